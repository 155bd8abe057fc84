//! One conformance suite for every `OrderStore`: the cases in [`cases`] are written once and
//! run against the in-memory reference, SQLite (real files in a temporary directory) and, with
//! `--features postgres-tests`, PostgreSQL (a fresh database per test, so tests run in
//! parallel). Backend-specific behaviour (reopening a file, replicas claiming concurrently,
//! lock waits cut off by the request's limit) has its own modules at the end.
//!
//! PostgreSQL tests connect to `CHECKOUT_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`) and create and drop `checkout_t_<random>`.

use std::sync::Arc;
use std::time::Duration;

use checkout::config::SqliteSynchronous;
use checkout::store::{
    Begin, Decision, Failure, Job, JobKind, JobOutcome, JobStats, MemoryStore, Money, NewJob,
    NewOrder, OrderRecord, OrderStatus, OrderStore, Phase, Reason, SqliteStore, StoreError,
    TimeLimit,
};
use tempfile::TempDir;

/// A limit no healthy store comes near.
const LIMIT: TimeLimit = TimeLimit(Duration::from_secs(10));

/// Background timeout of the stores under test.
const BACKGROUND: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Builders

fn new_order(order_id: &str, created_at_ms: i64) -> NewOrder {
    NewOrder {
        order_id: order_id.to_owned(),
        scope: "tests:checkout".to_owned(),
        idempotency_key: format!("key-{order_id}"),
        request_hash: "5f1d".to_owned(),
        customer_id: "customer-1".to_owned(),
        cart_id: "cart-4200".to_owned(),
        wallet_account_id: "account-1".to_owned(),
        expected_total: None,
        deadline_ms: created_at_ms + 2_400,
        created_at_ms,
        // Stored and read back like every other field (the worker links its spans to it).
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned()),
    }
}

fn usd(minor_units: i64) -> Money {
    Money {
        currency: "USD".to_owned(),
        minor_units,
    }
}

fn decision(order_id: &str, status: OrderStatus, reason: &str, at_ms: i64) -> Decision {
    Decision {
        order_id: order_id.to_owned(),
        status,
        reason: Reason::from_stored(reason).expect("a reason code, or empty"),
        retryable: false,
        retry_after_ms: None,
        total: None,
        hold_id: None,
        fraud_review: false,
        jobs: Vec::new(),
        complete: Vec::new(),
        at_ms,
    }
}

fn job(kind: JobKind, run_at_ms: i64) -> NewJob {
    NewJob {
        kind,
        run_at_ms,
        reschedule: false,
    }
}

fn retry(run_at_ms: i64, failed: bool) -> JobOutcome {
    failing(
        run_at_ms,
        if failed {
            Failure::Transient
        } else {
            Failure::Wait
        },
    )
}

fn failing(run_at_ms: i64, failure: Failure) -> JobOutcome {
    JobOutcome::RetryAt {
        run_at_ms,
        failure,
        error: "wallet unavailable".to_owned(),
        at_ms: run_at_ms - 100,
    }
}

/// Begins an order that must be new.
async fn create(store: &dyn OrderStore, order_id: &str, takeover_at_ms: i64) -> OrderRecord {
    match store
        .begin(&new_order(order_id, 0), takeover_at_ms, LIMIT)
        .await
        .expect("begin")
    {
        Begin::Created(record) => record,
        Begin::Existing(record) => panic!("{order_id} already existed: {record:?}"),
    }
}

/// Reads an order that must exist.
async fn stored(store: &dyn OrderStore, order_id: &str) -> OrderRecord {
    store
        .get(order_id)
        .await
        .expect("get")
        .unwrap_or_else(|| panic!("{order_id} is stored"))
}

/// The done jobs the store keeps (the operator's count; the scraped stats leave them out).
async fn done_jobs(store: &dyn OrderStore) -> u64 {
    store
        .count_done_jobs()
        .await
        .expect("done jobs are counted")
}

/// Claims everything due at `now_ms` for `owner`.
async fn claim(store: &dyn OrderStore, owner: &str, now_ms: i64, lease_until_ms: i64) -> Vec<Job> {
    store
        .claim_due(owner, now_ms, lease_until_ms, 100)
        .await
        .expect("claim_due")
        .into_iter()
        .map(|claimed| claimed.job)
        .collect()
}

/// Finishes every job in `jobs` as done; each one's lease must hold.
async fn finish_done(store: &dyn OrderStore, jobs: impl IntoIterator<Item = &Job>) {
    for job in jobs {
        assert!(
            store
                .finish_job(job, &JobOutcome::Done(None))
                .await
                .expect("done"),
            "the lease of {job:?} held"
        );
    }
}

/// Claims the one job due at `now_ms`.
async fn claim_one(store: &dyn OrderStore, now_ms: i64, lease_until_ms: i64) -> Job {
    let mut jobs = claim(store, "worker-a", now_ms, lease_until_ms).await;
    assert_eq!(jobs.len(), 1, "exactly one job due at {now_ms}: {jobs:?}");
    jobs.remove(0)
}

fn kinds(jobs: &[Job]) -> Vec<(String, JobKind)> {
    jobs.iter().map(|j| (j.order_id.clone(), j.kind)).collect()
}

// ---------------------------------------------------------------------------------------------
// Backends

/// A store under test and what must outlive it (its directory or database).
struct Harness {
    store: Arc<dyn OrderStore>,
    _keep: Keep,
}

enum Keep {
    Nothing,
    Dir(#[allow(dead_code)] TempDir),
    #[cfg(feature = "postgres-tests")]
    Database(#[allow(dead_code)] pg::TestDatabase),
}

impl Harness {
    async fn memory() -> Self {
        Self {
            store: Arc::new(MemoryStore::new()),
            _keep: Keep::Nothing,
        }
    }

    async fn sqlite() -> Self {
        let dir = TempDir::new().expect("temp dir");
        let store = SqliteStore::open(dir.path(), SqliteSynchronous::Full, 4, BACKGROUND)
            .await
            .expect("open sqlite");
        Self {
            store: Arc::new(store),
            _keep: Keep::Dir(dir),
        }
    }

    #[cfg(feature = "postgres-tests")]
    async fn postgres() -> Self {
        let database = pg::TestDatabase::create("checkout_t").await;
        let store = pg::open(&database).await;
        Self {
            store: Arc::new(store),
            _keep: Keep::Database(database),
        }
    }

    /// Closes the store before its directory or database goes.
    async fn finish(self) {
        self.store.close().await;
    }
}

/// SHA-384 of `0003_random_order_ids_and_parking.sql` as released (`git show
/// 0e4aeca:src/store/migrations/<backend>/0003_random_order_ids_and_parking.sql | sha384sum`),
/// before its comment was reworded: what every database migrated by a release records.
const RELEASED_V3_SQLITE: &str = "2d7607d03e5dfdbee4eae800efe7d616514e8d2b4530aa94a0582df9ca0600b5df1734d61a22af72815ef8001144b70c";
#[cfg(feature = "postgres-tests")]
const RELEASED_V3_POSTGRES: &str = "ebf1fb80b09c511942732af7ca1a5adc3e22a6a1b49c3093115246dc4a35b81daf06a3ace26fd009533429a7c3fd0b2a";

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(feature = "postgres-tests")]
mod pg {
    //! Fresh PostgreSQL databases for tests.

    use super::*;
    use checkout::store::PostgresStore;

    pub use crate::common::pg::TestDatabase;

    /// A store on `database`, like one replica.
    pub async fn open(database: &TestDatabase) -> PostgresStore {
        PostgresStore::open(
            &database.url(),
            8,
            Duration::from_millis(5),
            BACKGROUND,
            crate::common::pg::pooler(),
        )
        .await
        .expect("open postgres")
    }
}

// ---------------------------------------------------------------------------------------------
// The cases every store must pass

mod cases {
    use super::*;

    /// A new order id is recorded once, as RECEIVED with its takeover time (a `drive_order`
    /// job is claimed from then on); later begins return the stored record and change nothing.
    pub async fn begin_records_an_order_once_and_returns_it_after(store: Arc<dyn OrderStore>) {
        let store = &*store;
        let mut order = new_order("o-1", 1_000);
        order.expected_total = Some(usd(4_200));
        let Begin::Created(created) = store.begin(&order, 4_400, LIMIT).await.expect("begin")
        else {
            panic!("the first begin creates the order");
        };
        assert_eq!(created.order, order);
        assert_eq!(created.phase, Phase::Received);
        assert_eq!(created.status, OrderStatus::Pending);
        assert_eq!(Reason::stored(created.reason), "IN_PROGRESS");
        assert!(!created.retryable && !created.fraud_review);
        assert_eq!(created.retry_after_ms, None);
        assert_eq!(
            (created.total.clone(), created.hold_id.clone()),
            (None, None)
        );
        assert_eq!(created.hold_sent_at_ms, None);
        assert_eq!(created.updated_at_ms, 1_000);
        assert!(created.parked_jobs.is_empty());
        assert_eq!(stored(store, "o-1").await, created);

        let mut again = new_order("o-1", 2_000);
        again.request_hash = "different".to_owned();
        let begun = store
            .begin(&again, 9_999, LIMIT)
            .await
            .expect("begin again");
        assert_eq!(begun, Begin::Existing(created.clone()));
        assert_eq!(stored(store, "o-1").await, created);

        assert!(claim(store, "w", 4_399, 10_000).await.is_empty());
        let jobs = claim(store, "w", 4_400, 10_000).await;
        assert_eq!(kinds(&jobs), [("o-1".to_owned(), JobKind::DriveOrder)]);
        assert_eq!(jobs[0].attempts, 0);
        let stats = store.stats().await.expect("stats");
        assert_eq!(
            stats,
            JobStats {
                pending: 1,
                parked: 0,
                orders_pending: 1,
                // The leased takeover job: a lease runs until 10,000, and is due again then.
                oldest_pending_run_at_ms: Some(10_000),
            }
        );
    }

    /// Twenty concurrent begins of one order id: exactly one creates it, the rest see it.
    pub async fn concurrent_begins_of_one_order_create_it_exactly_once(store: Arc<dyn OrderStore>) {
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    store
                        .begin(&new_order("o-race", i), 5_000, LIMIT)
                        .await
                        .expect("begin")
                })
            })
            .collect();
        let mut created = 0;
        for task in tasks {
            if matches!(task.await.expect("task"), Begin::Created(_)) {
                created += 1;
            }
        }
        assert_eq!(created, 1);
        let stats = store.stats().await.expect("stats");
        // No job yet: the order becomes a `drive_order` job only when its takeover is due.
        assert_eq!((stats.pending, stats.orders_pending), (0, 1));
        let jobs = claim(&*store, "w", 5_000, 10_000).await;
        assert_eq!(kinds(&jobs), [("o-race".to_owned(), JobKind::DriveOrder)]);
    }

    /// The hold intent moves a RECEIVED order to HOLD_SENT once; later intents, intents after
    /// a decision and intents for unknown orders change nothing.
    pub async fn hold_intent_is_recorded_only_from_received(store: Arc<dyn OrderStore>) {
        let store = &*store;
        create(store, "o-1", 5_000).await;
        store
            .record_hold_intent("o-1", &usd(4_200), 300, LIMIT)
            .await
            .expect("hold intent");
        let held = stored(store, "o-1").await;
        assert_eq!(held.phase, Phase::HoldSent);
        assert_eq!(held.total, Some(usd(4_200)));
        assert_eq!(held.hold_sent_at_ms, Some(300));
        assert_eq!(held.updated_at_ms, 300);
        assert_eq!(held.status, OrderStatus::Pending);

        store
            .record_hold_intent("o-1", &usd(1), 400, LIMIT)
            .await
            .expect("second hold intent");
        assert_eq!(stored(store, "o-1").await, held);

        create(store, "o-2", 5_000).await;
        let decided = store
            .decide(
                &decision("o-2", OrderStatus::Declined, "OUT_OF_STOCK", 200),
                LIMIT,
            )
            .await
            .expect("decide");
        store
            .record_hold_intent("o-2", &usd(4_200), 300, LIMIT)
            .await
            .expect("hold intent after decision");
        assert_eq!(stored(store, "o-2").await, decided);

        store
            .record_hold_intent("o-missing", &usd(4_200), 300, LIMIT)
            .await
            .expect("hold intent for an unknown order is a no-op");
        assert_eq!(store.get("o-missing").await.expect("get"), None);
    }

    /// A decision applies once: a second decision on the terminal order changes nothing and
    /// returns the stored record; a decision for an unknown order is corrupt.
    pub async fn a_decision_applies_once_and_later_ones_return_the_stored_order(
        store: Arc<dyn OrderStore>,
    ) {
        let store = &*store;
        create(store, "o-1", 5_000).await;
        store
            .record_hold_intent("o-1", &usd(4_200), 300, LIMIT)
            .await
            .expect("hold intent");
        let mut confirm = decision("o-1", OrderStatus::Confirmed, "", 400);
        confirm.hold_id = Some("hold-1".to_owned());
        confirm.complete = vec![JobKind::DriveOrder];
        let confirmed = store.decide(&confirm, LIMIT).await.expect("decide");
        assert_eq!(confirmed.phase, Phase::Decided);
        assert_eq!(confirmed.status, OrderStatus::Confirmed);
        assert_eq!(Reason::stored(confirmed.reason), "");
        assert_eq!(
            confirmed.total,
            Some(usd(4_200)),
            "a missing total keeps the stored one"
        );
        assert_eq!(confirmed.hold_id.as_deref(), Some("hold-1"));
        assert_eq!(confirmed.hold_sent_at_ms, Some(300));
        assert_eq!(confirmed.updated_at_ms, 400);
        assert_eq!(stored(store, "o-1").await, confirmed);

        let mut decline = decision("o-1", OrderStatus::Declined, "WALLET_REJECTED", 500);
        decline.retryable = true;
        decline.retry_after_ms = Some(2_000);
        decline.total = Some(usd(1));
        decline.jobs = vec![job(JobKind::WalletRelease, 500)];
        let replay = store.decide(&decline, LIMIT).await.expect("second decide");
        assert_eq!(replay, confirmed);
        assert_eq!(stored(store, "o-1").await, confirmed);
        assert!(
            claim(store, "w", 100_000, 200_000).await.is_empty(),
            "the ignored decision added no job"
        );

        let missing = store
            .decide(&decision("o-missing", OrderStatus::Confirmed, "", 1), LIMIT)
            .await;
        assert!(
            matches!(missing, Err(StoreError::Corrupt(_))),
            "{missing:?}"
        );
    }

    /// A PENDING decision (the worker owns the order) records its fields and still lets a
    /// later decision finish the order.
    pub async fn a_pending_decision_is_followed_by_a_final_one(store: Arc<dyn OrderStore>) {
        let store = &*store;
        create(store, "o-1", 5_000).await;
        let mut pending = decision("o-1", OrderStatus::Pending, "FRAUD_REVIEW", 200);
        pending.retry_after_ms = Some(1_000);
        pending.fraud_review = true;
        pending.total = Some(usd(4_200));
        pending.hold_id = Some("hold-1".to_owned());
        let recorded = store
            .decide(&pending, LIMIT)
            .await
            .expect("pending decision");
        assert_eq!(recorded.phase, Phase::Decided);
        assert_eq!(recorded.status, OrderStatus::Pending);
        assert_eq!(Reason::stored(recorded.reason), "FRAUD_REVIEW");
        assert_eq!(recorded.retry_after_ms, Some(1_000));
        assert!(recorded.fraud_review);
        assert_eq!(recorded.total, Some(usd(4_200)));

        let final_ = store
            .decide(
                &decision("o-1", OrderStatus::Declined, "FRAUD_DENIED", 900),
                LIMIT,
            )
            .await
            .expect("final decision");
        assert_eq!(final_.status, OrderStatus::Declined);
        assert_eq!(Reason::stored(final_.reason), "FRAUD_DENIED");
        assert_eq!(final_.retry_after_ms, None);
        assert!(!final_.fraud_review);
        assert_eq!(final_.total, Some(usd(4_200)));
        assert_eq!(final_.hold_id.as_deref(), Some("hold-1"));
        assert_eq!(final_.updated_at_ms, 900);
    }

    /// A decision adds its jobs (keeping an existing job of the same kind as it is) and marks
    /// the kinds it completes done, in the same write.
    pub async fn decision_jobs_are_added_once_and_completed_kinds_are_done(
        store: Arc<dyn OrderStore>,
    ) {
        let store = &*store;
        create(store, "o-1", 10_000).await;
        let mut unknown = decision("o-1", OrderStatus::Pending, "WALLET_OUTCOME_UNKNOWN", 100);
        unknown.jobs = vec![
            job(JobKind::WalletReconcile, 500),
            job(JobKind::DriveOrder, 20_000),
        ];
        store.decide(&unknown, LIMIT).await.expect("decide");
        let reconcile = claim_one(store, 600, 700).await;
        assert_eq!(reconcile.kind, JobKind::WalletReconcile);

        let mut confirm = decision("o-1", OrderStatus::Confirmed, "", 650);
        confirm.jobs = vec![
            job(JobKind::WalletCapture, 1_000),
            job(JobKind::InventoryCommit, 1_000),
            job(JobKind::WalletReconcile, 2_000),
        ];
        confirm.complete = vec![JobKind::DriveOrder];
        store.decide(&confirm, LIMIT).await.expect("decide");
        let stats = store.stats().await.expect("stats");
        assert_eq!(
            (stats.pending, done_jobs(store).await, stats.parked),
            (3, 1, 0)
        );
        assert_eq!(stats.orders_pending, 0);

        // The reconcile job kept its lease through the second decision.
        assert!(
            store
                .finish_job(&reconcile, &retry(700, false))
                .await
                .expect("finish"),
            "a job the decision did not reschedule keeps its lease"
        );
        // The drive_order the first decision added (the worker's turn at 20_000) is done: the
        // confirmation completed it.
        let jobs = claim(store, "w", 20_000, 30_000).await;
        let order = |k| ("o-1".to_owned(), k);
        assert_eq!(
            kinds(&jobs),
            [
                order(JobKind::WalletReconcile),
                order(JobKind::WalletCapture),
                order(JobKind::InventoryCommit),
            ]
        );
    }

    /// A decision that reschedules a job makes it pending again at the new time with attempts
    /// reset, which voids the lease of whoever held it.
    pub async fn a_rescheduling_decision_resets_the_job_and_voids_its_lease(
        store: Arc<dyn OrderStore>,
    ) {
        let store = &*store;
        create(store, "o-1", 1_000).await;
        let first = claim_one(store, 1_000, 5_000).await;
        assert!(
            store
                .finish_job(&first, &retry(1_500, true))
                .await
                .expect("retry")
        );
        let second = claim_one(store, 1_500, 9_000).await;
        assert_eq!(
            (second.attempts, second.due_at_ms),
            (1, 1_500),
            "due at its retry"
        );

        let mut exhausted = decision("o-1", OrderStatus::Pending, "BUDGET_EXHAUSTED", 1_600);
        exhausted.jobs = vec![NewJob {
            kind: JobKind::DriveOrder,
            run_at_ms: 1_600,
            reschedule: true,
        }];
        store.decide(&exhausted, LIMIT).await.expect("decide");

        assert!(
            !store
                .finish_job(&second, &JobOutcome::Done(None))
                .await
                .expect("finish"),
            "the rescheduled job's old lease is void"
        );
        assert!(claim(store, "w", 1_599, 9_000).await.is_empty());
        let third = claim_one(store, 1_600, 9_000).await;
        assert_eq!((third.id, third.attempts), (first.id, 0));
    }

    /// Claims take due jobs oldest first, up to the limit, each with the time it was due (the
    /// worker's lag is measured from it); jobs not yet due wait.
    pub async fn claims_take_due_jobs_oldest_first_up_to_the_limit(store: Arc<dyn OrderStore>) {
        let store = &*store;
        for (id, takeover) in [
            ("o-a", 50),
            ("o-b", 40),
            ("o-c", 30),
            ("o-d", 20),
            ("o-e", 10),
        ] {
            create(store, id, takeover).await;
        }
        create(store, "o-later", 1_000).await;
        assert!(
            store
                .claim_due("w", 100, 500, 0)
                .await
                .expect("claim")
                .is_empty()
        );
        let first = store.claim_due("w", 100, 500, 3).await.expect("claim");
        let ids: Vec<_> = first.iter().map(|c| c.job.order_id.as_str()).collect();
        assert_eq!(ids, ["o-e", "o-d", "o-c"]);
        let due: Vec<_> = first.iter().map(|c| c.job.due_at_ms).collect();
        assert_eq!(due, [10, 20, 30], "due times, not the lease's run time");
        assert!(
            first
                .iter()
                .all(|c| c.job.lease_owner == "w" && c.job.lease_until_ms == 500)
        );
        // Each job comes with its order as stored.
        for claimed in &first {
            let order = claimed
                .order
                .as_ref()
                .expect("the order is claimed with its job");
            assert_eq!(*order, stored(store, &claimed.job.order_id).await);
        }
        let rest = store.claim_due("w", 100, 500, 3).await.expect("claim");
        let ids: Vec<_> = rest.iter().map(|c| c.job.order_id.as_str()).collect();
        assert_eq!(ids, ["o-b", "o-a"]);
        let due: Vec<_> = rest.iter().map(|c| c.job.due_at_ms).collect();
        assert_eq!(due, [40, 50]);
    }

    /// A lease is a token: a finish from the wrong owner or with a stale lease changes nothing,
    /// an expired lease lets another worker claim the job, and a finished job cannot be
    /// finished again.
    pub async fn a_finish_with_a_stale_lease_changes_nothing(store: Arc<dyn OrderStore>) {
        let store = &*store;
        create(store, "o-1", 0).await;
        let mine = claim_one(store, 0, 1_000).await;
        assert!(
            claim(store, "worker-b", 999, 2_000).await.is_empty(),
            "still leased"
        );

        let wrong_owner = Job {
            lease_owner: "worker-b".to_owned(),
            ..mine.clone()
        };
        let wrong_token = Job {
            lease_until_ms: 999,
            ..mine.clone()
        };
        for stale in [&wrong_owner, &wrong_token] {
            assert!(
                !store
                    .finish_job(stale, &JobOutcome::Done(None))
                    .await
                    .expect("finish")
            );
        }

        let theirs = claim(store, "worker-b", 1_000, 2_000).await;
        assert_eq!(theirs.len(), 1, "the expired lease is claimable");
        let theirs = &theirs[0];
        assert_eq!((theirs.id, theirs.attempts), (mine.id, 0));
        assert_eq!(
            (theirs.lease_owner.as_str(), theirs.lease_until_ms),
            ("worker-b", 2_000)
        );

        let outcomes = [
            JobOutcome::Done(None),
            retry(5_000, true),
            JobOutcome::Park {
                error: "gave up".to_owned(),
                at_ms: 1_500,
            },
        ];
        for outcome in &outcomes {
            assert!(!store.finish_job(&mine, outcome).await.expect("finish"));
        }
        assert_eq!(
            Reason::stored(stored(store, "o-1").await.reason),
            "IN_PROGRESS"
        );
        assert!(
            store
                .finish_job(theirs, &JobOutcome::Done(None))
                .await
                .expect("finish")
        );
        assert!(
            !store
                .finish_job(theirs, &JobOutcome::Done(None))
                .await
                .expect("finish")
        );
        let stats = store.stats().await.expect("stats");
        assert_eq!((stats.pending, done_jobs(store).await), (0, 1));
    }

    /// A retry hands the job back for its next run time; only failed attempts count.
    pub async fn retries_wait_for_their_time_and_count_only_failures(store: Arc<dyn OrderStore>) {
        let store = &*store;
        create(store, "o-1", 0).await;
        let job = claim_one(store, 0, 1_000).await;
        assert!(
            store
                .finish_job(&job, &retry(400, true))
                .await
                .expect("retry")
        );
        assert!(
            claim(store, "w", 399, 1_000).await.is_empty(),
            "not before run_at"
        );
        let job = claim_one(store, 400, 1_000).await;
        assert_eq!(job.attempts, 1);
        assert!(
            store
                .finish_job(&job, &retry(500, false))
                .await
                .expect("wait")
        );
        let job = claim_one(store, 500, 1_000).await;
        assert_eq!(job.attempts, 1, "a wait is not a failure");
        assert!(
            store
                .finish_job(&job, &retry(600, true))
                .await
                .expect("retry")
        );
        let job = claim_one(store, 600, 1_000).await;
        assert_eq!(job.attempts, 2);
    }

    /// Parking keeps the job (counted, listed on its order, never claimed again); a PENDING
    /// order's reason becomes PARKED, a terminal order keeps its outcome.
    pub async fn parking_a_job_keeps_it_visible_and_marks_a_pending_order(
        store: Arc<dyn OrderStore>,
    ) {
        let store = &*store;
        create(store, "o-1", 0).await;
        let mut pending = decision("o-1", OrderStatus::Pending, "BUDGET_EXHAUSTED", 10);
        pending.retry_after_ms = Some(1_000);
        pending.jobs = vec![NewJob {
            reschedule: true,
            ..job(JobKind::DriveOrder, 10)
        }];
        store.decide(&pending, LIMIT).await.expect("decide");
        let drive = claim_one(store, 10, 1_000).await;
        let park = JobOutcome::Park {
            error: "wallet unreachable".to_owned(),
            at_ms: 50,
        };
        assert!(store.finish_job(&drive, &park).await.expect("park"));
        let order = stored(store, "o-1").await;
        assert_eq!(order.status, OrderStatus::Pending);
        assert_eq!(Reason::stored(order.reason), "PARKED");
        assert_eq!(order.retry_after_ms, None);
        assert_eq!(order.updated_at_ms, 50);
        assert_eq!(order.parked_jobs, [JobKind::DriveOrder]);
        assert!(claim(store, "w", 100_000, 200_000).await.is_empty());
        let stats = store.stats().await.expect("stats");
        assert_eq!(
            (stats.pending, stats.parked, stats.orders_pending),
            (0, 1, 1)
        );

        create(store, "o-2", 100_000).await;
        let mut confirm = decision("o-2", OrderStatus::Confirmed, "", 20);
        confirm.jobs = vec![
            job(JobKind::InventoryCommit, 30),
            job(JobKind::WalletCapture, 30),
        ];
        confirm.complete = vec![JobKind::DriveOrder];
        let confirmed = store.decide(&confirm, LIMIT).await.expect("decide");
        for job in claim(store, "w", 30, 1_000).await {
            assert!(store.finish_job(&job, &park).await.expect("park"));
        }
        let after = stored(store, "o-2").await;
        assert_eq!(
            after.parked_jobs,
            [JobKind::WalletCapture, JobKind::InventoryCommit]
        );
        assert_eq!(
            OrderRecord {
                parked_jobs: Vec::new(),
                ..after
            },
            confirmed,
            "a terminal order keeps its outcome"
        );
        let stats = store.stats().await.expect("stats");
        assert_eq!(
            (stats.pending, stats.parked, done_jobs(store).await),
            (0, 3, 0)
        );
    }

    /// A job finished with a decision applies it in the same write, under the rules of
    /// `decide`: a terminal order is left as it is, but the job is still done.
    pub async fn a_job_done_with_a_decision_applies_it_atomically(store: Arc<dyn OrderStore>) {
        let store = &*store;
        create(store, "o-1", 0).await;
        let drive = claim_one(store, 0, 1_000).await;
        let mut confirm = decision("o-1", OrderStatus::Confirmed, "", 100);
        confirm.hold_id = Some("hold-1".to_owned());
        confirm.total = Some(usd(4_200));
        confirm.jobs = vec![job(JobKind::WalletCapture, 100)];
        assert!(
            store
                .finish_job(&drive, &JobOutcome::Done(Some(confirm)))
                .await
                .expect("finish")
        );
        let confirmed = stored(store, "o-1").await;
        assert_eq!(confirmed.status, OrderStatus::Confirmed);
        assert_eq!(confirmed.hold_id.as_deref(), Some("hold-1"));

        let capture = claim_one(store, 100, 1_000).await;
        assert_eq!(capture.kind, JobKind::WalletCapture);
        let late = decision("o-1", OrderStatus::Declined, "WALLET_REJECTED", 200);
        assert!(
            store
                .finish_job(&capture, &JobOutcome::Done(Some(late)))
                .await
                .expect("finish")
        );
        assert_eq!(stored(store, "o-1").await, confirmed);
        let stats = store.stats().await.expect("stats");
        assert_eq!((stats.pending, done_jobs(store).await), (0, 2));
    }

    /// Purging deletes old terminal orders (with their done jobs) and keeps recent ones,
    /// undecided ones, and any with a pending or parked job.
    pub async fn purge_removes_only_old_terminal_orders_without_open_jobs(
        store: Arc<dyn OrderStore>,
    ) {
        let store = &*store;
        let finish = |id: &'static str, status, at_ms, jobs: Vec<NewJob>| {
            let mut d = decision(id, status, "", at_ms);
            d.jobs = jobs;
            d.complete = vec![JobKind::DriveOrder];
            d
        };
        for id in [
            "done-old",
            "capture-pending",
            "release-parked",
            "recent",
            "undecided",
        ] {
            create(store, id, 1_000_000).await;
        }
        let decisions = [
            finish(
                "done-old",
                OrderStatus::Confirmed,
                100,
                vec![job(JobKind::WalletCapture, 50)],
            ),
            finish(
                "capture-pending",
                OrderStatus::Confirmed,
                100,
                vec![job(JobKind::WalletCapture, 500_000)],
            ),
            finish(
                "release-parked",
                OrderStatus::Declined,
                100,
                vec![job(JobKind::WalletRelease, 50)],
            ),
            finish("recent", OrderStatus::Declined, 5_000, Vec::new()),
        ];
        for d in &decisions {
            store.decide(d, LIMIT).await.expect("decide");
        }
        let due = claim(store, "w", 100, 200).await;
        assert_eq!(due.len(), 2, "{due:?}");
        let park = JobOutcome::Park {
            error: "gave up".to_owned(),
            at_ms: 150,
        };
        for job in &due {
            let outcome = if job.order_id == "done-old" {
                JobOutcome::Done(None)
            } else {
                park.clone()
            };
            assert!(store.finish_job(job, &outcome).await.expect("finish"));
        }
        let before = store.stats().await.expect("stats");
        assert_eq!(
            (done_jobs(store).await, before.pending, before.parked),
            (1, 1, 1)
        );

        assert_eq!(store.purge_terminal(1_000).await.expect("purge"), 1);
        assert_eq!(store.get("done-old").await.expect("get"), None);
        for kept in ["capture-pending", "release-parked", "recent", "undecided"] {
            stored(store, kept).await;
        }
        let after = store.stats().await.expect("stats");
        assert_eq!(
            (done_jobs(store).await, after.pending, after.parked),
            (0, 1, 1),
            "done-old's capture went with it"
        );
        assert_eq!(store.purge_terminal(1_000).await.expect("purge"), 0);
        assert_eq!(
            store.purge_terminal(10_000).await.expect("purge"),
            1,
            "recent"
        );
    }

    /// Many callers writing at once (the durable stores commit their writes in shared
    /// transactions): every write applies whole, and one that fails half way — a job finished
    /// with a decision for an unknown order — changes nothing, not even its job.
    pub async fn concurrent_writes_each_apply_whole_or_not_at_all(store: Arc<dyn OrderStore>) {
        create(&*store, "o-leased", 0).await;
        let leased = claim_one(&*store, 0, 1_000).await;
        let orders: Vec<_> = (0..40)
            .map(|i| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let id = format!("o-{i:02}");
                    let begun = store.begin(&new_order(&id, 0), 100_000, LIMIT).await?;
                    assert!(matches!(begun, Begin::Created(_)), "{begun:?}");
                    store.record_hold_intent(&id, &usd(100), 10, LIMIT).await?;
                    let mut confirm = decision(&id, OrderStatus::Confirmed, "", 20);
                    confirm.jobs = vec![
                        job(JobKind::WalletCapture, 50_000),
                        job(JobKind::InventoryCommit, 50_000),
                    ];
                    confirm.complete = vec![JobKind::DriveOrder];
                    store.decide(&confirm, LIMIT).await
                })
            })
            .collect();
        let failing = {
            let store = Arc::clone(&store);
            let leased = leased.clone();
            tokio::spawn(async move {
                let unknown = decision("o-missing", OrderStatus::Confirmed, "", 30);
                store
                    .finish_job(&leased, &JobOutcome::Done(Some(unknown)))
                    .await
            })
        };
        for order in orders {
            let decided = order.await.expect("task").expect("every write applies");
            assert_eq!(decided.status, OrderStatus::Confirmed);
            assert_eq!(decided.phase, Phase::Decided);
            assert_eq!(decided.total, Some(usd(100)), "the hold intent applied");
            assert_eq!(decided.hold_sent_at_ms, Some(10));
        }
        let failed = failing.await.expect("task");
        assert!(matches!(failed, Err(StoreError::Corrupt(_))), "{failed:?}");
        assert!(
            store
                .finish_job(&leased, &JobOutcome::Done(None))
                .await
                .expect("finish"),
            "the failed finish left the job leased"
        );
        let stats = store.stats().await.expect("stats");
        assert_eq!(
            stats,
            JobStats {
                pending: 80,
                parked: 0,
                orders_pending: 1,
                oldest_pending_run_at_ms: stats.oldest_pending_run_at_ms,
            }
        );
        // o-leased's takeover; the others were decided before theirs, so they never had one.
        assert_eq!(done_jobs(store.as_ref()).await, 1);
    }

    /// Concurrent decisions of one order: exactly one applies (with its jobs), and every
    /// caller is answered with the order as stored.
    pub async fn concurrent_decisions_of_one_order_apply_exactly_one(store: Arc<dyn OrderStore>) {
        create(&*store, "o-1", 100_000).await;
        let tasks: Vec<_> = (0..10)
            .map(|i| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let (status, kind) = if i % 2 == 0 {
                        (OrderStatus::Confirmed, JobKind::WalletCapture)
                    } else {
                        (OrderStatus::Declined, JobKind::WalletRelease)
                    };
                    // A reason of its own per decision: the one stored tells which applied.
                    let reason = Reason::ALL[usize::try_from(i).expect("0..10")].as_str();
                    let mut d = decision("o-1", status, reason, 100 + i);
                    d.jobs = vec![job(kind, 500)];
                    d.complete = vec![JobKind::DriveOrder];
                    store.decide(&d, LIMIT).await.expect("decide")
                })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.expect("task"));
        }
        let stored = stored(&*store, "o-1").await;
        assert!(stored.status.is_terminal());
        assert!(
            answers.iter().all(|answer| *answer == stored),
            "{answers:?}"
        );
        let jobs = claim(&*store, "w", 500, 1_000).await;
        let expected = match stored.status {
            OrderStatus::Confirmed => JobKind::WalletCapture,
            _ => JobKind::WalletRelease,
        };
        assert_eq!(kinds(&jobs), [("o-1".to_owned(), expected)]);
    }

    /// An unknown order id reads as absent, not as an error.
    pub async fn an_unknown_order_reads_as_none(store: Arc<dyn OrderStore>) {
        assert_eq!(store.get("nobody").await.expect("get"), None);
        assert_eq!(
            store.find("tests:checkout", "nobody").await.expect("find"),
            None
        );
        assert_eq!(store.stats().await.expect("stats"), JobStats::default());
    }

    /// The idempotency key is unique per scope whatever id a request draws: a second begin
    /// with another id finds the first order; another scope gets its own order; once the
    /// order is purged, the key makes a new order with the new id.
    pub async fn a_key_is_unique_per_scope_whatever_id_the_request_draws(
        store: Arc<dyn OrderStore>,
    ) {
        let store = &*store;
        let first = create(store, "o-1", 50).await;
        let mut again = new_order("o-2", 10);
        again.idempotency_key = first.order.idempotency_key.clone();
        match store.begin(&again, 60, LIMIT).await.expect("begin") {
            Begin::Existing(existing) => assert_eq!(existing, first),
            Begin::Created(created) => panic!("a second order for one key: {created:?}"),
        }
        assert_eq!(store.get("o-2").await.expect("get"), None);
        let found = store
            .find(&first.order.scope, &first.order.idempotency_key)
            .await
            .expect("find");
        assert_eq!(found, Some(first.clone()));
        let mut elsewhere = again.clone();
        elsewhere.order_id = "o-3".to_owned();
        elsewhere.scope = "other:checkout".to_owned();
        assert!(matches!(
            store.begin(&elsewhere, 60, LIMIT).await.expect("begin"),
            Begin::Created(_)
        ));

        let mut done = decision("o-1", OrderStatus::Confirmed, "", 100);
        done.complete = vec![JobKind::DriveOrder];
        store.decide(&done, LIMIT).await.expect("decide");
        assert_eq!(store.purge_terminal(1_000).await.expect("purge"), 1);
        match store.begin(&again, 2_000, LIMIT).await.expect("begin") {
            Begin::Created(created) => assert_eq!(created.order.order_id, "o-2"),
            Begin::Existing(existing) => panic!("the purged order came back: {existing:?}"),
        }
        assert_eq!(
            store
                .find(&again.scope, &again.idempotency_key)
                .await
                .expect("find")
                .map(|o| o.order.order_id),
            Some("o-2".to_owned())
        );
    }

    /// `attempts` counts every failure (the backoff), `rejections` only definitive refusals,
    /// and the first transient failure starts `failing_since`, which later ones keep.
    pub async fn failures_count_rejections_apart_and_remember_when_transient_ones_began(
        store: Arc<dyn OrderStore>,
    ) {
        let store = &*store;
        create(store, "o-1", 0).await;
        let job = claim_one(store, 0, 1_000).await;
        assert_eq!(
            (job.attempts, job.rejections, job.failing_since_ms),
            (0, 0, None)
        );
        let outcomes = [
            (failing(200, Failure::Transient), (1, 0, Some(100))),
            (failing(400, Failure::Transient), (2, 0, Some(100))),
            (failing(600, Failure::Rejection), (3, 1, Some(100))),
            (failing(800, Failure::Wait), (3, 1, Some(100))),
        ];
        let mut job = job;
        for (outcome, expected) in outcomes {
            let JobOutcome::RetryAt { run_at_ms, .. } = outcome else {
                unreachable!("a retry")
            };
            assert!(store.finish_job(&job, &outcome).await.expect("retry"));
            job = claim_one(store, run_at_ms, run_at_ms + 1_000).await;
            assert_eq!(
                (job.attempts, job.rejections, job.failing_since_ms),
                expected,
                "after {outcome:?}"
            );
        }
    }

    /// Parked jobs are listed a page at a time; re-queuing them (one order's, or all) makes
    /// them due now with fresh counts, and a PENDING order left with no parked job gets back
    /// the reason its open jobs stand for.
    pub async fn parked_jobs_are_listed_and_requeued_with_fresh_counts(store: Arc<dyn OrderStore>) {
        let store = &*store;
        let park = |at_ms| JobOutcome::Park {
            error: "wallet refused".to_owned(),
            at_ms,
        };
        for (id, reason, kind) in [
            ("o-1", "BUDGET_EXHAUSTED", JobKind::DriveOrder),
            ("o-2", "WALLET_OUTCOME_UNKNOWN", JobKind::WalletReconcile),
        ] {
            create(store, id, 100_000).await;
            let mut pending = decision(id, OrderStatus::Pending, reason, 10);
            pending.jobs = vec![NewJob {
                reschedule: true,
                ..job(kind, 10)
            }];
            pending.complete = if kind == JobKind::DriveOrder {
                Vec::new()
            } else {
                vec![JobKind::DriveOrder]
            };
            store.decide(&pending, LIMIT).await.expect("decide");
        }
        let mut jobs = claim(store, "w", 10, 1_000).await;
        jobs.sort_by_key(|j| j.id);
        assert_eq!(jobs.len(), 2, "{jobs:?}");
        for (i, job) in jobs.iter().enumerate() {
            assert!(
                store
                    .finish_job(job, &park(20 + i as i64))
                    .await
                    .expect("park")
            );
        }
        assert_eq!(Reason::stored(stored(store, "o-1").await.reason), "PARKED");

        let first_page = store.list_parked(0, 1).await.expect("list");
        assert_eq!(first_page.len(), 1);
        let second_page = store.list_parked(first_page[0].id, 10).await.expect("list");
        assert_eq!(second_page.len(), 1);
        let all: Vec<_> = first_page.iter().chain(&second_page).collect();
        assert_eq!(
            all.iter()
                .map(|p| (p.order_id.as_str(), p.kind))
                .collect::<Vec<_>>(),
            [
                ("o-1", JobKind::DriveOrder),
                ("o-2", JobKind::WalletReconcile)
            ]
        );
        assert_eq!(all[0].last_error, "wallet refused");
        assert_eq!(all[0].parked_at_ms, 20);
        assert_eq!(all[0].attempts, 1);

        assert_eq!(
            store
                .retry_parked(Some("o-2"), 500, 1_000)
                .await
                .expect("retry"),
            1
        );
        let o2 = stored(store, "o-2").await;
        assert_eq!(
            (
                Reason::stored(o2.reason),
                o2.retry_after_ms,
                o2.parked_jobs.len()
            ),
            ("WALLET_OUTCOME_UNKNOWN", Some(1_000), 0)
        );
        assert_eq!(
            Reason::stored(stored(store, "o-1").await.reason),
            "PARKED",
            "only o-2's"
        );
        assert_eq!(
            store.retry_parked(None, 600, 1_000).await.expect("retry"),
            1
        );
        let o1 = stored(store, "o-1").await;
        assert_eq!(
            (Reason::stored(o1.reason), o1.parked_jobs.len()),
            ("BUDGET_EXHAUSTED", 0)
        );
        assert!(store.list_parked(0, 10).await.expect("list").is_empty());
        let due = claim(store, "w", 600, 2_000).await;
        assert_eq!(due.len(), 2, "both due again: {due:?}");
        assert!(due.iter().all(|j| (j.attempts, j.rejections) == (0, 0)));
        assert_eq!(store.stats().await.expect("stats").parked, 0);
    }

    /// An order not decided by its takeover time (its process died) is handed to a worker as a
    /// `drive_order` job due then, once; an order decided or abandoned before never is,
    /// whatever its decision's jobs.
    pub async fn an_undecided_order_is_handed_over_once_at_its_takeover_time(
        store: Arc<dyn OrderStore>,
    ) {
        let store = &*store;
        for id in ["o-1", "o-2", "o-3", "o-4"] {
            create(store, id, 1_000).await;
        }
        create(store, "o-late", 3_000).await;
        // Decided before its takeover time: no takeover, whatever the decision says.
        store
            .decide(&decision("o-2", OrderStatus::Confirmed, "", 500), LIMIT)
            .await
            .expect("decide");
        let mut review = decision("o-3", OrderStatus::Pending, "FRAUD_REVIEW", 500);
        review.jobs = vec![job(JobKind::FraudRescore, 50_000)];
        store.decide(&review, LIMIT).await.expect("decide");
        // Abandoned by its caller: declined, its compensations run instead.
        assert!(store.abandon("o-4", 600, 1_000).await.expect("abandon"));
        let compensations = claim(store, "w", 999, 1_500).await;
        assert!(
            compensations
                .iter()
                .all(|j| j.order_id == "o-4" && j.kind != JobKind::DriveOrder),
            "{compensations:?}"
        );
        assert_eq!(compensations.len(), 2, "{compensations:?}");
        finish_done(store, &compensations).await;

        // o-1 only: the others were decided, o-late is not due.
        let taken = claim_one(store, 1_000, 2_000).await;
        assert_eq!(
            (taken.order_id.as_str(), taken.kind, taken.attempts),
            ("o-1", JobKind::DriveOrder, 0)
        );
        // Handed over once: the job's lease holds until 2,000, and no second job appears.
        assert!(claim(store, "w", 1_999, 5_000).await.is_empty());
        let again = claim(store, "w", 2_000, 5_000).await;
        assert_eq!(kinds(&again), [("o-1".to_owned(), JobKind::DriveOrder)]);
        assert_eq!(again[0].id, taken.id, "the same job, its lease expired");
        // The takeover job carries the order as stored, and decides it like any job.
        let late = store.claim_due("w", 3_000, 9_000, 10).await.expect("claim");
        assert_eq!(late.len(), 1, "{late:?}");
        assert_eq!(late[0].job.kind, JobKind::DriveOrder);
        let order = late[0].order.as_ref().expect("the order");
        assert_eq!(
            (order.order.order_id.as_str(), order.phase),
            ("o-late", Phase::Received)
        );
        let stats = store.stats().await.expect("stats");
        assert_eq!(
            (stats.pending, stats.orders_pending),
            (3, 3),
            "o-1's and o-late's takeovers and o-3's re-score; o-1, o-3 and o-late are PENDING"
        );
    }

    /// A caller who left before hearing a decision: the order becomes DECLINED
    /// CALLER_ABANDONED, its pending jobs are cancelled and a reconcile and an inventory
    /// release are due — unless its capture started or it is already declined.
    pub async fn an_abandoned_decision_is_undone_unless_its_capture_started(
        store: Arc<dyn OrderStore>,
    ) {
        let store = &*store;
        for id in ["o-1", "o-2", "o-3"] {
            create(store, id, 100_000).await;
            let mut confirm = decision(id, OrderStatus::Confirmed, "", 10);
            confirm.jobs = vec![
                job(JobKind::WalletCapture, 5_000),
                job(JobKind::InventoryCommit, 5_000),
            ];
            confirm.complete = vec![JobKind::DriveOrder];
            store.decide(&confirm, LIMIT).await.expect("decide");
        }
        assert!(store.abandon("o-1", 100, 1_000).await.expect("abandon"));
        let o1 = stored(store, "o-1").await;
        assert_eq!(
            (
                o1.status,
                Reason::stored(o1.reason),
                o1.retryable,
                o1.retry_after_ms
            ),
            (OrderStatus::Declined, "CALLER_ABANDONED", true, Some(1_000))
        );
        assert!(!store.abandon("o-1", 200, 1_000).await.expect("again"));
        // Its capture and commit are cancelled; the compensations are due at once.
        let mut due = claim(store, "w", 100, 1_000).await;
        due.sort_by_key(|j| j.kind);
        assert_eq!(
            kinds(&due),
            [
                ("o-1".to_owned(), JobKind::WalletReconcile),
                ("o-1".to_owned(), JobKind::InventoryRelease)
            ]
        );
        finish_done(store, &due).await;

        // o-2's capture is leased by a worker: too late.
        let leased = claim(store, "w", 5_000, 20_000).await;
        let capture = leased
            .iter()
            .find(|j| j.order_id == "o-2" && j.kind == JobKind::WalletCapture)
            .expect("o-2's capture is due")
            .clone();
        assert!(!store.abandon("o-2", 5_001, 1_000).await.expect("abandon"));
        assert_eq!(stored(store, "o-2").await.status, OrderStatus::Confirmed);
        assert!(
            store
                .finish_job(&capture, &JobOutcome::Done(None))
                .await
                .expect("done")
        );
        finish_done(store, leased.iter().filter(|j| j.id != capture.id)).await;
        // o-3's capture ran: too late as well.
        assert!(!store.abandon("o-3", 30_000, 1_000).await.expect("abandon"));
        assert!(
            !store
                .abandon("unknown", 30_000, 1_000)
                .await
                .expect("abandon")
        );
        assert!(
            claim(store, "w", 30_000, 40_000).await.is_empty(),
            "o-1's capture never comes back"
        );
    }
}

/// Runs every case against one backend, as a module of tests named after the cases.
macro_rules! conformance_suite {
    ($( $(#[$doc:meta])* $case:ident ),* $(,)?) => {
        conformance_suite!(@backend memory, memory; $( $(#[$doc])* $case ),*);
        conformance_suite!(@backend sqlite, sqlite; $( $(#[$doc])* $case ),*);
        #[cfg(feature = "postgres-tests")]
        conformance_suite!(@backend postgres, postgres; $( $(#[$doc])* $case ),*);
    };
    (@backend $module:ident, $open:ident; $( $(#[$doc:meta])* $case:ident ),*) => {
        mod $module {
            use super::*;
            $(
                $(#[$doc])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let harness = Harness::$open().await;
                    cases::$case(Arc::clone(&harness.store)).await;
                    harness.finish().await;
                }
            )*
        }
    };
}

conformance_suite! {
    /// A new order id is recorded once; later begins return the stored record untouched.
    begin_records_an_order_once_and_returns_it_after,
    /// Twenty concurrent begins of one order id create it exactly once.
    concurrent_begins_of_one_order_create_it_exactly_once,
    /// The hold intent is recorded only from RECEIVED.
    hold_intent_is_recorded_only_from_received,
    /// A decision applies once; later ones return the stored order.
    a_decision_applies_once_and_later_ones_return_the_stored_order,
    /// A PENDING decision leaves the order open for a final one.
    a_pending_decision_is_followed_by_a_final_one,
    /// A decision adds its jobs once and completes the kinds it names.
    decision_jobs_are_added_once_and_completed_kinds_are_done,
    /// A rescheduling decision resets the job and voids its lease.
    a_rescheduling_decision_resets_the_job_and_voids_its_lease,
    /// Claims take due jobs oldest first, up to the limit.
    claims_take_due_jobs_oldest_first_up_to_the_limit,
    /// A finish with a stale lease changes nothing; expired leases are claimable.
    a_finish_with_a_stale_lease_changes_nothing,
    /// Retries wait for their time and count only failed attempts.
    retries_wait_for_their_time_and_count_only_failures,
    /// A parked job stays visible and marks a PENDING order PARKED.
    parking_a_job_keeps_it_visible_and_marks_a_pending_order,
    /// A job done with a decision applies it in the same write.
    a_job_done_with_a_decision_applies_it_atomically,
    /// Purge removes only old terminal orders without pending or parked jobs.
    purge_removes_only_old_terminal_orders_without_open_jobs,
    /// An unknown order reads as None.
    an_unknown_order_reads_as_none,
    /// Concurrent writes each apply whole or not at all.
    concurrent_writes_each_apply_whole_or_not_at_all,
    /// Concurrent decisions of one order apply exactly one.
    concurrent_decisions_of_one_order_apply_exactly_one,
    /// The idempotency key is unique per scope whatever id a request draws.
    a_key_is_unique_per_scope_whatever_id_the_request_draws,
    /// Rejections are counted apart; transient failures remember when they began.
    failures_count_rejections_apart_and_remember_when_transient_ones_began,
    /// An undecided order is handed over once, at its takeover time, as a `drive_order` job.
    an_undecided_order_is_handed_over_once_at_its_takeover_time,
    /// Parked jobs are listed and re-queued with fresh counts.
    parked_jobs_are_listed_and_requeued_with_fresh_counts,
    /// An abandoned decision is undone unless its capture started.
    an_abandoned_decision_is_undone_unless_its_capture_started,
}

// ---------------------------------------------------------------------------------------------
// SQLite only

mod sqlite_file {
    use super::*;
    use sqlx::{Connection, Executor, SqliteConnection};

    /// Orders and jobs written before the store is closed are there when the file is reopened.
    #[tokio::test]
    async fn data_survives_closing_and_reopening_the_file() {
        let dir = TempDir::new().expect("temp dir");
        let store = SqliteStore::open(dir.path(), SqliteSynchronous::Normal, 2, BACKGROUND)
            .await
            .expect("open");
        assert_eq!(store.path(), dir.path().join("checkout.db"));
        create(&store, "o-1", 100).await;
        create(&store, "o-2", 100).await;
        let mut confirm = decision("o-1", OrderStatus::Confirmed, "", 50);
        confirm.jobs = vec![job(JobKind::WalletCapture, 60)];
        let confirmed = store.decide(&confirm, LIMIT).await.expect("decide");
        store.close().await;
        assert!(matches!(
            store.get("o-1").await,
            Err(StoreError::Unavailable(_))
        ));

        let reopened = SqliteStore::open(dir.path(), SqliteSynchronous::Full, 2, BACKGROUND)
            .await
            .expect("reopen");
        assert_eq!(stored(&reopened, "o-1").await, confirmed);
        // o-1's capture job, and o-2's takeover time (undecided, it is handed over).
        let jobs = claim(&reopened, "w", 100, 1_000).await;
        assert_eq!(
            kinds(&jobs),
            [
                ("o-1".to_owned(), JobKind::WalletCapture),
                ("o-2".to_owned(), JobKind::DriveOrder)
            ]
        );
        reopened.close().await;
    }

    /// A stored reason code no reason has is read as a corrupt record, never as some reason or
    /// as none: the code is parsed where the row is read.
    #[tokio::test]
    async fn an_unknown_stored_reason_is_a_corrupt_record() {
        let dir = TempDir::new().expect("temp dir");
        let store = SqliteStore::open(dir.path(), SqliteSynchronous::Full, 2, BACKGROUND)
            .await
            .expect("open");
        create(&store, "o-1", 100).await;
        let mut other = SqliteConnection::connect(&format!("sqlite://{}", store.path().display()))
            .await
            .expect("second connection");
        other
            .execute("UPDATE orders SET reason = 'NOT_A_REASON' WHERE order_id = 'o-1'")
            .await
            .expect("written behind the store's back");
        other.close().await.expect("closed");
        let read = store.get("o-1").await;
        assert!(
            matches!(&read, Err(StoreError::Corrupt(why)) if why.contains("NOT_A_REASON")),
            "{read:?}"
        );
        store.close().await;
    }

    /// While another process holds the write lock, a request-path write gives up within its
    /// limit with Timeout, and nothing is applied.
    #[tokio::test]
    async fn a_write_blocked_by_another_process_times_out_within_its_limit() {
        let dir = TempDir::new().expect("temp dir");
        let store = SqliteStore::open(dir.path(), SqliteSynchronous::Full, 2, BACKGROUND)
            .await
            .expect("open");
        create(&store, "o-1", 100).await;

        let mut other = SqliteConnection::connect(&format!("sqlite://{}", store.path().display()))
            .await
            .expect("second connection");
        other.execute("BEGIN IMMEDIATE").await.expect("lock");

        let started = std::time::Instant::now();
        let result = store
            .record_hold_intent("o-1", &usd(1), 10, TimeLimit(Duration::from_millis(50)))
            .await;
        let took = started.elapsed();
        assert!(matches!(result, Err(StoreError::Timeout(_))), "{result:?}");
        assert!(took < Duration::from_secs(1), "took {took:?}");

        other.execute("ROLLBACK").await.expect("unlock");
        assert_eq!(stored(&store, "o-1").await.phase, Phase::Received);
        store
            .record_hold_intent("o-1", &usd(1), 10, LIMIT)
            .await
            .expect("the store works once the lock is gone");
        assert_eq!(stored(&store, "o-1").await.phase, Phase::HoldSent);
        store.close().await;
    }

    /// A request-path write whose limit passes while the writer waits for another process's
    /// write lock is not applied: withdrawn while still queued (Unavailable, nothing was sent)
    /// or skipped once taken (Timeout). The writes ahead of it still commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_write_whose_limit_passes_in_the_queue_is_not_applied() {
        let dir = TempDir::new().expect("temp dir");
        let store = Arc::new(
            SqliteStore::open(dir.path(), SqliteSynchronous::Full, 2, BACKGROUND)
                .await
                .expect("open"),
        );
        create(&*store, "o-1", 100).await;

        let mut other = SqliteConnection::connect(&format!("sqlite://{}", store.path().display()))
            .await
            .expect("second connection");
        other.execute("BEGIN IMMEDIATE").await.expect("lock");

        // A write with a long limit takes the writer first and waits for the lock. Polled once,
        // it is in the writer's queue (the queue has room, so its send completes at once), and
        // the queue is first in, first out: the late write below is queued behind it.
        let o2 = new_order("o-2", 0);
        let mut ahead = std::pin::pin!(store.begin(&o2, 5_000, LIMIT));
        assert!(
            futures::poll!(&mut ahead).is_pending(),
            "the write ahead waits for the lock"
        );
        let started = std::time::Instant::now();
        let late = store
            .record_hold_intent("o-1", &usd(1), 10, TimeLimit(Duration::from_millis(100)))
            .await;
        let took = started.elapsed();
        assert!(
            matches!(
                late,
                Err(StoreError::Unavailable(_) | StoreError::Timeout(_))
            ),
            "{late:?}"
        );
        assert!(took < Duration::from_secs(1), "took {took:?}");

        tokio::time::sleep(Duration::from_millis(100)).await;
        other.execute("ROLLBACK").await.expect("unlock");
        let begun = ahead.await.expect("the write ahead commits");
        assert!(matches!(begun, Begin::Created(_)), "{begun:?}");
        // One more write through the writer, so anything still queued has been seen.
        create(&*store, "o-3", 100).await;
        assert_eq!(stored(&*store, "o-1").await.phase, Phase::Received);
        store.close().await;
    }

    /// The applied migrations as sqlx records them: version, description, checksum, success.
    async fn applied(conn: &mut SqliteConnection) -> Vec<(i64, String, Vec<u8>, bool)> {
        sqlx::query_as(
            "SELECT version, description, checksum, success FROM _sqlx_migrations \
             ORDER BY version",
        )
        .fetch_all(conn)
        .await
        .expect("_sqlx_migrations")
    }

    /// A data dir written before the store had its own writer thread — migrated by sqlx's
    /// migrator from the migration files (as sqlx-cli does), rows written through sqlx — opens:
    /// its orders read back, its jobs are claimed, new orders are recorded, and
    /// `_sqlx_migrations` is left exactly as it was, so sqlx-cli still agrees with it.
    #[tokio::test]
    async fn a_data_dir_migrated_and_written_by_sqlx_opens_with_its_orders() {
        let dir = TempDir::new().expect("temp dir");
        let file = dir.path().join("checkout.db");
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&file)
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
        let mut old = SqliteConnection::connect_with(&options)
            .await
            .expect("old connection");
        let folder =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/migrations/sqlite");
        let migrator = sqlx::migrate::Migrator::new(folder.as_path())
            .await
            .expect("migration files");
        migrator
            .run(&mut old)
            .await
            .expect("migrated as sqlx-cli does");
        // A CONFIRMED order with its capture pending, and an order a crash left RECEIVED.
        old.execute(
            "INSERT INTO orders (order_id, scope, idempotency_key, request_hash, customer_id, \
             cart_id, wallet_account_id, expected_currency, expected_minor, deadline_ms, phase, \
             status, reason, retryable, retry_after_ms, total_currency, total_minor, hold_id, \
             hold_sent_at_ms, fraud_review, created_at_ms, updated_at_ms) VALUES \
             ('o-old', 'tests:checkout', 'key-o-old', '5f1d', 'customer-1', 'cart-4200', \
             'account-1', NULL, NULL, 2400, 'DECIDED', 'CONFIRMED', '', 0, NULL, 'USD', 4200, \
             'hold-1', 10, 0, 0, 50), \
             ('o-crashed', 'tests:checkout', 'key-o-crashed', '5f1d', 'customer-1', \
             'cart-4200', 'account-1', 'USD', 4200, 2400, 'RECEIVED', 'PENDING', \
             'IN_PROGRESS', 0, NULL, NULL, NULL, NULL, NULL, 0, 0, 0); \
             INSERT INTO jobs (order_id, kind, state, attempts, run_at_ms, created_at_ms, \
             updated_at_ms) VALUES ('o-old', 'drive_order', 'done', 0, 100, 0, 50), \
             ('o-old', 'wallet_capture', 'pending', 0, 60, 50, 50), \
             ('o-crashed', 'drive_order', 'pending', 0, 100, 0, 0)",
        )
        .await
        .expect("rows written through sqlx");
        let before = applied(&mut old).await;
        let files = std::fs::read_dir(&folder)
            .expect("migrations folder")
            .filter(|f| {
                f.as_ref()
                    .is_ok_and(|f| f.file_name().to_string_lossy().ends_with(".sql"))
            })
            .count();
        assert_eq!(before.len(), files, "every migration applied: {before:?}");
        old.close().await.expect("closed");

        let store = SqliteStore::open(dir.path(), SqliteSynchronous::Full, 2, BACKGROUND)
            .await
            .expect("opens the old data dir");
        let confirmed = stored(&store, "o-old").await;
        assert_eq!(confirmed.status, OrderStatus::Confirmed);
        assert_eq!(confirmed.phase, Phase::Decided);
        assert_eq!(confirmed.total, Some(usd(4200)));
        assert_eq!(confirmed.hold_id.as_deref(), Some("hold-1"));
        let crashed = store
            .find("tests:checkout", "key-o-crashed")
            .await
            .expect("find")
            .expect("the crashed order is stored");
        assert_eq!(crashed.phase, Phase::Received);
        assert_eq!(crashed.order.expected_total, Some(usd(4200)));
        let jobs = claim(&store, "w", 100, 1_000).await;
        assert_eq!(
            kinds(&jobs),
            [
                ("o-old".to_owned(), JobKind::WalletCapture),
                ("o-crashed".to_owned(), JobKind::DriveOrder),
            ]
        );
        create(&store, "o-new", 200).await;
        store.close().await;

        let mut after = SqliteConnection::connect_with(&options)
            .await
            .expect("reopened");
        assert_eq!(applied(&mut after).await, before);
        migrator
            .run(&mut after)
            .await
            .expect("sqlx-cli finds nothing to apply");
        assert_eq!(applied(&mut after).await, before);
        after.close().await.expect("closed");
    }

    /// A fresh data dir records, for migration 3 (whose comment was reworded after release),
    /// the checksum of the text as released in 0e4aeca, so a binary rolled back to a release
    /// before the rewording opens it; and it opens again with this one.
    #[tokio::test]
    async fn a_fresh_data_dir_records_the_released_checksum_of_a_reworded_migration() {
        let dir = TempDir::new().expect("temp dir");
        let open = || SqliteStore::open(dir.path(), SqliteSynchronous::Full, 2, BACKGROUND);
        open().await.expect("fresh").close().await;
        let options =
            sqlx::sqlite::SqliteConnectOptions::new().filename(dir.path().join("checkout.db"));
        let mut conn = SqliteConnection::connect_with(&options)
            .await
            .expect("connect");
        let recorded = applied(&mut conn).await;
        conn.close().await.expect("closed");
        let (_, _, checksum, _) = &recorded[2];
        assert_eq!(hex(checksum), super::RELEASED_V3_SQLITE);
        let store = open()
            .await
            .expect("reopened with the released checksum recorded");
        create(&store, "o-1", 0).await;
        store.close().await;
    }

    /// `store::open` without a database URL opens SQLite under the data dir, and refuses a
    /// URL that is not PostgreSQL.
    #[tokio::test]
    async fn open_uses_sqlite_without_a_database_url() {
        let dir = TempDir::new().expect("temp dir");
        let mut config = checkout::config::StoreConfig {
            data_dir: dir.path().join("nested/data"),
            ..Default::default()
        };
        let store = checkout::store::open(&config).await.expect("open");
        create(&*store, "o-1", 0).await;
        store.close().await;
        assert!(dir.path().join("nested/data/checkout.db").exists());

        config.database_url = Some("mysql://localhost/checkout".to_owned());
        let refused = checkout::store::open(&config).await.err();
        assert!(
            matches!(refused, Some(StoreError::Unavailable(_))),
            "{refused:?}"
        );
    }
}

/// Opening PostgreSQL where nothing listens fails as Unavailable within the background limit.
#[tokio::test]
async fn opening_an_unreachable_postgres_fails_as_unavailable() {
    let started = std::time::Instant::now();
    let result = checkout::store::PostgresStore::open(
        "postgres://postgres@127.0.0.1:1/none",
        2,
        Duration::from_millis(5),
        Duration::from_millis(300),
        checkout::config::Pooler::None,
    )
    .await;
    assert!(
        matches!(result, Err(StoreError::Unavailable(_))),
        "{:?}",
        result.err()
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL only

#[cfg(feature = "postgres-tests")]
mod postgres_replicas {
    use super::*;
    use std::collections::HashSet;

    use sqlx::{Connection, Executor, PgConnection};

    /// Migration 3's checksum on PostgreSQL: a fresh database records the released text's (a
    /// binary rolled back opens it), one sqlx-cli migrated from the folder keeps the current
    /// text's; both open and take orders.
    #[tokio::test]
    async fn a_reworded_migration_opens_with_either_checksum() {
        let fresh = pg::TestDatabase::create("checkout_t").await;
        pg::open(&fresh).await.close().await;
        let by_cli = pg::TestDatabase::create("checkout_t").await;
        let folder =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/migrations/postgres");
        let migrator = sqlx::migrate::Migrator::new(folder.as_path())
            .await
            .expect("migration files");
        let current = hex(&migrator.iter().nth(2).expect("migration 3").checksum);
        assert_ne!(
            current,
            super::RELEASED_V3_POSTGRES,
            "the text was reworded"
        );
        // sqlx-cli, and the checksum reads below, on the server itself: their prepared
        // statements would outlive them on a transaction pooler's server connections and collide
        // with the next client's (as sqlx-cli's would; operators migrate past the pooler).
        let mut conn = PgConnection::connect(&by_cli.direct_url())
            .await
            .expect("connect");
        migrator
            .run(&mut conn)
            .await
            .expect("migrated as sqlx-cli does");
        conn.close().await.expect("closed");
        for (database, expected) in [(&fresh, super::RELEASED_V3_POSTGRES), (&by_cli, &current)] {
            let mut conn = PgConnection::connect(&database.direct_url())
                .await
                .expect("connect");
            let checksum: Vec<u8> =
                sqlx::query_scalar("SELECT checksum FROM _sqlx_migrations WHERE version = 3")
                    .fetch_one(&mut conn)
                    .await
                    .expect("migration 3 applied");
            conn.close().await.expect("closed");
            assert_eq!(hex(&checksum), expected);
            let store = pg::open(database).await;
            create(&store, "o-1", 0).await;
            store.close().await;
        }
    }

    /// Two replicas (two pools on one database) claiming in a loop lease each of 200 due jobs
    /// exactly once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_replicas_claiming_concurrently_never_lease_the_same_job() {
        let database = pg::TestDatabase::create("checkout_t").await;
        let a = Arc::new(pg::open(&database).await);
        let b = Arc::new(pg::open(&database).await);
        for i in 0..200 {
            create(&*a, &format!("o-{i:03}"), 0).await;
        }
        let claimer = |store: Arc<checkout::store::PostgresStore>, owner: &'static str| {
            tokio::spawn(async move {
                let mut ids = Vec::new();
                loop {
                    let jobs = store
                        .claim_due(owner, 10, 60_000, 3)
                        .await
                        .expect("claim_due");
                    if jobs.is_empty() {
                        return ids;
                    }
                    assert!(jobs.iter().all(|c| c.job.lease_owner == owner));
                    ids.extend(jobs.iter().map(|c| c.job.id));
                }
            })
        };
        let (from_a, from_b) = tokio::join!(claimer(a.clone(), "a"), claimer(b.clone(), "b"));
        let (from_a, from_b) = (from_a.expect("claimer a"), from_b.expect("claimer b"));
        let all: Vec<i64> = from_a.iter().chain(&from_b).copied().collect();
        let unique: HashSet<i64> = all.iter().copied().collect();
        assert_eq!(all.len(), 200, "a: {}, b: {}", from_a.len(), from_b.len());
        assert_eq!(unique.len(), 200, "a job was leased twice");
        a.close().await;
        b.close().await;
    }

    /// Concurrent begins of one order id from two replicas create it exactly once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn begins_from_two_replicas_create_an_order_exactly_once() {
        let database = pg::TestDatabase::create("checkout_t").await;
        let replicas: [Arc<dyn OrderStore>; 2] = [
            Arc::new(pg::open(&database).await),
            Arc::new(pg::open(&database).await),
        ];
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let store = Arc::clone(&replicas[i % 2]);
                tokio::spawn(async move {
                    store
                        .begin(&new_order("o-race", i as i64), 5_000, LIMIT)
                        .await
                        .expect("begin")
                })
            })
            .collect();
        let mut created = 0;
        for task in tasks {
            created += usize::from(matches!(task.await.expect("task"), Begin::Created(_)));
        }
        assert_eq!(created, 1);
        for store in &replicas {
            store.close().await;
        }
    }

    /// A background call whose statement runs long — a trigger on the probe row sleeping in
    /// `probe`'s write — is cut by the server at the call's budget: its transaction's
    /// `SET LOCAL statement_timeout`, with no session default behind it (none is set at
    /// connect, so a transaction pooler loses nothing). The call fails as Timeout within its
    /// limit, and no statement of the store is left sleeping on the server (a call cut off
    /// only on the client would leave it sleeping there for 30 s).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_statement_in_a_background_call_is_cancelled_by_the_server_at_its_budget() {
        let database = pg::TestDatabase::create("checkout_t").await;
        let budget = Duration::from_millis(500);
        let store = checkout::store::PostgresStore::open(
            &database.url(),
            2,
            Duration::from_millis(5),
            budget,
            crate::common::pg::pooler(),
        )
        .await
        .expect("open postgres");
        store.probe(1).await.expect("a first probe");

        let mut admin = PgConnection::connect(&database.direct_url())
            .await
            .expect("admin connection");
        admin
            .execute(
                "CREATE FUNCTION slow_probe() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN PERFORM pg_sleep(30); RETURN NEW; END $$; \
                 CREATE TRIGGER slow_probe BEFORE INSERT OR UPDATE ON store_probe \
                 FOR EACH ROW EXECUTE FUNCTION slow_probe()",
            )
            .await
            .expect("a sleeping trigger");

        let started = std::time::Instant::now();
        let result = store.probe(2).await;
        let took = started.elapsed();
        assert!(matches!(result, Err(StoreError::Timeout(_))), "{result:?}");
        assert!(took < budget + Duration::from_millis(500), "took {took:?}");

        let admin = tokio::sync::Mutex::new(admin);
        let sleeping = || async {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = $1 \
                 AND state = 'active' AND query LIKE '%INTO store_probe%' \
                 AND pid <> pg_backend_pid()",
            )
            .bind(database.name())
            .fetch_one(&mut *admin.lock().await)
            .await
            .expect("pg_stat_activity");
            n
        };
        crate::common::poll_until(
            "the store's sleeping statement (cancelled by the server)",
            Duration::from_secs(3),
            Duration::from_millis(20),
            sleeping,
            |n| *n == 0,
        )
        .await;
        store.close().await;
        admin.into_inner().close().await.ok();
    }

    /// A request-path write blocked by a row lock gives up within its limit with Timeout (the
    /// server cancels the statement), applies nothing, and leaves the store usable.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_write_blocked_by_a_row_lock_times_out_within_its_limit() {
        let database = pg::TestDatabase::create("checkout_t").await;
        let store = pg::open(&database).await;
        create(&store, "o-1", 100).await;

        let mut locker = PgConnection::connect(&database.url())
            .await
            .expect("second connection");
        locker.execute("BEGIN").await.expect("begin");
        locker
            .execute("SELECT * FROM orders WHERE order_id = 'o-1' FOR UPDATE")
            .await
            .expect("lock the order");

        let started = std::time::Instant::now();
        let result = store
            .record_hold_intent("o-1", &usd(1), 10, TimeLimit(Duration::from_millis(50)))
            .await;
        let took = started.elapsed();
        assert!(matches!(result, Err(StoreError::Timeout(_))), "{result:?}");
        assert!(took < Duration::from_secs(1), "took {took:?}");

        locker.execute("ROLLBACK").await.expect("unlock");
        assert_eq!(stored(&store, "o-1").await.phase, Phase::Received);
        store
            .record_hold_intent("o-1", &usd(1), 10, LIMIT)
            .await
            .expect("the store works once the lock is gone");
        assert_eq!(stored(&store, "o-1").await.phase, Phase::HoldSent);
        store.close().await;
        locker.close().await.ok();
    }
}

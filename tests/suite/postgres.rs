//! Orchestrator replicas sharing one real PostgreSQL database, end to end over gRPC on
//! 127.0.0.1:0 against in-process stubs: one idempotency key makes one order and one hold
//! across replicas, every follow-up job is worked by exactly one replica, a PENDING order left
//! by a stopped replica is finished by the other, a database that cannot be reached is
//! answered UNAVAILABLE (calling no one) and recovered from without a restart, and a replica
//! whose own clock is off takes no order over before its time (every stored time is on the
//! database's clock).
//!
//! Runs with `--features postgres-tests` against `CHECKOUT_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`). Each test creates its own `checkout_e2e_<random>`
//! database, which every replica of the test opens with its own pool, and drops it at the end.

#![cfg(feature = "postgres-tests")]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use checkout::config::Config;
use checkout::proto::checkout::v1::{
    self as pb, OrderStatus, checkout_service_client::CheckoutServiceClient,
    operator_service_client::OperatorServiceClient,
};
use checkout::proto::stub::v1::{self as stub, Behavior, Fault};
use checkout::server::Running;
use checkout::store::{OrderStore, PostgresStore, StoreClock};
use common::pg::TestDatabase;
use common::{
    Control, as_client, behavior, by_id, dur, order, poll_until, start_stubs, test_config,
    with_timeout,
};
use futures::StreamExt;
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tonic_types::StatusExt;

const SECOND: Duration = Duration::from_secs(1);

/// How long anything the worker owns may take to happen on a loaded 2-core machine.
const EVENTUALLY: Duration = Duration::from_secs(20);

/// Connections per replica's pool: two replicas per test, tests in parallel, and the server's
/// default `max_connections` of 100.
const POOL: u32 = 8;

// ---------------------------------------------------------------------------------------------
// Replicas and the stubs they share

/// One orchestrator process: its server, its own pool on the shared database, its clients.
///
/// Started by hand, not by `checkout-testkit` (the stubs are the testkit's): a test runs
/// several replicas over ONE set of stubs, and a `TestCheckout` owns the stubs it calls.
struct Replica {
    server: Running,
    checkout: CheckoutServiceClient<Channel>,
    operator: OperatorServiceClient<Channel>,
    store: Arc<dyn OrderStore>,
}

impl Replica {
    /// Starts a replica on `database` whose downstreams are `stubs`, with `adjust` applied to
    /// the harness policy.
    async fn start(
        stubs: &checkout_testkit::Stubs,
        database: &TestDatabase,
        adjust: impl FnOnce(&mut Config),
    ) -> Self {
        Self::start_with_clock(stubs, database, adjust, None).await
    }

    /// [`Replica::start`], its store measuring `clock` instead of a clock of its own when
    /// given (a replica whose own clock is off: [`StoreClock::with_local_skew`]).
    async fn start_with_clock(
        stubs: &checkout_testkit::Stubs,
        database: &TestDatabase,
        adjust: impl FnOnce(&mut Config),
        clock: Option<StoreClock>,
    ) -> Self {
        let mut config = test_config(&stubs.uri(), &std::env::temp_dir());
        config.store.database_url = Some(database.url());
        config.store.pooler = crate::common::pg::pooler();
        config.store.max_connections = POOL;
        adjust(&mut config);
        config.validate().unwrap();
        let config = Arc::new(config);
        let store: Arc<dyn OrderStore> = match clock {
            None => checkout::store::open(&config.store)
                .await
                .expect("open the shared PostgreSQL store"),
            Some(clock) => {
                let s = &config.store;
                Arc::new(
                    PostgresStore::open_with_clock(
                        &database.url(),
                        s.max_connections,
                        s.statement_guard,
                        s.background_timeout,
                        s.pooler,
                        clock,
                    )
                    .await
                    .expect("open the shared PostgreSQL store"),
                )
            }
        };
        let server = Running::start(
            TcpListener::bind("127.0.0.1:0").await.unwrap(),
            config,
            Arc::clone(&store),
        )
        .await
        .unwrap();
        Self {
            checkout: CheckoutServiceClient::connect(server.uri()).await.unwrap(),
            operator: OperatorServiceClient::connect(server.uri()).await.unwrap(),
            server,
            store,
        }
    }

    /// The gRPC health of this replica's CheckoutService.
    async fn health(&self) -> tonic_health::pb::health_check_response::ServingStatus {
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
        let channel = Endpoint::from_shared(self.server.uri())
            .unwrap()
            .connect()
            .await
            .unwrap();
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: "checkout.v1.CheckoutService".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status()
    }

    /// Places with a `grpc-timeout`; returns the answer and how long it took.
    async fn place(
        &self,
        message: pb::PlaceOrderRequest,
        timeout: Duration,
    ) -> (Result<pb::Order, tonic::Status>, Duration) {
        let started = Instant::now();
        let answer = self
            .checkout
            .clone()
            .place_order(with_timeout(message, timeout))
            .await
            .map(tonic::Response::into_inner);
        (answer, started.elapsed())
    }

    /// Reads an order by id.
    async fn get(&self, order_id: &str) -> pb::Order {
        self.checkout
            .clone()
            .get_order(as_client(by_id(order_id), "test"))
            .await
            .expect("GetOrder")
            .into_inner()
    }

    /// Polls GetOrder until the order is no longer PENDING.
    async fn settled(&self, order_id: &str) -> pb::Order {
        let what = format!("order {order_id} (settled)");
        let every = Duration::from_millis(50);
        poll_until(
            &what,
            EVENTUALLY,
            every,
            || self.get(order_id),
            |o| o.status() != OrderStatus::Pending,
        )
        .await
    }

    /// `checkout.v1.OperatorService/GetWorkerStats`.
    async fn worker_stats(&self) -> pb::WorkerStats {
        self.operator
            .clone()
            .get_worker_stats(pb::GetWorkerStatsRequest {})
            .await
            .expect("GetWorkerStats")
            .into_inner()
    }

    /// Polls GetWorkerStats until no job is pending.
    async fn idle(&self) -> pb::WorkerStats {
        let every = Duration::from_millis(50);
        poll_until(
            "the worker (idle)",
            EVENTUALLY,
            every,
            || self.worker_stats(),
            |s| s.jobs_pending == 0,
        )
        .await
    }

    /// Stops it like a process exit: the server drains, the worker stops, the pool closes.
    async fn stop(self) {
        drop((self.checkout, self.operator));
        self.server.stop().await.expect("replica stops cleanly");
        self.store.close().await;
    }
}

/// The stubs every replica of a test calls, and their control client.
struct Stubs {
    server: checkout_testkit::Stubs,
    control: Control,
}

impl Stubs {
    async fn start() -> Self {
        let server = start_stubs().await;
        let control = Control::connect(server.uri()).await;
        Self { server, control }
    }

    /// Sets the behaviour of one method.
    async fn configure(&self, service: &str, method: &str, behavior: Behavior) {
        self.control.configure(service, method, behavior).await;
    }

    /// All stats.
    async fn stats(&self) -> stub::GetStatsResponse {
        self.control.stats().await
    }

    /// Stats of one method.
    async fn method(&self, service: &str, method: &str) -> stub::MethodStats {
        self.control.method(service, method).await
    }

    /// Polls one method's stats until `ok` calls have succeeded.
    async fn ok_reaches(&self, service: &str, method: &str, ok: u64) -> stub::MethodStats {
        self.control
            .method_until(service, method, EVENTUALLY, |m| m.ok >= ok)
            .await
    }

    /// Effects of `method` on `reference`.
    async fn effects_on(&self, method: &str, reference: &str) -> usize {
        self.control.effects_on(method, reference).await
    }

    async fn stop(self) {
        self.server.stop().await;
    }
}

// ---------------------------------------------------------------------------------------------
// The tests

/// Ten PlaceOrder calls with one key, sent at once and split across two replicas while the
/// wallet takes 300 ms, make one order and one hold: the other calls answer PENDING IN_PROGRESS
/// or replay the order, and the order is CONFIRMED and captured exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_key_sent_to_two_replicas_at_once_is_held_and_captured_exactly_once() {
    let database = TestDatabase::create("checkout_e2e").await;
    let stubs = Stubs::start().await;
    let replicas = [
        Replica::start(&stubs.server, &database, |_| {}).await,
        Replica::start(&stubs.server, &database, |_| {}).await,
    ];
    stubs
        .configure("wallet", "Hold", behavior(300, Fault::None))
        .await;

    let request = order("one-key", "cart-500");
    let answers = futures::future::join_all(
        (0..10).map(|i| replicas[i % 2].place(request.clone(), 2 * SECOND)),
    )
    .await;
    let id = answers[0]
        .0
        .as_ref()
        .map(|o| o.order_id.clone())
        .unwrap_or_default();
    let (mut confirmed, mut in_progress) = (0, 0);
    for (i, (answer, took)) in answers.iter().enumerate() {
        let placed = answer
            .as_ref()
            .unwrap_or_else(|status| panic!("call {i} to replica {}: {status:?}", i % 2));
        assert_eq!(placed.order_id, id, "call {i}: one key, one order");
        assert!(
            *took < 2 * SECOND,
            "call {i} answered after its deadline: {took:?}"
        );
        match (placed.status(), placed.reason.as_str()) {
            (OrderStatus::Confirmed, "") => confirmed += 1,
            (OrderStatus::Pending, "IN_PROGRESS") => {
                in_progress += 1;
                assert_eq!(dur(&placed.retry_after), SECOND, "call {i}: {placed:?}");
            }
            _ => panic!("call {i}: neither the order nor IN_PROGRESS: {placed:?}"),
        }
    }
    assert!(
        confirmed >= 1,
        "the call that made the order is told CONFIRMED"
    );
    assert!(
        in_progress >= 1,
        "the calls overlapped the 300 ms hold ({confirmed} CONFIRMED, none IN_PROGRESS)"
    );

    let hold = stubs.method("wallet", "Hold").await;
    assert_eq!(hold.received, 1, "one hold reached the wallet: {hold:?}");
    assert_eq!(stubs.effects_on("Hold", &id).await, 1);
    assert_eq!(
        stubs.method("cart", "FreezeCart").await.received,
        1,
        "duplicates call no one"
    );
    for replica in &replicas {
        assert_eq!(replica.settled(&id).await.status(), OrderStatus::Confirmed);
    }

    stubs.ok_reaches("wallet", "Capture", 1).await;
    replicas[0].idle().await;
    let capture = stubs.method("wallet", "Capture").await;
    assert_eq!(capture.received, 1, "captured once: {capture:?}");
    assert_eq!(stubs.effects_on("Capture", &id).await, 1);
    let wallet = stubs.stats().await.wallet.unwrap();
    assert_eq!((wallet.holds_active, wallet.holds_captured), (0, 1));

    for replica in replicas {
        replica.stop().await;
    }
    stubs.stop().await;
}

/// Forty orders placed across two replicas are each captured and committed exactly once: both
/// replicas' workers claim from the shared jobs table, no job is worked by both, and none is
/// left pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_are_worked_once_across_replicas() {
    let database = TestDatabase::create("checkout_e2e").await;
    let stubs = Stubs::start().await;
    let replicas = [
        Replica::start(&stubs.server, &database, |_| {}).await,
        Replica::start(&stubs.server, &database, |_| {}).await,
    ];

    let orders = 40;
    let placed: Vec<_> = futures::stream::iter(0..orders)
        .map(|i| {
            let replica = &replicas[i % 2];
            async move {
                let key = format!("spread-{i}");
                let (answer, _) = replica
                    .place(order(&key, &format!("cart-{}", 100 + i)), 2 * SECOND)
                    .await;
                (key, answer)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    for (key, answer) in &placed {
        let placed = answer
            .as_ref()
            .unwrap_or_else(|status| panic!("{key}: {status:?}"));
        assert_eq!(placed.status(), OrderStatus::Confirmed, "{key}: {placed:?}");
    }

    let n = orders as u64;
    stubs.ok_reaches("wallet", "Capture", n).await;
    stubs.ok_reaches("inventory", "Commit", n).await;
    let stats = replicas[0].idle().await;
    assert_eq!(
        (stats.jobs_pending, stats.jobs_parked, stats.orders_pending),
        (0, 0, 0),
        "{stats:?}"
    );
    // Per order: a capture and a commit. No takeover job: each order was decided before its
    // takeover time, so none was ever written.
    assert_eq!(stats.jobs_done, 2 * n, "{stats:?}");
    assert_eq!(replicas[1].worker_stats().await.jobs_pending, 0);

    let capture = stubs.method("wallet", "Capture").await;
    assert_eq!(
        capture.received, n,
        "no capture was sent twice: {capture:?}"
    );
    let commit = stubs.method("inventory", "Commit").await;
    assert_eq!(commit.received, n, "no commit was sent twice: {commit:?}");
    assert_eq!(stubs.stats().await.wallet.unwrap().holds_captured, n);

    // Each replica counts the attempts its own worker made: together, one per job.
    let a = replicas[0].worker_stats().await;
    let b = replicas[1].worker_stats().await;
    assert_eq!(
        (a.first_attempts + b.first_attempts, a.retries + b.retries),
        (2 * n, 0),
        "a: {a:?}, b: {b:?}"
    );
    assert!(
        a.first_attempts > 0 && b.first_attempts > 0,
        "both replicas worked jobs: a: {a:?}, b: {b:?}"
    );

    for replica in replicas {
        replica.stop().await;
    }
    stubs.stop().await;
}

/// An order left PENDING WALLET_OUTCOME_UNKNOWN by a replica that then stops is finished by
/// the other replica once the wallet recovers: CONFIRMED, one hold, captured.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pending_order_of_a_stopped_replica_is_finished_by_the_other() {
    let database = TestDatabase::create("checkout_e2e").await;
    let stubs = Stubs::start().await;
    let short_settle = |c: &mut Config| c.worker.settle_window = Duration::from_millis(500);
    let a = Replica::start(&stubs.server, &database, short_settle).await;
    let b = Replica::start(&stubs.server, &database, short_settle).await;
    stubs
        .configure("wallet", "Hold", behavior(0, Fault::Internal))
        .await;

    let (answer, _) = a.place(order("orphan", "cart-600"), 2 * SECOND).await;
    let placed = answer.expect("PlaceOrder answers with an Order");
    assert_eq!(
        (placed.status(), placed.reason.as_str()),
        (OrderStatus::Pending, "WALLET_OUTCOME_UNKNOWN"),
        "{placed:?}"
    );
    a.stop().await;
    stubs
        .configure("wallet", "Hold", behavior(0, Fault::None))
        .await;

    let done = b.settled(&placed.order_id).await;
    assert_eq!(done.status(), OrderStatus::Confirmed, "{done:?}");
    assert_eq!(stubs.effects_on("Hold", &placed.order_id).await, 1);
    stubs.ok_reaches("wallet", "Capture", 1).await;
    let stats = b.idle().await;
    assert_eq!(
        (stats.jobs_parked, stats.orders_pending),
        (0, 0),
        "{stats:?}"
    );
    assert_eq!(stubs.effects_on("Capture", &placed.order_id).await, 1);

    b.stop().await;
    stubs.stop().await;
}

/// With its database refusing new connections and its open ones terminated, PlaceOrder
/// answers UNAVAILABLE with RetryInfo within its deadline and calls no one; once connections
/// are allowed again, the same key is CONFIRMED by the same process, with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_database_is_answered_unavailable_and_recovered_from_without_restart() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let database = TestDatabase::create("checkout_e2e").await;
    let stubs = Stubs::start().await;
    let replica = Replica::start(&stubs.server, &database, |_| {}).await;
    // Readiness is decided in the background once the store and downstreams answer.
    poll_until(
        "health SERVING after start",
        EVENTUALLY,
        Duration::from_millis(50),
        || replica.health(),
        |s| *s == ServingStatus::Serving,
    )
    .await;

    database.cut_off(EVENTUALLY).await;
    // The first attempt meets the pool's terminated connections, and its failed write wakes the
    // store's probe; the later ones come once the probe has found the server refusing new
    // connections (health NOT_SERVING).
    for attempt in 0..3 {
        let (answer, took) = replica.place(order("outage", "cart-700"), SECOND).await;
        let status = answer.expect_err("nothing can be recorded");
        assert_eq!(
            status.code(),
            Code::Unavailable,
            "attempt {attempt}: {status:?}"
        );
        let retry = status
            .get_details_retry_info()
            .unwrap_or_else(|| panic!("attempt {attempt}: no RetryInfo: {status:?}"));
        assert_eq!(retry.retry_delay, Some(2 * SECOND), "attempt {attempt}");
        assert!(
            took < SECOND,
            "attempt {attempt} answered after its deadline: {took:?}"
        );
        if attempt == 0 {
            poll_until(
                "CheckoutService health (NOT_SERVING once the probe finds the database gone)",
                EVENTUALLY,
                Duration::from_millis(50),
                || replica.health(),
                |s| *s == ServingStatus::NotServing,
            )
            .await;
        }
    }
    let called: Vec<_> = stubs
        .stats()
        .await
        .methods
        .into_iter()
        .filter(|m| m.received > 0)
        .map(|m| format!("{}.{}", m.service, m.method))
        .collect();
    assert!(called.is_empty(), "called without a record: {called:?}");

    database.restore().await;
    // Refused UNAVAILABLE until the store's probe (every 250 ms while it is down) sees it back.
    // A pooler reaches the server again only when it next tries to log in, which PgBouncer
    // does `server_login_retry` (15 s) after a failed login; until then it refuses too.
    let pooled = database.through_pooler();
    let within = if pooled {
        Duration::from_secs(30)
    } else {
        EVENTUALLY
    };
    let (answer, took) = poll_until(
        "PlaceOrder (answered with an Order once the store is back)",
        within,
        Duration::from_millis(50),
        || replica.place(order("outage", "cart-700"), 2 * SECOND),
        // Directly, anything but UNAVAILABLE ends the wait (a wrong answer fails below at
        // once); through a pooler, its own refusals while it backs off are waited out too.
        |(answer, _)| match answer {
            Ok(_) => true,
            Err(s) => !pooled && s.code() != Code::Unavailable,
        },
    )
    .await;
    let placed = answer.expect("the store is back: PlaceOrder answers with an Order");
    assert_eq!(placed.status(), OrderStatus::Confirmed, "{placed:?}");
    assert!(took < 2 * SECOND, "{took:?}");
    assert_eq!(stubs.effects_on("Hold", &placed.order_id).await, 1);
    stubs.ok_reaches("wallet", "Capture", 1).await;

    replica.stop().await;
    stubs.stop().await;
}

/// The database turns read-only while the replica runs: within a few probe intervals its gRPC
/// health for CheckoutService is NOT_SERVING (load balancers stop sending orders that would all
/// fail), and SERVING again once the database takes writes. And `sslmode` is honoured: the
/// local server speaks TLS, so `require` connects, while `verify-full` refuses its self-signed
/// certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_stops_taking_writes_turns_health_not_serving() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let database = TestDatabase::create("checkout_e2e").await;
    let stubs = Stubs::start().await;
    let replica = Replica::start(&stubs.server, &database, |c| {
        c.store.probe_interval = Duration::from_millis(100);
    })
    .await;
    let mut health = HealthClient::new(
        Endpoint::from_shared(replica.server.uri())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let status = |mut health: HealthClient<Channel>| async move {
        health
            .check(HealthCheckRequest {
                service: "checkout.v1.CheckoutService".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status()
    };
    // Readiness is decided in the background once the store and downstreams answer.
    poll_until(
        "health SERVING after start",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || status(health.clone()),
        |s| *s == ServingStatus::Serving,
    )
    .await;
    let name = database.name();
    let read_only = |on: bool| {
        let database = &database;
        let name = name.clone();
        async move {
            database
                .admin(&format!(
                    "ALTER DATABASE {name} SET default_transaction_read_only = {on}"
                ))
                .await;
            database
                .admin(&format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                ))
                .await;
        }
    };
    read_only(true).await;
    for expected in [ServingStatus::NotServing, ServingStatus::Serving] {
        poll_until(
            &format!("CheckoutService health (to be {expected:?})"),
            EVENTUALLY,
            Duration::from_millis(50),
            || status(health.clone()),
            |now| *now == expected,
        )
        .await;
        if expected == ServingStatus::NotServing {
            read_only(false).await;
        }
    }
    let _ = &mut health;
    replica.stop().await;

    // Past any pooler: TLS is the server's.
    let require = format!("{}?sslmode=require", database.direct_url());
    let config = checkout::config::StoreConfig {
        database_url: Some(require),
        ..Default::default()
    };
    let store = checkout::store::open(&config)
        .await
        .expect("sslmode=require: the server speaks TLS and rustls does too");
    store.close().await;
    let verify = checkout::config::StoreConfig {
        database_url: Some(format!("{}?sslmode=verify-full", database.direct_url())),
        ..Default::default()
    };
    let refused = checkout::store::open(&verify)
        .await
        .err()
        .expect("verify-full refuses a certificate no trusted CA signed");
    assert!(
        refused.to_string().to_lowercase().contains("certificate")
            || refused.to_string().to_lowercase().contains("tls"),
        "{refused}"
    );
    stubs.stop().await;
}

/// Places `count` orders at once through `replica`, each with `deadline`; returns their ids
/// once all are answered CONFIRMED.
async fn confirmed_orders(
    replica: &Replica,
    prefix: &str,
    count: usize,
    deadline: Duration,
) -> Vec<String> {
    let placed = futures::future::join_all(
        (0..count).map(|i| replica.place(order(&format!("{prefix}-{i}"), "cart-700"), deadline)),
    )
    .await;
    placed
        .into_iter()
        .map(|(answer, took)| {
            let order = answer.expect("PlaceOrder answers with an Order");
            assert_eq!(order.status(), OrderStatus::Confirmed, "{order:?}");
            assert!(took < deadline, "answered after its deadline: {took:?}");
            order.order_id
        })
        .collect()
}

/// A replica whose own clock is 4 s ahead takes no order over before its takeover time and
/// runs no job before it is due: it measured the database's clock when its store opened (its
/// offset reads about -4 s), and every time the replicas compare is on that clock. The
/// wallet's Hold takes 600 ms, so each order is still being worked when a replica 4 s ahead
/// on its own clock would take it over (its takeover time, the 2 s deadline plus the 2 s
/// grace, is reached at once by that clock): each order is held once, and captured after its
/// deadline. The same replica on an unmeasured clock — how every replica read time before —
/// takes the orders over while their owner works them, sending their holds again: the test
/// would see a clock the worker does not consult. The deadline leaves the owner 1.4 s beyond
/// the hold for its other steps and two store writes, which a loaded CI machine needs (with
/// 1 s, one order's decision once took 290 ms to write and was answered PENDING).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_whose_clock_is_ahead_takes_no_order_over_before_its_time() {
    let database = TestDatabase::create("checkout_e2e").await;
    let stubs = Stubs::start().await;
    stubs
        .configure("wallet", "Hold", behavior(600, Fault::None))
        .await;
    // A 600 ms hold is a slow call to the breaker (250 ms): it would open after ten.
    let patient = |c: &mut Config| c.breaker.slow_call_threshold = 2 * SECOND;
    let owner = Replica::start(&stubs.server, &database, patient).await;
    const DEADLINE: Duration = Duration::from_secs(2);
    // The takeover time, deadline + grace, is already past on this clock when an order begins.
    let grace = Config::default().worker.takeover_grace;
    let ahead_ms = i64::try_from((DEADLINE + grace).as_millis()).expect("a few seconds");
    let ahead = Replica::start_with_clock(
        &stubs.server,
        &database,
        patient,
        Some(StoreClock::measured().with_local_skew(ahead_ms)),
    )
    .await;
    let offset = ahead.store.clock().offset_ms();
    assert!(
        (offset + ahead_ms).abs() < 500,
        "the measured offset cancels the skew: {offset} ms"
    );

    const ORDERS: usize = 10;
    let started_ms = common::now_ms();
    let ids = confirmed_orders(&owner, "ahead", ORDERS, DEADLINE).await;
    stubs.ok_reaches("wallet", "Capture", ORDERS as u64).await;
    let holds = stubs.method("wallet", "Hold").await;
    assert_eq!(
        holds.received, ORDERS as u64,
        "one Hold per order: none was taken over while its owner worked it"
    );
    let deadline_ms = started_ms + i64::try_from(DEADLINE.as_millis()).expect("2 s");
    for effect in stubs.control.effects("wallet").await {
        if effect.method == "Capture" && ids.contains(&effect.reference) {
            let at = effect.applied_at.expect("a capture's time");
            let at_ms = at.seconds * 1_000 + i64::from(at.nanos / 1_000_000);
            assert!(
                at_ms >= deadline_ms,
                "{} captured {} ms before its caller's deadline",
                effect.reference,
                deadline_ms - at_ms
            );
        }
    }
    ahead.stop().await;

    let unmeasured = Replica::start_with_clock(
        &stubs.server,
        &database,
        patient,
        Some(StoreClock::local().with_local_skew(ahead_ms)),
    )
    .await;
    confirmed_orders(&owner, "unmeasured", ORDERS, DEADLINE).await;
    // At least one hold re-sent by a replica 4 s ahead on its own clock, while in flight.
    poll_until(
        "a Hold re-sent by the replica that is 4 s ahead on an unmeasured clock",
        EVENTUALLY,
        Duration::from_millis(50),
        || stubs.method("wallet", "Hold"),
        |m| m.received > 2 * ORDERS as u64,
    )
    .await;
    unmeasured.stop().await;
    owner.stop().await;
    stubs.stop().await;
}

//! The writes a group commit carries on PostgreSQL, and how a group runs: one set-based
//! statement for all the writes of one kind (`unnest` over arrays of their fields), so a group
//! of many writes costs a handful of round trips and statements, not one (or three) each.
//!
//! Writes run kind by kind: begins, hold intents, decisions, then job outcomes. Writes of one
//! kind that name the same row go to successive statements ("rounds"), since one statement
//! sees one snapshot and must not change a row twice; so repeats behave as if run in turn.
//! Writes in one group were all in flight at once, so any order among them is one their
//! callers could have seen.
//!
//! [`run`] fails (the transaction must then be rolled back) only when a statement fails or a
//! row that was written cannot be read back; a write that fails without changing anything (a
//! decision for an unknown order) just keeps its error.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use sqlx::Row;
use sqlx::postgres::{PgArguments, PgConnection, Postgres};
use sqlx::query::Query;

use super::super::bounded::Fail;
use super::super::group::{Reply, Ticket};
use super::super::{
    Begin, Decision, Failure, Job, JobOutcome, Money, NewOrder, OrderRecord, StoreError, sql,
};
use super::{Sql, decision};

/// Inserts new orders as RECEIVED, each with its takeover time, skipping those whose scope
/// already has their idempotency key; returns the ids inserted. `$1`..`$13` arrays
/// of the [`NewOrder`] fields (expected total as currency and amount), created at, takeover
/// time and traceparent.
const BEGIN_ORDERS: &str = "WITH input AS (\
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
     $6::text[], $7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::bigint[], \
     $12::bigint[], $13::text[]) \
     AS i (order_id, scope, idempotency_key, request_hash, customer_id, cart_id, \
     wallet_account_id, expected_currency, expected_minor, deadline_ms, created_at_ms, \
     takeover_at_ms, traceparent)), \
     created AS (\
     INSERT INTO orders (order_id, scope, idempotency_key, request_hash, customer_id, cart_id, \
     wallet_account_id, expected_currency, expected_minor, deadline_ms, phase, status, reason, \
     retryable, retry_after_ms, fraud_review, created_at_ms, updated_at_ms, traceparent, \
     takeover_at_ms) \
     SELECT order_id, scope, idempotency_key, request_hash, customer_id, cart_id, \
     wallet_account_id, expected_currency, expected_minor, deadline_ms, 'RECEIVED', 'PENDING', \
     'IN_PROGRESS', FALSE, NULL, FALSE, created_at_ms, created_at_ms, traceparent, \
     takeover_at_ms FROM input \
     ON CONFLICT DO NOTHING RETURNING order_id) \
     SELECT order_id FROM created";

/// Moves RECEIVED orders to HOLD_SENT with their frozen totals. `$1`..`$4` arrays of order
/// id, total currency and amount, and now.
const RECORD_HOLD_INTENTS: &str = "UPDATE orders o SET phase = 'HOLD_SENT', \
     total_currency = i.currency, total_minor = i.minor_units, hold_sent_at_ms = i.at_ms, \
     updated_at_ms = i.at_ms \
     FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) \
     AS i (order_id, currency, minor_units, at_ms) \
     WHERE o.order_id = i.order_id AND o.phase = 'RECEIVED'";

/// The orders named in `$1` (an array of ids), with their parked job kinds.
const SELECT_ORDERS: &str = concat!(
    sql::select_orders_sql!("string_agg"),
    " WHERE o.order_id = ANY ($1::text[])"
);

/// The orders of the (scope, idempotency key) pairs in `$1` and `$2` (arrays), with their
/// parked job kinds.
const SELECT_ORDERS_BY_KEY: &str = concat!(
    sql::select_orders_sql!("string_agg"),
    " JOIN unnest($1::text[], $2::text[]) AS k (scope, idempotency_key) ",
    "ON o.scope = k.scope AND o.idempotency_key = k.idempotency_key"
);

/// The lease condition of the set-based job outcomes: `$1`..`$3` arrays of job id, owner and
/// lease token, unnested with the outcome's own arrays as `i`. The jobs are found by id:
/// `state IS NOT DISTINCT FROM 'pending'` (the same as `=` for a NOT NULL column) does not
/// match the predicate of `jobs_due`, the index of pending jobs, so the plan cannot be one that
/// reads every pending job.
macro_rules! while_leased {
    () => {
        " WHERE jobs.id = i.id AND jobs.state IS NOT DISTINCT FROM 'pending' \
         AND jobs.lease_owner = i.owner AND jobs.run_at_ms = i.token RETURNING jobs.id"
    };
}

/// Ends leased jobs as done (keeping `updated_at_ms`); returns the ids whose lease held.
const FINISH_DONE: &str = concat!(
    "UPDATE jobs SET state = 'done', lease_owner = NULL ",
    "FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS i (id, owner, token)",
    while_leased!()
);

/// Hands leased jobs back for later: `$4`..`$8` arrays of next run, 1 if the attempt failed
/// else 0, error text, 1 if it was a rejection else 0, and now if it failed transiently else
/// NULL; returns the ids whose lease held.
const FINISH_RETRY: &str = concat!(
    "UPDATE jobs SET run_at_ms = i.run_at_ms, lease_owner = NULL, ",
    "attempts = jobs.attempts + i.failed, last_error = i.error, ",
    "rejections = jobs.rejections + i.rejected, ",
    "failing_since_ms = COALESCE(jobs.failing_since_ms, i.transient_at) ",
    "FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], ",
    "$6::text[], $7::bigint[], $8::bigint[]) ",
    "AS i (id, owner, token, run_at_ms, failed, error, rejected, transient_at)",
    while_leased!()
);

/// Parks a leased job and marks its order PARKED if it is PENDING, in one statement; returns
/// how many jobs were parked (0 when the lease was lost). `$1`..`$5` as
/// [`sql::finish_park_sql`].
const FINISH_PARK: &str = concat!(
    "WITH parked AS (",
    sql::finish_park_sql!(),
    " RETURNING order_id), ",
    "marked AS (UPDATE orders SET reason = 'PARKED', retry_after_ms = NULL, ",
    "updated_at_ms = $5 WHERE order_id IN (SELECT order_id FROM parked) ",
    "AND status = 'PENDING') ",
    "SELECT count(*) AS finished FROM parked"
);

/// A write queued for a group, with its caller's ticket.
#[derive(Debug)]
pub(super) struct Pending {
    /// Its place in the queue.
    pub(super) ticket: Ticket,
    /// What to write, and where the answer goes.
    pub(super) op: Op,
}

/// The writes a group carries.
#[derive(Debug)]
pub(super) enum Op {
    /// [`super::super::OrderStore::begin`].
    Begin {
        order: NewOrder,
        takeover_at_ms: i64,
        reply: Reply<Begin>,
    },
    /// [`super::super::OrderStore::record_hold_intent`].
    HoldIntent {
        order_id: String,
        total: Money,
        at_ms: i64,
        reply: Reply<()>,
    },
    /// [`super::super::OrderStore::decide`].
    Decide {
        decision: Decision,
        reply: Reply<OrderRecord>,
    },
    /// [`super::super::OrderStore::finish_job`].
    Finish {
        job: Job,
        outcome: JobOutcome,
        reply: Reply<bool>,
    },
}

impl Op {
    /// See [`Reply::refuse`].
    pub(super) fn refuse(self, error: &StoreError) {
        match self {
            Self::Begin { reply, .. } => reply.refuse(error),
            Self::HoldIntent { reply, .. } => reply.refuse(error),
            Self::Decide { reply, .. } => reply.refuse(error),
            Self::Finish { reply, .. } => reply.refuse(error),
        }
    }

    /// See [`Reply::settle`].
    pub(super) fn settle(self, group: Result<(), &StoreError>) {
        match self {
            Self::Begin { reply, .. } => reply.settle(group),
            Self::HoldIntent { reply, .. } => reply.settle(group),
            Self::Decide { reply, .. } => reply.settle(group),
            Self::Finish { reply, .. } => reply.settle(group),
        }
    }
}

/// Runs every write of `group` on `conn` (inside the group's transaction), kind by kind,
/// keeping each write's result in its reply.
pub(super) async fn run(
    conn: &mut PgConnection,
    q: Sql,
    group: &mut [Pending],
) -> Result<(), Fail> {
    let mut begins = Vec::new();
    let mut holds = Vec::new();
    let mut decides = Vec::new();
    let mut finishes = Vec::new();
    for pending in group.iter_mut() {
        match &mut pending.op {
            Op::Begin {
                order,
                takeover_at_ms,
                reply,
            } => begins.push((&*order, *takeover_at_ms, reply)),
            Op::HoldIntent {
                order_id,
                total,
                at_ms,
                reply,
            } => holds.push((order_id.as_str(), &*total, *at_ms, reply)),
            Op::Decide { decision, reply } => decides.push((&*decision, reply)),
            Op::Finish {
                job,
                outcome,
                reply,
            } => finishes.push((&*job, &*outcome, reply)),
        }
    }
    for round in rounds(begins, |(order, ..)| {
        (order.scope.clone(), order.idempotency_key.clone())
    }) {
        begin_orders(conn, q, round).await?;
    }
    for round in rounds(holds, |(order_id, ..)| (*order_id).to_owned()) {
        record_hold_intents(conn, q, round).await?;
    }
    for round in rounds(decides, |(d, _)| d.order_id.clone()) {
        let (decisions, replies): (Vec<_>, Vec<_>) = round.into_iter().unzip();
        let results = decide(conn, q, &decisions).await?;
        for (reply, result) in replies.into_iter().zip(results) {
            reply.result = Some(result);
        }
    }
    finish_jobs(conn, q, finishes).await
}

/// Splits `items` into rounds in which no key repeats, keeping their order: the first of each
/// key goes to the first round, a repeat to the next, and so on.
fn rounds<T, K: Hash + Eq>(mut items: Vec<T>, key: impl Fn(&T) -> K) -> Vec<Vec<T>> {
    let mut rounds = Vec::new();
    while !items.is_empty() {
        let mut seen = HashSet::new();
        let (round, rest): (Vec<T>, Vec<T>) =
            items.into_iter().partition(|item| seen.insert(key(item)));
        rounds.push(round);
        items = rest;
    }
    rounds
}

/// Reads the orders `ids` by id (in any order; an id given twice is read once).
pub(super) async fn load(
    conn: &mut PgConnection,
    q: Sql,
    ids: &[&str],
) -> Result<HashMap<String, OrderRecord>, Fail> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = q
        .query_planned_each_time(SELECT_ORDERS)
        .bind(ids)
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|row| {
            let record = sql::order_from_row(row)?;
            Ok((record.order.order_id.clone(), record))
        })
        .collect()
}

/// One round of begins (distinct order ids).
async fn begin_orders(
    conn: &mut PgConnection,
    q: Sql,
    round: Vec<(&NewOrder, i64, &mut Reply<Begin>)>,
) -> Result<(), Fail> {
    let text = |field: fn(&NewOrder) -> &str| -> Vec<&str> {
        round.iter().map(|(order, ..)| field(order)).collect()
    };
    let number = |field: fn(&NewOrder) -> i64| -> Vec<i64> {
        round.iter().map(|(order, ..)| field(order)).collect()
    };
    let rows = q
        .query_planned_each_time(BEGIN_ORDERS)
        .bind(text(|o| &o.order_id))
        .bind(text(|o| &o.scope))
        .bind(text(|o| &o.idempotency_key))
        .bind(text(|o| &o.request_hash))
        .bind(text(|o| &o.customer_id))
        .bind(text(|o| &o.cart_id))
        .bind(text(|o| &o.wallet_account_id))
        .bind(
            round
                .iter()
                .map(|(o, ..)| o.expected_total.as_ref().map(|m| m.currency.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(
            round
                .iter()
                .map(|(o, ..)| o.expected_total.as_ref().map(|m| m.minor_units))
                .collect::<Vec<_>>(),
        )
        .bind(number(|o| o.deadline_ms))
        .bind(number(|o| o.created_at_ms))
        .bind(round.iter().map(|(_, at, _)| *at).collect::<Vec<_>>())
        .bind(
            round
                .iter()
                .map(|(o, ..)| o.traceparent.as_deref())
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await?;
    let created = rows
        .iter()
        .map(|row| row.try_get::<String, _>("order_id"))
        .collect::<Result<HashSet<_>, _>>()?;
    // The conflicting inserts have committed (ON CONFLICT waited for them) or are this
    // transaction's own, so a new statement sees the rows.
    let existing: Vec<&NewOrder> = round
        .iter()
        .map(|(order, ..)| *order)
        .filter(|order| !created.contains(&order.order_id))
        .collect();
    let mut stored = load_by_key(conn, q, &existing).await?;
    for (order, _, reply) in round {
        reply.result = Some(if created.contains(&order.order_id) {
            Ok(Begin::Created(sql::received(order)))
        } else {
            stored
                .remove(&(order.scope.clone(), order.idempotency_key.clone()))
                .map(Begin::Existing)
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("order {} neither new nor stored", order.order_id))
                })
        });
    }
    Ok(())
}

/// Reads the stored orders of the scopes and keys of `orders`, by (scope, key).
async fn load_by_key(
    conn: &mut PgConnection,
    q: Sql,
    orders: &[&NewOrder],
) -> Result<HashMap<(String, String), OrderRecord>, Fail> {
    if orders.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = q
        .query_planned_each_time(SELECT_ORDERS_BY_KEY)
        .bind(orders.iter().map(|o| o.scope.as_str()).collect::<Vec<_>>())
        .bind(
            orders
                .iter()
                .map(|o| o.idempotency_key.as_str())
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|row| {
            let record = sql::order_from_row(row)?;
            let key = (
                record.order.scope.clone(),
                record.order.idempotency_key.clone(),
            );
            Ok((key, record))
        })
        .collect()
}

/// One round of hold intents (distinct order ids).
async fn record_hold_intents(
    conn: &mut PgConnection,
    q: Sql,
    round: Vec<(&str, &Money, i64, &mut Reply<()>)>,
) -> Result<(), Fail> {
    q.query_planned_each_time(RECORD_HOLD_INTENTS)
        .bind(round.iter().map(|(id, ..)| *id).collect::<Vec<_>>())
        .bind(
            round
                .iter()
                .map(|(_, t, ..)| t.currency.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            round
                .iter()
                .map(|(_, t, ..)| t.minor_units)
                .collect::<Vec<_>>(),
        )
        .bind(round.iter().map(|(_, _, at, _)| *at).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
    for (.., reply) in round {
        reply.result = Some(Ok(()));
    }
    Ok(())
}

/// Decisions for distinct orders, in one statement: each order as stored afterwards, or a
/// Corrupt error for an unknown order (which changed nothing).
pub(super) async fn decide(
    conn: &mut PgConnection,
    q: Sql,
    decisions: &[&Decision],
) -> Result<Vec<Result<OrderRecord, StoreError>>, Fail> {
    let rows = q
        .send_planned_each_time(decision::query(decisions.iter().copied()))
        .fetch_all(&mut *conn)
        .await?;
    let mut decided = rows
        .iter()
        .map(|row| {
            let record = sql::order_from_row(row)?;
            Ok((record.order.order_id.clone(), record))
        })
        .collect::<Result<HashMap<_, _>, Fail>>()?;
    // Nothing changed for the others: answer from what is stored. A new statement takes a new
    // snapshot, so it sees a decision that committed while this one waited for the row.
    let unchanged: Vec<&str> = decisions
        .iter()
        .map(|d| d.order_id.as_str())
        .filter(|id| !decided.contains_key(*id))
        .collect();
    let mut stored = load(conn, q, &unchanged).await?;
    Ok(decisions
        .iter()
        .map(|d| {
            decided
                .remove(&d.order_id)
                .or_else(|| stored.remove(&d.order_id))
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("decision for unknown order {}", d.order_id))
                })
        })
        .collect())
}

/// A job outcome waiting in a group.
type Finish<'a> = (&'a Job, &'a JobOutcome, &'a mut Reply<bool>);

/// Job outcomes: done and retry as one statement per round each; parking and done with a
/// decision one by one (rare, and a decision must roll back with its job).
async fn finish_jobs(
    conn: &mut PgConnection,
    q: Sql,
    finishes: Vec<Finish<'_>>,
) -> Result<(), Fail> {
    let mut done = Vec::new();
    let mut retry = Vec::new();
    let mut single = Vec::new();
    for finish in finishes {
        match finish.1 {
            JobOutcome::Done(None) => done.push(finish),
            JobOutcome::RetryAt { .. } => retry.push(finish),
            JobOutcome::Done(Some(_)) | JobOutcome::Park { .. } => single.push(finish),
        }
    }
    for round in rounds(done, |(job, ..)| job.id) {
        let held = leased(
            q.query_planned_each_time(FINISH_DONE)
                .bind(round.iter().map(|(job, ..)| job.id).collect::<Vec<_>>())
                .bind(
                    round
                        .iter()
                        .map(|(job, ..)| job.lease_owner.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    round
                        .iter()
                        .map(|(job, ..)| job.lease_until_ms)
                        .collect::<Vec<_>>(),
                ),
            conn,
        )
        .await?;
        settle_leases(round, &held);
    }
    for round in rounds(retry, |(job, ..)| job.id) {
        let mut run_at = Vec::with_capacity(round.len());
        let mut failed = Vec::with_capacity(round.len());
        let mut errors = Vec::with_capacity(round.len());
        let mut rejected = Vec::with_capacity(round.len());
        let mut transient_at = Vec::with_capacity(round.len());
        for (_, outcome, _) in &round {
            if let JobOutcome::RetryAt {
                run_at_ms,
                failure,
                error,
                at_ms,
            } = outcome
            {
                run_at.push(*run_at_ms);
                failed.push(i64::from(failure.failed()));
                errors.push(error.as_str());
                rejected.push(i64::from(*failure == Failure::Rejection));
                transient_at.push((*failure == Failure::Transient).then_some(*at_ms));
            }
        }
        let held = leased(
            q.query_planned_each_time(FINISH_RETRY)
                .bind(round.iter().map(|(job, ..)| job.id).collect::<Vec<_>>())
                .bind(
                    round
                        .iter()
                        .map(|(job, ..)| job.lease_owner.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    round
                        .iter()
                        .map(|(job, ..)| job.lease_until_ms)
                        .collect::<Vec<_>>(),
                )
                .bind(run_at)
                .bind(failed)
                .bind(errors)
                .bind(rejected)
                .bind(transient_at),
            conn,
        )
        .await?;
        settle_leases(round, &held);
    }
    for (job, outcome, reply) in single {
        reply.result = Some(Ok(finish_one(conn, q, job, outcome).await?));
    }
    Ok(())
}

/// The job ids a set-based outcome returned: those whose lease held.
async fn leased(
    query: Query<'_, Postgres, PgArguments>,
    conn: &mut PgConnection,
) -> Result<HashSet<i64>, Fail> {
    let rows = query.fetch_all(&mut *conn).await?;
    Ok(rows
        .iter()
        .map(|row| row.try_get::<i64, _>("id"))
        .collect::<Result<_, _>>()?)
}

/// Each outcome's answer: whether its lease held.
fn settle_leases(round: Vec<Finish<'_>>, held: &HashSet<i64>) {
    for (job, _, reply) in round {
        reply.result = Some(Ok(held.contains(&job.id)));
    }
}

/// A parking, or a done with a decision, on its own: whether the lease held. A decision for
/// an unknown order fails the whole write (its job must not be finished either).
async fn finish_one(
    conn: &mut PgConnection,
    q: Sql,
    job: &Job,
    outcome: &JobOutcome,
) -> Result<bool, Fail> {
    let lease = |statement: &'static str| {
        q.query_planned_each_time(statement)
            .bind(job.id)
            .bind(&job.lease_owner)
            .bind(job.lease_until_ms)
    };
    match outcome {
        JobOutcome::Park { error, at_ms } => {
            let row = lease(FINISH_PARK)
                .bind(error)
                .bind(at_ms)
                .fetch_one(&mut *conn)
                .await?;
            let parked: i64 = row.try_get("finished")?;
            Ok(parked == 1)
        }
        JobOutcome::Done(Some(decision)) => {
            let done = lease(sql::FINISH_DONE)
                .bind(Some(decision.at_ms))
                .execute(&mut *conn)
                .await?
                .rows_affected();
            if done != 1 {
                return Ok(false);
            }
            match decide(conn, q, &[decision]).await?.pop() {
                Some(Ok(_)) => Ok(true),
                Some(Err(e)) => Err(Fail::Store(e)),
                None => Err(Fail::Store(StoreError::Corrupt(
                    "a decision returned no result".to_owned(),
                ))),
            }
        }
        // Set-based outcomes never come here; one that did is finished the same way.
        JobOutcome::Done(None) => Ok(lease(sql::FINISH_DONE)
            .bind(None::<i64>)
            .execute(&mut *conn)
            .await?
            .rows_affected()
            == 1),
        JobOutcome::RetryAt {
            run_at_ms,
            failure,
            error,
            at_ms,
        } => Ok(lease(sql::FINISH_RETRY)
            .bind(run_at_ms)
            .bind(i64::from(failure.failed()))
            .bind(error)
            .bind(i64::from(*failure == Failure::Rejection))
            .bind((*failure == Failure::Transient).then_some(*at_ms))
            .execute(&mut *conn)
            .await?
            .rows_affected()
            == 1),
    }
}

//! What an order's follow-up work costs the SQLite writer in two layouts, side by side: as job
//! rows (today's store: a capture and a commit row per order, with their unique and due
//! indexes), or as columns of the order row (due time, state and lease of the capture and of
//! the commit; the worker claims through a partial index on each due time).
//!
//! The writer thread is most of serve's CPU beyond the bare fan-out (docs/benchmarks.md), so
//! this measures the one lever that changes what an order writes, without touching the store:
//! every statement of an order's life that differs between the layouts runs on a real file
//! with the store's schema and pragmas (WAL, `synchronous = FULL`, foreign keys), in groups
//! of writes per transaction as the writer commits them, and the thread's CPU time per order
//! is read from the kernel. The rows layout runs the store's own statement texts; the columns
//! layout their one-row equivalents.
//!
//! ```sh
//! cargo run --release -p checkout-bench --example follow_up_layout -- [ORDERS] [ROUNDS] [rows|columns]
//! ```
//!
//! With a layout named, only that one runs: under `valgrind --tool=callgrind` its instruction
//! count is a figure that a busy machine does not move.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, named_params};

/// Orders written together in one transaction, as the writer's group commit does at ~1,100/s.
const GROUP: usize = 8;

/// The store's order insert (the takeover time included).
const INSERT_ORDER: &str = "INSERT INTO orders (order_id, scope, idempotency_key, \
     request_hash, customer_id, cart_id, wallet_account_id, expected_currency, expected_minor, \
     deadline_ms, phase, status, reason, retryable, retry_after_ms, fraud_review, \
     created_at_ms, updated_at_ms, traceparent, takeover_at_ms) \
     VALUES ($1, 'load', $2, 'h', 'c1', 'cart-100', 'a1', NULL, NULL, \
     $3, 'RECEIVED', 'PENDING', 'IN_PROGRESS', 0, NULL, 0, $3, $3, NULL, $4) \
     ON CONFLICT DO NOTHING";

const RECORD_HOLD_INTENT: &str = "UPDATE orders SET phase = 'HOLD_SENT', \
     total_currency = 'USD', total_minor = 1234, hold_sent_at_ms = $2, updated_at_ms = $2 \
     WHERE order_id = $1 AND phase = 'RECEIVED'";

/// The store's decision (its RETURNING list shortened to what the layouts share).
const DECIDE_ROWS: &str = "UPDATE orders SET phase = 'DECIDED', status = 'CONFIRMED', \
     reason = '', retryable = 0, retry_after_ms = NULL, fraud_review = 0, updated_at_ms = $2, \
     hold_id = 'h-1', takeover_at_ms = NULL \
     WHERE order_id = $1 AND status = 'PENDING' \
     RETURNING order_id, status, (SELECT group_concat(j.kind, ',') FROM jobs j \
     WHERE j.order_id = orders.order_id AND j.state = 'parked') AS parked_jobs";

/// The decision's two follow-up jobs, in one statement (as `insert_jobs` builds it).
const INSERT_JOBS: &str = "INSERT INTO jobs (order_id, kind, state, attempts, run_at_ms, \
     created_at_ms, updated_at_ms) VALUES (?1, 'wallet_capture', 'pending', 0, ?2, ?2, ?2), \
     (?1, 'inventory_commit', 'pending', 0, ?2, ?2, ?2) ON CONFLICT (order_id, kind) DO NOTHING";

/// The decision with its follow-up work as columns of the same row.
const DECIDE_COLUMNS: &str = "UPDATE orders SET phase = 'DECIDED', status = 'CONFIRMED', \
     reason = '', retryable = 0, retry_after_ms = NULL, fraud_review = 0, updated_at_ms = $2, \
     hold_id = 'h-1', takeover_at_ms = NULL, \
     capture_state = 'pending', capture_run_at_ms = $2, \
     commit_state = 'pending', commit_run_at_ms = $2 \
     WHERE order_id = $1 AND status = 'PENDING' \
     RETURNING order_id, status, NULL AS parked_jobs";

/// The claim's takeover sweep (both layouts: an empty index range when nothing is due).
const INSERT_TAKEOVERS: &str = "INSERT INTO jobs (order_id, kind, state, attempts, run_at_ms, \
     created_at_ms, updated_at_ms) \
     SELECT order_id, 'drive_order', 'pending', 0, takeover_at_ms, $1, $1 FROM orders \
     WHERE takeover_at_ms <= $1 ORDER BY takeover_at_ms, order_id LIMIT $2 \
     ON CONFLICT (order_id, kind) DO NOTHING";
const CLEAR_TAKEOVERS: &str = "UPDATE orders SET takeover_at_ms = NULL \
     WHERE order_id IN (SELECT order_id FROM orders \
     WHERE takeover_at_ms <= $1 ORDER BY takeover_at_ms, order_id LIMIT $2)";

/// The store's claim: due jobs with their orders' columns, then the same jobs leased.
const DUE_JOBS: &str = "SELECT jb.id, jb.order_id, jb.kind, jb.attempts, o.status, o.hold_id, \
     o.total_minor FROM jobs jb LEFT JOIN orders o ON o.order_id = jb.order_id \
     WHERE jb.state = 'pending' AND jb.run_at_ms <= $1 ORDER BY jb.run_at_ms, jb.id LIMIT $2";
const LEASE_DUE_JOBS: &str = "UPDATE jobs SET lease_owner = $3, run_at_ms = $4, \
     updated_at_ms = $1 WHERE id IN (SELECT id FROM jobs \
     WHERE state = 'pending' AND run_at_ms <= $1 ORDER BY run_at_ms, id LIMIT $2)";
const FINISH_DONE: &str = "UPDATE jobs SET state = 'done', lease_owner = NULL, \
     updated_at_ms = COALESCE($4, updated_at_ms) \
     WHERE id = $1 AND state = 'pending' AND lease_owner = $2 AND run_at_ms = $3";

/// The columns layout's claim: due captures and due commits through their partial indexes,
/// each kind leased by one statement.
const DUE_COLUMNS: &str = "SELECT * FROM (SELECT order_id, 'wallet_capture', status, \
     hold_id, total_minor FROM orders WHERE capture_state = 'pending' AND capture_run_at_ms <= $1 \
     LIMIT $2) UNION ALL SELECT * FROM (SELECT order_id, 'inventory_commit', status, hold_id, \
     total_minor FROM orders WHERE commit_state = 'pending' AND commit_run_at_ms <= $1 LIMIT $2)";
const LEASE_CAPTURES: &str = "UPDATE orders SET capture_lease_owner = $3, capture_run_at_ms = $4 \
     WHERE order_id IN (SELECT order_id FROM orders \
     WHERE capture_state = 'pending' AND capture_run_at_ms <= $1 LIMIT $2)";
const LEASE_COMMITS: &str = "UPDATE orders SET commit_lease_owner = $3, commit_run_at_ms = $4 \
     WHERE order_id IN (SELECT order_id FROM orders \
     WHERE commit_state = 'pending' AND commit_run_at_ms <= $1 LIMIT $2)";
const FINISH_CAPTURE: &str = "UPDATE orders SET capture_state = 'done', \
     capture_lease_owner = NULL, updated_at_ms = $4 WHERE order_id = $1 \
     AND capture_state = 'pending' AND capture_lease_owner = $2 AND capture_run_at_ms = $3";
const FINISH_COMMIT: &str = "UPDATE orders SET commit_state = 'done', \
     commit_lease_owner = NULL, updated_at_ms = $4 WHERE order_id = $1 \
     AND commit_state = 'pending' AND commit_lease_owner = $2 AND commit_run_at_ms = $3";

/// The columns the second layout adds, and its claim's indexes.
const COLUMNS_SCHEMA: &str = "
    ALTER TABLE orders ADD COLUMN capture_state TEXT;
    ALTER TABLE orders ADD COLUMN capture_run_at_ms INTEGER;
    ALTER TABLE orders ADD COLUMN capture_lease_owner TEXT;
    ALTER TABLE orders ADD COLUMN commit_state TEXT;
    ALTER TABLE orders ADD COLUMN commit_run_at_ms INTEGER;
    ALTER TABLE orders ADD COLUMN commit_lease_owner TEXT;
    CREATE INDEX orders_capture_due ON orders (capture_run_at_ms) WHERE capture_state = 'pending';
    CREATE INDEX orders_commit_due ON orders (commit_run_at_ms) WHERE commit_state = 'pending';
";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    Rows,
    Columns,
}

/// A fresh database with the store's schema (applied by the store itself), connected as the
/// writer connects.
async fn fresh(dir: &Path, layout: Layout) -> anyhow::Result<Connection> {
    let config = checkout::config::StoreConfig {
        data_dir: dir.to_path_buf(),
        ..Default::default()
    };
    drop(checkout::store::open(&config).await?);
    let conn = Connection::open(dir.join("checkout.db"))?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; \
         PRAGMA temp_store = MEMORY;",
    )?;
    if layout == Layout::Columns {
        conn.execute_batch(COLUMNS_SCHEMA)?;
    }
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// This thread's CPU time so far.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid pointer given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Writes `orders` orders through their whole life (recorded, hold intent, decided; the
/// worker's claim and both follow-ups done), `GROUP` writes per transaction, and returns the
/// thread's CPU time per order and the file's bytes per order.
fn drive(conn: &Connection, layout: Layout, orders: usize) -> anyhow::Result<(f64, u64)> {
    let owner = "worker-1";
    let started = thread_cpu();
    let mut now: i64 = 1_800_000_000_000;
    for batch in 0..orders / GROUP {
        let ids: Vec<String> = (0..GROUP)
            .map(|i| {
                format!(
                    "ord_{:016x}{:08x}",
                    rand::random::<u64>(),
                    batch * GROUP + i
                )
            })
            .collect();
        now += 7;
        // The request path: three commits per order, as three groups.
        for step in 0..3 {
            let tx = conn.unchecked_transaction()?;
            for id in &ids {
                match step {
                    0 => {
                        conn.prepare_cached(INSERT_ORDER)?.execute(named_params! {
                            "$1": id, "$2": id, "$3": now, "$4": now + 4_000,
                        })?;
                    }
                    1 => {
                        conn.prepare_cached(RECORD_HOLD_INTENT)?
                            .execute(named_params! { "$1": id, "$2": now })?;
                    }
                    _ => match layout {
                        Layout::Rows => {
                            conn.prepare_cached(DECIDE_ROWS)?
                                .query_row(named_params! { "$1": id, "$2": now }, |_| Ok(()))?;
                            conn.prepare_cached(INSERT_JOBS)?
                                .execute(rusqlite::params![id, now])?;
                        }
                        Layout::Columns => {
                            conn.prepare_cached(DECIDE_COLUMNS)?
                                .query_row(named_params! { "$1": id, "$2": now }, |_| Ok(()))?;
                        }
                    },
                }
            }
            tx.commit()?;
        }
        // The worker: one claim of what is due, then each follow-up finished.
        let lease = now + 10_000;
        let tx = conn.unchecked_transaction()?;
        let sweep = named_params! { "$1": now, "$2": 500 };
        conn.prepare_cached(INSERT_TAKEOVERS)?.execute(sweep)?;
        conn.prepare_cached(CLEAR_TAKEOVERS)?.execute(sweep)?;
        let limit = i64::try_from(2 * GROUP)?;
        let claim = named_params! { "$1": now, "$2": limit, "$3": owner, "$4": lease };
        let claimed: Vec<(String, String)> = match layout {
            Layout::Rows => {
                let jobs = conn
                    .prepare_cached(DUE_JOBS)?
                    .query_map(named_params! { "$1": now, "$2": limit }, |row| {
                        Ok((row.get::<_, i64>(0)?.to_string(), row.get(2)?))
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                conn.prepare_cached(LEASE_DUE_JOBS)?.execute(claim)?;
                jobs
            }
            Layout::Columns => {
                let jobs = conn
                    .prepare_cached(DUE_COLUMNS)?
                    .query_map(named_params! { "$1": now, "$2": limit }, |row| {
                        Ok((row.get(0)?, row.get(1)?))
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                conn.prepare_cached(LEASE_CAPTURES)?.execute(claim)?;
                conn.prepare_cached(LEASE_COMMITS)?.execute(claim)?;
                jobs
            }
        };
        tx.commit()?;
        anyhow::ensure!(claimed.len() == 2 * GROUP, "claimed {}", claimed.len());
        let tx = conn.unchecked_transaction()?;
        for (id, kind) in &claimed {
            let done = match layout {
                Layout::Rows => conn.prepare_cached(FINISH_DONE)?.execute(named_params! {
                    "$1": id.parse::<i64>()?, "$2": owner, "$3": lease, "$4": now,
                })?,
                Layout::Columns => {
                    let text = if kind == "wallet_capture" {
                        FINISH_CAPTURE
                    } else {
                        FINISH_COMMIT
                    };
                    conn.prepare_cached(text)?.execute(named_params! {
                        "$1": id, "$2": owner, "$3": lease, "$4": now,
                    })?
                }
            };
            anyhow::ensure!(done == 1, "{kind} of {id} not finished");
        }
        tx.commit()?;
    }
    let cpu = thread_cpu() - started;
    let bytes: i64 = conn.query_row(
        "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
        [],
        |row| row.get(0),
    )?;
    let bytes = u64::try_from(bytes)?;
    let written = u64::try_from(orders / GROUP * GROUP)?;
    Ok((cpu.as_secs_f64() * 1e6 / written as f64, bytes / written))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let orders: usize = args.next().map_or(Ok(40_000), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(3), |a| a.parse())?;
    let only = args.next();
    let layouts: Vec<Layout> = [Layout::Rows, Layout::Columns]
        .into_iter()
        .filter(|l| {
            only.as_deref()
                .is_none_or(|o| format!("{l:?}").eq_ignore_ascii_case(o))
        })
        .collect();
    anyhow::ensure!(!layouts.is_empty(), "the layout is rows or columns");
    println!(
        "{orders} orders per run, {GROUP} writes per transaction, synchronous = FULL, {rounds} \
         rounds alternated; writer-thread CPU per order (µs) and database bytes per order"
    );
    let mut totals = [(0.0, 0u64), (0.0, 0u64)];
    for round in 1..=rounds {
        for &layout in &layouts {
            let i = usize::from(layout == Layout::Columns);
            let dir = tempfile::tempdir()?;
            let conn = fresh(dir.path(), layout).await?;
            let (us, bytes) = drive(&conn, layout, orders)?;
            println!("round {round} {layout:?}: {us:.1} µs/order, {bytes} bytes/order");
            totals[i].0 += us;
            totals[i].1 += bytes;
        }
    }
    if layouts.len() < 2 {
        return Ok(());
    }
    let n = rounds as f64;
    let (rows, cols) = (totals[0].0 / n, totals[1].0 / n);
    println!(
        "mean: rows {rows:.1} µs/order ({} bytes), columns {cols:.1} µs/order ({} bytes): \
         columns {:.2}x rows",
        totals[0].1 / rounds as u64,
        totals[1].1 / rounds as u64,
        cols / rows
    );
    Ok(())
}

//! `op-834` (the traced capture of "Deadlines, Timeouts, Retries, Hedging, and Idempotency"): the caller allows 240 ms; the service reaches the ledger at 79 ms
//! and the ledger would commit at 388 ms, after the caller gave up; the client retries op-834 at
//! 427 ms. Modelled with cart 18 ms, fraud 61 ms (so the hold leaves at about 79 ms) and a wallet
//! Hold taking 309 ms. Expected: an answer before 240 ms, no wallet effect after the deadline of
//! the call that caused it, the retry at 427 ms replaying the stored answer (same order, no new
//! hold), the reconciler resolving the outcome through the stable reference (one hold, at most
//! one capture), a retry after that replaying CONFIRMED, and a changed payload under the same key
//! refused as a conflict.

use std::time::{Duration, Instant};

use tonic_types::StatusExt;

use super::rig::{self, Rig};
use super::{Options, Report, ScenarioError, ms};
use crate::load::outcome_of;
use checkout_proto::checkout::v1 as pb;

/// The caller's deadline.
const DEADLINE: Duration = Duration::from_millis(240);
/// When the client retries op-834 through another gateway.
const RETRY_AT: Duration = Duration::from_millis(427);
/// When the ledger would commit, from the caller's start.
const COMMIT_AT_MS: u32 = 388;
/// When the service calls the ledger, from the caller's start.
const LEDGER_CALL_MS: u32 = 79;
/// How long the reconciler may take to resolve the outcome (it waits `settle_window`, 2 s).
const RESOLVE_WITHIN: Duration = Duration::from_secs(20);

/// Runs the scenario.
pub async fn run(options: &Options) -> Result<Report, ScenarioError> {
    let rig = Rig::start(options.config.clone()).await?;
    let result = drive(&rig).await;
    rig.stop().await?;
    result
}

async fn drive(rig: &Rig) -> Result<Report, ScenarioError> {
    let mut report = Report::new("op-834");
    report.setup(format!(
        "one order, deadline {} ms; cart 18 ms, fraud 61 ms, wallet Hold {} ms (commit at ~{} ms); \
         same key again at {} ms",
        DEADLINE.as_millis(),
        COMMIT_AT_MS - LEDGER_CALL_MS,
        COMMIT_AT_MS,
        RETRY_AT.as_millis()
    ));
    rig.configure("cart", "FreezeCart", rig::latency(18))
        .await?;
    rig.configure("fraud", "Score", rig::latency(LEDGER_CALL_MS - 18))
        .await?;
    rig.configure(
        "wallet",
        "Hold",
        rig::latency(COMMIT_AT_MS - LEDGER_CALL_MS),
    )
    .await?;

    let op = rig::order("op-834", "cart-4200");
    let started = Instant::now();
    let (first, took) = rig.place(op.clone(), DEADLINE).await;
    let first_text = answer_text(&first);
    let hold_step = first
        .as_ref()
        .ok()
        .and_then(|o| o.budget.as_ref())
        .and_then(|b| b.steps.iter().find(|s| s.name == "wallet_hold"))
        .map(|s| {
            format!(
                "hold sent at {} with {} left to it",
                ms(duration(&s.offset)),
                ms(duration(&s.allotted))
            )
        })
        .unwrap_or_else(|| "no hold step".to_owned());
    report.check(
        "answer by the caller's deadline",
        "caller gave up at 240 ms: outcome unknown",
        format!("{first_text} in {}; {hold_step}", ms(took)),
        first.is_ok() && took <= DEADLINE,
    );

    // The retry through "another gateway", at 427 ms.
    tokio::time::sleep_until((started + RETRY_AT).into()).await;
    let holds_before = rig.method("wallet", "Hold").await?.received;
    let (retry, _) = rig.place(op.clone(), DEADLINE).await;
    let holds_after = rig.method("wallet", "Hold").await?.received;
    let same_order = match (&first, &retry) {
        (Ok(a), Ok(b)) => a.order_id == b.order_id,
        _ => false,
    };
    report.check(
        "same key at 427 ms",
        "one operation: stored answer, no second effect",
        format!(
            "{} ({}), {} new holds",
            answer_text(&retry),
            if same_order {
                "same order"
            } else {
                "a different order"
            },
            holds_after - holds_before
        ),
        same_order && holds_after == holds_before,
    );

    let wallet = rig.wallet().await?;
    report.check(
        "wallet effects after their call's deadline",
        "ledger committed at 388 ms, 148 ms late",
        format!("{}", wallet.effects_after_deadline),
        wallet.effects_after_deadline == 0,
    );

    // The reconciler resolves the outcome by the order's reference.
    let resolved = rig
        .poll(RESOLVE_WITHIN, || async {
            Ok(rig
                .order_of("op-834")
                .await?
                .filter(|o| o.status() != pb::OrderStatus::Pending))
        })
        .await?;
    let resolved_text = resolved
        .as_ref()
        .map_or_else(|| "still PENDING".to_owned(), outcome_of);
    // And its follow-up work (the capture) is done.
    rig.poll(RESOLVE_WITHIN, || async {
        let (wallet, worker) = (rig.wallet().await?, rig.worker().await?);
        Ok((wallet.holds_active == 0 && worker.jobs_pending == 0).then_some(()))
    })
    .await?;
    let effects = rig.wallet_effects().await?;
    let holds = effects.iter().filter(|e| e.method == "Hold").count();
    let captures = effects.iter().filter(|e| e.method == "Capture").count();
    report.check(
        "resolved through the stable reference",
        "COMMITTED, one capture",
        format!("{resolved_text}; {holds} hold(s), {captures} capture(s)"),
        resolved.is_some() && holds == 1 && captures <= 1,
    );

    let (again, _) = rig.place(op.clone(), DEADLINE).await;
    let replayed = match (&again, &resolved) {
        (Ok(a), Some(r)) => a.order_id == r.order_id && a.status == r.status,
        _ => false,
    };
    report.check(
        "same key after the commit",
        "stored 201 replayed",
        answer_text(&again),
        replayed,
    );

    let mut changed = op;
    changed.cart_id = "cart-9999".to_owned();
    let (conflict, _) = rig.place(changed, DEADLINE).await;
    let refused = conflict.as_ref().err().is_some_and(|s| {
        s.code() == tonic::Code::AlreadyExists
            && s.get_details_error_info()
                .is_some_and(|i| i.reason == "IDEMPOTENCY_KEY_REUSED")
    });
    report.check(
        "same key, changed payload",
        "conflict, never a replay",
        answer_text(&conflict),
        refused,
    );
    let holds_total = rig
        .wallet_effects()
        .await?
        .iter()
        .filter(|e| e.method == "Hold")
        .count();
    report.check(
        "holds for op-834 in all",
        "1",
        holds_total.to_string(),
        holds_total <= 1,
    );
    Ok(report)
}

/// `PENDING WALLET_OUTCOME_UNKNOWN`, or `error AlreadyExists IDEMPOTENCY_KEY_REUSED`.
fn answer_text(answer: &Result<pb::Order, tonic::Status>) -> String {
    match answer {
        Ok(order) => outcome_of(order),
        Err(status) => {
            let reason = status
                .get_details_error_info()
                .map(|i| format!(" {}", i.reason))
                .unwrap_or_default();
            format!("error {:?}{reason}", status.code())
        }
    }
}

/// A protobuf duration (zero when unset or negative).
fn duration(d: &Option<prost_types::Duration>) -> Duration {
    d.as_ref()
        .and_then(|d| Duration::try_from(*d).ok())
        .unwrap_or_default()
}

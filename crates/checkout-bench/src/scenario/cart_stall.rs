//! `cart-stall` (the timeout contract, docs/design.md "Sources"): the staging test the contract
//! asks for — cart stalls 2,300 ms under the gateway's 2,500 ms deadline (sent as
//! `x-request-deadline`, as the contract's gateway injects it). Expected: no wallet call at all
//! (the contract was written after an incident in which 1,400 payments were charged after their
//! callers had timed out), the cart call cut at its 300 ms read cap, and every caller answered
//! with a structured result before 2,500 ms. Then requests arriving with 100 ms or less left
//! (the contract's fast-fail floor): refused on arrival with `DEADLINE_EXCEEDED` /
//! `DEADLINE_TOO_SHORT` and `x-deadline-exceeded: true`, nothing recorded, nothing sent
//! downstream.

use std::time::Duration;

use futures::future::join_all;
use tonic_types::StatusExt;

use super::rig::{self, Rig};
use super::{Options, Report, ScenarioError, ms};
use checkout::deadline::X_REQUEST_DEADLINE;
use checkout_proto::checkout::v1 as pb;

/// The gateway's deadline (the timeout contract's mobile checkout budget).
const DEADLINE: Duration = Duration::from_millis(2_500);
/// The cart's stall (the timeout contract's next steps).
const CART_STALL_MS: u32 = 2_300;
/// The contract's cart socket read timeout, which our `steps.cart.cap` matches.
const CART_READ_CAP: Duration = Duration::from_millis(300);
/// The contract's fast-fail floor: requests with this little left are refused on arrival.
const FLOOR: Duration = Duration::from_millis(100);

/// Runs the scenario.
pub async fn run(options: &Options) -> Result<Report, ScenarioError> {
    let rig = Rig::start(options.config.clone()).await?;
    let result = drive(&rig, options).await;
    rig.stop().await?;
    result
}

async fn drive(rig: &Rig, options: &Options) -> Result<Report, ScenarioError> {
    let orders = options.pick(200, 20);
    let doomed = options.pick(100, 10);
    let mut report = Report::new("cart-stall");
    report.setup(format!(
        "{orders} orders with cart FreezeCart stalled {CART_STALL_MS} ms, deadline {} ms as \
         x-request-deadline; then {doomed} orders arriving with <= {} ms left",
        DEADLINE.as_millis(),
        FLOOR.as_millis()
    ));
    rig.configure("cart", "FreezeCart", rig::latency(CART_STALL_MS))
        .await?;

    let answers = join_all((0..orders).map(|n| {
        let order = rig::order(&format!("stall-{n}"), "cart-4200");
        place_by_x_request_deadline(rig, order, DEADLINE)
    }))
    .await;
    let stats = rig.stats().await?;
    let wallet_calls: u64 = stats
        .methods
        .iter()
        .filter(|m| m.service == "wallet")
        .map(|m| m.received)
        .sum();
    let wallet = stats.wallet.unwrap_or_default();
    let cart = rig::method_of(&stats, "cart", "FreezeCart")?;
    let slowest = answers.iter().map(|(_, d)| *d).max().unwrap_or_default();
    let late = answers.iter().filter(|(_, d)| *d > DEADLINE).count();
    let structured = answers.iter().filter(|(a, _)| a.is_ok()).count();
    let outcomes = outcomes(&answers);

    report.check(
        "wallet calls (holds, lookups)",
        "0 (the contract's incident: 1,400 phantom charges)",
        format!("{wallet_calls} calls, {} holds", wallet.holds_active),
        wallet_calls == 0 && wallet.holds_active == 0,
    );
    report.check(
        "answered before the deadline",
        format!("all, <= {}", ms(DEADLINE)),
        format!("{} of {orders} late; slowest {}", late, ms(slowest)),
        late == 0,
    );
    report.check(
        "structured answers (no bare 504)",
        "all",
        format!("{structured} of {orders}: {outcomes}"),
        structured == orders,
    );
    report.check(
        "cart call cut at its read cap",
        format!("<= {}", ms(CART_READ_CAP)),
        format!("largest cart budget sent {} ms", cart.max_budget_ms),
        u128::from(cart.max_budget_ms) <= CART_READ_CAP.as_millis(),
    );

    // The fast-fail floor: arriving with the floor or less left.
    rig.configure("cart", "FreezeCart", rig::latency(0)).await?;
    let before = rig.stats().await?;
    let left = [FLOOR, FLOOR / 2];
    let refusals = join_all((0..doomed).map(|n| {
        let key = format!("doomed-{n}");
        let remaining = left[n % left.len()];
        async move {
            let answer =
                place_by_x_request_deadline(rig, rig::order(&key, "cart-4200"), remaining).await;
            (key, answer)
        }
    }))
    .await;
    let after = rig.stats().await?;
    let sent: u64 = after.methods.iter().map(|m| m.received).sum::<u64>()
        - before.methods.iter().map(|m| m.received).sum::<u64>();
    let mut recorded = 0;
    for (key, _) in &refusals {
        if rig.order_of(key).await?.is_some() {
            recorded += 1;
        }
    }
    let fast_failed = refusals
        .iter()
        .filter(|(_, (answer, _))| match answer {
            Err(status) => {
                status.code() == tonic::Code::DeadlineExceeded
                    && status
                        .get_details_error_info()
                        .is_some_and(|i| i.reason == "DEADLINE_TOO_SHORT")
                    && status
                        .metadata()
                        .get("x-deadline-exceeded")
                        .is_some_and(|v| v == "true")
            }
            Ok(_) => false,
        })
        .count();
    let slowest_refusal = refusals
        .iter()
        .map(|(_, (_, d))| *d)
        .max()
        .unwrap_or_default();
    report.check(
        "<= 100 ms left: refused on arrival",
        "504 + X-Deadline-Exceeded: true",
        format!("{fast_failed} of {doomed} DEADLINE_TOO_SHORT, x-deadline-exceeded: true"),
        fast_failed == doomed,
    );
    report.check(
        "  ... answered within the time left",
        "< 2 ms at the service",
        format!("slowest {} at the client", ms(slowest_refusal)),
        refusals.iter().all(|(_, (_, d))| *d < FLOOR),
    );
    report.check(
        "  ... nothing recorded, nothing sent",
        "no downstream call",
        format!("{recorded} recorded, {sent} downstream calls"),
        recorded == 0 && sent == 0,
    );
    Ok(report)
}

/// Places `order` with `x-request-deadline` = now + `deadline` (no `grpc-timeout`: the server's
/// own timer must answer in time); the client gives up a second after the deadline.
async fn place_by_x_request_deadline(
    rig: &Rig,
    order: pb::PlaceOrderRequest,
    deadline: Duration,
) -> (Result<pb::Order, tonic::Status>, Duration) {
    let started = std::time::Instant::now();
    let at = checkout::deadline::now_ms() + i64::try_from(deadline.as_millis()).unwrap_or(i64::MAX);
    let mut request = rig::request(order);
    if let Ok(value) = at.to_string().parse() {
        request.metadata_mut().insert(X_REQUEST_DEADLINE, value);
    }
    let mut client = rig.checkout.clone();
    let call = client.place_order(request);
    let answer = match tokio::time::timeout(deadline + Duration::from_secs(1), call).await {
        Ok(answer) => answer.map(tonic::Response::into_inner),
        Err(_) => Err(tonic::Status::deadline_exceeded(
            "the scenario gave up waiting",
        )),
    };
    (answer, started.elapsed())
}

/// `DECLINED CART_UNAVAILABLE 20` and the like.
fn outcomes(answers: &[(Result<pb::Order, tonic::Status>, Duration)]) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for (answer, _) in answers {
        let outcome = match answer {
            Ok(order) => crate::load::outcome_of(order),
            Err(status) => format!("error {:?}", status.code()),
        };
        match counts.iter_mut().find(|(o, _)| *o == outcome) {
            Some((_, n)) => *n += 1,
            None => counts.push((outcome, 1)),
        }
    }
    let parts: Vec<String> = counts.iter().map(|(o, n)| format!("{o} {n}")).collect();
    parts.join(", ")
}

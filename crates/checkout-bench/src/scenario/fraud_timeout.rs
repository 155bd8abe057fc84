//! `fraud-timeout` ("Timeout Hierarchies and Latency Budgets"): the fraud vendor times out. ShardPay answers
//! "202 pending_fraud" rather than a 504; we expect the hold to go ahead and the caller to get
//! PENDING `FRAUD_REVIEW` in time — an answer, not an error — and, once fraud recovers, the
//! worker to re-score and confirm. Then the note's cascading cancel: the caller disconnects at
//! 80 ms while fraud and inventory are in flight; every branch in flight must be cancelled (seen
//! by the stubs before fraud's own 450 ms cap could have ended it), no hold sent, and the order
//! DECLINED `CALLER_ABANDONED`.

use std::time::{Duration, Instant};

use futures::future::join_all;

use super::rig::{self, Rig};
use super::{Options, Report, ScenarioError, ms};
use crate::load::outcome_of;
use checkout_proto::checkout::v1 as pb;
use checkout_proto::stub::v1::Fault;

/// The callers' deadline.
const DEADLINE: Duration = Duration::from_secs(2);
/// When the caller disconnects (the note: "the mobile client disconnects at T+80ms").
const DISCONNECT_AT: Duration = Duration::from_millis(80);
/// How long the worker may take to re-score and confirm once fraud answers again.
const RESCORE_WITHIN: Duration = Duration::from_secs(20);

/// Runs the scenario.
pub async fn run(options: &Options) -> Result<Report, ScenarioError> {
    let mut report = Report::new("fraud-timeout");
    // Two rigs: the timeouts of the first part open fraud's breaker, which would keep the
    // second part's fraud calls from being sent at all.
    let rig = Rig::start(options.config.clone()).await?;
    let result = time_out(&rig, options, &mut report).await;
    rig.stop().await?;
    result?;
    let rig = Rig::start(options.config.clone()).await?;
    let result = abandon(&rig, options, &mut report).await;
    rig.stop().await?;
    result?;
    Ok(report)
}

/// Fraud hangs: the hold goes ahead, the caller gets PENDING FRAUD_REVIEW in time, and the
/// worker confirms once fraud answers again.
async fn time_out(rig: &Rig, options: &Options, report: &mut Report) -> Result<(), ScenarioError> {
    let orders = options.pick(50, 5);
    let abandoned = options.pick(10, 3);
    report.setup(format!(
        "{orders} orders with fraud Score hanging, deadline {} ms; then {abandoned} callers \
         disconnecting at {} ms with fraud and inventory slow",
        DEADLINE.as_millis(),
        DISCONNECT_AT.as_millis()
    ));
    rig.configure("fraud", "Score", rig::fault(Fault::Hang, None))
        .await?;
    let answers = join_all(
        (0..orders).map(|n| rig.place(rig::order(&format!("fraud-{n}"), "cart-4200"), DEADLINE)),
    )
    .await;
    let pending = answers
        .iter()
        .filter(|(a, _)| {
            a.as_ref()
                .is_ok_and(|o| o.status() == pb::OrderStatus::Pending && o.reason == "FRAUD_REVIEW")
        })
        .count();
    let slowest = answers.iter().map(|(_, d)| *d).max().unwrap_or_default();
    let errors = answers.iter().filter(|(a, _)| a.is_err()).count();
    let sample = answers
        .first()
        .map(|(a, _)| match a {
            Ok(order) => outcome_of(order),
            Err(status) => format!("error {:?}", status.code()),
        })
        .unwrap_or_default();
    report.check(
        "fraud timed out, hold placed",
        "202 pending_fraud, not a 504",
        format!("{pending} of {orders} PENDING FRAUD_REVIEW ({sample}), {errors} errors"),
        pending == orders && errors == 0,
    );
    report.check(
        "  ... answered in time",
        format!("<= {}", ms(DEADLINE)),
        format!("slowest {}", ms(slowest)),
        answers.iter().all(|(_, d)| *d <= DEADLINE),
    );

    // Fraud recovers: the worker re-scores and confirms.
    rig.configure("fraud", "Score", rig::latency(0)).await?;
    let confirmed = rig
        .poll(RESCORE_WITHIN, || async {
            let mut n = 0;
            for i in 0..orders {
                if rig
                    .order_of(&format!("fraud-{i}"))
                    .await?
                    .is_some_and(|o| o.status() == pb::OrderStatus::Confirmed)
                {
                    n += 1;
                }
            }
            Ok((n == orders).then_some(n))
        })
        .await?;
    report.check(
        "  ... re-scored once fraud answers",
        "worker completes the pending transfer",
        match confirmed {
            Some(n) => format!("{n} of {orders} CONFIRMED"),
            None => format!("not all CONFIRMED within {}", ms(RESCORE_WITHIN)),
        },
        confirmed.is_some(),
    );

    Ok(())
}

/// The cascading cancel: callers leave at 80 ms while fraud and inventory are in flight.
async fn abandon(rig: &Rig, options: &Options, report: &mut Report) -> Result<(), ScenarioError> {
    let abandoned = options.pick(10, 3);
    rig.configure("fraud", "Score", rig::latency(1_000)).await?;
    rig.configure("inventory", "Reserve", rig::latency(1_000))
        .await?;
    let fraud_cap = rig.config.steps.fraud.cap;
    let (mut fraud_calls, mut inventory_calls, mut holds, mut slowest_cancel, mut declined) =
        (0, 0, 0, Duration::ZERO, 0);
    // Orders whose calls were still running 3 s after the caller left.
    let mut lingering = 0;
    for n in 0..abandoned {
        let key = format!("abandoned-{n}");
        let before = rig.stats().await?;
        let started = Instant::now();
        // Dropping the call at 80 ms resets its HTTP/2 stream: the caller is gone.
        let _ = tokio::time::timeout(
            DISCONNECT_AT,
            rig.place(rig::order(&key, "cart-4200"), DEADLINE),
        )
        .await;
        let ended = rig
            .poll(Duration::from_secs(3), || async {
                let now = rig.stats().await?;
                let delta = |service: &str,
                             method: &str,
                             f: fn(&checkout_proto::stub::v1::MethodStats) -> u64|
                 -> Result<u64, ScenarioError> {
                    Ok(f(&rig::method_of(&now, service, method)?)
                        - f(&rig::method_of(&before, service, method)?))
                };
                let fraud = delta("fraud", "Score", |m| m.received)?;
                let inventory = delta("inventory", "Reserve", |m| m.received)?;
                let gone = delta("fraud", "Score", |m| m.cancelled)?
                    + delta("inventory", "Reserve", |m| m.cancelled)?;
                let hold = delta("wallet", "Hold", |m| m.received)?;
                Ok((gone == fraud + inventory).then_some((
                    (fraud, inventory),
                    started.elapsed(),
                    hold,
                )))
            })
            .await?;
        if let Some(((fraud, inventory), after, hold)) = ended {
            fraud_calls += fraud;
            inventory_calls += inventory;
            holds += hold;
            slowest_cancel = slowest_cancel.max(after);
        } else {
            lingering += 1;
        }
        let abandoned_order = rig
            .poll(Duration::from_secs(5), || async {
                Ok(rig.order_of(&key).await?.filter(|o| {
                    o.status() == pb::OrderStatus::Declined && o.reason == "CALLER_ABANDONED"
                }))
            })
            .await?;
        if abandoned_order.is_some() {
            declined += 1;
        }
    }
    report.check(
        "caller gone at 80 ms: branches cancelled",
        "every in-flight call aborted",
        format!(
            "fraud {fraud_calls}/{abandoned}, inventory {inventory_calls}/{abandoned} sent, all \
             cancelled by {} (fraud cap {}); {lingering} orders' calls still running after 3 s",
            ms(slowest_cancel),
            ms(fraud_cap)
        ),
        fraud_calls > 0 && lingering == 0 && slowest_cancel < fraud_cap,
    );
    report.check(
        "  ... no hold, DECLINED CALLER_ABANDONED",
        "no work for a gone caller",
        format!("{holds} holds; {declined} of {abandoned} CALLER_ABANDONED"),
        holds == 0 && declined == abandoned,
    );
    Ok(())
}

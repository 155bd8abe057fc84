//! The testkit as another team uses it: only its public API (and checkout-client's, and the
//! generated types of the contract), a real checkout and stubs over loopback gRPC.

use std::time::{Duration, SystemTime};

use checkout_client::{Deadline, Error, NewOrder, Placed, with_deadline};
use checkout_proto::metadata::{X_REQUEST_DEADLINE, epoch_ms};
use checkout_proto::wallet::v1::{HoldRequest, Money, wallet_service_client::WalletServiceClient};
use checkout_testkit::{Behavior, Fault, Stubs, TestCheckout, poll_until};

const SECOND: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn order(key: &str, cart: &str) -> NewOrder {
    NewOrder {
        customer_id: "c1".to_owned(),
        cart_id: cart.to_owned(),
        wallet_account_id: "a1".to_owned(),
        idempotency_key: Some(key.to_owned()),
    }
}

/// Caps of a second for the cart and the inventory, for the tests that count what happened
/// to hundreds of orders: on a machine starved of CPU, the default 300 ms and 150 ms can end a
/// call the stub answered at once, and a count of declines would count that too.
const ROOMY: &str = "[steps.cart]\ncap = \"1s\"\n[steps.inventory]\ncap = \"1s\"\n";

/// Places `order` with a deadline of `timeout`.
async fn place(t: &TestCheckout, order: NewOrder, timeout: Duration) -> Result<Placed, Error> {
    with_deadline(Deadline::after(timeout), t.client().place(order)).await
}

/// An order through a fresh testkit is confirmed; once the worker is idle the wallet has held
/// and captured it and the inventory committed it, all before their calls' deadlines.
#[tokio::test]
async fn an_order_is_confirmed_and_its_effects_are_listed_once_the_worker_is_idle() {
    let t = TestCheckout::start().await;
    let placed = place(&t, order("kit-1", "cart-1200"), SECOND)
        .await
        .expect("placed");
    assert!(matches!(placed, Placed::Confirmed(_)), "{placed:?}");
    assert_eq!(
        placed.order().total.as_ref().map(|m| m.minor_units),
        Some(1200)
    );
    let idle = t.wait_idle(10 * SECOND).await;
    assert_eq!((idle.jobs_pending, idle.orders_pending), (0, 0));
    let effects = t.stubs().effects("").await;
    for (service, method) in [
        ("wallet", "Hold"),
        ("wallet", "Capture"),
        ("inventory", "Reserve"),
        ("inventory", "Commit"),
    ] {
        assert!(
            effects.iter().any(|e| e.service == service
                && e.method == method
                && e.reference == placed.order_id()),
            "no {service}.{method} in {effects:?}"
        );
    }
    assert!(effects.iter().all(|e| !e.after_deadline), "{effects:?}");
    let wallet = t.stubs().wallet().await;
    assert_eq!((wallet.holds_captured, wallet.holds_active), (1, 0));
    t.stop().await;
}

/// A fault set on one method shapes checkout's answer; reset clears it (and the stats).
#[tokio::test]
async fn a_stub_behavior_shapes_the_answer_and_reset_clears_it() {
    let t = TestCheckout::start().await;
    t.stubs()
        .set("wallet", "Hold", Behavior::failing(Fault::Unavailable))
        .await;
    let declined = place(&t, order("kit-2", "cart-1"), SECOND)
        .await
        .expect("answered");
    assert!(
        matches!(&declined, Placed::Declined { order, retryable: true, .. } if order.reason == "WALLET_UNAVAILABLE"),
        "{declined:?}"
    );
    assert_eq!(t.stubs().method("wallet", "Hold").await.errors, 1);
    t.wait_idle(10 * SECOND).await;
    t.stubs().reset().await;
    assert_eq!(t.stubs().method("wallet", "Hold").await.received, 0);
    let confirmed = place(&t, order("kit-3", "cart-1"), SECOND)
        .await
        .expect("answered");
    assert!(matches!(confirmed, Placed::Confirmed(_)), "{confirmed:?}");
    t.stop().await;
}

/// A latency set on the wallet is what the call spends: a 300 ms hold is seen as such in
/// the budget waterfall, and the stub saw one call with a budget under the deadline.
#[tokio::test]
async fn a_latency_set_on_a_stub_is_spent_by_the_order() {
    let t = TestCheckout::start().await;
    t.stubs()
        .set("wallet", "Hold", Behavior::slow(300 * MS))
        .await;
    let placed = place(&t, order("kit-4", "cart-1"), 2 * SECOND)
        .await
        .expect("answered");
    let budget = placed.order().budget.as_ref().expect("budget report");
    let hold = budget
        .steps
        .iter()
        .find(|s| s.name == "wallet_hold")
        .expect("a hold step");
    let spent = hold.spent.expect("spent");
    assert!(spent.seconds == 0 && spent.nanos >= 300_000_000, "{hold:?}");
    let stats = t.stubs().method("wallet", "Hold").await;
    assert_eq!(stats.received, 1);
    assert!(
        stats.max_budget_ms > 300 && stats.max_budget_ms < 2_000,
        "{stats:?}"
    );
    t.stop().await;
}

/// `config_toml` sets checkout's policy: with a 1 s budget cap, an order sent with 2 s is
/// granted 1 s; the client the testkit hands out uses checkout's own admission floor.
#[tokio::test]
async fn config_toml_sets_checkouts_policy() {
    let t = TestCheckout::builder()
        .config_toml("[deadline]\nserver_budget_max = \"1s\"\n")
        .start()
        .await;
    let placed = place(&t, order("kit-5", "cart-1"), 2 * SECOND)
        .await
        .expect("answered");
    let granted = placed
        .order()
        .budget
        .as_ref()
        .and_then(|b| b.deadline)
        .expect("granted");
    assert_eq!((granted.seconds, granted.nanos), (1, 0), "{placed:?}");
    assert_eq!(t.admission_floor(), 220 * MS);
    t.stop().await;
}

/// With `.sqlite()` orders are recorded in SQLite and read back like any other.
#[tokio::test]
async fn an_sqlite_checkout_records_and_reads_orders() {
    let t = TestCheckout::builder().sqlite().start().await;
    let placed = place(&t, order("kit-6", "cart-1"), SECOND)
        .await
        .expect("answered");
    let read = with_deadline(Deadline::after(SECOND), t.client().get_by_key("kit-6"))
        .await
        .expect("read back");
    assert_eq!(read.order_id(), placed.order_id());
    t.stop().await;
}

/// The time the budget waterfall says `step` spent on this order, if the step ran and its call
/// answered (`ok`): on a starved machine an order can stop at an earlier step's cap.
fn spent(placed: &Placed, step: &str) -> Option<Duration> {
    let budget = placed.order().budget.as_ref()?;
    let step = budget.steps.iter().find(|s| s.name == step)?;
    let spent = step.spent.filter(|_| step.outcome == "ok")?;
    Some(Duration::new(
        u64::try_from(spent.seconds).ok()?,
        u32::try_from(spent.nanos).ok()?,
    ))
}

/// A latency scripted with a p99 is log-normal around its median. Each of 200 orders calls
/// the inventory (median 5 ms, p99 60 ms) and, in parallel, fraud (a fixed 5 ms: the control,
/// under the same machine load): the reservation is as often quicker than fraud as slower,
/// often by over 2 ms (a log-normal draws under 3 ms 32 % of the time), and now and then
/// slower by over 20 ms (over 25 ms: 7 %), which a fixed latency never is. (Inventory, because
/// cart and fraud would hedge its tail away; orders a starved machine stopped at an earlier
/// step's cap are left out.)
#[tokio::test]
async fn a_latency_with_a_p99_is_log_normal_around_its_median() {
    let t = TestCheckout::builder().config_toml(ROOMY).start().await;
    t.stubs()
        .set(
            "inventory",
            "Reserve",
            Behavior::slow(5 * MS).with_p99(60 * MS),
        )
        .await;
    t.stubs()
        .set("fraud", "Score", Behavior::slow(5 * MS))
        .await;
    let mut against_fixed = Vec::new();
    for i in 0..200 {
        let placed = place(&t, order(&format!("ln-{i}"), "cart-1"), 2 * SECOND)
            .await
            .expect("answered");
        let millis = |d: Duration| d.as_secs_f64() * 1_000.0;
        if let (Some(reserve), Some(score)) = (spent(&placed, "inventory"), spent(&placed, "fraud"))
        {
            against_fixed.push(millis(reserve) - millis(score));
        }
    }
    let usable = against_fixed.len();
    assert!(
        usable >= 100,
        "only {usable} of 200 orders reached both steps"
    );
    against_fixed.sort_by(f64::total_cmp);
    let median = against_fixed[usable / 2];
    let quicker = against_fixed.iter().filter(|d| **d < -2.0).count();
    let tail = against_fixed.iter().filter(|d| **d > 20.0).count();
    assert!(
        median.abs() < 4.0,
        "median {median:.1} ms from the fixed 5 ms: {against_fixed:?}"
    );
    assert!(
        quicker >= usable / 10,
        "{quicker} of {usable} over 2 ms quicker: {against_fixed:?}"
    );
    assert!(
        (3..=usable * 3 / 10).contains(&tail),
        "{tail} of {usable} over 20 ms slower: {against_fixed:?}"
    );
    t.stop().await;
}

/// A fault scripted with a probability hits about that share of the calls, and each hit is
/// the answer the order gets: of 100 orders with the inventory UNAVAILABLE 30 % of the time,
/// as many are DECLINED INVENTORY_UNAVAILABLE as the stub injected faults, the rest
/// CONFIRMED. (The breaker is held off with `config_toml`: its 50 % trip rate could be
/// crossed by chance over its first ten calls.)
#[tokio::test]
async fn a_fault_with_a_probability_hits_that_share_of_the_calls() {
    let t = TestCheckout::builder()
        .config_toml(&format!("{ROOMY}[breaker]\nmin_calls = 100000\n"))
        .start()
        .await;
    t.stubs()
        .set(
            "inventory",
            "Reserve",
            Behavior::failing(Fault::Unavailable).with_probability(0.3),
        )
        .await;
    let (mut declined, mut confirmed) = (0_u64, 0_u64);
    for i in 0..100 {
        match place(&t, order(&format!("p-{i}"), "cart-1"), 2 * SECOND).await {
            Ok(Placed::Confirmed(_)) => confirmed += 1,
            Ok(Placed::Declined { order, .. }) if order.reason == "INVENTORY_UNAVAILABLE" => {
                declined += 1;
            }
            other => panic!("order {i}: {other:?}"),
        }
    }
    let reserve = t.stubs().method("inventory", "Reserve").await;
    assert_eq!((reserve.received, reserve.errors), (100, declined));
    // Binomial(100, 0.3): 30 ± 4.6; outside 10..=55 is beyond four standard deviations.
    assert!((10..=55).contains(&declined), "{declined} of 100 declined");
    assert_eq!(confirmed + declined, 100);
    t.stop().await;
}

/// An effect a stub applies after the deadline its call carried is read back, by its order
/// reference, as `after_deadline`. Checkout itself never causes one (its calls end at their
/// budgets), so here the test plays a service of its own calling the wallet the way checkout
/// must not: forwarding its deadline as `x-request-deadline` but enforcing none (no
/// `grpc-timeout`, no timer), so a 300 ms hold lands after a 50 ms deadline — a phantom
/// charge. A hold with time to spare is not flagged.
#[tokio::test]
async fn an_effect_applied_after_its_calls_deadline_is_read_back_by_reference() {
    let stubs = Stubs::start().await;
    stubs.set("wallet", "Hold", Behavior::slow(300 * MS)).await;
    let mut wallet = WalletServiceClient::connect(stubs.uri())
        .await
        .expect("the wallet stub");
    let hold = |reference: &str, deadline_in: Duration| {
        let mut request = tonic::Request::new(HoldRequest {
            reference: reference.to_owned(),
            account_id: "a1".to_owned(),
            amount: Some(Money {
                currency: "USD".to_owned(),
                minor_units: 1200,
            }),
        });
        let at = epoch_ms(SystemTime::now() + deadline_in);
        request.metadata_mut().insert(X_REQUEST_DEADLINE, at.into());
        request
    };
    wallet
        .hold(hold("ord_late", 50 * MS))
        .await
        .expect("held: nothing stopped it at its deadline");
    wallet
        .hold(hold("ord_in_time", 5 * SECOND))
        .await
        .expect("held");

    let effects = stubs.effects("wallet").await;
    let of = |reference: &str| {
        let found: Vec<_> = effects
            .iter()
            .filter(|e| e.reference == reference)
            .collect();
        assert_eq!(found.len(), 1, "{reference}: {effects:?}");
        found[0].clone()
    };
    let late = of("ord_late");
    assert_eq!((late.method.as_str(), late.after_deadline), ("Hold", true));
    assert!(late.applied_at > late.call_deadline.expect("a deadline was carried"));
    assert!(!of("ord_in_time").after_deadline);
    assert_eq!(stubs.wallet().await.effects_after_deadline, 1);
    stubs.stop().await;
}

/// Dropping a TestCheckout stops checkout and its stubs: their ports stop answering.
#[tokio::test]
async fn dropping_the_testkit_stops_checkout_and_the_stubs() {
    let t = TestCheckout::start().await;
    let (uri, stubs) = (t.uri(), t.stubs().uri());
    drop(t);
    for target in [uri, stubs] {
        let endpoint = tonic::transport::Endpoint::new(target.clone()).expect("uri");
        let refused = poll_until(
            &format!("{target} to refuse connections"),
            10 * SECOND,
            20 * MS,
            || endpoint.connect(),
            Result::is_err,
        )
        .await;
        assert!(refused.is_err());
    }
}

/// `wait_idle` fails loudly, with the worker's counts, when the worker cannot finish (a
/// wallet that hangs keeps the order pending).
#[tokio::test]
async fn wait_idle_panics_with_the_counts_when_the_worker_cannot_finish() {
    let t = TestCheckout::start().await;
    t.stubs()
        .set("wallet", "", Behavior::failing(Fault::Hang))
        .await;
    let pending = place(&t, order("kit-7", "cart-1"), SECOND)
        .await
        .expect("answered");
    assert!(matches!(pending, Placed::Pending { .. }), "{pending:?}");
    let waited = tokio::spawn(async move {
        t.wait_idle(300 * MS).await;
        t
    })
    .await;
    let panic = waited.expect_err("wait_idle gives up");
    let message = panic.into_panic();
    let message = message
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or_default();
    assert!(
        message.contains("never reached") && message.contains("orders_pending: 1"),
        "{message}"
    );
}

//! The testkit as another team uses it: only its public API (and checkout-client's), a real
//! checkout and stubs over loopback gRPC.

use std::time::Duration;

use checkout_client::{Deadline, Error, NewOrder, Placed, with_deadline};
use checkout_testkit::{Behavior, Fault, TestCheckout, poll_until};

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

//! The downstream stubs over real gRPC on 127.0.0.1:0: data conventions, the hold and reservation
//! state machines, injected faults and latency, and what `StubControl` reports.

// The workspace's one poll helper (it needs nothing but tokio).
#[path = "../../../tests/common/poll.rs"]
mod poll;

use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use checkout_proto::cart::v1::FreezeCartRequest;
use checkout_proto::cart::v1::cart_service_client::CartServiceClient;
use checkout_proto::fraud::v1::fraud_service_client::FraudServiceClient;
use checkout_proto::fraud::v1::{ScoreRequest, Verdict};
use checkout_proto::inventory;
use checkout_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use checkout_proto::inventory::v1::{CommitRequest, Item, ReserveRequest};
use checkout_proto::stub::v1::stub_control_client::StubControlClient;
use checkout_proto::stub::v1::{
    Behavior, ConfigureRequest, Effect, Fault, GetStatsRequest, HistoryStats, ListEffectsRequest,
    MethodStats, ResetRequest, WalletStats,
};
use checkout_proto::wallet::v1::wallet_service_client::WalletServiceClient;
use checkout_proto::wallet::v1::{
    CaptureRequest, HoldRequest, HoldState, LookupByReferenceRequest, Money, ReleaseRequest,
};
use checkout_stubs::{BehaviorSpec, StubConfig, StubServer};
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

/// How long a poll waits for what it expects before it fails the test.
const POLL_LIMIT: Duration = Duration::from_secs(5);

/// The pause between two polls.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Clients of every service on one stub server.
struct Stubs {
    server: StubServer,
    cart: CartServiceClient<Channel>,
    fraud: FraudServiceClient<Channel>,
    inventory: InventoryServiceClient<Channel>,
    wallet: WalletServiceClient<Channel>,
    control: StubControlClient<Channel>,
}

async fn start_stubs() -> Stubs {
    start_stubs_with(Vec::new()).await
}

async fn start_stubs_with(initial: Vec<BehaviorSpec>) -> Stubs {
    start_stubs_configured(StubConfig {
        behaviors: initial,
        ..StubConfig::default()
    })
    .await
}

/// Stubs keeping at most `capacity` entries per bounded history.
async fn start_stubs_keeping(capacity: usize) -> Stubs {
    start_stubs_configured(StubConfig {
        history_capacity: capacity.try_into().unwrap(),
        ..StubConfig::default()
    })
    .await
}

/// The stub server started directly, not through `checkout-testkit`: it is what these tests
/// test (its initial behaviours and history bounds come from `StubConfig`), and the testkit
/// is built on this crate.
async fn start_stubs_configured(config: StubConfig) -> Stubs {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = StubServer::start_with(listener, config).await.unwrap();
    let channel = Channel::from_shared(server.uri())
        .unwrap()
        .connect()
        .await
        .unwrap();
    Stubs {
        server,
        cart: CartServiceClient::new(channel.clone()),
        fraud: FraudServiceClient::new(channel.clone()),
        inventory: InventoryServiceClient::new(channel.clone()),
        wallet: WalletServiceClient::new(channel.clone()),
        control: StubControlClient::new(channel),
    }
}

impl Stubs {
    async fn configure(&mut self, service: &str, method: &str, behavior: Behavior) {
        self.control
            .configure(ConfigureRequest {
                service: service.into(),
                method: method.into(),
                behavior: Some(behavior),
            })
            .await
            .unwrap();
    }

    async fn stats(&self, service: &str, method: &str) -> MethodStats {
        let response = self
            .control
            .clone()
            .get_stats(GetStatsRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        response
            .methods
            .into_iter()
            .find(|m| m.method == method)
            .unwrap()
    }

    async fn wallet_stats(&mut self) -> WalletStats {
        self.control
            .get_stats(GetStatsRequest {
                service: "wallet".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .wallet
            .unwrap()
    }

    async fn history(&mut self) -> HistoryStats {
        self.control
            .get_stats(GetStatsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .history
            .expect("GetStats always reports the history")
    }

    async fn effects(&self, service: &str) -> Vec<Effect> {
        self.control
            .clone()
            .list_effects(ListEffectsRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .effects
    }

    /// Polls until `method`'s stats satisfy `done` (a cancellation reaches the server a moment
    /// after the client gives up); fails the test with the last stats seen after `POLL_LIMIT`.
    async fn stats_until(
        &self,
        service: &str,
        method: &str,
        done: impl Fn(&MethodStats) -> bool,
    ) -> MethodStats {
        let what = format!("{service}.{method} stats");
        let fetch = || self.stats(service, method);
        poll::poll_until(&what, POLL_LIMIT, POLL_EVERY, fetch, done).await
    }

    /// Polls until the effect log of `service` satisfies `done`; fails the test with the last log
    /// seen after `POLL_LIMIT`.
    async fn effects_until(&self, service: &str, done: impl Fn(&[Effect]) -> bool) -> Vec<Effect> {
        let what = format!("the {service:?} effects");
        let fetch = || self.effects(service);
        let done = |effects: &Vec<Effect>| done(effects);
        poll::poll_until(&what, POLL_LIMIT, POLL_EVERY, fetch, done).await
    }
}

fn behavior(latency_ms: u32, fault: Fault) -> Behavior {
    Behavior {
        latency_ms,
        latency_p99_ms: 0,
        fault: fault.into(),
        fault_probability: None,
    }
}

fn cart_usd(minor_units: i64) -> Option<checkout_proto::cart::v1::Money> {
    Some(checkout_proto::cart::v1::Money {
        currency: "USD".into(),
        minor_units,
    })
}

fn usd(minor_units: i64) -> Option<Money> {
    Some(Money {
        currency: "USD".into(),
        minor_units,
    })
}

fn hold(reference: &str, account_id: &str) -> HoldRequest {
    HoldRequest {
        reference: reference.into(),
        account_id: account_id.into(),
        amount: usd(4200),
    }
}

fn reserve(reference: &str, sku: &str) -> ReserveRequest {
    ReserveRequest {
        reference: reference.into(),
        items: vec![Item {
            sku: sku.into(),
            quantity: 1,
        }],
    }
}

fn lookup(reference: &str) -> LookupByReferenceRequest {
    LookupByReferenceRequest {
        reference: reference.into(),
    }
}

fn epoch_ms_now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

fn with_x_request_deadline<T>(message: T, epoch_ms: i64) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("x-request-deadline", epoch_ms.to_string().parse().unwrap());
    request
}

/// Asserts `status` has `code` and an ErrorInfo with `reason` in `domain`; returns its metadata.
fn error_info(
    status: &Status,
    code: Code,
    domain: &str,
    reason: &str,
) -> std::collections::HashMap<String, String> {
    assert_eq!(status.code(), code, "{status:?}");
    let info = status.get_details_error_info().expect("ErrorInfo details");
    assert_eq!(info.reason, reason);
    assert_eq!(info.domain, domain);
    info.metadata
}

/// Asserts `future` does not finish within `wait`: the client gives up and drops the call.
async fn never_answers<T: std::fmt::Debug>(future: impl Future<Output = T>, wait: Duration) {
    let outcome = tokio::time::timeout(wait, future).await;
    assert!(outcome.is_err(), "expected no answer, got {outcome:?}");
}

/// Cart ids script the cart: `cart-<N>` totals N, `missing-…` is NOT_FOUND, others total 4200,
/// the sku carries the cart id, and a repeat freeze for a reference answers the same snapshot.
#[tokio::test]
async fn cart_ids_script_totals_skus_and_missing_carts() {
    let mut stubs = start_stubs().await;
    let freeze = |cart_id: &str, reference: &str| FreezeCartRequest {
        cart_id: cart_id.into(),
        customer_id: "c-1".into(),
        reference: reference.into(),
    };

    let cart = stubs
        .cart
        .freeze_cart(freeze("cart-1999", "order-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cart.cart_id, "cart-1999");
    assert_eq!(cart.total, cart_usd(1999));
    assert_eq!(cart.lines.len(), 1);
    assert_eq!(cart.lines[0].sku, "sku-cart-1999");
    assert_eq!(cart.lines[0].quantity, 1);
    assert_eq!(cart.lines[0].unit_price, cart_usd(1999));

    let other = stubs
        .cart
        .freeze_cart(freeze("cart-oos-3", "order-2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(other.total, cart_usd(4200));
    assert!(other.lines[0].sku.contains("oos"));

    let missing = stubs
        .cart
        .freeze_cart(freeze("missing-7", "order-3"))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    let again = stubs
        .cart
        .freeze_cart(freeze("cart-5", "order-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, cart, "a reference keeps its first snapshot");
    assert!(stubs.effects("").await.is_empty(), "freezing is no effect");
    stubs.server.stop().await;
}

/// Customers whose id starts with `deny-` are denied (score 95); everyone else is approved.
#[tokio::test]
async fn fraud_denies_deny_customers_and_approves_everyone_else() {
    let mut stubs = start_stubs().await;
    let score = |customer_id: &str| ScoreRequest {
        reference: "order-1".into(),
        customer_id: customer_id.into(),
        ..ScoreRequest::default()
    };
    let denied = stubs.fraud.score(score("deny-mallory")).await.unwrap();
    assert_eq!(denied.get_ref().verdict(), Verdict::Deny);
    assert_eq!(denied.get_ref().score, 95);
    let approved = stubs.fraud.score(score("alice")).await.unwrap();
    assert_eq!(approved.get_ref().verdict(), Verdict::Approve);
    assert_eq!(approved.get_ref().score, 5);
    stubs.server.stop().await;
}

/// A sku containing `oos` is refused with FAILED_PRECONDITION ErrorInfo OUT_OF_STOCK naming the
/// sku, and nothing is reserved.
#[tokio::test]
async fn an_out_of_stock_sku_is_refused_with_error_info_and_reserves_nothing() {
    let mut stubs = start_stubs().await;
    let status = stubs
        .inventory
        .reserve(reserve("order-1", "sku-cart-oos-1"))
        .await
        .unwrap_err();
    let metadata = error_info(
        &status,
        Code::FailedPrecondition,
        "inventory.v1",
        "OUT_OF_STOCK",
    );
    assert_eq!(metadata["sku"], "sku-cart-oos-1");
    assert!(stubs.effects("inventory").await.is_empty());
    stubs.server.stop().await;
}

/// Reserve is idempotent per reference; Commit and Release move a reservation once and refuse to
/// undo each other; unknown references are NOT_FOUND. Only real changes are effects.
#[tokio::test]
async fn reservations_are_idempotent_per_reference_and_follow_their_state_machine() {
    let mut stubs = start_stubs().await;
    let inv = &mut stubs.inventory;
    let first = inv
        .reserve(reserve("a", "sku-1"))
        .await
        .unwrap()
        .into_inner();
    let repeat = inv
        .reserve(reserve("a", "sku-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.reservation_id, repeat.reservation_id);

    let commit = |r: &str| CommitRequest {
        reference: r.into(),
    };
    let release = |r: &str| inventory::v1::ReleaseRequest {
        reference: r.into(),
    };
    inv.commit(commit("a")).await.unwrap();
    inv.commit(commit("a")).await.unwrap();
    let status = inv.release(release("a")).await.unwrap_err();
    error_info(
        &status,
        Code::FailedPrecondition,
        "inventory.v1",
        "RESERVATION_COMMITTED",
    );

    inv.reserve(reserve("b", "sku-2")).await.unwrap();
    inv.release(release("b")).await.unwrap();
    inv.release(release("b")).await.unwrap();
    let status = inv.commit(commit("b")).await.unwrap_err();
    error_info(
        &status,
        Code::FailedPrecondition,
        "inventory.v1",
        "RESERVATION_RELEASED",
    );

    assert_eq!(
        inv.commit(commit("nope")).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        inv.release(release("nope")).await.unwrap_err().code(),
        Code::NotFound
    );

    let effects: Vec<(String, String)> = stubs
        .effects("inventory")
        .await
        .into_iter()
        .map(|e| (e.method, e.reference))
        .collect();
    let expected = [
        ("Reserve", "a"),
        ("Commit", "a"),
        ("Reserve", "b"),
        ("Release", "b"),
    ]
    .map(|(m, r)| (m.to_owned(), r.to_owned()));
    assert_eq!(effects, expected);
    stubs.server.stop().await;
}

/// Holds are validated (INVALID_ARGUMENT) and `poor-` accounts are refused with
/// FAILED_PRECONDITION INSUFFICIENT_FUNDS; neither applies anything.
#[tokio::test]
async fn invalid_holds_and_poor_accounts_are_refused_without_effect() {
    let mut stubs = start_stubs().await;
    let status = stubs
        .wallet
        .hold(hold("order-1", "poor-bob"))
        .await
        .unwrap_err();
    error_info(
        &status,
        Code::FailedPrecondition,
        "wallet.v1",
        "INSUFFICIENT_FUNDS",
    );

    for bad in [
        hold("", "alice"),
        hold("order-2", ""),
        HoldRequest {
            amount: usd(0),
            ..hold("order-3", "alice")
        },
        HoldRequest {
            amount: None,
            ..hold("order-4", "alice")
        },
    ] {
        let status = stubs.wallet.hold(bad).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.get_details_bad_request().is_some());
    }
    assert!(stubs.effects("wallet").await.is_empty());
    stubs.server.stop().await;
}

/// A second Hold with the same reference answers ALREADY_EXISTS ErrorInfo DUPLICATE_REFERENCE
/// carrying the EXISTING hold's id, account and amount (not the second request's), and applies
/// nothing.
#[tokio::test]
async fn a_second_hold_for_a_reference_answers_duplicate_reference_with_the_existing_holds_terms() {
    let mut stubs = start_stubs().await;
    let first = stubs
        .wallet
        .hold(hold("order-1", "alice"))
        .await
        .unwrap()
        .into_inner()
        .hold
        .unwrap();
    assert!(first.hold_id.starts_with("hold-"));
    assert_eq!(first.state(), HoldState::Active);
    assert_eq!(first.amount, usd(4200));

    // Another account and amount under the same reference: the answer describes the first hold.
    let other_terms = HoldRequest {
        amount: Some(Money {
            currency: "EUR".into(),
            minor_units: 999,
        }),
        ..hold("order-1", "bob")
    };
    for second in [hold("order-1", "alice"), other_terms] {
        let status = stubs.wallet.hold(second).await.unwrap_err();
        let metadata = error_info(
            &status,
            Code::AlreadyExists,
            "wallet.v1",
            "DUPLICATE_REFERENCE",
        );
        assert_eq!(metadata["existing_hold_id"], first.hold_id);
        assert_eq!(metadata["account_id"], "alice");
        assert_eq!(metadata["currency"], "USD");
        assert_eq!(metadata["minor_units"], "4200");
    }

    let effects = stubs.effects("wallet").await;
    assert_eq!(effects.len(), 1);
    assert_eq!(
        (effects[0].method.as_str(), effects[0].reference.as_str()),
        ("Hold", "order-1")
    );
    assert_eq!(stubs.wallet_stats().await.holds_active, 1);
    stubs.server.stop().await;
}

/// Capture and Release move an active hold once, repeat idempotently, refuse to undo each other,
/// and LookupByReference reads the result; the wallet stats count holds per state.
#[tokio::test]
async fn capture_and_release_follow_the_hold_state_machine() {
    let mut stubs = start_stubs().await;
    let capture = |r: &str| CaptureRequest {
        reference: r.into(),
    };
    let release = |r: &str| ReleaseRequest {
        reference: r.into(),
    };
    let w = &mut stubs.wallet;
    for reference in ["captured", "released", "active"] {
        w.hold(hold(reference, "alice")).await.unwrap();
    }

    let captured = w.capture(capture("captured")).await.unwrap().into_inner();
    assert_eq!(captured.hold.unwrap().state(), HoldState::Captured);
    w.capture(capture("captured")).await.unwrap();
    let status = w.release(release("captured")).await.unwrap_err();
    error_info(
        &status,
        Code::FailedPrecondition,
        "wallet.v1",
        "HOLD_ALREADY_CAPTURED",
    );

    let released = w.release(release("released")).await.unwrap().into_inner();
    assert_eq!(released.hold.unwrap().state(), HoldState::Released);
    w.release(release("released")).await.unwrap();
    let status = w.capture(capture("released")).await.unwrap_err();
    error_info(
        &status,
        Code::FailedPrecondition,
        "wallet.v1",
        "HOLD_NOT_ACTIVE",
    );

    assert_eq!(
        w.capture(capture("nope")).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        w.release(release("nope")).await.unwrap_err().code(),
        Code::NotFound
    );
    let record = w.lookup_by_reference(lookup("captured")).await.unwrap();
    assert_eq!(record.get_ref().state(), HoldState::Captured);
    assert_eq!(
        w.lookup_by_reference(lookup("nope"))
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );

    let stats = stubs.wallet_stats().await;
    assert_eq!(
        (
            stats.holds_active,
            stats.holds_captured,
            stats.holds_released
        ),
        (1, 1, 1)
    );
    // 3 holds + 1 capture + 1 release; the repeats and refusals changed nothing.
    assert_eq!(stubs.effects("wallet").await.len(), 5);
    stubs.server.stop().await;
}

/// FAULT_UNAVAILABLE and FAULT_INTERNAL answer their codes, are counted as errors, and apply
/// nothing.
#[tokio::test]
async fn unavailable_and_internal_faults_answer_their_codes_and_apply_nothing() {
    let mut stubs = start_stubs().await;
    stubs
        .configure("wallet", "Hold", behavior(0, Fault::Unavailable))
        .await;
    let status = stubs
        .wallet
        .hold(hold("order-1", "alice"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);

    stubs
        .configure("wallet", "Hold", behavior(0, Fault::Internal))
        .await;
    let status = stubs
        .wallet
        .hold(hold("order-1", "alice"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal);

    let stats = stubs.stats("wallet", "Hold").await;
    assert_eq!((stats.received, stats.ok, stats.errors), (2, 0, 2));
    assert!(stubs.effects("").await.is_empty());
    let lookup = stubs.wallet.lookup_by_reference(lookup("order-1")).await;
    assert_eq!(lookup.unwrap_err().code(), Code::NotFound);
    stubs.server.stop().await;
}

/// A FAULT_HANG call never answers; when the client gives up (dropping the call) the stub counts
/// it `cancelled`, and it applies nothing.
#[tokio::test]
async fn a_hanging_call_cancelled_by_its_caller_is_counted_cancelled_and_applies_nothing() {
    let mut stubs = start_stubs().await;
    stubs
        .configure("wallet", "Hold", behavior(0, Fault::Hang))
        .await;
    let mut wallet = stubs.wallet.clone();
    never_answers(
        wallet.hold(hold("order-1", "alice")),
        Duration::from_millis(300),
    )
    .await;

    let stats = stubs
        .stats_until("wallet", "Hold", |s| s.cancelled == 1)
        .await;
    assert_eq!(
        (stats.received, stats.cancelled, stats.ok, stats.errors),
        (1, 1, 0, 0)
    );
    assert!(stubs.effects("").await.is_empty());
    let lookup = stubs.wallet.lookup_by_reference(lookup("order-1")).await;
    assert_eq!(lookup.unwrap_err().code(), Code::NotFound);
    stubs.server.stop().await;
}

/// A FAULT_AMBIGUOUS hold applies its effect but never answers: the caller gives up, yet the hold
/// exists and can be found by reference.
#[tokio::test]
async fn an_ambiguous_hold_applies_its_effect_though_the_caller_never_hears_back() {
    let mut stubs = start_stubs().await;
    stubs
        .configure("wallet", "Hold", behavior(50, Fault::Ambiguous))
        .await;
    let mut wallet = stubs.wallet.clone();
    never_answers(
        wallet.hold(hold("order-1", "alice")),
        Duration::from_millis(500),
    )
    .await;

    let stats = stubs
        .stats_until("wallet", "Hold", |s| s.cancelled == 1)
        .await;
    assert_eq!((stats.cancelled, stats.ok, stats.errors), (1, 0, 0));
    let effects = stubs.effects("wallet").await;
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].reference, "order-1");
    let found = stubs
        .wallet
        .lookup_by_reference(lookup("order-1"))
        .await
        .unwrap();
    assert_eq!(found.get_ref().state(), HoldState::Active);
    assert_eq!(stubs.wallet_stats().await.holds_active, 1);
    stubs.server.stop().await;
}

/// The effect lands at the END of the latency: a call cancelled before then applies nothing,
/// even after its latency would have ended; an uncancelled call answers no sooner than its latency.
#[tokio::test]
async fn latency_delays_the_effect_so_a_call_cancelled_earlier_applies_nothing() {
    let mut stubs = start_stubs().await;
    stubs
        .configure("wallet", "Hold", behavior(600, Fault::None))
        .await;
    let mut wallet = stubs.wallet.clone();
    never_answers(
        wallet.hold(hold("order-1", "alice")),
        Duration::from_millis(100),
    )
    .await;
    stubs
        .stats_until("wallet", "Hold", |s| s.cancelled == 1)
        .await;
    assert!(stubs.effects("").await.is_empty());

    // order-2 arrives at least 100 ms after order-1 with the same latency, so its effect lands
    // after the moment order-1's would have: once it has, order-1's moment has passed too.
    let started = Instant::now();
    stubs.wallet.hold(hold("order-2", "alice")).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(600));
    let effects = stubs.effects("wallet").await;
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].reference, "order-2");
    stubs.server.stop().await;
}

/// GetStats records the budget each call carried as grpc-timeout (last and max) and the
/// x-request-deadline of the last call; ListEffects stamps each effect with its call's deadline.
#[tokio::test]
async fn received_budgets_and_x_request_deadlines_are_recorded() {
    let mut stubs = start_stubs().await;
    let x_request_deadline = epoch_ms_now() + 60_000;
    let mut first = with_x_request_deadline(hold("order-1", "alice"), x_request_deadline);
    first.set_timeout(Duration::from_millis(1500));
    let sent = SystemTime::now();
    stubs.wallet.hold(first).await.unwrap();

    let mut second = Request::new(hold("order-2", "alice"));
    second.set_timeout(Duration::from_millis(700));
    stubs.wallet.hold(second).await.unwrap();

    let stats = stubs.stats("wallet", "Hold").await;
    assert_eq!(stats.last_budget_ms, 700);
    assert_eq!(stats.max_budget_ms, 1500);
    assert_eq!(stats.last_x_request_deadline, 0, "the last call sent none");
    assert_eq!(stats.arrived_expired, 0);

    stubs
        .wallet
        .hold(with_x_request_deadline(
            hold("order-3", "alice"),
            x_request_deadline,
        ))
        .await
        .unwrap();
    let stats = stubs.stats("wallet", "Hold").await;
    assert_eq!(stats.last_x_request_deadline, x_request_deadline);
    assert_eq!(
        stats.last_budget_ms, 0,
        "the last call sent no grpc-timeout"
    );
    assert_eq!(stats.max_budget_ms, 1500);

    let effects = stubs.effects("wallet").await;
    let deadline = SystemTime::try_from(effects[0].call_deadline.unwrap()).unwrap();
    let applied_at = SystemTime::try_from(effects[0].applied_at.unwrap()).unwrap();
    assert!(applied_at < deadline);
    assert!(deadline <= SystemTime::now() + Duration::from_millis(1500));
    assert!(deadline >= sent + Duration::from_millis(1500) - Duration::from_millis(50));
    let third = SystemTime::try_from(
        effects[2]
            .call_deadline
            .expect("x-request-deadline is a deadline"),
    )
    .unwrap();
    let expected = UNIX_EPOCH + Duration::from_millis(x_request_deadline as u64);
    let off = third
        .duration_since(expected)
        .unwrap_or_else(|e| e.duration());
    assert!(
        off < Duration::from_millis(2),
        "without grpc-timeout the x-request-deadline is the call's deadline: {third:?} vs {expected:?}"
    );
    stubs.server.stop().await;
}

/// A call whose x-request-deadline is already in the past when it arrives is counted
/// `arrived_expired`; one with a future deadline is not.
#[tokio::test]
async fn a_call_whose_x_request_deadline_already_passed_is_counted_arrived_expired() {
    let mut stubs = start_stubs().await;
    let score = ScoreRequest::default;
    let past = epoch_ms_now() - 1_000;
    stubs
        .fraud
        .score(with_x_request_deadline(score(), past))
        .await
        .unwrap();
    stubs
        .fraud
        .score(with_x_request_deadline(score(), epoch_ms_now() + 60_000))
        .await
        .unwrap();
    let stats = stubs.stats("fraud", "Score").await;
    assert_eq!((stats.received, stats.arrived_expired), (2, 1));
    stubs.server.stop().await;
}

/// Slow calls sent together are in flight together, and GetStats says so.
#[tokio::test]
async fn concurrent_slow_calls_raise_max_concurrent() {
    let mut stubs = start_stubs().await;
    stubs
        .configure("fraud", "Score", behavior(500, Fault::None))
        .await;
    let calls = (0..4).map(|_| {
        let mut fraud = stubs.fraud.clone();
        async move { fraud.score(ScoreRequest::default()).await }
    });
    for result in futures::future::join_all(calls).await {
        result.unwrap();
    }
    let stats = stubs.stats("fraud", "Score").await;
    assert_eq!(stats.ok, 4);
    assert!(stats.max_concurrent >= 2, "{stats:?}");
    stubs.server.stop().await;
}

/// Why `effects_after_deadline` cannot be provoked honestly through a tonic server: a hold whose
/// grpc-timeout is shorter than its latency is dropped (by the server's grpc-timeout enforcement,
/// or the client's own) before the latency ends, so even FAULT_AMBIGUOUS applies nothing.
#[tokio::test]
async fn a_hold_that_outlives_its_grpc_timeout_is_dropped_before_its_effect() {
    let mut stubs = start_stubs().await;
    stubs
        .configure("wallet", "Hold", behavior(800, Fault::Ambiguous))
        .await;
    let mut request = Request::new(hold("order-1", "alice"));
    request.set_timeout(Duration::from_millis(200));
    let status = stubs.wallet.hold(request).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    let stats = stubs
        .stats_until("wallet", "Hold", |s| s.cancelled == 1)
        .await;
    assert_eq!(stats.cancelled, 1);

    // A marker hold sent now, with the same latency and room to finish, applies its effect after
    // the moment order-1's would have landed: once it shows, order-1's moment has passed.
    let mut marker = Request::new(hold("order-marker", "alice"));
    marker.set_timeout(Duration::from_secs(30));
    let mut wallet = stubs.wallet.clone();
    let marker = tokio::spawn(async move { wallet.hold(marker).await });
    let effects = stubs.effects_until("", |e| !e.is_empty()).await;
    let references: Vec<&str> = effects.iter().map(|e| e.reference.as_str()).collect();
    assert_eq!(references, ["order-marker"], "order-1 applied nothing");
    assert_eq!(stubs.wallet_stats().await.effects_after_deadline, 0);
    marker.abort();
    stubs.server.stop().await;
}

/// A caller that forwards an `x-request-deadline` but lets a call outlive it (no grpc-timeout,
/// patient client) gets a phantom effect: the wallet applies it after the caller's deadline, and
/// `effects_after_deadline` counts it — the counter the orchestrator's tests assert stays 0.
#[tokio::test]
async fn an_effect_applied_after_the_callers_x_request_deadline_is_counted() {
    let mut stubs = start_stubs().await;
    stubs
        .configure("wallet", "Hold", behavior(300, Fault::Ambiguous))
        .await;
    let mut request = Request::new(hold("order-late", "alice"));
    let deadline_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
        + 50;
    request
        .metadata_mut()
        .insert("x-request-deadline", deadline_ms.into());
    let sent = Instant::now();
    let mut wallet = stubs.wallet.clone();
    let mut call = tokio::spawn(async move { wallet.hold(request).await });
    let effects = stubs.effects_until("wallet", |e| !e.is_empty()).await;
    // An ambiguous hold never answers: still nothing 1.5 s after it was sent.
    never_answers(
        &mut call,
        Duration::from_millis(1500).saturating_sub(sent.elapsed()),
    )
    .await;
    call.abort();
    assert_eq!(effects.len(), 1);
    let effect = &effects[0];
    let applied = effect.applied_at.expect("applied_at");
    let deadline = effect.call_deadline.expect("call_deadline");
    assert!(
        (applied.seconds, applied.nanos) > (deadline.seconds, deadline.nanos),
        "{effect:?}"
    );
    assert_eq!(stubs.wallet_stats().await.effects_after_deadline, 1);
    stubs.server.stop().await;
}

/// Configure names the offending field: an unknown or empty service, a method the service lacks,
/// a p99 below the median, a probability outside [0, 1], an unknown fault.
#[tokio::test]
async fn configure_rejects_bad_targets_and_impossible_behaviours_naming_the_field() {
    let mut stubs = start_stubs().await;
    let cases = [
        ("bank", "", behavior(0, Fault::None), "service"),
        ("", "", behavior(0, Fault::None), "service"),
        ("wallet", "Score", behavior(0, Fault::None), "method"),
        (
            "wallet",
            "Hold",
            Behavior {
                latency_p99_ms: 50,
                ..behavior(100, Fault::None)
            },
            "behavior.latency_p99_ms",
        ),
        (
            "wallet",
            "",
            Behavior {
                fault_probability: Some(1.5),
                ..behavior(0, Fault::Internal)
            },
            "behavior.fault_probability",
        ),
        (
            "cart",
            "",
            Behavior {
                fault: 42,
                ..behavior(0, Fault::None)
            },
            "behavior.fault",
        ),
    ];
    for (service, method, behavior, field) in cases {
        let status = stubs
            .control
            .configure(ConfigureRequest {
                service: service.into(),
                method: method.into(),
                behavior: Some(behavior),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(field), "{status:?}");
        let violations = status.get_details_bad_request().unwrap().field_violations;
        assert_eq!(violations[0].field, field);
    }
    let status = stubs
        .control
        .get_stats(GetStatsRequest {
            service: "bank".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);

    // A missing behaviour is the default one, and an empty method means every method.
    stubs
        .control
        .configure(ConfigureRequest {
            service: "wallet".into(),
            method: String::new(),
            behavior: None,
        })
        .await
        .unwrap();
    stubs.server.stop().await;
}

/// An empty method configures every method of the service, and no other service.
#[tokio::test]
async fn an_empty_method_configures_every_method_of_the_service() {
    let mut stubs = start_stubs().await;
    stubs
        .configure("inventory", "", behavior(0, Fault::Unavailable))
        .await;
    let inv = &mut stubs.inventory;
    let reserve = inv.reserve(reserve("a", "sku-1")).await.unwrap_err();
    let commit = inv
        .commit(CommitRequest {
            reference: "a".into(),
        })
        .await
        .unwrap_err();
    let release = inv
        .release(inventory::v1::ReleaseRequest {
            reference: "a".into(),
        })
        .await
        .unwrap_err();
    for status in [reserve, commit, release] {
        assert_eq!(status.code(), Code::Unavailable);
    }
    stubs.wallet.hold(hold("a", "alice")).await.unwrap();
    stubs.server.stop().await;
}

/// A fault probability of 0 never fires, though the fault mode is set.
#[tokio::test]
async fn a_fault_probability_of_zero_never_faults() {
    let mut stubs = start_stubs().await;
    stubs
        .configure(
            "wallet",
            "",
            Behavior {
                fault_probability: Some(0.0),
                ..behavior(0, Fault::Internal)
            },
        )
        .await;
    for i in 0..20 {
        stubs
            .wallet
            .hold(hold(&format!("order-{i}"), "alice"))
            .await
            .unwrap();
    }
    let stats = stubs.stats("wallet", "Hold").await;
    assert_eq!((stats.ok, stats.errors), (20, 0));
    stubs.server.stop().await;
}

/// Behaviour specs given at start apply from the first call.
#[tokio::test]
async fn initial_behaviour_specs_apply_from_the_first_call() {
    let specs = ["wallet.Hold=fault:unavailable", "cart=latency:300"]
        .map(|s| s.parse::<BehaviorSpec>().unwrap())
        .to_vec();
    let mut stubs = start_stubs_with(specs).await;
    let status = stubs
        .wallet
        .hold(hold("order-1", "alice"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let other_method = stubs
        .wallet
        .capture(CaptureRequest {
            reference: "x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        other_method.code(),
        Code::NotFound,
        "other wallet methods keep the default behaviour"
    );
    let started = Instant::now();
    stubs
        .cart
        .freeze_cart(FreezeCartRequest::default())
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    stubs.server.stop().await;
}

/// GetStats lists one entry per method of the selected services, in a fixed order, including
/// methods never called; the wallet section appears when the wallet is selected.
#[tokio::test]
async fn get_stats_lists_every_method_in_a_stable_order_even_if_never_called() {
    let mut stubs = start_stubs().await;
    let all = stubs
        .control
        .get_stats(GetStatsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let names: Vec<String> = all
        .methods
        .iter()
        .map(|m| format!("{}.{}", m.service, m.method))
        .collect();
    assert_eq!(
        names,
        [
            "cart.FreezeCart",
            "fraud.Score",
            "inventory.Reserve",
            "inventory.Commit",
            "inventory.Release",
            "wallet.Hold",
            "wallet.Capture",
            "wallet.Release",
            "wallet.LookupByReference",
        ]
    );
    assert!(all.wallet.is_some());
    let cart = stubs
        .control
        .get_stats(GetStatsRequest {
            service: "cart".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cart.methods.len(), 1);
    assert!(cart.wallet.is_none());
    stubs.server.stop().await;
}

/// Reset forgets behaviours, counters, the ledger and the effect log.
#[tokio::test]
async fn reset_forgets_behaviour_stats_ledger_and_effects() {
    let mut stubs = start_stubs().await;
    stubs.wallet.hold(hold("order-1", "alice")).await.unwrap();
    stubs
        .configure("wallet", "Hold", behavior(0, Fault::Unavailable))
        .await;
    stubs.control.reset(ResetRequest {}).await.unwrap();

    assert!(stubs.effects("").await.is_empty());
    assert_eq!(stubs.stats("wallet", "Hold").await.received, 0);
    assert_eq!(stubs.wallet_stats().await, WalletStats::default());
    let lookup = stubs.wallet.lookup_by_reference(lookup("order-1")).await;
    assert_eq!(lookup.unwrap_err().code(), Code::NotFound);
    stubs
        .wallet
        .hold(hold("order-1", "alice"))
        .await
        .expect("the fault was forgotten");
    stubs.server.stop().await;
}

/// The stub server reports its services SERVING in grpc.health.v1, and its reflection lists
/// exactly the services it answers.
#[tokio::test]
async fn health_and_reflection_cover_every_stub_service() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let stubs = start_stubs().await;
    let channel = Channel::from_shared(stubs.server.uri())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    for service in [
        "cart.v1.CartService",
        "fraud.v1.FraudService",
        "inventory.v1.InventoryService",
        "wallet.v1.WalletService",
        "stub.v1.StubControl",
    ] {
        let response = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap();
        assert_eq!(
            response.get_ref().status(),
            ServingStatus::Serving,
            "{service}"
        );
    }

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::once(request))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        responses.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list");
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    // Exactly what this port answers: nothing of checkout.v1, which the orchestrator serves.
    assert_eq!(
        names,
        [
            "cart.v1.CartService",
            "fraud.v1.FraudService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "inventory.v1.InventoryService",
            "stub.v1.StubControl",
            "wallet.v1.WalletService",
        ]
    );
    stubs.server.stop().await;
}

/// Stopping the server finishes even while a call hangs: in-flight calls get a grace period, not
/// forever.
#[tokio::test]
async fn stop_finishes_even_while_a_call_hangs() {
    let mut stubs = start_stubs().await;
    stubs
        .configure("wallet", "Hold", behavior(0, Fault::Hang))
        .await;
    let mut wallet = stubs.wallet.clone();
    let hanging = tokio::spawn(async move { wallet.hold(hold("order-1", "alice")).await });
    stubs
        .stats_until("wallet", "Hold", |s| s.received == 1)
        .await;
    let stopped = tokio::time::timeout(Duration::from_secs(10), stubs.server.stop()).await;
    assert!(stopped.is_ok(), "stop did not finish");
    hanging.abort();
}

/// ListEffects lists only the most recent `capacity` effects, in applied order; GetStats counts
/// the older ones dropped, and Reset forgets the counts but keeps the capacity.
#[tokio::test]
async fn list_effects_keeps_the_most_recent_effects_and_get_stats_counts_the_dropped_ones() {
    let mut stubs = start_stubs_keeping(3).await;
    for n in 1..=5 {
        let reference = format!("order-{n}");
        stubs.wallet.hold(hold(&reference, "alice")).await.unwrap();
    }
    let references: Vec<String> = stubs
        .effects("")
        .await
        .into_iter()
        .map(|e| e.reference)
        .collect();
    assert_eq!(references, ["order-3", "order-4", "order-5"]);
    let history = stubs.history().await;
    assert_eq!(
        (
            history.capacity,
            history.effects_retained,
            history.effects_dropped
        ),
        (3, 3, 2)
    );
    // Five holds, all active: none evicted, though more than the capacity.
    assert_eq!((history.records_retained, history.records_evicted), (5, 0));

    stubs.control.reset(ResetRequest {}).await.unwrap();
    assert_eq!(
        stubs.history().await,
        HistoryStats {
            capacity: 3,
            ..HistoryStats::default()
        }
    );
    stubs.server.stop().await;
}

/// Past the capacity, the hold that was captured first is evicted and forgotten — lookup answers
/// NOT_FOUND and a new Hold for its reference is a new hold — while every reference still kept
/// answers DUPLICATE_REFERENCE; the wallet's captured count still includes the evicted hold.
#[tokio::test]
async fn duplicates_are_detected_for_every_retained_hold_and_an_evicted_one_is_forgotten() {
    let mut stubs = start_stubs_keeping(2).await;
    let w = &mut stubs.wallet;
    let mut hold_ids = Vec::new();
    for reference in ["a", "b", "c"] {
        let held = w.hold(hold(reference, "alice")).await.unwrap().into_inner();
        hold_ids.push(held.hold.unwrap().hold_id);
        w.capture(CaptureRequest {
            reference: reference.into(),
        })
        .await
        .unwrap();
    }

    for (reference, hold_id) in [("b", &hold_ids[1]), ("c", &hold_ids[2])] {
        let status = w.hold(hold(reference, "alice")).await.unwrap_err();
        let metadata = error_info(
            &status,
            Code::AlreadyExists,
            "wallet.v1",
            "DUPLICATE_REFERENCE",
        );
        assert_eq!(&metadata["existing_hold_id"], hold_id, "{reference}");
        let kept = w.lookup_by_reference(lookup(reference)).await.unwrap();
        assert_eq!(kept.get_ref().state(), HoldState::Captured);
    }
    let evicted = w.lookup_by_reference(lookup("a")).await.unwrap_err();
    assert_eq!(evicted.code(), Code::NotFound);
    let again = w.hold(hold("a", "alice")).await.unwrap().into_inner();
    assert_ne!(
        again.hold.unwrap().hold_id,
        hold_ids[0],
        "a forgotten reference"
    );

    let history = stubs.history().await;
    // Kept: captured b and c, active a; evicted: the first a.
    assert_eq!((history.records_retained, history.records_evicted), (3, 1));
    let wallet = stubs.wallet_stats().await;
    assert_eq!((wallet.holds_active, wallet.holds_captured), (1, 3));
    stubs.server.stop().await;
}

/// However many holds and reservations finish, the active holds and held reservations are all
/// kept: found by reference, deduplicated, and still able to complete.
#[tokio::test]
async fn active_holds_and_held_reservations_are_never_evicted() {
    let mut stubs = start_stubs_keeping(1).await;
    let live: Vec<String> = (0..5).map(|n| format!("live-{n}")).collect();
    for reference in &live {
        stubs.wallet.hold(hold(reference, "alice")).await.unwrap();
        stubs
            .inventory
            .reserve(reserve(reference, "sku-1"))
            .await
            .unwrap();
    }
    for n in 0..10 {
        let reference = format!("done-{n}");
        stubs.wallet.hold(hold(&reference, "alice")).await.unwrap();
        stubs
            .wallet
            .release(ReleaseRequest {
                reference: reference.clone(),
            })
            .await
            .unwrap();
        stubs
            .inventory
            .reserve(reserve(&reference, "sku-1"))
            .await
            .unwrap();
        stubs
            .inventory
            .release(inventory::v1::ReleaseRequest { reference })
            .await
            .unwrap();
    }
    let history = stubs.history().await;
    // Per collection: the 5 live records plus the last finished one; 9 finished evicted from each.
    assert_eq!(
        (history.records_retained, history.records_evicted),
        (12, 18)
    );

    for reference in &live {
        let status = stubs
            .wallet
            .hold(hold(reference, "alice"))
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::AlreadyExists,
            "{reference}: {status:?}"
        );
        stubs
            .inventory
            .commit(CommitRequest {
                reference: reference.clone(),
            })
            .await
            .unwrap();
        let captured = stubs
            .wallet
            .capture(CaptureRequest {
                reference: reference.clone(),
            })
            .await
            .unwrap();
        assert_eq!(
            captured.into_inner().hold.unwrap().state(),
            HoldState::Captured
        );
    }
    stubs.server.stop().await;
}

//! What every call carries on the wire, seen by an intercepting server: the remaining budget
//! less the reserve as both `grpc-timeout` and `x-request-deadline`, the client id, and the
//! caller's trace context as W3C `traceparent`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use checkout_client::{CheckoutClient, Placed};
use checkout_testkit::TestCheckout;
use opentelemetry::context::FutureExt;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};

use crate::proxy::Proxy;
use crate::{SECOND, order, within};

const MS: Duration = Duration::from_millis(1);

fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    i64::try_from(since.as_millis()).expect("epoch ms fit")
}

/// Under an 800 ms deadline the call carries about 750 ms as grpc-timeout and the same
/// instant as x-request-deadline, plus its client id; with no deadline current, the default
/// 2 s less the reserve.
#[tokio::test]
async fn every_call_carries_its_budget_as_grpc_timeout_and_x_request_deadline() {
    let t = TestCheckout::start().await;
    let proxy = Proxy::start(t.uri()).await;
    let client = CheckoutClient::connect(proxy.uri.clone())
        .await
        .expect("connect")
        .with_client_id("team-a");
    let before = now_ms();
    let placed = within(800 * MS, client.place(order("cart-1", None))).await;
    assert!(matches!(placed, Ok(Placed::Confirmed(_))), "{placed:?}");
    let seen = proxy.seen_of("PlaceOrder").remove(0);
    let budget = seen.grpc_timeout.expect("grpc-timeout");
    assert!(budget <= 750 * MS && budget > 700 * MS, "{budget:?}");
    let at = seen.x_request_deadline.expect("x-request-deadline");
    assert!(
        at >= before + 700 && at <= now_ms() + 750,
        "x-request-deadline {at}, sent after {before}"
    );
    assert_eq!(seen.client_id.as_deref(), Some("team-a"));

    let read = client.get(placed.expect("placed").order_id()).await;
    assert!(read.is_ok(), "{read:?}");
    let seen = proxy.seen_of("GetOrder").remove(0);
    let budget = seen.grpc_timeout.expect("grpc-timeout");
    assert!(
        budget <= 1_950 * MS && budget > 1_900 * MS,
        "default timeout less the reserve: {budget:?}"
    );
    t.stop().await;
}

/// The caller's current OpenTelemetry span context arrives as `traceparent`, its trace and
/// span ids intact; a call outside any span sends none.
#[tokio::test]
async fn the_callers_trace_context_is_sent_as_traceparent() {
    let t = TestCheckout::start().await;
    let proxy = Proxy::start(t.uri()).await;
    let client = CheckoutClient::connect(proxy.uri.clone())
        .await
        .expect("connect");
    let span = SpanContext::new(
        TraceId::from(0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c_u128),
        SpanId::from(0xb7ad_6b71_6920_3331_u64),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let cx = opentelemetry::Context::new().with_remote_span_context(span);
    let placed = within(2 * SECOND, client.place(order("cart-1", None)))
        .with_context(cx)
        .await;
    assert!(matches!(placed, Ok(Placed::Confirmed(_))), "{placed:?}");
    let untraced = within(2 * SECOND, client.get(placed.expect("placed").order_id())).await;
    assert!(untraced.is_ok(), "{untraced:?}");
    let seen = proxy.seen();
    assert_eq!(
        seen[0].traceparent.as_deref(),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    assert_eq!(seen[1].traceparent, None);
    t.stop().await;
}

/// A caller that traces with `tracing` and the tracing-opentelemetry layer needs nothing
/// more: a call made inside a `tracing` span (here a future `.instrument`ed with it) sends
/// that span's trace and span ids as `traceparent`, because the layer (0.32 and later) makes a
/// span's OpenTelemetry context current whenever the span is entered. The subscriber is this
/// test's alone (`set_default`, on the test's one thread), not the process's.
#[tokio::test(flavor = "current_thread")]
async fn a_tracing_span_under_the_opentelemetry_layer_is_sent_as_traceparent() {
    use opentelemetry::trace::TracerProvider as _;
    use tracing::Instrument as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    let t = TestCheckout::start().await;
    let proxy = Proxy::start(t.uri()).await;
    let client = CheckoutClient::connect(proxy.uri.clone())
        .await
        .expect("connect");
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_sampler(opentelemetry_sdk::trace::Sampler::AlwaysOn)
        .build();
    // Only this test's own spans: the checkout and stubs in this process trace on their own.
    let ours = tracing_subscriber::filter::filter_fn(|meta| meta.target().starts_with("calls"));
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("caller"))
        .with_filter(ours);
    let _scoped = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));

    let span = tracing::info_span!("handle_purchase");
    let context = span.context().span().span_context().clone();
    assert!(context.is_valid() && context.is_sampled(), "{context:?}");
    let placed = within(2 * SECOND, client.place(order("cart-1", None)))
        .instrument(span)
        .await;
    assert!(matches!(placed, Ok(Placed::Confirmed(_))), "{placed:?}");
    let seen = proxy.seen_of("PlaceOrder").remove(0);
    assert_eq!(
        seen.traceparent,
        Some(format!(
            "00-{:032x}-{:016x}-01",
            context.trace_id(),
            context.span_id()
        ))
    );
    t.stop().await;
}

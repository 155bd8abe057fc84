//! [`DeadlineLayer`]: a tower layer for the caller's OWN tonic server that reads the deadline
//! its caller sent and makes it current for the handler, so the checkout calls the handler
//! makes spend that deadline (docs/design.md §3 for the headers).
//!
//! It reads `grpc-timeout` (relative, gRPC wire format), `x-request-deadline` (absolute, epoch
//! milliseconds) and `x-envoy-expected-rq-timeout-ms` (relative milliseconds, set by Envoy);
//! the earliest wins. A malformed value is IGNORED, with a debug log: this layer sits in front
//! of a service that did not opt into refusing requests over a header, so it never breaks one.
//! (The checkout service itself refuses them with INVALID_ARGUMENT; it owns its contract.)

use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use checkout_proto::grpc_timeout;
use checkout_proto::metadata::{GRPC_TIMEOUT, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, X_REQUEST_DEADLINE};

use crate::deadline::{self, Deadline};

/// Reads the inbound deadline headers of every request and runs the inner service with that
/// deadline current ([`Deadline::current`]). Add it with `Server::builder().layer(...)`.
#[derive(Debug, Clone, Copy)]
pub struct DeadlineLayer {
    /// Subtracted from an `x-request-deadline`, which compares the caller's clock to ours.
    clock_skew_allowance: Duration,
}

impl Default for DeadlineLayer {
    /// A 5 ms clock skew allowance on `x-request-deadline`, as the checkout service uses.
    fn default() -> Self {
        Self {
            clock_skew_allowance: Duration::from_millis(5),
        }
    }
}

impl DeadlineLayer {
    /// How much earlier than the caller's `x-request-deadline` to assume it ends, for clocks
    /// that disagree (default 5 ms).
    pub fn with_clock_skew_allowance(mut self, allowance: Duration) -> Self {
        self.clock_skew_allowance = allowance;
        self
    }

    /// The deadline `headers` carry, placed on the clock now; `None` when none of the three
    /// headers carries a usable value.
    pub fn read(&self, headers: &http::HeaderMap) -> Option<Deadline> {
        self.budget(headers, SystemTime::now()).map(Deadline::after)
    }

    /// The time `headers` leave from `now` (the wall clock, for `x-request-deadline`): the
    /// earliest of every well-formed value; malformed values are skipped with a debug log.
    fn budget(&self, headers: &http::HeaderMap, now: SystemTime) -> Option<Duration> {
        let mut earliest: Option<Duration> = None;
        let mut consider = |left: Duration| {
            earliest = Some(earliest.map_or(left, |e| e.min(left)));
        };
        for (value, header) in values(headers, GRPC_TIMEOUT) {
            match grpc_timeout::parse(value) {
                Ok(left) => consider(left),
                Err(error) => ignored(header, value, &error.to_string()),
            }
        }
        for (value, header) in values(headers, X_REQUEST_DEADLINE) {
            match milliseconds(value) {
                Some(at_ms) => {
                    let at = UNIX_EPOCH + Duration::from_millis(at_ms);
                    let left = at.duration_since(now).unwrap_or(Duration::ZERO);
                    consider(left.saturating_sub(self.clock_skew_allowance));
                }
                None => ignored(header, value, "not epoch milliseconds"),
            }
        }
        for (value, header) in values(headers, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS) {
            match milliseconds(value) {
                Some(ms) => consider(Duration::from_millis(ms)),
                None => ignored(header, value, "not milliseconds"),
            }
        }
        earliest
    }
}

/// Every value of `header` that is text (a non-ASCII value is logged and skipped).
fn values<'h>(
    headers: &'h http::HeaderMap,
    header: &'static str,
) -> impl Iterator<Item = (&'h str, &'static str)> {
    headers
        .get_all(header)
        .iter()
        .filter_map(move |value| match value.to_str() {
            Ok(text) => Some((text, header)),
            Err(_) => {
                ignored(header, "<not ASCII>", "not ASCII");
                None
            }
        })
}

/// A non-negative integer of at most 19 digits (what `u64` and an epoch in ms hold).
fn milliseconds(value: &str) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// Logs a skipped header value, cut short: it is the caller's input.
fn ignored(header: &str, value: &str, why: &str) {
    let shown: String = value.chars().take(32).collect();
    tracing::debug!(header, value = %shown, why, "ignoring a malformed deadline header");
}

impl<S> tower::Layer<S> for DeadlineLayer {
    type Service = DeadlineService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService {
            inner,
            layer: *self,
        }
    }
}

/// The service [`DeadlineLayer`] wraps around yours.
#[derive(Debug, Clone)]
pub struct DeadlineService<S> {
    /// Your service.
    inner: S,
    /// How headers are read.
    layer: DeadlineLayer,
}

/// The inner service's future, run with the request's deadline current.
pub type ResponseFuture<F> = tokio::task::futures::TaskLocalFuture<Option<Deadline>, F>;

impl<S, B> tower::Service<http::Request<B>> for DeadlineService<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let current = self.layer.read(request.headers());
        // Current for the inner `call` too, in case it starts work before returning its future.
        let future = deadline::sync_scope(current, || self.inner.call(request));
        deadline::scope(current, future)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A wall clock at a round epoch millisecond.
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_800_000_000_000)
    }

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().expect("valid header value"));
        }
        map
    }

    fn budget(pairs: &[(&'static str, &str)]) -> Option<Duration> {
        DeadlineLayer::default().budget(&headers(pairs), now())
    }

    /// Each of the three headers is read on its own; none gives no deadline.
    #[test]
    fn each_header_is_a_deadline_source() {
        assert_eq!(budget(&[]), None);
        assert_eq!(budget(&[(GRPC_TIMEOUT, "800m")]), Some(800 * MS));
        assert_eq!(
            budget(&[(X_REQUEST_DEADLINE, "1800000000800")]),
            Some(795 * MS),
            "less the clock skew allowance"
        );
        assert_eq!(
            budget(&[(X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, "650")]),
            Some(650 * MS)
        );
    }

    /// Every source present is read and the earliest wins, whichever it is.
    #[test]
    fn the_earliest_source_wins() {
        let all = |t: &str, x: &str, e: &str| {
            budget(&[
                (GRPC_TIMEOUT, t),
                (X_REQUEST_DEADLINE, x),
                (X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, e),
            ])
        };
        assert_eq!(all("300m", "1800000001000", "900"), Some(300 * MS));
        assert_eq!(all("2S", "1800000000405", "900"), Some(400 * MS));
        assert_eq!(all("2S", "1800000001000", "120"), Some(120 * MS));
    }

    /// Malformed values are ignored (the others still count); a deadline already past is zero.
    #[test]
    fn malformed_values_are_ignored_and_past_deadlines_are_zero() {
        assert_eq!(budget(&[(GRPC_TIMEOUT, "800")]), None);
        assert_eq!(budget(&[(X_REQUEST_DEADLINE, "soon")]), None);
        assert_eq!(budget(&[(X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, "-5")]), None);
        assert_eq!(
            budget(&[
                (GRPC_TIMEOUT, "1.5S"),
                (X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, "700")
            ]),
            Some(700 * MS)
        );
        assert_eq!(
            budget(&[(X_REQUEST_DEADLINE, "1799999999000")]),
            Some(Duration::ZERO)
        );
        assert_eq!(
            budget(&[(X_REQUEST_DEADLINE, "99999999999999999999")]),
            None
        );
    }

    /// A header sent twice is not refused: both values count and the earlier binds.
    #[test]
    fn repeated_headers_count_every_value() {
        assert_eq!(
            budget(&[(GRPC_TIMEOUT, "900m"), (GRPC_TIMEOUT, "400m")]),
            Some(400 * MS)
        );
    }

    /// The clock skew allowance is configurable.
    #[test]
    fn the_clock_skew_allowance_is_configurable() {
        let layer = DeadlineLayer::default().with_clock_skew_allowance(Duration::ZERO);
        let h = headers(&[(X_REQUEST_DEADLINE, "1800000000800")]);
        assert_eq!(layer.budget(&h, now()), Some(800 * MS));
    }

    /// Through the tower service, the handler sees the request's deadline as current, and a
    /// request without one sees none.
    #[tokio::test(start_paused = true)]
    async fn the_handler_runs_with_the_request_deadline_current() {
        use tower::{Layer, Service, ServiceExt};
        let handler = tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(Deadline::current().map(|d| d.remaining()))
        });
        let mut service = DeadlineLayer::default().layer(handler);
        let request = http::Request::builder()
            .header(GRPC_TIMEOUT, "250m")
            .body(())
            .expect("request");
        let seen = service.ready().await.expect("ready").call(request).await;
        assert_eq!(seen, Ok(Some(250 * MS)));
        let bare = http::Request::new(());
        assert_eq!(
            service.ready().await.expect("ready").call(bare).await,
            Ok(None)
        );
    }
}

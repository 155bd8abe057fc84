//! The request metadata that carries a deadline from hop to hop, and the epoch-millisecond clock
//! `x-request-deadline` is written in. Parsing policy (which source wins, caps, reserves) belongs
//! to whoever reads them; this module only names and encodes them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The gRPC wire deadline (relative), encoded by [`crate::grpc_timeout`].
pub const GRPC_TIMEOUT: &str = "grpc-timeout";
/// An absolute deadline in epoch milliseconds, forwarded unchanged by every hop.
pub const X_REQUEST_DEADLINE: &str = "x-request-deadline";
/// A relative deadline in milliseconds, sent by older mobile clients.
pub const REQUEST_DEADLINE_MS: &str = "request-deadline-ms";
/// The route timeout a proxy (Envoy) announces to the upstream, relative milliseconds.
pub const X_ENVOY_EXPECTED_RQ_TIMEOUT_MS: &str = "x-envoy-expected-rq-timeout-ms";
/// Who the caller is when it speaks plaintext: the idempotency scope.
pub const X_CLIENT_ID: &str = "x-client-id";

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    epoch_ms(SystemTime::now())
}

/// Milliseconds since the Unix epoch (negative before 1970, which no clock here reports).
pub fn epoch_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => millis_i64(d),
        Err(e) => -millis_i64(e.duration()),
    }
}

/// `d` in whole milliseconds, saturating at `i64::MAX`.
fn millis_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The epoch itself is 0 and a time before it is negative, so a bogus clock cannot wrap.
    #[test]
    fn epoch_ms_is_signed_around_the_epoch() {
        assert_eq!(epoch_ms(UNIX_EPOCH), 0);
        assert_eq!(epoch_ms(UNIX_EPOCH - Duration::from_millis(5)), -5);
        assert_eq!(epoch_ms(UNIX_EPOCH + Duration::from_millis(1_500)), 1_500);
    }
}

//! Reads the caller's deadline from inbound metadata: every source present is parsed, malformed
//! values are refused, and the earliest deadline wins, capped at `server_budget_max`.

use std::time::{Duration, Instant, SystemTime};

use tonic::metadata::MetadataMap;

use super::{Deadline, DeadlinePolicy, DeadlineSource, epoch_ms, grpc_timeout};

pub use checkout_proto::metadata::{
    GRPC_TIMEOUT, REQUEST_DEADLINE_MS, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, X_REQUEST_DEADLINE,
};

/// A deadline header that cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("is malformed ({reason}): {value:?}")]
pub struct IngestError {
    /// The offending header.
    pub header: &'static str,
    /// Its raw value (lossy for non-ASCII), cut to [`ECHO_LIMIT`] characters: a status message
    /// never repeats more of a client's input than that.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Reads the deadline of a request that arrived now.
pub fn ingest(metadata: &MetadataMap, policy: &DeadlinePolicy) -> Result<Deadline, IngestError> {
    ingest_at(metadata, policy, Instant::now(), SystemTime::now())
}

/// [`ingest`] with the arrival instant and wall clock given (for tests).
pub fn ingest_at(
    metadata: &MetadataMap,
    policy: &DeadlinePolicy,
    arrived: Instant,
    wall: SystemTime,
) -> Result<Deadline, IngestError> {
    let now_ms = epoch_ms(wall);
    let mut best: Option<(Duration, DeadlineSource)> = None;
    let mut consider = |remaining: Duration, source| {
        if best.is_none_or(|(b, _)| remaining < b) {
            best = Some((remaining, source));
        }
    };

    if let Some(raw) = single(metadata, GRPC_TIMEOUT)? {
        let timeout = grpc_timeout::parse(raw).map_err(|e| malformed(GRPC_TIMEOUT, raw, e))?;
        consider(timeout, DeadlineSource::GrpcTimeout);
    }
    let mut caller_epoch_ms = None;
    if let Some(raw) = single(metadata, X_REQUEST_DEADLINE)? {
        let at_ms = non_negative_integer(X_REQUEST_DEADLINE, raw)?;
        let at_ms =
            i64::try_from(at_ms).map_err(|_| malformed(X_REQUEST_DEADLINE, raw, "too large"))?;
        caller_epoch_ms = Some(at_ms);
        let skew = i64::try_from(policy.clock_skew_allowance.as_millis()).unwrap_or(i64::MAX);
        let left_ms = at_ms.saturating_sub(now_ms).saturating_sub(skew).max(0);
        consider(
            Duration::from_millis(left_ms.unsigned_abs()),
            DeadlineSource::XRequestDeadline,
        );
    }
    if let Some(raw) = single(metadata, REQUEST_DEADLINE_MS)? {
        let ms = non_negative_integer(REQUEST_DEADLINE_MS, raw)?;
        let effective = Duration::from_millis(ms)
            .saturating_sub(policy.request_deadline_ms_reserve)
            .min(policy.server_budget_max);
        consider(effective, DeadlineSource::RequestDeadlineMs);
    }
    if let Some(raw) = single(metadata, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS)? {
        let ms = non_negative_integer(X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, raw)?;
        consider(
            Duration::from_millis(ms),
            DeadlineSource::EnvoyExpectedRqTimeout,
        );
    }

    let (budget, source) = best.unwrap_or((policy.server_budget_max, DeadlineSource::Default));
    let budget = budget.min(policy.server_budget_max);
    let at_epoch_ms = now_ms.saturating_add(i64::try_from(budget.as_millis()).unwrap_or(i64::MAX));
    Ok(Deadline {
        started: arrived,
        at: arrived + budget,
        at_epoch_ms,
        forward_epoch_ms: caller_epoch_ms.unwrap_or(at_epoch_ms),
        source,
    })
}

/// The header's value, if sent once; sending a deadline header twice is ambiguous, so refused.
fn single<'m>(
    metadata: &'m MetadataMap,
    header: &'static str,
) -> Result<Option<&'m str>, IngestError> {
    let mut values = metadata.get_all(header).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        // Cut like any malformed value: the first value is the caller's bytes, of any length.
        return Err(malformed(
            header,
            &String::from_utf8_lossy(first.as_encoded_bytes()),
            "sent more than once",
        ));
    }
    first.to_str().map(Some).map_err(|_| {
        malformed(
            header,
            &String::from_utf8_lossy(first.as_encoded_bytes()),
            "not ASCII",
        )
    })
}

fn non_negative_integer(header: &'static str, raw: &str) -> Result<u64, IngestError> {
    if raw.is_empty() || raw.len() > 19 || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed(
            header,
            raw,
            "expected a non-negative integer of milliseconds",
        ));
    }
    raw.parse().map_err(|_| malformed(header, raw, "too large"))
}

/// The most characters of a malformed value an error repeats.
pub const ECHO_LIMIT: usize = 32;

fn malformed(header: &'static str, value: &str, reason: impl ToString) -> IngestError {
    let mut shown: String = value.chars().take(ECHO_LIMIT).collect();
    if shown.len() < value.len() {
        shown.push('…');
    }
    IngestError {
        header,
        value: shown,
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn md(pairs: &[(&'static str, &str)]) -> MetadataMap {
        let mut m = MetadataMap::new();
        for (k, v) in pairs {
            m.append(*k, v.parse().expect("ascii"));
        }
        m
    }

    fn run(pairs: &[(&'static str, &str)]) -> Result<Deadline, IngestError> {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_000);
        ingest_at(&md(pairs), &DeadlinePolicy::default(), Instant::now(), wall)
    }

    #[test]
    fn no_header_grants_the_server_budget() {
        let d = run(&[]).expect("ok");
        assert_eq!(d.granted(), Duration::from_millis(2400));
        assert_eq!(d.source(), DeadlineSource::Default);
        assert_eq!(d.forward_epoch_ms(), 1_800_000_002_400);
        assert_eq!(d.at_epoch_ms(), 1_800_000_002_400);
    }

    #[test]
    fn grpc_timeout_is_read_and_capped() {
        let d = run(&[(GRPC_TIMEOUT, "1000m")]).expect("ok");
        assert_eq!(
            (d.granted(), d.source()),
            (Duration::from_secs(1), DeadlineSource::GrpcTimeout)
        );
        let capped = run(&[(GRPC_TIMEOUT, "30S")]).expect("ok");
        assert_eq!(capped.granted(), Duration::from_millis(2400));
    }

    #[test]
    fn x_request_deadline_subtracts_skew_and_is_forwarded_unchanged() {
        let d = run(&[(X_REQUEST_DEADLINE, "1800000001000")]).expect("ok");
        assert_eq!(d.granted(), Duration::from_millis(995));
        assert_eq!(d.source(), DeadlineSource::XRequestDeadline);
        assert_eq!(d.forward_epoch_ms(), 1_800_000_001_000);
        let past = run(&[(X_REQUEST_DEADLINE, "1799999999000")]).expect("ok");
        assert_eq!(past.granted(), Duration::ZERO);
    }

    #[test]
    fn request_deadline_ms_follows_the_adr_clamp() {
        let d = run(&[(REQUEST_DEADLINE_MS, "3000")]).expect("ok");
        assert_eq!(d.granted(), Duration::from_millis(2400));
        let d = run(&[(REQUEST_DEADLINE_MS, "1500")]).expect("ok");
        assert_eq!(d.granted(), Duration::from_millis(900));
        let d = run(&[(REQUEST_DEADLINE_MS, "400")]).expect("ok");
        assert_eq!(d.granted(), Duration::ZERO);
        assert_eq!(d.source(), DeadlineSource::RequestDeadlineMs);
    }

    /// Envoy's route timeout is read as relative milliseconds with no reserve taken off, is
    /// capped at the server budget, and names itself as the source when it wins.
    #[test]
    fn envoy_expected_rq_timeout_is_a_relative_deadline_capped_at_the_server_budget() {
        let d = run(&[(X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, "500")]).expect("ok");
        assert_eq!(
            (d.granted(), d.source()),
            (
                Duration::from_millis(500),
                DeadlineSource::EnvoyExpectedRqTimeout
            )
        );
        assert_eq!(d.source().as_str(), "x-envoy-expected-rq-timeout-ms");
        assert_eq!(d.forward_epoch_ms(), 1_800_000_000_500);
        let capped = run(&[(X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, "15000")]).expect("ok");
        assert_eq!(capped.granted(), Duration::from_millis(2400));
    }

    /// A proxy's timeout only ever shortens the caller's deadline: an earlier caller deadline
    /// still wins over a longer route timeout, and a shorter route timeout wins over it.
    #[test]
    fn envoy_expected_rq_timeout_can_only_shorten_the_deadline() {
        let longer = run(&[
            (GRPC_TIMEOUT, "300m"),
            (X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, "1000"),
        ])
        .expect("ok");
        assert_eq!(
            (longer.granted(), longer.source()),
            (Duration::from_millis(300), DeadlineSource::GrpcTimeout)
        );
        let shorter = run(&[
            (X_REQUEST_DEADLINE, "1800000002000"),
            (X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, "700"),
        ])
        .expect("ok");
        assert_eq!(
            (shorter.granted(), shorter.source()),
            (
                Duration::from_millis(700),
                DeadlineSource::EnvoyExpectedRqTimeout
            )
        );
        assert_eq!(
            shorter.forward_epoch_ms(),
            1_800_000_002_000,
            "the caller's absolute deadline is still forwarded unchanged"
        );
    }

    #[test]
    fn the_earliest_source_wins() {
        let d = run(&[
            (GRPC_TIMEOUT, "2S"),
            (X_REQUEST_DEADLINE, "1800000001500"),
            (REQUEST_DEADLINE_MS, "2000"),
        ])
        .expect("ok");
        assert_eq!(
            (d.granted(), d.source()),
            (
                Duration::from_millis(1400),
                DeadlineSource::RequestDeadlineMs
            )
        );
        let d = run(&[
            (GRPC_TIMEOUT, "700m"),
            (X_REQUEST_DEADLINE, "1800000001500"),
        ])
        .expect("ok");
        assert_eq!(d.source(), DeadlineSource::GrpcTimeout);
        assert_eq!(
            d.forward_epoch_ms(),
            1_800_000_001_500,
            "the caller's absolute deadline is forwarded unchanged"
        );
    }

    #[test]
    fn malformed_values_name_their_header() {
        for (header, value) in [
            (GRPC_TIMEOUT, "100"),
            (GRPC_TIMEOUT, "123456789m"),
            (GRPC_TIMEOUT, ""),
            (X_REQUEST_DEADLINE, "soon"),
            (X_REQUEST_DEADLINE, "-5"),
            (X_REQUEST_DEADLINE, "99999999999999999999"),
            (REQUEST_DEADLINE_MS, "1.5"),
            (REQUEST_DEADLINE_MS, ""),
            (X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, "15s"),
            (X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, "-1"),
            (X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, ""),
            (X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, "99999999999999999999"),
        ] {
            let err = run(&[(header, value)]).expect_err(value);
            assert_eq!(err.header, header, "{value}");
        }
        let twice = run(&[(GRPC_TIMEOUT, "1S"), (GRPC_TIMEOUT, "2S")]).expect_err("twice");
        assert_eq!(twice.reason, "sent more than once");
    }

    /// A header sent twice is refused, and the error repeats at most [`ECHO_LIMIT`] characters
    /// of its first value, whatever its bytes (here 4 KiB, ASCII or not): the duplicate path
    /// is cut like every other malformed value.
    #[test]
    fn a_header_sent_twice_echoes_at_most_the_echo_limit() {
        let long = "9".repeat(4096);
        let mut non_ascii = vec![0xffu8; 4096];
        non_ascii[0] = b'1';
        for header in [
            GRPC_TIMEOUT,
            X_REQUEST_DEADLINE,
            REQUEST_DEADLINE_MS,
            X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
        ] {
            for first in [
                tonic::metadata::AsciiMetadataValue::try_from(long.as_str()).expect("ascii"),
                tonic::metadata::AsciiMetadataValue::try_from(non_ascii.as_slice())
                    .expect("obs-text is a valid header value"),
            ] {
                let mut m = MetadataMap::new();
                m.append(header, first);
                m.append(header, "100".parse().expect("ascii"));
                let err = ingest(&m, &DeadlinePolicy::default()).expect_err("twice");
                assert_eq!(
                    (err.header, err.reason.as_str()),
                    (header, "sent more than once")
                );
                assert!(
                    err.value.chars().count() <= ECHO_LIMIT + 1,
                    "{header}: {} characters echoed",
                    err.value.chars().count()
                );
                assert!(err.to_string().len() < 200, "{header}: {err}");
            }
        }
    }

    proptest! {
        #[test]
        fn granted_never_exceeds_the_cap_or_any_source(t in 0u64..100_000, x in 0i64..100_000, r in 0u64..100_000, e in 0u64..100_000) {
            let d = run(&[
                (GRPC_TIMEOUT, &format!("{t}m")),
                (X_REQUEST_DEADLINE, &(1_800_000_000_000 + x).to_string()),
                (REQUEST_DEADLINE_MS, &r.to_string()),
                (X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, &e.to_string()),
            ]).expect("valid");
            let g = d.granted();
            prop_assert!(g <= Duration::from_millis(2400));
            prop_assert!(g <= Duration::from_millis(t));
            prop_assert!(g <= Duration::from_millis(x.unsigned_abs()));
            prop_assert!(g <= Duration::from_millis(r));
            prop_assert!(g <= Duration::from_millis(e));
        }

        #[test]
        fn arbitrary_x_request_deadline_values_either_parse_or_name_the_header(s in "[ -~]{0,24}") {
            match run(&[(X_REQUEST_DEADLINE, &s)]) {
                Ok(d) => prop_assert!(s.bytes().all(|b| b.is_ascii_digit()) && d.granted() <= Duration::from_millis(2400)),
                Err(e) => prop_assert_eq!(e.header, X_REQUEST_DEADLINE),
            }
        }
    }
}

//! Inbound metadata, as hostile as a caller can make it: any number of values (valid header
//! bytes of any kind) for the deadline headers and `x-client-id`. Ingest and the idempotency
//! scope never panic, a granted deadline never exceeds the server's cap, and no error repeats
//! more than `ECHO_LIMIT` characters of what was sent.

#![no_main]

use std::time::{Duration, Instant, SystemTime};

use checkout::checkout::scope;
use checkout::deadline::{DeadlinePolicy, ECHO_LIMIT, ingest_at};
use libfuzzer_sys::fuzz_target;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};

const HEADERS: [&str; 5] = [
    "grpc-timeout",
    "x-request-deadline",
    "request-deadline-ms",
    "x-envoy-expected-rq-timeout-ms",
    "x-client-id",
];

fuzz_target!(|data: &[u8]| {
    // Values are separated by 0x00 (never valid in a header); each value's first byte names
    // its header.
    let mut metadata = MetadataMap::new();
    for chunk in data.split(|b| *b == 0).take(16) {
        let Some((which, value)) = chunk.split_first() else {
            continue;
        };
        if let Ok(value) = AsciiMetadataValue::try_from(value) {
            metadata.append(HEADERS[usize::from(*which) % HEADERS.len()], value);
        }
    }
    let policy = DeadlinePolicy::default();
    let wall = SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_000);
    match ingest_at(&metadata, &policy, Instant::now(), wall) {
        Ok(deadline) => assert!(deadline.granted() <= policy.server_budget_max),
        Err(error) => {
            assert!(
                error.value.chars().count() <= ECHO_LIMIT + 1,
                "{} characters echoed",
                error.value.chars().count()
            );
            assert!(error.to_string().len() <= 512, "{error}");
        }
    }
    let mut violations = Vec::new();
    let scope = scope(&metadata, &mut violations);
    // A refused x-client-id (malformed, or sent twice) leaves no usable scope, only a violation.
    assert!(scope.ends_with(":checkout") || !violations.is_empty());
    for v in &violations {
        assert!(v.description.len() <= 128, "{v:?}");
    }
});

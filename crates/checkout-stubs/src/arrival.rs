//! When a stubbed call arrived and the deadline it carried (`grpc-timeout`,
//! `x-request-deadline`), read once so the accounting can judge whether an effect came late.

use std::time::{Duration, SystemTime};

use checkout_proto::grpc_timeout;
use checkout_proto::metadata::{GRPC_TIMEOUT, X_REQUEST_DEADLINE, epoch_ms};
use tokio::time::Instant;
use tonic::metadata::MetadataMap;

/// When a call arrived and the deadline it carried.
#[derive(Debug, Clone)]
pub(crate) struct Arrival {
    /// Monotonic arrival instant (tokio's clock, so it follows paused test time).
    arrived: Instant,
    /// Wall clock at arrival, to report instants as timestamps.
    arrived_wall: SystemTime,
    /// The `grpc-timeout` the call carried.
    pub(crate) budget: Option<Duration>,
    /// The `x-request-deadline` (epoch ms) the call carried.
    pub(crate) x_request_deadline: Option<i64>,
}

impl Arrival {
    /// Reads the deadline headers of a call arriving now. Malformed values count as absent:
    /// a stub records what it can and never refuses a call over them.
    pub(crate) fn read(metadata: &MetadataMap) -> Self {
        let header = |name: &str| metadata.get(name).and_then(|v| v.to_str().ok());
        let budget = header(GRPC_TIMEOUT).and_then(|v| grpc_timeout::parse(v).ok());
        let x_request_deadline = header(X_REQUEST_DEADLINE).and_then(|v| v.trim().parse().ok());
        Self::at(
            Instant::now(),
            SystemTime::now(),
            budget,
            x_request_deadline,
        )
    }

    /// An arrival at a given instant (for tests of the accounting).
    pub(crate) fn at(
        arrived: Instant,
        arrived_wall: SystemTime,
        budget: Option<Duration>,
        x_request_deadline: Option<i64>,
    ) -> Self {
        Self {
            arrived,
            arrived_wall,
            budget,
            x_request_deadline,
        }
    }

    /// The call's deadline: the earlier of arrival plus its `grpc-timeout` and its
    /// `x-request-deadline` (the caller's own deadline, as docs/design.md §3 reads it); `None` if it
    /// carried neither.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let relative = self.budget.and_then(|b| self.arrived.checked_add(b));
        let absolute = self.x_request_deadline.map(|at_ms| {
            let left_ms = at_ms.saturating_sub(epoch_ms(self.arrived_wall)).max(0);
            self.arrived + Duration::from_millis(left_ms.unsigned_abs())
        });
        match (relative, absolute) {
            (Some(r), Some(a)) => Some(r.min(a)),
            (r, a) => r.or(a),
        }
    }

    /// Whether the call's deadline had passed when it arrived: a zero `grpc-timeout`, or an
    /// `x-request-deadline` already in the past.
    pub(crate) fn expired(&self) -> bool {
        self.budget.is_some_and(|b| b.is_zero())
            || self
                .x_request_deadline
                .is_some_and(|d| d < epoch_ms(self.arrived_wall))
    }

    /// The wall-clock time of `at`, measured from this arrival; `None` if unrepresentable.
    pub(crate) fn wall_clock(&self, at: Instant) -> Option<SystemTime> {
        let since = at.saturating_duration_since(self.arrived);
        self.arrived_wall.checked_add(since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(headers: &[(&'static str, &str)]) -> Arrival {
        let mut metadata = MetadataMap::new();
        for (name, value) in headers {
            metadata.insert(*name, value.parse().unwrap());
        }
        Arrival::read(&metadata)
    }

    #[test]
    fn deadline_headers_are_read_and_malformed_ones_ignored() {
        let read = arrival(&[
            ("grpc-timeout", "250m"),
            ("x-request-deadline", "1700000000000"),
        ]);
        assert_eq!(read.budget, Some(Duration::from_millis(250)));
        assert_eq!(read.x_request_deadline, Some(1_700_000_000_000));
        assert!(read.deadline().is_some());

        let malformed = arrival(&[("grpc-timeout", "250ms"), ("x-request-deadline", "soon")]);
        assert_eq!(malformed.budget, None);
        assert_eq!(malformed.x_request_deadline, None);
        assert_eq!(malformed.deadline(), None);
    }

    #[test]
    fn a_zero_budget_or_a_past_x_request_deadline_arrived_expired() {
        assert!(arrival(&[("grpc-timeout", "0n")]).expired());
        assert!(!arrival(&[("grpc-timeout", "1n")]).expired());
        assert!(arrival(&[("x-request-deadline", "1")]).expired());
        let future = (epoch_ms(SystemTime::now()) + 60_000).to_string();
        assert!(!arrival(&[("x-request-deadline", &future)]).expired());
        assert!(!arrival(&[]).expired());
    }
}

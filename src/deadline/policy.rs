//! `[deadline]`: how the caller's deadline is read (caps, the relative header's reserve, clock
//! skew) and spent (the reserves, the admission floor's parts, the least a call is sent with).

use std::time::Duration;

use serde::Deserialize;

/// `deadline.*` keys (docs/design.md §3): reading and spending the caller's deadline.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeadlinePolicy {
    /// Cap on any deadline, and the deadline when the caller sends none.
    #[serde(with = "humantime_serde")]
    pub server_budget_max: Duration,
    /// Subtracted from `request-deadline-ms` (docs/design.md §8).
    #[serde(with = "humantime_serde")]
    pub request_deadline_ms_reserve: Duration,
    /// Kept back from every child budget so the answer can still be sent in time.
    #[serde(with = "humantime_serde")]
    pub return_reserve: Duration,
    /// Kept back from every child budget, on top of `return_reserve`, so the decision can be
    /// written durably before the answer leaves. 0 gives docs/design.md §3's formula exactly.
    #[serde(with = "humantime_serde")]
    pub record_reserve: Duration,
    /// Below this (after the return reserve) a request is refused on arrival.
    #[serde(with = "humantime_serde")]
    pub fast_fail_floor: Duration,
    /// A downstream call is not sent with less than this.
    #[serde(with = "humantime_serde")]
    pub min_to_send: Duration,
    /// Subtracted from an absolute `x-request-deadline` for clock skew between hosts.
    #[serde(with = "humantime_serde")]
    pub clock_skew_allowance: Duration,
}

impl Default for DeadlinePolicy {
    fn default() -> Self {
        Self {
            server_budget_max: Duration::from_millis(2400),
            request_deadline_ms_reserve: Duration::from_millis(600),
            return_reserve: Duration::from_millis(50),
            record_reserve: Duration::from_millis(20),
            fast_fail_floor: Duration::from_millis(100),
            min_to_send: Duration::from_millis(50),
            clock_skew_allowance: Duration::from_millis(5),
        }
    }
}

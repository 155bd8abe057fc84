//! How a dead connection to a downstream is found and given up: `downstream_connection.*`,
//! and the TCP connector every downstream channel is built with.

use std::time::Duration;

use serde::Deserialize;

/// `downstream_connection.*` keys: how a connection to a downstream that has gone dead — its
/// peer gone, or the network between silently dropping packets — is found and given up, in
/// TCP itself, below gRPC (HTTP/2 PINGs this often would be refused by gRPC servers' default
/// ping policies, which allow one every five minutes).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DownstreamConnectionPolicy {
    /// An idle connection is probed (TCP keepalive) after this long without traffic, then
    /// again every this long; unanswered, it is closed.
    #[serde(with = "humantime_serde")]
    pub keepalive: Duration,
    /// Data sent on a connection and not acknowledged for this long aborts the connection
    /// (TCP_USER_TIMEOUT), discarding whatever it had not delivered: a call sent into a
    /// partition is never delivered after the partition heals, later than this after it was
    /// sent. Above the longest call (the 2.4 s server budget, the worker's 2 s attempts) and
    /// several retransmissions of a lossy link.
    #[serde(with = "humantime_serde")]
    pub unacked_timeout: Duration,
}

impl Default for DownstreamConnectionPolicy {
    fn default() -> Self {
        Self {
            keepalive: Duration::from_secs(1),
            unacked_timeout: Duration::from_secs(3),
        }
    }
}

/// The TCP connector of every downstream channel: tonic's own settings (any scheme, no
/// Nagle, the step's connect timeout) and `downstream_connection`'s dead-connection detection:
/// TCP keepalive on idle connections, and TCP_USER_TIMEOUT on data left unacknowledged, which
/// aborts the connection and discards what it had not delivered (docs/design.md §10,
/// Partitions). Without them a connection into a partition that drops packets stays open:
/// every call on it times out (an ambiguous outcome), and what was written to it is delivered
/// when the partition heals, however late — a wallet effect long after its call's deadline.
pub(super) fn tcp_connector(
    connect: std::time::Duration,
    link: &DownstreamConnectionPolicy,
) -> hyper_util::client::legacy::connect::HttpConnector {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect));
    http.set_keepalive(Some(link.keepalive));
    http.set_keepalive_interval(Some(link.keepalive));
    #[cfg(target_os = "linux")]
    http.set_tcp_user_timeout(Some(link.unacked_timeout));
    http
}

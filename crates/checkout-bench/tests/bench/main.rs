//! The tooling's integration suite, one test binary: the bare baseline and the loader over
//! real gRPC on 127.0.0.1:0 (`bare`), and the incident scenarios through the library and the
//! real `checkout-bench` binary (`scenarios`).

mod bare;
// The workspace's one poll helper (it needs nothing but tokio).
#[path = "../../../../tests/common/poll.rs"]
mod poll;
mod scenarios;
mod support;

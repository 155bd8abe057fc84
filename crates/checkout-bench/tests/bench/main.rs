//! The tooling's integration suite, one test binary: the bare baseline and the loader over
//! real gRPC on 127.0.0.1:0 (`bare`), and the incident scenarios through the library and the
//! real `checkout-bench` binary (`scenarios`).

mod bare;
mod scenarios;
mod support;

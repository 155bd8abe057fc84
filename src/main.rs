//! The `checkout` binary.
fn main() {}

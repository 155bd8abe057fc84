//! Generates the Rust code of every package in the repository's `proto/` with protox (a
//! pure-Rust protobuf compiler, so no system `protoc`): messages, clients and servers.

use std::path::PathBuf;

/// Every `.proto` file, relative to `proto/`.
const PROTOS: &[&str] = &[
    "checkout/v1/checkout.proto",
    "cart/v1/cart.proto",
    "fraud/v1/fraud.proto",
    "inventory/v1/inventory.proto",
    "wallet/v1/wallet.proto",
    "stub/v1/stub.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let descriptors = protox::compile(PROTOS, [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}

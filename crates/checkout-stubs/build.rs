//! Encodes the descriptor set the stub server's reflection serves: the four stubbed services
//! and `stub.v1.StubControl` (with their imports), and not `checkout.v1`, which this port does
//! not answer. The code itself is generated once, in `crates/checkout-proto`.

use std::path::PathBuf;

/// What the stub server answers, relative to the repository's `proto/`.
const SERVED: &[&str] = &[
    "cart/v1/cart.proto",
    "fraud/v1/fraud.proto",
    "inventory/v1/inventory.proto",
    "wallet/v1/wallet.proto",
    "stub/v1/stub.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = protox::compile(SERVED, [&root])?;
    std::fs::write(
        out_dir.join("stubs_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    Ok(())
}

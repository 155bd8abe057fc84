//! Compiles proto/ with protox (a pure-Rust protobuf compiler, so no system `protoc`) and emits
//! the descriptor set that server reflection serves.

use std::{env, path::PathBuf};

const PROTOS: &[&str] = &[
    "checkout/v1/checkout.proto",
    "cart/v1/cart.proto",
    "fraud/v1/fraud.proto",
    "inventory/v1/inventory.proto",
    "wallet/v1/wallet.proto",
    "stub/v1/stub.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let descriptors = protox::compile(PROTOS, ["proto"])?;
    std::fs::write(
        out_dir.join("checkout_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}

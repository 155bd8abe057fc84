//! Encodes the descriptor set the orchestrator's server reflection serves: `checkout.v1` (both
//! of its services) and what it imports, and nothing of the downstreams it calls, so grpcurl
//! lists exactly what this port answers. The code itself is generated once, in
//! `crates/checkout-proto`, and shared with the stubs and the client.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/checkout");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let descriptors = protox::compile(["checkout/v1/checkout.proto"], ["proto"])?;
    std::fs::write(
        out_dir.join("orchestrator_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    Ok(())
}

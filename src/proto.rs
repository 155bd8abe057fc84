//! Generated protobuf and gRPC code for every package in `proto/`, plus the encoded descriptor
//! set that server reflection serves.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// The public checkout API.
pub mod checkout {
    pub mod v1 {
        tonic::include_proto!("checkout.v1");
    }
}

/// Downstream: the cart service.
pub mod cart {
    pub mod v1 {
        tonic::include_proto!("cart.v1");
    }
}

/// Downstream: the fraud service.
pub mod fraud {
    pub mod v1 {
        tonic::include_proto!("fraud.v1");
    }
}

/// Downstream: the inventory service.
pub mod inventory {
    pub mod v1 {
        tonic::include_proto!("inventory.v1");
    }
}

/// Downstream: the wallet service.
pub mod wallet {
    pub mod v1 {
        tonic::include_proto!("wallet.v1");
    }
}

/// Control plane of the stub services.
pub mod stub {
    pub mod v1 {
        tonic::include_proto!("stub.v1");
    }
}

/// Encoded `FileDescriptorSet` of every file in `proto/` and its imports.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/checkout_descriptor.bin"));

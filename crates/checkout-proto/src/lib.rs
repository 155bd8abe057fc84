//! The wire contract of checkout and its downstreams: the protobuf messages and gRPC clients and
//! servers generated from the repository's `proto/` (every package), and the deadline metadata
//! every hop reads and writes ([`metadata`], [`grpc_timeout`]).
//!
//! One crate so the service, the stubs and the client share the same generated types instead of
//! each compiling its own copy. It depends on tonic and prost only.

pub mod grpc_timeout;
pub mod metadata;
#[cfg(feature = "reflection")]
pub mod reflection;

/// The public checkout API.
pub mod checkout {
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("checkout.v1");
    }
}

/// Downstream: the cart service.
pub mod cart {
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("cart.v1");
    }
}

/// Downstream: the fraud service.
pub mod fraud {
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("fraud.v1");
    }
}

/// Downstream: the inventory service.
pub mod inventory {
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("inventory.v1");
    }
}

/// Downstream: the wallet service.
pub mod wallet {
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("wallet.v1");
    }
}

/// Control plane of the stub services.
pub mod stub {
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("stub.v1");
    }
}

//! What every checkout server exposes besides its own services: gRPC server reflection (v1 and
//! v1alpha, so every grpcurl release works without proto files, with the `google.rpc`
//! error-detail types so error details decode) and `grpc.health.v1.Health`. Each server passes
//! the descriptor set of exactly what it serves, so reflection lists nothing it does not answer.

use tonic::service::RoutesBuilder;
use tonic_health::server::HealthReporter;

/// Reflection could not be built from the embedded descriptors.
#[derive(Debug, thiserror::Error)]
#[error("cannot build server reflection: {0}")]
pub struct ReflectionError(#[from] tonic_reflection::server::Error);

/// Adds reflection (v1 + v1alpha) of `served` (an encoded `FileDescriptorSet`) and health to
/// `routes`; returns the health reporter so the caller can mark its services SERVING (and
/// NOT_SERVING on shutdown).
pub fn add_to(
    routes: &mut RoutesBuilder,
    served: &'static [u8],
) -> Result<HealthReporter, ReflectionError> {
    let v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(served)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(served)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let (reporter, health) = tonic_health::server::health_reporter();
    routes
        .add_service(v1)
        .add_service(v1alpha)
        .add_service(health);
    Ok(reporter)
}

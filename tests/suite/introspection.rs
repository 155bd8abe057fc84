//! What grpcurl meets on the orchestrator's port: reflection lists exactly the services the
//! port answers (checkout.v1, health, reflection) and resolves none of the downstreams' symbols,
//! and the `google.rpc` error details it answers with are described.

use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

use crate::common::*;

/// One reflection request on `channel`, its one response (or the status the stream ended with).
async fn reflect(channel: Channel, request: MessageRequest) -> Result<MessageResponse, Status> {
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut responses = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::once(request))
        .await
        .expect("reflection answers")
        .into_inner();
    let response: ServerReflectionResponse =
        responses.message().await?.expect("one message per request");
    Ok(response.message_response.expect("a message response"))
}

/// The orchestrator's reflection lists checkout.v1's two services, health and reflection, and
/// nothing of the stubs (cart, fraud, inventory, wallet, stub.v1), which it does not answer.
#[tokio::test]
async fn orchestrator_reflection_lists_exactly_what_its_port_serves() {
    let h = start().await;
    let channel = Channel::from_shared(h.kit.uri())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let Ok(MessageResponse::ListServicesResponse(list)) =
        reflect(channel.clone(), MessageRequest::ListServices(String::new())).await
    else {
        panic!("expected a service list");
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "checkout.v1.CheckoutService",
            "checkout.v1.OperatorService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
        ]
    );
    for foreign in ["wallet.v1.WalletService", "stub.v1.StubControl"] {
        let answer = reflect(
            channel.clone(),
            MessageRequest::FileContainingSymbol(foreign.to_owned()),
        )
        .await;
        // tonic-reflection ends the stream NOT_FOUND for a symbol it does not know.
        assert!(
            matches!(&answer, Err(status) if status.code() == Code::NotFound)
                || matches!(answer, Ok(MessageResponse::ErrorResponse(_))),
            "{foreign} resolved on the orchestrator's port: {answer:?}"
        );
    }
    // The error details the service answers with decode in grpcurl.
    let answer = reflect(
        channel,
        MessageRequest::FileContainingSymbol("google.rpc.ErrorInfo".to_owned()),
    )
    .await;
    assert!(
        matches!(answer, Ok(MessageResponse::FileDescriptorResponse(_))),
        "{answer:?}"
    );
}

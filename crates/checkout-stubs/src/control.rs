//! `stub.v1.StubControl`: the control plane. `Configure` shapes a method's behaviour, `GetStats`
//! and `ListEffects` read what the stubs saw (ListEffects: the most recent effects the bounded
//! log keeps), `Reset` forgets everything.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::behavior::Behavior;
use super::handler::bad_request;
use super::method::{Method, Service};
use super::state::State;
use checkout_proto::stub::v1::stub_control_server::StubControl;
use checkout_proto::stub::v1::{
    ConfigureRequest, ConfigureResponse, GetStatsRequest, GetStatsResponse, ListEffectsRequest,
    ListEffectsResponse, ResetRequest, ResetResponse,
};

/// The gRPC service over the shared state.
#[derive(Debug, Clone)]
pub(crate) struct Control {
    pub(crate) state: Arc<State>,
}

/// The service named in a request's `service` field; empty means all (`None`).
fn service_filter(name: &str) -> Result<Option<Service>, Status> {
    if name.is_empty() {
        return Ok(None);
    }
    name.parse()
        .map(Some)
        .map_err(|e: super::method::UnknownService| bad_request(vec![("service", &e.to_string())]))
}

impl Control {
    /// Validates a `ConfigureRequest` into its target and behaviour.
    fn target(request: ConfigureRequest) -> Result<(Service, Option<Method>, Behavior), Status> {
        let service = service_filter(&request.service)?.ok_or_else(|| {
            bad_request(vec![(
                "service",
                "must be one of cart, fraud, inventory, wallet",
            )])
        })?;
        let method = if request.method.is_empty() {
            None
        } else {
            let method = service.method(&request.method).ok_or_else(|| {
                let problem = format!(
                    "service {service} has no method {:?} (expected one of {}, or empty for all)",
                    request.method,
                    service.method_names()
                );
                bad_request(vec![("method", &problem)])
            })?;
            Some(method)
        };
        let behavior = match request.behavior {
            None => Behavior::default(),
            Some(proto) => Behavior::try_from(proto)
                .map_err(|e| bad_request(vec![(e.field(), &e.to_string())]))?,
        };
        Ok((service, method, behavior))
    }
}

#[tonic::async_trait]
impl StubControl for Control {
    async fn configure(
        &self,
        request: Request<ConfigureRequest>,
    ) -> Result<Response<ConfigureResponse>, Status> {
        let (service, method, behavior) = Self::target(request.into_inner())?;
        tracing::info!(%service, method = method.map(Method::name), ?behavior, "stub configured");
        self.state.configure(service, method, behavior);
        Ok(Response::new(ConfigureResponse {}))
    }

    async fn get_stats(
        &self,
        request: Request<GetStatsRequest>,
    ) -> Result<Response<GetStatsResponse>, Status> {
        let only = service_filter(&request.into_inner().service)?;
        let wallet = only
            .is_none_or(|s| s == Service::Wallet)
            .then(|| self.state.wallet_stats());
        Ok(Response::new(GetStatsResponse {
            methods: self.state.method_stats(only),
            wallet,
            history: Some(self.state.history_stats()),
        }))
    }

    async fn reset(
        &self,
        _request: Request<ResetRequest>,
    ) -> Result<Response<ResetResponse>, Status> {
        self.state.reset();
        tracing::info!("stubs reset");
        Ok(Response::new(ResetResponse {}))
    }

    async fn list_effects(
        &self,
        request: Request<ListEffectsRequest>,
    ) -> Result<Response<ListEffectsResponse>, Status> {
        let only = service_filter(&request.into_inner().service)?;
        Ok(Response::new(ListEffectsResponse {
            effects: self.state.effects(only),
        }))
    }
}

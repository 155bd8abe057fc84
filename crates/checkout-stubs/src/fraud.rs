//! `fraud.v1.FraudService`: customers whose id starts with `deny-` are denied, everyone else is
//! approved. Scoring changes nothing.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::applied::Applied;
use super::handler;
use super::method::Method;
use super::state::State;
use checkout_proto::fraud::v1::fraud_service_server::FraudService;
use checkout_proto::fraud::v1::{ScoreRequest, ScoreResponse, Verdict};

/// Customers with this prefix are denied.
const DENY_PREFIX: &str = "deny-";

/// The verdict and score for a customer.
fn score(customer_id: &str) -> ScoreResponse {
    let (verdict, score) = if customer_id.starts_with(DENY_PREFIX) {
        (Verdict::Deny, 95)
    } else {
        (Verdict::Approve, 5)
    };
    ScoreResponse {
        verdict: verdict.into(),
        score,
    }
}

/// The gRPC service over the shared state.
#[derive(Debug, Clone)]
pub(crate) struct Fraud {
    pub(crate) state: Arc<State>,
}

#[tonic::async_trait]
impl FraudService for Fraud {
    async fn score(
        &self,
        request: Request<ScoreRequest>,
    ) -> Result<Response<ScoreResponse>, Status> {
        handler::handle(&self.state, Method::FraudScore, request, |_, r| {
            Applied::unchanged(score(&r.customer_id))
        })
        .await
    }
}

//! `checkout.v1.OperatorService`: what the worker is doing, for operators with grpcurl.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::RetryBudget;
use crate::checkout::CheckoutError;
use crate::config::Config;
use crate::proto::checkout::v1::{self as pb, operator_service_server::OperatorService};
use crate::store::OrderStore;

/// Serves job and retry counts.
pub struct OperatorApi {
    store: Arc<dyn OrderStore>,
    retry_budget: Arc<RetryBudget>,
    config: Arc<Config>,
}

impl OperatorApi {
    /// Over the store and the worker's retry budget.
    pub fn new(
        store: Arc<dyn OrderStore>,
        retry_budget: Arc<RetryBudget>,
        config: Arc<Config>,
    ) -> Self {
        Self {
            store,
            retry_budget,
            config,
        }
    }
}

#[tonic::async_trait]
impl OperatorService for OperatorApi {
    async fn get_worker_stats(
        &self,
        _: Request<pb::GetWorkerStatsRequest>,
    ) -> Result<Response<pb::WorkerStats>, Status> {
        let stats = self
            .store
            .stats()
            .await
            .map_err(|source| CheckoutError::StoreUnavailable {
                source,
                retry_after: self.config.retry_after.unavailable,
            })?;
        let (first_attempts, retries, retries_deferred) = self.retry_budget.counts();
        Ok(Response::new(pb::WorkerStats {
            jobs_pending: stats.pending,
            jobs_parked: stats.parked,
            jobs_done: stats.done,
            orders_pending: stats.orders_pending,
            first_attempts,
            retries,
            retries_deferred,
        }))
    }
}

//! `checkout.v1.OperatorService`: what the worker is doing, and the parked jobs an operator can
//! list and re-queue, with grpcurl.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use tonic::{Request, Response, Status};

use super::RetryBudget;
use crate::checkout::RetryAfterPolicy;
use crate::checkout::{CheckoutError, FieldViolation, is_order_id};
use crate::deadline::millis;
use crate::proto::checkout::v1::{
    self as pb, operator_service_server::OperatorService, retry_parked_jobs_request::Target,
};
use crate::store::{OrderStore, ParkedJob};

/// Parked jobs listed per page when the request does not say.
const DEFAULT_PAGE: u32 = 100;
/// The most parked jobs one page lists.
const MAX_PAGE: u32 = 1_000;

/// Serves job, claim and retry counts, and the parked jobs.
pub struct OperatorApi {
    store: Arc<dyn OrderStore>,
    retry_budgets: [Arc<RetryBudget>; 2],
    claims: Arc<AtomicU64>,
    /// The advice put on answers (`retry_after.*`).
    retry_after: RetryAfterPolicy,
}

impl OperatorApi {
    /// Over the store and the worker's counters: its retry budgets (forward work,
    /// compensations) and its claims ([`super::Worker::claims`]).
    pub fn new(
        store: Arc<dyn OrderStore>,
        retry_budgets: [Arc<RetryBudget>; 2],
        claims: Arc<AtomicU64>,
        retry_after: RetryAfterPolicy,
    ) -> Self {
        Self {
            store,
            retry_budgets,
            claims,
            retry_after,
        }
    }

    fn unavailable(&self, source: crate::store::StoreError) -> Status {
        CheckoutError::StoreUnavailable {
            source,
            retry_after: self.retry_after.unavailable,
        }
        .into()
    }
}

#[tonic::async_trait]
impl OperatorService for OperatorApi {
    async fn get_worker_stats(
        &self,
        _: Request<pb::GetWorkerStatsRequest>,
    ) -> Result<Response<pb::WorkerStats>, Status> {
        // Before the job counts: `claims` two past an earlier answer's with no job pending means
        // the worker finished everything due since then (see `WorkerStats.claims`).
        let claims = self.claims.load(Ordering::Acquire);
        let stats = self.store.stats().await.map_err(|e| self.unavailable(e))?;
        let jobs_done = self
            .store
            .count_done_jobs()
            .await
            .map_err(|e| self.unavailable(e))?;
        let (mut first_attempts, mut retries, mut retries_deferred) = (0, 0, 0);
        for budget in &self.retry_budgets {
            let (first, retried, deferred) = budget.counts();
            first_attempts += first;
            retries += retried;
            retries_deferred += deferred;
        }
        Ok(Response::new(pb::WorkerStats {
            jobs_pending: stats.pending,
            jobs_parked: stats.parked,
            jobs_done,
            orders_pending: stats.orders_pending,
            first_attempts,
            retries,
            retries_deferred,
            claims,
        }))
    }

    async fn list_parked_jobs(
        &self,
        request: Request<pb::ListParkedJobsRequest>,
    ) -> Result<Response<pb::ListParkedJobsResponse>, Status> {
        let request = request.into_inner();
        let mut violations = Vec::new();
        let page_size = match request.page_size {
            0 => DEFAULT_PAGE,
            n if n <= MAX_PAGE => n,
            _ => {
                violations.push(FieldViolation::new(
                    "page_size",
                    format!("must be at most {MAX_PAGE}"),
                ));
                DEFAULT_PAGE
            }
        };
        let after_id = match request.page_token.as_str() {
            "" => 0,
            token => token.parse::<i64>().unwrap_or_else(|_| {
                violations.push(FieldViolation::new(
                    "page_token",
                    "must be a next_page_token from an earlier answer",
                ));
                0
            }),
        };
        if !violations.is_empty() {
            return Err(CheckoutError::BadRequest(violations).into());
        }
        let jobs = self
            .store
            .list_parked(after_id, page_size as usize)
            .await
            .map_err(|e| self.unavailable(e))?;
        let next_page_token = match jobs.last() {
            Some(last) if jobs.len() == page_size as usize => last.id.to_string(),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListParkedJobsResponse {
            jobs: jobs.iter().map(parked_to_proto).collect(),
            next_page_token,
        }))
    }

    async fn retry_parked_jobs(
        &self,
        request: Request<pb::RetryParkedJobsRequest>,
    ) -> Result<Response<pb::RetryParkedJobsResponse>, Status> {
        let order_id = match request.into_inner().target {
            Some(Target::All(true)) => None,
            Some(Target::OrderId(id)) if is_order_id(&id) => Some(id),
            Some(Target::OrderId(_)) => {
                return Err(CheckoutError::BadRequest(vec![FieldViolation::new(
                    "order_id",
                    "must be an order id: ord_ and 32 hex digits",
                )])
                .into());
            }
            _ => {
                return Err(CheckoutError::BadRequest(vec![FieldViolation::new(
                    "target",
                    "set all: true, or an order_id",
                )])
                .into());
            }
        };
        let requeued = self
            .store
            .retry_parked(
                order_id.as_deref(),
                self.store.clock().now_ms(),
                millis(self.retry_after.pending),
            )
            .await
            .map_err(|e| self.unavailable(e))?;
        tracing::info!(
            requeued,
            order_id = order_id.as_deref().unwrap_or("*"),
            "parked jobs re-queued by an operator"
        );
        Ok(Response::new(pb::RetryParkedJobsResponse { requeued }))
    }
}

fn parked_to_proto(job: &ParkedJob) -> pb::ParkedJob {
    pb::ParkedJob {
        order_id: job.order_id.clone(),
        kind: job.kind.as_str().to_owned(),
        attempts: job.attempts,
        rejections: job.rejections,
        last_error: job.last_error.clone(),
        parked_at: Some(timestamp(job.parked_at_ms)),
        failing_since: job.failing_since_ms.map(timestamp),
    }
}

fn timestamp(epoch_ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp::from(UNIX_EPOCH + Duration::from_millis(epoch_ms.max(0).unsigned_abs()))
}

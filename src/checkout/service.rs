//! `checkout.v1.CheckoutService` over tonic: reads metadata and fields, hands the order to the
//! [`Orchestrator`], and renders stored records as `Order` messages.

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use opentelemetry::KeyValue;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::RetryAfterPolicy;
use super::{
    CheckoutError, FieldViolation, Orchestrator, OrderRequest, Overload, Reason, caller_scope,
    is_key, is_order_id,
};
use crate::budget::waterfall_duration;
use crate::deadline::ingest_at;
use crate::proto::checkout::v1::{
    self as pb, checkout_service_server::CheckoutService, get_order_request::Lookup,
};
use crate::steps::Step;
use crate::store::{OrderRecord, OrderStatus, Phase};
use checkout_telemetry::{self as telemetry, metrics};

/// The gRPC face of the orchestrator.
#[derive(Clone)]
pub struct CheckoutApi {
    orchestrator: Arc<Orchestrator>,
}

impl CheckoutApi {
    /// Serves `orchestrator`.
    pub fn new(orchestrator: Arc<Orchestrator>) -> Self {
        declare_metrics();
        Self { orchestrator }
    }
}

/// Every outcome, refusal, shedding cause and step this service can report, at zero, so that
/// the alerts and the dashboard (deploy/) read 0 on a replica that has not seen one yet.
fn declare_metrics() {
    metrics::declare::order_outcome(OrderStatus::Confirmed.as_str(), "");
    for reason in Reason::ALL {
        metrics::declare::order_outcome(reason.status().as_str(), reason.as_str());
    }
    for reason in CheckoutError::METRIC_REASONS {
        metrics::declare::admission_rejection(reason);
    }
    for cause in Overload::CAUSES {
        metrics::declare::overload_cause(cause);
    }
    for step in Step::ALL {
        metrics::declare::step(step.name());
    }
}

#[tonic::async_trait]
impl CheckoutService for CheckoutApi {
    async fn place_order(
        &self,
        request: Request<pb::PlaceOrderRequest>,
    ) -> Result<Response<pb::Order>, Status> {
        let settings = self.orchestrator.settings();
        let mut violations = Vec::new();
        // The caller's absolute deadline is read on the store's clock, which also carries the
        // deadline forwarded downstream (docs/design.md §6, One clock).
        let wall = self.orchestrator.clock().now();
        let deadline = ingest_at(request.metadata(), &settings.deadline, Instant::now(), wall)
            .map_err(|e| violations.push(FieldViolation::new(e.header, e.to_string())))
            .ok();
        // Under a surge, refuse before spending anything on the request.
        if let Some(deadline) = &deadline {
            self.orchestrator
                .shed_early(deadline)
                .inspect_err(|error| metrics::admission_rejected(error.metric_reason()))?;
        }
        let scope = caller_scope(&request, &settings.auth, &mut violations)
            .inspect_err(|error| metrics::admission_rejected(error.metric_reason()))?;
        let message = request.into_inner();
        let order = OrderRequest::parse(scope, message, &mut violations);
        let Some(deadline) = deadline.filter(|_| violations.is_empty()) else {
            metrics::admission_rejected("invalid");
            return Err(CheckoutError::BadRequest(violations).into());
        };
        // The server span (made by the telemetry layer from the caller's traceparent) gets the
        // order's attributes; log lines of this call carry its trace id and order id.
        telemetry::annotate(|| {
            vec![
                KeyValue::new("checkout.order_id", order.order_id.clone()),
                KeyValue::new(
                    "checkout.deadline_ms",
                    deadline.granted().as_millis() as i64,
                ),
                KeyValue::new("checkout.deadline_source", deadline.source().as_str()),
            ]
        });
        let span = tracing::info_span!(
            "PlaceOrder",
            order_id = %order.order_id,
            trace_id = %telemetry::current_trace_id(),
            deadline_ms = deadline.granted().as_millis() as u64,
            deadline_source = deadline.source().as_str(),
        );
        let placed = self
            .orchestrator
            .place(order, deadline)
            .instrument(span)
            .await
            .inspect_err(|error| metrics::admission_rejected(error.metric_reason()))?;
        let mut answer = order_to_proto(&placed.record, &settings.retry_after);
        answer.budget = Some(placed.waterfall.report(&deadline));
        let remaining = deadline.remaining();
        metrics::order_answered(
            status_name(answer.status()),
            // Empty when CONFIRMED (reported as `none`).
            Reason::stored(placed.record.reason),
        );
        metrics::remaining_at_return(remaining);
        telemetry::annotate(|| {
            vec![
                KeyValue::new("checkout.budget.remaining_ms", remaining.as_millis() as i64),
                KeyValue::new("checkout.order.status", status_name(answer.status())),
                KeyValue::new("checkout.order.reason", answer.reason.clone()),
            ]
        });
        tracing::info!(
            order_id = %answer.order_id,
            trace_id = %telemetry::current_trace_id(),
            status = ?answer.status(),
            reason = %answer.reason,
            elapsed_ms = deadline.elapsed().as_millis() as u64,
            "PlaceOrder answered"
        );
        Ok(Response::new(answer))
    }

    async fn get_order(
        &self,
        request: Request<pb::GetOrderRequest>,
    ) -> Result<Response<pb::Order>, Status> {
        let mut violations = Vec::new();
        let scope = caller_scope(
            &request,
            &self.orchestrator.settings().auth,
            &mut violations,
        )?;
        let lookup = request.into_inner().lookup;
        match &lookup {
            Some(Lookup::OrderId(id)) if is_order_id(id) => {}
            Some(Lookup::OrderId(_)) => violations.push(FieldViolation::new(
                "order_id",
                "must be an order id: ord_ and 32 hex digits",
            )),
            Some(Lookup::IdempotencyKey(key)) if is_key(key) => {}
            Some(Lookup::IdempotencyKey(_)) => violations.push(FieldViolation::new(
                "idempotency_key",
                "must be 1-64 characters of [A-Za-z0-9._:-]",
            )),
            None => violations.push(FieldViolation::new(
                "lookup",
                "set order_id or idempotency_key",
            )),
        }
        let (Some(lookup), true) = (lookup, violations.is_empty()) else {
            return Err(CheckoutError::BadRequest(violations).into());
        };
        let store = self.orchestrator.store();
        let read = match &lookup {
            Lookup::OrderId(id) => store.get(id).await,
            Lookup::IdempotencyKey(key) => store.find(&scope, key).await,
        };
        let record = read.map_err(|source| CheckoutError::StoreUnavailable {
            source,
            retry_after: self.orchestrator.settings().retry_after.unavailable,
        })?;
        // Every read is scoped: another scope's order is reported as absent, so that its
        // existence is not revealed.
        let record = record
            .filter(|r| r.order.scope == scope)
            .ok_or(CheckoutError::NotFound)?;
        Ok(Response::new(order_to_proto(
            &record,
            &self.orchestrator.settings().retry_after,
        )))
    }
}

/// Renders a stored order (without a budget report).
pub fn order_to_proto(record: &OrderRecord, policy: &RetryAfterPolicy) -> pb::Order {
    let status = match record.status {
        OrderStatus::Pending => pb::OrderStatus::Pending,
        OrderStatus::Confirmed => pb::OrderStatus::Confirmed,
        OrderStatus::Declined => pb::OrderStatus::Declined,
    };
    let retry_after = record
        .retry_after_ms
        .map(|ms| Duration::from_millis(ms.max(0).unsigned_abs()))
        .or_else(|| {
            // A record still being worked on by its first attempt has no advice stored yet.
            (record.status == OrderStatus::Pending && record.reason == Some(Reason::InProgress))
                .then_some(policy.pending)
        });
    let hold_may_exist = record.hold_sent_at_ms.is_some()
        || record.hold_id.is_some()
        || record.phase == Phase::HoldSent;
    pb::Order {
        order_id: record.order.order_id.clone(),
        status: status.into(),
        reason: Reason::stored(record.reason).to_owned(),
        retryable: record.status == OrderStatus::Declined && record.retryable,
        retry_after: retry_after.map(waterfall_duration),
        total: record.total.as_ref().map(|m| pb::Money {
            currency: m.currency.clone(),
            minor_units: m.minor_units,
        }),
        wallet_reference: if hold_may_exist {
            record.order.order_id.clone()
        } else {
            String::new()
        },
        created_at: Some(timestamp(record.order.created_at_ms)),
        updated_at: Some(timestamp(record.updated_at_ms)),
        budget: None,
        parked_jobs: record
            .parked_jobs
            .iter()
            .map(|k| k.as_str().to_owned())
            .collect(),
    }
}

/// The status as the API spells it (`CONFIRMED`).
fn status_name(status: pb::OrderStatus) -> &'static str {
    match status {
        pb::OrderStatus::Unspecified => "UNSPECIFIED",
        pb::OrderStatus::Confirmed => "CONFIRMED",
        pb::OrderStatus::Declined => "DECLINED",
        pb::OrderStatus::Pending => "PENDING",
    }
}

fn timestamp(epoch_ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp::from(UNIX_EPOCH + Duration::from_millis(epoch_ms.max(0).unsigned_abs()))
}

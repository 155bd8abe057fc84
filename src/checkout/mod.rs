//! The checkout service: validating requests, the request-path flow, the rules that decide an
//! order's outcome, the outcomes it can reach, and the gRPC surface that maps them onto
//! `checkout.v1`.

mod decide;
mod error;
mod flow;
mod reason;
mod request;
mod service;
mod step_calls;
mod trace;
mod verdict;

pub use decide::{
    Exposure, FraudOnTimeout, FraudPolicy, Inconsistency, Next, Path, Reconciled, Rules, Settled,
    Stop, Tried, Unsettled, looked_up, reason_for_rejection,
};
pub use error::{CheckoutError, ERROR_DOMAIN, FieldViolation, Overload, X_DEADLINE_EXCEEDED};
pub use flow::{Orchestrator, Placed, Settings};
pub use reason::{Reason, RetryAfterPolicy};
pub use request::{
    AuthPolicy, OrderRequest, X_CLIENT_ID, caller_scope, is_key, is_order_id, new_order_id, scope,
};
pub use service::{CheckoutApi, order_to_proto};
pub use step_calls::{Called, Cart, Fraud, Lookup, StepCalls, StepResult, Stock, frozen_cart};
pub use verdict::{Held, MissingHold, Verdict};

//! Driving PlaceOrder load over gRPC, shared by `checkout loadgen` and the scenarios: the open
//! loop (orders on a fixed schedule whatever the answers, so a slow server cannot hide its
//! queue), the closed loop (callers that each send the next order when the last is answered),
//! and one order placed and timed ([`Shot`]).
//!
//! Latency is measured from the intended send time (`scheduled`); whether an answer was late is
//! measured from the actual send against the deadline the call carried.

use std::future::Future;
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tonic_types::StatusExt;

use checkout_proto::checkout::v1::{self as pb, checkout_service_client::CheckoutServiceClient};

/// How long after its deadline the loader stops waiting for an answer (and counts the call as
/// given up: late, and an error outcome).
pub const GIVE_UP_AFTER_DEADLINE: Duration = Duration::from_secs(1);

/// What came back for one order.
#[derive(Debug, Clone)]
pub enum Answer {
    /// An `Order`, whatever its status.
    Order(Box<pb::Order>),
    /// A gRPC error (a refusal, a fast-fail, a transport error).
    Error(tonic::Status),
    /// Nothing within the deadline plus [`GIVE_UP_AFTER_DEADLINE`].
    GaveUp,
}

/// One order placed: when it was meant to go, when it went, when its answer came, and what.
#[derive(Debug, Clone)]
pub struct Shot {
    /// When the schedule meant to send it.
    pub scheduled: Instant,
    /// When the call was actually made.
    pub sent: Instant,
    /// When the answer (or the give-up) came.
    pub answered: Instant,
    /// The deadline it carried (`grpc-timeout`).
    pub deadline: Duration,
    /// What came back.
    pub answer: Answer,
}

impl Shot {
    /// From the intended send time to the answer.
    pub fn latency(&self) -> Duration {
        self.answered.saturating_duration_since(self.scheduled)
    }

    /// Whether the answer came later than the deadline sent with the call, counted from the
    /// actual send (a give-up always is).
    pub fn late(&self) -> bool {
        self.answered.saturating_duration_since(self.sent) > self.deadline
    }

    /// `CONFIRMED`, `PENDING BUDGET_EXHAUSTED`, `error Unavailable with RetryInfo`, `error
    /// ResourceExhausted OVERLOADED with RetryInfo`, `error loader gave up` (see [`error_of`]).
    pub fn outcome(&self) -> String {
        match &self.answer {
            Answer::Order(order) => outcome_of(order),
            Answer::Error(status) => error_of(status),
            Answer::GaveUp => "error loader gave up".to_owned(),
        }
    }

    /// The order, if one came back.
    pub fn order(&self) -> Option<&pb::Order> {
        match &self.answer {
            Answer::Order(order) => Some(order),
            _ => None,
        }
    }
}

/// `CONFIRMED`, `PENDING BUDGET_EXHAUSTED`, …
pub fn outcome_of(order: &pb::Order) -> String {
    let status = order
        .status()
        .as_str_name()
        .trim_start_matches("ORDER_STATUS_")
        .to_owned();
    if order.reason.is_empty() {
        status
    } else {
        format!("{status} {}", order.reason)
    }
}

/// `error <gRPC code>`, then the `ErrorInfo` reason if the status carries one, then `with
/// RetryInfo` if it carries that: the service's own refusals (`error Unavailable with
/// RetryInfo` while its store is down, `error ResourceExhausted OVERLOADED with RetryInfo`)
/// are told apart from a transport failure (`error Unavailable`: a connection refused or
/// reset, which no server answered).
pub fn error_of(status: &tonic::Status) -> String {
    let details = status.get_error_details();
    let mut text = format!("error {:?}", status.code());
    if let Some(info) = details.error_info() {
        text.push(' ');
        text.push_str(&info.reason);
    }
    if details.retry_info().is_some() {
        text.push_str(" with RetryInfo");
    }
    text
}

/// Order `n` of load run `run_id`: a fresh key, customers, carts and accounts spread over a
/// thousand values (carts `cart-100` to `cart-999`, all in stock and approved).
pub fn order(run_id: &str, n: u64) -> pb::PlaceOrderRequest {
    pb::PlaceOrderRequest {
        idempotency_key: format!("load-{run_id}-{n}"),
        customer_id: format!("c{}", n % 1000),
        cart_id: format!("cart-{}", 100 + n % 900),
        wallet_account_id: format!("a{}", n % 1000),
        expected_total: None,
    }
}

/// Places `request` with `deadline` as its `grpc-timeout`, waiting at most the deadline plus
/// [`GIVE_UP_AFTER_DEADLINE`]; `scheduled` is when the schedule meant to send it.
pub async fn place(
    mut client: CheckoutServiceClient<Channel>,
    mut request: tonic::Request<pb::PlaceOrderRequest>,
    deadline: Duration,
    scheduled: Instant,
) -> Shot {
    request.set_timeout(deadline);
    let sent = Instant::now();
    let answer = tokio::time::timeout(
        deadline + GIVE_UP_AFTER_DEADLINE,
        client.place_order(request),
    )
    .await;
    let answered = Instant::now();
    let answer = match answer {
        Ok(Ok(response)) => Answer::Order(Box::new(response.into_inner())),
        Ok(Err(status)) => Answer::Error(status),
        Err(_) => Answer::GaveUp,
    };
    Shot {
        scheduled,
        sent,
        answered,
        deadline,
        answer,
    }
}

/// One stretch of an open-loop schedule: `rate` orders per second for `duration`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    /// Orders per second (at least one per second is sent).
    pub rate: f64,
    /// How long this rate lasts.
    pub duration: Duration,
}

/// Open loop: from `start`, calls `fire(n, scheduled)` at each scheduled instant of `phases`,
/// one after another, and runs what it returns as its own task, whatever earlier orders are
/// doing; returns once every order's task has ended. Orders are numbered from 0.
pub async fn open_loop<F, Fut>(start: Instant, phases: &[Phase], mut fire: F)
where
    F: FnMut(u64, Instant) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut in_flight = tokio::task::JoinSet::new();
    let mut next = start;
    let mut phase_start = start;
    let mut n = 0;
    for phase in phases {
        let interval = Duration::from_secs_f64(1.0 / phase.rate.max(1.0));
        let end = phase_start + phase.duration;
        while next < end {
            tokio::time::sleep_until(next.into()).await;
            in_flight.spawn(fire(n, next));
            n += 1;
            next += interval;
            while in_flight.try_join_next().is_some() {}
        }
        phase_start = end;
    }
    while in_flight.join_next().await.is_some() {}
}

/// Closed loop: `callers` tasks, each calling `fire(now)` and awaiting it, again and again,
/// until `end`.
pub async fn closed_loop<F, Fut>(callers: usize, end: Instant, fire: F) -> Result<(), LoadError>
where
    F: Fn(Instant) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let callers = (0..callers.max(1)).map(|_| {
        let fire = fire.clone();
        tokio::spawn(async move {
            while Instant::now() < end {
                fire(Instant::now()).await;
            }
        })
    });
    for caller in futures::future::join_all(callers).await {
        caller?;
    }
    Ok(())
}

/// A caller task of the closed loop failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// It panicked or was cancelled.
    #[error("load caller task failed: {0}")]
    Caller(#[from] tokio::task::JoinError),
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// Each phase sends at its own rate, back to back, on one schedule (the scheduled instants
    /// are computed, so a loaded machine only delays the sends, not what they are stamped with).
    #[tokio::test]
    async fn the_open_loop_follows_its_phases() {
        let start = Instant::now();
        let times = Arc::new(std::sync::Mutex::new(Vec::new()));
        let phases = [
            Phase {
                rate: 50.0,
                duration: Duration::from_millis(100),
            },
            Phase {
                rate: 500.0,
                duration: Duration::from_millis(100),
            },
        ];
        open_loop(start, &phases, |n, at| {
            let times = Arc::clone(&times);
            async move {
                times.lock().unwrap().push((n, at - start));
            }
        })
        .await;
        let times = times.lock().unwrap();
        let in_first = |at: &Duration| at.as_millis() < 100;
        let first = times.iter().filter(|(_, at)| in_first(at)).count();
        let second = times.iter().filter(|(_, at)| !in_first(at)).count();
        assert_eq!((first, second), (5, 50), "{times:?}");
        assert_eq!(times.last().map(|(n, _)| *n), Some(54));
    }

    /// Every caller sends again once its last call ended, and none starts a call after the end.
    #[tokio::test]
    async fn the_closed_loop_keeps_each_caller_busy_until_the_end() {
        let count = Arc::new(AtomicU64::new(0));
        let end = Instant::now() + Duration::from_millis(100);
        closed_loop(4, end, {
            let count = Arc::clone(&count);
            move |at| {
                let count = Arc::clone(&count);
                async move {
                    assert!(at < end);
                    count.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        })
        .await
        .unwrap();
        // At most 10 calls of 10 ms per caller fit in 100 ms; a loaded machine may fit fewer.
        let calls = count.load(Ordering::Relaxed);
        assert!((4..=44).contains(&calls), "{calls} calls");
    }

    /// A refusal names its reason and whether it says when to retry; a bare transport error
    /// is its code alone.
    #[test]
    fn an_error_outcome_names_its_reason_and_retry_info() {
        use tonic_types::{ErrorDetails, StatusExt as _};
        let second = Some(Duration::from_secs(1));
        let down = tonic::Status::with_error_details(
            tonic::Code::Unavailable,
            "store down",
            ErrorDetails::with_retry_info(second),
        );
        assert_eq!(error_of(&down), "error Unavailable with RetryInfo");
        let mut details = ErrorDetails::with_retry_info(second);
        details.set_error_info("OVERLOADED", "checkout.v1", []);
        let shed =
            tonic::Status::with_error_details(tonic::Code::ResourceExhausted, "shed", details);
        assert_eq!(
            error_of(&shed),
            "error ResourceExhausted OVERLOADED with RetryInfo"
        );
        let reset = tonic::Status::unavailable("connection reset");
        assert_eq!(error_of(&reset), "error Unavailable");
    }
}

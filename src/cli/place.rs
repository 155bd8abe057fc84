//! `checkout place`: one order with a chosen deadline, its result, and its budget waterfall.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use clap::{Args, ValueEnum};
use tonic::metadata::MetadataValue;
use tonic_types::StatusExt;

use checkout::deadline::{
    GRPC_TIMEOUT, REQUEST_DEADLINE_MS, X_REQUEST_DEADLINE, epoch_ms, grpc_timeout,
};
use checkout::proto::checkout::v1::{self as pb, checkout_service_client::CheckoutServiceClient};

/// How the deadline travels.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum DeadlineHeader {
    /// `grpc-timeout` (relative, gRPC wire format).
    GrpcTimeout,
    /// `x-request-deadline` (absolute epoch ms).
    XRequestDeadline,
    /// `request-deadline-ms` (relative ms, clamped as docs/design.md §3 says).
    RequestDeadlineMs,
    /// No deadline header: the server's default budget.
    None,
}

/// Flags of `checkout place`.
#[derive(Debug, Args)]
pub struct PlaceArgs {
    /// Orchestrator address.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    addr: String,
    /// The deadline, in milliseconds from now.
    #[arg(long, default_value_t = 2000)]
    deadline_ms: u64,
    /// Which header carries the deadline.
    #[arg(long, value_enum, default_value = "grpc-timeout")]
    deadline_header: DeadlineHeader,
    /// Idempotency key (default: a fresh one).
    #[arg(long)]
    key: Option<String>,
    /// x-client-id (the idempotency scope).
    #[arg(long, default_value = "cli")]
    client_id: String,
    /// Customer id (`deny-…` is denied by the stub fraud service).
    #[arg(long, default_value = "c1")]
    customer: String,
    /// Cart id (`cart-<N>` totals N cents; `missing-…` does not exist; `…oos…` is out of stock).
    #[arg(long, default_value = "cart-1234")]
    cart: String,
    /// Wallet account (`poor-…` has no funds).
    #[arg(long, default_value = "a1")]
    account: String,
    /// Expected total in cents (USD); a different cart total is declined PRICE_CHANGED.
    #[arg(long)]
    expected_total: Option<i64>,
    /// Width of the waterfall bars.
    #[arg(long, default_value_t = 50)]
    width: usize,
}

/// Exit code of a refused call (an error status: nothing was admitted) or of no answer.
pub const EXIT_REFUSED: u8 = 1;
/// Exit code of a PENDING answer: the order was taken; poll it (GetOrder) after `retry_after`.
pub const EXIT_PENDING: u8 = 3;
/// Exit code of a DECLINED answer (`retryable` says whether a new key may be tried).
pub const EXIT_DECLINED: u8 = 4;

/// Places the order and prints what came back. Exits 0 when CONFIRMED, [`EXIT_PENDING`],
/// [`EXIT_DECLINED`], or [`EXIT_REFUSED`] for an error status; 2 is clap's, for bad flags.
pub async fn run(args: PlaceArgs) -> anyhow::Result<ExitCode> {
    let key = args
        .key
        .clone()
        .unwrap_or_else(|| format!("place-{}", epoch_ms(SystemTime::now())));
    let mut client = CheckoutServiceClient::connect(args.addr.clone())
        .await
        .with_context(|| format!("connecting to {}", args.addr))?;
    let mut request = tonic::Request::new(pb::PlaceOrderRequest {
        idempotency_key: key.clone(),
        customer_id: args.customer.clone(),
        cart_id: args.cart.clone(),
        wallet_account_id: args.account.clone(),
        expected_total: args.expected_total.map(|minor_units| pb::Money {
            currency: "USD".into(),
            minor_units,
        }),
    });
    let budget = Duration::from_millis(args.deadline_ms);
    let md = request.metadata_mut();
    md.insert(
        "x-client-id",
        args.client_id
            .parse()
            .context("x-client-id must be ASCII")?,
    );
    match args.deadline_header {
        DeadlineHeader::GrpcTimeout => {
            md.insert(
                GRPC_TIMEOUT,
                MetadataValue::try_from(grpc_timeout::format(budget))?,
            );
        }
        DeadlineHeader::XRequestDeadline => {
            md.insert(
                X_REQUEST_DEADLINE,
                MetadataValue::from(epoch_ms(SystemTime::now()) + args.deadline_ms as i64),
            );
        }
        DeadlineHeader::RequestDeadlineMs => {
            md.insert(REQUEST_DEADLINE_MS, MetadataValue::from(args.deadline_ms));
        }
        DeadlineHeader::None => {}
    }
    let started = std::time::Instant::now();
    // The client keeps its own deadline too, with a little slack to see a late answer as late.
    let patience = budget.max(Duration::from_millis(2400)) + Duration::from_millis(500);
    let answer = tokio::time::timeout(patience, client.place_order(request)).await;
    let took = started.elapsed();
    match answer {
        Err(_) => anyhow::bail!("no answer within {patience:?}"),
        Ok(Err(status)) => {
            println!("error        {:?}: {}", status.code(), status.message());
            let details = status.get_error_details();
            if let Some(info) = details.error_info() {
                println!("reason       {} {:?}", info.reason, info.metadata);
            }
            if let Some(bad) = details.bad_request() {
                for v in &bad.field_violations {
                    println!("field        {}: {}", v.field, v.description);
                }
            }
            if let Some(retry) = details.retry_info() {
                println!("retry_delay  {:?}", retry.retry_delay);
            }
            println!("round trip   {}", super::waterfall::fmt_ms(took));
            Ok(ExitCode::from(EXIT_REFUSED))
        }
        Ok(Ok(response)) => {
            let order = response.into_inner();
            print_order(&order, &key, took, args.width);
            Ok(match order.status() {
                pb::OrderStatus::Confirmed => ExitCode::SUCCESS,
                pb::OrderStatus::Pending => ExitCode::from(EXIT_PENDING),
                pb::OrderStatus::Declined => ExitCode::from(EXIT_DECLINED),
                // Not an answer the service gives; a script must not read it as success.
                pb::OrderStatus::Unspecified => ExitCode::from(EXIT_REFUSED),
            })
        }
    }
}

fn print_order(order: &pb::Order, key: &str, took: Duration, width: usize) {
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_owned()
        } else {
            s.to_owned()
        }
    };
    println!("order        {} (key {key})", order.order_id);
    println!(
        "status       {}",
        order
            .status()
            .as_str_name()
            .trim_start_matches("ORDER_STATUS_")
    );
    println!("reason       {}", dash(&order.reason));
    if order.status() == pb::OrderStatus::Declined {
        println!("retryable    {}", order.retryable);
    }
    println!(
        "retry_after  {}",
        order
            .retry_after
            .as_ref()
            .map_or("-".to_owned(), |d| format!(
                "{}s",
                d.seconds as f64 + f64::from(d.nanos) / 1e9
            ))
    );
    if let Some(total) = &order.total {
        println!("total        {} {}", total.minor_units, total.currency);
    }
    println!("round trip   {}", super::waterfall::fmt_ms(took));
    if let Some(budget) = &order.budget {
        println!();
        print!("{}", super::waterfall::render(budget, width));
    }
}

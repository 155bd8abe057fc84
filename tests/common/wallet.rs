//! A wallet scripted to answer what the stubs never do: a Hold whose answer does not name the
//! hold (ALREADY_EXISTS `DUPLICATE_REFERENCE` with this order's terms but no
//! `existing_hold_id`, or OK without a hold id), and lookups that find a hold with or without
//! its id. It counts every call, so a test can prove what the orchestrator did — and did not:
//! capture.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use checkout::proto::wallet::v1::wallet_service_server::{WalletService, WalletServiceServer};
use checkout::proto::wallet::v1::{
    CaptureRequest, CaptureResponse, HoldRecord, HoldRequest, HoldResponse, HoldState,
    LookupByReferenceRequest, ReleaseRequest, ReleaseResponse,
};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// How the scripted wallet answers Hold.
#[derive(Debug, Clone, Copy)]
pub enum HoldAnswer {
    /// ALREADY_EXISTS `DUPLICATE_REFERENCE` with the request's own terms (account, currency,
    /// amount) in the metadata, but no `existing_hold_id`.
    DuplicateWithoutId,
    /// OK, with a hold record whose id is empty.
    OkWithoutId,
    /// INTERNAL: the outcome is unknown.
    Internal,
}

/// How the scripted wallet answers LookupByReference for a reference it was asked to hold.
#[derive(Debug, Clone, Copy)]
pub enum LookupAnswer {
    /// NOT_FOUND.
    NotFound,
    /// An active hold with this id (empty: a hold the wallet does not name).
    Found(&'static str),
}

/// Calls received, by method.
#[derive(Debug, Default)]
struct Calls {
    holds: AtomicU64,
    lookups: AtomicU64,
    captures: AtomicU64,
    releases: AtomicU64,
}

/// See the module docs.
pub struct ScriptedWallet {
    addr: SocketAddr,
    calls: Arc<Calls>,
}

struct Service {
    hold: HoldAnswer,
    lookup: LookupAnswer,
    calls: Arc<Calls>,
    /// The hold requests by reference, so a lookup answers with the order's terms.
    asked: Mutex<HashMap<String, HoldRequest>>,
}

impl ScriptedWallet {
    /// Serves on 127.0.0.1:0 in the current runtime until it ends.
    pub async fn start(hold: HoldAnswer, lookup: LookupAnswer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(Calls::default());
        let service = Service {
            hold,
            lookup,
            calls: Arc::clone(&calls),
            asked: Mutex::new(HashMap::new()),
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(WalletServiceServer::new(service))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Self { addr, calls }
    }

    /// `http://127.0.0.1:port`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Holds asked for so far.
    pub fn holds(&self) -> u64 {
        self.calls.holds.load(Ordering::SeqCst)
    }

    /// Lookups by reference so far.
    pub fn lookups(&self) -> u64 {
        self.calls.lookups.load(Ordering::SeqCst)
    }

    /// Captures asked for so far.
    pub fn captures(&self) -> u64 {
        self.calls.captures.load(Ordering::SeqCst)
    }

    /// Releases asked for so far.
    pub fn releases(&self) -> u64 {
        self.calls.releases.load(Ordering::SeqCst)
    }
}

#[tonic::async_trait]
impl WalletService for Service {
    async fn hold(&self, request: Request<HoldRequest>) -> Result<Response<HoldResponse>, Status> {
        self.calls.holds.fetch_add(1, Ordering::SeqCst);
        let request = request.into_inner();
        self.asked
            .lock()
            .unwrap()
            .insert(request.reference.clone(), request.clone());
        let amount = request.amount.clone().unwrap_or_default();
        match self.hold {
            HoldAnswer::DuplicateWithoutId => Err(Status::with_error_details(
                Code::AlreadyExists,
                "a hold exists for this reference",
                ErrorDetails::with_error_info(
                    "DUPLICATE_REFERENCE",
                    "wallet.v1",
                    [
                        ("account_id".to_owned(), request.account_id.clone()),
                        ("currency".to_owned(), amount.currency.clone()),
                        ("minor_units".to_owned(), amount.minor_units.to_string()),
                    ],
                ),
            )),
            HoldAnswer::OkWithoutId => Ok(Response::new(HoldResponse {
                hold: Some(record(&request, "")),
            })),
            HoldAnswer::Internal => Err(Status::internal("scripted: outcome unknown")),
        }
    }

    async fn capture(
        &self,
        request: Request<CaptureRequest>,
    ) -> Result<Response<CaptureResponse>, Status> {
        self.calls.captures.fetch_add(1, Ordering::SeqCst);
        let reference = request.into_inner().reference;
        let asked = self.asked.lock().unwrap().get(&reference).cloned();
        Ok(Response::new(CaptureResponse {
            hold: asked.map(|r| HoldRecord {
                state: HoldState::Captured.into(),
                ..record(&r, "")
            }),
        }))
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        self.calls.releases.fetch_add(1, Ordering::SeqCst);
        let _ = request;
        Err(Status::not_found("scripted: nothing to release"))
    }

    async fn lookup_by_reference(
        &self,
        request: Request<LookupByReferenceRequest>,
    ) -> Result<Response<HoldRecord>, Status> {
        self.calls.lookups.fetch_add(1, Ordering::SeqCst);
        let reference = request.into_inner().reference;
        let asked = self.asked.lock().unwrap().get(&reference).cloned();
        match (self.lookup, asked) {
            (LookupAnswer::Found(hold_id), Some(asked)) => {
                Ok(Response::new(record(&asked, hold_id)))
            }
            _ => Err(Status::not_found("scripted: no hold for this reference")),
        }
    }
}

/// An active hold for `request`, named `hold_id`.
fn record(request: &HoldRequest, hold_id: &str) -> HoldRecord {
    HoldRecord {
        hold_id: hold_id.to_owned(),
        reference: request.reference.clone(),
        account_id: request.account_id.clone(),
        amount: request.amount.clone(),
        state: HoldState::Active.into(),
    }
}

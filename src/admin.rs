//! The admin HTTP port (`--admin-listen`, config `admin_listen`): `/metrics` in Prometheus
//! text, `/healthz` (the process answers) and `/readyz` (it should receive traffic, as
//! [`crate::readiness`] defines it; 503 with the reason otherwise). Served by axum on a
//! listener the caller binds, until the caller's shutdown signal.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::readiness::Readiness;
use crate::store::OrderStore;
use checkout_telemetry::metrics;

/// How long a scrape waits for the store's job counts before it renders the last ones.
const STATS_TIMEOUT: Duration = Duration::from_secs(1);

/// What the admin port reports on.
#[derive(Clone, Default)]
pub struct Admin {
    /// The orchestrator's readiness; `None` (the stubs) is always ready.
    pub readiness: Option<Arc<Readiness>>,
    /// The store whose job counts `/metrics` reads at each scrape; `None` for the stubs.
    pub store: Option<Arc<dyn OrderStore>>,
}

/// Serves the admin routes on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    admin: Admin,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(admin);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn render_metrics(State(admin): State<Admin>) -> impl IntoResponse {
    if let Some(store) = &admin.store {
        if let Some(bytes) = store.memory_in_use() {
            metrics::store_memory(bytes);
        }
        match tokio::time::timeout(STATS_TIMEOUT, store.stats()).await {
            Ok(Ok(stats)) => {
                // Due times are on the store's clock (docs/design.md §6, One clock).
                let now = store.clock().now_ms();
                let overdue_ms = stats
                    .oldest_pending_run_at_ms
                    .map_or(0, |at| now.saturating_sub(at).max(0));
                metrics::worker_jobs(
                    stats.pending,
                    stats.parked,
                    Duration::from_millis(overdue_ms.unsigned_abs()),
                );
            }
            // The gauges keep their last values; readiness says whether the store is there.
            Ok(Err(error)) => tracing::debug!(%error, "job counts not read for /metrics"),
            Err(_) => tracing::debug!("job counts not read in time for /metrics"),
        }
    }
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        metrics::encode(),
    )
}

async fn ready(State(admin): State<Admin>) -> impl IntoResponse {
    match admin
        .readiness
        .as_deref()
        .and_then(Readiness::not_ready_because)
    {
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
        None => (StatusCode::OK, "ready\n".to_owned()),
    }
}

//! Span export that never holds up an order: finished spans go into a bounded queue
//! (`OTEL_BSP_MAX_QUEUE_SIZE`) with a non-blocking send, and one task reads the queue every
//! 25 ms and ships it in batches (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`; a partial batch once its
//! first span has waited `OTEL_BSP_SCHEDULE_DELAY`; each export bounded by
//! `OTEL_BSP_EXPORT_TIMEOUT`; up to four exports in flight). A full queue drops the span and counts it in
//! `checkout_telemetry_spans_dropped_total` (as are the spans of a failed export): a collector that is down or slow costs spans,
//! never latency. (The SDK's own batch processor drops too, but does not expose the count.)

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics;

/// The queue and batch settings, from the standard `OTEL_BSP_*` variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Finished spans waiting for export, at most (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048).
    pub queue: usize,
    /// Spans per export, at most (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, 512).
    pub batch: usize,
    /// The longest a span waits for its batch to fill (`OTEL_BSP_SCHEDULE_DELAY`, 5000 ms).
    pub delay: Duration,
    /// The longest one export may take (`OTEL_BSP_EXPORT_TIMEOUT`, 30000 ms).
    pub timeout: Duration,
}

impl Default for Batching {
    fn default() -> Self {
        Self {
            queue: 2048,
            batch: 512,
            delay: Duration::from_millis(5000),
            timeout: Duration::from_millis(30_000),
        }
    }
}

impl Batching {
    /// The defaults, overridden by any `OTEL_BSP_*` variable that is set and parses.
    pub fn from_env() -> Self {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let d = Self::default();
        let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX).max(1);
        Self {
            queue: var("OTEL_BSP_MAX_QUEUE_SIZE").map_or(d.queue, count),
            batch: var("OTEL_BSP_MAX_EXPORT_BATCH_SIZE").map_or(d.batch, count),
            delay: var("OTEL_BSP_SCHEDULE_DELAY").map_or(d.delay, Duration::from_millis),
            timeout: var("OTEL_BSP_EXPORT_TIMEOUT").map_or(d.timeout, Duration::from_millis),
        }
    }
}

/// The span processor: a non-blocking hand-off to [`Shipper`]'s bounded queue.
#[derive(Debug)]
pub struct QueueProcessor {
    queue: mpsc::Sender<SpanData>,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.queue.try_send(span).is_err() {
            metrics::spans_dropped(1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The task that ships queued spans; [`Shipper::stop`] sends what is left and ends it.
#[derive(Debug)]
pub struct Shipper {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Shipper {
    /// Starts shipping to `exporter`; spans enter through the returned processor.
    pub fn start<E: SpanExporter + 'static>(
        exporter: E,
        batching: Batching,
    ) -> (QueueProcessor, Shipper) {
        let (tx, rx) = mpsc::channel(batching.queue.max(1));
        let stop = CancellationToken::new();
        let task = tokio::spawn(ship(exporter, rx, batching, stop.clone()));
        (QueueProcessor { queue: tx }, Shipper { stop, task })
    }

    /// Ships the spans still queued (within `within`) and stops.
    pub async fn stop(self, within: Duration) {
        self.stop.cancel();
        if tokio::time::timeout(within, self.task).await.is_err() {
            eprintln!("telemetry: spans still queued after {within:?}; not exported");
        }
    }
}

/// Exports in flight at once, at most: a slow export does not stop the next batch.
const EXPORTS_IN_FLIGHT: usize = 4;

/// How often the queue is read: full batches leave within this, partial ones after the
/// schedule delay (give or take this).
const TICK: Duration = Duration::from_millis(25);

async fn ship<E: SpanExporter + 'static>(
    exporter: E,
    mut queue: mpsc::Receiver<SpanData>,
    batching: Batching,
    stop: CancellationToken,
) {
    let exporter = Arc::new(exporter);
    let in_flight = Arc::new(Semaphore::new(EXPORTS_IN_FLIGHT));
    let mut batch = Vec::with_capacity(batching.batch);
    // When the batch being filled took its first span.
    let mut first_at: Option<tokio::time::Instant> = None;
    // The queue is read on a tick, never awaited span by span: a finished span costs its
    // sender an atomic push, with no task to wake.
    let mut tick = tokio::time::interval(TICK.min(batching.delay));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => break,
        }
        loop {
            while batch.len() < batching.batch {
                match queue.try_recv() {
                    Ok(span) => {
                        first_at.get_or_insert_with(tokio::time::Instant::now);
                        batch.push(span);
                    }
                    Err(_) => break,
                }
            }
            let full = batch.len() >= batching.batch;
            let due = first_at.is_some_and(|at| at.elapsed() >= batching.delay);
            if !full && !due {
                break;
            }
            // Waits only when EXPORTS_IN_FLIGHT exports are out; meanwhile the queue fills
            // (and drops, counted) rather than anything waiting on it.
            let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
                break;
            };
            let mut spans = std::mem::replace(&mut batch, Vec::with_capacity(batching.batch));
            first_at = None;
            let exporter = Arc::clone(&exporter);
            tokio::spawn(async move {
                export(exporter.as_ref(), &mut spans, batching.timeout).await;
                drop(permit);
            });
        }
    }
    // Let the exports in flight finish (each bounded by the export timeout).
    let _ = in_flight.acquire_many(EXPORTS_IN_FLIGHT as u32).await;
    // Stopping: what is already queued still goes out.
    while let Ok(span) = queue.try_recv() {
        batch.push(span);
        if batch.len() >= batching.batch {
            export(exporter.as_ref(), &mut batch, batching.timeout).await;
        }
    }
    export(exporter.as_ref(), &mut batch, batching.timeout).await;
    let _ = exporter.shutdown();
}

async fn export<E: SpanExporter>(exporter: &E, batch: &mut Vec<SpanData>, timeout: Duration) {
    if batch.is_empty() {
        return;
    }
    let spans = std::mem::take(batch);
    let count = spans.len();
    match tokio::time::timeout(timeout, exporter.export(spans)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            metrics::spans_dropped(count as u64);
            tracing::debug!(%error, spans = count, "span export failed; spans lost");
        }
        Err(_) => {
            metrics::spans_dropped(count as u64);
            tracing::debug!(?timeout, spans = count, "span export timed out; spans lost");
        }
    }
}

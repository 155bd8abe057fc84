//! Span export that never holds up an order: the SDK's `BatchSpanProcessor` ships finished
//! spans from a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`) in batches
//! (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`; a partial batch every `OTEL_BSP_SCHEDULE_DELAY`) on a
//! thread of its own, one export at a time, each bounded by the exporter's timeout. A full
//! queue drops the span and counts it in `checkout_telemetry_spans_dropped_total` (as are the
//! spans of a failed export): a collector that is down or slow costs spans, never latency.
//!
//! The count needs the one wrapper here, because the SDK's processor counts its drops in a
//! private field and only logs the total at shutdown: [`Counted`] keeps its own count of the
//! spans in the SDK's queue (one more on each hand-off, fewer by a batch when the exporter
//! takes it) and drops — and counts — a span itself when the queue is full, before the SDK
//! would. Its count is never below the SDK's queue length, so the SDK never drops silently.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor,
};

use crate::metrics;

/// The queue and batch settings, from the standard `OTEL_BSP_*` variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Finished spans waiting for export, at most (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048).
    pub queue: usize,
    /// Spans per export, at most (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, 512).
    pub batch: usize,
    /// How often a partial batch is shipped (`OTEL_BSP_SCHEDULE_DELAY`, 5000 ms).
    pub delay: Duration,
    /// The longest one export may take: the OTLP exporter's timeout (`OTEL_BSP_EXPORT_TIMEOUT`,
    /// else `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT`, else
    /// 10000 ms, the exporter's default). The SDK's processor does not bound an export itself.
    pub timeout: Duration,
}

impl Default for Batching {
    fn default() -> Self {
        Self {
            queue: 2048,
            batch: 512,
            delay: Duration::from_millis(5000),
            timeout: Duration::from_millis(10_000),
        }
    }
}

impl Batching {
    /// The defaults, overridden by any of the variables above that is set and parses.
    pub fn from_env() -> Self {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let d = Self::default();
        let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX).max(1);
        let timeout = var("OTEL_BSP_EXPORT_TIMEOUT")
            .or_else(|| var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"))
            .or_else(|| var("OTEL_EXPORTER_OTLP_TIMEOUT"));
        Self {
            queue: var("OTEL_BSP_MAX_QUEUE_SIZE").map_or(d.queue, count),
            batch: var("OTEL_BSP_MAX_EXPORT_BATCH_SIZE").map_or(d.batch, count),
            delay: var("OTEL_BSP_SCHEDULE_DELAY").map_or(d.delay, Duration::from_millis),
            timeout: timeout.map_or(d.timeout, Duration::from_millis),
        }
    }
}

/// The SDK's batch processor in front of `exporter`, with its drops counted.
pub(crate) fn processor<E: SpanExporter + 'static>(exporter: E, batching: Batching) -> Counted {
    let queue = batching.queue.max(1);
    let queued = Arc::new(AtomicUsize::new(0));
    let config = BatchConfigBuilder::default()
        .with_max_queue_size(queue)
        .with_max_export_batch_size(batching.batch.clamp(1, queue))
        .with_scheduled_delay(batching.delay)
        .build();
    let exporter = Taken {
        inner: exporter,
        queued: Arc::clone(&queued),
    };
    Counted {
        inner: BatchSpanProcessor::new(exporter, config),
        queued,
        queue,
    }
}

/// The SDK's batch processor, behind the count of what is in its queue.
#[derive(Debug)]
pub(crate) struct Counted {
    inner: BatchSpanProcessor,
    /// Spans handed to `inner` and not yet taken by the exporter.
    queued: Arc<AtomicUsize>,
    /// The SDK's queue size.
    queue: usize,
}

impl SpanProcessor for Counted {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.queue {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            metrics::spans_dropped(1);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter, telling [`Counted`] when a batch has left the queue and counting the spans of
/// a failed export.
#[derive(Debug)]
struct Taken<E> {
    inner: E,
    queued: Arc<AtomicUsize>,
}

impl<E: SpanExporter> SpanExporter for Taken<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let count = batch.len();
        self.queued.fetch_sub(count, Ordering::AcqRel);
        let result = self.inner.export(batch).await;
        if let Err(error) = &result {
            metrics::spans_dropped(count as u64);
            tracing::debug!(%error, spans = count, "span export failed; spans lost");
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

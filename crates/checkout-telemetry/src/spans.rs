//! Where `tracing` spans become OpenTelemetry spans: a slot in the subscriber that holds the
//! tracing-opentelemetry layer once span export starts ([`install`]), and the filters that keep
//! the two kinds of spans apart — spans of target [`TARGET`] go to OpenTelemetry only, every
//! other span and event to the log lines only.
//!
//! Until [`install`] the slot is empty and its filter says `never` to every callsite, so a span
//! of [`TARGET`] is disabled where it is written (`tracing::Span::none()` in effect): without
//! an exporter no OpenTelemetry work happens at all. The slot exists because logging is
//! installed once per process while span export may start on a later `init_with` (tests do
//! that); `tracing` cannot swap a layer into an installed subscriber.

use std::any::TypeId;
use std::sync::OnceLock;

use opentelemetry_sdk::trace::SdkTracer;
use tracing::span;
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::Registry;
use tracing_subscriber::layer::{Context, Filter, Layer};

/// The `tracing` target of every exported span: what the tracing-opentelemetry layer sees, and
/// what log lines leave out.
pub const TARGET: &str = "checkout::span";

/// The tracing-opentelemetry layer, once spans are exported.
static OTEL: OnceLock<OpenTelemetryLayer<Registry, SdkTracer>> = OnceLock::new();

/// Starts span export: spans of [`TARGET`] are made by `tracer` from now on. Only the first
/// call has an effect. Callsites already seen are asked again, so their cached "never" goes.
pub(crate) fn install(tracer: SdkTracer) -> bool {
    // The layer's defaults add five attributes to every span (source file, module, line,
    // thread id and name) and two more at its end (busy and idle time, which cost two clock
    // reads on every poll of an instrumented future): none is part of the service's span
    // contract (docs/design.md §11), and at 16 spans an order they are most of
    // what the exporter encodes. No exported span is ever entered (each span's context is
    // carried by the future it covers, see trace.rs), so context activation, which stays on,
    // costs nothing; with it a contextual span's parent is the current OpenTelemetry context.
    let layer = tracing_opentelemetry::layer()
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_tracer(tracer);
    let installed = OTEL.set(layer).is_ok();
    if installed {
        tracing::callsite::rebuild_interest_cache();
    }
    installed
}

/// Whether spans are exported (the layer is in its slot).
pub(crate) fn exporting() -> bool {
    OTEL.get().is_some()
}

/// The slot: forwards to the tracing-opentelemetry layer when there is one. It sits right on
/// the registry, under [`ExportedOnly`], so the layer sees exactly the spans of [`TARGET`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Slot;

impl Layer<Registry> for Slot {
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, Registry>) {
        if let Some(layer) = OTEL.get() {
            layer.on_new_span(attrs, id, ctx);
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, Registry>) {
        if let Some(layer) = OTEL.get() {
            layer.on_record(id, values, ctx);
        }
    }

    fn on_follows_from(&self, id: &span::Id, follows: &span::Id, ctx: Context<'_, Registry>) {
        if let Some(layer) = OTEL.get() {
            layer.on_follows_from(id, follows, ctx);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, Registry>) {
        if let Some(layer) = OTEL.get() {
            layer.on_event(event, ctx);
        }
    }

    fn on_enter(&self, id: &span::Id, ctx: Context<'_, Registry>) {
        if let Some(layer) = OTEL.get() {
            layer.on_enter(id, ctx);
        }
    }

    fn on_exit(&self, id: &span::Id, ctx: Context<'_, Registry>) {
        if let Some(layer) = OTEL.get() {
            layer.on_exit(id, ctx);
        }
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, Registry>) {
        if let Some(layer) = OTEL.get() {
            layer.on_close(id, ctx);
        }
    }

    // SAFETY: the pointers returned point into `self` or into the layer in `OTEL`, which lives
    // for the rest of the process; tracing-opentelemetry finds its `OpenTelemetrySpanExt`
    // hooks through this.
    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        if id == TypeId::of::<Self>() {
            return Some(std::ptr::from_ref(self).cast());
        }
        // SAFETY: forwarded as is; the layer's own `downcast_raw` upholds the contract.
        OTEL.get()
            .and_then(|layer| unsafe { layer.downcast_raw(id) })
    }
}

/// The filter of the slot: spans (and events inside them) of [`TARGET`], once spans are
/// exported; nothing before.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ExportedOnly;

impl<S: Subscriber> Filter<S> for ExportedOnly {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        meta.target() == TARGET && exporting()
    }

    fn callsite_enabled(&self, meta: &Metadata<'_>) -> Interest {
        if meta.target() == TARGET && exporting() {
            Interest::always()
        } else {
            Interest::never()
        }
    }
}

/// The filter added to the log lines' own: no span or event of [`TARGET`] (the exported spans
/// stay out of log lines; a line's span fields are those of the log spans).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LogsOnly;

impl<S: Subscriber> Filter<S> for LogsOnly {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        meta.target() != TARGET
    }

    fn callsite_enabled(&self, meta: &Metadata<'_>) -> Interest {
        if meta.target() == TARGET {
            Interest::never()
        } else {
            Interest::always()
        }
    }
}

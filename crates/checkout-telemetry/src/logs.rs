//! How log lines look: human-readable text (the default) or one JSON object a line
//! (`--log-format json`, `CHECKOUT_LOG_FORMAT=json`). Either way a line written inside a
//! request or a job carries the fields of its span: `trace_id` and `order_id`.

use tracing_subscriber::Layer;
use tracing_subscriber::fmt::TestWriter;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::registry::LookupSpan;

/// The shape of log lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `2026-01-01T00:00:00Z  INFO PlaceOrder{order_id=… trace_id=…}: message`; colours only
    /// on a terminal.
    #[default]
    Text,
    /// One JSON object a line, the span's fields under `span`.
    Json,
}

/// Where log lines go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogWriter {
    /// Standard error, the process's log.
    #[default]
    Stderr,
    /// The test harness's captured output (`print!`): a test's lines are shown only when it
    /// fails, or with `--nocapture`.
    Test,
}

/// The formatting layer writing to `writer` in `format`.
pub fn layer<S>(format: LogFormat, writer: LogWriter) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let base = tracing_subscriber::fmt::layer().with_writer(match writer {
        LogWriter::Stderr => BoxMakeWriter::new(std::io::stderr),
        LogWriter::Test => BoxMakeWriter::new(TestWriter::new()),
    });
    match format {
        LogFormat::Text => base
            // Colours only for a terminal: a log file or collector gets plain text.
            .with_ansi(
                writer == LogWriter::Stderr && std::io::IsTerminal::is_terminal(&std::io::stderr()),
            )
            .boxed(),
        LogFormat::Json => base
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
    }
}

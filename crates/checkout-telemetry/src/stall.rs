//! Stall watch: tells a stalled async runtime from a starved machine, with evidence in the log.
//!
//! Two ticks of [`TICK`] run side by side. One is a tokio task (it runs late when every runtime
//! worker thread is busy or blocked), the other a plain OS thread (it runs late only when the
//! process gets no CPU: the machine is saturated, or the kernel held it). How late each tick
//! woke is its *lag*. A runtime lag with no thread lag points at work blocking the runtime's
//! threads; both lagging together points at CPU starvation. Every lag above `report_over` is
//! logged at `warn` (`runtime stalled` / `process starved`), and each [`SUMMARY`] the worst
//! lags of the interval are logged at `info` when either passed `report_over`. Every lag also
//! goes to the `checkout_stall_watch_lag_seconds{watch}` histogram, so stalls shorter than the
//! log's threshold show too (the 20–50 ms stalls of transparent huge pages did not reach it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::metrics;

/// How often each watch wakes.
pub const TICK: Duration = Duration::from_millis(10);
/// How often the worst lags are summed up in the log.
pub const SUMMARY: Duration = Duration::from_secs(30);
/// Lags above this are logged one by one.
pub const REPORT_OVER: Duration = Duration::from_millis(50);

/// Worst lags seen, in microseconds, since start (readable while the watch runs).
#[derive(Debug, Default)]
pub struct Lags {
    runtime_max_us: AtomicU64,
    thread_max_us: AtomicU64,
    runtime_over: AtomicU64,
    thread_over: AtomicU64,
}

impl Lags {
    /// The worst runtime (tokio task) lag since start.
    pub fn runtime_max(&self) -> Duration {
        Duration::from_micros(self.runtime_max_us.load(Ordering::Relaxed))
    }

    /// The worst OS thread lag since start.
    pub fn thread_max(&self) -> Duration {
        Duration::from_micros(self.thread_max_us.load(Ordering::Relaxed))
    }

    /// How many runtime and thread ticks were later than the report threshold.
    pub fn over(&self) -> (u64, u64) {
        (
            self.runtime_over.load(Ordering::Relaxed),
            self.thread_over.load(Ordering::Relaxed),
        )
    }
}

/// A running watch; dropping it stops both ticks.
#[derive(Debug)]
pub struct StallWatch {
    lags: Arc<Lags>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl StallWatch {
    /// Starts both watches for `process` (a name for the log) on the current runtime.
    pub fn start(process: &'static str, report_over: Duration) -> Self {
        let lags = Arc::new(Lags::default());
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(runtime_watch(process, Arc::clone(&lags), report_over));
        {
            let lags = Arc::clone(&lags);
            let stop = Arc::clone(&stop);
            let spawned = std::thread::Builder::new()
                .name("stall-watch".to_owned())
                .spawn(move || thread_watch(process, &lags, &stop, report_over));
            if let Err(error) = spawned {
                tracing::warn!(%error, "no stall-watch thread: only the runtime is watched");
            }
        }
        Self { lags, stop, task }
    }

    /// The lags seen so far.
    pub fn lags(&self) -> &Lags {
        &self.lags
    }
}

impl Drop for StallWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.abort();
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Records `lag` in `max` and `over`; whether it passed `report_over`.
fn record(max: &AtomicU64, over: &AtomicU64, lag: Duration, report_over: Duration) -> bool {
    max.fetch_max(micros(lag), Ordering::Relaxed);
    let late = lag > report_over;
    if late {
        over.fetch_add(1, Ordering::Relaxed);
    }
    late
}

async fn runtime_watch(process: &'static str, lags: Arc<Lags>, report_over: Duration) {
    let mut interval_max = Duration::ZERO;
    let mut summary_at = Instant::now() + SUMMARY;
    loop {
        let asleep = Instant::now();
        tokio::time::sleep(TICK).await;
        let lag = asleep.elapsed().saturating_sub(TICK);
        metrics::stall_watch_lag("runtime", lag);
        interval_max = interval_max.max(lag);
        if record(&lags.runtime_max_us, &lags.runtime_over, lag, report_over) {
            tracing::warn!(
                process,
                lag_ms = lag.as_millis() as u64,
                "runtime stalled: a 10 ms timer task woke late"
            );
        }
        if Instant::now() >= summary_at {
            summary_at += SUMMARY;
            let thread = lags.thread_max();
            if interval_max > report_over || thread > report_over {
                tracing::info!(
                    process,
                    runtime_max_lag_ms = interval_max.as_millis() as u64,
                    thread_max_lag_since_start_ms = thread.as_millis() as u64,
                    "stall watch: worst runtime lag of the last 30 s"
                );
            }
            interval_max = Duration::ZERO;
        }
    }
}

fn thread_watch(process: &'static str, lags: &Lags, stop: &AtomicBool, report_over: Duration) {
    while !stop.load(Ordering::Relaxed) {
        let asleep = Instant::now();
        std::thread::sleep(TICK);
        let lag = asleep.elapsed().saturating_sub(TICK);
        metrics::stall_watch_lag("thread", lag);
        if record(&lags.thread_max_us, &lags.thread_over, lag, report_over) {
            tracing::warn!(
                process,
                lag_ms = lag.as_millis() as u64,
                "process starved: a 10 ms OS-thread sleep woke late (CPU saturated or the \
                 kernel held the process)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocking the only runtime thread shows as a runtime lag, not as a thread lag.
    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_runtime_thread_is_told_from_a_starved_process() {
        let watch = StallWatch::start("test", Duration::from_millis(50));
        // Let the runtime watch take its first tick.
        tokio::time::sleep(TICK * 3).await;
        std::thread::sleep(Duration::from_millis(200));
        // The watch task runs again only after the block, and records its lag then.
        while watch.lags().runtime_max() < Duration::from_millis(100) {
            tokio::time::sleep(TICK).await;
        }
        assert!(watch.lags().over().0 >= 1);
        assert!(watch.lags().runtime_max() >= Duration::from_millis(100));
        // The metric saw it too: a runtime tick later than 0.1 s, none of the thread's.
        let text = metrics::encode();
        let series = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("{name} in:\n{text}"))
        };
        let ticks = series("checkout_stall_watch_lag_seconds_count{watch=\"runtime\"}");
        let within =
            series("checkout_stall_watch_lag_seconds_bucket{le=\"0.1\",watch=\"runtime\"}");
        assert!(
            ticks - within >= 1.0,
            "{ticks} ticks, {within} within 0.1 s"
        );
    }
}

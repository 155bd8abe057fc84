//! What an open-loop scenario records per order — when it was scheduled (from the run's start),
//! its latency, whether it was late, and its outcome — and the arithmetic the checks need over a
//! span of them (counts, percentiles, rates). Compact on purpose: a surge records tens of
//! thousands.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tonic_types::StatusExt;

use crate::load::{Answer, Shot};

/// The ErrorInfo reason of a refusal by admission control (docs/design.md §10).
pub const OVERLOADED: &str = "OVERLOADED";

/// One order of a run.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was scheduled, from the start of the run.
    pub at: Duration,
    /// From its scheduled send to its answer.
    pub latency: Duration,
    /// From its actual send to its answer: what the client waited, without the loader's lag.
    pub waited: Duration,
    /// Answered later than its deadline (or given up on).
    pub late: bool,
    /// `CONFIRMED`, `PENDING BUDGET_EXHAUSTED`, `error ResourceExhausted`, ...
    pub outcome: String,
    /// An `Order` came back (the request was admitted).
    pub admitted: bool,
    /// Refused: `RESOURCE_EXHAUSTED` with ErrorInfo reason `OVERLOADED`.
    pub overloaded: bool,
}

impl Sample {
    /// The sample of `shot` in a run that started at `start`.
    pub fn of(shot: &Shot, start: Instant) -> Self {
        let overloaded = match &shot.answer {
            Answer::Error(status) => {
                status.code() == tonic::Code::ResourceExhausted
                    && status
                        .get_details_error_info()
                        .is_some_and(|info| info.reason == OVERLOADED)
            }
            _ => false,
        };
        Self {
            at: shot.scheduled.saturating_duration_since(start),
            latency: shot.latency(),
            waited: shot.answered.saturating_duration_since(shot.sent),
            late: shot.late(),
            outcome: shot.outcome(),
            admitted: shot.order().is_some(),
            overloaded,
        }
    }

    /// Whether its outcome is `outcome` (e.g. `CONFIRMED`, `PENDING WALLET_OUTCOME_UNKNOWN`).
    pub fn is(&self, outcome: &str) -> bool {
        self.outcome == outcome
    }
}

/// Samples shared by the tasks of a run.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// When the run started: samples are timed from here.
    pub start: Instant,
    samples: Arc<Mutex<Vec<Sample>>>,
}

impl Recorder {
    /// A recorder for a run starting at `start`.
    pub fn new(start: Instant) -> Self {
        Self {
            start,
            samples: Arc::default(),
        }
    }

    /// Records one answered (or given-up) order.
    pub fn record(&self, shot: &Shot) {
        let sample = Sample::of(shot, self.start);
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(sample);
    }

    /// Everything recorded, in scheduled order.
    pub fn samples(&self) -> Samples {
        let mut all = self
            .samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        all.sort_by_key(|s| s.at);
        Samples(all)
    }
}

/// A run's samples, in scheduled order.
#[derive(Debug, Clone, Default)]
pub struct Samples(pub Vec<Sample>);

impl Samples {
    /// Those scheduled in `[from, to)` from the run's start.
    pub fn between(&self, from: Duration, to: Duration) -> Samples {
        Samples(
            self.0
                .iter()
                .filter(|s| s.at >= from && s.at < to)
                .cloned()
                .collect(),
        )
    }

    /// How many.
    pub fn len(&self) -> u64 {
        self.0.len() as u64
    }

    /// None at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many satisfy `f`.
    pub fn count(&self, f: impl Fn(&Sample) -> bool) -> u64 {
        self.0.iter().filter(|s| f(s)).count() as u64
    }

    /// How many had `outcome`.
    pub fn outcome(&self, outcome: &str) -> u64 {
        self.count(|s| s.is(outcome))
    }

    /// The `q` quantile (0-1) of the latencies of those satisfying `f`; `None` if none do.
    pub fn quantile(&self, q: f64, f: impl Fn(&Sample) -> bool) -> Option<Duration> {
        self.quantile_of(q, f, |s| s.latency)
    }

    /// The `q` quantile (0-1) of `measure` over those satisfying `f`; `None` if none do.
    pub fn quantile_of(
        &self,
        q: f64,
        f: impl Fn(&Sample) -> bool,
        measure: impl Fn(&Sample) -> Duration,
    ) -> Option<Duration> {
        let mut latencies: Vec<Duration> = self.0.iter().filter(|s| f(s)).map(measure).collect();
        if latencies.is_empty() {
            return None;
        }
        latencies.sort();
        // Nearest rank: the smallest value with at least q of the values at or below it.
        let rank = ((q * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
        latencies.get(rank - 1).copied()
    }

    /// Outcomes and their counts, most frequent first: `CONFIRMED 980, PENDING ... 20`.
    pub fn outcomes_text(&self) -> String {
        let mut counts: Vec<(String, u64)> = Vec::new();
        for s in &self.0 {
            match counts.iter_mut().find(|(o, _)| *o == s.outcome) {
                Some((_, n)) => *n += 1,
                None => counts.push((s.outcome.clone(), 1)),
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let parts: Vec<String> = counts.iter().map(|(o, n)| format!("{o} {n}")).collect();
        if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_ms: u64, latency_ms: u64, outcome: &str) -> Sample {
        Sample {
            at: Duration::from_millis(at_ms),
            latency: Duration::from_millis(latency_ms),
            waited: Duration::from_millis(latency_ms),
            late: false,
            outcome: outcome.to_owned(),
            admitted: true,
            overloaded: false,
        }
    }

    #[test]
    fn spans_counts_and_quantiles() {
        let samples = Samples(
            (0..100)
                .map(|i| sample(i * 10, i + 1, "CONFIRMED"))
                .collect(),
        );
        let first = samples.between(Duration::ZERO, Duration::from_millis(500));
        assert_eq!(first.len(), 50);
        assert_eq!(
            samples.quantile(0.99, |_| true),
            Some(Duration::from_millis(99))
        );
        assert_eq!(
            first.quantile(0.5, |_| true),
            Some(Duration::from_millis(25))
        );
        assert_eq!(samples.quantile(0.5, |s| s.is("DECLINED")), None);
        assert_eq!(samples.outcome("CONFIRMED"), 100);
        assert_eq!(first.outcomes_text(), "CONFIRMED 50");
    }
}

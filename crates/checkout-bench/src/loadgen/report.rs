//! What a load run measured and how it is printed: the tally of answers (latency histogram,
//! outcomes, late answers), the processes' CPU and memory over the same span, and their
//! rendering as table rows or JSON lines (one object per window, run and lane).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// The answers to the orders scheduled in one span.
#[derive(Debug, Clone)]
pub struct Tally {
    /// Latency of answered orders (an `Order`, whatever its status) from the intended send
    /// time, in microseconds.
    pub latency: Histogram<u64>,
    /// Latency of the calls answered with a gRPC error (refusals such as `RESOURCE_EXHAUSTED
    /// OVERLOADED`, fast-fails, transport errors; not the calls the loader gave up on), from
    /// the intended send time, in microseconds: how fast a caller learns it must go elsewhere.
    pub error_latency: Histogram<u64>,
    /// Answers by `STATUS REASON`, or `error <gRPC code>`.
    pub outcomes: BTreeMap<String, u64>,
    /// Orders answered with an `Order`.
    pub answered: u64,
    /// Answers (orders or errors) that came back later than the deadline sent with the call,
    /// counted from the actual send; calls the loader gave up on count here too.
    pub late: u64,
    /// When the last of these answers came back.
    pub last_answer: Option<Instant>,
}

impl Tally {
    /// Nothing answered yet.
    pub fn new() -> anyhow::Result<Self> {
        Ok(Self {
            latency: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            error_latency: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            outcomes: BTreeMap::new(),
            answered: 0,
            late: 0,
            last_answer: None,
        })
    }

    /// Adds `other` to this tally.
    pub fn merge(&mut self, other: &Tally) -> anyhow::Result<()> {
        self.latency.add(&other.latency)?;
        self.error_latency.add(&other.error_latency)?;
        for (outcome, n) in &other.outcomes {
            *self.outcomes.entry(outcome.clone()).or_default() += n;
        }
        self.answered += other.answered;
        self.late += other.late;
        self.last_answer = self.last_answer.max(other.last_answer);
        Ok(())
    }

    /// The latency at quantile `q`, in milliseconds.
    fn ms(&self, q: f64) -> f64 {
        self.latency.value_at_quantile(q) as f64 / 1000.0
    }

    /// The error answers' latency at quantile `q`, in milliseconds; `None` without any.
    pub fn error_ms(&self, q: f64) -> Option<f64> {
        (!self.error_latency.is_empty())
            .then(|| self.error_latency.value_at_quantile(q) as f64 / 1000.0)
    }

    /// `CONFIRMED 11000, error Unavailable 3 (errors answered p50 1.2 / p99 4.5 ms)`.
    fn outcomes_text(&self) -> String {
        if self.outcomes.is_empty() {
            return "none".to_owned();
        }
        let parts: Vec<String> = self
            .outcomes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let mut text = parts.join(", ");
        if let (Some(p50), Some(p99)) = (self.error_ms(0.5), self.error_ms(0.99)) {
            let _ = write!(text, " (errors answered p50 {p50:.1} / p99 {p99:.1} ms)");
        }
        text
    }
}

/// One measured process over a span.
#[derive(Debug, Clone)]
pub struct ProcUse {
    /// The name given with `--pid NAME=PID`.
    pub name: String,
    /// Whether it is the server of the lane being driven (rather than shared, like the stubs).
    pub server: bool,
    /// CPU time spent in the span; `None` if the process could not be read.
    pub cpu: Option<Duration>,
    /// Resident memory at the end of the span.
    pub rss_bytes: Option<u64>,
    /// Threads of a process measured as a whole too (`NAME=thread:PID:THREAD`): shown, but not
    /// added to the system's CPU a second time.
    pub thread: bool,
}

impl ProcUse {
    /// The load generator measuring itself alongside separate server processes.
    pub fn is_loader(&self) -> bool {
        !self.server && self.name == LOADER
    }
}

/// The name the loader measures itself under.
pub const LOADER: &str = "loadgen";

/// A tally with the time it took and what the processes spent meanwhile.
#[derive(Debug, Clone)]
pub struct Measured {
    /// The answers.
    pub tally: Tally,
    /// From the start of the span to its end or to the last answer of its orders, whichever
    /// is later: what the achieved rate divides by.
    pub span: Duration,
    /// The measured processes: the lane's server first, then the shared ones in `--pid` order,
    /// then the loader itself.
    pub procs: Vec<ProcUse>,
}

impl Measured {
    /// Orders answered per second of span.
    pub fn achieved(&self) -> f64 {
        self.tally.answered as f64 / self.span.as_secs_f64().max(1e-9)
    }

    /// CPU microseconds per answered order of process `p`.
    pub fn cpu_per_order_us(p: &ProcUse, answered: u64) -> Option<f64> {
        let cpu = p.cpu?;
        (answered > 0).then(|| cpu.as_secs_f64() * 1e6 / answered as f64)
    }

    /// The lane's own server process, if one is measured.
    pub fn server(&self) -> Option<&ProcUse> {
        self.procs.iter().find(|p| p.server)
    }

    /// CPU µs per answered order of the lane's server.
    pub fn server_cpu_per_order_us(&self) -> Option<f64> {
        Self::cpu_per_order_us(self.server()?, self.tally.answered)
    }

    /// CPU µs per answered order of every measured process but the loader: the servers, the
    /// stubs and the database, i.e. what the whole system behind the loader spent (a thread
    /// probe's CPU is already in its process's).
    pub fn system_cpu_per_order_us(&self) -> Option<f64> {
        let system: Vec<&ProcUse> = self
            .procs
            .iter()
            .filter(|p| !p.is_loader() && !p.thread)
            .collect();
        if system.is_empty() || self.tally.answered == 0 {
            return None;
        }
        let cpu: Duration = system.iter().map(|p| p.cpu).sum::<Option<Duration>>()?;
        Some(cpu.as_secs_f64() * 1e6 / self.tally.answered as f64)
    }

    /// Adds another span of the same lane (another round): tallies, spans and CPU add up, the
    /// memory is the largest seen.
    pub fn merge(&mut self, other: &Measured) -> anyhow::Result<()> {
        self.tally.merge(&other.tally)?;
        self.span += other.span;
        for p in &mut self.procs {
            if let Some(o) = other.procs.iter().find(|o| o.name == p.name) {
                p.cpu = p.cpu.zip(o.cpu).map(|(a, b)| a + b);
                p.rss_bytes = p.rss_bytes.max(o.rss_bytes);
            }
        }
        Ok(())
    }
}

/// Header of [`row`]: the fixed columns, then CPU/order and RSS of each process.
pub fn header(first: &str, procs: &[ProcUse]) -> String {
    let mut out = format!(
        "{first:<16}{:>9}{:>8}{:>8}{:>8}{:>9}{:>8}{:>6}",
        "orders/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "late"
    );
    for p in procs {
        let name = if p.server { "server" } else { short(&p.name) };
        let _ = write!(out, "{:>15}{:>8}", format!("{name} µs/ord"), "RSS MB");
    }
    out.push_str("  outcomes");
    out
}

/// One table row; `first` names the lane, round or window.
pub fn row(first: &str, m: &Measured) -> String {
    let t = &m.tally;
    let mut out = format!(
        "{first:<16}{:>9.0}{:>8.1}{:>8.1}{:>8.1}{:>9.1}{:>8.1}{:>6}",
        m.achieved(),
        t.ms(0.5),
        t.ms(0.9),
        t.ms(0.99),
        t.ms(0.999),
        t.latency.max() as f64 / 1000.0,
        t.late
    );
    for p in &m.procs {
        let cpu = Measured::cpu_per_order_us(p, t.answered)
            .map_or("-".to_owned(), |us| format!("{us:.0}"));
        let rss = p
            .rss_bytes
            .map_or("-".to_owned(), |b| format!("{:.0}", mb(b)));
        let _ = write!(out, "{cpu:>15}{rss:>8}");
    }
    let _ = write!(out, "  {}", t.outcomes_text());
    out
}

/// A process name cut to fit a column header.
fn short(name: &str) -> &str {
    name.get(..name.len().min(7)).unwrap_or(name)
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// One JSON object (no trailing newline): `fields` (already JSON-encoded values) then the
/// measurements of `m`.
pub fn json(fields: &[(&str, String)], m: &Measured) -> String {
    let t = &m.tally;
    let mut out = String::from("{");
    for (k, v) in fields {
        let _ = write!(out, "{}:{v},", string(k));
    }
    let _ = write!(
        out,
        "\"seconds\":{:.3},\"answered\":{},\"achieved_per_s\":{:.1},\"late\":{},\
         \"p50_ms\":{:.3},\"p90_ms\":{:.3},\"p99_ms\":{:.3},\"p999_ms\":{:.3},\"max_ms\":{:.3},\
         \"errors\":{},\"error_p50_ms\":{},\"error_p99_ms\":{},",
        m.span.as_secs_f64(),
        t.answered,
        m.achieved(),
        t.late,
        t.ms(0.5),
        t.ms(0.9),
        t.ms(0.99),
        t.ms(0.999),
        t.latency.max() as f64 / 1000.0,
        t.error_latency.len(),
        number(t.error_ms(0.5)),
        number(t.error_ms(0.99)),
    );
    let outcomes: Vec<String> = t
        .outcomes
        .iter()
        .map(|(k, v)| format!("{}:{v}", string(k)))
        .collect();
    let _ = write!(out, "\"outcomes\":{{{}}},\"procs\":[", outcomes.join(","));
    let procs: Vec<String> = m
        .procs
        .iter()
        .map(|p| {
            format!(
                "{{\"name\":{},\"server\":{},\"cpu_s\":{},\"cpu_us_per_order\":{},\"rss_mb\":{}}}",
                string(&p.name),
                p.server,
                number(p.cpu.map(|c| c.as_secs_f64())),
                number(Measured::cpu_per_order_us(p, t.answered)),
                number(p.rss_bytes.map(mb)),
            )
        })
        .collect();
    let _ = write!(out, "{}]}}", procs.join(","));
    out
}

/// A JSON string literal.
pub fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON number, or `null`.
pub fn number(x: Option<f64>) -> String {
    match x {
        Some(x) if x.is_finite() => format!("{x:.3}"),
        _ => "null".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(answered: u64, cpu_ms: u64) -> Measured {
        let mut tally = Tally::new().unwrap();
        for us in 1..=answered {
            tally.latency.record(us * 10).unwrap();
        }
        tally.answered = answered;
        tally.outcomes.insert("CONFIRMED".into(), answered);
        Measured {
            tally,
            span: Duration::from_secs(1),
            procs: vec![ProcUse {
                name: "serve".into(),
                server: true,
                cpu: Some(Duration::from_millis(cpu_ms)),
                rss_bytes: Some(50 << 20),
                thread: false,
            }],
        }
    }

    /// Rounds add up: CPU per order is total CPU over total orders, not a mean of means.
    #[test]
    fn merged_rounds_divide_total_cpu_by_total_orders() {
        let mut a = measured(1000, 1000);
        a.merge(&measured(3000, 1000)).unwrap();
        assert_eq!(a.tally.answered, 4000);
        assert_eq!(a.span, Duration::from_secs(2));
        assert_eq!(a.server_cpu_per_order_us(), Some(500.0));
        assert_eq!(a.system_cpu_per_order_us(), Some(500.0));
        assert_eq!(a.achieved(), 2000.0);
        assert_eq!(a.tally.outcomes["CONFIRMED"], 4000);
    }

    /// A thread probe (serve's writer thread) is shown but not counted twice in the system's
    /// CPU: its time is already in its process's.
    #[test]
    fn a_thread_of_a_measured_process_is_not_added_to_the_system_again() {
        let mut m = measured(1000, 1000);
        m.procs.push(ProcUse {
            name: "stubs".into(),
            server: false,
            cpu: Some(Duration::from_millis(500)),
            rss_bytes: Some(30 << 20),
            thread: false,
        });
        m.procs.push(ProcUse {
            name: "writer".into(),
            server: false,
            cpu: Some(Duration::from_millis(400)),
            rss_bytes: None,
            thread: true,
        });
        assert_eq!(m.system_cpu_per_order_us(), Some(1500.0));
        assert_eq!(Measured::cpu_per_order_us(&m.procs[2], 1000), Some(400.0));
        assert!(row("serve", &m).contains("            400       -"));
    }

    #[test]
    fn json_lines_are_valid_json_with_nulls_for_unread_processes() {
        let mut m = measured(10, 5);
        m.procs[0].cpu = None;
        m.tally.outcomes.insert("error \"odd\"\n".into(), 1);
        let line = json(&[("kind", string("run"))], &m);
        assert!(line.starts_with("{\"kind\":\"run\",\"seconds\":1.000,\"answered\":10,"));
        assert!(line.contains("\"cpu_us_per_order\":null"));
        assert!(line.contains("\"error \\\"odd\\\"\\n\":1"));
        assert!(!line.contains('\n'));
        assert!(line.contains("\"errors\":0,\"error_p50_ms\":null,\"error_p99_ms\":null,"));
    }

    /// Refusals are timed apart from the orders: a caller's question is how fast it is told
    /// to go elsewhere.
    #[test]
    fn error_answers_are_timed_apart_and_shown_with_the_outcomes() {
        let mut m = measured(10, 5);
        m.tally.outcomes.insert("error ResourceExhausted".into(), 2);
        m.tally.error_latency.record(3_000).unwrap();
        m.tally.error_latency.record(20_000).unwrap();
        let line = json(&[("kind", string("run"))], &m);
        assert!(
            line.contains("\"errors\":2,\"error_p50_ms\":3.001,\"error_p99_ms\":20.015,"),
            "{line}"
        );
        assert!(
            row("serve", &m)
                .ends_with("error ResourceExhausted 2 (errors answered p50 3.0 / p99 20.0 ms)")
        );
        let mut other = measured(1, 1);
        other.tally.error_latency.record(7_000).unwrap();
        m.merge(&other).unwrap();
        assert_eq!(m.tally.error_latency.len(), 3);
    }

    #[test]
    fn rows_line_up_with_their_header() {
        let m = measured(10, 5);
        let header = header("lane", &m.procs);
        let row = row("serve", &m);
        let width = |s: &str, last: &str| s.split(last).next().map(|s| s.chars().count());
        assert_eq!(width(&header, "  outcomes"), width(&row, "  CONFIRMED"));
        assert!(header.contains("server µs/ord"));
    }
}

//! Draws a budget waterfall as a terminal bar chart: one row per step, positioned on the
//! deadline's time axis — `░` what the step was allotted, `█` what it spent.

use std::fmt::Write;
use std::time::Duration;

use checkout::proto::checkout::v1::BudgetReport;

fn ms(d: Option<&prost_types::Duration>) -> f64 {
    d.map_or(0.0, |d| {
        d.seconds as f64 * 1000.0 + f64::from(d.nanos) / 1e6
    })
}

/// Renders `report` with a bar `width` columns wide.
pub fn render(report: &BudgetReport, width: usize) -> String {
    let deadline = ms(report.deadline.as_ref()).max(1.0);
    let column = |t: f64| {
        ((t / deadline) * width as f64)
            .round()
            .clamp(0.0, width as f64) as usize
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "deadline {:.0}ms from {} · elapsed {:.1}ms · remaining at return {:.1}ms",
        deadline,
        report.deadline_source,
        ms(report.elapsed.as_ref()),
        ms(report.remaining_at_return.as_ref()),
    );
    let _ = writeln!(
        out,
        "{:<14}{:>8}{:>18}  0ms{:>w$}",
        "step",
        "offset",
        "spent / allotted",
        format!("{deadline:.0}ms"),
        w = width - 1
    );
    for step in &report.steps {
        let offset = ms(step.offset.as_ref());
        let allotted = ms(step.allotted.as_ref());
        let spent = ms(step.spent.as_ref());
        let start = column(offset);
        let allot_end = column(offset + allotted).max(start);
        let spent_end = column(offset + spent)
            .max(start + usize::from(spent > 0.0))
            .min(width);
        let bar: String = (0..width)
            .map(|i| match i {
                i if i >= start && i < spent_end => '█',
                i if i >= start && i < allot_end => '░',
                _ => ' ',
            })
            .collect();
        let _ = writeln!(
            out,
            "{:<14}{:>6.0}ms{:>8.1}ms /{:>5.0}ms  |{bar}| {}",
            step.name, offset, spent, allotted, step.outcome
        );
    }
    let elapsed = ms(report.elapsed.as_ref());
    let mark = column(elapsed).min(width.saturating_sub(1));
    let _ = writeln!(
        out,
        "{:<40}  {}^ answered at {elapsed:.1}ms",
        "",
        " ".repeat(mark)
    );
    out
}

/// A `std::time::Duration` rendered in milliseconds with one decimal.
pub fn fmt_ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use checkout::proto::checkout::v1::BudgetStep;

    fn d(ms: u64) -> Option<prost_types::Duration> {
        Some(checkout::budget::waterfall_duration(Duration::from_millis(
            ms,
        )))
    }

    #[test]
    fn bars_sit_on_the_deadline_axis() {
        let report = BudgetReport {
            deadline: d(1000),
            deadline_source: "grpc-timeout".into(),
            elapsed: d(500),
            remaining_at_return: d(500),
            steps: vec![
                BudgetStep {
                    name: "cart".into(),
                    offset: d(0),
                    allotted: d(300),
                    spent: d(100),
                    outcome: "ok".into(),
                    attempts: 1,
                    hedged: false,
                },
                BudgetStep {
                    name: "wallet_hold".into(),
                    offset: d(500),
                    allotted: d(0),
                    spent: d(0),
                    outcome: "not_sent".into(),
                    attempts: 0,
                    hedged: false,
                },
            ],
        };
        let text = render(&report, 10);
        let cart = text
            .lines()
            .find(|l| l.starts_with("cart"))
            .expect("cart row");
        assert!(cart.ends_with("|█░░       | ok"), "{cart}");
        let hold = text
            .lines()
            .find(|l| l.starts_with("wallet_hold"))
            .expect("hold row");
        assert!(hold.ends_with("|          | not_sent"), "{hold}");
        assert!(text.starts_with("deadline 1000ms from grpc-timeout"));
    }
}

//! `[hedge]`: when a hedgeable step sends a backup, and how many it may send.

use std::time::Duration;

use serde::Deserialize;

/// `[hedge]`: when a hedgeable step sends a backup.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HedgePolicy {
    /// The backup is sent once the first attempt is slower than this percentile of recent calls.
    pub percentile: f64,
    /// Backups allowed, as a percentage of first attempts over `budget_window`.
    pub max_extra_percent: f64,
    /// No hedging until the previous period holds this many latencies.
    pub min_samples: u64,
    /// How often the latency histogram rotates (the delay reflects the previous period).
    #[serde(with = "humantime_serde")]
    pub rotation: Duration,
    /// The window over which first attempts earn backups.
    #[serde(with = "humantime_serde")]
    pub budget_window: Duration,
}

impl Default for HedgePolicy {
    fn default() -> Self {
        Self {
            percentile: 95.0,
            max_extra_percent: 5.0,
            min_samples: 20,
            rotation: Duration::from_secs(10),
            budget_window: Duration::from_secs(10),
        }
    }
}

impl HedgePolicy {
    /// Checks every number against its bounds; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        let bad =
            |key: &str, value: String, rule: &str| Err(format!("hedge.{key} ({value}) {rule}"));
        if !(self.percentile >= 50.0 && self.percentile <= 99.99) {
            return bad(
                "percentile",
                self.percentile.to_string(),
                "must be 50-99.99",
            );
        }
        if !(self.max_extra_percent > 0.0 && self.max_extra_percent <= 100.0) {
            let value = self.max_extra_percent.to_string();
            return bad("max_extra_percent", value, "must be in (0, 100]");
        }
        if !(1..=100_000).contains(&self.min_samples) {
            let value = self.min_samples.to_string();
            return bad("min_samples", value, "must be 1-100000");
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(600)).contains(&self.rotation) {
            return bad("rotation", format!("{:?}", self.rotation), "must be 1s-10m");
        }
        let window = self.budget_window;
        if !(Duration::from_secs(1)..=Duration::from_secs(60)).contains(&window) {
            return bad("budget_window", format!("{window:?}"), "must be 1s-60s");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_default_policy_is_valid_and_every_bad_number_names_its_key() {
        let policy = HedgePolicy::default();
        policy.validate().expect("defaults are valid");
        let parsed: HedgePolicy = toml::from_str(
            "percentile = 95.0\nmax_extra_percent = 5.0\nmin_samples = 20\n\
             rotation = \"10s\"\nbudget_window = \"10s\"\n",
        )
        .expect("parses");
        assert_eq!(parsed, policy);
        assert!(toml::from_str::<HedgePolicy>("delay = \"5ms\"\n").is_err());
        type Spoil = fn(&mut HedgePolicy);
        let cases: [(&str, Spoil); 5] = [
            ("percentile", |p| p.percentile = 100.0),
            ("max_extra_percent", |p| p.max_extra_percent = 0.0),
            ("min_samples", |p| p.min_samples = 0),
            ("rotation", |p| p.rotation = MS),
            ("budget_window", |p| {
                p.budget_window = Duration::from_secs(120)
            }),
        ];
        for (key, spoil) in cases {
            let mut policy = HedgePolicy::default();
            spoil(&mut policy);
            let err = policy.validate().expect_err(key);
            assert!(err.starts_with(&format!("hedge.{key} ")), "{key}: {err}");
        }
    }
}

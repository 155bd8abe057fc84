//! The incidents as runnable scenarios: the quick versions of the scenarios whose protections exist
//! today pass through the library entry point, and through the real binary a scenario run
//! without its protection exits non-zero with the failed check in its table.
//!
//! Scenarios measure real timing under load, so they run one at a time (a shared lock) rather
//! than competing for the machine's two cores.

use std::process::Command;

use checkout_bench::scenario::{self, Options};

/// One scenario at a time in this process.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs the quick version of `name` with the default policy and asserts it passes.
async fn passes(name: &str) {
    let _one_at_a_time = SERIAL.lock().await;
    let report = scenario::find(name)
        .expect("a known scenario")
        .run(&Options::new(true))
        .await
        .unwrap_or_else(|e| panic!("scenario {name} could not run: {e}"));
    println!("{}", report.table());
    assert!(report.passed(), "{}", report.table());
}

/// A cart stalled past its cap calls no wallet, answers everyone in time; too little time left
/// is refused on arrival with nothing recorded or sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cart_stall_passes() {
    passes("cart-stall").await;
}

/// A hold that would commit after the caller's deadline is cut; the retry with the same key
/// replays the stored answer, and the reconciler settles it with one hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn op_834_passes() {
    passes("op-834").await;
}

/// One retry per transient capture failure (a ~2.2 % tax); a capture outage meets the retry
/// budget and loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_tax_passes() {
    passes("retry-tax").await;
}

/// A fraud timeout answers PENDING FRAUD_REVIEW and is confirmed later; a caller leaving
/// cancels every branch in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fraud_timeout_passes() {
    passes("fraud-timeout").await;
}

/// `checkout scenario list` names every scenario; an unknown name is an error.
#[test]
fn the_binary_lists_scenarios_and_refuses_unknown_ones() {
    let list = Command::new(env!("CARGO_BIN_EXE_checkout-bench"))
        .args(["scenario", "list"])
        .output()
        .expect("checkout runs");
    assert!(list.status.success(), "{list:?}");
    let text = String::from_utf8_lossy(&list.stdout);
    for s in &scenario::ALL {
        assert!(text.contains(s.name), "{} missing from:\n{text}", s.name);
    }
    let unknown = Command::new(env!("CARGO_BIN_EXE_checkout-bench"))
        .args(["scenario", "no-such-scenario"])
        .output()
        .expect("checkout runs");
    assert!(!unknown.status.success(), "{unknown:?}");
}

/// With the retry budget opened wide (and a quick backoff), the capture outage multiplies
/// retries: `retry-tax` reports the failed check and the binary exits non-zero.
#[test]
fn a_scenario_without_its_protection_fails_and_exits_non_zero() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("no-retry-budget.toml");
    std::fs::write(
        &config,
        "[retry_budget]\npercent = 1000.0\nfloor_per_second = 1000\n\n\
         [worker]\nbackoff_base = \"20ms\"\nbackoff_cap = \"200ms\"\n",
    )
    .expect("config written");
    let _one_at_a_time = SERIAL.blocking_lock();
    let run = Command::new(env!("CARGO_BIN_EXE_checkout-bench"))
        .args(["scenario", "retry-tax", "--quick", "--config"])
        .arg(&config)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("checkout runs");
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(!run.status.success(), "exited successfully:\n{text}");
    assert!(text.contains("scenario retry-tax: FAIL"), "{text}");
    let budget_row = text
        .lines()
        .find(|l| l.contains("outage: retries stop at the budget"))
        .unwrap_or_else(|| panic!("no budget row in:\n{text}"));
    assert!(budget_row.trim_end().ends_with("FAIL"), "{text}");
}

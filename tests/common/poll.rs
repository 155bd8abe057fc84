//! The one way a test waits for something to happen: fetch a state, check it, wait, again —
//! until it holds or the time allowed is over, and then fail loudly with the last state seen.
//!
//! Every test of the workspace that waits does so through [`poll_until`] (or [`poll`], when
//! the caller words the failure itself). The service's suites reach it through `common`; the
//! stubs' and the bench's tests and the library's unit tests include this file by path, and
//! `checkout-testkit` includes it as its public `poll` module (other teams' tests wait through
//! it, and so do the bench's scenarios), so there is one helper, not one per crate. It depends
//! on nothing but tokio.
//!
//! Time is tokio's clock: a test under paused time (`start_paused`) polls without sleeping,
//! the clock jumping to each next poll.

#![allow(dead_code)]

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Fetches a state every `every` until `done` holds and returns it; after `within`, panics
/// with the last state fetched: "`what` never reached the expected state within …; last
/// seen: …". The first fetch is immediate, and one is always made after the time is up.
pub async fn poll_until<T: Debug, F: Future<Output = T>>(
    what: &str,
    within: Duration,
    every: Duration,
    fetch: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    match poll(within, every, fetch, done).await {
        Ok(state) => state,
        Err(last) => {
            panic!("{what} never reached the expected state within {within:?}; last seen: {last:?}")
        }
    }
}

/// [`poll_until`] for a caller that says itself what a timeout means (a message that needs
/// more than the last state's `Debug`, or a wait whose timeout is an answer): `Ok` with the
/// state once `done` holds, `Err` with the last state fetched once `within` has passed.
pub async fn poll<T, F: Future<Output = T>>(
    within: Duration,
    every: Duration,
    mut fetch: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> Result<T, T> {
    let until = Instant::now() + within;
    loop {
        let state = fetch().await;
        if done(&state) {
            return Ok(state);
        }
        if Instant::now() >= until {
            return Err(state);
        }
        tokio::time::sleep(every).await;
    }
}

//! Golden answers: the exact bytes of every hook answer (and of the agent API's answers and the operator
//! views) for a corpus of calls, kept under `tests/golden/` one JSON-lines file per scenario. The hooks are
//! called in process through the router (`tower::ServiceExt::oneshot`), the agents through the dispatcher's
//! agent API, all against a dispatcher whose clock is pinned and moved only by the scenario. A wire change
//! fails here, showing the first call whose answer differs; `GOLDEN_BLESS=1` rewrites the files, which is
//! right only when the change is meant (tests/golden/README.md).
//!
//! Every scenario runs on tokio's current-thread runtime: with nothing else running between two calls, the
//! dispatcher's last-seen writer has always finished before the clock moves (see `harness`).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod corpus;
mod file;
mod harness;
mod operator;
mod rollout;

#[tokio::test(flavor = "current_thread")]
async fn fixtures() {
    corpus::fixtures_scenario().await;
}

#[tokio::test(flavor = "current_thread")]
async fn malformed() {
    corpus::malformed_scenario().await;
}

#[tokio::test(flavor = "current_thread")]
async fn bad_input() {
    corpus::bad_input_scenario().await;
}

#[tokio::test(flavor = "current_thread")]
async fn demo_rollout() {
    rollout::demo_rollout_scenario().await;
}

#[tokio::test(flavor = "current_thread")]
async fn drain() {
    rollout::drain_scenario().await;
}

#[tokio::test(flavor = "current_thread")]
async fn retry() {
    operator::retry_scenario().await;
}

#[tokio::test(flavor = "current_thread")]
async fn hold() {
    operator::hold_scenario().await;
}

#[tokio::test(flavor = "current_thread")]
async fn window() {
    operator::window_scenario().await;
}

#[tokio::test(flavor = "current_thread")]
async fn refusals() {
    operator::refusals_scenario().await;
}

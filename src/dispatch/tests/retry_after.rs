//! Adaptive `retryAfterSeconds` through dispatch (memory store): step durations are learned from agents'
//! reports, and UpdateMachine tells CAPI to call again about when the run is expected to end.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::dispatch::testing::*;
use crate::dispatch::*;
use inplace_agent_api::{AgentIdentity, Plan, StepReport, StepStatus};

/// How long the simulated steps take: a long `kubeadm upgrade`, a few seconds for everything else.
fn step_ms(plan: &Plan, index: usize) -> u64 {
    match plan.steps[index].action.kind() {
        "kubeadmUpgrade" => 120_000,
        _ => 4_000,
    }
}

fn report_of(
    name: &str,
    plan: &Plan,
    index: usize,
    status: StepStatus,
    started: u64,
    finished: Option<u64>,
) -> StepReport {
    StepReport {
        agent: AgentIdentity::Machine(inplace_agent_api::MachineRef::new("default", name)),
        plan_id: plan.id.clone(),
        step_index: index as u32,
        status,
        attempt: 1,
        started_at_unix_ms: Some(started),
        finished_at_unix_ms: finished,
        exit_code: finished.map(|_| 0),
        stderr_tail: None,
        message: None,
        undo: false,
        rollback: None,
    }
}

/// Records the run of `name` and hands its plan to the (now connected) agent.
async fn start(d: &Dispatcher, name: &str) -> Plan {
    update(d, &request(name, false, "v1.34.1", "hi"))
        .await
        .unwrap();
    handed_plan(d, name).await
}

/// The agent of `name` finished the steps before `index` back to back, and step `index` has run `running_ms`.
async fn at_step(d: &Dispatcher, name: &str, plan: &Plan, index: usize, running_ms: u64) {
    let started = now_ms() - running_ms;
    let mut end = started;
    for earlier in (0..index).rev() {
        let begin = end - step_ms(plan, earlier);
        let done = report_of(name, plan, earlier, StepStatus::Succeeded, begin, Some(end));
        d.agents.report(&scope(), &done).await.unwrap();
        end = begin;
    }
    if index < plan.steps.len() {
        let running = report_of(name, plan, index, StepStatus::Running, started, None);
        d.agents.report(&scope(), &running).await.unwrap();
    }
}

/// When CAPI calls again: after N seconds, or never (done).
async fn capi_waits(d: &Dispatcher, name: &str) -> Option<i32> {
    match update(d, &request(name, false, "v1.34.1", "hi"))
        .await
        .unwrap()
    {
        UpdateAnswer::InProgress {
            retry_after_seconds,
            ..
        } => Some(retry_after_seconds),
        UpdateAnswer::Done { .. } => None,
        other => panic!("{other:?}"),
    }
}

/// A dispatcher that has seen `runs` earlier Machines' updates take [`step_ms`] per step.
async fn learned(runs: usize, config: DispatchConfig) -> Arc<Dispatcher> {
    let d = Dispatcher::new(memory().await, config, CancellationToken::new());
    tokio::spawn(d.agents.clone().follow_changes());
    for k in 0..runs {
        let name = format!("warm-{k}");
        let plan = start(&d, &name).await;
        at_step(&d, &name, &plan, plan.steps.len(), 0).await;
        assert_eq!(capi_waits(&d, &name).await, None);
    }
    d
}

#[tokio::test]
async fn capi_is_told_to_call_about_when_the_run_ends() {
    let d = learned(10, DispatchConfig::default()).await;
    let plan = start(&d, "m-1").await;
    let last = plan.steps.len() - 1;
    let upgrade = plan
        .steps
        .iter()
        .position(|s| s.action.kind() == "kubeadmUpgrade")
        .expect("a version change upgrades with kubeadm");
    assert!(upgrade < last, "{plan:?}");

    let max = DEFAULT_RETRY_AFTER_MAX_SECONDS;
    // Plan handed to a connected agent, nothing started: minutes ahead, the longest answer.
    assert_eq!(capi_waits(&d, "m-1").await, Some(max));
    // 10 s into a 120 s kubeadm upgrade: longer than the fixed 5 s, at most the maximum.
    at_step(&d, "m-1", &plan, upgrade, 10_000).await;
    let during_upgrade = capi_waits(&d, "m-1").await.unwrap();
    assert!(
        during_upgrade > DEFAULT_RETRY_AFTER_SECONDS && during_upgrade <= max,
        "{during_upgrade}"
    );
    // The last step (4 s) has run 1 s: expected to end in 3 s, so CAPI calls within 3 s.
    at_step(&d, "m-1", &plan, last, 1_000).await;
    let near_end = capi_waits(&d, "m-1").await.unwrap();
    assert!(
        (MIN_RETRY_AFTER_SECONDS..=3).contains(&near_end),
        "{near_end}"
    );
}

#[tokio::test]
async fn an_overrun_is_asked_about_every_second_and_a_done_run_never_again() {
    let d = learned(10, DispatchConfig::default()).await;
    let plan = start(&d, "m-1").await;
    let last = plan.steps.len() - 1;
    // The last step (4 s) has run 6 s: past its expected end.
    at_step(&d, "m-1", &plan, last, 6_000).await;
    assert_eq!(capi_waits(&d, "m-1").await, Some(1));
    let end = now_ms();
    let done = report_of(
        "m-1",
        &plan,
        last,
        StepStatus::Succeeded,
        end - 6_000,
        Some(end),
    );
    d.agents.report(&scope(), &done).await.unwrap();
    assert_eq!(
        capi_waits(&d, "m-1").await,
        None,
        "done: retryAfterSeconds 0"
    );
}

#[tokio::test]
async fn unlearned_steps_and_fixed_mode_answer_the_fixed_seconds() {
    // A fresh replica has seen no step: its guesses never make CAPI wait longer than the fixed answer.
    let fresh = dispatcher(memory().await);
    let plan = start(&fresh, "m-1").await;
    assert_eq!(
        capi_waits(&fresh, "m-1").await,
        Some(DEFAULT_RETRY_AFTER_SECONDS)
    );
    let upgrade = plan
        .steps
        .iter()
        .position(|s| s.action.kind() == "kubeadmUpgrade")
        .unwrap();
    at_step(&fresh, "m-1", &plan, upgrade, 10_000).await;
    assert_eq!(
        capi_waits(&fresh, "m-1").await,
        Some(DEFAULT_RETRY_AFTER_SECONDS)
    );

    // `--retry-after fixed` answers the fixed seconds whatever was learned, near the end too.
    let fixed = learned(
        10,
        DispatchConfig {
            retry_after: RetryAfterMode::Fixed,
            retry_after_seconds: 7,
            ..DispatchConfig::default()
        },
    )
    .await;
    let plan = start(&fixed, "m-1").await;
    assert_eq!(capi_waits(&fixed, "m-1").await, Some(7));
    at_step(&fixed, "m-1", &plan, plan.steps.len() - 1, 3_000).await;
    assert_eq!(capi_waits(&fixed, "m-1").await, Some(7));
}

#[tokio::test]
async fn waiting_for_an_agent_that_is_not_connected_keeps_the_fixed_pace() {
    let d = learned(10, DispatchConfig::default()).await;
    // No agent of m-1 ever polled.
    update(&d, &request("m-1", false, "v1.34.1", "hi"))
        .await
        .unwrap();
    assert_eq!(
        capi_waits(&d, "m-1").await,
        Some(DEFAULT_RETRY_AFTER_SECONDS)
    );
}

//! The demo's rollout (three control-plane Machines one by one, then two workers of one MachineSet, agents
//! polling and reporting every step while the clock moves) and drain runs (progress, failure, the
//! exclude-node-draining annotation, a patch version with and without `drainPatchVersion`).

use inplace_agent_api::StepStatus;
use inplace_updater::api::Hook;
use serde_json::{Value, json};

use super::harness::{Agent, Failure, Golden};
use crate::common::fleet::{can_update_before, can_update_request, update_request};
use crate::e2e_rollout::{CONTROL_PLANE, WORKERS};
use crate::hooks_malformed::fixture;

/// How long each kind of step takes on the simulated nodes (seconds), so learned durations differ.
fn step_seconds(kind: &str) -> u64 {
    match kind {
        "drainNode" => 24,
        "kubeadmUpgrade" => 40,
        "installKubeadm" | "installKubelet" => 9,
        "waitNodeReady" => 12,
        _ => 4,
    }
}

/// `request` with the Machine annotation `key: value` (`None`: without it).
pub fn annotated(request: &Value, key: &str, value: Option<&str>) -> Value {
    let mut request = request.clone();
    let annotations = &mut request["desired"]["machine"]["metadata"]["annotations"];
    if !annotations.is_object() {
        *annotations = json!({});
    }
    let annotations = annotations.as_object_mut().unwrap();
    match value {
        Some(value) => {
            annotations.insert(key.into(), json!(value));
        }
        None => {
            annotations.remove(key);
        }
    }
    request
}

/// The running step's `step i/n` label part.
fn at(agent: &Agent) -> String {
    format!("step {}/{}", agent.done + 1, agent.total())
}

/// The agent runs its plan's next step to success: running, UpdateMachine while it runs (with the
/// agent's progress text for drains), succeeded, UpdateMachine again. The clock moves by the step's time.
pub async fn run_step(golden: &mut Golden, who: &str, agent: &mut Agent, update: &Value) {
    let step = &agent.plan.as_ref().unwrap().steps[agent.done as usize];
    let (kind, at) = (step.action.kind(), at(agent));
    golden.running(&format!("{who} {at} running"), agent).await;
    golden.advance(step_seconds(kind) / 2);
    golden
        .hook(
            &format!("{who} {at} running: UpdateMachine"),
            Hook::UpdateMachine,
            update,
        )
        .await;
    if kind == "drainNode" {
        golden
            .step(
                &format!("{who} {at} draining"),
                agent,
                StepStatus::Running,
                None,
                Some("draining: 2 pods left, waiting on PodDisruptionBudget default/web"),
            )
            .await;
        golden.advance(1);
        golden
            .hook(
                &format!("{who} {at} draining: UpdateMachine"),
                Hook::UpdateMachine,
                update,
            )
            .await;
    }
    golden.advance(step_seconds(kind) - step_seconds(kind) / 2);
    golden
        .succeeded(&format!("{who} {at} succeeded"), agent)
        .await;
    golden.advance(1);
    golden
        .hook(
            &format!("{who} {at} succeeded: UpdateMachine"),
            Hook::UpdateMachine,
            update,
        )
        .await;
}

/// UpdateMachine until the agent has its plan, then every remaining step, then the Done answer (twice:
/// CAPI may ask again).
pub async fn update_to_done(golden: &mut Golden, who: &str, agent: &mut Agent, update: &Value) {
    golden
        .hook(&format!("{who} UpdateMachine"), Hook::UpdateMachine, update)
        .await;
    golden.advance(2);
    golden
        .hook(
            &format!("{who} UpdateMachine before the agent polls"),
            Hook::UpdateMachine,
            update,
        )
        .await;
    golden.poll(&format!("{who} poll: the plan"), agent).await;
    finish_run(golden, who, agent, update).await;
}

/// Every remaining step of the agent's plan, then the Done answer twice and the agent's last poll.
pub async fn finish_run(golden: &mut Golden, who: &str, agent: &mut Agent, update: &Value) {
    while !agent.finished() {
        run_step(golden, who, agent, update).await;
    }
    golden
        .hook(&format!("{who} done"), Hook::UpdateMachine, update)
        .await;
    golden.advance(3);
    golden
        .hook(
            &format!("{who} done, asked again"),
            Hook::UpdateMachine,
            update,
        )
        .await;
    golden
        .poll(&format!("{who} poll after the run"), agent)
        .await;
}

/// The demo: agents start (inventory, first poll), then CanUpdateMachine and UpdateMachine for each
/// control-plane Machine one by one (the first claims `kubeadm upgrade apply`), CanUpdateMachineSet once
/// and UpdateMachine for each worker; an agent restart mid-run (inventory with its progress) and a report
/// sent twice.
pub async fn demo_rollout_scenario() {
    let mut golden = Golden::new("demo_rollout");
    let names: Vec<&str> = CONTROL_PLANE
        .iter()
        .chain(WORKERS.iter())
        .copied()
        .collect();
    let mut agents: Vec<Agent> = names.iter().map(|name| Agent::machine(name)).collect();
    for (name, agent) in names.iter().zip(agents.iter_mut()) {
        golden
            .inventory(&format!("{name} inventory"), agent, "v1.33.4")
            .await;
        golden.poll(&format!("{name} first poll"), agent).await;
        golden.advance(1);
    }
    golden.advance(5);
    golden.operator_views("before the rollout").await;
    for (i, name) in CONTROL_PLANE.iter().enumerate() {
        let question = can_update_request("can-update-machine-kcp-version.json", name);
        golden.judge(name, &question).await;
        let update = update_request("update-machine-kcp.json", name);
        let agent = &mut agents[i];
        if i == 0 {
            // The first one shows a restart of its agent mid-run and a report the server sees twice.
            golden
                .hook(
                    &format!("{name} UpdateMachine"),
                    Hook::UpdateMachine,
                    &update,
                )
                .await;
            golden.poll(&format!("{name} poll: the plan"), agent).await;
            run_step(&mut golden, name, agent, &update).await;
            golden
                .inventory(
                    &format!("{name} inventory after a restart"),
                    agent,
                    "v1.33.4",
                )
                .await;
            golden
                .running(&format!("{name} step 2 running"), agent)
                .await;
            golden.advance(2);
            golden
                .running(&format!("{name} step 2 running, sent again"), agent)
                .await;
            golden
                .operator_views(&format!("{name} step 2 running"))
                .await;
            finish_run(&mut golden, name, agent, &update).await;
        } else {
            update_to_done(&mut golden, name, agent, &update).await;
        }
        golden.advance(10);
    }
    golden
        .hook(
            "MachineSet CanUpdateMachineSet",
            Hook::CanUpdateMachineSet,
            &fixture("can-update-machineset-md.json"),
        )
        .await;
    for (i, name) in WORKERS.iter().enumerate() {
        let update = update_request("update-machine-worker.json", name);
        update_to_done(
            &mut golden,
            name,
            &mut agents[CONTROL_PLANE.len() + i],
            &update,
        )
        .await;
        golden.advance(10);
    }
    for (name, agent) in names.iter().zip(agents.iter_mut()) {
        golden
            .inventory(
                &format!("{name} inventory after the rollout"),
                agent,
                "v1.34.1",
            )
            .await;
    }
    golden.advance(120);
    golden.operator_views("after the rollout").await;
    golden.finish();
}

/// Drains: a minor upgrade whose drain reports progress and then fails (and a retry that drains again);
/// a Machine annotated exclude-node-draining; a patch version change, drained by default and not with
/// `drainPatchVersion: "false"`.
pub async fn drain_scenario() {
    const EXCLUDE: &str = "machine.cluster.x-k8s.io/exclude-node-draining";
    let mut golden = Golden::new("drain");
    let [failing, excluded, patch] = CONTROL_PLANE;

    let update = update_request("update-machine-kcp.json", failing);
    golden
        .judge(failing, &can_update_before(&update, "v1.33.4"))
        .await;
    let mut agent = Agent::machine(failing);
    golden
        .hook(
            &format!("{failing} UpdateMachine"),
            Hook::UpdateMachine,
            &update,
        )
        .await;
    golden
        .poll(&format!("{failing} poll: the plan"), &mut agent)
        .await;
    while agent.plan.as_ref().unwrap().steps[agent.done as usize]
        .action
        .kind()
        != "drainNode"
    {
        run_step(&mut golden, failing, &mut agent, &update).await;
    }
    let drain = at(&agent);
    golden
        .running(&format!("{failing} {drain} running"), &mut agent)
        .await;
    for (i, progress) in [
        "cordoned; evicting 3 pods",
        "draining: 1 pod left, waiting on PodDisruptionBudget default/web (4 evictions refused)",
    ]
    .iter()
    .enumerate()
    {
        golden.advance(30);
        golden
            .step(
                &format!("{failing} {drain} progress {i}"),
                &mut agent,
                StepStatus::Running,
                None,
                Some(progress),
            )
            .await;
        golden
            .hook(
                &format!("{failing} {drain} progress {i}: UpdateMachine"),
                Hook::UpdateMachine,
                &update,
            )
            .await;
    }
    golden.advance(540);
    golden
        .step(
            &format!("{failing} {drain} failed"),
            &mut agent,
            StepStatus::Failed,
            Some(Failure {
                exit_code: None,
                stderr_tail: None,
                message: "pod default/web-0 not evicted within 600s: PodDisruptionBudget default/web \
                          allows no disruption",
            }),
            None,
        )
        .await;
    golden
        .hook(
            &format!("{failing} drain failed: UpdateMachine"),
            Hook::UpdateMachine,
            &update,
        )
        .await;
    golden.operator_views("after the drain failure").await;
    golden.advance(300);
    let retry = annotated(&update, "inplace-updater.dev/retry", Some("budget-raised"));
    golden
        .hook(&format!("{failing} retry"), Hook::UpdateMachine, &retry)
        .await;
    golden
        .poll(&format!("{failing} poll: the retried plan"), &mut agent)
        .await;
    finish_run(
        &mut golden,
        &format!("{failing} retried"),
        &mut agent,
        &retry,
    )
    .await;

    // exclude-node-draining on the Machine: CanUpdateMachine says so, and the plan has no drain.
    let update = annotated(
        &update_request("update-machine-kcp.json", excluded),
        EXCLUDE,
        Some(""),
    );
    let mut question = can_update_before(&update, "v1.33.4");
    question["current"]["machine"]["metadata"]["annotations"][EXCLUDE] = json!("");
    golden.judge(excluded, &question).await;
    let mut agent = Agent::machine(excluded);
    update_to_done(&mut golden, excluded, &mut agent, &update).await;

    // A patch version: drained by default; `drainPatchVersion: "false"` plans no drain.
    for (label, settings) in [
        ("patch", json!(null)),
        (
            "patch, drainPatchVersion=false",
            json!({ "drainPatchVersion": "false" }),
        ),
    ] {
        golden.fresh();
        let mut update = update_request("update-machine-kcp.json", patch);
        update["desired"]["machine"]["spec"]["version"] = json!("v1.34.2");
        let mut question = can_update_before(&update, "v1.34.1");
        if !settings.is_null() {
            update["settings"] = settings.clone();
            question["settings"] = settings;
        }
        golden.judge(label, &question).await;
        let mut agent = Agent::machine(patch);
        update_to_done(&mut golden, label, &mut agent, &update).await;
    }
    golden.operator_views("after the patch runs").await;
    golden.finish();
}

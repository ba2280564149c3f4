//! The bodies of the cargo-fuzz targets in `fuzz/`: each `fuzz/fuzz_targets/<target>.rs` calls the function
//! of the same name here, and `tests/integration/hostile.rs` replays every kept input in `tests/fuzz-regressions/<target>/`
//! through it, so plain `cargo test` runs exactly the code the fuzzer ran. Each function feeds arbitrary bytes
//! to the decoders that take network or file input, through the same functions the server and CLI use, and
//! must return without panicking whatever the bytes are.

use std::sync::LazyLock;

use inplace_agent_api::{
    AckResponse, ErrorResponse, InventoryReport, KubeadmUpgradeMode, Plan, PlanProgress,
    PollRequest, PollResponse, StepReport, validate_plan, validate_report,
};
use inplace_core::Policy;

use crate::api::{
    CanUpdateMachineRequest, CanUpdateMachineSetRequest, UpdateMachineRequest, decode_request,
};
use crate::cmd::diff::{PackedInputs, render_json, render_text};
use crate::dispatch::floor::keys::valid_segment;
use crate::dispatch::floor::run::UpdateRecord;
use crate::dispatch::{node_change_of, plan_for};
use crate::hooks::{Engine, can_update_machine, can_update_machine_set, update_request};
use crate::server::decode_agent_body;

/// A target's body: takes any bytes, must return without panicking.
pub type TargetBody = fn(&[u8]);

/// Every target: its name (the `fuzz/` binary and the regression directory) and its body.
pub const TARGETS: [(&str, TargetBody); 5] = [
    ("hook_request", hook_request),
    ("agent_api", agent_api),
    ("policy_yaml", policy_yaml),
    ("token_file", token_file),
    ("diff_inputs", diff_inputs),
];

static ENGINE: LazyLock<Engine> = LazyLock::new(Engine::in_memory);

/// Hook request bodies as CAPI (or anyone who reaches the hook port) sends them: each decoder (which runs
/// every object through [`crate::api::validate`]), then the full CanUpdateMachine / CanUpdateMachineSet hooks
/// (their one path, [`crate::hooks::Question::decide`]: diff, policy, patch, self-check), and UpdateMachine up to the store: settings, Machine facts and allowed
/// actions ([`update_request`]) — asserting that the Machine validation let through has a name agents accept
/// — then the plan it would record and its validation ([`plan_for`], for both kubeadm upgrade modes), and the
/// verdict fingerprints of the desired objects.
pub fn hook_request(data: &[u8]) {
    let _ = decode_request::<CanUpdateMachineRequest>(data);
    let _ = decode_request::<CanUpdateMachineSetRequest>(data);
    if let Ok(request) = decode_request::<UpdateMachineRequest>(data)
        && let Ok(update) = update_request(&ENGINE.policy, request)
    {
        // What validation promises: a Machine it lets through can be recorded and served to its agent.
        let machine = &update.desired.facts.machine;
        assert!(
            valid_segment(&machine.namespace) && valid_segment(&machine.name),
            "validation let through a Machine no agent can be given: {machine}"
        );
        // Unjudged: every allowed action is planned, so every field a plan reads is decoded.
        let change = node_change_of(&update, None);
        let _ = plan_for(&update, KubeadmUpgradeMode::Node, &change);
        let _ = plan_for(&update, KubeadmUpgradeMode::Apply, &change);
    }
    let _ = can_update_machine(&ENGINE, data);
    let _ = can_update_machine_set(&ENGINE, data);
    verdict_prints(data);
}

/// The verdict check's normalisation and fingerprints over whatever desired objects the body carries, read
/// as a Machine's objects and as templates.
fn verdict_prints(data: &[u8]) {
    use inplace_core::verdict::{CheckMode, Desired, Normalized, check};
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let side = &body["desired"];
    let first = |names: [&str; 2]| names.iter().find_map(|name| side.get(name));
    let objects = inplace_core::Objects {
        machine: first(["machine", "machineSet"]),
        bootstrap: first(["bootstrapConfig", "bootstrapConfigTemplate"]),
        infra: first(["infrastructureMachine", "infrastructureMachineTemplate"]),
    };
    for scope in [inplace_core::Scope::Object, inplace_core::Scope::Template] {
        let desired = Desired::new(Normalized::of(scope, &objects));
        for mode in [CheckMode::Exact, CheckMode::TemplateSubset] {
            let _ = check(&desired.prints, &desired, mode);
        }
    }
}

/// The run agent reports and progress are folded into: three steps, id `3f2a` as in the agent_api seeds.
const RUN_PLAN_JSON: &str = r#"{"id": "3f2a", "machine": {"namespace": "default", "name": "cp-0"},
 "cluster": "prod", "steps": [
 {"index": 0, "description": "install kubeadm v1.34.1", "timeoutSeconds": 600,
  "action": {"kind": "installKubeadm", "version": "v1.34.1"}},
 {"index": 1, "description": "kubeadm upgrade apply", "timeoutSeconds": 900,
  "action": {"kind": "kubeadmUpgrade", "version": "v1.34.1", "mode": "apply"}},
 {"index": 2, "description": "ntp", "timeoutSeconds": 60,
  "action": {"kind": "ntp", "servers": ["pool.ntp.org"], "enabled": true}}]}"#;

static RUN_PLAN: LazyLock<Option<Plan>> =
    LazyLock::new(|| serde_json::from_str::<Plan>(RUN_PLAN_JSON).ok());

fn fold_progress(progress: &PlanProgress) {
    if let Some(plan) = RUN_PLAN.as_ref() {
        let mut run = UpdateRecord::new(plan.clone(), 1);
        let _ = run.agent_needs_plan(Some(progress));
        let _ = run.apply_progress(progress, 2);
        let _ = run.outcome();
        let _ = run.agent_needs_plan(Some(progress));
    }
}

/// Agent API bodies, both directions. Server side: what an agent posts to `/agent/v1/{poll,report,inventory}`,
/// decoded as the routes decode it ([`decode_agent_body`]), validated, and folded into a recorded run the way
/// dispatch does (`apply_report`, `apply_progress`, `agent_needs_plan`). Agent side: the poll response
/// (decoded, then its plan validated before anything runs) and the server's error and ack bodies.
pub fn agent_api(data: &[u8]) {
    if let Ok(poll) = decode_agent_body::<PollRequest>(data)
        && let Some(progress) = &poll.current
    {
        fold_progress(progress);
    }
    if let Ok(inventory) = decode_agent_body::<InventoryReport>(data)
        && let Some(progress) = &inventory.current
    {
        fold_progress(progress);
    }
    if let Ok(report) = decode_agent_body::<StepReport>(data)
        && validate_report(&report).is_ok()
        && let Some(plan) = RUN_PLAN.as_ref()
    {
        let mut run = UpdateRecord::new(plan.clone(), 1);
        // Twice: the second is the at-least-once repeat.
        let _ = run.apply_report(&report, 2);
        let _ = run.apply_report(&report, 3);
        let _ = run.outcome();
    }
    if let Ok(PollResponse {
        plan: Some(plan), ..
    }) = serde_json::from_slice::<PollResponse>(data)
    {
        let _ = validate_plan(&plan);
    }
    let _ = serde_json::from_slice::<ErrorResponse>(data);
    let _ = serde_json::from_slice::<AckResponse>(data);
}

/// The policy file (`serve --policy`, `policy check`, `diff --policy`): any text gives a policy or an error.
pub fn policy_yaml(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Policy::from_yaml(text);
    }
}

/// The agent token file (`--agent-tokens`): any text gives entries or an error naming the line.
pub fn token_file(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::dispatch::upkeep::tokens::parse_token_file("fuzz", text);
    }
}

/// `inplace-updater diff`'s inputs packed as [`PackedInputs`] (`CURRENT[\0DESIRED[\0SETTINGS]]`), through the
/// CLI's own path ([`crate::cmd::diff::decide_inputs`] with the built-in policy, which decides through the
/// hooks' [`crate::hooks::Question::decide`]), then both renderings.
/// Non-UTF-8 input is skipped: the CLI refuses such a file before parsing it.
pub fn diff_inputs(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(report) = PackedInputs::unpack(text).decide(&ENGINE.policy) {
        let _ = render_text(&report);
        let _ = render_json(&report);
    }
}

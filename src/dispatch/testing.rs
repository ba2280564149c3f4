//! What dispatch's tests share: a dispatcher over the in-memory store, UpdateMachine requests, the CanUpdate
//! verdict CAPI would have recorded first, agent polls and reports.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use inplace_agent_api::{
    AgentIdentity, Hold, MachineRef, Plan, PlanProgress, PlanStatus, PollRequest, StepReport,
    StepStatus,
};
use inplace_core::plan::PlanInputs;
use inplace_core::{Action, DesiredMachine};
use inplace_store::{EtcdOptions, Store, StoreUrl};
use serde_json::json;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

pub(crate) use super::licence::VERDICT_REFRESH;
pub(crate) use inplace_core::knobs::*;

use super::floor::keys::machine_verdict_key;
use super::*;

pub(crate) async fn memory() -> Arc<dyn Store> {
    inplace_store::open(&StoreUrl::Memory, &EtcdOptions::default())
        .await
        .unwrap()
}

pub(crate) fn dispatcher(store: Arc<dyn Store>) -> Arc<Dispatcher> {
    let dispatcher = Dispatcher::new(store, DispatchConfig::default(), CancellationToken::new());
    tokio::spawn(dispatcher.agents.clone().follow_changes());
    dispatcher
}

pub(crate) fn request(name: &str, control_plane: bool, version: &str, motd: &str) -> UpdateRequest {
    let mut labels = json!({ "cluster.x-k8s.io/cluster-name": "edge-01" });
    if control_plane {
        labels["cluster.x-k8s.io/control-plane"] = json!("");
    }
    let machine = json!({
        "metadata": { "name": name, "namespace": "default", "labels": labels },
        "spec": { "clusterName": "edge-01", "version": version }
    });
    let bootstrap = json!({ "spec": { "files": [ { "path": "/etc/motd", "content": motd } ] } });
    request_of(&machine, &bootstrap)
}

/// UpdateMachine for these desired Machine and bootstrap objects, allowed to change the version and files.
pub(crate) fn request_of(
    machine: &serde_json::Value,
    bootstrap: &serde_json::Value,
) -> UpdateRequest {
    request_with(
        machine,
        bootstrap,
        &[Action::KubernetesVersion, Action::Files],
    )
}

/// UpdateMachine for these desired Machine and bootstrap objects, allowed `actions`.
pub(crate) fn request_with(
    machine: &serde_json::Value,
    bootstrap: &serde_json::Value,
    actions: &[Action],
) -> UpdateRequest {
    UpdateRequest {
        bootstrap: Some(text(bootstrap)),
        infra: None,
        paused_setting: None,
        on_failure_setting: None,
        inputs: PlanInputs {
            actions: actions.iter().copied().collect::<BTreeSet<_>>(),
            ..PlanInputs::default()
        },
        window: None,
        ..with_machine(&blank(), machine.clone())
    }
}

fn text(value: &serde_json::Value) -> Box<RawValue> {
    RawValue::from_string(value.to_string()).unwrap()
}

fn blank() -> UpdateRequest {
    let machine =
        json!({"metadata": {"name": "m", "namespace": "default"}, "spec": {"clusterName": "c"}});
    UpdateRequest {
        desired: DesiredMachine::of(&machine).unwrap(),
        machine_text: text(&machine),
        machine,
        bootstrap: None,
        infra: None,
        inputs: PlanInputs::default(),
        window: None,
        paused_setting: None,
        on_failure_setting: None,
        pacing: Default::default(),
        keep_guard_past_deadline: false,
        hashed: Default::default(),
    }
}

/// `request` with another desired Machine (everything else as it was).
pub(crate) fn with_machine(request: &UpdateRequest, machine: serde_json::Value) -> UpdateRequest {
    UpdateRequest {
        desired: DesiredMachine::of(&machine).unwrap(),
        machine_text: text(&machine),
        machine,
        hashed: Default::default(),
        ..request.clone()
    }
}

/// What CAPI does before UpdateMachine: CanUpdateMachine judged the request's desired objects in place.
pub(crate) async fn judge_in_place(d: &Dispatcher, request: &UpdateRequest) {
    let record = verdict_for(request, true);
    d.licences
        .record_verdict(
            &machine_verdict_key(&request.desired.facts.machine),
            &record,
        )
        .await
        .unwrap();
}

/// A CanUpdateMachine verdict on the request's desired objects.
pub(crate) fn verdict_for(request: &UpdateRequest, in_place: bool) -> VerdictRecord {
    let parse = |raw: &RawValue| serde_json::from_str::<serde_json::Value>(raw.get()).unwrap();
    let machine = request.machine.clone();
    let bootstrap = request.bootstrap.as_deref().map(parse);
    let infra = request.infra.as_deref().map(parse);
    let normalized = inplace_core::verdict::Normalized::of(
        inplace_core::Scope::Object,
        &inplace_core::Objects {
            machine: Some(&machine),
            bootstrap: bootstrap.as_ref(),
            infra: infra.as_ref(),
        },
    );
    let prints = normalized.prints();
    VerdictRecord {
        hook: VerdictHook::CanUpdateMachine,
        object: request.desired.facts.machine.to_string(),
        judged_ms: now_ms(),
        in_place,
        accepted: vec![],
        rejected: if in_place {
            vec![]
        } else {
            vec!["KubeadmConfig spec.diskSetup".into()]
        },
        rejected_total: usize::from(!in_place),
        template_hash: None,
        // What these requests move: every action they allow (the version's packages and the motd, or the OS
        // image). The size of a version change is left `None`, so these plans do not drain (tests/drain.rs
        // judges its own changes).
        node_change: Some(inplace_core::drain::NodeChange {
            version: inplace_core::drain::VersionChange::None,
            actions: request.inputs.actions.clone(),
        }),
        fingerprint: prints.fingerprint(),
        prints,
    }
}

/// CanUpdate first, as CAPI does, then UpdateMachine.
pub(crate) async fn update(
    d: &Dispatcher,
    request: &UpdateRequest,
) -> Result<UpdateAnswer, DispatchError> {
    judge_in_place(d, request).await;
    d.runs.update_machine(request).await
}

pub(crate) fn scope() -> AgentScope {
    AgentScope::Cluster {
        namespace: "default".into(),
        cluster: "edge-01".into(),
    }
}

pub(crate) fn poll_for(name: &str, wait_seconds: u32) -> PollRequest {
    PollRequest {
        agent: AgentIdentity::Machine(MachineRef::new("default", name)),
        current: None,
        wait_seconds,
        facts: None,
    }
}

pub(crate) fn report(name: &str, plan: &str, index: u32, status: StepStatus) -> StepReport {
    StepReport {
        agent: AgentIdentity::Machine(MachineRef::new("default", name)),
        plan_id: plan.into(),
        step_index: index,
        status,
        attempt: 1,
        started_at_unix_ms: Some(1),
        finished_at_unix_ms: Some(2),
        exit_code: (status == StepStatus::Failed).then_some(1),
        stderr_tail: (status == StepStatus::Failed).then(|| "[ERROR] kubeadm says no".to_string()),
        message: None,
        undo: false,
        rollback: None,
    }
}

/// A poll of Machine `default/<name>`'s agent saying where it is in `plan`: `status`, `succeeded` steps done,
/// `hold` confirmed.
pub(crate) fn poll_with_progress(
    name: &str,
    plan: &Plan,
    status: PlanStatus,
    succeeded: u32,
    hold: Option<Hold>,
) -> PollRequest {
    PollRequest {
        current: Some(PlanProgress {
            plan_id: plan.id.clone(),
            status,
            succeeded_steps: succeeded,
            total_steps: plan.steps.len() as u32,
            failed_step: None,
            hold,
            rollback: None,
        }),
        ..poll_for(name, 0)
    }
}

/// The plan the agent of Machine `default/<name>` is handed on its next poll.
pub(crate) async fn handed_plan(d: &Dispatcher, name: &str) -> Plan {
    d.agents
        .poll(&scope(), &poll_for(name, 0))
        .await
        .unwrap()
        .plan
        .expect("a plan for the agent")
}

/// The agent of Machine `default/<name>` reports `status` for each step of `indices` of plan `plan`.
pub(crate) async fn agent_reports(
    d: &Dispatcher,
    name: &str,
    plan: &str,
    indices: impl IntoIterator<Item = u32>,
    status: StepStatus,
) {
    for index in indices {
        d.agents
            .report(&scope(), &report(name, plan, index, status))
            .await
            .unwrap();
    }
}

//! Desired node state: turns the desired Machine ([`MachineFacts`]) and bootstrap config
//! ([`KubeadmConfigView`]) of an UpdateMachine call, the actions the policy lets this updater perform and what
//! the change moves ([`NodeChange`]), into an ordered list of declarative agent steps with a stable id (a hash
//! of exactly what the agent will converge to). Pure: no I/O, no clock.
//!
//! A plan holds the steps of what the change moves: an action's steps only when the change does that action
//! (a one-file change plans `files`, never `kubeadm upgrade` at the version the node already runs). Each step
//! is the whole desired state of its domain (every managed file, every key of a user), which the agent's
//! drivers converge idempotently. UpdateMachine carries no current state: what moved is what the CanUpdate
//! verdict that accepted this desired state judged; where nobody judged it ([`NodeChange::unknown`]) every
//! allowed action is planned, and the agent passes over a step whose target the node already has.
//!
//! When [`crate::drain`] decided the node is drained, the plan gets three node steps around the steps that
//! restart kubelet or control-plane static pods: `drainNode` right before the first of them (after
//! `kubeadmUpgrade`), then `waitNodeReady` (with the target kubelet version when the version changes: CAPI
//! keeps the Machine `UpToDate=False` until the Node reports it) and `uncordonNode` last. A plan without a
//! drain is exactly what it was before drains existed, id included.

mod error;
mod facts;
mod inputs;
mod lines;
mod steps;
pub mod view;

use inplace_agent_api::{Plan, Step, StepAction, Undo};
use sha2::{Digest as _, Sha256};

use crate::drain::Drain;
pub use error::PlanError;
pub use facts::MachineFacts;
pub use inputs::{PlanInput, PlanInputs, Switches};
pub use lines::LinesError;
use steps::BUILDERS;
use steps::builder::{Context, Draft};
pub use view::KubeadmConfigView;

/// What the description of a step a rollback does not undo ends with (`kubeadm upgrade`, see the step-kind
/// table's `undo` column).
pub const POINT_OF_NO_RETURN: &str = "[point of no return]";

/// Whether the plan does `action`: the settings allow it and the change moves it.
fn moved(input: &PlanInput<'_>, action: crate::Action) -> bool {
    input.inputs.actions.contains(&action) && input.change.actions.contains(&action)
}

/// Whether a step restarts kubelet or a control-plane static pod: the steps a drain goes before.
fn disturbs_kubelet(action: &StepAction) -> bool {
    matches!(
        action,
        StepAction::InstallKubelet { .. }
            | StepAction::ContainerRuntime { .. }
            | StepAction::EtcdImage { .. }
            | StepAction::KubeletArgs { .. }
            | StepAction::OsImage { .. }
            | StepAction::Reboot { .. }
    )
}

/// Builds the plan: each step builder of an action the settings allow and the change moves, in the builders'
/// order (node-local config first, then the Kubernetes upgrade, then what the upgrade would overwrite: the
/// etcd image and kubelet flags); with a drain, the node steps around the steps that restart kubelet; and an
/// id hashing all of it.
pub fn build(input: &PlanInput<'_>) -> Result<Plan, PlanError> {
    let running: Vec<_> = BUILDERS
        .iter()
        .filter(|builder| builder.action.is_none_or(|action| moved(input, action)))
        .collect();
    let view = match input.bootstrap {
        Some(text) if running.iter().any(|builder| builder.reads_bootstrap) => {
            Some(KubeadmConfigView::decode(text)?)
        }
        _ => None,
    };
    let cx = Context {
        input,
        spec: view.as_ref().and_then(|b| b.spec.as_ref()),
    };
    let mut drafts = Vec::new();
    for builder in running {
        let built = (builder.build)(&cx)?;
        debug_assert!(
            (built.iter()).all(|d| builder.kinds.contains(&d.action.step_kind())),
            "a step builder built a kind it does not list"
        );
        drafts.extend(built);
    }
    if let Some(drain) = &input.drain {
        add_node_steps(&mut drafts, drain, input);
    }

    let steps: Vec<Step> = drafts
        .into_iter()
        .enumerate()
        .map(|(index, draft)| Step {
            index: index as u32,
            // A rollback stops before a point of no return (the step-kind table says which): the plan says so.
            description: if draft.action.step_kind().undo() == Undo::NoReturn {
                format!("{} {POINT_OF_NO_RETURN}", draft.description)
            } else {
                draft.description
            },
            timeout_seconds: draft.timeout_seconds,
            action: draft.action,
        })
        .collect();
    let mut plan = Plan {
        id: String::new(),
        machine: input.facts.machine.clone(),
        cluster: input.facts.cluster.clone(),
        steps,
        control_plane: input.facts.control_plane,
    };
    plan.id = plan_id(&plan);
    Ok(plan)
}

/// `drainNode` before the first step that restarts kubelet, `waitNodeReady` and `uncordonNode` last. Without
/// such a step there is nothing to drain for.
fn add_node_steps(drafts: &mut Vec<Draft>, drain: &Drain, input: &PlanInput<'_>) {
    let Some(at) = drafts.iter().position(|d| disturbs_kubelet(&d.action)) else {
        return;
    };
    let mut evicts = String::new();
    if drain.delete_empty_dir_data {
        evicts.push_str(", emptyDir pods too");
    }
    if drain.force_unmanaged {
        evicts.push_str(", unmanaged pods too");
    }
    drafts.insert(
        at,
        Draft {
            description: format!(
                "drain the node ({}; at most {}s{evicts})",
                drain.why, drain.timeout_seconds
            ),
            // The Machine's node drain timeout, not the table's default.
            timeout_seconds: drain.timeout_seconds,
            action: StepAction::DrainNode {
                delete_empty_dir_data: drain.delete_empty_dir_data,
                force_unmanaged: drain.force_unmanaged,
            },
        },
    );
    let upgrades = drafts
        .iter()
        .any(|d| matches!(d.action, StepAction::InstallKubelet { .. }));
    let kubelet_version = input
        .facts
        .version
        .clone()
        .filter(|_| drain.version_changes && upgrades);
    let text = match &kubelet_version {
        Some(version) => format!("wait for the node to be Ready with kubelet {version}"),
        None => "wait for the node to be Ready".to_owned(),
    };
    drafts.push(Draft::new(
        text,
        StepAction::WaitNodeReady { kubelet_version },
    ));
    drafts.push(Draft::new("uncordon the node", StepAction::UncordonNode));
}

/// The stable id: sha256 over the canonical JSON of machine, cluster and steps.
pub fn plan_id(plan: &Plan) -> String {
    let canonical = serde_json::json!({
        "machine": plan.machine,
        "cluster": plan.cluster,
        "steps": plan.steps,
    });
    crate::hex(&Sha256::digest(canonical.to_string().as_bytes()))
}

/// Inputs allowing `actions`, every switch at its default (tests).
#[cfg(test)]
fn allowed(actions: &std::collections::BTreeSet<crate::Action>) -> PlanInputs {
    PlanInputs {
        actions: actions.clone(),
        ..PlanInputs::default()
    }
}

#[cfg(test)]
mod drain_tests;
#[cfg(test)]
mod golden;
#[cfg(test)]
mod reboot_tests;
#[cfg(test)]
mod tests;

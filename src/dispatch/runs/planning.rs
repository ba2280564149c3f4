//! The plan a run records for an UpdateMachine request: built from the desired state, with the steps of what
//! the node change moves and the drain it calls for, then checked as the agent will check it. Pure: no store,
//! no clock.

use inplace_agent_api::{KubeadmUpgradeMode, Plan, validate_plan};
use inplace_core::Action;
use inplace_core::drain::{self, NodeChange};
use inplace_core::plan::{self, PlanInput};
use serde_json::value::RawValue;

use super::request::UpdateRequest;
use crate::dispatch::floor::DispatchError;

/// The plan an update records: built from the desired state, with the steps of the actions `change` moves and
/// the drain it calls for under the request's drain rules and the Machine's knobs, then checked as the agent
/// will check it.
/// Pure (no store, no clock), so the hook_request fuzz target runs exactly this.
pub fn plan_for(
    request: &UpdateRequest,
    mode: KubeadmUpgradeMode,
    change: &NodeChange,
) -> Result<Plan, DispatchError> {
    let facts = &request.desired.facts;
    let switches = &request.inputs.switches;
    let verdict = drain::decide(
        change,
        &switches.drain,
        &facts.drain,
        switches.version_steps,
    );
    let plan = plan::build(&PlanInput {
        facts,
        bootstrap: request.bootstrap.as_deref().map(RawValue::get),
        inputs: &request.inputs,
        change,
        upgrade_mode: mode,
        drain: verdict.drain().copied(),
        infra: request.infra.as_deref().map(RawValue::get),
    })
    .map_err(|err| DispatchError::BadRequest(err.to_string()))?;
    validate_plan(&plan)
        .map_err(|err| DispatchError::BadRequest(format!("the plan is not valid: {err}")))?;
    Ok(plan)
}

/// What the request's plan moves and drains for: the change a judgement of this desired state found (the
/// licence's, or the Machine record's for a repeat of its state), else [`NodeChange::unknown`] — every action,
/// with an OS image change when the request's plan may switch the image (unjudged, it may differ: the plan
/// then switches it, draining before the reboot, and the agent passes over what the node already has).
pub fn node_change_of(request: &UpdateRequest, known: Option<&NodeChange>) -> NodeChange {
    known.cloned().unwrap_or_else(|| {
        let unknown = NodeChange::unknown(request.desired.facts.version.is_some());
        let inputs = &request.inputs;
        match inputs.os_image {
            Some(_) if inputs.actions.contains(&Action::OsImage) => unknown.with(Action::OsImage),
            _ => unknown,
        }
    })
}

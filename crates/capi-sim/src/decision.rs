//! What CAPI's controllers decide from a hook answer: KubeadmControlPlane for CanUpdateMachine
//! (inplace_canupdatemachine.go), the MachineDeployment rollout planner for CanUpdateMachineSet
//! (machinedeployment_canupdatemachineset.go), the Machine controller for UpdateMachine
//! (machine_controller_inplace_update.go).

use serde_json::Value;

use crate::capi_patch::{
    PatchError, SPEC_PATH, TEMPLATE_SPEC_PATH, apply_patch_the_capi_way, apply_patch_to_machine,
    apply_patch_to_machine_set, nested_field,
};
use crate::client::{CapiError, FailurePolicy, HookAnswer, call_extension};
use crate::diff::json_differences;
use crate::machine::{Machine, MachineSet, decode_typed, machine_spec_differences};
use crate::request::{
    CanUpdateMachineRequest, CanUpdateMachineSetRequest, MachineObjects, MachineSetObjects,
};
use crate::wire::{CanUpdateMachineResponse, CanUpdateMachineSetResponse, UpdateMachineResponse};

/// What CAPI does after a CanUpdateMachine / CanUpdateMachineSet answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapiDecision {
    /// Every spec matches after the patches: the Machine(s) are updated in place.
    InPlace,
    /// Something still differs: CAPI falls back to replacing the Machine(s).
    Rollout {
        /// One entry per differing field, `<Kind> <path>`, e.g. `Machine spec.version`,
        /// `KubeadmConfig spec.files[1].content` (paths only, never values).
        reasons: Vec<String>,
    },
    /// The reconcile fails: no rollout and no in-place update until the answer changes.
    Error {
        /// CAPI's error, e.g. `got failure response with message: ...`.
        message: String,
    },
    /// The request is not one CAPI would send, so there is nothing to simulate.
    BadRequest {
        /// What is wrong with the request.
        message: String,
    },
}

/// What the Machine controller does after an UpdateMachine answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateOutcome {
    /// `Success` with `retryAfterSeconds > 0`: CAPI calls again after that many seconds.
    InProgress {
        /// Seconds until the next call.
        retry_after_seconds: i32,
        /// Shown in the Machine's `Updating` condition.
        message: String,
    },
    /// `Success` with `retryAfterSeconds <= 0`: CAPI completes the update (removes the annotations).
    Done,
    /// The extension answered `Failure`: reason `InPlaceUpdateFailed`, retried with back-off.
    Failed {
        /// The extension's message (CAPI writes it only to its log).
        message: String,
    },
    /// CAPI could not use the answer (transport, decode, unknown status): handled like `Failed`.
    Error {
        /// CAPI's error.
        message: String,
    },
}

impl UpdateOutcome {
    /// The message CAPI puts into the Machine's `Updating` condition, if it sets one.
    pub fn updating_condition_message(&self) -> Option<String> {
        match self {
            UpdateOutcome::InProgress { message, .. } if message.is_empty() => {
                Some("In-place update in progress".into())
            }
            UpdateOutcome::InProgress { message, .. } => {
                Some(format!("In-place update in progress: {message}"))
            }
            UpdateOutcome::Done => None,
            UpdateOutcome::Failed { .. } | UpdateOutcome::Error { .. } => {
                Some("UpdateMachine hook failed: please check controller logs for errors".into())
            }
        }
    }
}

/// KCP's decision for a 200 answer, `failurePolicy: Fail`.
pub fn can_update_machine(request: &Value, response_body: &[u8]) -> CapiDecision {
    can_update_machine_with(request, HookAnswer::ok(response_body), FailurePolicy::Fail)
}

/// KCP's decision for any answer under the given failure policy.
pub fn can_update_machine_with(
    request: &Value,
    answer: HookAnswer<'_>,
    policy: FailurePolicy,
) -> CapiDecision {
    let request = match CanUpdateMachineRequest::from_json(request) {
        Ok(r) => r,
        Err(e) => {
            return CapiDecision::BadRequest {
                message: e.to_string(),
            };
        }
    };
    let response: CanUpdateMachineResponse = match call_extension(answer, policy) {
        Ok(r) => r,
        Err(e) => return call_failed(&e),
    };
    let patched = match patch_current_machine_objects(&request, &response) {
        Ok(p) => p,
        Err(e) => {
            return CapiDecision::Error {
                message: format!(
                    "failed to apply patches from extension to the CanUpdateMachine request: {e}"
                ),
            };
        }
    };
    decide(machine_objects_differences(&patched, &request.desired))
}

/// The MachineDeployment controller's decision for a 200 answer, `failurePolicy: Fail`.
pub fn can_update_machine_set(request: &Value, response_body: &[u8]) -> CapiDecision {
    can_update_machine_set_with(request, HookAnswer::ok(response_body), FailurePolicy::Fail)
}

/// The MachineDeployment controller's decision for any answer under the given failure policy.
pub fn can_update_machine_set_with(
    request: &Value,
    answer: HookAnswer<'_>,
    policy: FailurePolicy,
) -> CapiDecision {
    let request = match CanUpdateMachineSetRequest::from_json(request) {
        Ok(r) => r,
        Err(e) => {
            return CapiDecision::BadRequest {
                message: e.to_string(),
            };
        }
    };
    let response: CanUpdateMachineSetResponse = match call_extension(answer, policy) {
        Ok(r) => r,
        Err(e) => return call_failed(&e),
    };
    let patched = match patch_current_machine_set_objects(&request, &response) {
        Ok(p) => p,
        Err(e) => {
            return CapiDecision::Error {
                message: format!(
                    "failed to apply patches from extension to the CanUpdateMachineSet request: {e}"
                ),
            };
        }
    };
    decide(machine_set_objects_differences(&patched, &request.desired))
}

fn call_failed(e: &CapiError) -> CapiDecision {
    CapiDecision::Error {
        message: format!("failed to call extension handler: {e}"),
    }
}

fn decide(differences: Result<Vec<String>, String>) -> CapiDecision {
    match differences {
        Ok(reasons) if reasons.is_empty() => CapiDecision::InPlace,
        Ok(reasons) => CapiDecision::Rollout { reasons },
        Err(message) => CapiDecision::Error { message },
    }
}

/// `applyPatchesToRequest` (KCP): the current objects after CAPI applied each defined patch.
pub fn patch_current_machine_objects(
    request: &CanUpdateMachineRequest,
    response: &CanUpdateMachineResponse,
) -> Result<MachineObjects, PatchError> {
    let mut out = request.current.clone();
    if response.machine_patch.is_defined() {
        out.machine = apply_patch_to_machine(&out.machine, &response.machine_patch)?;
    }
    if response.bootstrap_config_patch.is_defined()
        && let Some(b) = &out.bootstrap_config
    {
        out.bootstrap_config = Some(apply_patch_the_capi_way(
            b,
            &response.bootstrap_config_patch,
            SPEC_PATH,
        )?);
    }
    if response.infrastructure_machine_patch.is_defined() {
        out.infrastructure_machine = apply_patch_the_capi_way(
            &out.infrastructure_machine,
            &response.infrastructure_machine_patch,
            SPEC_PATH,
        )?;
    }
    Ok(out)
}

/// `applyPatchesToRequest` (MachineDeployment): the current objects after CAPI applied each
/// defined patch (a bootstrap template patch is skipped when there is no bootstrap template).
pub fn patch_current_machine_set_objects(
    request: &CanUpdateMachineSetRequest,
    response: &CanUpdateMachineSetResponse,
) -> Result<MachineSetObjects, PatchError> {
    let mut out = request.current.clone();
    if response.machine_set_patch.is_defined() {
        out.machine_set =
            apply_patch_to_machine_set(&out.machine_set, &response.machine_set_patch)?;
    }
    if response.bootstrap_config_template_patch.is_defined()
        && let Some(b) = &out.bootstrap_config_template
    {
        out.bootstrap_config_template = Some(apply_patch_the_capi_way(
            b,
            &response.bootstrap_config_template_patch,
            TEMPLATE_SPEC_PATH,
        )?);
    }
    if response.infrastructure_machine_template_patch.is_defined() {
        out.infrastructure_machine_template = apply_patch_the_capi_way(
            &out.infrastructure_machine_template,
            &response.infrastructure_machine_template_patch,
            TEMPLATE_SPEC_PATH,
        )?;
    }
    Ok(out)
}

/// `matchesMachine` (KCP): every field that still differs, as `<Kind> <path>`; empty = in place.
pub fn machine_objects_differences(
    patched: &MachineObjects,
    desired: &MachineObjects,
) -> Result<Vec<String>, String> {
    let decode =
        |m: &Value| decode_typed::<Machine>(m).map_err(|e| format!("failed to match Machine: {e}"));
    let (p, d) = (decode(&patched.machine)?, decode(&desired.machine)?);
    let mut out = machine_spec_differences(&p.spec, &d.spec, "Machine spec");
    if let (Some(p), Some(d)) = (&patched.bootstrap_config, &desired.bootstrap_config) {
        out.extend(spec_differences(p, d));
    }
    out.extend(spec_differences(
        &patched.infrastructure_machine,
        &desired.infrastructure_machine,
    ));
    Ok(out)
}

/// `matchesMachineSet`: every field of `spec.template.spec` that still differs; empty = in place.
pub fn machine_set_objects_differences(
    patched: &MachineSetObjects,
    desired: &MachineSetObjects,
) -> Result<Vec<String>, String> {
    let decode = |m: &Value| {
        decode_typed::<MachineSet>(m).map_err(|e| format!("failed to match MachineSet: {e}"))
    };
    let (p, d) = (decode(&patched.machine_set)?, decode(&desired.machine_set)?);
    let mut out = machine_spec_differences(
        &p.spec.template.spec,
        &d.spec.template.spec,
        "MachineSet spec.template.spec",
    );
    if let (Some(p), Some(d)) = (
        &patched.bootstrap_config_template,
        &desired.bootstrap_config_template,
    ) {
        out.extend(template_spec_differences(p, d)?);
    }
    out.extend(template_spec_differences(
        &patched.infrastructure_machine_template,
        &desired.infrastructure_machine_template,
    )?);
    Ok(out)
}

fn kind_of(obj: &Value) -> &str {
    obj.get("kind").and_then(Value::as_str).unwrap_or("object")
}

/// KCP compares `Object["spec"]`, where absent and `null` are the same nil.
fn spec_differences(patched: &Value, desired: &Value) -> Vec<String> {
    let spec = |o: &Value| o.get("spec").filter(|s| !s.is_null()).cloned();
    json_differences(
        spec(patched).as_ref(),
        spec(desired).as_ref(),
        &format!("{} spec", kind_of(patched)),
    )
}

/// The MachineDeployment side compares `spec.template.spec` found via NestedFieldNoCopy.
fn template_spec_differences(patched: &Value, desired: &Value) -> Result<Vec<String>, String> {
    let kind = kind_of(patched);
    let p = nested_field(patched, TEMPLATE_SPEC_PATH).map_err(|_| {
        format!("failed to match {kind}: could not read spec.template.spec from patched object")
    })?;
    let d = nested_field(desired, TEMPLATE_SPEC_PATH).map_err(|_| {
        format!("failed to match {kind}: could not read spec.template.spec from desired object")
    })?;
    Ok(json_differences(
        p,
        d,
        &format!("{kind} spec.template.spec"),
    ))
}

/// The Machine controller's reading of a 200 UpdateMachine answer, `failurePolicy: Fail`.
pub fn update_machine(response_body: &[u8]) -> UpdateOutcome {
    update_machine_with(HookAnswer::ok(response_body), FailurePolicy::Fail)
}

/// The Machine controller's reading of any UpdateMachine answer under the given failure policy.
pub fn update_machine_with(answer: HookAnswer<'_>, policy: FailurePolicy) -> UpdateOutcome {
    match call_extension::<UpdateMachineResponse>(answer, policy) {
        Ok(r) if r.retry_after_seconds > 0 => UpdateOutcome::InProgress {
            retry_after_seconds: r.retry_after_seconds,
            message: r.message,
        },
        // A negative retryAfterSeconds gives a negative requeue, which CAPI treats as done.
        Ok(_) => UpdateOutcome::Done,
        Err(CapiError::Failure { message }) => UpdateOutcome::Failed { message },
        Err(e) => UpdateOutcome::Error {
            message: e.to_string(),
        },
    }
}

#[cfg(test)]
#[path = "decision_tests.rs"]
mod tests;

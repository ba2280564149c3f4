//! CanUpdateMachine and CanUpdateMachineSet: diff, policy and patch (in `inplace-core`), answered the way CAPI
//! reads it. `Success` with patches covering what goes in place (CAPI rolls out whatever is left), or `Failure`
//! when in-place-only mode refuses a change or our own self-check caught a patch CAPI would mis-read.

use inplace_core::{Decision, Objects, Outcome, Scope, Settings, decide};

use super::{Answer, Engine, answer, failure};
use crate::api::{
    CanUpdateMachineRequest, CanUpdateMachineResponse, CanUpdateMachineSetRequest,
    CanUpdateMachineSetResponse, DecodeError, Hook, MachineObjects, MachineSetObjects, Object,
    ObjectKey, Pair, Patch, PatchType, Status, decode_request,
};

fn wire_patch(patch: Option<&inplace_core::Patch>) -> Option<Patch> {
    patch.map(|patch| Patch {
        patch_type: match patch.patch_type {
            inplace_core::PatchType::JsonPatch => PatchType::JsonPatch,
            inplace_core::PatchType::JsonMergePatch => PatchType::JsonMergePatch,
        },
        patch: patch.bytes.clone(),
    })
}

/// The three objects of a CanUpdate request, both sides parsed (only as far as they can differ: see
/// `api::objects`).
struct Parsed {
    machine: Pair,
    bootstrap: Pair,
    infra: Pair,
}

/// One side's object texts: machine (or MachineSet), bootstrap config (template), infrastructure (template).
type Texts<'a> = [Option<&'a Object>; 3];

/// One side of a CanUpdateMachine request as texts.
fn machine_texts(side: &MachineObjects) -> Texts<'_> {
    [
        Some(&side.machine),
        side.bootstrap_config.as_ref(),
        side.infrastructure_machine.as_ref(),
    ]
}

/// One side of a CanUpdateMachineSet request as texts.
fn machine_set_texts(side: &MachineSetObjects) -> Texts<'_> {
    [
        Some(&side.machine_set),
        side.bootstrap_config_template.as_ref(),
        side.infrastructure_machine_template.as_ref(),
    ]
}

impl Parsed {
    fn new(scope: Scope, current: Texts<'_>, desired: Texts<'_>) -> Result<Parsed, DecodeError> {
        let region = scope.segments();
        let pair = |index: usize, path| {
            let (current, desired) = (current[index], desired[index]);
            Pair::parse(current.map(|o| &**o), desired.map(|o| &**o), region, path)
        };
        Ok(Parsed {
            machine: pair(0, "machine")?,
            bootstrap: pair(1, "bootstrap")?,
            infra: pair(2, "infrastructure")?,
        })
    }

    fn current(&self) -> Objects<'_> {
        Objects {
            machine: self.machine.current(),
            bootstrap: self.bootstrap.current(),
            infra: self.infra.current(),
        }
    }

    fn desired(&self) -> Objects<'_> {
        Objects {
            machine: self.machine.desired(),
            bootstrap: self.bootstrap.desired(),
            infra: self.infra.desired(),
        }
    }
}

/// Status and verdict label of a decision.
fn verdict(decision: &Decision) -> (Status, &'static str) {
    match decision.outcome {
        Outcome::InPlace => (Status::Success, "in-place"),
        Outcome::NeedsRollout => (Status::Success, "rollout"),
        Outcome::Refused => (Status::Failure, "refused"),
        Outcome::SelfCheckFailed => (Status::Failure, "self-check-failed"),
    }
}

fn report_self_check(hook: Hook, object: &Option<ObjectKey>, decision: &Decision) {
    if decision.outcome == Outcome::SelfCheckFailed {
        tracing::error!(
            hook = hook.name(),
            object = %object.as_ref().map(ToString::to_string).unwrap_or_default(),
            paths = ?decision.self_check_failures,
            "self-check refused our own patch (a bug: please report it); answered Failure"
        );
    }
}

fn settings(
    hook: Hook,
    map: &std::collections::BTreeMap<String, String>,
    object: &Option<ObjectKey>,
) -> Result<Settings, Answer> {
    Settings::from_map(map).map_err(|err| {
        failure(
            hook,
            format!("ExtensionConfig settings: {err}"),
            "bad-settings",
            object.clone(),
        )
    })
}

/// CanUpdateMachine: which of the changes between current and desired go in place.
pub fn can_update_machine(engine: &Engine, body: &[u8]) -> Answer {
    let hook = Hook::CanUpdateMachine;
    let request: CanUpdateMachineRequest = match decode_request(body) {
        Ok(request) => request,
        Err(err) => return failure(hook, err.to_string(), "bad-request", None),
    };
    let object = request.desired.key.clone();
    let settings = match settings(hook, &request.settings, &object) {
        Ok(settings) => settings,
        Err(answer) => return answer,
    };
    let parsed = match Parsed::new(
        Scope::Object,
        machine_texts(&request.current),
        machine_texts(&request.desired),
    ) {
        Ok(parsed) => parsed,
        Err(err) => return failure(hook, err.to_string(), "bad-request", object),
    };
    let decision = decide(
        Scope::Object,
        &parsed.current(),
        &parsed.desired(),
        &engine.policy,
        &settings,
    );
    report_self_check(hook, &object, &decision);
    let (status, verdict) = verdict(&decision);
    let mut response = CanUpdateMachineResponse::new(status, decision.message.clone());
    if status == Status::Success {
        response.machine_patch = wire_patch(decision.patches.machine.as_ref());
        response.bootstrap_config_patch = wire_patch(decision.patches.bootstrap.as_ref());
        response.infrastructure_machine_patch = wire_patch(decision.patches.infra.as_ref());
        response.affects_availability =
            (!decision.actions.is_empty()).then_some(decision.affects_availability);
    }
    answer(hook, &response, status, verdict, object, decision.message)
}

/// CanUpdateMachineSet: the same question for a MachineDeployment's old and new MachineSet templates.
pub fn can_update_machine_set(engine: &Engine, body: &[u8]) -> Answer {
    let hook = Hook::CanUpdateMachineSet;
    let request: CanUpdateMachineSetRequest = match decode_request(body) {
        Ok(request) => request,
        Err(err) => return failure(hook, err.to_string(), "bad-request", None),
    };
    let object = request.desired.key.clone();
    let settings = match settings(hook, &request.settings, &object) {
        Ok(settings) => settings,
        Err(answer) => return answer,
    };
    let parsed = match Parsed::new(
        Scope::Template,
        machine_set_texts(&request.current),
        machine_set_texts(&request.desired),
    ) {
        Ok(parsed) => parsed,
        Err(err) => return failure(hook, err.to_string(), "bad-request", object),
    };
    let decision = decide(
        Scope::Template,
        &parsed.current(),
        &parsed.desired(),
        &engine.policy,
        &settings,
    );
    report_self_check(hook, &object, &decision);
    let (status, verdict) = verdict(&decision);
    let mut response = CanUpdateMachineSetResponse::new(status, decision.message.clone());
    if status == Status::Success {
        response.machine_set_patch = wire_patch(decision.patches.machine.as_ref());
        response.bootstrap_config_template_patch = wire_patch(decision.patches.bootstrap.as_ref());
        response.infrastructure_machine_template_patch =
            wire_patch(decision.patches.infra.as_ref());
        response.affects_availability =
            (!decision.actions.is_empty()).then_some(decision.affects_availability);
    }
    answer(hook, &response, status, verdict, object, decision.message)
}

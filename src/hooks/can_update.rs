//! CanUpdateMachine and CanUpdateMachineSet: diff, policy and patch (in `inplace-core`), answered the way CAPI
//! reads it. `Success` with patches covering what goes in place (CAPI rolls out whatever is left), or `Failure`
//! when in-place-only mode refuses a change or our own self-check caught a patch CAPI would mis-read.
//!
//! A `Success` is also a verdict UpdateMachine will be checked against: with an updater configured, the
//! answer comes with the [`VerdictRecord`] to store before it is sent ([`record`]); if it cannot be stored
//! the answer becomes a `Failure` (CAPI asks again), never a `Success` UpdateMachine could not honour.

use inplace_agent_api::MachineRef;
use inplace_core::verdict::{Normalized, NormalizedObject, label_value};
use inplace_core::{Decision, ObjectRole, Objects, Outcome, Scope, Settings, decide};

use super::{Answer, Engine, answer, failure};
use crate::api::objects;
use crate::api::{
    CanUpdateMachineRequest, CanUpdateMachineResponse, CanUpdateMachineSetRequest,
    CanUpdateMachineSetResponse, DecodeError, Hook, MachineObjects, MachineSetObjects, Object,
    ObjectKey, Pair, Patch, PatchType, Status, decode_request,
};
use crate::dispatch::now_ms;
use crate::dispatch::records::valid_segment;
use crate::dispatch::verdicts::{
    TEMPLATE_HASH_LABEL, VerdictHook, VerdictRecord, machine_set_verdict_key, machine_verdict_key,
};

/// A CanUpdate answer and, for a `Success` with an updater configured, the verdict to record first.
#[derive(Debug, Clone)]
pub struct Judged {
    /// The answer.
    pub answer: Answer,
    /// Store key and record of the verdict.
    pub verdict: Option<(String, VerdictRecord)>,
}

impl From<Answer> for Judged {
    fn from(answer: Answer) -> Self {
        Judged {
            answer,
            verdict: None,
        }
    }
}

/// Stores the verdict of a judged answer (if any) and returns the answer to send: the judged one, or a
/// `Failure` when the verdict could not be stored.
pub async fn record(engine: std::sync::Arc<Engine>, judged: Judged) -> Answer {
    let (Some((key, verdict)), Some(dispatcher)) = (judged.verdict, engine.dispatcher.as_ref())
    else {
        return judged.answer;
    };
    match dispatcher.record_verdict(&key, &verdict).await {
        Ok(()) => judged.answer,
        Err(err) => failure(
            wire_hook(verdict.hook),
            format!("cannot record the verdict ({err}); CAPI will ask again"),
            "error",
            judged.answer.object,
        ),
    }
}

fn wire_hook(hook: VerdictHook) -> Hook {
    match hook {
        VerdictHook::CanUpdateMachine => Hook::CanUpdateMachine,
        VerdictHook::CanUpdateMachineSet => Hook::CanUpdateMachineSet,
    }
}

/// The desired objects, normalised for the verdict: an object whose two sides were the same text was parsed
/// whole once; one that differs was parsed only where it differs, so its desired text is parsed again here.
fn normalized_desired(
    scope: Scope,
    texts: Texts<'_>,
    parsed: &Parsed,
) -> Result<Normalized, DecodeError> {
    let one = |role, pair: &Pair, text: Option<&Object>| -> Result<_, DecodeError> {
        Ok(match pair {
            Pair::Same(value) | Pair::OnlyDesired(value) => {
                Some(NormalizedObject::of(role, scope, value))
            }
            Pair::Different { .. } => text
                .map(|raw| objects::parse(raw, "desired"))
                .transpose()?
                .map(|value| NormalizedObject::from_owned(role, scope, value)),
            Pair::OnlyCurrent(_) | Pair::Neither => None,
        })
    };
    Ok(Normalized {
        machine: one(ObjectRole::Machine, &parsed.machine, texts[0])?,
        bootstrap: one(ObjectRole::Bootstrap, &parsed.bootstrap, texts[1])?,
        infra: one(ObjectRole::Infra, &parsed.infra, texts[2])?,
    })
}

/// The namespace a key uses for an object: CAPI always sends one; `default` when absent, as for UpdateMachine.
fn key_segments(key: &ObjectKey) -> Option<(&str, &str)> {
    let namespace = if key.namespace.is_empty() {
        "default"
    } else {
        &key.namespace
    };
    (valid_segment(namespace) && valid_segment(&key.name)).then_some((namespace, &key.name))
}

/// The verdict of a `Success` answer: its key and record.
fn verdict_of(
    hook: VerdictHook,
    key: Option<&ObjectKey>,
    desired: Texts<'_>,
    parsed: &Parsed,
    decision: &Decision,
) -> Result<(String, VerdictRecord), String> {
    let Some((namespace, name)) = key.and_then(key_segments) else {
        return Err(
            "cannot record the verdict: the desired object's namespace and name must be \
                    Kubernetes names"
                .into(),
        );
    };
    let scope = match hook {
        VerdictHook::CanUpdateMachine => Scope::Object,
        VerdictHook::CanUpdateMachineSet => Scope::Template,
    };
    let normalized = normalized_desired(scope, desired, parsed).map_err(|err| err.to_string())?;
    let (store_key, template_hash) = match hook {
        VerdictHook::CanUpdateMachine => {
            (machine_verdict_key(&MachineRef::new(namespace, name)), None)
        }
        VerdictHook::CanUpdateMachineSet => {
            // Labels lie outside the compared part, so even a pruned desired side has them whole.
            let hash = parsed.machine.desired().and_then(|set| {
                ["/metadata/labels", "/spec/template/metadata/labels"]
                    .iter()
                    .find_map(|at| {
                        set.pointer(at)?
                            .get(TEMPLATE_HASH_LABEL)?
                            .as_str()
                            .map(str::to_owned)
                    })
            });
            (machine_set_verdict_key(namespace, &label_value(name)), hash)
        }
    };
    let record = VerdictRecord::new(
        hook,
        format!("{namespace}/{name}"),
        decision,
        &normalized,
        template_hash,
        now_ms(),
    );
    Ok((store_key, record))
}

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
pub fn can_update_machine(engine: &Engine, body: &[u8]) -> Judged {
    let hook = Hook::CanUpdateMachine;
    let request: CanUpdateMachineRequest = match decode_request(body) {
        Ok(request) => request,
        Err(err) => return failure(hook, err.to_string(), "bad-request", None).into(),
    };
    let object = request.desired.key.clone();
    let settings = match settings(hook, &request.settings, &object) {
        Ok(settings) => settings,
        Err(answer) => return answer.into(),
    };
    let parsed = match Parsed::new(
        Scope::Object,
        machine_texts(&request.current),
        machine_texts(&request.desired),
    ) {
        Ok(parsed) => parsed,
        Err(err) => return failure(hook, err.to_string(), "bad-request", object).into(),
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
    judged(
        engine,
        VerdictHook::CanUpdateMachine,
        machine_texts(&request.desired),
        &parsed,
        &decision,
        answer(
            hook,
            &response,
            status,
            verdict,
            object,
            decision.message.clone(),
        ),
    )
}

/// The answer with its verdict, when it is a `Success` and an updater will check UpdateMachine against it.
fn judged(
    engine: &Engine,
    hook: VerdictHook,
    desired: Texts<'_>,
    parsed: &Parsed,
    decision: &Decision,
    answer: Answer,
) -> Judged {
    if answer.status != Status::Success || engine.dispatcher.is_none() {
        return answer.into();
    }
    match verdict_of(hook, answer.object.as_ref(), desired, parsed, decision) {
        Ok(verdict) => Judged {
            answer,
            verdict: Some(verdict),
        },
        Err(message) => failure(wire_hook(hook), message, "bad-request", answer.object).into(),
    }
}

/// CanUpdateMachineSet: the same question for a MachineDeployment's old and new MachineSet templates.
pub fn can_update_machine_set(engine: &Engine, body: &[u8]) -> Judged {
    let hook = Hook::CanUpdateMachineSet;
    let request: CanUpdateMachineSetRequest = match decode_request(body) {
        Ok(request) => request,
        Err(err) => return failure(hook, err.to_string(), "bad-request", None).into(),
    };
    let object = request.desired.key.clone();
    let settings = match settings(hook, &request.settings, &object) {
        Ok(settings) => settings,
        Err(answer) => return answer.into(),
    };
    let parsed = match Parsed::new(
        Scope::Template,
        machine_set_texts(&request.current),
        machine_set_texts(&request.desired),
    ) {
        Ok(parsed) => parsed,
        Err(err) => return failure(hook, err.to_string(), "bad-request", object).into(),
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
    judged(
        engine,
        VerdictHook::CanUpdateMachineSet,
        machine_set_texts(&request.desired),
        &parsed,
        &decision,
        answer(
            hook,
            &response,
            status,
            verdict,
            object,
            decision.message.clone(),
        ),
    )
}

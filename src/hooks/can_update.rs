//! CanUpdateMachine and CanUpdateMachineSet: diff, policy and patch (in `inplace-core`), answered the way CAPI
//! reads it. `Success` with patches covering what goes in place (CAPI rolls out whatever is left), or `Failure`
//! when in-place-only mode refuses a change or our own self-check caught a patch CAPI would mis-read.
//!
//! Every CanUpdate question goes one way to `inplace_core::decide`: a [`Question`] (scope, both sides' object
//! texts, settings, the desired object's key) built from a decoded request ([`Question::of`]) or from
//! `inplace-updater diff`'s object sets, then [`Question::decide`]: settings, both sides parsed, the decision,
//! the self-check report. The two hooks differ only in their request and response types ([`Answering`]).
//!
//! A `Success` is also a verdict UpdateMachine will be checked against: with an updater configured, the
//! answer comes with the [`VerdictRecord`] to store before it is sent ([`record`]); if it cannot be stored
//! the answer becomes a `Failure` (CAPI asks again), never a `Success` UpdateMachine could not honour.

use std::collections::BTreeMap;

use inplace_agent_api::MachineRef;
use inplace_core::verdict::{Normalized, NormalizedObject, label_value};
use inplace_core::{
    Decision, DecisionOutcome, ObjectRole, Objects, Policy, Scope, Settings, SettingsError, decide,
};
use serde::Serialize;

use super::{Answer, Engine, answer, failure};
use crate::api::{
    CanUpdateMachineRequest, CanUpdateMachineResponse, CanUpdateMachineSetRequest,
    CanUpdateMachineSetResponse, CanUpdateRequest, DecodeError, Hook, ObjectKey, Pair, Patch,
    PatchType, SideTexts, Status, decode_request,
};
use crate::dispatch::floor::keys::{machine_set_verdict_key, machine_verdict_key, valid_segment};
use crate::dispatch::{VerdictHook, VerdictRecord};
use inplace_core::objects::TEMPLATE_HASH_LABEL;

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
    let Some((key, verdict)) = judged.verdict else {
        return judged.answer;
    };
    match engine
        .dispatcher
        .licences
        .record_verdict(&key, &verdict)
        .await
    {
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

/// The desired objects, normalised for the verdict, taken out of both sides as they were parsed for the
/// decision: an object whose two sides differ gets back only the members left out as equal text, parsed (its
/// text is not parsed a second time), and no compared part is copied.
fn normalized_desired(scope: Scope, parsed: Parsed) -> Result<Normalized, DecodeError> {
    let region = scope.segments();
    let one = |role, pair: Pair, path| -> Result<_, DecodeError> {
        Ok(pair
            .into_desired(region, path)?
            .map(|value| NormalizedObject::from_owned(role, scope, value)))
    };
    Ok(Normalized {
        machine: one(ObjectRole::Machine, parsed.machine, "desired")?,
        bootstrap: one(ObjectRole::Bootstrap, parsed.bootstrap, "desired")?,
        infra: one(ObjectRole::Infra, parsed.infra, "desired")?,
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

/// One CanUpdate question, however it was asked: by CanUpdateMachine, by CanUpdateMachineSet or by
/// `inplace-updater diff`. Deciding it ([`Question::decide`]) is the one way into `inplace_core::decide`.
#[derive(Debug, Clone)]
pub struct Question<'a> {
    /// [`Scope::Object`] for a Machine's objects, [`Scope::Template`] for a MachineSet and templates.
    pub scope: Scope,
    /// The current objects' texts.
    pub current: SideTexts<'a>,
    /// The desired objects' texts.
    pub desired: SideTexts<'a>,
    /// ExtensionConfig settings.
    pub settings: &'a BTreeMap<String, String>,
    /// The desired Machine or MachineSet, for logs, messages and the verdict's key.
    pub object: Option<ObjectKey>,
}

/// Why a question could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum Unanswerable {
    /// The settings name something this extension does not know.
    #[error(transparent)]
    Settings(SettingsError),
    /// An object could not be parsed.
    #[error(transparent)]
    Objects(DecodeError),
}

/// A decided question: the decision, and both sides as they were parsed for it (the verdict reads them).
#[derive(Debug)]
pub struct Decided {
    /// The decision.
    pub decision: Decision,
    parsed: Parsed,
}

impl<'a> Question<'a> {
    /// The question a decoded request asks.
    pub fn of<R: CanUpdateRequest>(request: &'a R) -> Self {
        let [current, desired] = request.sides();
        Question {
            scope: scope_of(R::TEMPLATES),
            current,
            desired,
            settings: request.settings(),
            object: request.key().cloned(),
        }
    }

    /// The hook that asks it: CanUpdateMachine for a Machine's objects, CanUpdateMachineSet for templates.
    pub fn hook(&self) -> Hook {
        hook_of(self.scope)
    }

    /// Settings, both sides parsed, `inplace_core::decide` under `policy`, and the self-check report.
    pub fn decide(&self, policy: &Policy) -> Result<Decided, Unanswerable> {
        let settings = Settings::from_map(self.settings).map_err(Unanswerable::Settings)?;
        let parsed =
            Parsed::new(self.scope, self.current, self.desired).map_err(Unanswerable::Objects)?;
        let decision = decide(
            self.scope,
            &parsed.current(),
            &parsed.desired(),
            policy,
            &settings,
        );
        report_self_check(self.hook(), &self.object, &decision);
        Ok(Decided { decision, parsed })
    }

    fn verdict_hook(&self) -> VerdictHook {
        match self.scope {
            Scope::Object => VerdictHook::CanUpdateMachine,
            Scope::Template => VerdictHook::CanUpdateMachineSet,
        }
    }
}

fn hook_of(scope: Scope) -> Hook {
    match scope {
        Scope::Object => Hook::CanUpdateMachine,
        Scope::Template => Hook::CanUpdateMachineSet,
    }
}

fn scope_of(templates: bool) -> Scope {
    if templates {
        Scope::Template
    } else {
        Scope::Object
    }
}

/// The verdict of a `Success` answer judged at `now_ms` (the dispatcher's clock): its key and record.
fn verdict_of(
    question: &Question<'_>,
    decided: Decided,
    now_ms: u64,
) -> Result<(String, VerdictRecord), String> {
    let Some((namespace, name)) = question.object.as_ref().and_then(key_segments) else {
        return Err(
            "cannot record the verdict: the desired object's namespace and name must be \
                    Kubernetes names"
                .into(),
        );
    };
    let (hook, Decided { decision, parsed }) = (question.verdict_hook(), decided);
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
    let normalized = normalized_desired(question.scope, parsed).map_err(|err| err.to_string())?;
    let record = VerdictRecord::new(
        hook,
        format!("{namespace}/{name}"),
        &decision,
        &normalized,
        template_hash,
        now_ms,
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

/// The three objects of a CanUpdate question, both sides parsed (only as far as they can differ: see
/// `api::objects`).
#[derive(Debug)]
struct Parsed {
    machine: Pair,
    bootstrap: Pair,
    infra: Pair,
}

impl Parsed {
    fn new(
        scope: Scope,
        current: SideTexts<'_>,
        desired: SideTexts<'_>,
    ) -> Result<Parsed, DecodeError> {
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
        DecisionOutcome::InPlace => (Status::Success, "in-place"),
        DecisionOutcome::NeedsRollout => (Status::Success, "rollout"),
        DecisionOutcome::Refused => (Status::Failure, "refused"),
        DecisionOutcome::SelfCheckFailed => (Status::Failure, "self-check-failed"),
    }
}

fn report_self_check(hook: Hook, object: &Option<ObjectKey>, decision: &Decision) {
    if decision.outcome == DecisionOutcome::SelfCheckFailed {
        tracing::error!(
            hook = hook.name(),
            object = %object.as_ref().map(ToString::to_string).unwrap_or_default(),
            paths = ?decision.self_check_failures,
            "self-check refused our own patch (a bug: please report it); answered Failure"
        );
    }
}

/// What differs between the two hooks: the request type (through [`CanUpdateRequest`]) and where the
/// response carries the patches.
trait Answering: CanUpdateRequest {
    /// The response type.
    type Response: Serialize;
    /// The response to `decision`: patches and `affectsAvailability` for a `Success` only.
    fn response(status: Status, decision: &Decision) -> Self::Response;
}

/// `affectsAvailability`: said only when something is done in place.
fn affects_availability(decision: &Decision) -> Option<bool> {
    (!decision.actions.is_empty()).then_some(decision.affects_availability)
}

impl Answering for CanUpdateMachineRequest {
    type Response = CanUpdateMachineResponse;
    fn response(status: Status, decision: &Decision) -> Self::Response {
        let mut response = CanUpdateMachineResponse::new(status, decision.message.clone());
        if status == Status::Success {
            let patches = &decision.patches;
            response.machine_patch = wire_patch(patches.machine.as_ref());
            response.bootstrap_config_patch = wire_patch(patches.bootstrap.as_ref());
            response.infrastructure_machine_patch = wire_patch(patches.infra.as_ref());
            response.affects_availability = affects_availability(decision);
        }
        response
    }
}

impl Answering for CanUpdateMachineSetRequest {
    type Response = CanUpdateMachineSetResponse;
    fn response(status: Status, decision: &Decision) -> Self::Response {
        let mut response = CanUpdateMachineSetResponse::new(status, decision.message.clone());
        if status == Status::Success {
            let patches = &decision.patches;
            response.machine_set_patch = wire_patch(patches.machine.as_ref());
            response.bootstrap_config_template_patch = wire_patch(patches.bootstrap.as_ref());
            response.infrastructure_machine_template_patch = wire_patch(patches.infra.as_ref());
            response.affects_availability = affects_availability(decision);
        }
        response
    }
}

/// Both hooks: decode → [`Question::decide`] → answer → the verdict to record with a `Success`.
fn can_update<R: Answering>(engine: &Engine, body: &[u8]) -> Judged {
    let hook = hook_of(scope_of(R::TEMPLATES));
    let request: R = match decode_request(body) {
        Ok(request) => request,
        Err(err) => return failure(hook, err.to_string(), "bad-request", None).into(),
    };
    let question = Question::of(&request);
    let decided = match question.decide(&engine.policy) {
        Ok(decided) => decided,
        Err(Unanswerable::Settings(err)) => {
            let message = format!("ExtensionConfig settings: {err}");
            return failure(hook, message, "bad-settings", question.object).into();
        }
        Err(Unanswerable::Objects(err)) => {
            return failure(hook, err.to_string(), "bad-request", question.object).into();
        }
    };
    let decision = &decided.decision;
    let (status, verdict) = verdict(decision);
    let answer = answer(
        hook,
        &R::response(status, decision),
        status,
        verdict,
        question.object.clone(),
        decision.message.clone(),
    );
    judged(
        &question,
        decided,
        answer,
        engine.dispatcher.clock().now_ms(),
    )
}

/// The answer with its verdict judged at `now_ms`, when it is a `Success` (UpdateMachine is checked against it).
fn judged(question: &Question<'_>, decided: Decided, answer: Answer, now_ms: u64) -> Judged {
    if answer.status != Status::Success {
        return answer.into();
    }
    match verdict_of(question, decided, now_ms) {
        Ok(verdict) => Judged {
            answer,
            verdict: Some(verdict),
        },
        Err(message) => failure(question.hook(), message, "bad-request", answer.object).into(),
    }
}

/// CanUpdateMachine: which of the changes between current and desired go in place.
pub fn can_update_machine(engine: &Engine, body: &[u8]) -> Judged {
    can_update::<CanUpdateMachineRequest>(engine, body)
}

/// CanUpdateMachineSet: the same question for a MachineDeployment's old and new MachineSet templates.
pub fn can_update_machine_set(engine: &Engine, body: &[u8]) -> Judged {
    can_update::<CanUpdateMachineSetRequest>(engine, body)
}

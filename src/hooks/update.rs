//! UpdateMachine: decode, work out which actions the policy allows for this Machine, and hand the desired
//! state to dispatch, which records the run and answers from the store.

use std::sync::Arc;

use inplace_core::plan::PlanInputs;
use inplace_core::{DesiredMachine, Objects, Policy, Settings, window};

use super::{Answer, Engine, answer, failure};
use crate::api::objects;
use crate::api::validate::Head;
use crate::api::{Hook, Status, UpdateMachineRequest, UpdateMachineResponse, decode_request};
use crate::dispatch::{DispatchError, UpdateAnswer, UpdateRequest};

/// Why a decoded UpdateMachine request cannot become an update: the Failure message and its verdict label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// What the Failure answer says.
    pub message: String,
    /// The metrics/log verdict (`bad-settings`, `refused`, `bad-request`).
    pub verdict: &'static str,
}

impl Refusal {
    fn bad_request(err: impl std::fmt::Display) -> Self {
        Refusal {
            message: err.to_string(),
            verdict: "bad-request",
        }
    }
}

/// The pure part of UpdateMachine after decoding: the ExtensionConfig settings, the facts of the desired
/// Machine and the actions the policy allows it. The desired objects move into the update as text. The hook
/// and the hook_request fuzz target share it.
pub fn update_request(
    policy: &Policy,
    request: UpdateMachineRequest,
) -> Result<UpdateRequest, Refusal> {
    let settings = Settings::from_map(&request.settings).map_err(|err| Refusal {
        message: format!("ExtensionConfig settings: {err}"),
        verdict: "bad-settings",
    })?;
    if !settings.in_place {
        return Err(Refusal {
            message: "in-place updates are disabled by the ExtensionConfig setting inPlace=false"
                .into(),
            verdict: "refused",
        });
    }
    let desired = request.desired;
    let machine = match request.machine {
        Some(machine) => machine,
        None => {
            objects::parse(&desired.machine, "desired.machine").map_err(Refusal::bad_request)?
        }
    };
    // Which actions apply depends on the objects' kinds and the Machine's labels, nothing else: the
    // bootstrap config stays text until a plan has to be built from it, and its kind was read when the
    // request was validated.
    let [_, bootstrap, infra] = desired
        .heads
        .each_ref()
        .map(|head| head.as_ref().map(Head::type_meta));
    // The desired Machine is read once here: dispatch works from this typed view (facts, knobs, labels).
    let view = DesiredMachine::of(&machine).map_err(Refusal::bad_request)?;
    // The Machine's annotation overrides the registration's window; a bad one is the client's mistake.
    let window = window::effective(
        settings.maintenance_window.as_ref(),
        view.knobs.window.as_deref(),
    )
    .map_err(Refusal::bad_request)?;
    let heads = Objects {
        machine: Some(&machine),
        bootstrap: bootstrap.as_ref(),
        infra: infra.as_ref(),
    };
    let inputs = PlanInputs::of(policy, &heads, &settings);
    Ok(UpdateRequest {
        desired: view,
        machine,
        machine_text: desired.machine,
        bootstrap: desired.bootstrap_config,
        infra: desired.infrastructure_machine,
        inputs,
        window,
        paused_setting: settings.paused,
        on_failure_setting: settings.on_failure,
        pacing: settings.pacing,
        keep_guard_past_deadline: settings.keep_guard_past_deadline,
        hashed: Default::default(),
    })
}

/// UpdateMachine: performs (or reports on) the in-place update of one Machine.
pub async fn update_machine(engine: Arc<Engine>, body: bytes::Bytes) -> Answer {
    let hook = Hook::UpdateMachine;
    let request: UpdateMachineRequest = match decode_request(&body) {
        Ok(request) => request,
        Err(err) => return failure(hook, err.to_string(), "bad-request", None),
    };
    let object = request.desired.key.clone();
    let dispatcher = engine.dispatcher.clone();
    let update = match update_request(&engine.policy, request) {
        Ok(update) => update,
        Err(refusal) => return failure(hook, refusal.message, refusal.verdict, object),
    };
    let (status, verdict, message, retry) = match dispatcher.runs.update_machine(&update).await {
        Ok(UpdateAnswer::InProgress {
            message,
            retry_after_seconds,
        }) => (
            Status::Success,
            super::VERDICT_IN_PROGRESS,
            message,
            retry_after_seconds,
        ),
        Ok(UpdateAnswer::Done { message }) => (Status::Success, "done", message, 0),
        Ok(UpdateAnswer::Failed { message }) => (Status::Failure, "failed", message, 0),
        Ok(UpdateAnswer::Refused { reason, message }) => {
            (Status::Failure, reason.as_str(), message, 0)
        }
        Err(DispatchError::BadRequest(message)) => (Status::Failure, "bad-request", message, 0),
        // Not transient: the same desired spec will never fit, so say what to change instead of "try again".
        Err(DispatchError::Store(inplace_store::StoreError::TooLarge { size, limit, .. })) => (
            Status::Failure,
            "too-large",
            format!(
                "the desired node state is {size} bytes, over the store's per-record limit of {limit} bytes; \
                 reduce inline file contents (e.g. move large files to an image) and apply again"
            ),
            0,
        ),
        Err(err) => (
            Status::Failure,
            "error",
            format!("cannot record the update right now ({err}); CAPI will call again"),
            0,
        ),
    };
    let response = UpdateMachineResponse::new(status, message.clone(), retry);
    answer(hook, &response, status, verdict, object, message)
}

//! UpdateMachine: decode, work out which actions the policy allows for this Machine, and hand the desired
//! state to dispatch, which records the run and answers from the store.

use std::sync::Arc;

use inplace_core::{Objects, Scope, Settings};

use super::{Answer, Engine, answer, failure};
use crate::api::objects;
use crate::api::{
    Hook, Object, Status, UpdateMachineRequest, UpdateMachineResponse, decode_request,
};
use crate::dispatch::{DispatchError, UpdateAnswer, UpdateRequest};
use crate::plan::MachineFacts;

/// UpdateMachine: performs (or reports on) the in-place update of one Machine.
pub async fn update_machine(engine: Arc<Engine>, body: bytes::Bytes) -> Answer {
    let hook = Hook::UpdateMachine;
    let request: UpdateMachineRequest = match decode_request(&body) {
        Ok(request) => request,
        Err(err) => return failure(hook, err.to_string(), "bad-request", None),
    };
    let object = request.desired.key.clone();
    let Some(dispatcher) = engine.dispatcher.clone() else {
        return failure(
            hook,
            "no updater is configured on this server: the change was not performed",
            "failed",
            object,
        );
    };
    let settings = match Settings::from_map(&request.settings) {
        Ok(settings) => settings,
        Err(err) => {
            return failure(
                hook,
                format!("ExtensionConfig settings: {err}"),
                "bad-settings",
                object,
            );
        }
    };
    if !settings.in_place {
        return failure(
            hook,
            "in-place updates are disabled by the ExtensionConfig setting inPlace=false",
            "refused",
            object,
        );
    }
    let desired = request.desired;
    let parsed = (|| {
        let machine = objects::parse(&desired.machine, "desired.machine")?;
        // Which actions apply depends on the objects' kinds and the Machine's labels, nothing else: the
        // bootstrap config stays text until a plan has to be built from it.
        let head = |raw: &Option<Object>, path| {
            raw.as_ref()
                .map(|raw| objects::type_meta(raw, path))
                .transpose()
        };
        let bootstrap = head(&desired.bootstrap_config, "desired.bootstrapConfig")?;
        let infra = head(
            &desired.infrastructure_machine,
            "desired.infrastructureMachine",
        )?;
        Ok::<_, crate::api::DecodeError>((machine, bootstrap, infra))
    })();
    let (machine, bootstrap, infra) = match parsed {
        Ok(parsed) => parsed,
        Err(err) => return failure(hook, err.to_string(), "bad-request", object),
    };
    let facts = match MachineFacts::of(&machine) {
        Ok(facts) => facts,
        Err(err) => return failure(hook, err.to_string(), "bad-request", object),
    };
    let heads = Objects {
        machine: Some(&machine),
        bootstrap: bootstrap.as_ref(),
        infra: infra.as_ref(),
    };
    let actions = engine.policy.actions_for(Scope::Object, &heads, &settings);
    let update = UpdateRequest {
        facts,
        machine: desired.machine,
        bootstrap: desired.bootstrap_config,
        actions,
    };
    let (status, verdict, message, retry) = match dispatcher.update_machine(&update).await {
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

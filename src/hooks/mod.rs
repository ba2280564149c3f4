//! One function per hook: decode → decide → answer. No TLS, no sockets, no disk: the server calls these
//! with the request body and writes back what they return.

use serde::Serialize;

use crate::api::{
    CanUpdateMachineRequest, CanUpdateMachineResponse, CanUpdateMachineSetRequest,
    CanUpdateMachineSetResponse, DiscoveryResponse, ExtensionHandler, FailurePolicy,
    GroupVersionHook, HOOKS_API_VERSION, Hook, ObjectKey, Status, UpdateMachineRequest,
    decode_request,
};

/// `timeoutSeconds` advertised in discovery for every handler (CAPI allows 0..=30; 10 is its default).
pub const HANDLER_TIMEOUT_SECONDS: i32 = 10;

/// A computed answer: the JSON body plus what the server logs and counts about it.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The serialized response body.
    pub body: Vec<u8>,
    /// The response's `status`.
    pub status: Status,
    /// A short verdict for logs and metrics (`in-place`, `rollout`, `bad-request`, ...).
    pub verdict: &'static str,
    /// `namespace/name` of the Machine or MachineSet, when the request named one.
    pub object: Option<ObjectKey>,
    /// The response message (never secrets: messages are built from paths and hashes).
    pub message: String,
}

fn answer<T: Serialize>(
    hook: Hook,
    response: &T,
    status: Status,
    verdict: &'static str,
    object: Option<ObjectKey>,
    message: String,
) -> Answer {
    match serde_json::to_vec(response) {
        Ok(body) => Answer {
            body,
            status,
            verdict,
            object,
            message,
        },
        Err(err) => failure(hook, format!("cannot encode the answer: {err}"), "error", object),
    }
}

/// A `Failure` answer of the right kind for `hook`.
pub fn failure(
    hook: Hook,
    message: impl Into<String>,
    verdict: &'static str,
    object: Option<ObjectKey>,
) -> Answer {
    let message = message.into();
    let body = serde_json::json!({
        "apiVersion": HOOKS_API_VERSION,
        "kind": hook.response_kind(),
        "status": Status::Failure.as_str(),
        "message": message,
    });
    let mut bytes = body.to_string().into_bytes();
    if hook == Hook::UpdateMachine {
        // UpdateMachineResponse always carries retryAfterSeconds (no omitempty in Go).
        bytes = serde_json::json!({
            "apiVersion": HOOKS_API_VERSION,
            "kind": hook.response_kind(),
            "status": Status::Failure.as_str(),
            "message": message,
            "retryAfterSeconds": 0,
        })
        .to_string()
        .into_bytes();
    }
    Answer {
        body: bytes,
        status: Status::Failure,
        verdict,
        object,
        message,
    }
}

/// The discovery answer: the three in-place handlers, `failurePolicy: Fail`.
pub fn discovery() -> Answer {
    let handler = |hook: Hook| ExtensionHandler {
        name: hook.handler_name().unwrap_or_default(),
        request_hook: GroupVersionHook {
            api_version: HOOKS_API_VERSION,
            hook: hook.name(),
        },
        timeout_seconds: HANDLER_TIMEOUT_SECONDS,
        failure_policy: FailurePolicy::Fail,
    };
    let response = DiscoveryResponse {
        api_version: HOOKS_API_VERSION,
        kind: Hook::Discovery.response_kind(),
        status: Status::Success,
        message: String::new(),
        handlers: vec![
            handler(Hook::CanUpdateMachine),
            handler(Hook::CanUpdateMachineSet),
            handler(Hook::UpdateMachine),
        ],
    };
    answer(
        Hook::Discovery,
        &response,
        Status::Success,
        "discovered",
        None,
        String::new(),
    )
}

/// CanUpdateMachine: which of the changes between current and desired go in place.
pub fn can_update_machine(body: &[u8]) -> Answer {
    let hook = Hook::CanUpdateMachine;
    let request: CanUpdateMachineRequest = match decode_request(body) {
        Ok(request) => request,
        Err(err) => return failure(hook, err.to_string(), "bad-request", None),
    };
    let object = ObjectKey::of(&request.desired.machine);
    let message = "no in-place rules are configured: every change needs a rollout".to_string();
    let response = CanUpdateMachineResponse::new(Status::Success, message.clone());
    answer(hook, &response, Status::Success, "rollout", object, message)
}

/// CanUpdateMachineSet: the same question for a MachineDeployment's old and new MachineSet.
pub fn can_update_machine_set(body: &[u8]) -> Answer {
    let hook = Hook::CanUpdateMachineSet;
    let request: CanUpdateMachineSetRequest = match decode_request(body) {
        Ok(request) => request,
        Err(err) => return failure(hook, err.to_string(), "bad-request", None),
    };
    let object = ObjectKey::of(&request.desired.machine_set);
    let message = "no in-place rules are configured: every change needs a rollout".to_string();
    let response = CanUpdateMachineSetResponse::new(Status::Success, message.clone());
    answer(hook, &response, Status::Success, "rollout", object, message)
}

/// UpdateMachine: performs (or reports on) the in-place update of one Machine.
pub fn update_machine(body: &[u8]) -> Answer {
    let hook = Hook::UpdateMachine;
    let request: UpdateMachineRequest = match decode_request(body) {
        Ok(request) => request,
        Err(err) => return failure(hook, err.to_string(), "bad-request", None),
    };
    let object = ObjectKey::of(&request.desired.machine);
    failure(
        hook,
        "no updater is configured on this server: the change was not performed",
        "failed",
        object,
    )
}

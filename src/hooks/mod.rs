//! One function per hook: decode → decide → answer. No TLS, no sockets: the server calls these with the
//! request body and writes back what they return. UpdateMachine reaches the store only through `dispatch`.

mod can_update;
pub mod gates;
mod update;

use std::sync::Arc;

use inplace_core::Policy;
use inplace_gates::Gates;
use serde::Serialize;

pub use can_update::{
    Decided, Judged, Question, Unanswerable, can_update_machine, can_update_machine_set, record,
};
pub use update::{Refusal, update_machine, update_request};

use crate::dispatch::Dispatcher;

use crate::api::{
    DiscoveryResponse, ExtensionHandler, FailurePolicy, GroupVersionHook, HOOKS_API_VERSION, Hook,
    ObjectKey, Status,
};

/// What the hooks decide with: the policy, the dispatcher and the health gates (every server has a store, so every answer
/// takes the same path: a CanUpdate `Success` is sent only once its verdict is stored).
#[derive(Debug)]
pub struct Engine {
    /// The in-place policy (`--policy` or the built-in default).
    pub policy: Policy,
    /// Dispatch over the store.
    pub dispatcher: Arc<Dispatcher>,
    /// The health gates of `--gates-file` (none when absent), for pacing a change across the fleet.
    pub gates: Arc<Gates>,
}

impl Engine {
    /// The built-in policy over `dispatcher`.
    pub fn builtin(dispatcher: Arc<Dispatcher>) -> Self {
        Self {
            policy: Policy::builtin(),
            dispatcher,
            gates: Arc::new(Gates::none()),
        }
    }

    /// The built-in policy over a dispatcher on a fresh in-memory store (tests, benches, fuzz targets).
    pub fn in_memory() -> Self {
        Self::builtin(Dispatcher::in_memory())
    }
}

/// The verdict of an UpdateMachine answer that says "still running, ask again".
pub const VERDICT_IN_PROGRESS: &str = "in-progress";

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

pub(crate) fn answer<T: Serialize>(
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
        Err(err) => failure(
            hook,
            format!("cannot encode the answer: {err}"),
            "error",
            object,
        ),
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
    let mut body = serde_json::json!({
        "apiVersion": HOOKS_API_VERSION,
        "kind": hook.response_kind(),
        "status": Status::Failure.as_str(),
        "message": message,
    });
    if hook == Hook::UpdateMachine {
        // UpdateMachineResponse always carries retryAfterSeconds (no omitempty in Go).
        body["retryAfterSeconds"] = serde_json::json!(0);
    }
    let bytes = body.to_string().into_bytes();
    Answer {
        body: bytes,
        status: Status::Failure,
        verdict,
        object,
        message,
    }
}

/// The discovery answer: the three in-place handlers, `failurePolicy: Fail`. The same every time, so it is
/// encoded once.
pub fn discovery() -> Answer {
    static ANSWER: std::sync::LazyLock<Answer> = std::sync::LazyLock::new(encode_discovery);
    ANSWER.clone()
}

fn encode_discovery() -> Answer {
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

#[cfg(test)]
mod tests;

//! Malformed objects against every hook (in process, `oneshot`, a real in-memory store): a Pod sent as a
//! Machine, names no agent could be given, fields of the wrong type, templates without `spec.template.spec`,
//! current and desired of different kinds. Each case starts from a request CAPI sends (the fixtures), changes
//! one thing, and asserts what CAPI would see: a `Failure` (decoded with CAPI's rules by `capi-sim`) whose
//! message names the field and the shape expected, no patch, and — for UpdateMachine — a store exactly as it
//! was, with the Machine's real run still in it.
//!
//! `can_update.rs` holds the CanUpdateMachine and CanUpdateMachineSet tables, `update.rs` the UpdateMachine one;
//! `golden_answers` replays the same tables to keep their exact answers.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

pub(crate) mod can_update;
pub(crate) mod update;

use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use inplace_updater::api::Hook;
use inplace_updater::dispatch::Dispatcher;
use inplace_updater::dispatch::upkeep::tokens::AgentTokens;
use inplace_updater::hooks::Engine;
use inplace_updater::server::{AppState, app};
use serde_json::{Value, json};

pub(crate) fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// One change to a fixture request: the value at a JSON Pointer replaced (`Some`) or removed (`None`).
pub(crate) type Change = (&'static str, Option<Value>);

/// A malformed case: its changes and what the Failure message must contain (the field path first).
pub(crate) struct Case {
    pub(crate) changes: Vec<Change>,
    pub(crate) message: &'static str,
}

fn case(pointer: &'static str, value: Option<Value>, message: &'static str) -> Case {
    Case {
        changes: vec![(pointer, value)],
        message,
    }
}

pub(crate) fn apply(mut request: Value, changes: &[Change]) -> Value {
    for (pointer, value) in changes {
        let (parent, last) = pointer.rsplit_once('/').unwrap();
        let last = last.replace("~1", "/").replace("~0", "~");
        let parent = request
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("{pointer}"));
        match (parent, value) {
            (Value::Object(map), Some(value)) => {
                map.insert(last, value.clone());
            }
            (Value::Object(map), None) => {
                map.remove(&last).unwrap_or_else(|| panic!("{pointer}"));
            }
            (Value::Array(items), Some(value)) => {
                items[last.parse::<usize>().unwrap()] = value.clone()
            }
            (other, _) => panic!("{pointer}: {other}"),
        }
    }
    request
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
}

fn router(dispatcher: Arc<Dispatcher>) -> Router {
    app(AppState::new(
        Arc::new(Engine::builtin(dispatcher)),
        Arc::new(AgentTokens::none()),
    ))
}

async fn call(router: &Router, hook: Hook, request: &Value) -> Vec<u8> {
    let http = Request::post(hook.path())
        .header("content-type", "application/json")
        .body(Body::from(request.to_string()))
        .unwrap();
    let (status, body) = crate::common::respond(router.clone(), http).await;
    assert_eq!(status, 200, "a client mistake is never an HTTP error");
    body
}

/// What CAPI's runtime client makes of a CanUpdate answer: the Failure's message (and no patch in it).
fn assert_names(hook: Hook, message: &str, case: &Case) {
    assert!(
        message.starts_with(case.message),
        "{hook} {:?}:\n  got      {message}\n  expected {}…",
        case.changes,
        case.message
    );
    assert!(
        message.contains("expected"),
        "{hook}: the expected shape is named: {message}"
    );
}

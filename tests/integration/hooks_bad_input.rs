//! Bad input against the hook router (in process, `oneshot`): every client mistake gets a clear answer
//! naming the problem — HTTP 200 `Failure` for undecodable requests (as CAPI's Go SDK does), 404/405/413
//! for wrong routes, methods and sizes — never a 5xx, never a crash.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use inplace_updater::api::Hook;
use inplace_updater::dispatch::upkeep::tokens::AgentTokens;
use inplace_updater::hooks::Engine;
use inplace_updater::server::{AppState, Compute, MAX_BODY_BYTES, app, hook_route};
use tower::ServiceExt as _;

fn state() -> AppState {
    AppState::new(Arc::new(Engine::in_memory()), Arc::new(AgentTokens::none()))
}

async fn call(router: Router, request: Request<Body>) -> (StatusCode, serde_json::Value) {
    let (status, bytes) = crate::common::respond(router, request).await;
    let status = StatusCode::from_u16(status).unwrap();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| serde_json::json!({ "raw": String::from_utf8_lossy(&bytes) }));
    (status, json)
}

fn post(path: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap()
}

/// A request body a hook cannot answer as asked, and what its `Failure` message must contain.
pub(crate) struct BadBody {
    /// Tells the case apart (the golden answers' label).
    pub(crate) label: &'static str,
    /// The hook it is sent to.
    pub(crate) hook: Hook,
    /// The query after the hook's path (`""`: none).
    pub(crate) query: &'static str,
    /// The body.
    pub(crate) body: String,
    /// What the `Failure` message names.
    pub(crate) names: &'static str,
}

impl BadBody {
    /// The hook's path with the case's query.
    pub(crate) fn path(&self) -> String {
        format!("{}{}", self.hook.path(), self.query)
    }
}

const MACHINE: &str = r#"{"apiVersion":"cluster.x-k8s.io/v1beta2","kind":"Machine","metadata":{"name":"m-1","namespace":"default"},"spec":{"clusterName":"c","version":"v1.33.4"}}"#;

/// Every undecodable request: HTTP 200 `Failure` naming the problem (`golden_answers` keeps their bytes).
pub(crate) fn bad_bodies() -> Vec<BadBody> {
    let bad = |label, hook, body: String, names| BadBody {
        label,
        hook,
        query: "",
        body,
        names,
    };
    // Objects are first skipped over as text (no recursion), then parsed where a hook needs them (with
    // serde_json's depth limit): either way the answer names the problem instead of overflowing the stack.
    let deep = |open: usize, close: usize| {
        format!(
            r#"{{"metadata":{{"name":"m"}},"spec":{{"x":{}{}}}}}"#,
            "[".repeat(open),
            "]".repeat(close)
        )
    };
    let mut cases = Vec::new();
    for hook in [
        Hook::CanUpdateMachine,
        Hook::CanUpdateMachineSet,
        Hook::UpdateMachine,
    ] {
        cases.push(bad(
            "not json",
            hook,
            "{not json".into(),
            "key must be a string",
        ));
        cases.push(bad("empty", hook, String::new(), "empty"));
    }
    cases.extend([
        bad(
            "no current",
            Hook::CanUpdateMachine,
            format!(r#"{{"desired":{{"machine":{MACHINE}}}}}"#),
            "missing field `current`",
        ),
        bad(
            "no desired",
            Hook::CanUpdateMachine,
            format!(r#"{{"current":{{"machine":{MACHINE}}}}}"#),
            "missing field `desired`",
        ),
        bad(
            "no desired machine",
            Hook::UpdateMachine,
            r#"{"desired":{}}"#.into(),
            "desired: missing field `machine`",
        ),
        bad(
            "no desired machineSet",
            Hook::CanUpdateMachineSet,
            format!(
                r#"{{"current":{{"machineSet":{MACHINE}}},"desired":{{"machine":{MACHINE}}}}}"#
            ),
            "desired: missing field `machineSet`",
        ),
        bad(
            "bootstrapConfig a list",
            Hook::UpdateMachine,
            format!(r#"{{"desired":{{"machine":{MACHINE},"bootstrapConfig":[1,2]}}}}"#),
            "desired.bootstrapConfig: expected an object, found a list",
        ),
        bad(
            "settings a string",
            Hook::UpdateMachine,
            format!(r#"{{"settings":"x","desired":{{"machine":{MACHINE}}}}}"#),
            "settings: invalid type: string",
        ),
        bad(
            "deep nesting",
            Hook::CanUpdateMachine,
            format!(
                r#"{{"current":{{"machine":{}}},"desired":{{"machine":{MACHINE}}}}}"#,
                deep(100_000, 100_000)
            ),
            "recursion limit",
        ),
        bad(
            "deep nesting unclosed",
            Hook::UpdateMachine,
            format!(r#"{{"desired":{{"machine":{}}}}}"#, deep(100_000, 0)),
            "expected value at line 1",
        ),
        BadBody {
            label: "bad timeout",
            hook: Hook::UpdateMachine,
            query: "?timeout=soon",
            body: format!(r#"{{"desired":{{"machine":{MACHINE}}}}}"#),
            names: "`timeout`",
        },
    ]);
    cases
}

/// An UpdateMachine request with a 15 MiB annotation (the answer must not echo it).
pub(crate) fn huge_annotation_body() -> String {
    let huge = "x".repeat(15 * 1024 * 1024);
    format!(
        r#"{{"desired":{{"machine":{{"metadata":{{"name":"m","namespace":"n","annotations":{{"a":"{huge}"}}}},"spec":{{}}}}}}}}"#
    )
}

#[tokio::test]
async fn undecodable_requests_are_failures_naming_the_problem() {
    for case in bad_bodies() {
        let (status, json) = call(app(state()), post(&case.path(), case.body.clone())).await;
        let what = format!("{} {}", case.hook, case.label);
        assert_eq!(status, StatusCode::OK, "{what}: {json}");
        assert_eq!(json["status"], "Failure", "{what}: {json}");
        assert_eq!(json["kind"], case.hook.response_kind(), "{what}");
        let message = json["message"].as_str().unwrap();
        assert!(message.contains(case.names), "{what}: {message}");
    }
}

#[tokio::test]
async fn huge_strings_are_answered_without_echoing_them() {
    let (status, json) = call(
        app(state()),
        post(Hook::UpdateMachine.path(), huge_annotation_body()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json["status"], "Failure", "{json}");
    assert!(
        json["message"].as_str().unwrap().len() < 1000,
        "the message must not echo the input"
    );
}

#[tokio::test]
async fn oversized_bodies_are_refused_with_413() {
    let declared = Request::post(Hook::CanUpdateMachine.path())
        .header("content-length", (MAX_BODY_BYTES + 1).to_string())
        .body(Body::empty())
        .unwrap();
    let (status, json) = call(app(state()), declared).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{json}");
    assert!(json["message"].as_str().unwrap().contains("limit"));

    // A chunked body with no length is cut off at the limit while it streams.
    let chunk = bytes::Bytes::from(vec![b' '; 1024 * 1024]);
    let stream =
        futures_util::stream::iter(std::iter::repeat_n(chunk, 21).map(Ok::<_, std::io::Error>));
    let (status, _) = call(
        app(state()),
        post(Hook::CanUpdateMachine.path(), Body::from_stream(stream)),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn unknown_paths_are_404_and_wrong_methods_405() {
    let (status, json) = call(
        app(state()),
        post(
            "/hooks.runtime.cluster.x-k8s.io/v1alpha1/beforeclustercreate/x",
            "{}",
        ),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .contains("no such endpoint")
    );
    for hook in Hook::ALL {
        let get = Request::get(hook.path()).body(Body::empty()).unwrap();
        let response = app(state()).oneshot(get).await.unwrap();
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED, "{hook}");
        assert_eq!(response.headers()["allow"], "POST");
    }
}

#[tokio::test]
async fn a_panicking_handler_becomes_a_failure_answer() {
    let state = state();
    let metrics = state.metrics.clone();
    let router = hook_route(
        Hook::CanUpdateMachine,
        Compute::Blocking(|_, _| panic!("boom")),
        state,
    );
    let (status, json) = call(router, post(Hook::CanUpdateMachine.path(), "{}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json["status"], "Failure");
    assert_eq!(json["kind"], "CanUpdateMachineResponse");
    assert!(json["message"].as_str().unwrap().contains("panicked"));
    assert_eq!(metrics.panics.get(), 1);
    assert!(
        metrics
            .encode()
            .contains("inplace_updater_handler_panics_total 1")
    );
}

#[tokio::test]
async fn hooks_refuse_calls_without_client_certificate_when_required() {
    let mut state = state();
    state.require_client_cert = true;
    let (status, json) = call(app(state), post(Hook::Discovery.path(), "{}")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .contains("client certificate")
    );
}

/// A body that arrives 50 ms after the headers, as one read from the network can (an in-memory body is
/// ready at once).
fn arriving_body(bytes: &str) -> Body {
    let bytes = bytes::Bytes::from(bytes.to_string());
    Body::from_stream(futures_util::stream::once(async move {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        Ok::<_, std::io::Error>(bytes)
    }))
}

/// Found by schemathesis: `?timeout=0ns` (a valid Go duration) gave the body zero time to arrive, so a body
/// that was sent was refused with 408. The body is read; the answer is the hook's (here a deadline Failure).
#[tokio::test]
async fn a_zero_timeout_still_reads_the_body_and_answers_the_hook() {
    for timeout in ["0ns", "0", "1ns"] {
        for hook in Hook::ALL {
            let path = format!("{}?timeout={timeout}", hook.path());
            let body = format!(r#"{{"desired":{{"machine":{MACHINE}}}}}"#);
            let (status, json) = call(app(state()), post(&path, arriving_body(&body))).await;
            assert_eq!(status, StatusCode::OK, "{hook} timeout={timeout}: {json}");
            assert_eq!(json["kind"], hook.response_kind(), "{json}");
        }
    }
}

/// A body that trickles in and a computation that runs long share one deadline: the answer is a hook
/// `Failure` within 80% of `?timeout=`, never the route's 30 s safety timeout (504).
#[tokio::test(start_paused = true)]
async fn a_slow_body_and_a_slow_computation_share_one_deadline() {
    let router = hook_route(
        Hook::UpdateMachine,
        Compute::Async(|_, _| Box::pin(std::future::pending())),
        state(),
    );
    let body = Body::from_stream(futures_util::stream::once(async {
        tokio::time::sleep(std::time::Duration::from_secs(20)).await;
        Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"{}"))
    }));
    let path = format!("{}?timeout=30s", Hook::UpdateMachine.path());
    let started = tokio::time::Instant::now();
    let (status, json) = call(router, post(&path, body)).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["status"], "Failure", "{json}");
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .contains("no answer within 24.0s"),
        "{json}"
    );
    let elapsed = started.elapsed();
    assert!(
        elapsed >= std::time::Duration::from_secs(24)
            && elapsed < std::time::Duration::from_secs(25),
        "{elapsed:?}"
    );
}

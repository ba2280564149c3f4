//! The agent API's refusals against the in-process router (`oneshot`), with a real (in-memory) store: the
//! 64 KiB body limit on every route, tokens used outside their cluster, and expired or unknown tokens. Each
//! refusal is checked for what it must not do as well: store nothing, hand out no byte of a plan.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use inplace_agent_api::{INVENTORY_PATH, MAX_REQUEST_BODY_BYTES, POLL_PATH, REPORT_PATH};
use inplace_store::{Entry, Store};
use inplace_updater::api::Hook;
use inplace_updater::dispatch::upkeep::tokens::{
    AgentTokens, NewToken, create_token, parse_token_file,
};
use inplace_updater::dispatch::{AgentScope, Dispatcher};
use inplace_updater::hooks::Engine;
use inplace_updater::server::{AppState, app};
use serde_json::{Value, json};
use tower::ServiceExt as _;

/// The Machine of `tests/fixtures/update-machine-kcp.json` (cluster default/edge-01).
const MACHINE: &str = "edge-01-control-plane-abcde";

struct Server {
    router: Router,
    store: Arc<dyn Store>,
    /// Scoped to cluster default/edge-01.
    edge: NewToken,
    /// Scoped to cluster default/other: same namespace, another cluster.
    other: NewToken,
    /// Scoped to cluster default/edge-01, expired an hour ago.
    expired: NewToken,
}

async fn server() -> Server {
    let cluster = |name: &str| AgentScope::Cluster {
        namespace: "default".into(),
        cluster: name.into(),
    };
    let edge = create_token(&cluster("edge-01"), None).unwrap();
    let other = create_token(&cluster("other"), None).unwrap();
    let past = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    let expired = create_token(&cluster("edge-01"), Some(past)).unwrap();
    let file = format!("{}\n{}\n{}\n", edge.line, other.line, expired.line);
    let store = inplace_store::open(&inplace_store::StoreUrl::Memory, &Default::default())
        .await
        .unwrap();
    let dispatcher = Dispatcher::new(store.clone(), Default::default(), Default::default());
    let router = app(AppState::new(
        Arc::new(Engine::builtin(dispatcher)),
        Arc::new(AgentTokens::from_entries(
            parse_token_file("tokens", &file).unwrap(),
        )),
    ));
    Server {
        router,
        store,
        edge,
        other,
        expired,
    }
}

impl Server {
    async fn call(&self, path: &str, token: Option<&str>, body: Body) -> (StatusCode, String) {
        let mut request = Request::post(path).header("content-type", "application/json");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = self
            .router
            .clone()
            .oneshot(request.body(body).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Every stored key with its revision (a write anywhere changes some revision).
    /// Every key and revision, except the refusal records refused calls leave on purpose (for `status
    /// --agents`): what a refused call must not change.
    async fn snapshot(&self) -> Vec<(String, u64)> {
        let entries: Vec<Entry> = self.store.list("").await.unwrap();
        entries
            .into_iter()
            .filter(|entry| !entry.key.starts_with("agent-refusals/"))
            .map(|entry| (entry.key, entry.revision.0))
            .collect()
    }

    /// The refusal records, as stored.
    async fn refusals(&self) -> Vec<Value> {
        let entries: Vec<Entry> = self.store.list("agent-refusals/").await.unwrap();
        entries
            .iter()
            .map(|entry| serde_json::from_slice(&entry.value).unwrap())
            .collect()
    }

    /// What CAPI asks before it triggers the update: CanUpdateMachine for [`MACHINE`] at the same version.
    async fn can_update_machine(&self) {
        let (status, body) = self
            .call(
                Hook::CanUpdateMachine.path(),
                None,
                Body::from(common::fixture("can-update-machine-kcp-version.json")),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.contains(r#""status":"Success""#), "{body}");
    }

    /// Records an UpdateMachine run for [`MACHINE`] (after CanUpdateMachine, as CAPI does) and returns the
    /// answer.
    async fn update_machine(&self) -> Value {
        self.can_update_machine().await;
        let (status, body) = self
            .call(
                Hook::UpdateMachine.path(),
                None,
                Body::from(common::fixture("update-machine-kcp.json")),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// The plan handed to the edge-01 agent of [`MACHINE`].
    async fn plan(&self) -> Value {
        let (status, body) = self
            .call(
                POLL_PATH,
                Some(&self.edge.token),
                Body::from(poll_body(None).to_string()),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert!(answer["plan"]["steps"].is_array(), "{answer}");
        answer["plan"].clone()
    }
}

fn agent() -> Value {
    json!({"machine": {"namespace": "default", "name": MACHINE}})
}

fn poll_body(current: Option<Value>) -> Value {
    let mut body = json!({"agent": agent(), "waitSeconds": 0});
    if let Some(current) = current {
        body["current"] = current;
    }
    body
}

/// A valid body for each agent route (`report` names `plan_id`).
fn bodies(plan_id: &str) -> [(&'static str, Value); 3] {
    [
        (POLL_PATH, poll_body(None)),
        (
            REPORT_PATH,
            json!({"agent": agent(), "planId": plan_id, "stepIndex": 0, "status": "running", "attempt": 1}),
        ),
        (
            INVENTORY_PATH,
            json!({"agent": agent(), "agentVersion": "0.1.0", "hostname": "node-1"}),
        ),
    ]
}

/// `json` followed by spaces up to exactly `size` bytes: still valid JSON, so only the size can refuse it.
fn padded(json: &Value, size: usize) -> Vec<u8> {
    let mut bytes = json.to_string().into_bytes();
    assert!(bytes.len() <= size);
    bytes.resize(size, b' ');
    bytes
}

#[tokio::test]
async fn agent_bodies_over_64_kib_are_refused_with_413_and_nothing_is_stored() {
    let server = server().await;
    server.update_machine().await;
    let plan_id = server.plan().await["id"].as_str().unwrap().to_string();
    let before = server.snapshot().await;
    for (path, body) in bodies(&plan_id) {
        let over = padded(&body, MAX_REQUEST_BODY_BYTES + 1);
        // Declared too large (Content-Length), and streamed without a length: both are cut off.
        let chunks = over
            .chunks(4096)
            .map(|chunk| Ok::<_, std::io::Error>(bytes::Bytes::copy_from_slice(chunk)))
            .collect::<Vec<_>>();
        for (how, request_body) in [
            ("with a length", Body::from(over.clone())),
            (
                "streamed",
                Body::from_stream(futures_util::stream::iter(chunks)),
            ),
        ] {
            let (status, text) = server
                .call(path, Some(&server.edge.token), request_body)
                .await;
            assert_eq!(
                status,
                StatusCode::PAYLOAD_TOO_LARGE,
                "{path} {how}: {text}"
            );
            let answer: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(answer["status"], "Failure", "{path} {how}: {answer}");
            assert!(
                answer["message"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("limited to {MAX_REQUEST_BODY_BYTES} bytes")),
                "{path} {how}: {answer}"
            );
        }
    }
    assert_eq!(
        server.snapshot().await,
        before,
        "a refused body wrote to the store"
    );
}

#[tokio::test]
async fn an_agent_body_of_exactly_64_kib_is_not_refused_for_size() {
    let server = server().await;
    server.update_machine().await;
    let plan_id = server.plan().await["id"].as_str().unwrap().to_string();
    for (path, body) in bodies(&plan_id) {
        let (status, text) = server
            .call(
                path,
                Some(&server.edge.token),
                Body::from(padded(&body, MAX_REQUEST_BODY_BYTES)),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{path}: {text}");
    }
    // The inventory at the limit was stored.
    let stored = server.store.list("agents/").await.unwrap();
    assert!(
        stored
            .iter()
            .any(|entry| String::from_utf8_lossy(&entry.value).contains("node-1")),
        "no inventory stored"
    );
}

#[tokio::test]
async fn a_token_of_another_cluster_gets_403_learns_nothing_and_changes_nothing() {
    let server = server().await;
    let first = server.update_machine().await;
    assert_eq!(first["status"], "Success", "{first}");
    assert!(first["retryAfterSeconds"].as_i64().unwrap() > 0, "{first}");
    let plan = server.plan().await;
    let plan_id = plan["id"].as_str().unwrap();
    let steps = plan["steps"].as_array().unwrap().len() as u64;
    let before = server.snapshot().await;

    // Knowing (or computing) the run id must not let another cluster's agent touch the run: a poll that
    // claims every step succeeded, a report and an inventory.
    let done = json!({"planId": plan_id, "status": "succeeded", "succeededSteps": steps, "totalSteps": steps});
    let [_, report, inventory] = bodies(plan_id);
    let mut inventory_with_progress = inventory.1.clone();
    inventory_with_progress["current"] = done.clone();
    for (path, body) in [
        (POLL_PATH, poll_body(None)),
        (POLL_PATH, poll_body(Some(done.clone()))),
        (REPORT_PATH, report.1),
        (INVENTORY_PATH, inventory_with_progress),
    ] {
        let (status, text) = server
            .call(
                path,
                Some(&server.other.token),
                Body::from(body.to_string()),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            answer.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["message", "status"],
            "{path}: {answer}"
        );
        for secret in [
            plan_id,
            "steps",
            "audit",
            "ssh-ed25519",
            "edge-01/",
            "cluster default/edge-01",
        ] {
            assert!(!text.contains(secret), "{path} leaked {secret:?}: {text}");
        }
    }
    assert_eq!(
        server.snapshot().await,
        before,
        "a refused call wrote to the store"
    );
    let refusals = server.refusals().await;
    assert_eq!(
        refusals.len(),
        1,
        "the last refusal of the Machine: {refusals:?}"
    );
    assert_eq!(refusals[0]["reason"], "out-of-scope");
    assert!(!refusals[0].to_string().contains(&server.other.token));
    let again = server.update_machine().await;
    assert!(
        again["retryAfterSeconds"].as_i64().unwrap() > 0,
        "the run is still in progress: {again}"
    );
}

#[tokio::test]
async fn missing_unknown_and_expired_tokens_get_401_on_every_agent_route() {
    let server = server().await;
    server.update_machine().await;
    let plan_id = server.plan().await["id"].as_str().unwrap().to_string();
    let before = server.snapshot().await;
    let revoked = create_token(
        &AgentScope::Cluster {
            namespace: "default".into(),
            cluster: "edge-01".into(),
        },
        None,
    )
    .unwrap();
    for (path, body) in bodies(&plan_id) {
        for (what, token) in [
            ("no token", None),
            ("unknown token", Some(revoked.token.as_str())),
            ("expired token", Some(server.expired.token.as_str())),
        ] {
            let (status, text) = server.call(path, token, Body::from(body.to_string())).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path} {what}: {text}");
            assert!(!text.contains("steps"), "{path} {what}: {text}");
        }
    }
    assert_eq!(server.snapshot().await, before);
    let refusals = server.refusals().await.to_vec();
    assert_eq!(refusals.len(), 1, "one record per Machine: {refusals:?}");
    let stored = refusals[0].to_string();
    assert!(!stored.contains(&revoked.token) && !stored.contains(&server.expired.token));
}

/// A body that never arrives used to hold the call until the route's 35 s safety timeout answered 504 (a
/// 5xx for a client's fault); it is cut off with 408 once the body read time is up.
#[tokio::test(start_paused = true)]
async fn an_agent_body_that_never_arrives_gets_408_not_a_5xx() {
    let server = server().await;
    for path in [POLL_PATH, REPORT_PATH, INVENTORY_PATH] {
        let started = tokio::time::Instant::now();
        let never = futures_util::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
        let (status, text) = server
            .call(path, Some(&server.edge.token), Body::from_stream(never))
            .await;
        assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{path}: {text}");
        assert!(text.contains("not received within"), "{path}: {text}");
        assert!(
            started.elapsed() <= inplace_updater::server::AGENT_BODY_READ_TIME,
            "{path}: {:?}",
            started.elapsed()
        );
    }
}

/// Found by schemathesis: a provider id of the allowed 512 bytes made a store key over the store's limit,
/// so polling with it answered 503 and an UpdateMachine for a Machine with such a `spec.providerID` failed.
#[tokio::test]
async fn the_longest_provider_id_is_served_not_a_503() {
    let server = server().await;
    let provider_id = format!("docker:///{}", "p".repeat(502));
    assert_eq!(provider_id.len(), 512);
    let unknown = json!({"agent": {"providerID": "u".repeat(512)}, "waitSeconds": 0});
    let (status, text) = server
        .call(
            POLL_PATH,
            Some(&server.edge.token),
            Body::from(unknown.to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "unknown provider id: {text}");
    assert_eq!(text, "{}");

    let mut request: Value =
        serde_json::from_slice(&common::fixture("update-machine-kcp.json")).unwrap();
    request["desired"]["machine"]["spec"]["providerID"] = json!(provider_id);
    server.can_update_machine().await;
    let (status, text) = server
        .call(
            Hook::UpdateMachine.path(),
            None,
            Body::from(request.to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["status"], "Success", "{answer}");
    let poll = json!({"agent": {"providerID": provider_id}, "waitSeconds": 0});
    let (status, text) = server
        .call(
            POLL_PATH,
            Some(&server.edge.token),
            Body::from(poll.to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["plan"]["machine"]["name"], MACHINE, "{answer}");
}

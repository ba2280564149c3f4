//! Version skew (issue 29): this server accepts what agents of the previous release send. The requests in
//! `crates/agent-api/tests/wire-0.1.0/` were serialized by 0.1.0's own types (commit f4f90af), before agents
//! said anything about themselves; each is posted to the in-process router as such an agent would, and must be
//! decoded and answered, and an older agent's poll is answered without anything it does not know (no upgrade,
//! token or CA digest). Also: the executable this server hands out at `GET /agent/v1/binary` goes only to a
//! valid token, with its digest.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use inplace_agent_api::{BINARY_PATH, INVENTORY_PATH, POLL_PATH, REPORT_PATH};
use inplace_updater::dispatch::upkeep::rollout::release::AgentImage;
use inplace_updater::dispatch::upkeep::tokens::{AgentTokens, create_token, parse_token_file};
use inplace_updater::dispatch::{AgentScope, Dispatcher};
use inplace_updater::hooks::Engine;
use inplace_updater::server::{AppState, app};
use sha2::{Digest as _, Sha256};
use tower::ServiceExt as _;

fn recorded(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("crates/agent-api/tests/wire-0.1.0")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

async fn router(image: Option<AgentImage>) -> (axum::Router, String) {
    let scope = AgentScope::Cluster {
        namespace: "default".into(),
        cluster: "edge-01".into(),
    };
    let token = create_token(&scope, None).unwrap();
    let store = inplace_store::open(&inplace_store::StoreUrl::Memory, &Default::default())
        .await
        .unwrap();
    let dispatcher = Dispatcher::new(store, Default::default(), Default::default());
    let state = AppState {
        agent_image: image.map(Arc::new),
        ..AppState::new(
            Arc::new(Engine::builtin(dispatcher)),
            Arc::new(AgentTokens::from_entries(
                parse_token_file("tokens", &token.line).unwrap(),
            )),
        )
    };
    (app(state), token.token)
}

async fn call(
    router: &axum::Router,
    request: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, Bytes) {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    (
        status,
        headers,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

#[tokio::test]
async fn every_request_a_0_1_agent_sends_is_decoded_and_answered() {
    let (router, token) = router(None).await;
    for (path, file) in [
        (INVENTORY_PATH, "inventory.json"),
        (POLL_PATH, "poll-idle.json"),
        (POLL_PATH, "poll-running.json"),
        (POLL_PATH, "poll-rolling-back.json"),
        (REPORT_PATH, "report-running.json"),
        (REPORT_PATH, "report-failed-rollback.json"),
        (REPORT_PATH, "report-undo.json"),
    ] {
        // As recorded, but a poll's wait cut to 0 so that an idle poll answers at once.
        let mut body: serde_json::Value = serde_json::from_slice(&recorded(file)).unwrap();
        if body.get("waitSeconds").is_some() {
            body["waitSeconds"] = 0.into();
        }
        let request = Request::post(path)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap();
        let (status, _, body) = call(&router, request).await;
        let text = String::from_utf8_lossy(&body);
        // A report of a run this server does not know is refused as stale (409), which the agent handles;
        // what must not happen is a 400: the body not understood.
        assert!(
            status == StatusCode::OK || status == StatusCode::CONFLICT,
            "{file}: {status} {text}"
        );
        if path == POLL_PATH {
            let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
            for field in ["agentUpgrade", "token", "caBundleSha256"] {
                assert!(
                    answer.get(field).is_none(),
                    "{file}: a 0.1 agent was sent {field}: {text}"
                );
            }
        }
    }
}

#[tokio::test]
async fn the_agent_binary_goes_only_to_a_valid_token_with_its_digest() {
    let bytes = b"\x7fELF not really".to_vec();
    let sha: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let image = AgentImage {
        bytes: Bytes::from(bytes.clone()),
        sha256: sha.clone(),
        path: "/opt/inplace-agent".into(),
    };
    let (router, token) = router(Some(image)).await;
    let get = |token: Option<&str>| {
        let mut request = Request::get(BINARY_PATH);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        request.body(Body::empty()).unwrap()
    };
    let (status, headers, body) = call(&router, get(Some(&token))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.as_ref(), bytes.as_slice());
    assert_eq!(headers["x-inplace-sha256"], sha.as_str());
    for refused in [None, Some("iu1_not-a-token")] {
        let (status, _, body) = call(&router, get(refused)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{refused:?}");
        assert!(
            !body.windows(4).any(|w| w == b"\x7fELF"),
            "no byte of the binary without a token"
        );
    }
    // A server without a binary says so.
    let (router, token) = self::router(None).await;
    let (status, _, body) = call(&router, get(Some(&token))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(String::from_utf8_lossy(&body).contains("--agent-binary"));
}

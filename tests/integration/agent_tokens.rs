//! Agent token rotation against the in-process router (`oneshot`) over a shared in-memory store: a token past
//! 2/3 of its life is offered a successor once (and only to an agent that sends its facts), the successor is
//! accepted by another dispatcher over the same store (a second replica), the rotated token is refused once
//! the grace period after the successor's first use has passed, removing the root line refuses the successor,
//! and an expired token's refusal says how to re-enrol the node.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use inplace_agent_api::POLL_PATH;
use inplace_store::Store;
use inplace_updater::dispatch::upkeep::tokens::{AgentTokens, NewToken, create_token_issued};
use inplace_updater::dispatch::{AgentScope, DispatchConfig, Dispatcher};
use inplace_updater::hooks::Engine;
use inplace_updater::server::{AppState, app};
use serde_json::{Value, json};
use time::OffsetDateTime;
use tower::ServiceExt as _;

const MACHINE: &str = "edge-01-control-plane-abcde";

fn cluster() -> AgentScope {
    AgentScope::Cluster {
        namespace: "default".into(),
        cluster: "edge-01".into(),
    }
}

/// A token of default/edge-01 issued `age_hours` ago that lives `life_hours` in all.
pub fn aged_token(age_hours: i64, life_hours: i64) -> NewToken {
    let issued = OffsetDateTime::now_utc() - time::Duration::hours(age_hours);
    create_token_issued(
        &cluster(),
        issued,
        Some(issued + time::Duration::hours(life_hours)),
    )
    .unwrap()
}

/// A poll body for `MACHINE`, with or without facts.
pub fn poll_body(facts: bool) -> Vec<u8> {
    let mut body = json!({
        "agent": {"machine": {"namespace": "default", "name": MACHINE}},
        "waitSeconds": 0,
    });
    if facts {
        body["facts"] = json!({"version": "0.2.0", "arch": "amd64"});
    }
    serde_json::to_vec(&body).unwrap()
}

struct Replica {
    router: Router,
    tokens: Arc<AgentTokens>,
}

fn replica(store: &Arc<dyn Store>, file: &Path, grace: Duration) -> Replica {
    let config = DispatchConfig {
        agent_token_grace: grace,
        ..Default::default()
    };
    let dispatcher = Dispatcher::new(store.clone(), config, Default::default());
    let tokens = Arc::new(AgentTokens::load(file).unwrap());
    Replica {
        router: app(AppState::new(
            Arc::new(Engine::builtin(dispatcher)),
            tokens.clone(),
        )),
        tokens,
    }
}

impl Replica {
    async fn poll(&self, token: &str, facts: bool) -> (StatusCode, Value) {
        let request = Request::post(POLL_PATH)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::from(poll_body(facts)))
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }
}

async fn memory_store() -> Arc<dyn Store> {
    inplace_store::open(&inplace_store::StoreUrl::Memory, &Default::default())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_token_near_expiry_is_rotated_once_and_its_successor_works_on_another_replica() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    let young = aged_token(1, 3);
    let old = aged_token(2, 3);
    std::fs::write(&file, format!("{}\n{}\n", young.line, old.line)).unwrap();
    let store = memory_store().await;
    let a = replica(&store, &file, Duration::from_secs(3600));
    let b = replica(&store, &file, Duration::from_secs(3600));

    let (status, answer) = a.poll(&young.token, true).await;
    assert_eq!(status, StatusCode::OK);
    assert!(answer.get("token").is_none(), "1/3 of its life: {answer}");
    let (_, answer) = a.poll(&old.token, false).await;
    assert!(
        answer.get("token").is_none(),
        "no facts, no offer: {answer}"
    );

    let (status, answer) = a.poll(&old.token, true).await;
    assert_eq!(status, StatusCode::OK);
    let successor = answer["token"]["token"].as_str().unwrap().to_string();
    assert!(successor.starts_with("iu1_"));
    let expires = answer["token"]["expiresUnix"].as_u64().unwrap();
    let now = OffsetDateTime::now_utc().unix_timestamp() as u64;
    assert!(
        (now + 3 * 3600 - 60..=now + 3 * 3600 + 60).contains(&expires),
        "same 3 h lifetime: {expires} vs now {now}"
    );
    // Neither replica mints another one for the same agent within the interval.
    for replica in [&a, &b] {
        let (_, again) = replica.poll(&old.token, true).await;
        assert!(again.get("token").is_none(), "{again}");
    }
    // Stored hashed only.
    for entry in store.list("agent-tokens/").await.unwrap() {
        assert!(!String::from_utf8_lossy(&entry.value).contains(&successor));
    }

    // Minted through A, accepted by B; and the rotated token still works within its grace period.
    let (status, answer) = b.poll(&successor, true).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(
        answer.get("token").is_none(),
        "a fresh successor is not rotated"
    );
    assert_eq!(a.poll(&old.token, true).await.0, StatusCode::OK);
}

#[tokio::test]
async fn the_rotated_token_is_refused_after_the_grace_and_revoking_the_root_refuses_the_successor()
{
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    let old = aged_token(2, 3);
    let other = aged_token(0, 3);
    std::fs::write(&file, format!("{}\n{}\n", old.line, other.line)).unwrap();
    let store = memory_store().await;
    let a = replica(&store, &file, Duration::ZERO);
    let (_, answer) = a.poll(&old.token, true).await;
    let successor = answer["token"]["token"].as_str().unwrap().to_string();
    assert_eq!(
        a.poll(&old.token, true).await.0,
        StatusCode::OK,
        "the successor was not used yet"
    );
    assert_eq!(a.poll(&successor, true).await.0, StatusCode::OK);
    let (status, refusal) = a.poll(&old.token, true).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        refusal["message"].as_str().unwrap().contains("superseded"),
        "{refusal}"
    );

    // The root line goes: its successor goes with it.
    std::fs::write(&file, format!("{}\n", other.line)).unwrap();
    assert!(a.tokens.reload_if_changed().unwrap());
    let (status, refusal) = a.poll(&successor, true).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        refusal["message"].as_str().unwrap().contains("revoked"),
        "{refusal}"
    );
}

#[tokio::test]
async fn an_expired_token_is_refused_with_how_to_re_enrol_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    let expired = aged_token(4, 3);
    std::fs::write(&file, format!("{}\n", expired.line)).unwrap();
    let a = replica(&memory_store().await, &file, Duration::ZERO);
    let (status, refusal) = a.poll(&expired.token, true).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let message = refusal["message"].as_str().unwrap();
    for needle in [
        "token expired at",
        "inplace-updater token create --namespace default --cluster edge-01 --ttl 8760h",
        "/etc/inplace-updater/token",
        "Agent tokens: expiry, rotation, revocation, re-enrolment",
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
    assert!(!message.contains(&expired.token));
}

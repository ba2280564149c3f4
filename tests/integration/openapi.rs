//! openapi/openapi.yaml (as `inplace-updater openapi` prints it) and the served routes agree: every documented route answers, every served route is
//! documented, and real answers match their documented schema (no undocumented field, every required one).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use base64::Engine as _;
use http_body_util::BodyExt as _;
use inplace_updater::api::Hook;
use inplace_updater::server::{AppState, Metrics, Readiness, app, health_router, metrics_router};
use serde_json::Value;
use tower::ServiceExt as _;

/// The document of this build: openapi/openapi.yaml with its step kinds filled in (what schemathesis checks).
fn document() -> Value {
    serde_yaml_ng::from_str(&inplace_updater::openapi::document()).unwrap()
}

fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let pointer = reference.trim_start_matches('#');
            resolve(
                doc,
                doc.pointer(pointer)
                    .unwrap_or_else(|| panic!("dangling {reference}")),
            )
        }
        None => schema,
    }
}

/// A strict structural check: types, required, enums, no undocumented properties, `format: byte` is base64,
/// `null` only where `nullable`.
fn check(doc: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let schema = resolve(doc, schema);
    if value.is_null() && schema.get("nullable").and_then(Value::as_bool) == Some(true) {
        return Ok(());
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        return Err(format!("{at}: {value} not in {options:?}"));
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let object = value.as_object().ok_or(format!("{at}: not an object"))?;
            for required in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let name = required.as_str().unwrap();
                if !object.contains_key(name) {
                    return Err(format!("{at}: required `{name}` missing"));
                }
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            for (key, item) in object {
                match properties.and_then(|p| p.get(key)) {
                    Some(property) => check(doc, property, item, &format!("{at}.{key}"))?,
                    None if schema.get("additionalProperties").is_some() => {}
                    None => return Err(format!("{at}: undocumented field `{key}`")),
                }
            }
        }
        Some("array") => {
            let items = value.as_array().ok_or(format!("{at}: not an array"))?;
            for (i, item) in items.iter().enumerate() {
                check(doc, &schema["items"], item, &format!("{at}[{i}]"))?;
            }
        }
        Some("string") => {
            let text = value.as_str().ok_or(format!("{at}: not a string"))?;
            if schema.get("format").and_then(Value::as_str) == Some("byte") {
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|err| format!("{at}: not standard base64: {err}"))?;
            }
        }
        Some("integer") => {
            value.as_i64().ok_or(format!("{at}: not an integer"))?;
        }
        Some("boolean") => {
            value.as_bool().ok_or(format!("{at}: not a boolean"))?;
        }
        _ => {}
    }
    Ok(())
}

fn documented_operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut operations = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "post", "put", "delete", "patch"] {
            if item.get(method).is_some() {
                operations.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    operations
}

fn served_operations() -> BTreeSet<(String, String)> {
    let mut operations: BTreeSet<_> = Hook::ALL
        .iter()
        .map(|hook| ("POST".to_string(), hook.path().to_string()))
        .collect();
    for path in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/status",
        "/status/agents",
        "/status/retention",
        inplace_agent_api::CA_PATH,
        inplace_agent_api::BINARY_PATH,
    ] {
        operations.insert(("GET".to_string(), path.to_string()));
    }
    for path in [
        inplace_agent_api::POLL_PATH,
        inplace_agent_api::REPORT_PATH,
        inplace_agent_api::INVENTORY_PATH,
    ] {
        operations.insert(("POST".to_string(), path.to_string()));
    }
    operations
}

async fn router_for(path: &str) -> Router {
    let metrics = Arc::new(Metrics::new());
    let store = inplace_store::open(&inplace_store::StoreUrl::Memory, &Default::default())
        .await
        .unwrap();
    let dispatcher =
        inplace_updater::dispatch::Dispatcher::new(store, Default::default(), Default::default());
    match path {
        "/status" | "/status/agents" => inplace_updater::server::status_router(dispatcher, metrics),
        "/status/retention" => {
            // A swept store, so the record's schema is checked (before any sweep the answer is null).
            dispatcher.sweep().await.unwrap();
            inplace_updater::server::status_router(dispatcher, metrics)
        }
        "/healthz" | "/readyz" => {
            let readiness = Readiness::default();
            readiness.set(true);
            health_router(readiness)
        }
        "/metrics" => metrics_router(metrics),
        _ => app(AppState {
            metrics,
            ..AppState::new(
                Arc::new(inplace_updater::hooks::Engine::builtin(dispatcher)),
                Arc::new(
                    inplace_updater::dispatch::upkeep::tokens::AgentTokens::from_entries(
                        inplace_updater::dispatch::upkeep::tokens::parse_token_file(
                            "tokens",
                            &agent_token().line,
                        )
                        .unwrap(),
                    ),
                ),
            )
        }),
    }
}

#[test]
fn every_served_route_is_documented_and_nothing_else() {
    assert_eq!(documented_operations(&document()), served_operations());
}

#[tokio::test]
async fn documented_routes_answer_with_their_documented_schema() {
    let doc = document();
    let bodies = [
        (Hook::Discovery, "discovery-request.json"),
        (
            Hook::CanUpdateMachine,
            "can-update-machine-kcp-version.json",
        ),
        (Hook::CanUpdateMachineSet, "can-update-machineset-md.json"),
        (Hook::UpdateMachine, "update-machine-kcp.json"),
    ];
    let agent = serde_json::json!({"machine": {"namespace": "default", "name": "edge-01-control-plane-abcde"}});
    let agent_bodies = [
        (
            inplace_agent_api::POLL_PATH,
            serde_json::json!({"agent": agent, "waitSeconds": 0}),
        ),
        (
            inplace_agent_api::REPORT_PATH,
            serde_json::json!({"agent": agent, "planId": "p", "stepIndex": 0, "status": "running"}),
        ),
        (
            inplace_agent_api::INVENTORY_PATH,
            serde_json::json!({"agent": agent, "agentVersion": "0.1.0"}),
        ),
    ];
    for (method, path) in documented_operations(&doc) {
        let body = bodies
            .iter()
            .find(|(hook, _)| hook.path() == path)
            .map(|(_, fixture)| common::fixture(fixture))
            .or_else(|| {
                agent_bodies
                    .iter()
                    .find(|(p, _)| *p == path)
                    .map(|(_, b)| b.to_string().into_bytes())
            })
            .unwrap_or_default();
        // Agent routes are called both without a token (401) and with one (their success answers).
        let tokens: &[Option<&str>] = if path.starts_with("/agent/") {
            &[None, Some(TOKEN_NAME)]
        } else {
            &[None]
        };
        for token in tokens {
            let mut request = Request::builder().method(method.as_str()).uri(&path);
            if token.is_some() {
                request =
                    request.header("authorization", format!("Bearer {}", agent_token().token));
            }
            let request = request.body(Body::from(body.clone())).unwrap();
            let response = router_for(&path).await.oneshot(request).await.unwrap();
            let status = response.status().as_str().to_string();
            let operation = &doc["paths"][&path][method.to_lowercase()];
            let documented = &operation["responses"][&status];
            assert!(
                !documented.is_null(),
                "{method} {path} answered undocumented status {status}"
            );
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            if let Some(schema) =
                resolve(&doc, documented).pointer("/content/application~1json/schema")
            {
                let value: Value = serde_json::from_slice(&bytes).unwrap();
                check(&doc, schema, &value, &format!("{method} {path}")).unwrap();
            }
        }
    }
}

const TOKEN_NAME: &str = "edge-01";

fn agent_token() -> &'static inplace_updater::dispatch::upkeep::tokens::NewToken {
    static TOKEN: std::sync::OnceLock<inplace_updater::dispatch::upkeep::tokens::NewToken> =
        std::sync::OnceLock::new();
    TOKEN.get_or_init(|| {
        let scope = inplace_updater::dispatch::AgentScope::Cluster {
            namespace: "default".into(),
            cluster: "edge-01".into(),
        };
        inplace_updater::dispatch::upkeep::tokens::create_token(&scope, None).unwrap()
    })
}

#[test]
fn the_checker_catches_what_it_should() {
    let doc = document();
    let schema = serde_json::json!({ "$ref": "#/components/schemas/UpdateMachineResponse" });
    let good = serde_json::json!({"apiVersion": "x", "kind": "UpdateMachineResponse", "status": "Success", "retryAfterSeconds": 0});
    check(&doc, &schema, &good, "r").unwrap();
    let mut extra = good.clone();
    extra["retryafter"] = 1.into();
    assert!(
        check(&doc, &schema, &extra, "r")
            .unwrap_err()
            .contains("undocumented")
    );
    let mut missing = good.clone();
    missing.as_object_mut().unwrap().remove("retryAfterSeconds");
    assert!(
        check(&doc, &schema, &missing, "r")
            .unwrap_err()
            .contains("required")
    );
    let patch = serde_json::json!({ "$ref": "#/components/schemas/Patch" });
    let raw = serde_json::json!({"patchType": "JSONPatch", "patch": "[{\"op\":\"add\"}]"});
    assert!(
        check(&doc, &patch, &raw, "p")
            .unwrap_err()
            .contains("base64")
    );
}

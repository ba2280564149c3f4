//! events.k8s.io/v1 Events on the fake management API: create (POST) and patch (PATCH: JSON merge patch,
//! strategic merge patch — the same for an Event's fields, none of which is a merged list — or JSON patch),
//! validated as the API server validates an events.k8s.io/v1 Event (`ValidateEventCreate` and
//! `ValidateEventUpdate`): the name, `eventTime`, `reportingController` (a qualified name) and
//! `reportingInstance`, `action` and `reason` (each at most 128 characters), `note` at most 1 kB, `type`
//! Normal or Warning, no `deprecated*` field, a `series` only with `count` ≥ 2 and a `lastObservedTime`; on a
//! patch every field but `series` and `metadata` is immutable. 409 AlreadyExists for a name taken, 404 for a
//! patch of no Event, 422 Invalid naming each field. Stricter than the API in one place, as our contract: the
//! Event must name its `regarding` object (kind, name, namespace). Not checked: `related`, the namespace's
//! existence, Event TTL (the API deletes Events after an hour by default).

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{patch, post};
use serde_json::{Value, json};

use super::{FakeManagementApi, Shared, lock};
use crate::fake::serving::{answer, status};

/// The group and version Events are served under.
pub const EVENTS_PATH: &str = "/apis/events.k8s.io/v1";
/// `reason`, `action`, `reportingInstance`: at most this many characters (the API's limits).
const FIELD_LIMIT: usize = 128;
/// `note`: at most this many bytes (the API's `NoteLengthLimit`).
const NOTE_LIMIT: usize = 1024;

/// One Event write the fake accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventWrite {
    /// `create` or `patch`.
    pub verb: &'static str,
    /// `namespace/name` of the Event.
    pub event: String,
    /// The Event after the write.
    pub object: Value,
}

/// The Events the fake holds, in creation order, and every accepted write.
#[derive(Debug, Default)]
pub(super) struct Events {
    objects: Vec<Value>,
    writes: Vec<EventWrite>,
    revision: u64,
}

/// The Event routes.
pub(super) fn routes() -> Router<Shared> {
    Router::new()
        .route(
            &format!("{EVENTS_PATH}/namespaces/{{ns}}/events"),
            post(create_event),
        )
        .route(
            &format!("{EVENTS_PATH}/namespaces/{{ns}}/events/{{name}}"),
            patch(patch_event),
        )
}

impl FakeManagementApi {
    /// Every Event now, in creation order.
    pub fn events(&self) -> Vec<Value> {
        lock(&self.model).events.objects.clone()
    }

    /// Every Event write accepted, in order.
    pub fn event_writes(&self) -> Vec<EventWrite> {
        lock(&self.model).events.writes.clone()
    }

    /// Deletes every Event (as their TTL would): a later patch of one finds it gone.
    pub fn delete_events(&self) {
        lock(&self.model).events.objects.clear();
    }
}

fn key_of(object: &Value) -> (String, String) {
    let text = |field: &str| {
        object["metadata"][field]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    (text("namespace"), text("name"))
}

fn invalid(name: &str, errors: &[String]) -> (u16, Value) {
    status(
        422,
        "Invalid",
        &format!(
            "Event.events.k8s.io \"{name}\" is invalid: {}",
            errors.join(", ")
        ),
        json!({"name": name, "group": "events.k8s.io", "kind": "Event",
               "causes": errors.iter().map(|e| json!({"message": e})).collect::<Vec<_>>()}),
    )
}

fn is_qualified_name(text: &str) -> bool {
    let (prefix, name) = match text.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, text),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    name_ok && prefix_ok
}

/// What `ValidateEventCreate` (and the new object's half of `ValidateEventUpdate`) says of `event`.
fn validate(event: &Value, namespace: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let text = |field: &str| event[field].as_str().unwrap_or_default();
    let name = event["metadata"]["name"].as_str().unwrap_or_default();
    if name.is_empty() || name.len() > 253 {
        errors.push(
            "metadata.name: Required value: a DNS subdomain of at most 253 characters".into(),
        );
    }
    if event["metadata"]["namespace"].as_str().unwrap_or(namespace) != namespace {
        errors.push(
            "metadata.namespace: Invalid value: does not match the request's namespace".into(),
        );
    }
    if text("eventTime").is_empty() {
        errors.push("eventTime: Required value".into());
    }
    let controller = text("reportingController");
    if controller.is_empty() {
        errors.push("reportingController: Required value".into());
    } else if !is_qualified_name(controller) {
        errors.push(format!(
            "reportingController: Invalid value: {controller:?}: not a qualified name"
        ));
    }
    for field in ["reportingInstance", "action", "reason"] {
        let value = text(field);
        if value.is_empty() {
            errors.push(format!("{field}: Required value"));
        } else if value.chars().count() > FIELD_LIMIT {
            errors.push(format!(
                "{field}: Invalid value: can have at most {FIELD_LIMIT} characters"
            ));
        }
    }
    if text("note").len() > NOTE_LIMIT {
        errors.push(format!(
            "note: Invalid value: can have at most {NOTE_LIMIT} characters"
        ));
    }
    if !matches!(text("type"), "Normal" | "Warning") {
        errors.push(format!(
            "type: Invalid value: has invalid value: {}",
            text("type")
        ));
    }
    for field in [
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
        "deprecatedCount",
        "deprecatedSource",
    ] {
        if !event[field].is_null() {
            errors.push(format!("{field}: Invalid value: needs to be unset"));
        }
    }
    let regarding = &event["regarding"];
    for field in ["kind", "name", "namespace"] {
        if regarding[field].as_str().unwrap_or_default().is_empty() {
            errors.push(format!("regarding.{field}: Required value"));
        }
    }
    errors.extend(validate_series(&event["series"]));
    errors
}

fn validate_series(series: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    if series.is_null() {
        return errors;
    }
    if series["count"].as_i64().is_none_or(|count| count < 2) {
        errors.push("series.count: Invalid value: should be at least 2".into());
    }
    if series["lastObservedTime"]
        .as_str()
        .is_none_or(str::is_empty)
    {
        errors.push("series.lastObservedTime: Required value".into());
    }
    errors
}

async fn create_event(
    State(model): State<Shared>,
    UrlPath(ns): UrlPath<String>,
    body: Bytes,
) -> Response {
    let Ok(mut event) = serde_json::from_slice::<Value>(&body) else {
        return answer(status(
            400,
            "BadRequest",
            "the body is not a JSON object",
            Value::Null,
        ));
    };
    let name = event["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let errors = validate(&event, &ns);
    if !errors.is_empty() {
        return answer(invalid(&name, &errors));
    }
    let mut model = lock(&model);
    let events = &mut model.events;
    if events
        .objects
        .iter()
        .any(|e| key_of(e) == (ns.clone(), name.clone()))
    {
        return answer(status(
            409,
            "AlreadyExists",
            &format!("events.events.k8s.io \"{name}\" already exists"),
            json!({"name": name, "group": "events.k8s.io", "kind": "events"}),
        ));
    }
    events.revision += 1;
    event["metadata"]["namespace"] = json!(ns);
    event["metadata"]["resourceVersion"] = json!(events.revision.to_string());
    event["metadata"]["uid"] = json!(format!("event-uid-{}", events.revision));
    event["apiVersion"] = json!("events.k8s.io/v1");
    event["kind"] = json!("Event");
    events.objects.push(event.clone());
    events.writes.push(EventWrite {
        verb: "create",
        event: format!("{ns}/{name}"),
        object: event.clone(),
    });
    answer((201, event))
}

async fn patch_event(
    State(model): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let media = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return answer(status(
            400,
            "BadRequest",
            "the patch is not JSON",
            Value::Null,
        ));
    };
    let mut model = lock(&model);
    let events = &mut model.events;
    let Some(at) = events
        .objects
        .iter()
        .position(|e| key_of(e) == (ns.clone(), name.clone()))
    else {
        return answer(status(
            404,
            "NotFound",
            &format!("events.events.k8s.io \"{name}\" not found"),
            json!({"name": name, "group": "events.k8s.io", "kind": "events"}),
        ));
    };
    let old = events.objects[at].clone();
    let mut new = old.clone();
    match media.as_str() {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            json_patch::merge(&mut new, &body)
        }
        "application/json-patch+json" => {
            let applied = serde_json::from_value::<json_patch::Patch>(body)
                .map_err(|e| e.to_string())
                .and_then(|p| json_patch::patch(&mut new, &p).map_err(|e| e.to_string()));
            if let Err(err) = applied {
                return answer(status(422, "Invalid", &err, Value::Null));
            }
        }
        other => {
            return answer(status(
                415,
                "UnsupportedMediaType",
                &format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {other:?})"
                ),
                Value::Null,
            ));
        }
    }
    let mut errors = validate(&new, &ns);
    for (key, value) in new.as_object().into_iter().flatten() {
        if key != "series" && key != "metadata" && old.get(key) != Some(value) {
            errors.push(format!("{key}: Invalid value: field is immutable"));
        }
    }
    for key in old.as_object().into_iter().flatten().map(|(k, _)| k) {
        if key != "series" && key != "metadata" && new.get(key).is_none() {
            errors.push(format!("{key}: Invalid value: field is immutable"));
        }
    }
    for field in ["name", "namespace", "uid"] {
        if new["metadata"][field] != old["metadata"][field] {
            errors.push(format!(
                "metadata.{field}: Invalid value: field is immutable"
            ));
        }
    }
    if !errors.is_empty() {
        return answer(invalid(&name, &errors));
    }
    events.revision += 1;
    new["metadata"]["resourceVersion"] = json!(events.revision.to_string());
    events.objects[at] = new.clone();
    events.writes.push(EventWrite {
        verb: "patch",
        event: format!("{ns}/{name}"),
        object: new.clone(),
    });
    answer((200, new))
}

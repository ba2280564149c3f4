//! The fake management API's Machines (`cluster.x-k8s.io/v1beta2`, namespaced) as plain data: GET, and PATCH as
//! the API server applies it to a custom resource — JSON merge patch (RFC 7386) or JSON patch (RFC 6902), never
//! strategic merge (415, as for every custom resource) —, the optimistic-concurrency check (a patch that carries
//! `metadata.resourceVersion` must carry the current one, else 409 Conflict) and a new resourceVersion on every
//! change. Every patch is recorded with the annotations before and after, so a test sees what was changed.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::fake::serving::status;

/// The group, version and plural the Machines are served under.
pub const MACHINES_PATH: &str = "/apis/cluster.x-k8s.io/v1beta2";

/// One patch the fake accepted, as applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachinePatch {
    /// The Machine, `namespace/name`.
    pub machine: String,
    /// The request's content type (`application/merge-patch+json` or `application/json-patch+json`).
    pub content_type: String,
    /// The patch body.
    pub body: Value,
    /// `metadata.annotations` before.
    pub before: BTreeMap<String, String>,
    /// `metadata.annotations` after.
    pub after: BTreeMap<String, String>,
    /// When it was applied.
    pub at: std::time::Instant,
}

/// Every Machine, and the one resourceVersion counter they share (as etcd's revision).
#[derive(Debug, Default)]
pub(super) struct Machines {
    objects: BTreeMap<(String, String), Value>,
    revision: u64,
    pub(super) patches: Vec<MachinePatch>,
}

fn not_found(name: &str) -> (u16, Value) {
    status(
        404,
        "NotFound",
        &format!("machines.cluster.x-k8s.io \"{name}\" not found"),
        json!({"name": name, "group": "cluster.x-k8s.io", "kind": "machines"}),
    )
}

/// `metadata.annotations` of a Machine object, as strings.
pub(super) fn annotations(object: &Value) -> BTreeMap<String, String> {
    object["metadata"]["annotations"]
        .as_object()
        .map(|map| {
            map.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

impl Machines {
    fn next_revision(&mut self) -> String {
        self.revision += 1;
        self.revision.to_string()
    }

    /// Creates or replaces a Machine with these annotations (a new uid and resourceVersion).
    pub(super) fn put(
        &mut self,
        namespace: &str,
        name: &str,
        annotations: &BTreeMap<String, String>,
    ) {
        let revision = self.next_revision();
        let object = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {
                "name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}-{revision}"),
                "resourceVersion": revision, "annotations": annotations,
            },
            "spec": {"clusterName": "cluster", "bootstrap": {}, "infrastructureRef": {}},
        });
        self.objects.insert((namespace.into(), name.into()), object);
    }

    /// Sets (`Some`) or removes (`None`) one annotation as an operator's `kubectl annotate` would; false when
    /// there is no such Machine.
    pub(super) fn annotate(
        &mut self,
        namespace: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> bool {
        let revision = self.next_revision();
        let Some(object) = self.objects.get_mut(&(namespace.into(), name.into())) else {
            return false;
        };
        let metadata = &mut object["metadata"];
        if !metadata["annotations"].is_object() {
            metadata["annotations"] = json!({});
        }
        match value {
            Some(value) => metadata["annotations"][key] = json!(value),
            None => {
                if let Some(map) = metadata["annotations"].as_object_mut() {
                    map.remove(key);
                }
            }
        }
        metadata["resourceVersion"] = json!(revision);
        true
    }

    /// The Machine, if any.
    pub(super) fn object(&self, namespace: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(namespace.into(), name.into()))
    }

    /// GET.
    pub(super) fn get(&self, namespace: &str, name: &str) -> (u16, Value) {
        match self.object(namespace, name) {
            Some(object) => (200, object.clone()),
            None => not_found(name),
        }
    }

    /// PATCH with `content_type` and `body`.
    pub(super) fn patch(
        &mut self,
        namespace: &str,
        name: &str,
        content_type: &str,
        body: &[u8],
    ) -> (u16, Value) {
        let Some(current) = self.object(namespace, name).cloned() else {
            return not_found(name);
        };
        let media = content_type.split(';').next().unwrap_or_default().trim();
        let Ok(patch) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "the patch is not JSON", Value::Null);
        };
        let mut patched = current.clone();
        match media {
            "application/merge-patch+json" => json_patch::merge(&mut patched, &patch),
            "application/json-patch+json" => {
                let ops = match serde_json::from_value::<json_patch::Patch>(patch.clone()) {
                    Ok(ops) => ops,
                    Err(e) => {
                        return status(
                            400,
                            "BadRequest",
                            &format!("invalid JSON patch: {e}"),
                            Value::Null,
                        );
                    }
                };
                if let Err(e) = json_patch::patch(&mut patched, &ops) {
                    return status(
                        422,
                        "Invalid",
                        &format!("the JSON patch could not be applied: {e}"),
                        Value::Null,
                    );
                }
            }
            other => {
                return status(
                    415,
                    "UnsupportedMediaType",
                    &format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?}; strategic merge patch is not supported for custom resources)"
                    ),
                    Value::Null,
                );
            }
        }
        let current_version = current["metadata"]["resourceVersion"].clone();
        match &patched["metadata"]["resourceVersion"] {
            Value::Null => {}
            sent if *sent == current_version => {}
            _ => {
                return status(
                    409,
                    "Conflict",
                    &format!(
                        "Operation cannot be fulfilled on machines.cluster.x-k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                    ),
                    json!({"name": name, "group": "cluster.x-k8s.io", "kind": "machines"}),
                );
            }
        }
        for field in ["name", "namespace", "uid"] {
            if patched["metadata"][field] != current["metadata"][field] {
                return status(
                    422,
                    "Invalid",
                    &format!(
                        "Machine.cluster.x-k8s.io \"{name}\" is invalid: metadata.{field}: field is immutable"
                    ),
                    Value::Null,
                );
            }
        }
        let values_are_strings = patched["metadata"]["annotations"]
            .as_object()
            .is_none_or(|map| map.values().all(Value::is_string));
        if !patched["metadata"]["annotations"].is_null() && !values_are_strings {
            return status(
                400,
                "BadRequest",
                "metadata.annotations: values must be strings",
                Value::Null,
            );
        }
        patched["metadata"]["resourceVersion"] = json!(self.next_revision());
        self.patches.push(MachinePatch {
            machine: format!("{namespace}/{name}"),
            content_type: media.to_owned(),
            body: patch,
            before: annotations(&current),
            after: annotations(&patched),
            at: std::time::Instant::now(),
        });
        self.objects
            .insert((namespace.into(), name.into()), patched.clone());
        (200, patched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machines() -> Machines {
        let mut machines = Machines::default();
        machines.put("ns", "m", &BTreeMap::new());
        machines
    }

    #[test]
    fn a_patch_with_a_stale_resource_version_conflicts_and_changes_nothing() {
        let mut m = machines();
        let (_, object) = m.get("ns", "m");
        let version = object["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_owned();
        m.annotate("ns", "m", "operator", Some("x"));
        let body = json!({"metadata": {"resourceVersion": version, "annotations": {"a": "b"}}});
        let (code, _) = m.patch(
            "ns",
            "m",
            "application/merge-patch+json",
            body.to_string().as_bytes(),
        );
        assert_eq!(code, 409);
        assert!(m.patches.is_empty());
        assert_eq!(annotations(&m.get("ns", "m").1).get("a"), None);
    }

    #[test]
    fn a_patch_with_the_current_version_applies_and_bumps_it() {
        let mut m = machines();
        let version = m.get("ns", "m").1["metadata"]["resourceVersion"].clone();
        let body = json!({"metadata": {"resourceVersion": version, "annotations": {"a": "b"}}});
        let (code, object) = m.patch(
            "ns",
            "m",
            "application/merge-patch+json",
            body.to_string().as_bytes(),
        );
        assert_eq!(code, 200);
        assert_ne!(object["metadata"]["resourceVersion"], version);
        assert_eq!(annotations(&object).get("a").map(String::as_str), Some("b"));
        let removal = json!([{"op": "remove", "path": "/metadata/annotations/a"}]);
        let (code, object) = m.patch(
            "ns",
            "m",
            "application/json-patch+json",
            removal.to_string().as_bytes(),
        );
        assert_eq!(code, 200);
        assert!(annotations(&object).is_empty());
        let (code, _) = m.patch("ns", "m", "application/strategic-merge-patch+json", b"{}");
        assert_eq!(code, 415);
        assert_eq!(
            m.patch("ns", "gone", "application/merge-patch+json", b"{}")
                .0,
            404
        );
    }
}

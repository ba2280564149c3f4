//! Reading hook request bodies as CAPI builds them, and refusing any body CAPI could not have sent
//! (unknown keys, status, wrong kinds): a simulator fed a request CAPI would never send would
//! answer questions nobody asks.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::discovery::HOOKS_API_VERSION;
use crate::godecode::GoEncode;
use crate::machine::{Machine, MachineSet, RequestObjectMeta, decode_request_object};

/// `apiVersion` of Machines and MachineSets in hook requests.
pub const CORE_API_VERSION: &str = "cluster.x-k8s.io/v1beta2";

/// Annotation CAPI puts on every object of an UpdateMachine request.
pub const UPDATE_IN_PROGRESS_ANNOTATION: &str =
    "in-place-updates.internal.cluster.x-k8s.io/update-in-progress";

/// A request body that CAPI would never send; the message names the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a request CAPI would send: {0}")]
pub struct RequestError(pub String);

/// One side of a CanUpdateMachine request (or the desired side of UpdateMachine).
#[derive(Debug, Clone, PartialEq)]
pub struct MachineObjects {
    /// The Machine, written as Go's `json.Marshal` writes the typed Machine.
    pub machine: Value,
    /// The infrastructure machine (unstructured: kept as sent).
    pub infrastructure_machine: Value,
    /// The bootstrap config (unstructured: kept as sent). `None` only in UpdateMachine requests
    /// for Machines without one.
    pub bootstrap_config: Option<Value>,
}

/// One side of a CanUpdateMachineSet request.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineSetObjects {
    /// The MachineSet, written as Go's `json.Marshal` writes the typed MachineSet.
    pub machine_set: Value,
    /// The infrastructure machine template (unstructured).
    pub infrastructure_machine_template: Value,
    /// The bootstrap config template, when the MachineSet references one.
    pub bootstrap_config_template: Option<Value>,
}

/// A CanUpdateMachineRequest.
#[derive(Debug, Clone, PartialEq)]
pub struct CanUpdateMachineRequest {
    /// `settings` from the ExtensionConfig.
    pub settings: BTreeMap<String, String>,
    /// Current objects.
    pub current: MachineObjects,
    /// Desired objects.
    pub desired: MachineObjects,
}

/// A CanUpdateMachineSetRequest.
#[derive(Debug, Clone, PartialEq)]
pub struct CanUpdateMachineSetRequest {
    /// `settings` from the ExtensionConfig.
    pub settings: BTreeMap<String, String>,
    /// Current (old MachineSet) objects.
    pub current: MachineSetObjects,
    /// Desired (new MachineSet) objects.
    pub desired: MachineSetObjects,
}

/// An UpdateMachineRequest (desired state only).
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateMachineRequest {
    /// `settings` from the ExtensionConfig.
    pub settings: BTreeMap<String, String>,
    /// Desired objects, already written and annotated by CAPI.
    pub desired: MachineObjects,
}

impl CanUpdateMachineRequest {
    /// Reads a CanUpdateMachineRequest body; KCP always sends all six objects.
    pub fn from_json(body: &Value) -> Result<Self, RequestError> {
        let (settings, root) = envelope(body, "CanUpdateMachineRequest", &["current", "desired"])?;
        let side = |name: &str| -> Result<MachineObjects, RequestError> {
            let objects = member_object(root, name, "request")?;
            machine_objects(objects, name, true)
        };
        Ok(CanUpdateMachineRequest {
            settings,
            current: side("current")?,
            desired: side("desired")?,
        })
    }
}

impl CanUpdateMachineSetRequest {
    /// Reads a CanUpdateMachineSetRequest body.
    pub fn from_json(body: &Value) -> Result<Self, RequestError> {
        let (settings, root) =
            envelope(body, "CanUpdateMachineSetRequest", &["current", "desired"])?;
        let side = |name: &str| -> Result<MachineSetObjects, RequestError> {
            let objects = member_object(root, name, "request")?;
            only_keys(
                objects,
                &[
                    "machineSet",
                    "infrastructureMachineTemplate",
                    "bootstrapConfigTemplate",
                ],
                name,
            )?;
            let machine_set: MachineSet = typed(objects, "machineSet", name, "MachineSet")?;
            let bootstrap = objects
                .get("bootstrapConfigTemplate")
                .map(|v| unstructured(v, &format!("{name}.bootstrapConfigTemplate")))
                .transpose()?;
            if machine_set
                .spec
                .template
                .spec
                .bootstrap
                .config_ref
                .kind
                .is_empty()
                != bootstrap.is_none()
            {
                return Err(RequestError(format!(
                    "{name}: bootstrapConfigTemplate must be sent exactly when the MachineSet has a bootstrap configRef"
                )));
            }
            Ok(MachineSetObjects {
                machine_set: machine_set.go_encode(),
                infrastructure_machine_template: required_unstructured(
                    objects,
                    "infrastructureMachineTemplate",
                    name,
                )?,
                bootstrap_config_template: bootstrap,
            })
        };
        Ok(CanUpdateMachineSetRequest {
            settings,
            current: side("current")?,
            desired: side("desired")?,
        })
    }
}

impl UpdateMachineRequest {
    /// Reads an UpdateMachineRequest body; every object must carry the update-in-progress annotation.
    pub fn from_json(body: &Value) -> Result<Self, RequestError> {
        let (settings, root) = envelope(body, "UpdateMachineRequest", &["desired"])?;
        let objects = member_object(root, "desired", "request")?;
        let desired = machine_objects(objects, "desired", false)?;
        let mut all = vec![
            ("machine", &desired.machine),
            ("infrastructureMachine", &desired.infrastructure_machine),
        ];
        if let Some(b) = &desired.bootstrap_config {
            all.push(("bootstrapConfig", b));
        }
        for (name, obj) in all {
            if obj
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(UPDATE_IN_PROGRESS_ANNOTATION))
                .is_none()
            {
                return Err(RequestError(format!(
                    "desired.{name}: CAPI calls UpdateMachine only after annotating it {UPDATE_IN_PROGRESS_ANNOTATION}"
                )));
            }
        }
        Ok(UpdateMachineRequest { settings, desired })
    }
}

fn machine_objects(
    objects: &serde_json::Map<String, Value>,
    side: &str,
    bootstrap_required: bool,
) -> Result<MachineObjects, RequestError> {
    only_keys(
        objects,
        &["machine", "infrastructureMachine", "bootstrapConfig"],
        side,
    )?;
    let machine: Machine = typed(objects, "machine", side, "Machine")?;
    let bootstrap_config = match objects.get("bootstrapConfig") {
        Some(v) => Some(unstructured(v, &format!("{side}.bootstrapConfig"))?),
        None if bootstrap_required => {
            return Err(RequestError(format!("{side}.bootstrapConfig is missing")));
        }
        None => None,
    };
    Ok(MachineObjects {
        machine: machine.go_encode(),
        infrastructure_machine: required_unstructured(objects, "infrastructureMachine", side)?,
        bootstrap_config,
    })
}

/// `settings` of a request.
type Settings = BTreeMap<String, String>;

/// Checks TypeMeta and top-level keys; returns the settings and the body's members.
fn envelope<'a>(
    body: &'a Value,
    kind: &str,
    members: &[&str],
) -> Result<(Settings, &'a serde_json::Map<String, Value>), RequestError> {
    let root = body
        .as_object()
        .ok_or_else(|| RequestError("the body is not a JSON object".into()))?;
    let mut allowed = vec!["apiVersion", "kind", "settings"];
    allowed.extend_from_slice(members);
    only_keys(root, &allowed, "request")?;
    if root.get("apiVersion").and_then(Value::as_str) != Some(HOOKS_API_VERSION) {
        return Err(RequestError(format!(
            "apiVersion must be {HOOKS_API_VERSION}"
        )));
    }
    if root.get("kind").and_then(Value::as_str) != Some(kind) {
        return Err(RequestError(format!("kind must be {kind}")));
    }
    let mut settings = BTreeMap::new();
    if let Some(s) = root.get("settings") {
        let map = s
            .as_object()
            .ok_or_else(|| RequestError("settings must be an object of strings".into()))?;
        for (k, v) in map {
            let v = v
                .as_str()
                .ok_or_else(|| RequestError(format!("settings.{k} must be a string")))?;
            settings.insert(k.clone(), v.to_string());
        }
    }
    Ok((settings, root))
}

fn only_keys(
    map: &serde_json::Map<String, Value>,
    allowed: &[&str],
    what: &str,
) -> Result<(), RequestError> {
    match map.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(RequestError(format!(
            "{what}: unexpected key {k:?} (CAPI sends only {})",
            allowed.join(", ")
        ))),
        None => Ok(()),
    }
}

fn member_object<'a>(
    map: &'a serde_json::Map<String, Value>,
    name: &str,
    what: &str,
) -> Result<&'a serde_json::Map<String, Value>, RequestError> {
    map.get(name)
        .and_then(Value::as_object)
        .ok_or_else(|| RequestError(format!("{what}.{name} is missing or not an object")))
}

fn typed<T: crate::godecode::GoDecode + TypeMeta>(
    objects: &serde_json::Map<String, Value>,
    name: &str,
    side: &str,
    kind: &str,
) -> Result<T, RequestError> {
    let what = format!("{side}.{name}");
    let value = objects
        .get(name)
        .ok_or_else(|| RequestError(format!("{what} is missing")))?;
    let typed: T = decode_request_object(value, &what).map_err(RequestError)?;
    if typed.api_version() != CORE_API_VERSION || typed.kind() != kind {
        return Err(RequestError(format!(
            "{what} must be apiVersion {CORE_API_VERSION}, kind {kind}"
        )));
    }
    check_meta(typed.meta(), &what)?;
    Ok(typed)
}

/// TypeMeta and metadata access for the typed request objects.
trait TypeMeta {
    fn api_version(&self) -> &str;
    fn kind(&self) -> &str;
    fn meta(&self) -> &RequestObjectMeta;
}

macro_rules! type_meta {
    ($($ty:ty),*) => {$(
        impl TypeMeta for $ty {
            fn api_version(&self) -> &str { &self.api_version }
            fn kind(&self) -> &str { &self.kind }
            fn meta(&self) -> &RequestObjectMeta { &self.metadata }
        }
    )*};
}
type_meta!(Machine, MachineSet);

fn check_meta(meta: &RequestObjectMeta, what: &str) -> Result<(), RequestError> {
    if meta.name.is_empty() || meta.namespace.is_empty() {
        return Err(RequestError(format!(
            "{what}.metadata must have a name and a namespace"
        )));
    }
    Ok(())
}

fn required_unstructured(
    objects: &serde_json::Map<String, Value>,
    name: &str,
    side: &str,
) -> Result<Value, RequestError> {
    let what = format!("{side}.{name}");
    let value = objects
        .get(name)
        .ok_or_else(|| RequestError(format!("{what} is missing")))?;
    unstructured(value, &what)
}

/// An unstructured object as `cleanupUnstructured` leaves it: TypeMeta, four metadata fields, spec.
fn unstructured(value: &Value, what: &str) -> Result<Value, RequestError> {
    let map = value
        .as_object()
        .ok_or_else(|| RequestError(format!("{what} is not an object")))?;
    only_keys(map, &["apiVersion", "kind", "metadata", "spec"], what)?;
    let api_version = map.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if api_version.is_empty() || api_version.matches('/').count() > 1 {
        return Err(RequestError(format!(
            "{what}.apiVersion must be a group/version string"
        )));
    }
    if map
        .get("kind")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(RequestError(format!(
            "{what}.kind must be a non-empty string"
        )));
    }
    let meta: RequestObjectMeta = decode_request_object(
        map.get("metadata").unwrap_or(&Value::Null),
        &format!("{what}.metadata"),
    )
    .map_err(RequestError)?;
    check_meta(&meta, what)?;
    Ok(value.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn machine() -> Value {
        json!({"apiVersion": CORE_API_VERSION, "kind": "Machine", "metadata": {"name": "m", "namespace": "default"}, "spec": {"version": "v1.33.4", "providerID": ""}})
    }

    fn object(kind: &str) -> Value {
        json!({"apiVersion": "x.example/v1", "kind": kind, "metadata": {"name": "o", "namespace": "default"}, "spec": {"a": 1}})
    }

    fn request() -> Value {
        let side = json!({"machine": machine(), "infrastructureMachine": object("AcmeMachine"), "bootstrapConfig": object("KubeadmConfig")});
        json!({"apiVersion": HOOKS_API_VERSION, "kind": "CanUpdateMachineRequest", "current": side, "desired": side})
    }

    #[test]
    fn reads_a_request_and_writes_the_machine_the_go_way() {
        let r = CanUpdateMachineRequest::from_json(&request()).unwrap();
        assert_eq!(r.current.machine["spec"], json!({"version": "v1.33.4"}));
        assert_eq!(r.current.infrastructure_machine, object("AcmeMachine"));
    }

    type Mutation = Box<dyn Fn(&mut Value)>;

    #[test]
    fn refuses_what_capi_never_sends() {
        let mutations: Vec<Mutation> = vec![
            Box::new(|r| r["kind"] = json!("CanUpdateMachineSetRequest")),
            Box::new(|r| r["current"]["machine"]["status"] = json!({})),
            Box::new(|r| r["current"]["machine"]["spec"]["failuredomain"] = json!("x")),
            Box::new(|r| r["current"]["machine"]["metadata"]["uid"] = json!("x")),
            Box::new(|r| r["current"]["machine"]["spec"]["version"] = json!(1)),
            Box::new(|r| r["desired"]["infrastructureMachine"]["status"] = json!({})),
            Box::new(|r| {
                r["desired"]["infrastructureMachine"]["metadata"]["labels"] = json!({"a": 1})
            }),
            Box::new(|r| r["desired"]["bootstrapConfig"]["kind"] = json!("")),
            Box::new(|r| {
                r["desired"]
                    .as_object_mut()
                    .unwrap()
                    .remove("bootstrapConfig")
                    .map(|_| ())
                    .unwrap_or(())
            }),
            Box::new(|r| r["settings"] = json!({"a": 1})),
            Box::new(|r| r["extra"] = json!(1)),
        ];
        for (i, m) in mutations.iter().enumerate() {
            let mut r = request();
            m(&mut r);
            assert!(
                CanUpdateMachineRequest::from_json(&r).is_err(),
                "mutation {i} accepted"
            );
        }
    }
}

//! Hook request bodies as CAPI sends them. Objects CAPI passes through untyped stay JSON maps;
//! only the shape (which objects exist, which are required) is typed here.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::HOOKS_API_VERSION;
use super::objects::{Object, key_of, require_object};

/// Why a request body could not be decoded; the message names the offending field.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The body was empty.
    #[error("request body is empty: expected a {kind} JSON object")]
    Empty {
        /// The request kind that was expected.
        kind: &'static str,
    },
    /// JSON syntax or shape error at a field path.
    #[error("cannot decode {kind}: {detail}")]
    Json {
        /// The request kind that was expected.
        kind: &'static str,
        /// `path: serde message`, e.g. ``desired: missing field `machine` at line 1 column 40``.
        detail: String,
    },
    /// `apiVersion` or `kind` is present but names something else.
    #[error("field `{field}` is {found:?}, expected {expected:?}")]
    TypeMeta {
        /// `apiVersion` or `kind`.
        field: &'static str,
        /// What the body said (truncated).
        found: String,
        /// What this endpoint serves.
        expected: &'static str,
    },
    /// An object is not a JSON object.
    #[error("field `{path}` must be a JSON object, found {found}")]
    NotAnObject {
        /// Path of the object, e.g. `desired.bootstrapConfig`.
        path: &'static str,
        /// The JSON type found.
        found: &'static str,
    },
    /// An object lacks `metadata.name`, without which nothing can be tracked.
    #[error("field `{path}.metadata.name` is missing or not a string")]
    MissingName {
        /// Path of the object, e.g. `desired.machine`.
        path: &'static str,
    },
}

/// A request type: what `kind` it is and how to check it after decoding.
pub trait HookRequest: DeserializeOwned {
    /// The request's `kind`.
    const KIND: &'static str;
    /// The TypeMeta the body carried.
    fn type_meta(&self) -> (&Option<String>, &Option<String>);
    /// Checks what decoding alone cannot express (objects are objects, required names), and notes the
    /// names it read.
    fn validate(&mut self) -> Result<(), DecodeError> {
        Ok(())
    }
}

/// Decodes a hook request body, naming the first field that is wrong.
pub fn decode_request<R: HookRequest>(body: &[u8]) -> Result<R, DecodeError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(DecodeError::Empty { kind: R::KIND });
    }
    let mut request: R = decode_json(body).map_err(|detail| DecodeError::Json {
        kind: R::KIND,
        detail,
    })?;
    let (api_version, kind) = request.type_meta();
    check_type_meta("apiVersion", api_version, HOOKS_API_VERSION)?;
    check_type_meta("kind", kind, R::KIND)?;
    request.validate()?;
    Ok(request)
}

/// Decodes JSON into `T`; on failure, says where: `path: serde message` (just the message at the top).
///
/// The plain decoder runs first: tracking the path of every field costs about a third of a decode, and only a
/// body that fails needs it, so such a body is decoded a second time to name the field.
pub fn decode_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let plain = match serde_json::from_slice(body) {
        Ok(value) => return Ok(value),
        Err(err) => err,
    };
    let deserializer = &mut serde_json::Deserializer::from_slice(body);
    match serde_path_to_error::deserialize::<_, T>(deserializer) {
        // Both are serde_json underneath; should they ever disagree, the plain error stands.
        Ok(_) => Err(plain.to_string()),
        Err(err) => {
            let path = err.path().to_string();
            let inner = err.into_inner();
            Err(if path == "." {
                inner.to_string()
            } else {
                format!("{path}: {inner}")
            })
        }
    }
}

fn check_type_meta(
    field: &'static str,
    found: &Option<String>,
    expected: &'static str,
) -> Result<(), DecodeError> {
    match found {
        Some(value) if value != expected => Err(DecodeError::TypeMeta {
            field,
            found: value.chars().take(100).collect(),
            expected,
        }),
        _ => Ok(()),
    }
}

/// `namespace/name` of an object, for logs and messages.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// `metadata.namespace` (empty when absent).
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

fn optional_object(object: &Option<Object>, path: &'static str) -> Result<(), DecodeError> {
    object
        .as_ref()
        .map_or(Ok(()), |object| require_object(object, path))
}

fn require_name(object: &Object, path: &'static str) -> Result<ObjectKey, DecodeError> {
    require_object(object, path)?;
    key_of(object).ok_or(DecodeError::MissingName { path })
}

impl MachineObjects {
    fn validate(&mut self, side: Side) -> Result<(), DecodeError> {
        let (machine, infra, bootstrap) = match side {
            Side::Current => (
                "current.machine",
                "current.infrastructureMachine",
                "current.bootstrapConfig",
            ),
            Side::Desired => (
                "desired.machine",
                "desired.infrastructureMachine",
                "desired.bootstrapConfig",
            ),
        };
        self.key = Some(require_name(&self.machine, machine)?);
        optional_object(&self.infrastructure_machine, infra)?;
        optional_object(&self.bootstrap_config, bootstrap)
    }
}

impl MachineSetObjects {
    fn validate(&mut self, side: Side) -> Result<(), DecodeError> {
        let (set, infra, bootstrap) = match side {
            Side::Current => (
                "current.machineSet",
                "current.infrastructureMachineTemplate",
                "current.bootstrapConfigTemplate",
            ),
            Side::Desired => (
                "desired.machineSet",
                "desired.infrastructureMachineTemplate",
                "desired.bootstrapConfigTemplate",
            ),
        };
        self.key = Some(require_name(&self.machine_set, set)?);
        optional_object(&self.infrastructure_machine_template, infra)?;
        optional_object(&self.bootstrap_config_template, bootstrap)
    }
}

#[derive(Clone, Copy)]
enum Side {
    Current,
    Desired,
}

/// The objects of one side (`current` or `desired`) of a CanUpdateMachine request.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineObjects {
    /// The Machine (required).
    pub machine: Object,
    /// The infrastructure machine (e.g. DevMachine), any kind.
    #[serde(default)]
    pub infrastructure_machine: Option<Object>,
    /// The bootstrap config (e.g. KubeadmConfig).
    #[serde(default)]
    pub bootstrap_config: Option<Object>,
    /// The Machine's `namespace/name`, read when the request was validated.
    #[serde(skip)]
    pub key: Option<ObjectKey>,
}

/// The objects of one side of a CanUpdateMachineSet request.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetObjects {
    /// The MachineSet (required).
    pub machine_set: Object,
    /// The infrastructure machine template.
    #[serde(default)]
    pub infrastructure_machine_template: Option<Object>,
    /// The bootstrap config template.
    #[serde(default)]
    pub bootstrap_config_template: Option<Object>,
    /// The MachineSet's `namespace/name`, read when the request was validated.
    #[serde(skip)]
    pub key: Option<ObjectKey>,
}

/// The desired objects of an UpdateMachine request.
pub type UpdateMachineObjects = MachineObjects;

/// `CanUpdateMachineRequest`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineRequest {
    /// TypeMeta `apiVersion`.
    #[serde(default)]
    pub api_version: Option<String>,
    /// TypeMeta `kind`.
    #[serde(default)]
    pub kind: Option<String>,
    /// ExtensionConfig `spec.settings`.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// The objects as they are.
    pub current: MachineObjects,
    /// The objects as they should become.
    pub desired: MachineObjects,
}

impl HookRequest for CanUpdateMachineRequest {
    const KIND: &'static str = "CanUpdateMachineRequest";
    fn type_meta(&self) -> (&Option<String>, &Option<String>) {
        (&self.api_version, &self.kind)
    }
    fn validate(&mut self) -> Result<(), DecodeError> {
        self.current.validate(Side::Current)?;
        self.desired.validate(Side::Desired)
    }
}

/// `CanUpdateMachineSetRequest`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineSetRequest {
    /// TypeMeta `apiVersion`.
    #[serde(default)]
    pub api_version: Option<String>,
    /// TypeMeta `kind`.
    #[serde(default)]
    pub kind: Option<String>,
    /// ExtensionConfig `spec.settings`.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// The objects as they are.
    pub current: MachineSetObjects,
    /// The objects as they should become.
    pub desired: MachineSetObjects,
}

impl HookRequest for CanUpdateMachineSetRequest {
    const KIND: &'static str = "CanUpdateMachineSetRequest";
    fn type_meta(&self) -> (&Option<String>, &Option<String>) {
        (&self.api_version, &self.kind)
    }
    fn validate(&mut self) -> Result<(), DecodeError> {
        self.current.validate(Side::Current)?;
        self.desired.validate(Side::Desired)
    }
}

/// `UpdateMachineRequest`: only the desired objects.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateMachineRequest {
    /// TypeMeta `apiVersion`.
    #[serde(default)]
    pub api_version: Option<String>,
    /// TypeMeta `kind`.
    #[serde(default)]
    pub kind: Option<String>,
    /// ExtensionConfig `spec.settings`.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// The objects with the desired spec already written by CAPI.
    pub desired: UpdateMachineObjects,
}

impl HookRequest for UpdateMachineRequest {
    const KIND: &'static str = "UpdateMachineRequest";
    fn type_meta(&self) -> (&Option<String>, &Option<String>) {
        (&self.api_version, &self.kind)
    }
    fn validate(&mut self) -> Result<(), DecodeError> {
        self.desired.validate(Side::Desired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(body: &str) -> Result<CanUpdateMachineRequest, DecodeError> {
        decode_request(body.as_bytes())
    }

    const MACHINE: &str = r#"{"metadata":{"name":"m","namespace":"ns"},"spec":{}}"#;

    #[test]
    fn names_missing_and_mistyped_fields() {
        let err = decode(&format!(r#"{{"current":{{"machine":{MACHINE}}}}}"#)).unwrap_err();
        assert!(err.to_string().contains("missing field `desired`"), "{err}");
        let err = decode(&format!(
            r#"{{"current":{{"machine":{MACHINE}}},"desired":{{}}}}"#
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("desired: missing field `machine`"),
            "{err}"
        );
        let err = decode(&format!(
            r#"{{"current":{{"machine":{MACHINE}}},"desired":{{"machine":"oops"}}}}"#
        ))
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("field `desired.machine` must be a JSON object, found a string"),
            "{err}"
        );
        let err = decode(&format!(
            r#"{{"settings":{{"mode":1}},"current":{{"machine":{MACHINE}}},"desired":{{"machine":{MACHINE}}}}}"#
        ))
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("settings.mode: invalid type: integer"),
            "{err}"
        );
    }

    #[test]
    fn refuses_wrong_kind_and_nameless_objects() {
        let err = decode(&format!(
            r#"{{"kind":"UpdateMachineRequest","current":{{"machine":{MACHINE}}},"desired":{{"machine":{MACHINE}}}}}"#
        ))
        .unwrap_err();
        assert!(err.to_string().contains("field `kind`"), "{err}");
        let err = decode(&format!(
            r#"{{"current":{{"machine":{MACHINE}}},"desired":{{"machine":{{"spec":{{}}}}}}}}"#
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("desired.machine.metadata.name"),
            "{err}"
        );
        assert!(matches!(decode("  "), Err(DecodeError::Empty { .. })));
    }

    #[test]
    fn accepts_null_optional_objects() {
        let request = decode(&format!(
            r#"{{"current":{{"machine":{MACHINE},"bootstrapConfig":null}},"desired":{{"machine":{MACHINE}}}}}"#
        ))
        .unwrap();
        assert!(request.current.bootstrap_config.is_none());
        assert_eq!(request.desired.key.unwrap().to_string(), "ns/m");
    }
}

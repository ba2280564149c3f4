//! Hook response bodies, written the way CAPI's Go decoder reads them.

use base64::Engine as _;
use serde::{Serialize, Serializer};

use super::{HOOKS_API_VERSION, Hook};

/// `status` of every response: exactly `Success` or `Failure` (CAPI treats anything else as an error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Status {
    /// The hook did its job; for CanUpdate* the patches say what goes in place.
    Success,
    /// A real error (or in-place-only refusal): CAPI stops and retries; it does not fall back.
    Failure,
}

impl Status {
    /// The wire spelling, also used as a metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Success => "Success",
            Status::Failure => "Failure",
        }
    }
}

/// `patchType` of a [`Patch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PatchType {
    /// RFC 6902 JSON Patch (an array of operations).
    #[serde(rename = "JSONPatch")]
    JsonPatch,
    /// RFC 7386 JSON Merge Patch (an object).
    #[serde(rename = "JSONMergePatch")]
    JsonMergePatch,
}

/// A patch CAPI applies to the current object: `patch` is Go `[]byte`, so base64 on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Patch {
    /// How to read `patch`.
    pub patch_type: PatchType,
    /// The raw JSON patch document (serialized as standard padded base64).
    #[serde(serialize_with = "base64_bytes")]
    pub patch: Vec<u8>,
}

fn base64_bytes<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn is_empty(text: &str) -> bool {
    text.is_empty()
}

/// `CanUpdateMachineResponse`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineResponse {
    /// TypeMeta.
    pub api_version: &'static str,
    /// TypeMeta.
    pub kind: &'static str,
    /// Success or Failure.
    pub status: Status,
    /// What operators read.
    #[serde(skip_serializing_if = "is_empty")]
    pub message: String,
    /// Patch for the Machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine_patch: Option<Patch>,
    /// Patch for the infrastructure machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infrastructure_machine_patch: Option<Patch>,
    /// Patch for the bootstrap config.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap_config_patch: Option<Patch>,
    /// Newer CAPI reads this to skip surge machines; older CAPI ignores it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affects_availability: Option<bool>,
}

impl CanUpdateMachineResponse {
    /// An answer with no patches.
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        Self {
            api_version: HOOKS_API_VERSION,
            kind: Hook::CanUpdateMachine.response_kind(),
            status,
            message: message.into(),
            machine_patch: None,
            infrastructure_machine_patch: None,
            bootstrap_config_patch: None,
            affects_availability: None,
        }
    }
}

/// `CanUpdateMachineSetResponse`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineSetResponse {
    /// TypeMeta.
    pub api_version: &'static str,
    /// TypeMeta.
    pub kind: &'static str,
    /// Success or Failure.
    pub status: Status,
    /// What operators read.
    #[serde(skip_serializing_if = "is_empty")]
    pub message: String,
    /// Patch for the MachineSet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine_set_patch: Option<Patch>,
    /// Patch for the infrastructure machine template.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infrastructure_machine_template_patch: Option<Patch>,
    /// Patch for the bootstrap config template.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap_config_template_patch: Option<Patch>,
    /// Newer CAPI reads this to skip surge machines; older CAPI ignores it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affects_availability: Option<bool>,
}

impl CanUpdateMachineSetResponse {
    /// An answer with no patches.
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        Self {
            api_version: HOOKS_API_VERSION,
            kind: Hook::CanUpdateMachineSet.response_kind(),
            status,
            message: message.into(),
            machine_set_patch: None,
            infrastructure_machine_template_patch: None,
            bootstrap_config_template_patch: None,
            affects_availability: None,
        }
    }
}

/// `UpdateMachineResponse` (a CommonRetryResponse).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateMachineResponse {
    /// TypeMeta.
    pub api_version: &'static str,
    /// TypeMeta.
    pub kind: &'static str,
    /// Success (in progress or done) or Failure.
    pub status: Status,
    /// Shown by CAPI as `In-place update in progress: <message>`.
    #[serde(skip_serializing_if = "is_empty")]
    pub message: String,
    /// `> 0`: in progress, call again after this many seconds; `0`: done. Always present (no omitempty in Go).
    pub retry_after_seconds: i32,
}

impl UpdateMachineResponse {
    /// An answer with the given status, message and retry hint.
    pub fn new(status: Status, message: impl Into<String>, retry_after_seconds: i32) -> Self {
        Self {
            api_version: HOOKS_API_VERSION,
            kind: Hook::UpdateMachine.response_kind(),
            status,
            message: message.into(),
            retry_after_seconds,
        }
    }
}

/// `failurePolicy` of a discovered handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum FailurePolicy {
    /// Errors calling the handler stop the caller (CAPI's default).
    Fail,
    /// Transport errors become an empty Success.
    Ignore,
}

/// `requestHook` of a discovered handler.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupVersionHook {
    /// Always [`HOOKS_API_VERSION`].
    pub api_version: &'static str,
    /// The hook's Go type name.
    pub hook: &'static str,
}

/// One entry of `handlers` in discovery.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionHandler {
    /// DNS-1123 label.
    pub name: &'static str,
    /// Which hook it serves.
    pub request_hook: GroupVersionHook,
    /// 0..=30.
    pub timeout_seconds: i32,
    /// Fail or Ignore.
    pub failure_policy: FailurePolicy,
}

/// `DiscoveryResponse`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryResponse {
    /// TypeMeta.
    pub api_version: &'static str,
    /// TypeMeta.
    pub kind: &'static str,
    /// Success or Failure.
    pub status: Status,
    /// What operators read.
    #[serde(skip_serializing_if = "is_empty")]
    pub message: String,
    /// The handlers served.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub handlers: Vec<ExtensionHandler>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_bytes_are_base64_on_the_wire() {
        let mut response = CanUpdateMachineResponse::new(Status::Success, "");
        response.machine_patch = Some(Patch {
            patch_type: PatchType::JsonPatch,
            patch: br#"[{"op":"add","path":"/spec/version","value":"v1.34.1"}]"#.to_vec(),
        });
        let wire = serde_json::to_value(&response).unwrap();
        let encoded = wire["machinePatch"]["patch"].as_str().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        assert!(decoded.starts_with(b"[{\"op\":\"add\""));
        assert_eq!(wire["machinePatch"]["patchType"], "JSONPatch");
        assert_eq!(wire["kind"], "CanUpdateMachineResponse");
        assert!(wire.get("message").is_none());
    }

    #[test]
    fn retry_after_is_always_written() {
        let wire =
            serde_json::to_value(UpdateMachineResponse::new(Status::Success, "done", 0)).unwrap();
        assert_eq!(wire["retryAfterSeconds"], 0);
    }
}

//! Hook answers as CAPI's Go types see them (api/runtime/hooks/v1alpha1), and their decoding.
//!
//! Embedded Go structs (`TypeMeta`, `CommonResponse`, `CommonRetryResponse`) are flattened: Go
//! promotes their fields, so they decode exactly like direct fields.

use crate::godecode::{DecodeCtx, DecodeError, GoDecode, decode_partial, go_struct};
use crate::gojson::parse_first_value;

go_struct! {
    /// A patch in a CanUpdate* answer (`Patch` in inplaceupdate_types.go).
    /// `Debug` shows the size only: patches carry file contents and keys.
    #[derive(Clone, Default, PartialEq, Eq)]
    pub struct Patch {
        /// `patchType`: `JSONPatch`, `JSONMergePatch`; anything else fails when CAPI applies it.
        patch_type: String = "patchType" [omitempty],
        /// `patch`: the RFC 6902 / RFC 7386 document (base64 on the wire).
        bytes: Vec<u8> = "patch" [omitempty],
    }
}

impl Patch {
    /// Go's `Patch.IsDefined`: CAPI applies a patch when it has a type or any bytes.
    pub fn is_defined(&self) -> bool {
        !self.patch_type.is_empty() || !self.bytes.is_empty()
    }
}

impl std::fmt::Debug for Patch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Patch")
            .field("patch_type", &self.patch_type)
            .field("bytes", &format_args!("<{} bytes>", self.bytes.len()))
            .finish()
    }
}

go_struct! {
    /// `CanUpdateMachineResponse`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct CanUpdateMachineResponse {
        /// TypeMeta `apiVersion` (not checked by CAPI).
        api_version: String = "apiVersion" [omitempty],
        /// TypeMeta `kind` (not checked by CAPI).
        kind: String = "kind" [omitempty],
        /// `Success` or `Failure`.
        status: String = "status",
        /// Free text.
        message: String = "message" [omitempty],
        /// Patch for the Machine.
        machine_patch: Patch = "machinePatch" [omitempty, omitzero],
        /// Patch for the infrastructure machine.
        infrastructure_machine_patch: Patch = "infrastructureMachinePatch" [omitempty, omitzero],
        /// Patch for the bootstrap config.
        bootstrap_config_patch: Patch = "bootstrapConfigPatch" [omitempty, omitzero],
        /// `*bool`, on CAPI main after v1.14 only (older releases ignore the key); nil means true.
        affects_availability: Option<bool> = "affectsAvailability" [omitempty],
    }
}

go_struct! {
    /// `CanUpdateMachineSetResponse`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct CanUpdateMachineSetResponse {
        /// TypeMeta `apiVersion` (not checked by CAPI).
        api_version: String = "apiVersion" [omitempty],
        /// TypeMeta `kind` (not checked by CAPI).
        kind: String = "kind" [omitempty],
        /// `Success` or `Failure`.
        status: String = "status",
        /// Free text.
        message: String = "message" [omitempty],
        /// Patch for the MachineSet.
        machine_set_patch: Patch = "machineSetPatch" [omitempty, omitzero],
        /// Patch for the infrastructure machine template.
        infrastructure_machine_template_patch: Patch = "infrastructureMachineTemplatePatch" [omitempty, omitzero],
        /// Patch for the bootstrap config template.
        bootstrap_config_template_patch: Patch = "bootstrapConfigTemplatePatch" [omitempty, omitzero],
        /// `*bool`, on CAPI main after v1.14 only (older releases ignore the key); nil means true.
        affects_availability: Option<bool> = "affectsAvailability" [omitempty],
    }
}

go_struct! {
    /// `UpdateMachineResponse` (a `CommonRetryResponse`).
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct UpdateMachineResponse {
        /// TypeMeta `apiVersion` (not checked by CAPI).
        api_version: String = "apiVersion" [omitempty],
        /// TypeMeta `kind` (not checked by CAPI).
        kind: String = "kind" [omitempty],
        /// `Success` or `Failure`.
        status: String = "status",
        /// Shown in the Machine's `Updating` condition while the update is in progress.
        message: String = "message" [omitempty],
        /// `> 0`: in progress, call again after this many seconds; otherwise done.
        retry_after_seconds: i32 = "retryAfterSeconds",
    }
}

go_struct! {
    /// `GroupVersionHook` of a discovered handler.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct GroupVersionHook {
        /// Must be `hooks.runtime.cluster.x-k8s.io/v1alpha1`.
        api_version: String = "apiVersion",
        /// Hook name, e.g. `CanUpdateMachine`.
        hook: String = "hook",
    }
}

go_struct! {
    /// One `ExtensionHandler` of a discovery answer.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct ExtensionHandler {
        /// Handler name (a DNS-1123 label).
        name: String = "name",
        /// Which hook it serves.
        request_hook: GroupVersionHook = "requestHook",
        /// `timeoutSeconds` (`None`: CAPI uses 10).
        timeout_seconds: Option<i32> = "timeoutSeconds" [omitempty],
        /// `failurePolicy` (`None`: CAPI uses `Fail`).
        failure_policy: Option<String> = "failurePolicy" [omitempty],
    }
}

go_struct! {
    /// `DiscoveryResponse`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct DiscoveryResponse {
        /// TypeMeta `apiVersion` (not checked by CAPI).
        api_version: String = "apiVersion" [omitempty],
        /// TypeMeta `kind` (not checked by CAPI).
        kind: String = "kind" [omitempty],
        /// `Success` or `Failure`.
        status: String = "status",
        /// Free text.
        message: String = "message" [omitempty],
        /// The handlers the extension offers.
        handlers: Vec<ExtensionHandler> = "handlers" [omitempty],
    }
}

/// The common response fields CAPI's runtime client reads and resets.
pub(crate) trait ResponseObject: GoDecode {
    fn status(&self) -> &str;
    fn message(&self) -> &str;
    /// What `failurePolicy: Ignore` does to a response after a call error.
    fn set_default_success(&mut self);
}

macro_rules! response_object {
    ($($ty:ty),*) => {$(
        impl ResponseObject for $ty {
            fn status(&self) -> &str {
                &self.status
            }
            fn message(&self) -> &str {
                &self.message
            }
            fn set_default_success(&mut self) {
                self.status = "Success".into();
                self.message.clear();
            }
        }
    )*};
}
response_object!(
    CanUpdateMachineResponse,
    CanUpdateMachineSetResponse,
    UpdateMachineResponse,
    DiscoveryResponse
);

/// Decodes a 200 body like `json.NewDecoder(body).Decode(&resp)`: returns what Go would have
/// filled in, and Go's error (a syntax error leaves everything zero; a type error does not).
pub(crate) fn decode_body<T: GoDecode>(body: &[u8]) -> (T, Option<DecodeError>) {
    match parse_first_value(body) {
        Err(e) => (T::default(), Some(DecodeError::Syntax(e))),
        Ok(json) => {
            let mut cx = DecodeCtx::default();
            let value = decode_partial(&json, &mut cx);
            (value, cx.first_error().cloned())
        }
    }
}

fn strict<T: GoDecode>(body: &[u8]) -> Result<T, DecodeError> {
    match decode_body(body) {
        (value, None) => Ok(value),
        (_, Some(e)) => Err(e),
    }
}

/// Decodes a CanUpdateMachine answer body with Go's rules (status is not checked here).
pub fn decode_can_update_machine_response(
    body: &[u8],
) -> Result<CanUpdateMachineResponse, DecodeError> {
    strict(body)
}

/// Decodes a CanUpdateMachineSet answer body with Go's rules (status is not checked here).
pub fn decode_can_update_machine_set_response(
    body: &[u8],
) -> Result<CanUpdateMachineSetResponse, DecodeError> {
    strict(body)
}

/// `affectsAvailability` of a CanUpdateMachine (`machine_set` false) or CanUpdateMachineSet answer as CAPI
/// releases after v1.14 read it: the decoded `*bool`, nil meaning true. Releases up to v1.14 do not read it.
pub fn affects_availability(machine_set: bool, body: &[u8]) -> Result<bool, DecodeError> {
    let field = if machine_set {
        decode_can_update_machine_set_response(body)?.affects_availability
    } else {
        decode_can_update_machine_response(body)?.affects_availability
    };
    Ok(field.unwrap_or(true))
}

/// Decodes an UpdateMachine answer body with Go's rules (status is not checked here).
pub fn decode_update_machine_response(body: &[u8]) -> Result<UpdateMachineResponse, DecodeError> {
    strict(body)
}

/// Decodes a Discovery answer body with Go's rules (nothing is validated here).
pub fn decode_discovery_response(body: &[u8]) -> Result<DiscoveryResponse, DecodeError> {
    strict(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capitalised_keys_decode_and_unknown_keys_are_ignored() {
        let r = decode_can_update_machine_response(br#"{"Status":"Success","MACHINEPATCH":{"PatchType":"JSONPatch","Patch":"W10="},"AffectsAvailability":false,"other":1}"#).unwrap();
        assert_eq!(r.status, "Success");
        assert_eq!(r.affects_availability, Some(false));
        assert_eq!(
            r.machine_patch,
            Patch {
                patch_type: "JSONPatch".into(),
                bytes: b"[]".to_vec()
            }
        );
    }

    #[test]
    fn raw_json_patch_array_in_patch_is_an_error() {
        let body = br#"{"status":"Success","machinePatch":{"patchType":"JSONPatch","patch":[{"op":"replace","path":"/spec/version","value":"v1.34.1"}]}}"#;
        assert!(matches!(
            decode_can_update_machine_response(body),
            Err(DecodeError::Type { .. })
        ));
        let body = br#"{"status":"Success","bootstrapConfigPatch":{"patchType":"JSONMergePatch","patch":{"spec":{}}}}"#;
        assert!(decode_can_update_machine_response(body).is_err());
    }

    #[test]
    fn retry_after_seconds_must_be_an_int32() {
        for bad in ["1.5", "\"5\"", "2147483648", "true", "5e0"] {
            let body = format!(r#"{{"status":"Success","retryAfterSeconds":{bad}}}"#);
            assert!(
                decode_update_machine_response(body.as_bytes()).is_err(),
                "{bad}"
            );
        }
        let r = decode_update_machine_response(
            br#"{"status":"Success","retryAfterSeconds":-5,"retryAfterSeconds":null}"#,
        )
        .unwrap();
        assert_eq!(r.retry_after_seconds, -5);
    }

    #[test]
    fn debug_of_a_patch_hides_its_bytes() {
        let p = Patch {
            patch_type: "JSONMergePatch".into(),
            bytes: b"{\"spec\":{\"users\":[{\"passwd\":\"hunter2\"}]}}".to_vec(),
        };
        let shown = format!("{p:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("bytes"),
            "{shown}"
        );
    }

    #[test]
    fn discovery_handlers_decode_with_optional_fields() {
        let r = decode_discovery_response(br#"{"status":"Success","handlers":[{"name":"a","requestHook":{"apiVersion":"x","hook":"UpdateMachine"},"timeoutSeconds":null,"failurePolicy":"Ignore"}]}"#).unwrap();
        assert_eq!(r.handlers[0].timeout_seconds, None);
        assert_eq!(r.handlers[0].failure_policy.as_deref(), Some("Ignore"));
    }
}

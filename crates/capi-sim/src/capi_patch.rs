//! How CAPI applies one hook patch to one object (internal/util/patch/patch.go): patch the whole
//! object, read the result back as an unstructured object, copy back only the patch path (`spec`,
//! or `spec.template.spec` for templates); typed objects are then re-read through their Go struct.

use serde_json::{Map, Value};

use crate::godecode::{DecodeError, GoEncode, fold_eq};
use crate::machine::{Machine, MachineSet, decode_typed};
use crate::wire::Patch;
use crate::{evanphx, godecode};

/// Copy-back path for Machines, bootstrap configs and infrastructure machines.
pub const SPEC_PATH: &[&str] = &["spec"];

/// Copy-back path for MachineSets and templates.
pub const TEMPLATE_SPEC_PATH: &[&str] = &["spec", "template", "spec"];

/// Why CAPI fails to apply a patch (the KCP / MachineDeployment reconcile then errors).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// Bytes without a `patchType`.
    #[error("failed to apply patch: patchType is not set")]
    MissingPatchType,
    /// A `patchType` other than `JSONPatch` / `JSONMergePatch`.
    #[error("failed to apply patch: unknown patchType {0}")]
    UnknownPatchType(String),
    /// The JSON Patch document does not decode (evanphx `DecodePatch`).
    #[error("failed to apply patch: error decoding json patch (RFC6902): {0}")]
    DecodeJsonPatch(String),
    /// An operation fails (e.g. `replace` of a missing path).
    #[error("failed to apply patch: error applying json patch (RFC6902): {0}")]
    ApplyJsonPatch(String),
    /// The merge patch is not valid JSON.
    #[error("failed to apply patch: error applying json merge patch (RFC7386): {0}")]
    MergePatch(String),
    /// The patched object cannot be read back or the copy-back fails.
    #[error("failed to apply patch to object: {0}")]
    CopyBack(String),
    /// The patched typed object (Machine, MachineSet) does not decode into its Go struct.
    #[error("failed to decode patched {kind}: {error}")]
    TypedDecode {
        /// Kind of the object.
        kind: String,
        /// Go's decode error.
        error: DecodeError,
    },
}

/// `ApplyPatchToObject`: applies `patch` to the whole `obj`, then copies back only `path`.
/// Returns `obj` unchanged for an empty patch (`[]`, `null`; merge patch `""` or exactly `{}`).
pub fn apply_patch_the_capi_way(
    obj: &Value,
    patch: &Patch,
    path: &[&str],
) -> Result<Value, PatchError> {
    Ok(apply_to_object(obj, patch, path)?.unwrap_or_else(|| obj.clone()))
}

/// Like [`apply_patch_the_capi_way`], but `None` when CAPI considers the object unchanged.
fn apply_to_object(obj: &Value, patch: &Patch, path: &[&str]) -> Result<Option<Value>, PatchError> {
    let patched = match patch.patch_type.as_str() {
        "" => return Err(PatchError::MissingPatchType),
        "JSONPatch" => {
            let decoded =
                evanphx::decode_json_patch(&patch.bytes).map_err(PatchError::DecodeJsonPatch)?;
            if decoded.is_empty() {
                return Ok(None);
            }
            decoded.apply(obj).map_err(PatchError::ApplyJsonPatch)?
        }
        "JSONMergePatch" => {
            if patch.bytes.is_empty() || patch.bytes == b"{}" {
                return Ok(None);
            }
            evanphx::apply_merge_patch(obj, &patch.bytes).map_err(PatchError::MergePatch)?
        }
        other => return Err(PatchError::UnknownPatchType(other.to_string())),
    };
    copy_back(obj, &patched, path).map(Some)
}

/// `patch.Patch`: reads both objects as unstructured, copies `path` from patched into current.
fn copy_back(current: &Value, patched: &Value, path: &[&str]) -> Result<Value, PatchError> {
    check_unstructured(current).map_err(|e| {
        PatchError::CopyBack(format!("failed to convert object to Unstructured: {e}"))
    })?;
    check_unstructured(patched).map_err(|e| {
        PatchError::CopyBack(format!(
            "failed to convert patched object to Unstructured: {e}"
        ))
    })?;
    let mut out = current.clone();
    // CAPI ignores NestedFieldNoCopy's error (found is false then): nothing is copied.
    if let Ok(Some(value)) = nested_field(patched, path) {
        set_nested_field(&mut out, value.clone(), path).map_err(PatchError::CopyBack)?;
    }
    Ok(out)
}

/// What Kubernetes' universal deserializer demands of an unstructured object.
fn check_unstructured(obj: &Value) -> Result<(), String> {
    let Value::Object(map) = obj else {
        return Err("couldn't get version/kind; json parse error: not a JSON object".into());
    };
    // SimpleMetaFactory.Interpret: encoding/json into {apiVersion, kind}, case-insensitive keys.
    for (key, value) in map {
        if (fold_eq("apiVersion", key) || fold_eq("kind", key))
            && !(value.is_string() || value.is_null())
        {
            return Err(format!(
                "couldn't get version/kind; json parse error: {key} is not a string"
            ));
        }
    }
    let api_version = map
        .get("apiVersion")
        .or_else(|| {
            map.iter()
                .find(|(k, _)| fold_eq("apiVersion", k))
                .map(|(_, v)| v)
        })
        .and_then(Value::as_str)
        .unwrap_or("");
    if api_version != "/" && api_version.matches('/').count() > 1 {
        return Err(format!("unexpected GroupVersion string: {api_version}"));
    }
    match map.get("kind").and_then(Value::as_str) {
        Some(kind) if !kind.is_empty() => Ok(()),
        _ => Err("Object 'Kind' is missing".into()),
    }
}

/// `unstructured.NestedFieldNoCopy`: `Ok(None)` when absent (or below a `null`), `Err` when a
/// parent is not an object.
pub(crate) fn nested_field<'a>(obj: &'a Value, path: &[&str]) -> Result<Option<&'a Value>, String> {
    let mut value = obj;
    for (i, field) in path.iter().enumerate() {
        match value {
            Value::Null => return Ok(None),
            Value::Object(map) => match map.get(*field) {
                Some(v) => value = v,
                None => return Ok(None),
            },
            _ => {
                return Err(format!(
                    ".{} accessor error: expected map[string]interface{{}}",
                    path[..=i].join(".")
                ));
            }
        }
    }
    Ok(Some(value))
}

/// `unstructured.SetNestedField`.
fn set_nested_field(obj: &mut Value, value: Value, path: &[&str]) -> Result<(), String> {
    let Some((last, parents)) = path.split_last() else {
        return Ok(());
    };
    let mut map = obj.as_object_mut().ok_or("object is not a map")?;
    for (i, field) in parents.iter().enumerate() {
        let entry = map.entry(field.to_string()).or_insert(Value::Null);
        if entry.is_null() {
            *entry = Value::Object(Map::new());
        }
        map = entry.as_object_mut().ok_or_else(|| {
            format!(
                "value cannot be set because .{} is not a map[string]interface{{}}",
                path[..=i].join(".")
            )
        })?;
    }
    map.insert(last.to_string(), value);
    Ok(())
}

/// `ApplyPatchToTypedObject` for a Machine: the Machine is first written as Go writes it, patched,
/// copied back (`spec`) and re-read through the Go struct. Returns the Go-written Machine JSON.
pub fn apply_patch_to_machine(machine: &Value, patch: &Patch) -> Result<Value, PatchError> {
    apply_typed::<Machine>(machine, patch, SPEC_PATH, "Machine")
}

/// `ApplyPatchToTypedObject` for a MachineSet (copy-back path `spec.template.spec`).
pub fn apply_patch_to_machine_set(machine_set: &Value, patch: &Patch) -> Result<Value, PatchError> {
    apply_typed::<MachineSet>(machine_set, patch, TEMPLATE_SPEC_PATH, "MachineSet")
}

fn apply_typed<T: godecode::GoDecode + GoEncode>(
    obj: &Value,
    patch: &Patch,
    path: &[&str],
    kind: &str,
) -> Result<Value, PatchError> {
    let typed_error = |error| PatchError::TypedDecode {
        kind: kind.to_string(),
        error,
    };
    let current: T = decode_typed(obj).map_err(typed_error)?;
    let raw = current.go_encode();
    match apply_to_object(&raw, patch, path)? {
        None => Ok(raw),
        Some(patched) => {
            let reread: T = decode_typed(&patched).map_err(typed_error)?;
            Ok(reread.go_encode())
        }
    }
}

#[cfg(test)]
#[path = "capi_patch_tests.rs"]
mod tests;

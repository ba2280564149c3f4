//! Applying a patch exactly as CAPI does (internal/util/patch/patch.go): to the whole current
//! object, then copying back only `spec` (or `spec.template.spec`); if the patched object lacks that
//! part, the current one stays. JSON Patch goes through the json-patch crate (RFC 6902 like CAPI's
//! evanphx/json-patch v5); merge patch follows evanphx's `MergePatch`, which also strips `null`s nested
//! inside values it inserts — the json-patch crate's `merge` does not, so that part is ours.

use serde_json::Value;

use super::{Patch, PatchType};
use crate::objects::{self, Scope};

/// Why CAPI could not apply a patch (it would make the whole CanUpdate call an error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The bytes do not decode as the declared patch type.
    #[error("cannot decode {patch_type} patch: {problem}")]
    Decode {
        /// Declared type.
        patch_type: PatchType,
        /// Decoder message.
        problem: String,
    },
    /// An operation does not apply (e.g. `replace` of a missing path).
    #[error("JSON patch does not apply: {0}")]
    Apply(String),
}

/// The compared part (`spec` or `spec.template.spec`) of `current` after CAPI applied `patch` to it.
pub fn apply(scope: Scope, current: &Value, patch: &Patch) -> Result<Option<Value>, ApplyError> {
    let decode = |problem: String| ApplyError::Decode {
        patch_type: patch.patch_type,
        problem,
    };
    let mut doc = match patch.patch_type {
        PatchType::JsonPatch => {
            let ops: json_patch::Patch =
                serde_json::from_slice(&patch.bytes).map_err(|e| decode(e.to_string()))?;
            let mut doc = current.clone();
            json_patch::patch_unsafe(&mut doc, &ops.0)
                .map_err(|e| ApplyError::Apply(e.to_string()))?;
            doc
        }
        PatchType::JsonMergePatch if patch.bytes.is_empty() => current.clone(),
        PatchType::JsonMergePatch => {
            let p: Value =
                serde_json::from_slice(&patch.bytes).map_err(|e| decode(e.to_string()))?;
            go_merge_patch(current, p)
        }
    };
    // Move the compared part out rather than copying it (it can be megabytes of file contents).
    match doc.pointer_mut(scope.pointer()) {
        Some(region) => Ok(Some(region.take())),
        None => Ok(objects::region(scope, current).cloned()),
    }
}

/// evanphx/json-patch v5 `MergePatch(doc, patch)`: the merged document. Parts of `doc` the patch
/// replaces are never copied.
pub fn go_merge_patch(doc: &Value, patch: Value) -> Value {
    match (doc, patch) {
        (Value::Object(d), Value::Object(p)) => Value::Object(merge_docs(d, p)),
        (_, mut p) => {
            prune_nulls(&mut p);
            p
        }
    }
}

fn merge_docs(
    doc: &serde_json::Map<String, Value>,
    mut patch: serde_json::Map<String, Value>,
) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    for (k, cur) in doc {
        match patch.remove(k) {
            None => {
                out.insert(k.clone(), cur.clone());
            }
            // `null` deletes.
            Some(Value::Null) => {}
            Some(p) => {
                out.insert(k.clone(), merge_value(cur, p));
            }
        }
    }
    for (k, mut v) in patch {
        if !v.is_null() {
            prune_nulls(&mut v);
            out.insert(k, v);
        }
    }
    out
}

fn merge_value(cur: &Value, patch: Value) -> Value {
    match (cur, patch) {
        (Value::Object(c), Value::Object(p)) => Value::Object(merge_docs(c, p)),
        // Current is an object, the patch value is not: taken as is (evanphx does not prune here).
        (Value::Object(_), p) => p,
        // Current is null or not an object: the patch value, without nested nulls.
        (_, mut p) => {
            prune_nulls(&mut p);
            p
        }
    }
}

fn prune_nulls(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(prune_nulls);
        }
        Value::Array(items) => items
            .iter_mut()
            .filter(|v| !v.is_null())
            .for_each(prune_nulls),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_prunes_nulls_in_inserted_values_like_go() {
        let doc = json!({"spec": {"list": [1], "obj": {"a": 1}}});
        let doc = go_merge_patch(
            &doc,
            json!({"spec": {"list": [{"x": null, "y": 1}, null], "obj": {"a": null, "b": 2}, "new": {"z": null}}}),
        );
        assert_eq!(
            doc,
            json!({"spec": {"list": [{"y": 1}, null], "obj": {"b": 2}, "new": {}}})
        );
        // Current object, patch array: no pruning.
        let doc = json!({"spec": {"o": {"a": 1}}, "n": null});
        let doc = go_merge_patch(
            &doc,
            json!({"spec": {"o": [{"x": null}]}, "n": {"a": null, "b": 1}}),
        );
        assert_eq!(doc, json!({"spec": {"o": [{"x": null}]}, "n": {"b": 1}}));
    }

    #[test]
    fn copies_back_only_the_compared_part() {
        let cur = json!({"metadata": {"name": "a"}, "spec": {"v": 1}});
        let p = Patch { patch_type: PatchType::JsonPatch, bytes: br#"[{"op":"replace","path":"/metadata/name","value":"b"},{"op":"replace","path":"/spec/v","value":2}]"#.to_vec() };
        assert_eq!(
            apply(Scope::Object, &cur, &p).unwrap(),
            Some(json!({"v": 2}))
        );
        let gone = Patch {
            patch_type: PatchType::JsonPatch,
            bytes: br#"[{"op":"remove","path":"/spec"}]"#.to_vec(),
        };
        assert_eq!(
            apply(Scope::Object, &cur, &gone).unwrap(),
            Some(json!({"v": 1}))
        );
        let bad = Patch {
            patch_type: PatchType::JsonPatch,
            bytes: br#"[{"op":"replace","path":"/spec/missing","value":2}]"#.to_vec(),
        };
        assert!(matches!(
            apply(Scope::Object, &cur, &bad),
            Err(ApplyError::Apply(_))
        ));
    }
}

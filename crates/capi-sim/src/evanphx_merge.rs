//! JSON Merge Patch (RFC 7386) the way evanphx/json-patch v5 `MergePatch` applies it; see the
//! evanphx module for the quirks (null pruning, also inside arrays of newly set members).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::gojson::{GoJson, parse_document, to_value};

/// Applies an RFC 7386 merge patch the evanphx v5 `MergePatch` way. The result may be a non-object
/// (a non-object patch replaces the document); CAPI then fails to read it back.
pub fn apply_merge_patch(doc: &Value, patch: &[u8]) -> Result<Value, String> {
    let parsed = parse_document(patch).map_err(|e| format!("Invalid JSON Patch: {e}"))?;
    match (&parsed, doc) {
        (GoJson::Object(members), Value::Object(map)) => {
            let mut map = map.clone();
            merge_docs(&mut map, members)?;
            Ok(Value::Object(map))
        }
        (GoJson::Object(_), _) => Ok(prune_nulls(to_value(&parsed)?)),
        (GoJson::Array(_), _) => Ok(prune_nulls(to_value(&parsed)?)),
        _ => to_value(&parsed),
    }
}

fn merge_docs(doc: &mut Map<String, Value>, patch: &[(String, GoJson)]) -> Result<(), String> {
    let patch: BTreeMap<&str, &GoJson> = patch.iter().map(|(k, v)| (k.as_str(), v)).collect();
    for (key, value) in patch {
        if matches!(value, GoJson::Null) {
            doc.remove(key);
            continue;
        }
        match doc.get_mut(key) {
            Some(current) if !current.is_null() => {
                let merged = merge(current, value)?;
                *current = merged;
            }
            _ => {
                doc.insert(key.to_string(), prune_nulls(to_value(value)?));
            }
        }
    }
    Ok(())
}

fn merge(current: &mut Value, patch: &GoJson) -> Result<Value, String> {
    let Value::Object(map) = current else {
        return Ok(prune_nulls(to_value(patch)?));
    };
    let GoJson::Object(members) = patch else {
        return to_value(patch);
    };
    let mut map = std::mem::take(map);
    merge_docs(&mut map, members)?;
    Ok(Value::Object(map))
}

fn prune_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, prune_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(prune_nulls).collect()),
        other => other,
    }
}

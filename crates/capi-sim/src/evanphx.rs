//! JSON Patch and JSON Merge Patch with the semantics of github.com/evanphx/json-patch/v5 (v5.9.11),
//! the library CAPI applies hook patches with.
//!
//! It is RFC 6902 / RFC 7386 plus quirks a faithful simulator must keep (the `json-patch` crate
//! implements the RFCs, so it is used as a cross-check in tests, not here):
//! - decoding: the patch must be valid JSON, a JSON array (or `null` = no operations); `add` and
//!   `replace` need a `value` key (`null` allowed), `move`/`copy` a string `from`; `op` must be a
//!   known name, `path` a string;
//! - array indices go through Go's `strconv.Atoi` (`+1`, `01` accepted) and may be negative
//!   (counted from the end); a path without a leading `/` acts on its last segment at the root;
//! - `test` of a missing object member passes when the value is `null` (or absent); scalars compare
//!   by their compact JSON text (`1` is not `1.0`); comparing arrays that hold `null` panics in
//!   evanphx, which CAPI recovers as an error;
//! - merge patch: `null` members delete; a member whose target is absent, `null` or not an object
//!   is set with its nested `null`s pruned (also inside arrays); a non-object member replacing an
//!   object is set as is.
//!
//! - an empty last token (`/` or `/a/`) reads, in evanphx, the node itself: the whole document at
//!   the root, `null` below it; `copy`/`test` from `""` read the whole document.
//!
//! Known divergences (none arise from patches a sane extension emits): an empty reference token in
//! the middle of a path (`/a//b`) is treated as a missing member; the whole document read through
//! `""` is the current one (evanphx reads the original bytes); values are held parsed, so a `test`
//! of a number written earlier by `add` compares its Go-printed form, not its original text.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::gojson::{GoJson, go_number_literal, parse_document, to_value};

pub use crate::evanphx_merge::apply_merge_patch;

/// One decoded operation: member name → value (`None` = JSON `null`, i.e. Go's nil RawMessage).
type Operation<'a> = BTreeMap<&'a str, Option<&'a GoJson>>;

fn operation(json: &GoJson) -> Result<Operation<'_>, String> {
    match json {
        // A null element is a nil map: it has no "op", so validation rejects it.
        GoJson::Null => Ok(BTreeMap::new()),
        GoJson::Object(members) => Ok(members
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    if matches!(v, GoJson::Null) {
                        None
                    } else {
                        Some(v)
                    },
                )
            })
            .collect()),
        other => Err(format!(
            "cannot unmarshal {} into Go value of type jsonpatch.Operation",
            other.kind_name()
        )),
    }
}

fn string_member(op: &Operation<'_>, name: &str) -> Result<String, String> {
    match op.get(name) {
        Some(Some(GoJson::String(s))) => Ok(s.clone()),
        Some(Some(other)) => Err(format!(
            "cannot unmarshal {} into Go value of type string",
            other.kind_name()
        )),
        _ => Err(format!("operation missing {name} field: missing value")),
    }
}

fn kind<'a>(op: &Operation<'a>) -> &'a str {
    match op.get("op") {
        Some(Some(GoJson::String(s))) => s.as_str(),
        _ => "unknown",
    }
}

/// A JSON Patch that passed evanphx v5 `DecodePatch`.
#[derive(Debug)]
pub struct JsonPatch {
    parsed: GoJson,
}

/// evanphx v5 `DecodePatch`: the patch must be valid JSON, an array of valid operations or `null`.
pub fn decode_json_patch(patch: &[u8]) -> Result<JsonPatch, String> {
    let parsed = parse_document(patch).map_err(|e| format!("invalid state detected: {e}"))?;
    let decoded = JsonPatch { parsed };
    for op in decoded.operations()? {
        validate(&op)?;
    }
    Ok(decoded)
}

impl JsonPatch {
    fn operations(&self) -> Result<Vec<Operation<'_>>, String> {
        match &self.parsed {
            GoJson::Null => Ok(Vec::new()),
            GoJson::Array(items) => items.iter().map(operation).collect(),
            other => Err(format!(
                "cannot unmarshal {} into Go value of type jsonpatch.Patch",
                other.kind_name()
            )),
        }
    }

    /// Whether the patch has no operations (CAPI then leaves the object alone).
    pub fn is_empty(&self) -> bool {
        self.operations().map_or(true, |ops| ops.is_empty())
    }

    /// evanphx v5 `Patch.Apply` on a parsed document.
    pub fn apply(&self, doc: &Value) -> Result<Value, String> {
        let mut doc = doc.clone();
        for op in self.operations()? {
            apply_operation(&mut doc, &op)?;
        }
        Ok(doc)
    }
}

/// Decodes and applies an RFC 6902 patch document to `doc` as evanphx v5 does.
/// `Ok(None)`: the patch has no operations.
pub fn apply_json_patch(doc: &Value, patch: &[u8]) -> Result<Option<Value>, String> {
    let decoded = decode_json_patch(patch)?;
    if decoded.is_empty() {
        return Ok(None);
    }
    decoded.apply(doc).map(Some)
}

fn validate(op: &Operation<'_>) -> Result<(), String> {
    let name = kind(op);
    match name {
        "add" | "replace" if !op.contains_key("value") => {
            return Err(format!(
                "invalid operation: failed to decode 'value' of {name}: missing value"
            ));
        }
        "add" | "replace" | "remove" | "test" => {}
        "move" | "copy" => {
            string_member(op, "from")
                .map_err(|e| format!("invalid operation: failed to decode 'from': {e}"))?;
        }
        _ => return Err("invalid operation: unsupported operation".into()),
    }
    string_member(op, "path")
        .map_err(|e| format!("invalid operation: failed to decode 'path': {e}"))?;
    Ok(())
}

fn value_of(op: &Operation<'_>) -> Result<Value, String> {
    match op.get("value") {
        Some(Some(v)) => to_value(v),
        _ => Ok(Value::Null),
    }
}

fn apply_operation(doc: &mut Value, op: &Operation<'_>) -> Result<(), String> {
    let path = string_member(op, "path")?;
    match kind(op) {
        "add" => {
            let value = value_of(op)?;
            if path.is_empty() {
                return replace_root(doc, value, "add");
            }
            let t = find_object(doc, &path).ok_or_else(|| {
                format!("add operation does not apply: doc is missing path: {path:?}")
            })?;
            add(t.con, &t.key, value).map_err(|e| format!("error in add for path: '{path}': {e}"))
        }
        "remove" => {
            let t = find_object(doc, &path).ok_or_else(|| {
                format!("remove operation does not apply: doc is missing path: {path:?}")
            })?;
            remove(t.con, &t.key).map_err(|e| format!("error in remove for path: '{path}': {e}"))
        }
        "replace" => {
            let value = value_of(op)?;
            if path.is_empty() {
                return replace_root(doc, value, "replace");
            }
            let t = find_object(doc, &path).ok_or_else(|| {
                format!("replace operation does not apply: doc is missing path: {path}")
            })?;
            get(&t).map_err(|_| {
                format!("replace operation does not apply: doc is missing key: {path}")
            })?;
            set(t.con, &t.key, value)
        }
        "move" => {
            let from = string_member(op, "from")?;
            if from.is_empty() {
                return Err(
                    "unable to move entire document to another path: invalid state detected".into(),
                );
            }
            let t = find_object(doc, &from).ok_or_else(|| {
                format!("move operation does not apply: doc is missing from path: {from}")
            })?;
            let value = get(&t)
                .map_err(|e| format!("error in move for path: '{}': {e}", t.key))?
                .unwrap_or(Value::Null);
            remove(t.con, &t.key)
                .map_err(|e| format!("error in move for path: '{}': {e}", t.key))?;
            let t = find_object(doc, &path).ok_or_else(|| {
                format!("move operation does not apply: doc is missing destination path: {path}")
            })?;
            add(t.con, &t.key, value).map_err(|e| format!("error in move for path: '{path}': {e}"))
        }
        "copy" => {
            let from = string_member(op, "from")?;
            let t = find_object(doc, &from).ok_or_else(|| {
                format!("copy operation does not apply: doc is missing from path: {from:?}")
            })?;
            let value = get(&t)
                .map_err(|e| format!("error in copy for from: '{from}': {e}"))?
                .unwrap_or(Value::Null);
            let t = find_object(doc, &path).ok_or_else(|| {
                format!("copy operation does not apply: doc is missing destination path: {path}")
            })?;
            add(t.con, &t.key, value)
                .map_err(|e| format!("error while adding value during copy: {e}"))
        }
        "test" => test(doc, op, &path),
        other => Err(format!("Unexpected kind: {other}")),
    }
}

fn replace_root(doc: &mut Value, value: Value, op: &str) -> Result<(), String> {
    match value {
        Value::Object(_) | Value::Array(_) => {
            *doc = value;
            Ok(())
        }
        _ => Err(format!(
            "{op} operation value for the whole document must be object or array"
        )),
    }
}

fn decode_token(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Where an operation acts: the container holding the path's last token, and that token.
struct Target<'a> {
    con: &'a mut Value,
    key: String,
    at_root: bool,
}

/// evanphx `findObject`.
fn find_object<'a>(doc: &'a mut Value, path: &str) -> Option<Target<'a>> {
    let split: Vec<&str> = path.split('/').collect();
    if split.len() < 2 {
        return path.is_empty().then(|| Target {
            con: doc,
            key: String::new(),
            at_root: true,
        });
    }
    let parts = &split[1..split.len() - 1];
    let mut con = doc;
    for part in parts {
        let next = get_mut(con, &decode_token(part))?;
        if !(next.is_object() || next.is_array()) {
            return None;
        }
        con = next;
    }
    Some(Target {
        con,
        key: decode_token(split[split.len() - 1]),
        at_root: parts.is_empty(),
    })
}

/// Go's `strconv.Atoi`.
fn atoi(key: &str) -> Result<i64, String> {
    let digits = key.strip_prefix(['+', '-']).unwrap_or(key);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("strconv.Atoi: parsing {key:?}: invalid syntax"));
    }
    key.trim_start_matches('+')
        .parse()
        .map_err(|_| format!("strconv.Atoi: parsing {key:?}: value out of range"))
}

/// Resolves an index the evanphx way for `get`/`set`/`remove` on an array of `len` elements.
fn index(key: &str, len: usize) -> Result<usize, String> {
    let mut idx = atoi(key)?;
    let n = i64::try_from(len).unwrap_or(i64::MAX);
    if idx >= n {
        return Err(format!(
            "Unable to access invalid index: {idx}: invalid index referenced"
        ));
    }
    if idx < 0 {
        if idx < -n {
            return Err(format!(
                "Unable to access invalid index: {idx}: invalid index referenced"
            ));
        }
        idx += n;
    }
    usize::try_from(idx).map_err(|_| "invalid index referenced".to_string())
}

fn get_mut<'a>(con: &'a mut Value, key: &str) -> Option<&'a mut Value> {
    match con {
        Value::Object(_) if key.is_empty() => None,
        Value::Object(map) => map.get_mut(key),
        Value::Array(items) => {
            let i = index(key, items.len()).ok()?;
            items.get_mut(i)
        }
        _ => None,
    }
}

/// evanphx `container.get`, cloned. `Ok(None)`: evanphx's nil node (a `null`, or `""` below the root).
fn get(target: &Target<'_>) -> Result<Option<Value>, GetError> {
    let found = match &*target.con {
        Value::Object(_) if target.key.is_empty() => {
            return Ok(target.at_root.then(|| target.con.clone()));
        }
        Value::Object(map) => map.get(&target.key).ok_or(GetError::Missing)?,
        Value::Array(items) => &items[index(&target.key, items.len()).map_err(GetError::Other)?],
        _ => return Err(GetError::Other("invalid state detected".into())),
    };
    Ok((!found.is_null()).then(|| found.clone()))
}

/// Why `get` failed; a missing object member is the one failure `test` forgives.
enum GetError {
    Missing,
    Other(String),
}

impl std::fmt::Display for GetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GetError::Missing => f.write_str("unable to get nonexistent key: missing value"),
            GetError::Other(e) => f.write_str(e),
        }
    }
}

fn set(con: &mut Value, key: &str, value: Value) -> Result<(), String> {
    match con {
        Value::Object(map) => {
            map.insert(key.to_string(), value);
        }
        Value::Array(items) => {
            let i = index(key, items.len())?;
            items[i] = value;
        }
        _ => return Err("invalid state detected".into()),
    }
    Ok(())
}

fn add(con: &mut Value, key: &str, value: Value) -> Result<(), String> {
    match con {
        Value::Object(map) => {
            map.insert(key.to_string(), value);
        }
        Value::Array(items) if key == "-" => items.push(value),
        Value::Array(items) => {
            let mut idx = atoi(key)
                .map_err(|e| format!("value was not a proper array index: '{key}': {e}"))?;
            let size = i64::try_from(items.len() + 1).unwrap_or(i64::MAX);
            if idx >= size || idx < -size {
                return Err(format!(
                    "Unable to access invalid index: {idx}: invalid index referenced"
                ));
            }
            if idx < 0 {
                idx += size;
            }
            let at = usize::try_from(idx).map_err(|_| "invalid index referenced".to_string())?;
            items.insert(at, value);
        }
        _ => return Err("invalid state detected".into()),
    }
    Ok(())
}

fn remove(con: &mut Value, key: &str) -> Result<(), String> {
    match con {
        Value::Object(map) => map
            .remove(key)
            .map(|_| ())
            .ok_or_else(|| format!("unable to remove nonexistent key: {key}: missing value")),
        Value::Array(items) => {
            let i = index(key, items.len())?;
            items.remove(i);
            Ok(())
        }
        _ => Err("invalid state detected".into()),
    }
}

fn test(doc: &mut Value, op: &Operation<'_>, path: &str) -> Result<(), String> {
    let expected: Option<&GoJson> = op.get("value").copied().flatten();
    let actual: Option<Value> = if path.is_empty() {
        Some(doc.clone())
    } else {
        let t = find_object(doc, path)
            .ok_or_else(|| format!("test operation does not apply: is missing path: {path}"))?;
        match get(&t) {
            Ok(v) => v,
            Err(GetError::Missing) => None,
            Err(e) => return Err(format!("error in test for path: '{path}': {e}")),
        }
    };
    let passed = match (&actual, expected) {
        (None, None) => true,
        (None, Some(_)) | (Some(_), None) => false,
        (Some(actual), Some(expected)) => equal(actual, expected).map_err(|_| {
            "observed a panic when applying patch: nil pointer dereference".to_string()
        })?,
    };
    if passed {
        Ok(())
    } else {
        Err(format!("testing value {path} failed: test failed"))
    }
}

/// evanphx `lazyNode.equal` (document side vs. patch side). `Err`: evanphx panics (a `null`
/// element met while comparing arrays).
fn equal(actual: &Value, expected: &GoJson) -> Result<bool, ()> {
    match actual {
        Value::Object(map) => {
            let GoJson::Object(members) = expected else {
                return Ok(false);
            };
            let expected: BTreeMap<&str, &GoJson> =
                members.iter().map(|(k, v)| (k.as_str(), v)).collect();
            if map.len() != expected.len() {
                return Ok(false);
            }
            for (k, v) in map {
                let Some(ev) = expected.get(k.as_str()) else {
                    return Ok(false);
                };
                match (v.is_null(), matches!(ev, GoJson::Null)) {
                    (true, true) => continue,
                    (false, false) => {
                        if !equal(v, ev)? {
                            return Ok(false);
                        }
                    }
                    _ => return Ok(false),
                }
            }
            Ok(true)
        }
        Value::Array(items) => {
            let GoJson::Array(expected) = expected else {
                return Ok(false);
            };
            if items.len() != expected.len() {
                return Ok(false);
            }
            for (v, ev) in items.iter().zip(expected) {
                if v.is_null() || matches!(ev, GoJson::Null) {
                    return Err(());
                }
                if !equal(v, ev)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        scalar => Ok(match (scalar, expected) {
            (Value::String(a), GoJson::String(b)) => a == b,
            (Value::Bool(a), GoJson::Bool(b)) => a == b,
            (Value::Null, GoJson::Null) => true,
            (Value::Number(a), GoJson::Number(b)) => go_number_literal(a) == *b,
            _ => false,
        }),
    }
}

#[cfg(test)]
#[path = "evanphx_tests.rs"]
mod tests;

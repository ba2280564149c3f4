//! RFC 7386 JSON Merge Patch from the accepted-change tree. A merge patch cannot address list
//! items, so a touched list is sent whole (merged: accepted items as desired, the rest as current);
//! `null` deletes, so a desired value containing `null` cannot be sent (CAPI's evanphx/json-patch
//! would also strip nulls nested in new values).

use serde_json::{Map, Value};

use super::{Accepted, Patch, PatchType, Sides, Unrepresentable, merged};
use crate::path::{Path, Seg};

pub(super) fn build(sides: &Sides, accepted: &Accepted) -> Result<Option<Patch>, Unrepresentable> {
    let Some(fragment) = fragment(&Path::spec(), sides.current, sides.desired, accepted)? else {
        return Ok(None);
    };
    let mut value = fragment;
    for name in sides.scope.segments().iter().rev() {
        value = Value::Object([(name.to_string(), value)].into_iter().collect());
    }
    let bytes = serde_json::to_vec(&value).map_err(|_| Path::spec())?;
    Ok(Some(Patch {
        patch_type: PatchType::JsonMergePatch,
        bytes,
    }))
}

fn contains_null(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(items) => items.iter().any(contains_null),
        Value::Object(map) => map.values().any(contains_null),
        _ => false,
    }
}

/// What to put at `path` in the patch (`None`: nothing to change there).
fn fragment(
    path: &Path,
    cur: Option<&Value>,
    des: Option<&Value>,
    node: &Accepted,
) -> Result<Option<Value>, Unrepresentable> {
    let checked = |v: Value| {
        if contains_null(&v) {
            Err(path.clone())
        } else {
            Ok(Some(v))
        }
    };
    if node.here {
        return match des {
            None => Ok(cur.map(|_| Value::Null)),
            Some(d) => checked(d.clone()),
        };
    }
    let Some(c) = cur else { return Ok(None) };
    match (c, des) {
        (Value::Object(cm), Some(Value::Object(dm))) => {
            let mut out = Map::new();
            for (seg, kid) in &node.children {
                let Seg::Field(k) = seg else { continue };
                if let Some(v) = fragment(&path.child(seg.clone()), cm.get(k), dm.get(k), kid)? {
                    out.insert(k.clone(), v);
                }
            }
            Ok((!out.is_empty()).then_some(Value::Object(out)))
        }
        // Something below is accepted, so the merged list differs from current.
        (Value::Array(_), Some(Value::Array(_))) => {
            merged(cur, des, node).map_or(Ok(None), checked)
        }
        _ => Ok(None),
    }
}

//! Names the JSON paths where two unstructured specs differ, the way go-cmp would see them
//! (`null` is not "absent", `1` is not `1.0`, `[]` is not `null`). Only paths, never values:
//! specs carry file contents and keys.

use serde_json::Value;

/// At most this many differing paths are listed per object; the rest are counted.
pub const MAX_LISTED_DIFFERENCES: usize = 50;

/// Paths (e.g. `spec.files[1].content`) where `a` and `b` differ; `None` is an absent field.
pub fn json_differences(a: Option<&Value>, b: Option<&Value>, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    walk(a, b, prefix.to_string(), &mut out);
    if out.len() > MAX_LISTED_DIFFERENCES {
        let more = out.len() - MAX_LISTED_DIFFERENCES;
        out.truncate(MAX_LISTED_DIFFERENCES);
        out.push(format!("{prefix}: and {more} more differences"));
    }
    out
}

fn walk(a: Option<&Value>, b: Option<&Value>, path: String, out: &mut Vec<String>) {
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                walk(x.get(k), y.get(k), child(&path, k), out);
            }
        }
        (Some(Value::Array(x)), Some(Value::Array(y))) => {
            for i in 0..x.len().max(y.len()) {
                walk(x.get(i), y.get(i), format!("{path}[{i}]"), out);
            }
        }
        (x, y) if x == y => {}
        _ => out.push(path),
    }
}

fn child(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if plain {
        format!("{path}.{key}")
    } else {
        format!("{path}[{key:?}]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_paths_and_distinguishes_null_from_absent() {
        let a = json!({"files": [{"path": "/a", "content": "x"}], "ntp": {"servers": ["a"]}, "x": null, "n": 1});
        let b = json!({"files": [{"path": "/a", "content": "y"}, {"path": "/b"}], "ntp": {"servers": ["a"]}, "n": 1.0, "a/b": 1});
        let d = json_differences(Some(&a), Some(&b), "spec");
        assert_eq!(
            d,
            [
                "spec[\"a/b\"]",
                "spec.files[0].content",
                "spec.files[1]",
                "spec.n",
                "spec.x"
            ]
        );
        assert!(json_differences(Some(&a), Some(&a), "spec").is_empty());
    }

    #[test]
    fn long_lists_are_capped() {
        let a = json!((0..200).collect::<Vec<_>>());
        let b = json!((1..201).collect::<Vec<_>>());
        let d = json_differences(Some(&a), Some(&b), "spec");
        assert_eq!(d.len(), MAX_LISTED_DIFFERENCES + 1);
        assert!(d[MAX_LISTED_DIFFERENCES].contains("150 more"));
    }
}

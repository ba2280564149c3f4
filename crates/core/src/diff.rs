//! Structural diff of two spec values into field-path changes.
//!
//! Lists whose items have identity are compared by key, not position (`files` by `path`, `users` and
//! `extraArgs`/`kubeletExtraArgs` by `name`, `readinessGates` by `conditionType`), so inserting a file
//! shows up as one added file rather than every later file changed; a pure reorder is one
//! [`ChangeKind::Reordered`] change. A keyed list whose items lack the key, or repeat it, is compared
//! by position. Values are borrowed, never copied, and never printed by `Debug` (they may be secrets).

use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::fmt;

use crate::path::{Path, Seg};

/// List fields whose items are identified by a member, and that member.
pub const KEYED_LISTS: &[(&str, &str)] = &[
    ("files", "path"),
    ("users", "name"),
    ("extraArgs", "name"),
    ("kubeletExtraArgs", "name"),
    ("readinessGates", "conditionType"),
];

/// The identifying member of items of the list field `name`, if it is a keyed list.
pub fn keyed_list_field(name: &str) -> Option<&'static str> {
    KEYED_LISTS
        .iter()
        .find(|(list, _)| *list == name)
        .map(|(_, key)| *key)
}

/// The key of every item, when every item is an object with a string `key` member and no key repeats.
pub fn list_keys<'v>(items: &'v [Value], key: &str) -> Option<Vec<&'v str>> {
    let keys: Vec<&str> = items
        .iter()
        .map(|item| item.get(key)?.as_str())
        .collect::<Option<_>>()?;
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    keys.iter().all(|k| seen.insert(*k)).then_some(keys)
}

/// The key member and each item's key of the list `items` found at `path`, when it is a keyed list whose items
/// allow it (see [`list_keys`]).
pub fn keyed_items<'v>(path: &Path, items: &'v [Value]) -> Option<(&'static str, Vec<&'v str>)> {
    let Some(Seg::Field(name)) = path.last() else {
        return None;
    };
    let key = keyed_list_field(name)?;
    Some((key, list_keys(items, key)?))
}

/// The key member to diff the list at `path` by, when its items allow it (see [`list_keys`]).
pub fn list_key_for<'v>(
    path_last: Option<&Seg>,
    old: &'v [Value],
    new: &'v [Value],
) -> Option<(&'static str, Vec<&'v str>, Vec<&'v str>)> {
    let Some(Seg::Field(name)) = path_last else {
        return None;
    };
    let key = keyed_list_field(name)?;
    Some((key, list_keys(old, key)?, list_keys(new, key)?))
}

/// What happened at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// Present in desired only.
    Added,
    /// Present in current only.
    Removed,
    /// Present in both, different.
    Changed,
    /// A keyed list whose common items appear in another order (item changes are reported separately).
    Reordered,
}

/// One difference between current and desired.
#[derive(Clone)]
pub struct Change<'a> {
    /// Where (`spec…`).
    pub path: Path,
    /// What happened.
    pub kind: ChangeKind,
    /// The current value (`None` when added). For [`ChangeKind::Reordered`], the whole current list.
    pub old: Option<&'a Value>,
    /// The desired value (`None` when removed). For [`ChangeKind::Reordered`], the whole desired list.
    pub new: Option<&'a Value>,
}

impl fmt::Debug for Change<'_> {
    // Values stay out: they may be file contents or passwords.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Change({:?} {})", self.kind, self.path)
    }
}

/// How values are compared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiffOptions {
    /// Compare as CAPI compares a typed Go struct (the Machine): a member that is `null`, `""`, `[]`
    /// or an object of only such members counts as absent. Otherwise JSON is compared as is and
    /// `null` is a value.
    pub typed: bool,
}

/// Whether a typed Go struct would decode `v` to its zero value (so `omitempty` drops it).
pub fn typed_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.values().all(typed_empty),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

/// The changes that turn `old` into `new`, both being the value at `spec` (absent = `None`).
pub fn diff<'a>(
    old: Option<&'a Value>,
    new: Option<&'a Value>,
    opts: DiffOptions,
) -> Vec<Change<'a>> {
    let mut out = Vec::new();
    let mut segs = vec![Seg::Field("spec".to_owned())];
    let old = old.filter(|v| !(opts.typed && typed_empty(v)));
    let new = new.filter(|v| !(opts.typed && typed_empty(v)));
    walk(&mut segs, old, new, opts, &mut out);
    out
}

fn emit<'a>(
    segs: &[Seg],
    kind: ChangeKind,
    old: Option<&'a Value>,
    new: Option<&'a Value>,
    out: &mut Vec<Change<'a>>,
) {
    out.push(Change {
        path: Path(segs.to_vec()),
        kind,
        old,
        new,
    });
}

fn walk<'a>(
    segs: &mut Vec<Seg>,
    old: Option<&'a Value>,
    new: Option<&'a Value>,
    opts: DiffOptions,
    out: &mut Vec<Change<'a>>,
) {
    let (o, n) = match (old, new) {
        (None, None) => return,
        (Some(o), None) => return emit(segs, ChangeKind::Removed, Some(o), None, out),
        (None, Some(n)) => return emit(segs, ChangeKind::Added, None, Some(n), out),
        (Some(o), Some(n)) => (o, n),
    };
    if o == n {
        return;
    }
    match (o, n) {
        (Value::Object(a), Value::Object(b)) => {
            let present = |v: &&'a Value| !(opts.typed && typed_empty(v));
            for (k, av) in a {
                segs.push(Seg::Field(k.clone()));
                walk(
                    segs,
                    Some(av).filter(present),
                    b.get(k).filter(present),
                    opts,
                    out,
                );
                segs.pop();
            }
            for (k, bv) in b {
                if !a.contains_key(k) {
                    segs.push(Seg::Field(k.clone()));
                    walk(segs, None, Some(bv).filter(present), opts, out);
                    segs.pop();
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => match list_key_for(segs.last(), a, b) {
            Some((key, ka, kb)) => keyed(segs, (o, a, &ka), (n, b, &kb), key, opts, out),
            None => {
                for i in 0..a.len().max(b.len()) {
                    segs.push(Seg::Index(i));
                    walk(segs, a.get(i), b.get(i), opts, out);
                    segs.pop();
                }
            }
        },
        _ => emit(segs, ChangeKind::Changed, Some(o), Some(n), out),
    }
}

type Side<'a, 'k> = (&'a Value, &'a [Value], &'k [&'a str]);

fn keyed<'a>(
    segs: &mut Vec<Seg>,
    old: Side<'a, '_>,
    new: Side<'a, '_>,
    key: &str,
    opts: DiffOptions,
    out: &mut Vec<Change<'a>>,
) {
    let (old_list, a, ka) = old;
    let (new_list, b, kb) = new;
    let a_index: HashMap<&str, usize> = ka.iter().enumerate().map(|(i, k)| (*k, i)).collect();
    let b_index: HashMap<&str, usize> = kb.iter().enumerate().map(|(i, k)| (*k, i)).collect();
    let common_a = ka.iter().filter(|k| b_index.contains_key(*k));
    let common_b = kb.iter().filter(|k| a_index.contains_key(*k));
    if !common_a.eq(common_b) {
        emit(
            segs,
            ChangeKind::Reordered,
            Some(old_list),
            Some(new_list),
            out,
        );
    }
    for (item, k) in a.iter().zip(ka) {
        segs.push(Seg::Key {
            field: key.to_owned(),
            value: (*k).to_owned(),
        });
        walk(segs, Some(item), b_index.get(k).map(|&j| &b[j]), opts, out);
        segs.pop();
    }
    for (item, k) in b.iter().zip(kb) {
        if !a_index.contains_key(k) {
            segs.push(Seg::Key {
                field: key.to_owned(),
                value: (*k).to_owned(),
            });
            walk(segs, None, Some(item), opts, out);
            segs.pop();
        }
    }
}

/// Every leaf below `path` in `value` (non-container values, and empty objects or lists), with keyed
/// lists addressed by key. Used to judge a whole added or removed subtree field by field.
pub fn leaves<'a>(path: &Path, value: &'a Value, out: &mut Vec<(Path, &'a Value)>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                leaves(&path.child(Seg::Field(k.clone())), v, out);
            }
        }
        Value::Array(items) if !items.is_empty() => match keyed_items(path, items) {
            Some((key, keys)) => {
                for (item, k) in items.iter().zip(keys) {
                    leaves(
                        &path.child(Seg::Key {
                            field: key.to_owned(),
                            value: k.to_owned(),
                        }),
                        item,
                        out,
                    );
                }
            }
            None => {
                for (i, item) in items.iter().enumerate() {
                    leaves(&path.child(Seg::Index(i)), item, out);
                }
            }
        },
        _ => out.push((path.clone(), value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn summary(changes: &[Change]) -> Vec<String> {
        changes
            .iter()
            .map(|c| format!("{:?} {}", c.kind, c.path))
            .collect()
    }

    #[test]
    fn keyed_files_add_remove_modify_reorder() {
        let old = json!({"files": [{"path": "/a", "content": "1"}, {"path": "/b", "content": "2"}, {"path": "/c", "content": "3"}]});
        let new = json!({"files": [{"path": "/c", "content": "3"}, {"path": "/a", "content": "9"}, {"path": "/d", "content": "4"}]});
        let changes = diff(Some(&old), Some(&new), DiffOptions::default());
        assert_eq!(
            summary(&changes),
            [
                "Reordered spec.files",
                "Changed spec.files[path=/a].content",
                "Removed spec.files[path=/b]",
                "Added spec.files[path=/d]",
            ]
        );
    }

    #[test]
    fn pure_reorder_is_one_change() {
        let old = json!({"users": [{"name": "a"}, {"name": "b"}]});
        let new = json!({"users": [{"name": "b"}, {"name": "a"}]});
        assert_eq!(
            summary(&diff(Some(&old), Some(&new), DiffOptions::default())),
            ["Reordered spec.users"]
        );
    }

    #[test]
    fn duplicate_or_missing_keys_fall_back_to_positions() {
        let old = json!({"extraArgs": [{"name": "x", "value": "1"}, {"name": "x", "value": "2"}]});
        let new = json!({"extraArgs": [{"name": "x", "value": "1"}, {"name": "x", "value": "3"}]});
        assert_eq!(
            summary(&diff(Some(&old), Some(&new), DiffOptions::default())),
            ["Changed spec.extraArgs[1].value"]
        );
    }

    #[test]
    fn plain_lists_by_index_and_nested_objects() {
        let old = json!({"ntp": {"servers": ["a", "b"]}, "x": 1});
        let new = json!({"ntp": {"servers": ["a", "c", "d"], "enabled": true}});
        assert_eq!(
            summary(&diff(Some(&old), Some(&new), DiffOptions::default())),
            [
                "Changed spec.ntp.servers[1]",
                "Added spec.ntp.servers[2]",
                "Added spec.ntp.enabled",
                "Removed spec.x"
            ]
        );
    }

    #[test]
    fn null_is_a_value_unless_typed() {
        let old = json!({"a": null, "b": ""});
        let new = json!({});
        assert_eq!(
            summary(&diff(Some(&old), Some(&new), DiffOptions::default())),
            ["Removed spec.a", "Removed spec.b"]
        );
        assert!(diff(Some(&old), Some(&new), DiffOptions { typed: true }).is_empty());
    }

    #[test]
    fn leaves_use_keys() {
        let v = json!({"path": "/a", "contentFrom": {"secret": {"name": "s", "key": "k"}}});
        let base = Path::spec()
            .child(Seg::Field("files".into()))
            .child(Seg::Key {
                field: "path".into(),
                value: "/a".into(),
            });
        let mut out = Vec::new();
        leaves(&base, &v, &mut out);
        let mut shown: Vec<String> = out.iter().map(|(p, _)| p.to_string()).collect();
        shown.sort();
        assert_eq!(
            shown,
            [
                "spec.files[path=/a].contentFrom.secret.key",
                "spec.files[path=/a].contentFrom.secret.name",
                "spec.files[path=/a].path"
            ]
        );
    }

    #[test]
    fn debug_never_shows_values() {
        let old = json!({"files": [{"path": "/a", "content": "TOPSECRET"}]});
        let new = json!({"files": [{"path": "/a", "content": "OTHERSECRET"}]});
        let changes = diff(Some(&old), Some(&new), DiffOptions::default());
        let dbg = format!("{changes:?}");
        assert!(!dbg.contains("SECRET"), "{dbg}");
    }
}

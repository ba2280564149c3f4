#![allow(clippy::unwrap_used)]

use super::*;
use crate::diff::{DiffOptions, diff};
use crate::objects::Scope;
use serde_json::json;

fn file(path: &str, content: &str) -> Value {
    json!({"path": path, "content": content})
}

fn object(spec: &Value) -> Value {
    json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig", "metadata": {"name": "x"}, "spec": spec})
}

/// For every subset of accepted changes and both patch types: the patch applies the CAPI way,
/// accepted paths read desired, the others current, and a reorder is honoured exactly when accepted.
fn check_all_subsets(cur_spec: Value, des_spec: Value) {
    let cur_obj = object(&cur_spec);
    let changes = diff(Some(&cur_spec), Some(&des_spec), DiffOptions::default());
    assert!(
        changes.len() <= 10,
        "too many changes for an exhaustive test"
    );
    let sides = Sides {
        scope: Scope::Object,
        current_object: &cur_obj,
        current: Some(&cur_spec),
        desired: Some(&des_spec),
    };
    for mask in 0u32..(1 << changes.len()) {
        let mut accepted = Accepted::default();
        let on = |i: usize| mask & (1 << i) != 0;
        for (i, c) in changes.iter().enumerate() {
            if on(i) {
                accepted.insert(c);
            }
        }
        for patch_type in [PatchType::JsonPatch, PatchType::JsonMergePatch] {
            let (patch, note) = build(&sides, &accepted, patch_type);
            assert_eq!(note, None);
            assert_eq!(
                patch.is_none(),
                mask == 0,
                "a patch exactly when something is accepted"
            );
            let after = match &patch {
                Some(p) => capi::apply(Scope::Object, &cur_obj, p)
                    .unwrap_or_else(|e| panic!("mask {mask:b} {patch_type}: {e}")),
                None => Some(cur_spec.clone()),
            };
            for (i, c) in changes.iter().enumerate() {
                let want = if on(i) { &des_spec } else { &cur_spec };
                if c.kind == ChangeKind::Reordered {
                    let keys = |v: Option<&Value>| -> Vec<String> {
                        let items = c
                            .path
                            .resolve(v)
                            .and_then(Value::as_array)
                            .cloned()
                            .unwrap_or_default();
                        items
                            .iter()
                            .filter_map(|f| f["path"].as_str().map(str::to_owned))
                            .collect()
                    };
                    let both: Vec<String> = keys(Some(&cur_spec))
                        .into_iter()
                        .filter(|k| keys(Some(&des_spec)).contains(k))
                        .collect();
                    let common = |v: Option<&Value>| {
                        keys(v)
                            .into_iter()
                            .filter(|k| both.contains(k))
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(
                        common(after.as_ref()),
                        common(Some(want)),
                        "mask {mask:b} {patch_type}: order"
                    );
                } else {
                    assert_eq!(
                        c.path.resolve(after.as_ref()),
                        c.path.resolve(Some(want)),
                        "mask {mask:b} {patch_type}: {}",
                        c.path
                    );
                }
            }
            if mask == (1 << changes.len()) - 1 {
                assert_eq!(
                    after.as_ref(),
                    Some(&des_spec),
                    "{patch_type}: all accepted gives desired"
                );
            }
        }
    }
}

#[test]
fn keyed_list_add_remove_modify_every_subset() {
    let cur =
        json!({"files": [file("/a", "1"), file("/b", "2"), file("/c", "3"), file("/d", "4")]});
    let des = json!({"files": [file("/x", "0"), file("/a", "1"), file("/c", "33"), file("/y", "5"), file("/d", "4"), file("/z", "6")]});
    check_all_subsets(cur, des);
}

#[test]
fn keyed_list_reorder_with_changes_every_subset() {
    let cur = json!({"files": [file("/a", "1"), file("/b", "2"), file("/c", "3")]});
    let des = json!({"files": [file("/c", "3"), file("/n", "9"), file("/a", "11")]});
    check_all_subsets(cur, des);
}

#[test]
fn keyed_list_created_and_deleted() {
    check_all_subsets(
        json!({"ntp": {"servers": ["a"]}}),
        json!({"files": [file("/a", "1")], "ntp": {"servers": ["a", "b"]}}),
    );
    check_all_subsets(json!({"files": [file("/a", "1")]}), json!({"files": []}));
}

#[test]
fn pointer_escaping_and_add_for_missing_members() {
    let cur = json!({"a/b": {"x~y": 1}, "n": null});
    let des = json!({"a/b": {"x~y": 2, "new": true}, "n": {"v": 1}});
    let cur_obj = object(&cur);
    let sides = Sides {
        scope: Scope::Object,
        current_object: &cur_obj,
        current: Some(&cur),
        desired: Some(&des),
    };
    let mut accepted = Accepted::default();
    for c in diff(Some(&cur), Some(&des), DiffOptions::default()) {
        accepted.insert(&c);
    }
    let (patch, _) = build(&sides, &accepted, PatchType::JsonPatch);
    let ops: Value = serde_json::from_slice(&patch.unwrap().bytes).unwrap();
    assert_eq!(
        ops,
        json!([
            {"op": "add", "path": "/spec/a~1b/new", "value": true},
            {"op": "replace", "path": "/spec/a~1b/x~0y", "value": 2},
            {"op": "replace", "path": "/spec/n", "value": {"v": 1}},
        ])
    );
}

#[test]
fn merge_patch_falls_back_when_desired_holds_null() {
    let cur = json!({"a": 1});
    let des = json!({"a": null});
    let cur_obj = object(&cur);
    let sides = Sides {
        scope: Scope::Object,
        current_object: &cur_obj,
        current: Some(&cur),
        desired: Some(&des),
    };
    let mut accepted = Accepted::default();
    for c in diff(Some(&cur), Some(&des), DiffOptions::default()) {
        accepted.insert(&c);
    }
    let (patch, note) = build(&sides, &accepted, PatchType::JsonMergePatch);
    let patch = patch.unwrap();
    assert_eq!(patch.patch_type, PatchType::JsonPatch);
    assert!(note.unwrap().contains("spec.a"));
    assert_eq!(
        capi::apply(Scope::Object, &cur_obj, &patch).unwrap(),
        Some(des)
    );
}

#[test]
fn region_missing_in_current_is_added_with_parents() {
    let cur_obj = json!({"kind": "KubeadmConfigTemplate", "spec": {}});
    let des = json!({"files": [file("/a", "1")]});
    for (scope, current) in [(Scope::Template, None), (Scope::Object, None)] {
        let obj = if scope == Scope::Object {
            json!({"kind": "KubeadmConfig"})
        } else {
            cur_obj.clone()
        };
        let sides = Sides {
            scope,
            current_object: &obj,
            current,
            desired: Some(&des),
        };
        let mut accepted = Accepted::default();
        for c in diff(current, Some(&des), DiffOptions::default()) {
            accepted.insert(&c);
        }
        for pt in [PatchType::JsonPatch, PatchType::JsonMergePatch] {
            let (patch, _) = build(&sides, &accepted, pt);
            assert_eq!(
                capi::apply(scope, &obj, &patch.unwrap()).unwrap(),
                Some(des.clone()),
                "{scope:?} {pt}"
            );
        }
    }
}

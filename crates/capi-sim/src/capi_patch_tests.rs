//! Tests of CAPI's apply-then-copy-back step.

use serde_json::{Value, json};

use super::*;

fn config() -> Value {
    json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmConfig",
        "metadata": {"name": "c", "namespace": "default", "labels": {"a": "1"}},
        "spec": {"files": [{"path": "/etc/a", "content": "A"}], "ntp": {"servers": ["0.pool.ntp.org"]}}
    })
}

fn json_patch(ops: Value) -> Patch {
    Patch {
        patch_type: "JSONPatch".into(),
        bytes: ops.to_string().into_bytes(),
    }
}

fn merge_patch(doc: Value) -> Patch {
    Patch {
        patch_type: "JSONMergePatch".into(),
        bytes: doc.to_string().into_bytes(),
    }
}

#[test]
fn only_the_spec_is_copied_back() {
    let p = merge_patch(
        json!({"metadata": {"labels": {"a": "2"}}, "kind": "Other", "spec": {"ntp": {"servers": ["1.pool.ntp.org"]}}}),
    );
    let out = apply_patch_the_capi_way(&config(), &p, SPEC_PATH).unwrap();
    assert_eq!(out["metadata"], config()["metadata"]);
    assert_eq!(out["kind"], "KubeadmConfig");
    assert_eq!(out["spec"]["ntp"]["servers"], json!(["1.pool.ntp.org"]));
}

#[test]
fn empty_patches_change_nothing() {
    for p in [
        json_patch(json!([])),
        Patch {
            patch_type: "JSONPatch".into(),
            bytes: b"null".to_vec(),
        },
        merge_patch(json!({})),
        Patch {
            patch_type: "JSONMergePatch".into(),
            bytes: vec![],
        },
    ] {
        assert_eq!(
            apply_patch_the_capi_way(&config(), &p, SPEC_PATH).unwrap(),
            config(),
            "{p:?}"
        );
    }
    // An empty JSONPatch document is not valid JSON: an error, not "no change".
    let empty = Patch {
        patch_type: "JSONPatch".into(),
        bytes: vec![],
    };
    assert!(matches!(
        apply_patch_the_capi_way(&config(), &empty, SPEC_PATH),
        Err(PatchError::DecodeJsonPatch(_))
    ));
}

#[test]
fn patch_type_rules() {
    let no_type = Patch {
        patch_type: String::new(),
        bytes: b"[]".to_vec(),
    };
    assert_eq!(
        apply_patch_the_capi_way(&config(), &no_type, SPEC_PATH),
        Err(PatchError::MissingPatchType)
    );
    let unknown = Patch {
        patch_type: "StrategicMergePatch".into(),
        bytes: b"{}".to_vec(),
    };
    assert!(matches!(
        apply_patch_the_capi_way(&config(), &unknown, SPEC_PATH),
        Err(PatchError::UnknownPatchType(_))
    ));
}

#[test]
fn failing_operations_are_errors() {
    let p = json_patch(json!([{"op": "replace", "path": "/spec/users", "value": []}]));
    assert!(matches!(
        apply_patch_the_capi_way(&config(), &p, SPEC_PATH),
        Err(PatchError::ApplyJsonPatch(_))
    ));
    let p = json_patch(json!([{"op": "test", "path": "/spec/ntp/servers/0", "value": "x"}]));
    assert!(matches!(
        apply_patch_the_capi_way(&config(), &p, SPEC_PATH),
        Err(PatchError::ApplyJsonPatch(_))
    ));
}

#[test]
fn patched_objects_must_still_be_kubernetes_objects() {
    for p in [
        json_patch(json!([{"op": "remove", "path": "/kind"}])),
        json_patch(json!([{"op": "replace", "path": "/apiVersion", "value": 5}])),
        json_patch(json!([{"op": "replace", "path": "/apiVersion", "value": "a/b/c"}])),
        merge_patch(json!([1])),
        merge_patch(json!(null)),
    ] {
        assert!(
            matches!(
                apply_patch_the_capi_way(&config(), &p, SPEC_PATH),
                Err(PatchError::CopyBack(_))
            ),
            "{p:?}"
        );
    }
}

#[test]
fn removing_the_spec_leaves_it_alone_and_null_replaces_it() {
    let p = json_patch(json!([{"op": "remove", "path": "/spec"}]));
    assert_eq!(
        apply_patch_the_capi_way(&config(), &p, SPEC_PATH).unwrap(),
        config()
    );
    let p = json_patch(json!([{"op": "replace", "path": "/spec", "value": null}]));
    assert_eq!(
        apply_patch_the_capi_way(&config(), &p, SPEC_PATH).unwrap()["spec"],
        Value::Null
    );
}

#[test]
fn template_path_creates_parents_and_refuses_non_objects() {
    let tpl = json!({"apiVersion": "x/v1", "kind": "T", "metadata": {"name": "t"}, "spec": {}});
    let p = merge_patch(json!({"spec": {"template": {"spec": {"a": 1}}, "other": 1}}));
    let out = apply_patch_the_capi_way(&tpl, &p, TEMPLATE_SPEC_PATH).unwrap();
    assert_eq!(out["spec"], json!({"template": {"spec": {"a": 1}}}));
    let bad = json!({"apiVersion": "x/v1", "kind": "T", "metadata": {"name": "t"}, "spec": {"template": "s"}});
    let p = merge_patch(json!({"spec": {"template": {"spec": {"a": 1}}}}));
    assert!(matches!(
        apply_patch_the_capi_way(&bad, &p, TEMPLATE_SPEC_PATH),
        Err(PatchError::CopyBack(_))
    ));
}

fn machine() -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {"name": "m", "namespace": "default"},
        "spec": {"clusterName": "edge-01", "version": "v1.33.4", "failureDomain": "fd1"}
    })
}

#[test]
fn machines_are_reread_through_the_go_struct() {
    let p = merge_patch(
        json!({"spec": {"version": "v1.34.1", "unknownField": true, "providerID": ""}}),
    );
    let out = apply_patch_to_machine(&machine(), &p).unwrap();
    assert_eq!(
        out["spec"],
        json!({"clusterName": "edge-01", "version": "v1.34.1", "failureDomain": "fd1"})
    );
    // A wrong type is an error once the Machine is re-read.
    let p = merge_patch(json!({"spec": {"minReadySeconds": "10"}}));
    assert!(matches!(
        apply_patch_to_machine(&machine(), &p),
        Err(PatchError::TypedDecode { .. })
    ));
    // 10.0 survives: the unstructured round trip prints it as 10.
    let p = merge_patch(json!({"spec": {"minReadySeconds": 10.0}}));
    assert_eq!(
        apply_patch_to_machine(&machine(), &p).unwrap()["spec"]["minReadySeconds"],
        10
    );
}

#[test]
fn case_variant_keys_lose_to_the_real_key_in_sorted_order() {
    // Go re-reads the sorted JSON: "Version" comes before "version", which then wins.
    let p = json_patch(json!([{"op": "add", "path": "/spec/Version", "value": "v1.34.1"}]));
    assert_eq!(
        apply_patch_to_machine(&machine(), &p).unwrap()["spec"]["version"],
        "v1.33.4"
    );
    // Without the real key the case variant is what Go reads.
    let p = json_patch(
        json!([{"op": "remove", "path": "/spec/version"}, {"op": "add", "path": "/spec/VERSION", "value": "v1.34.1"}]),
    );
    assert_eq!(
        apply_patch_to_machine(&machine(), &p).unwrap()["spec"]["version"],
        "v1.34.1"
    );
}

#[test]
fn json_patch_paths_see_the_go_written_machine() {
    // Go omits empty fields, so `replace` of an empty providerID fails even if the request had "".
    let mut m = machine();
    m["spec"]["providerID"] = json!("");
    let p = json_patch(json!([{"op": "replace", "path": "/spec/providerID", "value": "x"}]));
    assert!(matches!(
        apply_patch_to_machine(&m, &p),
        Err(PatchError::ApplyJsonPatch(_))
    ));
}

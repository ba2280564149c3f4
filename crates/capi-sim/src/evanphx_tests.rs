//! Tests of the evanphx port: agreement with the RFC crate where evanphx follows the RFCs, and
//! each quirk where it does not.

use serde_json::{Value, json};

use super::{apply_json_patch, apply_merge_patch};

fn doc() -> Value {
    json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmConfig",
        "metadata": {"name": "a", "labels": {"x": "1"}},
        "spec": {
            "files": [{"path": "/etc/a", "content": "A"}, {"path": "/etc/b", "content": "B"}],
            "users": [{"name": "capi", "sshAuthorizedKeys": ["ssh-ed25519 AAA"]}],
            "ntp": {"servers": ["0.pool.ntp.org"], "enabled": true},
            "verbosity": 5,
            "ratio": 1.5
        }
    })
}

fn patch(ops: Value) -> Result<Option<Value>, String> {
    apply_json_patch(&doc(), ops.to_string().as_bytes())
}

fn rfc_patch(ops: &Value) -> Result<Value, String> {
    let p: json_patch::Patch = serde_json::from_value(ops.clone()).map_err(|e| e.to_string())?;
    let mut d = doc();
    json_patch::patch(&mut d, &p).map_err(|e| e.to_string())?;
    Ok(d)
}

#[test]
fn standard_patches_agree_with_the_rfc_crate() {
    let cases = [
        json!([{"op": "replace", "path": "/spec/files/0/content", "value": "A2"}]),
        json!([{"op": "add", "path": "/spec/files/-", "value": {"path": "/etc/c", "content": "C"}}]),
        json!([{"op": "add", "path": "/spec/files/1", "value": {"path": "/etc/c"}}]),
        json!([{"op": "remove", "path": "/spec/files/0"}, {"op": "remove", "path": "/spec/ntp/enabled"}]),
        json!([{"op": "move", "from": "/spec/ntp", "path": "/spec/ntp2"}]),
        json!([{"op": "copy", "from": "/spec/users/0", "path": "/spec/users/-"}]),
        json!([{"op": "test", "path": "/spec/verbosity", "value": 5}, {"op": "replace", "path": "/spec/verbosity", "value": 2}]),
        json!([{"op": "test", "path": "/spec/users/0/name", "value": "capi"}]),
        json!([{"op": "add", "path": "/spec/a~1b~0c", "value": null}]),
        json!([{"op": "replace", "path": "/spec", "value": {}}]),
        json!([{"op": "replace", "path": "/spec/files/2", "value": 1}]),
        json!([{"op": "remove", "path": "/spec/missing"}]),
        json!([{"op": "replace", "path": "/spec/missing", "value": 1}]),
        json!([{"op": "add", "path": "/spec/missing/deeper", "value": 1}]),
        json!([{"op": "add", "path": "/spec/files/3", "value": 1}]),
        json!([{"op": "test", "path": "/spec/verbosity", "value": 6}]),
        json!([{"op": "test", "path": "/spec/ntp", "value": {"servers": ["0.pool.ntp.org"], "enabled": true}}]),
        json!([{"op": "move", "from": "/spec", "path": "/spec/inner"}]),
    ];
    for ops in cases {
        let ours = patch(ops.clone()).map(|d| d.unwrap_or_else(doc));
        let rfc = rfc_patch(&ops);
        assert_eq!(
            ours.is_ok(),
            rfc.is_ok(),
            "{ops}: ours {ours:?} vs rfc {rfc:?}"
        );
        if let (Ok(a), Ok(b)) = (ours, rfc) {
            assert_eq!(a, b, "{ops}");
        }
    }
}

#[test]
fn decoding_rules() {
    assert_eq!(apply_json_patch(&doc(), b"[]"), Ok(None));
    assert_eq!(apply_json_patch(&doc(), b"null"), Ok(None));
    for bad in [
        &b""[..],
        b"{}",
        b"[null]",
        b"[1]",
        b"[{\"op\":\"add\",\"path\":\"/x\"}]",
        b"[{\"op\":\"ADD\",\"path\":\"/x\",\"value\":1}]",
        b"[{\"op\":\"copy\",\"path\":\"/x\"}]",
        b"[{\"op\":\"remove\"}]",
        b"[{\"op\":\"remove\",\"path\":5}]",
        b"[] x",
    ] {
        assert!(
            apply_json_patch(&doc(), bad).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    // `"value": null` is present; extra members are ignored.
    assert!(
        patch(json!([{"op": "add", "path": "/spec/x", "value": null, "comment": "hi"}]))
            .unwrap()
            .is_some()
    );
}

#[test]
fn negative_and_lenient_indices() {
    let d = patch(json!([{"op": "replace", "path": "/spec/files/-1/content", "value": "Z"}]))
        .unwrap()
        .unwrap();
    assert_eq!(d["spec"]["files"][1]["content"], "Z");
    let d = patch(json!([{"op": "remove", "path": "/spec/files/-2"}]))
        .unwrap()
        .unwrap();
    assert_eq!(d["spec"]["files"][0]["path"], "/etc/b");
    let d = patch(json!([{"op": "add", "path": "/spec/files/-1", "value": 1}]))
        .unwrap()
        .unwrap();
    assert_eq!(d["spec"]["files"][2], 1);
    let d = patch(json!([{"op": "replace", "path": "/spec/files/+01/content", "value": "Y"}]))
        .unwrap()
        .unwrap();
    assert_eq!(d["spec"]["files"][1]["content"], "Y");
    assert!(patch(json!([{"op": "remove", "path": "/spec/files/-3"}])).is_err());
}

#[test]
fn path_without_leading_slash_acts_at_the_root() {
    let d = patch(json!([{"op": "add", "path": "spec/version", "value": "v2"}]))
        .unwrap()
        .unwrap();
    assert_eq!(d["version"], "v2");
    assert!(patch(json!([{"op": "add", "path": "spec", "value": 1}])).is_err());
}

#[test]
fn test_operation_quirks() {
    // Missing member tested against null passes; against a value fails.
    assert!(patch(json!([{"op": "test", "path": "/spec/missing", "value": null}])).is_ok());
    assert!(patch(json!([{"op": "test", "path": "/spec/missing"}])).is_ok());
    assert!(patch(json!([{"op": "test", "path": "/spec/missing", "value": 1}])).is_err());
    // Numbers compare by their text.
    assert!(patch(json!([{"op": "test", "path": "/spec/verbosity", "value": 5.0}])).is_err());
    assert!(patch(json!([{"op": "test", "path": "/spec/ratio", "value": 1.5}])).is_ok());
    // Arrays holding null make evanphx panic (an error for CAPI).
    let d = json!({"kind": "K", "spec": {"a": [null]}});
    let e =
        apply_json_patch(&d, br#"[{"op":"test","path":"/spec/a","value":[null]}]"#).unwrap_err();
    assert!(e.contains("panic"), "{e}");
}

#[test]
fn merge_patch_follows_evanphx() {
    let m = |p: Value| apply_merge_patch(&doc(), p.to_string().as_bytes()).unwrap();
    let d = m(
        json!({"spec": {"ntp": {"enabled": null, "servers": ["1.pool.ntp.org"]}, "new": {"a": null, "b": [{"c": null, "d": 1}, null]}}}),
    );
    assert_eq!(d["spec"]["ntp"], json!({"servers": ["1.pool.ntp.org"]}));
    // New members are pruned of nulls, inside arrays too (RFC 7386 would keep {"c": null}).
    assert_eq!(d["spec"]["new"], json!({"b": [{"d": 1}, null]}));
    // An array replacing an object is set as is.
    let d = m(json!({"spec": {"ntp": [{"x": null}]}}));
    assert_eq!(d["spec"]["ntp"], json!([{"x": null}]));
    // Replacing a scalar with an object prunes.
    let d = m(json!({"spec": {"verbosity": {"a": null, "b": 2}}}));
    assert_eq!(d["spec"]["verbosity"], json!({"b": 2}));
    // Non-object patches replace the document.
    assert_eq!(
        apply_merge_patch(&doc(), b"[1,null]").unwrap(),
        json!([1, null])
    );
    assert_eq!(apply_merge_patch(&doc(), b"null").unwrap(), Value::Null);
    assert!(apply_merge_patch(&doc(), b"{").is_err());
}

#[test]
fn merge_patch_agrees_with_the_rfc_crate_on_plain_patches() {
    for p in [
        json!({"spec": {"files": [{"path": "/etc/z"}]}}),
        json!({"spec": {"ntp": null}}),
        json!({"metadata": {"labels": {"y": "2"}}}),
    ] {
        let mut rfc = doc();
        json_patch::merge(&mut rfc, &p);
        assert_eq!(
            apply_merge_patch(&doc(), p.to_string().as_bytes()).unwrap(),
            rfc,
            "{p}"
        );
    }
}

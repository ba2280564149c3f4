//! The walk on its own: text and parsed value give the same verdicts, member order does not matter, and every
//! problem names its path.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use serde_json::{Value, json};

use super::*;

fn machine() -> Value {
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m-1", "namespace": "default", "labels": {"cluster.x-k8s.io/cluster-name": "c"}},
        "spec": {"clusterName": "c", "version": "v1.34.1", "readinessGates": [{"conditionType": "A"}]}})
}

/// Both doors, which must agree.
fn check(role: Role, value: &Value) -> Result<Head, Invalid> {
    let raw = RawValue::from_string(value.to_string()).unwrap();
    let from_text = check_text(role, "desired.machine", &raw);
    let from_value = check_value(role, "desired.machine", value);
    assert_eq!(from_text, from_value, "{value}");
    from_text
}

#[test]
fn a_valid_machine_gives_its_head() {
    let head = check(Role::Machine, &machine()).unwrap();
    assert_eq!(head.key().to_string(), "default/m-1");
    assert_eq!(head.group(), "cluster.x-k8s.io");
    assert_eq!(
        head.type_meta(),
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine"})
    );
}

#[test]
fn problems_name_the_path_and_the_expected_shape() {
    let cases: [(&str, Value, &str); 6] = [
        (
            "/spec/version",
            json!(134),
            "desired.machine.spec.version: expected a string, found a number",
        ),
        (
            "/metadata/name",
            json!("../../etc"),
            "desired.machine.metadata.name: expected a Kubernetes object name",
        ),
        (
            "/spec/readinessGates/0/conditionType",
            json!(null),
            "desired.machine.spec.readinessGates[0].conditionType: expected a string, found null",
        ),
        (
            "/metadata/labels/cluster.x-k8s.io~1cluster-name",
            json!("A/B"),
            "desired.machine.metadata.labels[cluster.x-k8s.io/cluster-name]: expected a Kubernetes object name",
        ),
        (
            "/kind",
            json!("Pod"),
            "desired.machine.kind: expected \"Machine\", found \"Pod\"",
        ),
        (
            "/apiVersion",
            json!("v1"),
            "desired.machine.apiVersion: expected \"cluster.x-k8s.io/<version>\", found \"v1\"",
        ),
    ];
    for (pointer, value, message) in cases {
        let mut object = machine();
        *object.pointer_mut(pointer).unwrap() = value;
        let err = check(Role::Machine, &object).unwrap_err();
        assert!(err.to_string().starts_with(message), "{pointer}: {err}");
    }
}

#[test]
fn spec_before_kind_is_checked_once_the_kind_is_known() {
    // Members in an unusual order: spec first, then the type.
    let text = r#"{"spec":{"files":[{"path":7}]},"metadata":{"name":"b"},"kind":"KubeadmConfig","apiVersion":"bootstrap.cluster.x-k8s.io/v1beta2"}"#;
    let raw = RawValue::from_string(text.into()).unwrap();
    let err = check_text(Role::Bootstrap, "current.bootstrapConfig", &raw).unwrap_err();
    assert_eq!(
        err.to_string(),
        "current.bootstrapConfig.spec.files[0].path: expected a string, found a number"
    );
    // The same object as another provider's kind: its spec is not KubeadmConfig's.
    let other = text.replace("KubeadmConfig", "TalosConfig");
    let raw = RawValue::from_string(other).unwrap();
    let head = check_text(Role::Bootstrap, "current.bootstrapConfig", &raw).unwrap();
    assert_eq!(head.kind, "TalosConfig");
}

#[test]
fn a_pod_is_named_by_its_kind_before_anything_it_lacks() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
    let err = check(Role::Machine, &pod).unwrap_err();
    assert_eq!(err.path, "desired.machine.apiVersion");
    let err = check(Role::Infra, &pod).unwrap_err();
    assert!(err.problem.contains("non-empty group"), "{err}");
}

#[test]
fn kinds_must_match_across_sides() {
    let a = check(Role::Machine, &machine()).unwrap();
    let mut b = a.clone();
    b.api_version = "other.io/v1".into();
    let err = same_kind("current.machine", &a, "desired.machine", &b).unwrap_err();
    assert_eq!(err.path, "desired.machine.apiVersion");
    b.api_version = a.api_version.clone();
    b.kind = "MachinePool".into();
    let err = same_kind("current.machine", &a, "desired.machine", &b).unwrap_err();
    assert_eq!(err.path, "desired.machine.kind");
    assert!(same_kind("current.machine", &a, "desired.machine", &a).is_ok());
}

#[test]
fn every_object_shape_fits_the_member_bitmask() {
    for shape in rules::every_object_shape() {
        if let walk::Shape::Object(members) = shape {
            assert!(members.len() <= 64, "{shape:?}");
        }
    }
}

//! Tests of the controllers' decisions on small hand-made requests (the fixtures have their own).

use base64::Engine as _;
use serde_json::{Value, json};

use super::*;
use crate::discovery::HOOKS_API_VERSION;

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::STANDARD.encode(v.to_string())
}

fn object(api: &str, kind: &str, spec: Value) -> Value {
    json!({"apiVersion": api, "kind": kind, "metadata": {"name": "edge-01-control-plane-abcde", "namespace": "default"}, "spec": spec})
}

fn machine_spec(version: &str) -> Value {
    json!({
        "clusterName": "edge-01",
        "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "edge-01-control-plane-abcde"}, "dataSecretName": "edge-01-control-plane-abcde"},
        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachine", "name": "edge-01-control-plane-abcde"},
        "version": version,
        "providerID": "docker:////edge-01-control-plane-abcde",
        "failureDomain": "fd-1",
        "readinessGates": [{"conditionType": "APIServerPodHealthy"}],
        "deletion": {"nodeDeletionTimeoutSeconds": 10}
    })
}

fn side(version: &str, servers: Value) -> Value {
    json!({
        "machine": object("cluster.x-k8s.io/v1beta2", "Machine", machine_spec(version)),
        "infrastructureMachine": object("infrastructure.cluster.x-k8s.io/v1beta2", "DevMachine", json!({"backend": {"docker": {}}})),
        "bootstrapConfig": object("bootstrap.cluster.x-k8s.io/v1beta2", "KubeadmConfig", json!({"ntp": {"servers": servers}})),
    })
}

fn request(current: Value, desired: Value) -> Value {
    json!({"apiVersion": HOOKS_API_VERSION, "kind": "CanUpdateMachineRequest", "current": current, "desired": desired})
}

fn version_bump() -> Value {
    request(side("v1.33.4", json!(["a"])), side("v1.34.1", json!(["a"])))
}

fn answer(patches: Value) -> Vec<u8> {
    let mut body = json!({"apiVersion": HOOKS_API_VERSION, "kind": "CanUpdateMachineResponse", "status": "Success"});
    for (k, v) in patches.as_object().cloned().unwrap_or_default() {
        body[k] = v;
    }
    body.to_string().into_bytes()
}

fn rollout(d: &CapiDecision) -> &[String] {
    match d {
        CapiDecision::Rollout { reasons } => reasons,
        other => panic!("expected a rollout, got {other:?}"),
    }
}

#[test]
fn empty_success_rolls_out_and_a_covering_patch_goes_in_place() {
    let d = can_update_machine(&version_bump(), &answer(json!({})));
    assert_eq!(rollout(&d), ["Machine spec.version"]);
    let merge = json!({"machinePatch": {"patchType": "JSONMergePatch", "patch": b64(&json!({"spec": {"version": "v1.34.1"}}))}});
    assert_eq!(
        can_update_machine(&version_bump(), &answer(merge)),
        CapiDecision::InPlace
    );
    let jp = json!({"machinePatch": {"patchType": "JSONPatch", "patch": b64(&json!([{"op": "replace", "path": "/spec/version", "value": "v1.34.1"}]))}});
    assert_eq!(
        can_update_machine(&version_bump(), &answer(jp)),
        CapiDecision::InPlace
    );
}

#[test]
fn a_metadata_only_patch_changes_nothing() {
    let p = json!({"machinePatch": {"patchType": "JSONMergePatch", "patch": b64(&json!({"metadata": {"labels": {"v": "v1.34.1"}}, "status": {"version": "v1.34.1"}}))}});
    assert_eq!(
        rollout(&can_update_machine(&version_bump(), &answer(p))),
        ["Machine spec.version"]
    );
}

#[test]
fn ignored_machine_fields_never_need_a_patch() {
    let mut desired = side("v1.33.4", json!(["a"]));
    let spec = &mut desired["machine"]["spec"];
    spec["providerID"] = json!("docker:////other");
    spec["readinessGates"] = json!([]);
    spec["taints"] = json!([{"key": "k", "effect": "NoSchedule", "propagation": "Always"}]);
    spec["minReadySeconds"] = json!(60);
    spec["deletion"] =
        json!({"nodeDrainTimeoutSeconds": 600, "nodeVolumeDetachTimeoutSeconds": 60});
    spec.as_object_mut().unwrap().remove("bootstrap");
    let r = request(side("v1.33.4", json!(["a"])), desired.clone());
    assert_eq!(
        can_update_machine(&r, &answer(json!({}))),
        CapiDecision::InPlace
    );
    desired["machine"]["spec"]["failureDomain"] = json!("fd-2");
    let r = request(side("v1.33.4", json!(["a"])), desired);
    assert_eq!(
        rollout(&can_update_machine(&r, &answer(json!({})))),
        ["Machine spec.failureDomain"]
    );
}

#[test]
fn null_is_not_absent_in_bootstrap_specs() {
    let mut desired = side("v1.33.4", json!(["a"]));
    desired["bootstrapConfig"]["spec"]["ntp"]["enabled"] = Value::Null;
    let r = request(side("v1.33.4", json!(["a"])), desired);
    assert_eq!(
        rollout(&can_update_machine(&r, &answer(json!({})))),
        ["KubeadmConfig spec.ntp.enabled"]
    );
    // A merge patch cannot write that null (null deletes); a JSON patch can.
    let jp = json!({"bootstrapConfigPatch": {"patchType": "JSONPatch", "patch": b64(&json!([{"op": "add", "path": "/spec/ntp/enabled", "value": null}]))}});
    assert_eq!(can_update_machine(&r, &answer(jp)), CapiDecision::InPlace);
}

#[test]
fn answers_that_stop_the_reconcile() {
    let r = version_bump();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("failure", br#"{"status":"Failure","message":"nope"}"#.to_vec()),
        ("lowercase status", br#"{"status":"success"}"#.to_vec()),
        ("raw array patch", br#"{"status":"Success","machinePatch":{"patchType":"JSONPatch","patch":[{"op":"add"}]}}"#.to_vec()),
        ("bytes without type", answer(json!({"machinePatch": {"patch": b64(&json!({"spec": {"version": "v1.34.1"}}))}}))),
        ("replace of a missing path", answer(json!({"infrastructureMachinePatch": {"patchType": "JSONPatch", "patch": b64(&json!([{"op": "replace", "path": "/spec/memory", "value": 1}]))}}))),
        ("type only, no bytes", answer(json!({"bootstrapConfigPatch": {"patchType": "JSONPatch"}}))),
        ("wrong type in machine spec", answer(json!({"machinePatch": {"patchType": "JSONMergePatch", "patch": b64(&json!({"spec": {"version": 134}}))}}))),
    ];
    for (name, body) in cases {
        assert!(
            matches!(can_update_machine(&r, &body), CapiDecision::Error { .. }),
            "{name}"
        );
    }
}

#[test]
fn failure_policy_ignore() {
    let r = version_bump();
    let ignore = |answer| can_update_machine_with(&r, answer, FailurePolicy::Ignore);
    assert_eq!(
        rollout(&ignore(HookAnswer::TransportError("connection refused"))),
        ["Machine spec.version"]
    );
    assert_eq!(
        rollout(&ignore(HookAnswer::Http {
            status: 500,
            body: b"oops"
        })),
        ["Machine spec.version"]
    );
    assert_eq!(
        rollout(&ignore(HookAnswer::ok(b"{not json"))),
        ["Machine spec.version"]
    );
    assert!(matches!(
        ignore(HookAnswer::ok(br#"{"status":"Failure"}"#)),
        CapiDecision::Error { .. }
    ));
    assert!(matches!(
        can_update_machine_with(
            &r,
            HookAnswer::TransportError("refused"),
            FailurePolicy::Fail
        ),
        CapiDecision::Error { .. }
    ));
    // A decode error keeps the patches decoded so far: they are applied.
    let body = format!(
        r#"{{"status":"Success","machinePatch":{{"patchType":"JSONMergePatch","patch":"{}"}},"message":7}}"#,
        b64(&json!({"spec": {"version": "v1.34.1"}}))
    );
    assert_eq!(
        ignore(HookAnswer::ok(body.as_bytes())),
        CapiDecision::InPlace
    );
}

#[test]
fn bad_requests_are_reported_as_such() {
    let mut r = version_bump();
    r["current"]["machine"]["status"] = json!({"phase": "Running"});
    assert!(matches!(
        can_update_machine(&r, &answer(json!({}))),
        CapiDecision::BadRequest { .. }
    ));
    assert!(matches!(
        can_update_machine_set(&version_bump(), &answer(json!({}))),
        CapiDecision::BadRequest { .. }
    ));
}

fn machine_set(name: &str, version: &str, bootstrap: bool) -> Value {
    let mut spec = json!({"clusterName": "edge-01", "version": version, "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachineTemplate", "name": "t"}});
    if bootstrap {
        spec["bootstrap"] = json!({"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfigTemplate", "name": name}});
    }
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "metadata": {"name": name, "namespace": "default"}, "spec": {"replicas": 3, "template": {"spec": spec}}})
}

fn template(kind: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "x.example/v1", "kind": kind, "metadata": {"name": name, "namespace": "default"}, "spec": {"template": {"spec": spec}}})
}

#[test]
fn machine_sets_compare_template_specs_only() {
    let current = json!({"machineSet": machine_set("old", "v1.33.4", true), "infrastructureMachineTemplate": template("DevMachineTemplate", "t", json!({})), "bootstrapConfigTemplate": template("KubeadmConfigTemplate", "old", json!({"files": []}))});
    let desired = json!({"machineSet": machine_set("new", "v1.33.4", true), "infrastructureMachineTemplate": template("DevMachineTemplate", "t", json!({})), "bootstrapConfigTemplate": template("KubeadmConfigTemplate", "new", json!({"files": [{"path": "/a"}]}))});
    let r = json!({"apiVersion": HOOKS_API_VERSION, "kind": "CanUpdateMachineSetRequest", "current": current, "desired": desired});
    let d = can_update_machine_set(&r, &answer(json!({})));
    // Names, refs and replicas differ between old and new MachineSet; CAPI does not look at them.
    assert_eq!(
        rollout(&d),
        ["KubeadmConfigTemplate spec.template.spec.files[0]"]
    );
    let p = json!({"bootstrapConfigTemplatePatch": {"patchType": "JSONMergePatch", "patch": b64(&json!({"spec": {"template": {"spec": {"files": [{"path": "/a"}]}}}}))}});
    assert_eq!(
        can_update_machine_set(&r, &answer(p)),
        CapiDecision::InPlace
    );
    // Covering the path with a patch on the wrong level (spec, not spec.template.spec) does nothing.
    let p = json!({"bootstrapConfigTemplatePatch": {"patchType": "JSONMergePatch", "patch": b64(&json!({"spec": {"files": [{"path": "/a"}]}}))}});
    assert!(matches!(
        can_update_machine_set(&r, &answer(p)),
        CapiDecision::Rollout { .. }
    ));
}

#[test]
fn update_machine_outcomes() {
    let in_progress =
        update_machine(br#"{"status":"Success","retryAfterSeconds":5,"message":"draining"}"#);
    assert_eq!(
        in_progress,
        UpdateOutcome::InProgress {
            retry_after_seconds: 5,
            message: "draining".into()
        }
    );
    assert_eq!(
        in_progress.updating_condition_message().as_deref(),
        Some("In-place update in progress: draining")
    );
    assert_eq!(
        update_machine(br#"{"status":"Success"}"#),
        UpdateOutcome::Done
    );
    assert_eq!(
        update_machine(br#"{"status":"Success","retryAfterSeconds":-3}"#),
        UpdateOutcome::Done
    );
    assert_eq!(
        update_machine(br#"{"status":"Failure","message":"kubeadm failed"}"#),
        UpdateOutcome::Failed {
            message: "kubeadm failed".into()
        }
    );
    assert!(matches!(
        update_machine(br#"{"status":"Success","retryAfterSeconds":1.5}"#),
        UpdateOutcome::Error { .. }
    ));
    assert!(matches!(
        update_machine(br#"{"status":"success"}"#),
        UpdateOutcome::Error { .. }
    ));
    assert_eq!(
        update_machine_with(HookAnswer::TransportError("timeout"), FailurePolicy::Ignore),
        UpdateOutcome::Done
    );
    let r = update_machine_with(
        HookAnswer::ok(br#"{"status":"Success","retryAfterSeconds":9,"message":5}"#),
        FailurePolicy::Ignore,
    );
    assert_eq!(
        r,
        UpdateOutcome::InProgress {
            retry_after_seconds: 9,
            message: String::new()
        }
    );
}

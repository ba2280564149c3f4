//! CanUpdateMachine and CanUpdateMachineSet: each malformed request is a Failure CAPI reads as such, naming the
//! field, with no patch.

use capi_sim::{CapiError, check_response_status};
use inplace_updater::api::Hook;
use inplace_updater::dispatch::Dispatcher;
use serde_json::{Value, json};

use super::{Case, apply, assert_names, call, case, fixture, pod, router};

fn capi_failure(hook: Hook, body: &[u8]) -> String {
    let (status, message, patched) = if hook == Hook::CanUpdateMachine {
        let r = capi_sim::decode_can_update_machine_response(body).unwrap();
        let patched = [
            &r.machine_patch,
            &r.bootstrap_config_patch,
            &r.infrastructure_machine_patch,
        ]
        .iter()
        .any(|p| p.is_defined());
        (r.status, r.message, patched)
    } else {
        let r = capi_sim::decode_can_update_machine_set_response(body).unwrap();
        let patched = [
            &r.machine_set_patch,
            &r.bootstrap_config_template_patch,
            &r.infrastructure_machine_template_patch,
        ]
        .iter()
        .any(|p| p.is_defined());
        (r.status, r.message, patched)
    };
    assert!(!patched, "a refused request carries no patch");
    match check_response_status(&status, &message) {
        Err(CapiError::Failure { message }) => message,
        other => panic!("CAPI would not see a Failure: {other:?}"),
    }
}

async fn can_update_cases(hook: Hook, fixture_name: &str, cases: Vec<Case>) {
    let router = router(Dispatcher::in_memory());
    let valid = fixture(fixture_name);
    let answer = call(&router, hook, &valid).await;
    let status = serde_json::from_slice::<Value>(&answer).unwrap()["status"].clone();
    assert_eq!(status, "Success", "the unchanged fixture is accepted");
    for case in &cases {
        let body = call(&router, hook, &apply(valid.clone(), &case.changes)).await;
        assert_names(hook, &capi_failure(hook, &body), case);
    }
}

/// The request the CanUpdateMachine cases change.
pub(crate) const MACHINE_FIXTURE: &str = "can-update-machine-kcp-mixed.json";
/// The request the CanUpdateMachineSet cases change.
pub(crate) const MACHINE_SET_FIXTURE: &str = "can-update-machineset-md.json";

#[tokio::test]
async fn can_update_machine_refuses_malformed_objects_naming_the_field() {
    can_update_cases(Hook::CanUpdateMachine, MACHINE_FIXTURE, machine_cases()).await;
}

#[tokio::test]
async fn can_update_machine_set_refuses_malformed_templates_naming_the_field() {
    can_update_cases(
        Hook::CanUpdateMachineSet,
        MACHINE_SET_FIXTURE,
        machine_set_cases(),
    )
    .await;
}

/// Malformed CanUpdateMachine requests: changes to [`MACHINE_FIXTURE`].
pub(crate) fn machine_cases() -> Vec<Case> {
    vec![
        case(
            "/current/machine",
            Some(pod("p")),
            "current.machine.apiVersion: expected \"cluster.x-k8s.io/<version>\", found \"v1\"",
        ),
        case(
            "/desired/machine/kind",
            Some(json!("MachineSet")),
            "desired.machine.kind: expected \"Machine\", found \"MachineSet\"",
        ),
        case(
            "/desired/machine/apiVersion",
            Some(json!("infrastructure.cluster.x-k8s.io/v1beta2")),
            "desired.machine.apiVersion: expected \"cluster.x-k8s.io/<version>\"",
        ),
        case(
            "/desired/machine/metadata",
            None,
            "desired.machine.metadata: missing, expected an object",
        ),
        case(
            "/desired/machine/metadata/name",
            Some(json!("a/b")),
            "desired.machine.metadata.name: expected a Kubernetes object name",
        ),
        case(
            "/desired/machine/metadata/name",
            Some(json!("Edge-01")),
            "desired.machine.metadata.name: expected a Kubernetes object name",
        ),
        case(
            "/desired/machine/metadata/namespace",
            Some(json!("kube_system")),
            "desired.machine.metadata.namespace: expected a Kubernetes namespace",
        ),
        case(
            "/desired/machine/spec",
            Some(json!([])),
            "desired.machine.spec: expected an object, found a list",
        ),
        case(
            "/desired/machine/spec/version",
            Some(json!(134)),
            "desired.machine.spec.version: expected a string, found a number",
        ),
        case(
            "/desired/machine/spec/clusterName",
            Some(json!("Edge")),
            "desired.machine.spec.clusterName: expected a Kubernetes object name",
        ),
        case(
            "/desired/machine/metadata/labels",
            Some(json!({"a": 1})),
            "desired.machine.metadata.labels[a]: expected a string, found a number",
        ),
        case(
            "/desired/machine/metadata/annotations",
            Some(json!(["x"])),
            "desired.machine.metadata.annotations: expected an object of strings, found a list",
        ),
        case(
            "/desired/bootstrapConfig/spec/files",
            Some(json!("x")),
            "desired.bootstrapConfig.spec.files: expected a list of objects, found a string",
        ),
        case(
            "/desired/bootstrapConfig/spec/files/0/path",
            Some(json!(7)),
            "desired.bootstrapConfig.spec.files[0].path: expected a string, found a number",
        ),
        case(
            "/desired/bootstrapConfig/spec/files/0/encoding",
            Some(json!("zip")),
            "desired.bootstrapConfig.spec.files[0].encoding: expected one of \"base64\", \"gzip\", \"gzip+base64\", found \"zip\"",
        ),
        case(
            "/desired/bootstrapConfig/spec/users/0/sshAuthorizedKeys",
            Some(json!("ssh-ed25519 AAAA")),
            "desired.bootstrapConfig.spec.users[0].sshAuthorizedKeys: expected a list of strings, found a string",
        ),
        case(
            "/desired/bootstrapConfig/spec/ntp/enabled",
            Some(json!("yes")),
            "desired.bootstrapConfig.spec.ntp.enabled: expected a boolean, found a string",
        ),
        case(
            "/desired/bootstrapConfig/spec/joinConfiguration/nodeRegistration/kubeletExtraArgs",
            Some(json!({"v": "2"})),
            "desired.bootstrapConfig.spec.joinConfiguration.nodeRegistration.kubeletExtraArgs: expected a list of objects, found an object",
        ),
        case(
            "/desired/bootstrapConfig/spec/clusterConfiguration/etcd/local/imageTag",
            Some(json!(3.5)),
            "desired.bootstrapConfig.spec.clusterConfiguration.etcd.local.imageTag: expected a string, found a number",
        ),
        case(
            "/current/bootstrapConfig/kind",
            Some(json!("TalosConfig")),
            "desired.bootstrapConfig.kind: expected the kind of current.bootstrapConfig (\"TalosConfig\"), found \"KubeadmConfig\"",
        ),
        case(
            "/desired/infrastructureMachine/spec",
            None,
            "desired.infrastructureMachine.spec: missing, expected an object",
        ),
        case(
            "/desired/infrastructureMachine/apiVersion",
            Some(json!(5)),
            "desired.infrastructureMachine.apiVersion: expected a string, found a number",
        ),
        case(
            "/desired/infrastructureMachine/metadata/name",
            Some(json!("x".repeat(300))),
            "desired.infrastructureMachine.metadata.name: expected a Kubernetes object name",
        ),
    ]
}

/// Malformed CanUpdateMachineSet requests: changes to [`MACHINE_SET_FIXTURE`].
pub(crate) fn machine_set_cases() -> Vec<Case> {
    let cluster_label =
        "/desired/machineSet/spec/template/metadata/labels/cluster.x-k8s.io~1cluster-name";
    vec![
        case(
            "/desired/machineSet/spec/template",
            Some(json!([])),
            "desired.machineSet.spec.template: expected an object, found a list",
        ),
        case(
            "/desired/machineSet/spec/template/spec/version",
            Some(json!(134)),
            "desired.machineSet.spec.template.spec.version: expected a string, found a number",
        ),
        case(
            "/desired/machineSet/spec/template/spec",
            None,
            "desired.machineSet.spec.template.spec: missing, expected an object",
        ),
        case(
            "/desired/machineSet/kind",
            Some(json!("MachineDeployment")),
            "desired.machineSet.kind: expected \"MachineSet\", found \"MachineDeployment\"",
        ),
        case(
            "/current/machineSet",
            Some(pod("p")),
            "current.machineSet.apiVersion: expected \"cluster.x-k8s.io/<version>\"",
        ),
        case(
            "/desired/machineSet/metadata/name",
            Some(json!("m".repeat(254))),
            "desired.machineSet.metadata.name: expected a Kubernetes object name",
        ),
        case(
            cluster_label,
            Some(json!("Bad Name")),
            "desired.machineSet.spec.template.metadata.labels[cluster.x-k8s.io/cluster-name]: expected a Kubernetes object name",
        ),
        case(
            "/desired/machineSet/spec/template/spec/readinessGates",
            Some(json!([{"conditionType": 1}])),
            "desired.machineSet.spec.template.spec.readinessGates[0].conditionType: expected a string, found a number",
        ),
        case(
            "/desired/bootstrapConfigTemplate/spec/template/spec/files/0/content",
            Some(json!({})),
            "desired.bootstrapConfigTemplate.spec.template.spec.files[0].content: expected a string, found an object",
        ),
        case(
            "/desired/bootstrapConfigTemplate/spec/template",
            None,
            "desired.bootstrapConfigTemplate.spec.template: missing, expected an object",
        ),
        case(
            "/desired/bootstrapConfigTemplate/metadata",
            Some(json!("x")),
            "desired.bootstrapConfigTemplate.metadata: expected an object, found a string",
        ),
        case(
            "/desired/infrastructureMachineTemplate/spec/template/spec",
            Some(json!("x")),
            "desired.infrastructureMachineTemplate.spec.template.spec: expected an object, found a string",
        ),
        case(
            "/desired/infrastructureMachineTemplate/kind",
            Some(json!("OtherMachineTemplate")),
            "desired.infrastructureMachineTemplate.kind: expected the kind of current.infrastructureMachineTemplate (\"DevMachineTemplate\")",
        ),
        case(
            "/desired/infrastructureMachineTemplate/kind",
            Some(json!("Dev Machine")),
            "desired.infrastructureMachineTemplate.kind: expected a kind",
        ),
    ]
}

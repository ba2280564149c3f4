//! UpdateMachine: each malformed request is a Failure, and the store — holding the Machine's real run — is
//! exactly as it was afterwards.

use std::sync::Arc;

use capi_sim::UpdateOutcome;
use inplace_store::Store;
use inplace_updater::api::Hook;
use inplace_updater::dispatch::Dispatcher;
use serde_json::{Value, json};

use super::{Case, apply, assert_names, call, case, fixture, pod, router};

/// Every key, value and revision in the store.
async fn contents(store: &Arc<dyn Store>) -> Vec<(String, Vec<u8>, u64)> {
    let entries = store.list("").await.unwrap();
    entries
        .into_iter()
        .map(|e| (e.key, e.value, e.revision.0))
        .collect()
}

fn update_outcome(body: &[u8]) -> UpdateOutcome {
    capi_sim::update_machine(body)
}

#[tokio::test]
async fn update_machine_refuses_malformed_objects_and_keeps_the_recorded_run() {
    let store = inplace_store::open(&inplace_store::StoreUrl::Memory, &Default::default())
        .await
        .unwrap();
    let dispatcher = Dispatcher::new(store.clone(), Default::default(), Default::default());
    let router = router(dispatcher);
    let valid = fixture(FIXTURE);
    // What CAPI asks first: CanUpdateMachine accepts this desired state in place (its verdict licenses the run).
    let judged = call(
        &router,
        Hook::CanUpdateMachine,
        &fixture("can-update-machine-kcp-version.json"),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&judged).contains(r#""status":"Success""#),
        "{}",
        String::from_utf8_lossy(&judged)
    );
    // The Machine's real run, recorded by a well-formed call.
    let first = update_outcome(&call(&router, Hook::UpdateMachine, &valid).await);
    assert!(
        matches!(first, UpdateOutcome::InProgress { .. }),
        "{first:?}"
    );
    let before = contents(&store).await;
    assert!(
        before
            .iter()
            .any(|(key, _, _)| key.contains("edge-01-control-plane-abcde")),
        "the run is recorded: {:?}",
        before.iter().map(|e| &e.0).collect::<Vec<_>>()
    );

    for case in &cases(&valid) {
        let body = call(
            &router,
            Hook::UpdateMachine,
            &apply(valid.clone(), &case.changes),
        )
        .await;
        match update_outcome(&body) {
            UpdateOutcome::Failed { message } => assert_names(Hook::UpdateMachine, &message, case),
            other => panic!(
                "{:?}: CAPI would not see a Failure: {other:?}",
                case.changes
            ),
        }
        assert_eq!(
            contents(&store).await,
            before,
            "{:?}: the store must be exactly as it was",
            case.changes
        );
    }

    // The comparison can fail: a well-formed new desired spec for the same Machine does replace the run.
    let newer = apply(
        valid,
        &[("/desired/machine/spec/version", Some(json!("v1.34.2")))],
    );
    let judged = call(
        &router,
        Hook::CanUpdateMachine,
        &apply(
            fixture("can-update-machine-kcp-version.json"),
            &[("/desired/machine/spec/version", Some(json!("v1.34.2")))],
        ),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&judged).contains(r#""status":"Success""#),
        "{}",
        String::from_utf8_lossy(&judged)
    );
    let answer = update_outcome(&call(&router, Hook::UpdateMachine, &newer).await);
    assert!(
        matches!(answer, UpdateOutcome::InProgress { .. }),
        "{answer:?}"
    );
    assert_ne!(contents(&store).await, before);
}

/// The request the UpdateMachine cases change.
pub(crate) const FIXTURE: &str = "update-machine-kcp.json";

/// Malformed UpdateMachine requests: changes to `valid` ([`FIXTURE`]).
pub(crate) fn cases(valid: &Value) -> Vec<Case> {
    let mut pod_as_machine = pod("edge-01-control-plane-abcde");
    pod_as_machine["metadata"]["labels"] =
        valid["desired"]["machine"]["metadata"]["labels"].clone();
    vec![
        case(
            "/desired/machine",
            Some(pod_as_machine),
            "desired.machine.apiVersion: expected \"cluster.x-k8s.io/<version>\", found \"v1\"",
        ),
        case(
            "/desired/machine/metadata/name",
            Some(json!("../../etc")),
            "desired.machine.metadata.name: expected a Kubernetes object name (a DNS-1123 subdomain",
        ),
        case(
            "/desired/machine/metadata/name",
            Some(json!("edge/01")),
            "desired.machine.metadata.name: expected a Kubernetes object name",
        ),
        case(
            "/desired/machine/metadata/namespace",
            Some(json!("Default")),
            "desired.machine.metadata.namespace: expected a Kubernetes namespace (a DNS-1123 label",
        ),
        case(
            "/desired/machine/spec/version",
            Some(json!(134)),
            "desired.machine.spec.version: expected a string, found a number",
        ),
        case(
            "/desired/machine/spec/clusterName",
            Some(json!(7)),
            "desired.machine.spec.clusterName: expected a Kubernetes object name",
        ),
        case(
            "/desired/machine/spec/providerID",
            Some(json!(["x"])),
            "desired.machine.spec.providerID: expected a string, found a list",
        ),
        case(
            "/desired/machine/spec/failureDomain",
            Some(json!(false)),
            "desired.machine.spec.failureDomain: expected a string, found a boolean",
        ),
        case(
            "/desired/machine/spec",
            Some(json!([])),
            "desired.machine.spec: expected an object, found a list",
        ),
        case(
            "/desired/machine/metadata/labels/cluster.x-k8s.io~1cluster-name",
            Some(json!("../x")),
            "desired.machine.metadata.labels[cluster.x-k8s.io/cluster-name]: expected a Kubernetes object name",
        ),
        case(
            "/desired/bootstrapConfig/spec/files",
            Some(json!({"path": "/etc/x"})),
            "desired.bootstrapConfig.spec.files: expected a list of objects, found an object",
        ),
        case(
            "/desired/bootstrapConfig/spec/files/0/path",
            Some(json!(7)),
            "desired.bootstrapConfig.spec.files[0].path: expected a string, found a number",
        ),
        case(
            "/desired/bootstrapConfig/spec/files/0/append",
            Some(json!("true")),
            "desired.bootstrapConfig.spec.files[0].append: expected a boolean, found a string",
        ),
        case(
            "/desired/bootstrapConfig/spec/files/1/contentFrom",
            Some(json!("secret")),
            "desired.bootstrapConfig.spec.files[1].contentFrom: expected an object, found a string",
        ),
        case(
            "/desired/bootstrapConfig/spec/users/0/sshAuthorizedKeys",
            Some(json!("ssh-ed25519 AAAA")),
            "desired.bootstrapConfig.spec.users[0].sshAuthorizedKeys: expected a list of strings, found a string",
        ),
        case(
            "/desired/bootstrapConfig/spec/users/0/name",
            None,
            "desired.bootstrapConfig.spec.users[0].name: missing, expected a string",
        ),
        case(
            "/desired/bootstrapConfig/spec/ntp/servers",
            Some(json!("pool.ntp.org")),
            "desired.bootstrapConfig.spec.ntp.servers: expected a list of strings, found a string",
        ),
        case(
            "/desired/bootstrapConfig/spec/joinConfiguration/nodeRegistration/kubeletExtraArgs/0/value",
            Some(json!(1)),
            "desired.bootstrapConfig.spec.joinConfiguration.nodeRegistration.kubeletExtraArgs[0].value: expected a string, found a number",
        ),
        case(
            "/desired/bootstrapConfig/spec/clusterConfiguration/etcd/local/imageTag",
            Some(json!(3)),
            "desired.bootstrapConfig.spec.clusterConfiguration.etcd.local.imageTag: expected a string, found a number",
        ),
        case(
            "/desired/bootstrapConfig/kind",
            None,
            "desired.bootstrapConfig.kind: missing, expected a kind",
        ),
        case(
            "/desired/bootstrapConfig",
            Some(json!([1, 2])),
            "desired.bootstrapConfig: expected an object, found a list",
        ),
        case(
            "/desired/infrastructureMachine/metadata/name",
            None,
            "desired.infrastructureMachine.metadata.name: missing, expected a Kubernetes object name",
        ),
    ]
}

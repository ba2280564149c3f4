//! UpdateMachine performs only what a CanUpdate answer accepted, against the real server process: the races
//! CAPI can produce (KubeadmControlPlane changing its spec between CanUpdateMachine and the trigger, a
//! MachineDeployment reusing a CanUpdateMachineSet verdict for later Machines), each answer read the way
//! CAPI reads it (capi-sim). A restart between the two hooks is in `e2e_durability`, two replicas in
//! `e2e_ha`.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use capi_sim::{CapiDecision, UpdateOutcome};
use common::fleet::{Capi, update_request};
use common::{Client, ServerProcess, certs, plain_get};
use inplace_core::verdict::label_value;
use serde_json::{Value, json};

/// The fake bootstrap token CABPK wrote into the UpdateMachine fixtures' KubeadmConfig.
const BOOTSTRAP_TOKEN: &str = "k9r2qm.7c4e1f0a9b3d8e6f";

fn capi(certs: &common::Certs, server: &ServerProcess) -> Capi {
    Capi {
        client: Client::new(&certs.paths.ca_cert, None, false),
        addr: server.hooks,
    }
}

fn failed(outcome: UpdateOutcome) -> String {
    match outcome {
        UpdateOutcome::Failed { message } => message,
        other => panic!("CAPI should see a Failure, saw {other:?}"),
    }
}

fn in_progress(outcome: &UpdateOutcome) -> bool {
    matches!(outcome, UpdateOutcome::InProgress { .. })
}

/// `/status` rows for `machine`: (state, step).
fn status_of(server: &ServerProcess, machine: &str) -> Vec<(String, String)> {
    let (code, body) = plain_get(server.health, "/status").unwrap();
    assert_eq!(code, 200, "{body}");
    let rows: Vec<Value> = serde_json::from_str(&body).unwrap();
    rows.iter()
        .filter(|r| r["machine"] == format!("default/{machine}"))
        .map(|r| {
            (
                r["state"].as_str().unwrap().to_string(),
                r["step"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn metric(server: &ServerProcess, reason: &str) -> u64 {
    let (_, text) = plain_get(server.metrics, "/metrics").unwrap();
    let name = format!("inplace_updater_unjudged_updates_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&name))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// The fingerprint a refusal offers for the override annotation.
fn offered(message: &str) -> String {
    let needle = "inplace-updater.dev/accept-unjudged=";
    let at = message.find(needle).unwrap_or_else(|| panic!("{message}"));
    message[at + needle.len()..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect()
}

/// KCP asked CanUpdateMachine about spec A, then triggered the update with a spec that also holds a change
/// CanUpdateMachine never saw (KCP's TODO: its spec changed before a retried trigger). Refused, naming the
/// path, with no run recorded; A itself — as CAPI really sends it, with CABPK's token and every difference
/// KCP's diff preparation introduces — runs. Neither the token nor file content reaches a verdict or a log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcp_changes_after_can_update_machine_are_refused_and_the_judged_spec_runs() {
    let certs = certs();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = format!("file:{}", data.display());
    let mut server = ServerProcess::start(&certs.paths, &["--store", &store]);
    let capi = capi(&certs, &server);
    let name = "edge-01-control-plane-race1";
    capi.kcp_judges(name).await;
    let judged = update_request("update-machine-kcp.json", name);

    let mut disks = judged.clone();
    disks["desired"]["bootstrapConfig"]["spec"]["diskSetup"] =
        json!({"partitions": [{"device": "/dev/sdb", "layout": true, "tableType": "gpt"}]});
    let message = failed(capi.update_machine(&disks).await);
    assert!(
        message.contains("refused (changed-after-judgement)")
            && message.contains("KubeadmConfig spec.diskSetup (added)")
            && message.contains("after CanUpdateMachine judged this Machine at ")
            && message.contains("Nothing was run on the node"),
        "{message}"
    );
    assert_eq!(
        status_of(&server, name),
        [("refused".to_string(), "changed-after-judgement".to_string())],
        "no run recorded"
    );

    let mut secret_file = judged.clone();
    secret_file["desired"]["bootstrapConfig"]["spec"]["files"]
        .as_array_mut()
        .unwrap()
        .push(json!({"path": "/etc/kubernetes/extra.conf", "owner": "root:root", "permissions": "0600",
            "contentFrom": {"secret": {"name": "edge-01-extra", "key": "extra.conf"}}}));
    let message = failed(capi.update_machine(&secret_file).await);
    assert!(
        message.contains("KubeadmConfig spec.files[path=/etc/kubernetes/extra.conf] (added)"),
        "{message}"
    );
    assert_eq!(metric(&server, "changed-after-judgement"), 2);

    // Only differences CAPI itself introduces: defaults spelled out, empty lists, the health-check timeout
    // v1beta1 conversion adds, an init configuration left from CAPI <= 1.11, DNS and the endpoint CABPK/KCP
    // own. Not a change: it runs.
    let mut noisy = judged.clone();
    let spec = &mut noisy["desired"]["bootstrapConfig"]["spec"];
    spec.as_object_mut().unwrap().remove("format");
    spec["mounts"] = json!([]);
    spec["bootCommands"] = json!([]);
    spec["clusterConfiguration"]["apiServer"]["extraEnvs"] = json!([]);
    spec["clusterConfiguration"]["dns"] = json!({"imageTag": "v1.12.0"});
    spec["joinConfiguration"]["nodeRegistration"]["imagePullPolicy"] = json!("IfNotPresent");
    spec["joinConfiguration"]["nodeRegistration"]["ignorePreflightErrors"] = json!([]);
    spec["joinConfiguration"]["timeouts"] = json!({"controlPlaneComponentHealthCheckSeconds": 240});
    spec["initConfiguration"] = json!({"nodeRegistration": {"imagePullPolicy": "IfNotPresent"}});
    let outcome = capi.update_machine(&noisy).await;
    assert!(in_progress(&outcome), "{outcome:?}");
    let outcome = capi.update_machine(&judged).await;
    assert!(in_progress(&outcome), "exactly A: {outcome:?}");
    let rows = status_of(&server, name);
    assert_eq!(
        rows.len(),
        1,
        "one run, the refusals no longer shown: {rows:?}"
    );
    assert_eq!(rows[0].0, "waiting");

    let logs = server.logs().join("\n");
    assert!(
        logs.contains("UpdateMachine refused"),
        "refusals are logged"
    );
    assert!(
        !logs.contains(BOOTSTRAP_TOKEN),
        "the bootstrap token reached a log"
    );
    server.kill9();
    let store = inplace_store::file::FileStore::open(&data).await.unwrap();
    let verdicts = inplace_store::Store::list(&store, "verdicts/")
        .await
        .unwrap();
    assert_eq!(verdicts.len(), 1);
    let text = String::from_utf8_lossy(&verdicts[0].value);
    for secret in [BOOTSTRAP_TOKEN, "level: Metadata", "net.ipv4.ip_forward"] {
        assert!(
            !text.contains(secret),
            "{secret:?} in a verdict record: {text}"
        );
    }
    assert!(text.contains("spec.files[path=/etc/kubernetes/audit-policy.yaml].content"));
}

/// A MachineDeployment asks CanUpdateMachineSet once and moves Machines to the new MachineSet for as long
/// as CAPI caches the answer. Every Machine whose objects are the judged templates plus their own instance
/// fields runs (also under a MachineSet name CAPI hashes into the label); one whose bootstrap config holds
/// other template content than was judged is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_set_verdict_is_reused_for_later_machines_of_its_templates_only() {
    let certs = certs();
    let server = ServerProcess::start(&certs.paths, &[]);
    let capi = capi(&certs, &server);
    let question: Value =
        serde_json::from_slice(&common::fixture("can-update-machineset-md.json")).unwrap();
    assert_eq!(
        capi.can_update_machine_set(&question).await,
        CapiDecision::InPlace
    );
    for name in ["edge-01-md-0-q9vdm-aaaaa", "edge-01-md-0-q9vdm-bbbbb"] {
        let outcome = capi
            .update_machine(&update_request("update-machine-worker.json", name))
            .await;
        assert!(in_progress(&outcome), "{name}: {outcome:?}");
    }
    let mut edited = update_request("update-machine-worker.json", "edge-01-md-0-q9vdm-ccccc");
    edited["desired"]["bootstrapConfig"]["spec"]["files"][0]["content"] =
        json!("version = 2\n[plugins]\n");
    let message = failed(capi.update_machine(&edited).await);
    assert!(
        message.contains(
            "KubeadmConfig spec.files[path=/etc/containerd/config.toml].content (changed)"
        ) && message.contains("CanUpdateMachineSet judged MachineSet default/edge-01-md-0-q9vdm"),
        "{message}"
    );
    assert_eq!(metric(&server, "changed-after-judgement"), 1);

    // A MachineSet name over 63 characters reaches the Machine as CAPI's hashed label value.
    let long = format!("edge-01-md-0-{}", "q".repeat(60));
    let mut question = question.clone();
    question["desired"]["machineSet"]["metadata"]["name"] = json!(long);
    assert_eq!(
        capi.can_update_machine_set(&question).await,
        CapiDecision::InPlace
    );
    let mut moved = update_request("update-machine-worker.json", "edge-01-md-0-long-ddddd");
    moved["desired"]["machine"]["metadata"]["labels"]["cluster.x-k8s.io/set-name"] =
        json!(label_value(&long));
    let outcome = capi.update_machine(&moved).await;
    assert!(in_progress(&outcome), "{outcome:?}");
}

/// No verdict at all (new install, lost store, expired): refused, fail-safe. The operator's annotation with
/// the fingerprint the refusal showed lets exactly that state run; a wrong one does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_verdict_only_the_operator_fingerprint_lets_the_update_run() {
    let certs = certs();
    let server = ServerProcess::start(&certs.paths, &[]);
    let capi = capi(&certs, &server);
    let name = "edge-01-control-plane-nover";
    let request = update_request("update-machine-kcp.json", name);
    let message = failed(capi.update_machine(&request).await);
    assert!(message.contains("refused (no-verdict)"), "{message}");
    let fingerprint = offered(&message);
    assert_eq!(fingerprint.len(), 16, "{message}");
    assert_eq!(
        status_of(&server, name),
        [("refused".to_string(), "no-verdict".to_string())]
    );

    let annotate = |value: &str| {
        let mut annotated = request.clone();
        annotated["desired"]["machine"]["metadata"]["annotations"]["inplace-updater.dev/accept-unjudged"] =
            json!(value);
        annotated
    };
    let message = failed(capi.update_machine(&annotate("feedfacecafebeef")).await);
    assert!(message.contains("another state's fingerprint"), "{message}");
    let outcome = capi.update_machine(&annotate(&fingerprint)).await;
    assert!(in_progress(&outcome), "{outcome:?}");
    assert_eq!(status_of(&server, name)[0].0, "waiting");
    assert_eq!(metric(&server, "no-verdict"), 2);
    server.wait_for_log("an operator accepted a desired state no CanUpdate answer judged");
}

//! UpdateMachine against recorded CanUpdate verdicts, over the in-memory store: what is refused, that a
//! refusal writes nothing but its own record, the operator override, MachineSet verdicts found by label,
//! repeats of a running update, and retention.

use std::time::Duration;

use inplace_core::verdict::{Normalized, label_value};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::dispatch::floor::keys::{machine_set_verdict_key, machine_verdict_key};
use crate::dispatch::testing::*;
use crate::dispatch::*;

fn text(value: &Value) -> Box<RawValue> {
    RawValue::from_string(value.to_string()).unwrap()
}

/// Every key under the prefixes a run writes (Machine record, run, apply claim, provider index).
async fn run_keys(d: &Dispatcher) -> Vec<String> {
    let mut keys = Vec::new();
    for prefix in ["machines/", "updates/", "clusters/", "providers/"] {
        keys.extend(
            d.store()
                .list(prefix)
                .await
                .unwrap()
                .into_iter()
                .map(|e| e.key),
        );
    }
    keys
}

fn refused(answer: UpdateAnswer) -> (RefusalReason, String) {
    match answer {
        UpdateAnswer::Refused { reason, message } => (reason, message),
        other => panic!("not refused: {other:?}"),
    }
}

/// The fingerprint a refusal message offers for the override.
fn offered(message: &str) -> String {
    let at = message
        .find(&format!("{ACCEPT_UNJUDGED_ANNOTATION}="))
        .unwrap();
    message[at + ACCEPT_UNJUDGED_ANNOTATION.len() + 1..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect()
}

fn with_annotation(r: UpdateRequest, value: &str) -> UpdateRequest {
    let mut machine = r.machine.clone();
    machine["metadata"]["annotations"] = json!({ ACCEPT_UNJUDGED_ANNOTATION: value });
    with_machine(&r, machine)
}

/// No verdict: refused, with no run, no Machine record and no `kubeadm upgrade apply` claim written (a
/// control-plane Machine that never runs must not hold the claim), only the refusal `status` shows.
#[tokio::test]
async fn without_a_verdict_nothing_is_recorded_or_claimed() {
    let d = dispatcher(memory().await);
    let r = request("cp-1", true, "v1.34.1", "secret-content");
    let (reason, message) = refused(d.runs.update_machine(&r).await.unwrap());
    assert_eq!(reason, RefusalReason::NoVerdict);
    assert!(
        message.contains("no CanUpdateMachine or CanUpdateMachineSet verdict"),
        "{message}"
    );
    assert!(message.contains("--verdict-retention 72h"), "{message}");
    assert!(
        message.contains("kubectl annotate machine -n default cp-1"),
        "{message}"
    );
    assert!(!message.contains("secret-content"));
    assert!(run_keys(&d).await.is_empty(), "{:?}", run_keys(&d).await);
    let rows = d.fleet.status().await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].state, StatusState::Refused);
    assert_eq!(rows[0].step, "no-verdict");
    for entry in d.store().list("").await.unwrap() {
        assert!(!String::from_utf8_lossy(&entry.value).contains("secret-content"));
    }

    // The next control-plane Machine judged in place gets `apply`: the refused one claimed nothing.
    let other = request("cp-2", true, "v1.34.1", "x");
    judge_in_place(&d, &other).await;
    d.runs.update_machine(&other).await.unwrap();
    let plan = d
        .agents
        .poll(&super::tests::scope(), &super::tests::poll_for("cp-2", 0))
        .await
        .unwrap()
        .plan
        .unwrap();
    assert!(
        plan.steps
            .iter()
            .any(|s| s.description.contains("kubeadm upgrade apply")),
        "{:?}",
        plan.steps
            .iter()
            .map(|s| &s.description)
            .collect::<Vec<_>>()
    );
}

/// The override names one state: a wrong fingerprint is refused, the offered one runs (once per state: a
/// later change is refused again).
#[tokio::test]
async fn the_operator_accepts_exactly_the_state_the_refusal_showed() {
    let d = dispatcher(memory().await);
    let r = request("m-1", false, "v1.34.1", "hi");
    let (_, message) = refused(d.runs.update_machine(&r).await.unwrap());
    let fingerprint = offered(&message);
    assert_eq!(fingerprint.len(), 16, "{message}");

    let wrong = with_annotation(r.clone(), "0123456789abcdef");
    let (reason, message) = refused(d.runs.update_machine(&wrong).await.unwrap());
    assert_eq!(reason, RefusalReason::NoVerdict);
    assert!(message.contains("another state's fingerprint"), "{message}");
    assert!(run_keys(&d).await.is_empty());

    let right = with_annotation(r.clone(), &fingerprint);
    assert!(matches!(
        d.runs.update_machine(&right).await.unwrap(),
        UpdateAnswer::InProgress { .. }
    ));
    assert!(
        d.fleet
            .status()
            .await
            .unwrap()
            .iter()
            .all(|row| row.state != StatusState::Refused),
        "a run since the refusal hides it"
    );
    let next = with_annotation(request("m-1", false, "v1.34.2", "hi"), &fingerprint);
    assert_eq!(
        refused(d.runs.update_machine(&next).await.unwrap()).0,
        RefusalReason::NoVerdict
    );
}

/// A change beyond the verdict is refused by path; nothing is replaced; exactly the judged state runs.
#[tokio::test]
async fn a_change_after_the_verdict_is_refused_by_path() {
    let d = dispatcher(memory().await);
    let judged = request("m-1", false, "v1.34.1", "hi");
    judge_in_place(&d, &judged).await;
    let mut later = request("m-1", false, "v1.34.1", "bye");
    let mut bootstrap: Value =
        serde_json::from_str(later.bootstrap.as_ref().unwrap().get()).unwrap();
    bootstrap["spec"]["diskSetup"] = json!({"partitions": [{"device": "/dev/sdb"}]});
    later.bootstrap = Some(text(&bootstrap));
    let (reason, message) = refused(d.runs.update_machine(&later).await.unwrap());
    assert_eq!(reason, RefusalReason::ChangedAfterJudgement);
    assert!(
        message.contains("spec.files[path=/etc/motd].content (changed)")
            && message.contains("spec.diskSetup (added)")
            && message.contains("after CanUpdateMachine judged this Machine at 20"),
        "{message}"
    );
    assert!(run_keys(&d).await.is_empty());
    assert!(matches!(
        d.runs.update_machine(&judged).await.unwrap(),
        UpdateAnswer::InProgress { .. }
    ));
}

/// A verdict that sent the change to a rollout licenses nothing, even for exactly its state.
#[tokio::test]
async fn a_rollout_verdict_licenses_nothing() {
    let d = dispatcher(memory().await);
    let r = request("m-1", false, "v1.34.1", "hi");
    d.licences
        .record_verdict(
            &machine_verdict_key(&r.desired.facts.machine),
            &verdict_for(&r, false),
        )
        .await
        .unwrap();
    let (reason, message) = refused(d.runs.update_machine(&r).await.unwrap());
    assert_eq!(reason, RefusalReason::NotInPlace);
    assert!(
        message.contains("sent this desired state to a rollout (KubeadmConfig spec.diskSetup)"),
        "{message}"
    );
}

/// A worker Machine of a MachineDeployment: the new MachineSet's verdict, found through the Machine's
/// `set-name` label (hashed as CAPI hashes names over 63 characters) and checked template-wise.
#[tokio::test]
async fn a_machine_set_verdict_covers_the_machines_moved_to_it() {
    let d = dispatcher(memory().await);
    let set_name = format!("edge-01-md-0-{}", "x".repeat(60));
    let label = label_value(&set_name);
    assert!(label.starts_with("hash_"));
    let files = json!([{"path": "/etc/motd", "content": "hi"}]);
    let templates = [
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
            "spec": {"template": {"spec": {"version": "v1.34.1", "bootstrap": {"configRef": {"name": "t"}}}}}}),
        json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfigTemplate",
            "spec": {"template": {"spec": {"files": files}}}}),
    ];
    let normalized = Normalized::of(
        inplace_core::Scope::Template,
        &inplace_core::Objects {
            machine: Some(&templates[0]),
            bootstrap: Some(&templates[1]),
            infra: None,
        },
    );
    let prints = normalized.prints();
    let verdict = VerdictRecord {
        hook: VerdictHook::CanUpdateMachineSet,
        object: format!("default/{set_name}"),
        judged_ms: now_ms(),
        in_place: true,
        accepted: vec![],
        rejected: vec![],
        rejected_total: 0,
        template_hash: Some("123-abc".into()),
        node_change: None,
        fingerprint: prints.fingerprint(),
        prints,
    };
    d.licences
        .record_verdict(&machine_set_verdict_key("default", &label), &verdict)
        .await
        .unwrap();

    let worker = |name: &str, hash: &str, content: &str| {
        let machine = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "default", "labels": {
                "cluster.x-k8s.io/cluster-name": "edge-01", "cluster.x-k8s.io/set-name": label,
                "machine-template-hash": hash}},
            "spec": {"clusterName": "edge-01", "version": "v1.34.1", "providerID": format!("p://{name}"),
                "bootstrap": {"configRef": {"name": name}, "dataSecretName": name}}});
        let bootstrap = json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig",
            "spec": {"files": [{"path": "/etc/motd", "content": content}],
                "joinConfiguration": {"discovery": {"bootstrapToken": {"token": "abcdef.0123456789abcdef"}}}}});
        request_of(&machine, &bootstrap)
    };
    assert!(matches!(
        d.runs
            .update_machine(&worker("w-1", "123-abc", "hi"))
            .await
            .unwrap(),
        UpdateAnswer::InProgress { .. }
    ));
    let (reason, message) = refused(
        d.runs
            .update_machine(&worker("w-2", "123-abc", "changed"))
            .await
            .unwrap(),
    );
    assert_eq!(reason, RefusalReason::ChangedAfterJudgement);
    assert!(
        message.contains(&format!(
            "CanUpdateMachineSet judged MachineSet default/{set_name}"
        )),
        "{message}"
    );
    assert_eq!(
        refused(
            d.runs
                .update_machine(&worker("w-3", "999-zzz", "hi"))
                .await
                .unwrap()
        )
        .0,
        RefusalReason::NoVerdict,
        "another template revision's MachineSet hashed to the same label"
    );
}

/// Once a run is recorded, CAPI's repeated calls need no verdict any more: the exact repeat, another
/// spelling of the same objects.
#[tokio::test]
async fn a_running_update_keeps_answering_without_its_verdict() {
    let d = dispatcher(memory().await);
    let r = request("m-1", false, "v1.34.1", "hi");
    judge_in_place(&d, &r).await;
    let first = d.runs.update_machine(&r).await.unwrap();
    d.store()
        .delete(
            &machine_verdict_key(&r.desired.facts.machine),
            inplace_store::Precondition::Any,
        )
        .await
        .unwrap();
    assert_eq!(d.runs.update_machine(&r).await.unwrap(), first);
    let pretty = |raw: &RawValue| {
        let value: Value = serde_json::from_str(raw.get()).unwrap();
        RawValue::from_string(serde_json::to_string_pretty(&value).unwrap()).unwrap()
    };
    let respelled = UpdateRequest {
        machine_text: pretty(&r.machine_text),
        hashed: Default::default(),
        ..r.clone()
    };
    assert_eq!(d.runs.update_machine(&respelled).await.unwrap(), first);

    // A new desired state is a new judgement.
    assert_eq!(
        refused(
            d.runs
                .update_machine(&request("m-1", false, "v1.34.2", "hi"))
                .await
                .unwrap()
        )
        .0,
        RefusalReason::NoVerdict
    );
}

#[tokio::test]
async fn verdicts_and_refusals_expire() {
    let store = memory().await;
    let config = DispatchConfig {
        verdict_retention: Duration::ZERO,
        ..DispatchConfig::default()
    };
    let d = Dispatcher::new(store, config, CancellationToken::new());
    let r = request("m-1", false, "v1.34.1", "hi");
    judge_in_place(&d, &r).await;
    d.runs
        .update_machine(&request("m-2", false, "v1.34.1", "hi"))
        .await
        .unwrap();
    assert_eq!(d.licences.sweep().await.unwrap(), 2);
    assert!(d.store().list("verdicts/").await.unwrap().is_empty());
    assert!(d.store().list("refusals/").await.unwrap().is_empty());
}

/// CAPI re-asks CanUpdate on every reconcile: the same judgement is not written again (no fsync per call on
/// the default store) until the stored one is `VERDICT_REFRESH` old; a different judgement is written at once.
#[tokio::test]
async fn a_repeated_judgement_is_written_once_per_refresh_interval() {
    let d = dispatcher(memory().await);
    let r = request("m-1", false, "v1.34.1", "hi");
    let key = machine_verdict_key(&r.desired.facts.machine);
    let first = verdict_for(&r, true);
    d.licences.record_verdict(&key, &first).await.unwrap();
    let revision = |d: &Dispatcher| {
        let key = key.clone();
        let store = d.store().clone();
        async move { store.get(&key).await.unwrap().unwrap().revision }
    };
    let written = revision(&d).await;

    let minute_later = VerdictRecord {
        judged_ms: first.judged_ms + 60_000,
        ..first.clone()
    };
    d.licences
        .record_verdict(&key, &minute_later)
        .await
        .unwrap();
    assert_eq!(
        revision(&d).await,
        written,
        "an identical judgement was written again"
    );
    assert_eq!(stored_verdict(&d, &key).await.judged_ms, first.judged_ms);

    let other = verdict_for(&r, false);
    d.licences.record_verdict(&key, &other).await.unwrap();
    assert_ne!(
        revision(&d).await,
        written,
        "a changed judgement was not written"
    );
    let written = revision(&d).await;

    let hour_later = VerdictRecord {
        judged_ms: other.judged_ms + VERDICT_REFRESH.as_millis() as u64,
        ..other.clone()
    };
    d.licences.record_verdict(&key, &hour_later).await.unwrap();
    assert_ne!(revision(&d).await, written, "the time was never refreshed");
    assert_eq!(
        stored_verdict(&d, &key).await.judged_ms,
        hour_later.judged_ms
    );
}

async fn stored_verdict(d: &Dispatcher, key: &str) -> VerdictRecord {
    let entry = d.store().get(key).await.unwrap().unwrap();
    serde_json::from_slice(&entry.value).unwrap()
}

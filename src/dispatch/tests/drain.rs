//! Dispatch with drains (issue 15): a run recorded before drains were planned continues as recorded, and a
//! drain step's progress text reaches UpdateMachine's message.

use inplace_agent_api::{KubeadmUpgradeMode, StepStatus};
use inplace_core::drain::{NodeChange, VersionChange};

use super::tests::{dispatcher, memory, poll_for, report, request, scope, update, verdict_for};
use super::floor::keys::machine_verdict_key;
use super::*;

const KEY: &str = "machines/default/m-1";

async fn stored(d: &Dispatcher, key: &str) -> serde_json::Value {
    let entry = d.store().get(key).await.unwrap().unwrap();
    serde_json::from_slice(&entry.value).unwrap()
}

async fn put(d: &Dispatcher, key: &str, value: &impl serde::Serialize) {
    d.store()
        .put(
            key,
            serde_json::to_vec(value).unwrap(),
            inplace_store::Precondition::Any,
        )
        .await
        .unwrap();
}

/// Records the run `asked` asks for and returns the plan its agent gets.
async fn recorded(d: &Dispatcher, asked: &UpdateRequest) -> inplace_agent_api::Plan {
    update(d, asked).await.unwrap();
    d.agents.poll(&scope(), &poll_for("m-1", 0))
        .await
        .unwrap()
        .plan
        .unwrap()
}

/// The Machine record and verdict of `machine` rewritten as a server before drain planning wrote them: no
/// node change, no `nodeSteps`, and an input fingerprint of another server version.
async fn as_written_before_drains(d: &Dispatcher, request: &UpdateRequest, node_steps: bool) {
    let key = format!("machines/default/{}", request.desired.facts.machine.name);
    let mut record = stored(d, &key).await;
    let object = record.as_object_mut().unwrap();
    object.remove("nodeChange");
    object.remove("nodeSteps");
    if node_steps {
        object.insert("nodeSteps".into(), true.into());
    }
    object.insert("inputHash".into(), "inplace-updater/older".into());
    put(d, &key, &record).await;
    let mut verdict = verdict_for(request, true);
    verdict.node_change = None;
    d.licences.record_verdict(&machine_verdict_key(&request.desired.facts.machine), &verdict)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_run_recorded_before_drains_were_planned_continues_as_recorded() {
    let d = dispatcher(memory().await);
    // The judgement "files only" plans no node steps: exactly the plan the older server recorded.
    let asked = request("m-1", false, "v1.34.1", "hi");
    let plan = recorded(&d, &asked).await;
    let recorded_kinds: Vec<_> = plan.steps.iter().map(|s| s.action.kind()).collect();
    assert_eq!(
        recorded_kinds,
        [
            "files",
            "installKubeadm",
            "kubeadmUpgrade",
            "installKubelet"
        ]
    );
    d.agents.report(&scope(), &report("m-1", &plan.id, 0, StepStatus::Succeeded))
        .await
        .unwrap();
    d.agents.report(&scope(), &report("m-1", &plan.id, 1, StepStatus::Running))
        .await
        .unwrap();
    let before = stored(&d, KEY).await;
    as_written_before_drains(&d, &asked, false).await;
    // Nothing says what changed now, so this server would plan a drain for the same desired state...
    let now_planned =
        plan_for(&asked, KubeadmUpgradeMode::Node, &NodeChange::unknown(true)).unwrap();
    assert!(
        now_planned
            .steps
            .iter()
            .any(|s| s.action.kind() == "drainNode")
    );

    // ...but the next UpdateMachine (the server upgraded mid-run, a new input fingerprint) continues the run.
    let answer = d.runs.update_machine(&asked).await.unwrap();
    let UpdateAnswer::InProgress { message, .. } = &answer else {
        panic!("{answer:?}")
    };
    assert!(
        message.starts_with("step 2/4: install kubeadm v1.34.1"),
        "{message}"
    );
    let after = stored(&d, KEY).await;
    assert_eq!(after["runId"], before["runId"], "the same run");
    assert_eq!(after["stateHash"], before["stateHash"]);
    assert!(
        after.get("nodeSteps").is_none(),
        "still the older plan: {after}"
    );
    assert_eq!(
        d.store().list("updates/").await.unwrap().len(),
        1,
        "no new run"
    );
    // The agent keeps getting the recorded plan and finishes it.
    let again = d
        .poll(&scope(), &poll_for("m-1", 0))
        .await
        .unwrap()
        .plan
        .unwrap();
    assert_eq!(again, plan);
    for index in 1..4 {
        d.agents.report(
            &scope(),
            &report("m-1", &plan.id, index, StepStatus::Succeeded),
        )
        .await
        .unwrap();
    }
    assert!(matches!(
        d.runs.update_machine(&asked).await.unwrap(),
        UpdateAnswer::Done { .. }
    ));
}

#[tokio::test]
async fn a_record_of_this_version_with_another_plan_is_a_new_run() {
    // The control for the test above: a record that says it was planned with node steps is not continued
    // when the plan differs.
    let d = dispatcher(memory().await);
    let asked = request("m-1", false, "v1.34.1", "hi");
    update(&d, &asked).await.unwrap();
    let before = stored(&d, KEY).await;
    as_written_before_drains(&d, &asked, true).await;
    d.runs.update_machine(&asked).await.unwrap();
    let after = stored(&d, KEY).await;
    assert_ne!(after["runId"], before["runId"]);
    let plan = d
        .poll(&scope(), &poll_for("m-1", 0))
        .await
        .unwrap()
        .plan
        .unwrap();
    assert!(plan.steps.iter().any(|s| s.action.kind() == "drainNode"));
}

#[tokio::test]
async fn the_drain_steps_progress_text_is_shown() {
    let d = dispatcher(memory().await);
    let asked = request("m-1", false, "v1.34.1", "hi");
    let mut verdict = verdict_for(&asked, true);
    verdict.node_change = Some(NodeChange {
        version: VersionChange::Minor,
        actions: [inplace_core::Action::KubernetesVersion].into(),
    });
    d.licences.record_verdict(&machine_verdict_key(&asked.facts.machine), &verdict)
        .await
        .unwrap();
    d.runs.update_machine(&asked).await.unwrap();
    let plan = d
        .poll(&scope(), &poll_for("m-1", 0))
        .await
        .unwrap()
        .plan
        .unwrap();
    let kinds: Vec<_> = plan.steps.iter().map(|s| s.action.kind()).collect();
    assert_eq!(
        kinds,
        [
            "files",
            "installKubeadm",
            "kubeadmUpgrade",
            "drainNode",
            "installKubelet",
            "waitNodeReady",
            "uncordonNode"
        ]
    );
    for index in 0..3 {
        d.agents.report(
            &scope(),
            &report("m-1", &plan.id, index, StepStatus::Succeeded),
        )
        .await
        .unwrap();
    }
    let mut draining = report("m-1", &plan.id, 3, StepStatus::Running);
    draining.finished_at_unix_ms = None;
    draining.message = Some("draining node-a: 4 pods left, waiting on PDB web/pdb".into());
    d.agents.report(&scope(), &draining).await.unwrap();
    let answer = d.runs.update_machine(&asked).await.unwrap();
    let UpdateAnswer::InProgress { message, .. } = &answer else {
        panic!("{answer:?}")
    };
    assert_eq!(
        message,
        "step 4/7: drain the node (minor Kubernetes version change; at most 600s) \
         (draining node-a: 4 pods left, waiting on PDB web/pdb)"
    );
    // A newer text replaces it.
    draining.message = Some("draining node-a: 1 pod left".into());
    d.agents.report(&scope(), &draining).await.unwrap();
    let UpdateAnswer::InProgress { message, .. } = d.runs.update_machine(&asked).await.unwrap() else {
        panic!()
    };
    assert!(
        message.ends_with("(draining node-a: 1 pod left)"),
        "{message}"
    );
    // Not done before the node is Ready with the new kubelet and uncordoned.
    for index in 3..6 {
        d.agents.report(
            &scope(),
            &report("m-1", &plan.id, index, StepStatus::Succeeded),
        )
        .await
        .unwrap();
    }
    let UpdateAnswer::InProgress { message, .. } = d.runs.update_machine(&asked).await.unwrap() else {
        panic!()
    };
    assert!(
        message.starts_with("step 7/7: uncordon the node"),
        "{message}"
    );
}

/// An operator retry of a failed run recorded before drains were planned starts a fresh run of it, as for any
/// failed run (the retry compares the recorded state, which has no node steps, not this version's plan id).
#[tokio::test]
async fn an_operator_retry_restarts_a_failed_run_recorded_before_drains() {
    let d = dispatcher(memory().await);
    let asked = request("m-1", false, "v1.34.1", "hi");
    let plan = recorded(&d, &asked).await;
    d.agents.report(&scope(), &report("m-1", &plan.id, 0, StepStatus::Failed))
        .await
        .unwrap();
    as_written_before_drains(&d, &asked, false).await;
    assert!(matches!(
        d.runs.update_machine(&asked).await.unwrap(),
        UpdateAnswer::Failed { .. }
    ));
    let failed = stored(&d, KEY).await["runId"].clone();

    let machine = serde_json::json!({
        "metadata": {
            "name": "m-1", "namespace": "default",
            "labels": { "cluster.x-k8s.io/cluster-name": "edge-01" },
            "annotations": { RETRY_ANNOTATION: "1" }
        },
        "spec": { "clusterName": "edge-01", "version": "v1.34.1" }
    });
    let bootstrap =
        serde_json::json!({ "spec": { "files": [ { "path": "/etc/motd", "content": "hi" } ] } });
    let retried = super::tests::request_of(&machine, &bootstrap);
    let answer = d.runs.update_machine(&retried).await.unwrap();
    assert!(
        matches!(answer, UpdateAnswer::InProgress { .. }),
        "the retry restarts the run: {answer:?}"
    );
    assert_ne!(stored(&d, KEY).await["runId"], failed, "a fresh run");
}

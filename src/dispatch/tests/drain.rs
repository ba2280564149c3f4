//! Dispatch with drains (issue 15): a drain step's progress text reaches UpdateMachine's message.

use inplace_agent_api::StepStatus;
use inplace_core::drain::{NodeChange, VersionChange};

use crate::dispatch::floor::keys::machine_verdict_key;
use crate::dispatch::testing::*;
use crate::dispatch::*;

#[tokio::test]
async fn the_drain_steps_progress_text_is_shown() {
    let d = dispatcher(memory().await);
    let asked = request("m-1", false, "v1.34.1", "hi");
    let mut verdict = verdict_for(&asked, true);
    verdict.node_change = Some(NodeChange {
        version: VersionChange::Minor,
        actions: [
            inplace_core::Action::KubernetesVersion,
            inplace_core::Action::Files,
        ]
        .into(),
    });
    d.licences
        .record_verdict(&machine_verdict_key(&asked.desired.facts.machine), &verdict)
        .await
        .unwrap();
    d.runs.update_machine(&asked).await.unwrap();
    let plan = handed_plan(&d, "m-1").await;
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
    agent_reports(&d, "m-1", &plan.id, 0..3, StepStatus::Succeeded).await;
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
    let UpdateAnswer::InProgress { message, .. } = d.runs.update_machine(&asked).await.unwrap()
    else {
        panic!()
    };
    assert!(
        message.ends_with("(draining node-a: 1 pod left)"),
        "{message}"
    );
    // Not done before the node is Ready with the new kubelet and uncordoned.
    agent_reports(&d, "m-1", &plan.id, 3..6, StepStatus::Succeeded).await;
    let UpdateAnswer::InProgress { message, .. } = d.runs.update_machine(&asked).await.unwrap()
    else {
        panic!()
    };
    assert!(
        message.starts_with("step 7/7: uncordon the node"),
        "{message}"
    );
}

//! Plans with a drain: where the node steps go and what they carry.

use std::collections::BTreeSet;

use inplace_agent_api::{KubeadmUpgradeMode, StepAction, validate_plan};
use serde_json::{Value, json};

use super::*;
use crate::Action;
use crate::drain::{
    self, DEFAULT_DRAIN_TIMEOUT_SECONDS, DrainRules, MachineDrain, NodeChange, VersionChange, Why,
};
use crate::objects::Scope;

fn machine(control_plane: bool, annotations: Value) -> Value {
    let mut labels = json!({ "cluster.x-k8s.io/cluster-name": "edge-01" });
    if control_plane {
        labels["cluster.x-k8s.io/control-plane"] = json!("");
    }
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": { "name": "edge-01-md-abcde", "namespace": "default", "labels": labels,
                      "annotations": annotations },
        "spec": { "clusterName": "edge-01", "version": "v1.34.1",
                  "deletion": { "nodeDrainTimeoutSeconds": 240 } }
    })
}

fn config() -> Value {
    json!({"spec": {
        "clusterConfiguration": { "etcd": { "local": { "imageTag": "3.5.21-0" } } },
        "joinConfiguration": { "nodeRegistration": { "kubeletExtraArgs": [ { "name": "max-pods", "value": "200" } ] } },
        "files": [ { "path": "/etc/motd", "content": "hello" } ],
        "users": [ { "name": "capi", "sshAuthorizedKeys": ["ssh-ed25519 AAAA key-1"] } ],
        "ntp": { "servers": ["0.pool.ntp.org"] }
    }})
}

/// The plan the way dispatch builds it: the drain decided from the change, the rules and the Machine.
fn plan(
    machine: &Value,
    change: &NodeChange,
    rules: &DrainRules,
    actions: &BTreeSet<Action>,
) -> Plan {
    let facts = MachineFacts::of(machine).unwrap();
    let verdict = drain::decide(
        change,
        rules,
        &MachineDrain::of(Scope::Object, machine),
        crate::VersionSteps::default(),
    );
    let plan = build(&PlanInput {
        facts: &facts,
        bootstrap: Some(&config().to_string()),
        inputs: &allowed(actions),
        change,
        upgrade_mode: KubeadmUpgradeMode::Node,
        drain: verdict.drain().copied(),
        infra: None,
    })
    .unwrap();
    validate_plan(&plan).unwrap();
    plan
}

fn kinds(plan: &Plan) -> Vec<&'static str> {
    plan.steps.iter().map(|s| s.action.kind()).collect()
}

fn all() -> BTreeSet<Action> {
    Action::ALL.into_iter().collect()
}

fn change(version: VersionChange, actions: &[Action]) -> NodeChange {
    NodeChange {
        version,
        actions: actions.iter().copied().collect(),
    }
}

#[test]
fn a_minor_upgrade_drains_after_kubeadm_and_is_done_once_the_kubelet_reports_the_version() {
    // The version with every other action of the config: the drain goes after kubeadm, before the kubelet.
    let p = plan(
        &machine(true, json!({})),
        &change(VersionChange::Minor, &Action::ALL),
        &DrainRules::default(),
        &all(),
    );
    assert_eq!(
        kinds(&p),
        [
            "files",
            "sshKeys",
            "ntp",
            "installKubeadm",
            "kubeadmUpgrade",
            "drainNode",
            "installKubelet",
            "etcdImage",
            "kubeletArgs",
            "waitNodeReady",
            "uncordonNode"
        ]
    );
    let drain = &p.steps[5];
    assert_eq!(
        drain.timeout_seconds, 240,
        "the Machine's node drain timeout"
    );
    assert_eq!(
        drain.action,
        StepAction::DrainNode {
            delete_empty_dir_data: false,
            force_unmanaged: false
        }
    );
    assert!(
        drain
            .description
            .contains("minor Kubernetes version change"),
        "{}",
        drain.description
    );
    assert_eq!(
        p.steps[9].action,
        StepAction::WaitNodeReady {
            kubelet_version: Some("v1.34.1".into())
        }
    );
    assert_eq!(
        p.steps[9].timeout_seconds,
        drain::WAIT_NODE_READY_TIMEOUT_SECONDS
    );
    assert_eq!(p.steps[10].timeout_seconds, drain::UNCORDON_TIMEOUT_SECONDS);
    assert!(p.steps.iter().enumerate().all(|(i, s)| s.index == i as u32));
}

#[test]
fn a_kubelet_flags_drain_waits_for_ready_without_a_version() {
    let rules = DrainRules {
        kubelet_args: true,
        ..DrainRules::default()
    };
    let actions: BTreeSet<Action> = [Action::Files, Action::KubeletArgs].into();
    let p = plan(
        &machine(false, json!({})),
        &change(VersionChange::None, &[Action::Files, Action::KubeletArgs]),
        &rules,
        &actions,
    );
    assert_eq!(
        kinds(&p),
        [
            "files",
            "drainNode",
            "kubeletArgs",
            "waitNodeReady",
            "uncordonNode"
        ]
    );
    assert_eq!(
        p.steps[3].action,
        StepAction::WaitNodeReady {
            kubelet_version: None
        }
    );
}

/// The plan of `change` built without a drain: what a plan was before drains existed.
fn undrained(m: &Value, change: &NodeChange) -> Plan {
    let facts = MachineFacts::of(m).unwrap();
    build(&PlanInput {
        facts: &facts,
        bootstrap: Some(&config().to_string()),
        inputs: &allowed(&all()),
        change,
        upgrade_mode: KubeadmUpgradeMode::Node,
        drain: None,
        infra: None,
    })
    .unwrap()
}

#[test]
fn no_drain_leaves_the_plan_as_it_was() {
    let m = machine(true, json!({}));
    let files = change(VersionChange::None, &[Action::Files]);
    let without = plan(&m, &files, &DrainRules::default(), &all());
    assert_eq!(without, undrained(&m, &files));
    // The annotation: no drain, no cordon, no node steps at all, even for a minor version change.
    let excluded = machine(true, json!({ drain::EXCLUDE_NODE_DRAINING_ANNOTATION: "" }));
    let minor = plan(
        &excluded,
        &change(VersionChange::Minor, &[Action::KubernetesVersion]),
        &DrainRules::default(),
        &all(),
    );
    assert!(
        !kinds(&minor)
            .iter()
            .any(|k| ["drainNode", "waitNodeReady", "uncordonNode"].contains(k))
    );
    // A patch change with patchVersion off.
    let off = DrainRules {
        patch_version: false,
        ..DrainRules::default()
    };
    let patch_change = change(VersionChange::Patch, &[Action::KubernetesVersion]);
    let patch = plan(&m, &patch_change, &off, &all());
    assert_eq!(patch.id, undrained(&m, &patch_change).id);
}

#[test]
fn a_drain_with_nothing_restarting_kubelet_adds_no_steps() {
    let actions: BTreeSet<Action> = [Action::Files, Action::SshKeys].into();
    let p = plan(
        &machine(false, json!({})),
        &change(VersionChange::Unknown, &[Action::Files, Action::SshKeys]),
        &DrainRules::default(),
        &actions,
    );
    assert_eq!(kinds(&p), ["files", "sshKeys"]);
}

#[test]
fn the_drain_flags_and_default_timeout_reach_the_step() {
    let mut m = machine(false, json!({}));
    m["spec"].as_object_mut().unwrap().remove("deletion");
    let rules = DrainRules {
        delete_empty_dir_data: true,
        force_unmanaged: true,
        ..DrainRules::default()
    };
    let p = plan(
        &m,
        &change(VersionChange::Patch, &[Action::KubernetesVersion]),
        &rules,
        &all(),
    );
    let step = p
        .steps
        .iter()
        .find(|s| s.action.kind() == "drainNode")
        .unwrap();
    assert_eq!(step.timeout_seconds, DEFAULT_DRAIN_TIMEOUT_SECONDS);
    assert_eq!(
        step.action,
        StepAction::DrainNode {
            delete_empty_dir_data: true,
            force_unmanaged: true
        }
    );
    assert!(step.description.contains("patch Kubernetes version change"));
    assert_eq!(
        drain::decide(
            &change(VersionChange::Patch, &[]),
            &rules,
            &MachineDrain::of(Scope::Object, &m),
            crate::VersionSteps::default()
        )
        .drain()
        .map(|d| d.why),
        Some(Why::PatchVersion)
    );
}

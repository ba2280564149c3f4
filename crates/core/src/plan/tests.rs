use std::collections::BTreeSet;

use inplace_agent_api::{FileEncoding, KubeadmUpgradeMode, StepAction, validate_plan};
use serde_json::{Value, json};

use super::*;
use crate::Action;
use crate::drain::NodeChange;

fn machine(control_plane: bool) -> Value {
    let mut labels = json!({ "cluster.x-k8s.io/cluster-name": "edge-01" });
    if control_plane {
        labels["cluster.x-k8s.io/control-plane"] = json!("");
    }
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": { "name": "edge-01-cp-abcde", "namespace": "default", "labels": labels },
        "spec": { "clusterName": "edge-01", "version": "v1.34.1", "providerID": "dev://edge-01-cp-abcde" }
    })
}

fn kubeadm_config() -> Value {
    json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig",
        "metadata": { "name": "edge-01-cp-abcde", "namespace": "default" },
        "spec": {
            "clusterConfiguration": { "etcd": { "local": { "imageTag": "3.5.21-0" } } },
            "joinConfiguration": { "nodeRegistration": { "kubeletExtraArgs": [ { "name": "max-pods", "value": "200" } ] } },
            "files": [
                { "path": "/etc/motd", "content": "hello", "permissions": "0644" },
                { "path": "/etc/agent-token", "contentFrom": { "secret": { "name": "t", "key": "token" } } },
                { "path": "/etc/blob", "content": "aGk=", "encoding": "base64", "owner": "root:root" }
            ],
            "users": [ { "name": "capi", "sshAuthorizedKeys": ["ssh-ed25519 AAAA key-1"] }, { "name": "nokeys" } ],
            "ntp": { "servers": ["0.pool.ntp.org", "1.pool.ntp.org"], "enabled": true }
        }
    })
}

/// What nobody judged: every action moves, so only the allowed actions narrow the plan.
fn unjudged() -> NodeChange {
    NodeChange::unknown(true)
}

fn all_actions() -> BTreeSet<Action> {
    Action::ALL.into_iter().collect()
}

fn plan_for(
    machine: &Value,
    bootstrap: &Value,
    actions: &BTreeSet<Action>,
    mode: KubeadmUpgradeMode,
) -> Plan {
    let facts = MachineFacts::of(machine).unwrap();
    build(&PlanInput {
        facts: &facts,
        bootstrap: Some(&bootstrap.to_string()),
        inputs: &allowed(actions),
        change: &unjudged(),
        upgrade_mode: mode,
        drain: None,
        infra: None,
    })
    .unwrap()
}

fn kinds(plan: &Plan) -> Vec<&'static str> {
    plan.steps.iter().map(|s| s.action.kind()).collect()
}

#[test]
fn control_plane_plan_orders_config_then_upgrade_then_what_upgrade_overwrites() {
    let plan = plan_for(
        &machine(true),
        &kubeadm_config(),
        &all_actions(),
        KubeadmUpgradeMode::Apply,
    );
    assert_eq!(
        kinds(&plan),
        [
            "files",
            "sshKeys",
            "ntp",
            "installKubeadm",
            "kubeadmUpgrade",
            "installKubelet",
            "etcdImage",
            "kubeletArgs"
        ]
    );
    assert_eq!(
        plan.steps[4].description,
        "kubeadm upgrade apply (v1.34.1) [point of no return]"
    );
    assert!(
        plan.steps
            .iter()
            .enumerate()
            .all(|(i, s)| s.index as usize == i)
    );
    validate_plan(&plan).expect("the agent accepts what we build");
    assert_eq!(plan.cluster, "edge-01");
    assert_eq!(plan.machine.to_string(), "default/edge-01-cp-abcde");
}

#[test]
fn workers_always_upgrade_node_and_never_touch_etcd() {
    let plan = plan_for(
        &machine(false),
        &kubeadm_config(),
        &all_actions(),
        KubeadmUpgradeMode::Apply,
    );
    assert!(!kinds(&plan).contains(&"etcdImage"));
    assert!(plan.steps.iter().any(|s| matches!(
        s.action,
        StepAction::KubeadmUpgrade {
            mode: KubeadmUpgradeMode::Node,
            ..
        }
    )));
}

#[test]
fn only_allowed_actions_become_steps() {
    let actions: BTreeSet<Action> = [Action::Files, Action::SshKeys].into_iter().collect();
    let plan = plan_for(
        &machine(true),
        &kubeadm_config(),
        &actions,
        KubeadmUpgradeMode::Apply,
    );
    assert_eq!(kinds(&plan), ["files", "sshKeys"]);
    let StepAction::Files { files } = &plan.steps[0].action else {
        panic!()
    };
    let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/etc/motd", "/etc/blob"],
        "secret-sourced files are not managed"
    );
    assert_eq!(files[1].encoding, FileEncoding::Base64);
    let StepAction::SshKeys { users } = &plan.steps[1].action else {
        panic!()
    };
    assert_eq!(
        users.len(),
        1,
        "users without sshAuthorizedKeys are left alone"
    );
}

#[test]
fn id_is_stable_and_changes_with_any_desired_byte() {
    let a = plan_for(
        &machine(true),
        &kubeadm_config(),
        &all_actions(),
        KubeadmUpgradeMode::Apply,
    );
    let b = plan_for(
        &machine(true),
        &kubeadm_config(),
        &all_actions(),
        KubeadmUpgradeMode::Apply,
    );
    assert_eq!(a.id, b.id);
    assert_eq!(a.id.len(), 64);
    let mut changed = kubeadm_config();
    changed["spec"]["files"][0]["content"] = json!("hello!");
    assert_ne!(
        a.id,
        plan_for(
            &machine(true),
            &changed,
            &all_actions(),
            KubeadmUpgradeMode::Apply
        )
        .id
    );
    assert_ne!(
        a.id,
        plan_for(
            &machine(true),
            &kubeadm_config(),
            &all_actions(),
            KubeadmUpgradeMode::Node
        )
        .id
    );
}

#[test]
fn secrets_stay_out_of_debug_output() {
    let plan = plan_for(
        &machine(true),
        &kubeadm_config(),
        &all_actions(),
        KubeadmUpgradeMode::Apply,
    );
    let debug = format!("{plan:?}");
    assert!(!debug.contains("hello"), "{debug}");
    assert!(!debug.contains("key-1"), "{debug}");
}

#[test]
fn malformed_fields_are_named() {
    let mut bad = kubeadm_config();
    bad["spec"]["files"][0]["encoding"] = json!("rot13");
    let facts = MachineFacts::of(&machine(true)).unwrap();
    let err = build(&PlanInput {
        facts: &facts,
        bootstrap: Some(&bad.to_string()),
        inputs: &allowed(&all_actions()),
        change: &unjudged(),
        upgrade_mode: KubeadmUpgradeMode::Node,
        drain: None,
        infra: None,
    })
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("bootstrapConfig.spec.files[0].encoding"),
        "{err}"
    );
    let mut nameless = machine(false);
    nameless["spec"]
        .as_object_mut()
        .unwrap()
        .remove("clusterName");
    nameless["metadata"]["labels"] = json!({});
    assert_eq!(MachineFacts::of(&nameless), Err(PlanError::NoCluster));
}

fn try_build(bootstrap: &str, actions: &BTreeSet<Action>) -> Result<Plan, PlanError> {
    let facts = MachineFacts::of(&machine(true)).unwrap();
    build(&PlanInput {
        facts: &facts,
        bootstrap: Some(bootstrap),
        inputs: &allowed(actions),
        change: &unjudged(),
        upgrade_mode: KubeadmUpgradeMode::Node,
        drain: None,
        infra: None,
    })
}

#[test]
fn null_is_unset_as_in_go() {
    let config = json!({"spec": {
        "files": null, "ntp": null,
        "users": [{"name": "capi", "sshAuthorizedKeys": null}],
        "joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": null}},
        "initConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "v", "value": "2"}]}}
    }});
    let plan = try_build(&config.to_string(), &all_actions()).unwrap();
    // No files, no ntp, the user's keys left alone; the join flags unset, so the init flags apply.
    assert_eq!(
        kinds(&plan),
        [
            "installKubeadm",
            "kubeadmUpgrade",
            "installKubelet",
            "kubeletArgs"
        ]
    );
    let StepAction::KubeletArgs { args } = &plan.steps[3].action else {
        panic!()
    };
    assert_eq!(args[0].name, "v");
}

#[test]
fn field_names_are_exact_and_unknown_fields_are_skipped() {
    let config = json!({"spec": {
        "Files": [{"path": "/etc/motd"}],
        "ntp": {"Servers": ["a"], "servers": ["b"], "extra": {"anything": 1}}
    }});
    let actions: BTreeSet<Action> = [Action::Files, Action::Ntp].into_iter().collect();
    let plan = try_build(&config.to_string(), &actions).unwrap();
    assert_eq!(kinds(&plan), ["ntp"]);
    let StepAction::Ntp { servers, .. } = &plan.steps[0].action else {
        panic!()
    };
    assert_eq!(servers, &["b"]);
}

#[test]
fn decode_errors_name_the_field_and_never_show_a_value() {
    let mut config = kubeadm_config();
    config["spec"]["users"][0]["sshAuthorizedKeys"] = json!("ssh-ed25519 AAAA key-1");
    let err = try_build(&config.to_string(), &all_actions())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(
            "field `bootstrapConfig.spec.users[0].sshAuthorizedKeys`: invalid type: a string, expected a sequence"
        ),
        "{err}"
    );
    assert!(!err.contains("key-1"), "{err}");
    let err = try_build("\"secret\"", &all_actions())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("field `bootstrapConfig`: invalid type: a string, expected"),
        "{err}"
    );
}

#[test]
fn a_bootstrap_config_no_allowed_action_reads_is_not_decoded() {
    // e.g. another provider's config, whose `files` has another shape: only the version is planned.
    let talos = json!({"kind": "TalosConfig", "spec": {"files": "not a list"}});
    let actions: BTreeSet<Action> = [Action::KubernetesVersion].into_iter().collect();
    let plan = try_build(&talos.to_string(), &actions).unwrap();
    assert_eq!(
        kinds(&plan),
        ["installKubeadm", "kubeadmUpgrade", "installKubelet"]
    );
    assert!(try_build(&talos.to_string(), &all_actions()).is_err());
}

fn plan_moving(machine: &Value, change: &NodeChange) -> Plan {
    let facts = MachineFacts::of(machine).unwrap();
    build(&PlanInput {
        facts: &facts,
        bootstrap: Some(&kubeadm_config().to_string()),
        inputs: &allowed(&all_actions()),
        change,
        upgrade_mode: KubeadmUpgradeMode::Apply,
        drain: None,
        infra: None,
    })
    .unwrap()
}

fn moving(version: crate::drain::VersionChange, actions: &[Action]) -> NodeChange {
    NodeChange {
        version,
        actions: actions.iter().copied().collect(),
    }
}

#[test]
fn a_plan_holds_the_steps_of_what_the_change_moves() {
    use crate::drain::VersionChange;
    let cp = machine(true);
    // One file changed at the version the node runs: the files step alone, no kubeadm upgrade apply.
    let files = plan_moving(&cp, &moving(VersionChange::None, &[Action::Files]));
    assert_eq!(kinds(&files), ["files"]);
    validate_plan(&files).unwrap();
    // The version alone: its packages and the upgrade, not the unchanged files, keys, time servers or flags.
    let version = plan_moving(
        &cp,
        &moving(VersionChange::Minor, &[Action::KubernetesVersion]),
    );
    assert_eq!(
        kinds(&version),
        ["installKubeadm", "kubeadmUpgrade", "installKubelet"]
    );
    // Keys and flags: their two steps, in the plan's order.
    let two = plan_moving(
        &cp,
        &moving(VersionChange::None, &[Action::KubeletArgs, Action::SshKeys]),
    );
    assert_eq!(kinds(&two), ["sshKeys", "kubeletArgs"]);
    // Nobody judged the change: every allowed action, as before.
    assert_eq!(kinds(&plan_moving(&cp, &unjudged())).len(), 8);
    // The same desired state moved differently is another plan; moved the same, the same plan.
    assert_ne!(files.id, version.id);
    assert_eq!(
        files.id,
        plan_moving(&cp, &moving(VersionChange::None, &[Action::Files])).id
    );
    // A change moving only what the settings do not allow plans nothing.
    let facts = MachineFacts::of(&cp).unwrap();
    let only_files: BTreeSet<Action> = [Action::Files].into_iter().collect();
    let none = build(&PlanInput {
        facts: &facts,
        bootstrap: Some(&kubeadm_config().to_string()),
        inputs: &allowed(&only_files),
        change: &moving(VersionChange::None, &[Action::Ntp]),
        upgrade_mode: KubeadmUpgradeMode::Apply,
        drain: None,
        infra: None,
    })
    .unwrap();
    assert!(none.steps.is_empty());
}

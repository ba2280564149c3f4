//! Golden plan ids: fixed inputs, fixed ids. Machine records and agents compare plan ids across server
//! versions (a changed id is a new run the agent executes again), so a change here must be deliberate.

use std::collections::BTreeSet;

use inplace_agent_api::KubeadmUpgradeMode::{self, Apply, Node};
use serde_json::Value;

use super::*;
use crate::Action;
use crate::drain::{Drain, NodeChange, VersionChange, Why};

const KCP: &str = include_str!("../../../../tests/fixtures/update-machine-kcp.json");
const WORKER: &str = include_str!("../../../../tests/fixtures/update-machine-worker.json");

/// The desired Machine and KubeadmConfig of an UpdateMachine fixture.
fn desired(fixture: &str) -> (Value, Value) {
    let request: Value = serde_json::from_str(fixture).unwrap();
    let desired = &request["desired"];
    (
        desired["machine"].clone(),
        desired["bootstrapConfig"].clone(),
    )
}

/// A control-plane Machine and a KubeadmConfig with every field the plan reads: files (one secret-sourced),
/// users (one without keys), ntp, the etcd image and kubelet flags.
fn every_field() -> (Value, Value) {
    let machine = serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": { "name": "edge-01-cp-abcde", "namespace": "default",
            "labels": { "cluster.x-k8s.io/cluster-name": "edge-01", "cluster.x-k8s.io/control-plane": "" } },
        "spec": { "clusterName": "edge-01", "version": "v1.34.1", "providerID": "dev://edge-01-cp-abcde" }
    });
    let config = serde_json::json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig",
        "metadata": { "name": "edge-01-cp-abcde", "namespace": "default" },
        "spec": {
            "clusterConfiguration": { "etcd": { "local": { "imageTag": "3.5.21-0", "imageRepository": "registry.k8s.io" } } },
            "joinConfiguration": { "nodeRegistration": { "kubeletExtraArgs": [ { "name": "max-pods", "value": "200" } ] } },
            "initConfiguration": { "nodeRegistration": { "kubeletExtraArgs": [ { "name": "ignored", "value": "join wins" } ] } },
            "files": [
                { "path": "/etc/motd", "content": "hello", "permissions": "0644" },
                { "path": "/etc/agent-token", "contentFrom": { "secret": { "name": "t", "key": "token" } } },
                { "path": "/etc/blob", "content": "aGk=", "encoding": "base64", "owner": "root:root" },
                { "path": "/etc/log.conf", "content": "x\n", "encoding": "", "append": true }
            ],
            "users": [ { "name": "capi", "sshAuthorizedKeys": ["ssh-ed25519 AAAA key-1", "ssh-ed25519 BBBB key-2"] },
                       { "name": "nokeys" }, { "name": "emptied", "sshAuthorizedKeys": [] } ],
            "ntp": { "servers": ["0.pool.ntp.org", "1.pool.ntp.org"], "enabled": true }
        }
    });
    (machine, config)
}

fn ids_and_kinds(input: &(Value, Value), mode: KubeadmUpgradeMode) -> (String, Vec<&'static str>) {
    ids_and_kinds_drained(input, mode, None)
}

fn ids_and_kinds_drained(
    input: &(Value, Value),
    mode: KubeadmUpgradeMode,
    drain: Option<Drain>,
) -> (String, Vec<&'static str>) {
    ids_and_kinds_moving(input, mode, drain, &NodeChange::unknown(true))
}

fn ids_and_kinds_moving(
    (machine, bootstrap): &(Value, Value),
    mode: KubeadmUpgradeMode,
    drain: Option<Drain>,
    change: &NodeChange,
) -> (String, Vec<&'static str>) {
    let facts = MachineFacts::of(machine).unwrap();
    let actions: BTreeSet<Action> = Action::ALL.into_iter().collect();
    let plan = build(&PlanInput {
        facts: &facts,
        bootstrap: Some(&bootstrap.to_string()),
        inputs: &allowed(&actions),
        change,
        upgrade_mode: mode,
        drain,
        infra: None,
    })
    .unwrap();
    let kinds = plan.steps.iter().map(|s| s.action.kind()).collect();
    (plan.id, kinds)
}

const CONTROL_PLANE: [&str; 8] = [
    "files",
    "sshKeys",
    "ntp",
    "installKubeadm",
    "kubeadmUpgrade",
    "installKubelet",
    "etcdImage",
    "kubeletArgs",
];
const WORKER_KINDS: [&str; 7] = [
    "files",
    "sshKeys",
    "ntp",
    "installKubeadm",
    "kubeadmUpgrade",
    "installKubelet",
    "kubeletArgs",
];

/// Recorded in `src/plan.rs` before `plan` moved to `crates/core` (commit "golden plan ids before the move"),
/// re-recorded when the kubeadm upgrade step's description gained `[point of no return]` (issue 28). Planned
/// as a change nobody judged ([`NodeChange::unknown`]: every action moves), which kept these ids when plans
/// began to hold only what the change moves (issue 43).
const GOLDEN: [(&str, KubeadmUpgradeMode, &str, &[&str]); 6] = [
    (
        "kcp",
        Apply,
        "b1cc57dba23e3ac0d4855eb61796dcc2dc12bc82a6a0e9cca2ef26f74f422840",
        &CONTROL_PLANE,
    ),
    (
        "kcp",
        Node,
        "c63955a0ba66d00af6fc6800f7cc6a971f12bc54f22fcbcd124787874b292b29",
        &CONTROL_PLANE,
    ),
    // A worker always runs `kubeadm upgrade node`: the mode asked for does not change its plan.
    (
        "worker",
        Apply,
        "90956a73b93c1766b59121a67aa87cb4dca2034df086d5536857777f67602b64",
        &WORKER_KINDS,
    ),
    (
        "worker",
        Node,
        "90956a73b93c1766b59121a67aa87cb4dca2034df086d5536857777f67602b64",
        &WORKER_KINDS,
    ),
    (
        "every-field",
        Apply,
        "50f3206e803ca594856a29662138ea12e9291ed9596e8046c313cedb8c9e6fa1",
        &CONTROL_PLANE,
    ),
    (
        "every-field",
        Node,
        "e93f5240ca02ba037e2a3780b03395e7491b739580ca07d8f01255c891fa98c9",
        &CONTROL_PLANE,
    ),
];

#[test]
fn plan_ids_of_fixed_inputs_never_change() {
    for (name, mode, id, kinds) in GOLDEN {
        let input = match name {
            "kcp" => desired(KCP),
            "worker" => desired(WORKER),
            _ => every_field(),
        };
        let (got, got_kinds) = ids_and_kinds(&input, mode);
        assert_eq!(
            (got.as_str(), got_kinds.as_slice()),
            (id, kinds),
            "{name} {mode:?}: the plan id changed, so every recorded run would start again"
        );
    }
}

const DRAINED_CONTROL_PLANE: [&str; 11] = [
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
    "uncordonNode",
];
const DRAINED_WORKER: [&str; 10] = [
    "files",
    "sshKeys",
    "ntp",
    "installKubeadm",
    "kubeadmUpgrade",
    "drainNode",
    "installKubelet",
    "kubeletArgs",
    "waitNodeReady",
    "uncordonNode",
];

fn drain(why: Why, timeout_seconds: u32, evict_all: bool, version_changes: bool) -> Drain {
    Drain {
        why,
        timeout_seconds,
        delete_empty_dir_data: evict_all,
        force_unmanaged: evict_all,
        version_changes,
    }
}

/// Plans with node steps (issue 15), recorded when drains were first planned; re-recorded when the kubeadm
/// upgrade step's description gained `[point of no return]` (issue 28).
#[test]
fn drained_plan_ids_of_fixed_inputs_never_change() {
    let cases: [(&str, KubeadmUpgradeMode, Drain, &str, &[&str]); 3] = [
        (
            "kcp",
            Apply,
            drain(Why::MinorVersion, 600, false, true),
            "df9fbc8deeb2184f6148bf76271db4eda5ffdeb3395521dc3a8d3890c3e525a8",
            &DRAINED_CONTROL_PLANE,
        ),
        (
            "worker",
            Node,
            drain(Why::PatchVersion, 3600, true, true),
            "0bdfe7b460d4c505387af248e86deba796d41a56afd93d81b89b420c61a9fcf8",
            &DRAINED_WORKER,
        ),
        (
            "every-field",
            Node,
            drain(Why::KubeletArgs, 120, false, false),
            "6dfdc25e6155c369ef8eba29027a28729773375ce6d4fc9121fef59e899d9e8a",
            &DRAINED_CONTROL_PLANE,
        ),
    ];
    for (name, mode, drain, id, kinds) in cases {
        let input = match name {
            "kcp" => desired(KCP),
            "worker" => desired(WORKER),
            _ => every_field(),
        };
        let (got, got_kinds) = ids_and_kinds_drained(&input, mode, Some(drain));
        assert_eq!(
            (got.as_str(), got_kinds.as_slice()),
            (id, kinds),
            "{name} {mode:?} {drain:?}: the plan id changed, so every recorded run would start again"
        );
    }
}

/// A version change alone, drained.
const DRAINED_VERSION: [&str; 6] = [
    "installKubeadm",
    "kubeadmUpgrade",
    "drainNode",
    "installKubelet",
    "waitNodeReady",
    "uncordonNode",
];

/// Fixture, upgrade mode, what the change moves, the drain, the plan id, the step kinds.
type JudgedCase = (
    &'static str,
    KubeadmUpgradeMode,
    NodeChange,
    Option<Drain>,
    &'static str,
    &'static [&'static str],
);

/// Plans of judged changes (issue 43): only the steps of what the change moves. Recorded when plans began to
/// leave out what a change does not move; the same desired states planned unjudged are the ids above.
#[test]
fn plan_ids_of_judged_changes_never_change() {
    let moving = |version, actions: &[Action]| NodeChange {
        version,
        actions: actions.iter().copied().collect(),
    };
    let cases: [JudgedCase; 4] = [
        // One file at the version the node runs: no kubeadm upgrade apply.
        (
            "every-field",
            Apply,
            moving(VersionChange::None, &[Action::Files]),
            None,
            "a7f6440c219a621f36bd32c25e6c2de9cc75f451debf97be52291796e9ddd460",
            &["files"],
        ),
        // The version alone, as CAPI's KubeadmControlPlane upgrades it (the demo's first Machine).
        (
            "kcp",
            Apply,
            moving(VersionChange::Minor, &[Action::KubernetesVersion]),
            Some(drain(Why::MinorVersion, 600, false, true)),
            "6765c53ee150b7b65666b3f9a54601b872569dd3fc677104e5d163599c0a9690",
            &DRAINED_VERSION,
        ),
        (
            "worker",
            Node,
            moving(VersionChange::Patch, &[Action::KubernetesVersion]),
            Some(drain(Why::PatchVersion, 3600, true, true)),
            "913f872cd6548de1377e881a3204d8962ecf1e5006bf97e285aaf790968eff8b",
            &DRAINED_VERSION,
        ),
        // Kubelet flags and the etcd image on a control plane, drained for the flags.
        (
            "every-field",
            Node,
            moving(
                VersionChange::None,
                &[Action::EtcdImage, Action::KubeletArgs],
            ),
            Some(drain(Why::KubeletArgs, 120, false, false)),
            "14d2d461bfd7914f1ac7d1a2fee074d328adac0b3c78f01306d3216ef8546594",
            &[
                "drainNode",
                "etcdImage",
                "kubeletArgs",
                "waitNodeReady",
                "uncordonNode",
            ],
        ),
    ];
    for (name, mode, change, drain, id, kinds) in cases {
        let input = match name {
            "kcp" => desired(KCP),
            "worker" => desired(WORKER),
            _ => every_field(),
        };
        let (got, got_kinds) = ids_and_kinds_moving(&input, mode, drain, &change);
        assert_eq!(
            (got.as_str(), got_kinds.as_slice()),
            (id, kinds),
            "{name} {mode:?} {change:?}: the plan id changed, so every recorded run would start again"
        );
    }
}

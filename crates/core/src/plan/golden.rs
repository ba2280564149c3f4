//! Golden plan ids: fixed inputs, fixed ids. Machine records and agents compare plan ids across server
//! versions (a changed id is a new run the agent executes again), so a change here must be deliberate.

use std::collections::BTreeSet;

use inplace_agent_api::KubeadmUpgradeMode::{self, Apply, Node};
use serde_json::Value;

use super::*;
use crate::Action;
use crate::drain::{Drain, Why};

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
    (machine, bootstrap): &(Value, Value),
    mode: KubeadmUpgradeMode,
    drain: Option<Drain>,
) -> (String, Vec<&'static str>) {
    let facts = MachineFacts::of(machine).unwrap();
    let actions: BTreeSet<Action> = Action::ALL.into_iter().collect();
    let plan = build(&PlanInput {
        facts: &facts,
        bootstrap: Some(&bootstrap.to_string()),
        actions: &actions,
        upgrade_mode: mode,
        drain,
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
/// unchanged since.
const GOLDEN: [(&str, KubeadmUpgradeMode, &str, &[&str]); 6] = [
    (
        "kcp",
        Apply,
        "5630fa237c32b40fc5f28d96d192383142f1f4bd90088f65de49e133df71a2a7",
        &CONTROL_PLANE,
    ),
    (
        "kcp",
        Node,
        "7447ad5442fa8dec0b468bc7846fb7f6559e4f75ef109b40b54d039fff5ed569",
        &CONTROL_PLANE,
    ),
    // A worker always runs `kubeadm upgrade node`: the mode asked for does not change its plan.
    (
        "worker",
        Apply,
        "f2c93126ce1c0f7dcdd1a226ea6c9145fb9dbe9fb0607361306faeceaf5b5b85",
        &WORKER_KINDS,
    ),
    (
        "worker",
        Node,
        "f2c93126ce1c0f7dcdd1a226ea6c9145fb9dbe9fb0607361306faeceaf5b5b85",
        &WORKER_KINDS,
    ),
    (
        "every-field",
        Apply,
        "baa3ac3b95bb0b6b81b265dba408422d5b58b71f4d342b0ba16c7c0e274a62aa",
        &CONTROL_PLANE,
    ),
    (
        "every-field",
        Node,
        "0c8602830f923dd2edc3cf7c308c2dc698b63c441faf769b78573c1b20e0f0e2",
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

/// Plans with node steps (issue 15), recorded when drains were first planned. Their ids are new; the plans
/// without a drain above keep theirs.
#[test]
fn drained_plan_ids_of_fixed_inputs_never_change() {
    let cases: [(&str, KubeadmUpgradeMode, Drain, &str, &[&str]); 3] = [
        (
            "kcp",
            Apply,
            drain(Why::MinorVersion, 600, false, true),
            "76d14aedb7dbf2dd317024cc2bee40b7a94140cf36825a027bbbdcc70f78b733",
            &DRAINED_CONTROL_PLANE,
        ),
        (
            "worker",
            Node,
            drain(Why::PatchVersion, 3600, true, true),
            "3754d0e2b1d2cda2083dff7234f31e349508adabd60b5392e87944334a1a2a01",
            &DRAINED_WORKER,
        ),
        (
            "every-field",
            Node,
            drain(Why::KubeletArgs, 120, false, false),
            "2be20f28114c413f9f653bb0dfa85d7e0e39f01ddd4259b2970b858587b596d9",
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

//! Every rule of the built-in policy, accepted and rejected, through `decide` and read back the way
//! CAPI applies our patches — with both patch types.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use inplace_core::{Action, ChangeVerdict, DecisionOutcome, ObjectRole};
use serde_json::{Value, json};

use ObjectRole::{Bootstrap, Infra, Machine};

struct Case {
    name: &'static str,
    mutate: fn(&mut Req),
    outcome: DecisionOutcome,
    /// (shown path, verdict, reason fragment)
    expect: &'static [(&'static str, ChangeVerdict, &'static str)],
    actions: &'static [Action],
    affects_availability: bool,
}

fn files(req: &mut Req) -> &mut Vec<Value> {
    req.desired_spec(Bootstrap)["files"].as_array_mut().unwrap()
}
fn user(req: &mut Req, i: usize) -> &mut Value {
    &mut req.desired_spec(Bootstrap)["users"][i]
}

const A: ChangeVerdict = ChangeVerdict::Action;
const R: ChangeVerdict = ChangeVerdict::Reject;
const I: ChangeVerdict = ChangeVerdict::Ignored;

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "minor upgrade",
            mutate: |r| r.desired_spec(Machine)["version"] = json!("v1.34.1"),
            outcome: DecisionOutcome::InPlace,
            expect: &[("spec.version", A, "kubernetes-version")],
            actions: &[Action::KubernetesVersion],
            affects_availability: true,
        },
        Case {
            name: "patch upgrade",
            mutate: |r| r.desired_spec(Machine)["version"] = json!("v1.33.5"),
            outcome: DecisionOutcome::InPlace,
            expect: &[("spec.version", A, "kubernetes-version")],
            actions: &[Action::KubernetesVersion],
            affects_availability: true,
        },
        Case {
            name: "downgrade",
            mutate: |r| r.desired_spec(Machine)["version"] = json!("v1.33.3"),
            outcome: DecisionOutcome::NeedsRollout,
            expect: &[("spec.version", R, "downgrade")],
            actions: &[],
            affects_availability: true,
        },
        Case {
            name: "minor skip",
            mutate: |r| r.desired_spec(Machine)["version"] = json!("v1.35.0"),
            outcome: DecisionOutcome::NeedsRollout,
            expect: &[("spec.version", R, "skips a minor version")],
            actions: &[],
            affects_availability: true,
        },
        Case {
            name: "failure domain",
            mutate: |r| r.desired_spec(Machine)["failureDomain"] = json!("fd-2"),
            outcome: DecisionOutcome::NeedsRollout,
            expect: &[("spec.failureDomain", R, "failure domain")],
            actions: &[],
            affects_availability: true,
        },
        Case {
            name: "fields CAPI ignores",
            mutate: |r| {
                let m = r.desired_spec(Machine);
                m["providerID"] = json!("vsphere://other");
                m["minReadySeconds"] = json!(30);
                m["deletion"]["nodeDrainTimeoutSeconds"] = json!(600);
                m["readinessGates"] = json!([{"conditionType": "other/Ready"}]);
                m["taints"] = json!([{"key": "k", "effect": "NoSchedule"}]);
            },
            outcome: DecisionOutcome::InPlace,
            expect: &[
                ("spec.providerID", I, "ignored by CAPI"),
                ("spec.minReadySeconds", I, "ignored by CAPI"),
                (
                    "spec.deletion.nodeDrainTimeoutSeconds",
                    I,
                    "ignored by CAPI",
                ),
                (
                    "spec.readinessGates[conditionType=example.com/Ready]",
                    I,
                    "ignored by CAPI",
                ),
                (
                    "spec.readinessGates[conditionType=other/Ready]",
                    I,
                    "ignored by CAPI",
                ),
                ("spec.taints", I, "ignored by CAPI"),
            ],
            actions: &[],
            affects_availability: false,
        },
        Case {
            name: "inline file content",
            mutate: |r| {
                files(r)[0]["content"] = json!(
                    "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: RequestResponse\n"
                )
            },
            outcome: DecisionOutcome::InPlace,
            expect: &[(
                "spec.files[path=/etc/kubernetes/audit-policy.yaml].content",
                A,
                "files",
            )],
            actions: &[Action::Files],
            affects_availability: false,
        },
        Case {
            name: "inline file added and one removed",
            mutate: |r| {
                let f = files(r);
                f.remove(1);
                f.push(json!({"path": "/etc/motd", "content": "hello\n", "permissions": "0644"}));
            },
            outcome: DecisionOutcome::InPlace,
            expect: &[
                ("spec.files[path=/etc/motd]", A, "files"),
                ("spec.files[path=/etc/sysctl.d/99-k8s.conf]", A, "files"),
            ],
            actions: &[Action::Files],
            affects_availability: false,
        },
        Case {
            name: "static pod manifest file added",
            mutate: |r| {
                files(r).push(json!({"path": "/etc/kubernetes/manifests/extra.yaml", "content": "kind: Pod\n"}))
            },
            outcome: DecisionOutcome::InPlace,
            expect: &[(
                "spec.files[path=/etc/kubernetes/manifests/extra.yaml]",
                A,
                "files",
            )],
            actions: &[Action::Files],
            affects_availability: true,
        },
        Case {
            name: "secret-sourced file changed",
            mutate: |r| files(r)[2]["contentFrom"]["secret"]["name"] = json!("prod-ca-2"),
            outcome: DecisionOutcome::NeedsRollout,
            expect: &[(
                "spec.files[path=/etc/pki/ca.pem].contentFrom.secret.name",
                R,
                "secret-sourced files need a secret resolver",
            )],
            actions: &[],
            affects_availability: true,
        },
        Case {
            name: "secret-sourced file added",
            mutate: |r| {
                files(r).push(json!({"path": "/etc/x.pem", "contentFrom": {"secret": {"name": "s", "key": "k"}}}))
            },
            outcome: DecisionOutcome::NeedsRollout,
            expect: &[("spec.files[path=/etc/x.pem]", R, "contentFrom.secret.")],
            actions: &[],
            affects_availability: true,
        },
        Case {
            name: "ssh key added",
            mutate: |r| {
                user(r, 0)["sshAuthorizedKeys"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!("ssh-ed25519 AAAA-two dev@example.com"))
            },
            outcome: DecisionOutcome::InPlace,
            expect: &[("spec.users[name=capv].sshAuthorizedKeys[1]", A, "ssh-keys")],
            actions: &[Action::SshKeys],
            affects_availability: false,
        },
        Case {
            name: "ssh keys replaced",
            mutate: |r| {
                user(r, 1)["sshAuthorizedKeys"] = json!(["ssh-ed25519 AAAA-new backup@example.com"])
            },
            outcome: DecisionOutcome::InPlace,
            expect: &[(
                "spec.users[name=backup].sshAuthorizedKeys[0]",
                A,
                "ssh-keys",
            )],
            actions: &[Action::SshKeys],
            affects_availability: false,
        },
        Case {
            name: "user shell",
            mutate: |r| user(r, 1)["shell"] = json!("/bin/zsh"),
            outcome: DecisionOutcome::NeedsRollout,
            expect: &[("spec.users[name=backup].shell", R, "no rule")],
            actions: &[],
            affects_availability: true,
        },
        Case {
            name: "user added",
            mutate: |r| {
                r.desired_spec(Bootstrap)["users"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "new", "sshAuthorizedKeys": ["k"]}))
            },
            outcome: DecisionOutcome::NeedsRollout,
            expect: &[("spec.users[name=new]", R, "no rule")],
            actions: &[],
            affects_availability: true,
        },
        Case {
            name: "ntp servers",
            mutate: |r| r.desired_spec(Bootstrap)["ntp"]["servers"] = json!(["time.example.com"]),
            outcome: DecisionOutcome::InPlace,
            expect: &[
                ("spec.ntp.servers[0]", A, "ntp"),
                ("spec.ntp.servers[1]", A, "ntp"),
            ],
            actions: &[Action::Ntp],
            affects_availability: false,
        },
        Case {
            name: "ntp removed",
            mutate: |r| {
                r.desired_spec(Bootstrap)
                    .as_object_mut()
                    .unwrap()
                    .remove("ntp");
            },
            outcome: DecisionOutcome::InPlace,
            expect: &[("spec.ntp", A, "ntp")],
            actions: &[Action::Ntp],
            affects_availability: false,
        },
        Case {
            name: "etcd image on a control-plane machine",
            mutate: |r| {
                r.desired_spec(Bootstrap)["clusterConfiguration"]["etcd"]["local"]["imageTag"] =
                    json!("3.5.22-0")
            },
            outcome: DecisionOutcome::InPlace,
            expect: &[(
                "spec.clusterConfiguration.etcd.local.imageTag",
                A,
                "etcd-image",
            )],
            actions: &[Action::EtcdImage],
            affects_availability: true,
        },
        Case {
            name: "etcd repository",
            mutate: |r| {
                r.desired_spec(Bootstrap)["clusterConfiguration"]["etcd"]["local"]["imageRepository"] =
                    json!("mirror.example.com")
            },
            outcome: DecisionOutcome::NeedsRollout,
            expect: &[(
                "spec.clusterConfiguration.etcd.local.imageRepository",
                R,
                "no rule",
            )],
            actions: &[],
            affects_availability: true,
        },
        Case {
            name: "kubelet args",
            mutate: |r| {
                let s = r.desired_spec(Bootstrap);
                s["initConfiguration"]["nodeRegistration"]["kubeletExtraArgs"][1]["value"] =
                    json!("200");
                s["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "max-pods", "value": "200"}));
            },
            outcome: DecisionOutcome::InPlace,
            expect: &[
                (
                    "spec.initConfiguration.nodeRegistration.kubeletExtraArgs[name=max-pods].value",
                    A,
                    "kubelet-args",
                ),
                (
                    "spec.joinConfiguration.nodeRegistration.kubeletExtraArgs[name=max-pods]",
                    A,
                    "kubelet-args",
                ),
            ],
            actions: &[Action::KubeletArgs],
            affects_availability: true,
        },
        Case {
            name: "api server args",
            mutate: |r| {
                r.desired_spec(Bootstrap)["clusterConfiguration"]["apiServer"]["extraArgs"][0]["value"] =
                    json!("/var/log/a.log")
            },
            outcome: DecisionOutcome::NeedsRollout,
            expect: &[(
                "spec.clusterConfiguration.apiServer.extraArgs[name=audit-log-path].value",
                R,
                "no rule",
            )],
            actions: &[],
            affects_availability: true,
        },
        Case {
            name: "disk setup and mounts",
            mutate: |r| {
                let s = r.desired_spec(Bootstrap);
                s["diskSetup"]["filesystems"][0]["filesystem"] = json!("xfs");
                s["mounts"] = json!([["LABEL=etcd_disk", "/var/lib/etcd"]]);
            },
            outcome: DecisionOutcome::NeedsRollout,
            expect: &[
                (
                    "spec.diskSetup.filesystems[0].filesystem",
                    R,
                    "disks are partitioned",
                ),
                ("spec.mounts[0][1]", R, "disks are partitioned"),
            ],
            actions: &[],
            affects_availability: true,
        },
        Case {
            name: "commands",
            mutate: |r| {
                r.desired_spec(Bootstrap)["preKubeadmCommands"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!("echo hi"))
            },
            outcome: DecisionOutcome::NeedsRollout,
            expect: &[("spec.preKubeadmCommands[1]", R, "no rule")],
            actions: &[],
            affects_availability: true,
        },
        Case {
            name: "infra size",
            mutate: |r| r.desired_spec(Infra)["memoryMiB"] = json!(16384),
            outcome: DecisionOutcome::NeedsRollout,
            expect: &[("spec.memoryMiB", R, "no rule")],
            actions: &[],
            affects_availability: true,
        },
    ]
}

#[test]
fn every_default_rule_with_both_patch_types() {
    for patch_type in ["JSONPatch", "JSONMergePatch"] {
        let settings = settings(&[("patchType", patch_type)]);
        for case in cases() {
            let mut req = Req::machine("v1.33.4");
            (case.mutate)(&mut req);
            let d = req.decide_with(&inplace_core::Policy::builtin(), &settings);
            let ctx = format!("{} ({patch_type}): {}", case.name, d.message);
            assert_eq!(d.outcome, case.outcome, "{ctx}");
            assert!(d.self_check_failures.is_empty(), "{ctx}");
            for (path, verdict, reason) in case.expect {
                let c = verdict_of(&d, path);
                assert_eq!(c.verdict, *verdict, "{ctx}: {path}");
                assert!(
                    c.reason.contains(reason),
                    "{ctx}: {path} reason {:?} lacks {reason:?}",
                    c.reason
                );
            }
            assert_eq!(
                d.changes.len(),
                case.expect.len(),
                "{ctx}: {:?}",
                d.changes.iter().map(|c| &c.path).collect::<Vec<_>>()
            );
            assert_eq!(d.actions, case.actions.iter().copied().collect(), "{ctx}");
            assert_eq!(d.affects_availability, case.affects_availability, "{ctx}");
            assert_capi_agrees(&req, &d);
            let sent: Vec<_> = ObjectRole::ALL
                .iter()
                .filter_map(|r| d.patches.get(*r))
                .collect();
            assert!(
                sent.iter().all(|p| p.patch_type.as_str() == patch_type),
                "{ctx}: {sent:?}"
            );
        }
    }
}

#[test]
fn message_reads_like_the_issue_example() {
    let mut req = Req::machine("v1.33.4");
    req.desired_spec(Machine)["version"] = json!("v1.34.1");
    req.desired_spec(Infra)["memoryMiB"] = json!(16384);
    let d = req.decide();
    assert_eq!(d.outcome, DecisionOutcome::NeedsRollout);
    assert_eq!(
        d.message,
        "in place: Machine spec.version v1.33.4→v1.34.1 (kubernetes-version); needs rollout: VSphereMachine spec.memoryMiB 8192→16384 (no rule)"
    );
    // The partial patch still covers the version, so a second extension could add the rest.
    assert!(
        d.patches.machine.is_some() && d.patches.infra.is_none() && d.patches.bootstrap.is_none()
    );
    assert_capi_agrees(&req, &d);
}

#[test]
fn no_changes_means_in_place_without_patches() {
    let req = Req::machine("v1.33.4");
    let d = req.decide();
    assert_eq!(d.outcome, DecisionOutcome::InPlace);
    assert_eq!(d.message, "no changes");
    assert!(d.changes.is_empty() && d.patches == Default::default());
    assert!(!d.affects_availability);
}

#[test]
fn secrets_never_reach_messages_or_debug() {
    let mut req = Req::machine("v1.33.4");
    req.desired_spec(Bootstrap)["files"][0]["content"] = json!("TOP-SECRET-CONTENT");
    req.desired_spec(Bootstrap)["users"][0]["passwd"] = json!("NEW-SECRET-HASH");
    req.desired_spec(Bootstrap)["files"]
        .as_array_mut()
        .unwrap()
        .push(json!({"path": "/etc/new", "content": "ANOTHER-SECRET"}));
    req.desired_spec(Bootstrap)["clusterConfiguration"]["apiServer"]["extraArgs"][1]["value"] =
        json!("ARG-SECRET");
    let d = req.decide();
    let everything = format!(
        "{d:?} {} {}",
        d.message,
        serde_json::to_string(&d.changes).unwrap()
    );
    for secret in [
        "TOP-SECRET-CONTENT",
        "NEW-SECRET-HASH",
        "ANOTHER-SECRET",
        "ARG-SECRET",
        "$6$rounds",
        "s3cr3t",
    ] {
        assert!(!everything.contains(secret), "{secret} leaked");
    }
    let content = verdict_of(
        &d,
        "spec.files[path=/etc/kubernetes/audit-policy.yaml].content",
    );
    assert!(content.new.as_deref().unwrap().starts_with("sha256:"));
    assert_capi_agrees(&req, &d);
}

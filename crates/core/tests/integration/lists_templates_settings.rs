//! Keyed and positional lists, CanUpdateMachineSet templates, ExtensionConfig settings and
//! in-place-only mode, each read back the way CAPI reads our answer.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use inplace_core::{
    Action, ChangeKind, ChangeVerdict, DecisionOutcome, ObjectRole, PatchType, Policy, Scope,
};
use serde_json::{Value, json};

use ObjectRole::{Bootstrap, Infra, Machine};

fn both_patch_types(
    req: &Req,
    policy: &Policy,
    extra: &[(&str, &str)],
    check: impl Fn(&inplace_core::Decision),
) {
    for pt in ["JSONPatch", "JSONMergePatch"] {
        let mut pairs = extra.to_vec();
        pairs.push(("patchType", pt));
        let d = req.decide_with(policy, &settings(&pairs));
        assert!(d.self_check_failures.is_empty(), "{pt}: {}", d.message);
        check(&d);
        assert_capi_agrees(req, &d);
    }
}

fn files(req: &mut Req) -> &mut Vec<Value> {
    req.desired_spec(Bootstrap)["files"].as_array_mut().unwrap()
}

#[test]
fn files_reordered_added_removed_and_modified_together() {
    let mut req = Req::machine("v1.33.4");
    let f = files(&mut req);
    let first = f.remove(0);
    f.remove(0); // sysctl file removed
    f.push(first);
    f.insert(0, json!({"path": "/etc/new.conf", "content": "new"}));
    f[2]["content"] = json!("changed audit policy");
    both_patch_types(&req, &Policy::builtin(), &[], |d| {
        assert_eq!(d.outcome, DecisionOutcome::InPlace, "{}", d.message);
        let kinds: Vec<_> = d
            .changes
            .iter()
            .map(|c| (c.path.as_str(), c.change))
            .collect();
        assert!(
            kinds.contains(&("spec.files", ChangeKind::Reordered)),
            "{kinds:?}"
        );
        assert!(kinds.contains(&("spec.files[path=/etc/new.conf]", ChangeKind::Added)));
        assert!(kinds.contains(&(
            "spec.files[path=/etc/sysctl.d/99-k8s.conf]",
            ChangeKind::Removed
        )));
        assert!(kinds.contains(&(
            "spec.files[path=/etc/kubernetes/audit-policy.yaml].content",
            ChangeKind::Changed
        )));
        let reorder = verdict_of(d, "spec.files");
        assert_eq!(
            reorder.old.as_deref(),
            Some(
                r#"["/etc/kubernetes/audit-policy.yaml","/etc/sysctl.d/99-k8s.conf","/etc/pki/ca.pem"]"#
            )
        );
        assert_eq!(d.actions, [Action::Files].into());
    });
}

#[test]
fn pure_reorder_of_users_is_reported_once_and_needs_a_rollout() {
    let mut req = Req::machine("v1.33.4");
    req.desired_spec(Bootstrap)["users"]
        .as_array_mut()
        .unwrap()
        .reverse();
    both_patch_types(&req, &Policy::builtin(), &[], |d| {
        assert_eq!(d.changes.len(), 1);
        let c = &d.changes[0];
        assert_eq!(
            (c.path.as_str(), c.change, c.verdict),
            ("spec.users", ChangeKind::Reordered, ChangeVerdict::Reject)
        );
        assert!(
            d.message.contains("spec.users reordered (no rule)"),
            "{}",
            d.message
        );
        assert_eq!(d.outcome, DecisionOutcome::NeedsRollout);
    });
}

#[test]
fn partially_accepted_keyed_list_keeps_rejected_items_current() {
    let mut req = Req::machine("v1.33.4");
    let f = files(&mut req);
    f[0]["content"] = json!("new audit policy");
    f[2]["contentFrom"]["secret"]["key"] = json!("ca.crt");
    f.insert(
        1,
        json!({"path": "/etc/from-secret", "contentFrom": {"secret": {"name": "a", "key": "b"}}}),
    );
    f.push(json!({"path": "/etc/inline", "content": "ok"}));
    both_patch_types(&req, &Policy::builtin(), &[], |d| {
        assert_eq!(d.outcome, DecisionOutcome::NeedsRollout);
        assert_eq!(
            verdict_of(
                d,
                "spec.files[path=/etc/kubernetes/audit-policy.yaml].content"
            )
            .verdict,
            ChangeVerdict::Action
        );
        assert_eq!(
            verdict_of(d, "spec.files[path=/etc/inline]").verdict,
            ChangeVerdict::Action
        );
        assert_eq!(
            verdict_of(d, "spec.files[path=/etc/from-secret]").verdict,
            ChangeVerdict::Reject
        );
        assert_eq!(
            verdict_of(d, "spec.files[path=/etc/pki/ca.pem].contentFrom.secret.key").verdict,
            ChangeVerdict::Reject
        );
        assert!(d.patches.bootstrap.is_some());
    });
}

#[test]
fn positional_lists_only_grow_and_shrink_at_the_end() {
    let policy = Policy::from_yaml(
        r#"
rules:
  - objects: [{kind: KubeadmConfig}]
    paths: ["spec.preKubeadmCommands[2]", "spec.postKubeadmCommands[1]"]
    accept: test rule
"#,
    )
    .unwrap();
    let mut req = Req::machine("v1.33.4");
    req.desired_spec(Bootstrap)["preKubeadmCommands"]
        .as_array_mut()
        .unwrap()
        .extend([json!("b"), json!("c")]);
    req.current_spec(Bootstrap)["postKubeadmCommands"] = json!(["a", "b", "c"]);
    req.desired_spec(Bootstrap)["postKubeadmCommands"] = json!(["a"]);
    both_patch_types(&req, &policy, &[], |d| {
        // [2] can only be appended after [1], which is rejected.
        let appended = verdict_of(d, "spec.preKubeadmCommands[2]");
        assert_eq!(appended.verdict, ChangeVerdict::Reject);
        assert!(
            appended
                .reason
                .contains("needs spec.preKubeadmCommands[1] too"),
            "{}",
            appended.reason
        );
        // Removing [1] would shift the kept [2] into its place.
        let removed = verdict_of(d, "spec.postKubeadmCommands[1]");
        assert_eq!(removed.verdict, ChangeVerdict::Reject);
        assert!(
            removed
                .reason
                .contains("needs spec.postKubeadmCommands[2] too"),
            "{}",
            removed.reason
        );
        assert!(d.patches.bootstrap.is_none(), "nothing left to patch");
    });
}

#[test]
fn machine_set_templates_use_machine_rules() {
    let mut req = Req::machine_set("v1.33.4");
    req.desired_spec(Machine)["version"] = json!("v1.34.0");
    req.desired_spec(Bootstrap)["files"][1]["content"] = json!("net.ipv4.ip_forward = 0\n");
    req.desired_spec(Bootstrap)["ntp"]["enabled"] = json!(false);
    // Outside spec.template.spec: CAPI does not compare it, neither do we.
    req.desired[0]["spec"]["replicas"] = json!(5);
    both_patch_types(&req, &Policy::builtin(), &[], |d| {
        assert_eq!(d.outcome, DecisionOutcome::InPlace, "{}", d.message);
        assert_eq!(
            d.actions,
            [Action::KubernetesVersion, Action::Files, Action::Ntp].into()
        );
        assert!(
            d.message.contains(
                "MachineSet spec.template.spec.version v1.33.4→v1.34.0 (kubernetes-version)"
            ),
            "{}",
            d.message
        );
        assert!(
            d.changes
                .iter()
                .all(|c| c.path.starts_with("spec.template.spec"))
        );
        assert_eq!(d.changes.len(), 3);
        let ms = d.patches.machine.as_ref().unwrap();
        let text = String::from_utf8(ms.bytes.clone()).unwrap();
        match ms.patch_type {
            PatchType::JsonPatch => assert!(text.contains("/spec/template/spec/version"), "{text}"),
            PatchType::JsonMergePatch => assert_eq!(
                text,
                r#"{"spec":{"template":{"spec":{"version":"v1.34.0"}}}}"#
            ),
        }
    });
}

#[test]
fn templates_are_worker_machines() {
    let mut req = Req::machine_set("v1.33.4");
    req.desired_spec(Bootstrap)["clusterConfiguration"]["etcd"]["local"]["imageTag"] =
        json!("3.5.22-0");
    req.desired_spec(Infra)["numCPUs"] = json!(8);
    both_patch_types(&req, &Policy::builtin(), &[], |d| {
        assert_eq!(d.outcome, DecisionOutcome::NeedsRollout);
        let etcd = verdict_of(
            d,
            "spec.template.spec.clusterConfiguration.etcd.local.imageTag",
        );
        assert!(
            etcd.reason.contains("control-plane machines only"),
            "{}",
            etcd.reason
        );
        assert!(
            d.message
                .contains("VSphereMachineTemplate spec.template.spec.numCPUs 4→8 (no rule)"),
            "{}",
            d.message
        );
    });
}

#[test]
fn bootstrap_template_present_on_one_side_only_is_not_compared() {
    let mut req = Req::machine_set("v1.33.4");
    req.desired_spec(Machine)["version"] = json!("v1.33.5");
    let req = req;
    let d = inplace_core::decide(
        Scope::Template,
        &inplace_core::Objects {
            machine: Some(&req.current[0]),
            bootstrap: Some(&req.current[1]),
            infra: Some(&req.current[2]),
        },
        &inplace_core::Objects {
            machine: Some(&req.desired[0]),
            bootstrap: None,
            infra: Some(&req.desired[2]),
        },
        &Policy::builtin(),
        &settings(&[]),
    );
    assert_eq!(d.outcome, DecisionOutcome::InPlace, "{}", d.message);
    assert_eq!(
        verdict_of(&d, "spec.template.spec").verdict,
        ChangeVerdict::Ignored
    );
}

#[test]
fn machine_request_missing_an_object_needs_a_rollout() {
    let req = Req::machine("v1.33.4");
    let d = inplace_core::decide(
        Scope::Object,
        &Req::objects(&req.current),
        &inplace_core::Objects {
            infra: None,
            ..Req::objects(&req.desired)
        },
        &Policy::builtin(),
        &settings(&[]),
    );
    assert_eq!(d.outcome, DecisionOutcome::NeedsRollout);
    assert!(
        d.message
            .contains("VSphereMachine spec removed (the request has no desired VSphereMachine)"),
        "{}",
        d.message
    );
}

#[test]
fn in_place_off_accepts_nothing() {
    let mut req = Req::machine("v1.33.4");
    req.desired_spec(Machine)["version"] = json!("v1.33.5");
    req.desired_spec(Bootstrap)["ntp"]["enabled"] = json!(false);
    both_patch_types(&req, &Policy::builtin(), &[("inPlace", "false")], |d| {
        assert_eq!(d.outcome, DecisionOutcome::NeedsRollout);
        assert!(
            d.changes
                .iter()
                .all(|c| c.verdict == ChangeVerdict::Reject && c.reason.contains("inPlace"))
        );
        assert_eq!(d.patches, Default::default());
        assert!(d.actions.is_empty());
    });
}

#[test]
fn disabled_actions_are_rejected_others_still_go_in_place() {
    let mut req = Req::machine("v1.33.4");
    req.desired_spec(Bootstrap)["ntp"]["enabled"] = json!(false);
    req.desired_spec(Bootstrap)["users"][0]["sshAuthorizedKeys"] =
        json!(["ssh-ed25519 AAAA-rotated"]);
    req.desired_spec(Bootstrap)["files"][1]["content"] = json!("x");
    both_patch_types(
        &req,
        &Policy::builtin(),
        &[("disableActions", "ssh-keys,ntp")],
        |d| {
            assert_eq!(d.outcome, DecisionOutcome::NeedsRollout);
            assert!(
                verdict_of(d, "spec.ntp.enabled")
                    .reason
                    .contains("action ntp is disabled")
            );
            assert!(
                verdict_of(d, "spec.users[name=capv].sshAuthorizedKeys[0]")
                    .reason
                    .contains("action ssh-keys is disabled")
            );
            assert_eq!(
                verdict_of(d, "spec.files[path=/etc/sysctl.d/99-k8s.conf].content").verdict,
                ChangeVerdict::Action
            );
            assert_eq!(d.actions, [Action::Files].into());
        },
    );
}

#[test]
fn in_place_only_refuses_instead_of_rolling_out() {
    let mut req = Req::machine("v1.33.4");
    req.desired_spec(Machine)["version"] = json!("v1.34.0");
    req.desired_spec(Infra)["diskGiB"] = json!(80);
    both_patch_types(
        &req,
        &Policy::builtin(),
        &[("mode", "in-place-only")],
        |d| {
            assert_eq!(d.outcome, DecisionOutcome::Refused);
            assert!(!d.outcome.is_success());
            assert_eq!(d.patches, Default::default());
            assert!(
                d.message
                    .starts_with("refused (mode in-place-only, no rollout)"),
                "{}",
                d.message
            );
            assert!(
                d.message
                    .contains("needs rollout: VSphereMachine spec.diskGiB 40→80 (no rule)"),
                "{}",
                d.message
            );
        },
    );
    // Nothing rejected: in place as usual.
    let mut ok = Req::machine("v1.33.4");
    ok.desired_spec(Machine)["version"] = json!("v1.34.0");
    both_patch_types(&ok, &Policy::builtin(), &[("mode", "in-place-only")], |d| {
        assert_eq!(d.outcome, DecisionOutcome::InPlace)
    });
}

#[test]
fn merge_patch_that_cannot_carry_null_is_sent_as_json_patch() {
    let policy = Policy::from_yaml(
        "rules: [{objects: [{kind: VSphereMachine}], paths: [spec.network], accept: test}]",
    )
    .unwrap();
    let mut req = Req::machine("v1.33.4");
    req.desired_spec(Infra)["network"]["devices"][0]["gateway4"] = Value::Null;
    let d = req.decide_with(&policy, &settings(&[("patchType", "JSONMergePatch")]));
    assert_eq!(d.outcome, DecisionOutcome::InPlace, "{}", d.message);
    assert_eq!(
        d.patches.infra.as_ref().unwrap().patch_type,
        PatchType::JsonPatch
    );
    assert!(d.message.contains("note: VSphereMachine: JSONMergePatch cannot set spec.network.devices to a value containing null; sent JSONPatch"), "{}", d.message);
    assert_capi_agrees(&req, &d);
}

#[test]
fn machine_zero_values_are_absent_like_in_go() {
    let mut req = Req::machine("v1.33.4");
    req.current_spec(Machine)
        .as_object_mut()
        .unwrap()
        .remove("failureDomain");
    req.desired_spec(Machine)["failureDomain"] = Value::Null;
    req.desired_spec(Machine)["minReadySeconds"] = Value::Null;
    let d = req.decide();
    assert!(d.changes.is_empty(), "{:?}", d.changes);
    assert_capi_agrees(&req, &d);
    // For unstructured objects null is a value.
    let mut infra = Req::machine("v1.33.4");
    infra.desired_spec(Infra)["folder"] = Value::Null;
    let d = infra.decide();
    assert_eq!(verdict_of(&d, "spec.folder").change, ChangeKind::Added);
    assert_capi_agrees(&infra, &d);
}

#![allow(clippy::unwrap_used)]

use super::*;
use crate::patch::PatchType;
use serde_json::json;

fn judged(verdict: ChangeVerdict) -> Judged {
    Judged {
        verdict,
        actions: BTreeSet::new(),
        reason: String::new(),
    }
}

/// The self-check catches patches CAPI would read differently from what we decided.
#[test]
fn self_check_names_the_paths_a_wrong_patch_gets_wrong() {
    let cur_obj = json!({"kind": "KubeadmConfig", "spec": {"ntp": {"enabled": true}, "format": "cloud-config"}});
    let des_obj =
        json!({"kind": "KubeadmConfig", "spec": {"ntp": {"enabled": false}, "format": "ignition"}});
    let sides = Sides {
        scope: Scope::Object,
        current_object: &cur_obj,
        current: cur_obj.get("spec"),
        desired: des_obj.get("spec"),
    };
    let changes = diff::diff(sides.current, sides.desired, DiffOptions::default());
    assert_eq!(changes.len(), 2); // format, ntp.enabled
    let verdicts = [judged(ChangeVerdict::Reject), judged(ChangeVerdict::Action)];
    let patch = |ops: &str| Patch {
        patch_type: PatchType::JsonPatch,
        bytes: ops.as_bytes().to_vec(),
    };

    let right = patch(r#"[{"op":"replace","path":"/spec/ntp/enabled","value":false}]"#);
    assert!(
        check::check(
            &sides,
            ObjectRole::Bootstrap,
            "KubeadmConfig",
            &changes,
            &verdicts,
            Some(&right)
        )
        .is_empty()
    );

    // Also changes the rejected field: CAPI would see no difference left.
    let too_much = patch(
        r#"[{"op":"replace","path":"/spec/ntp/enabled","value":false},{"op":"replace","path":"/spec/format","value":"ignition"}]"#,
    );
    let problems = check::check(
        &sides,
        ObjectRole::Bootstrap,
        "KubeadmConfig",
        &changes,
        &verdicts,
        Some(&too_much),
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("spec.format: after our patch it differs from current")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("no difference although changes are rejected")),
        "{problems:?}"
    );

    // Misses the accepted field.
    let too_little = patch(r#"[]"#);
    let problems = check::check(
        &sides,
        ObjectRole::Bootstrap,
        "KubeadmConfig",
        &changes,
        &verdicts,
        Some(&too_little),
    );
    assert_eq!(
        problems,
        ["KubeadmConfig spec.ntp.enabled: after our patch it differs from desired"]
    );

    // Does not apply at all (replace of a missing path).
    let broken = patch(r#"[{"op":"replace","path":"/spec/missing","value":1}]"#);
    let problems = check::check(
        &sides,
        ObjectRole::Bootstrap,
        "KubeadmConfig",
        &changes,
        &verdicts,
        Some(&broken),
    );
    assert!(
        problems[0].starts_with("KubeadmConfig: JSON patch does not apply"),
        "{problems:?}"
    );

    // Everything accepted but CAPI would still see a difference.
    let all = [judged(ChangeVerdict::Accept), judged(ChangeVerdict::Action)];
    let problems = check::check(
        &sides,
        ObjectRole::Bootstrap,
        "KubeadmConfig",
        &changes,
        &all,
        Some(&right),
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("would still see a difference")),
        "{problems:?}"
    );
}

#[test]
fn machine_compare_drops_ignored_fields_and_zero_values() {
    let spec = json!({"version": "v1", "failureDomain": "", "providerID": "x", "deletion": {"nodeDrainTimeoutSeconds": 3}, "taints": []});
    assert_eq!(
        check::compared(ObjectRole::Machine, Some(&spec)).as_deref(),
        Some(&json!({"version": "v1"}))
    );
    assert_eq!(
        check::compared(ObjectRole::Infra, Some(&spec)).as_deref(),
        Some(&spec)
    );
}

#[test]
fn self_check_failure_message_withholds_the_answer() {
    let msg = message::message(
        DecisionOutcome::SelfCheckFailed,
        &[],
        &["KubeadmConfig spec.x: after our patch it differs from desired".into()],
        &[],
        None,
    );
    assert!(msg.starts_with("self-check failed, no patch sent"), "{msg}");
    assert!(msg.contains("KubeadmConfig spec.x"));
}

#[test]
fn long_sections_are_counted_not_listed() {
    let mut cur = json!({"kind": "KubeadmConfig", "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "spec": {"files": []}});
    let mut des = cur.clone();
    for i in 0..20 {
        cur["spec"]["files"]
            .as_array_mut()
            .unwrap()
            .push(json!({"path": format!("/f{i}"), "content": "a"}));
        des["spec"]["files"]
            .as_array_mut()
            .unwrap()
            .push(json!({"path": format!("/f{i}"), "content": "b"}));
    }
    let objs = |o| Objects {
        bootstrap: Some(o),
        ..Default::default()
    };
    let d = decide(
        Scope::Object,
        &objs(&cur),
        &objs(&des),
        &Policy::builtin(),
        &Settings::default(),
    );
    assert_eq!(d.outcome, DecisionOutcome::InPlace);
    assert_eq!(d.changes.len(), 20);
    assert!(
        d.message
            .ends_with(&format!("… and {} more", 20 - MAX_MESSAGE_ITEMS)),
        "{}",
        d.message
    );
}

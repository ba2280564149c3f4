//! What CanUpdate says about draining: the message, `affectsAvailability` and the node change kept with the
//! verdict, under the policy's drain section, the settings and the Machine's exclude annotation.

use inplace_core::drain::{DrainVerdict, EXCLUDE_NODE_DRAINING_ANNOTATION, VersionChange, Why};
use inplace_core::{Action, DecisionOutcome, ObjectRole, Policy};
use serde_json::json;

use crate::common::{Req, settings};

fn upgrade(to: &str) -> Req {
    let mut req = Req::machine("v1.33.4");
    req.desired_spec(ObjectRole::Machine)["version"] = json!(to);
    req
}

#[test]
fn a_minor_upgrade_says_it_drains_whatever_the_settings() {
    for pairs in [&[][..], &[("drainPatchVersion", "false")][..]] {
        let d = upgrade("v1.34.1").decide_with(&Policy::builtin(), &settings(pairs));
        assert_eq!(d.outcome, DecisionOutcome::InPlace, "{}", d.message);
        assert_eq!(d.node_change.version, VersionChange::Minor);
        assert!(matches!(d.drain, DrainVerdict::Drain(drain) if drain.why == Why::MinorVersion));
        assert!(
            d.message
                .ends_with("; drains the node (minor Kubernetes version change)"),
            "{}",
            d.message
        );
        assert!(d.affects_availability);
    }
}

#[test]
fn a_patch_upgrade_drains_by_default_and_not_when_turned_off() {
    let d = upgrade("v1.33.5").decide();
    assert!(
        d.message
            .contains("drains the node (patch Kubernetes version change)"),
        "{}",
        d.message
    );
    let off = upgrade("v1.33.5").decide_with(
        &Policy::builtin(),
        &settings(&[("drainPatchVersion", "false")]),
    );
    assert_eq!(off.drain, DrainVerdict::NotNeeded);
    assert!(!off.message.contains("drain"), "{}", off.message);
    assert!(off.affects_availability, "kubelet still restarts");
}

#[test]
fn the_exclude_annotation_is_named_in_the_message() {
    let mut req = upgrade("v1.34.1");
    req.desired[0]["metadata"]["annotations"] = json!({ EXCLUDE_NODE_DRAINING_ANNOTATION: "" });
    let d = req.decide();
    assert_eq!(d.drain, DrainVerdict::Excluded(Why::MinorVersion));
    assert!(
        d.message.contains(EXCLUDE_NODE_DRAINING_ANNOTATION),
        "{}",
        d.message
    );
    assert!(d.affects_availability);
}

#[test]
fn kubelet_flags_drain_only_when_asked() {
    let flags = || {
        let mut req = Req::machine("v1.33.4");
        req.desired_spec(ObjectRole::Bootstrap)["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"] =
            json!([{"name": "max-pods", "value": "250"}]);
        req
    };
    let d = flags().decide();
    assert_eq!(d.outcome, DecisionOutcome::InPlace, "{}", d.message);
    assert_eq!(d.node_change.actions, [Action::KubeletArgs].into());
    assert_eq!(d.drain, DrainVerdict::NotNeeded);
    assert!(d.affects_availability, "kubelet restarts");
    let text =
        inplace_core::DEFAULT_POLICY_YAML.replace("  kubeletArgs: false", "  kubeletArgs: true");
    let policy = Policy::from_yaml(&text).unwrap();
    assert!(policy.drain().kubelet_args);
    let d = flags().decide_with(&policy, &settings(&[]));
    assert!(
        d.message.contains("drains the node (kubelet flags change)"),
        "{}",
        d.message
    );
    let d = flags().decide_with(&policy, &settings(&[("drainKubeletArgs", "false")]));
    assert_eq!(d.drain, DrainVerdict::NotNeeded);
}

#[test]
fn a_rollout_says_nothing_about_draining() {
    let mut req = upgrade("v1.34.1");
    req.desired_spec(ObjectRole::Infra)["memoryMiB"] = json!(16384);
    let d = req.decide();
    assert_eq!(d.outcome, DecisionOutcome::NeedsRollout);
    assert_eq!(d.drain, DrainVerdict::NotNeeded);
    assert!(!d.message.contains("drain"), "{}", d.message);
}

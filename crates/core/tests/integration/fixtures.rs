//! The shared request fixtures (tests/fixtures/*.json, bodies as CAPI sends them): our decision,
//! and what CAPI (capi-sim) does with the answer built from it.

use crate::common;

use common::{response_body_for, settings};
use inplace_core::{
    Action, ChangeVerdict, Decision, DecisionOutcome, Objects, Policy, Scope, decide,
};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = format!("{}/../../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn objects(side: &Value, scope: Scope) -> Objects<'_> {
    let names = match scope {
        Scope::Object => ["machine", "bootstrapConfig", "infrastructureMachine"],
        Scope::Template => [
            "machineSet",
            "bootstrapConfigTemplate",
            "infrastructureMachineTemplate",
        ],
    };
    Objects {
        machine: side.get(names[0]),
        bootstrap: side.get(names[1]),
        infra: side.get(names[2]),
    }
}

/// Decides the fixture and checks that CAPI reaches the same outcome from our answer.
fn run(name: &str, pairs: &[(&str, &str)]) -> Decision {
    let body = fixture(name);
    let scope = if body["kind"] == "CanUpdateMachineSetRequest" {
        Scope::Template
    } else {
        Scope::Object
    };
    let d = decide(
        scope,
        &objects(&body["current"], scope),
        &objects(&body["desired"], scope),
        &Policy::builtin(),
        &settings(pairs),
    );
    assert!(d.self_check_failures.is_empty(), "{name}: {}", d.message);
    let response = response_body_for(scope, &d);
    let capi = match scope {
        Scope::Object => capi_sim::can_update_machine(&body, &response),
        Scope::Template => capi_sim::can_update_machine_set(&body, &response),
    };
    let agrees = match d.outcome {
        DecisionOutcome::InPlace => capi == capi_sim::CapiDecision::InPlace,
        DecisionOutcome::NeedsRollout => matches!(capi, capi_sim::CapiDecision::Rollout { .. }),
        DecisionOutcome::Refused | DecisionOutcome::SelfCheckFailed => {
            matches!(capi, capi_sim::CapiDecision::Error { .. })
        }
    };
    assert!(
        agrees,
        "{name}: we said {:?} ({}), CAPI does {capi:?}",
        d.outcome, d.message
    );
    d
}

fn verdicts(d: &Decision) -> Vec<(String, ChangeVerdict)> {
    d.changes
        .iter()
        .map(|c| (format!("{} {}", c.kind, c.path), c.verdict))
        .collect()
}

#[test]
fn version_bump_goes_in_place() {
    for pt in ["JSONPatch", "JSONMergePatch"] {
        let d = run("can-update-machine-kcp-version.json", &[("patchType", pt)]);
        assert_eq!(d.outcome, DecisionOutcome::InPlace);
        assert_eq!(
            d.message,
            "in place: Machine spec.version v1.33.4→v1.34.1 (kubernetes-version); \
             drains the node (minor Kubernetes version change)"
        );
        assert_eq!(d.actions, [Action::KubernetesVersion].into());
        assert!(d.affects_availability);
        assert!(
            d.patches.machine.is_some()
                && d.patches.bootstrap.is_none()
                && d.patches.infra.is_none()
        );
    }
}

#[test]
fn files_keys_and_ntp_go_in_place_and_a_containerd_file_affects_availability() {
    for pt in ["JSONPatch", "JSONMergePatch"] {
        let d = run(
            "can-update-machine-kcp-files-keys.json",
            &[("patchType", pt)],
        );
        assert_eq!(d.outcome, DecisionOutcome::InPlace, "{}", d.message);
        assert_eq!(
            d.actions,
            [Action::Files, Action::SshKeys, Action::Ntp].into()
        );
        // The fixture changes /etc/containerd/certs.d/…/hosts.toml, which containerd reads (issue 15).
        assert!(d.affects_availability);
        assert!(!d.message.contains("drains"), "{}", d.message);
        assert!(
            d.changes.iter().all(|c| c.verdict == ChangeVerdict::Action),
            "{:?}",
            verdicts(&d)
        );
    }
}

#[test]
fn mixed_changes_need_a_rollout_or_are_refused() {
    let d = run("can-update-machine-kcp-mixed.json", &[]);
    assert_eq!(d.outcome, DecisionOutcome::NeedsRollout);
    let v = verdicts(&d);
    assert!(
        v.contains(&(
            "KubeadmConfig spec.ntp.servers[0]".into(),
            ChangeVerdict::Action
        )),
        "{v:?}"
    );
    assert!(
        v.contains(&("KubeadmConfig spec.diskSetup".into(), ChangeVerdict::Reject)),
        "{v:?}"
    );
    assert!(
        v.contains(&("KubeadmConfig spec.mounts".into(), ChangeVerdict::Reject)),
        "{v:?}"
    );
    assert!(
        v.contains(&("Machine spec.failureDomain".into(), ChangeVerdict::Reject)),
        "{v:?}"
    );
    assert!(
        v.iter().any(
            |(p, verdict)| p.starts_with("DevMachine spec.backend.docker.customImage")
                && *verdict == ChangeVerdict::Reject
        ),
        "{v:?}"
    );
    assert!(
        d.patches.bootstrap.is_some(),
        "the ntp part is still patched"
    );
    let refused = run(
        "can-update-machine-kcp-mixed.json",
        &[("mode", "in-place-only")],
    );
    assert_eq!(refused.outcome, DecisionOutcome::Refused);
    assert!(
        refused
            .message
            .contains("Machine spec.failureDomain fd-1→fd-2"),
        "{}",
        refused.message
    );
}

#[test]
fn unknown_infrastructure_kind_is_judged_by_no_rule() {
    let d = run("can-update-machine-unknown-infra.json", &[]);
    assert_eq!(d.outcome, DecisionOutcome::NeedsRollout);
    let firmware = d
        .changes
        .iter()
        .find(|c| c.kind == "AcmeMetalMachine")
        .unwrap();
    assert_eq!(
        (firmware.path.as_str(), firmware.reason.as_str()),
        ("spec.firmware.bmcVersion", "no rule")
    );
    assert!(
        d.changes
            .iter()
            .any(|c| c.kind == "KubeadmConfig" && c.verdict == ChangeVerdict::Action)
    );
}

#[test]
fn machine_deployment_template_change_goes_in_place() {
    for pt in ["JSONPatch", "JSONMergePatch"] {
        let d = run("can-update-machineset-md.json", &[("patchType", pt)]);
        assert_eq!(d.outcome, DecisionOutcome::InPlace, "{}", d.message);
        assert_eq!(
            d.actions,
            [Action::KubernetesVersion, Action::Files, Action::SshKeys].into()
        );
        assert!(
            d.changes
                .iter()
                .all(|c| c.path.starts_with("spec.template.spec")),
            "{:?}",
            verdicts(&d)
        );
    }
}

//! What CAPI would decide from our CanUpdate answers: every fixture goes through the router and then through
//! `capi-sim`, which decodes the answer the way Go does, applies the patches the way KCP / the MachineDeployment
//! controller do, and compares with CAPI's cleanup rules.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use capi_sim::CapiDecision;
use inplace_updater::api::Hook;
use inplace_updater::dispatch::upkeep::tokens::AgentTokens;
use inplace_updater::hooks::Engine;
use inplace_updater::server::{AppState, app};
use serde_json::{Value, json};

fn state() -> AppState {
    AppState::new(Arc::new(Engine::in_memory()), Arc::new(AgentTokens::none()))
}

fn request(fixture: &str, settings: &[(&str, &str)]) -> Value {
    let request: Value = serde_json::from_slice(&common::fixture(fixture)).unwrap();
    common::with_settings(request, settings)
}

async fn ask(hook: Hook, request: &Value) -> (Value, Vec<u8>) {
    let http = Request::post(hook.path())
        .body(Body::from(request.to_string()))
        .unwrap();
    let (status, body) = common::respond(app(state()), http).await;
    assert_eq!(status, 200);
    (serde_json::from_slice(&body).unwrap(), body)
}

/// What CAPI decides from our CanUpdateMachine answer to `request`.
async fn capi_decides_on(request: &Value) -> CapiDecision {
    let (_, body) = ask(Hook::CanUpdateMachine, request).await;
    capi_sim::can_update_machine(request, &body)
}

async fn capi_decides(fixture: &str, settings: &[(&str, &str)]) -> (CapiDecision, Value) {
    let request = request(fixture, settings);
    if fixture.contains("machineset") {
        let (json, body) = ask(Hook::CanUpdateMachineSet, &request).await;
        (capi_sim::can_update_machine_set(&request, &body), json)
    } else {
        let (json, body) = ask(Hook::CanUpdateMachine, &request).await;
        (capi_sim::can_update_machine(&request, &body), json)
    }
}

/// `affectsAvailability` as CAPI after v1.14 decodes it (Go's decoder, nil meaning true).
async fn capi_reads_affects_availability(request: &Value) -> bool {
    let machine_set = request["kind"]
        .as_str()
        .unwrap_or_default()
        .contains("MachineSet");
    let hook = if machine_set {
        Hook::CanUpdateMachineSet
    } else {
        Hook::CanUpdateMachine
    };
    let (_, body) = ask(hook, request).await;
    capi_sim::affects_availability(machine_set, &body).unwrap()
}

const BOTH: [&[(&str, &str)]; 2] = [&[], &[("patchType", "JSONMergePatch")]];

#[tokio::test]
async fn a_single_minor_version_upgrade_goes_in_place() {
    for settings in BOTH {
        let (decision, answer) =
            capi_decides("can-update-machine-kcp-version.json", settings).await;
        assert_eq!(decision, CapiDecision::InPlace, "{settings:?}: {answer}");
        let message = answer["message"].as_str().unwrap();
        assert!(
            message.contains("spec.version") && message.contains("kubernetes-version"),
            "{message}"
        );
        assert!(
            message.contains("drains the node (minor Kubernetes version change)"),
            "{message}"
        );
        assert!(
            capi_reads_affects_availability(&request(
                "can-update-machine-kcp-version.json",
                settings
            ))
            .await,
            "a drain and a kubelet restart disturb workloads"
        );
    }
}

#[tokio::test]
async fn files_keys_and_ntp_go_in_place_and_only_runtime_files_affect_availability() {
    for settings in BOTH {
        let (decision, answer) =
            capi_decides("can-update-machine-kcp-files-keys.json", settings).await;
        assert_eq!(decision, CapiDecision::InPlace, "{settings:?}: {answer}");
        // The fixture changes containerd's registry config under /etc/containerd/ (issue 15).
        let mut asked = request("can-update-machine-kcp-files-keys.json", settings);
        assert!(capi_reads_affects_availability(&asked).await);
        // Without that file's change (the fixture adds it) nothing running is disturbed.
        asked["desired"]["bootstrapConfig"]["spec"]["files"]
            .as_array_mut()
            .unwrap()
            .retain(|f| !f["path"].as_str().unwrap().starts_with("/etc/containerd/"));
        assert_eq!(capi_decides_on(&asked).await, CapiDecision::InPlace);
        assert!(!capi_reads_affects_availability(&asked).await);
        assert_eq!(
            answer["machinePatch"],
            Value::Null,
            "nothing changed on the Machine"
        );
    }
}

#[tokio::test]
async fn a_machine_deployment_template_change_goes_in_place() {
    for settings in BOTH {
        let (decision, answer) = capi_decides("can-update-machineset-md.json", settings).await;
        assert_eq!(decision, CapiDecision::InPlace, "{settings:?}: {answer}");
    }
}

fn rollout_reasons(decision: CapiDecision) -> Vec<String> {
    match decision {
        CapiDecision::Rollout { reasons } => reasons,
        other => panic!("expected a rollout, got {other:?}"),
    }
}

#[tokio::test]
async fn mixed_changes_cover_only_what_can_be_done_and_capi_rolls_out_the_rest() {
    for settings in BOTH {
        let (decision, answer) = capi_decides("can-update-machine-kcp-mixed.json", settings).await;
        let reasons = rollout_reasons(decision).join("; ");
        for rejected in ["failureDomain", "diskSetup", "mounts", "customImage"] {
            assert!(
                reasons.contains(rejected),
                "{rejected} must be left for the rollout: {reasons}"
            );
        }
        assert!(
            !reasons.contains("ntp"),
            "ntp was accepted, so the patch must cover it: {reasons}"
        );
        let message = answer["message"].as_str().unwrap();
        assert!(message.contains("needs rollout"), "{message}");
    }
}

#[tokio::test]
async fn an_unknown_infrastructure_kind_is_left_to_a_rollout() {
    let (decision, answer) = capi_decides("can-update-machine-unknown-infra.json", &[]).await;
    let reasons = rollout_reasons(decision);
    assert_eq!(
        reasons.len(),
        1,
        "only the infra change remains: {reasons:?}"
    );
    assert!(reasons[0].contains("AcmeMetalMachine"), "{reasons:?}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("AcmeMetalMachine")
    );
}

/// The fixture's request with the bootstrap config the same on both sides: the version is all that changes.
fn version_only(request: &Value) -> Value {
    let mut asked = request.clone();
    asked["desired"]["bootstrapConfig"] = request["current"]["bootstrapConfig"].clone();
    asked
}

/// Control planes other than KubeadmControlPlane ask CanUpdateMachine too (RKE2, k3s, Talos). Their nodes are
/// not made by kubeadm, so nothing of theirs goes in place, the Kubernetes version included: CAPI reads a
/// `Success` without a patch (a rollout), whose message names the bootstrap kind.
#[tokio::test]
async fn other_bootstrap_providers_roll_out_naming_their_kind() {
    let providers = [
        (
            "can-update-machine-rke2.json",
            "RKE2Config",
            "spec.agentConfig.ntp.servers[0]",
        ),
        (
            "can-update-machine-k3s.json",
            "KThreesConfig",
            "spec.version",
        ),
        (
            "can-update-machine-talos.json",
            "TalosConfig",
            "spec.strategicPatches[0]",
        ),
    ];
    for (fixture, kind, field) in providers {
        let request = request(fixture, &[]);
        for (asked, changed) in [
            (request.clone(), vec!["Machine spec.version", field]),
            (version_only(&request), vec!["Machine spec.version"]),
        ] {
            let (answer, body) = ask(Hook::CanUpdateMachine, &asked).await;
            assert_eq!(answer["status"], "Success", "{fixture}: {answer}");
            for patch in [
                "machinePatch",
                "bootstrapConfigPatch",
                "infrastructureMachinePatch",
            ] {
                assert_eq!(answer[patch], Value::Null, "{fixture}: {patch}");
            }
            let reasons = rollout_reasons(capi_sim::can_update_machine(&asked, &body)).join("; ");
            for path in &changed {
                assert!(reasons.contains(path), "{fixture}: {path} in {reasons}");
            }
            let message = answer["message"].as_str().unwrap();
            assert!(
                message.starts_with("needs rollout")
                    && message.contains(&format!(
                        "Machine spec.version {} (the Machine's bootstrap config, {kind} (bootstrap.cluster.x-k8s.io), \
                         is not kubeadm's KubeadmConfig",
                        version_change(&asked)
                    )),
                "{fixture}: {message}"
            );
        }
    }
}

/// `v1.32.4+rke2r1→v1.32.5+rke2r1`, as a CanUpdate message shows the Machine's version change.
fn version_change(request: &Value) -> String {
    let version = |side: &str| {
        request[side]["machine"]["spec"]["version"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    format!("{}→{}", version("current"), version("desired"))
}

#[tokio::test]
async fn in_place_only_mode_stops_capi_instead_of_replacing() {
    let (decision, answer) = capi_decides(
        "can-update-machine-kcp-mixed.json",
        &[("mode", "in-place-only")],
    )
    .await;
    let CapiDecision::Error { message } = decision else {
        panic!("expected CAPI to stop: {decision:?}")
    };
    assert!(message.contains("failureDomain"), "{message}");
    assert_eq!(answer["status"], "Failure");
    // ... and changes that all go in place still do.
    let (decision, _) = capi_decides(
        "can-update-machine-kcp-version.json",
        &[("mode", "in-place-only")],
    )
    .await;
    assert_eq!(decision, CapiDecision::InPlace);
}

#[tokio::test]
async fn settings_narrow_the_policy() {
    let (decision, _) = capi_decides(
        "can-update-machine-kcp-version.json",
        &[("inPlace", "false")],
    )
    .await;
    assert!(
        matches!(decision, CapiDecision::Rollout { .. }),
        "{decision:?}"
    );
    let (decision, _) = capi_decides(
        "can-update-machine-kcp-files-keys.json",
        &[("disableActions", "ssh-keys")],
    )
    .await;
    let reasons = rollout_reasons(decision);
    assert!(
        reasons.iter().all(|r| r.contains("users")),
        "only the key rotation is left: {reasons:?}"
    );
    let (decision, answer) = capi_decides(
        "can-update-machine-kcp-version.json",
        &[("mode", "sometimes")],
    )
    .await;
    assert!(
        matches!(decision, CapiDecision::Error { .. }),
        "a bad setting is a Failure: {decision:?}"
    );
    assert!(
        answer["message"].as_str().unwrap().contains("mode"),
        "{answer}"
    );
}

#[tokio::test]
async fn version_skips_and_downgrades_need_a_rollout() {
    for (version, why) in [("v1.35.0", "minor"), ("v1.32.9", "downgrade")] {
        let mut request = request("can-update-machine-kcp-version.json", &[]);
        request["desired"]["machine"]["spec"]["version"] = json!(version);
        let (answer, body) = ask(Hook::CanUpdateMachine, &request).await;
        let reasons = rollout_reasons(capi_sim::can_update_machine(&request, &body));
        assert!(
            reasons.iter().any(|r| r.contains("spec.version")),
            "{why}: {reasons:?}"
        );
        assert!(
            answer["message"]
                .as_str()
                .unwrap()
                .contains("needs rollout"),
            "{answer}"
        );
    }
}

#[tokio::test]
async fn secret_values_never_appear_in_answers() {
    let request = request("can-update-machine-kcp-files-keys.json", &[]);
    let (answer, _) = ask(Hook::CanUpdateMachine, &request).await;
    let message = answer["message"].as_str().unwrap();
    let desired_files = request["desired"]["bootstrapConfig"]["spec"]["files"]
        .as_array()
        .unwrap();
    for file in desired_files {
        if let Some(content) = file["content"].as_str().filter(|c| c.len() > 12) {
            assert!(
                !message.contains(content),
                "file content leaked into the message: {message}"
            );
        }
    }
    let key = request["desired"]["bootstrapConfig"]["spec"]["users"][0]["sshAuthorizedKeys"][1]
        .as_str()
        .unwrap();
    assert!(!message.contains(key), "{message}");
}

/// The unknown-infrastructure fixture as a Metal3 machine whose only change is its OS image (`spec.image`).
fn metal3_image_change(settings: &[(&str, &str)]) -> Value {
    let mut asked = request("can-update-machine-unknown-infra.json", settings);
    for side in ["current", "desired"] {
        let infra = &mut asked[side]["infrastructureMachine"];
        infra["apiVersion"] = json!("infrastructure.cluster.x-k8s.io/v1beta2");
        infra["kind"] = json!("Metal3Machine");
        let machine = &mut asked[side]["machine"]["spec"]["infrastructureRef"];
        machine["kind"] = json!("Metal3Machine");
        machine["apiGroup"] = json!("infrastructure.cluster.x-k8s.io");
    }
    let firmware = asked["current"]["infrastructureMachine"]["spec"]["firmware"].clone();
    let desired = &mut asked["desired"]["infrastructureMachine"]["spec"];
    desired["firmware"] = firmware;
    desired["image"] = json!({
        "url": "https://images.acme.example/ubuntu-2404-kube-v1.33.4-2026-12.raw",
        "checksum": "sha256:9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b",
        "checksumType": "sha256",
        "diskFormat": "raw"
    });
    asked
}

#[tokio::test]
async fn an_os_image_change_goes_in_place_only_where_the_registration_turns_os_image_on() {
    // Off by default: a rollout, and the answer says which setting would turn it on.
    let asked = metal3_image_change(&[]);
    let (answer, _) = ask(Hook::CanUpdateMachine, &asked).await;
    let reasons = rollout_reasons(capi_decides_on(&asked).await);
    assert!(
        !reasons.is_empty()
            && reasons
                .iter()
                .all(|r| r.starts_with("Metal3Machine spec.image.")),
        "only the image remains: {reasons:?}"
    );
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("enableActions: os-image"),
        "{answer}"
    );
    for settings in BOTH {
        let mut on = settings.to_vec();
        on.push(("enableActions", "os-image"));
        let asked = metal3_image_change(&on);
        let (answer, _) = ask(Hook::CanUpdateMachine, &asked).await;
        assert_eq!(
            capi_decides_on(&asked).await,
            CapiDecision::InPlace,
            "{answer}"
        );
        let message = answer["message"].as_str().unwrap();
        assert!(
            message.contains("os-image")
                && message.contains("drains the node (OS image change: the node reboots)"),
            "{message}"
        );
        assert!(
            capi_reads_affects_availability(&asked).await,
            "a reboot disturbs workloads"
        );
    }
}

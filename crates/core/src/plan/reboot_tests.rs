//! Plans that reboot the node: an OS image change (the `os-image` action, the image read from the
//! infrastructure machine's field the policy names) and package steps under `rebootWhenRequired`; and the
//! container runtime step under `upgradeContainerRuntime`, which drains like them.

use std::collections::BTreeSet;

use inplace_agent_api::{KubeadmUpgradeMode, RebootWhen, StepAction, StepKind, validate_plan};
use serde_json::json;

use super::*;
use crate::Action;
use crate::drain::{self, DrainRules, MachineDrain, NodeChange, VersionChange, Why};
use crate::objects::Scope;
use crate::policy::ImageField;

const IMAGE: &str = "https://images.example/ubuntu-24.04-k8s-1.34.raw";

fn machine(version: &str, annotations: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": { "name": "edge-01-md-abcde", "namespace": "default", "annotations": annotations,
                      "labels": { "cluster.x-k8s.io/cluster-name": "edge-01" } },
        "spec": { "clusterName": "edge-01", "version": version }
    })
}

fn infra(url: serde_json::Value) -> String {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "Metal3Machine",
        "spec": { "image": { "url": url, "checksum": "sha256:00", "checksumType": "sha256" } }
    })
    .to_string()
}

/// The plan as dispatch builds it, from what changed and the allowed actions.
fn plan(
    machine: &serde_json::Value,
    change: &NodeChange,
    actions: &[Action],
    infra: Option<&str>,
    reboot_when_required: bool,
) -> Result<Plan, PlanError> {
    let steps = crate::VersionSteps {
        reboot_when_required,
        container_runtime: false,
    };
    plan_with(machine, change, actions, infra, steps)
}

/// [`plan`] with any extra version steps.
fn plan_with(
    machine: &serde_json::Value,
    change: &NodeChange,
    actions: &[Action],
    infra: Option<&str>,
    steps: crate::VersionSteps,
) -> Result<Plan, PlanError> {
    let facts = MachineFacts::of(machine).unwrap();
    let field = ImageField::parse("spec.image.url").unwrap();
    let verdict = drain::decide(
        change,
        &DrainRules::default(),
        &MachineDrain::of(Scope::Object, machine),
        steps,
    );
    let actions: BTreeSet<Action> = actions.iter().copied().collect();
    let plan = build(&PlanInput {
        facts: &facts,
        bootstrap: None,
        inputs: &PlanInputs {
            actions,
            switches: Switches {
                version_steps: steps,
                ..Switches::default()
            },
            os_image: Some(field),
            steps: Default::default(),
        },
        change,
        upgrade_mode: KubeadmUpgradeMode::Node,
        drain: verdict.drain().copied(),
        infra,
    })?;
    validate_plan(&plan).unwrap();
    Ok(plan)
}

fn change(version: VersionChange, actions: &[Action]) -> NodeChange {
    NodeChange {
        version,
        actions: actions.iter().copied().collect(),
    }
}

fn kinds(plan: &Plan) -> Vec<StepKind> {
    plan.steps.iter().map(|s| s.action.step_kind()).collect()
}

#[test]
fn an_os_image_change_drains_switches_the_image_and_waits_for_the_node() {
    let text = infra(json!(IMAGE));
    let p = plan(
        &machine("v1.34.1", json!({})),
        &change(VersionChange::None, &[Action::OsImage]),
        &[Action::OsImage],
        Some(&text),
        false,
    )
    .unwrap();
    assert_eq!(
        kinds(&p),
        [
            StepKind::DrainNode,
            StepKind::OsImage,
            StepKind::WaitNodeReady,
            StepKind::UncordonNode
        ]
    );
    assert_eq!(
        p.steps[1].action,
        StepAction::OsImage {
            image: IMAGE.to_owned()
        }
    );
    assert_eq!(
        p.steps[1].timeout_seconds,
        inplace_agent_api::MAX_STEP_TIMEOUT_SECONDS
    );
    assert!(
        p.steps[0].description.contains(&Why::OsImage.to_string()),
        "{}",
        p.steps[0].description
    );
}

#[test]
fn the_os_image_goes_before_a_kubernetes_upgrade_in_the_same_plan() {
    let text = infra(json!(IMAGE));
    let p = plan(
        &machine("v1.34.1", json!({})),
        &change(
            VersionChange::Minor,
            &[Action::OsImage, Action::KubernetesVersion],
        ),
        &[Action::OsImage, Action::KubernetesVersion],
        Some(&text),
        false,
    )
    .unwrap();
    let kinds = kinds(&p);
    let at = |k: StepKind| kinds.iter().position(|x| *x == k).unwrap();
    assert!(at(StepKind::DrainNode) < at(StepKind::OsImage));
    assert!(at(StepKind::OsImage) < at(StepKind::InstallKubeadm));
}

#[test]
fn no_image_step_without_the_action_or_the_field_and_a_bad_field_names_itself() {
    let m = machine("v1.34.1", json!({}));
    let none = change(VersionChange::None, &[]);
    let text = infra(json!(IMAGE));
    // Not allowed: no step, even with the image there.
    let p = plan(&m, &none, &[Action::Files], Some(&text), false).unwrap();
    assert!(p.steps.is_empty());
    // Allowed but not moved (the verdict judged no image change): no step.
    assert!(
        plan(&m, &none, &[Action::OsImage], Some(&text), false)
            .unwrap()
            .steps
            .is_empty()
    );
    let image = change(VersionChange::None, &[Action::OsImage]);
    // Allowed, the field absent: nothing to converge.
    let empty = infra(serde_json::Value::Null);
    assert!(
        plan(&m, &image, &[Action::OsImage], Some(&empty), false)
            .unwrap()
            .steps
            .is_empty()
    );
    // A list where the image should be: the plan is refused naming the field.
    let wrong = infra(json!(["a", "b"]));
    let err = plan(&m, &image, &[Action::OsImage], Some(&wrong), false).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("field `infrastructureMachine.spec.image.url`"),
        "{err}"
    );
}

#[test]
fn reboot_when_required_ends_the_package_steps_and_always_drains() {
    let m = machine("v1.34.2", json!({}));
    let patch = change(VersionChange::Patch, &[Action::KubernetesVersion]);
    let p = plan(&m, &patch, &[Action::KubernetesVersion], None, true).unwrap();
    assert_eq!(
        kinds(&p),
        [
            StepKind::InstallKubeadm,
            StepKind::KubeadmUpgrade,
            StepKind::DrainNode,
            StepKind::InstallKubelet,
            StepKind::Reboot,
            StepKind::WaitNodeReady,
            StepKind::UncordonNode
        ]
    );
    let reboot = &p.steps[4];
    assert_eq!(
        reboot.action,
        StepAction::Reboot {
            when: RebootWhen::IfRequired
        }
    );
    assert!(
        reboot.description.contains("if the node requires it"),
        "{}",
        reboot.description
    );
    // Without the setting: no reboot step, and the plan is what it was.
    let off = plan(&m, &patch, &[Action::KubernetesVersion], None, false).unwrap();
    assert!(!kinds(&off).contains(&StepKind::Reboot));
    // Under CAPI's exclude annotation the node is not drained, and still may reboot (the operator's choice).
    let excluded = machine(
        "v1.34.2",
        json!({ drain::EXCLUDE_NODE_DRAINING_ANNOTATION: "" }),
    );
    let p = plan(&excluded, &patch, &[Action::KubernetesVersion], None, true).unwrap();
    assert!(!kinds(&p).contains(&StepKind::DrainNode));
    assert!(kinds(&p).contains(&StepKind::Reboot));
}

#[test]
fn upgrade_container_runtime_puts_the_runtime_before_the_kubelet_on_a_drained_node() {
    let m = machine("v1.34.2", json!({}));
    // A patch change under drainPatchVersion off would not drain: the runtime step makes it drain.
    let patch = change(VersionChange::Patch, &[Action::KubernetesVersion]);
    let steps = crate::VersionSteps {
        reboot_when_required: false,
        container_runtime: true,
    };
    let rules = DrainRules {
        patch_version: false,
        ..DrainRules::default()
    };
    let verdict = drain::decide(&patch, &rules, &MachineDrain::of(Scope::Object, &m), steps);
    assert_eq!(verdict.drain().map(|d| d.why), Some(Why::ContainerRuntime));
    let p = plan_with(&m, &patch, &[Action::KubernetesVersion], None, steps).unwrap();
    assert_eq!(
        kinds(&p),
        [
            StepKind::InstallKubeadm,
            StepKind::KubeadmUpgrade,
            StepKind::DrainNode,
            StepKind::ContainerRuntime,
            StepKind::InstallKubelet,
            StepKind::WaitNodeReady,
            StepKind::UncordonNode
        ]
    );
    assert_eq!(
        p.steps[3].action,
        StepAction::ContainerRuntime {
            kubernetes_version: "v1.34.2".into()
        }
    );
    assert_eq!(
        p.steps[3].timeout_seconds,
        StepKind::ContainerRuntime.timeout_seconds()
    );
    // Without the setting the plan is what it was, id included.
    let off = plan(&m, &patch, &[Action::KubernetesVersion], None, false).unwrap();
    assert!(!kinds(&off).contains(&StepKind::ContainerRuntime));
    let again = plan(&m, &patch, &[Action::KubernetesVersion], None, false).unwrap();
    assert_eq!(off.id, again.id);
    assert_ne!(off.id, p.id);
    // No version change, no runtime step.
    let files = change(VersionChange::None, &[Action::Files]);
    let p = plan_with(&m, &files, &[Action::Files], None, steps).unwrap();
    assert!(!kinds(&p).contains(&StepKind::ContainerRuntime));
}

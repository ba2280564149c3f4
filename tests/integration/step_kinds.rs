//! Every step kind of the one table (`inplace_agent_api::StepKind`) is wired everywhere a kind must be:
//! the validator accepts a valid step of it, the agent has a driver for it, the server's pace has a guess
//! for it, its metrics series exist from the first scrape, the OpenAPI document lists it, and every shipped
//! agent config holds what its driver needs. A kind added to the table alone fails here (first to compile,
//! in `valid_step`, then at each check).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use inplace_agent_api::{
    FileEncoding, FileSpec, KubeadmUpgradeMode, KubeletArg, RebootWhen, SecretString, SshUser,
    StepAction, StepKind, validate_action,
};
use inplace_updater::dispatch::fleet::pace::{RunPace, StepDurations, remaining};
use serde_json::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A valid step of `kind`, as the server would send it.
fn valid_step(kind: StepKind) -> StepAction {
    let version = || "v1.34.1".to_owned();
    match kind {
        StepKind::Files => StepAction::Files {
            files: vec![FileSpec {
                path: "/etc/motd".into(),
                owner: None,
                permissions: Some("0644".into()),
                encoding: FileEncoding::None,
                append: false,
                content: SecretString::new("hello"),
            }],
        },
        StepKind::SshKeys => StepAction::SshKeys {
            users: vec![SshUser {
                name: "capi".into(),
                authorized_keys: vec!["ssh-ed25519 AAAA".into()],
            }],
        },
        StepKind::Ntp => StepAction::Ntp {
            servers: vec!["time.example.org".into()],
            enabled: None,
        },
        StepKind::EtcdImage => StepAction::EtcdImage {
            image_tag: "3.6.4-0".into(),
            image_repository: None,
        },
        StepKind::KubeletArgs => StepAction::KubeletArgs {
            args: vec![KubeletArg {
                name: "max-pods".into(),
                value: "200".into(),
            }],
        },
        StepKind::InstallKubeadm => StepAction::InstallKubeadm { version: version() },
        StepKind::KubeadmUpgrade => StepAction::KubeadmUpgrade {
            version: version(),
            mode: KubeadmUpgradeMode::Node,
        },
        StepKind::InstallKubelet => StepAction::InstallKubelet { version: version() },
        StepKind::ContainerRuntime => StepAction::ContainerRuntime {
            kubernetes_version: version(),
        },
        StepKind::DrainNode => StepAction::DrainNode {
            delete_empty_dir_data: false,
            force_unmanaged: false,
        },
        StepKind::WaitNodeReady => StepAction::WaitNodeReady {
            kubelet_version: Some(version()),
        },
        StepKind::UncordonNode => StepAction::UncordonNode,
        StepKind::Reboot => StepAction::Reboot {
            when: RebootWhen::IfRequired,
        },
        StepKind::OsImage => StepAction::OsImage {
            image: "quay.io/fedora/fedora-bootc@sha256:0123".into(),
        },
        StepKind::Unsupported => StepAction::Unsupported,
    }
}

/// The shipped agent configs: the node's and the examples.
fn shipped_configs() -> Vec<PathBuf> {
    let mut files = vec![repo("deploy/node/agent.yaml")];
    for entry in std::fs::read_dir(repo("crates/agent/config-examples")).unwrap() {
        files.push(entry.unwrap().path());
    }
    files.sort();
    files
}

#[test]
fn every_step_kind_is_wired() {
    let table: BTreeSet<StepKind> = StepKind::ALL.into_iter().collect();
    assert_eq!(table.len(), StepKind::ALL.len(), "a kind is listed twice");
    // Every gap, so one run names all of them.
    let mut gaps = Vec::new();

    // The wire shape and the validator: a valid step of the kind is of the kind, carries its wire name,
    // and validates (is not refused as a kind the validator does not know).
    for kind in StepKind::ALL {
        let action = valid_step(kind);
        if action.step_kind() != kind
            || serde_json::to_value(&action).unwrap()["kind"] != kind.wire()
        {
            gaps.push(format!(
                "{kind}: its StepAction variant is not its row of the table"
            ));
        }
        if let Err(e) = validate_action(&action) {
            gaps.push(format!("{kind}: the validator refuses a valid step: {e}"));
        }
    }

    // The agent: one driver per kind, none for a kind outside the table.
    let drivers: BTreeSet<StepKind> = inplace_agent::driver_kinds().into_iter().collect();
    for kind in table.difference(&drivers) {
        gaps.push(format!(
            "{kind}: no driver in the agent's registry (crates/agent/src/drivers/mod.rs)"
        ));
    }
    for kind in drivers.difference(&table) {
        gaps.push(format!("{kind}: a driver for a kind outside the table"));
    }

    // The server's pace: a kind nothing was learned about is expected to take its guess.
    for kind in StepKind::ALL {
        let run = RunPace {
            kinds: &[kind],
            current: 0,
            current_since_ms: None,
        };
        let expected = remaining(&run, &StepDurations::default(), 0);
        if kind.guess_seconds() == 0 || expected.mean_ms != f64::from(kind.guess_seconds()) * 1000.0
        {
            gaps.push(format!(
                "{kind}: no pace guess (expected {} ms)",
                expected.mean_ms
            ));
        }
    }

    // The metrics: both step series of every kind exist from the first scrape.
    let text = inplace_updater::server::Metrics::new().encode();
    for kind in StepKind::ALL {
        for series in [
            format!("inplace_updater_step_failures_total{{kind=\"{kind}\"}} 0"),
            format!("inplace_updater_step_duration_seconds_count{{kind=\"{kind}\"}} 0"),
        ] {
            if !text.lines().any(|line| line == series) {
                gaps.push(format!("{kind}: no metrics series `{series}`"));
            }
        }
    }

    // openapi/openapi.yaml: the plan schema's step kinds are the table's, filled in where the file marks them
    // (a hand-written list there would go stale with the next kind).
    let raw: Value = serde_yaml_ng::from_str(inplace_updater::openapi::SOURCE).unwrap();
    let kind_schema = "/components/schemas/Step/properties/action/properties/kind";
    if raw.pointer(&format!("{kind_schema}/enum")).is_some() {
        gaps.push("openapi.yaml: Step.action.kind lists kinds by hand".into());
    }
    let openapi: Value = serde_yaml_ng::from_str(&inplace_updater::openapi::document()).unwrap();
    let documented: Vec<&str> = openapi
        .pointer(&format!("{kind_schema}/enum"))
        .and_then(Value::as_array)
        .expect("openapi.yaml: Step.action.kind has no step-kinds marker")
        .iter()
        .map(|kind| kind.as_str().unwrap())
        .collect();
    let wires: Vec<&str> = StepKind::ALL.map(StepKind::wire).into();
    if documented != wires {
        gaps.push(format!(
            "openapi document: Step.action.kind enum {documented:?}, the table {wires:?}"
        ));
    }

    // The shipped agent configs hold what every driver of a kind every node runs needs (e.g. the commands of
    // the Kubernetes version steps, the node steps' `node:` section). An optional kind (osImage: only an
    // image-based OS can switch images) is set up by at least one of them, its example.
    let configs = shipped_configs();
    assert!(configs.len() >= 4, "{configs:?}");
    let mut optional_unconfigured: Option<BTreeSet<StepKind>> = None;
    for file in configs {
        let config = inplace_agent::DriverConfig::load(&file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (kind, missing) in inplace_agent::unconfigured_kinds(&config) {
            gaps.push(format!("{kind}: {} lacks {missing}", file.display()));
        }
        let here: BTreeSet<StepKind> = inplace_agent::unconfigured_optional_kinds(&config)
            .into_iter()
            .map(|(kind, _)| kind)
            .collect();
        optional_unconfigured = Some(match optional_unconfigured {
            None => here,
            Some(before) => before.intersection(&here).copied().collect(),
        });
        // A kind that is undone (issue 28) needs its sequence's `undo:`, or a rollback reaching it fails.
        for missing in inplace_agent::missing_undos(&config) {
            gaps.push(format!(
                "{}: a rollback cannot undo it: lacks {missing}",
                file.display()
            ));
        }
    }

    for kind in optional_unconfigured.unwrap_or_default() {
        gaps.push(format!(
            "{kind}: optional, but no shipped config sets it up"
        ));
    }

    assert!(
        gaps.is_empty(),
        "step kinds not wired everywhere:\n{}",
        gaps.join("\n")
    );
}

#[test]
fn a_config_without_a_drivers_settings_is_caught() {
    // The check above can fail: the empty config lacks the Kubernetes sequences and the `node:` section.
    let missing = inplace_agent::unconfigured_kinds(&inplace_agent::DriverConfig::default());
    let kinds: Vec<StepKind> = missing.iter().map(|(kind, _)| *kind).collect();
    assert_eq!(
        kinds,
        [
            StepKind::InstallKubeadm,
            StepKind::KubeadmUpgrade,
            StepKind::InstallKubelet,
            StepKind::DrainNode,
            StepKind::WaitNodeReady,
            StepKind::UncordonNode,
        ]
    );
    assert_eq!(
        missing[1].1,
        "kubernetes.kubeadmUpgradeApply, kubernetes.kubeadmUpgradeNode"
    );
    assert_eq!(missing[3].1, "node");
}

#[test]
fn a_package_sequence_without_an_undo_is_caught() {
    // The undo check above can fail: a sequence of a kind that is undone, without `undo:`.
    let config = inplace_agent::DriverConfig::from_yaml(
        "kubernetes:\n  installKubelet:\n    commands:\n      - run: [apt-get, install, -y, kubelet]\n",
    )
    .unwrap();
    assert_eq!(
        inplace_agent::missing_undos(&config),
        ["kubernetes.installKubelet.undo"]
    );
    for kind in [StepKind::InstallKubeadm, StepKind::InstallKubelet] {
        assert_eq!(kind.undo(), inplace_agent::api::Undo::Restores, "{kind}");
    }
}

//! What a resumed plan must have done, computed from the shipped config and the plan the agent got, and the
//! checks of tests/integration/e2e_resume.rs against the stand-ins' log and the node's end state.

use std::path::{Path, PathBuf};

use inplace_agent::api::{KubeadmUpgradeMode, Plan, StepAction};
use inplace_agent::{CommandSequence, CommandSpec, SequenceCommand};

use super::standins::{World, release_binary};
use super::{Node, Shipped, TO};

/// The Kubernetes version sequences of an agent config.
pub const SEQUENCES: [&str; 4] = [
    "installKubeadm",
    "kubeadmUpgradeApply",
    "kubeadmUpgradeNode",
    "installKubelet",
];

pub fn sequence<'a>(shipped: &'a Shipped, key: &str) -> Option<&'a CommandSequence> {
    let k = &shipped.config.kubernetes;
    match key {
        "installKubeadm" => k.install_kubeadm.as_ref(),
        "kubeadmUpgradeApply" => k.kubeadm_upgrade_apply.as_ref(),
        "kubeadmUpgradeNode" => k.kubeadm_upgrade_node.as_ref(),
        "installKubelet" => k.install_kubelet.as_ref(),
        _ => None,
    }
}

/// Every `run` command of every sequence of every shipped config, as (config, sequence, index).
pub fn targets(configs: &[Shipped]) -> Vec<(usize, &'static str, usize)> {
    let mut targets = Vec::new();
    for (c, shipped) in configs.iter().enumerate() {
        for key in SEQUENCES {
            let sequence = sequence(shipped, key)
                .unwrap_or_else(|| panic!("{} has no kubernetes.{key}", shipped.file));
            for (i, command) in sequence.commands.iter().enumerate() {
                if matches!(command.spec, CommandSpec::Run(_)) {
                    targets.push((c, key, i));
                }
            }
        }
    }
    targets
}

pub fn expand(template: &str, root: &str, pins: &[(String, String)]) -> String {
    let bare = TO.trim_start_matches('v');
    let minor = &TO[..TO.rfind('.').expect("minor")];
    let mut text = template
        .replace("{{version}}", TO)
        .replace("{{bareVersion}}", bare)
        .replace("{{minor}}", minor)
        .replace("{{root}}", root);
    for (name, value) in pins {
        text = text.replace(&format!("{{{{pin.{name}}}}}"), value);
    }
    text
}

/// One command the plan runs, as the stand-ins log it, with the sequence and index it comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct Effect {
    pub sequence: Option<&'static str>,
    pub index: usize,
    pub argv: String,
}

pub fn runs(
    commands: &[SequenceCommand],
    key: Option<&'static str>,
    root: &str,
    pins: &[(String, String)],
) -> Vec<Effect> {
    commands
        .iter()
        .enumerate()
        .filter_map(|(index, command)| match &command.spec {
            CommandSpec::Run(argv) => Some(Effect {
                sequence: key,
                index,
                argv: argv
                    .iter()
                    .map(|a| expand(a, root, pins))
                    .collect::<Vec<_>>()
                    .join(" "),
            }),
            _ => None,
        })
        .collect()
}

/// Every command the plan runs on a node that starts below every desired state, in order.
pub fn plan_effects(shipped: &Shipped, plan: &Plan, root: &str) -> Vec<Effect> {
    let config = &shipped.config;
    let pins: Vec<(String, String)> = sandbox_pins(shipped);
    let restart = |argv: &[String]| Effect {
        sequence: None,
        index: 0,
        argv: argv.join(" "),
    };
    let mut effects = Vec::new();
    for step in &plan.steps {
        let key = match &step.action {
            StepAction::Ntp { servers, enabled } => {
                if *enabled != Some(false) && !servers.is_empty() {
                    effects.push(restart(&config.ntp.restart()));
                }
                continue;
            }
            StepAction::KubeletArgs { .. } => {
                effects.push(restart(&config.kubelet.restart));
                continue;
            }
            StepAction::InstallKubeadm { .. } => "installKubeadm",
            StepAction::KubeadmUpgrade {
                mode: KubeadmUpgradeMode::Apply,
                ..
            } => "kubeadmUpgradeApply",
            StepAction::KubeadmUpgrade {
                mode: KubeadmUpgradeMode::Node,
                ..
            } => "kubeadmUpgradeNode",
            StepAction::InstallKubelet { .. } => "installKubelet",
            _ => continue,
        };
        let sequence = sequence(shipped, key).expect("sequence");
        effects.extend(runs(&sequence.commands, Some(key), root, &pins));
    }
    effects
}

/// The pins as the sandbox config has them.
pub fn sandbox_pins(shipped: &Shipped) -> Vec<(String, String)> {
    let text = shipped.for_sandbox();
    let config = inplace_agent::DriverConfig::from_yaml(&text).expect("sandbox config");
    config
        .pins
        .get(TO)
        .map(|p| p.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

pub fn inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// The node file the config's `writeFile` commands write (they must not be rewritten once done).
pub fn written_files(shipped: &Shipped) -> Vec<String> {
    SEQUENCES
        .iter()
        .filter_map(|key| sequence(shipped, key))
        .flat_map(|s| s.commands.iter())
        .filter_map(|c| match &c.spec {
            CommandSpec::WriteFile { path, .. } => Some(path.clone()),
            _ => None,
        })
        .collect()
}

/// The order of the stand-ins' commands around the stop inside `sequence`'s command `command`.
pub fn check_calls(
    shipped: &Shipped,
    node: &Node,
    (key, command): (&str, usize),
    root: &str,
    context: &str,
) {
    let plan_file = std::fs::read_dir(&node.state)
        .expect("state dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("plan-"))
        })
        .expect("plan file");
    let plan: Plan =
        serde_json::from_slice(&std::fs::read(plan_file).expect("plan")).expect("plan json");
    let effects = plan_effects(shipped, &plan, root);
    let k = effects
        .iter()
        .position(|e| e.sequence == Some(key) && e.index == command)
        .unwrap_or_else(|| panic!("the plan runs no {}[{}]: {context}", key, command));
    assert!(
        !effects[..k].iter().any(|e| e.argv == effects[k].argv),
        "the trap would fire before the case's command: {context}"
    );
    let calls = node.calls();
    let lines: Vec<&str> = calls.lines().collect();
    let blocked = lines
        .iter()
        .position(|l| l.starts_with("blocked "))
        .expect("blocked line");
    let (before, after) = (&lines[..blocked], &lines[blocked + 1..]);
    let starts = |lines: &[&str]| -> Vec<String> {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix("start "))
            .map(str::to_string)
            .collect()
    };
    let argvs =
        |effects: &[Effect]| -> Vec<String> { effects.iter().map(|e| e.argv.clone()).collect() };
    assert_eq!(
        starts(before),
        argvs(&effects[..=k]),
        "before the stop: {context}"
    );
    let seq = sequence(shipped, key).expect("sequence");
    let mut expected = argvs(&runs(&seq.on_resume, None, root, &[]));
    expected.extend(argvs(&effects[k..]));
    assert_eq!(
        starts(after),
        expected,
        "after the restart: onResume, the interrupted command, then each later command once: {context}"
    );
    // After the restart every command ran to its end before the next one started.
    let steps: Vec<&str> = after
        .iter()
        .copied()
        .filter(|l| l.starts_with("start ") || l.starts_with("end ") || l.starts_with("failed "))
        .collect();
    for pair in steps.chunks(2) {
        let start = pair[0].strip_prefix("start ");
        let end = pair.get(1).and_then(|l| l.strip_prefix("end "));
        assert!(
            start.is_some() && start == end,
            "{pair:?} is not a completed command: {context}"
        );
    }
    // When installKubelet ended, kubelet ran the new version (not only at the plan's end, where the
    // kubeletArgs step restarts it anyway).
    let last = effects
        .iter()
        .rposition(|e| e.sequence == Some("installKubelet"))
        .expect("installKubelet runs commands");
    let ends_needed = expected.len() - (effects.len() - last) + 1;
    let mut ends = 0;
    let mut running = None;
    for line in after {
        if let Some(version) = line.strip_prefix("running kubelet ") {
            running = Some(version);
        }
        if line.starts_with("end ") {
            ends += 1;
            if ends == ends_needed {
                break;
            }
        }
    }
    assert_eq!(
        running,
        Some(TO),
        "kubelet at the end of installKubelet: {context}"
    );
}

/// The node is upgraded as the step promises.
pub fn check_end_state(
    shipped: &Shipped,
    node: &Node,
    files: &[(PathBuf, Option<u64>)],
    context: &str,
) {
    let running = node.standin("kubelet-running");
    assert_eq!(
        running.as_deref(),
        Some(TO),
        "kubelet restarted on the new version: {context}"
    );
    for tool in ["kubeadm", "kubelet", "kubectl"] {
        let installed = match shipped.world {
            World::Release => {
                let text = std::fs::read_to_string(node.path(&format!("/usr/local/bin/{tool}")))
                    .unwrap_or_default();
                (text == release_binary(tool, TO)).then(|| TO.to_string())
            }
            World::Apt | World::Dnf => node.standin(&format!("pkg-{tool}")),
        };
        assert_eq!(
            installed.as_deref(),
            Some(TO),
            "{tool} installed: {context}"
        );
    }
    let upgrade = node.standin("kubeadm-upgrade").unwrap_or_default();
    assert!(
        upgrade.starts_with(&format!("apply {TO} ")) || upgrade.starts_with("node "),
        "kubeadm upgrade ran ({upgrade:?}): {context}"
    );
    match shipped.world {
        World::Apt => {
            for tool in ["kubeadm", "kubelet", "kubectl"] {
                assert!(
                    node.standin(&format!("held-{tool}")).is_some(),
                    "{tool} held: {context}"
                );
            }
            assert!(
                node.standin("dpkg-interrupted").is_none(),
                "dpkg clean: {context}"
            );
        }
        World::Release => {
            let leftovers: Vec<String> = std::fs::read_dir(node.path("/usr/local/bin"))
                .expect("bin")
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".download"))
                .collect();
            assert!(
                leftovers.is_empty(),
                "downloads removed: {leftovers:?}: {context}"
            );
        }
        World::Dnf => {}
    }
    for (path, before) in files {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            text.contains("v1.34"),
            "{} names the new minor: {context}",
            path.display()
        );
        if before.is_some() {
            assert_eq!(
                inode(path),
                *before,
                "{} not written again: {context}",
                path.display()
            );
        }
    }
}

//! The agent's `--config` file (YAML): how each driver does its work on this node — the commands
//! of the Kubernetes version steps, restart commands, paths, `PATH`, pinned checksums.
//! Unknown keys are errors, so a typo fails at start rather than mid-upgrade.

use std::collections::BTreeMap;
use std::path::Path;

use inplace_agent_api::is_valid_kubernetes_version;
use serde::Deserialize;

pub(crate) mod agent;
pub(crate) mod artifact;
pub(crate) mod control_plane;
pub(crate) mod node;
pub(crate) mod reboot;
pub(crate) mod runtime;
pub(crate) mod sections;
pub(crate) mod service;
pub(crate) mod sysext;
pub(crate) mod verify;

pub use crate::config::artifact::{ArtifactsConfig, MirrorConfig};
pub use crate::config::control_plane::{
    ControlPlaneConfig, DEFAULT_ETCD_CA_FILE, DEFAULT_ETCD_CERT_FILE, DEFAULT_ETCD_ENDPOINT,
    DEFAULT_ETCD_KEY_FILE,
};
pub use crate::config::node::NodeConfig;
pub use crate::config::reboot::{OsImageConfig, RebootConfig, RequiredCheck};
pub use crate::config::sections::{Section, SectionConfig, Sections};
pub use crate::config::service::{
    EtcdConfig, InventoryConfig, KubeletConfig, NtpConfig, NtpFlavor,
};
pub use crate::config::sysext::SysextConfig;
pub use crate::config::verify::{VerifyCommand, VerifyConfig};
use crate::retry::RetryPolicy;
pub use crate::sequence::command::{CommandSpec, RecordCondition, SequenceCommand};
use crate::sequence::command::{check_argv, check_node_path};
use crate::sequence::template;
pub use crate::sequence::undo::{RecordCommand, UndoSequence};

/// Largest `--config` file accepted.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// Why the driver config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read, is not UTF-8, or is over [`MAX_CONFIG_BYTES`] (pipes included).
    #[error("agent config: {0}")]
    Read(#[from] inplace_bounded_read::ReadError),
    /// YAML syntax or shape.
    #[error("agent config: {0}")]
    Parse(String),
    /// A value is not acceptable (names the key).
    #[error("agent config: {0}")]
    Invalid(String),
}

/// The whole `--config` file. Every section is optional; see `config-examples/`. Its unknown keys are refused
/// by [`Sections::declare`] (they are the drivers' sections, or typos), not by serde.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DriverConfig {
    /// `PATH` of every command, in order (`{{root}}` allowed). Default: the usual sbin/bin dirs.
    #[serde(default = "default_path")]
    pub path: Vec<String>,
    /// Extra environment variables for every command (e.g. `DEBIAN_FRONTEND: noninteractive`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Per-version values for `{{pin.<name>}}`, e.g. `v1.34.1: {kubeadmSha256: …}`.
    #[serde(default)]
    pub pins: BTreeMap<String, BTreeMap<String, String>>,
    /// Commands of the Kubernetes version steps.
    #[serde(default)]
    pub kubernetes: KubernetesConfig,
    /// The kubelet-args driver.
    #[serde(default)]
    pub kubelet: KubeletConfig,
    /// The ntp driver.
    #[serde(default)]
    pub ntp: NtpConfig,
    /// The etcd-image driver.
    #[serde(default)]
    pub etcd: EtcdConfig,
    /// Commands whose output goes into the inventory report.
    #[serde(default)]
    pub inventory: InventoryConfig,
    /// The node steps' API access (drainNode, waitNodeReady, uncordonNode); they fail without it.
    #[serde(default)]
    pub node: Option<NodeConfig>,
    /// The reboot driver (and the reboot of osImage steps): every key has a default.
    #[serde(default)]
    pub reboot: RebootConfig,
    /// The osImage driver; without it this node refuses osImage steps.
    #[serde(default)]
    pub os_image: Option<OsImageConfig>,
    /// The control-plane preflight's access to this node's etcd member (kubeadm's defaults).
    #[serde(default)]
    pub control_plane: ControlPlaneConfig,
    /// How `fetch` commands reach registries and `https://` servers.
    #[serde(default)]
    pub artifacts: ArtifactsConfig,
    /// The runtime matrix of the containerRuntime step; without it the step leaves the runtime alone.
    #[serde(default)]
    pub runtime: Option<crate::config::runtime::RuntimeConfig>,
    /// How `sysextSwitch` commands reach systemd-sysext (every key has a default).
    #[serde(default)]
    pub sysext: SysextConfig,
    /// How the node proves itself after a plan's last step; without it the node is not verified.
    #[serde(default)]
    pub verify: Option<VerifyConfig>,
    /// The sections drivers declare in their own files ([`Section`]): read and checked with the file, each
    /// driver reading its own with [`DriverConfig::section`].
    #[serde(flatten)]
    pub sections: Sections,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self {
            path: default_path(),
            env: BTreeMap::new(),
            pins: BTreeMap::new(),
            kubernetes: KubernetesConfig::default(),
            kubelet: KubeletConfig::default(),
            ntp: NtpConfig::default(),
            etcd: EtcdConfig::default(),
            inventory: InventoryConfig::default(),
            node: None,
            reboot: RebootConfig::default(),
            os_image: None,
            control_plane: ControlPlaneConfig::default(),
            artifacts: ArtifactsConfig::default(),
            runtime: None,
            sysext: SysextConfig::default(),
            verify: None,
            sections: Sections::default(),
        }
    }
}

fn default_path() -> Vec<String> {
    [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ]
    .map(String::from)
    .to_vec()
}

/// One sequence per Kubernetes step kind. A kind without a sequence fails its steps with a clear
/// message (the agent never guesses how this node installs packages).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubernetesConfig {
    /// `installKubeadm` steps.
    pub install_kubeadm: Option<CommandSequence>,
    /// `kubeadmUpgrade` steps with mode `apply`.
    pub kubeadm_upgrade_apply: Option<CommandSequence>,
    /// `kubeadmUpgrade` steps with mode `node`.
    pub kubeadm_upgrade_node: Option<CommandSequence>,
    /// `installKubelet` steps.
    pub install_kubelet: Option<CommandSequence>,
}

impl KubernetesConfig {
    /// The sequences every node may run (`installKubeadm`, `kubeadmUpgradeNode`, `installKubelet`) that this
    /// config lacks, by their YAML names.
    pub fn missing_sequences(&self) -> Vec<&'static str> {
        [
            ("installKubeadm", self.install_kubeadm.is_none()),
            ("kubeadmUpgradeNode", self.kubeadm_upgrade_node.is_none()),
            ("installKubelet", self.install_kubelet.is_none()),
        ]
        .into_iter()
        .filter_map(|(name, missing)| missing.then_some(name))
        .collect()
    }
}

/// Commands run in order within the step's timeout; the first failure fails the step.
///
/// Resume rule: a step that began (it was recorded running, even if a clean shutdown stopped it)
/// is never skipped by `skip_if`; it runs `on_resume`, then its commands from the first one not
/// recorded complete. So every command must be safe to run again after being interrupted
/// part-way, or after completing but before its completion was recorded.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandSequence {
    /// When this check passes (and the step never began, and no earlier plan left this sequence
    /// unfinished) the desired state already holds: the step is a no-op success.
    #[serde(default)]
    pub skip_if: Option<Check>,
    /// Run first whenever a step that began is resumed, before its first unfinished command:
    /// repairs an interrupted command needs before it can run again (e.g. `dpkg --configure -a`,
    /// without which apt refuses to work after an interrupted install). Not counted as progress,
    /// so they must be safe to run at any point of the sequence.
    #[serde(default)]
    pub on_resume: Vec<SequenceCommand>,
    /// The commands (`- run: …` maps rather than YAML `!tags`).
    pub commands: Vec<SequenceCommand>,
    /// How often, and how far apart, the commands marked `retryable` run when they exit non-zero.
    #[serde(default)]
    pub retry: Option<RetryPolicy>,
    /// Commands run before the step's first effect (only when it never began), whose outputs the undo
    /// needs (`{{record.<name>}}`), e.g. the exact package version installed before. Not for kubeadm upgrade.
    #[serde(default)]
    pub record: Vec<RecordCommand>,
    /// How a rollback puts the node back after this step. Not for kubeadm upgrade (the point of no return).
    #[serde(default)]
    pub undo: Option<UndoSequence>,
}

/// A command whose success (and optionally output) says "already done".
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Check {
    /// argv (templated).
    pub run: Vec<String>,
    /// The trimmed stdout must equal this (templated).
    #[serde(default)]
    pub stdout_equals: Option<String>,
    /// The stdout must contain this (templated).
    #[serde(default)]
    pub stdout_contains: Option<String>,
}

impl DriverConfig {
    /// Reads and checks a config file whose other top-level keys are the sections in `declared` (the drivers'
    /// own: `DriverConfig::load` passes them).
    pub fn load_declaring(path: &Path, declared: &[Section]) -> Result<Self, ConfigError> {
        let text = inplace_bounded_read::read_to_string(path, MAX_CONFIG_BYTES)?;
        Self::from_yaml_declaring(&text, declared)
    }

    /// Parses and checks YAML text whose other top-level keys are the sections in `declared`.
    pub fn from_yaml_declaring(text: &str, declared: &[Section]) -> Result<Self, ConfigError> {
        let mut config: Self =
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        config.sections.declare(declared)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks templates, argv, pins.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = ConfigError::Invalid;
        if self.path.is_empty() {
            return Err(invalid("path: needs at least one directory".into()));
        }
        for (i, dir) in self.path.iter().enumerate() {
            template::check(dir).map_err(|e| invalid(format!("path[{i}]: {e}")))?;
            if dir.contains(':') {
                return Err(invalid(format!("path[{i}]: {dir:?} contains `:`")));
            }
        }
        for name in self.env.keys() {
            let ok = !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !["PATH", "INPLACE_ROOT"].contains(&name.as_str());
            if !ok {
                return Err(invalid(format!(
                    "env: {name:?} is not a settable variable name"
                )));
            }
        }
        for (version, pins) in &self.pins {
            if !is_valid_kubernetes_version(version) {
                return Err(invalid(format!(
                    "pins: {version:?} is not a version like v1.34.1"
                )));
            }
            for (name, value) in pins {
                let ok = !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b));
                if !ok || value.contains(['\n', '\0']) {
                    return Err(invalid(format!("pins.{version}: bad entry {name:?}")));
                }
            }
        }
        let sequences = [
            (
                "kubernetes.installKubeadm",
                &self.kubernetes.install_kubeadm,
            ),
            (
                "kubernetes.kubeadmUpgradeApply",
                &self.kubernetes.kubeadm_upgrade_apply,
            ),
            (
                "kubernetes.kubeadmUpgradeNode",
                &self.kubernetes.kubeadm_upgrade_node,
            ),
            (
                "kubernetes.installKubelet",
                &self.kubernetes.install_kubelet,
            ),
        ];
        for (key, sequence) in sequences {
            if let Some(sequence) = sequence {
                let undone = !key.starts_with("kubernetes.kubeadmUpgrade");
                sequence
                    .validate(undone)
                    .map_err(|e| invalid(format!("{key}: {e}")))?;
            }
        }
        let argvs = [
            ("kubelet.restart", Some(&self.kubelet.restart)),
            ("ntp.restart", self.ntp.restart.as_ref()),
            (
                "inventory.kubeletVersion",
                Some(&self.inventory.kubelet_version),
            ),
            (
                "inventory.kubeadmVersion",
                Some(&self.inventory.kubeadm_version),
            ),
        ];
        for (key, argv) in argvs {
            if let Some(argv) = argv {
                check_argv(argv).map_err(|e| invalid(format!("{key}: {e}")))?;
            }
        }
        for (key, path) in [
            ("kubelet.flagsFile", self.kubelet.flags_file.clone()),
            ("ntp.configFile", self.ntp.config_file()),
            ("etcd.manifest", self.etcd.manifest.clone()),
        ] {
            check_node_path(&path).map_err(|e| invalid(format!("{key}: {e}")))?;
        }
        if let Some(node) = &self.node {
            node.validate().map_err(invalid)?;
        }
        self.reboot.validate().map_err(invalid)?;
        if let Some(os_image) = &self.os_image {
            os_image.validate().map_err(invalid)?;
        }
        self.control_plane.validate().map_err(invalid)?;
        self.artifacts.validate().map_err(invalid)?;
        if let Some(runtime) = &self.runtime {
            runtime.validate().map_err(invalid)?;
        }
        self.sysext.validate().map_err(invalid)?;
        if let Some(verify) = &self.verify {
            verify.validate(self.node.is_some()).map_err(invalid)?;
        }
        Ok(())
    }

    /// The section `key` a driver declared ([`Section`]), when the file has it.
    pub fn section<T: SectionConfig>(&self, key: &str) -> Option<&T> {
        self.sections.get(key)
    }

    /// `PATH` with `{{root}}` expanded.
    pub fn path_env(&self, root: &str) -> String {
        let vars = template::Vars::root_only(root);
        self.path
            .iter()
            .map(|dir| template::expand(dir, &vars).unwrap_or_else(|_| dir.clone()))
            .collect::<Vec<_>>()
            .join(":")
    }
}

impl CommandSequence {
    pub(crate) fn validate(&self, undone: bool) -> Result<(), String> {
        self.validate_commands(template::Scope::Forward)?;
        crate::sequence::undo::validate(&self.record, self.undo.as_ref(), undone)
    }

    /// Checks `osImage.apply`: its commands may use `{{image}}` (and `{{root}}`) only.
    pub(crate) fn validate_with_image(&self) -> Result<(), String> {
        self.validate_commands(template::Scope::OsImage)
    }

    fn validate_commands(&self, scope: template::Scope<'_>) -> Result<(), String> {
        if let Some(check) = &self.skip_if {
            check_argv(&check.run).map_err(|e| format!("skipIf.run: {e}"))?;
            for text in [&check.stdout_equals, &check.stdout_contains]
                .into_iter()
                .flatten()
            {
                template::check(text).map_err(|e| format!("skipIf: {e}"))?;
            }
        }
        if let Some(retry) = &self.retry {
            retry.validate()?;
        }
        for (list, commands) in [("onResume", &self.on_resume), ("commands", &self.commands)] {
            for (i, command) in commands.iter().enumerate() {
                command
                    .spec
                    .validate(scope)
                    .map_err(|e| format!("{list}[{i}]: {e}"))?;
                if command.when.is_some() {
                    return Err(format!(
                        "{list}[{i}]: ifRecorded/ifNotRecorded apply to `undo:` commands only"
                    ));
                }
                if command.retryable && self.retry.is_none() {
                    return Err(format!(
                        "{list}[{i}]: retryable, but the sequence has no `retry: {{attempts, initialDelaySeconds, maxDelaySeconds}}`"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The `undo:` keys a config lacks for a sequence it configures whose kind is undone (e.g.
/// `kubernetes.installKubelet.undo`): a rollback reaching such a step fails, naming the key.
pub fn missing_undos(config: &DriverConfig) -> Vec<String> {
    let k = &config.kubernetes;
    [
        ("kubernetes.installKubeadm", k.install_kubeadm.as_ref()),
        ("kubernetes.installKubelet", k.install_kubelet.as_ref()),
        (
            "runtime.install",
            config.runtime.as_ref().map(|r| &r.install),
        ),
    ]
    .into_iter()
    .filter(|(_, sequence)| sequence.is_some_and(|s| s.undo.is_none()))
    .map(|(key, _)| format!("{key}.undo"))
    .collect()
}

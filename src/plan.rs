//! Desired node state: turns the desired Machine and bootstrap config of an UpdateMachine call, plus the
//! actions the policy lets this updater perform, into an ordered list of declarative agent steps with a
//! stable id (a hash of exactly what the agent will converge to). Pure: no I/O, no clock.
//!
//! UpdateMachine carries no current state, so the plan is the whole desired state of every managed
//! domain; the agent's drivers converge idempotently (an already-true step is a no-op).

use std::collections::BTreeSet;

use inplace_agent_api::{
    FileEncoding, FileSpec, KubeadmUpgradeMode, KubeletArg, MachineRef, Plan, SecretString,
    SshUser, Step, StepAction,
};
use inplace_core::Action;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// Timeout of a files step.
pub const FILES_TIMEOUT_SECONDS: u32 = 60;
/// Timeout of an ssh-keys step.
pub const SSH_KEYS_TIMEOUT_SECONDS: u32 = 60;
/// Timeout of an ntp step (config write and service restart).
pub const NTP_TIMEOUT_SECONDS: u32 = 120;
/// Timeout of installing kubeadm (package download included).
pub const INSTALL_KUBEADM_TIMEOUT_SECONDS: u32 = 600;
/// Timeout of `kubeadm upgrade apply|node` (image pulls and static pod restarts included).
pub const KUBEADM_UPGRADE_TIMEOUT_SECONDS: u32 = 1800;
/// Timeout of installing kubelet and kubectl and restarting kubelet.
pub const INSTALL_KUBELET_TIMEOUT_SECONDS: u32 = 600;
/// Timeout of an etcd image change.
pub const ETCD_IMAGE_TIMEOUT_SECONDS: u32 = 120;
/// Timeout of a kubelet flags change (kubelet restart included).
pub const KUBELET_ARGS_TIMEOUT_SECONDS: u32 = 120;

/// Label CAPI puts on control-plane Machines.
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
/// Label CAPI puts on every Machine with its cluster's name.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// Why no plan could be built from the desired objects.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// A field the plan needs has the wrong shape.
    #[error("field `{path}` {problem}")]
    Field {
        /// Where, e.g. `bootstrapConfig.spec.files[2].path`.
        path: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// The Machine has no cluster name (neither `spec.clusterName` nor the cluster-name label).
    #[error("Machine has no spec.clusterName and no {CLUSTER_NAME_LABEL} label")]
    NoCluster,
}

/// Facts about the Machine that decide the plan, read from the desired Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineFacts {
    /// `namespace/name`.
    pub machine: MachineRef,
    /// The cluster it belongs to.
    pub cluster: String,
    /// Whether it is a control-plane Machine.
    pub control_plane: bool,
    /// `spec.version`, when set.
    pub version: Option<String>,
    /// `spec.providerID`, when set.
    pub provider_id: Option<String>,
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

impl MachineFacts {
    /// Reads the facts from a desired Machine object.
    pub fn of(machine: &Value) -> Result<Self, PlanError> {
        let name = str_at(machine, "/metadata/name").ok_or(PlanError::Field {
            path: "machine.metadata.name".into(),
            problem: "is missing",
        })?;
        let namespace = str_at(machine, "/metadata/namespace").unwrap_or("default");
        let cluster = str_at(machine, "/spec/clusterName")
            .or_else(|| {
                str_at(
                    machine,
                    &format!("/metadata/labels/{}", CLUSTER_NAME_LABEL.replace('/', "~1")),
                )
            })
            .filter(|c| !c.is_empty())
            .ok_or(PlanError::NoCluster)?;
        let control_plane = machine
            .pointer(&format!(
                "/metadata/labels/{}",
                CONTROL_PLANE_LABEL.replace('/', "~1")
            ))
            .is_some();
        Ok(Self {
            machine: MachineRef::new(namespace, name),
            cluster: cluster.to_string(),
            control_plane,
            version: str_at(machine, "/spec/version").map(str::to_string),
            provider_id: str_at(machine, "/spec/providerID").map(str::to_string),
        })
    }
}

/// Everything a plan is built from.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    /// Facts of the desired Machine.
    pub facts: &'a MachineFacts,
    /// The desired bootstrap config (KubeadmConfig), when there is one.
    pub bootstrap: Option<&'a Value>,
    /// Actions the policy and settings allow for this Machine.
    pub actions: &'a BTreeSet<Action>,
    /// For a version change on a control-plane node: `apply` on the first node of that version, else `node`.
    pub upgrade_mode: KubeadmUpgradeMode,
}

/// Builds the plan: steps in a safe order (node-local config first, then the Kubernetes upgrade, then what the
/// upgrade would overwrite: the etcd image and kubelet flags) and an id hashing all of it.
pub fn build(input: &PlanInput<'_>) -> Result<Plan, PlanError> {
    let mut actions: Vec<(String, u32, StepAction)> = Vec::new();
    let spec = input.bootstrap.and_then(|b| b.get("spec"));
    let enabled = |action: Action| input.actions.contains(&action);

    if let (true, Some(spec)) = (enabled(Action::Files), spec) {
        let files = files(spec)?;
        if !files.is_empty() {
            let text = format!("write {} file{}", files.len(), plural(files.len()));
            actions.push((text, FILES_TIMEOUT_SECONDS, StepAction::Files { files }));
        }
    }
    if let (true, Some(spec)) = (enabled(Action::SshKeys), spec) {
        let users = ssh_users(spec)?;
        if !users.is_empty() {
            let names: Vec<&str> = users.iter().map(|u| u.name.as_str()).collect();
            let text = format!("authorized SSH keys of {}", names.join(", "));
            actions.push((
                text,
                SSH_KEYS_TIMEOUT_SECONDS,
                StepAction::SshKeys { users },
            ));
        }
    }
    if let (true, Some(ntp)) = (enabled(Action::Ntp), spec.and_then(|s| s.get("ntp"))) {
        let servers = string_list(ntp.get("servers"), "bootstrapConfig.spec.ntp.servers")?;
        let enabled = ntp.get("enabled").and_then(Value::as_bool);
        let text = format!("time servers: {}", servers.join(", "));
        actions.push((
            text,
            NTP_TIMEOUT_SECONDS,
            StepAction::Ntp { servers, enabled },
        ));
    }
    if let (true, Some(version)) = (enabled(Action::KubernetesVersion), &input.facts.version) {
        let mode = if input.facts.control_plane {
            input.upgrade_mode
        } else {
            KubeadmUpgradeMode::Node
        };
        let mode_word = match mode {
            KubeadmUpgradeMode::Apply => "apply",
            KubeadmUpgradeMode::Node => "node",
        };
        actions.push((
            format!("install kubeadm {version}"),
            INSTALL_KUBEADM_TIMEOUT_SECONDS,
            StepAction::InstallKubeadm {
                version: version.clone(),
            },
        ));
        actions.push((
            format!("kubeadm upgrade {mode_word} ({version})"),
            KUBEADM_UPGRADE_TIMEOUT_SECONDS,
            StepAction::KubeadmUpgrade {
                version: version.clone(),
                mode,
            },
        ));
        actions.push((
            format!("install kubelet and kubectl {version}, restart kubelet"),
            INSTALL_KUBELET_TIMEOUT_SECONDS,
            StepAction::InstallKubelet {
                version: version.clone(),
            },
        ));
    }
    if let (true, true, Some(spec)) = (enabled(Action::EtcdImage), input.facts.control_plane, spec)
    {
        if let Some(local) = spec.pointer("/clusterConfiguration/etcd/local") {
            if let Some(tag) = local.get("imageTag").and_then(Value::as_str) {
                let repository = local
                    .get("imageRepository")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                actions.push((
                    format!("etcd image tag {tag}"),
                    ETCD_IMAGE_TIMEOUT_SECONDS,
                    StepAction::EtcdImage {
                        image_tag: tag.to_string(),
                        image_repository: repository,
                    },
                ));
            }
        }
    }
    if let (true, Some(spec)) = (enabled(Action::KubeletArgs), spec) {
        if let Some(args) = kubelet_args(spec)? {
            let text = format!(
                "kubelet flags: {}",
                args.iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            actions.push((
                text,
                KUBELET_ARGS_TIMEOUT_SECONDS,
                StepAction::KubeletArgs { args },
            ));
        }
    }

    let steps: Vec<Step> = actions
        .into_iter()
        .enumerate()
        .map(|(index, (description, timeout_seconds, action))| Step {
            index: index as u32,
            description,
            timeout_seconds,
            action,
        })
        .collect();
    let mut plan = Plan {
        id: String::new(),
        machine: input.facts.machine.clone(),
        cluster: input.facts.cluster.clone(),
        steps,
    };
    plan.id = plan_id(&plan);
    Ok(plan)
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The stable id: sha256 over the canonical JSON of machine, cluster and steps.
pub fn plan_id(plan: &Plan) -> String {
    let canonical = serde_json::json!({
        "machine": plan.machine,
        "cluster": plan.cluster,
        "steps": plan.steps,
    });
    crate::hex(&Sha256::digest(canonical.to_string().as_bytes()))
}

fn field(path: String, problem: &'static str) -> PlanError {
    PlanError::Field { path, problem }
}

fn string_list(value: Option<&Value>, path: &str) -> Result<Vec<String>, PlanError> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                item.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| field(format!("{path}[{i}]"), "is not a string"))
            })
            .collect(),
        Some(_) => Err(field(path.to_string(), "is not a list")),
    }
}

fn files(spec: &Value) -> Result<Vec<FileSpec>, PlanError> {
    let Some(items) = spec.get("files") else {
        return Ok(Vec::new());
    };
    let items = items
        .as_array()
        .ok_or_else(|| field("bootstrapConfig.spec.files".into(), "is not a list"))?;
    let mut files = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = |name: &str| format!("bootstrapConfig.spec.files[{i}].{name}");
        // Secret-sourced files were written at bootstrap; the updater does not manage them.
        if item.get("contentFrom").is_some_and(|v| !v.is_null()) {
            continue;
        }
        let path = item
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| field(at("path"), "is missing or not a string"))?;
        let content = match item.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(text)) => text.clone(),
            Some(_) => return Err(field(at("content"), "is not a string")),
        };
        let encoding = match item.get("encoding").and_then(Value::as_str) {
            None | Some("") => FileEncoding::None,
            Some("base64") => FileEncoding::Base64,
            Some("gzip") => FileEncoding::Gzip,
            Some("gzip+base64") => FileEncoding::GzipBase64,
            Some(_) => {
                return Err(field(
                    at("encoding"),
                    "is not one of base64, gzip, gzip+base64",
                ));
            }
        };
        files.push(FileSpec {
            path: path.to_string(),
            owner: item
                .get("owner")
                .and_then(Value::as_str)
                .map(str::to_string),
            permissions: item
                .get("permissions")
                .and_then(Value::as_str)
                .map(str::to_string),
            encoding,
            append: item.get("append").and_then(Value::as_bool).unwrap_or(false),
            content: SecretString::new(content),
        });
    }
    Ok(files)
}

fn ssh_users(spec: &Value) -> Result<Vec<SshUser>, PlanError> {
    let Some(items) = spec.get("users") else {
        return Ok(Vec::new());
    };
    let items = items
        .as_array()
        .ok_or_else(|| field("bootstrapConfig.spec.users".into(), "is not a list"))?;
    let mut users = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let name = item.get("name").and_then(Value::as_str).ok_or_else(|| {
            field(
                format!("bootstrapConfig.spec.users[{i}].name"),
                "is missing or not a string",
            )
        })?;
        if item.get("sshAuthorizedKeys").is_none() {
            continue;
        }
        let keys = string_list(
            item.get("sshAuthorizedKeys"),
            &format!("bootstrapConfig.spec.users[{i}].sshAuthorizedKeys"),
        )?;
        users.push(SshUser {
            name: name.to_string(),
            authorized_keys: keys.into_iter().map(SecretString::new).collect(),
        });
    }
    Ok(users)
}

/// kubelet flags of the configuration this node joined (or was initialised) with.
fn kubelet_args(spec: &Value) -> Result<Option<Vec<KubeletArg>>, PlanError> {
    let source = ["joinConfiguration", "initConfiguration"]
        .into_iter()
        .find_map(|config| {
            spec.pointer(&format!("/{config}/nodeRegistration/kubeletExtraArgs"))
                .map(|args| (config, args))
        });
    let Some((config, args)) = source else {
        return Ok(None);
    };
    let path = format!("bootstrapConfig.spec.{config}.nodeRegistration.kubeletExtraArgs");
    let items = args
        .as_array()
        .ok_or_else(|| field(path.clone(), "is not a list of {name, value}"))?;
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let name = item.get("name").and_then(Value::as_str);
        let value = item.get("value").and_then(Value::as_str);
        match (name, value) {
            (Some(name), Some(value)) => out.push(KubeletArg {
                name: name.to_string(),
                value: value.to_string(),
            }),
            _ => {
                return Err(field(
                    format!("{path}[{i}]"),
                    "needs string `name` and `value`",
                ));
            }
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod golden;
#[cfg(test)]
mod tests;

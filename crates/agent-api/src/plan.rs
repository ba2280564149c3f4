//! The plan: the declarative desired state of one node, as ordered steps.
//!
//! Every step is a desired state (files, keys, versions), never a shell command: the agent maps
//! each kind to a node-local driver and its own configured commands.

use serde::{Deserialize, Serialize};

use crate::SecretString;

/// A Cluster API Machine, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MachineRef {
    /// Namespace of the Machine.
    pub namespace: String,
    /// Name of the Machine.
    pub name: String,
}

impl MachineRef {
    /// Builds a reference.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Parses `namespace/name` (both parts non-empty, exactly one `/`).
    pub fn parse(text: &str) -> Option<Self> {
        let (namespace, name) = text.split_once('/')?;
        if namespace.is_empty() || name.is_empty() || name.contains('/') {
            return None;
        }
        Some(Self::new(namespace, name))
    }
}

impl std::fmt::Display for MachineRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The work for one Machine. Its `id` is a stable hash of the desired node state computed by the
/// server: the same desired state always has the same id, and the agent never runs a finished
/// step of an id twice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Stable id (hash of the desired state), at most [`crate::MAX_PLAN_ID_BYTES`] bytes.
    pub id: String,
    /// The Machine this plan is for.
    pub machine: MachineRef,
    /// Name of the Cluster (in `machine.namespace`) the Machine belongs to.
    pub cluster: String,
    /// Steps in execution order; `steps[i].index == i`.
    pub steps: Vec<Step>,
    /// Whether the Machine is a control-plane Machine: the agent then checks etcd and the other
    /// control-plane Nodes before every step whose kind disturbs the control plane
    /// ([`crate::StepKind::preflight`]). Absent (false) from servers before issue 30. Not part of the id (the
    /// id's Machine already says it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub control_plane: bool,
}

/// One step of a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// Position in the plan, from 0.
    pub index: u32,
    /// Operator-facing summary, e.g. `kubeadm upgrade node (v1.34.1)`.
    pub description: String,
    /// The agent stops the step (kills its process group) after this many seconds.
    pub timeout_seconds: u32,
    /// What the node must look like after the step.
    pub action: StepAction,
}

/// The kinds of step, as declarative desired states. JSON: an object with `"kind"` plus the
/// variant's fields, e.g. `{"kind": "installKubeadm", "version": "v1.34.1"}`. Each variant has its
/// row in the table of step kinds (`kinds.rs`, [`crate::StepKind`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum StepAction {
    /// The full set of files the updater manages on this node. Files a previous plan wrote that
    /// this set no longer holds are removed (after a backup).
    Files {
        /// Desired files, unique by `path`.
        files: Vec<FileSpec>,
    },
    /// `authorized_keys` of each listed user is rewritten to exactly these keys.
    #[serde(rename_all = "camelCase")]
    SshKeys {
        /// Users, unique by `name`.
        users: Vec<SshUser>,
    },
    /// Time service configuration.
    Ntp {
        /// NTP servers, in order.
        #[serde(default)]
        servers: Vec<String>,
        /// `Some(false)`: the updater's NTP configuration is removed. `None`/`Some(true)`: applied.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        enabled: Option<bool>,
    },
    /// The etcd static pod's image (`/etc/kubernetes/manifests/etcd.yaml`).
    #[serde(rename_all = "camelCase")]
    EtcdImage {
        /// New image tag, e.g. `3.5.21-0`.
        image_tag: String,
        /// New repository (`registry.k8s.io`); `None` keeps the manifest's current one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        image_repository: Option<String>,
    },
    /// The kubelet flags the updater manages in `KUBELET_KUBEADM_ARGS`
    /// (`/var/lib/kubelet/kubeadm-flags.env`). Flags a previous plan set and this list dropped are
    /// removed; flags nobody asked for (kubeadm's own) are kept.
    KubeletArgs {
        /// Desired flags, unique by `name` (without leading dashes).
        args: Vec<KubeletArg>,
    },
    /// Install the kubeadm binary/package of this version.
    InstallKubeadm {
        /// Kubernetes version, `v1.2.3` (see [`crate::is_valid_kubernetes_version`]).
        version: String,
    },
    /// Run the kubeadm upgrade for this node.
    KubeadmUpgrade {
        /// Kubernetes version, `v1.2.3`.
        version: String,
        /// `apply` on the first control-plane node to reach the version, `node` elsewhere.
        mode: KubeadmUpgradeMode,
    },
    /// Install kubelet and kubectl of this version and restart kubelet.
    InstallKubelet {
        /// Kubernetes version, `v1.2.3`.
        version: String,
    },
    /// Bring containerd, runc and the CNI plugins to the bundle the node's runtime matrix (agent config
    /// `runtime.matrix`) names for this Kubernetes version, with the node's configured install sequence; the
    /// versions are verified after. A node already on the bundle, or without a matrix, is left alone. The
    /// agent restarts containerd only when this plan drained the node before the step.
    #[serde(rename_all = "camelCase")]
    ContainerRuntime {
        /// The Kubernetes version the node is upgraded to, `v1.2.3`: its minor picks the bundle.
        kubernetes_version: String,
    },
    /// Cordon the node (the agent records first that this plan cordoned it) and evict its pods through
    /// the Eviction API (policy/v1), honouring PodDisruptionBudgets; DaemonSet and mirror pods stay. A
    /// drain that does not finish within the step's timeout fails naming the pods that blocked it, and
    /// the node stays cordoned (the operator decides).
    #[serde(rename_all = "camelCase")]
    DrainNode {
        /// Also evict pods with emptyDir volumes (their emptyDir data is lost). Otherwise such pods
        /// block the drain.
        #[serde(default)]
        delete_empty_dir_data: bool,
        /// Also evict pods no controller owns (nothing recreates them). Otherwise such pods block the
        /// drain.
        #[serde(default)]
        force_unmanaged: bool,
    },
    /// Wait until the Node is Ready and, when set, its kubelet reports this version (CAPI keeps the
    /// Machine `UpToDate=False` until it does).
    #[serde(rename_all = "camelCase")]
    WaitNodeReady {
        /// Kubernetes version, `v1.2.3`, the Node's `status.nodeInfo.kubeletVersion` must show.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kubelet_version: Option<String>,
    },
    /// Uncordon the node, only when a drainNode step of this plan cordoned it (a node an operator
    /// cordoned stays cordoned).
    UncordonNode,
    /// Reboot the node with its configured reboot command (`systemctl reboot` by default) and confirm the
    /// new boot by its boot id, then wait for the Node to be Ready. The agent records the boot id before
    /// the command: after its restart, the same boot id is not a reboot. A plan drains before it.
    Reboot {
        /// `always`, or `ifRequired`: only when the node says a reboot is required (Debian's
        /// `/var/run/reboot-required`, dnf's `needs-restarting -r`); otherwise the step succeeds saying so.
        when: RebootWhen,
    },
    /// Switch the node to an OS image with its configured image sequence (`osImage.apply`, the image as
    /// the `{{image}}` template value), reboot into it, and verify it with the configured OS-version
    /// command (`osImage.current`). A node whose OS already reports the image is left alone. A node that
    /// comes back on its previous image (an A/B fallback) fails the step: "booted the previous image".
    OsImage {
        /// The image, as the infrastructure machine's mapped field names it (a URL, an image
        /// reference, a template name), at most [`crate::MAX_OS_IMAGE_BYTES`] bytes, no control characters.
        image: String,
    },
    /// Any kind this build does not know (decoded from a newer server). The agent fails such a
    /// step with a clear message instead of refusing the whole plan.
    #[serde(other)]
    Unsupported,
}

impl StepAction {
    /// The wire name of the kind (`files`, `sshKeys`, …; `unsupported`): [`crate::StepKind::wire`].
    pub fn kind(&self) -> &'static str {
        self.step_kind().wire()
    }
}

/// `kubeadm upgrade apply` (first control-plane node) or `kubeadm upgrade node` (all others).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum KubeadmUpgradeMode {
    /// `kubeadm upgrade apply <version>`.
    Apply,
    /// `kubeadm upgrade node`.
    Node,
}

/// When a [`StepAction::Reboot`] reboots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RebootWhen {
    /// Always.
    Always,
    /// Only when the node says it needs one (after package steps).
    IfRequired,
}

/// One desired file, the same fields as a KubeadmConfig `files[]` entry (content resolved).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileSpec {
    /// Absolute path on the node.
    pub path: String,
    /// `user`, `user:group`, or numeric `uid:gid`; `None` means `root:root`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Octal mode, e.g. `"0644"`; `None` means `0644`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// How `content` is encoded.
    #[serde(default)]
    pub encoding: FileEncoding,
    /// Append `content` to the file instead of replacing it (skipped when the file already ends
    /// with it, so a re-run does not append twice).
    #[serde(default)]
    pub append: bool,
    /// The content (secret: never printed by `Debug`).
    pub content: SecretString,
}

/// Encoding of [`FileSpec::content`]: the KubeadmConfig names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileEncoding {
    /// Plain text.
    #[default]
    #[serde(rename = "none")]
    None,
    /// Standard base64 (padded).
    #[serde(rename = "base64")]
    Base64,
    /// The content's bytes are gzip data, as cloud-init reads it. (A JSON string rarely carries
    /// gzip bytes intact; KubeadmConfigs normally use `gzip+base64`.) The server passes the
    /// KubeadmConfig's content through unchanged.
    #[serde(rename = "gzip")]
    Gzip,
    /// Base64 of gzip bytes.
    #[serde(rename = "gzip+base64")]
    GzipBase64,
}

/// One user's SSH keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SshUser {
    /// Login name.
    pub name: String,
    /// The exact `authorized_keys` lines (never printed by `Debug`).
    #[serde(default)]
    pub authorized_keys: Vec<SecretString>,
}

/// One kubelet flag, `--name=value`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeletArg {
    /// Flag name without dashes, e.g. `max-pods`.
    pub name: String,
    /// Flag value.
    pub value: String,
}

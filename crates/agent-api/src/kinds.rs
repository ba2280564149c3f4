//! The one table of step kinds: each kind of [`StepAction`] once, with its wire name and the facts the
//! server needs about it. Everything else that lists step kinds derives from this table (the server's pace
//! and step metrics, the agent's driver registry) or is checked against it by the root crate's
//! `every_step_kind_is_wired` test (validator, driver, pace, metrics, openapi, shipped agent configs).
//!
//! A new kind is a `StepAction` variant (the wire shape, in `plan.rs`) plus one row here: the macro builds
//! [`StepKind`], [`StepKind::ALL`], the wire names, each kind's facts (guess, timeout, undo, preflight, disrupts) and
//! [`StepAction::step_kind`] from the rows, and a variant without a row does not compile.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::StepAction;

/// What a rollback does with a finished step of a kind (issue 28): the column `undo` of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Undo {
    /// Its effects are undone: the node is put back as it was before the step (files restored, packages
    /// reinstalled at the versions found before, services restarted again).
    Restores,
    /// A point of no return: a success of it is not undone, and a rollback stops at it (it changed the control
    /// plane, which Kubernetes does not downgrade). The steps after it are undone back to the state right
    /// after it. A step of it the agent passed over (the node already ran its target) crossed nothing: the
    /// rollback goes on past it.
    NoReturn,
    /// It leaves nothing to undo (waiting, or the drain's cordon, which the rollback lifts last and only
    /// after the node is verified).
    Nothing,
}

/// What a step of a kind this build does not know is guessed to take, in seconds.
pub const UNSUPPORTED_GUESS_SECONDS: u32 = 10;

macro_rules! step_kinds {
    ($( $(#[$doc:meta])* $kind:ident = $wire:literal, guess_seconds: $guess:literal, timeout_seconds: $timeout:expr, undo: $undo:ident, preflight: $preflight:literal, disrupts: $disrupts:literal; )+) => {
        /// A kind of step: the `kind` tag of a [`StepAction`], as a small `Copy` value.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub enum StepKind {
            $( $(#[$doc])* $kind, )+
            /// A kind this build does not know (decoded from a newer peer, or a record without kinds).
            #[default]
            Unsupported,
        }

        /// How many kinds this build knows.
        const KNOWN: usize = [$($wire),+].len();

        impl StepKind {
            /// Every kind this build knows, in table order ([`StepKind::Unsupported`] is not one).
            pub const ALL: [StepKind; KNOWN] = [$(StepKind::$kind),+];

            /// The kind's wire name, the `kind` tag of its [`StepAction`] (`files`, `sshKeys`, …);
            /// `unsupported` for [`StepKind::Unsupported`].
            pub const fn wire(self) -> &'static str {
                match self {
                    $( StepKind::$kind => $wire, )+
                    StepKind::Unsupported => "unsupported",
                }
            }

            /// What a rollback does with a finished step of this kind ([`Undo`]).
            pub const fn undo(self) -> Undo {
                match self {
                    $( StepKind::$kind => Undo::$undo, )+
                    StepKind::Unsupported => Undo::Nothing,
                }
            }

            /// Whether a step of this kind disturbs the control plane when run on a control-plane node
            /// (it reboots, restarts kubelet or changes a static pod): the agent then runs the
            /// control-plane preflight first (etcd healthy with quorum without this member, every other
            /// control-plane Node Ready).
            pub const fn preflight(self) -> bool {
                match self {
                    $( StepKind::$kind => $preflight, )+
                    StepKind::Unsupported => false,
                }
            }

            /// Whether the node may be unhealthy to Kubernetes while a step of this kind runs (it drains the node,
            /// restarts kubelet or the container runtime, reboots, or waits for the node to come back): the
            /// server keeps CAPI's `cluster.x-k8s.io/skip-remediation` guard on the Machine through such steps,
            /// so a MachineHealthCheck does not replace it mid-update.
            pub const fn disrupts(self) -> bool {
                match self {
                    $( StepKind::$kind => $disrupts, )+
                    StepKind::Unsupported => false,
                }
            }

            /// What a step of this kind typically takes on a node, in seconds: the server's adaptive
            /// `retryAfterSeconds` starts from it before it has seen steps of the kind finish.
            pub const fn guess_seconds(self) -> u32 {
                match self {
                    $( StepKind::$kind => $guess, )+
                    StepKind::Unsupported => UNSUPPORTED_GUESS_SECONDS,
                }
            }

            /// The timeout the server gives a step of this kind (a `drainNode` step's is the default, which the
            /// Machine's node drain timeout replaces); [`crate::DEFAULT_STEP_TIMEOUT_SECONDS`] for
            /// [`StepKind::Unsupported`]. A bound: docs/operations.md's Bounds table gives each.
            pub const fn timeout_seconds(self) -> u32 {
                match self {
                    $( StepKind::$kind => $timeout, )+
                    StepKind::Unsupported => crate::DEFAULT_STEP_TIMEOUT_SECONDS,
                }
            }
        }

        impl StepAction {
            /// The action's kind.
            pub fn step_kind(&self) -> StepKind {
                match self {
                    $( StepAction::$kind { .. } => StepKind::$kind, )+
                    StepAction::Unsupported => StepKind::Unsupported,
                }
            }
        }
    };
}

step_kinds! {
    /// `files`: the full set of files the updater manages.
    Files = "files", guess_seconds: 1, timeout_seconds: 60, undo: Restores, preflight: false, disrupts: false;
    /// `sshKeys`: each listed user's `authorized_keys`.
    SshKeys = "sshKeys", guess_seconds: 1, timeout_seconds: 60, undo: Restores, preflight: false, disrupts: false;
    /// `ntp`: the time service's drop-in, then its restart.
    Ntp = "ntp", guess_seconds: 3, timeout_seconds: 120, undo: Restores, preflight: false, disrupts: false;
    /// `etcdImage`: the etcd static pod's image.
    EtcdImage = "etcdImage", guess_seconds: 20, timeout_seconds: 120, undo: Restores, preflight: true, disrupts: false;
    /// `kubeletArgs`: the managed kubelet flags, then a kubelet restart.
    KubeletArgs = "kubeletArgs", guess_seconds: 20, timeout_seconds: 120, undo: Restores, preflight: true, disrupts: true;
    /// `installKubeadm`: the node's configured sequence installing kubeadm.
    InstallKubeadm = "installKubeadm", guess_seconds: 30, timeout_seconds: 600, undo: Restores, preflight: false, disrupts: false;
    /// `kubeadmUpgrade`: `kubeadm upgrade apply` or `node`, as configured.
    KubeadmUpgrade = "kubeadmUpgrade", guess_seconds: 90, timeout_seconds: 1800, undo: NoReturn, preflight: true, disrupts: true;
    /// `installKubelet`: the node's configured sequence installing kubelet and kubectl.
    InstallKubelet = "installKubelet", guess_seconds: 30, timeout_seconds: 600, undo: Restores, preflight: true, disrupts: true;
    /// `drainNode`: cordon and evict through the Kubernetes API.
    DrainNode = "drainNode", guess_seconds: 60, timeout_seconds: 600, undo: Nothing, preflight: false, disrupts: true;
    /// `waitNodeReady`: the Node Ready (at a kubelet version).
    WaitNodeReady = "waitNodeReady", guess_seconds: 20, timeout_seconds: 300, undo: Nothing, preflight: false, disrupts: true;
    /// `uncordonNode`: undo this plan's cordon.
    UncordonNode = "uncordonNode", guess_seconds: 1, timeout_seconds: 120, undo: Nothing, preflight: false, disrupts: false;
    /// `reboot`: reboot the node (always, or only when it says one is required), confirmed by a new boot id.
    Reboot = "reboot", guess_seconds: 180, timeout_seconds: 1800, undo: Nothing, preflight: true, disrupts: true;
    /// `osImage`: switch to an OS image, reboot into it, verify it.
    OsImage = "osImage", guess_seconds: 600, timeout_seconds: crate::MAX_STEP_TIMEOUT_SECONDS, undo: Restores, preflight: true, disrupts: true;
    /// `containerRuntime`: containerd, runc and the CNI plugins of the node's matrix bundle for a Kubernetes
    /// version, containerd restarted, the versions verified.
    ContainerRuntime = "containerRuntime", guess_seconds: 60, timeout_seconds: 900, undo: Restores, preflight: true, disrupts: true;
}

impl StepKind {
    /// Whether a step of this kind reboots the node (its agent goes silent while the machine restarts).
    pub const fn reboots(self) -> bool {
        matches!(self, StepKind::Reboot | StepKind::OsImage)
    }

    /// How many slots a table with one entry per kind, [`StepKind::Unsupported`] included, needs.
    pub const SLOTS: usize = KNOWN + 1;

    /// The kind's slot in a per-kind table: `0..StepKind::SLOTS`, in table order,
    /// [`StepKind::Unsupported`] last.
    pub const fn index(self) -> usize {
        // Declaration order is table order, with `Unsupported` declared last.
        self as usize
    }

    /// The kind of a wire name; names this build does not know are [`StepKind::Unsupported`].
    pub fn of_wire(name: &str) -> StepKind {
        Self::ALL
            .into_iter()
            .find(|kind| kind.wire() == name)
            .unwrap_or(StepKind::Unsupported)
    }
}

impl fmt::Display for StepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.wire())
    }
}

impl Serialize for StepKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.wire())
    }
}

/// A wire name: known names are their kind, any other string is [`StepKind::Unsupported`].
impl<'de> Deserialize<'de> for StepKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct WireName;
        impl Visitor<'_> for WireName {
            type Value = StepKind;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a step kind name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<StepKind, E> {
                Ok(StepKind::of_wire(name))
            }
        }
        deserializer.deserialize_str(WireName)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn wire_names_are_unique_and_name_their_variant() {
        for (i, kind) in StepKind::ALL.into_iter().enumerate() {
            assert_eq!(kind.index(), i);
            assert_eq!(StepKind::of_wire(kind.wire()), kind);
            assert!(kind.guess_seconds() > 0, "{kind}");
            let bounds = crate::MIN_STEP_TIMEOUT_SECONDS..=crate::MAX_STEP_TIMEOUT_SECONDS;
            assert!(bounds.contains(&kind.timeout_seconds()), "{kind}");
            // A name no variant carries decodes as `Unsupported`; a real one as its variant, or fails
            // on the variant's missing fields.
            match serde_json::from_value::<StepAction>(serde_json::json!({"kind": kind.wire()})) {
                Ok(action) => assert_eq!(action.step_kind(), kind),
                Err(e) => assert!(e.to_string().contains("missing field"), "{kind}: {e}"),
            }
        }
        assert_eq!(StepKind::Unsupported.index(), StepKind::SLOTS - 1);
        assert_eq!(StepKind::of_wire("someFutureKind"), StepKind::Unsupported);
        assert_eq!(StepAction::Unsupported.step_kind(), StepKind::Unsupported);
    }

    #[test]
    fn kinds_decode_from_their_wire_names() {
        let decoded: StepKind = serde_json::from_str("\"waitNodeReady\"").unwrap();
        assert_eq!(decoded, StepKind::WaitNodeReady);
        let decoded: StepKind = serde_json::from_str("\"somethingNew\"").unwrap();
        assert_eq!(decoded, StepKind::Unsupported);
        assert_eq!(
            serde_json::to_string(&StepKind::KubeletArgs).unwrap(),
            "\"kubeletArgs\""
        );
        assert!(serde_json::from_str::<StepKind>("3").is_err());
    }
}

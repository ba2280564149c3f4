//! Which change a run is: what the desired state moves, the same wherever the same change is asked of another
//! Machine in any cluster — the target Kubernetes version (when it moves), the OS image (when it moves) and the
//! other actions by name. A file or flag change is named by its action, not its contents, so two different file
//! changes asked at the same time share one change (docs/operations.md says so). Pure.

use inplace_agent_api::{Plan, StepAction};
use inplace_core::Action;
use inplace_core::drain::{NodeChange, VersionChange};
use sha2::{Digest as _, Sha256};

use crate::hex;

/// Hex digits of a change id (96 bits: no two changes of one fleet meet).
pub const CHANGE_ID_HEX: usize = 24;

/// A change: its id (a store key segment) and what it moves, for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeId {
    /// Hex digest of the label.
    pub id: String,
    /// `v1.34.1+os-image:node-os:2.0+files`.
    pub label: String,
}

impl ChangeId {
    /// The change `plan` makes under `change` for a Machine asked to run Kubernetes `version`.
    pub fn of(change: &NodeChange, version: Option<&str>, plan: &Plan) -> ChangeId {
        let mut parts = Vec::new();
        for action in &change.actions {
            match action {
                Action::KubernetesVersion => {
                    if change.version != VersionChange::None
                        && let Some(version) = version
                    {
                        parts.push(version.to_owned());
                    }
                }
                Action::OsImage => {
                    let image = plan.steps.iter().find_map(|step| match &step.action {
                        StepAction::OsImage { image } => Some(image.as_str()),
                        _ => None,
                    });
                    if let Some(image) = image {
                        parts.push(format!("{action}:{image}"));
                    }
                }
                other => parts.push(other.as_str().to_owned()),
            }
        }
        ChangeId::from_label(if parts.is_empty() {
            "no-change".to_owned()
        } else {
            parts.join("+")
        })
    }

    /// The change a label names (the id is the label's digest).
    pub fn from_label(label: String) -> ChangeId {
        let digest = Sha256::digest(label.as_bytes());
        let mut id = hex(&digest);
        id.truncate(CHANGE_ID_HEX);
        ChangeId { id, label }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inplace_agent_api::{MachineRef, Step};

    fn plan(image: Option<&str>) -> Plan {
        let mut steps = Vec::new();
        if let Some(image) = image {
            steps.push(Step {
                index: 0,
                description: "os image".into(),
                timeout_seconds: 60,
                action: StepAction::OsImage {
                    image: image.to_owned(),
                },
            });
        }
        Plan {
            id: "p".into(),
            machine: MachineRef {
                namespace: "default".into(),
                name: "m".into(),
            },
            cluster: "c".into(),
            steps,
            control_plane: false,
        }
    }

    fn change(version: VersionChange, actions: &[Action]) -> NodeChange {
        NodeChange {
            version,
            actions: actions.iter().copied().collect(),
        }
    }

    #[test]
    fn the_same_moves_are_the_same_change_on_any_machine() {
        let a = ChangeId::of(
            &change(
                VersionChange::Minor,
                &[Action::KubernetesVersion, Action::OsImage],
            ),
            Some("v1.34.1"),
            &plan(Some("node-os:2.0")),
        );
        assert_eq!(a.label, "v1.34.1+os-image:node-os:2.0");
        assert_eq!(a.id.len(), CHANGE_ID_HEX);
        let mut other = plan(Some("node-os:2.0"));
        other.machine.name = "another".into();
        other.id = "q".into();
        let b = ChangeId::of(
            &change(
                VersionChange::Minor,
                &[Action::KubernetesVersion, Action::OsImage],
            ),
            Some("v1.34.1"),
            &other,
        );
        assert_eq!(a, b);
    }

    #[test]
    fn another_target_is_another_change() {
        let to = |v: &str, image: &str| {
            ChangeId::of(
                &change(
                    VersionChange::Patch,
                    &[Action::KubernetesVersion, Action::OsImage],
                ),
                Some(v),
                &plan(Some(image)),
            )
            .id
        };
        assert_ne!(to("v1.34.1", "os:2"), to("v1.34.2", "os:2"));
        assert_ne!(to("v1.34.1", "os:2"), to("v1.34.1", "os:3"));
        let files = ChangeId::of(
            &change(VersionChange::None, &[Action::Files]),
            None,
            &plan(None),
        );
        assert_eq!(files.label, "files");
        let unmoved = ChangeId::of(
            &change(
                VersionChange::None,
                &[Action::KubernetesVersion, Action::Files],
            ),
            Some("v1.34.1"),
            &plan(None),
        );
        assert_eq!(
            unmoved.label, "files",
            "a version that does not move is no part of the change"
        );
    }
}

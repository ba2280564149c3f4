//! The step builders: one per action (or per step a setting turns on), listed once in [`BUILDERS`], in plan
//! order. Each reads what it needs from the [`Context`] and returns its steps; [`super::build`] runs them in
//! turn and puts the node steps of a drain around what they built. A step's timeout is its kind's row in the
//! step-kind table ([`inplace_agent_api::StepKind::timeout_seconds`]).

pub(super) mod builder;
mod etcd_image;
mod files;
mod kubelet_args;
mod kubernetes_version;
mod ntp;
mod os_image;
mod ssh_keys;

use builder::StepBuilder;

/// The step builders, in plan order: node-local config first, the OS (a Kubernetes upgrade then lands on the
/// new image), the Kubernetes upgrade, then what the upgrade would overwrite (the etcd image, kubelet flags).
pub(super) const BUILDERS: &[StepBuilder] = &[
    files::BUILDER,
    ssh_keys::BUILDER,
    ntp::BUILDER,
    os_image::BUILDER,
    kubernetes_version::BUILDER,
    etcd_image::BUILDER,
    kubelet_args::BUILDER,
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use inplace_agent_api::StepKind;

    use super::*;
    use crate::Action;

    /// The kinds [`super::super::build`] puts around the builders' steps when the node is drained.
    const NODE_KINDS: [StepKind; 3] = [
        StepKind::DrainNode,
        StepKind::WaitNodeReady,
        StepKind::UncordonNode,
    ];

    #[test]
    fn every_action_has_one_builder_and_every_kind_one_place() {
        for action in Action::ALL {
            let builders = BUILDERS.iter().filter(|b| b.action == Some(action)).count();
            assert_eq!(builders, 1, "{action}: {builders} step builders");
        }
        let mut places: BTreeMap<StepKind, usize> = BTreeMap::new();
        let built = BUILDERS.iter().flat_map(|b| b.kinds.iter());
        for kind in built.chain(NODE_KINDS.iter()) {
            *places.entry(*kind).or_default() += 1;
        }
        for kind in StepKind::ALL {
            assert_eq!(
                places.get(&kind),
                Some(&1),
                "step kind {kind}: no builder or node step builds it, or more than one"
            );
        }
    }
}

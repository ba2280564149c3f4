//! The `etcd-image` action: on a control-plane node, one `etcdImage` step with the local etcd's image tag
//! (and repository) of the bootstrap config's cluster configuration.

use inplace_agent_api::{StepAction, StepKind};

use super::builder::{Context, Draft, StepBuilder};
use crate::Action;
use crate::plan::error::PlanError;

/// The builder of the `etcd-image` action.
pub(crate) const BUILDER: StepBuilder = StepBuilder {
    action: Some(Action::EtcdImage),
    reads_bootstrap: true,
    kinds: &[StepKind::EtcdImage],
    build,
};

fn build(cx: &Context<'_>) -> Result<Vec<Draft>, PlanError> {
    let (true, Some(spec)) = (cx.input.facts.control_plane, cx.spec) else {
        return Ok(Vec::new());
    };
    let local = (spec.cluster_configuration.as_ref())
        .and_then(|c| c.etcd.as_ref())
        .and_then(|e| e.local.as_ref());
    let Some((local, tag)) = local.and_then(|l| Some((l, l.image_tag.as_ref()?))) else {
        return Ok(Vec::new());
    };
    Ok(vec![Draft::new(
        format!("etcd image tag {tag}"),
        StepAction::EtcdImage {
            image_tag: tag.clone(),
            image_repository: local.image_repository.clone(),
        },
    )])
}

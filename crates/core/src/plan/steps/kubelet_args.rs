//! The `kubelet-args` action: one `kubeletArgs` step with the kubelet flags of the configuration this node
//! joined (or was initialised) with.

use inplace_agent_api::{KubeletArg, StepAction, StepKind};

use super::builder::{Context, Draft, StepBuilder};
use crate::Action;
use crate::plan::error::PlanError;
use crate::plan::view::KubeadmConfigSpec;

/// The builder of the `kubelet-args` action.
pub(crate) const BUILDER: StepBuilder = StepBuilder {
    action: Some(Action::KubeletArgs),
    reads_bootstrap: true,
    kinds: &[StepKind::KubeletArgs],
    build,
};

fn build(cx: &Context<'_>) -> Result<Vec<Draft>, PlanError> {
    let Some(args) = cx.spec.and_then(kubelet_args) else {
        return Ok(Vec::new());
    };
    let names: Vec<&str> = args.iter().map(|a| a.name.as_str()).collect();
    let text = format!("kubelet flags: {}", names.join(", "));
    Ok(vec![Draft::new(text, StepAction::KubeletArgs { args })])
}

/// kubelet flags of the configuration this node joined (or was initialised) with.
fn kubelet_args(spec: &KubeadmConfigSpec) -> Option<Vec<KubeletArg>> {
    let args = [&spec.join_configuration, &spec.init_configuration]
        .into_iter()
        .find_map(|config| {
            config
                .as_ref()?
                .node_registration
                .as_ref()?
                .kubelet_extra_args
                .as_ref()
        })?;
    let args = args.iter().map(|arg| KubeletArg {
        name: arg.name.clone(),
        value: arg.value.clone(),
    });
    Some(args.collect())
}

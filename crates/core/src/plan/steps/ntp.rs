//! The `ntp` action: one `ntp` step with the bootstrap config's time servers.

use inplace_agent_api::{StepAction, StepKind};

use super::builder::{Context, Draft, StepBuilder};
use crate::Action;
use crate::plan::error::PlanError;

/// The builder of the `ntp` action.
pub(crate) const BUILDER: StepBuilder = StepBuilder {
    action: Some(Action::Ntp),
    reads_bootstrap: true,
    kinds: &[StepKind::Ntp],
    build,
};

fn build(cx: &Context<'_>) -> Result<Vec<Draft>, PlanError> {
    let Some(ntp) = cx.spec.and_then(|s| s.ntp.as_ref()) else {
        return Ok(Vec::new());
    };
    let servers = ntp.servers.clone().unwrap_or_default();
    let text = format!("time servers: {}", servers.join(", "));
    let enabled = ntp.enabled;
    Ok(vec![Draft::new(text, StepAction::Ntp { servers, enabled })])
}

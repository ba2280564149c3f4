//! The `os-image` action: one `osImage` step with the image the desired infrastructure machine names at the
//! policy's field, when the field is set.

use inplace_agent_api::{StepAction, StepKind};

use super::builder::{Context, Draft, StepBuilder};
use crate::Action;
use crate::plan::error::PlanError;

/// The builder of the `os-image` action.
pub(crate) const BUILDER: StepBuilder = StepBuilder {
    action: Some(Action::OsImage),
    reads_bootstrap: false,
    kinds: &[StepKind::OsImage],
    build,
};

fn build(cx: &Context<'_>) -> Result<Vec<Draft>, PlanError> {
    let (Some(field), Some(text)) = (cx.input.inputs.os_image.as_ref(), cx.input.infra) else {
        return Ok(Vec::new());
    };
    let problem = |problem: String| PlanError::Field {
        path: format!("infrastructureMachine.{}", field.as_str()),
        problem,
    };
    let object: serde_json::Value = crate::decode::decode_json(text.as_bytes())
        .map_err(|e| problem(format!("the object is not JSON: {e}")))?;
    let Some(image) = field.read(&object).map_err(problem)? else {
        return Ok(Vec::new());
    };
    Ok(vec![Draft::new(
        format!("OS image {image}, reboot into it, verify it"),
        StepAction::OsImage { image },
    )])
}

//! The OpenAPI document of this build: `openapi/openapi.yaml` with the step kinds of the one table
//! (`inplace_agent_api::StepKind`) filled in where the file marks them, so a new kind needs no edit there.
//! `inplace-updater openapi` prints it; schemathesis (`.ci/run`) and `tests/integration/openapi.rs` check the
//! server against it.

use inplace_agent_api::StepKind;

/// The document as the repository keeps it.
pub const SOURCE: &str = include_str!("../openapi/openapi.yaml");

/// The line that stands where the step kinds' `enum` goes (its indentation kept).
pub const STEP_KINDS_MARKER: &str = "x-enum: step-kinds";

/// [`SOURCE`] with every [`STEP_KINDS_MARKER`] line replaced by an `enum` of the step kinds' wire names, in
/// table order.
pub fn document() -> String {
    let kinds: Vec<&str> = StepKind::ALL.iter().map(|kind| kind.wire()).collect();
    let list = format!("enum: [{}]", kinds.join(", "));
    let mut out = String::with_capacity(SOURCE.len() + list.len());
    for line in SOURCE.split_inclusive('\n') {
        match line.trim_end().strip_suffix(STEP_KINDS_MARKER) {
            Some(indent) if indent.trim().is_empty() => {
                out.push_str(indent);
                out.push_str(&list);
                out.push('\n');
            }
            _ => out.push_str(line),
        }
    }
    out
}

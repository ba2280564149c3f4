//! The `files` action: one `files` step with every file of the bootstrap config's `spec.files` the updater
//! manages.

use inplace_agent_api::{FileEncoding, FileSpec, SecretString, StepAction, StepKind};

use super::builder::{Context, Draft, StepBuilder};
use crate::Action;
use crate::plan::error::PlanError;
use crate::plan::view::KubeadmConfigSpec;

/// The builder of the `files` action.
pub(crate) const BUILDER: StepBuilder = StepBuilder {
    action: Some(Action::Files),
    reads_bootstrap: true,
    kinds: &[StepKind::Files],
    build,
};

fn build(cx: &Context<'_>) -> Result<Vec<Draft>, PlanError> {
    let Some(spec) = cx.spec else {
        return Ok(Vec::new());
    };
    let files = files(spec)?;
    if files.is_empty() {
        return Ok(Vec::new());
    }
    let plural = if files.len() == 1 { "" } else { "s" };
    let text = format!("write {} file{plural}", files.len());
    Ok(vec![Draft::new(text, StepAction::Files { files })])
}

fn files(spec: &KubeadmConfigSpec) -> Result<Vec<FileSpec>, PlanError> {
    let mut files = Vec::new();
    for (i, item) in spec.files.iter().flatten().enumerate() {
        // Secret-sourced files were written at bootstrap; the updater does not manage them.
        if item.content_from.is_some() {
            continue;
        }
        let path = item.path.clone().ok_or_else(|| PlanError::Field {
            path: format!("bootstrapConfig.spec.files[{i}].path"),
            problem: "is missing".into(),
        })?;
        files.push(FileSpec {
            path,
            owner: item.owner.clone(),
            permissions: item.permissions.clone(),
            encoding: item.encoding.map_or(FileEncoding::None, |e| e.0),
            append: item.append.unwrap_or(false),
            content: item
                .content
                .clone()
                .unwrap_or_else(|| SecretString::new("")),
        });
    }
    Ok(files)
}

//! The `ssh-keys` action: one `sshKeys` step with the authorized keys of each user the bootstrap config sets
//! them for.

use inplace_agent_api::{SshUser, StepAction, StepKind};

use super::builder::{Context, Draft, StepBuilder};
use crate::Action;
use crate::plan::error::PlanError;
use crate::plan::view::KubeadmConfigSpec;

/// The builder of the `ssh-keys` action.
pub(crate) const BUILDER: StepBuilder = StepBuilder {
    action: Some(Action::SshKeys),
    reads_bootstrap: true,
    kinds: &[StepKind::SshKeys],
    build,
};

fn build(cx: &Context<'_>) -> Result<Vec<Draft>, PlanError> {
    let users = cx.spec.map(ssh_users).unwrap_or_default();
    if users.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = users.iter().map(|u| u.name.as_str()).collect();
    let text = format!("authorized SSH keys of {}", names.join(", "));
    Ok(vec![Draft::new(text, StepAction::SshKeys { users })])
}

/// Users whose keys the config sets; a user without `sshAuthorizedKeys` is left alone.
fn ssh_users(spec: &KubeadmConfigSpec) -> Vec<SshUser> {
    let users = spec.users.iter().flatten();
    users
        .filter_map(|user| {
            Some(SshUser {
                name: user.name.clone(),
                authorized_keys: user.ssh_authorized_keys.clone()?,
            })
        })
        .collect()
}

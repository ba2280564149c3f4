//! The `sshKeys` driver: each listed user's `authorized_keys` becomes exactly the given keys.
//!
//! The home directory comes from `<root>/etc/passwd`, else `/home/<name>`. The file is 0600 in a
//! 0700 `.ssh`, both owned by the user when the agent runs as root and the user exists. A `.ssh`
//! the agent creates appears with its mode and owner already set (temp dir, then rename), so an
//! interrupted run never leaves one that a re-run would take as done. The agent
//! never creates accounts: for a user missing from passwd (sandboxes, or a user a later boot
//! creates) the keys are still written, owned by the agent, and the report says so. Users a
//! previous plan listed and this one dropped are left alone: the agent cannot tell their keys
//! from keys someone else manages.

use std::sync::Arc;

use inplace_agent_api::{SshUser, StepAction, StepKind};

use super::driver::{Driver, StepFuture, blocking_step, wrong_kind};
use super::error::DriverError;
use super::step::StepContext;
use super::undo::Place;
use crate::fsutil::{FileMeta, atomic_write, create_dir_atomic, matches};
use crate::os::driver_env::DriverEnv;
use crate::os::users::{PasswdEntry, lookup_user};

/// Mode of `authorized_keys`.
const KEYS_MODE: u32 = 0o600;
/// Mode of `~/.ssh`.
const SSH_DIR_MODE: u32 = 0o700;

/// The `sshKeys` driver.
pub(crate) struct SshKeys;

impl Driver for SshKeys {
    fn kind(&self) -> StepKind {
        StepKind::SshKeys
    }

    fn run(&self, env: Arc<DriverEnv>, ctx: StepContext) -> StepFuture {
        let StepAction::SshKeys { users } = ctx.step.action.clone() else {
            return wrong_kind(self.kind(), &ctx.step.action);
        };
        blocking_step(env, ctx, move |env, plan_id| apply(env, plan_id, &users))
    }

    fn undo_places(
        &self,
        env: &DriverEnv,
        action: &StepAction,
    ) -> Result<Option<Vec<Place>>, DriverError> {
        let StepAction::SshKeys { users } = action else {
            return Ok(None);
        };
        let mut places = Vec::with_capacity(users.len());
        for user in users {
            places.push(Place::Node(keys_path(env, &user.name)?.1));
        }
        Ok(Some(places))
    }
}

/// The user's passwd entry (if any) and the node path of their `authorized_keys`.
fn keys_path(env: &DriverEnv, name: &str) -> Result<(Option<PasswdEntry>, String), DriverError> {
    let entry = lookup_user(&env.fs, name)?;
    let home = entry
        .as_ref()
        .map_or_else(|| format!("/home/{name}"), |e| e.home.clone());
    let keys = format!("{}/.ssh/authorized_keys", home.trim_end_matches('/'));
    Ok((entry, keys))
}

/// Converges every listed user's keys; returns a summary.
fn apply(env: &DriverEnv, plan_id: &str, users: &[SshUser]) -> Result<String, DriverError> {
    let (mut written, mut unchanged) = (0usize, 0usize);
    let mut unknown = Vec::new();
    for user in users {
        let (entry, keys_node) = keys_path(env, &user.name)?;
        if entry.is_none() {
            unknown.push(user.name.clone());
        }
        let owner = entry
            .as_ref()
            .filter(|_| env.is_root)
            .map(|e| (e.uid, e.gid));
        let keys_path = env.fs.path(&keys_node)?;
        let ssh_dir = keys_path
            .parent()
            .ok_or_else(|| DriverError::refused(format!("{keys_node} has no directory")))?
            .to_path_buf();

        let mut content = String::new();
        for key in &user.authorized_keys {
            content.push_str(key.expose().trim());
            content.push('\n');
        }
        let meta = FileMeta {
            mode: KEYS_MODE,
            owner,
        };
        if !ssh_dir.exists() {
            create_dir_atomic(&ssh_dir, SSH_DIR_MODE, owner)?;
        }
        if matches(&keys_path, content.as_bytes(), meta)? {
            unchanged += 1;
            continue;
        }
        env.backups.save(plan_id, &keys_node, &keys_path)?;
        atomic_write(&keys_path, content.as_bytes(), meta)?;
        written += 1;
    }
    let mut summary = format!(
        "{} users: {written} written, {unchanged} unchanged",
        users.len()
    );
    if !unknown.is_empty() {
        summary.push_str(&format!(
            "; not in /etc/passwd (keys written, owned by the agent): {}",
            unknown.join(", ")
        ));
    }
    Ok(summary)
}

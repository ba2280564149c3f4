//! The `sshKeys` driver: each listed user's `authorized_keys` becomes exactly the given keys.
//!
//! The home directory comes from `<root>/etc/passwd`, else `/home/<name>`. The file is 0600 in a
//! 0700 `.ssh`, both owned by the user when the agent runs as root and the user exists. The agent
//! never creates accounts: for a user missing from passwd (sandboxes, or a user a later boot
//! creates) the keys are still written, owned by the agent, and the report says so. Users a
//! previous plan listed and this one dropped are left alone: the agent cannot tell their keys
//! from keys someone else manages.

use inplace_agent_api::SshUser;

use super::DriverEnv;
use crate::fsutil::{FileMeta, atomic_write, create_dirs, lookup_user, matches};

/// Mode of `authorized_keys`.
const KEYS_MODE: u32 = 0o600;
/// Mode of `~/.ssh`.
const SSH_DIR_MODE: u32 = 0o700;

/// Converges every listed user's keys; returns a summary.
pub(crate) fn apply(env: &DriverEnv, plan_id: &str, users: &[SshUser]) -> Result<String, String> {
    let (mut written, mut unchanged) = (0usize, 0usize);
    let mut unknown = Vec::new();
    for user in users {
        let entry = lookup_user(&env.fs, &user.name)?;
        let home = entry
            .as_ref()
            .map_or_else(|| format!("/home/{}", user.name), |e| e.home.clone());
        if entry.is_none() {
            unknown.push(user.name.clone());
        }
        let owner = entry
            .as_ref()
            .filter(|_| env.is_root)
            .map(|e| (e.uid, e.gid));
        let ssh_dir_node = format!("{}/.ssh", home.trim_end_matches('/'));
        let keys_node = format!("{ssh_dir_node}/authorized_keys");
        let ssh_dir = env.fs.path(&ssh_dir_node)?;
        let keys_path = env.fs.path(&keys_node)?;

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
            create_dirs(&ssh_dir).map_err(|e| e.to_string())?;
            std::fs::set_permissions(
                &ssh_dir,
                std::os::unix::fs::PermissionsExt::from_mode(SSH_DIR_MODE),
            )
            .map_err(|e| format!("chmod {}: {e}", ssh_dir.display()))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&ssh_dir, Some(uid), Some(gid))
                    .map_err(|e| format!("chown {}: {e}", ssh_dir.display()))?;
            }
        }
        if matches(&keys_path, content.as_bytes(), meta).map_err(|e| e.to_string())? {
            unchanged += 1;
            continue;
        }
        env.backups
            .save(plan_id, &keys_node, &keys_path)
            .map_err(|e| e.to_string())?;
        atomic_write(&keys_path, content.as_bytes(), meta).map_err(|e| e.to_string())?;
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

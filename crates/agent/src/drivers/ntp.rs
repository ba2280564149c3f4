//! The `ntp` driver: writes the agent's own drop-in for the configured time service (chrony or
//! systemd-timesyncd) and leaves the distribution's main config alone. `enabled: false`, or no
//! servers, removes the drop-in so the distribution's defaults apply again. The caller restarts
//! the service when the drop-in changed, or changed earlier without a restart since.

use super::DriverEnv;
use crate::driver_config::NtpFlavor;
use crate::fsutil::{FileMeta, atomic_write, matches, remove_file};

/// Mode of the drop-in.
const DROP_IN_MODE: u32 = 0o644;

/// The drop-in's content for these servers.
pub(crate) fn render(flavor: NtpFlavor, servers: &[String]) -> String {
    let header =
        "# Managed by inplace-updater (from the Machine's KubeadmConfig ntp): do not edit.\n";
    match flavor {
        NtpFlavor::Chrony => {
            let lines: String = servers
                .iter()
                .map(|s| format!("server {s} iburst\n"))
                .collect();
            format!("{header}{lines}")
        }
        NtpFlavor::Timesyncd => format!("{header}[Time]\nNTP={}\n", servers.join(" ")),
    }
}

/// Converges the drop-in; returns (changed, summary). `before_change` runs right before the
/// drop-in is written or removed (it records that a restart is owed).
pub(crate) fn write(
    env: &DriverEnv,
    plan_id: &str,
    servers: &[String],
    enabled: Option<bool>,
    before_change: impl FnOnce() -> Result<(), String>,
) -> Result<(bool, String), String> {
    let node_path = env.config.ntp.config_file();
    let path = env.fs.path(&node_path)?;
    if enabled == Some(false) || servers.is_empty() {
        env.backups
            .save(plan_id, &node_path, &path)
            .map_err(|e| e.to_string())?;
        if std::fs::symlink_metadata(&path).is_ok() {
            before_change()?;
        }
        let removed = remove_file(&path).map_err(|e| e.to_string())?;
        let summary = if removed {
            format!("removed {node_path}")
        } else {
            format!("{node_path} already absent")
        };
        return Ok((removed, summary));
    }
    let content = render(env.config.ntp.flavor, servers);
    let meta = FileMeta {
        mode: DROP_IN_MODE,
        owner: env.is_root.then_some((0, 0)),
    };
    if matches(&path, content.as_bytes(), meta).map_err(|e| e.to_string())? {
        return Ok((
            false,
            format!("{node_path} already lists {} servers", servers.len()),
        ));
    }
    env.backups
        .save(plan_id, &node_path, &path)
        .map_err(|e| e.to_string())?;
    before_change()?;
    atomic_write(&path, content.as_bytes(), meta).map_err(|e| e.to_string())?;
    Ok((
        true,
        format!("wrote {node_path} with {} servers", servers.len()),
    ))
}

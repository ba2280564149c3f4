//! The `ntp` driver: writes the agent's own drop-in for the configured time service (chrony or
//! systemd-timesyncd) and leaves the distribution's main config alone. `enabled: false`, or no
//! servers, removes the drop-in so the distribution's defaults apply again. The service is restarted
//! when the drop-in changed, or changed earlier without a restart since ([`super::restart`]).

use std::sync::Arc;

use inplace_agent_api::{StepAction, StepKind};

use super::driver::{Driver, StepFuture, wrong_kind};
use super::error::DriverError;
use super::restart::{BeforeChange, write_then_restart};
use super::step::StepContext;
use super::undo::{Place, UndoContext, restore_then_restart};
use crate::config::NtpFlavor;
use crate::fsutil::{FileMeta, atomic_write, matches, remove_file};
use crate::os::driver_env::DriverEnv;

/// Mode of the drop-in.
const DROP_IN_MODE: u32 = 0o644;
/// `unfinished.json` key of the restart: set before the drop-in changes, cleared after the restart
/// succeeded.
const RESTART_KEY: &str = "ntp.restart";

/// The `ntp` driver.
pub(crate) struct Ntp;

impl Driver for Ntp {
    fn kind(&self) -> StepKind {
        StepKind::Ntp
    }

    fn run(&self, env: Arc<DriverEnv>, ctx: StepContext) -> StepFuture {
        let StepAction::Ntp { servers, enabled } = ctx.step.action.clone() else {
            return wrong_kind(self.kind(), &ctx.step.action);
        };
        let restart = env.config.ntp.restart();
        Box::pin(write_then_restart(
            env,
            ctx,
            RESTART_KEY,
            restart,
            move |env, plan_id, before_change| {
                write(env, plan_id, &servers, enabled, before_change)
            },
        ))
    }

    fn undo_places(
        &self,
        env: &DriverEnv,
        _action: &StepAction,
    ) -> Result<Option<Vec<Place>>, DriverError> {
        Ok(Some(vec![Place::Node(env.config.ntp.config_file())]))
    }

    fn undo(&self, env: Arc<DriverEnv>, ctx: UndoContext) -> StepFuture {
        let restart = env.config.ntp.restart();
        restore_then_restart(env, ctx, Some((RESTART_KEY, restart)))
    }
}

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

/// Converges the drop-in; returns (changed, summary). `before_change` is marked right before the
/// drop-in is written or removed (it records that a restart is owed).
fn write(
    env: &DriverEnv,
    plan_id: &str,
    servers: &[String],
    enabled: Option<bool>,
    before_change: BeforeChange<'_>,
) -> Result<(bool, String), DriverError> {
    let node_path = env.config.ntp.config_file();
    let path = env.fs.path(&node_path)?;
    if enabled == Some(false) || servers.is_empty() {
        env.backups.save(plan_id, &node_path, &path)?;
        if std::fs::symlink_metadata(&path).is_ok() {
            before_change.mark()?;
        }
        let removed = remove_file(&path)?;
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
    if matches(&path, content.as_bytes(), meta)? {
        return Ok((
            false,
            format!("{node_path} already lists {} servers", servers.len()),
        ));
    }
    env.backups.save(plan_id, &node_path, &path)?;
    before_change.mark()?;
    atomic_write(&path, content.as_bytes(), meta)?;
    Ok((
        true,
        format!("wrote {node_path} with {} servers", servers.len()),
    ))
}

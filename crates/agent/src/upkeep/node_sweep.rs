//! The node's retention sweep, run when the agent starts and when a plan ends: artifact downloads and `.partial`
//! files unused for `ARTIFACT_RETENTION` (`crate::config::artifact::prune`), then old systemd-sysext images and
//! the leftovers of interrupted writes beside them (`crate::os::sysext::images::sweep`, after
//! `SYSEXT_IMAGE_RETENTION`). Every removal is one unlink of a file nothing needs, so a kill at any instant only
//! leaves the rest for the next sweep; a failure is logged and old files stay until then.

use std::time::SystemTime;

use crate::os::driver_env::DriverEnv;
use crate::os::sysext::images::{SYSEXT_IMAGE_RETENTION, sweep};
use crate::state::LocalState;

/// Sweeps now; `state`: the agent's saved state (an image its current plan names stays).
pub(crate) fn sweep_now(env: &DriverEnv, state: &LocalState) {
    crate::config::artifact::prune_now(&env.state_dir);
    // The plan's records as saved: an undo record names the image a rollback switches back to.
    let plan_text = match state.current.as_ref().map(serde_json::to_string) {
        None => String::new(),
        Some(Ok(text)) => text,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "cannot read the plan's records; no sysext image is swept now");
            return;
        }
    };
    match sweep(env, &plan_text, SystemTime::now()) {
        Ok(swept) if swept.images + swept.leftovers > 0 => tracing::info!(
            images = swept.images,
            leftovers = swept.leftovers,
            retention_days = SYSEXT_IMAGE_RETENTION.as_secs() / 86_400,
            "removed old sysext images and leftovers of interrupted writes"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot sweep old sysext images"),
    }
}

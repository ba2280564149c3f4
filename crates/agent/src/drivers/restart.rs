//! The protocol of the drivers that converge one node file and then restart the service reading it (ntp,
//! kubeletArgs): write the file, journal in `unfinished.json` that a restart is owed, restart the service.
//!
//! The key is marked durably right *before* the file changes ([`BeforeChange`]) and cleared only after the
//! restart succeeded. So a restart that failed, or never ran because the agent stopped in between, is owed
//! to the next step of the kind even though the file already looks right then; and a resumed step restarts
//! whatever the file looks like, since the interruption may have come between the write and the restart.

use std::path::Path;
use std::sync::Arc;

use super::driver::blocking_value;
use super::error::DriverError;
use super::step::{Done, StepContext};
use crate::drivers::unfinished;
use crate::fsutil::JournalError;
use crate::os::driver_env::DriverEnv;
use crate::sequence::process::{display_argv, run_command};

/// Handed to the write: records that a restart is owed. Called right before the file is written or
/// removed, after its backup is saved.
pub(crate) struct BeforeChange<'a> {
    state_dir: &'a Path,
    key: &'static str,
}

impl BeforeChange<'_> {
    /// Marks the restart owed (durably).
    pub fn mark(self) -> Result<(), JournalError> {
        unfinished::mark(self.state_dir, self.key)
    }
}

/// Converges a file through `write` (which returns whether it changed the file, and a summary), then runs
/// `restart` when it changed now, or earlier without a successful restart since, or the step is resumed.
/// `key` names the owed restart in `unfinished.json`.
pub(crate) async fn write_then_restart(
    env: Arc<DriverEnv>,
    mut ctx: StepContext,
    key: &'static str,
    restart: Vec<String>,
    write: impl FnOnce(&DriverEnv, &str, BeforeChange<'_>) -> Result<(bool, String), DriverError>
    + Send
    + 'static,
) -> Result<Done, DriverError> {
    let plan_id = ctx.plan_id.clone();
    let blocking_env = env.clone();
    let written = blocking_value(&ctx, move || {
        let env = blocking_env;
        let owed = unfinished::contains(&env.state_dir, key)?;
        let before_change = BeforeChange {
            state_dir: &env.state_dir,
            key,
        };
        let (changed, message) = write(&env, &plan_id, before_change)?;
        Ok((changed || owed, message))
    })
    .await?;
    let (changed, message) = written;
    if !changed && !ctx.resumed {
        return Ok(Done::ok(message));
    }
    let output = run_command(&restart, &env.command_env, ctx.deadline, &mut ctx.cancel).await;
    if let Some(failure) = DriverError::command(&restart, &output, ctx.step.timeout_seconds) {
        return Err(failure);
    }
    if let Err(e) = unfinished::clear(&env.state_dir, key) {
        // Only costs one more restart at the next step of this kind.
        tracing::warn!(error = %e, key, "cannot record the restart as done");
    }
    Ok(Done::ok(format!(
        "{message}; ran `{}`",
        display_argv(&restart)
    )))
}

//! One attempt at a step, an undo or the rollback's verification, shared by the executor and the rollback:
//! the host they run in (`host`), driving the task to its end (`drive`), and waiting for room when the state dir
//! is full (`state_full`).

pub(crate) mod drive;
pub(crate) mod host;
pub(crate) mod protocol;
pub(crate) mod state_full;

/// Attempts after which a step that keeps being interrupted is failed.
pub const MAX_STEP_ATTEMPTS: u32 = 3;

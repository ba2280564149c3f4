//! How far a step's command sequence got: the count of completed commands and the retry state of the next,
//! as the step's record in `state.json` keeps it and the drivers resume from it.

use serde::{Deserialize, Serialize};

/// The commands of a step's configured sequence known to have completed, written (fsynced) after
/// each one. A resumed step continues at the first command not counted here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SequenceProgress {
    /// SHA-256 (hex) of the expanded commands the count refers to: a count for another sequence
    /// (the agent config or the pins changed in between) is never used.
    pub sequence: String,
    /// How many commands, from the first, completed.
    pub done: u32,
    /// Failed attempts of the next command (number `done`) under the sequence's retry policy.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_attempts: u32,
    /// When its next attempt is due (Unix ms): a resumed step waits out what is left of the delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at_unix_ms: Option<u64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

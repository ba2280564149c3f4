//! A run's rollback as the store keeps it (issue 28): the agent's summary (rolling back, rolled back, failed, and
//! its words about the node) and one record per undone step, folded in from the agent's reports and progress by
//! [`super::run::UpdateRecord`]. Pure.

use std::collections::BTreeMap;

use inplace_agent_api::{RollbackProgress, RollbackState};
use serde::{Deserialize, Serialize};

use super::run::{RunStepRecord, StepState};

/// A run's rollback (issue 28), as its agent reported it: the summary, and one record per undone step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRollback {
    /// Where it is.
    pub state: RollbackState,
    /// The step whose failure started it.
    pub failed_step: u32,
    /// How many steps were undone.
    pub undone: u32,
    /// The agent's words: what the node is now, or where and why the rollback failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Each undo's record, by the index of the step it undoes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub undos: BTreeMap<u32, RunStepRecord>,
}

impl RunRollback {
    /// The undone steps as `7–6` (1-based, the failed one first; `7` for one, empty for none).
    pub fn undone_range(&self) -> String {
        let done: Vec<u32> = self
            .undos
            .iter()
            .filter(|(_, u)| u.state == StepState::Succeeded)
            .map(|(&i, _)| i + 1)
            .collect();
        match (done.iter().max(), done.iter().min()) {
            (Some(high), Some(low)) if high == low => high.to_string(),
            (Some(high), Some(low)) => format!("{high}\u{2013}{low}"),
            _ => String::new(),
        }
    }

    /// Folds in the agent's summary. A final state (rolled back, failed) never changes again.
    pub(super) fn absorb(&mut self, progress: &RollbackProgress) -> bool {
        let final_state = self.state != RollbackState::RollingBack;
        if final_state
            || (self.state, self.undone, &self.message)
                == (progress.state, progress.undone, &progress.message)
        {
            return false;
        }
        self.state = progress.state;
        self.undone = progress.undone;
        self.message = progress.message.clone();
        true
    }

    /// `rolled back steps 7–6: …` (`step 7` for one), `rolling back: …` or `rollback failed: …`, with the
    /// agent's words.
    pub fn summary(&self) -> String {
        let range = self.undone_range();
        let what = match self.state {
            RollbackState::RollingBack => "rolling back".to_owned(),
            RollbackState::RolledBack if range.is_empty() => {
                "rolled back (nothing to undo)".to_owned()
            }
            RollbackState::RolledBack if range.contains('\u{2013}') => {
                format!("rolled back steps {range}")
            }
            RollbackState::RolledBack => format!("rolled back step {range}"),
            RollbackState::Failed => "rollback failed".to_owned(),
        };
        if self.message.is_empty() {
            what
        } else {
            format!("{what}: {}", self.message)
        }
    }
}

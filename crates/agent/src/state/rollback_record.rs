//! The rollback of a plan as `state.json` keeps it (issue 28): which steps to undo and in what order, each
//! undo's record, where the rollback is and what it says. Data and pure rules only; the rollback phase that
//! runs the undos is `rollback/mod.rs`, its end `rollback/verify.rs`.

use inplace_agent_api::{MESSAGE_MAX_BYTES, Plan, RollbackProgress, RollbackState, Undo};
use serde::{Deserialize, Serialize};

use crate::state::{LocalStepRecord, LocalStepStatus, truncate_head};

/// A rollback of the current plan: the steps to undo, in order, and how each undo went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollbackRecord {
    /// The step whose failure started it.
    pub failed_step: u32,
    /// The steps to undo, in order: the failed one (when its kind is undone), then the succeeded ones in
    /// reverse, back to the last point of no return.
    pub order: Vec<u32>,
    /// One record per entry of `order`: the undo's status, attempts and outcome.
    pub undos: Vec<LocalStepRecord>,
    /// Where it is.
    pub state: RollbackState,
    /// For operators (bounded by `MESSAGE_MAX_BYTES`).
    pub message: String,
    /// What the verification after the undos found (the Node Ready at its old kubelet version), once it
    /// passed; the uncordon comes next (`rollback/verify.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<String>,
    /// Attempts of the verification or uncordon under way, bounded by `MAX_STEP_ATTEMPTS` like a step's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub finish_attempts: u32,
    /// A drainNode step of the plan began: a failed rollback leaves the node cordoned (by this plan).
    #[serde(default)]
    pub drained: bool,
    /// The point of no return the undos stop at (its step index), when one succeeded before the failure: the
    /// steps up to it stay done, so the verification does not expect the kubelet version before the plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<u32>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl RollbackRecord {
    /// A rollback of the steps `order` after `failed_step` failed (with nothing to undo, it goes straight
    /// to the verification and the uncordon), stopping at the point of no return `stopped_at`; `drained`: a
    /// drainNode step of the plan began, so the node may carry this plan's cordon.
    pub fn new(failed_step: u32, order: UndoOrder, drained: bool) -> Self {
        let UndoOrder { order, stopped_at } = order;
        let undos = order.iter().map(|_| LocalStepRecord::pending()).collect();
        Self {
            failed_step,
            order,
            undos,
            state: RollbackState::RollingBack,
            message: String::new(),
            verified: None,
            finish_attempts: 0,
            drained,
            stopped_at,
        }
    }

    /// The position in `order` of the next undo to run, while rolling back.
    pub fn next_undo(&self) -> Option<usize> {
        if self.state != RollbackState::RollingBack {
            return None;
        }
        self.undos.iter().position(|u| {
            matches!(
                u.status,
                LocalStepStatus::Pending | LocalStepStatus::Running
            )
        })
    }

    /// How many undos succeeded.
    pub fn undone(&self) -> u32 {
        self.undos
            .iter()
            .filter(|u| u.status == LocalStepStatus::Succeeded)
            .count() as u32
    }

    /// Every undo succeeded and the node passed the verification: rolled back. `note` says what the node is
    /// now (Ready at which kubelet version, the cordon).
    pub fn finish_rolled_back(&mut self, note: &str) {
        self.state = RollbackState::RolledBack;
        let text = if self.order.is_empty() {
            format!("nothing to undo; {note}")
        } else {
            note.to_owned()
        };
        self.message = truncate_head(&text, MESSAGE_MAX_BYTES).to_owned();
    }

    /// An undo failed (`message` says which and why): the rollback ends failed, the node left cordoned.
    pub fn finish_failed(&mut self, message: &str) {
        self.state = RollbackState::Failed;
        let text = if self.drained {
            format!("{message}; node left cordoned")
        } else {
            format!("{message}; the plan did not cordon the node")
        };
        self.message = truncate_head(&text, MESSAGE_MAX_BYTES).to_owned();
    }

    /// The summary sent with polls and inventory.
    pub fn progress(&self) -> RollbackProgress {
        RollbackProgress {
            state: self.state,
            failed_step: self.failed_step,
            undone: self.undone(),
            message: self.message.clone(),
        }
    }
}

/// What a failure undoes: the steps, in order, and the point of no return that stops them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct UndoOrder {
    /// The steps to undo, in order.
    pub order: Vec<u32>,
    /// The succeeded point of no return the order stops at (its index), if any.
    pub stopped_at: Option<u32>,
}

/// The steps a failure of step `failed` undoes, in order: the failed one when its kind is undone (it may
/// have changed things), then the succeeded ones before it in reverse, stopping at the last point of no
/// return crossed. Kinds that leave nothing to undo (the drain's cordon, waits) are passed over, and so is a
/// point of no return the step itself passed over (its node already ran the target: it changed nothing).
pub(crate) fn undo_order(plan: &Plan, steps: &[LocalStepRecord], failed: usize) -> UndoOrder {
    let kind = |i: usize| plan.steps[i].action.step_kind().undo();
    let mut order = Vec::new();
    let mut stopped_at = None;
    // A step that failed before it began (its record could not be taken) changed nothing.
    if kind(failed) == Undo::Restores && steps.get(failed).is_some_and(LocalStepRecord::began) {
        order.push(failed as u32);
    }
    for i in (0..failed.min(steps.len())).rev() {
        if steps[i].status != LocalStepStatus::Succeeded {
            continue;
        }
        match kind(i) {
            Undo::NoReturn if steps[i].passed_over => {}
            Undo::NoReturn => {
                stopped_at = Some(i as u32);
                break;
            }
            Undo::Restores => order.push(i as u32),
            Undo::Nothing => {}
        }
    }
    UndoOrder { order, stopped_at }
}

//! One update run of a Machine as the store keeps it ([`UpdateRecord`]: the plan handed to its agent and how
//! far each step got), and the pure transitions a run goes through (step and undo reports, the agent's progress
//! summary); the lighter view UpdateMachine answers from is `run_view.rs`. No I/O: every function here is
//! tested alone.

use std::collections::BTreeMap;

use inplace_agent_api::{
    Hold, Plan, PlanProgress, PlanStatus, RollbackProgress, RollbackState, StepReport, StepStatus,
};
use serde::{Deserialize, Serialize};

pub use super::rollback::RunRollback;
pub use super::run_view::{ActionView, PlanView, RunView, StepView};

/// Longest stderr tail kept per step (the agent sends at most 4 KiB; operators need the end).
pub const KEPT_STDERR_BYTES: usize = inplace_agent_api::STDERR_TAIL_MAX_BYTES;

/// How a cancelled run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelledRun {
    /// The cancel annotation's value.
    pub value: String,
    /// Steps that had succeeded when the agent stopped.
    pub after_steps: u32,
}

/// State of one step of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StepState {
    /// Not started.
    Pending,
    /// Started by the agent.
    Running,
    /// Done.
    Succeeded,
    /// Failed; the run stops here.
    Failed,
}

impl StepState {
    /// Whether the state is final.
    pub fn is_final(self) -> bool {
        matches!(self, StepState::Succeeded | StepState::Failed)
    }
}

/// One step's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunStepRecord {
    /// Where it is.
    pub state: StepState,
    /// Which attempt the state belongs to (agent restarts re-run an interrupted step).
    #[serde(default)]
    pub attempt: u32,
    /// Start of the attempt (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// End of the attempt (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<u64>,
    /// Exit code of the command that ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Last bytes of stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<String>,
    /// The agent's message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The step state a report's status means.
fn state_of(status: StepStatus) -> StepState {
    match status {
        StepStatus::Running => StepState::Running,
        StepStatus::Succeeded => StepState::Succeeded,
        StepStatus::Failed => StepState::Failed,
    }
}

/// Whether `report` (meaning `state`) is news for `step`: a newer attempt, or the same attempt not yet final
/// with a new state (or, while running, a new message: the agent's automatic retries, "attempt 2/3 …").
fn report_is_news(step: &RunStepRecord, report: &StepReport, state: StepState) -> bool {
    let news = state != step.state
        || (state == StepState::Running
            && report.message.is_some()
            && report.message != step.message);
    report.attempt > step.attempt
        || (report.attempt == step.attempt && !step.state.is_final() && news)
}

impl RunStepRecord {
    /// Takes `report` (meaning `state`) as this record's attempt.
    fn record(&mut self, report: &StepReport, state: StepState) {
        self.state = state;
        self.attempt = report.attempt;
        self.started_ms = report.started_at_unix_ms.or(self.started_ms);
        self.finished_ms = report.finished_at_unix_ms;
        self.exit_code = report.exit_code;
        self.stderr_tail = report
            .stderr_tail
            .as_deref()
            .map(|t| inplace_agent_api::truncate_tail(t, KEPT_STDERR_BYTES).to_string());
        self.message = report.message.clone();
    }

    pub(super) fn pending() -> Self {
        Self {
            state: StepState::Pending,
            attempt: 0,
            started_ms: None,
            finished_ms: None,
            exit_code: None,
            stderr_tail: None,
            message: None,
        }
    }
}

/// One update run of a Machine: the plan handed to its agent and how far it got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateRecord {
    /// The plan (its `id` is the run id).
    pub plan: Plan,
    /// When the run was recorded (Unix ms).
    pub created_ms: u64,
    /// When it ended, succeeded or failed (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<u64>,
    /// One record per plan step.
    pub steps: Vec<RunStepRecord>,
    /// The hold the agent last confirmed it honours (sent with its polls): it runs no step and starts none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Hold>,
    /// Set when the agent confirmed an operator cancel: the run ended there (and counts as failed for a retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<CancelledRun>,
    /// Set once the agent reported a rollback of this run (a step failed under `onFailure: rollback`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RunRollback>,
    /// The remediation guard's value while the run waits for its guard to be settled (set on the Machine, or
    /// found impossible): the agent starts no step meanwhile. Set when a guarded run is recorded, cleared by
    /// the guard reconcile loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard_pending: Option<String>,
    /// The run is under a remediation guard (its steps that can take the node down): a step past its deadline
    /// is unguarded, and the UpdateMachine message says so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub guarded: bool,
    /// The guard stays on past a step's deadline (the `remediationGuardPastDeadline: keep` setting when the
    /// run was recorded), so every replica and a restarted server decide the same.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub guard_kept_past_deadline: bool,
}

/// Where a run is, as UpdateMachine reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// No step started yet.
    Waiting,
    /// Step `index` is the first unfinished one.
    InProgress {
        /// The step.
        index: usize,
    },
    /// Every step succeeded.
    Done,
    /// Step `index` failed (and the rollback, if there was one, ended: see the run's `rollback`).
    Failed {
        /// The step.
        index: usize,
    },
    /// Step `index` failed and the agent is undoing the steps before it: the run has not ended.
    RollingBack {
        /// The failed step.
        index: usize,
    },
    /// An operator cancelled it; the agent stopped after `after` steps.
    Cancelled {
        /// Steps that had succeeded.
        after: usize,
    },
}

impl RunOutcome {
    /// Where a run with these step records, this cancel and this rollback is.
    pub fn of_run(
        steps: &[RunStepRecord],
        cancelled: Option<&CancelledRun>,
        rollback: Option<&RunRollback>,
    ) -> RunOutcome {
        match (cancelled, RunOutcome::of(steps), rollback) {
            (Some(cancelled), _, _) => RunOutcome::Cancelled {
                after: cancelled.after_steps as usize,
            },
            (None, RunOutcome::Failed { index }, Some(rollback))
                if rollback.state == RollbackState::RollingBack =>
            {
                RunOutcome::RollingBack { index }
            }
            (None, outcome, _) => outcome,
        }
    }

    /// Whether the run ended without converging (failed or cancelled): an operator retry restarts it.
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            RunOutcome::Failed { .. } | RunOutcome::Cancelled { .. }
        )
    }

    /// Where a run with these step records is.
    pub fn of(steps: &[RunStepRecord]) -> RunOutcome {
        if let Some(index) = steps.iter().position(|s| s.state == StepState::Failed) {
            return RunOutcome::Failed { index };
        }
        match steps.iter().position(|s| s.state != StepState::Succeeded) {
            None => RunOutcome::Done,
            Some(0) if steps[0].state == StepState::Pending => RunOutcome::Waiting,
            Some(index) => RunOutcome::InProgress { index },
        }
    }
}

impl UpdateRecord {
    /// A fresh run of `plan`.
    pub fn new(plan: Plan, now_ms: u64) -> Self {
        let steps = plan
            .steps
            .iter()
            .map(|_| RunStepRecord::pending())
            .collect();
        let mut record = Self {
            plan,
            created_ms: now_ms,
            finished_ms: None,
            steps,
            held: None,
            cancelled: None,
            rollback: None,
            guard_pending: None,
            guarded: false,
            guard_kept_past_deadline: false,
        };
        if record.steps.is_empty() {
            record.finished_ms = Some(now_ms);
        }
        record
    }

    /// The run with its remediation guard pending when `guarded` (the server has a management-cluster client)
    /// and a step of its plan can take the node down; kept past a step's deadline when `keep_past_deadline`.
    pub fn guarded(mut self, guarded: bool, keep_past_deadline: bool) -> Self {
        let disrupts = self
            .plan
            .steps
            .iter()
            .any(|s| s.action.step_kind().disrupts());
        if guarded && disrupts && self.finished_ms.is_none() {
            self.guard_pending = Some(super::guard::guard_value(&self.plan.id));
            self.guarded = true;
            self.guard_kept_past_deadline = keep_past_deadline;
        }
        self
    }

    /// Where the run is.
    pub fn outcome(&self) -> RunOutcome {
        RunOutcome::of_run(&self.steps, self.cancelled.as_ref(), self.rollback.as_ref())
    }

    /// The rollback's state, if the agent reported one.
    pub fn rollback_state(&self) -> Option<RollbackState> {
        self.rollback.as_ref().map(|r| r.state)
    }

    /// The rollback, when it reached its end since it was `before` (the first change seen to a final state).
    pub fn rollback_ended_since(&self, before: Option<RollbackState>) -> Option<&RunRollback> {
        self.rollback
            .as_ref()
            .filter(|r| r.state != RollbackState::RollingBack && before != Some(r.state))
    }

    /// Steps that succeeded, from the first.
    pub fn succeeded_steps(&self) -> usize {
        self.steps
            .iter()
            .take_while(|s| s.state == StepState::Succeeded)
            .count()
    }

    fn settle(&mut self, now_ms: u64) {
        if self.finished_ms.is_none()
            && matches!(self.outcome(), RunOutcome::Done | RunOutcome::Failed { .. })
        {
            self.finished_ms = Some(now_ms);
        }
    }

    /// Applies one step report. Returns whether anything changed. Reports are at-least-once: a repeat is a
    /// no-op, a `running` report never overwrites a final state of the same or a later attempt, and nothing
    /// changes once the run failed. An undo's report (`undo`) goes to the run's rollback; the rollback summary
    /// a report carries is folded in after the report itself.
    pub fn apply_report(
        &mut self,
        report: &StepReport,
        now_ms: u64,
    ) -> Result<bool, ReportRejection> {
        if self.steps.get(report.step_index as usize).is_none() {
            return Err(ReportRejection::NoSuchStep(report.step_index));
        }
        if self.cancelled.is_some() {
            return Ok(false);
        }
        if report.undo {
            let rolled = self.absorb_rollback(report.rollback.as_ref(), now_ms);
            return Ok(self.apply_undo_report(report) || rolled);
        }
        let stepped = self.apply_step_report(report, now_ms);
        let rolled = self.absorb_rollback(report.rollback.as_ref(), now_ms);
        Ok(stepped || rolled)
    }

    /// A forward step's report (its index is checked).
    fn apply_step_report(&mut self, report: &StepReport, now_ms: u64) -> bool {
        let index = report.step_index as usize;
        if let RunOutcome::Failed { index: failed } | RunOutcome::RollingBack { index: failed } =
            self.outcome()
            && (failed != index || report.status != StepStatus::Failed)
        {
            return false;
        }
        let state = state_of(report.status);
        if !report_is_news(&self.steps[index], report, state) {
            return false;
        }
        // A step's success implies every earlier step succeeded (the agent runs them in order).
        if state == StepState::Succeeded {
            for earlier in &mut self.steps[..index] {
                if earlier.state != StepState::Succeeded {
                    earlier.state = StepState::Succeeded;
                }
            }
        }
        self.steps[index].record(report, state);
        self.settle(now_ms);
        true
    }

    /// An undo's report: its record under the step it undoes (the same at-least-once rules as a step's).
    fn apply_undo_report(&mut self, report: &StepReport) -> bool {
        let Some(rollback) = self.rollback.as_mut() else {
            // The summary rides every undo report: it is recorded first, by `absorb_rollback`.
            return false;
        };
        let state = state_of(report.status);
        let undo = rollback
            .undos
            .entry(report.step_index)
            .or_insert_with(RunStepRecord::pending);
        if !report_is_news(undo, report, state) {
            return false;
        }
        undo.record(report, state);
        true
    }

    /// Records the agent's rollback summary (from a report or its progress). The first one starts the run's
    /// rollback record; a final state ends the run.
    fn absorb_rollback(&mut self, progress: Option<&RollbackProgress>, now_ms: u64) -> bool {
        let Some(progress) = progress.filter(|p| (p.failed_step as usize) < self.steps.len())
        else {
            return false;
        };
        let changed = match self.rollback.as_mut() {
            Some(rollback) => rollback.absorb(progress),
            None => {
                self.rollback = Some(RunRollback {
                    state: progress.state,
                    failed_step: progress.failed_step,
                    undone: progress.undone,
                    message: progress.message.clone(),
                    undos: BTreeMap::new(),
                });
                true
            }
        };
        // The failed step's own report may come later: the rollback says it failed.
        if let Some(step) = self.steps.get_mut(progress.failed_step as usize)
            && step.state != StepState::Failed
        {
            step.state = StepState::Failed;
            step.message
                .get_or_insert_with(|| "the agent reported this step failed".into());
        }
        self.settle(now_ms);
        changed
    }

    /// Folds in the agent's summary of this run (sent with every poll and inventory), so progress whose
    /// reports were lost is not lost. Returns whether anything changed.
    pub fn apply_progress(&mut self, progress: &PlanProgress, now_ms: u64) -> bool {
        if progress.plan_id != self.plan.id || self.cancelled.is_some() {
            return false;
        }
        let rolled = self.absorb_rollback(progress.rollback.as_ref(), now_ms);
        if self.outcome().is_failure() || matches!(self.outcome(), RunOutcome::RollingBack { .. }) {
            return rolled;
        }
        let succeeded = (progress.succeeded_steps as usize).min(self.steps.len());
        let mut changed = rolled;
        for step in &mut self.steps[..succeeded] {
            if step.state != StepState::Succeeded {
                step.state = StepState::Succeeded;
                changed = true;
            }
        }
        if let (PlanStatus::Failed, Some(failed)) = (progress.status, progress.failed_step)
            && let Some(step) = self.steps.get_mut(failed as usize)
            && step.state != StepState::Failed
        {
            step.state = StepState::Failed;
            step.message
                .get_or_insert_with(|| "the agent reported this step failed".into());
            changed = true;
        }
        if self.held != progress.hold {
            self.held = progress.hold.clone();
            changed = true;
        }
        // The agent stopped for a cancel: no step runs and none will start, so the run ends here (unless its
        // steps all ended first).
        if let Some(hold) = progress.hold.as_ref().filter(|h| h.cancels())
            && let inplace_agent_api::HoldReason::Cancelled { value } = &hold.reason
            && matches!(
                self.outcome(),
                RunOutcome::Waiting | RunOutcome::InProgress { .. }
            )
        {
            self.cancelled = Some(CancelledRun {
                value: value.clone(),
                after_steps: self.succeeded_steps() as u32,
            });
            self.finished_ms.get_or_insert(now_ms);
            changed = true;
        }
        self.settle(now_ms);
        changed
    }

    /// Whether an agent reporting `progress` (or nothing) still needs this plan handed to it.
    pub fn agent_needs_plan(&self, progress: Option<&PlanProgress>) -> bool {
        match progress {
            None => self.finished_ms.is_none(),
            Some(progress) if progress.plan_id != self.plan.id => self.finished_ms.is_none(),
            Some(progress) => progress.status == PlanStatus::Running,
        }
    }
}

/// Why a step report was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportRejection {
    /// The plan has no step with that index.
    #[error("plan has no step {0}")]
    NoSuchStep(u32),
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;

//! The census: each Machine's current update and its state (this file: the tally, pure; [`follow`]: keeping it
//! from the store), kept in memory by following the store's change
//! feed, for `inplace_updater_updates{state}` and the stalled-update and missing-agent gauges. Computed on
//! change, not by scanning the store per scrape: a change costs one read of the record that changed (a Machine
//! record or an update record; an agent's last-seen write costs none), and every replica counts the same,
//! because it follows every replica's writes. Rebuilt from a listing of the Machine and update records at start
//! and whenever the feed had a gap (lagged receiver, etcd watch reconnected); agents' own records are never
//! listed (a fleet's, one per agent), only read for the Machines whose recorded update waits for its agent.

pub(super) mod follow;

use std::collections::HashMap;

use inplace_agent_api::{MachineRef, RollbackState};
use serde::Deserialize;

use crate::dispatch::floor::run::{CancelledRun, RunOutcome, RunRollback, RunStepRecord};

/// Where a Machine's current update is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateState {
    /// Recorded; no step started (waiting for the agent).
    Recorded,
    /// A step started and the run has not ended.
    Running,
    /// Every step done.
    Done,
    /// A step failed.
    Failed,
    /// Held by an operator pause (or another hold) and the agent confirmed it stopped: no step runs.
    Paused,
    /// Cancelled by an operator.
    Cancelled,
    /// A step failed and the agent is undoing the run.
    RollingBack,
    /// A step failed and the agent undid the run and verified the node.
    RolledBack,
    /// A step failed and so did the rollback: the node is left cordoned for an operator.
    RollbackFailed,
}

impl UpdateState {
    const ALL: [UpdateState; 9] = [
        Self::Recorded,
        Self::Running,
        Self::Done,
        Self::Failed,
        Self::Paused,
        Self::Cancelled,
        Self::RollingBack,
        Self::RolledBack,
        Self::RollbackFailed,
    ];

    /// The `state` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Recorded => "recorded",
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Paused => "paused",
            Self::Cancelled => "cancelled",
            Self::RollingBack => "rolling-back",
            Self::RolledBack => "rolled-back",
            Self::RollbackFailed => "rollback-failed",
        }
    }

    fn of(outcome: &RunOutcome, rollback: Option<RollbackState>) -> Self {
        match outcome {
            RunOutcome::Waiting => Self::Recorded,
            RunOutcome::InProgress { .. } => Self::Running,
            RunOutcome::Done => Self::Done,
            RunOutcome::Failed { .. } => match rollback {
                Some(RollbackState::RolledBack) => Self::RolledBack,
                Some(RollbackState::Failed) => Self::RollbackFailed,
                _ => Self::Failed,
            },
            RunOutcome::RollingBack { .. } => Self::RollingBack,
            RunOutcome::Cancelled { .. } => Self::Cancelled,
        }
    }

    fn unfinished(self) -> bool {
        // A paused run is not stuck: the stalled-update gauge leaves it out.
        matches!(self, Self::Recorded | Self::Running | Self::RollingBack)
    }
}

/// What the census reads of an update record: its times and step states (the plan is skipped).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RunTimes {
    created_ms: u64,
    steps: Vec<RunStepRecord>,
    #[serde(default)]
    held: Option<inplace_agent_api::Hold>,
    #[serde(default)]
    cancelled: Option<CancelledRun>,
    #[serde(default)]
    rollback: Option<RunRollback>,
}

impl RunTimes {
    /// The state and the time of the last progress (recording, or a step's start or end).
    fn judge(&self) -> (UpdateState, u64) {
        let progress = self
            .steps
            .iter()
            .flat_map(|s| [s.started_ms, s.finished_ms])
            .flatten()
            .fold(self.created_ms, u64::max);
        let outcome =
            RunOutcome::of_run(&self.steps, self.cancelled.as_ref(), self.rollback.as_ref());
        let rollback = self.rollback.as_ref().map(|r| r.state);
        let state = match UpdateState::of(&outcome, rollback) {
            UpdateState::Recorded | UpdateState::Running if self.held.is_some() => {
                UpdateState::Paused
            }
            state => state,
        };
        (state, progress)
    }
}

#[derive(Debug)]
struct Tally {
    run_id: String,
    /// State and last progress of the current run, once its record has been read.
    run: Option<(UpdateState, u64)>,
}

/// This replica's census.
#[derive(Debug, Default)]
pub struct Census {
    machines: HashMap<MachineRef, Tally>,
    /// When each agent's last-seen record was last written (Unix ms, as this replica saw the write).
    agents: HashMap<MachineRef, u64>,
    counts: [i64; UpdateState::ALL.len()],
}

fn index(state: UpdateState) -> usize {
    UpdateState::ALL
        .iter()
        .position(|s| *s == state)
        .unwrap_or_default()
}

impl Census {
    fn count(&mut self, run: Option<(UpdateState, u64)>, delta: i64) {
        if let Some((state, _)) = run {
            self.counts[index(state)] += delta;
        }
    }

    /// Points a Machine at a run; returns whether that is a different run than before.
    fn set_run(&mut self, machine: &MachineRef, run_id: &str) -> bool {
        if let Some(tally) = self.machines.get(machine)
            && tally.run_id == run_id
        {
            return false;
        }
        let old = self.machines.insert(
            machine.clone(),
            Tally {
                run_id: run_id.to_owned(),
                run: None,
            },
        );
        self.count(old.and_then(|t| t.run), -1);
        true
    }

    /// Records the state of a run, if it is the Machine's current one.
    fn set_state(&mut self, machine: &MachineRef, run_id: &str, run: Option<(UpdateState, u64)>) {
        let Some(tally) = self.machines.get_mut(machine) else {
            return;
        };
        if tally.run_id != run_id {
            return;
        }
        let old = std::mem::replace(&mut tally.run, run);
        self.count(old, -1);
        self.count(run, 1);
    }

    fn remove(&mut self, machine: &MachineRef) {
        let old = self.machines.remove(machine);
        self.count(old.and_then(|t| t.run), -1);
    }

    /// The Machines whose current run is recorded and waits for its agent.
    fn waiting(&self) -> impl Iterator<Item = &MachineRef> {
        self.machines
            .iter()
            .filter(|(_, tally)| matches!(tally.run, Some((UpdateState::Recorded, _))))
            .map(|(machine, _)| machine)
    }

    fn current_run(&self, machine: &MachineRef) -> Option<&str> {
        self.machines.get(machine).map(|t| t.run_id.as_str())
    }

    /// Machines per state.
    pub fn counts(&self) -> [(UpdateState, i64); UpdateState::ALL.len()] {
        UpdateState::ALL.map(|state| (state, self.counts[index(state)]))
    }

    pub(super) fn oldest_progress(&self) -> Option<u64> {
        self.machines
            .values()
            .filter_map(|t| t.run)
            .filter(|(state, _)| state.unfinished())
            .map(|(_, progress)| progress)
            .min()
    }

    /// The oldest last contact among agents that recorded updates wait for; `local` is what this replica saw.
    pub(super) fn oldest_waited_contact(
        &self,
        local: impl Fn(&MachineRef) -> Option<u64>,
    ) -> Option<u64> {
        self.machines
            .iter()
            .filter_map(|(machine, tally)| match tally.run {
                Some((UpdateState::Recorded, recorded)) => {
                    let seen = self.agents.get(machine).copied().max(local(machine));
                    Some(seen.unwrap_or(recorded))
                }
                _ => None,
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str) -> MachineRef {
        MachineRef::new("default", name)
    }

    #[test]
    fn counts_follow_each_machines_current_run_only() {
        let mut census = Census::default();
        assert!(census.set_run(&m("a"), "r1"));
        census.set_state(&m("a"), "r1", Some((UpdateState::Recorded, 10)));
        census.set_run(&m("b"), "r2");
        census.set_state(&m("b"), "r2", Some((UpdateState::Failed, 20)));
        assert_eq!(census.counts()[0], (UpdateState::Recorded, 1));
        assert_eq!(census.counts()[3], (UpdateState::Failed, 1));
        census.set_state(&m("a"), "r1", Some((UpdateState::Running, 30)));
        census.set_state(&m("a"), "old", Some((UpdateState::Failed, 40)));
        assert_eq!(
            census.counts().map(|(_, n)| n),
            [0, 1, 0, 1, 0, 0, 0, 0, 0],
            "a superseded run is not counted"
        );
        assert!(!census.set_run(&m("a"), "r1"), "same run: no change");
        assert!(census.set_run(&m("b"), "r3"), "a new desired state");
        assert_eq!(census.counts().map(|(_, n)| n), [0, 1, 0, 0, 0, 0, 0, 0, 0]);
        census.remove(&m("a"));
        assert_eq!(census.counts().map(|(_, n)| n), [0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn the_oldest_waits_are_found() {
        let mut census = Census::default();
        census.set_run(&m("a"), "r1");
        census.set_state(&m("a"), "r1", Some((UpdateState::Recorded, 1_000)));
        census.set_run(&m("b"), "r2");
        census.set_state(&m("b"), "r2", Some((UpdateState::Running, 500)));
        census.set_run(&m("c"), "r3");
        census.set_state(&m("c"), "r3", Some((UpdateState::Done, 1)));
        assert_eq!(
            census.oldest_progress(),
            Some(500),
            "done runs do not count"
        );
        assert_eq!(
            census.oldest_waited_contact(|_| None),
            Some(1_000),
            "never seen: the recording time"
        );
        census.agents.insert(m("a"), 200);
        assert_eq!(
            census.oldest_waited_contact(|_| None),
            Some(200),
            "seen long before: that"
        );
        assert_eq!(census.oldest_waited_contact(|_| Some(5_000)), Some(5_000));
    }

    #[test]
    fn progress_is_the_latest_step_time() {
        let run: RunTimes = serde_json::from_value(serde_json::json!({
            "plan": {"ignored": true},
            "createdMs": 100,
            "steps": [
                {"state": "succeeded", "startedMs": 150, "finishedMs": 300},
                {"state": "running", "startedMs": 350},
                {"state": "pending"}
            ]
        }))
        .unwrap();
        assert_eq!(run.judge(), (UpdateState::Running, 350));
    }
}

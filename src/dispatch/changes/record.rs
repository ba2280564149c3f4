//! What the store keeps of a change (`changes/<id>`): its canaries, the Machines running it, how many finished
//! or failed, the last finish, the brake or the operator's halt, a promotion, the last failing gate. One small
//! record per change, written in the same transaction as the run that joins it; bounded whatever the fleet's
//! size (the running list by [`MAX_RUNNING`], the failures by [`FAILURES_KEPT`]).

use inplace_agent_api::MachineRef;
use serde::{Deserialize, Serialize};

/// Most Machines of one paced change running at once (the change record lists each): a wave is never wider.
pub const MAX_RUNNING: usize = 500;
/// Failures a change record quotes (the count goes on).
pub const FAILURES_KEPT: usize = 10;
/// Longest failure reason kept per failed Machine.
pub const FAILURE_REASON_BYTES: usize = 300;

/// A Machine that joined a change with one of its runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    /// The Machine.
    pub machine: MachineRef,
    /// The run it joined with.
    pub run_id: String,
    /// When it joined (Unix ms).
    pub started_ms: u64,
}

/// A canary and, once its run ended, how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Canary {
    /// The Machine and its run.
    pub member: Member,
    /// When its run finished every step (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_ms: Option<u64>,
    /// Why it failed, once it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// A Machine whose run of the change ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ended {
    /// The Machine.
    pub machine: MachineRef,
    /// When its run ended as folded (Unix ms).
    pub ms: u64,
    /// Why it failed (empty for a success).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// Why a change is halted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "by")]
pub enum Halt {
    /// The failure brake: this many failures reached the bound.
    Brake {
        /// Failures counted since the last release.
        failures: u64,
        /// The bound they reached.
        allowed: u64,
        /// When (Unix ms).
        ms: u64,
    },
    /// An operator halted it.
    Operator {
        /// When (Unix ms).
        ms: u64,
    },
}

fn one() -> u32 {
    1
}

/// One change as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeRecord {
    /// What the change moves, for people (`v1.34.1+os-image:node-os:2.0`).
    pub label: String,
    /// When its first Machine joined (Unix ms).
    pub first_ms: u64,
    /// Canaries it takes (the setting in force when it was first asked).
    pub canary: u32,
    /// Failures past its canaries that halt it (`maxFailures` in force when it was first asked).
    #[serde(default = "one")]
    pub allowed_failures: u32,
    /// Its canaries, in the order they joined.
    #[serde(default)]
    pub canaries: Vec<Canary>,
    /// Machines whose run of it has not been seen to end.
    #[serde(default)]
    pub running: Vec<Member>,
    /// Machines that finished it.
    #[serde(default)]
    pub done: u64,
    /// The latest finish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_done: Option<Ended>,
    /// Machines whose run of it failed or was rolled back (a retried Machine counts again).
    #[serde(default)]
    pub failed: u64,
    /// The latest failures, newest last.
    #[serde(default)]
    pub failures: Vec<Ended>,
    /// Failures an operator's release already answered: the brake counts only the ones after.
    #[serde(default)]
    pub released_failures: u64,
    /// Set while the change is halted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<Halt>,
    /// An operator promoted it past its canaries and soaks.
    #[serde(default)]
    pub promoted: bool,
    /// The last time a health gate failed for it, and what it said: a soak restarts from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_failed: Option<(u64, String)>,
}

impl ChangeRecord {
    /// A change nobody joined yet, taking `canary` canaries, halted by `allowed_failures` failures past them.
    pub fn new(label: String, canary: u32, allowed_failures: u32, now_ms: u64) -> ChangeRecord {
        ChangeRecord {
            label,
            first_ms: now_ms,
            canary,
            allowed_failures,
            canaries: Vec::new(),
            running: Vec::new(),
            done: 0,
            last_done: None,
            failed: 0,
            failures: Vec::new(),
            released_failures: 0,
            halted: None,
            promoted: false,
            gate_failed: None,
        }
    }

    /// Whether `machine` joined it (running, finished, failed or as a canary).
    pub fn has_member(&self, machine: &MachineRef) -> bool {
        self.running.iter().any(|m| &m.machine == machine)
            || self.canaries.iter().any(|c| &c.member.machine == machine)
            || self.failures.iter().any(|e| &e.machine == machine)
            || self
                .last_done
                .as_ref()
                .is_some_and(|e| &e.machine == machine)
    }

    /// The last time anything happened to it (Unix ms): first asked, a finish, a failure, a failing gate, a
    /// halt.
    pub fn last_activity_ms(&self) -> u64 {
        let halted = self.halted.as_ref().map(|h| match h {
            Halt::Brake { ms, .. } | Halt::Operator { ms } => *ms,
        });
        [
            Some(self.first_ms),
            self.last_done.as_ref().map(|d| d.ms),
            self.failures.last().map(|f| f.ms),
            self.gate_failed.as_ref().map(|(ms, _)| *ms),
            halted,
        ]
        .into_iter()
        .flatten()
        .chain(self.canaries.iter().filter_map(|c| c.done_ms))
        .max()
        .unwrap_or(self.first_ms)
    }

    /// Whether the retention sweep may delete it at `horizon_ms`: nobody runs it, it is not halted (a brake or
    /// an operator's halt stays until released), and nothing happened to it since the horizon. A Machine that
    /// asks for it afterwards starts it afresh, canaries first.
    pub fn sweepable(&self, horizon_ms: u64) -> bool {
        self.running.is_empty() && self.halted.is_none() && self.last_activity_ms() <= horizon_ms
    }

    /// Whether it is still proving itself on its canaries.
    pub fn in_canary(&self) -> bool {
        !self.promoted
            && (self.canaries.len() < self.canary as usize
                || self.canaries.iter().any(|c| c.done_ms.is_none()))
    }
}

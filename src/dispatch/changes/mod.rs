//! The changes wing: a change proves itself before it spreads. A paced registration's new run is admitted only
//! when its change ([`identity`]) lets it — canaries first, a soak after each finish, the health gates
//! passing, no brake — decided purely ([`decide`]) over the change record ([`record`]) and how its running
//! Machines' runs ended, loaded here; the record is written in the same transaction as the run that joins it
//! (the runs wing adds the op), so every replica and every restart sees the same order. Operator controls
//! (halt, release, promote) and the listing for `status --changes` are [`control`]. Beside them, the fleet-wide
//! update budget: at most N runs in progress at once across every cluster and replica ([`budget`] pure,
//! [`budget_io`] load → decide → the caller's transaction).

pub mod budget;
pub mod budget_io;
pub mod control;
pub mod decide;
mod held;
pub mod identity;
pub mod record;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use inplace_agent_api::MachineRef;
use inplace_core::pacing::Pacing;
use inplace_store::Precondition;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::observe::StateLabels;

use super::floor::db::Put;
use super::floor::keys::{change_key, machine_key, update_key};
use super::floor::records::MachineRecord;
use super::floor::run::RunOutcome;
use super::floor::run_view::RunView;
use super::floor::{DispatchError, Floor};
pub use budget_io::Budget;
pub use decide::{Admission, Asked, GateOutcome, RunEnd, Verdict};
pub use identity::ChangeId;
pub use record::{ChangeRecord, Halt, Member};

/// What a per-node gate query is filled in with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateVars {
    /// The Node's name (the Machine's `status.nodeRef.name`, else the Machine's name).
    pub node: String,
    /// The Cluster's name.
    pub cluster: String,
    /// The Machine's namespace.
    pub namespace: String,
}

/// The boxed future a [`GateCheck`] returns.
pub type GateFuture<'a> = Pin<Box<dyn Future<Output = Vec<GateOutcome>> + Send + 'a>>;

/// Evaluates health gates by name (the server's gates file); a name it does not know is a failing gate.
pub trait GateCheck: Send + Sync {
    /// The outcome of each of `names` for `vars`, in order.
    fn check<'a>(&'a self, names: &'a [String], vars: &'a GateVars) -> GateFuture<'a>;
}

/// What pacing says about a new run.
#[derive(Debug)]
pub enum Paced {
    /// Start it; commit this op with the run.
    Go(Put),
    /// Do not start it: answer in progress.
    Wait {
        /// The message.
        message: String,
        /// `retryAfterSeconds`.
        retry_after_seconds: i32,
        /// Which hold of the change, for the Event on the Machine.
        held: super::floor::outbox::Reason,
    },
}

/// How often a server counts the changes in each state for `inplace_updater_changes{state}` (an operator's
/// release from the CLI is seen within this).
pub const CHANGE_GAUGES_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// How many running members' runs [`Changes::ends`] reads at once (two reads each): a change with hundreds of
/// Machines running is judged in a few store round trips' time, not hundreds.
pub const ENDS_READ_IN_FLIGHT: usize = 16;

/// The changes wing.
pub struct Changes {
    floor: Floor,
    gates: OnceLock<Arc<dyn GateCheck>>,
    gauges: Family<StateLabels, Gauge>,
}

impl Changes {
    /// The wing over `floor`, with no gates file yet ([`Changes::set_gates`]), counting the changes in each
    /// state into `gauges` whenever it lists them.
    pub fn new(floor: Floor, gauges: Family<StateLabels, Gauge>) -> Changes {
        Changes {
            floor,
            gates: OnceLock::new(),
            gauges,
        }
    }

    /// Lists the changes every [`CHANGE_GAUGES_INTERVAL`] (which counts them) until `shutdown`; a store error
    /// is logged and tried again at the next tick.
    pub async fn count_changes(&self) {
        let mut ticker = tokio::time::interval(CHANGE_GAUGES_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = self.floor.shutdown.cancelled() => return,
            }
            if let Err(err) = self.list().await {
                tracing::warn!(error = %err, "changes not counted; will try again");
            }
        }
    }

    /// The gates named by `healthGates` settings (once, at start-up).
    pub fn set_gates(&self, gates: Arc<dyn GateCheck>) {
        let _ = self.gates.set(gates);
    }

    /// Whether `machine` may start `run_id`, a run of `change`, under `pacing`: loads the change record and
    /// how its running Machines' runs stand, asks the gates, decides. A wait whose decision changed the record
    /// (a failure folded, the brake engaged, a gate failed) writes it at once; a conflict there is harmless
    /// (the next call folds again).
    pub async fn admit(
        &self,
        machine: &MachineRef,
        run_id: &str,
        change: &ChangeId,
        pacing: &Pacing,
        vars: &GateVars,
        skip_soak: bool,
    ) -> Result<Paced, DispatchError> {
        let key = change_key(&change.id);
        let loaded = self.floor.db.read::<ChangeRecord>(&key).await?;
        let precondition = match &loaded {
            Some((_, entry)) => Precondition::Revision(entry.revision),
            None => Precondition::Absent,
        };
        let record = loaded.map(|(record, _)| record);
        let ends = match &record {
            Some(record) => self.ends(&record.running).await?,
            None => Vec::new(),
        };
        let now_ms = self.floor.now_ms();
        let asked = |gates| Asked {
            machine,
            run_id,
            change,
            pacing,
            gates,
            now_ms,
            retry_after_seconds: self.floor.config.retry_after_seconds,
            skip_soak,
        };
        // Judged first without the gates; asked only when their outcome decides (a Machine that would start,
        // or waits for the soak), then judged again with them.
        let mut admission = decide::admit(record.as_ref(), &ends, &asked(&[]));
        if admission.gated && !pacing.health_gates.is_empty() {
            let gates = self.check_gates(&pacing.health_gates, vars).await;
            admission = decide::admit(record.as_ref(), &ends, &asked(&gates));
        }
        let put = Put::of(key, &admission.record, precondition)?;
        match admission.verdict {
            Verdict::Go { canary } => {
                if canary {
                    tracing::info!(%machine, change = %change.label, "a canary starts the change");
                }
                Ok(Paced::Go(put))
            }
            Verdict::Wait {
                message,
                retry_after_seconds,
            } => {
                if admission.changed {
                    if let Some(Halt::Brake { failures, .. }) = &admission.record.halted
                        && record.as_ref().is_none_or(|r| r.halted.is_none())
                    {
                        tracing::warn!(change = %change.label, id = %change.id, failures,
                            "the failure brake halted the change fleet-wide");
                    }
                    self.floor.db.commit(vec![put]).await?;
                }
                Ok(Paced::Wait {
                    held: held::reason(&admission.record, pacing, now_ms, skip_soak),
                    message,
                    retry_after_seconds,
                })
            }
        }
    }

    async fn check_gates(&self, names: &[String], vars: &GateVars) -> Vec<GateOutcome> {
        match self.gates.get() {
            Some(gates) => gates.check(names, vars).await,
            None => names
                .iter()
                .map(|name| GateOutcome {
                    name: name.clone(),
                    passed: false,
                    message: format!(
                        "gate {name}: not defined (the server has no gates file: serve --gates-file)"
                    ),
                })
                .collect(),
        }
    }

    /// How each running member's run stands: its Machine's current run and that run as stored, read
    /// [`ENDS_READ_IN_FLIGHT`] members at a time.
    pub(crate) async fn ends(
        &self,
        running: &[Member],
    ) -> Result<Vec<(Member, RunEnd)>, DispatchError> {
        use futures_util::StreamExt as _;
        let this = self;
        futures_util::stream::iter(running.to_vec())
            .map(move |member| async move {
                let current = this
                    .floor
                    .db
                    .value::<MachineRecord>(&machine_key(&member.machine))
                    .await?
                    .map(|r| r.run_id);
                let view = this
                    .floor
                    .db
                    .value::<RunView>(&update_key(&member.machine, &member.run_id))
                    .await?;
                let end = run_end(current.as_deref(), &member, view.as_ref());
                Ok((member, end))
            })
            .buffered(ENDS_READ_IN_FLIGHT)
            .collect::<Vec<Result<_, DispatchError>>>()
            .await
            .into_iter()
            .collect()
    }
}

/// How `member`'s run stands given its Machine's `current` run id and the run as stored.
pub fn run_end(current: Option<&str>, member: &Member, view: Option<&RunView>) -> RunEnd {
    let Some(view) = view else {
        return RunEnd::Gone;
    };
    // The agent's own words say why (a node verification that failed names the check); the record keeps
    // FAILURE_REASON_BYTES of it.
    let failed = |index: usize, rolling: bool| RunEnd::Failed {
        reason: format!(
            "step {}/{} {} failed{}{}",
            index + 1,
            view.plan.steps.len(),
            view.plan
                .steps
                .get(index)
                .map(|s| s.description.as_str())
                .unwrap_or_default(),
            if rolling { ", rolling back" } else { "" },
            view.steps
                .get(index)
                .and_then(|s| s.message.as_deref())
                .filter(|m| !m.is_empty())
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        ),
    };
    match view.outcome() {
        // The server's clock, not the agent's: a soak is measured by the clock that judges it.
        RunOutcome::Done => RunEnd::Done {
            ms: view.finished_ms.unwrap_or(member.started_ms),
        },
        RunOutcome::Failed { index } => failed(index, false),
        RunOutcome::RollingBack { index } => failed(index, true),
        RunOutcome::Cancelled { .. } => RunEnd::Gone,
        RunOutcome::Waiting | RunOutcome::InProgress { .. } => {
            if current == Some(member.run_id.as_str()) {
                RunEnd::Running
            } else {
                RunEnd::Gone
            }
        }
    }
}

#[cfg(test)]
mod decide_tests;

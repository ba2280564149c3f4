//! The remediation guard wing: while a Machine's run is in a step that can take the node down (the step-kind
//! table's `disrupts`), CAPI's `cluster.x-k8s.io/skip-remediation` annotation is on the Machine with the value
//! `inplace-updater:<run id>`, so a MachineHealthCheck does not replace it mid-update.
//!
//! The store is the truth: a guard record per Machine ([`crate::dispatch::floor::guard`]) says what the Machine
//! should carry. One reconcile of a Machine is load (its record, current run, guard record) → [`decide`] (pure)
//! → commit the guard record → the call to the management cluster ([`GuardTarget`], after the commit) → commit
//! what was seen, and release the run's start when its guard is settled. The loop ([`Guards::run`]) reconciles a
//! Machine whenever its record or run changes (the change feed), every Machine with a guard record or a pending
//! start every [`GUARD_RECONCILE_INTERVAL`] (deadlines, failed calls), and every Machine at start-up: a restart or
//! a failover neither leaks a guard nor drops one that is needed. Machines are reconciled concurrently, at most
//! [`GUARD_RECONCILES_IN_FLIGHT`] at once, one reconcile per Machine at a time.
//!
//! A guarded run starts no step until its guard is settled (the hold `remediationGuard`), so the guard is on
//! the Machine before its first step (a drain) begins. A failed call never stops an update: the run starts
//! unguarded, the failure is logged and counted, and the loop keeps trying.
//!
//! The parts: [`decide`] (what a Machine should carry, pure), `reconcile` (one Machine's load → decide → commit →
//! call), `records` (the guard records as `status` and retention read them); this file is the wing and its loop
//! (which Machines, when, how many at once).

pub mod decide;
mod reconcile;
mod records;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use inplace_agent_api::MachineRef;
use inplace_store::BoxFuture;
use prometheus_client::metrics::gauge::Gauge;

use crate::dispatch::floor::guard::{GuardRecord, GuardWant};
use crate::dispatch::floor::keys::{GUARDS_PREFIX, MACHINES_PREFIX, machine_of_change};
use crate::dispatch::floor::records::MachineRecord;
use crate::dispatch::floor::{DispatchError, Floor};

pub use decide::{MachineChange, Need, decide, machine_change, need, release_gate};
pub use reconcile::Reconciled;
pub use records::{held, status_line, sweep};

/// How often every guard record and every run waiting for its guard is reconciled again (deadlines, calls
/// that failed).
pub const GUARD_RECONCILE_INTERVAL: Duration = Duration::from_secs(15);

/// Machines one replica reconciles at once (each waits at most the management client's request timeout on a
/// call): an API that silently drops requests delays the held runs by about one timeout, not one per Machine.
pub const GUARD_RECONCILES_IN_FLIGHT: usize = 32;

/// What a guard call did to the Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The Machine carries another value of the annotation (an operator's), left alone.
    pub operator_value: bool,
}

/// The management cluster as the guard needs it: make Machine `machine`'s skip-remediation annotation match
/// `record` ([`machine_change`]: read it, compare, patch with the read resourceVersion). Implemented by
/// `crate::mgmt`; dispatch never talks to Kubernetes itself. An error is the call's failure, already logged
/// and counted by the implementation.
pub trait GuardTarget: Send + Sync + 'static {
    /// Applies `record` to the Machine.
    fn apply<'a>(
        &'a self,
        machine: &'a MachineRef,
        record: &'a GuardRecord,
    ) -> BoxFuture<'a, Result<Applied, String>>;
}

/// The wing (see the module docs).
pub struct Guards {
    floor: Floor,
    target: Arc<dyn GuardTarget>,
    /// Machines whose run waits for its guard, seen by this replica: reconciled every interval until released.
    pending: Mutex<BTreeSet<MachineRef>>,
    /// `inplace_updater_remediation_guards`.
    held: Gauge,
    /// One lock per Machine being reconciled: reconciles of one Machine never overlap (a late "set" landing
    /// after a "remove" would leave the annotation behind); those of different Machines do.
    reconciling: Mutex<BTreeMap<MachineRef, Arc<tokio::sync::Mutex<()>>>>,
    /// Machines the change feed asked to reconcile that have not started yet (asked again: once).
    queued: Mutex<BTreeSet<MachineRef>>,
    /// At most [`GUARD_RECONCILES_IN_FLIGHT`] reconciles at once.
    in_flight: tokio::sync::Semaphore,
}

impl std::fmt::Debug for Guards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guards").finish_non_exhaustive()
    }
}

impl Guards {
    /// The wing over `floor`, calling `target`, counting guards held in `held`.
    pub fn new(floor: Floor, target: Arc<dyn GuardTarget>, held: Gauge) -> Self {
        Self {
            floor,
            target,
            pending: Mutex::new(BTreeSet::new()),
            held,
            reconciling: Mutex::new(BTreeMap::new()),
            queued: Mutex::new(BTreeSet::new()),
            in_flight: tokio::sync::Semaphore::new(GUARD_RECONCILES_IN_FLIGHT),
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, BTreeSet<MachineRef>> {
        lock_set(&self.pending)
    }

    /// Reconciles `machines`; with the change feed's tasks, at most [`GUARD_RECONCILES_IN_FLIGHT`] at a time.
    async fn reconcile_each(&self, machines: BTreeSet<MachineRef>) {
        // The shared semaphore is the bound; this one only keeps a sweep from making every future at once.
        futures_util::stream::iter(machines)
            .for_each_concurrent(GUARD_RECONCILES_IN_FLIGHT, |machine| async move {
                self.reconcile_logged(&machine).await;
            })
            .await;
    }

    /// Reconciles `machine` in a task of its own (the loop goes on reading the change feed); asked again while
    /// it waits for its turn, it runs once.
    fn reconcile_later(
        self: &Arc<Self>,
        machine: MachineRef,
        tasks: &mut tokio::task::JoinSet<()>,
    ) {
        if !lock_set(&self.queued).insert(machine.clone()) {
            return;
        }
        let guards = self.clone();
        tasks.spawn(async move {
            guards.reconcile_logged(&machine).await;
        });
    }

    /// One reconcile once a [`GUARD_RECONCILES_IN_FLIGHT`] permit is free: from then on a change asks for another
    /// one. A failure is logged; the next sweep or change tries again.
    async fn reconcile_logged(&self, machine: &MachineRef) {
        let _permit = self.in_flight.acquire().await;
        lock_set(&self.queued).remove(machine);
        if let Err(err) = self.reconcile(machine).await {
            tracing::warn!(machine = %machine, error = %err, "remediation guard not reconciled; will try again");
        }
    }

    /// Reconciles every Machine with a guard record or a run waiting for its guard, and counts the guards held.
    pub async fn reconcile_known(&self) -> Result<(), DispatchError> {
        let mut machines: BTreeSet<MachineRef> = self.pending().clone();
        let guards = self
            .floor
            .db
            .per_machine::<GuardRecord>(GUARDS_PREFIX)
            .await?;
        machines.extend(
            guards
                .into_iter()
                .filter(|(_, g)| !(g.want == GuardWant::Off && g.applied))
                .map(|(m, _)| m),
        );
        self.reconcile_each(machines).await;
        self.count().await
    }

    /// Reconciles every Machine (start-up).
    pub async fn reconcile_all(&self) -> Result<(), DispatchError> {
        let mut machines: BTreeSet<MachineRef> = self
            .floor
            .db
            .per_machine::<MachineRecord>(MACHINES_PREFIX)
            .await?
            .into_iter()
            .map(|(m, _)| m)
            .collect();
        machines.extend(
            self.floor
                .db
                .per_machine::<GuardRecord>(GUARDS_PREFIX)
                .await?
                .into_iter()
                .map(|(m, _)| m),
        );
        self.reconcile_each(machines).await;
        self.count().await
    }

    async fn count(&self) -> Result<(), DispatchError> {
        let held = self.held_guards().await?.len();
        self.held.set(held as i64);
        Ok(())
    }

    /// The guards the updater holds now (as the store records them), for `status` and the gauge.
    pub async fn held_guards(&self) -> Result<Vec<GuardRecord>, DispatchError> {
        held(&self.floor).await
    }

    /// The loop: every Machine at start, then each Machine whose record or run changed, and the known ones every
    /// [`GUARD_RECONCILE_INTERVAL`]. Returns only at shutdown (or when the change feed closes).
    pub async fn run(self: Arc<Self>) {
        let mut feed = self.floor.db.store().subscribe();
        if let Err(err) = self.reconcile_all().await {
            tracing::warn!(error = %err, "remediation guards not reconciled at start-up; will try again");
        }
        let mut ticker = tokio::time::interval(GUARD_RECONCILE_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            while tasks.try_join_next().is_some() {}
            tokio::select! {
                () = self.floor.shutdown.cancelled() => return,
                _ = ticker.tick() => {
                    if let Err(err) = self.reconcile_known().await {
                        tracing::warn!(error = %err, "remediation guards not reconciled; will try again");
                    }
                }
                received = feed.recv() => match received {
                    Ok(change) => {
                        if let Some(machine) = machine_of_change(&change.key) {
                            self.reconcile_later(machine, &mut tasks);
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        if let Err(err) = self.reconcile_all().await {
                            tracing::warn!(error = %err, "remediation guards not reconciled; will try again");
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    }
}

fn lock_set<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

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

pub mod decide;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use inplace_agent_api::MachineRef;
use inplace_core::settings::REMEDIATION_GUARD_PAST_DEADLINE_SETTING;
use inplace_store::{BoxFuture, Precondition};
use prometheus_client::metrics::gauge::Gauge;

use crate::dispatch::floor::db::{CAS_ATTEMPTS, Committed, Put};
use crate::dispatch::floor::guard::{
    GuardRecord, GuardWant, LiftReason, SKIP_REMEDIATION_ANNOTATION,
};
use crate::dispatch::floor::keys::{
    GUARDS_PREFIX, MACHINES_PREFIX, guard_key, machine_key, machine_of_change, update_key,
};
use crate::dispatch::floor::outbox::{MachineEvent, Reason};
use crate::dispatch::floor::records::MachineRecord;
use crate::dispatch::floor::run::UpdateRecord;
use crate::dispatch::floor::run_view::RunView;
use crate::dispatch::floor::{DispatchError, Floor};

pub use decide::{MachineChange, Need, decide, machine_change, need, release_gate};

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

/// What a reconcile of one Machine left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// The guard record afterwards.
    pub guard: Option<GuardRecord>,
    /// Whether the run still waits for its guard.
    pub pending: bool,
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

    /// One reconcile of `machine` (see the module docs), never overlapping another of the same Machine.
    pub async fn reconcile(&self, machine: &MachineRef) -> Result<Reconciled, DispatchError> {
        let lock = {
            let mut locks = lock_set(&self.reconciling);
            locks.entry(machine.clone()).or_default().clone()
        };
        let held = lock.lock().await;
        let reconciled = self.reconcile_alone(machine).await;
        drop(held);
        let mut locks = lock_set(&self.reconciling);
        // Ours and the map's: nobody else waits for it.
        if Arc::strong_count(&lock) == 2 {
            locks.remove(machine);
        }
        reconciled
    }

    async fn reconcile_alone(&self, machine: &MachineRef) -> Result<Reconciled, DispatchError> {
        let db = &self.floor.db;
        let mut guard = None;
        for attempt in 0..=CAS_ATTEMPTS {
            if attempt == CAS_ATTEMPTS {
                return Err(DispatchError::Contention(guard_key(machine)));
            }
            let record = db.value::<MachineRecord>(&machine_key(machine)).await?;
            let run_id = record.as_ref().map(|r| r.run_id.clone());
            let run = match &run_id {
                Some(id) => db.value::<RunView>(&update_key(machine, id)).await?,
                None => None,
            };
            let current = db.read::<GuardRecord>(&guard_key(machine)).await?;
            let before = current.as_ref().map(|(g, _)| said(g));
            let now = self.floor.now_ms();
            let next = decide(
                machine,
                run_id.as_deref(),
                run.as_ref(),
                current.as_ref().map(|(g, _)| g),
                now,
                kept_past_deadline(run.as_ref()),
            );
            let Some(next) = next else {
                guard = current.map(|(g, _)| g);
                break;
            };
            let precondition = current.as_ref().map_or(Precondition::Absent, |(_, e)| {
                Precondition::Revision(e.revision)
            });
            let put = Put::of(guard_key(machine), &next, precondition)?;
            if db.commit(vec![put]).await? == Committed::Done {
                log_change(machine, &next);
                if before != Some(said(&next)) {
                    let uid = record.as_ref().and_then(|r| r.uid.as_deref());
                    self.floor.outbox.post(guard_event(machine, uid, &next));
                }
                guard = Some(next);
                break;
            }
        }
        let mut failed = false;
        if let Some(record) = guard.clone().filter(|g| !g.applied) {
            match self.target.apply(machine, &record).await {
                Ok(applied) => {
                    guard = self
                        .seen_applied(machine, &record, applied)
                        .await?
                        .or(guard);
                }
                Err(_) => failed = true,
            }
        }
        let pending = self.release(machine, guard.as_ref(), failed).await?;
        let mut set = self.pending();
        if pending {
            set.insert(machine.clone());
        } else {
            set.remove(machine);
        }
        Ok(Reconciled { guard, pending })
    }

    /// Records that the Machine now matches `record` (if the record is still as applied).
    async fn seen_applied(
        &self,
        machine: &MachineRef,
        record: &GuardRecord,
        applied: Applied,
    ) -> Result<Option<GuardRecord>, DispatchError> {
        let now = self.floor.now_ms();
        self.floor
            .db
            .update::<GuardRecord, _>(&guard_key(machine), |current| {
                Ok(current
                    .filter(|c| c.run_id == record.run_id && c.want == record.want && !c.applied)
                    .map(|c| GuardRecord {
                        applied: true,
                        operator_value: applied.operator_value && c.want == GuardWant::On,
                        updated_ms: now,
                        ..c.clone()
                    }))
            })
            .await
    }

    /// Lets the Machine's run start when its guard is settled (or setting it `failed`); whether it still waits.
    async fn release(
        &self,
        machine: &MachineRef,
        guard: Option<&GuardRecord>,
        failed: bool,
    ) -> Result<bool, DispatchError> {
        let db = &self.floor.db;
        let Some(record) = db.value::<MachineRecord>(&machine_key(machine)).await? else {
            return Ok(false);
        };
        let key = update_key(machine, &record.run_id);
        let mut waits = false;
        db.update::<UpdateRecord, _>(&key, |run| {
            let Some(run) = run.filter(|r| r.guard_pending.is_some()) else {
                waits = false;
                return Ok(None);
            };
            let view = RunView::of(run);
            let keep = kept_past_deadline(Some(&view));
            let not_needed = matches!(need(Some(&view), self.floor.now_ms(), keep), Need::Off(_));
            if release_gate(run.guard_pending.as_deref(), guard, failed || not_needed) {
                waits = false;
                let mut next = run.clone();
                next.guard_pending = None;
                if failed {
                    tracing::warn!(machine = %machine, run = %next.plan.id, "remediation guard not set (the management cluster's API failed): the update goes on unguarded; retrying");
                }
                return Ok(Some(next));
            }
            waits = true;
            Ok(None)
        })
        .await?;
        Ok(waits)
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

/// The guards the updater holds now, as the store records them (with or without a management client).
pub async fn held(floor: &Floor) -> Result<Vec<GuardRecord>, DispatchError> {
    Ok(floor
        .db
        .per_machine::<GuardRecord>(GUARDS_PREFIX)
        .await?
        .into_iter()
        .map(|(_, g)| g)
        .filter(GuardRecord::held)
        .collect())
}

/// `status`'s line for the guards `held`.
pub fn status_line(held: &[GuardRecord]) -> String {
    if held.is_empty() {
        return "remediation guards: none held".to_owned();
    }
    let each: Vec<String> = held
        .iter()
        .map(|g| {
            let step = g
                .step
                .map_or(String::new(), |s| format!(", step {}", s + 1));
            format!("{} ({}{step})", g.machine, g.value)
        })
        .collect();
    format!(
        "remediation guards: {} held (cluster.x-k8s.io/skip-remediation): {}",
        held.len(),
        each.join(", ")
    )
}

/// Retention: guard records lifted and seen lifted `--retention` ago (with or without a management client:
/// records of a server that ran with one are swept by one that runs without).
pub async fn sweep(floor: &Floor) -> Result<usize, DispatchError> {
    let horizon = floor
        .now_ms()
        .saturating_sub(floor.config.retention.as_millis() as u64);
    let mut deleted = 0;
    for entry in floor.db.store().list(GUARDS_PREFIX).await? {
        let done = serde_json::from_slice::<GuardRecord>(&entry.value).map_or(true, |g| {
            g.want == GuardWant::Off && g.applied && g.updated_ms < horizon
        });
        if done && floor.db.delete_as_listed(&entry).await? {
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Whether run `run`'s guard stays on past a step's deadline: the setting it was recorded with.
fn kept_past_deadline(run: Option<&RunView>) -> bool {
    run.is_some_and(|r| r.guard_kept_past_deadline)
}

/// What a guard record says to operators: a change of it is an Event.
fn said(record: &GuardRecord) -> (GuardWant, Option<LiftReason>, bool) {
    (record.want, record.lifted, record.kept_past_deadline)
}

/// The Event on the Machine when its guard is set, kept past a deadline, or lifted.
fn guard_event(machine: &MachineRef, uid: Option<&str>, record: &GuardRecord) -> MachineEvent {
    let (reason, note) = match (record.want, record.lifted) {
        (GuardWant::On, _) if record.kept_past_deadline => (
            Reason::RemediationGuardKept,
            format!(
                "{SKIP_REMEDIATION_ANNOTATION}={} kept past the step's deadline by setting \
                 {REMEDIATION_GUARD_PAST_DEADLINE_SETTING}=keep: the node has not come back; remediation \
                 stays off until the run moves on or ends",
                record.value
            ),
        ),
        (GuardWant::On, _) => (
            Reason::RemediationGuardSet,
            format!(
                "{SKIP_REMEDIATION_ANNOTATION}={} while run {} can take the node down",
                record.value, record.run_id
            ),
        ),
        (GuardWant::Off, Some(LiftReason::Deadline)) => (
            Reason::RemediationGuardExpired,
            format!(
                "{SKIP_REMEDIATION_ANNOTATION} lifted at the step's deadline so remediation can act: the \
                 node has not come back"
            ),
        ),
        (GuardWant::Off, lifted) => (
            Reason::RemediationGuardLifted,
            format!(
                "{SKIP_REMEDIATION_ANNOTATION} lifted: {}",
                lifted.map_or("the run needs it no more", LiftReason::as_str)
            ),
        ),
    };
    MachineEvent::new(machine, uid, reason, note)
}

fn lock_set<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn log_change(machine: &MachineRef, record: &GuardRecord) {
    match (record.want, record.lifted) {
        (GuardWant::On, _) => {
            tracing::info!(machine = %machine, run = %record.run_id, value = %record.value, "remediation guard: setting skip-remediation on the Machine")
        }
        (GuardWant::Off, reason) => {
            tracing::info!(machine = %machine, run = %record.run_id, reason = reason.map_or("", |r| r.as_str()), "remediation guard: lifting skip-remediation from the Machine")
        }
    }
}

//! The dispatcher's outbox: what happened to a Machine's update that an operator should see as a Kubernetes
//! Event on the Machine (issue 40), as plain values. The wings post where they decide it; `src/mgmt`, when the
//! server has a management cluster, connects the sink that turns them into events.k8s.io/v1 Events
//! (aggregated, rate-bounded, sent by a task of its own). Posting never blocks, never fails the caller and
//! does nothing while no sink is connected (`serve --dev`, the demo, every test without one).

use std::sync::{Arc, OnceLock};

use inplace_agent_api::MachineRef;

/// Why an Event is posted: its `reason` (CamelCase, as Kubernetes reasons are), its `type` and its `action`.
/// One list: a new kind of Event is one variant here and its three arms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// A new run was recorded: what will change and the plan's step count.
    UpdateRecorded,
    /// A new run or the next step waits for the Machine's maintenance window.
    HeldByWindow,
    /// The Machine's updates are paused (annotation or ExtensionConfig setting).
    HeldByPause,
    /// A new run waits for the fleet-wide update budget.
    HeldByBudget,
    /// A new run waits: its change's health gates fail.
    HeldByGate,
    /// A new run waits for its change's canaries to prove it.
    HeldByCanary,
    /// A new run waits for its change to soak.
    HeldBySoak,
    /// A new run waits: as many Machines as a change may run at once are running it.
    HeldByChangePace,
    /// A new run waits: its change is halted (the failure brake or an operator).
    HeldByBrake,
    /// A step of the run failed.
    StepFailed,
    /// The failed run is being rolled back.
    RollbackStarted,
    /// The rollback ended: the node is back where the run started.
    RolledBack,
    /// The rollback failed: the node is left cordoned.
    RollbackFailed,
    /// The server set the remediation guard (`cluster.x-k8s.io/skip-remediation`) while a step takes the node
    /// down.
    RemediationGuardSet,
    /// The server removed the remediation guard: the node is back.
    RemediationGuardLifted,
    /// The server removed the remediation guard at the step's deadline: the node has not come back, so
    /// remediation may act.
    RemediationGuardExpired,
    /// The step's deadline passed with the node not back and the guard stays on (the run's
    /// `remediationGuardPastDeadline: keep`).
    RemediationGuardKept,
    /// The run ended: every step done.
    UpdateDone,
}

/// An Event's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
    /// Nothing is wrong.
    Normal,
    /// Something an operator may have to act on.
    Warning,
}

impl EventType {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

impl Reason {
    /// Every reason, in the order an update meets them.
    pub const ALL: [Reason; 18] = [
        Reason::UpdateRecorded,
        Reason::HeldByWindow,
        Reason::HeldByPause,
        Reason::HeldByBudget,
        Reason::HeldByGate,
        Reason::HeldByCanary,
        Reason::HeldBySoak,
        Reason::HeldByChangePace,
        Reason::HeldByBrake,
        Reason::StepFailed,
        Reason::RollbackStarted,
        Reason::RolledBack,
        Reason::RollbackFailed,
        Reason::RemediationGuardSet,
        Reason::RemediationGuardLifted,
        Reason::RemediationGuardExpired,
        Reason::RemediationGuardKept,
        Reason::UpdateDone,
    ];

    /// The Event's `reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::UpdateRecorded => "UpdateRecorded",
            Reason::HeldByWindow => "HeldByWindow",
            Reason::HeldByPause => "HeldByPause",
            Reason::HeldByBudget => "HeldByBudget",
            Reason::HeldByGate => "HeldByGate",
            Reason::HeldByCanary => "HeldByCanary",
            Reason::HeldBySoak => "HeldBySoak",
            Reason::HeldByChangePace => "HeldByChangePace",
            Reason::HeldByBrake => "HeldByBrake",
            Reason::StepFailed => "StepFailed",
            Reason::RollbackStarted => "RollbackStarted",
            Reason::RolledBack => "RolledBack",
            Reason::RollbackFailed => "RollbackFailed",
            Reason::RemediationGuardSet => "RemediationGuardSet",
            Reason::RemediationGuardLifted => "RemediationGuardLifted",
            Reason::RemediationGuardExpired => "RemediationGuardExpired",
            Reason::RemediationGuardKept => "RemediationGuardKept",
            Reason::UpdateDone => "UpdateDone",
        }
    }

    /// The Event's `type`.
    pub fn event_type(self) -> EventType {
        match self {
            Reason::HeldByGate
            | Reason::HeldByBrake
            | Reason::StepFailed
            | Reason::RollbackStarted
            | Reason::RolledBack
            | Reason::RollbackFailed
            | Reason::RemediationGuardExpired
            | Reason::RemediationGuardKept => EventType::Warning,
            _ => EventType::Normal,
        }
    }

    /// The Event's `action`: what the updater was doing about the Machine.
    pub fn action(self) -> &'static str {
        match self {
            Reason::UpdateRecorded | Reason::StepFailed | Reason::UpdateDone => "UpdateInPlace",
            Reason::HeldByWindow
            | Reason::HeldByPause
            | Reason::HeldByBudget
            | Reason::HeldByGate
            | Reason::HeldByCanary
            | Reason::HeldBySoak
            | Reason::HeldByChangePace
            | Reason::HeldByBrake => "Hold",
            Reason::RollbackStarted | Reason::RolledBack | Reason::RollbackFailed => "Rollback",
            Reason::RemediationGuardSet
            | Reason::RemediationGuardLifted
            | Reason::RemediationGuardExpired
            | Reason::RemediationGuardKept => "GuardRemediation",
        }
    }
}

/// One thing that happened to a Machine's update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineEvent {
    /// The Machine.
    pub machine: MachineRef,
    /// Its `metadata.uid`, when the poster knows it (`kubectl describe` matches Events by it).
    pub uid: Option<String>,
    /// Why.
    pub reason: Reason,
    /// What an operator reads: the UpdateMachine message of the moment (the sink bounds its length).
    pub note: String,
}

impl MachineEvent {
    /// An event of `reason` on `machine`.
    pub fn new(
        machine: &MachineRef,
        uid: Option<&str>,
        reason: Reason,
        note: impl Into<String>,
    ) -> Self {
        MachineEvent {
            machine: machine.clone(),
            uid: uid.map(str::to_owned),
            reason,
            note: note.into(),
        }
    }
}

/// Where posted events go (implemented by `src/mgmt`). `post` must not block: a sink that cannot take an event
/// now drops it and counts it.
pub trait EventSink: Send + Sync {
    /// Takes `event`.
    fn post(&self, event: MachineEvent);
}

/// The outbox every wing holds: empty until a sink is connected (once, at start-up).
#[derive(Clone, Default)]
pub struct Outbox(Arc<OnceLock<Arc<dyn EventSink>>>);

impl Outbox {
    /// Connects `sink`; a second sink is ignored (false).
    pub fn connect(&self, sink: Arc<dyn EventSink>) -> bool {
        self.0.set(sink).is_ok()
    }

    /// Posts `event` to the sink, if one is connected.
    pub fn post(&self, event: MachineEvent) {
        if let Some(sink) = self.0.get() {
            sink.post(event);
        }
    }

    /// Whether a sink is connected (a poster may skip building an event nobody takes).
    pub fn is_connected(&self) -> bool {
        self.0.get().is_some()
    }
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("connected", &self.is_connected())
            .finish()
    }
}

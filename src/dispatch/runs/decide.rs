//! UpdateMachine's decision: a pure function of the request, the snapshot loaded for it and now, returning the
//! records to write in one transaction and what to answer from. No store, no clock: table-tested alone.
//!
//! In order: is this call a repeat of the recorded input (then nothing is judged or built); may its desired
//! state run at all (the licence, [`crate::dispatch::licence::grant`], which also says what the change moves);
//! would it start a new run outside the maintenance window (then it waits); which `kubeadm upgrade` this
//! Machine runs (the first control-plane Machine whose change moves it to a version claims `apply`); the
//! provider-id index; an operator retry; the Machine record for this desired state (the same state learns the
//! new spelling, another state gets a new run); the operator's holds; the run record when the current run is
//! not recorded yet.

use inplace_agent_api::{KubeadmUpgradeMode, Plan};
use inplace_core::Action;
use inplace_core::plan::MachineFacts;
use inplace_store::Precondition;

use super::answer::{PAUSED_SETTING, window_closed};
use super::planning::{node_change_of, plan_for};
use super::request::{UpdateAnswer, UpdateRequest, run_id};
use super::retry::{self, RetryOutcome};
use crate::dispatch::floor::records::{ApplyClaim, CancelMark, MachineRecord, ProviderIndex};
use crate::dispatch::floor::run::{RunOutcome, RunView, UpdateRecord};
use crate::dispatch::floor::{DispatchConfig, DispatchError};
use crate::dispatch::licence::{Licence, Refusal, VerdictRecord, grant};
use inplace_core::knobs::PAUSE_ANNOTATION;

/// What UpdateMachine reads before deciding.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The Machine record and its revision.
    pub record: Option<(MachineRecord, inplace_store::Revision)>,
    /// The `kubeadm upgrade apply` claim this call competes for: `None` when it competes for none, `Some(None)`
    /// when nobody holds it yet.
    pub claim: Option<Option<ApplyClaim>>,
    /// The verdict covering the desired Machine (read only when the call is not a repeat).
    pub verdict: Option<VerdictRecord>,
    /// The provider-id index entry of the Machine's provider id (read only when the call is not a repeat).
    pub provider: Option<ProviderIndex>,
    /// The record's current run.
    pub run: Option<RunView>,
}

/// A record the decision writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// This Machine claims `kubeadm upgrade apply` for its version (create only).
    Claim(ApplyClaim),
    /// The Machine's provider id points at it.
    Provider(ProviderIndex),
    /// The Machine record, if its revision is still the loaded one (create when none was loaded).
    Machine(MachineRecord, Precondition),
    /// A new run (create only).
    Run(UpdateRecord),
}

/// Something worth a log line (or a wake-up) once the writes are committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The operator's accept-unjudged annotation granted a state no verdict judged.
    GrantedByOperator {
        /// The state's fingerprint.
        fingerprint: String,
    },
    /// A new run became current.
    Recorded {
        /// Its id.
        run_id: String,
        /// Its steps.
        steps: usize,
    },
    /// An operator retry value was handled.
    Retry {
        /// The value.
        value: String,
        /// What it did.
        outcome: RetryOutcome,
    },
    /// The pause changed (to this; `None`: lifted).
    Paused(Option<String>),
    /// A new cancel value was recorded.
    Cancel(CancelMark),
}

/// What to do.
#[derive(Debug, Clone)]
pub enum Decision {
    /// No CanUpdate answer accepted this desired state: nothing is written; the refusal is noted and answered.
    Refused(Refusal),
    /// Answer this without writing (a new run waits for its maintenance window).
    Answer(UpdateAnswer),
    /// Commit the writes (none for a repeat), then answer from the record and run after them.
    Commit(Box<Commit>),
}

/// The records a decision writes in one transaction and the state it answers from.
#[derive(Debug, Clone)]
pub struct Commit {
    /// The records to write, all or none.
    pub writes: Vec<Write>,
    /// The Machine record after them.
    pub record: MachineRecord,
    /// Its current run after them.
    pub run: RunView,
    /// What to log once committed.
    pub events: Vec<Event>,
}

/// The key of the `kubeadm upgrade apply` claim a control-plane Machine with a version competes for, when the
/// policy lets this call change the version.
pub fn claim_key(request: &UpdateRequest) -> Option<String> {
    let facts: &MachineFacts = &request.desired.facts;
    let version = facts.version.as_deref().filter(|_| facts.control_plane)?;
    request
        .inputs
        .actions
        .contains(&Action::KubernetesVersion)
        .then(|| {
            crate::dispatch::floor::keys::apply_claim_key(
                &facts.machine.namespace,
                &facts.cluster,
                version,
            )
        })
}

/// Which `kubeadm upgrade` the Machine runs given the claim as loaded: `apply` when it holds the claim or nobody
/// does yet (it claims it then), `node` otherwise.
pub fn upgrade_mode(
    request: &UpdateRequest,
    claim: Option<&Option<ApplyClaim>>,
) -> KubeadmUpgradeMode {
    match claim {
        None => KubeadmUpgradeMode::Node,
        Some(Some(holder)) if holder.machine != request.desired.facts.machine.name => {
            KubeadmUpgradeMode::Node
        }
        Some(_) => KubeadmUpgradeMode::Apply,
    }
}

/// Whether the call repeats the input the Machine record was last built from (then nothing is judged or built).
pub fn is_repeat(request: &UpdateRequest, snapshot: &Snapshot) -> bool {
    let mode = upgrade_mode(request, snapshot.claim.as_ref());
    snapshot
        .record
        .as_ref()
        .is_some_and(|(record, _)| record.input_hash == request.input_hash(mode))
}

/// The plan for the request, built at most once per decision.
struct Planner<'a> {
    request: &'a UpdateRequest,
    mode: KubeadmUpgradeMode,
    change: inplace_core::drain::NodeChange,
    built: Option<Plan>,
}

impl Planner<'_> {
    fn plan(&mut self) -> Result<&Plan, DispatchError> {
        let plan = match self.built.take() {
            Some(plan) => plan,
            None => plan_for(self.request, self.mode, &self.change)?,
        };
        Ok(self.built.insert(plan))
    }
}

/// Decides what UpdateMachine writes and answers for `request` on `snapshot` at `now_ms`.
pub fn decide(
    request: &UpdateRequest,
    snapshot: &Snapshot,
    config: &DispatchConfig,
    now_ms: u64,
) -> Result<Decision, DispatchError> {
    let facts = &request.desired.facts;
    let knobs = &request.desired.knobs;
    let loaded = snapshot.record.as_ref();
    let record = loaded.map(|(record, _)| record);
    let mode = upgrade_mode(request, snapshot.claim.as_ref());
    let input_hash = request.input_hash(mode).to_owned();
    let repeat = record.is_some_and(|r| r.input_hash == input_hash);
    let mut events = Vec::new();
    let mut writes = Vec::new();

    let (licensed, judged_change) = if repeat {
        (None, None)
    } else {
        let desired = request.desired_print()?;
        match grant(
            &request.desired,
            &desired,
            record,
            snapshot.verdict.as_ref(),
            config.verdict_retention,
        ) {
            Licence::Refused(refusal) => return Ok(Decision::Refused(refusal)),
            Licence::Granted {
                fingerprint,
                change,
                by_operator,
            } => {
                if by_operator {
                    events.push(Event::GrantedByOperator {
                        fingerprint: fingerprint.clone(),
                    });
                }
                (Some(fingerprint), change)
            }
        }
    };
    // A repeat is the recorded state: its record knows the change. Otherwise only this call's licence does
    // (the record may be of another desired state).
    let known = if repeat {
        record.map(|r| &r.node_change)
    } else {
        judged_change.as_ref()
    };
    let mut planner = Planner {
        request,
        mode,
        change: node_change_of(request, known),
        built: None,
    };
    let retry_value = knobs.retry.as_deref().filter(|_| !repeat);

    // Outside the window no new run starts: neither a new desired state nor a retry of a failed run. Decided
    // before the `kubeadm upgrade apply` claim, so a waiting Machine claims nothing.
    if !repeat
        && let Some(window) = &request.window
        && let Some(waiting) =
            window_closed(window, now_ms, "the update", config.retry_after_seconds)
    {
        let starts = match record {
            None => true,
            Some(record) if planner.plan()?.id != record.state_hash => true,
            Some(record) => retry_value.is_some_and(|value| {
                record.retry.as_ref().is_none_or(|m| m.value != value)
                    && snapshot
                        .run
                        .as_ref()
                        .is_some_and(|run| matches!(run.outcome(), RunOutcome::Failed { .. }))
            }),
        };
        if starts {
            return Ok(Decision::Answer(waiting));
        }
    }

    // Only a plan that upgrades claims `apply`: a change that leaves the version alone runs no kubeadm upgrade.
    if !repeat
        && snapshot.claim == Some(None)
        && planner.change.actions.contains(&Action::KubernetesVersion)
    {
        writes.push(Write::Claim(ApplyClaim {
            machine: facts.machine.name.clone(),
            claimed_ms: now_ms,
        }));
    }
    // A repeated call never writes the index: it is written with the record that starts a run.
    if !repeat
        && facts.provider_id.is_some()
        && snapshot.provider.as_ref().map(|p| &p.machine) != Some(&facts.machine)
    {
        writes.push(Write::Provider(ProviderIndex {
            machine: facts.machine.clone(),
        }));
    }

    let mut current = record.cloned();
    let mut run = snapshot.run.clone();
    let mut fresh: Option<UpdateRecord> = None;
    if let (Some(value), Some(record)) = (retry_value, &current)
        && record.retry.as_ref().is_none_or(|m| m.value != value)
        && planner.plan()?.id == record.state_hash
    {
        let plan = planner.plan()?.clone();
        if let Some(retried) = retry::retry(
            record,
            run.as_ref().map(RunView::outcome).as_ref(),
            || Some(plan),
            value,
            now_ms,
        ) {
            events.push(Event::Retry {
                value: value.to_owned(),
                outcome: retried.outcome,
            });
            if let Some(started) = retried.fresh {
                let started =
                    started.guarded(config.remediation_guard, request.keep_guard_past_deadline);
                run = Some(RunView::of(&started));
                fresh = Some(started);
            }
            current = Some(retried.record);
        }
    }

    let mut next = match current {
        Some(record) if repeat => record,
        current => {
            let plan = planner.plan()?;
            match current {
                // Same desired state from a differently spelled input: keep the run, learn the spelling.
                Some(record) if record.state_hash == plan.id => MachineRecord {
                    input_hash,
                    licensed: licensed.unwrap_or(record.licensed.clone()),
                    ..record
                },
                current => {
                    let run_id = run_id(&plan.id, current.as_ref().map(|r| r.run_id.as_str()));
                    // A retry value that came with a new desired state is spent: the new state gets a run
                    // of its own anyway.
                    let retry = match retry_value {
                        Some(value) => Some(crate::dispatch::floor::records::RetryMark {
                            value: value.to_owned(),
                            run_id: run_id.clone(),
                            ignored: false,
                        }),
                        None => current.as_ref().and_then(|r| r.retry.clone()),
                    };
                    events.push(Event::Recorded {
                        run_id: run_id.clone(),
                        steps: plan.steps.len(),
                    });
                    run = None;
                    MachineRecord {
                        state_hash: plan.id.clone(),
                        input_hash,
                        licensed: licensed.unwrap_or_default(),
                        run_id,
                        cluster: facts.cluster.clone(),
                        provider_id: facts.provider_id.clone(),
                        since_ms: now_ms,
                        retry,
                        paused: current.as_ref().and_then(|r| r.paused.clone()),
                        cancel: current.as_ref().and_then(|r| r.cancel.clone()),
                        window: current.as_ref().and_then(|r| r.window.clone()),
                        node_change: planner.change.clone(),
                        on_failure: current.as_ref().and_then(|r| r.on_failure),
                        uid: None,
                    }
                }
            }
        }
    };

    // The holds, read on every call: the pause setting is not part of the input fingerprint.
    let paused = match &knobs.paused {
        Some(value) => Some(format!("annotation {PAUSE_ANNOTATION}={value}")),
        None => request
            .paused_setting
            .as_deref()
            .filter(|v| !v.is_empty())
            .map(|v| format!("ExtensionConfig setting {PAUSED_SETTING}={v}")),
    };
    if next.paused != paused {
        events.push(Event::Paused(paused.clone()));
        next.paused = paused;
    }
    next.window = request.window.clone();
    next.on_failure = knobs.on_failure.or(request.on_failure_setting);
    next.uid = request.uid().map(str::to_owned);
    if let Some(value) = &knobs.cancel
        && next.cancel.as_ref().is_none_or(|m| &m.value != value)
    {
        let mark = CancelMark {
            value: value.clone(),
            run_id: next.run_id.clone(),
        };
        events.push(Event::Cancel(mark.clone()));
        next.cancel = Some(mark);
    }

    let run = match run {
        Some(run) => run,
        None => {
            let mut plan = planner.plan()?.clone();
            plan.id = next.run_id.clone();
            let started = UpdateRecord::new(plan, now_ms)
                .guarded(config.remediation_guard, request.keep_guard_past_deadline);
            let view = RunView::of(&started);
            fresh = Some(started);
            view
        }
    };
    if let Some(started) = fresh {
        writes.push(Write::Run(started));
    }
    if record != Some(&next) {
        let precondition = match loaded {
            None => Precondition::Absent,
            Some((_, revision)) => Precondition::Revision(*revision),
        };
        writes.push(Write::Machine(next.clone(), precondition));
    }
    Ok(Decision::Commit(Box::new(Commit {
        writes,
        record: next,
        run,
        events,
    })))
}

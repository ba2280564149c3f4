//! The runs wing: UpdateMachine's records and answers. Each call is *load* (a snapshot, reads only) →
//! *decide* (pure, [`decide::decide`]) → *commit* (the records as one store transaction; a conflict loads and
//! decides again) → *answer* (from what was committed, never from memory, so a restart or another replica
//! answers the same). Also the operator retry of `inplace-updater retry`, which has no request to decide from.

mod answer;
mod decide;
mod events;
mod load;
mod planning;
mod request;
mod retry;

use std::sync::Arc;

use inplace_agent_api::MachineRef;
use inplace_core::knobs::check_retry_value;
use inplace_store::Precondition;

pub use answer::{
    FAILURE_STDERR_EXCERPT_BYTES, Inputs, PAUSED_SETTING, ago, answer, held_answer, resume_command,
    window_closed,
};
pub use decide::{Commit, Decision, Event, Snapshot, Write, claim_key, decide, upgrade_mode};
pub use planning::{node_change_of, plan_for};
pub use request::{UpdateAnswer, UpdateRequest, run_id};
pub use retry::{Retried, RetryOutcome, retry_command};

use super::agents::Agents;
use super::changes::Budget;
use super::changes::budget::Admission;
use super::changes::{ChangeId, Changes, GateVars, Paced};
use super::fleet::Fleet;
use super::floor::db::{CAS_ATTEMPTS, Committed, Put};
use super::floor::keys::{agent_key, machine_key, provider_key, update_key};
use super::floor::outbox::{MachineEvent, Reason};
use super::floor::records::{AgentRecord, MachineRecord};
use super::floor::run::{RunOutcome, RunView, UpdateRecord};
use super::floor::{DispatchError, Floor};
use super::licence::Licences;

/// The runs wing.
#[derive(Clone)]
pub struct Runs {
    floor: Floor,
    licences: Licences,
    agents: Arc<Agents>,
    fleet: Arc<Fleet>,
    changes: Arc<Changes>,
    budget: Arc<Budget>,
}

impl Runs {
    /// The wing over `floor`, answering with what `agents` and `fleet` know, starting new runs as `budget` admits.
    pub fn new(
        floor: Floor,
        licences: Licences,
        agents: Arc<Agents>,
        fleet: Arc<Fleet>,
        changes: Arc<Changes>,
        budget: Arc<Budget>,
    ) -> Runs {
        Runs {
            floor,
            licences,
            agents,
            fleet,
            changes,
            budget,
        }
    }

    /// Records the run for the desired state (idempotently) and answers from the store. A desired state no
    /// CanUpdate answer accepted in place is refused before anything is written (no run, no `kubeadm upgrade
    /// apply` claim); a repeated call for the run already recorded skips that check.
    pub async fn update_machine(
        &self,
        request: &UpdateRequest,
    ) -> Result<UpdateAnswer, DispatchError> {
        let facts = &request.desired.facts;
        for _ in 0..CAS_ATTEMPTS {
            let snapshot = load::load(&self.floor, &self.licences, request).await?;
            let now = self.floor.now_ms();
            let Commit {
                writes,
                record,
                run,
                events,
            } = match decide(request, &snapshot, &self.floor.config, now)? {
                Decision::Refused(refusal) => {
                    self.licences.note_refusal(facts, &refusal).await;
                    return Ok(UpdateAnswer::Refused {
                        reason: refusal.reason,
                        message: refusal.message,
                    });
                }
                Decision::Answer(answer) => {
                    // Only a new run outside its maintenance window is answered without a commit.
                    self.post(request, Reason::HeldByWindow, events::message(&answer));
                    return Ok(answer);
                }
                Decision::Commit(commit) => *commit,
            };
            let mut extra = Vec::new();
            if let Some(paced) = self.pace(request, &writes, &record).await? {
                match paced {
                    Paced::Go(put) => extra.push(put),
                    Paced::Wait {
                        message,
                        retry_after_seconds,
                        held,
                    } => {
                        self.post(request, held, &message);
                        return Ok(UpdateAnswer::InProgress {
                            message,
                            retry_after_seconds,
                        });
                    }
                }
            }
            // A new run starts only with its update budget slots, taken in the transaction that records it.
            let fresh = writes.iter().find_map(|write| match write {
                Write::Run(run) => Some(&run.plan),
                _ => None,
            });
            let slots = match fresh {
                None => Vec::new(),
                Some(plan) => match self
                    .budget
                    .admit(&facts.machine, &request.machine, plan)
                    .await?
                {
                    Admission::Admitted(ops) => ops,
                    Admission::Wait(waiting) => {
                        self.post(request, Reason::HeldByBudget, &waiting.message);
                        return Ok(UpdateAnswer::InProgress {
                            message: waiting.message,
                            retry_after_seconds: waiting.retry_after_seconds,
                        });
                    }
                },
            };
            let wrote = !writes.is_empty();
            if self.commit(request, writes, extra, slots).await? == Committed::Conflict {
                continue;
            }
            self.after(&facts.machine, &events);
            if wrote {
                // Local polls wake now; other replicas wake from the change feed.
                self.agents.changed(&facts.machine);
            }
            let answer = self.answer(&record, &run).await;
            self.post_answer(request, &events, &record, &run, &answer);
            return Ok(answer);
        }
        Err(DispatchError::Contention(machine_key(&facts.machine)))
    }

    /// Posts an Event of `reason` on the request's Machine.
    fn post(&self, request: &UpdateRequest, reason: Reason, note: &str) {
        let machine = &request.desired.facts.machine;
        self.floor
            .outbox
            .post(MachineEvent::new(machine, request.uid(), reason, note));
    }

    /// Posts what a committed call is worth: the run it recorded, the hold its answer is made of.
    fn post_answer(
        &self,
        request: &UpdateRequest,
        happened: &[Event],
        record: &MachineRecord,
        run: &RunView,
        answer: &UpdateAnswer,
    ) {
        if !self.floor.outbox.is_connected() {
            return;
        }
        for event in happened {
            if let Event::Recorded { run_id, .. } = event {
                self.post(
                    request,
                    Reason::UpdateRecorded,
                    &events::recorded_note(run_id, run),
                );
            }
        }
        if let Some(reason) = events::held(record, run, self.floor.now_ms()) {
            self.post(request, reason, events::message(answer));
        }
    }

    /// For a paced registration's new run, what its change says ([`Changes::admit`]); `None` when the
    /// registration is not paced or the writes start no run.
    async fn pace(
        &self,
        request: &UpdateRequest,
        writes: &[Write],
        record: &MachineRecord,
    ) -> Result<Option<Paced>, DispatchError> {
        if !request.pacing.is_on() {
            return Ok(None);
        }
        let Some(run) = writes.iter().find_map(|w| match w {
            Write::Run(run) => Some(run),
            _ => None,
        }) else {
            return Ok(None);
        };
        let facts = &request.desired.facts;
        let change = ChangeId::of(&record.node_change, facts.version.as_deref(), &run.plan);
        let node = request
            .machine
            .pointer("/status/nodeRef/name")
            .and_then(|v| v.as_str())
            .unwrap_or(&facts.machine.name);
        let vars = GateVars {
            node: node.to_owned(),
            cluster: facts.cluster.clone(),
            namespace: facts.machine.namespace.clone(),
        };
        self.changes
            .admit(
                &facts.machine,
                &run.plan.id,
                &change,
                &request.pacing,
                &vars,
                request.desired.knobs.skip_soak,
            )
            .await
            .map(Some)
    }

    async fn commit(
        &self,
        request: &UpdateRequest,
        writes: Vec<Write>,
        extra: Vec<Put>,
        slots: Vec<inplace_store::TxnOp>,
    ) -> Result<Committed, DispatchError> {
        let machine = &request.desired.facts.machine;
        let mut puts = Vec::with_capacity(writes.len() + extra.len());
        puts.extend(extra);
        for write in writes {
            puts.push(match write {
                Write::Claim(claim) => Put::of(
                    claim_key(request).ok_or_else(|| {
                        DispatchError::BadRequest("no apply claim for this Machine".into())
                    })?,
                    &claim,
                    Precondition::Absent,
                )?,
                Write::Provider(index) => {
                    let id = request
                        .desired
                        .facts
                        .provider_id
                        .as_deref()
                        .unwrap_or_default();
                    Put::of(provider_key(id), &index, Precondition::Any)?
                }
                Write::Machine(record, precondition) => {
                    Put::of(machine_key(machine), &record, precondition)?
                }
                Write::Run(run) => Put::of(
                    update_key(machine, &run.plan.id),
                    &run,
                    Precondition::Absent,
                )?,
            });
        }
        let ops = puts.into_iter().map(Put::op).chain(slots).collect();
        self.floor.db.commit_ops(ops).await
    }

    /// Logs what a committed decision did.
    fn after(&self, machine: &MachineRef, events: &[Event]) {
        for event in events {
            match event {
                Event::GrantedByOperator { fingerprint } => tracing::warn!(
                    %machine,
                    state = %inplace_core::verdict::operator_fingerprint(fingerprint),
                    "an operator accepted a desired state no CanUpdate answer judged ({}); \
                     running what the agent manages",
                    inplace_core::knobs::ACCEPT_UNJUDGED_ANNOTATION
                ),
                Event::Recorded { run_id, steps } => tracing::info!(
                    %machine,
                    run = %run_id.chars().take(12).collect::<String>(),
                    steps,
                    "update recorded"
                ),
                Event::Retry { value, outcome } => retry::log(machine, value, outcome),
                Event::Paused(Some(by)) => {
                    tracing::warn!(%machine, by, "updates paused: no new step starts")
                }
                Event::Paused(None) => {
                    tracing::info!(%machine, "pause lifted: the update continues")
                }
                Event::Cancel(mark) => tracing::warn!(
                    %machine,
                    value = mark.value,
                    run = %mark.run_id.chars().take(12).collect::<String>(),
                    "operator cancel: the run stops after its running step"
                ),
            }
        }
    }

    /// The answer for `record`'s current `run`; the agent's last contact and refusal are read only while the
    /// run waits for it or runs a step that reboots the node.
    async fn answer(&self, record: &MachineRecord, run: &RunView) -> UpdateAnswer {
        let machine = &run.plan.machine;
        let rebooting = match run.outcome() {
            RunOutcome::InProgress { index } => run
                .plan
                .steps
                .get(index)
                .is_some_and(|step| step.action.kind.reboots()),
            _ => false,
        };
        let (last_seen, refusal) = if run.outcome() == RunOutcome::Waiting || rebooting {
            // Best effort: the answer stands without them.
            let stored = self
                .floor
                .db
                .value::<AgentRecord>(&agent_key(machine))
                .await
                .ok()
                .flatten()
                .map(|agent| agent.last_seen_ms);
            let refusal = self.agents.refusals.last(machine).await.ok().flatten();
            (self.agents.last_contact(machine).max(stored), refusal)
        } else {
            (None, None)
        };
        let durations = self.fleet.durations();
        answer(&Inputs {
            record,
            run,
            last_seen,
            refusal: refusal.as_ref(),
            now_ms: self.floor.now_ms(),
            config: &self.floor.config,
            durations: &durations,
        })
    }

    /// `inplace-updater retry`: handles retry `value` for `machine` — when its current run failed and the value
    /// is new, a fresh run of the same desired state becomes current; a new value on a run that did not fail
    /// is recorded and ignored. One transaction: the Machine record and the fresh run.
    pub async fn retry(
        &self,
        machine: &MachineRef,
        value: &str,
    ) -> Result<RetryOutcome, DispatchError> {
        check_retry_value(value).map_err(|err| DispatchError::BadRequest(err.to_string()))?;
        let key = machine_key(machine);
        for _ in 0..CAS_ATTEMPTS {
            let Some((record, entry)) = self.floor.db.read::<MachineRecord>(&key).await? else {
                return Ok(RetryOutcome::NoRecord);
            };
            let run = self
                .floor
                .db
                .value::<UpdateRecord>(&update_key(machine, &record.run_id))
                .await?;
            let outcome = run.as_ref().map(UpdateRecord::outcome);
            // The retried run keeps the setting its failed run was recorded with (the CLI has no settings).
            let kept = run.as_ref().is_some_and(|r| r.guard_kept_past_deadline);
            let Some(retried) = retry::retry(
                &record,
                outcome.as_ref(),
                || run.map(|run| run.plan),
                value,
                self.floor.now_ms(),
            ) else {
                return Ok(RetryOutcome::AlreadySeen);
            };
            let mut puts = vec![Put::of(
                key.clone(),
                &retried.record,
                Precondition::Revision(entry.revision),
            )?];
            let guarded = self.floor.config.remediation_guard;
            if let Some(fresh) = retried.fresh.map(|run| run.guarded(guarded, kept)).as_ref() {
                puts.push(Put::of(
                    update_key(machine, &fresh.plan.id),
                    fresh,
                    Precondition::Absent,
                )?);
            }
            // Someone else changed the record: look again (a racing retry of the same value then finds it
            // recorded and does nothing).
            if self.floor.db.commit(puts).await? == Committed::Conflict {
                continue;
            }
            retry::log(machine, value, &retried.outcome);
            self.agents.changed(machine);
            return Ok(retried.outcome);
        }
        Err(DispatchError::Contention(key))
    }
}

#[cfg(test)]
mod decide_tests;

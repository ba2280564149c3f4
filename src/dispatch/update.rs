//! UpdateMachine's side of dispatch: record the run for the desired state (once), then answer from what the
//! store says about it — never from memory, so a restart or another replica gives the same answer.

use std::collections::BTreeSet;

use inplace_agent_api::{KubeadmUpgradeMode, MachineRef, Plan};
use inplace_core::Action;
use inplace_core::drain::DrainRules;
use inplace_core::plan::MachineFacts;
use inplace_store::{Precondition, Write};
use serde_json::value::RawValue;
use sha2::{Digest as _, Sha256};

use super::hold::{CANCEL_ANNOTATION, OperatorHolds, held_answer, hold_on};
use super::licence::Licence;
use super::pace::{self, RetryAfterMode, RunPace};
pub use super::planning::plan_for;
use super::planning::{node_change_of, plan_id_without_node_steps};
use super::records::{
    AgentRecord, ApplyClaim, MachineRecord, ProviderIndex, RetryMark, RunOutcome, RunView,
    StepState, UpdateRecord, agent_key, apply_claim_key, machine_key, provider_key, update_key,
};
use super::refusals::AgentRefusalRecord;
use super::retry::{RETRY_ANNOTATION, RetryOutcome, retry_command};
use super::verdicts::RefusalReason;
use super::{CONNECTED_WITHIN, DispatchError, Dispatcher, LAST_SEEN_PERSIST_INTERVAL};
use crate::hex;

/// Longest stderr excerpt put in a Failure message (CAPI logs it; our status shows the full tail).
pub const FAILURE_STDERR_EXCERPT_BYTES: usize = 600;

/// What UpdateMachine was asked, decoded as far as answering needs.
#[derive(Debug, Clone)]
pub struct UpdateRequest {
    /// Facts of the desired Machine.
    pub facts: MachineFacts,
    /// The desired Machine's JSON text, as CAPI sent it.
    pub machine: Box<RawValue>,
    /// The desired bootstrap config's JSON text; parsed only when the plan has to be built.
    pub bootstrap: Option<Box<RawValue>>,
    /// The desired infrastructure machine's JSON text; parsed only to check it against a CanUpdate verdict.
    pub infra: Option<Box<RawValue>>,
    /// Actions the policy and settings allow.
    pub actions: BTreeSet<Action>,
    /// The maintenance window in force for this Machine (its annotation, else the ExtensionConfig setting).
    pub window: Option<inplace_core::Window>,
    /// The ExtensionConfig `paused` setting, when set: every Machine of the registration is paused.
    pub paused_setting: Option<String>,
    /// The drain rules of this registration: the policy's `drain:` section with the settings' overrides.
    pub drain_rules: DrainRules,
}

impl UpdateRequest {
    /// A fingerprint of everything the plan is built from: this server's version, the upgrade mode, the
    /// actions and the desired objects' texts (the infrastructure machine's too, which only the verdict check
    /// reads). The same fingerprint always builds the same plan, so a Machine
    /// record carrying it lets a repeated call skip building and hashing the plan. Different texts that mean
    /// the same only cost one build.
    fn input_hash(&self, mode: KubeadmUpgradeMode) -> String {
        let mut hash = Sha256::new();
        hash.update(PLAN_INPUT_VERSION.as_bytes());
        hash.update(match mode {
            KubeadmUpgradeMode::Apply => b"\napply\n",
            KubeadmUpgradeMode::Node => b"\nnode\n\0",
        });
        for action in &self.actions {
            hash.update(action.as_str().as_bytes());
            hash.update(b",");
        }
        hash.update(b"\n");
        let rules = &self.drain_rules;
        for on in [
            rules.patch_version,
            rules.kubelet_args,
            rules.delete_empty_dir_data,
            rules.force_unmanaged,
        ] {
            hash.update(if on { b"1" } else { b"0" });
        }
        hash.update(b"\n");
        hash.update(self.machine.get().as_bytes());
        hash.update(b"\n");
        if let Some(bootstrap) = &self.bootstrap {
            hash.update(bootstrap.get().as_bytes());
        }
        // Not read by the plan, but checked against the CanUpdate verdict: a repeat must be the same text too.
        hash.update(b"\n");
        if let Some(infra) = &self.infra {
            hash.update(infra.get().as_bytes());
        }
        hex(&hash.finalize())
    }
}

/// Names the plan builder in input fingerprints: a new server version builds the plan once more (and keeps
/// the run when the plan is the same).
const PLAN_INPUT_VERSION: &str = concat!("inplace-updater/", env!("CARGO_PKG_VERSION"));

/// How UpdateMachine answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateAnswer {
    /// Call again after `retry_after_seconds`; `message` is what operators see.
    InProgress {
        /// Shown as `In-place update in progress: <message>`.
        message: String,
        /// Seconds.
        retry_after_seconds: i32,
    },
    /// Every step done.
    Done {
        /// Summary.
        message: String,
    },
    /// A step failed: the same answer on every later call for this run.
    Failed {
        /// The failing step and its error.
        message: String,
    },
    /// No CanUpdate answer accepted this desired state in place: nothing was recorded or run.
    Refused {
        /// Why.
        reason: RefusalReason,
        /// The paths and what the operator can do.
        message: String,
    },
}

/// The run id: the desired state's hash chained to the previous run, so returning to an earlier desired
/// state (A → B → A) is a new run the agent executes again, while repeated calls keep the same id.
pub(super) fn run_id(state_hash: &str, previous_run: Option<&str>) -> String {
    hex(&Sha256::digest(
        format!("{state_hash}:{}", previous_run.unwrap_or_default()).as_bytes(),
    ))
}

/// `12s ago`, `5m ago`, `3h ago`.
pub(crate) fn ago(now: u64, then: u64) -> String {
    let seconds = now.saturating_sub(then) / 1000;
    match seconds {
        0..=119 => format!("{seconds}s ago"),
        120..=7199 => format!("{}m ago", seconds / 60),
        _ => format!("{}h ago", seconds / 3600),
    }
}

/// The key of the `kubeadm upgrade apply` claim a control-plane Machine with a version competes for.
fn claim_key(facts: &MachineFacts) -> Option<String> {
    let version = facts.version.as_deref().filter(|_| facts.control_plane)?;
    Some(apply_claim_key(
        &facts.machine.namespace,
        &facts.cluster,
        version,
    ))
}

impl Dispatcher {
    /// Which `kubeadm upgrade` this control-plane Machine runs: the first one to ask for a version claims
    /// `apply` for its cluster (compare-and-swap create); every other one runs `node`.
    async fn upgrade_mode(
        &self,
        facts: &MachineFacts,
    ) -> Result<KubeadmUpgradeMode, DispatchError> {
        let Some(key) = claim_key(facts) else {
            return Ok(KubeadmUpgradeMode::Node);
        };
        let claim = ApplyClaim {
            machine: facts.machine.name.clone(),
            claimed_ms: self.clock.now_ms(),
        };
        let bytes = serde_json::to_vec(&claim).map_err(|err| DispatchError::Corrupt {
            key: key.clone(),
            detail: err.to_string(),
        })?;
        let holder = match self.store.put(&key, bytes, Precondition::Absent).await? {
            Write::Done(_) => claim.machine,
            Write::Conflict(Some(entry)) => {
                let existing: ApplyClaim =
                    serde_json::from_slice(&entry.value).map_err(|err| DispatchError::Corrupt {
                        key: key.clone(),
                        detail: err.to_string(),
                    })?;
                existing.machine
            }
            Write::Conflict(None) => return Err(DispatchError::Contention(key)),
        };
        Ok(if holder == facts.machine.name {
            KubeadmUpgradeMode::Apply
        } else {
            KubeadmUpgradeMode::Node
        })
    }

    /// The upgrade mode this Machine would get, without claiming anything: `apply` when it holds the claim or
    /// nobody does yet.
    async fn peek_upgrade_mode(
        &self,
        facts: &MachineFacts,
    ) -> Result<KubeadmUpgradeMode, DispatchError> {
        let Some(key) = claim_key(facts) else {
            return Ok(KubeadmUpgradeMode::Node);
        };
        Ok(match self.read::<ApplyClaim>(&key).await? {
            Some((claim, _)) if claim.machine != facts.machine.name => KubeadmUpgradeMode::Node,
            _ => KubeadmUpgradeMode::Apply,
        })
    }

    /// Points the node's provider id at its Machine, unless the index already does.
    async fn index_provider(
        &self,
        provider_id: &str,
        machine: &MachineRef,
    ) -> Result<(), DispatchError> {
        let key = provider_key(provider_id);
        match self.read::<ProviderIndex>(&key).await? {
            Some((index, _)) if &index.machine == machine => Ok(()),
            _ => {
                self.put_any(
                    &key,
                    &ProviderIndex {
                        machine: machine.clone(),
                    },
                )
                .await
            }
        }
    }

    /// Records the run for the desired state (idempotently) and answers from the store. A desired state no
    /// CanUpdate answer accepted in place is refused before anything is written (no run, no `kubeadm upgrade
    /// apply` claim); a repeated call for the run already recorded skips that check.
    pub async fn update_machine(
        &self,
        request: &UpdateRequest,
    ) -> Result<UpdateAnswer, DispatchError> {
        let facts = &request.facts;
        let uses_version = request.actions.contains(&Action::KubernetesVersion);
        let existing = self
            .read::<MachineRecord>(&machine_key(&facts.machine))
            .await?;
        let peeked = if uses_version {
            self.peek_upgrade_mode(facts).await?
        } else {
            KubeadmUpgradeMode::Node
        };
        let mut input_hash = request.input_hash(peeked);
        let repeat = existing
            .as_ref()
            .is_some_and(|(r, _)| r.input_hash.as_deref() == Some(input_hash.as_str()));
        let mut licensed = None;
        let mut judged_change = None;
        if !repeat {
            match self
                .licence(request, existing.as_ref().map(|(r, _)| r), peeked)
                .await?
            {
                Licence::Refused(refusal) => {
                    return Ok(UpdateAnswer::Refused {
                        reason: refusal.reason,
                        message: refusal.message,
                    });
                }
                Licence::Granted {
                    fingerprint,
                    change,
                } => {
                    licensed = Some(fingerprint);
                    judged_change = change;
                }
            }
        }
        // A repeat is the recorded state: its record knows the change. Otherwise only this call's licence does
        // (the record may be of another desired state).
        let known = if repeat {
            existing.as_ref().and_then(|(r, _)| r.node_change.as_ref())
        } else {
            judged_change.as_ref()
        };
        let change = node_change_of(request, known);
        // Outside the window no new run starts: neither a new desired state nor a retry of a failed run.
        // Checked before the `kubeadm upgrade apply` claim, so a waiting Machine claims nothing.
        if let Some(window) = request.window.as_ref().filter(|_| !repeat)
            && let Some(waiting) = self.window_closed(window, "the update")
            && self
                .would_start_run(request, existing.as_ref().map(|(r, _)| r), peeked, &change)
                .await?
        {
            return Ok(waiting);
        }
        let mode = if uses_version && !repeat {
            self.upgrade_mode(facts).await?
        } else {
            peeked
        };
        if mode != peeked {
            input_hash = request.input_hash(mode);
        }
        // Before the Machine record that starts a run: a repeated call never writes the index, so a crash
        // between the two writes in the other order left an agent that names its provider id without a plan.
        if !repeat && let Some(provider_id) = &facts.provider_id {
            self.index_provider(provider_id, &facts.machine).await?;
        }
        let now = self.clock.now_ms();

        // Built only when the Machine record does not already carry this input's fingerprint (CAPI asks
        // again every few seconds while an update runs, always with the same objects).
        let mut built: Option<Plan> = None;
        // A retry value is part of the input text, so a new one never arrives as a repeat.
        let mut existing = existing;
        let retry = if repeat {
            None
        } else {
            super::retry::retry_value(request.machine.get())?
        };
        if let Some(value) = &retry
            && existing
                .as_ref()
                .is_some_and(|(r, _)| r.retry.as_ref().is_none_or(|m| &m.value != value))
        {
            let plan = built.insert(plan_for(request, mode, &change)?);
            // A run recorded before drains were planned holds the state without node steps: the retry
            // compares that one (the run continues as recorded, so it restarts as recorded too).
            let state = match existing.as_ref() {
                Some((record, _))
                    if record
                        .converges_to(&plan.id, || plan_id_without_node_steps(request, mode)) =>
                {
                    record.state_hash.clone()
                }
                _ => plan.id.clone(),
            };
            let outcome = self.retry(&facts.machine, value, Some(&state)).await?;
            if !matches!(outcome, RetryOutcome::OtherState) {
                existing = self
                    .read::<MachineRecord>(&machine_key(&facts.machine))
                    .await?;
            }
        }
        let mut switched = false;
        let record = match existing {
            Some((record, _)) if repeat => record,
            existing => self
                .update_from(
                    &machine_key(&facts.machine),
                    Some(existing),
                    |current: Option<&MachineRecord>| {
                        switched = false;
                        if current
                            .is_some_and(|r| r.input_hash.as_deref() == Some(input_hash.as_str()))
                        {
                            return Ok(None);
                        }
                        let plan = match &built {
                            Some(plan) => plan,
                            None => built.insert(plan_for(request, mode, &change)?),
                        };
                        // A run recorded before plans had node steps keeps going for the same state.
                        let same_state = current.filter(|r| {
                            r.converges_to(&plan.id, || plan_id_without_node_steps(request, mode))
                        });
                        switched = same_state.is_none();
                        Ok(Some(match same_state {
                            // Same desired state from a differently spelled input: keep the run, learn the spelling.
                            Some(record) => MachineRecord {
                                input_hash: Some(input_hash.clone()),
                                licensed: licensed.clone().or_else(|| record.licensed.clone()),
                                node_change: record
                                    .node_change
                                    .clone()
                                    .or_else(|| judged_change.clone()),
                                ..record.clone()
                            },
                            None => {
                                let run_id = run_id(&plan.id, current.map(|r| r.run_id.as_str()));
                                // A retry value that came with a new desired state is spent: the new
                                // state gets a run of its own anyway.
                                let retry = match &retry {
                                    Some(value) => Some(RetryMark {
                                        value: value.clone(),
                                        run_id: run_id.clone(),
                                        ignored: false,
                                    }),
                                    None => current.and_then(|r| r.retry.clone()),
                                };
                                MachineRecord {
                                    state_hash: plan.id.clone(),
                                    input_hash: Some(input_hash.clone()),
                                    licensed: licensed.clone(),
                                    run_id,
                                    cluster: facts.cluster.clone(),
                                    provider_id: facts.provider_id.clone(),
                                    since_ms: now,
                                    retry,
                                    paused: current.and_then(|r| r.paused.clone()),
                                    cancel: current.and_then(|r| r.cancel.clone()),
                                    window: current.and_then(|r| r.window.clone()),
                                    node_change: Some(change.clone()),
                                    node_steps: true,
                                }
                            }
                        }))
                    },
                )
                .await?
                .ok_or_else(|| DispatchError::Contention(machine_key(&facts.machine)))?,
        };
        // Read on every call: the pause setting is not part of the input fingerprint.
        let mut wanted =
            OperatorHolds::read(request.machine.get(), request.paused_setting.as_deref())?;
        wanted.window = request.window.clone();
        let record = self.record_holds(&facts.machine, record, &wanted).await?;
        let key = update_key(&facts.machine, &record.run_id);
        let run = match self.read::<RunView>(&key).await? {
            Some((run, _)) => run,
            None => {
                let mut plan = match built {
                    Some(plan) => plan,
                    None => plan_for(request, mode, &change)?,
                };
                plan.id = record.run_id.clone();
                let fresh = UpdateRecord::new(plan, now);
                let bytes = serde_json::to_vec(&fresh).map_err(|err| DispatchError::Corrupt {
                    key: key.clone(),
                    detail: err.to_string(),
                })?;
                match self.store.put(&key, bytes, Precondition::Absent).await? {
                    Write::Done(_) => RunView::of(&fresh),
                    // Another replica recorded it first: answer from theirs.
                    Write::Conflict(_) => self
                        .read::<RunView>(&key)
                        .await?
                        .map(|(run, _)| run)
                        .ok_or(DispatchError::Contention(key))?,
                }
            }
        };
        if switched {
            tracing::info!(
                machine = %facts.machine,
                run = %record.run_id.chars().take(12).collect::<String>(),
                steps = run.plan.steps.len(),
                "update recorded"
            );
            // The run record is written before the machine record points at it from the agent's point of view
            // only after both exist; wake local waiters now (other replicas wake from the change feed).
            self.wake(&facts.machine);
        }
        let agent = self
            .read::<AgentRecord>(&agent_key(&facts.machine))
            .await?
            .map(|(a, _)| a);
        // Only while waiting for the agent; best effort: the answer stands without it.
        let refusal = match run.outcome() {
            RunOutcome::Waiting => self.last_refusal(&facts.machine).await.ok().flatten(),
            _ => None,
        };
        // A retry value this run ignored is said on every answer while the run has not failed.
        let ignored = record
            .retry
            .as_ref()
            .filter(|m| m.ignored && m.run_id == record.run_id)
            .map(|m| m.value.as_str());
        let window_now = self.clock.now_ms();
        let hold = hold_on(
            &record,
            &record.run_id,
            matches!(run.outcome(), RunOutcome::Done | RunOutcome::Failed { .. }),
            run.cancelled.as_ref().map(|c| &c.value),
            window_now,
        );
        let answer = match hold.filter(|_| !run.outcome().is_failure()) {
            Some(hold) if matches!(hold.reason, inplace_agent_api::HoldReason::Window { .. }) => {
                self.window_held(&record, &run, &hold)
            }
            Some(hold) => held_answer(&run, &hold, None, self.config.retry_after_seconds),
            None => self.answer(&run, agent.as_ref(), refusal.as_ref(), ignored, now),
        };
        Ok(answer)
    }

    fn last_seen(
        &self,
        machine: &inplace_agent_api::MachineRef,
        agent: Option<&AgentRecord>,
    ) -> Option<u64> {
        let local = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(machine)
            .map(|(seen, _)| *seen);
        local.max(agent.map(|a| a.last_seen_ms))
    }

    fn answer(
        &self,
        run: &RunView,
        agent: Option<&AgentRecord>,
        refusal: Option<&AgentRefusalRecord>,
        ignored_retry: Option<&str>,
        now: u64,
    ) -> UpdateAnswer {
        let answer = self.answer_run(run, agent, refusal, now);
        let Some(value) = ignored_retry else {
            return answer;
        };
        let note = format!(
            " ({RETRY_ANNOTATION}={value:?} ignored: a retry only restarts a failed run, and this one has not failed)"
        );
        match answer {
            UpdateAnswer::InProgress {
                message,
                retry_after_seconds,
            } => UpdateAnswer::InProgress {
                message: message + &note,
                retry_after_seconds,
            },
            UpdateAnswer::Done { message } => UpdateAnswer::Done {
                message: message + &note,
            },
            other => other,
        }
    }

    fn answer_run(
        &self,
        run: &RunView,
        agent: Option<&AgentRecord>,
        refusal: Option<&AgentRefusalRecord>,
        now: u64,
    ) -> UpdateAnswer {
        let plan = &run.plan;
        let total = plan.steps.len();
        match run.outcome() {
            RunOutcome::Done => UpdateAnswer::Done {
                message: format!(
                    "in-place update done: {total} step{} on {}",
                    if total == 1 { "" } else { "s" },
                    plan.machine
                ),
            },
            RunOutcome::Failed { index } => {
                let step = &run.steps[index];
                let mut message = format!(
                    "step {}/{total}: {} failed",
                    index + 1,
                    plan.steps[index].description
                );
                if let Some(code) = step.exit_code {
                    message.push_str(&format!(" (exit {code})"));
                }
                if let Some(text) = &step.message {
                    message.push_str(&format!(": {text}"));
                }
                if let Some(tail) = step.stderr_tail.as_deref().filter(|t| !t.trim().is_empty()) {
                    let excerpt = inplace_agent_api::truncate_tail(
                        tail.trim_end(),
                        FAILURE_STDERR_EXCERPT_BYTES,
                    );
                    message.push_str(&format!("; stderr: {excerpt}"));
                }
                message.push_str(&format!(
                    "; to run it again once the cause is fixed: {}",
                    retry_command(&plan.machine)
                ));
                UpdateAnswer::Failed { message }
            }
            RunOutcome::Cancelled { after } => UpdateAnswer::Failed {
                message: format!(
                    "cancelled by operator ({CANCEL_ANNOTATION}={}) after step {after} of {total}; to run it again: {}",
                    run.cancelled.as_ref().map_or("", |c| c.value.as_str()),
                    retry_command(&plan.machine)
                ),
            },
            RunOutcome::Waiting => {
                let last_seen = self.last_seen(&plan.machine, agent);
                let mut seen = match last_seen {
                    None => "never".to_string(),
                    Some(at) => ago(now, at),
                };
                // A refusal since the agent last got through is why it is not here.
                if let Some(refusal) = refusal.filter(|r| last_seen.is_none_or(|at| r.at_ms > at)) {
                    seen.push_str(&format!(
                        "; refused {}: {}",
                        ago(now, refusal.at_ms),
                        refusal.reason.summary()
                    ));
                }
                // An agent long-polling gets the plan at once: its run is paced from now. One not
                // connected is asked about at the fixed pace.
                let horizon = now.saturating_sub(
                    (CONNECTED_WITHIN + LAST_SEEN_PERSIST_INTERVAL).as_millis() as u64,
                );
                let retry_after_seconds = match last_seen {
                    Some(at) if at >= horizon => self.retry_after(run, 0, now),
                    _ => self.config.retry_after_seconds,
                };
                UpdateAnswer::InProgress {
                    message: format!(
                        "waiting for agent on {} (last seen: {seen}); {total} steps planned",
                        plan.machine
                    ),
                    retry_after_seconds,
                }
            }
            RunOutcome::InProgress { index } => {
                let mut message = format!(
                    "step {}/{total}: {}",
                    index + 1,
                    plan.steps[index].description
                );
                // What the agent says about the running step, e.g. which retry attempt is due.
                let step = &run.steps[index];
                if let Some(text) = step
                    .message
                    .as_deref()
                    .filter(|_| step.state == StepState::Running)
                {
                    message.push_str(&format!(" ({text})"));
                }
                UpdateAnswer::InProgress {
                    message,
                    retry_after_seconds: self.retry_after(run, index, now),
                }
            }
        }
    }

    /// `retryAfterSeconds` for `run` whose first unfinished step is `current`: the fixed one, or paced by the
    /// run's expected remaining time ([`super::pace`]).
    fn retry_after(&self, run: &RunView, current: usize, now: u64) -> i32 {
        let config = &self.config;
        if config.retry_after == RetryAfterMode::Fixed {
            return config.retry_after_seconds;
        }
        let kinds = pace::kinds_of(run);
        let at = RunPace {
            kinds: &kinds,
            current,
            current_since_ms: pace::current_since(run, current),
        };
        let remaining = pace::remaining(
            &at,
            &self
                .step_durations
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            now,
        );
        pace::retry_after(
            &remaining,
            config.retry_after_seconds,
            config.retry_after_max_seconds,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_chain_so_returning_to_an_old_state_is_a_new_run() {
        let a1 = run_id("A", None);
        let b = run_id("B", Some(&a1));
        let a2 = run_id("A", Some(&b));
        assert_ne!(a1, a2);
        assert_eq!(a1, run_id("A", None));
    }
}

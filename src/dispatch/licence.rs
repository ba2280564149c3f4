//! UpdateMachine's licence to record a new run: the verdicts CanUpdate recorded, looked up for a Machine
//! (its own CanUpdateMachine verdict first, else its MachineSet's by the `cluster.x-k8s.io/set-name` label),
//! checked against the desired objects, and the refusals answered when none covers them. Also the sweep of
//! verdicts and refusals older than `--verdict-retention`.

use inplace_agent_api::MachineRef;
use inplace_core::verdict::{Desired, Normalized, is_label_value};
use inplace_core::{Objects, Scope};
use inplace_store::{Precondition, Write};
use serde_json::Value;

use super::planning::{node_change_of, plan_for, plan_id_without_node_steps};
use super::records::{MachineRecord, RunView, update_key};
use super::update::UpdateRequest;
use super::verdicts::{
    ACCEPT_UNJUDGED_ANNOTATION, Granted, Judgement, REFUSAL_WARN_INTERVAL, REFUSALS_PREFIX,
    Refusal, RefusalRecord, SET_NAME_LABEL, TEMPLATE_HASH_LABEL, VERDICT_REFRESH, VERDICTS_PREFIX,
    VerdictRecord, judge, machine_set_verdict_key, machine_verdict_key, refusal_key,
};
use super::{DispatchError, Dispatcher};
use inplace_core::drain::NodeChange;

/// Whether a new run may be recorded for a desired state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Licence {
    /// Yes; `fingerprint` is the desired state's, kept with the run.
    Granted {
        /// The desired state's fingerprint.
        fingerprint: String,
        /// What the verdict that granted it judged the change to do to the node (for the drain), when known.
        change: Option<NodeChange>,
    },
    /// No: answer this.
    Refused(Refusal),
}

fn label<'v>(machine: &'v Value, name: &str) -> Option<&'v str> {
    machine.pointer("/metadata/labels")?.get(name)?.as_str()
}

fn parse(
    text: Option<&serde_json::value::RawValue>,
    what: &str,
) -> Result<Option<Value>, DispatchError> {
    text.map(|raw| serde_json::from_str(raw.get()))
        .transpose()
        .map_err(|err| DispatchError::BadRequest(format!("{what}: {err}")))
}

impl Dispatcher {
    /// Records a verdict (a plain put: the latest judgement wins). A judgement equal to the stored one but
    /// for its time is not written again while the stored one is younger than [`VERDICT_REFRESH`] (or half
    /// of `--verdict-retention`, if shorter): CAPI asks CanUpdate again on every reconcile, and on the default
    /// store each write is an fsync, while the read is served from memory.
    pub async fn record_verdict(
        &self,
        key: &str,
        record: &VerdictRecord,
    ) -> Result<(), DispatchError> {
        let refresh = VERDICT_REFRESH.min(self.config.verdict_retention / 2);
        if let Some(stored) = self.verdict(key).await?
            && stored.judged_ms <= record.judged_ms
            && u128::from(record.judged_ms - stored.judged_ms) < refresh.as_millis()
            && (VerdictRecord {
                judged_ms: record.judged_ms,
                ..stored
            }) == *record
        {
            return Ok(());
        }
        self.put_any(key, record).await
    }

    /// A verdict record, or `None` when absent or unreadable (an unreadable verdict licenses nothing).
    async fn verdict(&self, key: &str) -> Result<Option<VerdictRecord>, DispatchError> {
        match self.read::<VerdictRecord>(key).await {
            Ok(found) => Ok(found.map(|(record, _)| record)),
            Err(DispatchError::Corrupt { key, detail }) => {
                tracing::warn!(%key, %detail, "verdict record unreadable; treated as absent");
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }

    /// The verdict covering a Machine: its own, else its MachineSet's.
    pub async fn verdict_for(
        &self,
        machine: &MachineRef,
        object: &Value,
    ) -> Result<Option<VerdictRecord>, DispatchError> {
        if let Some(own) = self.verdict(&machine_verdict_key(machine)).await? {
            return Ok(Some(own));
        }
        let Some(set) =
            label(object, SET_NAME_LABEL).filter(|v| !v.is_empty() && is_label_value(v))
        else {
            return Ok(None);
        };
        let found = self
            .verdict(&machine_set_verdict_key(&machine.namespace, set))
            .await?;
        // Two long MachineSet names CAPI hashed to the same label value: not this Machine's template.
        Ok(found.filter(|verdict| {
            match (&verdict.template_hash, label(object, TEMPLATE_HASH_LABEL)) {
                (Some(judged), Some(own)) => judged == own,
                _ => true,
            }
        }))
    }

    /// Decides whether a new run may be recorded for `request` (the Machine's `existing` record, if any).
    pub(super) async fn licence(
        &self,
        request: &UpdateRequest,
        existing: Option<&MachineRecord>,
        mode: inplace_agent_api::KubeadmUpgradeMode,
    ) -> Result<Licence, DispatchError> {
        let machine: Value = serde_json::from_str(request.machine.get())
            .map_err(|err| DispatchError::BadRequest(format!("machine: {err}")))?;
        let bootstrap = parse(request.bootstrap.as_deref(), "bootstrap config")?;
        let infra = parse(request.infra.as_deref(), "infrastructure machine")?;
        let desired = Desired::new(Normalized::of(
            Scope::Object,
            &Objects {
                machine: Some(&machine),
                bootstrap: bootstrap.as_ref(),
                infra: infra.as_ref(),
            },
        ));
        let fingerprint = desired.fingerprint.clone();
        // The state this Machine's run was licensed for: CAPI asking again with other metadata or spelling.
        if let Some(record) =
            existing.filter(|r| r.licensed.as_deref() == Some(fingerprint.as_str()))
        {
            return Ok(Licence::Granted {
                fingerprint,
                change: record.node_change.clone(),
            });
        }
        let facts = &request.facts;
        let verdict = self.verdict_for(&facts.machine, &machine).await?;
        let accepted_by_operator = machine
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(ACCEPT_UNJUDGED_ANNOTATION))
            .and_then(Value::as_str);
        let judgement = Judgement {
            machine: &facts.machine,
            verdict: verdict.as_ref(),
            desired: &desired,
            accepted_by_operator,
            retention: self.config.verdict_retention,
        };
        match judge(&judgement) {
            Ok(Granted::ByVerdict) => Ok(Licence::Granted {
                fingerprint,
                change: verdict.and_then(|v| v.node_change),
            }),
            Ok(Granted::ByOperator) => {
                tracing::warn!(
                    machine = %facts.machine,
                    state = %inplace_core::verdict::operator_fingerprint(&fingerprint),
                    "an operator accepted a desired state no CanUpdate answer judged ({ACCEPT_UNJUDGED_ANNOTATION}); \
                     running what the agent manages"
                );
                Ok(Licence::Granted {
                    fingerprint,
                    change: None,
                })
            }
            Err(refusal) => {
                if self.legacy_run_continues(request, existing, mode).await {
                    tracing::info!(
                        machine = %facts.machine,
                        "run recorded by a version without verdicts continues for the same desired state"
                    );
                    // That run is of this very state: what its record knows of the change holds.
                    return Ok(Licence::Granted {
                        fingerprint,
                        change: existing.and_then(|r| r.node_change.clone()),
                    });
                }
                self.note_refusal(facts, &refusal).await;
                Ok(Licence::Refused(refusal))
            }
        }
    }

    /// Whether the Machine's current run was recorded by a version that kept no verdicts, is unfinished, and
    /// converges to exactly this request's state: an upgrade in the middle of a rollout must not stop it.
    async fn legacy_run_continues(
        &self,
        request: &UpdateRequest,
        existing: Option<&MachineRecord>,
        mode: inplace_agent_api::KubeadmUpgradeMode,
    ) -> bool {
        let Some(record) = existing.filter(|r| r.licensed.is_none()) else {
            return false;
        };
        let Ok(plan) = plan_for(
            request,
            mode,
            &node_change_of(request, record.node_change.as_ref()),
        ) else {
            return false;
        };
        if !record.converges_to(&plan.id, || plan_id_without_node_steps(request, mode)) {
            return false;
        }
        let key = update_key(&request.facts.machine, &record.run_id);
        matches!(
            self.read::<RunView>(&key).await,
            Ok(Some((run, _))) if matches!(
                run.outcome(),
                super::records::RunOutcome::Waiting | super::records::RunOutcome::InProgress { .. }
            )
        )
    }

    /// Keeps the refusal for `status` and logs it at WARN once (again after [`REFUSAL_WARN_INTERVAL`]). A
    /// store failure here changes nothing about the answer.
    async fn note_refusal(&self, facts: &inplace_core::plan::MachineFacts, refusal: &Refusal) {
        let key = refusal_key(&facts.machine);
        let now = self.clock.now_ms();
        let previous = self
            .read::<RefusalRecord>(&key)
            .await
            .ok()
            .flatten()
            .map(|(record, _)| record);
        let same = previous
            .as_ref()
            .filter(|p| p.reason == refusal.reason && p.fingerprint == refusal.fingerprint);
        let recent = same.is_some_and(|p| {
            now.saturating_sub(p.warned_ms) < REFUSAL_WARN_INTERVAL.as_millis() as u64
        });
        if recent {
            tracing::debug!(machine = %facts.machine, reason = refusal.reason.as_str(), "UpdateMachine refused again");
            return;
        }
        tracing::warn!(
            machine = %facts.machine,
            reason = refusal.reason.as_str(),
            state = %refusal.fingerprint,
            detail = %refusal.message,
            "UpdateMachine refused: its desired state was not accepted by a CanUpdate answer"
        );
        let record = RefusalRecord {
            machine: facts.machine.clone(),
            cluster: facts.cluster.clone(),
            reason: refusal.reason,
            message: refusal.message.clone(),
            fingerprint: refusal.fingerprint.clone(),
            first_ms: same.map_or(now, |p| p.first_ms),
            warned_ms: now,
        };
        if let Err(err) = self.put_any(&key, &record).await {
            tracing::warn!(machine = %facts.machine, error = %err, "refusal not recorded for status");
        }
    }

    /// Deletes verdicts and refusals older than `--verdict-retention`. Returns how many were deleted.
    pub async fn sweep_verdicts(&self) -> Result<usize, DispatchError> {
        let horizon = self
            .clock
            .now_ms()
            .saturating_sub(self.config.verdict_retention.as_millis() as u64);
        let mut deleted = 0;
        for prefix in [VERDICTS_PREFIX, REFUSALS_PREFIX] {
            for entry in self.store.list(prefix).await? {
                let at = if prefix == VERDICTS_PREFIX {
                    serde_json::from_slice::<VerdictRecord>(&entry.value).map(|v| v.judged_ms)
                } else {
                    serde_json::from_slice::<RefusalRecord>(&entry.value).map(|r| r.warned_ms)
                };
                // Unreadable records license nothing and show nothing: they go too.
                if at.is_ok_and(|at| at > horizon) {
                    continue;
                }
                if let Write::Done(_) = self
                    .store
                    .delete(&entry.key, Precondition::Revision(entry.revision))
                    .await?
                {
                    deleted += 1;
                }
            }
        }
        Ok(deleted)
    }
}

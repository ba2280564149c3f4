//! The licence wing: the CanUpdate verdicts we answered (recorded by the CanUpdate hooks, looked up for
//! UpdateMachine: a Machine's own CanUpdateMachine verdict first, else its MachineSet's by the
//! `cluster.x-k8s.io/set-name` label), the pure decision whether a desired state may run ([`grant`]), the
//! refusals answered when none covers it, and the sweep of verdicts and refusals older than
//! `--verdict-retention`.

mod verdicts;

use inplace_agent_api::MachineRef;
use inplace_core::DesiredMachine;
use inplace_core::drain::NodeChange;
use inplace_core::plan::MachineFacts;
use inplace_core::verdict::Desired;

pub use verdicts::{
    Granted, Judgement, MAX_REFUSAL_MESSAGE_CHARS, MAX_REFUSAL_PATHS, MAX_SHOWN_PATH_CHARS,
    MAX_VERDICT_PATHS, REFUSAL_WARN_INTERVAL, Refusal, VERDICT_REFRESH, VerdictHook, VerdictRecord,
    judge,
};
// The refusal record is the floor's: the fleet's `status` reads it too.
pub use super::floor::records::{RefusalReason, RefusalRecord};

use super::floor::keys::{
    REFUSALS_PREFIX, VERDICTS_PREFIX, machine_set_verdict_key, machine_verdict_key, refusal_key,
};
use super::floor::records::MachineRecord;
use super::floor::{DispatchError, Floor};

/// Whether a new run may be recorded for a desired state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Licence {
    /// Yes; `fingerprint` is the desired state's, kept with the run.
    Granted {
        /// The desired state's fingerprint.
        fingerprint: String,
        /// What the verdict that granted it judged the change to do to the node (for the drain), when known.
        change: Option<NodeChange>,
        /// True when the operator's `accept-unjudged` annotation granted it (no verdict did).
        by_operator: bool,
    },
    /// No: answer this.
    Refused(Refusal),
}

/// Decides whether a new run may be recorded for `desired` (the Machine's `record`, if any, and the `verdict`
/// covering it). Pure.
pub fn grant(
    machine: &DesiredMachine,
    desired: &Desired,
    record: Option<&MachineRecord>,
    verdict: Option<&VerdictRecord>,
    retention: std::time::Duration,
) -> Licence {
    let fingerprint = desired.fingerprint.clone();
    // The state this Machine's run was licensed for: CAPI asking again with other metadata or spelling.
    if let Some(record) = record.filter(|r| r.licensed == fingerprint) {
        return Licence::Granted {
            fingerprint,
            change: Some(record.node_change.clone()),
            by_operator: false,
        };
    }
    let judgement = Judgement {
        machine: &machine.facts.machine,
        verdict,
        desired,
        accepted_by_operator: machine.knobs.accept_unjudged.as_deref(),
        retention,
    };
    match judge(&judgement) {
        Ok(Granted::ByVerdict) => Licence::Granted {
            fingerprint,
            change: verdict.and_then(|v| v.node_change.clone()),
            by_operator: false,
        },
        Ok(Granted::ByOperator) => Licence::Granted {
            fingerprint,
            change: None,
            by_operator: true,
        },
        Err(refusal) => Licence::Refused(refusal),
    }
}

/// The licence wing: verdicts and refusals in the store.
#[derive(Clone)]
pub struct Licences {
    floor: Floor,
}

impl Licences {
    /// The wing over `floor`.
    pub fn new(floor: Floor) -> Licences {
        Licences { floor }
    }

    /// Records a verdict (a plain put: the latest judgement wins). A judgement equal to the stored one but
    /// for its time is not written again while the stored one is younger than [`VERDICT_REFRESH`] (or half
    /// of `--verdict-retention`, if shorter): CAPI asks CanUpdate again on every reconcile, and on the default
    /// store each write is an fsync, while the read is served from memory.
    pub async fn record_verdict(
        &self,
        key: &str,
        record: &VerdictRecord,
    ) -> Result<(), DispatchError> {
        let refresh = VERDICT_REFRESH.min(self.floor.config.verdict_retention / 2);
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
        self.floor.db.put_any(key, record).await
    }

    /// A verdict record, or `None` when absent or unreadable (an unreadable verdict licenses nothing).
    async fn verdict(&self, key: &str) -> Result<Option<VerdictRecord>, DispatchError> {
        self.floor.db.value_or_absent::<VerdictRecord>(key).await
    }

    /// The verdict covering a desired Machine: its own, else its MachineSet's.
    pub async fn verdict_for(
        &self,
        machine: &DesiredMachine,
    ) -> Result<Option<VerdictRecord>, DispatchError> {
        let name = &machine.facts.machine;
        if let Some(own) = self.verdict(&machine_verdict_key(name)).await? {
            return Ok(Some(own));
        }
        let Some(set) = &machine.set_name else {
            return Ok(None);
        };
        let found = self
            .verdict(&machine_set_verdict_key(&name.namespace, set))
            .await?;
        // Two long MachineSet names CAPI hashed to the same label value: not this Machine's template.
        Ok(found.filter(
            |verdict| match (&verdict.template_hash, &machine.template_hash) {
                (Some(judged), Some(own)) => judged == own,
                _ => true,
            },
        ))
    }

    /// Keeps the refusal for `status` and logs it at WARN once (again after [`REFUSAL_WARN_INTERVAL`]). A
    /// store failure here changes nothing about the answer.
    pub async fn note_refusal(&self, facts: &MachineFacts, refusal: &Refusal) {
        let key = refusal_key(&facts.machine);
        let now = self.floor.now_ms();
        let previous = self
            .floor
            .db
            .value::<RefusalRecord>(&key)
            .await
            .ok()
            .flatten();
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
        if let Err(err) = self.floor.db.put_any(&key, &record).await {
            tracing::warn!(machine = %facts.machine, error = %err, "refusal not recorded for status");
        }
    }

    /// The refusal last answered for `machine`, if any.
    pub async fn refusal(
        &self,
        machine: &MachineRef,
    ) -> Result<Option<RefusalRecord>, DispatchError> {
        self.floor.db.value(&refusal_key(machine)).await
    }

    /// Deletes verdicts and refusals older than `--verdict-retention`. Returns how many were deleted.
    pub async fn sweep(&self) -> Result<usize, DispatchError> {
        let horizon = self
            .floor
            .now_ms()
            .saturating_sub(self.floor.config.verdict_retention.as_millis() as u64);
        let store = self.floor.db.store();
        let mut deleted = 0;
        for prefix in [VERDICTS_PREFIX, REFUSALS_PREFIX] {
            for entry in store.list(prefix).await? {
                let at = if prefix == VERDICTS_PREFIX {
                    serde_json::from_slice::<VerdictRecord>(&entry.value).map(|v| v.judged_ms)
                } else {
                    serde_json::from_slice::<RefusalRecord>(&entry.value).map(|r| r.warned_ms)
                };
                // Unreadable records license nothing and show nothing: they go too.
                if at.is_ok_and(|at| at > horizon) {
                    continue;
                }
                if self.floor.db.delete_as_listed(&entry).await? {
                    deleted += 1;
                }
            }
        }
        Ok(deleted)
    }
}

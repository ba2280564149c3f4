//! What the rollback tells the server about its undos: each undo's report (an undo's record, flagged `undo`,
//! with the rollback's summary), the `running` report of an undo waiting for room or for the control plane,
//! the progress an undo sequence writes, and the finished undos sent again when the server missed them.

use inplace_agent_api::{AgentIdentity, MESSAGE_MAX_BYTES};

use crate::attempt::drive::write_progress;
use crate::state::{
    LocalStepRecord, LocalStepStatus, PlanRecord, SequenceProgress, StateError, StateStore,
    report_for, truncate_head,
};

/// The `running` report of undo `pos` saying `message` (a wait for room in the state dir) as the rollback's
/// message, which is what the server shows while it rolls back.
pub(super) fn undo_waiting(
    identity: &AgentIdentity,
    store: &StateStore,
    pos: usize,
    message: &str,
) -> Option<inplace_agent_api::StepReport> {
    let record = store.state.current.as_ref()?;
    let rollback = record.rollback.as_ref()?;
    let mut entry = rollback.undos.get(pos)?.clone();
    entry.status = LocalStepStatus::Running;
    entry.message = Some(message.to_owned());
    let index = *rollback.order.get(pos)? as usize;
    let mut report = undo_report(identity, &record.plan_id, index, &entry);
    let mut progress = rollback.progress();
    progress.message = truncate_head(message, inplace_agent_api::MESSAGE_MAX_BYTES).to_owned();
    report.rollback = Some(progress);
    Some(report)
}

/// Writes an undo's waiting message (`message`, about the control plane) as the rollback's and the undo's,
/// and queues the undo's report carrying the rollback's summary; `Ok` once it is on disk.
pub(super) fn record_undo_wait(
    store: &mut StateStore,
    identity: &AgentIdentity,
    pos: usize,
    message: &str,
) -> Result<(), StateError> {
    let gone = || StateError::Io("the undo to write its wait into is gone".into());
    let Some(record) = store.state.current.as_mut() else {
        return Err(gone());
    };
    let plan_id = record.plan_id.clone();
    let Some(rollback) = record.rollback.as_mut() else {
        return Err(gone());
    };
    let text = truncate_head(message, MESSAGE_MAX_BYTES).to_owned();
    rollback.message.clone_from(&text);
    let progress = rollback.progress();
    let index = rollback.order.get(pos).copied().unwrap_or_default() as usize;
    let Some(entry) = rollback.undos.get_mut(pos) else {
        return Err(gone());
    };
    entry.message = Some(text);
    let mut report = undo_report(identity, &plan_id, index, entry);
    report.rollback = Some(progress);
    store.enqueue(report);
    store.save()
}

/// Writes an undo sequence's progress (and a new message, reported as a `running` undo) into the undo's
/// record; `Ok` once it is on disk.
pub(super) fn record_undo_progress(
    store: &mut StateStore,
    identity: &AgentIdentity,
    pos: usize,
    progress: SequenceProgress,
    message: Option<String>,
) -> Result<(), StateError> {
    let index = store
        .state
        .current
        .as_ref()
        .and_then(|r| r.rollback.as_ref()?.order.get(pos).copied())
        .unwrap_or_default() as usize;
    let report =
        |plan_id: &str, undo: &LocalStepRecord| undo_report(identity, plan_id, index, undo);
    write_progress(
        store,
        Some(progress),
        message,
        |record| record.rollback.as_mut()?.undos.get_mut(pos),
        report,
    )
}

/// The report of an undo's record.
pub(super) fn undo_report(
    identity: &AgentIdentity,
    plan_id: &str,
    index: usize,
    entry: &LocalStepRecord,
) -> inplace_agent_api::StepReport {
    let mut report = report_for(identity, plan_id, index, entry);
    report.undo = true;
    report
}

/// The reports of every finished undo of `record`'s rollback (sent again when the server missed them).
pub(crate) fn finished_undo_reports(
    identity: &AgentIdentity,
    record: &PlanRecord,
) -> Vec<inplace_agent_api::StepReport> {
    let Some(rollback) = &record.rollback else {
        return Vec::new();
    };
    rollback
        .order
        .iter()
        .zip(&rollback.undos)
        .filter(|(_, u)| {
            matches!(
                u.status,
                LocalStepStatus::Succeeded | LocalStepStatus::Failed
            )
        })
        .map(|(&i, u)| {
            let mut report = undo_report(identity, &record.plan_id, i as usize, u);
            report.rollback = Some(rollback.progress());
            report
        })
        .collect()
}

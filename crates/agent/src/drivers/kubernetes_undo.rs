//! The undo of the package steps (installKubeadm, installKubelet; issue 28), from the agent config's
//! `record:` and `undo:` of their sequence.
//!
//! Before the step's first effect (only when it never began) the `record:` commands run and their values —
//! trimmed, bounded and of a restricted character set (`crate::sequence::undo`) — go into the step's
//! [`UndoRecord::Commands`] in `state.json`, with snapshots of the files the sequence's `writeFile` commands
//! replace (e.g. the package repository line of the old minor). Any failure there fails the step before it
//! changes anything. The undo puts those files back, then runs the `undo:` commands with
//! `{{record.<name>}}` templated in, recording its progress per command like a forward sequence: an
//! interrupted undo runs `undo.onResume`, then continues at its first unfinished command.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::driver::{RecordFuture, StepFuture, blocking_value};
use super::error::DriverError;
use super::kubernetes::sequence_of;
use super::prepared::{Prepared, fingerprint, prepare};
use super::sequence_run::{SequenceList, run_list};
use super::step::Done;
use super::undo::{Place, RecordContext, UndoContext, UndoRecord, restore, snapshot};
use crate::os::driver_env::DriverEnv;
use crate::sequence::command::CommandSpec;
use crate::sequence::process::{display_argv, run_command};
use crate::sequence::template::expand;
use crate::sequence::undo::record_value;

/// Runs the sequence's `record:` commands and snapshots its `writeFile` targets. `None` when the step has no
/// configured sequence (it then fails before any effect).
pub(super) fn record(env: Arc<DriverEnv>, ctx: RecordContext) -> RecordFuture {
    Box::pin(async move {
        let Ok(configured) = sequence_of(&env.config, &ctx.step.action) else {
            return Ok(None);
        };
        let Some(sequence) = configured.sequence else {
            return Ok(None);
        };
        let label = configured.label();
        let vars = configured.vars(&env);
        let mut values = BTreeMap::new();
        for (i, entry) in sequence.record.iter().enumerate() {
            let at = format!("{label}.record[{i}] ({})", entry.name);
            let argv = entry
                .run
                .iter()
                .map(|a| expand(a, &vars))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| DriverError::from(e).at(&at))?;
            let mut cancel = ctx.cancel.clone();
            let output = run_command(&argv, &env.command_env, ctx.deadline, &mut cancel).await;
            let value =
                record_value(entry, &output.end, &output.stdout_tail).map_err(|source| {
                    let stderr = output.stderr_tail.trim();
                    DriverError::Record {
                        shown: display_argv(&argv),
                        source,
                        stderr: (!stderr.is_empty()).then(|| stderr.to_owned()),
                    }
                    .at(&at)
                })?;
            values.insert(entry.name.clone(), value);
        }
        let places = sequence
            .commands
            .iter()
            .filter_map(|command| match &command.spec {
                CommandSpec::WriteFile { path, .. } => Some(expand(path, &vars).map(Place::Node)),
                _ => None,
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| DriverError::from(e).at(&label))?;
        let (plan_id, index) = (ctx.plan_id.clone(), ctx.index);
        let places = tokio::task::spawn_blocking(move || snapshot(&env, &plan_id, index, places))
            .await
            .map_err(|source| DriverError::Crashed {
                what: "crashed: ",
                source,
            })??;
        Ok(Some(UndoRecord::Commands { values, places }))
    })
}

/// Restores the snapshotted files, then runs `undo:` from its first unfinished command.
pub(super) fn undo(env: Arc<DriverEnv>, ctx: UndoContext) -> StepFuture {
    Box::pin(async move {
        let mut ctx = ctx;
        let Some(record @ UndoRecord::Commands { .. }) = ctx.record.take() else {
            return Err(DriverError::refused(
                "nothing was recorded before the step began",
            ));
        };
        let action = ctx.step.action.clone();
        let configured = sequence_of(&env.config, &action)?;
        let (key, label) = (configured.key, configured.label());
        let Some(undo) = configured.sequence.and_then(|s| s.undo.as_ref()) else {
            return Err(DriverError::refused(format!(
                "the agent config has no {label}.undo: this {} step cannot be undone",
                ctx.step.action.kind()
            )));
        };
        let mut vars = configured.vars(&env);
        if let UndoRecord::Commands { values, .. } = &record {
            vars.records = values.clone();
        }
        let undo_key = format!("{key}.undo");
        let undo_label = format!("{label}.undo");
        let commands = prepare(&env, &undo_label, "commands", &undo.commands, &vars)?;
        let on_resume = prepare(&env, &undo_label, "onResume", &undo.on_resume, &vars)?;
        let id = fingerprint(&undo_key, &commands);
        let label = undo_label;
        let list = SequenceList {
            label: &label,
            commands: &commands,
            specs: &undo.commands,
            on_resume: &on_resume,
            retry: undo.retry,
            id: &id,
        };
        let index = ctx.index;
        let mut step_ctx = ctx.into_step_context();
        let restored = if record.places().is_empty() {
            0
        } else {
            let (blocking_env, plan_id) = (env.clone(), step_ctx.plan_id.clone());
            let work = move || restore(&blocking_env, &plan_id, index, &record);
            blocking_value(&step_ctx, work).await?
        };
        let (first, retried) = run_list(&env, &mut step_ctx, &list).await?;
        let total = commands.len();
        let mut message = if first == 0 {
            let ran = commands
                .iter()
                .filter(|c| !matches!(c, Prepared::Skip))
                .count();
            format!("{ran} undo commands ran: back from {}", configured.version)
        } else {
            format!(
                "undo resumed at command {} of {total}: back from {}",
                first + 1,
                configured.version
            )
        };
        if restored > 0 {
            message.push_str(&format!("; {restored} files restored byte-equal"));
        }
        if !retried.is_empty() {
            message.push_str(&format!(" ({})", retried.join("; ")));
        }
        Ok(Done::ok(message))
    })
}

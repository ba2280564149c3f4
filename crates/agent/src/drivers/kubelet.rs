//! The `kubeletArgs` driver: sets the flags the updater manages inside `KUBELET_KUBEADM_ARGS`
//! of kubeadm's flags file, keeps every other flag and line as it is, and removes flags an
//! earlier plan set that this one dropped (journaled in `<state-dir>/managed-kubelet-args.json`).
//! kubelet is restarted when the file changed, or changed earlier without a restart since
//! ([`super::restart`]).

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use inplace_agent_api::{KubeletArg, StepAction, StepKind};
use serde::{Deserialize, Serialize};

use super::driver::{Driver, StepFuture, wrong_kind};
use super::error::DriverError;
use super::restart::{BeforeChange, write_then_restart};
use super::step::StepContext;
use super::undo::{Place, UndoContext, restore_then_restart};
use crate::fsutil::{FileMeta, atomic_write, read_journal, read_optional, write_journal};
use crate::os::driver_env::DriverEnv;

/// The variable kubeadm writes.
const VARIABLE: &str = "KUBELET_KUBEADM_ARGS";
/// Journal of the flag names this driver owns.
const JOURNAL: &str = "managed-kubelet-args.json";
/// Mode of a flags file the agent creates (kubeadm's own choice).
const FLAGS_FILE_MODE: u32 = 0o644;

/// `unfinished.json` key of the kubelet restart.
const RESTART_KEY: &str = "kubeletArgs.restart";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Journal {
    names: BTreeSet<String>,
}

/// The `kubeletArgs` driver.
pub(crate) struct KubeletArgs;

impl Driver for KubeletArgs {
    fn kind(&self) -> StepKind {
        StepKind::KubeletArgs
    }

    fn run(&self, env: Arc<DriverEnv>, ctx: StepContext) -> StepFuture {
        let StepAction::KubeletArgs { args } = ctx.step.action.clone() else {
            return wrong_kind(self.kind(), &ctx.step.action);
        };
        let restart = env.config.kubelet.restart.clone();
        Box::pin(write_then_restart(
            env,
            ctx,
            RESTART_KEY,
            restart,
            move |env, plan_id, before_change| write(env, plan_id, &args, before_change),
        ))
    }

    fn undo_places(
        &self,
        env: &DriverEnv,
        _action: &StepAction,
    ) -> Result<Option<Vec<Place>>, DriverError> {
        Ok(Some(vec![
            Place::Node(env.config.kubelet.flags_file.clone()),
            Place::State(JOURNAL.to_owned()),
        ]))
    }

    fn undo(&self, env: Arc<DriverEnv>, ctx: UndoContext) -> StepFuture {
        let restart = env.config.kubelet.restart.clone();
        restore_then_restart(env, ctx, Some((RESTART_KEY, restart)))
    }
}

/// Updates the flags file; returns (changed, summary). `before_change` is marked right before the
/// file is written (it records that a restart is owed).
fn write(
    env: &DriverEnv,
    plan_id: &str,
    args: &[KubeletArg],
    before_change: BeforeChange<'_>,
) -> Result<(bool, String), DriverError> {
    let node_path = &env.config.kubelet.flags_file;
    let path = env.fs.path(node_path)?;
    let journal_path = env.state_dir.join(JOURNAL);
    let mut journal: Journal = read_journal(
        &journal_path,
        "move it away to forget which flags the agent set",
    )?;
    let existing = read_optional(&path, crate::limits::MAX_KUBELET_FLAGS_BYTES)?;
    let text = match &existing {
        Some(bytes) => String::from_utf8(bytes.clone())
            .map_err(|_| DriverError::refused(format!("{node_path} is not UTF-8")))?,
        None => String::new(),
    };
    let updated = update_flags(&text, args, &journal.names);
    let names: BTreeSet<String> = args.iter().map(|a| a.name.clone()).collect();
    if updated == text && existing.is_some() {
        journal.names = names;
        write_journal(&journal_path, &journal)?;
        return Ok((false, format!("{} kubelet flags already set", args.len())));
    }
    journal.names.extend(names.iter().cloned());
    write_journal(&journal_path, &journal)?;
    let (mode, owner) = match std::fs::metadata(&path) {
        Ok(found) => (
            std::os::unix::fs::PermissionsExt::mode(&found.permissions()) & 0o7777,
            env.is_root.then(|| (found.uid(), found.gid())),
        ),
        Err(_) => (FLAGS_FILE_MODE, env.is_root.then_some((0, 0))),
    };
    env.backups.save(plan_id, node_path, &path)?;
    before_change.mark()?;
    atomic_write(&path, updated.as_bytes(), FileMeta { mode, owner })?;
    journal.names = names;
    write_journal(&journal_path, &journal)?;
    Ok((
        true,
        format!("{} kubelet flags written to {node_path}", args.len()),
    ))
}

fn flag_name(token: &str) -> &str {
    let bare = token.trim_start_matches('-');
    bare.split('=').next().unwrap_or(bare)
}

/// The file text with `KUBELET_KUBEADM_ARGS` holding `args` (in place of same-named flags),
/// without the `managed` flags `args` dropped, and with everything else unchanged.
pub(crate) fn update_flags(text: &str, args: &[KubeletArg], managed: &BTreeSet<String>) -> String {
    let prefix = format!("{VARIABLE}=");
    let mut out = String::with_capacity(text.len() + 64);
    let mut seen_line = false;
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches(['\n', '\r']);
        match body.strip_prefix(&prefix) {
            Some(value) if !seen_line => {
                seen_line = true;
                out.push_str(&render(value, args, managed));
                out.push_str(&line[body.len()..]);
            }
            _ => out.push_str(line),
        }
    }
    if !seen_line {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&render("", args, managed));
        out.push('\n');
    }
    out
}

fn render(value: &str, args: &[KubeletArg], managed: &BTreeSet<String>) -> String {
    let inner = value.trim();
    let inner = inner
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .or_else(|| inner.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
        .unwrap_or(inner);
    let mut placed = BTreeSet::new();
    let mut tokens = Vec::new();
    for token in inner.split_whitespace() {
        let name = flag_name(token);
        if let Some(arg) = args.iter().find(|a| a.name == name) {
            if placed.insert(name.to_owned()) {
                tokens.push(format!("--{}={}", arg.name, arg.value));
            }
        } else if !managed.contains(name) {
            tokens.push(token.to_owned());
        }
    }
    for arg in args {
        if !placed.contains(&arg.name) {
            tokens.push(format!("--{}={}", arg.name, arg.value));
        }
    }
    format!("{VARIABLE}=\"{}\"", tokens.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(name: &str, value: &str) -> KubeletArg {
        KubeletArg {
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn replaces_adds_and_removes_only_managed_flags() {
        let text = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock --max-pods=110 --old=1\"\n";
        let managed = BTreeSet::from(["old".to_owned()]);
        let out = update_flags(
            text,
            &[arg("max-pods", "200"), arg("node-labels", "a=b")],
            &managed,
        );
        assert_eq!(
            out,
            "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock --max-pods=200 --node-labels=a=b\"\n"
        );
        assert_eq!(
            update_flags(
                &out,
                &[arg("max-pods", "200"), arg("node-labels", "a=b")],
                &managed
            ),
            out
        );
    }

    #[test]
    fn creates_the_line_when_missing_and_keeps_other_lines() {
        assert_eq!(
            update_flags("", &[arg("v", "2")], &BTreeSet::new()),
            "KUBELET_KUBEADM_ARGS=\"--v=2\"\n"
        );
        assert_eq!(
            update_flags("# comment\nOTHER=1", &[arg("v", "2")], &BTreeSet::new()),
            "# comment\nOTHER=1\nKUBELET_KUBEADM_ARGS=\"--v=2\"\n"
        );
    }
}

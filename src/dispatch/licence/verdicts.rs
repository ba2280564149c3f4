//! The CanUpdate verdicts we answered, kept so UpdateMachine performs only what one of them accepted, and the
//! refusals UpdateMachine answered when none did: the records and the pure decision ([`judge`]); the store
//! work is the wing's (`licence/mod.rs`).
//!
//! A verdict is recorded for every CanUpdate answered `Success` (a `Failure` is no verdict: CAPI stops there),
//! keyed by the desired Machine (CanUpdateMachine) or by the value of the `cluster.x-k8s.io/set-name` label the
//! desired MachineSet gives its Machines (CanUpdateMachineSet), so a Machine moved to that MachineSet finds
//! it whether CAPI hashed the name into the label or not. The latest judgement wins. Records hold paths and
//! short hashes only, never a value.

use std::time::Duration;

use inplace_agent_api::MachineRef;
use inplace_core::drain::NodeChange;
use inplace_core::knobs::ACCEPT_UNJUDGED_ANNOTATION;
use inplace_core::verdict::{
    CheckMode, Desired, Mismatch, Normalized, Prints, operator_fingerprint,
};
use inplace_core::{ChangeVerdict, Decision, DecisionOutcome};
use serde::{Deserialize, Serialize};

use crate::dispatch::floor::records::RefusalReason;

/// A CanUpdate judgement identical to the stored one is written again (its time refreshed) only once the
/// stored one is this old: between refreshes a verdict's time is that of the first of the identical
/// judgements, so `--verdict-retention` counts from at most this long before the latest one.
pub const VERDICT_REFRESH: Duration = Duration::from_secs(3600);
/// Accepted (and rejected) paths a verdict record lists for operators; the rest are counted.
pub const MAX_VERDICT_PATHS: usize = 64;
/// Longest path shown in a verdict record or a refusal, in characters (longer ones are cut with `…`).
pub const MAX_SHOWN_PATH_CHARS: usize = 256;
/// Paths a refusal message names before it counts the rest (`… and 12 more`).
pub const MAX_REFUSAL_PATHS: usize = 8;
/// Longest refusal message, in characters (CAPI logs it; `status` shows it).
pub const MAX_REFUSAL_MESSAGE_CHARS: usize = 4096;
/// A refusal repeated by CAPI's retries is logged at WARN again after this long (once per refusal otherwise).
pub const REFUSAL_WARN_INTERVAL: Duration = Duration::from_secs(3600);

/// Which hook judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum VerdictHook {
    /// Per Machine (KubeadmControlPlane).
    CanUpdateMachine,
    /// Per MachineSet template (MachineDeployment).
    CanUpdateMachineSet,
}

impl VerdictHook {
    /// How UpdateMachine's objects are compared with a verdict of this hook.
    pub fn mode(self) -> CheckMode {
        match self {
            VerdictHook::CanUpdateMachine => CheckMode::Exact,
            VerdictHook::CanUpdateMachineSet => CheckMode::TemplateSubset,
        }
    }
}

/// One CanUpdate answer, as UpdateMachine checks against it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerdictRecord {
    /// The hook that judged.
    pub hook: VerdictHook,
    /// `namespace/name` of the Machine or MachineSet judged.
    pub object: String,
    /// When (Unix ms).
    pub judged_ms: u64,
    /// Whether every compared change was accepted in place (CAPI then updates in place).
    pub in_place: bool,
    /// Accepted paths (`KubeadmConfig spec.files[path=/x].content`), at most [`MAX_VERDICT_PATHS`].
    #[serde(default)]
    pub accepted: Vec<String>,
    /// Rejected paths, at most [`MAX_VERDICT_PATHS`].
    #[serde(default)]
    pub rejected: Vec<String>,
    /// How many paths were rejected in all.
    #[serde(default)]
    pub rejected_total: usize,
    /// The MachineSet's `machine-template-hash` (CanUpdateMachineSet), to tell two names hashed alike apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    /// What the accepted changes do to the node (version change, actions): UpdateMachine decides the drain
    /// from it. Absent in verdicts of versions before drains were planned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_change: Option<NodeChange>,
    /// Fingerprints of the normalised desired objects judged.
    pub prints: Prints,
    /// Fingerprint of all of `prints`.
    pub fingerprint: String,
}

/// Cuts a path for showing.
fn cut(path: String) -> String {
    if path.chars().count() <= MAX_SHOWN_PATH_CHARS {
        return path;
    }
    let mut out: String = path.chars().take(MAX_SHOWN_PATH_CHARS - 1).collect();
    out.push('…');
    out
}

impl VerdictRecord {
    /// The record of a `Success` answer: `decision` for `desired`, normalised.
    pub fn new(
        hook: VerdictHook,
        object: String,
        decision: &Decision,
        desired: &Normalized,
        template_hash: Option<String>,
        now_ms: u64,
    ) -> VerdictRecord {
        let paths = |wanted: fn(ChangeVerdict) -> bool| {
            decision
                .changes
                .iter()
                .filter(|change| wanted(change.verdict))
                .map(|change| cut(format!("{} {}", change.kind, change.location)))
                .collect::<Vec<_>>()
        };
        let mut rejected = paths(|v| v == ChangeVerdict::Reject);
        let rejected_total = rejected.len();
        rejected.truncate(MAX_VERDICT_PATHS);
        let mut accepted = paths(ChangeVerdict::accepted);
        accepted.truncate(MAX_VERDICT_PATHS);
        let prints = desired.prints();
        VerdictRecord {
            hook,
            object,
            judged_ms: now_ms,
            in_place: decision.outcome == DecisionOutcome::InPlace,
            accepted,
            rejected,
            rejected_total,
            template_hash,
            node_change: Some(decision.node_change.clone()),
            fingerprint: prints.fingerprint(),
            prints,
        }
    }
}

/// An UpdateMachine refused for want of a verdict that covers its desired state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: RefusalReason,
    /// The Failure message (paths and hashes only), at most [`MAX_REFUSAL_MESSAGE_CHARS`].
    pub message: String,
    /// The desired state's fingerprint as the override annotation takes it.
    pub fingerprint: String,
}

fn rfc3339(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|at| {
            at.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{ms} ms after the epoch"))
}

/// `a, b, c and 5 more`, each item cut, at most [`MAX_REFUSAL_PATHS`] items.
fn listing<'a>(items: impl ExactSizeIterator<Item = String> + 'a, total: usize) -> String {
    let shown: Vec<String> = items.take(MAX_REFUSAL_PATHS).map(cut).collect();
    let mut out = shown.join(", ");
    if total > shown.len() {
        out.push_str(&format!(" and {} more", total - shown.len()));
    }
    out
}

/// What UpdateMachine has to go on for one Machine.
#[derive(Debug, Clone)]
pub struct Judgement<'a> {
    /// The Machine.
    pub machine: &'a MachineRef,
    /// The verdict found (the Machine's own, else its MachineSet's).
    pub verdict: Option<&'a VerdictRecord>,
    /// The desired objects, normalised and fingerprinted.
    pub desired: &'a Desired,
    /// The Machine's [`ACCEPT_UNJUDGED_ANNOTATION`], if any.
    pub accepted_by_operator: Option<&'a str>,
    /// The verdict retention, for the message.
    pub retention: Duration,
}

/// Who let a desired state run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granted {
    /// A CanUpdate verdict accepted exactly this state in place.
    ByVerdict,
    /// The operator's [`ACCEPT_UNJUDGED_ANNOTATION`] names this state.
    ByOperator,
}

/// Whether the desired state may run: granted when a verdict accepted it in place (or the operator accepted
/// exactly this state), else the refusal to answer.
pub fn judge(j: &Judgement) -> Result<Granted, Refusal> {
    let fingerprint = operator_fingerprint(&j.desired.fingerprint);
    let (reason, summary) = match j.verdict {
        None => (
            RefusalReason::NoVerdict,
            format!(
                "no CanUpdateMachine or CanUpdateMachineSet verdict is on record for this Machine (a new install, \
                 a lost store, or a verdict older than --verdict-retention {}h), so nothing shows this desired \
                 state was accepted in place",
                j.retention.as_secs() / 3600
            ),
        ),
        Some(verdict) => {
            let by = match verdict.hook {
                VerdictHook::CanUpdateMachine => "CanUpdateMachine judged this Machine".to_owned(),
                VerdictHook::CanUpdateMachineSet => {
                    format!("CanUpdateMachineSet judged MachineSet {}", verdict.object)
                }
            };
            let at = rfc3339(verdict.judged_ms);
            let mismatches: Vec<Mismatch> =
                inplace_core::verdict::check(&verdict.prints, j.desired, verdict.hook.mode());
            if !mismatches.is_empty() {
                let total = mismatches.len();
                (
                    RefusalReason::ChangedAfterJudgement,
                    format!(
                        "the desired objects changed after {by} at {at}: {}; no CanUpdate answer accepted \
                         that in place",
                        listing(mismatches.iter().map(ToString::to_string), total),
                    ),
                )
            } else if !verdict.in_place {
                (
                    RefusalReason::NotInPlace,
                    format!(
                        "{by} at {at} and sent this desired state to a rollout ({}), so it was never accepted in place",
                        listing(verdict.rejected.iter().cloned(), verdict.rejected_total)
                    ),
                )
            } else {
                return Ok(Granted::ByVerdict);
            }
        }
    };
    if j.accepted_by_operator == Some(fingerprint) {
        return Ok(Granted::ByOperator);
    }
    let annotation = match j.accepted_by_operator {
        Some(other) => format!(
            " (its {ACCEPT_UNJUDGED_ANNOTATION} annotation holds {:?}, another state's fingerprint)",
            other
                .chars()
                .take(2 * inplace_core::verdict::OPERATOR_FINGERPRINT_HEX)
                .collect::<String>()
        ),
        None => String::new(),
    };
    let mut message = format!(
        "refused ({}): {summary}. Nothing was run on the node. CAPI does not ask CanUpdate again for an update in \
         progress: delete the Machine to have it replaced, or accept exactly this desired state{annotation} with \
         `kubectl annotate machine -n {} {} {ACCEPT_UNJUDGED_ANNOTATION}={fingerprint} --overwrite` (the agent then \
         performs what it manages; the rest is not done)",
        reason.as_str(),
        j.machine.namespace,
        j.machine.name,
    );
    if message.chars().count() > MAX_REFUSAL_MESSAGE_CHARS {
        message = message
            .chars()
            .take(MAX_REFUSAL_MESSAGE_CHARS - 1)
            .collect();
        message.push('…');
    }
    Err(Refusal {
        reason,
        message,
        fingerprint: fingerprint.to_owned(),
    })
}

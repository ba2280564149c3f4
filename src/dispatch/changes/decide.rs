//! Whether a Machine may start a run of a change now. Pure: the change record as loaded, how each of its
//! running Machines' runs ended ([`RunEnd`], read by the caller), the registration's [`Pacing`], the health
//! gates' outcomes and now. First the ends are folded into the record (finishes, failures, the brake), then
//! the Machine is judged: a Machine already in the change goes on; a halted change holds everyone else; a
//! failing gate holds it and restarts the soak; the first `canary` Machines go alone; then each start waits
//! for the soak after the latest finish.

use inplace_agent_api::MachineRef;
use inplace_core::pacing::Pacing;

use super::identity::ChangeId;
use super::record::{
    Canary, ChangeRecord, Ended, FAILURE_REASON_BYTES, FAILURES_KEPT, Halt, MAX_RUNNING, Member,
};
use crate::dispatch::floor::hold::timestamp;

/// How a running Machine's run of the change stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Still running (or waiting for its agent).
    Running,
    /// Every step succeeded; the last ended at `ms`.
    Done {
        /// Unix ms.
        ms: u64,
    },
    /// A step failed (rolled back or being rolled back, or held as it failed).
    Failed {
        /// Why, as the status says it.
        reason: String,
    },
    /// Cancelled, replaced by a run of another state, or no longer stored: it no longer counts.
    Gone,
}

/// A health gate's outcome for the asking Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateOutcome {
    /// The gate's name.
    pub name: String,
    /// Whether it passed (an unreachable gate did not).
    pub passed: bool,
    /// What it said (quoting what failed).
    pub message: String,
}

/// Who asks, for what, under which settings.
#[derive(Debug, Clone)]
pub struct Asked<'a> {
    /// The Machine.
    pub machine: &'a MachineRef,
    /// The run it would start.
    pub run_id: &'a str,
    /// The change that run makes.
    pub change: &'a ChangeId,
    /// The registration's rollout settings.
    pub pacing: &'a Pacing,
    /// The health gates' outcomes (empty: none named).
    pub gates: &'a [GateOutcome],
    /// Now (Unix ms).
    pub now_ms: u64,
    /// `retryAfterSeconds` of a wait that has no known end.
    pub retry_after_seconds: i32,
    /// The Machine's `inplace-updater.dev/skip-soak` annotation: it does not wait for the soak.
    pub skip_soak: bool,
}

/// What the Machine may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Start the run (as one of the change's canaries or not).
    Go {
        /// It is a canary.
        canary: bool,
    },
    /// Wait: CAPI is answered in progress with this message.
    Wait {
        /// Why, for `kubectl get machines`.
        message: String,
        /// When to ask again.
        retry_after_seconds: i32,
    },
}

/// The verdict and the change record after it (to be written when `changed`, or with a Go).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// Go or wait.
    pub verdict: Verdict,
    /// The record after folding the ends and admitting.
    pub record: ChangeRecord,
    /// Whether the record differs from the one loaded.
    pub changed: bool,
    /// Whether the health gates' outcomes decide this Machine's verdict: it would start, or it waits for the
    /// soak (a gate failing during the soak restarts it). Not when it is in the change already, the change is
    /// halted, or it waits for the canaries or a free place: the gates are asked only when they matter.
    pub gated: bool,
}

/// Folds how the running Machines' runs ended into `record`, engaging the brake when the failures reach the
/// bound (one while the change is in its canaries, else the record's `allowed_failures`).
pub fn fold(mut record: ChangeRecord, ends: &[(Member, RunEnd)], now_ms: u64) -> ChangeRecord {
    for (member, end) in ends {
        let Some(at) = record.running.iter().position(|m| m == member) else {
            continue;
        };
        let canary = record.canaries.iter().position(|c| &c.member == member);
        match end {
            RunEnd::Running => continue,
            RunEnd::Done { ms } => {
                record.done += 1;
                record.last_done = Some(Ended {
                    machine: member.machine.clone(),
                    ms: *ms,
                    reason: String::new(),
                });
                if let Some(c) = canary {
                    record.canaries[c].done_ms = Some(*ms);
                }
            }
            RunEnd::Failed { reason } => {
                let was_canary = canary.is_some() || record.in_canary();
                let reason: String = truncate(reason, FAILURE_REASON_BYTES);
                record.failed += 1;
                record.failures.push(Ended {
                    machine: member.machine.clone(),
                    ms: now_ms,
                    reason: reason.clone(),
                });
                if record.failures.len() > FAILURES_KEPT {
                    record.failures.remove(0);
                }
                if let Some(c) = canary {
                    record.canaries[c].failed = Some(reason);
                }
                let allowed = if was_canary {
                    1
                } else {
                    u64::from(record.allowed_failures)
                };
                let failures = record.failed.saturating_sub(record.released_failures);
                if failures >= allowed && record.halted.is_none() {
                    record.halted = Some(Halt::Brake {
                        failures,
                        allowed,
                        ms: now_ms,
                    });
                }
            }
            RunEnd::Gone => {
                // A canary that no longer counts leaves its place to the next Machine.
                if let Some(c) = canary
                    && record.canaries[c].done_ms.is_none()
                    && record.canaries[c].failed.is_none()
                {
                    record.canaries.remove(c);
                }
            }
        }
        record.running.remove(at);
    }
    record
}

/// Judges `asked` on the change's `loaded` record (`None`: nobody asked for the change yet) after folding
/// `ends` into it.
pub fn admit(loaded: Option<&ChangeRecord>, ends: &[(Member, RunEnd)], asked: &Asked) -> Admission {
    let now = asked.now_ms;
    let start = loaded.cloned().unwrap_or_else(|| {
        ChangeRecord::new(
            asked.change.label.clone(),
            asked.pacing.canaries(),
            asked.pacing.failures_allowed(),
            now,
        )
    });
    let mut record = fold(start, ends, now);
    let label = &record.label;
    let member = Member {
        machine: asked.machine.clone(),
        run_id: asked.run_id.to_owned(),
        started_ms: now,
    };
    let wait = |message: String, retry_after_seconds: i32| Verdict::Wait {
        message,
        retry_after_seconds: retry_after_seconds.max(1),
    };

    let mut gated = true;
    let verdict = if record.has_member(asked.machine) {
        gated = false;
        // Already in the change (a retry of its failed run, a run replaced by the same change): it goes on;
        // neither the brake nor the pace holds a Machine that started.
        record.running.retain(|m| &m.machine != asked.machine);
        record.running.push(member);
        Verdict::Go { canary: false }
    } else if let Some(halt) = &record.halted {
        gated = false;
        wait(halted_message(&record, halt), asked.retry_after_seconds)
    } else if let Some(failed) = failing_gates(asked.gates) {
        record.gate_failed = Some((now, failed.clone()));
        wait(
            format!("change {label} is held by its health gates: {failed}"),
            asked.retry_after_seconds,
        )
    } else if let Some((until, after)) =
        soaking(&record, asked.pacing, now).filter(|_| !asked.skip_soak)
    {
        let left = i32::try_from(until.saturating_sub(now).div_ceil(1000)).unwrap_or(i32::MAX);
        wait(
            format!(
                "waiting for change {label} to soak until {} after {after} ({} done, {} running)",
                clock(until),
                record.done,
                record.running.len()
            ),
            left.min(asked.retry_after_seconds),
        )
    } else if !record.promoted && record.canaries.len() < record.canary as usize {
        record.canaries.push(Canary {
            member: member.clone(),
            done_ms: None,
            failed: None,
        });
        record.running.push(member);
        Verdict::Go { canary: true }
    } else if record.in_canary() {
        gated = false;
        wait(
            format!(
                "waiting for change {label} to prove itself on its canaries: {}",
                canaries_said(&record, now)
            ),
            asked.retry_after_seconds,
        )
    } else if record.running.len() >= MAX_RUNNING {
        gated = false;
        wait(
            format!("waiting for change {label}: {MAX_RUNNING} of its Machines are running it"),
            asked.retry_after_seconds,
        )
    } else {
        record.running.push(member);
        Verdict::Go { canary: false }
    };
    let changed = loaded != Some(&record);
    Admission {
        verdict,
        record,
        changed,
        gated,
    }
}

/// The failing gates' messages, joined; `None` when every gate passed.
fn failing_gates(gates: &[GateOutcome]) -> Option<String> {
    let failed: Vec<&str> = gates
        .iter()
        .filter(|g| !g.passed)
        .map(|g| g.message.as_str())
        .collect();
    (!failed.is_empty()).then(|| failed.join("; "))
}

/// Until when the change soaks and after what: the latest finish (or failing gate) plus the soak.
pub(super) fn soaking(record: &ChangeRecord, pacing: &Pacing, now: u64) -> Option<(u64, String)> {
    if record.promoted || pacing.soak() == 0 {
        return None;
    }
    let finished = record
        .last_done
        .as_ref()
        .map(|d| (d.ms, format!("{} finished", d.machine)));
    let gate = record
        .gate_failed
        .as_ref()
        .map(|(ms, _)| (*ms, "a health gate failed".to_owned()));
    let (from, after) = match (finished, gate) {
        (Some(f), Some(g)) => {
            if g.0 > f.0 {
                g
            } else {
                f
            }
        }
        (f, g) => f.or(g)?,
    };
    let until = from.saturating_add(pacing.soak());
    (until > now).then_some((until, after))
}

/// Each canary and where it is.
fn canaries_said(record: &ChangeRecord, now: u64) -> String {
    record
        .canaries
        .iter()
        .map(|c| {
            let state = match (&c.failed, c.done_ms) {
                (Some(why), _) => format!("failed ({why})"),
                (None, Some(ms)) => format!("done {} ago", minutes(now.saturating_sub(ms))),
                (None, None) => "running".to_owned(),
            };
            format!("{} {state}", c.member.machine)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The message of a halted change: why, the failures, and the command that releases it.
pub fn halted_message(record: &ChangeRecord, halt: &Halt) -> String {
    let why = match halt {
        Halt::Brake {
            failures, allowed, ..
        } => {
            let quoted: Vec<String> = record
                .failures
                .iter()
                .rev()
                .take(3)
                .map(|f| format!("{}: {}", f.machine, f.reason))
                .collect();
            format!(
                "halted by the failure brake after {failures} failed Machine(s) (bound {allowed}): {}",
                quoted.join("; ")
            )
        }
        Halt::Operator { .. } => "halted by an operator".to_owned(),
    };
    format!(
        "change {} is {why}; Machines that have not started it wait. Release it with `inplace-updater change \
         release {}`",
        record.label,
        ChangeId::from_label(record.label.clone()).id
    )
}

fn minutes(ms: u64) -> String {
    match ms / 1000 {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

fn clock(ms: u64) -> String {
    timestamp(ms).strftime("%H:%M:%S UTC").to_string()
}

fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

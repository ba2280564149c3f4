//! What a reboot step (and the reboot of an osImage step) does next, as a pure function of what is on disk
//! and what the node says: [`decide`]. The drivers (`drivers/reboot.rs`, `drivers/os_image.rs`) do the I/O.
//!
//! The journal protocol (`<state-dir>/reboot.json`, written fsynced and renamed into place):
//! 1. Before the reboot command runs, the *intent* is recorded: which step (plan id, step index, forward or
//!    undo), the boot id before, the time (and for osImage the image the node booted before).
//! 2. After the command returned 0, the intent is marked *issued* (with the time).
//! 3. On every (re)start of the step: a boot id different from the recorded one means the reboot happened —
//!    the step never reboots again, it waits for the Node to be Ready and succeeds. The same boot id with an
//!    intent not issued runs the command (again). The same boot id with an issued intent means the reboot has
//!    NOT happened — a restart of the agent is not a reboot — so the step waits for the machine to go down,
//!    until [`wait_down_until`]: the step's timeout counted from the recorded intent (the executor gives a
//!    resumed step a fresh deadline; a node that never goes down must not be waited for afresh at each agent
//!    restart), then fails saying when the command ran.
//!
//! The journal stays after the step succeeded, so a step interrupted after its success but before its report
//! is resumed into "rebooted" again rather than rebooting twice. A journal of another plan or step is stale:
//! it is ignored and cleared.

use inplace_agent_api::RebootWhen;
use serde::{Deserialize, Serialize};

/// The reboot journal's file name in the state dir.
pub(crate) const REBOOT_JOURNAL: &str = "reboot.json";

/// `<state-dir>/reboot.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RebootJournal {
    /// The reboot a step asked for (`None`: none recorded).
    #[serde(default)]
    pub intent: Option<RebootIntent>,
}

/// One recorded reboot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RebootIntent {
    /// The plan of the step.
    pub plan_id: String,
    /// The step's index in the plan.
    pub step_index: u32,
    /// True for the reboot of a step's undo (an osImage rollback).
    #[serde(default)]
    pub undo: bool,
    /// The boot id when the intent was recorded.
    pub boot_id_before: String,
    /// When the intent was recorded (Unix ms): the wait for the machine to go down is counted from it.
    pub intent_at_unix_ms: u64,
    /// When the reboot command returned 0 (Unix ms); `None`: not known to have run.
    #[serde(default)]
    pub issued_at_unix_ms: Option<u64>,
    /// osImage: the image the node booted before (what a fallback boots again).
    #[serde(default)]
    pub previous_image: Option<String>,
    /// Why it reboots (`always`, or what said a reboot is required), for the step's message.
    #[serde(default)]
    pub reason: String,
}

/// Which step a reboot belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RebootOwner<'a> {
    /// The plan.
    pub plan_id: &'a str,
    /// The step's index.
    pub step_index: u32,
    /// The step's undo rather than the step.
    pub undo: bool,
}

impl RebootIntent {
    /// Whether this intent is `owner`'s (otherwise it is stale).
    pub(crate) fn is_for(&self, owner: RebootOwner<'_>) -> bool {
        self.plan_id == owner.plan_id
            && self.step_index == owner.step_index
            && self.undo == owner.undo
    }
}

/// What the step knows now.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Situation<'a> {
    /// The step.
    pub owner: RebootOwner<'a>,
    /// The recorded intent, whoever's it is.
    pub intent: Option<&'a RebootIntent>,
    /// The boot id now.
    pub boot_id: &'a str,
    /// The step's `when`.
    pub when: RebootWhen,
    /// What the node said when asked whether a reboot is required (`None`: not asked yet).
    pub required: Option<bool>,
    /// Now (Unix ms).
    pub now_unix_ms: u64,
    /// The step's timeout (ms).
    pub timeout_ms: u64,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// `ifRequired`, nothing recorded: ask the node, then decide again.
    AskRequired,
    /// The node needs no reboot: the step succeeds without one.
    NotRequired,
    /// Record the intent (boot id now, time now), run the reboot command, mark it issued.
    Reboot,
    /// The command ran and the boot id is unchanged: wait for the machine to go down until this time (Unix ms).
    WaitDown {
        /// When the command returned.
        issued_at_unix_ms: u64,
        /// The end of the wait.
        until_unix_ms: u64,
    },
    /// The command ran, the wait is over and the boot id is unchanged: the step fails.
    NeverWentDown {
        /// When the command returned.
        issued_at_unix_ms: u64,
    },
    /// The boot id changed since the intent: the reboot happened (never reboot again).
    Rebooted {
        /// The boot id before.
        before: String,
        /// The boot id now.
        after: String,
    },
}

/// The end of the wait for the machine to go down: the step's timeout counted from the recorded intent, and
/// never more than one timeout from now (a wall clock set back must not stretch it).
pub(crate) fn wait_down_until(intent: &RebootIntent, now_unix_ms: u64, timeout_ms: u64) -> u64 {
    intent
        .intent_at_unix_ms
        .saturating_add(timeout_ms)
        .min(now_unix_ms.saturating_add(timeout_ms))
}

/// The next thing to do.
pub(crate) fn decide(s: &Situation<'_>) -> Next {
    let mine = s.intent.filter(|intent| intent.is_for(s.owner));
    if let Some(intent) = mine {
        if intent.boot_id_before != s.boot_id {
            return Next::Rebooted {
                before: intent.boot_id_before.clone(),
                after: s.boot_id.to_owned(),
            };
        }
        return match intent.issued_at_unix_ms {
            None => Next::Reboot,
            Some(issued_at_unix_ms) => {
                let until_unix_ms = wait_down_until(intent, s.now_unix_ms, s.timeout_ms);
                if s.now_unix_ms >= until_unix_ms {
                    Next::NeverWentDown { issued_at_unix_ms }
                } else {
                    Next::WaitDown {
                        issued_at_unix_ms,
                        until_unix_ms,
                    }
                }
            }
        };
    }
    match (s.when, s.required) {
        (RebootWhen::Always, _) | (RebootWhen::IfRequired, Some(true)) => Next::Reboot,
        (RebootWhen::IfRequired, None) => Next::AskRequired,
        (RebootWhen::IfRequired, Some(false)) => Next::NotRequired,
    }
}

/// A boot id as messages show it: its first 8 characters and `…`.
pub(crate) fn short_boot_id(boot_id: &str) -> String {
    let head: String = boot_id.chars().take(8).collect();
    if head.len() < boot_id.len() {
        format!("{head}…")
    } else {
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: RebootOwner<'static> = RebootOwner {
        plan_id: "p1",
        step_index: 2,
        undo: false,
    };
    const TIMEOUT: u64 = 600_000;
    const T0: u64 = 1_800_000_000_000;

    fn intent(boot: &str, issued: Option<u64>) -> RebootIntent {
        RebootIntent {
            plan_id: "p1".into(),
            step_index: 2,
            undo: false,
            boot_id_before: boot.into(),
            intent_at_unix_ms: T0,
            issued_at_unix_ms: issued,
            previous_image: None,
            reason: "always".into(),
        }
    }

    fn situation<'a>(
        intent: Option<&'a RebootIntent>,
        boot_id: &'a str,
        when: RebootWhen,
        required: Option<bool>,
        now: u64,
    ) -> Situation<'a> {
        Situation {
            owner: OWNER,
            intent,
            boot_id,
            when,
            required,
            now_unix_ms: now,
            timeout_ms: TIMEOUT,
        }
    }

    #[test]
    fn the_decision_table() {
        use RebootWhen::{Always, IfRequired};
        let not_issued = intent("boot-a", None);
        let issued = intent("boot-a", Some(T0 + 50));
        let mut other_step = issued.clone();
        other_step.step_index = 3;
        let mut other_plan = issued.clone();
        other_plan.plan_id = "p0".into();
        let mut undo = issued.clone();
        undo.undo = true;
        let rebooted = Next::Rebooted {
            before: "boot-a".into(),
            after: "boot-b".into(),
        };
        let waiting = Next::WaitDown {
            issued_at_unix_ms: T0 + 50,
            until_unix_ms: T0 + TIMEOUT,
        };
        let cases: Vec<(&str, Situation<'_>, Next)> = vec![
            (
                "fresh, always",
                situation(None, "boot-a", Always, None, T0),
                Next::Reboot,
            ),
            (
                "fresh, ifRequired: ask",
                situation(None, "boot-a", IfRequired, None, T0),
                Next::AskRequired,
            ),
            (
                "fresh, required",
                situation(None, "boot-a", IfRequired, Some(true), T0),
                Next::Reboot,
            ),
            (
                "fresh, not required",
                situation(None, "boot-a", IfRequired, Some(false), T0),
                Next::NotRequired,
            ),
            (
                "intent, same boot: run the command",
                situation(Some(&not_issued), "boot-a", Always, None, T0 + 10),
                Next::Reboot,
            ),
            (
                "intent, new boot: it happened",
                situation(Some(&not_issued), "boot-b", Always, None, T0 + 10),
                rebooted.clone(),
            ),
            (
                "issued, new boot",
                situation(Some(&issued), "boot-b", Always, None, T0 + 10),
                rebooted.clone(),
            ),
            (
                "issued, new boot, ifRequired: never asks",
                situation(Some(&issued), "boot-b", IfRequired, None, T0 + 10),
                rebooted.clone(),
            ),
            (
                "issued, same boot: wait",
                situation(Some(&issued), "boot-a", Always, None, T0 + 100),
                waiting.clone(),
            ),
            (
                "issued, same boot, ifRequired no longer required: still wait",
                situation(Some(&issued), "boot-a", IfRequired, Some(false), T0 + 100),
                waiting,
            ),
            (
                "issued, same boot, past the bound",
                situation(Some(&issued), "boot-a", Always, None, T0 + TIMEOUT),
                Next::NeverWentDown {
                    issued_at_unix_ms: T0 + 50,
                },
            ),
            (
                "stale: another step",
                situation(Some(&other_step), "boot-b", Always, None, T0),
                Next::Reboot,
            ),
            (
                "stale: another plan",
                situation(Some(&other_plan), "boot-b", IfRequired, None, T0),
                Next::AskRequired,
            ),
            (
                "stale: the step's undo",
                situation(Some(&undo), "boot-b", IfRequired, Some(false), T0),
                Next::NotRequired,
            ),
        ];
        for (name, s, want) in cases {
            assert_eq!(decide(&s), want, "{name}");
        }
    }

    #[test]
    fn the_wait_is_counted_from_the_intent_not_from_the_agent_start() {
        let issued = intent("boot-a", Some(T0 + 50));
        // An agent restarted late in the wait gets only the rest of it.
        assert_eq!(
            wait_down_until(&issued, T0 + TIMEOUT - 5, TIMEOUT),
            T0 + TIMEOUT
        );
        // A clock set back by a day never makes the wait longer than one timeout from now.
        let back = T0 - 86_400_000;
        assert_eq!(wait_down_until(&issued, back, 1000), back + 1000);
    }

    #[test]
    fn boot_ids_are_shortened_for_messages() {
        assert_eq!(short_boot_id("0123456789abcdef"), "01234567…");
        assert_eq!(short_boot_id("abc"), "abc");
    }
}

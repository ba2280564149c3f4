//! The one-line summary of a decision, e.g. `in place: Machine spec.version v1.33.4→v1.34.1
//! (kubernetes-version); needs rollout: VSphereMachine spec.memoryMiB (no rule)`.

use super::judge::ChangeVerdict;
use super::{DecisionOutcome, JudgedChange};
use crate::diff::ChangeKind;

/// Changes listed per section of a message before the rest is counted (`… and 12 more`).
pub const MAX_MESSAGE_ITEMS: usize = 8;

/// Longest old or new value a message shows inline (`v1.33.4→v1.34.1`); longer ones are left out.
pub const MAX_INLINE_VALUE_CHARS: usize = 40;

fn inline(v: &str) -> Option<&str> {
    // Hashes of secrets, lists and objects are noise in a one-line message.
    if v.starts_with("sha256:")
        || v.starts_with('{')
        || v.starts_with('[')
        || v.chars().count() > MAX_INLINE_VALUE_CHARS
    {
        return None;
    }
    Some(
        v.strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .unwrap_or(v),
    )
}

fn item(c: &JudgedChange) -> String {
    let what = match c.change {
        ChangeKind::Changed => match (
            c.old.as_deref().and_then(inline),
            c.new.as_deref().and_then(inline),
        ) {
            (Some(o), Some(n)) => format!(" {o}→{n}"),
            _ => String::new(),
        },
        ChangeKind::Added => " added".to_owned(),
        ChangeKind::Removed => " removed".to_owned(),
        ChangeKind::Reordered => " reordered".to_owned(),
    };
    if c.reason.is_empty() || c.verdict == ChangeVerdict::Ignored {
        format!("{} {}{what}", c.kind, c.path)
    } else {
        format!("{} {}{what} ({})", c.kind, c.path, c.reason)
    }
}

fn section(title: &str, items: &[&JudgedChange]) -> Option<String> {
    if items.is_empty() {
        return None;
    }
    let mut parts: Vec<String> = items
        .iter()
        .take(MAX_MESSAGE_ITEMS)
        .map(|c| item(c))
        .collect();
    if items.len() > MAX_MESSAGE_ITEMS {
        parts.push(format!("… and {} more", items.len() - MAX_MESSAGE_ITEMS));
    }
    Some(format!("{title}: {}", parts.join(", ")))
}

/// Builds the message for a decision.
pub(crate) fn message(
    outcome: DecisionOutcome,
    changes: &[JudgedChange],
    self_check: &[String],
    notes: &[String],
    drain: Option<&str>,
) -> String {
    if outcome == DecisionOutcome::SelfCheckFailed {
        let mut shown: Vec<&str> = self_check
            .iter()
            .take(MAX_MESSAGE_ITEMS)
            .map(String::as_str)
            .collect();
        let more = self_check.len().saturating_sub(MAX_MESSAGE_ITEMS);
        let more = if more > 0 {
            format!("; … and {more} more")
        } else {
            String::new()
        };
        shown.dedup();
        return format!(
            "self-check failed, no patch sent (a bug in inplace-updater, please report): {}{more}",
            shown.join("; ")
        );
    }
    let pick =
        |f: fn(ChangeVerdict) -> bool| changes.iter().filter(|c| f(c.verdict)).collect::<Vec<_>>();
    let accepted = pick(ChangeVerdict::accepted);
    let rejected = pick(|v| v == ChangeVerdict::Reject);
    let ignored = pick(|v| v == ChangeVerdict::Ignored);
    let mut parts: Vec<String> = Vec::new();
    if outcome == DecisionOutcome::Refused {
        parts.push("refused (mode in-place-only, no rollout)".to_owned());
    }
    parts.extend(section("in place", &accepted));
    parts.extend(drain.map(str::to_owned));
    parts.extend(section("needs rollout", &rejected));
    parts.extend(section("ignored by CAPI", &ignored));
    parts.extend(notes.iter().map(|n| format!("note: {n}")));
    if parts.is_empty() {
        return "no changes".to_owned();
    }
    parts.join("; ")
}

//! How `status` prints for a person: the updates grouped by cluster and the agents' table (`--agents`).
//! The JSON output is the rows themselves.

use crate::dispatch::changes::control::ChangeRow;
use crate::dispatch::{AgentRow, StatusRow, ago};

/// `status --agents` as a table: one row per agent, what it runs, whether it is connected, the CA it trusts.
pub(crate) fn render_agents(rows: &[AgentRow], now: u64) -> String {
    if rows.is_empty() {
        return "no agent seen\n".into();
    }
    let mut out = format!(
        "{:<40} {:<24} {:<28} {:<13} {:<12} {:<18} {:<40} {}\n",
        "MACHINE", "NODE", "VERSION", "STATE", "LAST SEEN", "CA", "UPGRADE", "LAST REFUSAL"
    );
    for row in rows {
        let refusal = row
            .last_refusal
            .as_ref()
            .map(|r| {
                format!(
                    "{} {}: {} (from {})",
                    r.reason.as_str(),
                    ago(now, r.at_ms),
                    r.message,
                    r.peer.as_deref().unwrap_or("unknown peer")
                )
            })
            .unwrap_or_else(|| "-".into());
        let version = match (&row.agent_version, &row.arch, &row.agent_sha256) {
            (Some(version), Some(arch), Some(sha)) => {
                format!("{version} {arch} {}", sha.get(..12).unwrap_or(sha))
            }
            (Some(version), _, _) => version.clone(),
            (None, _, _) => "-".into(),
        };
        out.push_str(&format!(
            "{:<40} {:<24} {:<28} {:<13} {:<12} {:<18} {:<40} {}\n",
            row.machine,
            row.node.as_deref().unwrap_or("-"),
            version,
            if row.connected {
                "connected"
            } else {
                "disconnected"
            },
            row.last_seen_ms
                .map_or_else(|| "never".into(), |at| ago(now, at)),
            ca_column(row),
            row.upgrade.as_deref().unwrap_or("-"),
            refusal
        ));
    }
    out
}

/// `status --changes` as a table: one row per change, then why each halted one is held.
pub(crate) fn render_changes(rows: &[ChangeRow]) -> String {
    if rows.is_empty() {
        return "no change recorded (no paced registration has started one)\n".into();
    }
    let mut out = format!(
        "{:<24} {:<40} {:<9} {:>5} {:>8} {:>7}  {}\n",
        "CHANGE", "MOVES", "STATE", "DONE", "RUNNING", "FAILED", "CANARIES"
    );
    for row in rows {
        out.push_str(&format!(
            "{:<24} {:<40} {:<9} {:>5} {:>8} {:>7}  {}\n",
            row.id,
            row.label,
            row.state,
            row.done,
            row.running,
            row.failed,
            if row.canaries.is_empty() {
                "-".to_owned()
            } else {
                row.canaries.join(", ")
            }
        ));
    }
    for row in rows {
        if let Some(held) = &row.held {
            out.push_str(&format!("\n{held}\n"));
        } else if let Some(gate) = &row.last_gate_failure {
            out.push_str(&format!(
                "\nchange {} last held by a gate: {gate}\n",
                row.label
            ));
        }
    }
    out
}

/// Digest characters `status --agents` shows of the CA bundle an agent trusts.
pub const CA_DIGEST_SHOWN: usize = 8;

/// The CA column: the start of the digest of the bundle the agent trusts, and whether the server serves it.
fn ca_column(row: &AgentRow) -> String {
    let Some(digest) = &row.ca_sha256 else {
        return "-".into();
    };
    let short: String = digest.chars().take(CA_DIGEST_SHOWN).collect();
    match row.ca_served {
        Some(true) => format!("{short} served"),
        Some(false) => format!("{short} OLD"),
        None => short,
    }
}

/// `status` as text: the recorded updates grouped by cluster, each with its state, run and step.
pub(crate) fn render_status(rows: &[StatusRow]) -> String {
    if rows.is_empty() {
        return "no updates recorded\n".into();
    }
    let mut out = String::new();
    let mut cluster = "";
    for row in rows {
        if row.cluster != cluster {
            cluster = &row.cluster;
            out.push_str(&format!("cluster {cluster}\n"));
        }
        let state = serde_json::to_value(row.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        out.push_str(&format!(
            "  {:<40} {:<12} {:<12} {}",
            row.machine, state, row.run, row.step
        ));
        if !row.message.is_empty() {
            out.push_str(&format!(
                " — {}",
                row.message.lines().next().unwrap_or_default()
            ));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ca_sha256: Option<&str>, ca_served: Option<bool>) -> AgentRow {
        serde_json::from_value(serde_json::json!({
            "machine": "default/m", "connected": true, "caSha256": ca_sha256, "caServed": ca_served,
        }))
        .unwrap()
    }

    #[test]
    fn the_ca_column_shows_the_short_digest_and_whether_it_is_served() {
        let digest = "0123456789abcdef".repeat(4);
        assert_eq!(
            ca_column(&row(Some(&digest), Some(true))),
            "01234567 served"
        );
        assert_eq!(ca_column(&row(Some(&digest), Some(false))), "01234567 OLD");
        assert_eq!(ca_column(&row(Some(&digest), None)), "01234567");
        assert_eq!(ca_column(&row(None, None)), "-");
        let table = render_agents(&[row(Some(&digest), Some(false))], 0);
        assert!(table.lines().next().unwrap().contains(" CA "), "{table}");
        assert!(table.contains("01234567 OLD"), "{table}");
    }
}

//! Every key dispatch keeps in the store, in one place: what each wing writes under, and how a key of the
//! change feed is read back into the Machine it concerns.

use inplace_agent_api::MachineRef;
use sha2::{Digest as _, Sha256};

use crate::hex;

/// Prefix of every Machine record (which run is current).
pub const MACHINES_PREFIX: &str = "machines/";
/// Prefix of every update run.
pub const UPDATES_PREFIX: &str = "updates/";
/// Prefix of every agent record (last seen, inventory).
pub const AGENTS_PREFIX: &str = "agents/";
/// Prefix of every CanUpdate verdict.
pub const VERDICTS_PREFIX: &str = "verdicts/";
/// Prefix of every UpdateMachine refusal.
pub const REFUSALS_PREFIX: &str = "refusals/";
/// Prefix of every refused agent's last refusal.
pub const AGENT_REFUSALS_PREFIX: &str = "agent-refusals/";
/// Prefix of every agent's last self-upgrade.
pub const AGENT_UPGRADES_PREFIX: &str = "agent-upgrades/";
/// Prefix of the provider-id index.
pub const PROVIDERS_PREFIX: &str = "providers/";
/// Prefix of agent tokens the server minted (rotation successors, by hash) and of token rotations (by the
/// rotated token's hash and the agent that asked).
pub const AGENT_TOKENS_PREFIX: &str = "agent-tokens/";
/// Prefix of every slot of a store-backed counting semaphore ([`super::slots`]).
pub const SLOTS_PREFIX: &str = "slots/";
/// Prefix of every change a paced registration's Machines take ([`crate::dispatch::changes`]).
pub const CHANGES_PREFIX: &str = "changes/";
/// Prefix of every replica's heartbeat ([`crate::dispatch::agents::presence`]).
pub const PRESENCE_ALIVE_PREFIX: &str = "presence/alive/";
/// Prefix of every replica's membership chunks.
pub const PRESENCE_MEMBERS_PREFIX: &str = "presence/members/";
/// Prefix of every Machine's remediation guard record ([`super::guard`]).
pub const GUARDS_PREFIX: &str = "guards/";
/// The key holding the stored format's version ([`super::format`]).
pub const FORMAT_KEY: &str = "meta/format";

/// Key of a change's record, by its id.
pub fn change_key(id: &str) -> String {
    format!("{CHANGES_PREFIX}{id}")
}

/// Key of a Machine's record: which run is current.
pub fn machine_key(machine: &MachineRef) -> String {
    format!("{MACHINES_PREFIX}{}/{}", machine.namespace, machine.name)
}

/// Key of a Machine's remediation guard record.
pub fn guard_key(machine: &MachineRef) -> String {
    format!("{GUARDS_PREFIX}{}/{}", machine.namespace, machine.name)
}

/// Key of one update run of a Machine.
pub fn update_key(machine: &MachineRef, run_id: &str) -> String {
    format!(
        "{UPDATES_PREFIX}{}/{}/{run_id}",
        machine.namespace, machine.name
    )
}

/// Key of what the agent of a Machine last told us.
pub fn agent_key(machine: &MachineRef) -> String {
    format!("{AGENTS_PREFIX}{}/{}", machine.namespace, machine.name)
}

/// Key of a replica's heartbeat.
pub fn presence_alive_key(replica: &str) -> String {
    format!("{PRESENCE_ALIVE_PREFIX}{replica}")
}

/// Prefix of a replica's membership chunks.
pub fn presence_members_prefix(replica: &str) -> String {
    format!("{PRESENCE_MEMBERS_PREFIX}{replica}/")
}

/// Key of chunk `index` of a replica's membership.
pub fn presence_chunk_key(replica: &str, index: usize) -> String {
    format!("{}{index:04}", presence_members_prefix(replica))
}

/// Key of the last self-upgrade of a Machine's agent.
pub fn agent_upgrade_key(machine: &MachineRef) -> String {
    format!(
        "{AGENT_UPGRADES_PREFIX}{}/{}",
        machine.namespace, machine.name
    )
}

/// Key of the last refusal of a Machine's agent.
pub fn agent_refusal_key(machine: &MachineRef) -> String {
    format!(
        "{AGENT_REFUSALS_PREFIX}{}/{}",
        machine.namespace, machine.name
    )
}

/// Key mapping a provider id to its Machine (provider ids contain `/`, so they are hex-encoded). An id whose
/// hex form would not fit in a store key (over ~500 bytes) is keyed by its SHA-256 instead; the
/// `sha256-` prefix cannot be mistaken for hex.
pub fn provider_key(provider_id: &str) -> String {
    let key = format!("{PROVIDERS_PREFIX}{}", hex(provider_id.as_bytes()));
    if key.len() <= inplace_store::MAX_KEY_BYTES {
        return key;
    }
    format!(
        "{PROVIDERS_PREFIX}sha256-{}",
        hex(&Sha256::digest(provider_id.as_bytes()))
    )
}

/// Key of the claim "this Machine runs `kubeadm upgrade apply <version>` for its cluster".
pub fn apply_claim_key(namespace: &str, cluster: &str, version: &str) -> String {
    format!("clusters/{namespace}/{cluster}/kubeadm-apply/{version}")
}

/// Key of a token the server minted, by the hex of its SHA-256.
pub fn agent_token_key(hash_hex: &str) -> String {
    format!("{AGENT_TOKENS_PREFIX}{hash_hex}")
}

/// Key of the rotation of one token for one agent: the hex of the token's SHA-256, then a digest of the
/// agent's identity (a shared cluster token is rotated per agent, so every node gets a successor of its own).
pub fn token_rotation_key(hash_hex: &str, agent: &inplace_agent_api::AgentIdentity) -> String {
    let who = serde_json::to_vec(agent).unwrap_or_default();
    let digest = Sha256::digest(&who);
    format!(
        "{AGENT_TOKENS_PREFIX}{hash_hex}/rotation/{}",
        hex(&digest[..16])
    )
}

/// Key of slot `index` of the pool `pool` ([`super::slots`]).
pub fn slot_key(pool: &str, index: u32) -> String {
    format!("{SLOTS_PREFIX}{pool}/{index}")
}

/// Key of a CanUpdateMachine verdict.
pub fn machine_verdict_key(machine: &MachineRef) -> String {
    format!(
        "{VERDICTS_PREFIX}machines/{}/{}",
        machine.namespace, machine.name
    )
}

/// Key of a CanUpdateMachineSet verdict: by namespace and the `set-name` label value of its Machines.
pub fn machine_set_verdict_key(namespace: &str, set_label: &str) -> String {
    format!("{VERDICTS_PREFIX}machinesets/{namespace}/{set_label}")
}

/// Key of the refusal last answered for a Machine.
pub fn refusal_key(machine: &MachineRef) -> String {
    format!("{REFUSALS_PREFIX}{}/{}", machine.namespace, machine.name)
}

/// Whether a name may be used as a key segment (DNS-1123 subdomain characters, bounded length).
pub fn valid_segment(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !text.starts_with('.')
}

/// `namespace/name[/...]` → the Machine.
pub fn parse_machine(rest: &str) -> Option<MachineRef> {
    let mut parts = rest.split('/');
    let (namespace, name) = (parts.next()?, parts.next()?);
    Some(MachineRef::new(namespace, name))
}

/// `namespace/name/run` (an update key without its prefix) → the Machine and the run id.
pub fn parse_update_key(rest: &str) -> Option<(MachineRef, &str)> {
    let mut parts = rest.splitn(3, '/');
    let machine = MachineRef::new(parts.next()?, parts.next()?);
    Some((machine, parts.next()?))
}

/// The Machine a changed key concerns, for the keys whose change wakes its agent: its record and its runs.
pub fn machine_of_change(key: &str) -> Option<MachineRef> {
    key.strip_prefix(MACHINES_PREFIX)
        .or_else(|| key.strip_prefix(UPDATES_PREFIX))
        .and_then(parse_machine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_segment_safe() {
        assert!(valid_segment("edge-01-cp-abcde"));
        assert!(!valid_segment("../etc"));
        assert!(!valid_segment("a/b"));
        assert!(!valid_segment(""));
        assert_eq!(provider_key("a/b"), "providers/612f62");
    }

    #[test]
    fn long_provider_ids_still_make_store_keys() {
        let longest = "p".repeat(512);
        let other = format!("{}q", "p".repeat(511));
        for id in [&longest, &other] {
            assert!(
                provider_key(id).len() <= inplace_store::MAX_KEY_BYTES,
                "{id}"
            );
            assert!(provider_key(id).starts_with("providers/sha256-"));
        }
        assert_ne!(provider_key(&longest), provider_key(&other));
        let fits = "p".repeat(507);
        assert_eq!(provider_key(&fits).len(), inplace_store::MAX_KEY_BYTES);
        assert!(!provider_key(&fits).contains("sha256"));
    }

    #[test]
    fn changed_keys_name_their_machine() {
        let m = MachineRef::new("default", "m");
        assert_eq!(machine_of_change(&machine_key(&m)), Some(m.clone()));
        assert_eq!(machine_of_change(&update_key(&m, "r1")), Some(m));
        assert_eq!(machine_of_change("agents/default/m"), None);
        assert_eq!(
            parse_update_key("default/m/r1"),
            Some((MachineRef::new("default", "m"), "r1"))
        );
    }
}

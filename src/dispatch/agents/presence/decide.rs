//! Presence's pure core: the records a replica publishes (its heartbeat and its membership in chunks), how its
//! membership is cut into chunks and which chunks a change rewrites, and what the published records say of
//! each agent's last contact. No store, no clock: the owner ([`super::Presence`]) loads, decides, commits.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use inplace_agent_api::MachineRef;
use serde::{Deserialize, Serialize};

/// Bytes of membership a chunk is cut for: a replica's membership is split into a power of two of chunks so
/// each holds about this much (at most four times it while the count is kept, far under the store's 512 KiB
/// value limit and etcd's 1.5 MiB request limit even with an uneven hash).
pub const PRESENCE_CHUNK_BYTES: usize = 64 * 1024;

/// Most chunks a replica's membership is cut into (with [`PRESENCE_CHUNK_BYTES`], about 4 million agents of
/// 60-character names on one replica).
pub const PRESENCE_MAX_CHUNKS: usize = 4096;

/// "Replica R was alive at T, serving the agents of membership generation G, cut into N chunks."
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    /// When the replica wrote it (Unix ms): the last contact of every agent its membership lists.
    pub at_ms: u64,
    /// Bumped whenever the membership's chunks are rewritten: readers re-read them only then.
    pub generation: u64,
    /// How many chunks the membership is cut into.
    pub chunks: u32,
}

/// One chunk of a replica's membership: the agents (`namespace/name`) that made a request to it within
/// `CONNECTED_WITHIN` when it was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberChunk {
    /// When it was written (Unix ms): what a sweep records for its agents when the replica's heartbeat is gone.
    pub at_ms: u64,
    /// The agents, sorted.
    pub agents: Vec<String>,
}

/// The chunk of `agent` among `chunks`, fixed by its name.
pub fn chunk_of(agent: &str, chunks: usize) -> usize {
    use std::hash::{Hash as _, Hasher as _};
    // Any stable hash will do: only this replica's own chunks are cut by it, and only while it runs.
    let mut hasher = std::hash::DefaultHasher::new();
    agent.hash(&mut hasher);
    (hasher.finish() % chunks.max(1) as u64) as usize
}

/// How many chunks `members` are cut into, given the `current` count: kept while each chunk holds between a
/// quarter of and [`PRESENCE_CHUNK_BYTES`] on average (so a membership near a boundary does not rewrite every
/// chunk at each change), else the power of two that makes it about [`PRESENCE_CHUNK_BYTES`].
pub fn chunk_count(members: &BTreeSet<String>, current: usize) -> usize {
    // A name, its quotes and its comma.
    let bytes: usize = members.iter().map(|m| m.len() + 3).sum();
    let current = current.max(1);
    let per_chunk = bytes / current;
    if per_chunk <= PRESENCE_CHUNK_BYTES && (current == 1 || per_chunk >= PRESENCE_CHUNK_BYTES / 4)
    {
        return current;
    }
    bytes
        .div_ceil(PRESENCE_CHUNK_BYTES)
        .max(1)
        .next_power_of_two()
        .min(PRESENCE_MAX_CHUNKS)
}

/// `members` cut into `chunks` chunks, each sorted.
pub fn cut(members: &BTreeSet<String>, chunks: usize) -> Vec<Vec<String>> {
    let mut cut = vec![Vec::new(); chunks.max(1)];
    for member in members {
        cut[chunk_of(member, chunks)].push(member.clone());
    }
    cut
}

/// What a replica must write to publish `next` when it last published `published`: the chunks to (re)write,
/// by index, and the indices of chunks of the old cut to delete. Nothing when nothing changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ChunkWrites {
    /// Chunks whose content changed (or that are new), by index.
    pub put: BTreeMap<usize, Vec<String>>,
    /// Chunks of the old cut beyond the new one.
    pub delete: Vec<usize>,
}

impl ChunkWrites {
    /// Whether the membership changed at all.
    pub fn is_empty(&self) -> bool {
        self.put.is_empty() && self.delete.is_empty()
    }
}

/// The chunk writes that take the published cut `published` to `next` (an empty chunk is written empty, so
/// readers never keep an agent it no longer holds).
pub fn chunk_writes(published: &[Vec<String>], next: &[Vec<String>]) -> ChunkWrites {
    let put = next
        .iter()
        .enumerate()
        .filter(|(i, chunk)| published.get(*i) != Some(*chunk))
        .map(|(i, chunk)| (i, chunk.clone()))
        .collect();
    let delete = (next.len()..published.len()).collect();
    ChunkWrites { put, delete }
}

/// The agents `published` held that `next` no longer does: they left this replica, and their exact last
/// contact is written to their own record once.
pub fn departed<'a>(
    published: &'a BTreeSet<String>,
    next: &'a BTreeSet<String>,
) -> impl Iterator<Item = &'a String> {
    published.difference(next)
}

/// What one replica's published records say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaPresence {
    /// Its heartbeat; `None` when its chunks are stored without one (it died before its first heartbeat, or a
    /// sweep stopped half-way).
    pub heartbeat: Option<Heartbeat>,
    /// The members its chunks list, and the newest chunk's time.
    pub members: BTreeSet<MachineRef>,
    /// The newest of its chunks' times (Unix ms).
    pub chunks_at_ms: u64,
}

impl ReplicaPresence {
    /// When its members were last known to be in contact: its heartbeat, else its newest chunk.
    pub fn at_ms(&self) -> u64 {
        self.heartbeat.map_or(self.chunks_at_ms, |h| h.at_ms)
    }
}

/// Every agent's last contact as every replica's presence says: for an agent several replicas list (it moved,
/// and the one it left has not published since or died), the freshest.
pub fn last_contacts<'a>(
    replicas: impl IntoIterator<Item = &'a ReplicaPresence>,
) -> HashMap<MachineRef, u64> {
    let mut contacts: HashMap<MachineRef, u64> = HashMap::new();
    for replica in replicas {
        let at = replica.at_ms();
        for member in &replica.members {
            let seen = contacts.entry(member.clone()).or_insert(at);
            *seen = (*seen).max(at);
        }
    }
    contacts
}

/// Whether a replica whose presence says `at_ms` is dead at `now_ms`: its heartbeat is older than `stale_ms`.
pub fn is_dead(at_ms: u64, now_ms: u64, stale_ms: u64) -> bool {
    now_ms.saturating_sub(at_ms) > stale_ms
}

/// The agents whose last contact a sweep of `dead` must write to their own records before its presence goes:
/// its members that no live replica lists (those that moved are known by their new replica).
pub fn to_record<'a>(
    dead: &'a ReplicaPresence,
    live: &'a [&'a ReplicaPresence],
) -> impl Iterator<Item = &'a MachineRef> {
    dead.members
        .iter()
        .filter(move |m| !live.iter().any(|r| r.members.contains(*m)))
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;

//! Presence: who serves which agent, and since when, published so that the store's write rate depends on the
//! number of replicas, not of agents. Every agent request updates this replica's exact last-seen time in
//! memory only ([`super::LastSeen`]); every [`PRESENCE_HEARTBEAT_INTERVAL`] the replica writes its heartbeat
//! ("alive at T", one small record) and, only when it changed since, its membership: the agents that made a
//! request to it within `CONNECTED_WITHIN`, cut into chunks by name ([`decide`]) so no record nears etcd's
//! request limit at 100 000 agents. Other replicas read a connected agent's last contact as its replica's last
//! heartbeat (exact to the interval).
//!
//! Why this shape: a heartbeat per replica is the one write a steady fleet needs; the membership changes only
//! when agents come, go or move, and then only the chunks that hold them are rewritten (at most once per
//! interval: the tick is the debounce). An agent that leaves a replica (it stopped polling, or moved) gets its
//! exact last contact written to its own record once, before the chunk that listed it is rewritten; a replica
//! that dies stops its heartbeat, its agents count as not connected after [`PRESENCE_STALE_AFTER`] and
//! reconnect to another replica (agents retry), which lists them at its next tick: readers take the freshest.
//! The retention sweep writes a dead replica's agents' last contact to their records (those no live replica
//! lists) and then deletes its presence, chunks first and its heartbeat last, each as listed.

mod decide;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::StreamExt as _;
use inplace_agent_api::MachineRef;

pub use decide::{Heartbeat, MemberChunk, PRESENCE_CHUNK_BYTES, PRESENCE_MAX_CHUNKS};
use decide::{ReplicaPresence, chunk_count, chunk_writes, cut, departed, is_dead, last_contacts};

use super::listing::CONNECTED_WITHIN;
use super::seen::{LastSeen, SEEN_WRITES_IN_FLIGHT};
use crate::dispatch::floor::config::{
    PRESENCE_HEARTBEAT_INTERVAL, PRESENCE_STALE_AFTER, PRESENCE_SWEEP_AFTER,
};
use crate::dispatch::floor::db::decode;
use crate::dispatch::floor::keys::{
    PRESENCE_ALIVE_PREFIX, PRESENCE_MEMBERS_PREFIX, agent_key, parse_machine, presence_alive_key,
    presence_chunk_key, presence_members_prefix,
};
use crate::dispatch::floor::records::AgentRecord;
use crate::dispatch::floor::{DispatchError, Floor};

/// What this replica last published.
#[derive(Default)]
struct Published {
    generation: u64,
    members: BTreeSet<String>,
    cut: Vec<Vec<String>>,
}

/// Every replica's presence as last read, and each agent's last contact it gives.
#[derive(Default)]
struct View {
    replicas: HashMap<String, ReplicaPresence>,
    contacts: Arc<HashMap<MachineRef, u64>>,
}

/// This replica's presence: what it publishes, and what it read of every replica's.
pub struct Presence {
    floor: Floor,
    /// This replica's name in the store: its host name and a random suffix, new at every start.
    replica: String,
    seen: Arc<LastSeen>,
    /// Held across a publication: one at a time.
    published: tokio::sync::Mutex<Published>,
    view: Mutex<View>,
}

impl Presence {
    /// The presence of a new replica over `floor`, publishing the agents `seen` saw.
    pub fn new(floor: Floor, seen: Arc<LastSeen>) -> Arc<Presence> {
        Arc::new(Presence {
            floor,
            replica: replica_name(),
            seen,
            published: tokio::sync::Mutex::default(),
            view: Mutex::default(),
        })
    }

    /// This replica's name in the store.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    fn view(&self) -> MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `machine`'s last contact as every other replica's presence says (as last read; Unix ms).
    pub fn last(&self, machine: &MachineRef) -> Option<u64> {
        self.view().contacts.get(machine).copied()
    }

    /// Every agent's last contact as every other replica's presence says (as last read; Unix ms).
    pub fn contacts(&self) -> Arc<HashMap<MachineRef, u64>> {
        self.view().contacts.clone()
    }

    /// Publishes, then reads every replica's presence, every [`PRESENCE_HEARTBEAT_INTERVAL`] until shutdown
    /// (the first at once). A failed tick is logged and the next one tries again.
    pub async fn run(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(PRESENCE_HEARTBEAT_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = self.floor.shutdown.cancelled() => return,
            }
            if let Err(err) = self.publish().await {
                tracing::warn!(error = %err, "could not publish this replica's presence; trying again");
            }
            if let Err(err) = self.refresh().await {
                tracing::warn!(error = %err, "could not read the replicas' presence; trying again");
            }
        }
    }

    /// One publication: the exact last contact of the agents that left since the last one (to their own
    /// records), the membership chunks that changed, then the heartbeat. A failure leaves what was published
    /// as it was known, so the next publication writes the difference again.
    pub async fn publish(&self) -> Result<(), DispatchError> {
        let mut published = self.published.lock().await;
        let now = self.floor.now_ms();
        let within = CONNECTED_WITHIN.as_millis() as u64;
        let here = self.seen.here();
        let members: BTreeSet<String> = here
            .iter()
            .filter(|(_, at)| now.saturating_sub(**at) <= within)
            .map(|(machine, _)| machine.to_string())
            .collect();
        let gone: Vec<(MachineRef, u64)> = departed(&published.members, &members)
            .filter_map(|name| parse_machine(name))
            .filter_map(|machine| here.get(&machine).map(|at| (machine.clone(), *at)))
            .collect();
        record_contacts(&self.floor, gone).await?;
        let chunks = chunk_count(&members, published.cut.len());
        let next = cut(&members, chunks);
        let writes = chunk_writes(&published.cut, &next);
        let generation = published.generation + u64::from(!writes.is_empty());
        for (index, agents) in writes.put {
            let chunk = MemberChunk { at_ms: now, agents };
            self.floor
                .db
                .put_any(&presence_chunk_key(&self.replica, index), &chunk)
                .await?;
        }
        for index in writes.delete {
            self.floor
                .db
                .store()
                .delete(
                    &presence_chunk_key(&self.replica, index),
                    inplace_store::Precondition::Any,
                )
                .await?;
        }
        let heartbeat = Heartbeat {
            at_ms: now,
            generation,
            chunks: next.len() as u32,
        };
        self.floor
            .db
            .put_any(&presence_alive_key(&self.replica), &heartbeat)
            .await?;
        *published = Published {
            generation,
            members,
            cut: next,
        };
        Ok(())
    }

    /// Reads every replica's heartbeat, and the membership of those whose membership changed since the last
    /// read (or that are new).
    pub async fn refresh(&self) -> Result<(), DispatchError> {
        let store = self.floor.db.store();
        let mut heartbeats: HashMap<String, Heartbeat> = HashMap::new();
        for entry in store.list(PRESENCE_ALIVE_PREFIX).await? {
            if let (Some(replica), Ok(heartbeat)) = (
                entry.key.strip_prefix(PRESENCE_ALIVE_PREFIX),
                decode::<Heartbeat>(&entry.key, &entry.value),
            ) {
                heartbeats.insert(replica.to_owned(), heartbeat);
            }
        }
        let changed: Vec<(String, Heartbeat)> = {
            let view = self.view();
            heartbeats
                .iter()
                .filter(|(replica, heartbeat)| {
                    view.replicas
                        .get(*replica)
                        .and_then(|known| known.heartbeat)
                        .is_none_or(|known| known.generation != heartbeat.generation)
                })
                .map(|(replica, heartbeat)| (replica.clone(), *heartbeat))
                .collect()
        };
        let mut read = HashMap::new();
        for (replica, heartbeat) in changed {
            let members = self.members_of(&replica, Some(heartbeat.chunks)).await?;
            read.insert(replica, members);
        }
        let mut view = self.view();
        view.replicas
            .retain(|replica, _| heartbeats.contains_key(replica));
        for (replica, heartbeat) in heartbeats {
            let known = view.replicas.entry(replica.clone()).or_default();
            if let Some((members, chunks_at_ms)) = read.remove(&replica) {
                known.members = members;
                known.chunks_at_ms = chunks_at_ms;
            }
            known.heartbeat = Some(heartbeat);
        }
        // This replica's own agents are known to the millisecond from its memory, not as of its heartbeat.
        let others = view
            .replicas
            .iter()
            .filter(|(replica, _)| **replica != self.replica)
            .map(|(_, presence)| presence);
        view.contacts = Arc::new(last_contacts(others));
        Ok(())
    }

    /// The members `replica`'s chunks list (only its first `chunks` when given), and the newest chunk's time.
    async fn members_of(
        &self,
        replica: &str,
        chunks: Option<u32>,
    ) -> Result<(BTreeSet<MachineRef>, u64), DispatchError> {
        let prefix = presence_members_prefix(replica);
        let mut members = BTreeSet::new();
        let mut newest = 0;
        for entry in self.floor.db.store().list(&prefix).await? {
            let index = entry
                .key
                .strip_prefix(&prefix)
                .and_then(|i| i.parse::<u32>().ok());
            if index.is_none_or(|i| chunks.is_some_and(|n| i >= n)) {
                continue;
            }
            // A chunk that does not decode is passed over: the others still say who is here.
            let Ok(chunk) = decode::<MemberChunk>(&entry.key, &entry.value) else {
                continue;
            };
            newest = newest.max(chunk.at_ms);
            members.extend(chunk.agents.iter().filter_map(|a| parse_machine(a)));
        }
        Ok((members, newest))
    }

    /// The retention sweep of presence: every other replica whose presence is older than
    /// [`PRESENCE_SWEEP_AFTER`] has its agents' last contact written to their own records (those no live
    /// replica lists), then its chunks and its heartbeat deleted, each as listed. Returns the records deleted.
    pub async fn sweep(&self) -> Result<usize, DispatchError> {
        let now = self.floor.now_ms();
        let store = self.floor.db.store();
        let mut replicas: HashMap<String, (ReplicaPresence, Vec<inplace_store::Entry>)> =
            HashMap::new();
        for entry in store.list(PRESENCE_ALIVE_PREFIX).await? {
            let Some(replica) = entry.key.strip_prefix(PRESENCE_ALIVE_PREFIX) else {
                continue;
            };
            let heartbeat = decode::<Heartbeat>(&entry.key, &entry.value).ok();
            let known = replicas.entry(replica.to_owned()).or_default();
            known.0.heartbeat = heartbeat;
            known.1.push(entry);
        }
        for entry in store.list(PRESENCE_MEMBERS_PREFIX).await? {
            let Some((replica, _)) = entry
                .key
                .strip_prefix(PRESENCE_MEMBERS_PREFIX)
                .and_then(|rest| rest.split_once('/'))
            else {
                continue;
            };
            let known = replicas.entry(replica.to_owned()).or_default();
            if let Ok(chunk) = decode::<MemberChunk>(&entry.key, &entry.value) {
                known.0.chunks_at_ms = known.0.chunks_at_ms.max(chunk.at_ms);
                known
                    .0
                    .members
                    .extend(chunk.agents.iter().filter_map(|a| parse_machine(a)));
            }
            // Chunks are deleted before the heartbeat: a sweep stopped half-way leaves it naming the replica.
            known.1.insert(0, entry);
        }
        let live: Vec<&ReplicaPresence> = replicas
            .values()
            .map(|(presence, _)| presence)
            .filter(|p| !is_dead(p.at_ms(), now, PRESENCE_STALE_AFTER.as_millis() as u64))
            .collect();
        let mut deleted = 0;
        for (replica, (presence, entries)) in &replicas {
            let sweep_ms = PRESENCE_SWEEP_AFTER.as_millis() as u64;
            if replica == &self.replica || !is_dead(presence.at_ms(), now, sweep_ms) {
                continue;
            }
            let at = presence.at_ms();
            let contacts = decide::to_record(presence, &live)
                .map(|machine| (machine.clone(), at))
                .collect();
            record_contacts(&self.floor, contacts).await?;
            for entry in entries {
                if self.floor.db.delete_as_listed(entry).await? {
                    deleted += 1;
                }
            }
        }
        Ok(deleted)
    }
}

/// Writes each agent's last contact to its own record (keeping its inventory) unless the record already says
/// as late, [`SEEN_WRITES_IN_FLIGHT`] at a time.
async fn record_contacts(
    floor: &Floor,
    contacts: Vec<(MachineRef, u64)>,
) -> Result<(), DispatchError> {
    let failed = futures_util::stream::iter(contacts)
        .map(|(machine, at)| async move {
            floor
                .db
                .update(&agent_key(&machine), |current: Option<&AgentRecord>| {
                    Ok(match current {
                        Some(record) if record.last_seen_ms >= at => None,
                        _ => Some(AgentRecord {
                            last_seen_ms: at,
                            inventory: current.and_then(|c| c.inventory.clone()),
                        }),
                    })
                })
                .await
        })
        .buffer_unordered(SEEN_WRITES_IN_FLIGHT)
        .filter_map(|written| async move { written.err() })
        .collect::<Vec<_>>()
        .await;
    match failed.into_iter().next() {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// This replica's name: its host name (the pod's, in Kubernetes) as a key segment, and 8 random hex digits,
/// so a restarted replica is a new one and two on one host never share a name.
fn replica_name() -> String {
    let host: String = std::env::var("HOSTNAME")
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'))
        .take(63)
        .collect();
    let mut random = [0u8; 4];
    // Without OS randomness, the process id and the clock still tell restarts apart.
    if getrandom::fill(&mut random).is_err() {
        random =
            (std::process::id() ^ crate::dispatch::floor::clock::system_ms() as u32).to_be_bytes();
    }
    let suffix = crate::hex(&random);
    if host.is_empty() {
        format!("replica-{suffix}")
    } else {
        format!("{host}-{suffix}")
    }
}

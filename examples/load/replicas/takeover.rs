//! Phase between the hold and the updates (`--kill-replica K`): replica K is SIGKILLed, as a node failure or an
//! OOM kill does. Its agents' connections fail; each backs off as the real agent does and connects to the next
//! replica (as a Kubernetes Service sends a new connection to a live endpoint), which answers its inventory
//! report: it is served again. Measured: the time from the kill until each of K's agents was answered by
//! another replica, the connection failures to K counted apart from every other error, and from the store's
//! presence (what every replica's `status --agents` reads) the live replicas listing all of K's agents and K's
//! heartbeat ageing: with `--notice-dead`, until it is older than `PRESENCE_STALE_AFTER` (K is dead for every
//! replica). Taken before the updates so the plans dispatched afterwards through the live replicas reach K's
//! agents on their new replica: nothing of theirs was lost with K.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use inplace_agent::BACKOFF_INITIAL;
use inplace_store::EtcdOptions;
use inplace_updater::dispatch::PRESENCE_STALE_AFTER;
use inplace_updater::dispatch::agents::presence::{Heartbeat, MemberChunk};
use inplace_updater::dispatch::floor::keys::{PRESENCE_ALIVE_PREFIX, PRESENCE_MEMBERS_PREFIX};

use super::setup::Fleet;
use super::{Sizes, TICK};
use crate::fleet::machine_name;
use crate::stats::{Summary, Table, ms, summarize};
use crate::swarm::Counters;

/// Longest from the kill until every agent of the killed replica is served again and the live replicas'
/// presence lists them all (and, with `--notice-dead`, the killed replica's heartbeat is stale).
pub const TAKEOVER_DEADLINE: Duration = Duration::from_secs(120);
/// One new connection's TLS handshake and one answered request, on a loaded machine, with every agent of the
/// killed replica reconnecting at once.
pub const TAKEOVER_ANSWER_ALLOWANCE: Duration = Duration::from_secs(4);
/// Target: every agent of a killed replica served again within this long of the kill. Its in-flight poll
/// fails at the kill, it sleeps the agent's first back-off (at most `BACKOFF_INITIAL`) and its next
/// connection, to the next replica, is answered.
pub const TAKEOVER_TARGET: Duration = BACKOFF_INITIAL.saturating_add(TAKEOVER_ANSWER_ALLOWANCE);
/// How often the store's presence is read while waiting.
pub const PRESENCE_READ_EVERY: Duration = Duration::from_secs(1);

/// What the takeover measured.
pub struct Takeover {
    /// The replica killed.
    pub replica: usize,
    /// Its agents.
    pub agents: Vec<usize>,
    /// For each agent served again by another replica after the kill: how long after it, and by which.
    pub served: BTreeMap<usize, (Duration, usize)>,
    /// The agents' failed requests and connects to the killed replica before the kill: what the children count
    /// against it beyond this, at the end of the run, are the expected failures the kill caused.
    pub errors_before: u64,
    /// Its agents that the live replicas' presence lists.
    pub listed_by_live: usize,
    /// Its heartbeat's age when the phase ended, and when (after the kill) it was first seen older than
    /// `PRESENCE_STALE_AFTER`.
    pub heartbeat_age: Option<Duration>,
    pub noticed_dead: Option<Duration>,
    pub wall: Duration,
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Errors the children counted against `replica` so far.
fn errors_to(fleet: &Fleet, replica: usize) -> u64 {
    fleet
        .children
        .iter()
        .flat_map(|c| c.latest().errors_by_replica)
        .filter(|&(r, _)| r == replica)
        .map(|(_, n)| n)
        .sum()
}

/// Every replica's presence in the store: heartbeat time by replica name, and the agents each one lists.
struct Read {
    heartbeats: BTreeMap<String, u64>,
    members: BTreeMap<String, BTreeSet<String>>,
}

async fn read_presence(store: &dyn inplace_store::Store) -> anyhow::Result<Read> {
    let mut heartbeats = BTreeMap::new();
    for entry in store.list(PRESENCE_ALIVE_PREFIX).await? {
        let name = entry
            .key
            .trim_start_matches(PRESENCE_ALIVE_PREFIX)
            .to_string();
        let beat: Heartbeat = serde_json::from_slice(&entry.value)?;
        heartbeats.insert(name, beat.at_ms);
    }
    let mut members: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in store.list(PRESENCE_MEMBERS_PREFIX).await? {
        let rest = entry.key.trim_start_matches(PRESENCE_MEMBERS_PREFIX);
        let name = rest.split('/').next().unwrap_or(rest).to_string();
        let chunk: MemberChunk = serde_json::from_slice(&entry.value)?;
        members.entry(name).or_default().extend(chunk.agents);
    }
    Ok(Read {
        heartbeats,
        members,
    })
}

/// Kills replica `replica` and waits (within [`TAKEOVER_DEADLINE`]) until its agents are served again and
/// listed by the live replicas' presence (and, when `notice_dead`, its heartbeat is stale).
pub fn takeover(
    fleet: &mut Fleet,
    sizes: &Sizes,
    replica: usize,
    notice_dead: bool,
) -> anyhow::Result<Takeover> {
    anyhow::ensure!(
        replica < sizes.replicas && sizes.replicas >= 2,
        "--kill-replica must name one of 2 or more replicas (0..{})",
        sizes.replicas
    );
    let agents: Vec<usize> = (replica..sizes.agents).step_by(sizes.replicas).collect();
    let names: BTreeSet<String> = agents
        .iter()
        .map(|&i| format!("default/{}", machine_name(i / sizes.per_cluster, i)))
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let store = runtime.block_on(inplace_store::open(
        &fleet.etcd.url(),
        &EtcdOptions::default(),
    ))?;
    let before = runtime.block_on(read_presence(store.as_ref()))?;
    let errors_before = errors_to(fleet, replica);

    let kill_ns = unix_ns();
    let kill_ms = kill_ns / 1_000_000;
    let killed = Instant::now();
    fleet.replicas[replica].kill();
    fleet.dead = Some(replica);

    let served = |fleet: &Fleet| -> BTreeMap<usize, (Duration, usize)> {
        let mut served = BTreeMap::new();
        for child in &fleet.children {
            let Ok(view) = child.view.lock() else {
                continue;
            };
            for &(agent, by, at) in &view.served {
                if at > kill_ns && agent % sizes.replicas == replica {
                    served
                        .entry(agent)
                        .or_insert((Duration::from_nanos(at - kill_ns), by));
                }
            }
        }
        served
    };
    let mut dead_name: Option<String> = None;
    let (mut listed_by_live, mut heartbeat_age, mut noticed_dead) = (0, None, None);
    let mut read_at = Instant::now() - PRESENCE_READ_EVERY;
    loop {
        fleet.check_children()?;
        let all_served = served(fleet).len() == agents.len();
        if all_served && read_at.elapsed() >= PRESENCE_READ_EVERY {
            read_at = Instant::now();
            let now = runtime.block_on(read_presence(store.as_ref()))?;
            // The dead replica: of the names heartbeating before the kill, the one whose heartbeat has not
            // moved past the kill once every other one has.
            let stuck: Vec<&String> = before
                .heartbeats
                .keys()
                .filter(|name| now.heartbeats.get(*name).is_none_or(|&at| at <= kill_ms))
                .collect();
            if let [name] = stuck.as_slice() {
                dead_name = Some((*name).clone());
            }
            if let Some(dead) = &dead_name {
                let at = now.heartbeats.get(dead).copied().unwrap_or(0);
                let age = Duration::from_millis((unix_ns() / 1_000_000).saturating_sub(at));
                heartbeat_age = Some(age);
                if age > PRESENCE_STALE_AFTER && noticed_dead.is_none() {
                    noticed_dead = Some(killed.elapsed());
                }
                let live: BTreeSet<&String> = now
                    .members
                    .iter()
                    .filter(|(name, _)| *name != dead)
                    .flat_map(|(_, listed)| listed)
                    .collect();
                listed_by_live = names.iter().filter(|n| live.contains(n)).count();
            }
        }
        let done = all_served
            && listed_by_live == agents.len()
            && (!notice_dead || noticed_dead.is_some());
        if done || killed.elapsed() > TAKEOVER_DEADLINE {
            break;
        }
        std::thread::sleep(TICK);
    }
    Ok(Takeover {
        replica,
        served: served(fleet),
        agents,
        errors_before,
        listed_by_live,
        heartbeat_age,
        noticed_dead,
        wall: killed.elapsed(),
    })
}

impl Takeover {
    /// The failures the kill caused: the children's failed requests and connects to the killed replica after
    /// it (their final counters `children`).
    pub fn expected_errors<'a>(&self, children: impl Iterator<Item = &'a Counters>) -> u64 {
        let total: u64 = children
            .flat_map(|c| &c.errors_by_replica)
            .filter(|&&(r, _)| r == self.replica)
            .map(|&(_, n)| n)
            .sum();
        total.saturating_sub(self.errors_before)
    }

    /// Time from the kill to each agent served again.
    pub fn times(&self) -> Summary {
        summarize(self.served.values().map(|&(d, _)| d).collect())
    }

    /// Whether every agent of the killed replica was served again within [`TAKEOVER_TARGET`].
    pub fn met(&self) -> bool {
        self.served.len() == self.agents.len() && self.times().max <= TAKEOVER_TARGET
    }

    /// The takeover table; `plans` is how many of the killed replica's agents given work after the kill got
    /// their plan, of how many.
    pub fn print(&self, expected_errors: u64, plans: (usize, usize)) {
        let times = self.times();
        let mut by: BTreeMap<usize, usize> = BTreeMap::new();
        for &(_, replica) in self.served.values() {
            *by.entry(replica).or_default() += 1;
        }
        let by: Vec<String> = by
            .iter()
            .map(|(r, n)| format!("replica {r}: {n}"))
            .collect();
        let mut table = Table::new(&["takeover", "value"]);
        let rows = [
            (
                "replica killed (SIGKILL) after the hold".to_string(),
                format!("replica {} ({} agents)", self.replica, self.agents.len()),
            ),
            (
                "its agents answered by another replica (inventory acked)".into(),
                format!(
                    "{} / {} ({})",
                    self.served.len(),
                    self.agents.len(),
                    by.join(", ")
                ),
            ),
            (
                "kill → agent answered again p50 / p99 / max".into(),
                format!("{} / {} / {}", ms(times.p50), ms(times.p99), ms(times.max)),
            ),
            (
                "listed by the live replicas' presence (the store)".into(),
                format!("{} / {}", self.listed_by_live, self.agents.len()),
            ),
            (
                "killed replica's heartbeat age at the phase's end".into(),
                self.heartbeat_age.map_or("not identified".into(), ms),
            ),
            (
                format!("kill → its heartbeat older than {PRESENCE_STALE_AFTER:?} (dead)"),
                self.noticed_dead
                    .map_or("not waited for (--notice-dead)".into(), ms),
            ),
            (
                "connection failures to the killed replica (expected, not errors)".into(),
                expected_errors.to_string(),
            ),
            (
                "plans to its agents, dispatched after the kill through live replicas".into(),
                format!("{} / {}", plans.0, plans.1),
            ),
            ("phase wall time".into(), ms(self.wall)),
        ];
        for (name, value) in rows {
            table.row(vec![name, value]);
        }
        println!();
        table.print();
    }
}

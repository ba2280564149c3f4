//! Bounded retention (issue 43.6) over the in-memory store with a pinned clock: a fleet that runs for a simulated
//! year (token rotations every two days, a run and an agent release every week, one agent failing each release)
//! keeps a store of the same size from its second month on; the sweep never deletes a record still needed; and a
//! sweep stopped at any write (a crash) leaves only records nothing needed deleted, the next sweep ending where an
//! uninterrupted one would have.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use inplace_agent_api::{AgentIdentity, MachineRef, StepStatus, UpgradeOutcome};
use inplace_store::memory::MemoryStore;
use inplace_store::{Precondition, Store};
use tokio_util::sync::CancellationToken;

use super::upgrade::polling;
use crate::dispatch::faulty_store::{FaultyStore, unavailable};
use crate::dispatch::testing::*;
use crate::dispatch::upkeep::rollout::release::{AgentRelease, ReleaseBinary};
use crate::dispatch::upkeep::tokens::MintedToken;
use crate::dispatch::upkeep::tokens::rule::Lifetime;
use crate::dispatch::*;

const DAY: u64 = 86_400_000;
const HOUR: u64 = 3_600_000;
/// 2027-01-01T00:00:00Z.
const START: u64 = 1_798_761_600_000;
/// Agents' token lifetime: rotated every two days.
const TOKEN_TTL: u64 = 3 * DAY;

fn digest(n: u64) -> String {
    format!("{n:064x}")
}

/// One agent: its Machine, the token it uses now (hash, lifetime), and the agent binary it runs.
struct Agent {
    name: String,
    token: String,
    lifetime: Lifetime,
    running: String,
}

/// A fleet of agents whose records a year of operation writes through the dispatcher's own paths.
struct Sim {
    d: Arc<Dispatcher>,
    agents: Vec<Agent>,
    minted: u64,
    release: u64,
}

impl Sim {
    fn new(store: Arc<dyn Store>, machines: usize) -> Sim {
        let d = Dispatcher::new(store, DispatchConfig::default(), CancellationToken::new());
        d.clock().pin_for_tests(START);
        let agents = (0..machines)
            .map(|i| Agent {
                name: format!("m-{i}"),
                token: digest(1_000_000 + i as u64),
                lifetime: Lifetime {
                    issued_ms: START - DAY,
                    expires_ms: START - DAY + TOKEN_TTL,
                },
                running: digest(0),
            })
            .collect();
        Sim {
            d,
            agents,
            minted: 0,
            release: 0,
        }
    }

    fn now(&self) -> u64 {
        self.d.clock().now_ms()
    }

    /// Six hours pass; agents whose token is due get a successor and start using it (every third rotation,
    /// the first offer was lost on its way and a second one minted ten minutes later).
    async fn quarter_day(&mut self) {
        self.d
            .clock()
            .advance_for_tests(Duration::from_millis(6 * HOUR));
        for i in 0..self.agents.len() {
            let now = self.now();
            if !self.agents[i].lifetime.rotation_due(now) {
                continue;
            }
            let offers = if self.minted.is_multiple_of(3) { 2 } else { 1 };
            let mut successor = String::new();
            for offer in 0..offers {
                if offer > 0 {
                    self.d.clock().advance_for_tests(Duration::from_secs(600));
                }
                self.minted += 1;
                successor = digest(self.minted);
                let agent = &self.agents[i];
                let record = MintedToken {
                    scope: scope(),
                    lifetime: agent.lifetime.successor(self.now()),
                    root: digest(1_000_000 + i as u64),
                    predecessor: agent.token.clone(),
                    rotation_key: String::new(),
                };
                let minted = self
                    .d
                    .upkeep
                    .tokens
                    .mint_successor(&agent.token, &identity(&agent.name), &successor, record)
                    .await
                    .unwrap();
                assert!(minted.is_some(), "{} rotation {offer}", agent.name);
            }
            let minted = self
                .d
                .upkeep
                .tokens
                .minted_token(&successor)
                .await
                .unwrap()
                .unwrap();
            self.d
                .upkeep
                .tokens
                .successor_used(&successor, &minted)
                .await
                .unwrap();
            let agent = &mut self.agents[i];
            agent.token = successor;
            agent.lifetime = minted.lifetime;
        }
    }

    /// A week's work: every Machine gets a new desired state, run to the end by its agent; then a new agent
    /// release, to which every agent upgrades but the first, whose new binary fails.
    async fn week(&mut self, week: u64) {
        for agent in &self.agents {
            let request = request(&agent.name, false, "v1.34.1", &format!("week {week}"));
            update(&self.d, &request).await.unwrap();
            let plan = handed_plan(&self.d, &agent.name).await;
            for status in [StepStatus::Running, StepStatus::Succeeded] {
                agent_reports(
                    &self.d,
                    &agent.name,
                    &plan.id,
                    0..plan.steps.len() as u32,
                    status,
                )
                .await;
            }
        }
        self.release += 1;
        let target = digest(self.release);
        self.d.upkeep.rollout.set_release(Some(AgentRelease {
            version: format!("0.{}.0", self.release),
            binaries: BTreeMap::from([(
                "amd64".to_string(),
                ReleaseBinary {
                    sha256: target.clone(),
                    url: None,
                },
            )]),
            concurrency: self.agents.len() as u32,
            max_failures: u32::MAX,
        }));
        for (i, agent) in self.agents.iter_mut().enumerate() {
            let offered = self
                .d
                .agents
                .poll(&scope(), &polling(&agent.name, &agent.running, None))
                .await
                .unwrap();
            assert!(
                offered.agent_upgrade.is_some(),
                "{} week {week}",
                agent.name
            );
            let (sha, succeeded) = if i == 0 {
                (agent.running.clone(), false)
            } else {
                (target.clone(), true)
            };
            let outcome = UpgradeOutcome {
                target_sha256: target.clone(),
                succeeded,
                message: "outcome".into(),
            };
            self.d
                .agents
                .poll(&scope(), &polling(&agent.name, &sha, Some(outcome)))
                .await
                .unwrap();
            agent.running = sha;
        }
    }

    /// Runs `days` days, sweeping every `sweep_every` hours (`None`: never).
    async fn run(&mut self, first_day: u64, days: u64, sweep_every: Option<u64>) {
        for day in first_day..first_day + days {
            if day.is_multiple_of(7) {
                self.week(day / 7).await;
            }
            for quarter in 0..4 {
                self.quarter_day().await;
                if sweep_every.is_some_and(|h| (quarter * 6u64).is_multiple_of(h)) {
                    self.d.sweep().await.unwrap();
                }
            }
        }
    }
}

fn identity(name: &str) -> AgentIdentity {
    AgentIdentity::Machine(MachineRef::new("default", name))
}

/// Keys by their first segment, and the total bytes of keys and values.
async fn census(store: &dyn Store) -> (BTreeMap<String, usize>, usize) {
    let mut kinds = BTreeMap::new();
    let mut bytes = 0;
    for entry in store.list("").await.unwrap() {
        let kind = entry.key.split('/').next().unwrap_or_default().to_string();
        *kinds.entry(kind).or_default() += 1;
        bytes += entry.key.len() + entry.value.len();
    }
    (kinds, bytes)
}

#[tokio::test]
async fn a_fleet_that_ran_for_a_year_keeps_a_store_of_the_size_it_had_after_two_months() {
    const MACHINES: usize = 12;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut sim = Sim::new(store.clone(), MACHINES);
    sim.run(0, 60, Some(6)).await;
    let (early, early_bytes) = census(store.as_ref()).await;
    sim.run(60, 305, Some(6)).await;
    let (year, year_bytes) = census(store.as_ref()).await;
    let keys = |kinds: &BTreeMap<String, usize>| kinds.values().sum::<usize>();
    eprintln!(
        "{MACHINES} machines, {} tokens minted, {} releases: after 60 days {} keys ({early_bytes} bytes) \
         {early:?}; after 365 days {} keys ({year_bytes} bytes) {year:?}",
        sim.minted,
        sim.release,
        keys(&early),
        keys(&year)
    );
    // Per Machine: its record, current run and one or two finished within --retention, its verdict, its
    // provider index, its last upgrade; its tokens minted within the last TOKEN_TTL + --retention (10 days: at
    // most seven, with lost offers) and their rotations. The retention record besides.
    let bound = MACHINES * 25 + 1;
    assert!(keys(&year) <= bound, "{} keys, over {bound}", keys(&year));
    assert!(
        keys(&year) <= keys(&early) + MACHINES,
        "the store grew from day 60 to day 365: {early:?} → {year:?}"
    );
    assert!(year_bytes <= early_bytes * 11 / 10 + 4096);
    let record = sim.d.retention().await.unwrap().unwrap();
    assert_eq!(record.swept_ms, sim.now());
    assert!(record.failed.is_empty(), "{record:?}");
}

/// What the store holds that the sweep must keep at `now`, by the rules of each kind: tokens not expired and the
/// rotations of tokens not expired, upgrades in flight and held slots, unfinished and current runs, verdicts and
/// refusals younger than --verdict-retention; records of other kinds are never swept.
async fn needed(d: &Dispatcher, now: u64) -> BTreeSet<String> {
    let entries = d.store().list("").await.unwrap();
    let json = |bytes: &[u8]| serde_json::from_slice::<serde_json::Value>(bytes).unwrap();
    let expires: BTreeMap<String, u64> = entries
        .iter()
        .filter_map(|e| {
            let hash = e.key.strip_prefix("agent-tokens/")?;
            (!hash.contains('/')).then(|| {
                let expires = json(&e.value)["lifetime"]["expiresMs"].as_u64().unwrap();
                (hash.to_string(), expires)
            })
        })
        .collect();
    let current: BTreeSet<String> = entries
        .iter()
        .filter_map(|e| {
            let machine = e.key.strip_prefix("machines/")?;
            Some(format!(
                "updates/{machine}/{}",
                json(&e.value)["runId"].as_str()?
            ))
        })
        .collect();
    let verdict_horizon = now - DispatchConfig::default().verdict_retention.as_millis() as u64;
    let mut keep = BTreeSet::new();
    for entry in entries {
        let value = json(&entry.value);
        let at = |field: &str| value[field].as_u64().unwrap();
        let needed = match entry.key.split('/').next().unwrap() {
            "agent-tokens" if entry.key.contains("/rotation/") => value["successors"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| expires.get(s.as_str().unwrap()).is_some_and(|e| *e > now)),
            "agent-tokens" => expires[entry.key.strip_prefix("agent-tokens/").unwrap()] > now,
            "agent-upgrades" => value["state"] == "upgrading" && at("startedMs") + 600_000 > now,
            "slots" => at("expiresMs") > now,
            "updates" => value["finishedMs"].is_null() || current.contains(&entry.key),
            "verdicts" => at("judgedMs") > verdict_horizon,
            "refusals" => at("warnedMs") > verdict_horizon,
            _ => true,
        };
        if needed {
            keep.insert(entry.key);
        }
    }
    keep
}

#[tokio::test]
async fn the_sweep_keeps_every_record_still_needed_and_a_crash_at_any_write_only_stops_it_early() {
    // A month of a small fleet, never swept, then an upgrade in flight and a token not yet used.
    let inner = Arc::new(MemoryStore::new());
    let mut sim = Sim::new(inner.clone(), 3);
    sim.run(0, 30, None).await;
    let in_flight = sim
        .d
        .agents
        .poll(&scope(), &polling("m-1", &digest(0), None))
        .await
        .unwrap();
    assert!(in_flight.agent_upgrade.is_some(), "m-1 runs an old binary");
    let snapshot = inner.list("").await.unwrap();
    let now = sim.now();
    let release = sim.d.upkeep.rollout.release();
    let replica = |store: Arc<dyn Store>| {
        let d = Dispatcher::new(store, DispatchConfig::default(), CancellationToken::new());
        d.clock().pin_for_tests(now);
        d.upkeep.rollout.set_release(release.as_deref().cloned());
        d
    };
    let copy = || async {
        let store = Arc::new(MemoryStore::new());
        for entry in &snapshot {
            store
                .put(&entry.key, entry.value.clone(), Precondition::Any)
                .await
                .unwrap();
        }
        store
    };
    // The uninterrupted sweep: what it keeps, and how many writes it makes.
    let whole = copy().await;
    let writes = Arc::new(AtomicUsize::new(0));
    let counted = writes.clone();
    let d = replica(Arc::new(FaultyStore::new(
        whole.clone(),
        Box::new(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(()) })
        }),
    )));
    let must_keep = needed(&d, now).await;
    let record = d.sweep().await.unwrap();
    let deleted: u64 = record.deleted.values().sum();
    assert!(deleted > 50, "a month of records to sweep: {record:?}");
    let keys = |store: Arc<MemoryStore>| async move {
        let entries = store.list("").await.unwrap();
        entries
            .into_iter()
            .map(|e| e.key)
            .filter(|k| k != RETENTION_KEY)
            .collect::<BTreeSet<String>>()
    };
    let kept = keys(whole.clone()).await;
    assert!(
        must_keep.iter().all(|k| kept.contains(k)),
        "deleted a needed record: {:?}",
        must_keep.difference(&kept).collect::<Vec<_>>()
    );
    assert!(
        kept.contains("agent-upgrades/default/m-1") && kept.iter().any(|k| k.starts_with("slots/"))
    );
    let total = writes.load(Ordering::SeqCst);
    // The process dies before write `k` (no write from then on), for every k; then a new process sweeps.
    for k in 0..total {
        let store = copy().await;
        let count = Arc::new(AtomicUsize::new(0));
        let seen = count.clone();
        let crashed = replica(Arc::new(FaultyStore::new(
            store.clone(),
            Box::new(move |_| {
                let n = seen.fetch_add(1, Ordering::SeqCst);
                Box::pin(async move {
                    if n >= k {
                        Err(unavailable("the process died here"))
                    } else {
                        Ok(())
                    }
                })
            }),
        )));
        assert!(
            crashed.sweep().await.is_err(),
            "write {k}: the record is the last write"
        );
        let left = keys(store.clone()).await;
        assert!(
            must_keep.iter().all(|key| left.contains(key)),
            "crash at write {k} deleted a needed record"
        );
        assert!(left.is_superset(&kept), "crash at write {k}");
        assert!(
            crashed.retention().await.unwrap().is_none(),
            "no record of a sweep that did not end"
        );
        replica(store.clone()).sweep().await.unwrap();
        let after = keys(store.clone()).await;
        assert_eq!(after, kept, "crash at write {k}, then a whole sweep");
    }
}

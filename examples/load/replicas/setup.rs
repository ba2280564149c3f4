//! The run's processes: the scratch directory (development certificates, one agent token per cluster), one
//! real etcd and the server replicas on it, ready; the agents' child processes join them in
//! [`super::connect`]. Everything is killed when the [`Fleet`] is dropped, also when the run fails half-way.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use inplace_agent_api::{AgentIdentity, MachineRef};
use inplace_store::testing::Etcd;
use inplace_store::{EtcdOptions, MAX_TXN_OPS, Precondition, TxnOp};
use inplace_updater::cmd::certs::{DevCertPaths, DevCertsSpec, write_dev_certs};
use inplace_updater::dispatch::AgentScope;
use inplace_updater::dispatch::floor::keys::agent_key;
use inplace_updater::dispatch::floor::records::AgentRecord;
use inplace_updater::dispatch::upkeep::tokens::create_token;

use super::{ReplicasArgs, Sizes};
use crate::agents::idle_inventory;
use crate::fleet::machine_name;
use crate::process::{ServerProcess, default_binary, server_args};
use crate::stats::{ProcSample, proc_sample};
use crate::swarm::SwarmChild;

/// Processes this run started and the files they share. Fields drop in order: children first, then
/// replicas, then etcd, then the scratch directory.
pub struct Fleet {
    pub children: Vec<SwarmChild>,
    pub replicas: Vec<ServerProcess>,
    /// The replica SIGKILLed by the takeover phase, if any (its process is gone from then on).
    pub dead: Option<usize>,
    pub etcd: Etcd,
    pub etcd_pid: u32,
    /// Each replica's hooks and agent API address, in replica order.
    pub addrs: Vec<SocketAddr>,
    pub certs: DevCertPaths,
    /// The agents' raw tokens, one line per cluster: the children read them from here, never from a command
    /// line.
    pub raw_tokens: PathBuf,
    pub dir: tempfile::TempDir,
}

/// Every replica's and etcd's /proc figures at one phase boundary.
pub struct PhaseSample {
    pub replicas: Vec<ProcSample>,
    pub etcd: ProcSample,
}

impl Fleet {
    /// Certificates and tokens written, etcd started, every replica started on it and ready.
    pub fn start(args: &ReplicasArgs, sizes: &Sizes) -> anyhow::Result<Fleet> {
        let dir = tempfile::tempdir()?;
        if args.keep_dir {
            println!("scratch directory (kept): {}", dir.path().display());
        }
        let certs = write_dev_certs(&DevCertsSpec::with_defaults(
            dir.path().into(),
            vec![],
            vec![],
        ))?;
        let (mut hashed, mut raw) = (String::new(), String::new());
        for cluster in 0..sizes.clusters() {
            let scope = AgentScope::Cluster {
                namespace: "default".into(),
                cluster: format!("edge-{cluster:03}"),
            };
            let token =
                create_token(&scope, None).map_err(|err| anyhow::anyhow!("token: {err}"))?;
            hashed.push_str(&token.line);
            hashed.push('\n');
            raw.push_str(&token.token);
            raw.push('\n');
        }
        let token_file = dir.path().join("agent-tokens");
        std::fs::write(&token_file, hashed)?;
        let raw_tokens = dir.path().join("agent-tokens.raw");
        std::fs::write(&raw_tokens, raw)?;

        let mut etcd = Etcd::start().context("starting etcd (apt-get install etcd-server)")?;
        seed_inventories(&etcd, sizes)?;
        // etcd 3.4 (Debian's) copies its whole read buffer for every read, at the largest size a burst of writes
        // ever grew it to; after the seed's burst etcd spent 2.5–2.8 times the CPU on the same polls' reads
        // (docs/performance.md, "What made etcd work harder"). A fleet's records are written over days, never in
        // one burst: a restart gives etcd the buffer a long-running one has.
        etcd.restart().context("restarting etcd after the seed")?;
        let store = etcd.store_url();
        let etcd_pid = etcd.pid().context("etcd is not running")?;
        let binary = match &args.server_bin {
            Some(path) => path.clone(),
            None => default_binary()?,
        };
        let mut server_args = server_args(&certs, &token_file, &store);
        server_args.extend([
            "--retry-after-seconds".into(),
            args.retry_after_seconds.to_string(),
        ]);
        let mut fleet = Fleet {
            children: Vec::new(),
            replicas: Vec::new(),
            dead: None,
            etcd,
            etcd_pid,
            addrs: Vec::new(),
            certs,
            raw_tokens,
            dir,
        };
        for replica in 0..sizes.replicas {
            let home = fleet.dir.path().join(format!("replica-{replica}"));
            std::fs::create_dir_all(&home)?;
            fleet
                .replicas
                .push(ServerProcess::start(&binary, &server_args, &home)?);
        }
        for replica in &fleet.replicas {
            replica.wait_ready()?;
        }
        fleet.addrs = fleet.replicas.iter().map(|r| r.hooks).collect();
        println!(
            "{} agents ({} clusters, one token each) in {} child processes, long-polling {} replicas ({}) on \
             one etcd (pid {etcd_pid}, {store}); waitSeconds {}; work for {} of them from {} CAPI workers, each \
             UpdateMachine sent to another replica than the agent's",
            sizes.agents,
            sizes.clusters(),
            sizes.children,
            sizes.replicas,
            binary.display(),
            args.wait_seconds,
            sizes.targets,
            args.capi_workers
        );
        Ok(fleet)
    }

    /// Every replica's and etcd's figures now (zero for a killed replica).
    pub fn sample(&self) -> anyhow::Result<PhaseSample> {
        let replicas = self
            .replicas
            .iter()
            .enumerate()
            .map(|(i, r)| {
                if self.dead == Some(i) {
                    Ok(ProcSample::default())
                } else {
                    proc_sample(r.pid())
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PhaseSample {
            replicas,
            etcd: proc_sample(self.etcd_pid)?,
        })
    }

    /// Whether replica `i` is running (not killed by the takeover phase).
    pub fn alive(&self, i: usize) -> bool {
        self.dead != Some(i)
    }

    /// Fails when a child holding agents died.
    pub fn check_children(&mut self) -> anyhow::Result<()> {
        for child in &mut self.children {
            child.check_alive()?;
        }
        Ok(())
    }
}

/// Stores every agent's record with the inventory it reports after a failure, as a fleet that ran before the
/// measurement left the store (the real agent reports its inventory when it starts; the harness's agents stand
/// for agents already running, and report only after a failure): a replica killed later finds its agents'
/// inventories stored, as it would in a real fleet. [`MAX_TXN_OPS`] records per transaction, before the
/// replicas start. (Reporting them all at connect instead, 100 000 agents connecting at once, overwhelmed the one
/// etcd on the harness's 2 cores: reads timed out and the agents' retries kept it so for 8 minutes. A fleet's
/// first start is spread over the days its agents are installed.)
fn seed_inventories(etcd: &Etcd, sizes: &Sizes) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = inplace_store::open(&etcd.url(), &EtcdOptions::default()).await?;
        let now_ms = u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis(),
        )?;
        let indices: Vec<usize> = (0..sizes.agents).collect();
        for batch in indices.chunks(MAX_TXN_OPS) {
            let mut ops = Vec::with_capacity(batch.len());
            for &index in batch {
                let machine =
                    MachineRef::new("default", machine_name(index / sizes.per_cluster, index));
                let record = AgentRecord {
                    last_seen_ms: now_ms,
                    inventory: Some(idle_inventory(&AgentIdentity::Machine(machine.clone()))),
                };
                ops.push(TxnOp::put(
                    agent_key(&machine),
                    serde_json::to_vec(&record)?,
                    Precondition::Any,
                ));
            }
            store.commit(ops).await?;
        }
        anyhow::Ok(())
    })
}

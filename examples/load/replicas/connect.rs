//! Phase one: the fleet connects. One child process per slice of the agents, each agent on replica
//! `i % replicas`; done when every agent has sent its first poll.

use std::time::{Duration, Instant};

use super::setup::Fleet;
use super::{ReplicasArgs, Sizes, TICK};
use crate::swarm::{SwarmChild, SwarmSpec};

/// Longest the whole fleet may take to connect and send its first poll.
pub const CONNECT_DEADLINE: Duration = Duration::from_secs(600);

/// Starts the children and waits until every agent polled once, or fails naming how many did.
pub fn connect(fleet: &mut Fleet, args: &ReplicasArgs, sizes: &Sizes) -> anyhow::Result<()> {
    let started = Instant::now();
    let per_child = sizes.agents.div_ceil(sizes.children);
    for child in 0..sizes.children {
        let first = child * per_child;
        let count = per_child.min(sizes.agents.saturating_sub(first));
        if count == 0 {
            break;
        }
        let spec = SwarmSpec {
            ca: &fleet.certs.ca_cert,
            tokens: &fleet.raw_tokens,
            replicas: &fleet.addrs,
            first,
            count,
            agents_per_cluster: sizes.per_cluster,
            wait_seconds: args.wait_seconds,
            connect_concurrency: args.connect_concurrency,
            no_alpn: args.no_alpn,
            child,
        };
        let started = SwarmChild::start(&spec, fleet.dir.path())?;
        fleet.children.push(started);
    }
    let first_polls =
        |fleet: &Fleet| -> usize { fleet.children.iter().map(|c| c.latest().first_polls).sum() };
    let errors = |fleet: &Fleet| -> u64 { fleet.children.iter().map(|c| c.latest().errors).sum() };
    while first_polls(fleet) < sizes.agents {
        fleet.check_children()?;
        anyhow::ensure!(
            started.elapsed() < CONNECT_DEADLINE,
            "only {} of {} agents connected within {CONNECT_DEADLINE:?} (errors: {})",
            first_polls(fleet),
            sizes.agents,
            errors(fleet)
        );
        std::thread::sleep(TICK);
    }
    Ok(())
}

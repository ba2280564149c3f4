//! The open files a run needs, checked against the limit before anything starts. Every replica holds one
//! descriptor per agent it serves (`agents / replicas` of them) and every child one per agent it holds, and
//! both inherit this process's RLIMIT_NOFILE (raised at start-up as far as it may go): a limit too low for them
//! would otherwise fail midway, with a replica refusing connections (EMFILE) after minutes of connecting.

use rustix::process::{Resource, getrlimit};

use super::{MAX_REPLICAS, Sizes};
use crate::fleet::FD_HEADROOM;
use crate::swarm::CHILD_FD_HEADROOM;

/// The open-file limit in force: the soft one, which the replicas and children inherit, and the hard one,
/// past which only a process with CAP_SYS_RESOURCE may raise it.
#[derive(Clone, Copy)]
pub struct Limit {
    pub soft: u64,
    pub hard: u64,
}

/// This process's limit now.
pub fn open_file_limit() -> Limit {
    let limit = getrlimit(Resource::Nofile);
    Limit {
        soft: limit.current.unwrap_or(u64::MAX),
        hard: limit.maximum.unwrap_or(u64::MAX),
    }
}

/// Replicas the agents are shared by at the most crowded moment: all of them, or one fewer once the takeover
/// phase killed one (its agents move to the others).
fn serving(sizes: &Sizes) -> usize {
    (sizes.replicas - usize::from(sizes.kill.is_some())).max(1)
}

/// Open files one replica needs: its share of the agents' connections, CAPI's connections and its own files.
pub fn per_replica(sizes: &Sizes, capi_workers: usize) -> u64 {
    (sizes.agents.div_ceil(serving(sizes)) + capi_workers + FD_HEADROOM) as u64
}

/// Open files one child needs: its agents' connections and its own files.
pub fn per_child(sizes: &Sizes) -> u64 {
    (sizes.agents.div_ceil(sizes.children) + CHILD_FD_HEADROOM) as u64
}

/// Fails, naming the limit, the figure needed and what would fit, when a replica or a child of `sizes` would
/// need more open files than `limit.soft`.
pub fn check(sizes: &Sizes, capi_workers: usize, limit: Limit) -> anyhow::Result<()> {
    let replica = per_replica(sizes, capi_workers);
    if replica > limit.soft {
        let room = limit
            .soft
            .saturating_sub((capi_workers + FD_HEADROOM) as u64)
            .max(1);
        let replicas = (sizes.agents as u64).div_ceil(room) + u64::from(sizes.kill.is_some());
        let fits = if replicas <= MAX_REPLICAS as u64 {
            format!("--replicas {replicas} would fit")
        } else {
            format!("more than {MAX_REPLICAS} replicas (the most one run starts) would be needed")
        };
        anyhow::bail!(
            "{} agents over {} replicas{} need about {replica} open files in each replica ({} agent connections \
             + {capi_workers} CAPI workers + {FD_HEADROOM} of its own), but the open-file limit (RLIMIT_NOFILE) \
             is {} (hard limit {}; only CAP_SYS_RESOURCE raises the hard one, e.g. `ulimit -Hn` as root outside \
             a container that caps it): {fits}, or run with fewer agents or a higher limit",
            sizes.agents,
            sizes.replicas,
            if sizes.kill.is_some() {
                " (one of them killed: its agents move to the others)"
            } else {
                ""
            },
            sizes.agents.div_ceil(serving(sizes)),
            limit.soft,
            limit.hard
        );
    }
    let child = per_child(sizes);
    if child > limit.soft {
        let room = limit.soft.saturating_sub(CHILD_FD_HEADROOM as u64).max(1);
        anyhow::bail!(
            "{} agents in {} child processes need about {child} open files in each child, but the open-file limit \
             (RLIMIT_NOFILE) is {} (hard limit {}): run with --children {} or more",
            sizes.agents,
            sizes.children,
            limit.soft,
            limit.hard,
            (sizes.agents as u64).div_ceil(room)
        );
    }
    Ok(())
}

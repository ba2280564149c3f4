//! The control-plane preflight's decision, over data only: what the agent saw of etcd and of the other
//! control-plane Nodes → pass, or wait (saying why).
//!
//! The etcd rule, for this node's member M of the n voting members (learners do not vote and are not
//! looked at):
//! - every voting member other than M answers healthy, and
//! - the healthy voters other than M are a quorum, floor(n/2)+1: when the step takes M down, etcd keeps
//!   its quorum.
//!
//! M's own health is not required: disrupting a member that is already down loses nothing, and the step
//! may be what repairs it (an etcdImage fix, the reboot that brings it back). The exception is a
//! single-member etcd, which has no quorum to keep — any disruption of it is the outage the operator chose
//! with one control-plane node; it passes when it is healthy (the message says so). A two-member etcd
//! never passes: it cannot lose either member.
//!
//! When the agent cannot tell which member is M (no member has the local endpoint's member id or the node's
//! name), it waits: which member it would take down is unknown.

/// One etcd member as the agent saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    /// The member id.
    pub id: u64,
    /// Its name (kubeadm names members after their Node); empty before it started.
    pub name: String,
    /// The client URL its health was asked at (`None`: it lists none: not started).
    pub url: Option<String>,
    /// A learner (not a voter).
    pub learner: bool,
    /// `Ok` when it answered healthy, else why not.
    pub health: Result<(), String>,
}

/// What the agent saw of etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Etcd {
    /// No etcd static pod manifest: this node runs no etcd member, etcd is not checked.
    NoLocalMember,
    /// `controlPlane.checkEtcd: false`: etcd is not checked.
    NotChecked,
    /// The members could not be listed (why).
    Unreachable(String),
    /// The members and how each answered; `local_id` is the member id the local endpoint reported.
    Members {
        /// Every member listed.
        members: Vec<Member>,
        /// The local member's id, when the local endpoint told it (now, or at an earlier look).
        local_id: Option<u64>,
        /// The other member's client URL that listed the members, when the local endpoint did not.
        listed_by: Option<String>,
    },
}

/// What the agent saw of the other control-plane Nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Nodes {
    /// The agent config has no `node:` section: no API credentials, not checked.
    NotConfigured,
    /// The Nodes could not be listed (why).
    Unreachable(String),
    /// The other control-plane Nodes that are not Ready, each with what keeps it from Ready.
    NotReady(Vec<(String, String)>),
}

/// What the preflight saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    /// This node's name (`node.name`, else its host name), when known.
    pub node: Option<String>,
    /// etcd.
    pub etcd: Etcd,
    /// The other control-plane Nodes.
    pub nodes: Nodes,
}

/// The decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The step may start (what was checked).
    Pass(String),
    /// It may not yet (every reason, `; `-separated).
    Wait(String),
}

/// Decides from what was seen.
pub(crate) fn decide(seen: &Seen) -> Verdict {
    let etcd = decide_etcd(&seen.etcd, seen.node.as_deref());
    let nodes = decide_nodes(&seen.nodes);
    match (etcd, nodes) {
        (Ok(etcd), Ok(nodes)) => Verdict::Pass(format!("{etcd}; {nodes}")),
        (etcd, nodes) => Verdict::Wait(
            [etcd.err(), nodes.err()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join("; "),
        ),
    }
}

fn shown(member: &Member) -> String {
    let name = if member.name.is_empty() {
        format!("{:x}", member.id)
    } else {
        member.name.clone()
    };
    match &member.url {
        Some(url) => format!("{name} ({url})"),
        None => name,
    }
}

fn decide_etcd(etcd: &Etcd, node: Option<&str>) -> Result<String, String> {
    let (members, local_id, listed_by) = match etcd {
        Etcd::NoLocalMember => return Ok("no local etcd member (no etcd manifest)".to_owned()),
        Etcd::NotChecked => {
            return Ok("etcd not checked (controlPlane.checkEtcd: false)".to_owned());
        }
        Etcd::Unreachable(why) => return Err(format!("etcd: {why}")),
        Etcd::Members {
            members,
            local_id,
            listed_by,
        } => (members, *local_id, listed_by),
    };
    let local = members
        .iter()
        .find(|m| Some(m.id) == local_id)
        .or_else(|| node.and_then(|node| members.iter().find(|m| m.name == node)));
    let Some(local) = local else {
        let id = local_id.map_or_else(|| "unknown".to_owned(), |id| format!("{id:x}"));
        let name = node.unwrap_or("unknown");
        return Err(format!(
            "etcd: cannot tell which of the {} members runs on this node (local member id {id}, node name {name})",
            members.len()
        ));
    };
    let voters = members.iter().filter(|m| !m.learner).count();
    let quorum = voters / 2 + 1;
    let others: Vec<&Member> = members
        .iter()
        .filter(|m| !m.learner && m.id != local.id)
        .collect();
    if voters == 1 && others.is_empty() {
        return match &local.health {
            Ok(()) => Ok(format!(
                "single-member etcd {} healthy (no quorum to keep: the step disrupts etcd itself)",
                shown(local)
            )),
            Err(why) => Err(format!("etcd member {} unhealthy: {why}", shown(local))),
        };
    }
    let mut reasons: Vec<String> = others
        .iter()
        .filter_map(|m| {
            m.health
                .as_ref()
                .err()
                .map(|why| format!("etcd member {} unhealthy: {why}", shown(m)))
        })
        .collect();
    let healthy = others.iter().filter(|m| m.health.is_ok()).count();
    if healthy < quorum {
        let verb = if healthy == 1 { "is" } else { "are" };
        reasons.push(format!(
            "quorum without this member needs {quorum} healthy, {healthy} {verb}"
        ));
    }
    if reasons.is_empty() {
        let by = listed_by.as_ref().map_or_else(String::new, |url| {
            format!(" (members listed by {url}: the local endpoint did not answer)")
        });
        Ok(format!(
            "etcd: the {} other members are healthy, quorum {quorum} of {voters} holds without {}{by}",
            others.len(),
            local.name
        ))
    } else {
        Err(reasons.join("; "))
    }
}

fn decide_nodes(nodes: &Nodes) -> Result<String, String> {
    match nodes {
        Nodes::NotConfigured => Ok(
            "other control-plane Nodes not checked (no `node:` section in the agent config)"
                .to_owned(),
        ),
        Nodes::Unreachable(why) => Err(format!("cannot list the control-plane Nodes: {why}")),
        Nodes::NotReady(list) if list.is_empty() => {
            Ok("the other control-plane Nodes are Ready".to_owned())
        }
        Nodes::NotReady(list) => Err(list
            .iter()
            .map(|(name, why)| format!("control-plane Node {name} is not Ready: {why}"))
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;

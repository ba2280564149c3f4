//! The preflight's decision, table by table: etcd member counts and health, the local member's identity,
//! the other control-plane Nodes.
#![allow(clippy::unwrap_used)]

use super::*;

fn member(id: u64, healthy: bool) -> Member {
    Member {
        id,
        name: format!("cp-{id}"),
        url: Some(format!("https://10.0.0.{id}:2379")),
        learner: false,
        health: if healthy {
            Ok(())
        } else {
            Err("connection refused".to_owned())
        },
    }
}

/// `health[i]` is member `cp-{i+1}`'s; this node runs `cp-1`.
fn seen(health: &[bool]) -> Seen {
    let members = health
        .iter()
        .enumerate()
        .map(|(i, healthy)| member(i as u64 + 1, *healthy))
        .collect();
    Seen {
        node: Some("cp-1".into()),
        etcd: Etcd::Members {
            members,
            local_id: Some(1),
            listed_by: None,
        },
        nodes: Nodes::NotReady(Vec::new()),
    }
}

fn waits(verdict: Verdict) -> String {
    match verdict {
        Verdict::Wait(reason) => reason,
        Verdict::Pass(summary) => panic!("passed: {summary}"),
    }
}

fn passes(verdict: Verdict) -> String {
    match verdict {
        Verdict::Pass(summary) => summary,
        Verdict::Wait(reason) => panic!("waits: {reason}"),
    }
}

#[test]
fn member_counts_and_health() {
    // (health of cp-1.., passes, what the answer says)
    let table: &[(&[bool], bool, &[&str])] = &[
        (
            &[true],
            true,
            &["single-member etcd cp-1", "no quorum to keep"],
        ),
        (
            &[false],
            false,
            &["etcd member cp-1 (https://10.0.0.1:2379) unhealthy"],
        ),
        (
            &[true, true],
            false,
            &["quorum without this member needs 2 healthy, 1 is"],
        ),
        (
            &[true, true, true],
            true,
            &["the 2 other members are healthy, quorum 2 of 3 holds without cp-1"],
        ),
        (
            &[true, true, false],
            false,
            &[
                "etcd member cp-3 (https://10.0.0.3:2379) unhealthy: connection refused",
                "quorum without this member needs 2 healthy, 1 is",
            ],
        ),
        // This member is down, the two others are a quorum: disrupting it loses nothing.
        (&[false, true, true], true, &["quorum 2 of 3 holds"]),
        (&[true, true, true, true, true], true, &["quorum 3 of 5"]),
        // One other down of five: quorum would hold, but every other member must be healthy.
        (
            &[true, true, true, true, false],
            false,
            &["etcd member cp-5 (https://10.0.0.5:2379) unhealthy"],
        ),
        (
            &[true, false, true, true, false],
            false,
            &[
                "cp-2",
                "cp-5",
                "quorum without this member needs 3 healthy, 2 are",
            ],
        ),
    ];
    for (health, pass, wants) in table {
        let verdict = decide(&seen(health));
        let text = match (&verdict, pass) {
            (Verdict::Pass(text), true) | (Verdict::Wait(text), false) => text.clone(),
            _ => panic!("{health:?}: {verdict:?}"),
        };
        for want in *wants {
            assert!(text.contains(want), "{health:?}: {text}");
        }
    }
}

#[test]
fn the_local_member_is_known_by_its_id_else_by_the_node_name() {
    let mut by_name = seen(&[true, true, true]);
    by_name.etcd = match by_name.etcd {
        Etcd::Members { members, .. } => Etcd::Members {
            members,
            local_id: None,
            listed_by: None,
        },
        other => other,
    };
    passes(decide(&by_name));
    // The id wins over the name: the local endpoint is cp-2's, whatever the node is called.
    let mut seen_by_id = seen(&[true, false, true]);
    seen_by_id.etcd = match seen_by_id.etcd {
        Etcd::Members { members, .. } => Etcd::Members {
            members,
            local_id: Some(2),
            listed_by: None,
        },
        other => other,
    };
    assert!(passes(decide(&seen_by_id)).contains("without cp-2"));
    let mut unknown = by_name;
    unknown.node = Some("cp-9".into());
    let reason = waits(decide(&unknown));
    assert!(
        reason.contains("cannot tell which of the 3 members runs on this node (local member id unknown, node name cp-9)"),
        "{reason}"
    );
}

#[test]
fn a_member_list_from_another_member_passes_with_the_local_member_down_and_says_so() {
    let mut seen = seen(&[false, true, true]);
    if let Etcd::Members { listed_by, .. } = &mut seen.etcd {
        *listed_by = Some("https://10.0.0.2:2379".into());
    }
    let text = passes(decide(&seen));
    assert!(
        text.contains(
            "quorum 2 of 3 holds without cp-1 (members listed by https://10.0.0.2:2379: the local endpoint did not answer)"
        ),
        "{text}"
    );
}

#[test]
fn learners_neither_vote_nor_block() {
    let mut seen = seen(&[true, true, true, false]);
    if let Etcd::Members { members, .. } = &mut seen.etcd {
        members[3].learner = true;
    }
    assert!(passes(decide(&seen)).contains("quorum 2 of 3"));
}

#[test]
fn no_local_etcd_checks_only_the_nodes() {
    let mut seen = seen(&[]);
    seen.etcd = Etcd::NoLocalMember;
    assert!(passes(decide(&seen)).contains("no local etcd member"));
    seen.etcd = Etcd::NotChecked;
    assert!(passes(decide(&seen)).contains("etcd not checked (controlPlane.checkEtcd: false)"));
    seen.nodes = Nodes::NotReady(vec![(
        "cp-2".into(),
        "Ready is False (KubeletNotReady)".into(),
    )]);
    assert_eq!(
        waits(decide(&seen)),
        "control-plane Node cp-2 is not Ready: Ready is False (KubeletNotReady)"
    );
    seen.nodes = Nodes::NotConfigured;
    assert!(passes(decide(&seen)).contains("not checked (no `node:` section"));
    seen.nodes = Nodes::Unreachable("503".into());
    assert_eq!(
        waits(decide(&seen)),
        "cannot list the control-plane Nodes: 503"
    );
}

#[test]
fn every_reason_is_told_at_once() {
    let mut seen = seen(&[true, true, false]);
    seen.nodes = Nodes::NotReady(vec![("cp-3".into(), "Ready is Unknown".into())]);
    let reason = waits(decide(&seen));
    assert!(
        reason.contains("etcd member cp-3")
            && reason.ends_with("control-plane Node cp-3 is not Ready: Ready is Unknown"),
        "{reason}"
    );
    seen.etcd = Etcd::Unreachable("https://127.0.0.1:2379: connection refused".into());
    assert!(waits(decide(&seen)).starts_with("etcd: https://127.0.0.1:2379: connection refused; "));
}

//! The membership's cut into chunks and what readers make of the replicas' records.

use super::*;

fn names(count: usize, len: usize) -> BTreeSet<String> {
    (0..count)
        .map(|i| format!("default/{i:0>width$}", width = len - "default/".len()))
        .collect()
}

/// The JSON bytes of chunk `agents` as stored.
fn stored_bytes(agents: &[String]) -> usize {
    serde_json::to_vec(&MemberChunk {
        at_ms: u64::MAX,
        agents: agents.to_vec(),
    })
    .map(|v| v.len())
    .unwrap_or(usize::MAX)
}

#[test]
fn a_third_of_100_000_agents_is_cut_into_chunks_far_under_the_request_limits() {
    for (count, len) in [(34_000, 40), (100_000, 40), (34_000, 253)] {
        let members = names(count, len);
        let chunks = chunk_count(&members, 1);
        let cut = cut(&members, chunks);
        let largest = cut.iter().map(|c| stored_bytes(c)).max().unwrap_or(0);
        // The store takes at most 512 KiB a value; etcd 1.5 MiB a request.
        assert!(
            largest < 512 * 1024,
            "{count} × {len}: {chunks} chunks, largest {largest} B"
        );
        assert_eq!(cut.iter().map(Vec::len).sum::<usize>(), count);
    }
}

#[test]
fn one_agent_coming_or_going_rewrites_one_chunk_and_the_count_holds_near_a_boundary() {
    let mut members = names(20_000, 40);
    let chunks = chunk_count(&members, 1);
    assert!(chunks > 1, "{chunks}");
    let before = cut(&members, chunks);
    members.insert("default/newcomer".into());
    assert_eq!(chunk_count(&members, chunks), chunks, "kept");
    let after = cut(&members, chunks);
    let writes = chunk_writes(&before, &after);
    assert_eq!(writes.put.len(), 1, "{:?}", writes.put.keys());
    assert!(writes.delete.is_empty());
    assert!(
        chunk_writes(&after, &after).is_empty(),
        "no change, no write"
    );
    // Shrinking far below a chunk's share: fewer chunks, the old ones beyond deleted.
    let few = names(10, 40);
    let fewer = chunk_count(&few, chunks);
    assert_eq!(fewer, 1);
    let writes = chunk_writes(&after, &cut(&few, fewer));
    assert_eq!(writes.delete, (1..chunks).collect::<Vec<_>>());
}

#[test]
fn an_agent_that_left_is_named_once() {
    let before: BTreeSet<String> = ["a/x", "a/y"].map(String::from).into();
    let after: BTreeSet<String> = ["a/y", "a/z"].map(String::from).into();
    assert_eq!(departed(&before, &after).collect::<Vec<_>>(), ["a/x"]);
}

fn replica(at_ms: u64, members: &[&str]) -> ReplicaPresence {
    ReplicaPresence {
        heartbeat: Some(Heartbeat {
            at_ms,
            generation: 1,
            chunks: 1,
        }),
        members: members.iter().map(|m| MachineRef::new("a", *m)).collect(),
        chunks_at_ms: at_ms.saturating_sub(5),
    }
}

#[test]
fn an_agent_two_replicas_list_is_seen_at_the_fresher_heartbeat() {
    let dead = replica(1_000, &["x", "moved"]);
    let live = replica(9_000, &["moved", "y"]);
    let contacts = last_contacts([&dead, &live]);
    assert_eq!(contacts[&MachineRef::new("a", "x")], 1_000);
    assert_eq!(contacts[&MachineRef::new("a", "moved")], 9_000);
    assert_eq!(contacts[&MachineRef::new("a", "y")], 9_000);
    // Sweeping the dead one records only the agent nobody else lists.
    let live = [&live];
    let to: Vec<_> = to_record(&dead, &live).collect();
    assert_eq!(to, [&MachineRef::new("a", "x")]);
}

#[test]
fn chunks_without_a_heartbeat_are_dated_by_their_newest_chunk() {
    let mut orphan = replica(7_000, &["x"]);
    orphan.heartbeat = None;
    assert_eq!(orphan.at_ms(), 6_995);
    assert!(is_dead(orphan.at_ms(), 40_000, 30_000));
    assert!(!is_dead(orphan.at_ms(), 30_000, 30_000));
}

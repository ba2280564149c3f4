//! Presence across replicas on one store: polls write nothing per agent, a replica's agents are seen by the
//! others through its heartbeat and membership, a dead replica's agents go stale and are taken over by the
//! replica they reconnect to (an unchanged inventory reported there writes nothing, an unreadable record is
//! replaced), an agent that leaves has its exact last contact recorded once, and a dead replica's presence is
//! swept after its agents' last contact is in their records.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use inplace_agent_api::{AgentIdentity, InventoryReport, MachineRef};
use inplace_store::memory::MemoryStore;

use crate::dispatch::agents::CONNECTED_WITHIN;
use crate::dispatch::faulty_store::FaultyStore;
use crate::dispatch::floor::keys::{PRESENCE_ALIVE_PREFIX, PRESENCE_MEMBERS_PREFIX, agent_key};
use crate::dispatch::floor::records::AgentRecord;
use crate::dispatch::testing::*;
use crate::dispatch::*;

const T0: u64 = 1_900_000_000_000;

/// A store that notes the key of every write, and two replicas on it with one clock.
fn two_replicas() -> (Arc<Mutex<Vec<String>>>, Arc<Dispatcher>, Arc<Dispatcher>) {
    let writes = Arc::new(Mutex::new(Vec::new()));
    let noted = writes.clone();
    let store = Arc::new(FaultyStore::new(
        Arc::new(MemoryStore::new()),
        Box::new(move |key| {
            noted.lock().unwrap().push(key.to_owned());
            Box::pin(async { Ok(()) })
        }),
    ));
    let (a, b) = (dispatcher(store.clone()), dispatcher(store));
    for d in [&a, &b] {
        d.clock().pin_for_tests(T0);
    }
    (writes, a, b)
}

/// The kubelet version and the last contact `machine`'s own record holds, as `d` reads it.
async fn stored_agent(d: &Dispatcher, machine: &MachineRef) -> (Option<String>, u64) {
    let record: AgentRecord = d.db().value(&agent_key(machine)).await.unwrap().unwrap();
    (
        record
            .inventory
            .and_then(|inventory| inventory.kubelet_version),
        record.last_seen_ms,
    )
}

fn advance(replicas: &[&Arc<Dispatcher>], by: Duration) {
    for d in replicas {
        d.clock().advance_for_tests(by);
    }
}

async fn poll_all(d: &Dispatcher, names: impl IntoIterator<Item = String>) {
    for name in names {
        d.agents.poll(&scope(), &poll_for(&name, 0)).await.unwrap();
    }
}

fn names(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("w-{i}")).collect()
}

/// `status --agents` on `d`: (last seen, connected) of `name`'s agent.
async fn row(d: &Dispatcher, name: &str) -> (Option<u64>, bool) {
    let rows = d.agents.list().await.unwrap();
    let row = rows
        .iter()
        .find(|r| r.machine == format!("default/{name}"))
        .unwrap_or_else(|| panic!("no row for {name} in {rows:?}"));
    (row.last_seen_ms, row.connected)
}

#[tokio::test]
async fn a_replicas_agents_are_seen_by_another_with_one_write_per_interval_whatever_the_fleet() {
    let (writes, a, b) = two_replicas();
    poll_all(&a, names(0..200)).await;
    assert!(
        writes.lock().unwrap().is_empty(),
        "polls wrote to the store: {:?}",
        writes.lock().unwrap().iter().take(5).collect::<Vec<_>>()
    );
    a.agents.presence.publish().await.unwrap();
    b.agents.presence.refresh().await.unwrap();
    assert_eq!(row(&b, "w-7").await, (Some(T0), true));
    assert_eq!(b.agents.list().await.unwrap().len(), 200);

    // Steady state: the same agents poll again every interval; each publication is one heartbeat.
    for round in 1..=5 {
        writes.lock().unwrap().clear();
        advance(&[&a, &b], Duration::from_secs(10));
        poll_all(&a, names(0..200)).await;
        a.agents.presence.publish().await.unwrap();
        let written = writes.lock().unwrap().clone();
        assert_eq!(written.len(), 1, "round {round}: {written:?}");
        assert!(written[0].starts_with(PRESENCE_ALIVE_PREFIX), "{written:?}");
    }
    b.agents.presence.refresh().await.unwrap();
    let now = T0 + 50_000;
    assert_eq!(row(&b, "w-199").await, (Some(now), true));
    assert_eq!(
        b.agents.last_contact(&MachineRef::new("default", "w-3")),
        Some(now)
    );

    // The UpdateMachine message on the replica the agent does not poll says when it was last seen.
    let request = request("w-3", false, "v1.30.1", "hi");
    judge_in_place(&b, &request).await;
    advance(&[&a, &b], Duration::from_secs(4));
    match b.runs.update_machine(&request).await.unwrap() {
        UpdateAnswer::InProgress { message, .. } => {
            assert!(message.contains("(last seen: 4s ago)"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_dead_replicas_agents_go_stale_and_the_replica_they_reconnect_to_takes_them_over() {
    let (_, a, b) = two_replicas();
    poll_all(&a, names(0..10)).await;
    a.agents.presence.publish().await.unwrap();
    b.agents.presence.publish().await.unwrap();
    b.agents.presence.refresh().await.unwrap();
    assert_eq!(row(&b, "w-1").await, (Some(T0), true));

    // Replica a dies: no more heartbeats. Within the bound its agents still count as connected; past it not,
    // and their last contact stays its last heartbeat.
    advance(&[&b], PRESENCE_STALE_AFTER);
    b.agents.presence.refresh().await.unwrap();
    assert_eq!(row(&b, "w-1").await, (Some(T0), true));
    advance(&[&b], Duration::from_secs(1));
    b.agents.presence.refresh().await.unwrap();
    assert_eq!(row(&b, "w-1").await, (Some(T0), false));

    // The agents reconnect to b, which lists them at its next tick; a third replica reads the freshest.
    poll_all(&b, names(0..10)).await;
    b.agents.presence.publish().await.unwrap();
    let c = dispatcher(b.store().clone());
    c.clock().pin_for_tests(b.clock().now_ms());
    c.agents.presence.refresh().await.unwrap();
    let taken_over = T0 + PRESENCE_STALE_AFTER.as_millis() as u64 + 1_000;
    assert_eq!(row(&c, "w-1").await, (Some(taken_over), true));
    assert_eq!(row(&c, "w-9").await, (Some(taken_over), true));
}

#[tokio::test]
async fn an_agent_that_stops_polling_has_its_exact_last_contact_recorded_once() {
    let (writes, a, b) = two_replicas();
    poll_all(&a, names(0..3)).await;
    a.agents.presence.publish().await.unwrap();
    advance(&[&a, &b], Duration::from_secs(7));
    poll_all(&a, names(0..2)).await; // w-2 stops here, 7 s before w-0 and w-1's last poll
    advance(&[&a, &b], CONNECTED_WITHIN - Duration::from_secs(3));
    writes.lock().unwrap().clear();
    a.agents.presence.publish().await.unwrap();
    let written = writes.lock().unwrap().clone();
    assert_eq!(
        written
            .iter()
            .filter(|k| k.starts_with("agents/"))
            .collect::<Vec<_>>(),
        [&agent_key(&MachineRef::new("default", "w-2"))],
        "{written:?}"
    );
    let record: AgentRecord = a
        .db()
        .value(&agent_key(&MachineRef::new("default", "w-2")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.last_seen_ms, T0, "its exact last request");
    b.agents.presence.refresh().await.unwrap();
    assert_eq!(row(&b, "w-2").await, (Some(T0), false));
    let now = a.clock().now_ms();
    assert_eq!(
        row(&b, "w-0").await,
        (Some(now), true),
        "as of a's heartbeat"
    );
    a.agents.presence.refresh().await.unwrap();
    assert_eq!(
        row(&a, "w-0").await,
        (Some(T0 + 7_000), true),
        "a knows its own agent's last request exactly"
    );
    // Published once: the next tick writes only the heartbeat.
    writes.lock().unwrap().clear();
    a.agents.presence.publish().await.unwrap();
    assert_eq!(writes.lock().unwrap().len(), 1);
}

fn inventory(name: &str, kubelet: &str) -> InventoryReport {
    InventoryReport {
        agent: AgentIdentity::Machine(MachineRef::new("default", name)),
        agent_version: "0.1.0".into(),
        kubelet_version: Some(kubelet.into()),
        kubeadm_version: Some(kubelet.into()),
        boot_id: Some(format!("boot-{name}")),
        hostname: Some(name.into()),
        current: None,
        facts: None,
        runtime: None,
    }
}

fn agent_writes(writes: &Mutex<Vec<String>>) -> Vec<String> {
    writes
        .lock()
        .unwrap()
        .iter()
        .filter(|k| k.starts_with("agents/"))
        .cloned()
        .collect()
}

#[tokio::test]
async fn an_agent_that_moves_to_another_replica_with_the_same_inventory_costs_no_write() {
    let (writes, a, b) = two_replicas();
    let machine = MachineRef::new("default", "w-0");
    a.agents
        .inventory(&scope(), &inventory("w-0", "v1.33.4"))
        .await
        .unwrap();
    assert_eq!(agent_writes(&writes), [agent_key(&machine)]);

    // Replica a dies; its agent reports the same inventory to b, as every agent does when it connects.
    writes.lock().unwrap().clear();
    advance(&[&a, &b], Duration::from_secs(30));
    b.agents
        .inventory(&scope(), &inventory("w-0", "v1.33.4"))
        .await
        .unwrap();
    assert_eq!(agent_writes(&writes), Vec::<String>::new());
    // Still seen now, by b and, through b's presence, by any other replica.
    let now = T0 + 30_000;
    assert_eq!(row(&b, "w-0").await, (Some(now), true));
    b.agents.presence.publish().await.unwrap();
    let c = dispatcher(b.store().clone());
    c.clock().pin_for_tests(now);
    c.agents.presence.refresh().await.unwrap();
    assert_eq!(row(&c, "w-0").await, (Some(now), true));

    // A changed inventory is written, and is what the record then holds.
    b.agents
        .inventory(&scope(), &inventory("w-0", "v1.34.1"))
        .await
        .unwrap();
    assert_eq!(agent_writes(&writes), [agent_key(&machine)]);
    assert_eq!(
        stored_agent(&b, &machine).await,
        (Some("v1.34.1".to_owned()), now)
    );
}

#[tokio::test]
async fn an_unreadable_agent_record_is_replaced_by_the_inventory_the_agent_reports() {
    let (writes, a, _) = two_replicas();
    let machine = MachineRef::new("default", "w-0");
    a.store()
        .put(
            &agent_key(&machine),
            b"{not json".to_vec(),
            inplace_store::Precondition::Any,
        )
        .await
        .unwrap();
    writes.lock().unwrap().clear();
    a.agents
        .inventory(&scope(), &inventory("w-0", "v1.33.4"))
        .await
        .expect("an unreadable record does not refuse the report");
    assert_eq!(agent_writes(&writes), [agent_key(&machine)]);
    assert_eq!(
        stored_agent(&a, &machine).await.0.as_deref(),
        Some("v1.33.4")
    );
}

#[tokio::test]
async fn a_dead_replicas_presence_is_swept_once_its_agents_last_contact_is_recorded() {
    let (_, a, b) = two_replicas();
    poll_all(&a, names(0..3)).await;
    a.agents.presence.publish().await.unwrap();
    let store = b.store().clone();
    assert!(
        !store
            .list(PRESENCE_MEMBERS_PREFIX)
            .await
            .unwrap()
            .is_empty()
    );

    // a dies; w-2 reconnects to b. Within PRESENCE_SWEEP_AFTER nothing is swept.
    advance(&[&b], PRESENCE_SWEEP_AFTER);
    poll_all(&b, names(2..3)).await;
    b.agents.presence.publish().await.unwrap();
    b.sweep().await.unwrap();
    assert_eq!(store.list(PRESENCE_ALIVE_PREFIX).await.unwrap().len(), 2);

    advance(&[&b], Duration::from_secs(1));
    poll_all(&b, names(2..3)).await;
    b.agents.presence.publish().await.unwrap();
    let record = b.sweep().await.unwrap();
    assert_eq!(record.deleted["dead replicas' presence"], 2, "{record:?}");
    let alive = store.list(PRESENCE_ALIVE_PREFIX).await.unwrap();
    assert_eq!(alive.len(), 1, "b's own stays");
    assert!(alive[0].key.ends_with(b.agents.presence.replica()));
    let seen = |name: &str| {
        let db = b.db().clone();
        let key = agent_key(&MachineRef::new("default", name));
        async move {
            db.value::<AgentRecord>(&key)
                .await
                .unwrap()
                .map(|r| r.last_seen_ms)
        }
    };
    assert_eq!(seen("w-0").await, Some(T0), "a's last heartbeat");
    assert_eq!(seen("w-1").await, Some(T0));
    assert_eq!(seen("w-2").await, None, "b lists it: nothing to keep");
    // What status says after the sweep: the same facts.
    let c = dispatcher(store);
    c.clock().pin_for_tests(b.clock().now_ms());
    c.agents.presence.refresh().await.unwrap();
    assert_eq!(row(&c, "w-0").await, (Some(T0), false));
    assert_eq!(row(&c, "w-2").await, (Some(b.clock().now_ms()), true));
}

//! Dispatch over a store that fails. The instant between every two writes of UpdateMachine: the process dies
//! after its first k writes (k = 0, 1, …, every write a clean call makes), a fresh dispatcher on the same store
//! takes CAPI's next call, and the promises must hold: the call is answered in progress, and the agent — also
//! one that names itself by its node's provider id — gets the plan. And a store slow to take this replica's
//! presence writes never holds up its agents' polls.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use inplace_agent_api::{AgentIdentity, PollRequest};
use inplace_store::memory::MemoryStore;
use serde_json::json;

use crate::dispatch::faulty_store::{FaultyStore, unavailable};
use crate::dispatch::testing::*;
use crate::dispatch::*;

/// The in-memory store `inner` of a process that dies after `allowed` more writes (counting from
/// `writes`): every later write fails and changes nothing. The counter is shared, so the test can read it.
fn dies_after(
    inner: Arc<MemoryStore>,
    allowed: usize,
    writes: Arc<AtomicUsize>,
) -> Arc<FaultyStore> {
    Arc::new(FaultyStore::new(
        inner,
        Box::new(move |_key| {
            let alive = writes.fetch_add(1, Ordering::SeqCst) < allowed;
            Box::pin(async move {
                if alive {
                    Ok(())
                } else {
                    Err(unavailable("the process died here"))
                }
            })
        }),
    ))
}

/// A worker Machine whose node has a provider id, changing its version and a file.
fn worker_with_provider_id() -> UpdateRequest {
    let machine = json!({
        "metadata": {
            "name": "m-1", "namespace": "default",
            "labels": { "cluster.x-k8s.io/cluster-name": "edge-01" }
        },
        "spec": { "clusterName": "edge-01", "version": "v1.34.1", "providerID": "metal://rack-7/m-1" }
    });
    let bootstrap = json!({ "spec": { "files": [ { "path": "/etc/motd", "content": "hi" } ] } });
    request_of(&machine, &bootstrap)
}

#[tokio::test]
async fn a_crash_between_any_two_writes_of_a_first_update_loses_nothing() {
    let request = worker_with_provider_id();
    // How many writes a clean first call makes (the verdict CanUpdateMachine recorded is not one of them).
    let counted = Arc::new(AtomicUsize::new(0));
    let d = dispatcher(dies_after(
        Arc::new(MemoryStore::new()),
        usize::MAX,
        counted.clone(),
    ));
    judge_in_place(&d, &request).await;
    let before = counted.load(Ordering::SeqCst);
    d.runs.update_machine(&request).await.unwrap();
    let writes = counted.load(Ordering::SeqCst) - before;
    assert_eq!(
        writes, 1,
        "a first update records its Machine, its run and the provider-id index in one transaction"
    );

    for allowed in 0..writes {
        let inner = Arc::new(MemoryStore::new());
        let first = dispatcher(inner.clone());
        judge_in_place(&first, &request).await;
        // From here the process has `allowed` writes left before it dies.
        let dying = dies_after(inner.clone(), allowed, Arc::new(AtomicUsize::new(0)));
        let first = dispatcher(dying);
        assert!(
            first.runs.update_machine(&request).await.is_err(),
            "the call that died after {allowed} of {writes} writes cannot have answered"
        );

        let next = dispatcher(inner.clone());
        let answer = next.runs.update_machine(&request).await.unwrap();
        assert!(
            matches!(answer, UpdateAnswer::InProgress { .. }),
            "after a crash at write {allowed} of {writes}, CAPI's next call: {answer:?}"
        );
        let poll = PollRequest {
            agent: AgentIdentity::ProviderId("metal://rack-7/m-1".into()),
            current: None,
            wait_seconds: 0,
            facts: None,
        };
        let plan = next.agents.poll(&scope(), &poll).await.unwrap().plan;
        assert!(
            plan.is_some(),
            "after a crash at write {allowed} of {writes}, the agent naming its provider id gets no plan"
        );
    }
}

#[tokio::test]
async fn polls_are_answered_while_presence_writes_hang_and_the_times_land_later() {
    let inner = Arc::new(MemoryStore::new());
    let released = Arc::new(tokio::sync::Semaphore::new(0));
    // Every write hangs until released (an etcd a second behind, at 30 000 agents).
    let gate = released.clone();
    let d = dispatcher(Arc::new(FaultyStore::new(
        inner.clone(),
        Box::new(move |_key| {
            let gate = gate.clone();
            Box::pin(async move {
                let _open = gate.acquire().await;
                Ok(())
            })
        }),
    )));
    // This replica's presence is being published (and hangs) while the fleet polls.
    let publishing = tokio::spawn({
        let d = d.clone();
        async move { d.agents.presence.publish().await }
    });
    let agents = 50;
    for i in 0..agents {
        let answered = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            d.agents
                .poll(&scope(), &super::tests::poll_for(&format!("w-{i}"), 0)),
        )
        .await;
        assert!(
            matches!(answered, Ok(Ok(_))),
            "agent {i}'s poll waited on a store write: {answered:?}"
        );
    }
    // This replica knows them at once; the others, once the store takes writes again.
    assert_eq!(d.agents.list().await.unwrap().len(), agents);
    released.add_permits(tokio::sync::Semaphore::MAX_PERMITS);
    publishing.await.unwrap().unwrap();
    d.agents.presence.publish().await.unwrap();
    let other = dispatcher(inner);
    other.agents.presence.refresh().await.unwrap();
    assert_eq!(other.agents.list().await.unwrap().len(), agents);
}

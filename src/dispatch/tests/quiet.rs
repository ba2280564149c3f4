//! Quiet looks: an idle agent's polls read nothing from the store once a look found nothing for it to do, and
//! still get every run recorded afterwards — on this replica or, through the change feed, on another — and
//! nothing is kept by a replica that does not follow the feed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inplace_agent_api::{Plan, PlanStatus, PollRequest, StepStatus};
use inplace_store::memory::MemoryStore;

use crate::dispatch::faulty_store::FaultyStore;
use crate::dispatch::testing::*;
use crate::dispatch::*;

/// Store reads one poll of `request` costs on `d`, and its answer's plan id.
async fn poll_reads(
    d: &Dispatcher,
    store: &FaultyStore,
    request: &PollRequest,
) -> (usize, Option<String>) {
    let before = store.reads();
    let answer = d.agents.poll(&scope(), request).await.unwrap();
    (store.reads() - before, answer.plan.map(|plan| plan.id))
}

/// Polls until two polls in a row read nothing (the feed has brought every earlier change, and the last look
/// was kept), within 5 s.
async fn until_quiet(d: &Dispatcher, store: &FaultyStore, request: &PollRequest) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut quiet_in_a_row = 0;
    while quiet_in_a_row < 2 {
        assert!(
            Instant::now() < deadline,
            "the agent's polls never went quiet"
        );
        let (reads, plan) = poll_reads(d, store, request).await;
        assert_eq!(plan, None, "an idle agent is handed nothing");
        quiet_in_a_row = if reads == 0 { quiet_in_a_row + 1 } else { 0 };
        tokio::task::yield_now().await;
    }
}

/// A Machine `default/m-1` updated once, its agent done with the plan: the store counting reads, the
/// dispatcher, the plan, and the poll the idle agent now sends (its finished plan's summary).
async fn finished_machine() -> (Arc<FaultyStore>, Arc<Dispatcher>, Plan, PollRequest) {
    let store = Arc::new(FaultyStore::open(Arc::new(MemoryStore::new())));
    let d = dispatcher(store.clone());
    update(&d, &request("m-1", false, "v1.34.1", "hi"))
        .await
        .unwrap();
    let plan = handed_plan(&d, "m-1").await;
    let steps = plan.steps.len() as u32;
    agent_reports(&d, "m-1", &plan.id, 0..steps, StepStatus::Succeeded).await;
    let idle = poll_with_progress("m-1", &plan, PlanStatus::Succeeded, steps, None);
    (store, d, plan, idle)
}

#[tokio::test]
async fn an_idle_agent_polls_without_store_reads_and_still_gets_a_run_recorded_on_another_replica()
{
    let store = Arc::new(FaultyStore::open(Arc::new(MemoryStore::new())));
    let (a, b) = (dispatcher(store.clone()), dispatcher(store.clone()));
    let idle = poll_for("m-1", 0);
    let (first, _) = poll_reads(&b, &store, &idle).await;
    assert_eq!(
        first, 1,
        "the first look reads the Machine's record (absent)"
    );
    until_quiet(&b, &store, &idle).await;
    for _ in 0..10 {
        assert_eq!(poll_reads(&b, &store, &idle).await, (0, None));
    }

    update(&a, &request("m-1", false, "v1.34.1", "hi"))
        .await
        .unwrap();
    let started = Instant::now();
    let (_, plan) = poll_reads(&b, &store, &poll_for("m-1", 5)).await;
    assert!(
        plan.is_some(),
        "the run recorded on the other replica reaches the agent"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "woken by the change feed, not by the poll's 5 s wait: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn an_updated_machines_idle_agent_reads_nothing_until_its_machine_changes() {
    let (store, d, plan, idle) = finished_machine().await;

    // Without quiet looks: the Machine's record, its run, the run again to fold the summary in, and once more
    // to look at it as it is now.
    let (first, handed) = poll_reads(&d, &store, &idle).await;
    assert_eq!((first, handed), (4, None));
    until_quiet(&d, &store, &idle).await;
    for _ in 0..10 {
        assert_eq!(poll_reads(&d, &store, &idle).await, (0, None));
    }
    let mut other = idle.clone();
    if let Some(current) = other.current.as_mut() {
        current.succeeded_steps -= 1;
    }
    let (reads, _) = poll_reads(&d, &store, &other).await;
    assert!(
        reads > 0,
        "another summary is folded in from the store, not answered from memory"
    );

    let changed = update(&d, &request("m-1", false, "v1.34.2", "hi"))
        .await
        .unwrap();
    assert!(
        matches!(changed, UpdateAnswer::InProgress { .. }),
        "{changed:?}"
    );
    let (reads, handed) = poll_reads(&d, &store, &idle).await;
    let handed = handed.expect("the new run is handed to the agent that was idle");
    assert_ne!(handed, plan.id);
    assert!(reads > 0);
}

#[tokio::test]
async fn a_replica_that_does_not_follow_the_feed_reads_the_store_at_every_poll() {
    let store = Arc::new(FaultyStore::open(Arc::new(MemoryStore::new())));
    let d = Dispatcher::new(
        store.clone(),
        DispatchConfig::default(),
        tokio_util::sync::CancellationToken::new(),
    );
    let idle = poll_for("m-1", 0);
    for _ in 0..5 {
        assert_eq!(poll_reads(&d, &store, &idle).await, (1, None));
    }
    assert!(d.agents.quiet.is_empty());
    // Another writer records a run: the next poll sees it at once, with no feed to tell this replica.
    let other = dispatcher(store.clone());
    update(&other, &request("m-1", false, "v1.34.1", "hi"))
        .await
        .unwrap();
    assert!(poll_reads(&d, &store, &idle).await.1.is_some());
}

#[tokio::test]
async fn a_cluster_token_of_another_cluster_is_refused_from_a_kept_look_too() {
    let (store, d, _, idle) = finished_machine().await;
    until_quiet(&d, &store, &idle).await;
    let other = AgentScope::Cluster {
        namespace: "default".into(),
        cluster: "other".into(),
    };
    assert!(matches!(
        d.agents.poll(&other, &idle).await,
        Err(DispatchError::Forbidden(_))
    ));
}

//! The fleet-wide update budget over the in-memory store, through UpdateMachine and the agent API as CAPI and
//! the agents use them: a new run past the budget writes nothing and is answered in progress naming the holders;
//! each way a run ends (last step, failure, progress after a lost report, cancel) gives its slot back in the
//! same transaction; a Machine whose run is replaced keeps its slot, a superseded run's end gives nothing back;
//! two replicas asking at the same instant for the last slot admit one; an expired hold is swept.

use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{PlanStatus, StepStatus};
use inplace_store::Store;
use inplace_store::memory::MemoryStore;
use serde_json::json;

use crate::dispatch::floor::config::UpdateBudget;
use crate::dispatch::testing::*;
use crate::dispatch::*;
use inplace_core::knobs::{CANCEL_ANNOTATION, RETRY_ANNOTATION};

fn limited(store: Arc<dyn Store>, total: u32) -> Arc<Dispatcher> {
    let budget = UpdateBudget {
        total: Some(total),
        per_label: Vec::new(),
    };
    with_budget(store, budget)
}

fn with_budget(store: Arc<dyn Store>, budget: UpdateBudget) -> Arc<Dispatcher> {
    let config = DispatchConfig {
        budget,
        ..DispatchConfig::default()
    };
    let d = Dispatcher::new(store, config, CancellationToken::new());
    tokio::spawn(d.agents.clone().follow_changes());
    d
}

/// m-<name>'s desired state, `annotations` on it.
fn asked(name: &str, motd: &str, annotations: serde_json::Value) -> UpdateRequest {
    in_zone(name, motd, annotations, None)
}

/// [`asked`], the Machine labelled with `zone` (when given).
fn in_zone(
    name: &str,
    motd: &str,
    annotations: serde_json::Value,
    zone: Option<&str>,
) -> UpdateRequest {
    let mut machine = json!({
        "metadata": {
            "name": name, "namespace": "default", "annotations": annotations,
            "labels": { "cluster.x-k8s.io/cluster-name": "edge-01" }
        },
        "spec": { "clusterName": "edge-01", "version": "v1.34.1" }
    });
    if let Some(zone) = zone {
        machine["metadata"]["labels"][ZONE] = json!(zone);
    }
    let bootstrap = json!({ "spec": { "files": [ { "path": "/etc/motd", "content": motd } ] } });
    request_of(&machine, &bootstrap)
}

const ZONE: &str = "topology.kubernetes.io/zone";

/// Holders of live fleet-wide slots in the store, sorted.
async fn holders(d: &Dispatcher) -> Vec<String> {
    let mut holders: Vec<String> = d
        .store()
        .list("slots/updates/")
        .await
        .unwrap()
        .iter()
        .map(|e| {
            let hold: serde_json::Value = serde_json::from_slice(&e.value).unwrap();
            hold["holder"].as_str().unwrap().to_owned()
        })
        .collect();
    holders.sort();
    holders
}

fn waiting(answer: &UpdateAnswer) -> &str {
    match answer {
        UpdateAnswer::InProgress { message, .. }
            if message.starts_with("waiting for a fleet-wide") =>
        {
            message
        }
        other => panic!("not waiting for a slot: {other:?}"),
    }
}

async fn finish(d: &Dispatcher, name: &str, status: StepStatus) {
    let plan = handed_plan(d, name).await;
    let last = plan.steps.len() as u32 - 1;
    agent_reports(d, name, &plan.id, 0..last, StepStatus::Succeeded).await;
    agent_reports(d, name, &plan.id, [last], status).await;
}

#[tokio::test]
async fn past_the_budget_a_new_run_waits_and_each_end_gives_its_slot_to_the_next() {
    let d = limited(memory().await, 2);
    for name in ["m-1", "m-2"] {
        let answer = update(&d, &asked(name, "a", json!({}))).await.unwrap();
        assert!(answer_is_run(&answer), "{answer:?}");
    }
    let answer = update(&d, &asked("m-3", "a", json!({}))).await.unwrap();
    let message = waiting(&answer);
    assert!(
        message.starts_with(
            "waiting for a fleet-wide update slot: 2 of 2 runs in progress (default/m-"
        ),
        "{message}"
    );
    let UpdateAnswer::InProgress {
        retry_after_seconds,
        ..
    } = answer
    else {
        unreachable!()
    };
    assert_eq!(retry_after_seconds, DEFAULT_RETRY_AFTER_MAX_SECONDS);
    // Nothing was written for m-3: no Machine record, no run, no slot.
    assert!(
        d.store()
            .get("machines/default/m-3")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        d.store().list("updates/default/m-3/").await.unwrap().len(),
        0
    );
    assert_eq!(holders(&d).await, ["default/m-1", "default/m-2"]);
    assert_eq!(d.budget.waiting_count(), 1);

    // m-2's new desired state replaces its run: it keeps its slot (the budget is full, it is not asked to wait).
    let replaced = update(&d, &asked("m-2", "b", json!({}))).await.unwrap();
    assert!(answer_is_run(&replaced), "{replaced:?}");
    assert_eq!(holders(&d).await, ["default/m-1", "default/m-2"]);

    // m-1's last step: its slot goes back with the report, and m-3 starts.
    finish(&d, "m-1", StepStatus::Succeeded).await;
    assert_eq!(holders(&d).await, ["default/m-2"]);
    assert!(answer_is_run(
        &update(&d, &asked("m-3", "a", json!({}))).await.unwrap()
    ));
    assert_eq!(d.budget.waiting_count(), 0);
    assert_eq!(holders(&d).await, ["default/m-2", "default/m-3"]);

    // A failed step ends m-2's run: its slot goes back; a retry of it is a new run and needs a slot again.
    finish(&d, "m-2", StepStatus::Failed).await;
    assert_eq!(holders(&d).await, ["default/m-3"]);
    assert!(answer_is_run(
        &update(&d, &asked("m-4", "a", json!({}))).await.unwrap()
    ));
    let retry = asked("m-2", "b", json!({ RETRY_ANNOTATION: "1" }));
    waiting(&update(&d, &retry).await.unwrap());
    let status = d.budget.status().await.unwrap();
    assert_eq!(status.limit, Some(2));
    assert_eq!(status.holders.len(), 2);
    assert!(
        status
            .status_line(now_ms())
            .contains("2 of 2 slots in use (default/m-"),
        "{status:?}"
    );

    // m-3's agent lost its last report: the progress that says "succeeded" ends the run and frees the slot.
    let plan = handed_plan(&d, "m-3").await;
    let done = plan.steps.len() as u32;
    let poll = poll_with_progress("m-3", &plan, PlanStatus::Succeeded, done, None);
    d.agents.poll(&scope(), &poll).await.unwrap();
    assert_eq!(holders(&d).await, ["default/m-4"]);
    assert!(
        answer_is_run(&update(&d, &retry).await.unwrap()),
        "the retry's run starts now"
    );
    assert_eq!(holders(&d).await, ["default/m-2", "default/m-4"]);

    // An operator cancel ends m-4's run once its agent confirms it stopped: the slot goes back.
    update(&d, &asked("m-4", "a", json!({ CANCEL_ANNOTATION: "t-1" })))
        .await
        .unwrap();
    let plan = handed_plan(&d, "m-4").await;
    let hold = d
        .agents
        .report(&scope(), &report("m-4", &plan.id, 0, StepStatus::Succeeded))
        .await
        .unwrap()
        .expect("the cancel in the ack");
    let poll = poll_with_progress("m-4", &plan, PlanStatus::Running, 1, Some(hold));
    d.agents.poll(&scope(), &poll).await.unwrap();
    assert_eq!(holders(&d).await, ["default/m-2"]);
}

/// In progress with a run of its own (not waiting for a slot).
fn answer_is_run(answer: &UpdateAnswer) -> bool {
    matches!(answer, UpdateAnswer::InProgress { message, .. }
        if !message.starts_with("waiting for a fleet-wide") && !message.starts_with("waiting for an update slot"))
}

#[tokio::test]
async fn a_superseded_run_ending_gives_back_nothing() {
    let d = limited(memory().await, 1);
    update(&d, &asked("m-1", "a", json!({}))).await.unwrap();
    let first = handed_plan(&d, "m-1").await;
    update(&d, &asked("m-1", "b", json!({}))).await.unwrap();
    // The agent still finishes the first run (its progress names it): the slot stays with the current run.
    let done = first.steps.len() as u32;
    let poll = poll_with_progress("m-1", &first, PlanStatus::Succeeded, done, None);
    d.agents.poll(&scope(), &poll).await.unwrap();
    assert_eq!(holders(&d).await, ["default/m-1"]);
    waiting(&update(&d, &asked("m-2", "a", json!({}))).await.unwrap());
}

#[tokio::test]
async fn two_replicas_asking_at_once_for_the_last_slot_admit_one() {
    let store = memory().await;
    for round in 0..20 {
        let (a, b) = (limited(store.clone(), 1), limited(store.clone(), 1));
        let (x, y) = (format!("r{round}-a"), format!("r{round}-b"));
        let (ra, rb) = (asked(&x, "a", json!({})), asked(&y, "a", json!({})));
        judge_in_place(&a, &ra).await;
        judge_in_place(&b, &rb).await;
        let (one, two) = tokio::join!(a.runs.update_machine(&ra), b.runs.update_machine(&rb));
        let started = [one.unwrap(), two.unwrap()]
            .iter()
            .filter(|a| answer_is_run(a))
            .count();
        assert_eq!(started, 1, "round {round}");
        assert_eq!(holders(&a).await.len(), 1);
        // Free the slot for the next round: the admitted Machine's run ends.
        let admitted = holders(&a).await.remove(0);
        let name = admitted.trim_start_matches("default/").to_owned();
        finish(&a, &name, StepStatus::Succeeded).await;
        assert!(holders(&a).await.is_empty());
    }
}

#[tokio::test]
async fn an_expired_hold_stops_counting_and_the_sweep_frees_it() {
    let d = limited(memory().await, 1);
    d.clock().pin_for_tests(now_ms());
    update(&d, &asked("m-1", "a", json!({}))).await.unwrap();
    waiting(&update(&d, &asked("m-2", "a", json!({}))).await.unwrap());
    // The agent never reports: past every step's timeout and the margin, the hold has expired.
    d.clock().advance_for_tests(Duration::from_secs(24 * 3600));
    let record = d.sweep().await.unwrap();
    assert_eq!(record.deleted.get("update slots"), Some(&1));
    assert!(holders(&d).await.is_empty());
    assert!(answer_is_run(
        &update(&d, &asked("m-2", "a", json!({}))).await.unwrap()
    ));
    // m-1's run was never stopped: its agent may still run it and report (then the slot is not renewed: a
    // run holds only a slot it still has).
    assert_eq!(holders(&d).await, ["default/m-2"]);
}

/// A store whose every write fails from now on, changing nothing: the process died before its commit.
fn dead(inner: Arc<MemoryStore>) -> Arc<dyn Store> {
    use crate::dispatch::faulty_store::{FaultyStore, unavailable};
    Arc::new(FaultyStore::new(
        inner,
        Box::new(|_key| Box::pin(async { Err(unavailable("the process died here")) })),
    ))
}

#[tokio::test]
async fn a_crash_before_or_after_a_commit_leaves_the_run_and_its_slot_together() {
    let inner = Arc::new(MemoryStore::new());
    let store: Arc<dyn Store> = inner.clone();
    let first = limited(store.clone(), 1);
    let request = asked("m-1", "a", json!({}));
    judge_in_place(&first, &request).await;
    // Killed before the transaction that records the run and takes the slot: neither exists.
    let dying = limited(dead(inner.clone()), 1);
    assert!(dying.runs.update_machine(&request).await.is_err());
    assert!(holders(&first).await.is_empty());
    assert!(first.store().list("updates/").await.unwrap().is_empty());
    // Killed after it, before the answer (the answer is dropped): the restarted server's answer to CAPI's next
    // call is a repeat of that run, its slot held once.
    drop(first.runs.update_machine(&request).await.unwrap());
    let restarted = limited(store.clone(), 1);
    assert!(answer_is_run(
        &restarted.runs.update_machine(&request).await.unwrap()
    ));
    assert_eq!(holders(&restarted).await, ["default/m-1"]);
    assert_eq!(restarted.store().list("updates/").await.unwrap().len(), 1);
    waiting(
        &update(&restarted, &asked("m-2", "a", json!({})))
            .await
            .unwrap(),
    );

    // Killed before the transaction of the last step's report: the run has not ended and keeps its slot; the
    // agent sends the report again (to any replica) and the slot goes back with it.
    let plan = handed_plan(&restarted, "m-1").await;
    let last = plan.steps.len() as u32 - 1;
    agent_reports(&restarted, "m-1", &plan.id, 0..last, StepStatus::Succeeded).await;
    let done = report("m-1", &plan.id, last, StepStatus::Succeeded);
    let dying = limited(dead(inner.clone()), 1);
    assert!(dying.agents.report(&scope(), &done).await.is_err());
    assert_eq!(holders(&restarted).await, ["default/m-1"]);
    restarted.agents.report(&scope(), &done).await.unwrap();
    assert!(holders(&restarted).await.is_empty());
    // A report repeated after the end (its ack was lost) gives nothing back twice and takes nothing.
    assert!(answer_is_run(
        &update(&restarted, &asked("m-2", "a", json!({})))
            .await
            .unwrap()
    ));
    restarted.agents.report(&scope(), &done).await.unwrap();
    assert_eq!(holders(&restarted).await, ["default/m-2"]);
}

#[tokio::test]
async fn a_per_label_budget_paces_each_zone_and_the_unlabelled_machines_together() {
    let d = with_budget(
        memory().await,
        UpdateBudget {
            total: None,
            per_label: vec![format!("{ZONE}=1").parse().unwrap()],
        },
    );
    d.clock().pin_for_tests(now_ms());
    let run = |name: &'static str, zone: Option<&'static str>| {
        let d = d.clone();
        async move {
            update(&d, &in_zone(name, "a", json!({}), zone))
                .await
                .unwrap()
        }
    };
    assert!(answer_is_run(&run("a-1", Some("eu-1a")).await));
    let answer = run("a-2", Some("eu-1a")).await;
    let UpdateAnswer::InProgress { message, .. } = &answer else {
        panic!("{answer:?}")
    };
    assert_eq!(
        message,
        "waiting for an update slot for topology.kubernetes.io/zone=eu-1a: 1 of 1 runs in progress (default/a-1 0s)"
    );
    assert!(answer_is_run(&run("b-1", Some("eu-1b")).await));
    assert!(answer_is_run(&run("n-1", None).await));
    let answer = run("n-2", None).await;
    assert!(
        matches!(&answer, UpdateAnswer::InProgress { message, .. }
            if message.starts_with("waiting for an update slot for topology.kubernetes.io/zone unset: 1 of 1")),
        "{answer:?}"
    );
    // No fleet-wide limit: no fleet-wide slot taken.
    assert!(holders(&d).await.is_empty());
    finish(&d, "a-1", StepStatus::Succeeded).await;
    assert!(answer_is_run(&run("a-2", Some("eu-1a")).await));
}

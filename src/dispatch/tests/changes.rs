//! Change pacing through UpdateMachine over the in-memory store: a paced registration's canary runs alone, the
//! next Machine waits for it and its soak, a failed canary brakes the change for every Machine that has not
//! started it while another change goes on, and the operator's release lets it go on. A second dispatcher on
//! the same store (another replica, or the server after a restart) sees the same order.

use std::time::Duration;

use inplace_agent_api::StepStatus;
use inplace_core::drain::VersionChange;

use crate::dispatch::changes::control::Control;
use crate::dispatch::floor::keys::machine_verdict_key;
use crate::dispatch::testing::*;
use crate::dispatch::*;

/// UpdateMachine of `default/<name>` to Kubernetes `version`, paced by `settings`.
fn paced(name: &str, version: &str, settings: &[(&str, &str)]) -> UpdateRequest {
    let mut request = request(name, false, version, "hello");
    for (key, value) in settings {
        request.pacing.set(key, value).unwrap();
    }
    request
}

/// CanUpdateMachine's verdict (a minor version change), then UpdateMachine.
async fn ask(d: &Dispatcher, request: &UpdateRequest) -> UpdateAnswer {
    let mut verdict = verdict_for(request, true);
    if let Some(change) = verdict.node_change.as_mut() {
        change.version = VersionChange::Minor;
    }
    d.licences
        .record_verdict(
            &machine_verdict_key(&request.desired.facts.machine),
            &verdict,
        )
        .await
        .unwrap();
    d.runs.update_machine(request).await.unwrap()
}

fn message(answer: &UpdateAnswer) -> String {
    match answer {
        UpdateAnswer::InProgress { message, .. } => message.clone(),
        other => panic!("not in progress: {other:?}"),
    }
}

/// Whether the agent of `default/<name>` is handed a plan.
async fn has_plan(d: &Dispatcher, name: &str) -> bool {
    d.agents
        .poll(&scope(), &poll_for(name, 0))
        .await
        .unwrap()
        .plan
        .is_some()
}

/// The agent of `default/<name>` runs its plan to the end, every step ending `last`.
async fn finish(d: &Dispatcher, name: &str, last: StepStatus) {
    let plan = handed_plan(d, name).await;
    for index in 0..plan.steps.len() as u32 {
        let status = if index + 1 == plan.steps.len() as u32 {
            last
        } else {
            StepStatus::Succeeded
        };
        d.agents
            .report(&scope(), &report(name, &plan.id, index, status))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn the_canary_goes_alone_then_the_change_soaks_then_spreads() {
    let store = memory().await;
    let d = dispatcher(store.clone());
    d.clock().pin_for_tests(1_000_000);
    let settings = [("canary", "1"), ("soak", "10m")];
    let first = ask(&d, &paced("m-1", "v1.34.1", &settings)).await;
    assert!(
        message(&first).starts_with("waiting for agent on"),
        "{first:?}"
    );
    assert!(has_plan(&d, "m-1").await);

    let second = paced("m-2", "v1.34.1", &settings);
    let waiting = message(&ask(&d, &second).await);
    assert_eq!(
        waiting,
        "waiting for change v1.34.1+files to prove itself on its canaries: default/m-1 running"
    );
    assert!(!has_plan(&d, "m-2").await, "a waiting Machine gets no run");

    finish(&d, "m-1", StepStatus::Succeeded).await;
    // Another replica (or this server restarted) judges the same.
    let other = dispatcher(store.clone());
    other.clock().pin_for_tests(1_000_000 + 60_000);
    let soaking = message(&ask(&other, &second).await);
    assert!(
        soaking.starts_with("waiting for change v1.34.1+files to soak until ")
            && soaking.ends_with("after default/m-1 finished (1 done, 0 running)"),
        "{soaking}"
    );
    other.clock().advance_for_tests(Duration::from_secs(600));
    let started = message(&ask(&other, &second).await);
    assert!(!started.contains("change"), "{started}");
    assert!(has_plan(&other, "m-2").await);
    let rows = other.changes.list().await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].done, rows[0].running), (1, 1));
    assert_eq!(rows[0].state, "open");
}

#[tokio::test]
async fn a_failed_canary_brakes_its_change_only_until_released() {
    let d = dispatcher(memory().await);
    let settings = [("canary", "1")];
    ask(&d, &paced("m-1", "v1.34.1", &settings)).await;
    finish(&d, "m-1", StepStatus::Failed).await;

    let held = message(&ask(&d, &paced("m-2", "v1.34.1", &settings)).await);
    let id = d.changes.list().await.unwrap()[0].id.clone();
    assert!(
        held.starts_with("change v1.34.1+files is halted by the failure brake after 1 failed Machine(s) (bound 1): default/m-1: step ")
            && held.ends_with(&format!("Release it with `inplace-updater change release {id}`")),
        "{held}"
    );
    assert!(!has_plan(&d, "m-2").await);

    // Another change is not held by this one's brake.
    let other = message(&ask(&d, &paced("m-3", "v1.34.2", &settings)).await);
    assert!(other.starts_with("waiting for agent on"), "{other}");
    assert!(has_plan(&d, "m-3").await);

    d.changes
        .control(&id, Control::Release)
        .await
        .unwrap()
        .unwrap();
    let released = message(&ask(&d, &paced("m-2", "v1.34.1", &settings)).await);
    assert!(
        released.starts_with("waiting for agent on"),
        "the next canary starts: {released}"
    );
    let rows = d.changes.list().await.unwrap();
    let row = rows.iter().find(|r| r.id == id).unwrap();
    assert_eq!((row.failed, row.state.as_str()), (1, "proving"));
    assert_eq!(row.canaries, ["default/m-2 running"]);
}

#[tokio::test]
async fn a_registration_without_rollout_settings_is_not_paced() {
    let d = dispatcher(memory().await);
    for name in ["m-1", "m-2", "m-3"] {
        let answer = message(&ask(&d, &paced(name, "v1.34.1", &[])).await);
        assert!(answer.starts_with("waiting for agent on"), "{answer}");
    }
    assert!(d.changes.list().await.unwrap().is_empty());
}

/// The process dies after `allowed` more store writes: every later one fails and changes nothing.
fn dies_after(
    inner: std::sync::Arc<inplace_store::memory::MemoryStore>,
    allowed: usize,
) -> std::sync::Arc<crate::dispatch::faulty_store::FaultyStore> {
    let writes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::sync::Arc::new(crate::dispatch::faulty_store::FaultyStore::new(
        inner,
        Box::new(move |_key| {
            let alive = writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < allowed;
            Box::pin(async move {
                if alive {
                    Ok(())
                } else {
                    Err(crate::dispatch::faulty_store::unavailable(
                        "the process died here",
                    ))
                }
            })
        }),
    ))
}

#[tokio::test]
async fn a_crash_between_a_gate_pass_and_the_run_record_writes_neither_and_the_order_holds() {
    use inplace_store::Store as _;
    let settings = [("canary", "1"), ("soak", "1h")];
    let first = paced("m-1", "v1.34.1", &settings);
    let second = paced("m-2", "v1.34.1", &settings);
    for allowed in 0..3 {
        let store = std::sync::Arc::new(inplace_store::memory::MemoryStore::new());
        let healthy = dispatcher(store.clone());
        // CanUpdateMachine's verdict, recorded by a healthy call.
        let mut verdict = verdict_for(&first, true);
        if let Some(change) = verdict.node_change.as_mut() {
            change.version = VersionChange::Minor;
        }
        healthy
            .licences
            .record_verdict(&machine_verdict_key(&first.desired.facts.machine), &verdict)
            .await
            .unwrap();
        let dying = dispatcher(dies_after(store.clone(), allowed));
        let _ = dying.runs.update_machine(&first).await;
        // At this instant: a run of m-1 exists exactly when the change record names it.
        let runs = store.list("updates/default/m-1/").await.unwrap().len();
        let changes = store.list("changes/").await.unwrap();
        let named = changes
            .iter()
            .any(|e| String::from_utf8_lossy(&e.value).contains("\"name\":\"m-1\""));
        assert_eq!(
            runs == 1,
            named,
            "after {allowed} writes: {runs} runs, change {changes:?}"
        );
        // CAPI asks again (of a fresh server): m-1 is the canary, m-2 waits for it.
        let fresh = dispatcher(store.clone());
        let answer = message(&fresh.runs.update_machine(&first).await.unwrap());
        assert!(
            answer.starts_with("waiting for agent on"),
            "after {allowed} writes: {answer}"
        );
        let waits = message(&ask(&fresh, &second).await);
        assert!(
            waits.ends_with("canaries: default/m-1 running"),
            "after {allowed} writes: {waits}"
        );
    }
}

#[tokio::test]
async fn the_sweep_deletes_a_change_nobody_runs_after_the_retention_period_but_keeps_a_halted_one()
{
    let d = dispatcher(memory().await);
    d.clock().pin_for_tests(1_000_000);
    let settings = [("canary", "1")];
    ask(&d, &paced("m-1", "v1.34.1", &settings)).await;
    finish(&d, "m-1", StepStatus::Succeeded).await;
    ask(&d, &paced("m-2", "v1.34.2", &settings)).await;
    finish(&d, "m-2", StepStatus::Failed).await;
    // The brake engages when the next Machine asks.
    ask(&d, &paced("m-3", "v1.34.2", &settings)).await;
    ask(&d, &paced("m-4", "v1.34.3", &settings)).await;
    assert_eq!(d.changes.list().await.unwrap().len(), 3);

    // Within the retention period nothing goes.
    let retention = DispatchConfig::default().retention;
    d.clock().advance_for_tests(retention / 2);
    assert_eq!(d.sweep().await.unwrap().deleted.get("changes"), Some(&0));
    d.clock().advance_for_tests(retention);
    let record = d.sweep().await.unwrap();
    assert_eq!(record.deleted.get("changes"), Some(&1), "{record:?}");
    let mut left: Vec<(String, String)> = d
        .changes
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.label, r.state))
        .collect();
    left.sort();
    // v1.34.1 finished and went; v1.34.2 is halted by its brake; m-4's canary of v1.34.3 still runs.
    assert_eq!(
        left,
        [
            ("v1.34.2+files".to_owned(), "halted".to_owned()),
            ("v1.34.3+files".to_owned(), "proving".to_owned())
        ]
    );
}

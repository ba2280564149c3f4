//! The remediation guard against the fake management API (real TLS, the RBAC the shipped manifests grant, the
//! Machines' resourceVersion preconditions) with the real kube client of `crate::mgmt`, over an OS image run
//! judged by a pinned clock: the guard is on the Machine before the first step starts and gone once the node is
//! back; lifted at the step's deadline; removed by a restarted server when the step ended while it was down; an
//! operator's own value is never touched; with the API refusing or unreachable, every answer is as without it.

use std::collections::BTreeMap;
use std::time::Duration;

use inplace_agent_api::{HoldReason, MachineRef, StepKind, StepStatus};
use inplace_drain::fake::management::{FakeManagementApi, Mode};
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::CancellationToken;

use super::reboot::os_image_request;
use crate::dispatch::floor::guard::{GuardRecord, LiftReason};
use crate::dispatch::floor::keys::guard_key;
use crate::dispatch::guards::Guards;
use crate::dispatch::testing::*;
use crate::dispatch::*;
use crate::mgmt::{Management, ManagementSource, SKIP_REMEDIATION_ANNOTATION};
use crate::observe::{ManagementMetrics, OpLabels};

const START: u64 = 1_796_000_000_000;

fn fake() -> FakeManagementApi {
    let manifests = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/clusterctl/runtime-extension-components.yaml");
    FakeManagementApi::start(&manifests).unwrap()
}

/// A dispatcher with the guard on over `store`, calling `fake`, and its metrics.
async fn guarded(
    store: Arc<dyn inplace_store::Store>,
    fake: &FakeManagementApi,
) -> (Arc<Dispatcher>, Arc<Guards>, ManagementMetrics) {
    let config = DispatchConfig {
        remediation_guard: true,
        ..DispatchConfig::default()
    };
    let d = Dispatcher::new(store, config, CancellationToken::new());
    d.clock().pin_for_tests(START);
    let metrics = ManagementMetrics::default();
    let management = Management::connect(
        ManagementSource::Kubeconfig(fake.kubeconfig_path()),
        metrics.clone(),
    )
    .await
    .unwrap();
    let guards = d.attach_guards(Arc::new(management), Gauge::default());
    (d, guards, metrics)
}

fn annotation(fake: &FakeManagementApi, name: &str) -> Option<String> {
    fake.annotations("default", name)
        .unwrap()
        .get(SKIP_REMEDIATION_ANNOTATION)
        .cloned()
}

async fn guard_record(d: &Dispatcher, name: &str) -> Option<GuardRecord> {
    d.db()
        .value(&guard_key(&MachineRef::new("default", name)))
        .await
        .unwrap()
}

/// Reports step `index` of `plan` with `status`, started at the pinned start.
async fn step(d: &Dispatcher, name: &str, plan: &str, index: u32, status: StepStatus) {
    let mut report = report(name, plan, index, status);
    report.started_at_unix_ms = Some(START);
    if status == StepStatus::Running {
        report.finished_at_unix_ms = None;
    }
    d.agents.report(&scope(), &report).await.unwrap();
}

fn index_of(plan: &inplace_agent_api::Plan, kind: StepKind) -> u32 {
    plan.steps
        .iter()
        .position(|s| s.action.step_kind() == kind)
        .unwrap() as u32
}

#[tokio::test]
async fn the_guard_is_on_before_the_first_step_and_removed_once_the_node_is_back() {
    let fake = fake();
    let name = "edge-01-md-0-guard";
    fake.add_machine("default", name, &BTreeMap::new());
    let (d, guards, _) = guarded(memory().await, &fake).await;
    let machine = MachineRef::new("default", name);
    update(&d, &os_image_request(name)).await.unwrap();

    // Handed out held: no step starts before the guard is on the Machine.
    let polled = d.agents.poll(&scope(), &poll_for(name, 0)).await.unwrap();
    let plan = polled.plan.unwrap();
    let value = format!("inplace-updater:{}", plan.id);
    assert!(
        matches!(&polled.hold.as_ref().unwrap().reason, HoldReason::RemediationGuard { value: v } if *v == value),
        "{:?}",
        polled.hold
    );
    assert_eq!(annotation(&fake, name), None);
    let reconciled = guards.reconcile(&machine).await.unwrap();
    assert!(!reconciled.pending);
    assert_eq!(annotation(&fake, name), Some(value.clone()));
    let polled = d.agents.poll(&scope(), &poll_for(name, 0)).await.unwrap();
    assert_eq!(polled.hold, None, "the guard is on: the agent may start");
    assert_eq!(guards.held_guards().await.unwrap().len(), 1);
    let line = crate::dispatch::guards::status_line(&d.remediation_guards().await.unwrap());
    assert!(
        line.starts_with("remediation guards: 1 held")
            && line.contains(&format!("default/{name} ({value}")),
        "{line}"
    );

    // Through the drain and the reboot: still on, never patched again.
    let os = index_of(&plan, StepKind::OsImage);
    let ready = index_of(&plan, StepKind::WaitNodeReady);
    for i in 0..os {
        step(&d, name, &plan.id, i, StepStatus::Succeeded).await;
    }
    step(&d, name, &plan.id, os, StepStatus::Running).await;
    guards.reconcile(&machine).await.unwrap();
    assert_eq!(annotation(&fake, name), Some(value.clone()));
    assert_eq!(fake.machine_patches().len(), 1);

    // The node is back (its Ready verified on the new boot): removed, exactly what was set.
    for i in os..=ready {
        step(&d, name, &plan.id, i, StepStatus::Succeeded).await;
    }
    guards.reconcile(&machine).await.unwrap();
    assert_eq!(annotation(&fake, name), None);
    let patches = fake.machine_patches();
    assert_eq!(patches.len(), 2);
    assert_eq!(
        patches[1].before.get(SKIP_REMEDIATION_ANNOTATION),
        Some(&value)
    );
    assert!(patches[1].after.is_empty());
    let record = guard_record(&d, name).await.unwrap();
    assert_eq!(record.lifted, Some(LiftReason::NodeBack));
    assert!(guards.held_guards().await.unwrap().is_empty());
    // Only what the shipped RBAC grants was asked.
    for seen in fake.seen() {
        assert!(
            matches!(seen.request.verb.as_str(), "get" | "patch")
                && seen.request.resource == "machines",
            "{seen:?}"
        );
        assert_eq!(seen.code, 200, "{seen:?}");
    }
}

fn said(answer: UpdateAnswer) -> String {
    match answer {
        UpdateAnswer::InProgress { message, .. } => message,
        other => panic!("not in progress: {other:?}"),
    }
}

/// Machine `name`'s run (recorded already), guarded, in its osImage step one second before that step's
/// deadline, with the guard on and the answer silent about it; returns the plan, the step and its timeout.
async fn one_second_before_the_deadline(
    d: &Dispatcher,
    guards: &Guards,
    fake: &FakeManagementApi,
    name: &str,
) -> (inplace_agent_api::Plan, u32, u64) {
    let machine = MachineRef::new("default", name);
    let plan = handed_plan(d, name).await;
    guards.reconcile(&machine).await.unwrap();
    let os = index_of(&plan, StepKind::OsImage);
    for i in 0..os {
        step(d, name, &plan.id, i, StepStatus::Succeeded).await;
    }
    step(d, name, &plan.id, os, StepStatus::Running).await;
    let timeout = u64::from(plan.steps[os as usize].timeout_seconds);
    d.clock()
        .advance_for_tests(Duration::from_secs(timeout - 1));
    guards.reconcile(&machine).await.unwrap();
    assert!(
        annotation(fake, name).is_some(),
        "still within the deadline"
    );
    let before = said(update(d, &os_image_request(name)).await.unwrap());
    assert!(!before.contains("remediation guard"), "{before}");
    (plan, os, timeout)
}

#[tokio::test]
async fn a_node_that_never_returns_is_unguarded_at_the_steps_deadline() {
    let fake = fake();
    let name = "edge-01-md-0-gone";
    fake.add_machine("default", name, &BTreeMap::new());
    let (d, guards, _) = guarded(memory().await, &fake).await;
    let machine = MachineRef::new("default", name);
    update(&d, &os_image_request(name)).await.unwrap();
    one_second_before_the_deadline(&d, &guards, &fake, name).await;
    d.clock().advance_for_tests(Duration::from_secs(1));
    guards.reconcile(&machine).await.unwrap();
    assert_eq!(annotation(&fake, name), None, "remediation may act");
    let after = said(update(&d, &os_image_request(name)).await.unwrap());
    assert!(
        after.ends_with(
            " (remediation guard lifted at the step's deadline so remediation can act: a MachineHealthCheck may \
             replace the Machine now)"
        ),
        "{after}"
    );
    assert_eq!(
        guard_record(&d, name).await.unwrap().lifted,
        Some(LiftReason::Deadline)
    );
    // Later reconciles keep it lifted while the step is where it was.
    d.clock().advance_for_tests(Duration::from_secs(60));
    guards.reconcile(&machine).await.unwrap();
    assert_eq!(annotation(&fake, name), None);
    assert_eq!(fake.machine_patches().len(), 2);
}

/// The run is recorded under `remediationGuardPastDeadline: keep`; the setting is gone from later requests
/// (and a restarted server reads the run): the guard stays past the deadline all the same.
#[tokio::test]
async fn kept_by_its_setting_the_guard_stays_past_the_deadline_and_the_answer_says_so() {
    let fake = fake();
    let name = "edge-01-md-0-kept";
    fake.add_machine("default", name, &BTreeMap::new());
    let store = memory().await;
    let (d, guards, _) = guarded(store.clone(), &fake).await;
    let machine = MachineRef::new("default", name);
    let kept = UpdateRequest {
        keep_guard_past_deadline: true,
        ..os_image_request(name)
    };
    update(&d, &kept).await.unwrap();
    let (plan, os, timeout) = one_second_before_the_deadline(&d, &guards, &fake, name).await;
    d.clock().advance_for_tests(Duration::from_secs(1));
    guards.reconcile(&machine).await.unwrap();
    let value = format!("inplace-updater:{}", plan.id);
    assert_eq!(annotation(&fake, name), Some(value.clone()), "kept");
    let after = said(update(&d, &os_image_request(name)).await.unwrap());
    assert!(
        after.ends_with(
            " (remediation guard kept past the step's deadline by setting remediationGuardPastDeadline=keep: no \
             MachineHealthCheck replaces the Machine until the run moves on or ends)"
        ),
        "{after}"
    );
    let record = guard_record(&d, name).await.unwrap();
    assert!(
        record.kept_past_deadline && record.lifted.is_none(),
        "{record:?}"
    );
    // A restarted server decides the same from the run it reads.
    drop((d, guards));
    let (d, guards, _) = guarded(store, &fake).await;
    d.clock()
        .advance_for_tests(Duration::from_secs(timeout + 60));
    guards.reconcile_all().await.unwrap();
    assert_eq!(annotation(&fake, name), Some(value));
    assert_eq!(fake.machine_patches().len(), 1, "set once, never lifted");
    // The node comes back after all: lifted as usual.
    for i in os..plan.steps.len() as u32 {
        step(&d, name, &plan.id, i, StepStatus::Succeeded).await;
    }
    guards.reconcile(&machine).await.unwrap();
    assert_eq!(annotation(&fake, name), None);
}

/// 20 guarded runs against an API that never answers: each call waits the request timeout, and the loop's
/// reconciles run side by side, so every run is released (unguarded) in about one timeout, not twenty.
#[tokio::test]
async fn a_silently_dropping_api_delays_the_held_runs_by_about_one_timeout_not_one_each() {
    let fake = fake();
    let names: Vec<String> = (0..20).map(|i| format!("edge-01-md-0-drop-{i}")).collect();
    for name in &names {
        fake.add_machine("default", name, &BTreeMap::new());
    }
    let (d, guards, _) = guarded(memory().await, &fake).await;
    for name in &names {
        update(&d, &os_image_request(name)).await.unwrap();
    }
    fake.set_mode(Mode::Drop);
    let bound = crate::mgmt::MANAGEMENT_REQUEST_TIMEOUT * 3;
    let started = std::time::Instant::now();
    tokio::time::timeout(bound, guards.reconcile_all())
        .await
        .expect("20 reconciles within a few request timeouts")
        .unwrap();
    let took = started.elapsed();
    for name in &names {
        let polled = d.agents.poll(&scope(), &poll_for(name, 0)).await.unwrap();
        assert_eq!(polled.hold, None, "{name}: released unguarded");
    }
    assert!(
        took >= crate::mgmt::MANAGEMENT_REQUEST_TIMEOUT,
        "each call waited its timeout: {took:?}"
    );
    println!("20 reconciles against a dropping API: {took:?}");
}

#[tokio::test]
async fn a_guard_whose_step_ended_while_the_server_was_down_is_removed_at_start_up() {
    let fake = fake();
    let name = "edge-01-md-0-restart";
    fake.add_machine("default", name, &BTreeMap::new());
    let store = memory().await;
    let (d, guards, _) = guarded(store.clone(), &fake).await;
    update(&d, &os_image_request(name)).await.unwrap();
    let plan = handed_plan(&d, name).await;
    guards
        .reconcile(&MachineRef::new("default", name))
        .await
        .unwrap();
    assert!(annotation(&fake, name).is_some());
    // The step ends and nothing reconciles it (the replica is killed right after recording the report).
    for i in 0..plan.steps.len() as u32 {
        step(&d, name, &plan.id, i, StepStatus::Succeeded).await;
    }
    drop((d, guards));
    assert!(
        annotation(&fake, name).is_some(),
        "leaked until a server starts"
    );

    let (_restarted, guards, _) = guarded(store, &fake).await;
    guards.reconcile_all().await.unwrap();
    assert_eq!(annotation(&fake, name), None);
}

#[tokio::test]
async fn an_operators_own_skip_remediation_is_never_touched() {
    let fake = fake();
    let name = "edge-01-md-0-operator";
    let operator = BTreeMap::from([(
        SKIP_REMEDIATION_ANNOTATION.to_owned(),
        "ops:ticket-9".to_owned(),
    )]);
    fake.add_machine("default", name, &operator);
    let (d, guards, _) = guarded(memory().await, &fake).await;
    let machine = MachineRef::new("default", name);
    update(&d, &os_image_request(name)).await.unwrap();
    let plan = handed_plan(&d, name).await;
    let reconciled = guards.reconcile(&machine).await.unwrap();
    assert!(
        !reconciled.pending,
        "the Machine is guarded: the run starts"
    );
    assert!(reconciled.guard.unwrap().operator_value);
    for i in 0..plan.steps.len() as u32 {
        step(&d, name, &plan.id, i, StepStatus::Succeeded).await;
    }
    guards.reconcile(&machine).await.unwrap();
    assert_eq!(annotation(&fake, name).as_deref(), Some("ops:ticket-9"));
    assert!(fake.machine_patches().is_empty());
    // An operator who adds one mid-run after ours was set: ours is not removed over theirs either.
    let name = "edge-01-md-0-operator-late";
    fake.add_machine("default", name, &BTreeMap::new());
    let machine = MachineRef::new("default", name);
    update(&d, &os_image_request(name)).await.unwrap();
    let plan = handed_plan(&d, name).await;
    guards.reconcile(&machine).await.unwrap();
    assert!(fake.annotate(
        "default",
        name,
        SKIP_REMEDIATION_ANNOTATION,
        Some("ops:hold")
    ));
    for i in 0..plan.steps.len() as u32 {
        step(&d, name, &plan.id, i, StepStatus::Succeeded).await;
    }
    guards.reconcile(&machine).await.unwrap();
    assert_eq!(annotation(&fake, name).as_deref(), Some("ops:hold"));
}

/// Every UpdateMachine answer along an OS image run, each after a reconcile (when `guards` is given).
async fn answers(d: &Dispatcher, guards: Option<&Guards>, name: &str) -> Vec<String> {
    let request = os_image_request(name);
    let machine = MachineRef::new("default", name);
    let mut seen = vec![format!("{:?}", update(d, &request).await.unwrap())];
    let plan = handed_plan(d, name).await;
    for i in 0..plan.steps.len() as u32 {
        if let Some(guards) = guards {
            guards.reconcile(&machine).await.unwrap();
        }
        step(d, name, &plan.id, i, StepStatus::Succeeded).await;
        seen.push(format!(
            "{:?}",
            d.runs.update_machine(&request).await.unwrap()
        ));
    }
    seen
}

#[tokio::test]
async fn with_the_api_refusing_or_unreachable_every_answer_is_as_without_it() {
    let plain = dispatcher(memory().await);
    plain.clock().pin_for_tests(START);
    let name = "edge-01-md-0-cut";
    let without = answers(&plain, None, name).await;
    for mode in [Mode::ForbidAll, Mode::Unreachable] {
        let fake = fake();
        fake.add_machine("default", name, &BTreeMap::new());
        fake.set_mode(mode);
        let (d, guards, metrics) = guarded(memory().await, &fake).await;
        let with = answers(&d, Some(&guards), name).await;
        assert_eq!(with, without, "{mode:?}");
        assert_eq!(annotation(&fake, name), None);
        let failed = metrics
            .errors
            .get_or_create(&OpLabels { op: "machine-get" })
            .get();
        assert!(failed >= 1, "{mode:?}: failures are counted");
    }
}

//! Kubernetes Events on the Machine end to end (issue 40), real server and agent processes over TLS against the
//! fake management API (crates/drain `fake::management`: the RBAC of the shipped clusterctl components, the
//! events.k8s.io/v1 schema checked on create and patch). A run that fails and is rolled back leaves its Events
//! in order; 1 000 UpdateMachine calls of one held Machine make one Event whose `series.count` is 1 000; with
//! the API unreachable or answering 403, every hook answers exactly as a server without it. Each test prints the
//! Events as `kubectl describe machine` lists them. What the fake does not prove: a real API server's admission,
//! Event TTL and the field selectors `kubectl describe` uses.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::path::Path;
use std::time::Duration;

use capi_sim::UpdateOutcome;
use common::fleet::{Setup, update_request, wait_until};
use inplace_drain::fake::management::{FakeManagementApi, Mode};
use serde_json::{Value, json};

const SETTLE: Duration = Duration::from_secs(60);
const FIRST: &str = "edge-01-control-plane-aaaaa";
const UID: &str = "5f0c2e8a-8d3e-4c55-9b1a-0d6f1c2b3a4e";

fn fake() -> FakeManagementApi {
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/clusterctl/runtime-extension-components.yaml");
    FakeManagementApi::start(&manifests).unwrap()
}

fn with_uid(mut request: Value) -> Value {
    request["desired"]["machine"]["metadata"]["uid"] = json!(UID);
    request["machine"]["metadata"]["uid"] = json!(UID);
    request
}

fn reasons(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The Events of the update itself, without the remediation guard's (the guard is on while a step can take the
/// node down; its Events come from its own loop, so their place among the others is not fixed).
fn update_events(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| {
            !e["reason"]
                .as_str()
                .unwrap_or_default()
                .starts_with("RemediationGuard")
        })
        .cloned()
        .collect()
}

/// The Events on Machine `name` as `kubectl describe machine` lists them (Type, Reason, Age — with the series
/// as `(xN over …)` —, From, Message).
fn describe(events: &[Value], name: &str) -> String {
    let at = |text: &str| text.parse::<jiff::Timestamp>().ok();
    let first = events
        .iter()
        .filter_map(|e| at(e["eventTime"].as_str()?))
        .min();
    let age = |text: Option<&str>| match (text.and_then(at), first) {
        (Some(t), Some(first)) => format!("{}s", t.duration_since(first).as_secs()),
        _ => "<unknown>".into(),
    };
    let mut out = String::from(
        "Events:\n  Type     Reason                  Age          From                                              Message\n  ----     ------                  ----         ----                                              -------\n",
    );
    for event in events.iter().filter(|e| e["regarding"]["name"] == name) {
        let mut when = age(event["eventTime"].as_str());
        if let Some(count) = event["series"]["count"].as_i64() {
            when = format!("{when} (x{count})");
        }
        out.push_str(&format!(
            "  {:<8} {:<23} {:<12} {:<49} {}\n",
            event["type"].as_str().unwrap_or_default(),
            event["reason"].as_str().unwrap_or_default(),
            when,
            format!(
                "{}, {}",
                event["reportingController"].as_str().unwrap_or_default(),
                event["reportingInstance"].as_str().unwrap_or_default()
            ),
            event["note"].as_str().unwrap_or_default(),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_fails_and_rolls_back_leaves_its_events_on_the_machine_in_order() {
    let api = fake();
    let kubeconfig = api.kubeconfig_path().display().to_string();
    let setup = Setup::new();
    let store = format!("file:{}", setup.dir.path().join("data").display());
    let (server, capi) = setup.serve(&store, &["--management-kubeconfig", &kubeconfig]);
    let agent = setup.agent(&server, FIRST, true);
    agent.sandbox.fail_kubelet_restart(true).unwrap();

    capi.kcp_judges(FIRST).await;
    let request = with_uid(update_request("update-machine-kcp.json", FIRST));
    let (outcome, _) = capi.update_until_settled(&request, SETTLE).await;
    let UpdateOutcome::Failed { message } = outcome else {
        panic!("{outcome:?}")
    };
    let want = [
        "UpdateRecorded",
        "StepFailed",
        "RollbackStarted",
        "RolledBack",
    ];
    wait_until("the rollback's Events and the guard lifted", || {
        let all = api.events();
        update_events(&all).len() >= want.len()
            && reasons(&all).iter().any(|r| r == "RemediationGuardLifted")
    });
    let all = api.events();
    println!("{}", describe(&all, FIRST));
    let events = update_events(&all);
    assert_eq!(reasons(&events), want);
    // The update's steps that can take the node down are guarded: the guard is set before the failed step and
    // lifted once the run no longer needs it.
    let guard: Vec<String> = reasons(&all)
        .into_iter()
        .filter(|r| r.starts_with("RemediationGuard"))
        .collect();
    assert_eq!(guard, ["RemediationGuardSet", "RemediationGuardLifted"]);
    let at = |reason: &str| reasons(&all).iter().position(|r| r == reason).unwrap();
    assert!(
        at("RemediationGuardSet") < at("StepFailed"),
        "{:?}",
        reasons(&all)
    );
    for event in &all {
        assert_eq!(event["regarding"]["uid"], UID);
        assert_eq!(event["regarding"]["kind"], "Machine");
        assert_eq!(event["regarding"]["apiVersion"], "cluster.x-k8s.io/v1beta2");
        assert_eq!(event["regarding"]["namespace"], "default");
        assert_eq!(
            event["reportingController"],
            "inplace-updater.dev/extension"
        );
    }
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["Normal", "Warning", "Warning", "Warning"]);
    // The notes are the UpdateMachine messages' words: the Failure starts with the failed step.
    let step = events[1]["note"].as_str().unwrap();
    assert!(
        message.starts_with(step.split(": ").next().unwrap()),
        "{step} / {message}"
    );
    assert!(step.contains("restart kubelet failed (exit 1)"), "{step}");
    assert!(
        events[3]["note"]
            .as_str()
            .unwrap()
            .contains("the kubelet version it had before"),
        "{}",
        events[3]["note"]
    );
    assert!(
        events[0]["note"].as_str().unwrap().contains(" steps: 1. "),
        "{}",
        events[0]["note"]
    );
}

/// A Machine paused by its annotation, judged and asked `calls` times; returns every answer.
async fn held_calls(capi: &common::fleet::Capi, calls: usize) -> Vec<UpdateOutcome> {
    capi.kcp_judges(FIRST).await;
    let mut request = with_uid(update_request("update-machine-kcp.json", FIRST));
    request["desired"]["machine"]["metadata"]["annotations"]["inplace-updater.dev/paused"] =
        json!("maintenance");
    let mut answers = Vec::with_capacity(calls);
    for _ in 0..calls {
        answers.push(capi.update_machine(&request).await);
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_calls_of_one_held_machine_make_one_event_with_a_count() {
    let api = fake();
    let kubeconfig = api.kubeconfig_path().display().to_string();
    let setup = Setup::new();
    let (mut server, capi) = setup.serve("memory:", &["--management-kubeconfig", &kubeconfig]);
    let answers = held_calls(&capi, 1000).await;
    assert!(
        answers.iter().all(
            |a| matches!(a, UpdateOutcome::InProgress { message, .. } if message.contains("paused"))
        ),
        "{:?}",
        answers.last()
    );
    // Shutdown writes the counts the API lacks.
    server.signal("TERM");
    let (code, _) = server.wait_exit(Duration::from_secs(30));
    assert_eq!(code, Some(0));
    let all = api.events();
    println!("{}", describe(&all, FIRST));
    let events = update_events(&all);
    assert_eq!(reasons(&events), ["UpdateRecorded", "HeldByPause"]);
    assert_eq!(events[1]["series"]["count"], 1000, "{}", events[1]);
    assert!(events[1]["note"].as_str().unwrap().contains("paused"));
    let writes = api.event_writes();
    assert!(
        writes.len() <= 5,
        "1 000 calls made {} API writes: {:?}",
        writes.len(),
        writes.iter().map(|w| w.verb).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_api_unreachable_or_forbidden_every_hook_answers_as_without_it() {
    let setup = Setup::new();
    let (_plain, without) = setup.serve("memory:", &[]);
    let expected = held_calls(&without, 3).await;
    for mode in [Mode::Unreachable, Mode::ForbidAll] {
        let api = fake();
        api.set_mode(mode);
        let kubeconfig = api.kubeconfig_path().display().to_string();
        let (server, capi) = setup.serve("memory:", &["--management-kubeconfig", &kubeconfig]);
        let answers = held_calls(&capi, 3).await;
        assert_eq!(answers, expected, "{mode:?}");
        wait_until("the Events counted as dropped", || {
            common::status_text(server.health, &[]).contains("dropped")
        });
        let status = common::status_text(server.health, &[]);
        println!("{mode:?}: {}", status.lines().last().unwrap_or_default());
        assert!(status.contains("api_error"), "{status}");
        assert!(api.events().is_empty());
    }
}

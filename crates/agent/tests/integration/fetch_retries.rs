//! A registry outage during a `fetch` (issue 43.5), with the real registry behind [`OutageProxy`]: 503s, a 429
//! with `Retry-After`, a dropped connection and a blob body cut short are ridden out within the step's timeout
//! (the cut body resumed with `Range`), each retry logged with its cause; a 401, a 404 or a digest mismatch
//! fails the step at once with no second attempt; an outage longer than the step's timeout fails it naming the
//! last cause; a shutdown during the back-off stops at once.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use inplace_agent::api::*;

use crate::common::fixtures::LIMIT;
use crate::common::*;
use crate::fetch_command::{PREVIOUS, Run, TO, install_plan, oci_fetch, oci_source, pin, setup};
use crate::fetch_interrupted::AgentProcess;
use crate::registry::{PASSWORD, Registry, content, sha256};
use crate::registry_outage::{Fault, OutageProxy, Target};

/// A retry policy short enough for a test: 6 attempts, 1 s doubling to 2 s.
const QUICK_RETRY: &str = "  retry: {attempts: 6, initialDelaySeconds: 1, maxDelaySeconds: 2}\n";
/// A policy whose first back-off alone (30–60 s) would outlast every bound of these tests.
const SLOW_RETRY: &str = "  retry: {attempts: 3, initialDelaySeconds: 60, maxDelaySeconds: 60}\n";

/// The registry with one 1 MiB artifact, the proxy in front of it, and a run fetching it through the proxy.
struct Outage {
    registry: Registry,
    proxy: OutageProxy,
    run: Run,
    artifact: Vec<u8>,
}

impl Outage {
    async fn start(retry: &str) -> Self {
        let registry = Registry::start().await;
        let arch = inplace_agent::api::go_arch(std::env::consts::ARCH);
        let artifact = content("kubelet through an outage", 1024 * 1024);
        let index = registry.push("k8s/kubelet", &[(arch, &artifact)]);
        let proxy = OutageProxy::start(&registry).await;
        let run = setup(
            &registry,
            &[proxy.host()],
            PASSWORD,
            oci_fetch(),
            &pin("v1.34.1", &oci_source("kubelet", &index)),
            retry,
        )
        .await;
        Self {
            registry,
            proxy,
            run,
            artifact,
        }
    }

    fn blob_requests(&self) -> Vec<crate::registry_outage::Seen> {
        let blob = format!("/blobs/sha256:{}", sha256(&self.artifact));
        self.proxy
            .seen()
            .into_iter()
            .filter(|s| s.path.ends_with(&blob))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_outage_is_ridden_out_and_a_cut_body_resumes_with_a_range_request() {
    let started = Instant::now();
    let outage = Outage::start(QUICK_RETRY).await;
    let Outage { proxy, run, .. } = &outage;
    let half = 512 * 1024;
    proxy.fail_next(Target::Any, Fault::Unavailable);
    proxy.fail_next(Target::Any, Fault::TooManyRequests(2));
    proxy.fail_next(Target::Any, Fault::Drop);
    proxy.fail_next(Target::Blob, Fault::Cut(half));
    run.server.offer(install_plan("outage", "v1.34.1"));
    let mut agent = AgentProcess::spawn(run);
    let report = run.wait_final("outage").await;
    agent.kill();
    let log = std::fs::read_to_string(run.node.dir.path().join("agent.log")).unwrap();
    assert_eq!(
        report.status,
        StepStatus::Succeeded,
        "{:?}\n{log}",
        report.message
    );
    assert_eq!(run.installed(), outage.artifact);
    assert_eq!(proxy.pending(), 0, "every fault was met");

    // Each retry is logged with its cause, never the password.
    let retries: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("artifact fetch failed (transient); trying again"))
        .collect();
    assert_eq!(retries.len(), 4, "{log}");
    for (line, cause) in retries.iter().zip([
        "answered 503 (a server error)",
        "answered 429",
        "failed: ",
        "the body broke off after ",
    ]) {
        assert!(line.contains(cause), "{cause:?} in {line}");
    }
    assert!(!log.contains(PASSWORD), "{log}");

    // The 429's Retry-After (2 s) was waited out before the next request.
    let seen = proxy.seen();
    let limited = seen
        .iter()
        .position(|s| s.fault == Some(Fault::TooManyRequests(2)))
        .unwrap();
    let waited = seen[limited + 1].at - seen[limited].at;
    assert!(waited >= Duration::from_secs(2), "{waited:?}");

    // The cut blob was resumed where it broke off: one Range request, answered 206 by the registry.
    let blobs = outage.blob_requests();
    assert_eq!(blobs.len(), 2, "{blobs:?}");
    assert_eq!(blobs[0].fault, Some(Fault::Cut(half)));
    // From where the download broke off (what reached the agent of the half the proxy sent).
    let from: u64 = blobs[1]
        .range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok())
        .unwrap_or_else(|| panic!("{blobs:?}"));
    assert!(from > 0 && from <= half as u64, "{from}");
    outage.registry.wait_log("\" 206 ", 1).await;
    eprintln!(
        "outage ridden out in {:?} ({} requests through the proxy)",
        started.elapsed(),
        seen.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_a_404_or_a_digest_mismatch_fails_at_once_without_a_second_attempt() {
    let started = Instant::now();
    let registry = Registry::start().await;
    let arch = inplace_agent::api::go_arch(std::env::consts::ARCH);
    let good = content("fails at once", 20_000);
    let good_index = registry.push("k8s/good", &[(arch, &good)]);
    let swapped = content("swapped at once", 20_000);
    let swapped_index = registry.push("k8s/swapped", &[(arch, &swapped)]);
    std::fs::write(
        registry.blob_data(&sha256(&swapped)),
        content("other bytes at once", 20_000),
    )
    .unwrap();
    let proxy = OutageProxy::start(&registry).await;
    let cases = [
        (
            "fails-401",
            "wrong-password",
            oci_source("good", &good_index),
            "answered 401 Unauthorized",
        ),
        (
            "fails-404",
            PASSWORD,
            oci_source("good", &sha256(b"never pushed")),
            "answered 404 Not Found",
        ),
        (
            "fails-digest",
            PASSWORD,
            oci_source("swapped", &swapped_index),
            "digest mismatch",
        ),
    ];
    for (case, password, source, wanted) in cases {
        let before = proxy.seen().len();
        let run = setup(
            &registry,
            &[proxy.host()],
            password,
            oci_fetch(),
            &pin("v1.34.1", &source),
            SLOW_RETRY,
        )
        .await;
        let asked = Instant::now();
        let agent = spawn_agent(run.config.clone());
        run.server.offer(install_plan(case, "v1.34.1"));
        let report = run.wait_final(case).await;
        agent.shutdown().await;
        let took = asked.elapsed();
        let message = report.message.unwrap_or_default();
        assert_eq!(report.status, StepStatus::Failed, "{case}: {message}");
        assert!(message.contains(wanted), "{case}: {message}");
        assert!(!message.contains("attempt"), "{case}: {message}");
        // A retry would have waited 30–60 s first.
        assert!(took < Duration::from_secs(20), "{case}: {took:?}");
        // One attempt: no path asked for more often than its auth challenge explains (unauthenticated, then
        // with the credential).
        let seen: Vec<String> = proxy.seen()[before..]
            .iter()
            .map(|s| s.path.clone())
            .collect();
        for path in &seen {
            let times = seen.iter().filter(|p| *p == path).count();
            assert!(times <= 2, "{case}: {path} asked {times} times: {seen:?}");
        }
        assert_eq!(
            std::fs::read_to_string(run.node.path(TO)).unwrap(),
            PREVIOUS
        );
    }
    eprintln!("401, 404, digest mismatch: {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_step_timeout_fails_the_step_naming_the_last_cause() {
    let outage = Outage::start(QUICK_RETRY).await;
    let Outage { proxy, run, .. } = &outage;
    proxy.fail_all(Some(Fault::Unavailable));
    let mut plan = install_plan("long-outage", "v1.34.1");
    plan.steps[0].timeout_seconds = 4;
    let asked = Instant::now();
    let agent = spawn_agent(run.config.clone());
    run.server.offer(plan);
    let report = run.wait_final("long-outage").await;
    agent.shutdown().await;
    let took = asked.elapsed();
    let message = report.message.unwrap_or_default();
    assert_eq!(report.status, StepStatus::Failed, "{message}");
    assert!(
        message.contains("answered 503 (a server error)"),
        "{message}"
    );
    assert!(
        message.contains("would start after the deadline"),
        "{message}"
    );
    assert!(proxy.seen().len() >= 2, "retried before giving up");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(
        std::fs::read_to_string(run.node.path(TO)).unwrap(),
        PREVIOUS
    );
    eprintln!("gave up within the step timeout: {took:?}: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_during_the_backoff_stops_at_once_and_the_next_start_fetches() {
    let outage = Outage::start(SLOW_RETRY).await;
    let Outage { proxy, run, .. } = &outage;
    proxy.fail_all(Some(Fault::Unavailable));
    let mut plan = install_plan("backoff", "v1.34.1");
    // Room for the whole 30–60 s back-off inside the step's timeout.
    plan.steps[0].timeout_seconds = 600;
    run.server.offer(plan);
    let mut agent = AgentProcess::spawn(run);
    let log = run.node.dir.path().join("agent.log");
    wait_until("the agent's back-off after the first 503", LIMIT, || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("artifact fetch failed (transient); trying again")
    })
    .await;
    // The real process, SIGTERMed inside its 30–60 s back-off.
    let took = agent.terminate(Duration::from_secs(10));
    assert!(took < Duration::from_secs(5), "{took:?}");
    let finished = run
        .server
        .reports_for(0)
        .into_iter()
        .any(|r| matches!(r.status, StepStatus::Succeeded | StepStatus::Failed));
    assert!(!finished, "the step ended instead of stopping");
    assert_eq!(
        std::fs::read_to_string(run.node.path(TO)).unwrap(),
        PREVIOUS
    );

    // The outage is over: the next start resumes the step and fetches.
    proxy.fail_all(None);
    let mut agent = AgentProcess::spawn(run);
    let report = run.wait_final("backoff").await;
    agent.kill();
    assert_eq!(report.status, StepStatus::Succeeded, "{:?}", report.message);
    assert_eq!(run.installed(), outage.artifact);
    eprintln!("shutdown in the back-off took {took:?}");
}

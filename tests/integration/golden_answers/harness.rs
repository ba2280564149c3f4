//! The recorder: one engine at a time (a dispatcher over a fresh in-memory store, its clock pinned, and the
//! hook router over it), every call made through it written down as one JSON line (label, call, sha256 of the
//! request bytes, HTTP status, answer bytes), and at the end the lines compared with the scenario's golden
//! file, or written to it when `GOLDEN_BLESS=1`.
//!
//! Determinism: the clock moves only when a scenario advances it, and after every call the test task yields
//! so the dispatcher's last-seen writer (a task of its own) has written what the call queued before the clock
//! moves on. The tests run on tokio's current-thread runtime, so nothing else runs in between.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::response::IntoResponse as _;
use http_body_util::BodyExt as _;
use inplace_agent_api::{
    AckResponse, AgentIdentity, Hold, InventoryReport, MachineRef, Plan, PlanProgress, PlanStatus,
    PollRequest, StepReport, StepStatus,
};
use inplace_updater::api::Hook;
use inplace_updater::dispatch::upkeep::tokens::AgentTokens;
use inplace_updater::dispatch::{AgentScope, DispatchError, Dispatcher};
use inplace_updater::hooks::Engine;
use inplace_updater::server::{AppState, HttpError, app};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::file;

/// Where the scenarios start, unless they pin another instant: a Monday morning.
pub const START: &str = "2026-12-07T09:00:00Z";
/// How often the test task yields after a call so the last-seen writer finishes (it needs one turn).
const SETTLE_YIELDS: usize = 4;

/// Unix ms of an RFC 3339 instant.
pub fn unix_ms(rfc3339: &str) -> u64 {
    let at: jiff::Timestamp = rfc3339.parse().unwrap();
    u64::try_from(at.as_millisecond()).unwrap()
}

/// The cluster token every simulated agent holds (the demo's).
pub fn cluster_scope() -> AgentScope {
    AgentScope::Cluster {
        namespace: "default".into(),
        cluster: "edge-01".into(),
    }
}

/// A simulated agent: who it says it is, its token's scope, and the plan it holds with its progress.
pub struct Agent {
    /// What its requests say it is.
    pub identity: AgentIdentity,
    /// What its token allows.
    pub scope: AgentScope,
    /// The plan it holds.
    pub plan: Option<Plan>,
    /// Steps of that plan it finished with success.
    pub done: u32,
    /// The step that failed, when one did.
    pub failed: Option<u32>,
    /// The hold it honours (the last one the server said).
    pub hold: Option<Hold>,
    /// When the running step started (Unix ms, the pinned clock).
    started: Option<u64>,
}

impl Agent {
    /// The agent of Machine `default/name`, with the cluster token.
    pub fn machine(name: &str) -> Self {
        Self::new(AgentIdentity::Machine(MachineRef::new("default", name)))
    }

    /// An agent that knows only its node's provider id, with the cluster token.
    pub fn provider(id: &str) -> Self {
        Self::new(AgentIdentity::ProviderId(id.into()))
    }

    fn new(identity: AgentIdentity) -> Self {
        Self {
            identity,
            scope: cluster_scope(),
            plan: None,
            done: 0,
            failed: None,
            hold: None,
            started: None,
        }
    }

    /// The id of the plan it holds.
    pub fn plan_id(&self) -> String {
        self.plan.as_ref().map(|p| p.id.clone()).unwrap_or_default()
    }

    /// Steps in the plan it holds.
    pub fn total(&self) -> u32 {
        self.plan.as_ref().map_or(0, |p| p.steps.len() as u32)
    }

    /// Whether it finished (or failed) its plan.
    pub fn finished(&self) -> bool {
        self.failed.is_some() || (self.plan.is_some() && self.done == self.total())
    }

    /// What its polls and inventory say about its plan.
    fn progress(&self) -> Option<PlanProgress> {
        let plan = self.plan.as_ref()?;
        let total = plan.steps.len() as u32;
        Some(PlanProgress {
            plan_id: plan.id.clone(),
            status: match (self.failed, self.done == total) {
                (Some(_), _) => PlanStatus::Failed,
                (None, true) => PlanStatus::Succeeded,
                (None, false) => PlanStatus::Running,
            },
            succeeded_steps: self.done,
            total_steps: total,
            failed_step: self.failed,
            hold: self.hold.clone().filter(|h| h.plan_id == plan.id),
            rollback: None,
        })
    }
}

/// What a failed step reports besides its status.
pub struct Failure<'a> {
    /// The exit code of the command that failed, when a command failed.
    pub exit_code: Option<i32>,
    /// Its stderr's last lines.
    pub stderr_tail: Option<&'a str>,
    /// What the agent says about it.
    pub message: &'a str,
}

/// One engine and the calls recorded against it (and the engines before it) for one scenario.
pub struct Golden {
    scenario: &'static str,
    lines: Vec<String>,
    labels: BTreeSet<String>,
    dispatcher: Arc<Dispatcher>,
    router: Router,
}

impl Golden {
    /// A scenario over a fresh engine whose clock is pinned at [`START`].
    pub fn new(scenario: &'static str) -> Self {
        let (dispatcher, router) = engine();
        Self {
            scenario,
            lines: Vec::new(),
            labels: BTreeSet::new(),
            dispatcher,
            router,
        }
    }

    /// Goes on against a fresh engine (empty store, nothing learned), its clock pinned at [`START`].
    pub fn fresh(&mut self) {
        (self.dispatcher, self.router) = engine();
    }

    /// The engine's dispatcher.
    pub fn dispatcher(&self) -> &Arc<Dispatcher> {
        &self.dispatcher
    }

    /// Now, by the engine's clock (Unix ms).
    pub fn now(&self) -> u64 {
        self.dispatcher.clock().now_ms()
    }

    /// Moves the engine's clock `seconds` forward.
    pub fn advance(&self, seconds: u64) {
        self.dispatcher
            .clock()
            .advance_for_tests(Duration::from_secs(seconds));
    }

    /// Sets the engine's clock to an RFC 3339 instant.
    pub fn pin(&self, rfc3339: &str) {
        self.dispatcher.clock().pin_for_tests(unix_ms(rfc3339));
    }

    /// Calls `hook` with `request` as CAPI does (`?timeout=10s`); records and returns the answer as JSON.
    pub async fn hook(&mut self, label: &str, hook: Hook, request: &Value) -> Value {
        let body = request.to_string().into_bytes();
        let path = format!("{}?timeout=10s", hook.path());
        let (_, answer) = self.post(label, hook.name(), &path, body).await;
        serde_json::from_slice(&answer).unwrap_or(Value::Null)
    }

    /// POSTs `body` to `path` on the hook router and records the answer as `call`; returns status and bytes.
    pub async fn post(
        &mut self,
        label: &str,
        call: &str,
        path: &str,
        body: Vec<u8>,
    ) -> (u16, Vec<u8>) {
        let request_sha = sha256(&body);
        let http = Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        let (status, answer) = crate::common::respond(self.router.clone(), http).await;
        self.record(label, call, &request_sha, status, &answer);
        settle().await;
        (status, answer)
    }

    /// The agent's long-poll with `wait_seconds: 0`. A plan in the answer becomes the agent's (progress reset
    /// when it is another plan); the answer's hold becomes the one it honours.
    pub async fn poll(&mut self, label: &str, agent: &mut Agent) {
        let request = PollRequest {
            agent: agent.identity.clone(),
            current: agent.progress(),
            wait_seconds: 0,
            facts: None,
        };
        let answer = self.dispatcher.agents.poll(&agent.scope, &request).await;
        if let Ok(answer) = &answer {
            if let Some(plan) = &answer.plan
                && agent.plan.as_ref().is_none_or(|held| held.id != plan.id)
            {
                agent.plan = Some(plan.clone());
                agent.done = 0;
                agent.failed = None;
                agent.started = None;
            }
            agent.hold = answer.hold.clone();
        }
        self.record_agent(label, "poll", &request, answer).await;
    }

    /// CanUpdateMachine for `question`, labelled `{who} CanUpdateMachine`.
    pub async fn judge(&mut self, who: &str, question: &Value) -> Value {
        let label = format!("{who} CanUpdateMachine");
        self.hook(&label, Hook::CanUpdateMachine, question).await
    }

    /// The agent reports its next step running.
    pub async fn running(&mut self, label: &str, agent: &mut Agent) {
        self.step(label, agent, StepStatus::Running, None, None)
            .await;
    }

    /// The agent reports its running step succeeded.
    pub async fn succeeded(&mut self, label: &str, agent: &mut Agent) {
        self.step(label, agent, StepStatus::Succeeded, None, None)
            .await;
    }

    /// The agent reports its next step (index `done`) `status`; the ack's hold becomes the one it honours.
    pub async fn step(
        &mut self,
        label: &str,
        agent: &mut Agent,
        status: StepStatus,
        failure: Option<Failure<'_>>,
        message: Option<&str>,
    ) {
        let now = self.now();
        let started = match status {
            StepStatus::Running => *agent.started.insert(now),
            _ => agent.started.unwrap_or(now),
        };
        let report = StepReport {
            agent: agent.identity.clone(),
            plan_id: agent.plan_id(),
            step_index: agent.done,
            status,
            attempt: 1,
            started_at_unix_ms: Some(started),
            finished_at_unix_ms: (status != StepStatus::Running).then_some(now),
            exit_code: failure.as_ref().and_then(|f| f.exit_code),
            stderr_tail: failure
                .as_ref()
                .and_then(|f| f.stderr_tail)
                .map(str::to_owned),
            message: failure
                .as_ref()
                .map(|f| f.message)
                .or(message)
                .map(str::to_owned),
            undo: false,
            rollback: None,
        };
        let answer = self
            .dispatcher
            .agents
            .report(&agent.scope, &report)
            .await
            .map(|hold| AckResponse { hold });
        if let Ok(ack) = &answer {
            agent.hold = ack.hold.clone();
            match status {
                StepStatus::Running => {}
                StepStatus::Succeeded => {
                    agent.done += 1;
                    agent.started = None;
                }
                StepStatus::Failed => agent.failed = Some(report.step_index),
            }
        }
        self.record_agent(label, "report", &report, answer).await;
    }

    /// The agent's inventory (as it sends at start): its node, versions and the plan it holds.
    pub async fn inventory(&mut self, label: &str, agent: &Agent, kubelet: &str) {
        let hostname = match &agent.identity {
            AgentIdentity::Machine(machine) => machine.name.clone(),
            AgentIdentity::ProviderId(id) => id.rsplit('/').next().unwrap_or_default().to_owned(),
        };
        let report = InventoryReport {
            agent: agent.identity.clone(),
            agent_version: "0.1.0".into(),
            kubelet_version: Some(kubelet.into()),
            kubeadm_version: Some(kubelet.into()),
            boot_id: Some(format!("boot-{hostname}")),
            hostname: Some(hostname),
            current: agent.progress(),
            facts: None,
            runtime: None,
        };
        let answer = self
            .dispatcher
            .agents
            .inventory(&agent.scope, &report)
            .await
            .map(|()| AckResponse::default());
        self.record_agent(label, "inventory", &report, answer).await;
    }

    /// What operators see: `Dispatcher::status()` and `Dispatcher::agents()`, serialized.
    pub async fn operator_views(&mut self, label: &str) {
        let status = self.dispatcher.fleet.status().await;
        self.record_view(&format!("{label}: status"), "status", status);
        let agents = self.dispatcher.agents.list().await;
        self.record_view(&format!("{label}: agents"), "agents", agents);
    }

    fn record_view<T: Serialize>(
        &mut self,
        label: &str,
        call: &str,
        rows: Result<T, DispatchError>,
    ) {
        let rows = rows.unwrap_or_else(|err| panic!("{label}: {err}"));
        let answer = serde_json::to_vec(&rows).unwrap();
        self.record(label, call, &sha256(b""), 200, &answer);
    }

    /// Records an agent call the way the agent routes answer it: 200 with the JSON answer, or the status
    /// and body the dispatch error maps to.
    async fn record_agent<Q: Serialize, A: Serialize>(
        &mut self,
        label: &str,
        call: &str,
        request: &Q,
        answer: Result<A, DispatchError>,
    ) {
        let request_sha = sha256(&serde_json::to_vec(request).unwrap());
        let (status, body) = match answer {
            Ok(answer) => (200, serde_json::to_vec(&answer).unwrap()),
            Err(err) => {
                let response = HttpError::from(err).into_response();
                let status = response.status().as_u16();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (status, body.to_vec())
            }
        };
        self.record(label, call, &request_sha, status, &body);
        settle().await;
    }

    fn record(&mut self, label: &str, call: &str, request_sha: &str, status: u16, answer: &[u8]) {
        assert!(
            self.labels.insert(label.to_owned()),
            "{}: label {label:?} used twice",
            self.scenario
        );
        let answer = std::str::from_utf8(answer)
            .unwrap_or_else(|err| panic!("{}: {label}: answer is not UTF-8: {err}", self.scenario));
        self.lines
            .push(file::line(label, call, request_sha, status, answer));
    }

    /// Compares the recorded calls with the golden file (or rewrites it with `GOLDEN_BLESS=1`).
    pub fn finish(self) {
        file::check_or_bless(self.scenario, &self.lines);
    }
}

fn engine() -> (Arc<Dispatcher>, Router) {
    let dispatcher = Dispatcher::in_memory();
    dispatcher.clock().pin_for_tests(unix_ms(START));
    let router = app(AppState::new(
        Arc::new(Engine::builtin(dispatcher.clone())),
        Arc::new(AgentTokens::none()),
    ));
    (dispatcher, router)
}

/// Lets the dispatcher's own tasks (the last-seen writer) finish what the last call queued.
async fn settle() {
    for _ in 0..SETTLE_YIELDS {
        tokio::task::yield_now().await;
    }
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

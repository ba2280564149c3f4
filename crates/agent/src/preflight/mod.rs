//! The control-plane preflight (issue 30): before a step that disturbs a control plane (its kind's
//! `preflight()`: etcdImage, kubeletArgs, kubeadmUpgrade, installKubelet, reboot, osImage) starts on a
//! control-plane Machine (`Plan.control_plane`), the agent checks that the control plane can afford it:
//! - etcd, when this node runs a member (the etcd static pod manifest, `etcd.manifest`, exists): every other
//!   member healthy and a quorum of them without this one (`decide.rs` has the rule), asked with kubeadm's
//!   health-check client certificate (`controlPlane:` in the agent config, `etcd.rs`);
//! - every other control-plane Node Ready, through the node steps' API access (`node:`); without that section
//!   the agent has no credentials for it, so this part is skipped and the step's message says so.
//!
//! Not OK: the agent waits — at most [`PREFLIGHT_WAIT`], never past the step's timeout — looking again every
//! [`PREFLIGHT_RECHECK`], the running step's message saying why ("waiting for the control plane: …"); then
//! the step fails, naming what was unhealthy. The executor runs it (`run/executor.rs`, through [`check_step`]) before the
//! step's undo record, before it is recorded running and before its first effect: a step that fails its
//! preflight changed nothing, and a rollback passes it over.
//!
//! Resumes: the preflight gates a step's first attempt only — the attempts that have made no effect yet. A
//! preflight stopped by a shutdown or a crash leaves the step never begun, so the next start checks again.
//! A step that was recorded running may have made its effect (a command in flight at a crash leaves no
//! trace of whether it ran: the reboot that rebooted the node is exactly that case), and finishing it is
//! what the control plane needs most: a resumed step is never blocked by the preflight — the reboot step
//! confirms the reboot that happened even while this node's etcd member is still rejoining.

mod decide;
mod etcd;
mod members_seen;

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{MESSAGE_MAX_BYTES, Plan, Step, StepReport};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use decide::{Nodes, Seen, Verdict, decide};
pub use etcd::{ETCD_REQUEST_TIMEOUT, MAX_ETCD_ANSWER_BYTES};

use crate::attempt::drive::drive;
use crate::attempt::host::StepHost;
use crate::config::{ControlPlaneConfig, DriverConfig};
use crate::drivers::{
    DriverOutcome, ProgressRecorder, StepContext, StepResult, drainer, drive_node, node_name,
};
use crate::os::driver_env::DriverEnv;
use crate::shutdown::Shutdown;
use crate::state::{SequenceProgress, StateError, StateStore, truncate_head};

/// Longest the preflight waits for the control plane to become able to afford the step (the step's own
/// timeout caps it too), before the step fails.
pub const PREFLIGHT_WAIT: Duration = Duration::from_secs(300);
/// Longest an undo of a rollback waits for the control plane before it fails unbegun (the step's timeout
/// caps it too): longer than a step's [`PREFLIGHT_WAIT`], since giving up leaves the node half changed.
pub const UNDO_PREFLIGHT_WAIT: Duration = Duration::from_secs(1800);
/// Time between two looks at etcd and the Nodes while the preflight waits.
pub const PREFLIGHT_RECHECK: Duration = Duration::from_secs(3);
/// Longest listing the control-plane Nodes may take.
pub const NODE_LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether `step` of `plan` runs the preflight first.
pub(crate) fn needed(plan: &Plan, step: &Step) -> bool {
    plan.control_plane && step.action.step_kind().preflight()
}

/// The preflight as the executor runs it for a step (`ctx.deadline`: when it gives up), its message sent
/// as the step's while it waits. Succeeds with what it checked; fails naming what was unhealthy.
pub(crate) async fn run(env: Arc<DriverEnv>, mut ctx: StepContext) -> StepResult {
    let (texts, seen) = watch::channel(String::new());
    let deadline = ctx.deadline;
    match drive_node(&mut ctx, seen, wait_until_safe(&env, deadline, &texts)).await {
        Ok(Ok(summary)) => StepResult::ok(summary),
        Ok(Err(reason)) => StepResult::failed(reason),
        Err(ended) => ended.into(),
    }
}

/// One control-plane preflight outside a step, as the agent runs it before a disruptive step on a
/// control-plane node: with the agent config `config` on the node at `root` and the agent's state dir
/// `state_dir` (where the etcd members seen are kept), waiting at most `within`. Succeeds with what it
/// checked; fails naming what was unhealthy.
pub async fn control_plane_preflight(
    config: DriverConfig,
    root: PathBuf,
    state_dir: PathBuf,
    within: Duration,
) -> Result<String, String> {
    let env = DriverEnv::new(root, config, state_dir);
    let (texts, _seen) = watch::channel(String::new());
    wait_until_safe(&env, Instant::now() + within, &texts).await
}

/// Looks until the control plane can afford the step, or `deadline`; each wait's reason goes to `texts`.
async fn wait_until_safe(
    env: &DriverEnv,
    deadline: Instant,
    texts: &watch::Sender<String>,
) -> Result<String, String> {
    let started = Instant::now();
    loop {
        let verdict = match tokio::time::timeout_at(deadline, look(env)).await {
            Ok(verdict) => verdict,
            Err(_) => {
                Verdict::Wait("the last look at etcd and the Nodes did not finish in time".into())
            }
        };
        let reason = match verdict {
            Verdict::Pass(summary) => {
                return Ok(bounded(format!("control plane OK: {summary}")));
            }
            Verdict::Wait(reason) => reason,
        };
        let now = Instant::now();
        if now + PREFLIGHT_RECHECK > deadline {
            let waited = now.duration_since(started).as_secs();
            return Err(bounded(format!(
                "control-plane preflight failed after {waited} s (nothing was changed): {reason}"
            )));
        }
        let text = bounded(format!("waiting for the control plane: {reason}"));
        texts.send_if_modified(|current| {
            let changed = *current != text;
            if changed {
                current.clone_from(&text);
            }
            changed
        });
        tracing::info!(%reason, "control-plane preflight: waiting");
        tokio::time::sleep(PREFLIGHT_RECHECK).await;
    }
}

fn bounded(text: String) -> String {
    truncate_head(&text, MESSAGE_MAX_BYTES).to_owned()
}

/// One look at etcd and the other control-plane Nodes, at once.
async fn look(env: &DriverEnv) -> Verdict {
    let config = &env.config;
    let etcd = etcd::observe(
        &config.control_plane,
        &env.fs,
        &config.etcd.manifest,
        &env.state_dir,
    );
    let (etcd, nodes) = tokio::join!(etcd, nodes(env));
    decide(&Seen {
        node: node_name(env),
        etcd,
        nodes,
    })
}

async fn nodes(env: &DriverEnv) -> Nodes {
    if env.config.node.is_none() {
        return Nodes::NotConfigured;
    }
    let drainer = match drainer(env, "control-plane preflight").await {
        Ok(drainer) => drainer,
        Err(failed) => return Nodes::Unreachable(failed.to_string()),
    };
    match tokio::time::timeout(NODE_LIST_TIMEOUT, drainer.control_plane_not_ready()).await {
        Ok(Ok(not_ready)) => Nodes::NotReady(not_ready),
        Ok(Err(e)) => Nodes::Unreachable(e.to_string()),
        Err(_) => Nodes::Unreachable(format!(
            "no answer within {} s",
            NODE_LIST_TIMEOUT.as_secs()
        )),
    }
}

/// Runs the control-plane preflight of `step` of plan `plan_id`, waiting at most `wait`: `Continue(Ok)` when
/// the step (or its undo) may start, `Continue(Err)` with its failure, `Break` when the agent shuts down (it
/// stays never begun). A task of its own driven like a step (reports delivered), before the step's or the
/// undo's first effect; `record` writes each waiting message where the step's or the undo's record keeps it,
/// and queues its report (`waiting`: what it tells the server while a full state dir holds that write up).
pub(crate) async fn check_step<H, R>(
    host: &mut H,
    plan_id: &str,
    step: &Step,
    wait: Duration,
    shutdown: &mut Shutdown,
    record: impl FnMut(&mut StateStore, SequenceProgress, Option<String>) -> Result<(), StateError>,
    waiting: &R,
) -> ControlFlow<(), Result<(), StepResult>>
where
    H: StepHost + Send,
    R: Fn(&StateStore, &str) -> Option<StepReport> + Sync,
{
    let index = step.index;
    let deadline = Instant::now() + wait;
    let (cancel_tx, cancel) = watch::channel(false);
    let (progress_tx, progress_rx) = mpsc::channel(1);
    let ctx = StepContext {
        plan_id: plan_id.to_owned(),
        step: step.clone(),
        deadline,
        resumed: false,
        progress: None,
        recorder: ProgressRecorder::new(progress_tx),
        cancel,
        drained: false,
    };
    tracing::info!(plan = %plan_id, step = index, "control-plane preflight");
    let task = tokio::spawn(run(host.env(), ctx));
    let (result, stopping) = drive(
        host,
        task,
        cancel_tx,
        progress_rx,
        shutdown,
        record,
        waiting,
    )
    .await;
    if stopping || result.outcome == DriverOutcome::Interrupted {
        return ControlFlow::Break(());
    }
    match result.outcome {
        DriverOutcome::Succeeded => {
            tracing::info!(plan = %plan_id, step = index, message = %result.message, "control-plane preflight passed");
            ControlFlow::Continue(Ok(()))
        }
        _ => ControlFlow::Continue(Err(result)),
    }
}

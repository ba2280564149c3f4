//! The `containerRuntime` driver (issue 31): containerd, runc and the CNI plugins of the bundle the node's runtime
//! matrix (`runtime.matrix`) names for the target Kubernetes minor. A node without a matrix is left alone; a node
//! already on the bundle too. Otherwise — and only on a node this plan drained, since the install restarts
//! containerd — the configured `runtime.install` sequence runs (the bundle as `{{pin.…}}` values; resumed at its
//! first unfinished command after a crash, like every configured sequence), then each component's version command
//! must report the bundle's version. Its undo is the sequence's `record:`/`undo:` (the package steps' undo).

use std::sync::Arc;

use inplace_agent_api::{StepAction, StepKind};

use super::driver::{Driver, RecordFuture, StepFuture};
use super::error::DriverError;
use super::kubernetes::{run_sequence, sequence_of};
use super::kubernetes_undo;
use super::step::{Done, StepContext};
use super::undo::{RecordContext, UndoContext};
use crate::config::runtime::{Bundle, COMPONENTS, RuntimeConfig, bare, reports_version};
use crate::os::driver_env::DriverEnv;
use crate::sequence::process::{display_argv, run_command};
use crate::sequence::template::{Vars, expand};

/// The `containerRuntime` driver.
pub(crate) struct ContainerRuntime;

impl Driver for ContainerRuntime {
    fn kind(&self) -> StepKind {
        StepKind::ContainerRuntime
    }

    fn run(&self, env: Arc<DriverEnv>, mut ctx: StepContext) -> StepFuture {
        Box::pin(async move { run(&env, &mut ctx).await })
    }

    fn record(&self, env: Arc<DriverEnv>, ctx: RecordContext) -> Option<RecordFuture> {
        Some(kubernetes_undo::record(env, ctx))
    }

    fn undo(&self, env: Arc<DriverEnv>, ctx: UndoContext) -> StepFuture {
        kubernetes_undo::undo(env, ctx)
    }
}

/// What a component's version command printed (its first non-empty line), or why it could not say.
type Reported = Result<String, String>;

async fn run(env: &DriverEnv, ctx: &mut StepContext) -> Result<Done, DriverError> {
    let action = ctx.step.action.clone();
    let StepAction::ContainerRuntime { kubernetes_version } = &action else {
        return Err(DriverError::refused("not a containerRuntime step"));
    };
    let Some(runtime) = &env.config.runtime else {
        return Ok(Done::ok(
            "no runtime: section in the agent config: containerd, runc and the CNI plugins stay as they are",
        ));
    };
    // A version the matrix does not cover ends the step here, naming the minors it has.
    let configured = sequence_of(&env.config, &action)?;
    let Some(bundle) = configured.bundle else {
        return Err(DriverError::refused("not a containerRuntime step"));
    };
    let vars = configured.vars(env);
    let before = reported(env, ctx, runtime, &vars).await;
    let differs = differing(bundle, &before);
    // A step that began may have replaced a binary and not restarted containerd yet: it runs to its end.
    if differs.is_empty() && !ctx.resumed {
        return Ok(Done::ok(format!(
            "already on the runtime matrix bundle for {}: {}",
            kubernetes_version,
            bundle.summary()
        )));
    }
    if !ctx.drained && !ctx.resumed {
        return Err(DriverError::refused(format!(
            "not changed: {} differ from the bundle for {kubernetes_version}, and installing it restarts \
             containerd, which this agent does only on a node its plan drained (this plan has no drainNode step: \
             the Machine has machine.cluster.x-k8s.io/exclude-node-draining, or drainPatchVersion is off)",
            differs.join(", ")
        )));
    }
    let ran = run_sequence(env, ctx, &configured).await?;
    let after = reported(env, ctx, runtime, &vars).await;
    let wrong = differing(bundle, &after);
    if !wrong.is_empty() {
        return Err(DriverError::Unverified(format!(
            "runtime.install ran, but {}",
            wrong.join("; ")
        )));
    }
    Ok(Done::ok(format!(
        "{} ({}; was: {})",
        bundle.summary(),
        ran.message,
        before
            .iter()
            .zip(COMPONENTS)
            .map(|(r, name)| format!("{name} {}", r.as_deref().unwrap_or("unknown")))
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

/// Each component's version command's first line, in [`COMPONENTS`] order.
async fn reported(
    env: &DriverEnv,
    ctx: &mut StepContext,
    runtime: &RuntimeConfig,
    vars: &Vars,
) -> Vec<Reported> {
    let mut out = Vec::with_capacity(COMPONENTS.len());
    for name in COMPONENTS {
        out.push(version_of(env, ctx, runtime.versions.of(name), vars).await);
    }
    out
}

async fn version_of(
    env: &DriverEnv,
    ctx: &mut StepContext,
    template: &[String],
    vars: &Vars,
) -> Reported {
    let argv = template
        .iter()
        .map(|a| expand(a, vars))
        .collect::<Result<Vec<_>, _>>()
        .map_err(String::from)?;
    let output = run_command(&argv, &env.command_env, ctx.deadline, &mut ctx.cancel).await;
    if !output.success() {
        return Err(format!(
            "`{}` failed ({:?})",
            display_argv(&argv),
            output.end
        ));
    }
    Ok(output.first_line().unwrap_or_default().to_owned())
}

/// The components whose reported version is not the bundle's, each saying what was reported.
fn differing(bundle: &Bundle, reported: &[Reported]) -> Vec<String> {
    COMPONENTS
        .into_iter()
        .zip(reported)
        .filter_map(|(name, got)| {
            let want = bare(&bundle.component(name).version);
            match got {
                Ok(line) if reports_version(line, want) => None,
                Ok(line) => Some(format!("{name} reports {line:?}, the bundle has {want}")),
                Err(why) => Some(format!("{name}: {why}, the bundle has {want}")),
            }
        })
        .collect()
}

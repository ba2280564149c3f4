//! The `drainNode` driver: records that this plan cordons the node, cordons it (unless it already is),
//! then evicts its pods through the Eviction API within the step's timeout (see [`super::node`] for the
//! cordon journal's rules).

use std::sync::Arc;

use inplace_agent_api::{StepAction, StepKind};
use inplace_drain::DrainOptions;
use tokio::sync::watch;

use super::driver::{Driver, StepFuture, wrong_kind};
use super::node::{CordonJournal, drainer, drive, load_journal, save_journal, unconfigured};
use super::step::{StepContext, StepResult};
use crate::config::DriverConfig;
use crate::os::driver_env::DriverEnv;

/// The `drainNode` driver.
pub(crate) struct DrainNode;

impl Driver for DrainNode {
    fn kind(&self) -> StepKind {
        StepKind::DrainNode
    }

    fn unconfigured(&self, config: &DriverConfig) -> Option<String> {
        unconfigured(config)
    }

    fn run(&self, env: Arc<DriverEnv>, mut ctx: StepContext) -> StepFuture {
        let StepAction::DrainNode {
            delete_empty_dir_data,
            force_unmanaged,
        } = ctx.step.action
        else {
            return wrong_kind(self.kind(), &ctx.step.action);
        };
        let options = DrainOptions {
            delete_empty_dir_data,
            force_unmanaged,
        };
        Box::pin(async move { drain(&env, &mut ctx, options).await })
    }
}

/// drainNode: record + cordon (unless already cordoned), then drain within the step timeout.
async fn drain(env: &DriverEnv, ctx: &mut StepContext, options: DrainOptions) -> StepResult {
    let drainer = match drainer(env, "drainNode").await {
        Ok(d) => d,
        Err(failure) => return failure,
    };
    let (tx, rx) = watch::channel(String::new());
    let node = drainer.node().to_owned();
    let cordon = async {
        let cordoned = drainer.is_cordoned().await?;
        Ok::<_, inplace_drain::DrainError>(cordoned)
    };
    let already = match drive(ctx, rx.clone(), cordon).await {
        Ok(Ok(cordoned)) => cordoned,
        Ok(Err(e)) => return StepResult::failed(format!("drainNode: {e}")),
        Err(stop) => return stop,
    };
    let journal = match load_journal(ctx, env).await {
        Ok(j) => j,
        Err(failure) => return failure,
    };
    let ours = journal.cordoned_by_plan.as_deref() == Some(ctx.plan_id.as_str());
    let cordon_note = if already && ours {
        "cordoned by this plan"
    } else if already && journal.cordoned_by_plan.is_some() {
        // An earlier plan's drain cordoned the node and never uncordoned it (its drain failed and left the
        // node cordoned, or it was cancelled or replaced). The cordon is still the updater's, not an
        // operator's: this plan takes it over and uncordons at its end, or it would stay cordoned for ever.
        let record = CordonJournal {
            cordoned_by_plan: Some(ctx.plan_id.clone()),
        };
        if let Err(failure) = save_journal(ctx, env, Some(record)).await {
            return failure;
        }
        tracing::info!(node = %node, plan = %ctx.plan_id, "cordon of an earlier plan taken over");
        "cordoned by an earlier plan of this agent; this plan uncordons it"
    } else if already {
        "it was cordoned before this plan and stays cordoned after it"
    } else {
        let record = CordonJournal {
            cordoned_by_plan: Some(ctx.plan_id.clone()),
        };
        if let Err(failure) = save_journal(ctx, env, Some(record)).await {
            return failure;
        }
        match drive(ctx, rx.clone(), drainer.cordon()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return StepResult::failed(format!("drainNode: cordon: {e}")),
            Err(stop) => return stop,
        }
        tracing::info!(node = %node, plan = %ctx.plan_id, "node cordoned");
        "cordoned by this plan"
    };
    let deadline = ctx.deadline;
    let mut report = move |text: String| {
        let _ = tx.send(text);
    };
    match drive(ctx, rx, drainer.drain(options, deadline, &mut report)).await {
        Ok(Ok(summary)) => StepResult::ok(format!(
            "drained {node} ({cordon_note}): {} pod(s) evicted{}",
            summary.evicted.len(),
            if summary.gone.is_empty() {
                String::new()
            } else {
                format!(", {} already gone", summary.gone.len())
            }
        )),
        Ok(Err(e)) => StepResult::failed(format!("drainNode: {e}; the node stays cordoned")),
        Err(stop) => stop,
    }
}

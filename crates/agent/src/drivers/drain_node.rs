//! The `drainNode` driver: records that this plan cordons the node, cordons it (unless it already is),
//! records the pods Running and Ready for the node verification after the plan's last step (`pods_before_drain`),
//! then evicts its pods through the Eviction API within the step's timeout (see [`super::node`] for the
//! cordon journal's rules).

use std::sync::Arc;

use inplace_agent_api::{StepAction, StepKind};
use inplace_drain::DrainOptions;
use tokio::sync::watch;

use super::driver::{Driver, StepFuture, wrong_kind};
use super::error::DriverError;
use super::node::{
    CordonJournal, drainer, drive, load_journal, node_api, save_journal, unconfigured,
};
use super::step::{Done, StepContext};
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
async fn drain(
    env: &DriverEnv,
    ctx: &mut StepContext,
    options: DrainOptions,
) -> Result<Done, DriverError> {
    let drainer = drainer(env, "drainNode").await?;
    let (tx, rx) = watch::channel(String::new());
    let node = drainer.node().to_owned();
    let cordon = async {
        let cordoned = drainer.is_cordoned().await?;
        Ok::<_, inplace_drain::DrainError>(cordoned)
    };
    let already = drive(ctx, rx.clone(), cordon)
        .await?
        .map_err(|source| node_api("drainNode", source, ""))?;
    let journal = load_journal(ctx, env).await?;
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
        save_journal(ctx, env, Some(record)).await?;
        tracing::info!(node = %node, plan = %ctx.plan_id, "cordon of an earlier plan taken over");
        "cordoned by an earlier plan of this agent; this plan uncordons it"
    } else if already {
        "it was cordoned before this plan and stays cordoned after it"
    } else {
        let record = CordonJournal {
            cordoned_by_plan: Some(ctx.plan_id.clone()),
        };
        save_journal(ctx, env, Some(record)).await?;
        drive(ctx, rx.clone(), drainer.cordon())
            .await?
            .map_err(|source| node_api("drainNode: cordon", source, ""))?;
        tracing::info!(node = %node, plan = %ctx.plan_id, "node cordoned");
        "cordoned by this plan"
    };
    // What the node verification after the plan's last step waits for, recorded before the first eviction.
    let plan = ctx.plan_id.clone();
    drive(
        ctx,
        rx.clone(),
        super::pods_before_drain::note_pods_before_drain(env, plan, &drainer),
    )
    .await??;
    let deadline = ctx.deadline;
    let mut report = move |text: String| {
        let _ = tx.send(text);
    };
    let summary = drive(ctx, rx, drainer.drain(options, deadline, &mut report))
        .await?
        .map_err(|source| node_api("drainNode", source, "; the node stays cordoned"))?;
    Ok(Done::ok(format!(
        "drained {node} ({cordon_note}): {} pod(s) evicted{}",
        summary.evicted.len(),
        if summary.gone.is_empty() {
            String::new()
        } else {
            format!(", {} already gone", summary.gone.len())
        }
    )))
}

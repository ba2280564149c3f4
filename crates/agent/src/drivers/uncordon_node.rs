//! The `uncordonNode` driver: uncordons the node only when this plan's drainNode cordoned it (the cordon
//! journal names the plan), and clears that record after the uncordon succeeded.

use std::sync::Arc;

use inplace_agent_api::StepKind;
use tokio::sync::watch;

use super::driver::{Driver, StepFuture};
use super::error::DriverError;
use super::node::{drainer, drive, load_journal, node_api, save_journal, unconfigured};
use super::step::{Done, StepContext};
use crate::config::DriverConfig;
use crate::os::driver_env::DriverEnv;

/// The `uncordonNode` driver.
pub(crate) struct UncordonNode;

impl Driver for UncordonNode {
    fn kind(&self) -> StepKind {
        StepKind::UncordonNode
    }

    fn unconfigured(&self, config: &DriverConfig) -> Option<String> {
        unconfigured(config)
    }

    fn run(&self, env: Arc<DriverEnv>, mut ctx: StepContext) -> StepFuture {
        Box::pin(async move { uncordon(&env, &mut ctx).await })
    }
}

/// uncordonNode: only when this plan's drainNode cordoned the node; the record goes after.
async fn uncordon(env: &DriverEnv, ctx: &mut StepContext) -> Result<Done, DriverError> {
    let journal = load_journal(ctx, env).await?;
    if journal.cordoned_by_plan.as_deref() != Some(ctx.plan_id.as_str()) {
        return Ok(Done::ok(
            "node not cordoned by this plan: left as it is (an operator's cordon stays)",
        ));
    }
    let drainer = drainer(env, "uncordonNode").await?;
    let (_tx, rx) = watch::channel(String::new());
    let work = async {
        // A resumed step whose uncordon went through already does not patch again.
        if drainer.is_cordoned().await? {
            drainer.uncordon().await?;
        }
        Ok::<_, inplace_drain::DrainError>(())
    };
    drive(ctx, rx, work)
        .await?
        .map_err(|source| node_api("uncordonNode", source, ""))?;
    tracing::info!(node = %drainer.node(), plan = %ctx.plan_id, "node uncordoned");
    save_journal(ctx, env, None).await?;
    Ok(Done::ok(format!("uncordoned {}", drainer.node())))
}

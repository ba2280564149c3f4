//! The `waitNodeReady` driver: waits until the Node is Ready and, when the step names one, its kubelet
//! reports the version, within the step's timeout.

use std::sync::Arc;

use inplace_agent_api::{StepAction, StepKind};
use tokio::sync::watch;

use super::driver::{Driver, StepFuture, wrong_kind};
use super::error::DriverError;
use super::node::{drainer, drive, node_api, unconfigured};
use super::step::{Done, StepContext};
use crate::config::DriverConfig;
use crate::os::driver_env::DriverEnv;

/// The `waitNodeReady` driver.
pub(crate) struct WaitNodeReady;

impl Driver for WaitNodeReady {
    fn kind(&self) -> StepKind {
        StepKind::WaitNodeReady
    }

    fn unconfigured(&self, config: &DriverConfig) -> Option<String> {
        unconfigured(config)
    }

    fn run(&self, env: Arc<DriverEnv>, mut ctx: StepContext) -> StepFuture {
        let StepAction::WaitNodeReady { kubelet_version } = ctx.step.action.clone() else {
            return wrong_kind(self.kind(), &ctx.step.action);
        };
        Box::pin(async move {
            wait_ready(&env, &mut ctx, kubelet_version, None, "waitNodeReady")
                .await
                .map(Done::ok)
        })
    }
}

/// Waits for Ready=True and, when given, the kubelet version and the boot the Node reports (after a reboot: the
/// boot id now), within the step timeout; `kind` names the step in failures (waitNodeReady, or the reboot
/// steps after the new boot).
pub(super) async fn wait_ready(
    env: &DriverEnv,
    ctx: &mut StepContext,
    kubelet_version: Option<String>,
    boot_id: Option<&str>,
    kind: &str,
) -> Result<String, DriverError> {
    let drainer = drainer(env, kind).await?;
    let (tx, rx) = watch::channel(String::new());
    let deadline = ctx.deadline;
    let mut report = move |text: String| {
        let _ = tx.send(text);
    };
    let work = drainer.wait_node_ready(kubelet_version.as_deref(), boot_id, deadline, &mut report);
    drive(ctx, rx, work)
        .await?
        .map_err(|source| node_api(kind, source, ""))
}

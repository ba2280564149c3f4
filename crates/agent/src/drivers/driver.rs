//! The [`Driver`] trait every step kind's driver implements, and the helpers drivers share to run
//! synchronous disk work within the step's deadline.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use inplace_agent_api::{StepAction, StepKind};

use super::error::DriverError;
use super::step::{Done, StepContext};
use super::undo::{Place, RecordContext, UndoContext, UndoRecord, restore_then_restart};
use crate::config::{DriverConfig, Section};
use crate::os::driver_env::DriverEnv;

/// A step (or undo) running through its driver. Owned (`'static`): the executor spawns it as a task.
pub(crate) type StepFuture = Pin<Box<dyn Future<Output = Result<Done, DriverError>> + Send>>;

/// A driver taking the record its undo needs (`None`: nothing to record; `Err`: the step fails before any
/// effect).
pub(crate) type RecordFuture =
    Pin<Box<dyn Future<Output = Result<Option<UndoRecord>, DriverError>> + Send>>;

/// A node-local driver: converges the node to the desired state of one kind of step.
///
/// Contract: idempotent (a step whose desired state already holds is a no-op success) and crash safe (a
/// step interrupted at any point and run again, `ctx.resumed`, ends in the desired state). Work a later
/// step must not mistake for done is journaled in `unfinished.json` *before* the first effect (see
/// [`super::restart`]); backups of replaced files are saved before they are replaced.
///
/// Rollback (issue 28): a kind whose steps are undone (`StepKind::undo()` is `Restores`) names the places a
/// step may change ([`Driver::undo_places`]) or takes its record itself ([`Driver::record`]); the executor
/// writes it into the step's record before the step's first effect, and [`Driver::undo`] puts the node back. A kind that names none has no undo yet: a
/// rollback reaching one of its steps fails, naming it.
pub(crate) trait Driver: Sync {
    /// The step kind this driver runs (one driver per kind: the registry, `DRIVERS` in `drivers/mod.rs`).
    fn kind(&self) -> StepKind;

    /// Why `config` cannot run steps of this kind, naming the missing `--config` key; `None` when it can.
    /// Kinds whose settings all have defaults need nothing. The shipped configs are checked against it.
    fn unconfigured(&self, _config: &DriverConfig) -> Option<String> {
        None
    }

    /// The `--config` section this driver declares in its own file, when it reads one of its own (a kind's
    /// section needs no line in `config/`): the file is read with it, and the driver reads it with
    /// [`DriverConfig::section`].
    fn section(&self) -> Option<Section> {
        None
    }

    /// Whether only some nodes can run this kind (osImage: only an image-based OS can switch images). A
    /// config without what [`Driver::unconfigured`] names refuses its steps, and a shipped config need not
    /// hold it; the kinds every node must run are not optional.
    fn optional(&self) -> bool {
        false
    }

    /// Runs a step of this kind (`ctx.step.action` is of [`Driver::kind`]: the registry looked it up by
    /// its kind, and the executor validated it).
    fn run(&self, env: Arc<DriverEnv>, ctx: StepContext) -> StepFuture;

    /// The places a step of this kind with `action` may change, read before its first effect; `None` when
    /// this kind has no undo (yet).
    fn undo_places(
        &self,
        _env: &DriverEnv,
        _action: &StepAction,
    ) -> Result<Option<Vec<Place>>, DriverError> {
        Ok(None)
    }

    /// Takes the record the undo of a step needs by running commands (the package steps' `record:`); `None`
    /// (the default) when the driver only names places ([`Driver::undo_places`]).
    fn record(&self, _env: Arc<DriverEnv>, _ctx: RecordContext) -> Option<RecordFuture> {
        None
    }

    /// Undoes a step of this kind from what its record says (the default: restore the places, no restart).
    fn undo(&self, env: Arc<DriverEnv>, ctx: UndoContext) -> StepFuture {
        restore_then_restart(env, ctx, None)
    }
}

/// The failure of a driver handed a step of another kind (a registry mistake, never the server's).
pub(crate) fn wrong_kind(driver: StepKind, action: &StepAction) -> StepFuture {
    let refused = DriverError::refused(format!(
        "the {driver} driver was handed a {} step",
        action.kind()
    ));
    Box::pin(std::future::ready(Err(refused)))
}

/// A step whose whole work is synchronous disk work (`work(env, plan id)` returns the summary), run by
/// [`blocking_value`].
pub(crate) fn blocking_step(
    env: Arc<DriverEnv>,
    ctx: StepContext,
    work: impl FnOnce(&DriverEnv, &str) -> Result<String, DriverError> + Send + 'static,
) -> StepFuture {
    Box::pin(async move {
        let plan_id = ctx.plan_id.clone();
        blocking_value(&ctx, move || work(&env, &plan_id))
            .await
            .map(Done::ok)
    })
}

/// Runs synchronous disk work off the async threads, bounded by the step deadline; `Err` is the step's end.
pub(crate) async fn blocking_value<T: Send + 'static>(
    ctx: &StepContext,
    work: impl FnOnce() -> Result<T, DriverError> + Send + 'static,
) -> Result<T, DriverError> {
    match tokio::time::timeout_at(ctx.deadline, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(done)) => done,
        Ok(Err(join)) => Err(DriverError::Crashed {
            what: "driver crashed: ",
            source: join,
        }),
        Err(_) => Err(DriverError::TimedOut {
            seconds: ctx.step.timeout_seconds,
        }),
    }
}

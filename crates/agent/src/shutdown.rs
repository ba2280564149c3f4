//! The agent's shutdown signal, boxed so the pull loop and the step executor can both wait on it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// The shutdown signal: completes once when the agent is to stop.
pub(crate) type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Sleeps `delay` unless shutdown comes first; true on shutdown.
pub(crate) async fn pause(delay: Duration, shutdown: &mut Shutdown) -> bool {
    tokio::select! {
        () = tokio::time::sleep(delay) => false,
        () = &mut *shutdown => true,
    }
}

//! Kubernetes Events on every Machine (issue 40): what the dispatcher posts to its outbox
//! ([`crate::dispatch::floor::outbox`]) becomes events.k8s.io/v1 Events on the management cluster, aggregated into
//! series and bounded in rate as Kubernetes' own recorders do ([`aggregate`], [`rate`], pure), and sent by a
//! task of its own fed by a bounded queue ([`sender`]): posting never blocks a hook, and no API error fails one.

pub mod aggregate;
pub mod kube;
pub mod metrics;
pub mod rate;
pub mod sender;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::dispatch::Dispatcher;
use crate::mgmt::Management;

/// Connects the dispatcher's outbox to a queue and starts its sender among the server's `tasks` (whose end
/// while the server runs ends the process, as every background task's does).
pub fn start(
    tasks: &mut JoinSet<&'static str>,
    management: &Management,
    dispatcher: &Dispatcher,
    metrics: metrics::EventMetrics,
    shutdown: CancellationToken,
) {
    let (queue, sender) = sender::channel(metrics);
    dispatcher.connect_events(std::sync::Arc::new(queue));
    let writer = kube::KubeEvents::new(
        management.clone(),
        kube::reporting_instance(std::env::var("HOSTNAME").ok()),
    );
    tasks.spawn(async move {
        sender.run(writer, crate::dispatch::now_ms, shutdown).await;
        "Kubernetes Events sender"
    });
}

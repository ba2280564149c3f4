//! The Events' sender: the dispatcher's outbox is connected to a bounded queue ([`EventQueue`]: posting never
//! waits; a full queue drops and counts), drained by one task that aggregates ([`super::aggregate`]) and makes
//! the writes through an [`EventWriter`] (the management cluster's API), each bounded by [`WRITE_TIMEOUT`]. A
//! failed write never reaches a hook: it is counted and logged. At shutdown the task writes the counts the API
//! lacks (within [`SHUTDOWN_FLUSH_TIMEOUT`]) and ends.

use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::aggregate::{Aggregator, Dropped, Observed, Outcome, Write};
use super::metrics::EventMetrics;
use crate::dispatch::floor::outbox::{EventSink, MachineEvent};

/// Occurrences waiting for the sender; past it, posting drops them (counted `queue_full`).
pub const EVENT_QUEUE_CAPACITY: usize = 10_000;
/// How often the sender writes the series counts that are due.
pub const SENDER_TICK: Duration = Duration::from_secs(1);
/// The longest one API write may take before it counts as failed.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the sender may spend writing the last counts at shutdown.
pub const SHUTDOWN_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The management cluster's API, as the sender sees it.
pub trait EventWriter: Send + Sync + 'static {
    /// Makes `write` (a create, or a patch of a series).
    fn write(&self, write: &Write) -> impl Future<Output = Outcome> + Send;
}

/// The outbox's sink: a bounded queue to the sender.
#[derive(Debug, Clone)]
pub struct EventQueue {
    queue: mpsc::Sender<MachineEvent>,
    metrics: EventMetrics,
}

impl EventSink for EventQueue {
    fn post(&self, event: MachineEvent) {
        if self.queue.try_send(event).is_err() {
            self.metrics.dropped(Dropped::QueueFull, 1);
        }
    }
}

/// The queue and the sender that drains it.
pub fn channel(metrics: EventMetrics) -> (EventQueue, Sender) {
    let (queue, receiver) = mpsc::channel(EVENT_QUEUE_CAPACITY);
    (
        EventQueue {
            queue,
            metrics: metrics.clone(),
        },
        Sender { receiver, metrics },
    )
}

/// The receiving end, run by [`Sender::run`].
#[derive(Debug)]
pub struct Sender {
    receiver: mpsc::Receiver<MachineEvent>,
    metrics: EventMetrics,
}

impl Sender {
    /// Sends until `shutdown`, then writes the counts the API lacks and returns; `now_ms` is the clock.
    pub async fn run<W: EventWriter>(
        mut self,
        writer: W,
        now_ms: impl Fn() -> u64 + Send,
        shutdown: CancellationToken,
    ) {
        let mut aggregator = Aggregator::new(now_ms());
        let mut failing = false;
        let mut ticker = tokio::time::interval(SENDER_TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                event = self.receiver.recv() => {
                    let Some(event) = event else { break };
                    let observed = aggregator.observe(event, now_ms());
                    self.handle(&writer, &mut aggregator, observed, &now_ms, &mut failing).await;
                }
                _ = ticker.tick() => {
                    for write in aggregator.tick(now_ms()) {
                        self.handle(&writer, &mut aggregator, Observed::Write(write), &now_ms, &mut failing).await;
                    }
                }
            }
        }
        // What was posted before the shutdown still counts; then the counts the API lacks.
        let flush = async {
            while let Ok(event) = self.receiver.try_recv() {
                let observed = aggregator.observe(event, now_ms());
                self.handle(&writer, &mut aggregator, observed, &now_ms, &mut failing)
                    .await;
            }
            for write in aggregator.flush(now_ms()) {
                self.handle(
                    &writer,
                    &mut aggregator,
                    Observed::Write(write),
                    &now_ms,
                    &mut failing,
                )
                .await;
            }
        };
        if tokio::time::timeout(SHUTDOWN_FLUSH_TIMEOUT, flush)
            .await
            .is_err()
        {
            tracing::warn!("Events: the last series counts were not all written before shutdown");
        }
    }

    async fn handle<W: EventWriter>(
        &self,
        writer: &W,
        aggregator: &mut Aggregator,
        observed: Observed,
        now_ms: &(impl Fn() -> u64 + Send),
        failing: &mut bool,
    ) {
        let evicted = aggregator.take_evicted();
        if evicted > 0 {
            self.metrics.dropped(Dropped::Evicted, evicted);
        }
        let mut next = match observed {
            Observed::Write(write) => Some(write),
            Observed::Counted => None,
            Observed::Dropped(why) => {
                self.metrics.dropped(why, 1);
                None
            }
        };
        // At most a patch and the create that replaces its vanished Event.
        for _ in 0..2 {
            let Some(write) = next.take() else { return };
            let outcome = tokio::time::timeout(WRITE_TIMEOUT, writer.write(&write))
                .await
                .unwrap_or(Outcome::Failed);
            let reason = match &write {
                Write::Create(event) => event.key.reason,
                Write::Patch { key, .. } => key.reason,
            };
            match outcome {
                Outcome::Written => {
                    self.metrics.sent(reason);
                    if std::mem::take(failing) {
                        tracing::info!("Events: the management cluster takes them again");
                    }
                }
                Outcome::Failed | Outcome::Gone if matches!(write, Write::Create(_)) => {
                    self.metrics.dropped(Dropped::ApiError, 1);
                    if !std::mem::replace(failing, true) {
                        tracing::warn!(
                            reason = reason.as_str(),
                            "Events: the management cluster refused or could not be reached; dropping \
                             them (counted in inplace_updater_events_dropped_total) until it takes them again"
                        );
                    }
                }
                Outcome::Failed | Outcome::Gone => {}
            }
            next = aggregator.written(&write, outcome, now_ms());
        }
    }
}

//! Kubernetes Events on every Machine (issue 40): what the dispatcher posts to its outbox
//! ([`crate::dispatch::floor::outbox`]) becomes events.k8s.io/v1 Events on the management cluster, aggregated into
//! series and bounded in rate as Kubernetes' own recorders do ([`aggregate`], [`rate`], pure), and sent by a
//! task of its own fed by a bounded queue ([`sender`]): posting never blocks a hook, and no API error fails one.

pub mod aggregate;
pub mod rate;
pub mod metrics;
pub mod sender;

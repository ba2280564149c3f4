//! The upkeep wing: what keeps the agents themselves current, beside the runs they execute. Three parts, each
//! owning its own state and lock:
//!
//! - [`rollout`]: the agent release the fleet should run and its self-upgrade offers, paced by the floor's
//!   store-backed slots (`floor/slots.rs`) so replicas never offer more at once than
//!   `--agent-upgrade-concurrency`; whether to offer is pure ([`rollout::decide`]), what one transaction
//!   writes too ([`rollout::writes`]).
//! - [`tokens`]: the operator's token file, the check of a presented token, and the rotated successors in the
//!   store; when to rotate and what refuses a token is pure ([`tokens::rule`]).
//! - [`served_ca`]: the CA bundle agents are told to trust, handed out only while it verifies the server's own
//!   serving certificate.
//!
//! The agents wing asks it at every poll (an upgrade to offer, the digest of the served CA); the server only
//! reads requests and maps these answers to HTTP. It imports the floor and `fleet` (the upgrade outcome
//! counters), never another wing.

pub mod rollout;
pub mod served_ca;
pub mod tokens;

use rollout::Rollout;
use served_ca::ServedCa;
use tokens::Tokens;

use super::fleet::Fleet;
use super::floor::Floor;
use std::sync::Arc;

/// The upkeep wing: one owner per part.
pub struct Upkeep {
    /// The agent release and its self-upgrade offers.
    pub rollout: Rollout,
    /// Rotated agent tokens in the store.
    pub tokens: Tokens,
    /// The CA bundle agents are told to trust.
    pub served_ca: ServedCa,
}

impl Upkeep {
    /// The wing over `floor`, counting upgrade outcomes into `fleet`; no release and no CA bundle until set.
    pub fn new(floor: Floor, fleet: Arc<Fleet>) -> Upkeep {
        Upkeep {
            rollout: Rollout::new(floor.clone(), fleet),
            tokens: Tokens::new(floor),
            served_ca: ServedCa::default(),
        }
    }
}

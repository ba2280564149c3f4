//! What every handler on the hook port shares (hook routes and agent routes alike): the metrics, the
//! client-certificate requirement, the engine and the agent tokens.

use std::sync::Arc;

use super::metrics::Metrics;
use crate::dispatch::upkeep::rollout::release::SharedImage;
use crate::dispatch::upkeep::tokens::AgentTokens;
use crate::hooks::Engine;

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// Whether hook calls must come over a connection with a verified client certificate.
    pub require_client_cert: bool,
    /// Policy and dispatch.
    pub engine: Arc<Engine>,
    /// Agent tokens (agent API).
    pub tokens: Arc<AgentTokens>,
    /// The agent executable handed out at `GET /agent/v1/binary` (none: 404).
    pub agent_image: SharedImage,
}

impl AppState {
    /// `engine` and `tokens` with fresh metrics and no client-certificate requirement (what `serve` does
    /// without `--client-ca`); the fields stay public for the rest.
    pub fn new(engine: Arc<Engine>, tokens: Arc<AgentTokens>) -> Self {
        Self {
            metrics: Arc::new(Metrics::new()),
            require_client_cert: false,
            engine,
            tokens,
            agent_image: None,
        }
    }
}

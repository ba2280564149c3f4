//! The agent's upkeep of itself and the node between plans: its self-upgrade (`self_upgrade`, `download`),
//! following the server's CA (`ca_update`), and the node's retention sweep (`node_sweep`). The pull loop
//! (`run/upkeep.rs`) decides when; these do it.

pub(crate) mod ca_update;
pub(crate) mod download;
pub(crate) mod node_sweep;
pub(crate) mod self_upgrade;

//! The run loop: the agent's pull loop (`agent`), the step executor that walks a plan (`executor`) and the
//! loop's own upkeep between plans (`upkeep`). The top of the agent: it calls every other part and nothing but
//! the CLI calls it.

pub(crate) mod agent;
pub(crate) mod executor;
pub(crate) mod poll;
pub(crate) mod reports;
pub(crate) mod upkeep;

//! How a change spreads across the fleet. The fleet-wide update budget: at most N runs in progress at once
//! across every cluster and replica ([`budget`] pure, [`budget_io`] load → decide → the caller's transaction).

pub mod budget;
pub mod budget_io;

pub use budget_io::Budget;

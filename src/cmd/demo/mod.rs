//! `inplace-updater demo`: a server, N sandboxed agents and a simulated CAPI rollout on this machine, no
//! cluster needed: [`setup`] starts them, [`run`] rolls a change out as CAPI drives it, [`canary`] as the
//! updater paces it across a fleet. The sandbox is shared with the end-to-end tests.

mod agents;
pub mod canary;
pub mod run;
pub mod sandbox;
pub mod scenario;
pub mod setup;

pub use sandbox::Sandbox;

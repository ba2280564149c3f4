//! `inplace-updater demo`: a server, N sandboxed agents and a simulated CAPI rollout on this machine, no
//! cluster needed. The sandbox is shared with the end-to-end tests.

mod agents;
pub mod run;
pub mod sandbox;
pub mod scenario;

pub use sandbox::Sandbox;

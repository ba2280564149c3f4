//! inplace-updater: a Cluster API runtime extension that answers CanUpdateMachine, CanUpdateMachineSet
//! and UpdateMachine, and performs accepted changes in place through an agent on each node.
//!
//! The binary (`src/main.rs`) only parses the command line. The data path, in the order a request flows:
//!
//! 1. [`server`] — TLS listeners, limits, health, metrics, shutdown; routes hook calls to [`hooks`] and agent
//!    calls (their tokens checked by `dispatch::upkeep::tokens`) to [`dispatch`].
//! 2. [`api`] — CAPI's wire types: decoding with Go's field rules, `api::validate` (the object rules), answers.
//! 3. [`hooks`] — one function per hook: CanUpdate runs `inplace_core`'s diff, policy and patch and records a
//!    verdict; UpdateMachine reads the Machine's facts and allowed actions and hands them to [`dispatch`].
//! 4. `inplace_core::plan` — the desired Machine and bootstrap config turned into ordered agent steps with a
//!    stable id (pure, so it lives in the core crate; [`dispatch`] builds it once per desired state).
//! 5. [`dispatch`] — the store-backed runs: verdicts and their licence, agent polls and reports, status.
//! 6. [`observe`] — fleet, store and process metrics beside the data path.
//! 7. [`mgmt`] — the management cluster's API (optional): the skip-remediation guard on Machines, Events.
//!
//! Around it: [`cmd`] (the subcommands' glue: clap types, `status`, `diff`, `demo`, development certificates,
//! fatal-error printing), [`fuzzing`] (the fuzz targets' bodies) and [`openapi`] (the API document with this
//! build's step kinds).

pub mod api;
pub mod cmd;
pub mod dispatch;
pub mod fuzzing;
pub mod hooks;
pub mod mgmt;
pub mod observe;
pub mod openapi;
pub mod pem;
pub mod server;

/// Lower-case hex of `bytes` (digests in ids, store keys and token lines).
pub(crate) use inplace_core::hex;

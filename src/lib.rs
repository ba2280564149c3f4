//! inplace-updater: a Cluster API runtime extension that answers CanUpdateMachine, CanUpdateMachineSet
//! and UpdateMachine, and performs accepted changes in place through an agent on each node.
//!
//! The binary (`src/main.rs`) only parses the command line; everything else lives here:
//! [`api`] (wire types), [`hooks`] (one function per hook), [`server`] (TLS, limits, health, metrics,
//! shutdown), [`certs`] (development certificates), [`cli`] (clap types).

pub mod api;
pub mod auth;
pub mod certs;
pub mod cli;
pub mod commands;
pub mod diffcmd;
pub mod dispatch;
pub mod fuzzing;
pub mod hooks;
pub mod http;
pub mod server;

pub mod demo;
pub mod plan;

//! Every integration test of this crate in one test binary: each module was a binary of its own, and
//! each binary linked the whole crate again (one binary builds and links once).

mod artifacts;
mod common;
mod fetch_command;
mod fetch_interrupted;
mod fetch_retries;
mod holds;
mod node_steps;
mod node_verify;
mod pull_loop;
mod registry;
mod registry_outage;
mod registry_token;
mod restarts;

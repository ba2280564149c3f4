//! Every integration test of this crate in one test binary: each module was a binary of its own, and
//! each binary linked the whole crate again (one binary builds and links once).

mod agent_api;
mod agent_diagnostics;
mod agent_skew;
mod agent_tokens;
mod bounded_inputs;
mod common;
mod deploy_configs;
mod e2e_ca_rotation;
mod e2e_drain;
mod e2e_durability;
mod e2e_ha;
mod e2e_hold;
mod e2e_observe;
mod e2e_resume;
mod e2e_retry;
mod e2e_rollback;
mod e2e_rollout;
mod e2e_self_upgrade;
mod e2e_tokens;
mod e2e_verdicts;
mod e2e_window;
mod fatal_errors;
mod golden_answers;
mod hooks_bad_input;
mod hooks_capi;
mod hooks_malformed;
mod hostile;
mod layers;
mod load_harness;
mod openapi;
mod preflight;
mod readme;
mod resume_node;
mod server_tls;
mod step_kinds;

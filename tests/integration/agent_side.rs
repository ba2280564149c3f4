//! The agent crate's own test helpers, loaded once for every test here that needs them: its protocol test
//! server (`common`) and the real OCI registry (`registry`, which finds `common` beside it).

#[path = "../../crates/agent/tests/integration/common/mod.rs"]
pub mod common;
#[path = "../../crates/agent/tests/integration/registry.rs"]
#[allow(dead_code)]
pub mod registry;

//! Every integration test of this crate in one test binary: each module was a binary of its own, and
//! each binary linked the whole crate again (one binary builds and links once).

mod common;
mod default_rules;
mod drain_decisions;
mod fixtures;
mod lists_templates_settings;
mod proptest_patches;
mod verdict_fixtures;

//! Agent API bodies, both directions: poll, report and inventory as the server decodes and folds them
//! into a run, and the poll response, error and ack bodies the agent decodes.
//! The body is `inplace_updater::fuzzing::agent_api`, which `tests/integration/hostile.rs` also replays kept inputs through.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| inplace_updater::fuzzing::agent_api(data));

//! `inplace-updater diff`'s inputs, packed as `CURRENT[\0DESIRED[\0SETTINGS]]` (SETTINGS: one
//! `KEY=VALUE` per line), through the CLI's own code path and both renderings.
//! The body is `inplace_updater::fuzzing::diff_inputs`, which `tests/integration/hostile.rs` also replays kept inputs through.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| inplace_updater::fuzzing::diff_inputs(data));

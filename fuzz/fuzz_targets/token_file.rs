//! The agent token file (`--agent-tokens`): any text must give entries or an error naming the line.
//! The body is `inplace_updater::fuzzing::token_file`, which `tests/integration/hostile.rs` also replays kept inputs through.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| inplace_updater::fuzzing::token_file(data));

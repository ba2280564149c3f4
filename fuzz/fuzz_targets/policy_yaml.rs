//! The policy file (`serve --policy`, `policy check`, `diff --policy`): any text must give a policy or
//! a clear error.
//! The body is `inplace_updater::fuzzing::policy_yaml`, which `tests/integration/hostile.rs` also replays kept inputs through.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| inplace_updater::fuzzing::policy_yaml(data));

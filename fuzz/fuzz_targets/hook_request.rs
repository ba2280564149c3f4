//! Hook request bodies as CAPI (or anyone who reaches the hook port) sends them: the decoders, the
//! CanUpdateMachine / CanUpdateMachineSet hooks, and UpdateMachine up to the store (plan built and validated).
//! The body is `inplace_updater::fuzzing::hook_request`, which `tests/integration/hostile.rs` also replays kept inputs through.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| inplace_updater::fuzzing::hook_request(data));

//! Hook request bodies as CAPI (or anyone who reaches the hook port) sends them: each decoder, then the
//! full CanUpdateMachine / CanUpdateMachineSet hooks (diff, policy, patch, self-check). Must never panic.
#![no_main]

use std::sync::LazyLock;

use inplace_updater::api::{
    CanUpdateMachineRequest, CanUpdateMachineSetRequest, UpdateMachineRequest, decode_request,
};
use inplace_updater::hooks::{Engine, can_update_machine, can_update_machine_set};
use libfuzzer_sys::fuzz_target;

static ENGINE: LazyLock<Engine> = LazyLock::new(|| Engine {
    policy: inplace_core::Policy::builtin(),
    dispatcher: None,
});

fuzz_target!(|data: &[u8]| {
    let _ = decode_request::<CanUpdateMachineRequest>(data);
    let _ = decode_request::<CanUpdateMachineSetRequest>(data);
    let _ = decode_request::<UpdateMachineRequest>(data);
    let _ = can_update_machine(&ENGINE, data);
    let _ = can_update_machine_set(&ENGINE, data);
});

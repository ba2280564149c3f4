//! The policy file (`serve --policy`, `policy check`): any text must give a policy or a clear error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = inplace_core::Policy::from_yaml(text);
    }
});

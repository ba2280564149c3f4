//! The agent token file (`--agent-tokens`): any text must give entries or an error naming the line.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = inplace_updater::auth::parse_token_file("fuzz", text);
    }
});

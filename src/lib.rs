//! inplace-updater: a Cluster API runtime extension that answers CanUpdateMachine, CanUpdateMachineSet
//! and UpdateMachine, and performs accepted changes in place through an agent on each node.
//!
//! The binary (`src/main.rs`) only parses the command line. The data path, in the order a request flows:
//!
//! 1. [`server`] — TLS listeners, limits, health, metrics, shutdown; routes hook calls to [`hooks`] and agent
//!    calls (authenticated by [`server::auth`]) to [`dispatch`].
//! 2. [`api`] — CAPI's wire types: decoding with Go's field rules, `api::validate` (the object rules), answers.
//! 3. [`hooks`] — one function per hook: CanUpdate runs `inplace_core`'s diff, policy and patch and records a
//!    verdict; UpdateMachine builds the desired node state with [`plan`] and hands it to [`dispatch`].
//! 4. [`plan`] — the desired Machine and bootstrap config turned into ordered agent steps with a stable id.
//! 5. [`dispatch`] — the store-backed runs: verdicts and their licence, agent polls and reports, status.
//! 6. [`observe`] — fleet, store and process metrics beside the data path.
//!
//! Around it: [`cmd`] (the subcommands' glue: clap types, `status`, `diff`, `demo`, development certificates,
//! fatal-error printing) and [`fuzzing`] (the fuzz targets' bodies).

pub mod api;
pub mod cmd;
pub mod dispatch;
pub mod fuzzing;
pub mod hooks;
pub mod observe;
pub mod plan;
pub mod server;

/// Lower-case hex of `bytes` (digests in ids, store keys and token lines).
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_is_lower_case_two_digits_per_byte() {
        assert_eq!(super::hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(super::hex(&[]), "");
    }
}

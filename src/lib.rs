//! inplace-updater: a Cluster API runtime extension that answers CanUpdateMachine, CanUpdateMachineSet
//! and UpdateMachine, and performs accepted changes in place through an agent on each node.
//!
//! The binary (`src/main.rs`) only parses the command line; everything else lives here:
//! [`api`] (wire types), [`hooks`] (one function per hook), [`server`] (TLS, limits, health, metrics,
//! shutdown), [`observe`] (fleet, store and process metrics), [`fatal`] (one-line fatal errors), [`certs`]
//! (development certificates), [`cli`] (clap types).

pub mod api;
pub mod auth;
pub mod certs;
pub mod cli;
pub mod commands;
pub mod diffcmd;
pub mod dispatch;
pub mod fatal;
pub mod fuzzing;
pub mod hooks;
pub mod http;
pub mod observe;
pub mod server;

pub mod demo;
pub mod plan;

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

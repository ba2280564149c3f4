//! Lower-case hex of digests: a leaf module, so that the drivers, the HTTPS client and the artifact store
//! share it without importing one another.

/// Lower-case hex of `bytes` (digests).
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

//! Fingerprints of a normalised spec: one short hash per leaf, keyed by the same paths the diff and the
//! CanUpdate messages use (`spec.files[path=/etc/x].content`, `spec.users[name=u].sshAuthorizedKeys[0]`). Only
//! paths and hashes: a verdict record never holds a file's content, a key or a token. A map over
//! [`MAX_FINGERPRINT_BYTES`] falls back to one hash per top-level field, and that, if still too big, to one
//! hash of the whole spec.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::diff::{keyed_list_field, list_keys};
use crate::path::{push_field, push_index, push_key};

/// Hex digits of SHA-256 kept per fingerprint (64 bits: a chance collision between two values of one path
/// is out of reach, and no value can be read back from it).
pub const FINGERPRINT_HEX: usize = 16;

/// Most bytes one object's fingerprint map may take as JSON in a verdict record (paths, hashes, quoting).
/// Above it the map is coarsened ([`Granularity`]); three objects at the bound keep a record far below the
/// store's per-record limit.
pub const MAX_FINGERPRINT_BYTES: usize = 96 * 1024;

/// Domain separation: these hashes are of (path, value), never comparable with other hashes of a value.
const DOMAIN: &[u8] = b"inplace-updater/verdict/v1\0";

/// How fine a fingerprint map is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Granularity {
    /// One entry per leaf value, plus one per keyed list for the order of its items.
    Leaves,
    /// One entry per top-level member of the spec (`spec.files`, `spec.ntp`).
    Fields,
    /// One entry, `spec`, for the whole spec.
    Whole,
}

/// Path → fingerprint.
pub type FingerprintMap = BTreeMap<String, String>;

pub(crate) use crate::hex;

/// The first [`FINGERPRINT_HEX`] hex digits of `digest`.
fn short_hex(digest: &[u8]) -> String {
    hex(digest.get(..FINGERPRINT_HEX / 2).unwrap_or(digest))
}

/// Feeds what is written into a hash.
struct HashWriter<'h>(&'h mut Sha256);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The fingerprint of the value at `path`: SHA-256 over the domain, the path and the value's compact JSON,
/// streamed (no copy of the value is made).
fn print(path: &str, value: &Value) -> String {
    let mut hash = Sha256::new();
    hash.update(DOMAIN);
    hash.update(path.as_bytes());
    hash.update(b"\0");
    // Writing JSON into a hash cannot fail: the writer never errs and a `Value` always serialises.
    let _ = serde_json::to_writer(HashWriter(&mut hash), value);
    short_hex(&hash.finalize())
}

/// The fingerprint map of a normalised spec at `granularity` (no bound applied).
pub fn fingerprints_at(spec: &Value, granularity: Granularity) -> FingerprintMap {
    let empty = match spec {
        Value::Object(map) => map.is_empty(),
        Value::Null => true,
        _ => false,
    };
    let mut out = FingerprintMap::new();
    if empty {
        return out;
    }
    let mut path = String::from("spec");
    match (granularity, spec) {
        (Granularity::Leaves, _) => walk(&mut path, None, spec, &mut out),
        (Granularity::Fields, Value::Object(map)) => {
            for (name, value) in map {
                push_field(&mut path, name, false);
                let fingerprint = print(&path, value);
                out.insert(path.clone(), fingerprint);
                path.truncate("spec".len());
            }
        }
        _ => {
            let fingerprint = print(&path, spec);
            out.insert(path, fingerprint);
        }
    }
    out
}

/// Every leaf below `path` (shown as [`crate::path::Path`] shows it, built in place): a fingerprint per
/// non-container value and per empty object or list, keyed lists addressed by key, plus one entry per keyed
/// list (at the list's own path) for the order of its keys, since a reorder is a change the diff reports.
/// `member` is the name of the member `value` is, when it is one.
fn walk(path: &mut String, member: Option<&str>, value: &Value, out: &mut FingerprintMap) {
    let len = path.len();
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (name, item) in map {
                push_field(path, name, false);
                walk(path, Some(name), item, out);
                path.truncate(len);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            let keyed = member
                .and_then(keyed_list_field)
                .and_then(|key| Some((key, list_keys(items, key)?)));
            match keyed {
                Some((key, keys)) => {
                    let order = print(&format!("{path}\0order"), &Value::from(keys.clone()));
                    out.insert(path.clone(), order);
                    for (item, k) in items.iter().zip(keys) {
                        push_key(path, key, k);
                        walk(path, None, item, out);
                        path.truncate(len);
                    }
                }
                None => {
                    for (i, item) in items.iter().enumerate() {
                        push_index(path, i);
                        walk(path, None, item, out);
                        path.truncate(len);
                    }
                }
            }
        }
        _ => {
            let fingerprint = print(path, value);
            out.insert(path.clone(), fingerprint);
        }
    }
}

/// Bytes a map takes as JSON members (`"path":"hash",`): quotes, escapes (at most 6 bytes a character) and
/// the hash. Counted per byte: a character of several bytes in UTF-8 is never escaped, so it counts its bytes.
fn json_bytes(map: &FingerprintMap) -> usize {
    map.keys()
        .map(|path| {
            let quoted: usize = path
                .bytes()
                .map(|b| match b {
                    b'"' | b'\\' => 2,
                    b if b < 0x20 => 6,
                    _ => 1,
                })
                .sum();
            quoted + 2 + FINGERPRINT_HEX + 4
        })
        .sum()
}

/// The finest fingerprint map of a normalised spec that fits [`MAX_FINGERPRINT_BYTES`].
pub fn fingerprints(spec: &Value) -> (Granularity, FingerprintMap) {
    for granularity in [Granularity::Leaves, Granularity::Fields] {
        let map = fingerprints_at(spec, granularity);
        if json_bytes(&map) <= MAX_FINGERPRINT_BYTES {
            return (granularity, map);
        }
    }
    (
        Granularity::Whole,
        fingerprints_at(spec, Granularity::Whole),
    )
}

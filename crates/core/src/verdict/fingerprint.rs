//! Fingerprints of a normalised spec: one short hash per leaf, keyed by the same paths the diff and the
//! CanUpdate messages use (`spec.files[path=/etc/x].content`, `spec.users[name=u].sshAuthorizedKeys[0]`). Only
//! paths and hashes: a verdict record never holds a file's content, a key or a token. A map over
//! [`MAX_FINGERPRINT_BYTES`] falls back to one hash per top-level field, and that, if still too big, to one
//! hash of the whole spec.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::diff::{keyed_items, leaves};
use crate::path::{Path, Seg};

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

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|byte| [HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 15)]])
        .map(char::from)
        .collect()
}

/// The first [`FINGERPRINT_HEX`] hex digits of `digest`.
fn short_hex(digest: &[u8]) -> String {
    hex(digest.get(..FINGERPRINT_HEX / 2).unwrap_or(digest))
}

/// The fingerprint of the value at `path`.
fn print(path: &str, value: &Value) -> String {
    let mut hash = Sha256::new();
    hash.update(DOMAIN);
    hash.update(path.as_bytes());
    hash.update(b"\0");
    hash.update(value.to_string().as_bytes());
    short_hex(&hash.finalize())
}

/// The fingerprint map of a normalised spec at `granularity` (no bound applied).
pub fn fingerprints_at(spec: &Value, granularity: Granularity) -> FingerprintMap {
    entries(spec, granularity)
        .into_iter()
        .map(|(path, print)| (path.to_string(), print))
        .collect()
}

/// The entries of [`fingerprints_at`] with their structured paths.
fn entries(spec: &Value, granularity: Granularity) -> Vec<(Path, String)> {
    let mut out = Vec::new();
    let empty = match spec {
        Value::Object(map) => map.is_empty(),
        Value::Null => true,
        _ => false,
    };
    if empty {
        return out;
    }
    let root = Path::spec();
    let mut add = |path: Path, value: &Value| {
        let fingerprint = print(&path.to_string(), value);
        out.push((path, fingerprint));
    };
    match (granularity, spec) {
        (Granularity::Leaves, _) => {
            let mut found = Vec::new();
            leaves(&root, spec, &mut found);
            for (path, value) in found {
                add(path, value);
            }
            orders(&root, spec, &mut out);
        }
        (Granularity::Fields, Value::Object(map)) => {
            for (name, value) in map {
                add(root.child(Seg::Field(name.clone())), value);
            }
        }
        _ => add(root, spec),
    }
    out
}

/// One entry per keyed list (`spec.files`) for the order of its keys: a reorder is a change the diff reports.
fn orders(path: &Path, value: &Value, out: &mut Vec<(Path, String)>) {
    match value {
        Value::Object(map) => {
            for (name, member) in map {
                orders(&path.child(Seg::Field(name.clone())), member, out);
            }
        }
        Value::Array(items) => match keyed_items(path, items) {
            Some((key, keys)) => {
                let order = format!("{path}\0order");
                out.push((path.clone(), print(&order, &Value::from(keys.clone()))));
                for (item, k) in items.iter().zip(keys) {
                    let seg = Seg::Key {
                        field: key.to_owned(),
                        value: k.to_owned(),
                    };
                    orders(&path.child(seg), item, out);
                }
            }
            None => {
                for (i, item) in items.iter().enumerate() {
                    orders(&path.child(Seg::Index(i)), item, out);
                }
            }
        },
        _ => {}
    }
}

/// Bytes a map takes as JSON members (`"path":"hash",`).
fn json_bytes(map: &FingerprintMap) -> usize {
    map.keys()
        .map(|path| {
            serde_json::to_string(path).map_or(path.len() * 6, |quoted| quoted.len())
                + FINGERPRINT_HEX
                + 4
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

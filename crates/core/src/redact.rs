//! How values are shown to people: secrets (file contents, passwords, tokens, anything under
//! `contentFrom`) become a short sha256 hash, long values are cut.

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;

use crate::path::{Path, Seg};

/// Longest rendering of a value in a diff, in characters, before it is cut with `…`.
pub const MAX_SHOWN_CHARS: usize = 160;

/// Hex digits of sha256 shown for a secret (48 bits: enough to tell two values apart).
pub const SHORT_HASH_HEX: usize = 12;

/// Member names whose values are treated as secret wherever they appear.
const SECRET_NAMES: &[&str] = &[
    "content",
    "passwd",
    "contentFrom",
    "userData",
    "certificateKey",
];

/// Fragments that make a member name (or an extra-arg name) secret, compared lowercase.
const SECRET_FRAGMENTS: &[&str] = &["password", "secret", "token", "privatekey", "credential"];

/// Whether a member (or `--flag`) called `name` holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    if SECRET_NAMES.contains(&name) {
        return true;
    }
    let lower = name.to_ascii_lowercase();
    SECRET_FRAGMENTS.iter().any(|f| lower.contains(f))
}

/// Whether the value at `path` is (or lies inside) a secret.
pub fn is_secret_path(path: &Path) -> bool {
    let segs = &path.0;
    segs.iter().enumerate().any(|(i, seg)| match seg {
        Seg::Field(name) => is_secret_name(name),
        // An extra arg such as `[name=oidc-client-secret].value`.
        Seg::Key { field, value } => {
            field == "name"
                && is_secret_name(value)
                && matches!(segs.get(i + 1), Some(Seg::Field(f)) if f == "value")
        }
        Seg::Index(_) => false,
    })
}

/// `sha256:` and the first [`SHORT_HASH_HEX`] hex digits of the value (of a string's bytes, so it
/// matches `printf %s "$content" | sha256sum`; of compact JSON otherwise).
pub fn short_hash(value: &Value) -> String {
    let digest = match value {
        Value::String(s) => Sha256::digest(s.as_bytes()),
        other => Sha256::digest(other.to_string().as_bytes()),
    };
    let mut out = String::from("sha256:");
    for byte in digest.iter().take(SHORT_HASH_HEX / 2) {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// The value at `path` as compact JSON with secrets hashed, cut to [`MAX_SHOWN_CHARS`].
pub fn show(path: &Path, value: &Value) -> String {
    if is_secret_path(path) {
        return short_hash(value);
    }
    let mut out = String::new();
    write_value(&mut out, value);
    cut(out)
}

fn cut(mut s: String) -> String {
    if s.chars().count() > MAX_SHOWN_CHARS {
        let end = s
            .char_indices()
            .nth(MAX_SHOWN_CHARS)
            .map_or(s.len(), |(i, _)| i);
        s.truncate(end);
        s.push('…');
    }
    s
}

fn write_value(out: &mut String, value: &Value) {
    // Stop early: everything past the limit is cut anyway.
    if out.len() > MAX_SHOWN_CHARS * 4 {
        return;
    }
    match value {
        Value::Object(map) => {
            let secret_arg = map
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(is_secret_name);
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if is_secret_name(k) || (secret_arg && k == "value") {
                    out.push_str(&Value::String(short_hash(v)).to_string());
                } else {
                    write_value(out, v);
                }
                if out.len() > MAX_SHOWN_CHARS * 4 {
                    break;
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, v);
                if out.len() > MAX_SHOWN_CHARS * 4 {
                    break;
                }
            }
            out.push(']');
        }
        Value::String(s) if s.len() > MAX_SHOWN_CHARS * 4 => {
            let end = s
                .char_indices()
                .nth(MAX_SHOWN_CHARS)
                .map_or(s.len(), |(i, _)| i);
            out.push_str(&Value::String(s[..end].to_owned()).to_string());
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(segs: &[Seg]) -> Path {
        let mut path = Path::spec();
        for s in segs {
            path = path.child(s.clone());
        }
        path
    }

    #[test]
    fn secrets_are_hashed_everywhere() {
        let file = p(&[
            Seg::Field("files".into()),
            Seg::Key {
                field: "path".into(),
                value: "/etc/x".into(),
            },
        ]);
        let item = json!({"path": "/etc/x", "content": "hunter2", "contentFrom": {"secret": {"name": "s", "key": "k"}}});
        let shown = show(&file, &item);
        assert!(
            !shown.contains("hunter2") && !shown.contains("\"s\""),
            "{shown}"
        );
        assert!(shown.contains(&short_hash(&json!("hunter2"))));
        let content = file.child(Seg::Field("content".into()));
        assert_eq!(
            show(&content, &json!("hunter2")),
            short_hash(&json!("hunter2"))
        );
        let arg = p(&[
            Seg::Field("extraArgs".into()),
            Seg::Key {
                field: "name".into(),
                value: "oidc-client-secret".into(),
            },
            Seg::Field("value".into()),
        ]);
        assert!(show(&arg, &json!("abc")).starts_with("sha256:"));
        let args = json!([{"name": "bootstrap-token", "value": "abcdef.0123456789abcdef"}]);
        assert!(!show(&p(&[Seg::Field("extraArgs".into())]), &args).contains("0123456789"));
    }

    #[test]
    fn hash_of_string_matches_sha256sum() {
        // printf %s abc | sha256sum
        assert_eq!(short_hash(&json!("abc")), "sha256:ba7816bf8f01");
    }

    #[test]
    fn long_values_are_cut() {
        let long = "x".repeat(10_000);
        let shown = show(&p(&[Seg::Field("note".into())]), &json!(long));
        assert!(shown.chars().count() <= MAX_SHOWN_CHARS + 1 && shown.ends_with('…'));
        assert_eq!(
            show(&p(&[Seg::Field("version".into())]), &json!("v1.2.3")),
            "\"v1.2.3\""
        );
    }
}

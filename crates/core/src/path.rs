//! Field paths into an object's spec, as the diff reports them and the policy matches them.
//!
//! A [`Path`] always starts at the Machine-level `spec` (for a template, `spec.template.spec` is written
//! `spec` here, so rules written for a Machine apply to a MachineSet unchanged). It is shown as
//! `spec.files[path=/etc/x].content`, `spec.users[name=capi].sshAuthorizedKeys[0]`, `spec["odd.key"]`.

use serde_json::Value;
use std::collections::HashMap;
use std::fmt::{self, Write as _};

use crate::objects::Scope;

/// One step of a [`Path`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Seg {
    /// A member of an object.
    Field(String),
    /// An item of a list compared by position.
    Index(usize),
    /// An item of a list whose items have identity: the item whose `field` equals `value`.
    Key {
        /// The identifying member, e.g. `path` for `files`.
        field: String,
        /// Its value, e.g. `/etc/kubernetes/audit-policy.yaml`.
        value: String,
    },
}

/// A field path starting with the `spec` segment.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Path(pub Vec<Seg>);

impl Path {
    /// The path of the spec itself (`spec`).
    pub fn spec() -> Path {
        Path(vec![Seg::Field("spec".to_owned())])
    }

    /// This path with one more segment.
    pub fn child(&self, seg: Seg) -> Path {
        let mut segs = Vec::with_capacity(self.0.len() + 1);
        segs.extend_from_slice(&self.0);
        segs.push(seg);
        Path(segs)
    }

    /// The segments below `spec` (the path relative to the spec value).
    pub fn below_spec(&self) -> &[Seg] {
        self.0.get(1..).unwrap_or(&[])
    }

    /// The last segment, if any.
    pub fn last(&self) -> Option<&Seg> {
        self.0.last()
    }

    /// Whether `self` equals `other` or lies below it.
    pub fn starts_with(&self, other: &Path) -> bool {
        self.0.starts_with(&other.0)
    }

    /// Looks the path up in a spec value (the value at `spec`, or `spec.template.spec` for templates).
    pub fn resolve<'v>(&self, spec: Option<&'v Value>) -> Option<&'v Value> {
        resolve_segs(spec, self.below_spec())
    }

    /// The path as an operator reads it for an object of `scope`: templates show `spec.template.spec…`.
    pub fn display_in(&self, scope: Scope) -> String {
        let mut out = String::new();
        for (i, seg) in self.0.iter().enumerate() {
            write_seg(&mut out, seg, i == 0);
            if i == 0 && scope == Scope::Template {
                out.push_str(".template.spec");
            }
        }
        out
    }
}

impl Path {
    /// The segments after the first `n`, shown relative to them (`contentFrom.secret.key`, `[0]`).
    pub fn display_tail(&self, n: usize) -> String {
        let mut out = String::new();
        for (i, seg) in self.0.iter().skip(n).enumerate() {
            write_seg(&mut out, seg, i == 0);
        }
        out
    }
}

/// Looks `segs` up below `root`.
pub fn resolve_segs<'v>(root: Option<&'v Value>, segs: &[Seg]) -> Option<&'v Value> {
    let mut cur = root?;
    for seg in segs {
        cur = match (seg, cur) {
            (Seg::Field(name), Value::Object(map)) => map.get(name)?,
            (Seg::Index(i), Value::Array(items)) => items.get(*i)?,
            (Seg::Key { field, value }, Value::Array(items)) => items
                .iter()
                .find(|item| item.get(field).and_then(Value::as_str) == Some(value.as_str()))?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Resolves many paths in the same values: the items of a keyed list are indexed once per list,
/// where [`Path::resolve`] scans the list every time (quadratic for thousands of changed items).
#[derive(Default)]
pub struct Resolver<'v> {
    // (address of the list value, key member) → key → first item with it. The values are borrowed
    // for 'v, so an address cannot be reused for another list while the resolver lives.
    index: HashMap<(usize, String), HashMap<&'v str, &'v Value>>,
}

impl<'v> Resolver<'v> {
    /// An empty resolver.
    pub fn new() -> Resolver<'v> {
        Resolver::default()
    }

    /// Like [`Path::resolve`].
    pub fn resolve(&mut self, spec: Option<&'v Value>, path: &Path) -> Option<&'v Value> {
        let mut cur = spec?;
        for seg in path.below_spec() {
            cur = match (seg, cur) {
                (Seg::Field(name), Value::Object(map)) => map.get(name)?,
                (Seg::Index(i), Value::Array(items)) => items.get(*i)?,
                (Seg::Key { field, value }, Value::Array(items)) => {
                    let id = (std::ptr::from_ref(cur) as usize, field.clone());
                    let index = self.index.entry(id).or_insert_with(|| {
                        let mut index = HashMap::with_capacity(items.len());
                        for item in items {
                            if let Some(k) = item.get(field).and_then(Value::as_str) {
                                index.entry(k).or_insert(item);
                            }
                        }
                        index
                    });
                    *index.get(value.as_str())?
                }
                _ => return None,
            };
        }
        Some(cur)
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display_in(Scope::Object))
    }
}

impl fmt::Debug for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Path({self})")
    }
}

impl serde::Serialize for Path {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Whether a field name can be shown bare (`spec.name`) rather than quoted (`spec["a.b"]`).
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "*"
        && name != "**"
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '$' || c == '@')
}

/// Whether a list-key value can be shown bare (`[path=/etc/x]`) rather than quoted.
pub(crate) fn is_plain_key_value(value: &str) -> bool {
    !value.is_empty()
        && !value.starts_with(char::is_whitespace)
        && !value.ends_with(char::is_whitespace)
        && !value.contains(['[', ']', '"', '\\'])
}

fn write_seg(out: &mut String, seg: &Seg, first: bool) {
    match seg {
        Seg::Field(name) => push_field(out, name, first),
        Seg::Index(i) => push_index(out, *i),
        Seg::Key { field, value } => push_key(out, field, value),
    }
}

/// Appends a member segment as [`Path`] shows it (`.name`, or `["odd.name"]`; no dot when `first`).
pub(crate) fn push_field(out: &mut String, name: &str, first: bool) {
    if is_plain_name(name) {
        if !first {
            out.push('.');
        }
        out.push_str(name);
    } else {
        out.push('[');
        out.push_str(&quote(name));
        out.push(']');
    }
}

/// Appends a list position segment (`[2]`).
pub(crate) fn push_index(out: &mut String, index: usize) {
    let _ = write!(out, "[{index}]");
}

/// Appends a keyed-list item segment (`[path=/etc/x]`, or `[name="odd]"]`).
pub(crate) fn push_key(out: &mut String, field: &str, value: &str) {
    out.push('[');
    out.push_str(field);
    out.push('=');
    if is_plain_key_value(value) {
        out.push_str(value);
    } else {
        out.push_str(&quote(value));
    }
    out.push(']');
}

/// A JSON string literal for `s` (the quoting used in paths).
fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// Appends one RFC 6901 reference token (`~` → `~0`, `/` → `~1`) to a JSON Pointer.
pub fn push_pointer_token(pointer: &mut String, token: &str) {
    pointer.push('/');
    for c in token.chars() {
        match c {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            c => pointer.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(field: &str, value: &str) -> Seg {
        Seg::Key {
            field: field.into(),
            value: value.into(),
        }
    }

    #[test]
    fn shows_keyed_indexed_and_quoted_segments() {
        let p = Path::spec()
            .child(Seg::Field("files".into()))
            .child(key("path", "/etc/kubernetes/audit.yaml"))
            .child(Seg::Field("content".into()));
        assert_eq!(
            p.to_string(),
            "spec.files[path=/etc/kubernetes/audit.yaml].content"
        );
        assert_eq!(
            p.display_in(Scope::Template),
            "spec.template.spec.files[path=/etc/kubernetes/audit.yaml].content"
        );
        let q = Path::spec()
            .child(Seg::Field("a.b".into()))
            .child(Seg::Index(2))
            .child(key("name", "x]y"));
        assert_eq!(q.to_string(), r#"spec["a.b"][2][name="x]y"]"#);
        assert_eq!(
            p.display_tail(2),
            "[path=/etc/kubernetes/audit.yaml].content"
        );
        assert_eq!(p.display_tail(3), "content");
    }

    #[test]
    fn resolves_keys_and_indices() {
        let spec = json!({"users": [{"name": "a", "keys": ["k1", "k2"]}, {"name": "b"}]});
        let p = Path::spec()
            .child(Seg::Field("users".into()))
            .child(key("name", "a"))
            .child(Seg::Field("keys".into()))
            .child(Seg::Index(1));
        assert_eq!(p.resolve(Some(&spec)), Some(&json!("k2")));
        let mut r = Resolver::new();
        assert_eq!(r.resolve(Some(&spec), &p), Some(&json!("k2")));
        let b = Path::spec()
            .child(Seg::Field("users".into()))
            .child(key("name", "b"));
        assert_eq!(r.resolve(Some(&spec), &b), Some(&json!({"name": "b"})));
        let missing = Path::spec()
            .child(Seg::Field("users".into()))
            .child(key("name", "zz"));
        assert_eq!(missing.resolve(Some(&spec)), None);
    }

    #[test]
    fn escapes_pointer_tokens() {
        let mut ptr = String::new();
        push_pointer_token(&mut ptr, "a/b~c");
        assert_eq!(ptr, "/a~1b~0c");
    }
}

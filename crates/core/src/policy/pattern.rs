//! Path patterns of policy rules: `spec.files[path=/etc/*].content`, `spec.users[*].sshAuthorizedKeys`,
//! `spec.**`. A pattern covers the paths it matches and everything below them.

use std::fmt;

use crate::path::{Path, Seg};

/// One step of a [`Pattern`].
#[derive(Clone, Debug, PartialEq, Eq)]
enum PSeg {
    /// A field name glob (`*` matches any run of characters; a lone `*` any one name).
    Field(String),
    /// `**`: any number of segments, including none.
    AnyDepth,
    /// `[*]`: any one list item.
    AnyItem,
    /// `[3]`.
    Index(usize),
    /// `[path=/etc/*]`: an item of a keyed list whose key member `field` matches the glob.
    Key { field: String, glob: String },
}

/// A parsed path pattern.
#[derive(Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    segs: Vec<PSeg>,
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pattern({})", self.text)
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Pattern {
    /// Parses a pattern; the error says what is wrong and where.
    pub fn parse(text: &str) -> Result<Pattern, String> {
        let segs = parse_segs(text)?;
        if segs.is_empty() {
            return Err("empty pattern".to_owned());
        }
        Ok(Pattern {
            text: text.to_owned(),
            segs,
        })
    }

    /// Whether the pattern matches `path` or one of its ancestors (a rule for `spec.ntp` covers
    /// `spec.ntp.servers[0]`).
    pub fn covers(&self, path: &Path) -> bool {
        covers(&self.segs, &path.0)
    }
}

fn covers(p: &[PSeg], s: &[Seg]) -> bool {
    let Some((first, rest)) = p.split_first() else {
        return true;
    };
    if *first == PSeg::AnyDepth {
        return (0..=s.len()).any(|skip| covers(rest, &s[skip..]));
    }
    let Some((seg, srest)) = s.split_first() else {
        return false;
    };
    let one = match (first, seg) {
        (PSeg::Field(glob), Seg::Field(name)) => glob_match(glob, name),
        (PSeg::AnyItem, Seg::Index(_) | Seg::Key { .. }) => true,
        (PSeg::Index(i), Seg::Index(j)) => i == j,
        (PSeg::Key { field, glob }, Seg::Key { field: f, value }) => {
            field == f && glob_match(glob, value)
        }
        _ => false,
    };
    one && covers(rest, srest)
}

/// `*` matches any run of characters (including `/` and `.`); everything else matches itself.
pub fn glob_match(glob: &str, text: &str) -> bool {
    if !glob.contains('*') {
        return glob == text;
    }
    if glob == "*" {
        return true;
    }
    // Byte-wise is exact for UTF-8: `*` is ASCII and literal runs compare byte for byte.
    let (g, t) = (glob.as_bytes(), text.as_bytes());
    let (mut gi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if gi < g.len() && g[gi] == b'*' {
            star = Some((gi, ti));
            gi += 1;
        } else if gi < g.len() && g[gi] == t[ti] {
            gi += 1;
            ti += 1;
        } else if let Some((sg, st)) = star {
            gi = sg + 1;
            ti = st + 1;
            star = Some((sg, st + 1));
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|c| *c == b'*')
}

fn parse_segs(text: &str) -> Result<Vec<PSeg>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut segs = Vec::new();
    let mut i = 0;
    let mut expect_name = true;
    while i < chars.len() {
        match chars[i] {
            '.' => {
                if expect_name {
                    return Err(format!("empty field name at character {}", i + 1));
                }
                expect_name = true;
                i += 1;
            }
            '[' => {
                let (seg, next) = parse_bracket(&chars, i)?;
                segs.push(seg);
                i = next;
                expect_name = false;
            }
            _ => {
                let start = i;
                while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                    if chars[i] == ']' {
                        return Err(format!("unexpected ']' at character {}", i + 1));
                    }
                    i += 1;
                }
                let name: String = chars[start..i].iter().collect();
                segs.push(if name == "**" {
                    PSeg::AnyDepth
                } else {
                    PSeg::Field(name)
                });
                expect_name = false;
            }
        }
    }
    if expect_name && !segs.is_empty() {
        return Err("pattern ends with '.'".to_owned());
    }
    Ok(segs)
}

/// Parses `[...]` starting at `open`; returns the segment and the index after `]`.
fn parse_bracket(chars: &[char], open: usize) -> Result<(PSeg, usize), String> {
    let mut i = open + 1;
    if chars.get(i) == Some(&'"') {
        let (name, next) = parse_quoted(chars, i)?;
        return close(chars, next, PSeg::Field(name));
    }
    let start = i;
    while i < chars.len() && chars[i] != ']' && chars[i] != '=' {
        i += 1;
    }
    let head: String = chars[start..i].iter().collect();
    match chars.get(i) {
        Some(']') if head == "*" => Ok((PSeg::AnyItem, i + 1)),
        Some(']') => head
            .parse::<usize>()
            .map(|n| (PSeg::Index(n), i + 1))
            .map_err(|_| format!("'[{head}]' is neither [*], an index nor [key=value]")),
        Some('=') => {
            if head.is_empty() {
                return Err(format!(
                    "missing key name before '=' at character {}",
                    i + 1
                ));
            }
            i += 1;
            if chars.get(i) == Some(&'"') {
                let (glob, next) = parse_quoted(chars, i)?;
                return close(chars, next, PSeg::Key { field: head, glob });
            }
            let vstart = i;
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            let glob: String = chars[vstart..i].iter().collect();
            close(chars, i, PSeg::Key { field: head, glob })
        }
        _ => Err(format!("unclosed '[' at character {}", open + 1)),
    }
}

fn close(chars: &[char], at: usize, seg: PSeg) -> Result<(PSeg, usize), String> {
    if chars.get(at) == Some(&']') {
        Ok((seg, at + 1))
    } else {
        Err(format!("expected ']' at character {}", at + 1))
    }
}

/// Parses a JSON string literal starting at `start` (a `"`); returns it and the index after it.
fn parse_quoted(chars: &[char], start: usize) -> Result<(String, usize), String> {
    let mut i = start + 1;
    let mut escaped = false;
    while i < chars.len() {
        match chars[i] {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => {
                let literal: String = chars[start..=i].iter().collect();
                let s = serde_json::from_str::<String>(&literal)
                    .map_err(|e| format!("bad quoted name {literal}: {e}"))?;
                return Ok((s, i + 1));
            }
            _ => escaped = false,
        }
        i += 1;
    }
    Err(format!("unterminated quote at character {}", start + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(text: &[Seg]) -> Path {
        let mut p = Path::spec();
        for s in text {
            p = p.child(s.clone());
        }
        p
    }
    fn f(n: &str) -> Seg {
        Seg::Field(n.into())
    }
    fn k(field: &str, v: &str) -> Seg {
        Seg::Key {
            field: field.into(),
            value: v.into(),
        }
    }

    #[test]
    fn covers_descendants_and_globs() {
        let content = path(&[
            f("files"),
            k("path", "/etc/kubernetes/a.yaml"),
            f("content"),
        ]);
        assert!(Pattern::parse("spec.files").unwrap().covers(&content));
        assert!(
            Pattern::parse("spec.files[*].content")
                .unwrap()
                .covers(&content)
        );
        assert!(
            Pattern::parse("spec.files[path=/etc/kubernetes/*]")
                .unwrap()
                .covers(&content)
        );
        assert!(
            !Pattern::parse("spec.files[path=/opt/*]")
                .unwrap()
                .covers(&content)
        );
        assert!(
            !Pattern::parse("spec.files[name=*]")
                .unwrap()
                .covers(&content)
        );
        assert!(Pattern::parse("spec.**.content").unwrap().covers(&content));
        assert!(Pattern::parse("**").unwrap().covers(&content));
        assert!(Pattern::parse("spec.*").unwrap().covers(&content));
        assert!(!Pattern::parse("spec.*.x").unwrap().covers(&content));
        assert!(
            Pattern::parse("spec.*Configuration.etcd")
                .unwrap()
                .covers(&path(&[f("clusterConfiguration"), f("etcd"), f("local")]))
        );
        assert!(
            !Pattern::parse("spec.files[*].contentFrom")
                .unwrap()
                .covers(&content)
        );
        let key0 = path(&[
            f("users"),
            k("name", "capi"),
            f("sshAuthorizedKeys"),
            Seg::Index(0),
        ]);
        assert!(
            Pattern::parse("spec.users[*].sshAuthorizedKeys")
                .unwrap()
                .covers(&key0)
        );
        assert!(
            Pattern::parse("spec.users[name=capi].sshAuthorizedKeys[0]")
                .unwrap()
                .covers(&key0)
        );
        assert!(
            !Pattern::parse("spec.users[name=capi].sshAuthorizedKeys[1]")
                .unwrap()
                .covers(&key0)
        );
        // A pattern longer than the path does not cover it.
        assert!(
            !Pattern::parse("spec.users[*].sshAuthorizedKeys")
                .unwrap()
                .covers(&path(&[f("users")]))
        );
    }

    #[test]
    fn quoted_names_and_values() {
        let p = path(&[f("a.b"), k("path", "/x]y")]);
        assert!(
            Pattern::parse(r#"spec["a.b"][path="/x]y"]"#)
                .unwrap()
                .covers(&p)
        );
    }

    #[test]
    fn bad_patterns_are_explained() {
        for bad in [
            "",
            "spec..x",
            "spec.",
            "spec[",
            "spec[x]",
            "spec[=a]",
            "spec]",
            r#"spec["a"#,
        ] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn glob() {
        assert!(glob_match("*", ""));
        assert!(glob_match("a*c", "abbbc"));
        assert!(glob_match("/etc/*.yaml", "/etc/k/a.yaml"));
        assert!(!glob_match("a*c", "abd"));
        assert!(glob_match("capi", "capi"));
        assert!(glob_match("/é*/x", "/étoile/x"));
        assert!(!glob_match("a", "b"));
    }
}

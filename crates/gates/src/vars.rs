//! `{{node}}`, `{{cluster}}` and `{{namespace}}` in a query or matcher: what a per-node gate asks about.

/// The Machine a gate is evaluated for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vars {
    /// The Machine's Node name (`{{node}}`).
    pub node: String,
    /// The Machine's Cluster name (`{{cluster}}`).
    pub cluster: String,
    /// The Machine's namespace (`{{namespace}}`).
    pub namespace: String,
}

/// The placeholders a template may use.
const PLACEHOLDERS: [&str; 3] = ["node", "cluster", "namespace"];

impl Vars {
    fn get(&self, name: &str) -> Option<&str> {
        match name {
            "node" => Some(&self.node),
            "cluster" => Some(&self.cluster),
            "namespace" => Some(&self.namespace),
            _ => None,
        }
    }

    /// `template` with every placeholder replaced. A value is escaped for a double-quoted PromQL or matcher
    /// string (`\` and `"`), where placeholders belong: `node="{{node}}"`.
    pub fn fill(&self, template: &str) -> String {
        let mut out = String::with_capacity(template.len());
        let mut rest = template;
        while let Some(start) = rest.find("{{") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            match after
                .find("}}")
                .and_then(|end| Some((self.get(after[..end].trim())?, end)))
            {
                Some((value, end)) => {
                    for c in value.chars() {
                        if c == '\\' || c == '"' {
                            out.push('\\');
                        }
                        out.push(c);
                    }
                    rest = &after[end + 2..];
                }
                None => {
                    out.push_str("{{");
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }
}

/// Refuses a template with a `{{…}}` that is not one of the placeholders (a typo would otherwise query for
/// the literal text and find nothing: a gate that always passes).
pub(crate) fn check_template(template: &str) -> Result<(), String> {
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            return Err("has `{{` without a closing `}}`".into());
        };
        let name = after[..end].trim();
        if !PLACEHOLDERS.contains(&name) {
            return Err(format!(
                "unknown placeholder {{{{{name}}}}}: use {{{{node}}}}, {{{{cluster}}}} or {{{{namespace}}}}"
            ));
        }
        rest = &after[end + 2..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vars {
        Vars {
            node: "edge-01".into(),
            cluster: "site-a".into(),
            namespace: "default".into(),
        }
    }

    #[test]
    fn fills_every_placeholder_and_escapes_quotes() {
        assert_eq!(
            vars().fill(r#"up{node="{{node}}",cluster="{{ cluster }}",ns="{{namespace}}"}"#),
            r#"up{node="edge-01",cluster="site-a",ns="default"}"#
        );
        let odd = Vars {
            node: r#"a"b\c"#.into(),
            ..vars()
        };
        assert_eq!(odd.fill(r#"x{n="{{node}}"}"#), r#"x{n="a\"b\\c"}"#);
        assert_eq!(vars().fill("no placeholders {{"), "no placeholders {{");
    }

    #[test]
    fn refuses_unknown_and_unclosed_placeholders() {
        assert!(check_template(r#"up{node="{{node}}"}"#).is_ok());
        let err = check_template(r#"up{node="{{nodename}}"}"#).unwrap_err();
        assert!(err.contains("{{nodename}}"), "{err}");
        assert!(check_template("up{{node").unwrap_err().contains("closing"));
    }
}

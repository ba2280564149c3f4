//! The pure text handling of the registry conversation: `WWW-Authenticate` challenge parameters, query
//! value encoding, and redirect targets.

/// `key="value"` (or `key=value`) from a challenge's parameters.
pub(crate) fn param(params: &str, key: &str) -> Option<String> {
    let mut rest = params;
    while !rest.is_empty() {
        let (name, after) = rest.split_once('=')?;
        let name = name.trim().trim_start_matches(',').trim();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"')?;
            (&quoted[..end], &quoted[end + 1..])
        } else {
            after.split_once(',').map_or((after, ""), |(v, n)| (v, n))
        };
        if name.eq_ignore_ascii_case(key) {
            return Some(value.trim().to_owned());
        }
        rest = next.trim_start_matches([',', ' ']);
    }
    None
}

/// Percent-encoding of a query value.
pub(crate) fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or_default()
}

/// A `Location` relative to `base`.
pub(crate) fn resolve(base: &str, location: &str) -> String {
    if location.contains("://") {
        location.to_owned()
    } else if location.starts_with('/') {
        let scheme = base.split_once("://").map_or("https", |(s, _)| s);
        format!("{scheme}://{}{location}", authority(base))
    } else {
        let dir = base.rsplit_once('/').map_or(base, |(d, _)| d);
        format!("{dir}/{location}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenge_parameters() {
        let p = r#"realm="https://auth.example/token",service="registry.example",scope="repository:k8s/x:pull""#;
        assert_eq!(
            param(p, "realm").as_deref(),
            Some("https://auth.example/token")
        );
        assert_eq!(param(p, "service").as_deref(), Some("registry.example"));
        assert_eq!(param(p, "scope").as_deref(), Some("repository:k8s/x:pull"));
        assert_eq!(
            param("realm=https://a/t,service=s", "service").as_deref(),
            Some("s")
        );
        assert_eq!(param(p, "missing"), None);
        assert_eq!(
            encode("repository:k8s/x:pull"),
            "repository%3Ak8s%2Fx%3Apull"
        );
    }

    #[test]
    fn redirects_resolve_against_the_request() {
        assert_eq!(
            resolve("https://r:1/v2/x/blobs/sha256:a", "/b?c"),
            "https://r:1/b?c"
        );
        assert_eq!(resolve("https://r:1/v2/x", "https://s3/y"), "https://s3/y");
        assert_eq!(resolve("https://r:1/v2/x", "y"), "https://r:1/v2/y");
        assert_eq!(authority("https://r:1/v2/x"), "r:1");
    }
}

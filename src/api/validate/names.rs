//! Kubernetes' name rules (k8s.io/apimachinery `validation.IsDNS1123Subdomain`, `IsDNS1123Label`,
//! `IsDNS1035Label`), as every object name, namespace, API group and kind is checked.

/// Longest object name (DNS-1123 subdomain).
pub const MAX_NAME_BYTES: usize = 253;
/// Longest namespace, API version or kind (DNS-1123 / DNS-1035 label).
pub const MAX_LABEL_BYTES: usize = 63;

/// What a valid object name looks like, for messages.
pub(super) const NAME_RULE: &str = "a Kubernetes object name (a DNS-1123 subdomain: at most 253 \
     lower-case letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit)";
/// What a valid namespace looks like, for messages.
pub(super) const LABEL_RULE: &str = "a Kubernetes namespace (a DNS-1123 label: at most 63 lower-case \
     letters, digits and '-', starting and ending with a letter or digit)";
/// What a valid kind looks like, for messages.
pub(super) const KIND_RULE: &str = "a kind (at most 63 letters, digits and '-', starting with a letter, ending with a letter or digit)";

fn alphanumeric(byte: u8) -> bool {
    byte.is_ascii_lowercase() || byte.is_ascii_digit()
}

/// A DNS-1123 label: 1..=63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn is_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    (1..=MAX_LABEL_BYTES).contains(&bytes.len())
        && bytes.iter().all(|&b| alphanumeric(b) || b == b'-')
        && bytes.first().is_some_and(|&b| alphanumeric(b))
        && bytes.last().is_some_and(|&b| alphanumeric(b))
}

/// A DNS-1123 subdomain: 1..=253 bytes of dot-separated parts, each `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
/// (so no `/`, no `..`, no upper case, no leading or trailing dot).
pub fn is_subdomain(text: &str) -> bool {
    (1..=MAX_NAME_BYTES).contains(&text.len())
        && text.split('.').all(|part| {
            let bytes = part.as_bytes();
            !bytes.is_empty()
                && bytes.iter().all(|&b| alphanumeric(b) || b == b'-')
                && bytes.first().is_some_and(|&b| alphanumeric(b))
                && bytes.last().is_some_and(|&b| alphanumeric(b))
        })
}

/// A kind: lower-cased, a DNS-1035 label (what the API server requires of a CRD's `names.kind`).
pub fn is_kind(text: &str) -> bool {
    let bytes = text.as_bytes();
    (1..=MAX_LABEL_BYTES).contains(&bytes.len())
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphabetic)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// `group/version` with a non-empty group (a DNS-1123 subdomain) and a version (a DNS-1123 label): the group
/// and version, or `None` for anything else (`v1` of the core group included).
pub fn group_version(api_version: &str) -> Option<(&str, &str)> {
    let (group, version) = api_version.split_once('/')?;
    (is_subdomain(group) && is_label(version)).then_some((group, version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_dns_1123_rules() {
        for good in ["m", "edge-01-cp-abcde", "a.b-c.d", &"a".repeat(253), "0"] {
            assert!(is_subdomain(good), "{good}");
        }
        for bad in [
            "",
            "../../etc",
            "a/b",
            "A",
            "a..b",
            ".a",
            "a.",
            "-a",
            "a-",
            "a_b",
            "é",
            &"a".repeat(254),
        ] {
            assert!(!is_subdomain(bad), "{bad}");
        }
        assert!(is_label("default") && is_label(&"n".repeat(63)));
        for bad in ["", "a.b", "Default", "-x", &"n".repeat(64)] {
            assert!(!is_label(bad), "{bad}");
        }
    }

    #[test]
    fn kinds_and_api_versions() {
        assert!(is_kind("KubeadmConfig") && is_kind("DevMachineTemplate"));
        for bad in [
            "",
            "1Machine",
            "Machine-",
            "Ma chine",
            "Ma/chine",
            &"K".repeat(64),
        ] {
            assert!(!is_kind(bad), "{bad}");
        }
        assert_eq!(
            group_version("cluster.x-k8s.io/v1beta2"),
            Some(("cluster.x-k8s.io", "v1beta2"))
        );
        for bad in [
            "v1",
            "/v1",
            "cluster.x-k8s.io/",
            "a/b/c",
            "Cluster.io/v1",
            "g/V1",
        ] {
            assert_eq!(group_version(bad), None, "{bad}");
        }
    }
}

//! The `kubernetes-upgrade` check: kubeadm upgrades one minor version at a time and never downgrades.

use std::cmp::Ordering;

/// A Kubernetes version as Machines carry it: `v1.34.1`, `v1.34.0-rc.1`, `v1.33.4+vmware.1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeVersion {
    /// Major.
    pub major: u64,
    /// Minor.
    pub minor: u64,
    /// Patch.
    pub patch: u64,
    /// Pre-release identifiers after `-` (empty for a release).
    pub pre: Vec<String>,
}

impl KubeVersion {
    /// Parses `v1.2.3[-pre][+build]` (the leading `v` is optional; build metadata is ignored).
    pub fn parse(text: &str) -> Option<KubeVersion> {
        let t = text.strip_prefix('v').unwrap_or(text);
        let t = t.split_once('+').map_or(t, |(v, _)| v);
        let (core, pre) = match t.split_once('-') {
            Some((core, pre)) => (core, pre.split('.').map(str::to_owned).collect::<Vec<_>>()),
            None => (t, Vec::new()),
        };
        if pre.iter().any(String::is_empty) {
            return None;
        }
        let mut nums = core.split('.').map(|n| {
            (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .then(|| n.parse::<u64>().ok())
                .flatten()
        });
        let (major, minor, patch) = (nums.next()??, nums.next()??, nums.next()??);
        if nums.next().is_some() {
            return None;
        }
        Some(KubeVersion {
            major,
            minor,
            patch,
            pre,
        })
    }

    /// Semantic-version precedence (build metadata has none).
    pub fn precedence(&self, other: &KubeVersion) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => cmp_pre(&self.pre, &other.pre),
            })
    }
}

fn cmp_pre(a: &[String], b: &[String]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let ord = match (x.parse::<u64>(), y.parse::<u64>()) {
            (Ok(m), Ok(n)) => m.cmp(&n),
            (Ok(_), Err(_)) => Ordering::Less,
            (Err(_), Ok(_)) => Ordering::Greater,
            (Err(_), Err(_)) => x.cmp(y),
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    a.len().cmp(&b.len())
}

/// Why a version change cannot be done by `kubeadm upgrade`, or `None` when it can: a patch
/// upgrade, or an upgrade to the next minor version.
pub fn upgrade_problem(current: Option<&str>, desired: Option<&str>) -> Option<String> {
    let (Some(cur_text), Some(des_text)) = (current, desired) else {
        return Some("a Machine version can only be changed, not added or removed".to_owned());
    };
    let Some(cur) = KubeVersion::parse(cur_text) else {
        return Some(format!(
            "current version {cur_text:?} is not a Kubernetes version"
        ));
    };
    let Some(des) = KubeVersion::parse(des_text) else {
        return Some(format!(
            "desired version {des_text:?} is not a Kubernetes version"
        ));
    };
    if cur.major != des.major {
        return Some(format!(
            "{cur_text}→{des_text} changes the major version; kubeadm cannot do that"
        ));
    }
    match cur.precedence(&des) {
        Ordering::Greater => {
            return Some(format!(
                "{cur_text}→{des_text} is a downgrade; kubeadm cannot downgrade"
            ));
        }
        Ordering::Equal | Ordering::Less => {}
    }
    if des.minor > cur.minor + 1 {
        return Some(format!(
            "{cur_text}→{des_text} skips a minor version; kubeadm upgrades one minor version at a time"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_patch_and_single_minor_upgrades() {
        for (c, d) in [
            ("v1.33.4", "v1.34.1"),
            ("v1.33.4", "v1.33.5"),
            ("v1.33.4", "v1.34.0-rc.1"),
            ("v1.34.0-rc.1", "v1.34.0"),
            ("v1.34.0-alpha.2", "v1.34.0-beta.0"),
            ("v1.33.4+vmware.1", "v1.33.4+vmware.2"),
            ("1.33.4", "1.34.0"),
        ] {
            assert_eq!(upgrade_problem(Some(c), Some(d)), None, "{c}→{d}");
        }
    }

    #[test]
    fn rejects_downgrades_skips_and_garbage_with_reasons() {
        let cases = [
            ("v1.34.1", "v1.33.4", "downgrade"),
            ("v1.34.1", "v1.34.0", "downgrade"),
            ("v1.34.0", "v1.34.0-rc.1", "downgrade"),
            ("v1.32.0", "v1.34.0", "skips a minor"),
            ("v1.34.0", "v2.0.0", "major"),
            ("v1.34", "v1.34.1", "not a Kubernetes version"),
            ("v1.34.0", "latest", "not a Kubernetes version"),
            ("v1.34.0", "v1.34.01x", "not a Kubernetes version"),
        ];
        for (c, d, why) in cases {
            let problem = upgrade_problem(Some(c), Some(d)).unwrap_or_default();
            assert!(problem.contains(why), "{c}→{d}: {problem:?}");
        }
        assert!(upgrade_problem(None, Some("v1.34.0")).is_some());
        assert!(upgrade_problem(Some("v1.34.0"), None).is_some());
    }
}

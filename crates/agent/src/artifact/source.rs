//! Where an artifact comes from, parsed from text: `oci://registry[:port]/repository@sha256:<64 hex>` (a
//! digest only: a tag is refused), `https://…` with a SHA-256 given beside it, `file:///abs/path` with a
//! SHA-256. Pure: no I/O.

use std::fmt;
use std::path::PathBuf;

use inplace_agent_api::is_sha256_hex;

/// An artifact source as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArtifactSource {
    /// An OCI artifact or image in a registry, by manifest (or index) digest.
    Oci(OciReference),
    /// A file over HTTPS with its SHA-256.
    Https {
        /// The URL.
        url: String,
        /// SHA-256 of the file (64 lower-case hex digits).
        sha256: String,
    },
    /// A local file with its SHA-256.
    File {
        /// Absolute path.
        path: PathBuf,
        /// SHA-256 of the file (64 lower-case hex digits).
        sha256: String,
    },
}

/// `registry/repository@sha256:<hex>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciReference {
    /// `host[:port]`.
    pub registry: String,
    /// The repository path (`k8s/kubernetes-sysext`).
    pub repository: String,
    /// SHA-256 of the manifest or index (64 lower-case hex digits, without `sha256:`).
    pub digest: String,
}

impl fmt::Display for OciReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "oci://{}/{}@sha256:{}",
            self.registry, self.repository, self.digest
        )
    }
}

impl fmt::Display for ArtifactSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Oci(reference) => reference.fmt(f),
            Self::Https { url, .. } => f.write_str(url),
            Self::File { path, .. } => write!(f, "file://{}", path.display()),
        }
    }
}

/// Why a source text is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// Not one of the three schemes.
    #[error("{0:?}: not an oci://, https:// or file:// source")]
    Scheme(String),
    /// An `oci://` reference with a tag (or with neither tag nor digest).
    #[error("{0:?} names a tag; give a digest (@sha256:…)")]
    Tag(String),
    /// An `oci://` reference without a registry or repository.
    #[error("{0:?}: expected oci://registry[:port]/repository@sha256:<64 hex digits>")]
    Reference(String),
    /// A digest that is not `sha256:` followed by 64 lower-case hex digits.
    #[error("{text:?}: digest {digest:?} is not sha256:<64 lower-case hex digits>")]
    Digest {
        /// The source text.
        text: String,
        /// The digest part.
        digest: String,
    },
    /// An `https://` or `file://` source without its SHA-256 (or with a malformed one).
    #[error("{0:?}: needs its sha256 (64 lower-case hex digits) beside it")]
    Sha256(String),
    /// A `file://` source whose path is not absolute.
    #[error("{0:?}: a file:// source needs an absolute path (file:///…)")]
    RelativePath(String),
}

impl ArtifactSource {
    /// Parses `text`; `sha256` is the digest given beside an `https://` or `file://` source (ignored for
    /// `oci://`, whose digest is in the reference; `sha256:` in front is accepted).
    pub fn parse(text: &str, sha256: Option<&str>) -> Result<Self, SourceError> {
        let text = text.trim();
        if let Some(rest) = text.strip_prefix("oci://") {
            return parse_oci(text, rest).map(Self::Oci);
        }
        let sha256 = || {
            sha256
                .map(|s| s.trim().strip_prefix("sha256:").unwrap_or(s.trim()))
                .filter(|s| is_sha256_hex(s))
                .map(str::to_owned)
                .ok_or_else(|| SourceError::Sha256(text.to_owned()))
        };
        if text.starts_with("https://") && text.len() > "https://".len() {
            return Ok(Self::Https {
                url: text.to_owned(),
                sha256: sha256()?,
            });
        }
        if let Some(path) = text.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(SourceError::RelativePath(text.to_owned()));
            }
            return Ok(Self::File {
                path: PathBuf::from(path),
                sha256: sha256()?,
            });
        }
        Err(SourceError::Scheme(text.to_owned()))
    }

    /// The SHA-256 the fetched bytes must have, when the source itself fixes it (`https://`, `file://`).
    pub fn sha256(&self) -> Option<&str> {
        match self {
            Self::Oci(_) => None,
            Self::Https { sha256, .. } | Self::File { sha256, .. } => Some(sha256),
        }
    }
}

fn parse_oci(text: &str, rest: &str) -> Result<OciReference, SourceError> {
    let (name, digest) = match rest.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (rest, None),
    };
    let (registry, repository) = name
        .split_once('/')
        .filter(|(r, p)| !r.is_empty() && !p.is_empty() && !p.ends_with('/'))
        .ok_or_else(|| SourceError::Reference(text.to_owned()))?;
    // A `:` after the last `/` is a tag (the registry's port comes before the first `/`).
    let tagged = repository
        .rsplit('/')
        .next()
        .is_some_and(|last| last.contains(':'));
    let Some(digest) = digest.filter(|_| !tagged) else {
        return Err(SourceError::Tag(text.to_owned()));
    };
    let valid_name = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
    };
    if !valid_name(repository) || repository.split('/').any(str::is_empty) {
        return Err(SourceError::Reference(text.to_owned()));
    }
    if !registry
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
    {
        return Err(SourceError::Reference(text.to_owned()));
    }
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| is_sha256_hex(h))
        .ok_or_else(|| SourceError::Digest {
            text: text.to_owned(),
            digest: digest.to_owned(),
        })?;
    Ok(OciReference {
        registry: registry.to_owned(),
        repository: repository.to_owned(),
        digest: hex.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn oci_reference_by_digest_with_a_port() {
        let text = format!("oci://registry.example.com:5443/k8s/kubernetes-sysext@sha256:{HEX}");
        let ArtifactSource::Oci(r) = ArtifactSource::parse(&text, None).unwrap() else {
            panic!("not oci");
        };
        assert_eq!(r.registry, "registry.example.com:5443");
        assert_eq!(r.repository, "k8s/kubernetes-sysext");
        assert_eq!(r.digest, HEX);
        assert_eq!(r.to_string(), text);
    }

    #[test]
    fn a_tag_is_refused_with_the_fix() {
        for text in [
            "oci://r.example/k8s/kubelet:v1.34.1",
            "oci://r.example:5000/k8s/kubelet",
            &format!("oci://r.example/k8s/kubelet:v1@sha256:{HEX}"),
        ] {
            let err = ArtifactSource::parse(text, None).unwrap_err();
            assert_eq!(err, SourceError::Tag(text.to_owned()));
            assert!(
                err.to_string()
                    .ends_with("names a tag; give a digest (@sha256:…)")
            );
        }
    }

    #[test]
    fn malformed_digests_and_references_are_named() {
        let short = "oci://r.example/k8s/kubelet@sha256:abc";
        assert!(matches!(
            ArtifactSource::parse(short, None),
            Err(SourceError::Digest { digest, .. }) if digest == "sha256:abc"
        ));
        let upper = format!("oci://r.example/k8s/kubelet@sha256:{}", HEX.to_uppercase());
        assert!(matches!(
            ArtifactSource::parse(&upper, None),
            Err(SourceError::Digest { .. })
        ));
        let md5 = format!("oci://r.example/k8s/kubelet@md5:{HEX}");
        assert!(matches!(
            ArtifactSource::parse(&md5, None),
            Err(SourceError::Digest { .. })
        ));
        for bad in [
            format!("oci://r.example@sha256:{HEX}"),
            format!("oci:///k8s@sha256:{HEX}"),
            format!("oci://r.example/K8s@sha256:{HEX}"),
            format!("oci://r.example/k8s//x@sha256:{HEX}"),
        ] {
            assert_eq!(
                ArtifactSource::parse(&bad, None),
                Err(SourceError::Reference(bad.clone()))
            );
        }
    }

    #[test]
    fn https_and_file_need_their_sha256() {
        let url = "https://dl.example/containerd.tar.gz";
        assert_eq!(
            ArtifactSource::parse(url, Some(&format!("sha256:{HEX}"))).unwrap(),
            ArtifactSource::Https {
                url: url.into(),
                sha256: HEX.into()
            }
        );
        assert_eq!(
            ArtifactSource::parse(url, None),
            Err(SourceError::Sha256(url.into()))
        );
        assert_eq!(
            ArtifactSource::parse(url, Some("abc")),
            Err(SourceError::Sha256(url.into()))
        );
        let file = ArtifactSource::parse("file:///srv/k.raw", Some(HEX)).unwrap();
        assert_eq!(file.sha256(), Some(HEX));
        assert_eq!(file.to_string(), "file:///srv/k.raw");
        assert_eq!(
            ArtifactSource::parse("file://srv/k.raw", Some(HEX)),
            Err(SourceError::RelativePath("file://srv/k.raw".into()))
        );
        assert_eq!(
            ArtifactSource::parse("http://dl.example/x", Some(HEX)),
            Err(SourceError::Scheme("http://dl.example/x".into()))
        );
    }
}

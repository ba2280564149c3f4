//! The OCI and Docker manifest and index shapes the fetcher reads, and the pure choices over them: the
//! manifest for `linux/<arch>` in an index, the layer to fetch from a manifest.

use serde::Deserialize;

/// `Accept` for a manifest GET: OCI index and manifest, Docker manifest list and v2 manifest.
pub(crate) const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// A content descriptor (a manifest in an index, or a layer).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Its media type.
    #[serde(default)]
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// The platform (index entries).
    #[serde(default)]
    pub platform: Option<Platform>,
}

/// An index entry's platform.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Platform {
    /// `linux`.
    pub os: String,
    /// GOARCH name (`amd64`, `arm64`).
    pub architecture: String,
    /// `v7`, `v8`.
    #[serde(default)]
    pub variant: Option<String>,
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        match &self.variant {
            Some(v) => write!(f, "/{v}"),
            None => Ok(()),
        }
    }
}

/// A manifest or an index, as far as the fetcher reads it.
#[derive(Debug, Deserialize)]
pub(crate) struct Manifest {
    /// Present in an index.
    #[serde(default)]
    pub manifests: Option<Vec<Descriptor>>,
    /// Present in an image or artifact manifest.
    #[serde(default)]
    pub layers: Option<Vec<Descriptor>>,
}

/// The entry of `index` for `linux/<arch>`; else the platforms offered, for the error.
pub(crate) fn select_platform<'a>(
    index: &'a [Descriptor],
    arch: &str,
) -> Result<&'a Descriptor, String> {
    index
        .iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        })
        .ok_or_else(|| {
            let offered: Vec<String> = index
                .iter()
                .map(|d| {
                    d.platform
                        .as_ref()
                        .map_or_else(|| "(no platform)".to_owned(), Platform::to_string)
                })
                .collect();
            if offered.is_empty() {
                "nothing".to_owned()
            } else {
                offered.join(", ")
            }
        })
}

/// The layer to fetch: the one of `media_type` when given, else the only one.
pub(crate) fn select_layer<'a>(
    layers: &'a [Descriptor],
    media_type: Option<&str>,
) -> Result<&'a Descriptor, String> {
    match media_type {
        Some(wanted) => {
            let mut matching = layers.iter().filter(|l| l.media_type == wanted);
            match (matching.next(), matching.next()) {
                (Some(layer), None) => Ok(layer),
                (None, _) => Err(format!("no layer of media type {wanted}")),
                (Some(_), Some(_)) => Err(format!("several layers of media type {wanted}")),
            }
        }
        None => match layers {
            [layer] => Ok(layer),
            [] => Err("no layer".to_owned()),
            _ => Err(format!(
                "{} layers and no layer media type configured to choose one",
                layers.len()
            )),
        },
    }
}

/// The 64 hex digits of a `sha256:<hex>` descriptor digest.
pub(crate) fn sha256_of(digest: &str) -> Option<&str> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| inplace_agent_api::is_sha256_hex(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(arch: &str, variant: Option<&str>) -> Descriptor {
        Descriptor {
            media_type: "application/vnd.oci.image.manifest.v1+json".into(),
            digest: format!("sha256:{arch}"),
            size: 1,
            platform: Some(Platform {
                os: "linux".into(),
                architecture: arch.into(),
                variant: variant.map(str::to_owned),
            }),
        }
    }

    #[test]
    fn the_node_architecture_is_picked_or_the_offer_is_named() {
        let index = [
            entry("arm", Some("v7")),
            entry("arm64", None),
            entry("amd64", None),
        ];
        assert_eq!(
            select_platform(&index, "amd64").unwrap().digest,
            "sha256:amd64"
        );
        assert_eq!(
            select_platform(&index, "s390x").unwrap_err(),
            "linux/arm/v7, linux/arm64, linux/amd64"
        );
        assert_eq!(select_platform(&[], "amd64").unwrap_err(), "nothing");
    }

    #[test]
    fn one_layer_or_the_configured_media_type() {
        let mut a = entry("a", None);
        a.media_type = "application/vnd.example.sysext.raw.v1".into();
        let mut b = entry("b", None);
        b.media_type = "application/vnd.example.sig".into();
        assert_eq!(select_layer(std::slice::from_ref(&a), None).unwrap(), &a);
        let both = [a.clone(), b];
        assert_eq!(
            select_layer(&both, None).unwrap_err(),
            "2 layers and no layer media type configured to choose one"
        );
        assert_eq!(
            select_layer(&both, Some("application/vnd.example.sysext.raw.v1")).unwrap(),
            &a
        );
        assert_eq!(
            select_layer(&both, Some("x")).unwrap_err(),
            "no layer of media type x"
        );
        assert_eq!(select_layer(&[], None).unwrap_err(), "no layer");
        assert_eq!(sha256_of("sha256:abc"), None);
    }
}

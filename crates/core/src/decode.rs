//! The JSON decoder every typed read of CAPI's data goes through: the hook request bodies (`api` in the
//! server crate), the agent bodies and the plan's view of the KubeadmConfig ([`crate::plan`]). One decoder so
//! that one set of field rules holds everywhere: members are matched by the exact, case-sensitive names of
//! the Go JSON tags (spelled by `#[serde(rename_all = "camelCase")]` and friends; Go would also take a
//! case-folded name, which CAPI's encoder never writes and `api::validate` does not take either), unknown
//! members are skipped as Go skips them, and a failure names the field that is wrong.

use serde::de::DeserializeOwned;

/// Decodes JSON into `T`; on failure, says where: `path: serde message` (just the message at the top).
///
/// The plain decoder runs first: tracking the path of every field costs about a third of a decode, and only a
/// body that fails needs it, so such a body is decoded a second time to name the field.
pub fn decode_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    decode_json_at(body).map_err(|err| match err.path {
        Some(path) => format!("{path}: {}", err.message),
        None => err.message,
    })
}

/// Where and why a JSON text did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    /// The field path, e.g. `spec.files[0].encoding`; `None` when the text as a whole is wrong.
    pub path: Option<String>,
    /// Serde's message, e.g. ``invalid type: integer `1`, expected a string at line 1 column 9``.
    pub message: String,
}

/// [`decode_json`], with the path and the message apart (for callers that put the path under their own).
pub fn decode_json_at<T: DeserializeOwned>(body: &[u8]) -> Result<T, JsonError> {
    let plain = match serde_json::from_slice(body) {
        Ok(value) => return Ok(value),
        Err(err) => err,
    };
    let deserializer = &mut serde_json::Deserializer::from_slice(body);
    match serde_path_to_error::deserialize::<_, T>(deserializer) {
        // Both are serde_json underneath; should they ever disagree, the plain error stands.
        Ok(_) => Err(JsonError {
            path: None,
            message: plain.to_string(),
        }),
        Err(err) => {
            let path = err.path().to_string();
            let message = err.into_inner().to_string();
            Err(JsonError {
                path: (path != ".").then_some(path),
                message,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Outer {
        image_tag: Option<String>,
        #[serde(default)]
        items: Vec<u32>,
    }

    #[test]
    fn names_the_field_and_keeps_go_naming_rules() {
        let err = decode_json::<Outer>(br#"{"items": [1, "two"]}"#).unwrap_err();
        assert!(err.starts_with("items[1]: invalid type: string"), "{err}");
        // Exact, case-sensitive names; unknown members are skipped.
        let outer: Outer = decode_json(br#"{"ImageTag": "x", "other": 1}"#).unwrap();
        assert_eq!(outer.image_tag, None);
        let top = decode_json_at::<Outer>(b"[]").unwrap_err();
        assert_eq!(top.path, None, "{top:?}");
    }
}

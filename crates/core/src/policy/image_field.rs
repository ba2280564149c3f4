//! The field an `os-image` rule names with `imageField:` ([`ImageField`]), and reading the image from it.

use serde_json::Value;

/// The field an `os-image` rule reads the image from (its `imageField:`): a dotted path of plain field names from
/// the object's `spec`, e.g. `spec.image.url`. A string there is the image; a number (Proxmox's `templateID`)
/// its decimal text; an object (Nutanix's `spec.image`) its compact JSON with sorted keys.
/// Serialized as its dotted text.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct ImageField(String);

impl ImageField {
    /// Parses `spec.a.b`: starts at `spec`, at least one field below it, each of `[A-Za-z0-9_-]`.
    pub fn parse(text: &str) -> Result<ImageField, String> {
        let mut segments = text.split('.');
        let plain = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        };
        if segments.next() != Some("spec") {
            return Err(format!("image {text:?} does not start at `spec.`"));
        }
        let below: Vec<&str> = segments.collect();
        if below.is_empty() || !below.iter().all(|s| plain(s)) {
            return Err(format!(
                "image {text:?} is not a dotted path of plain field names (no lists, no wildcards)"
            ));
        }
        Ok(ImageField(text.to_owned()))
    }

    /// The path as written (`spec.image.url`).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The image in `object` at this field: `Ok(None)` when absent or null, `Err` naming the field when it
    /// is neither text nor an object.
    pub fn read(&self, object: &Value) -> Result<Option<String>, String> {
        let pointer: String = self.0.split('.').map(|s| format!("/{s}")).collect();
        match object.pointer(&pointer) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) if text.trim().is_empty() => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            // serde_json's map is ordered by key here (no `preserve_order`): the text is canonical.
            Some(value @ (Value::Object(_) | Value::Number(_))) => Ok(Some(value.to_string())),
            Some(other) => Err(format!(
                "{} is {other}, not an image name, number or object",
                self.0
            )),
        }
    }
}

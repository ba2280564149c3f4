//! Go `encoding/json` decoding into typed targets, and Go encoding back out (omitempty/omitzero).
//!
//! The rules reproduced here (from Go's decode.go): object keys find their field by exact name,
//! else case-insensitively (Go folds ASCII letters plus `ſ`→`S` and `K`→`K`); unknown keys are
//! skipped; later duplicate keys decode into the same field again; `null` leaves strings, numbers
//! and structs as they were and clears slices, maps and pointers; a value of the wrong JSON type is
//! an error, but Go records only the *first* error and keeps decoding the rest, so a failed decode
//! still leaves a partly filled value (which CAPI uses under `failurePolicy: Ignore`).
//! `[]byte` is a padded standard base64 string (`\r`/`\n` ignored, trailing bits not checked) or an
//! array of numbers 0..=255.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use serde_json::{Map, Value};

use crate::gojson::{GoJson, parse_go_int, parse_go_uint};

/// Why Go's decoder rejects a document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not valid JSON (Go: `*json.SyntaxError`, `io.EOF`, `io.ErrUnexpectedEOF`).
    #[error("invalid JSON: {0}")]
    Syntax(#[from] crate::gojson::SyntaxError),
    /// A JSON value of the wrong type for the Go field (Go: `*json.UnmarshalTypeError`).
    #[error("cannot unmarshal {found} into field {path} of Go type {go_type}")]
    Type {
        /// Dotted path of the field, e.g. `machinePatch.patch`.
        path: String,
        /// JSON type found (`string`, `number 1.5`, ...).
        found: String,
        /// Go type expected.
        go_type: String,
    },
    /// A `[]byte` field holding a string that is not padded standard base64.
    #[error("field {path}: illegal base64 data")]
    Base64 {
        /// Dotted path of the field.
        path: String,
    },
}

/// State of one decode: the path being decoded, Go's first error, and (strict mode) the keys
/// that a Go *encoder* would never have written.
#[derive(Debug, Default)]
pub(crate) struct DecodeCtx {
    path: Vec<String>,
    first_error: Option<DecodeError>,
    strict: bool,
    unexpected: Vec<String>,
}

impl DecodeCtx {
    /// A context that also records unknown and non-canonically spelled keys.
    pub(crate) fn strict() -> Self {
        DecodeCtx {
            strict: true,
            ..Default::default()
        }
    }

    fn path(&self) -> String {
        if self.path.is_empty() {
            "(top level)".into()
        } else {
            self.path.join(".")
        }
    }

    fn save(&mut self, error: DecodeError) {
        if self.first_error.is_none() {
            self.first_error = Some(error);
        }
    }

    pub(crate) fn type_error(&mut self, found: &GoJson, go_type: &str) {
        let found = match found {
            GoJson::Number(lit) => format!("number {lit}"),
            other => other.kind_name().to_string(),
        };
        let path = self.path();
        self.save(DecodeError::Type {
            path,
            found,
            go_type: go_type.into(),
        });
    }

    /// Go's first error, if any.
    pub(crate) fn first_error(&self) -> Option<&DecodeError> {
        self.first_error.as_ref()
    }

    /// Strict mode: keys no Go encoder of this type would produce.
    pub(crate) fn unexpected_keys(&self) -> &[String] {
        &self.unexpected
    }

    fn enter<R>(&mut self, segment: &str, f: impl FnOnce(&mut Self) -> R) -> R {
        self.path.push(segment.to_string());
        let r = f(self);
        self.path.pop();
        r
    }
}

/// Decoding a Go type from JSON, merging into the existing value as `encoding/json` does.
pub(crate) trait GoDecode: Default {
    /// The Go type's name, for error messages.
    fn go_type() -> &'static str;
    /// Decodes `json` into `self`, recording the first error in `cx`.
    fn go_decode(&mut self, json: &GoJson, cx: &mut DecodeCtx);
    /// `[]T` from a JSON string: only `[]byte` (base64) accepts one.
    fn slice_from_string(_s: &str) -> Option<Result<Vec<Self>, ()>> {
        None
    }
}

/// Encoding a Go type the way `json.Marshal` does.
pub(crate) trait GoEncode {
    /// The JSON Go would write for this value.
    fn go_encode(&self) -> Value;
    /// `omitempty`: false, 0, "", nil pointer, empty slice or map (structs are never empty).
    fn is_empty_value(&self) -> bool;
    /// `omitzero`: the Go zero value.
    fn is_zero_value(&self) -> bool;
    /// How `[]T` is written: an array, except `[]byte` (base64 string).
    fn encode_slice(items: &[Self]) -> Value
    where
        Self: Sized,
    {
        Value::Array(items.iter().map(GoEncode::go_encode).collect())
    }
}

/// Decodes a whole document; returns the (possibly partial) value and Go's first error.
pub(crate) fn decode_partial<T: GoDecode>(json: &GoJson, cx: &mut DecodeCtx) -> T {
    let mut value = T::default();
    value.go_decode(json, cx);
    value
}

impl GoDecode for String {
    fn go_type() -> &'static str {
        "string"
    }
    fn go_decode(&mut self, json: &GoJson, cx: &mut DecodeCtx) {
        match json {
            GoJson::Null => {}
            GoJson::String(s) => self.clone_from(s),
            other => cx.type_error(other, Self::go_type()),
        }
    }
}

impl GoEncode for String {
    fn go_encode(&self) -> Value {
        Value::String(self.clone())
    }
    fn is_empty_value(&self) -> bool {
        self.is_empty()
    }
    fn is_zero_value(&self) -> bool {
        self.is_empty()
    }
}

impl GoDecode for bool {
    fn go_type() -> &'static str {
        "bool"
    }
    fn go_decode(&mut self, json: &GoJson, cx: &mut DecodeCtx) {
        match json {
            GoJson::Null => {}
            GoJson::Bool(b) => *self = *b,
            other => cx.type_error(other, Self::go_type()),
        }
    }
}

impl GoEncode for bool {
    fn go_encode(&self) -> Value {
        Value::Bool(*self)
    }
    fn is_empty_value(&self) -> bool {
        !*self
    }
    fn is_zero_value(&self) -> bool {
        !*self
    }
}

impl GoDecode for i32 {
    fn go_type() -> &'static str {
        "int32"
    }
    fn go_decode(&mut self, json: &GoJson, cx: &mut DecodeCtx) {
        match json {
            GoJson::Null => {}
            GoJson::Number(lit) => {
                match parse_go_int(lit, 32).and_then(|n| i32::try_from(n).ok()) {
                    Some(n) => *self = n,
                    None => cx.type_error(json, Self::go_type()),
                }
            }
            other => cx.type_error(other, Self::go_type()),
        }
    }
}

impl GoEncode for i32 {
    fn go_encode(&self) -> Value {
        Value::from(*self)
    }
    fn is_empty_value(&self) -> bool {
        *self == 0
    }
    fn is_zero_value(&self) -> bool {
        *self == 0
    }
}

impl GoDecode for u8 {
    fn go_type() -> &'static str {
        "uint8"
    }
    fn go_decode(&mut self, json: &GoJson, cx: &mut DecodeCtx) {
        match json {
            GoJson::Null => {}
            GoJson::Number(lit) => match parse_go_uint(lit, 255).and_then(|n| u8::try_from(n).ok())
            {
                Some(n) => *self = n,
                None => cx.type_error(json, Self::go_type()),
            },
            other => cx.type_error(other, Self::go_type()),
        }
    }
    fn slice_from_string(s: &str) -> Option<Result<Vec<u8>, ()>> {
        // encoding/base64's StdEncoding: skips \r and \n, requires padding, ignores trailing bits.
        let engine = GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            GeneralPurposeConfig::new()
                .with_decode_allow_trailing_bits(true)
                .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
        );
        let cleaned: Vec<u8> = s.bytes().filter(|b| *b != b'\r' && *b != b'\n').collect();
        Some(engine.decode(cleaned).map_err(|_| ()))
    }
}

impl GoEncode for u8 {
    fn go_encode(&self) -> Value {
        Value::from(*self)
    }
    fn is_empty_value(&self) -> bool {
        *self == 0
    }
    fn is_zero_value(&self) -> bool {
        *self == 0
    }
    fn encode_slice(items: &[u8]) -> Value {
        Value::String(base64::engine::general_purpose::STANDARD.encode(items))
    }
}

/// A Go pointer: `null` makes it nil; anything else allocates it (even when the value then fails).
impl<T: GoDecode> GoDecode for Option<T> {
    fn go_type() -> &'static str {
        T::go_type()
    }
    fn go_decode(&mut self, json: &GoJson, cx: &mut DecodeCtx) {
        match json {
            GoJson::Null => *self = None,
            other => self.get_or_insert_with(T::default).go_decode(other, cx),
        }
    }
}

impl<T: GoEncode> GoEncode for Option<T> {
    fn go_encode(&self) -> Value {
        self.as_ref().map_or(Value::Null, GoEncode::go_encode)
    }
    fn is_empty_value(&self) -> bool {
        self.is_none()
    }
    fn is_zero_value(&self) -> bool {
        self.is_none()
    }
}

/// A Go slice: `null` clears it; an array decodes element by element into the existing elements.
impl<T: GoDecode> GoDecode for Vec<T> {
    fn go_type() -> &'static str {
        "slice"
    }
    fn go_decode(&mut self, json: &GoJson, cx: &mut DecodeCtx) {
        match json {
            GoJson::Null => self.clear(),
            GoJson::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    if i >= self.len() {
                        self.push(T::default());
                    }
                    cx.enter(&format!("[{i}]"), |cx| self[i].go_decode(item, cx));
                }
                self.truncate(items.len());
            }
            GoJson::String(s) => match T::slice_from_string(s) {
                Some(Ok(bytes)) => *self = bytes,
                Some(Err(())) => {
                    let path = cx.path();
                    cx.save(DecodeError::Base64 { path });
                }
                None => cx.type_error(json, Self::go_type()),
            },
            other => cx.type_error(other, Self::go_type()),
        }
    }
}

impl<T: GoEncode> GoEncode for Vec<T> {
    fn go_encode(&self) -> Value {
        T::encode_slice(self)
    }
    fn is_empty_value(&self) -> bool {
        self.is_empty()
    }
    fn is_zero_value(&self) -> bool {
        self.is_empty()
    }
}

/// `map[string]string`: `null` clears it; each member decodes into a fresh value that is stored
/// even when it fails to decode (Go stores the zero value then).
impl GoDecode for BTreeMap<String, String> {
    fn go_type() -> &'static str {
        "map[string]string"
    }
    fn go_decode(&mut self, json: &GoJson, cx: &mut DecodeCtx) {
        match json {
            GoJson::Null => self.clear(),
            GoJson::Object(members) => {
                for (key, value) in members {
                    let mut v = String::new();
                    cx.enter(key, |cx| v.go_decode(value, cx));
                    self.insert(key.clone(), v);
                }
            }
            other => cx.type_error(other, Self::go_type()),
        }
    }
}

impl GoEncode for BTreeMap<String, String> {
    fn go_encode(&self) -> Value {
        Value::Object(
            self.iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
        )
    }
    fn is_empty_value(&self) -> bool {
        self.is_empty()
    }
    fn is_zero_value(&self) -> bool {
        self.is_empty()
    }
}

/// Folds a key the way Go's `foldName` does, for comparisons against ASCII field names: ASCII
/// letters to upper case, and the two non-ASCII runes whose case orbit contains an ASCII letter.
fn fold(c: char) -> char {
    match c {
        '\u{17f}' => 'S',
        '\u{212a}' => 'K',
        c => c.to_ascii_uppercase(),
    }
}

/// Whether Go's decoder would match JSON key `key` to the field named `name` ignoring case.
pub(crate) fn fold_eq(name: &str, key: &str) -> bool {
    name.chars().map(fold).eq(key.chars().map(fold))
}

/// Decodes a JSON object into a struct with the given field names; `field` decodes one member.
pub(crate) fn decode_struct(
    json: &GoJson,
    names: &[&'static str],
    go_type: &str,
    cx: &mut DecodeCtx,
    mut field: impl FnMut(&'static str, &GoJson, &mut DecodeCtx),
) {
    match json {
        GoJson::Null => {}
        GoJson::Object(members) => {
            for (key, value) in members {
                let exact = names.iter().find(|n| **n == key.as_str());
                let found = exact.or_else(|| names.iter().find(|n| fold_eq(n, key)));
                match found {
                    Some(name) => {
                        if cx.strict && exact.is_none() {
                            let at = cx.path();
                            cx.unexpected
                                .push(format!("{at}: key {key:?} is not spelled {name:?}"));
                        }
                        cx.enter(name, |cx| field(name, value, cx));
                    }
                    None if cx.strict => {
                        let at = cx.path();
                        cx.unexpected.push(format!("{at}: unknown field {key:?}"));
                    }
                    None => {}
                }
            }
        }
        other => cx.type_error(other, go_type),
    }
}

/// Whether `json.Marshal` leaves a field out, given its tag options.
pub(crate) fn omitted<T: GoEncode>(value: &T, options: &[&str]) -> bool {
    (options.contains(&"omitempty") && value.is_empty_value())
        || (options.contains(&"omitzero") && value.is_zero_value())
}

/// Inserts a field into an encoded struct unless its tag options omit it.
pub(crate) fn encode_field<T: GoEncode>(
    map: &mut Map<String, Value>,
    name: &str,
    value: &T,
    options: &[&str],
) {
    if !omitted(value, options) {
        map.insert(name.to_string(), value.go_encode());
    }
}

/// Declares a struct mirroring a Go type: each field names its JSON key and tag options.
/// Generates the struct, its Go decoder and its Go encoder.
macro_rules! go_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[$fmeta:meta])*
                $field:ident : $ty:ty = $json:literal $([$($opt:ident),*])?
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl $crate::godecode::GoDecode for $name {
            fn go_type() -> &'static str {
                stringify!($name)
            }
            fn go_decode(&mut self, json: &$crate::gojson::GoJson, cx: &mut $crate::godecode::DecodeCtx) {
                const NAMES: &[&str] = &[$($json),*];
                $crate::godecode::decode_struct(json, NAMES, stringify!($name), cx, |name, value, cx| {
                    $( if name == $json { $crate::godecode::GoDecode::go_decode(&mut self.$field, value, cx); return; } )*
                });
            }
        }

        impl $crate::godecode::GoEncode for $name {
            fn go_encode(&self) -> serde_json::Value {
                let mut map = serde_json::Map::new();
                $( $crate::godecode::encode_field(&mut map, $json, &self.$field, &[$($(stringify!($opt)),*)?]); )*
                serde_json::Value::Object(map)
            }
            fn is_empty_value(&self) -> bool {
                false
            }
            fn is_zero_value(&self) -> bool {
                let zeros: &[bool] = &[$( $crate::godecode::GoEncode::is_zero_value(&self.$field) ),*];
                zeros.iter().all(|zero| *zero)
            }
        }
    };
}
pub(crate) use go_struct;

#[cfg(test)]
#[path = "godecode_tests.rs"]
mod tests;

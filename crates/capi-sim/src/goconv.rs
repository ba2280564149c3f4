//! Between Go's view of JSON and `serde_json::Value`: Go's integer parsing, the way Kubernetes'
//! unstructured decoder types numbers, and the way Go's encoder prints them.

use serde_json::{Map, Number, Value};

use crate::gojson::GoJson;

/// Deepest value converted to a `serde_json::Value` (recursive); Go would accept up to
/// [`GO_MAX_NESTING_DEPTH`](crate::gojson::GO_MAX_NESTING_DEPTH), but no hook answer nests patch values anywhere near this deep.
pub const MAX_VALUE_CONVERSION_DEPTH: usize = 512;

/// Go's `strconv.ParseInt(lit, 10, 64)` followed by a range check for `bits`.
pub fn parse_go_int(lit: &str, bits: u32) -> Option<i64> {
    let n: i64 = lit.parse().ok()?;
    // 2^(bits-1) - 1 without overflowing at 64 bits (`1 << 63` is i64::MIN, minus one panics in debug builds).
    let max = i64::MAX >> (64 - bits.clamp(1, 64));
    (n >= -max - 1 && n <= max).then_some(n)
}

/// Go's `strconv.ParseUint(lit, 10, 64)` followed by a range check against `max`.
pub fn parse_go_uint(lit: &str, max: u64) -> Option<u64> {
    if lit.starts_with(['+', '-']) {
        return None;
    }
    lit.parse::<u64>().ok().filter(|n| *n <= max)
}

/// Converts to a `serde_json::Value` the way Kubernetes' unstructured decoder reads JSON:
/// duplicate keys keep the last value, integer literals that fit `int64` stay integers, every
/// other number is a `float64` (out of range is an error, as in Go).
pub fn to_value(json: &GoJson) -> Result<Value, String> {
    to_value_at(json, 0)
}

fn to_value_at(json: &GoJson, depth: usize) -> Result<Value, String> {
    if depth > MAX_VALUE_CONVERSION_DEPTH {
        return Err(format!(
            "value nested deeper than {MAX_VALUE_CONVERSION_DEPTH} levels"
        ));
    }
    Ok(match json {
        GoJson::Null => Value::Null,
        GoJson::Bool(b) => Value::Bool(*b),
        GoJson::String(s) => Value::String(s.clone()),
        GoJson::Number(lit) => number_value(lit)?,
        GoJson::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| to_value_at(v, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        GoJson::Object(members) => {
            let mut map = Map::new();
            for (k, v) in members {
                map.insert(k.clone(), to_value_at(v, depth + 1)?);
            }
            Value::Object(map)
        }
    })
}

fn number_value(lit: &str) -> Result<Value, String> {
    if let Some(n) = parse_go_int(lit, 64) {
        return Ok(Value::Number(n.into()));
    }
    let f: f64 = lit
        .parse()
        .map_err(|_| format!("cannot unmarshal number {lit} into Go value of type float64"))?;
    Number::from_f64(f)
        .map(Value::Number)
        .ok_or_else(|| format!("cannot unmarshal number {lit} into Go value of type float64"))
}

/// Converts a `serde_json::Value` to what Go's `json.Marshal` of an unstructured object produces
/// and its decoder then reads back: map keys sorted bytewise, numbers printed the Go way.
pub fn from_value(value: &Value) -> GoJson {
    match value {
        Value::Null => GoJson::Null,
        Value::Bool(b) => GoJson::Bool(*b),
        Value::String(s) => GoJson::String(s.clone()),
        Value::Number(n) => GoJson::Number(go_number_literal(n)),
        Value::Array(items) => GoJson::Array(items.iter().map(from_value).collect()),
        Value::Object(map) => {
            let mut members: Vec<(String, GoJson)> = map
                .iter()
                .map(|(k, v)| (k.clone(), from_value(v)))
                .collect();
            members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            GoJson::Object(members)
        }
    }
}

/// How Go's encoder prints a number held in an unstructured object (`int64` or `float64`).
pub fn go_number_literal(n: &Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    let f = n.as_f64().unwrap_or(0.0);
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Go: 'e' format with the exponent sign always present ("1e+21", "1e-07" cleaned to "1e-7").
        let s = format!("{f:e}");
        match s.split_once('e') {
            Some((mantissa, exp)) if !exp.starts_with('-') => format!("{mantissa}e+{exp}"),
            _ => s,
        }
    } else {
        format!("{f}")
    }
}

//! Go's `time.ParseDuration` syntax, as CAPI writes it in the `?timeout=` query parameter (`10s`, `1m30s`, `500ms`)
//! and v1beta1 Machines in `spec.nodeDrainTimeout`.

use std::time::Duration;

/// Why a duration string could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DurationError {
    /// The string was empty.
    #[error("empty duration")]
    Empty,
    /// A number or unit could not be read at the given text.
    #[error("invalid duration {0:?}: expected numbers with units ns, us, ms, s, m, h (e.g. 10s)")]
    Invalid(String),
    /// The duration is negative; CAPI never sends one and a deadline cannot be negative.
    #[error("negative duration {0:?}")]
    Negative(String),
}

/// Parses a Go duration string such as `10s`, `1m30s`, `1.5s` or `250ms`.
pub fn parse_go_duration(text: &str) -> Result<Duration, DurationError> {
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    let invalid = || DurationError::Invalid(text.chars().take(64).collect());
    let body = match text.strip_prefix('-') {
        Some("0") => return Ok(Duration::ZERO),
        Some(_) => return Err(DurationError::Negative(text.chars().take(64).collect())),
        None => text.strip_prefix('+').unwrap_or(text),
    };
    if body == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = body;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() || number == "." {
            return Err(invalid());
        }
        let value: f64 = number.parse().map_err(|_| invalid())?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let seconds_per_unit = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        total += value * seconds_per_unit;
        rest = next;
    }
    Duration::try_from_secs_f64(total).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_capi_sends() {
        assert_eq!(parse_go_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_go_duration("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn refuses_what_go_refuses() {
        for bad in ["", "10", "s", "10x", "1..5s", "-3s", "ten seconds", "1e3s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} must be refused");
        }
    }
}

//! How window times are shown to operators: RFC 3339 with the local offset, and waits in words.

use jiff::{SignedDuration, ZonedDateTime};

/// `2026-03-29T03:00:00+02:00`: the local wall time with its offset, no zone annotation.
pub(super) fn rfc3339(at: &ZonedDateTime) -> String {
    at.timestamp().display_with_offset(at.offset()).to_string()
}

/// A wait as `2d3h12m`, `3h12m`, `12m`, rounded up to the minute (a wait of 10 s is `1m`).
pub fn in_words(wait: SignedDuration) -> String {
    let seconds = wait.as_secs().max(0) + i64::from(wait.subsec_nanos() > 0);
    let minutes = (seconds + 59) / 60;
    let (days, hours, minutes) = (minutes / 1440, minutes / 60 % 24, minutes % 60);
    let mut out = String::new();
    if days > 0 {
        out.push_str(&format!("{days}d"));
    }
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if minutes > 0 || out.is_empty() {
        out.push_str(&format!("{minutes}m"));
    }
    out
}

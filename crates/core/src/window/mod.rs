//! Maintenance windows: the days and local hours in which a run may start or take its next step, as the
//! ExtensionConfig setting `maintenanceWindow` (for every Machine of a registration) and the Machine
//! annotation `inplace-updater.dev/maintenance-window` (one Machine, overriding the setting) say.
//!
//! Syntax (one line, fits a YAML string and `kubectl annotate`):
//! `days=mon-fri start=22:00 end=04:00 tz=Europe/Berlin`.
//! - `days`: comma-separated day names (`mon`…`sun` or full names, any case) and ranges (`mon-fri`,
//!   `fri-mon` wraps the week); required, never empty.
//! - `start`, `end`: `HH:MM` wall-clock times in `tz`; `end` may be `24:00`. An `end` at or before `start`
//!   crosses midnight, and such a window belongs to the day it starts on (`days=fri start=22:00 end=04:00`
//!   is Friday 22:00 to Saturday 04:00). `start` equal to `end` is refused (write `start=00:00 end=24:00` for
//!   a whole day).
//! - `tz`: an IANA time zone name (the tz database is compiled into the binary, so the host's zoneinfo
//!   does not matter); default `UTC`.
//! - DST: a time the clock skips (02:30 on a spring-forward night in Europe/Berlin) means the moment the
//!   clock jumps past it (03:00); a time the clock shows twice (02:30 on the autumn night) means the first.
//!
//! The annotation value `none` means "no window for this Machine" even when the setting has one; an empty or
//! absent annotation leaves the setting in force (so a blank value never lifts a window by accident).

mod format;
#[cfg(test)]
mod tests;

use jiff::civil::{Date, DateTime};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Timestamp, ZonedDateTime};

pub use format::in_words;

/// The ExtensionConfig setting key holding the registration's window.
pub const WINDOW_SETTING: &str = "maintenanceWindow";
pub use crate::knobs::WINDOW_ANNOTATION;
/// The value (setting or annotation) meaning "no window: always open".
pub const WINDOW_NONE: &str = "none";
/// Longest window spec accepted, in bytes.
pub const MAX_WINDOW_SPEC_BYTES: usize = 256;
/// How many days ahead [`Window::next_open`] looks for an opening (a year and a week: every weekday
/// recurs within it even when DST empties one occurrence).
pub const WINDOW_SEARCH_DAYS: i32 = 371;

const MINUTES_PER_DAY: u16 = 24 * 60;
const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
const KEYS: &str = "days, start, end, tz";

/// A window spec that cannot be used; each message names the part at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// The spec is longer than [`MAX_WINDOW_SPEC_BYTES`].
    #[error("longer than {MAX_WINDOW_SPEC_BYTES} bytes")]
    TooLong,
    /// A word that is not `key=value`.
    #[error(
        "{0:?} is not key=value (expected {KEYS}, e.g. \"days=mon-fri start=22:00 end=04:00 tz=Europe/Berlin\")"
    )]
    NotKeyValue(String),
    /// A key other than days, start, end, tz.
    #[error("unknown key {0:?} (known: {KEYS})")]
    UnknownKey(String),
    /// The same key twice.
    #[error("{0} given twice")]
    Duplicate(&'static str),
    /// A required key is absent.
    #[error("{0} missing (e.g. \"days=mon-fri start=22:00 end=04:00\")")]
    Missing(&'static str),
    /// `days=` with nothing in it, or an empty item in the list.
    #[error("days is empty; list days such as mon,wed or a range such as mon-fri")]
    EmptyDays,
    /// A day name that is not one.
    #[error(
        "{0:?} is not a day (mon, tue, wed, thu, fri, sat, sun, full names, or a range such as mon-fri)"
    )]
    BadDay(String),
    /// A time that is not `HH:MM` within the day.
    #[error("{key} {value:?} is not a time HH:MM between 00:00 and {max}")]
    BadTime {
        /// `start` or `end`.
        key: &'static str,
        /// The value as given.
        value: String,
        /// The latest time allowed (23:59 for start, 24:00 for end).
        max: &'static str,
    },
    /// `start` equal to `end`: empty or whole day, so refused as ambiguous.
    #[error("start and end are both {0}; for a window open all day write start=00:00 end=24:00")]
    StartEqualsEnd(String),
    /// A time zone name the tz database does not know.
    #[error("unknown time zone {0:?} (an IANA name such as Europe/Berlin or UTC)")]
    UnknownTimeZone(String),
}

/// A parsed maintenance window. Compared and serialised as its canonical spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Bit `i` set: the window opens on the weekday `i` days after Monday.
    days: u8,
    /// Minutes after local midnight the window opens (0..1440).
    start: u16,
    /// Minutes after local midnight it closes (1..=1440); at or before `start` means the next day.
    end: u16,
    tz: TimeZone,
    tz_name: String,
}

/// One stretch of time the window is open, with the time zone it is shown in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opening {
    /// When it opens (may be before the instant asked about, when that instant is inside it).
    pub opens: ZonedDateTime,
    /// When it closes.
    pub closes: ZonedDateTime,
}

/// Whether the window lets a run go on at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Open until `closes`.
    Open {
        /// When the current opening ends.
        closes: ZonedDateTime,
    },
    /// Closed; `opens` is the next opening (`None`: none within [`WINDOW_SEARCH_DAYS`]).
    Closed {
        /// When the window next opens.
        opens: Option<ZonedDateTime>,
        /// "outside maintenance window <spec>: opens <RFC 3339 local time> (in 3h12m)".
        message: String,
    },
}

impl Window {
    /// Parses a window spec (syntax in the module docs).
    pub fn parse(spec: &str) -> Result<Window, WindowError> {
        if spec.len() > MAX_WINDOW_SPEC_BYTES {
            return Err(WindowError::TooLong);
        }
        let (mut days, mut start, mut end, mut tz) = (None, None, None, None);
        for word in spec.split_whitespace() {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| WindowError::NotKeyValue(word.to_owned()))?;
            let (slot, name): (&mut Option<&str>, &'static str) =
                match key.to_ascii_lowercase().as_str() {
                    "days" => (&mut days, "days"),
                    "start" => (&mut start, "start"),
                    "end" => (&mut end, "end"),
                    "tz" => (&mut tz, "tz"),
                    _ => return Err(WindowError::UnknownKey(key.to_owned())),
                };
            if slot.replace(value).is_some() {
                return Err(WindowError::Duplicate(name));
            }
        }
        let days = parse_days(days.ok_or(WindowError::Missing("days"))?)?;
        let start = parse_time("start", start.ok_or(WindowError::Missing("start"))?)?;
        let end = parse_time("end", end.ok_or(WindowError::Missing("end"))?)?;
        if start == MINUTES_PER_DAY {
            return Err(WindowError::BadTime {
                key: "start",
                value: "24:00".to_owned(),
                max: "23:59",
            });
        }
        if start == end {
            return Err(WindowError::StartEqualsEnd(hh_mm(start)));
        }
        let tz_name = tz.unwrap_or("UTC");
        let zone =
            TimeZone::get(tz_name).map_err(|_| WindowError::UnknownTimeZone(tz_name.to_owned()))?;
        // The database's spelling, so `europe/berlin` and `Europe/Berlin` print alike.
        let tz_name = zone.iana_name().unwrap_or(tz_name).to_owned();
        Ok(Window {
            days,
            start,
            end,
            tz: zone,
            tz_name,
        })
    }

    /// The canonical spec: `days=mon,tue start=22:00 end=04:00 tz=Europe/Berlin`.
    pub fn spec(&self) -> String {
        let days: Vec<&str> = (0..7)
            .filter(|i| self.days & (1 << i) != 0)
            .map(|i| DAY_NAMES[i])
            .collect();
        format!(
            "days={} start={} end={} tz={}",
            days.join(","),
            hh_mm(self.start),
            hh_mm(self.end),
            self.tz_name
        )
    }

    /// Whether the window is open at `at`.
    pub fn is_open(&self, at: Timestamp) -> bool {
        self.next_open(at)
            .is_some_and(|opening| opening.opens.timestamp() <= at)
    }

    /// The opening that contains `at`, or else the first one after it, with adjacent openings merged
    /// (`days=mon,tue start=00:00 end=24:00` is one opening, Monday 00:00 to Wednesday 00:00). `None` when
    /// none starts within [`WINDOW_SEARCH_DAYS`].
    pub fn next_open(&self, at: Timestamp) -> Option<Opening> {
        let today = at.to_zoned_datetime(self.tz.clone()).date();
        // From yesterday: a window that started yesterday and crosses midnight may still be open.
        let mut day = today.yesterday().ok()?;
        let mut found = None;
        for _ in 0..=WINDOW_SEARCH_DAYS {
            match self.interval(day) {
                Some((opens, closes)) if closes > at => {
                    found = Some((opens, closes));
                    break;
                }
                _ => {}
            }
            day = day.tomorrow().ok()?;
        }
        let (opens, mut closes) = found?;
        for _ in 0..WINDOW_SEARCH_DAYS {
            day = day.tomorrow().ok()?;
            match self.interval(day) {
                Some((next_opens, next_closes)) if next_opens <= closes => {
                    closes = closes.max(next_closes)
                }
                _ => break,
            }
        }
        Some(Opening {
            opens: opens.to_zoned_datetime(self.tz.clone()),
            closes: closes.to_zoned_datetime(self.tz.clone()),
        })
    }

    /// Whether a run may go on at `at`, and if not, when it may and the message saying so.
    pub fn gate(&self, at: Timestamp) -> Gate {
        match self.next_open(at) {
            Some(opening) if opening.opens.timestamp() <= at => Gate::Open {
                closes: opening.closes,
            },
            Some(opening) => Gate::Closed {
                message: format!(
                    "outside maintenance window {}: opens {} (in {})",
                    self.spec(),
                    format::rfc3339(&opening.opens),
                    in_words(opening.opens.timestamp().duration_since(at)),
                ),
                opens: Some(opening.opens),
            },
            None => Gate::Closed {
                message: format!(
                    "outside maintenance window {}: it does not open within {WINDOW_SEARCH_DAYS} days",
                    self.spec()
                ),
                opens: None,
            },
        }
    }

    /// The opening that starts on local date `day`, if `day` is one of the window's days and DST leaves
    /// it non-empty.
    fn interval(&self, day: Date) -> Option<(Timestamp, Timestamp)> {
        let weekday = day.weekday().to_monday_zero_offset();
        if self.days & (1 << weekday) == 0 {
            return None;
        }
        let opens = self.instant(day, self.start)?;
        let end_day = if self.end > self.start {
            day
        } else {
            day.tomorrow().ok()?
        };
        let closes = self.instant(end_day, self.end)?;
        (opens < closes).then_some((opens, closes))
    }

    /// The first instant the clock in `tz` shows `minutes` after midnight of `day`, or passes it when
    /// DST skips it.
    fn instant(&self, day: Date, minutes: u16) -> Option<Timestamp> {
        let (day, minutes) = if minutes >= MINUTES_PER_DAY {
            (day.tomorrow().ok()?, minutes - MINUTES_PER_DAY)
        } else {
            (day, minutes)
        };
        let wall: DateTime = day.at((minutes / 60) as i8, (minutes % 60) as i8, 0, 0);
        let ambiguous = self.tz.to_ambiguous_timestamp(wall);
        match ambiguous.offset() {
            AmbiguousOffset::Gap { before, .. } => {
                // Read with the offset before the gap, the wall time lands at or after the jump; the jump
                // itself is the last transition up to that instant (`preceding` is strictly before).
                let after_jump = before.to_timestamp(wall).ok()?;
                let just_after = after_jump
                    .checked_add(jiff::SignedDuration::from_nanos(1))
                    .ok()?;
                self.tz
                    .preceding(just_after)
                    .next()
                    .map(|transition| transition.timestamp())
                    .or(Some(after_jump))
            }
            AmbiguousOffset::Fold { .. } => ambiguous.earlier().ok(),
            AmbiguousOffset::Unambiguous { .. } => ambiguous.compatible().ok(),
        }
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.spec())
    }
}

impl serde::Serialize for Window {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.spec())
    }
}

impl<'de> serde::Deserialize<'de> for Window {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spec = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Window::parse(&spec).map_err(serde::de::Error::custom)
    }
}

/// A window value as a setting: empty or `none` is no window, anything else must parse.
pub fn parse_setting(value: &str) -> Result<Option<Window>, WindowError> {
    let value = value.trim();
    if value.is_empty() || value.eq_ignore_ascii_case(WINDOW_NONE) {
        return Ok(None);
    }
    Window::parse(value).map(Some)
}

/// The annotation [`WINDOW_ANNOTATION`] holds a value that is not a window spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {WINDOW_ANNOTATION}: invalid value {value:?}: {problem}")]
pub struct AnnotationError {
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub problem: WindowError,
}

/// The window in force for one Machine: its annotation's (`none`: no window) if it has a non-empty one,
/// else the registration's setting.
pub fn effective(
    setting: Option<&Window>,
    annotation: Option<&str>,
) -> Result<Option<Window>, AnnotationError> {
    match annotation.map(str::trim) {
        None | Some("") => Ok(setting.cloned()),
        Some(value) => parse_setting(value).map_err(|problem| AnnotationError {
            value: value.to_owned(),
            problem,
        }),
    }
}

fn parse_days(value: &str) -> Result<u8, WindowError> {
    let mut days = 0u8;
    for item in value.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(WindowError::EmptyDays);
        }
        match item.split_once('-') {
            None => days |= 1 << day_index(item)?,
            Some((first, last)) => {
                let (first, last) = (day_index(first)?, day_index(last)?);
                let mut day = first;
                loop {
                    days |= 1 << day;
                    if day == last {
                        break;
                    }
                    day = (day + 1) % 7;
                }
            }
        }
    }
    Ok(days)
}

fn day_index(name: &str) -> Result<u8, WindowError> {
    let lower = name.to_ascii_lowercase();
    let index = match lower.as_str() {
        "mon" | "monday" => 0,
        "tue" | "tues" | "tuesday" => 1,
        "wed" | "wednesday" => 2,
        "thu" | "thur" | "thurs" | "thursday" => 3,
        "fri" | "friday" => 4,
        "sat" | "saturday" => 5,
        "sun" | "sunday" => 6,
        _ => return Err(WindowError::BadDay(name.to_owned())),
    };
    Ok(index)
}

fn parse_time(key: &'static str, value: &str) -> Result<u16, WindowError> {
    let bad = || WindowError::BadTime {
        key,
        value: value.to_owned(),
        max: if key == "start" { "23:59" } else { "24:00" },
    };
    let (hours, minutes) = value.split_once(':').ok_or_else(bad)?;
    let digits = |s: &str, len: std::ops::RangeInclusive<usize>| {
        len.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit())
    };
    if !digits(hours, 1..=2) || !digits(minutes, 2..=2) {
        return Err(bad());
    }
    let hours: u16 = hours.parse().map_err(|_| bad())?;
    let minutes: u16 = minutes.parse().map_err(|_| bad())?;
    let total = hours * 60 + minutes;
    if minutes >= 60 || total > MINUTES_PER_DAY {
        return Err(bad());
    }
    Ok(total)
}

fn hh_mm(minutes: u16) -> String {
    format!("{:02}:{:02}", minutes / 60, minutes % 60)
}

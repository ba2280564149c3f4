//! Window parsing and evaluation at fixed instants: midnight and week wraps, DST days in Europe/Berlin,
//! merged whole days, the operator's message, and every refused spec.

use super::*;
use jiff::SignedDuration;

fn at(rfc3339: &str) -> Timestamp {
    rfc3339.parse().unwrap()
}

fn window(spec: &str) -> Window {
    Window::parse(spec).unwrap()
}

fn opening(w: &Window, now: &str) -> (String, String) {
    let o = w.next_open(at(now)).unwrap();
    (format::rfc3339(&o.opens), format::rfc3339(&o.closes))
}

#[test]
fn parses_to_a_canonical_spec() {
    let w = window("  DAYS=Mon-Wed,friday   start=22:00 end=4:00 tz=Europe/Berlin ");
    assert_eq!(
        w.spec(),
        "days=mon,tue,wed,fri start=22:00 end=04:00 tz=Europe/Berlin"
    );
    assert_eq!(
        window("days=sun start=00:00 end=24:00").spec(),
        "days=sun start=00:00 end=24:00 tz=UTC"
    );
    // A range may wrap the week.
    assert_eq!(
        window("days=fri-mon start=01:00 end=02:00").spec(),
        "days=mon,fri,sat,sun start=01:00 end=02:00 tz=UTC"
    );
    assert_eq!(window(&w.spec()), w);
}

#[test]
fn a_window_crossing_midnight_belongs_to_the_day_it_starts_on() {
    let w = window("days=fri start=22:00 end=04:00 tz=UTC");
    // Friday 2026-12-04.
    assert!(!w.is_open(at("2026-12-04T21:59:59Z")));
    assert!(w.is_open(at("2026-12-04T22:00:00Z")));
    assert!(
        w.is_open(at("2026-12-05T03:59:59Z")),
        "Saturday morning is Friday's window"
    );
    assert!(!w.is_open(at("2026-12-05T04:00:00Z")));
    // Friday morning is Thursday's night, and Thursday is not listed.
    assert!(!w.is_open(at("2026-12-04T02:00:00Z")));
    assert_eq!(
        opening(&w, "2026-12-05T04:00:00Z"),
        (
            "2026-12-11T22:00:00+00:00".to_owned(),
            "2026-12-12T04:00:00+00:00".to_owned()
        )
    );
    // While open, the opening is the current one.
    assert_eq!(
        opening(&w, "2026-12-05T01:00:00Z"),
        (
            "2026-12-04T22:00:00+00:00".to_owned(),
            "2026-12-05T04:00:00+00:00".to_owned()
        )
    );
}

#[test]
fn the_week_wraps_from_sunday_to_monday() {
    let w = window("days=sun start=23:00 end=01:00 tz=UTC");
    // Monday 2026-12-07 00:30 is inside Sunday's window.
    assert!(w.is_open(at("2026-12-07T00:30:00Z")));
    assert!(!w.is_open(at("2026-12-07T01:00:00Z")));
    // From Monday the next opening is six days on.
    assert_eq!(
        opening(&w, "2026-12-07T01:00:00Z").0,
        "2026-12-13T23:00:00+00:00"
    );
}

#[test]
fn every_day_listed_and_whole_days_merge() {
    let always = window("days=mon-sun start=00:00 end=24:00 tz=Europe/Berlin");
    for instant in [
        "2026-03-29T01:00:00Z",
        "2026-10-25T01:30:00Z",
        "2026-12-06T23:00:00Z",
    ] {
        assert!(always.is_open(at(instant)), "{instant}");
    }
    let two = window("days=mon,tue start=00:00 end=24:00 tz=UTC");
    assert_eq!(
        opening(&two, "2026-12-07T12:00:00Z"),
        (
            "2026-12-07T00:00:00+00:00".to_owned(),
            "2026-12-09T00:00:00+00:00".to_owned()
        ),
        "Monday and Tuesday are one opening"
    );
    let every_evening = window("days=mon-sun start=22:00 end=02:00 tz=UTC");
    assert!(every_evening.is_open(at("2026-12-07T01:00:00Z")));
    assert!(!every_evening.is_open(at("2026-12-07T12:00:00Z")));
}

#[test]
fn a_start_the_clock_skips_opens_when_it_jumps() {
    // Europe/Berlin, Sunday 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00Z).
    let w = window("days=sun start=02:30 end=05:00 tz=Europe/Berlin");
    assert_eq!(
        opening(&w, "2026-03-28T12:00:00Z"),
        (
            "2026-03-29T03:00:00+02:00".to_owned(),
            "2026-03-29T05:00:00+02:00".to_owned()
        )
    );
    assert!(!w.is_open(at("2026-03-29T00:59:59Z")));
    assert!(w.is_open(at("2026-03-29T01:00:00Z")));
    // A window lying wholly in the skipped hour is empty that day: the next one is a week later.
    let skipped = window("days=sun start=02:00 end=03:00 tz=Europe/Berlin");
    assert!(!skipped.is_open(at("2026-03-29T01:00:00Z")));
    assert_eq!(
        opening(&skipped, "2026-03-28T12:00:00Z").0,
        "2026-04-05T02:00:00+02:00"
    );
    // Crossing the night of the jump, the window is an hour shorter in real time.
    let night = window("days=sat start=22:00 end=04:00 tz=Europe/Berlin");
    let o = night.next_open(at("2026-03-28T12:00:00Z")).unwrap();
    assert_eq!(
        o.closes.timestamp().duration_since(o.opens.timestamp()),
        SignedDuration::from_hours(5)
    );
}

#[test]
fn a_time_the_clock_shows_twice_means_the_first() {
    // Europe/Berlin, Sunday 2026-10-25: 03:00 CEST falls back to 02:00 CET (01:00Z).
    let w = window("days=sun start=02:30 end=03:30 tz=Europe/Berlin");
    assert_eq!(
        opening(&w, "2026-10-24T12:00:00Z"),
        (
            "2026-10-25T02:30:00+02:00".to_owned(),
            "2026-10-25T03:30:00+01:00".to_owned()
        )
    );
    // So it is open for two real hours, including the repeated 02:30 CET.
    assert!(w.is_open(at("2026-10-25T01:30:00Z")));
    assert!(!w.is_open(at("2026-10-25T02:30:00Z")));
    let night = window("days=sat start=22:00 end=04:00 tz=Europe/Berlin");
    let o = night.next_open(at("2026-10-24T12:00:00Z")).unwrap();
    assert_eq!(
        o.closes.timestamp().duration_since(o.opens.timestamp()),
        SignedDuration::from_hours(7)
    );
}

#[test]
fn closed_gate_says_when_the_window_opens() {
    let w = window("days=mon start=22:00 end=04:00 tz=Europe/Berlin");
    // Monday 2026-12-07 17:48 UTC is 18:48 in Berlin: 3h12m before 22:00.
    match w.gate(at("2026-12-07T17:48:00Z")) {
        Gate::Closed { opens, message } => {
            assert_eq!(
                message,
                "outside maintenance window days=mon start=22:00 end=04:00 tz=Europe/Berlin: \
                 opens 2026-12-07T22:00:00+01:00 (in 3h12m)"
            );
            assert_eq!(opens.unwrap().timestamp(), at("2026-12-07T21:00:00Z"));
        }
        open => panic!("expected closed, got {open:?}"),
    }
    match w.gate(at("2026-12-07T23:00:00Z")) {
        Gate::Open { closes } => assert_eq!(closes.timestamp(), at("2026-12-08T03:00:00Z")),
        closed => panic!("expected open, got {closed:?}"),
    }
    // Just after it closes, the message counts the days to next Monday.
    match w.gate(at("2026-12-08T03:00:00Z")) {
        Gate::Closed { message, .. } => assert!(message.ends_with("(in 6d18h)"), "{message}"),
        open => panic!("expected closed, got {open:?}"),
    }
}

#[test]
fn waits_in_words_round_up_to_the_minute() {
    let words = |secs: i64| in_words(SignedDuration::from_secs(secs));
    assert_eq!(words(0), "0m");
    assert_eq!(words(10), "1m");
    assert_eq!(words(60), "1m");
    assert_eq!(words(61), "2m");
    assert_eq!(words(3 * 3600 + 12 * 60), "3h12m");
    assert_eq!(words(3 * 3600), "3h");
    assert_eq!(words(86_400 + 5 * 60), "1d5m");
    assert_eq!(in_words(SignedDuration::from_millis(1)), "1m");
}

#[test]
fn bad_specs_name_the_problem() {
    let err = |spec: &str| Window::parse(spec).unwrap_err();
    let cases: &[(&str, WindowError, &str)] = &[
        (
            "days= start=22:00 end=04:00",
            WindowError::EmptyDays,
            "days is empty",
        ),
        (
            "days=mon,,tue start=22:00 end=04:00",
            WindowError::EmptyDays,
            "days is empty",
        ),
        (
            "start=22:00 end=04:00",
            WindowError::Missing("days"),
            "days missing",
        ),
        (
            "days=mon end=04:00",
            WindowError::Missing("start"),
            "start missing",
        ),
        (
            "days=mon start=04:00",
            WindowError::Missing("end"),
            "end missing",
        ),
        (
            "days=mon start=22:00 end=22:00",
            WindowError::StartEqualsEnd("22:00".into()),
            "start=00:00 end=24:00",
        ),
        (
            "days=mon start=00:00 end=00:00",
            WindowError::StartEqualsEnd("00:00".into()),
            "both 00:00",
        ),
        (
            "days=funday start=22:00 end=04:00",
            WindowError::BadDay("funday".into()),
            "\"funday\" is not a day",
        ),
        (
            "days=mon-xyz start=22:00 end=04:00",
            WindowError::BadDay("xyz".into()),
            "\"xyz\"",
        ),
        (
            "days=mon start=25:00 end=04:00",
            bad_time("start", "25:00", "23:59"),
            "start \"25:00\"",
        ),
        (
            "days=mon start=24:00 end=04:00",
            bad_time("start", "24:00", "23:59"),
            "23:59",
        ),
        (
            "days=mon start=22:00 end=24:01",
            bad_time("end", "24:01", "24:00"),
            "end \"24:01\"",
        ),
        (
            "days=mon start=9:5 end=10:00",
            bad_time("start", "9:5", "23:59"),
            "HH:MM",
        ),
        (
            "days=mon start=22:60 end=04:00",
            bad_time("start", "22:60", "23:59"),
            "22:60",
        ),
        (
            "days=mon start=+1:00 end=04:00",
            bad_time("start", "+1:00", "23:59"),
            "+1:00",
        ),
        (
            "days=mon start=22:00 end=04:00 tz=Mars/Olympus",
            WindowError::UnknownTimeZone("Mars/Olympus".into()),
            "Mars/Olympus",
        ),
        (
            "days=mon start=22:00 end=04:00 zone=UTC",
            WindowError::UnknownKey("zone".into()),
            "unknown key \"zone\"",
        ),
        (
            "days=mon days=tue start=22:00 end=04:00",
            WindowError::Duplicate("days"),
            "days given twice",
        ),
        (
            "mon 22:00-04:00",
            WindowError::NotKeyValue("mon".into()),
            "\"mon\" is not key=value",
        ),
        ("", WindowError::Missing("days"), "days missing"),
    ];
    for (spec, expected, words) in cases {
        let got = err(spec);
        assert_eq!(&got, expected, "{spec}");
        assert!(got.to_string().contains(words), "{spec}: {got}");
    }
    let long = format!("days=mon start=22:00 end=04:00 tz={}", "A".repeat(300));
    assert_eq!(err(&long), WindowError::TooLong);
}

fn bad_time(key: &'static str, value: &str, max: &'static str) -> WindowError {
    WindowError::BadTime {
        key,
        value: value.to_owned(),
        max,
    }
}

#[test]
fn the_annotation_overrides_the_setting() {
    let setting = window("days=sat start=01:00 end=05:00 tz=UTC");
    let own = "days=mon start=02:00 end=03:00 tz=UTC";
    assert_eq!(
        effective(Some(&setting), Some(own)).unwrap(),
        Some(window(own))
    );
    assert_eq!(effective(None, Some(own)).unwrap(), Some(window(own)));
    // `none` lifts the setting's window for this Machine; blank or absent leaves it in force.
    assert_eq!(effective(Some(&setting), Some(" None ")).unwrap(), None);
    assert_eq!(
        effective(Some(&setting), Some("  ")).unwrap(),
        Some(setting.clone())
    );
    assert_eq!(
        effective(Some(&setting), None).unwrap(),
        Some(setting.clone())
    );
    assert_eq!(effective(None, None).unwrap(), None);
    let e = effective(Some(&setting), Some("days=mon")).unwrap_err();
    assert_eq!(e.problem, WindowError::Missing("start"));
    assert_eq!(
        e.to_string(),
        "annotation inplace-updater.dev/maintenance-window: invalid value \"days=mon\": \
         start missing (e.g. \"days=mon-fri start=22:00 end=04:00\")"
    );
    assert_eq!(parse_setting("").unwrap(), None);
    assert_eq!(parse_setting("NONE").unwrap(), None);
}

#[test]
fn serialises_as_its_spec() {
    let w = window("days=tue,thu start=22:15 end=23:45 tz=America/New_York");
    let json = serde_json::to_string(&w).unwrap();
    assert_eq!(
        json,
        "\"days=tue,thu start=22:15 end=23:45 tz=America/New_York\""
    );
    assert_eq!(serde_json::from_str::<Window>(&json).unwrap(), w);
    let bad = serde_json::from_str::<Window>("\"days=tue\"").unwrap_err();
    assert!(bad.to_string().contains("start missing"), "{bad}");
}

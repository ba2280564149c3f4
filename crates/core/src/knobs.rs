//! The operator's knobs on a desired Machine: the `inplace-updater.dev/*` annotations, named here once and read
//! here once. UpdateMachine gets them as [`Knobs`] from the hook; nothing else reads these annotations.
//!
//! A knob is an annotation because CAPI keeps a Machine's annotations when it hands the desired Machine to
//! UpdateMachine: an operator can steer one Machine's update with `kubectl annotate` and no new API.

use inplace_agent_api::OnFailure;
use serde_json::Value;

/// Pauses the Machine's updates (any non-empty value: the reason, shown in messages).
pub const PAUSE_ANNOTATION: &str = "inplace-updater.dev/paused";
/// Every new value cancels the Machine's current run once.
pub const CANCEL_ANNOTATION: &str = "inplace-updater.dev/cancel";
/// Every new value restarts the Machine's failed run once.
pub const RETRY_ANNOTATION: &str = "inplace-updater.dev/retry";
/// Accepts one desired state no CanUpdate answer judged: the value must be the state's fingerprint as a refusal
/// message shows it.
pub const ACCEPT_UNJUDGED_ANNOTATION: &str = "inplace-updater.dev/accept-unjudged";
/// The Machine's own maintenance window (overrides the ExtensionConfig setting; see [`crate::window`]).
pub const WINDOW_ANNOTATION: &str = "inplace-updater.dev/maintenance-window";
/// What the agent does when a step fails: `rollback` (undo the run, the default) or `hold` (leave the node as it
/// failed, for inspection); overrides the ExtensionConfig setting `onFailure`.
pub const ON_FAILURE_ANNOTATION: &str = "inplace-updater.dev/on-failure";
/// Lets this Machine start a paced change without waiting for the soak after the latest finish (`"true"`); the
/// canaries, gates, brake and budget still apply.
pub const SKIP_SOAK_ANNOTATION: &str = "inplace-updater.dev/skip-soak";
/// Longest pause, cancel or retry value accepted, in bytes (each is kept in the Machine record).
pub const MAX_KNOB_VALUE_BYTES: usize = 256;

/// The knobs of one desired Machine, as its annotations set them. Empty values count as absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Knobs {
    /// [`PAUSE_ANNOTATION`]'s value.
    pub paused: Option<String>,
    /// [`CANCEL_ANNOTATION`]'s value.
    pub cancel: Option<String>,
    /// [`RETRY_ANNOTATION`]'s value.
    pub retry: Option<String>,
    /// [`ACCEPT_UNJUDGED_ANNOTATION`]'s value (not bounded: it is compared, never stored).
    pub accept_unjudged: Option<String>,
    /// [`WINDOW_ANNOTATION`]'s text, parsed against the setting by [`crate::window::effective`].
    pub window: Option<String>,
    /// [`ON_FAILURE_ANNOTATION`]'s value.
    pub on_failure: Option<OnFailure>,
    /// [`SKIP_SOAK_ANNOTATION`] is `"true"`.
    pub skip_soak: bool,
}

/// A knob whose value cannot be used; the hook answers `Failure` with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KnobError {
    /// The annotation holds a JSON value that is not a string.
    #[error("annotation {name} must be a string, not {value}")]
    NotAString {
        /// The annotation.
        name: &'static str,
        /// The value, as JSON.
        value: String,
    },
    /// The value is longer than [`MAX_KNOB_VALUE_BYTES`].
    #[error("the {name} value is {bytes} bytes, over the limit of {MAX_KNOB_VALUE_BYTES}{hint}")]
    TooLong {
        /// The annotation.
        name: &'static str,
        /// The value's length.
        bytes: usize,
        /// What to use instead, when there is a usual form (`; use e.g. $(date +%s)`).
        hint: &'static str,
    },
    /// The value is not one of those the annotation accepts.
    #[error("annotation {name}: invalid value {value:?}, expected {expected}")]
    Invalid {
        /// The annotation.
        name: &'static str,
        /// The value (bounded: at most [`MAX_KNOB_VALUE_BYTES`] of it).
        value: String,
        /// What would have been accepted.
        expected: &'static str,
    },
}

/// `rollback` or `hold`, as the `onFailure` setting and the on-failure annotation spell them.
pub fn parse_on_failure(value: &str) -> Option<OnFailure> {
    match value {
        "rollback" => Some(OnFailure::Rollback),
        "hold" => Some(OnFailure::Hold),
        _ => None,
    }
}

/// What to put in a retry value instead of a long one.
const RETRY_HINT: &str = "; use e.g. $(date +%s)";

/// Checks a retry value from an annotation or `inplace-updater retry`.
pub fn check_retry_value(value: &str) -> Result<(), KnobError> {
    bounded(RETRY_ANNOTATION, value, RETRY_HINT)
}

fn bounded(name: &'static str, value: &str, hint: &'static str) -> Result<(), KnobError> {
    if value.len() > MAX_KNOB_VALUE_BYTES {
        return Err(KnobError::TooLong {
            name,
            bytes: value.len(),
            hint,
        });
    }
    Ok(())
}

impl Knobs {
    /// Reads the knobs of a desired Machine object (its `metadata.annotations`).
    pub fn of(machine: &Value) -> Result<Knobs, KnobError> {
        let annotations = machine.pointer("/metadata/annotations");
        let text = |name: &'static str| -> Result<Option<&str>, KnobError> {
            match annotations.and_then(|a| a.get(name)) {
                None => Ok(None),
                Some(Value::String(text)) if text.is_empty() => Ok(None),
                Some(Value::String(text)) => Ok(Some(text)),
                Some(other) => Err(KnobError::NotAString {
                    name,
                    value: other.to_string(),
                }),
            }
        };
        let kept = |name: &'static str, hint: &'static str| -> Result<Option<String>, KnobError> {
            let value = text(name)?;
            if let Some(value) = value {
                bounded(name, value, hint)?;
            }
            Ok(value.map(str::to_owned))
        };
        // Read in the order UpdateMachine has always judged them, so the first bad one is named.
        let window = annotations
            .and_then(|a| a.get(WINDOW_ANNOTATION))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let accept_unjudged = annotations
            .and_then(|a| a.get(ACCEPT_UNJUDGED_ANNOTATION))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let retry = kept(RETRY_ANNOTATION, RETRY_HINT)?;
        let on_failure = match text(ON_FAILURE_ANNOTATION)? {
            None => None,
            Some(value) => Some(parse_on_failure(value).ok_or_else(|| KnobError::Invalid {
                name: ON_FAILURE_ANNOTATION,
                value: value.chars().take(MAX_KNOB_VALUE_BYTES).collect(),
                expected: "\"rollback\" or \"hold\"",
            })?),
        };
        let skip_soak = match text(SKIP_SOAK_ANNOTATION)? {
            None | Some("false") => false,
            Some("true") => true,
            Some(value) => {
                return Err(KnobError::Invalid {
                    name: SKIP_SOAK_ANNOTATION,
                    value: value.chars().take(MAX_KNOB_VALUE_BYTES).collect(),
                    expected: "\"true\" or \"false\"",
                });
            }
        };
        Ok(Knobs {
            skip_soak,
            paused: kept(PAUSE_ANNOTATION, "")?,
            cancel: kept(CANCEL_ANNOTATION, "")?,
            retry,
            accept_unjudged,
            window,
            on_failure,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn machine(annotations: Value) -> Value {
        json!({"metadata": {"name": "m", "annotations": annotations}})
    }

    #[test]
    fn every_knob_is_read_and_empty_values_are_absent() {
        let knobs = Knobs::of(&machine(json!({
            PAUSE_ANNOTATION: "alice: disk check",
            CANCEL_ANNOTATION: "",
            RETRY_ANNOTATION: "1700000000",
            ACCEPT_UNJUDGED_ANNOTATION: "ab12",
            WINDOW_ANNOTATION: "days=mon start=01:00 end=03:00 tz=UTC",
        })))
        .unwrap();
        assert_eq!(knobs.paused.as_deref(), Some("alice: disk check"));
        assert_eq!(knobs.cancel, None);
        assert_eq!(knobs.retry.as_deref(), Some("1700000000"));
        assert_eq!(knobs.accept_unjudged.as_deref(), Some("ab12"));
        assert!(knobs.window.is_some());
        assert_eq!(Knobs::of(&json!({})).unwrap(), Knobs::default());
    }

    #[test]
    fn bad_values_name_the_annotation() {
        let err = Knobs::of(&machine(json!({CANCEL_ANNOTATION: true})))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "annotation inplace-updater.dev/cancel must be a string, not true"
        );
        let long = "x".repeat(MAX_KNOB_VALUE_BYTES + 1);
        let err = Knobs::of(&machine(json!({PAUSE_ANNOTATION: long})))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "the inplace-updater.dev/paused value is 257 bytes, over the limit of 256"
        );
        let err = Knobs::of(&machine(json!({RETRY_ANNOTATION: long})))
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with("over the limit of 256; use e.g. $(date +%s)"),
            "{err}"
        );
        assert!(check_retry_value(&"1".repeat(MAX_KNOB_VALUE_BYTES)).is_ok());
    }

    #[test]
    fn on_failure_is_rollback_or_hold_and_anything_else_is_named() {
        let of = |value: &str| Knobs::of(&machine(json!({ ON_FAILURE_ANNOTATION: value })));
        assert_eq!(of("hold").unwrap().on_failure, Some(OnFailure::Hold));
        assert_eq!(
            of("rollback").unwrap().on_failure,
            Some(OnFailure::Rollback)
        );
        assert_eq!(of("").unwrap().on_failure, None);
        let error = of("Hold").unwrap_err().to_string();
        assert_eq!(
            error,
            "annotation inplace-updater.dev/on-failure: invalid value \"Hold\", expected \"rollback\" or \"hold\""
        );
    }

    #[test]
    fn skip_soak_is_true_false_or_refused_by_name() {
        let of = |v: &str| Knobs::of(&machine(json!({SKIP_SOAK_ANNOTATION: v})));
        assert!(of("true").unwrap().skip_soak);
        assert!(!of("false").unwrap().skip_soak);
        assert!(!Knobs::of(&machine(json!({}))).unwrap().skip_soak);
        let err = of("yes").unwrap_err().to_string();
        assert!(
            err.contains(SKIP_SOAK_ANNOTATION) && err.contains("\"true\" or \"false\""),
            "{err}"
        );
    }
}

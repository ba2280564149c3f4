//! A registration's rollout settings: how a change proves itself before it spreads across the fleet — the
//! first `canary` Machines take it alone, the next start only `soak` after a Machine finished with every
//! health gate passing, and `maxFailures` failed Machines halt it. Parsed from the ExtensionConfig settings
//! beside the others ([`crate::Settings::pacing`]); with none of them set a registration is not paced (today's
//! behaviour). Pure: dispatch decides with these, the store and the clock are its.

use std::time::Duration;

use serde::Serialize;

use crate::duration::parse_go_duration;
use crate::settings::{SettingsError, invalid};

/// Setting: how many Machines take a change first, alone (fleet-wide, per change).
pub const CANARY_SETTING: &str = "canary";
/// Setting: how long after a Machine finished a change the next Machine may start it (a Go duration).
pub const SOAK_SETTING: &str = "soak";
/// Setting: how many failed or rolled-back Machines halt a change once past its canaries.
pub const MAX_FAILURES_SETTING: &str = "maxFailures";
/// Setting: the health gates (names in the server's gates file) that must pass before a run is recorded.
pub const HEALTH_GATES_SETTING: &str = "healthGates";

/// Most canaries a change may ask for: the change record lists each of them.
pub const MAX_CANARY: u32 = 100;
/// Longest soak accepted (a longer one is more likely a typo than a plan).
pub const MAX_SOAK: Duration = Duration::from_secs(7 * 24 * 3600);
/// Most health gates one registration may name.
pub const MAX_HEALTH_GATES: usize = 16;
/// Most failures `maxFailures` may allow before the brake.
pub const MAX_MAX_FAILURES: u32 = 10_000;
/// Canaries when a registration is paced but does not say how many.
pub const DEFAULT_CANARY: u32 = 1;
/// Failures that halt a change past its canaries when `maxFailures` is not set (in its canaries, one always
/// does).
pub const DEFAULT_MAX_FAILURES: u32 = 1;

/// The rollout settings as set (`None`: not set).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pacing {
    /// `canary`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary: Option<u32>,
    /// `soak`, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soak_ms: Option<u64>,
    /// `maxFailures`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_failures: Option<u32>,
    /// `healthGates`: gate names, in the order given, without repeats.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub health_gates: Vec<String>,
}

impl Pacing {
    /// Whether `key` is one of these settings.
    pub fn owns(key: &str) -> bool {
        [
            CANARY_SETTING,
            SOAK_SETTING,
            MAX_FAILURES_SETTING,
            HEALTH_GATES_SETTING,
        ]
        .contains(&key)
    }

    /// Sets `key` (one of [`Pacing::owns`]) from its `value`; an empty value unsets it.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), SettingsError> {
        let v = value.trim();
        match key {
            CANARY_SETTING => {
                self.canary = optional(v, |v| {
                    v.parse::<u32>()
                        .ok()
                        .filter(|n| *n <= MAX_CANARY)
                        .ok_or_else(|| invalid(CANARY_SETTING, value, "a whole number 0..=100"))
                })?
            }
            SOAK_SETTING => {
                self.soak_ms = optional(v, |v| {
                    let soak = parse_go_duration(v)
                        .ok()
                        .filter(|d| *d <= MAX_SOAK)
                        .ok_or_else(|| {
                            invalid(
                                SOAK_SETTING,
                                value,
                                "a duration up to 168h, e.g. 10m or 1h30m",
                            )
                        })?;
                    Ok(u64::try_from(soak.as_millis()).unwrap_or(u64::MAX))
                })?
            }
            MAX_FAILURES_SETTING => {
                self.max_failures = optional(v, |v| {
                    v.parse::<u32>()
                        .ok()
                        .filter(|n| (1..=MAX_MAX_FAILURES).contains(n))
                        .ok_or_else(|| {
                            invalid(MAX_FAILURES_SETTING, value, "a whole number 1..=10000")
                        })
                })?
            }
            HEALTH_GATES_SETTING => {
                let mut gates: Vec<String> = Vec::new();
                for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    if !gate_name(name) {
                        return Err(invalid(
                            HEALTH_GATES_SETTING,
                            value,
                            "comma-separated gate names (letters, digits, '-', '_', at most 63 each)",
                        ));
                    }
                    if !gates.iter().any(|g| g == name) {
                        gates.push(name.to_owned());
                    }
                }
                if gates.len() > MAX_HEALTH_GATES {
                    return Err(invalid(
                        HEALTH_GATES_SETTING,
                        value,
                        "at most 16 comma-separated gate names",
                    ));
                }
                self.health_gates = gates;
            }
            _ => {
                return Err(SettingsError::UnknownKey {
                    key: key.to_owned(),
                });
            }
        }
        Ok(())
    }

    /// Whether changes of this registration are paced at all (any of the settings is set).
    pub fn is_on(&self) -> bool {
        self.canary.is_some()
            || self.soak_ms.is_some()
            || self.max_failures.is_some()
            || !self.health_gates.is_empty()
    }

    /// Canaries per change ([`DEFAULT_CANARY`] when paced without saying; 0 when not paced).
    pub fn canaries(&self) -> u32 {
        match self.canary {
            Some(n) => n,
            None if self.is_on() => DEFAULT_CANARY,
            None => 0,
        }
    }

    /// The soak in milliseconds (0 when not set).
    pub fn soak(&self) -> u64 {
        self.soak_ms.unwrap_or(0)
    }

    /// Failures that halt a change past its canaries.
    pub fn failures_allowed(&self) -> u32 {
        self.max_failures.unwrap_or(DEFAULT_MAX_FAILURES)
    }
}

/// A gate name: a store key segment and a YAML key both.
fn gate_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn optional<T>(
    v: &str,
    parse: impl FnOnce(&str) -> Result<T, SettingsError>,
) -> Result<Option<T>, SettingsError> {
    if v.is_empty() {
        Ok(None)
    } else {
        parse(v).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pacing(pairs: &[(&str, &str)]) -> Result<Pacing, SettingsError> {
        let mut p = Pacing::default();
        for (k, v) in pairs {
            p.set(k, v)?;
        }
        Ok(p)
    }

    #[test]
    fn nothing_set_is_not_paced() {
        let p = Pacing::default();
        assert!(!p.is_on());
        assert_eq!(p.canaries(), 0);
        assert_eq!(p.soak(), 0);
    }

    #[test]
    fn any_setting_paces_with_one_canary_by_default() {
        let p = pacing(&[("soak", "10m")]).unwrap();
        assert!(p.is_on());
        assert_eq!(p.canaries(), 1);
        assert_eq!(p.soak(), 600_000);
        assert_eq!(p.failures_allowed(), 1);
        let p = pacing(&[("canary", "0"), ("maxFailures", "3")]).unwrap();
        assert!(p.is_on());
        assert_eq!(p.canaries(), 0);
        assert_eq!(p.failures_allowed(), 3);
    }

    #[test]
    fn gates_are_names_kept_in_order_once() {
        let p = pacing(&[("healthGates", " storage, critical-alerts,storage ")]).unwrap();
        assert_eq!(p.health_gates, ["storage", "critical-alerts"]);
        let err = pacing(&[("healthGates", "a b")]).unwrap_err().to_string();
        assert!(
            err.contains("healthGates") && err.contains("gate names"),
            "{err}"
        );
    }

    #[test]
    fn bad_values_name_the_setting_and_what_is_allowed() {
        for (key, value, says) in [
            ("canary", "-1", "0..=100"),
            ("canary", "101", "0..=100"),
            ("soak", "10 minutes", "duration"),
            ("soak", "200h", "168h"),
            ("maxFailures", "0", "1..=10000"),
        ] {
            let err = pacing(&[(key, value)]).unwrap_err().to_string();
            assert!(
                err.contains(key) && err.contains(value) && err.contains(says),
                "{key}={value}: {err}"
            );
        }
    }

    #[test]
    fn an_empty_value_unsets() {
        let p = pacing(&[("soak", "1h"), ("soak", "")]).unwrap();
        assert!(!p.is_on());
    }
}

//! When an agent token is rotated, and what of a rotation refuses a token: pure decisions over Unix-ms times
//! and the stored rotation record, tested without a store.
//!
//! A token is offered a successor once [`TOKEN_ROTATE_AT_FRACTION`] of its lifetime has passed (a token
//! without expiry is never rotated). The successor has the same scope and the same lifetime, counted from its
//! minting. At most one successor is minted per token and agent every [`TOKEN_REOFFER_INTERVAL`] (an answer
//! lost on the way is made good by the next one), at most [`MAX_OFFERED_SUCCESSORS`] in all. Once one of them
//! is used, its siblings are refused, and the rotated token is refused after the grace period.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The part of its lifetime after which a token is offered a successor: 2/3 (numerator, denominator).
pub const TOKEN_ROTATE_AT_FRACTION: (u64, u64) = (2, 3);
/// Longest time between two successors minted for the same token and agent (an offer lost on its way is
/// replaced after this long; a replica that did not mint it does not mint another one sooner).
pub const TOKEN_REOFFER_INTERVAL: Duration = Duration::from_secs(600);
/// Most successors ever minted for one token and agent.
pub const MAX_OFFERED_SUCCESSORS: usize = 16;
/// Lifetime of a token made by `token create` without `--ttl` (one year), and the lifetime assumed for a
/// token-file line with `expires=` but no `issued=`: such a line counts as issued this long before it expires.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(8760 * 3600);

/// When a token was issued and when it expires (Unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lifetime {
    /// Issued.
    pub issued_ms: u64,
    /// Expires.
    pub expires_ms: u64,
}

impl Lifetime {
    /// The lifetime of a token-file line: none without `expires=` (never rotated); without `issued=`, issued
    /// [`DEFAULT_TOKEN_TTL`] before it expires.
    pub fn of_line(issued_ms: Option<u64>, expires_ms: Option<u64>) -> Option<Lifetime> {
        let expires_ms = expires_ms?;
        let issued_ms = issued_ms
            .filter(|issued| *issued < expires_ms)
            .unwrap_or_else(|| expires_ms.saturating_sub(DEFAULT_TOKEN_TTL.as_millis() as u64));
        Some(Lifetime {
            issued_ms,
            expires_ms,
        })
    }

    /// Whether the retention sweep may delete the record of a minted token with this lifetime once everything
    /// is older than `horizon_ms`: it expired by then (an unused successor that has not expired is an agent's
    /// next token, and stays).
    pub fn sweepable(&self, horizon_ms: u64) -> bool {
        self.expires_ms <= horizon_ms
    }

    /// Whether it has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        now_ms >= self.expires_ms
    }

    /// When a successor is first offered.
    pub fn rotate_at_ms(&self) -> u64 {
        let (num, den) = TOKEN_ROTATE_AT_FRACTION;
        let span = self.expires_ms.saturating_sub(self.issued_ms);
        self.issued_ms + span / den * num + span % den * num / den
    }

    /// Whether a successor is due at `now_ms` (past the fraction, not yet expired).
    pub fn rotation_due(&self, now_ms: u64) -> bool {
        now_ms >= self.rotate_at_ms() && !self.expired(now_ms)
    }

    /// The lifetime of a successor minted at `now_ms`: as long as this one's.
    pub fn successor(&self, now_ms: u64) -> Lifetime {
        Lifetime {
            issued_ms: now_ms,
            expires_ms: now_ms + self.expires_ms.saturating_sub(self.issued_ms),
        }
    }
}

/// The rotation of one token for one agent, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rotation {
    /// When the last successor was minted (Unix ms).
    pub offered_ms: u64,
    /// The hex SHA-256 of every successor minted, oldest first.
    pub successors: Vec<String>,
    /// The successor first used, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<Used>,
}

/// The successor that was used first, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Used {
    /// Its hex SHA-256.
    pub successor: String,
    /// When the server first saw it (Unix ms).
    pub at_ms: u64,
}

impl Rotation {
    /// Whether a new successor may be minted at `now_ms`.
    pub fn may_offer(rotation: Option<&Rotation>, now_ms: u64) -> bool {
        let Some(rotation) = rotation else {
            return true;
        };
        rotation.used.is_none()
            && rotation.successors.len() < MAX_OFFERED_SUCCESSORS
            && now_ms >= rotation.offered_ms + TOKEN_REOFFER_INTERVAL.as_millis() as u64
    }

    /// The rotation after minting `successor` at `now_ms`.
    pub fn offered(rotation: Option<&Rotation>, successor: String, now_ms: u64) -> Rotation {
        let mut next = rotation.cloned().unwrap_or_default();
        next.offered_ms = now_ms;
        next.successors.push(successor);
        next
    }

    /// Whether the rotated token is refused at `now_ms`: a successor was used more than `grace` ago.
    pub fn retires_predecessor(&self, now_ms: u64, grace: Duration) -> bool {
        self.used
            .as_ref()
            .is_some_and(|used| now_ms >= used.at_ms + grace.as_millis() as u64)
    }

    /// Whether the retention sweep may delete this rotation once everything is older than `horizon_ms`: every
    /// successor minted in it expired by then (`successor_expiry` gives a successor's expiry, `None` when its
    /// record is gone, which the sweep does only after it expired). Until then the rotation still refuses the
    /// unused siblings and, the predecessor expiring before its successors, the retired predecessor.
    pub fn sweepable(
        &self,
        successor_expiry: impl Fn(&str) -> Option<u64>,
        horizon_ms: u64,
    ) -> bool {
        self.offered_ms <= horizon_ms
            && self
                .successors
                .iter()
                .all(|s| successor_expiry(s).is_none_or(|expires| expires <= horizon_ms))
    }

    /// What using `successor` at `now_ms` does: `Ok(Some(rotation))` to record it as the one used,
    /// `Ok(None)` when it is already recorded, `Err(())` when a sibling was used first (refused).
    #[allow(clippy::result_unit_err)]
    pub fn on_use(&self, successor: &str, now_ms: u64) -> Result<Option<Rotation>, ()> {
        match &self.used {
            Some(used) if used.successor == successor => Ok(None),
            Some(_) => Err(()),
            None => Ok(Some(Rotation {
                used: Some(Used {
                    successor: successor.to_string(),
                    at_ms: now_ms,
                }),
                ..self.clone()
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    #[test]
    fn a_token_is_rotated_after_two_thirds_of_its_life_and_not_once_expired() {
        let life = Lifetime {
            issued_ms: 0,
            expires_ms: 3 * HOUR,
        };
        assert!(!life.rotation_due(2 * HOUR - 1));
        assert!(life.rotation_due(2 * HOUR));
        assert!(!life.rotation_due(3 * HOUR), "expired: re-enrol instead");
        assert_eq!(
            life.successor(2 * HOUR),
            Lifetime {
                issued_ms: 2 * HOUR,
                expires_ms: 5 * HOUR
            },
            "same lifetime as its predecessor"
        );
    }

    #[test]
    fn lines_without_expiry_are_never_rotated_and_lines_without_issue_time_get_the_default_life() {
        assert_eq!(Lifetime::of_line(Some(5), None), None);
        let ttl = DEFAULT_TOKEN_TTL.as_millis() as u64;
        let life = Lifetime::of_line(None, Some(2 * ttl)).unwrap();
        assert_eq!(life.issued_ms, ttl);
        assert_eq!(life.rotate_at_ms(), ttl + ttl / 3 * 2);
        // An issue time after the expiry is nonsense: the default rule applies.
        assert_eq!(
            Lifetime::of_line(Some(3 * ttl), Some(2 * ttl))
                .unwrap()
                .issued_ms,
            ttl
        );
    }

    #[test]
    fn successors_are_minted_once_per_interval_and_never_after_one_was_used() {
        let interval = TOKEN_REOFFER_INTERVAL.as_millis() as u64;
        assert!(Rotation::may_offer(None, 0));
        let once = Rotation::offered(None, "a".into(), 1000);
        assert!(!Rotation::may_offer(Some(&once), 1000 + interval - 1));
        assert!(Rotation::may_offer(Some(&once), 1000 + interval));
        let twice = Rotation::offered(Some(&once), "b".into(), 1000 + interval);
        assert_eq!(twice.successors, ["a", "b"]);
        let used = twice.on_use("b", 5).unwrap().unwrap();
        assert!(!Rotation::may_offer(Some(&used), u64::MAX / 2));
        assert_eq!(used.on_use("b", 9), Ok(None), "recorded once");
        assert_eq!(
            used.on_use("a", 9),
            Err(()),
            "the unused sibling is refused"
        );
        let mut many = None;
        for i in 0..MAX_OFFERED_SUCCESSORS as u64 {
            many = Some(Rotation::offered(
                many.as_ref(),
                i.to_string(),
                i * interval,
            ));
        }
        assert!(!Rotation::may_offer(many.as_ref(), u64::MAX / 2));
    }

    #[test]
    fn token_records_are_swept_only_once_every_token_they_vouch_for_expired() {
        let life = Lifetime {
            issued_ms: 0,
            expires_ms: 3 * HOUR,
        };
        assert!(!life.sweepable(3 * HOUR - 1), "an unused successor stays");
        assert!(life.sweepable(3 * HOUR));
        let rotation = Rotation::offered(
            Some(&Rotation::offered(None, "a".into(), HOUR)),
            "b".into(),
            2 * HOUR,
        );
        let expiry = |s: &str| match s {
            "a" => Some(4 * HOUR),
            "b" => Some(5 * HOUR),
            _ => None,
        };
        // (horizon, successors' expiries) → sweepable
        for (horizon, swept_a, want) in [
            (4 * HOUR, false, false),
            (5 * HOUR - 1, true, false),
            (5 * HOUR, false, true),
            (5 * HOUR, true, true),
        ] {
            let lookup = |s: &str| if swept_a && s == "a" { None } else { expiry(s) };
            assert_eq!(
                rotation.sweepable(lookup, horizon),
                want,
                "{horizon} {swept_a}"
            );
        }
    }

    #[test]
    fn the_rotated_token_is_refused_only_after_the_grace_period() {
        let grace = Duration::from_secs(60);
        let rotation = Rotation::offered(None, "a".into(), 0);
        assert!(!rotation.retires_predecessor(u64::MAX / 2, grace), "unused");
        let used = rotation.on_use("a", 1000).unwrap().unwrap();
        assert!(!used.retires_predecessor(1000 + 59_999, grace));
        assert!(used.retires_predecessor(1000 + 60_000, grace));
    }
}

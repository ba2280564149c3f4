//! Aggregation of Events as client-go's events broadcaster does it: the first occurrence of a (Machine, reason)
//! — the reason fixes the action and the type — is created; a repeat within [`SERIES_FINISH_AFTER`] of the last
//! one only counts, and the count reaches the API as the Event's `series` (`count`, `lastObservedTime`) by a
//! patch: the first repeat at once, later ones at most every [`SERIES_PATCH_INTERVAL`], the last when the
//! series ends. So a Machine held for hours is one Event with a count, never one per poll. New Events are bounded
//! per Machine and fleet-wide ([`super::rate`]); what a bound refuses is dropped and counted. Pure: the clock
//! is passed in, the writes are returned for the sender to make, and their outcomes are told back.

use std::collections::HashMap;
use std::time::Duration;

use inplace_agent_api::MachineRef;

use super::rate::{Limited, Rates};
use crate::dispatch::floor::outbox::{MachineEvent, Reason};

/// How long after its last occurrence a series ends: a later occurrence is a new Event (client-go: 6 minutes).
pub const SERIES_FINISH_AFTER: Duration = Duration::from_secs(6 * 60);
/// The shortest time between two patches of one series' count (the first repeat is patched at once).
pub const SERIES_PATCH_INTERVAL: Duration = Duration::from_secs(60);
/// The most series kept in memory; past it, the one observed longest ago is forgotten (its unwritten repeats
/// are dropped and counted).
pub const MAX_SERIES: usize = 50_000;
/// The longest `note` the events.k8s.io/v1 API accepts (1 kB); a longer message is cut there, marked `…`.
pub const NOTE_MAX_BYTES: usize = 1024;
/// The longest name of an object the API accepts (a DNS subdomain).
const NAME_MAX_BYTES: usize = 253;

/// Why an Event was not sent (the `reason` label of `inplace_updater_events_dropped_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dropped {
    /// The Machine spent its burst of new Events.
    MachineRate,
    /// The process spent its fleet-wide burst.
    FleetRate,
    /// The sender's queue was full.
    QueueFull,
    /// The API refused or could not be reached.
    ApiError,
    /// Its series was forgotten before its count was written ([`MAX_SERIES`]).
    Evicted,
}

impl Dropped {
    /// Every reason.
    pub const ALL: [Dropped; 5] = [
        Dropped::MachineRate,
        Dropped::FleetRate,
        Dropped::QueueFull,
        Dropped::ApiError,
        Dropped::Evicted,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::MachineRate => "machine_rate",
            Dropped::FleetRate => "fleet_rate",
            Dropped::QueueFull => "queue_full",
            Dropped::ApiError => "api_error",
            Dropped::Evicted => "evicted",
        }
    }
}

/// What one series is aggregated by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    /// The Machine the Event is on (`regarding`).
    pub machine: MachineRef,
    /// Its reason (which fixes its action and type).
    pub reason: Reason,
}

/// A series' count as the API keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Series {
    /// Occurrences, at least 2.
    pub count: u32,
    /// The last one (Unix ms).
    pub last_observed_ms: u64,
}

/// An Event to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// Its series.
    pub key: Key,
    /// `metadata.name`.
    pub name: String,
    /// The Machine's uid, when known.
    pub uid: Option<String>,
    /// The note, at most [`NOTE_MAX_BYTES`].
    pub note: String,
    /// The first occurrence (Unix ms): `eventTime`.
    pub event_time_ms: u64,
    /// Set when an Event that counted repeats is created again (its patch found it gone).
    pub series: Option<Series>,
}

/// A write for the sender to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Create this Event.
    Create(NewEvent),
    /// Patch the `series` of the Event `name` of `key`.
    Patch {
        /// The series.
        key: Key,
        /// The Event's name.
        name: String,
        /// The count to write.
        series: Series,
    },
}

/// How a write went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Written.
    Written,
    /// The Event is not there (404) or not as expected (409): a patch creates it again.
    Gone,
    /// Any other error (unreachable, 403, 5xx…).
    Failed,
}

/// What an occurrence became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// Make this write.
    Write(Write),
    /// Counted in its series; written later.
    Counted,
    /// Not sent.
    Dropped(Dropped),
}

#[derive(Debug, Clone)]
struct Entry {
    name: String,
    uid: Option<String>,
    note: String,
    first_ms: u64,
    last_ms: u64,
    count: u32,
    /// The count the API has (0 while its create is not confirmed).
    written: u32,
    written_ms: u64,
}

/// The series in memory and the rate bounds.
#[derive(Debug, Clone)]
pub struct Aggregator {
    series: HashMap<Key, Entry>,
    rates: Rates,
    sequence: u64,
    /// Occurrences dropped by an eviction since [`Aggregator::take_evicted`] was last asked.
    evicted: u64,
}

/// `message` cut to [`NOTE_MAX_BYTES`] at a character boundary, `…` marking the cut.
pub fn bounded_note(message: &str) -> String {
    if message.len() <= NOTE_MAX_BYTES {
        return message.to_owned();
    }
    let mut end = NOTE_MAX_BYTES - '…'.len_utf8();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

impl Aggregator {
    /// No series, every bucket full at `now_ms`.
    pub fn new(now_ms: u64) -> Aggregator {
        Aggregator {
            series: HashMap::new(),
            rates: Rates::new(now_ms),
            sequence: 0,
            evicted: 0,
        }
    }

    /// A fresh Event name for `machine` (its name, a dot, the time and a sequence number in hex, as client-go
    /// names them).
    fn name_for(&mut self, machine: &MachineRef, now_ms: u64) -> String {
        self.sequence += 1;
        let suffix = format!(".{now_ms:x}{:04x}", self.sequence & 0xffff);
        let mut base = machine.name.as_str();
        let room = NAME_MAX_BYTES - suffix.len();
        if base.len() > room {
            base = base[..room].trim_end_matches(['.', '-']);
        }
        format!("{base}{suffix}")
    }

    /// An occurrence of `event` at `now_ms`.
    pub fn observe(&mut self, event: MachineEvent, now_ms: u64) -> Observed {
        let key = Key {
            machine: event.machine,
            reason: event.reason,
        };
        let finish = SERIES_FINISH_AFTER.as_millis() as u64;
        if let Some(entry) = self.series.get_mut(&key) {
            let same_object = match (&entry.uid, &event.uid) {
                (Some(known), Some(now)) => known == now,
                _ => true,
            };
            if same_object && now_ms < entry.last_ms.saturating_add(finish) {
                entry.count = entry.count.saturating_add(1);
                entry.last_ms = entry.last_ms.max(now_ms);
                entry.uid = entry.uid.take().or(event.uid);
                // The first repeat is written at once (the Event shows it repeats); later ones by `tick`.
                if entry.written == 1 && self.rates.series_update(now_ms).is_ok() {
                    return Observed::Write(Write::Patch {
                        name: entry.name.clone(),
                        series: Series {
                            count: entry.count,
                            last_observed_ms: entry.last_ms,
                        },
                        key,
                    });
                }
                return Observed::Counted;
            }
            self.series.remove(&key);
        }
        if let Err(limited) = self.rates.new_event(&key.machine, now_ms) {
            return Observed::Dropped(match limited {
                Limited::Machine => Dropped::MachineRate,
                Limited::Fleet => Dropped::FleetRate,
            });
        }
        if self.series.len() >= MAX_SERIES {
            self.evict_oldest();
        }
        let name = self.name_for(&key.machine, now_ms);
        let entry = Entry {
            name: name.clone(),
            uid: event.uid.clone(),
            note: bounded_note(&event.note),
            first_ms: now_ms,
            last_ms: now_ms,
            count: 1,
            written: 0,
            written_ms: now_ms,
        };
        let create = NewEvent {
            key: key.clone(),
            name,
            uid: entry.uid.clone(),
            note: entry.note.clone(),
            event_time_ms: now_ms,
            series: None,
        };
        self.series.insert(key, entry);
        Observed::Write(Write::Create(create))
    }

    fn evict_oldest(&mut self) {
        let oldest = self
            .series
            .iter()
            .min_by_key(|(_, entry)| entry.last_ms)
            .map(|(key, _)| key.clone());
        if let Some(entry) = oldest.and_then(|key| self.series.remove(&key))
            && entry.count > entry.written
        {
            self.evicted += 1;
        }
    }

    /// Occurrences dropped by evictions since the last call.
    pub fn take_evicted(&mut self) -> u64 {
        std::mem::take(&mut self.evicted)
    }

    /// What is due at `now_ms`: each series whose count the API lacks, once [`SERIES_PATCH_INTERVAL`] passed since
    /// its last write (or the series ended), as the fleet bound allows (the rest wait for the next tick). Ended
    /// series that are written are forgotten, and so are refilled Machine buckets.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Write> {
        self.due(now_ms, false)
    }

    /// Every series whose count the API lacks, whatever the interval (at shutdown), as the fleet bound allows.
    pub fn flush(&mut self, now_ms: u64) -> Vec<Write> {
        self.due(now_ms, true)
    }

    fn due(&mut self, now_ms: u64, all: bool) -> Vec<Write> {
        let finish = SERIES_FINISH_AFTER.as_millis() as u64;
        let interval = SERIES_PATCH_INTERVAL.as_millis() as u64;
        self.series.retain(|_, entry| {
            entry.count > entry.written || now_ms < entry.last_ms.saturating_add(finish)
        });
        let mut due: Vec<(&Key, &Entry)> = self
            .series
            .iter()
            .filter(|(_, entry)| {
                entry.written >= 1
                    && entry.count > entry.written
                    && (all
                        || now_ms >= entry.written_ms.saturating_add(interval)
                        || now_ms >= entry.last_ms.saturating_add(finish))
            })
            .collect();
        due.sort_by_key(|(_, entry)| entry.written_ms);
        let mut writes = Vec::new();
        for (key, entry) in due {
            if self.rates.series_update(now_ms).is_err() {
                break;
            }
            writes.push(Write::Patch {
                key: key.clone(),
                name: entry.name.clone(),
                series: Series {
                    count: entry.count,
                    last_observed_ms: entry.last_ms,
                },
            });
        }
        self.rates.prune(now_ms);
        writes
    }

    /// How `write` went at `now_ms`. A patch that found its Event gone is answered with the create that makes
    /// it again (with its series); a create that failed forgets the series (its next occurrence is a new Event)
    /// and is counted as dropped by the caller; a failed patch is tried again at the next tick.
    pub fn written(&mut self, write: &Write, outcome: Outcome, now_ms: u64) -> Option<Write> {
        let (key, count) = match write {
            Write::Create(event) => (&event.key, event.series.map_or(1, |s| s.count)),
            Write::Patch { key, series, .. } => (key, series.count),
        };
        match (write, outcome) {
            (_, Outcome::Written) => {
                if let Some(entry) = self.series.get_mut(key) {
                    entry.written = entry.written.max(count);
                    entry.written_ms = now_ms;
                }
                None
            }
            (Write::Patch { .. }, Outcome::Gone) => {
                let name = self.name_for(&key.machine, now_ms);
                let entry = self.series.get_mut(key)?;
                entry.name = name.clone();
                entry.written = 0;
                Some(Write::Create(NewEvent {
                    key: key.clone(),
                    name,
                    uid: entry.uid.clone(),
                    note: entry.note.clone(),
                    event_time_ms: entry.first_ms,
                    series: (entry.count >= 2).then_some(Series {
                        count: entry.count,
                        last_observed_ms: entry.last_ms,
                    }),
                }))
            }
            (Write::Patch { .. }, Outcome::Failed) => None,
            (Write::Create(_), _) => {
                self.series.remove(key);
                None
            }
        }
    }

    /// How many series are in memory.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// Whether no series is in memory.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

#[cfg(test)]
#[path = "aggregate_tests.rs"]
mod tests;

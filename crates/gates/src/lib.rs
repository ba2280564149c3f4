//! Health gates: checks against a site's own monitoring that must be quiet before a change spreads to the
//! next Machine. A gate is a Prometheus instant query that must return nothing, or an Alertmanager filter that
//! must match no active, unsilenced, uninhibited alert. An unreachable gate is a failing gate, never a pass.
//!
//! The gates file ([`Gates::load`]) is checked whole at start-up; [`evaluate`] and [`evaluate_all`] ask the
//! monitoring system, and [`AnswerCache`] keeps their answers for a few seconds. Everything between the bytes of an answer and its [`GateResult`] is a pure function
//! ([`prometheus::judge`], [`alertmanager::judge`]); the HTTP client is one GET with a timeout and a body limit.

pub mod alertmanager;
mod cache;
mod config;
mod evaluate;
mod fetch;
mod kind;
pub mod prometheus;
mod quote;
mod result;
mod vars;

pub use cache::{AnswerCache, GATE_ANSWER_TTL, MAX_CACHED_ANSWERS};
pub use config::{
    DEFAULT_GATE_TIMEOUT, Endpoint, Gate, Gates, GatesError, MAX_GATE_NAME_BYTES, MAX_GATE_TIMEOUT,
    MAX_GATES, MAX_GATES_FILE_BYTES,
};
pub use evaluate::{evaluate, evaluate_all};
pub use fetch::{MAX_CA_FILE_BYTES, MAX_GATE_ANSWER_BYTES, MAX_TOKEN_FILE_BYTES};
pub use kind::GateKind;
pub use quote::{MAX_QUOTE_CHARS, MAX_QUOTED_ITEMS};
pub use result::{GateLabel, GateResult, Verdict};
pub use vars::Vars;

//! Recent answers, so a fleet waiting on one change does not ask the monitoring system once per Machine per
//! retry: a gate's answer for one request (the gate and its filled-in query, so a per-node query is cached per
//! node and a fleet-wide one once) is reused for [`GATE_ANSWER_TTL`]. Pure: the caller passes the clock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::config::Gate;
use crate::result::GateResult;
use crate::vars::Vars;

/// How long one gate's answer to one request is reused. Short against a soak (minutes) and against how often a
/// waiting Machine asks (CAPI's `retryAfterSeconds`), so a gate that starts failing holds the change within it.
pub const GATE_ANSWER_TTL: Duration = Duration::from_secs(10);

/// Answers kept at most (one per gate and filled-in request); past it the expired ones go, then all of them.
pub const MAX_CACHED_ANSWERS: usize = 10_000;

/// Recent answers by gate and request.
#[derive(Debug, Default)]
pub struct AnswerCache {
    answers: HashMap<(String, String), (Instant, GateResult)>,
}

impl AnswerCache {
    /// What identifies one request of `gate` for `vars`.
    pub fn key(gate: &Gate, vars: &Vars) -> (String, String) {
        (
            gate.name.clone(),
            gate.kind.target(vars, gate.endpoint.timeout),
        )
    }

    /// The answer to `key` got at or after `now - GATE_ANSWER_TTL`.
    pub fn fresh(&self, key: &(String, String), now: Instant) -> Option<&GateResult> {
        self.answers
            .get(key)
            .filter(|(at, _)| now.saturating_duration_since(*at) < GATE_ANSWER_TTL)
            .map(|(_, result)| result)
    }

    /// Keeps `result` as the answer to `key` got at `now`.
    pub fn keep(&mut self, key: (String, String), result: GateResult, now: Instant) {
        if self.answers.len() >= MAX_CACHED_ANSWERS {
            self.answers
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < GATE_ANSWER_TTL);
            if self.answers.len() >= MAX_CACHED_ANSWERS {
                self.answers.clear();
            }
        }
        self.answers.insert(key, (now, result));
    }

    /// How many answers are kept.
    pub fn len(&self) -> usize {
        self.answers.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Gates;
    use crate::result::Verdict;

    fn gates() -> Gates {
        Gates::from_yaml(
            "gates:\n  - name: alerts\n    prometheus:\n      url: http://127.0.0.1:9\n      query: 'up == 0'\n  \
             - name: node\n    prometheus:\n      url: http://127.0.0.1:9\n      query: 'node_down{node=\"{{node}}\"}'\n",
            std::path::Path::new("/"),
        )
        .expect("valid gates")
    }

    fn vars(node: &str) -> Vars {
        Vars {
            node: node.into(),
            cluster: "edge-01".into(),
            namespace: "default".into(),
        }
    }

    fn pass(gate: &Gate) -> GateResult {
        GateResult {
            label: gate.label(),
            verdict: Verdict::Pass,
        }
    }

    #[test]
    fn a_fleet_wide_query_is_shared_by_nodes_and_a_per_node_one_is_not() {
        let gates = gates();
        let (alerts, node) = (
            gates.get("alerts").expect("alerts"),
            gates.get("node").expect("node"),
        );
        assert_eq!(
            AnswerCache::key(alerts, &vars("a")),
            AnswerCache::key(alerts, &vars("b"))
        );
        assert_ne!(
            AnswerCache::key(node, &vars("a")),
            AnswerCache::key(node, &vars("b"))
        );
    }

    #[test]
    fn an_answer_is_reused_within_its_ttl_only() {
        let gates = gates();
        let gate = gates.get("alerts").expect("alerts");
        let mut cache = AnswerCache::default();
        let t0 = Instant::now();
        let key = AnswerCache::key(gate, &vars("a"));
        cache.keep(key.clone(), pass(gate), t0);
        assert!(cache.fresh(&key, t0 + GATE_ANSWER_TTL / 2).is_some());
        assert!(cache.fresh(&key, t0 + GATE_ANSWER_TTL).is_none());
    }

    #[test]
    fn a_full_cache_drops_expired_answers_first() {
        let gates = gates();
        let gate = gates.get("node").expect("node");
        let mut cache = AnswerCache::default();
        let t0 = Instant::now();
        for i in 0..MAX_CACHED_ANSWERS {
            cache.keep(
                AnswerCache::key(gate, &vars(&i.to_string())),
                pass(gate),
                t0,
            );
        }
        let later = t0 + GATE_ANSWER_TTL;
        let key = AnswerCache::key(gate, &vars("new"));
        cache.keep(key.clone(), pass(gate), later);
        assert_eq!(cache.len(), 1);
        assert!(cache.fresh(&key, later).is_some());
    }
}

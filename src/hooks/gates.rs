//! The health gates of `--gates-file` as the changes wing asks them ([`GateCheck`]): the gates a registration's
//! `healthGates` names, evaluated at once for the asking Machine; a name the file does not define is a failing
//! gate that says so. An answer is reused for [`inplace_gates::GATE_ANSWER_TTL`] (per gate and filled-in
//! request), so Machines waiting on one change do not each ask the monitoring system at every retry.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use futures_util::future::join_all;
use inplace_gates::{AnswerCache, Gate, GateResult, Gates, Vars, evaluate};

use crate::dispatch::changes::{GateCheck, GateFuture, GateOutcome, GateVars};

/// The gates file, asked by name, with its recent answers.
#[derive(Debug)]
pub struct FileGates {
    gates: Arc<Gates>,
    answers: Mutex<AnswerCache>,
}

impl FileGates {
    /// The gates of `gates`, no answer kept yet.
    pub fn new(gates: Arc<Gates>) -> FileGates {
        FileGates {
            gates,
            answers: Mutex::default(),
        }
    }

    /// `gate`'s answer for `vars`: a fresh kept one, or asked now (and kept).
    async fn answer(&self, gate: &Gate, vars: &Vars) -> GateResult {
        let key = AnswerCache::key(gate, vars);
        let kept = self
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .fresh(&key, Instant::now())
            .cloned();
        if let Some(result) = kept {
            return result;
        }
        let result = evaluate(gate, vars).await;
        self.answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keep(key, result.clone(), Instant::now());
        result
    }
}

impl GateCheck for FileGates {
    fn check<'a>(&'a self, names: &'a [String], vars: &'a GateVars) -> GateFuture<'a> {
        Box::pin(async move {
            let vars = Vars {
                node: vars.node.clone(),
                cluster: vars.cluster.clone(),
                namespace: vars.namespace.clone(),
            };
            let vars = &vars;
            join_all(names.iter().map(|name| async move {
                let Some(gate) = self.gates.get(name) else {
                    return GateOutcome {
                        name: name.clone(),
                        passed: false,
                        message: format!(
                            "gate {name}: not defined in the server's gates file (--gates-file)"
                        ),
                    };
                };
                let result = self.answer(gate, vars).await;
                GateOutcome {
                    name: name.clone(),
                    passed: result.passes(),
                    message: result.message(),
                }
            }))
            .await
        })
    }
}

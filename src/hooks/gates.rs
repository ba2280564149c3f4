//! The health gates of `--gates-file` as the changes wing asks them ([`GateCheck`]): the gates a registration's
//! `healthGates` names, evaluated at once for the asking Machine; a name the file does not define is a failing
//! gate that says so.

use std::sync::Arc;

use inplace_gates::{Gates, Vars, evaluate_all};

use crate::dispatch::changes::{GateCheck, GateFuture, GateOutcome, GateVars};

/// The gates file, asked by name.
#[derive(Debug, Clone)]
pub struct FileGates(pub Arc<Gates>);

impl GateCheck for FileGates {
    fn check<'a>(&'a self, names: &'a [String], vars: &'a GateVars) -> GateFuture<'a> {
        Box::pin(async move {
            let vars = Vars {
                node: vars.node.clone(),
                cluster: vars.cluster.clone(),
                namespace: vars.namespace.clone(),
            };
            let known: Vec<_> = names
                .iter()
                .filter_map(|name| self.0.get(name).cloned())
                .collect();
            let mut results = evaluate_all(&known, &vars).await.into_iter();
            names
                .iter()
                .map(|name| match self.0.get(name) {
                    None => GateOutcome {
                        name: name.clone(),
                        passed: false,
                        message: format!(
                            "gate {name}: not defined in the server's gates file (--gates-file)"
                        ),
                    },
                    Some(_) => match results.next() {
                        Some((_, result)) => GateOutcome {
                            name: name.clone(),
                            passed: result.passes(),
                            message: result.message(),
                        },
                        None => GateOutcome {
                            name: name.clone(),
                            passed: false,
                            message: format!("gate {name}: not evaluated"),
                        },
                    },
                })
                .collect()
        })
    }
}

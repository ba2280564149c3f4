//! Asking a gate: fetch its answer, judge it. Every failure to get an answer is an unreachable verdict.

use futures_util::future::join_all;

use crate::config::Gate;
use crate::fetch::fetch;
use crate::result::{GateResult, Verdict};
use crate::vars::Vars;

/// Asks one gate about the Machine `vars` names, within the gate's timeout.
pub async fn evaluate(gate: &Gate, vars: &Vars) -> GateResult {
    let target = gate.kind.target(vars, gate.endpoint.timeout);
    let verdict = match fetch(&gate.endpoint, &target).await {
        Ok(answer) => gate.kind.judge(answer.status, &answer.body),
        Err(cause) => Verdict::Unreachable { cause },
    };
    GateResult {
        label: gate.label(),
        verdict,
    }
}

/// Asks every gate at once (each within its own timeout); the results in the order of `gates`, by name.
pub async fn evaluate_all(gates: &[Gate], vars: &Vars) -> Vec<(String, GateResult)> {
    join_all(
        gates
            .iter()
            .map(|gate| async move { (gate.name.clone(), evaluate(gate, vars).await) }),
    )
    .await
}

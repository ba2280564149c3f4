//! What a gate said: pass, fail with a quote of what failed, or unreachable with the cause. Only a pass passes.

use std::fmt;

/// Which gate a result is from, as its message names it: `gate storage (prometheus https://…)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateLabel {
    /// The gate's name in the gates file.
    pub name: String,
    /// The kind (`prometheus`, `alertmanager`).
    pub kind: &'static str,
    /// The configured URL (never carries credentials: the file refuses them).
    pub url: String,
}

impl fmt::Display for GateLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gate {} ({} {})", self.name, self.kind, self.url)
    }
}

/// The answer of one gate, without its label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The monitoring system answered and found nothing wrong.
    Pass,
    /// The monitoring system answered with something wrong; `quote` says what (the series or alerts).
    Fail {
        /// What failed, e.g. `query returned 1 series: ALERTS{alertname="StorageDegraded"} = 1`.
        quote: String,
    },
    /// No usable answer: connection refused, timeout, a non-2xx status, bad JSON, a query error. A gate that
    /// cannot be asked cannot vouch for the fleet, so this fails too.
    Unreachable {
        /// Why, e.g. `connection refused` (never a token or other file contents).
        cause: String,
    },
}

/// One gate's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateResult {
    /// The gate.
    pub label: GateLabel,
    /// What it said.
    pub verdict: Verdict,
}

impl GateResult {
    /// True only for [`Verdict::Pass`]: an unreachable gate fails.
    pub fn passes(&self) -> bool {
        matches!(self.verdict, Verdict::Pass)
    }

    /// One line for an operator: `gate storage (prometheus https://…): query returned 1 series: …`,
    /// `gate storage (prometheus …): unreachable: connection refused`, `gate storage (…): passed`.
    pub fn message(&self) -> String {
        match &self.verdict {
            Verdict::Pass => format!("{}: passed", self.label),
            Verdict::Fail { quote } => format!("{}: {quote}", self.label),
            Verdict::Unreachable { cause } => format!("{}: unreachable: {cause}", self.label),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(verdict: Verdict) -> GateResult {
        GateResult {
            label: GateLabel {
                name: "storage".into(),
                kind: "prometheus",
                url: "https://prom:9090".into(),
            },
            verdict,
        }
    }

    #[test]
    fn only_a_pass_passes_and_each_message_names_the_gate() {
        let pass = result(Verdict::Pass);
        assert!(pass.passes());
        assert_eq!(
            pass.message(),
            "gate storage (prometheus https://prom:9090): passed"
        );
        let fail = result(Verdict::Fail {
            quote: "query returned 1 series: up = 0".into(),
        });
        assert!(!fail.passes());
        assert_eq!(
            fail.message(),
            "gate storage (prometheus https://prom:9090): query returned 1 series: up = 0"
        );
        let down = result(Verdict::Unreachable {
            cause: "connection refused".into(),
        });
        assert!(!down.passes());
        assert_eq!(
            down.message(),
            "gate storage (prometheus https://prom:9090): unreachable: connection refused"
        );
    }
}

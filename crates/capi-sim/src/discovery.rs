//! Discovery as CAPI performs it (`Discover`, `defaultAndValidateDiscoveryResponse`): what makes
//! an ExtensionConfig register, and under which names, timeouts and failure policies.

use crate::client::{CapiError, FailurePolicy, HookAnswer, call_extension};
use crate::wire::DiscoveryResponse;

/// The only hook API version CAPI's catalog knows.
pub const HOOKS_API_VERSION: &str = "hooks.runtime.cluster.x-k8s.io/v1alpha1";

/// Hooks registered in CAPI's v1alpha1 catalog (`catalogBuilder.RegisterHook`).
pub const KNOWN_HOOKS: &[&str] = &[
    "AfterClusterUpgrade",
    "AfterControlPlaneInitialized",
    "AfterControlPlaneUpgrade",
    "AfterWorkersUpgrade",
    "BeforeClusterCreate",
    "BeforeClusterDelete",
    "BeforeClusterUpgrade",
    "BeforeControlPlaneUpgrade",
    "BeforeWorkersUpgrade",
    "CanUpdateMachine",
    "CanUpdateMachineSet",
    "DiscoverVariables",
    "Discovery",
    "GeneratePatches",
    "GenerateUpgradePlan",
    "UpdateMachine",
    "ValidateTopology",
];

/// Handler timeout CAPI uses when discovery gives none (`DefaultHandlersTimeoutSeconds`).
pub const DEFAULT_TIMEOUT_SECONDS: i32 = 10;

/// Largest `timeoutSeconds` CAPI accepts.
pub const MAX_TIMEOUT_SECONDS: i32 = 30;

/// Longest DNS-1123 label.
pub const DNS1123_LABEL_MAX_LEN: usize = 63;

/// A handler as CAPI registers it in `ExtensionConfig.status.handlers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredHandler {
    /// `<handler name>.<ExtensionConfig name>`.
    pub name: String,
    /// `requestHook.apiVersion`.
    pub api_version: String,
    /// `requestHook.hook`.
    pub hook: String,
    /// Defaulted timeout.
    pub timeout_seconds: i32,
    /// Defaulted failure policy.
    pub failure_policy: FailurePolicy,
}

/// `Discover` for a 200 answer: decode, status, defaults, validation, registered names.
pub fn discover(
    body: &[u8],
    extension_config_name: &str,
) -> Result<Vec<RegisteredHandler>, CapiError> {
    discover_with(HookAnswer::ok(body), extension_config_name)
}

/// `Discover` for any answer. `failurePolicy` never applies to discovery.
pub fn discover_with(
    answer: HookAnswer<'_>,
    extension_config_name: &str,
) -> Result<Vec<RegisteredHandler>, CapiError> {
    let response: DiscoveryResponse = call_extension(answer, FailurePolicy::Fail)?;
    validate_discovery_response(&response)?;
    Ok(response
        .handlers
        .iter()
        .map(|h| RegisteredHandler {
            name: format!("{}.{extension_config_name}", h.name),
            api_version: h.request_hook.api_version.clone(),
            hook: h.request_hook.hook.clone(),
            timeout_seconds: h.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
            failure_policy: match h.failure_policy.as_deref() {
                Some("Ignore") => FailurePolicy::Ignore,
                _ => FailurePolicy::Fail,
            },
        })
        .collect())
}

/// `defaultAndValidateDiscoveryResponse`: every problem CAPI reports, or `Ok`.
pub fn validate_discovery_response(response: &DiscoveryResponse) -> Result<(), CapiError> {
    let mut errors = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for h in &response.handlers {
        if !seen.insert(h.name.as_str()) {
            errors.push(format!("duplicate name for handler {} found", h.name));
        }
        let label_errors = dns1123_label_errors(&h.name);
        if !label_errors.is_empty() {
            errors.push(format!(
                "handler name {} is not valid: [{}]",
                h.name,
                label_errors.join(" ")
            ));
        }
        let timeout = h.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
        if !(0..=MAX_TIMEOUT_SECONDS).contains(&timeout) {
            errors.push(format!(
                "handler {} timeoutSeconds {timeout} must be between 0 and {MAX_TIMEOUT_SECONDS}",
                h.name
            ));
        }
        let policy = h.failure_policy.as_deref().unwrap_or("Fail");
        if policy != "Fail" && policy != "Ignore" {
            errors.push(format!(
                "handler {} failurePolicy {policy} must equal \"Ignore\" or \"Fail\"",
                h.name
            ));
        }
        let api_version = &h.request_hook.api_version;
        if api_version.matches('/').count() > 1 {
            errors.push(format!("handler {} requestHook APIVersion {api_version} is not valid: unexpected GroupVersion string", h.name));
        } else if api_version != HOOKS_API_VERSION
            || !KNOWN_HOOKS.contains(&h.request_hook.hook.as_str())
        {
            errors.push(format!(
                "handler {} requestHook {api_version}/{} is not in the Runtime SDK catalog",
                h.name, h.request_hook.hook
            ));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(CapiError::InvalidDiscovery(errors))
    }
}

/// `validation.IsDNS1123Label`: empty when `name` is a valid label.
pub fn dns1123_label_errors(name: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if name.len() > DNS1123_LABEL_MAX_LEN {
        errors.push(format!(
            "must be no more than {DNS1123_LABEL_MAX_LEN} characters"
        ));
    }
    let bytes = name.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let valid = !bytes.is_empty()
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes.iter().all(|b| alnum(b) || *b == b'-');
    if !valid {
        errors.push(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"
                .into(),
        );
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handler(name: &str, hook: &str, extra: &str) -> String {
        format!(
            r#"{{"name":"{name}","requestHook":{{"apiVersion":"{HOOKS_API_VERSION}","hook":"{hook}"}}{extra}}}"#
        )
    }

    fn answer(handlers: &[String]) -> String {
        format!(
            r#"{{"apiVersion":"{HOOKS_API_VERSION}","kind":"DiscoveryResponse","status":"Success","handlers":[{}]}}"#,
            handlers.join(",")
        )
    }

    #[test]
    fn a_valid_answer_registers_defaulted_handlers() {
        let body = answer(&[
            handler(
                "can-update-machine",
                "CanUpdateMachine",
                r#","timeoutSeconds":5"#,
            ),
            handler(
                "update-machine",
                "UpdateMachine",
                r#","failurePolicy":"Ignore""#,
            ),
        ]);
        let got = discover(body.as_bytes(), "inplace-updater").unwrap();
        assert_eq!(got[0].name, "can-update-machine.inplace-updater");
        assert_eq!(
            (got[0].timeout_seconds, got[0].failure_policy),
            (5, FailurePolicy::Fail)
        );
        assert_eq!(
            (got[1].timeout_seconds, got[1].failure_policy),
            (DEFAULT_TIMEOUT_SECONDS, FailurePolicy::Ignore)
        );
    }

    #[test]
    fn every_rule_is_enforced() {
        let cases = [
            vec![handler("dup", "UpdateMachine", ""), handler("dup", "CanUpdateMachine", "")],
            vec![handler("Can_Update", "CanUpdateMachine", "")],
            vec![handler(&"a".repeat(64), "CanUpdateMachine", "")],
            vec![handler("x", "CanUpdateMachine", r#","timeoutSeconds":31"#)],
            vec![handler("x", "CanUpdateMachine", r#","timeoutSeconds":-1"#)],
            vec![handler("x", "CanUpdateMachine", r#","failurePolicy":"ignore""#)],
            vec![handler("x", "CanUpdateMachines", "")],
            vec![r#"{"name":"x","requestHook":{"apiVersion":"hooks.runtime.cluster.x-k8s.io/v1alpha2","hook":"UpdateMachine"}}"#.to_string()],
        ];
        for handlers in cases {
            let body = answer(&handlers);
            assert!(
                matches!(
                    discover(body.as_bytes(), "e"),
                    Err(CapiError::InvalidDiscovery(_))
                ),
                "{body}"
            );
        }
        assert!(
            discover(
                answer(&[handler("x", "UpdateMachine", r#","timeoutSeconds":0"#)]).as_bytes(),
                "e"
            )
            .is_ok()
        );
    }

    #[test]
    fn failure_or_undecodable_discovery_is_an_error_whatever_the_policy() {
        assert!(matches!(
            discover(br#"{"status":"Failure","message":"no"}"#, "e"),
            Err(CapiError::Failure { .. })
        ));
        assert!(matches!(
            discover(br#"{"status":"Success","handlers":{}}"#, "e"),
            Err(CapiError::Decode(_))
        ));
        assert!(
            discover_with(
                HookAnswer::Http {
                    status: 404,
                    body: b""
                },
                "e"
            )
            .is_err()
        );
    }
}

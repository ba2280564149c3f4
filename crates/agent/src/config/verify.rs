//! The `verify:` section of the agent's `--config`: how this node proves itself after the last step of a plan
//! (after its uncordon) — commands that must exit 0, each with its own timeout and retries, and how long the
//! pods that were Running and Ready before the drain may take to be Ready again. Without the section the node
//! is not verified (as before it existed). The agent never runs a shell: every command is an argv.

use serde::Deserialize;

use crate::sequence::command::check_argv_in;
use crate::sequence::template::Scope;

/// Most commands in `verify.commands`.
pub const MAX_VERIFY_COMMANDS: usize = 20;
/// Default `timeoutSeconds` of a verify command: one attempt is killed (its process group) after it.
pub const DEFAULT_VERIFY_COMMAND_TIMEOUT_SECONDS: u32 = 60;
/// Largest `timeoutSeconds` of a verify command.
pub const MAX_VERIFY_COMMAND_TIMEOUT_SECONDS: u32 = 3600;
/// Default `retries` of a verify command: attempts after the first one that failed.
pub const DEFAULT_VERIFY_RETRIES: u32 = 2;
/// Largest `retries` of a verify command.
pub const MAX_VERIFY_RETRIES: u32 = 30;
/// Default `retryDelaySeconds`: the pause between two attempts of a verify command.
pub const DEFAULT_VERIFY_RETRY_DELAY_SECONDS: u32 = 10;
/// Largest `retryDelaySeconds`.
pub const MAX_VERIFY_RETRY_DELAY_SECONDS: u32 = 600;
/// Default `verify.podsReadyTimeoutSeconds`: how long the pods that were Running and Ready before the drain,
/// and are bound to the node again, may take to be Running and Ready after the last step.
pub const DEFAULT_PODS_READY_TIMEOUT_SECONDS: u32 = 300;
/// Largest `verify.podsReadyTimeoutSeconds` (0 turns the pods check off).
pub const MAX_PODS_READY_TIMEOUT_SECONDS: u32 = 3600;

/// `verify:`. Without it the node is not verified after a plan's last step.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VerifyConfig {
    /// Commands run in order after the last step; each must exit 0 within its attempts.
    #[serde(default)]
    pub commands: Vec<VerifyCommand>,
    /// How long the pods Running and Ready before the drain (and bound to the node again) may take to be Running
    /// and Ready; 0 turns the pods check off. It needs the `node:` section (the node's own API access).
    #[serde(default = "default_pods_ready_timeout")]
    pub pods_ready_timeout_seconds: u32,
}

/// One `verify.commands` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VerifyCommand {
    /// argv (`{{root}}` allowed).
    pub run: Vec<String>,
    /// One attempt's limit; its process group is killed after it.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u32,
    /// Attempts after a failed one (a non-zero exit, a signal, a timeout).
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// The pause between two attempts.
    #[serde(default = "default_retry_delay")]
    pub retry_delay_seconds: u32,
}

fn default_pods_ready_timeout() -> u32 {
    DEFAULT_PODS_READY_TIMEOUT_SECONDS
}

fn default_timeout() -> u32 {
    DEFAULT_VERIFY_COMMAND_TIMEOUT_SECONDS
}

fn default_retries() -> u32 {
    DEFAULT_VERIFY_RETRIES
}

fn default_retry_delay() -> u32 {
    DEFAULT_VERIFY_RETRY_DELAY_SECONDS
}

impl VerifyConfig {
    /// Checks the values (names the key). `has_node` says whether the config has the `node:` section the pods
    /// check reads through.
    pub fn validate(&self, has_node: bool) -> Result<(), String> {
        if self.commands.len() > MAX_VERIFY_COMMANDS {
            return Err(format!(
                "verify.commands: {} commands, over the limit of {MAX_VERIFY_COMMANDS}",
                self.commands.len()
            ));
        }
        for (i, command) in self.commands.iter().enumerate() {
            let key = format!("verify.commands[{i}]");
            check_argv_in(&command.run, Scope::Root).map_err(|e| format!("{key}.run: {e}"))?;
            for (name, value, range) in [
                (
                    "timeoutSeconds",
                    command.timeout_seconds,
                    1..=MAX_VERIFY_COMMAND_TIMEOUT_SECONDS,
                ),
                ("retries", command.retries, 0..=MAX_VERIFY_RETRIES),
                (
                    "retryDelaySeconds",
                    command.retry_delay_seconds,
                    0..=MAX_VERIFY_RETRY_DELAY_SECONDS,
                ),
            ] {
                if !range.contains(&value) {
                    return Err(format!(
                        "{key}.{name}: {value} is outside {}..={}",
                        range.start(),
                        range.end()
                    ));
                }
            }
        }
        if self.pods_ready_timeout_seconds > MAX_PODS_READY_TIMEOUT_SECONDS {
            return Err(format!(
                "verify.podsReadyTimeoutSeconds: {} is over the limit of {MAX_PODS_READY_TIMEOUT_SECONDS} (0 turns the pods check off)",
                self.pods_ready_timeout_seconds
            ));
        }
        if self.pods_ready_timeout_seconds > 0 && !has_node {
            return Err("verify.podsReadyTimeoutSeconds: the pods check reads the node's pods through the `node:` section, which this config lacks (add it, or set 0)".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::DriverConfig;

    #[test]
    fn defaults_apply_and_the_section_is_optional() {
        assert!(DriverConfig::from_yaml("").unwrap().verify.is_none());
        let config =
            DriverConfig::from_yaml("node: {}\nverify:\n  commands:\n    - run: [check-storage]\n")
                .unwrap();
        let verify = config.verify.unwrap();
        assert_eq!(
            verify.pods_ready_timeout_seconds,
            DEFAULT_PODS_READY_TIMEOUT_SECONDS
        );
        let command = &verify.commands[0];
        assert_eq!(command.run, ["check-storage"]);
        assert_eq!(
            command.timeout_seconds,
            DEFAULT_VERIFY_COMMAND_TIMEOUT_SECONDS
        );
        assert_eq!(command.retries, DEFAULT_VERIFY_RETRIES);
        assert_eq!(
            command.retry_delay_seconds,
            DEFAULT_VERIFY_RETRY_DELAY_SECONDS
        );
    }

    #[test]
    fn an_invalid_section_fails_naming_the_field() {
        let cases = [
            ("verify: {commands: [{run: []}]}", "verify.commands[0].run"),
            (
                "node: {}\nverify: {commands: [{run: [a]}, {run: [b], timeoutSeconds: 0}]}",
                "verify.commands[1].timeoutSeconds: 0 is outside 1..=3600",
            ),
            (
                "node: {}\nverify: {commands: [{run: [a], retries: 31}]}",
                "verify.commands[0].retries: 31 is outside 0..=30",
            ),
            (
                "node: {}\nverify: {commands: [{run: [a], retryDelaySeconds: 601}]}",
                "verify.commands[0].retryDelaySeconds",
            ),
            (
                "node: {}\nverify: {commands: [{run: [\"{{version}}\"]}]}",
                "verify.commands[0].run",
            ),
            (
                "node: {}\nverify: {podsReadyTimeoutSeconds: 3601}",
                "verify.podsReadyTimeoutSeconds: 3601",
            ),
            ("verify: {}", "verify.podsReadyTimeoutSeconds"),
            ("verify: {comands: []}", "unknown field `comands`"),
            (
                "verify: {commands: [{run: [a], timeout: 5}]}",
                "unknown field `timeout`",
            ),
        ];
        for (yaml, want) in cases {
            let err = DriverConfig::from_yaml(yaml).unwrap_err().to_string();
            assert!(err.contains(want), "{yaml}: {err}");
        }
        let many: String = (0..=MAX_VERIFY_COMMANDS)
            .map(|i| format!("    - run: [c{i}]\n"))
            .collect();
        let err = DriverConfig::from_yaml(&format!(
            "verify:\n  podsReadyTimeoutSeconds: 0\n  commands:\n{many}"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("verify.commands: 21 commands"), "{err}");
        // Without `node:`, commands alone are fine when the pods check is off.
        let config = DriverConfig::from_yaml(
            "verify: {podsReadyTimeoutSeconds: 0, commands: [{run: [\"{{root}}/bin/check\"]}]}",
        )
        .unwrap();
        assert_eq!(config.verify.unwrap().pods_ready_timeout_seconds, 0);
    }
}

//! The undo half of a Kubernetes version sequence (issue 28), as the agent config spells it: `record:`, the
//! commands whose outputs are kept before the step's first effect, and `undo:`, the commands that put the node
//! back, with `{{record.<name>}}` templated in. Checked at load (errors name the key), and the pure rule that
//! turns a record command's end into its value ([`record_value`]).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::retry::RetryPolicy;
use crate::sequence::command::{SequenceCommand, check_argv};
use crate::sequence::process::{CommandEnd, STDOUT_TAIL_MAX_BYTES};
use crate::sequence::template;

/// Longest value a record keeps (its command's trimmed stdout), in bytes.
pub const MAX_RECORD_VALUE_BYTES: usize = 128;

/// Most `record:` entries one sequence may declare.
pub const MAX_RECORDS: usize = 16;

/// One `record:` entry: a command run before the step's first effect (only when the step never began), whose
/// trimmed stdout is kept in the step's undo record as `{{record.<name>}}`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordCommand {
    /// The template name (`{{record.<name>}}`): letters, digits, `_`, `-`.
    pub name: String,
    /// argv (forward templates: `{{version}}`, `{{root}}`, …; never a shell). It runs again when the agent
    /// stops before the step is recorded begun, so it must be safe to repeat.
    pub run: Vec<String>,
    /// When set, the trimmed output must be one of these keys and the value is the word it maps to, e.g.
    /// `apt-mark showhold kubelet` → `{"kubelet": hold, "": unhold}`.
    #[serde(default)]
    pub map: Option<BTreeMap<String, String>>,
    /// Exit codes that mean "not there" (e.g. `dpkg-query` exits 1 and `rpm -q` exits 1 for a package that
    /// is not installed): the output is ignored and the value is empty (then mapped, when `map` is set).
    #[serde(default)]
    pub absent_on_exit: Vec<i32>,
}

/// `undo:` of a sequence: how the node is put back after the step (or part of it) ran. Same command shape as
/// `commands:`; progress is recorded per command, and an interrupted undo runs `onResume`, then continues at
/// its first unfinished command.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UndoSequence {
    /// Run first whenever an undo that began is resumed (like the forward `onResume`).
    #[serde(default)]
    pub on_resume: Vec<SequenceCommand>,
    /// The retry policy of the commands marked `retryable`.
    #[serde(default)]
    pub retry: Option<RetryPolicy>,
    /// The commands; `{{record.<name>}}` and `ifRecorded`/`ifNotRecorded` may name this sequence's records.
    pub commands: Vec<SequenceCommand>,
}

/// Checks `record:` and `undo:` of a sequence; `undone` is false for the point of no return (kubeadm
/// upgrade), where both are refused.
pub(crate) fn validate(
    record: &[RecordCommand],
    undo: Option<&UndoSequence>,
    undone: bool,
) -> Result<(), String> {
    if !undone && (!record.is_empty() || undo.is_some()) {
        return Err(
            "kubeadm upgrade is not undone: it is the point of no return (Kubernetes does not \
                    support downgrading the control plane); remove `record` and `undo` here"
                .into(),
        );
    }
    if record.len() > MAX_RECORDS {
        return Err(format!(
            "record: {} entries, at most {MAX_RECORDS}",
            record.len()
        ));
    }
    let mut names: Vec<&str> = Vec::new();
    for (i, entry) in record.iter().enumerate() {
        let key = format!("record[{i}]");
        let name = entry.name.as_str();
        let ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b));
        if !ok {
            return Err(format!(
                "{key}.name: {name:?} is not a name (letters, digits, `_`, `-`)"
            ));
        }
        if names.contains(&name) {
            return Err(format!("{key}.name: {name:?} is declared twice"));
        }
        names.push(name);
        check_argv(&entry.run).map_err(|e| format!("{key}.run: {e}"))?;
        if let Some(map) = &entry.map {
            for (output, word) in map {
                check_value(output).map_err(|e| format!("{key}.map: key {output:?}: {e}"))?;
                if word.len() > MAX_RECORD_VALUE_BYTES
                    || word.contains(['\n', '\0'])
                    || word.contains("{{")
                {
                    return Err(format!(
                        "{key}.map: value {word:?} is not a plain word of at most {MAX_RECORD_VALUE_BYTES} bytes"
                    ));
                }
            }
        }
    }
    let Some(undo) = undo else {
        return Ok(());
    };
    if let Some(retry) = &undo.retry {
        retry.validate().map_err(|e| format!("undo.retry: {e}"))?;
    }
    for (list, commands) in [("onResume", &undo.on_resume), ("commands", &undo.commands)] {
        for (i, command) in commands.iter().enumerate() {
            let key = format!("undo.{list}[{i}]");
            command
                .spec
                .validate(template::Scope::Undo(&names))
                .map_err(|e| format!("{key}: {e}"))?;
            if command.retryable && undo.retry.is_none() {
                return Err(format!(
                    "{key}: retryable, but the undo has no `retry: {{attempts, initialDelaySeconds, maxDelaySeconds}}`"
                ));
            }
            if let Some(when) = &command.when
                && !names.contains(&when.record())
            {
                return Err(format!(
                    "{key}: ifRecorded/ifNotRecorded {:?} names no record of this sequence",
                    when.record()
                ));
            }
        }
    }
    Ok(())
}

/// A value a record may keep: at most [`MAX_RECORD_VALUE_BYTES`], of the characters of Debian and RPM
/// versions and of node paths (letters, digits, `.+-:~_/`: a `readlink` of a sysext link); empty allowed
/// ("not installed"). Values reach argv only, never a shell.
pub(crate) fn check_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_RECORD_VALUE_BYTES {
        return Err(format!(
            "{} bytes, more than MAX_RECORD_VALUE_BYTES ({MAX_RECORD_VALUE_BYTES})",
            value.len()
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || ".+-:~_/".contains(*c)))
    {
        return Err(format!(
            "{c:?} is outside the allowed characters (letters, digits, `.+-:~_/`)"
        ));
    }
    Ok(())
}

/// The value `entry` keeps from its command's end and stdout, or why there is none (the step then fails
/// before any effect).
pub(crate) fn record_value(
    entry: &RecordCommand,
    end: &CommandEnd,
    stdout: &str,
) -> Result<String, RecordValueError> {
    let output = match end {
        CommandEnd::Exited(0) => {
            if stdout.len() >= STDOUT_TAIL_MAX_BYTES {
                return Err(RecordValueError::TooLong);
            }
            stdout.trim()
        }
        CommandEnd::Exited(code) if entry.absent_on_exit.contains(code) => "",
        other => return Err(RecordValueError::Failed(other.clone())),
    };
    check_value(output).map_err(|why| RecordValueError::NotAValue {
        output: output.to_owned(),
        why,
    })?;
    match &entry.map {
        None => Ok(output.to_owned()),
        Some(map) => map
            .get(output)
            .cloned()
            .ok_or_else(|| RecordValueError::NotInMap {
                output: output.to_owned(),
                keys: map.keys().map(|k| format!("{k:?}")).collect(),
            }),
    }
}

/// Why a record command's end gives no value (the step then fails before any effect).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordValueError {
    /// It exited 0 with more output than a value may have.
    #[error("its output is longer than MAX_RECORD_VALUE_BYTES ({MAX_RECORD_VALUE_BYTES})")]
    TooLong,
    /// It did not exit 0, nor with a code its `absentOnExit` lists.
    #[error("it did not succeed ({0:?})")]
    Failed(CommandEnd),
    /// Its output is not a value a record may keep ([`check_value`]).
    #[error("its output {output:?}: {why}")]
    NotAValue {
        /// The trimmed output.
        output: String,
        /// What is wrong with it.
        why: String,
    },
    /// Its output is none of the keys of its `map`.
    #[error("its output {output:?} is none of the keys of its map ({})", keys.join(", "))]
    NotInMap {
        /// The trimmed output.
        output: String,
        /// The map's keys, quoted.
        keys: Vec<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(map: Option<&[(&str, &str)]>, absent: &[i32]) -> RecordCommand {
        RecordCommand {
            name: "kubelet".into(),
            run: vec!["dpkg-query".into()],
            map: map.map(|m| {
                m.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
            absent_on_exit: absent.to_vec(),
        }
    }

    #[test]
    fn a_value_is_the_trimmed_output_bounded_and_restricted() {
        let plain = entry(None, &[1]);
        let ok = CommandEnd::Exited(0);
        assert_eq!(
            record_value(&plain, &ok, " 1.33.4-1.1\n").unwrap(),
            "1.33.4-1.1"
        );
        assert_eq!(
            record_value(&plain, &ok, "1:2.0~rc1+dfsg_x").unwrap(),
            "1:2.0~rc1+dfsg_x"
        );
        assert_eq!(record_value(&plain, &ok, "").unwrap(), "");
        assert_eq!(
            record_value(&plain, &CommandEnd::Exited(1), "package x is not installed").unwrap(),
            "",
            "an absent exit code ignores the output"
        );
        let err = record_value(&plain, &CommandEnd::Exited(2), "")
            .unwrap_err()
            .to_string();
        assert!(err.contains("did not succeed"), "{err}");
        let err = record_value(&plain, &ok, "1.0; rm -rf /")
            .unwrap_err()
            .to_string();
        assert!(err.contains("';'"), "{err}");
        let long = "1".repeat(MAX_RECORD_VALUE_BYTES + 1);
        assert!(
            record_value(&plain, &ok, &long)
                .unwrap_err()
                .to_string()
                .contains("MAX_RECORD_VALUE_BYTES")
        );
        let huge = "1".repeat(STDOUT_TAIL_MAX_BYTES);
        assert!(record_value(&plain, &ok, &huge).is_err());
    }

    /// The error loading `kubernetes:` YAML gives.
    fn load_error(kubernetes: &str) -> String {
        let yaml = format!("kubernetes:\n{kubernetes}");
        crate::config::DriverConfig::from_yaml(&yaml)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn config_errors_name_the_key() {
        let cases = [
            (
                "  kubeadmUpgradeNode:\n    commands: [{run: [kubeadm]}]\n    undo: {commands: []}\n",
                "kubernetes.kubeadmUpgradeNode: kubeadm upgrade is not undone",
            ),
            (
                "  kubeadmUpgradeApply:\n    commands: [{run: [kubeadm]}]\n    record: [{name: v, run: [x]}]\n",
                "kubernetes.kubeadmUpgradeApply: kubeadm upgrade is not undone",
            ),
            (
                "  installKubelet:\n    commands: [{run: [apt-get, \"kubelet={{record.kubelet}}\"]}]\n",
                "kubernetes.installKubelet: commands[0]: {{record.kubelet}}",
            ),
            (
                "  installKubelet:\n    record: [{name: kubelet, run: [q]}]\n    commands: []\n    \
                 undo: {commands: [{run: [x, \"{{record.kubectl}}\"]}]}\n",
                "kubernetes.installKubelet: undo.commands[0]: {{record.kubectl}} in \"{{record.kubectl}}\" names no \
                 record of this sequence (declared: kubelet)",
            ),
            (
                "  installKubelet:\n    record: [{name: kubelet, run: [q]}]\n    commands: []\n    \
                 undo: {commands: [{run: [x], ifRecorded: kubectl}]}\n",
                "kubernetes.installKubelet: undo.commands[0]: ifRecorded/ifNotRecorded \"kubectl\" names no record",
            ),
            (
                "  installKubelet:\n    commands: [{run: [x], ifRecorded: kubelet}]\n",
                "kubernetes.installKubelet: commands[0]: ifRecorded/ifNotRecorded apply to `undo:` commands only",
            ),
            (
                "  installKubeadm:\n    record: [{name: a, run: [q]}, {name: a, run: [q]}]\n    commands: []\n",
                "kubernetes.installKubeadm: record[1].name: \"a\" is declared twice",
            ),
            (
                "  installKubeadm:\n    record: [{name: \"a b\", run: [q]}]\n    commands: []\n",
                "kubernetes.installKubeadm: record[0].name: \"a b\" is not a name",
            ),
            (
                "  installKubeadm:\n    record: [{name: h, run: [q], map: {\"x y\": hold}}]\n    commands: []\n",
                "kubernetes.installKubeadm: record[0].map: key \"x y\": ' ' is outside the allowed characters",
            ),
            (
                "  installKubeadm:\n    commands: []\n    undo: {commands: [{run: [x], retryable: true}]}\n",
                "kubernetes.installKubeadm: undo.commands[0]: retryable, but the undo has no `retry",
            ),
        ];
        for (yaml, expected) in cases {
            let error = load_error(yaml);
            assert!(error.contains(expected), "{yaml}\n{error}");
        }
    }

    #[test]
    fn a_map_turns_the_output_into_one_of_its_words() {
        let holds = entry(Some(&[("kubelet", "hold"), ("", "unhold")]), &[]);
        let ok = CommandEnd::Exited(0);
        assert_eq!(record_value(&holds, &ok, "kubelet\n").unwrap(), "hold");
        assert_eq!(record_value(&holds, &ok, "").unwrap(), "unhold");
        let err = record_value(&holds, &ok, "kubectl")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"kubectl\"") && err.contains("\"kubelet\""),
            "{err}"
        );
    }
}

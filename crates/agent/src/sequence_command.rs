//! One entry of a command sequence as the agent config spells it: exactly one of `run`, `writeFile`,
//! `verifySha256`, and beside a `run` an optional `retryable: true`. Unknown keys are errors.

use serde::Deserialize;

use crate::driver_config::CommandSpec;

/// One command of a sequence: what it does, and whether a non-zero exit is retried under the
/// sequence's `retry` policy (`- run: [apt-get, update, -q]` with `retryable: true` beside it).
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "RawCommand")]
pub struct SequenceCommand {
    /// What it does.
    pub spec: CommandSpec,
    /// Retried on a non-zero exit (only `run` commands).
    pub retryable: bool,
}

/// A sequence entry as written: exactly one of `run`, `writeFile`, `verifySha256`, and `retryable`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawCommand {
    #[serde(default)]
    run: Option<Vec<String>>,
    #[serde(default)]
    write_file: Option<WriteFileSpec>,
    #[serde(default)]
    verify_sha256: Option<VerifySpec>,
    #[serde(default)]
    retryable: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WriteFileSpec {
    path: String,
    content: String,
    #[serde(default)]
    mode: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct VerifySpec {
    path: String,
    sha256: String,
}

impl TryFrom<RawCommand> for SequenceCommand {
    type Error = String;

    fn try_from(raw: RawCommand) -> Result<Self, String> {
        let spec = match (raw.run, raw.write_file, raw.verify_sha256) {
            (Some(argv), None, None) => CommandSpec::Run(argv),
            (None, Some(w), None) => CommandSpec::WriteFile {
                path: w.path,
                content: w.content,
                mode: w.mode,
            },
            (None, None, Some(v)) => CommandSpec::VerifySha256 {
                path: v.path,
                sha256: v.sha256,
            },
            _ => {
                return Err(
                    "a command needs exactly one of `run`, `writeFile`, `verifySha256`".into(),
                );
            }
        };
        if raw.retryable && !matches!(spec, CommandSpec::Run(_)) {
            return Err("`retryable` applies to `run` commands only".into());
        }
        Ok(SequenceCommand {
            spec,
            retryable: raw.retryable,
        })
    }
}

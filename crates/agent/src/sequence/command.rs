//! One entry of a command sequence as the agent config spells it: exactly one of `run`, `writeFile`,
//! `verifySha256`, `fetch`, `sysextSwitch`, beside a `run` an optional `retryable: true`, and in `undo:` lists an optional
//! `ifRecorded`/`ifNotRecorded` condition. Unknown keys are errors. What the
//! entry does ([`CommandSpec`]) and its checks (argv, node paths) live here too.

use serde::Deserialize;

use crate::sequence::template;

/// One command of a sequence: what it does, and whether a non-zero exit is retried under the
/// sequence's `retry` policy (`- run: [apt-get, update, -q]` with `retryable: true` beside it).
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "RawCommand")]
pub struct SequenceCommand {
    /// What it does.
    pub spec: CommandSpec,
    /// Retried on a non-zero exit (only `run` commands).
    pub retryable: bool,
    /// Runs only when a record's value is (or is not) empty (`undo:` commands only).
    pub when: Option<RecordCondition>,
}

/// `ifRecorded: <name>` / `ifNotRecorded: <name>` beside an undo command: it runs only when the record's value
/// is not empty (the thing was there before the step, e.g. the package was installed), or only when it is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum RecordCondition {
    /// Runs when the record `0` is not empty.
    Recorded(String),
    /// Runs when the record `0` is empty.
    NotRecorded(String),
}

impl RecordCondition {
    /// The record it reads.
    pub fn record(&self) -> &str {
        match self {
            RecordCondition::Recorded(name) | RecordCondition::NotRecorded(name) => name,
        }
    }

    /// Whether the command runs, given the record's value.
    pub fn holds(&self, value: &str) -> bool {
        match self {
            RecordCondition::Recorded(_) => !value.is_empty(),
            RecordCondition::NotRecorded(_) => value.is_empty(),
        }
    }
}

/// A sequence entry as written: exactly one of `run`, `writeFile`, `verifySha256`, `fetch`, `sysextSwitch`, and
/// `retryable`.
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
    fetch: Option<FetchSpec>,
    #[serde(default)]
    sysext_switch: Option<SysextSwitchSpec>,
    #[serde(default)]
    retryable: bool,
    #[serde(default)]
    if_recorded: Option<String>,
    #[serde(default)]
    if_not_recorded: Option<String>,
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

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FetchSpec {
    source: String,
    #[serde(default)]
    sha256: Option<String>,
    to: String,
    #[serde(default)]
    mode: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SysextSwitchSpec {
    name: String,
    image: String,
}

/// The error of an entry with none or several of the command keys.
const ONE_COMMAND: &str =
    "a command needs exactly one of `run`, `writeFile`, `verifySha256`, `fetch`, `sysextSwitch`";

impl TryFrom<RawCommand> for SequenceCommand {
    type Error = String;

    fn try_from(raw: RawCommand) -> Result<Self, String> {
        let spec = if let Some(switch) = raw.sysext_switch {
            if raw.run.is_some()
                || raw.write_file.is_some()
                || raw.verify_sha256.is_some()
                || raw.fetch.is_some()
            {
                return Err(ONE_COMMAND.into());
            }
            CommandSpec::SysextSwitch {
                name: switch.name,
                image: switch.image,
            }
        } else {
            match (raw.run, raw.write_file, raw.verify_sha256, raw.fetch) {
                (Some(argv), None, None, None) => CommandSpec::Run(argv),
                (None, Some(w), None, None) => CommandSpec::WriteFile {
                    path: w.path,
                    content: w.content,
                    mode: w.mode,
                },
                (None, None, Some(v), None) => CommandSpec::VerifySha256 {
                    path: v.path,
                    sha256: v.sha256,
                },
                (None, None, None, Some(f)) => CommandSpec::Fetch {
                    source: f.source,
                    sha256: f.sha256,
                    to: f.to,
                    mode: f.mode,
                },
                _ => return Err(ONE_COMMAND.into()),
            }
        };
        if raw.retryable && !matches!(spec, CommandSpec::Run(_)) {
            return Err("`retryable` applies to `run` commands only".into());
        }
        let when = match (raw.if_recorded, raw.if_not_recorded) {
            (None, None) => None,
            (Some(name), None) => Some(RecordCondition::Recorded(name)),
            (None, Some(name)) => Some(RecordCondition::NotRecorded(name)),
            (Some(_), Some(_)) => {
                return Err("a command takes `ifRecorded` or `ifNotRecorded`, not both".into());
            }
        };
        Ok(SequenceCommand {
            spec,
            retryable: raw.retryable,
            when,
        })
    }
}

/// What one entry of a sequence does. YAML: `- run: [argv…]` (optionally with `retryable: true`),
/// `- writeFile: {path, content, mode}`, `- verifySha256: {path, sha256}` or `- fetch: {source, sha256, to, mode}`. `run` arguments are literal (use `{{root}}` for node
/// paths); the `path` of the built-ins is a node path, joined under `--root` by the agent.
#[derive(Clone, Debug)]
pub enum CommandSpec {
    /// Run a program (looked up in `path`) with these arguments. Never through a shell.
    Run(Vec<String>),
    /// Write a file atomically (e.g. the package repository line for `{{minor}}`).
    WriteFile {
        /// Node path.
        path: String,
        /// Content (templated).
        content: String,
        /// Octal mode, default `0644`.
        mode: Option<String>,
    },
    /// Fail unless the file's SHA-256 is this (hex, templated: `{{pin.kubeadmSha256}}`).
    VerifySha256 {
        /// Node path.
        path: String,
        /// Expected digest, 64 hex digits.
        sha256: String,
    },
    /// Fetch an artifact by digest (into `<state-dir>/artifacts`, verified) and install it at `to`
    /// atomically: `source` is `oci://registry/repo@sha256:…` (a tag is refused), or `https://…` /
    /// `file:///…` with `sha256` beside it. `source`, `sha256` and `to` are templated.
    Fetch {
        /// The artifact source (templated, e.g. `{{pin.containerdSource}}`).
        source: String,
        /// SHA-256 of an `https://` or `file://` source (templated).
        sha256: Option<String>,
        /// Node path to install it at.
        to: String,
        /// Octal mode, default `0644`.
        mode: Option<String>,
    },
    /// Point `<sysext.extensionsDir>/<name>.raw` at `image` and merge it (`crate::os::sysext`); an empty
    /// image removes the link.
    SysextSwitch {
        /// The extension's name (its `extension-release.<name>`).
        name: String,
        /// Node path of the `.raw` image (templated), or empty.
        image: String,
    },
}

impl CommandSpec {
    /// Checks argv, paths and templates; `scope` says which template variables the command may use.
    pub(crate) fn validate(&self, scope: template::Scope<'_>) -> Result<(), String> {
        let check = |text: &str| template::check_in(text, scope);
        match self {
            CommandSpec::Run(argv) => check_argv_with(argv, check),
            CommandSpec::WriteFile {
                path,
                content,
                mode,
            } => check_node_path(path)
                .and_then(|()| check(path))
                .and_then(|()| check(content))
                .and_then(|()| check_mode(mode.as_deref())),
            CommandSpec::VerifySha256 { path, sha256 } => check_node_path(path)
                .and_then(|()| check(path))
                .and_then(|()| check(sha256)),
            CommandSpec::Fetch {
                source,
                sha256,
                to,
                mode,
            } => {
                check_node_path(to).map_err(|e| format!("fetch.to: {e}"))?;
                for (key, text) in [("source", Some(source)), ("sha256", sha256.as_ref())] {
                    if let Some(text) = text {
                        check(text).map_err(|e| format!("fetch.{key}: {e}"))?;
                    }
                }
                check(to).map_err(|e| format!("fetch.to: {e}"))?;
                check_mode(mode.as_deref()).map_err(|e| format!("fetch.mode: {e}"))?;
                if !source.contains("{{") {
                    // A templated sha256 is checked when it is expanded (prepare): stand in a valid one.
                    let sha256 = sha256.as_deref().map(|s| {
                        if s.contains("{{") {
                            LITERAL_STAND_IN
                        } else {
                            s
                        }
                    });
                    check_fetch_source(source, sha256).map_err(|e| format!("fetch.source: {e}"))?;
                }
                Ok(())
            }
            CommandSpec::SysextSwitch { name, image } => check_name(name)
                .and_then(|()| match image.is_empty() {
                    true => Ok(()),
                    false => check_node_path(image),
                })
                .and_then(|()| check(image)),
        }
    }
}

/// A valid SHA-256 standing in for a templated one while a literal source is checked.
const LITERAL_STAND_IN: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn check_mode(mode: Option<&str>) -> Result<(), String> {
    match mode {
        Some(m) if inplace_agent_api::parse_mode(m).is_none() => {
            Err(format!("mode {m:?} is not octal"))
        }
        _ => Ok(()),
    }
}

/// Parses a `fetch` source (a tag refused); `sha256` belongs to `https://` and `file://` sources only.
pub(crate) fn check_fetch_source(
    source: &str,
    sha256: Option<&str>,
) -> Result<crate::artifact::ArtifactSource, String> {
    let parsed =
        crate::artifact::ArtifactSource::parse(source, sha256).map_err(|e| e.to_string())?;
    if matches!(parsed, crate::artifact::ArtifactSource::Oci(_)) && sha256.is_some() {
        return Err(format!(
            "{source:?}: `sha256` is for https:// and file:// sources (an oci:// source carries its digest)"
        ));
    }
    Ok(parsed)
}

/// Checks an argv: a program, templates that expand, no NUL byte.
pub(crate) fn check_argv(argv: &[String]) -> Result<(), String> {
    check_argv_with(argv, template::check)
}

/// [`check_argv`] for a command whose templates know what `scope` says.
pub(crate) fn check_argv_in(argv: &[String], scope: template::Scope<'_>) -> Result<(), String> {
    check_argv_with(argv, |text| template::check_in(text, scope))
}

fn check_argv_with(
    argv: &[String],
    check: impl Fn(&str) -> Result<(), String>,
) -> Result<(), String> {
    if argv.first().is_none_or(|p| p.trim().is_empty()) {
        return Err("argv needs a program".into());
    }
    for arg in argv {
        check(arg)?;
        if arg.contains('\0') {
            return Err("an argument contains a NUL byte".into());
        }
    }
    Ok(())
}

/// Checks a node path: absolute, or a template.
pub(crate) fn check_node_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') && !path.starts_with("{{") {
        return Err(format!("{path:?} is not an absolute node path"));
    }
    Ok(())
}

/// Checks a `sysextSwitch` extension name: what systemd-sysext takes from `<name>.raw` (letters,
/// digits, `-`, `_`, `.`, not starting with a dot).
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "sysextSwitch name {name:?} is not an extension name (letters, digits, `-_.`)"
        ))
    }
}

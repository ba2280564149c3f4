//! `inplace-updater diff`: what would go in place, before anyone applies the change. Reads current and desired
//! objects (YAML or JSON: one object, a multi-document Machine + bootstrap + infra set, or a whole CanUpdate
//! request body), runs the same decision the hooks run, and prints every change with its verdict.
//!
//! A whole request is decoded by the hooks' own decoder (`api::AnyCanUpdateRequest`); object sets are checked
//! by the requests' rules (`api::check_object_sets`); either becomes a `hooks::Question`, decided the one way
//! the hooks decide ([`crate::hooks::Question::decide`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use inplace_core::{ChangeVerdict, Decision, DecisionOutcome, Policy, Scope};
use serde_json::Value;

use crate::api::{AnyCanUpdateRequest, DecodeError, Object, check_object_sets};
use crate::hooks::{Question, Unanswerable};

/// Exit code when every change goes in place (or nothing changed).
pub const EXIT_IN_PLACE: i32 = 0;
/// Exit code when some change needs a rollout (or in-place-only mode refuses it).
pub const EXIT_ROLLOUT: i32 = 3;
/// Exit code on bad input.
pub const EXIT_BAD_INPUT: i32 = 1;
/// Largest input file read (the same as a hook request body): a pipe or device is read no further than this.
pub const MAX_INPUT_BYTES: u64 = 20 * 1024 * 1024;

/// Why the inputs could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// A file could not be read (missing, not UTF-8, or over [`MAX_INPUT_BYTES`]).
    #[error(transparent)]
    Read(#[from] inplace_bounded_read::ReadError),
    /// A file is neither JSON nor YAML objects.
    #[error("{path}: {detail}")]
    Parse {
        /// The file.
        path: String,
        /// What the parser said.
        detail: String,
    },
    /// The inputs do not describe comparable objects.
    #[error("{0}")]
    Shape(String),
    /// A whole request the hooks would refuse (the message is the hook's), or objects that cannot be parsed.
    #[error("{path}: {source}")]
    Request {
        /// The file (or files).
        path: String,
        /// What the hooks' decoder said.
        #[source]
        source: DecodeError,
    },
}

#[derive(Default)]
struct Side {
    machine: Option<Value>,
    bootstrap: Option<Value>,
    infra: Option<Value>,
}

impl Side {
    /// The objects in role order (machine or MachineSet, bootstrap, infrastructure).
    fn slots(&self) -> [Option<&Value>; 3] {
        [
            self.machine.as_ref(),
            self.bootstrap.as_ref(),
            self.infra.as_ref(),
        ]
    }

    /// The objects as JSON texts, the form the hooks decide from.
    fn texts(&self) -> Result<[Option<Object>; 3], DiffError> {
        let text = |object: Option<&Value>| {
            object
                .map(serde_json::value::to_raw_value)
                .transpose()
                .map_err(|err| DiffError::Shape(format!("cannot write an object as JSON: {err}")))
        };
        let [machine, bootstrap, infra] = self.slots();
        Ok([text(machine)?, text(bootstrap)?, text(infra)?])
    }
}

/// Reads one input file (at most [`MAX_INPUT_BYTES`], UTF-8; pipes and devices included).
fn read_input(path: &Path) -> Result<String, DiffError> {
    inplace_bounded_read::read_to_string(path, MAX_INPUT_BYTES).map_err(DiffError::Read)
}

/// Parses one input: a JSON value, or every non-empty YAML document. `name` is shown in errors.
fn parse_documents(name: &str, text: &str) -> Result<Documents, DiffError> {
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return Ok(Documents::Json(value));
    }
    let mut documents = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let value: Value =
            serde::Deserialize::deserialize(document).map_err(|e| DiffError::Parse {
                path: name.to_string(),
                detail: format!("neither JSON nor YAML: {e}"),
            })?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    if documents.is_empty() {
        return Err(DiffError::Parse {
            path: name.to_string(),
            detail: "no object in the file".into(),
        });
    }
    Ok(Documents::Yaml(documents))
}

/// What an input file held.
enum Documents {
    /// One JSON value: the text itself is JSON.
    Json(Value),
    /// Every non-empty YAML document.
    Yaml(Vec<Value>),
}

impl Documents {
    fn into_vec(self) -> Vec<Value> {
        match self {
            Documents::Json(value) => vec![value],
            Documents::Yaml(values) => values,
        }
    }
}

fn kind(value: &Value) -> &str {
    value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn classify(name: &str, documents: Vec<Value>) -> Result<(Side, Option<Scope>), DiffError> {
    let mut side = Side::default();
    let mut scope = None;
    for document in documents {
        let kind = kind(&document).to_string();
        let group = document
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if !document.is_object() || kind.is_empty() {
            return Err(DiffError::Shape(format!(
                "{name}: every document needs `kind` and `apiVersion`"
            )));
        }
        let slot = match kind.as_str() {
            "Machine" | "MachineSet" => &mut side.machine,
            _ if group.starts_with("bootstrap.") => &mut side.bootstrap,
            _ => &mut side.infra,
        };
        if slot.is_some() {
            return Err(DiffError::Shape(format!(
                "{name}: two objects of the same role ({kind})"
            )));
        }
        if kind == "MachineSet" || kind.ends_with("Template") {
            scope = Some(Scope::Template);
        }
        *slot = Some(document);
    }
    Ok((side, scope))
}

/// Everything `diff` prints, plus the exit code.
#[derive(Debug)]
pub struct DiffReport {
    /// The decision.
    pub decision: Decision,
    /// `0` in place, `3` rollout needed.
    pub exit_code: i32,
}

/// Parses one `--setting KEY=VALUE` flag (split at the first `=`).
pub fn parse_setting(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))
}

/// One input of `diff` already in memory: the name its errors show (the file path) and its text.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// Shown in error messages.
    pub name: &'a str,
    /// The file's content.
    pub text: &'a str,
}

/// Reads the input files and decides ([`decide_inputs`] on their contents).
pub fn run(
    current: &Path,
    desired: Option<&Path>,
    policy: &Policy,
    settings: &BTreeMap<String, String>,
) -> Result<DiffReport, DiffError> {
    let current_name = current.display().to_string();
    let current_text = read_input(current)?;
    let desired =
        desired.map(|path| Ok::<_, DiffError>((path.display().to_string(), read_input(path)?)));
    let desired = desired.transpose()?;
    decide_inputs(
        Input {
            name: &current_name,
            text: &current_text,
        },
        desired.as_ref().map(|(name, text)| Input { name, text }),
        policy,
        settings,
    )
}

/// The inputs of one `diff` call packed in one text, as the diff_inputs fuzz target and its kept regression
/// inputs (`tests/fuzz-regressions/diff_inputs/`) hold them: `CURRENT[\0DESIRED[\0SETTINGS]]`, SETTINGS
/// one `KEY=VALUE` per line. Lines [`parse_setting`] refuses are dropped, as the CLI never gets past them.
#[derive(Debug, Clone)]
pub struct PackedInputs<'a> {
    /// CURRENT.
    pub current: Input<'a>,
    /// DESIRED, when there is a first NUL byte.
    pub desired: Option<Input<'a>>,
    /// The `--setting` flags.
    pub settings: BTreeMap<String, String>,
}

impl<'a> PackedInputs<'a> {
    /// Splits `text` at its first two NUL bytes.
    pub fn unpack(text: &'a str) -> Self {
        let mut parts = text.splitn(3, '\0');
        let current = parts.next().unwrap_or_default();
        let desired = parts.next();
        let settings = parts
            .next()
            .unwrap_or_default()
            .lines()
            .filter_map(|line| parse_setting(line).ok())
            .collect();
        Self {
            current: Input {
                name: "current",
                text: current,
            },
            desired: desired.map(|text| Input {
                name: "desired",
                text,
            }),
            settings,
        }
    }

    /// [`decide_inputs`] on these inputs with `policy`.
    pub fn decide(&self, policy: &Policy) -> Result<DiffReport, DiffError> {
        decide_inputs(self.current, self.desired, policy, &self.settings)
    }
}

/// Everything `diff` does after reading its files: parses CURRENT (and DESIRED) into the hooks' question — a
/// whole request decoded as the hook decodes it, or two object sets checked by the requests' rules — merges
/// the question's settings with `settings` (the `--setting` flags win) and decides it the way the hooks do.
/// The one code path of the CLI and of `fuzz/fuzz_targets/diff_inputs.rs`.
pub fn decide_inputs(
    current: Input<'_>,
    desired: Option<Input<'_>>,
    policy: &Policy,
    settings: &BTreeMap<String, String>,
) -> Result<DiffReport, DiffError> {
    let decision = match desired {
        None => decide_request(current, policy, settings)?,
        Some(desired) => decide_object_sets(current, desired, policy, settings)?,
    };
    let exit_code = if decision.outcome == DecisionOutcome::InPlace {
        EXIT_IN_PLACE
    } else {
        EXIT_ROLLOUT
    };
    Ok(DiffReport {
        decision,
        exit_code,
    })
}

/// A whole CanUpdate request in one file: JSON is decoded from its own text (so messages point into the
/// file), a YAML request from its JSON form.
fn decide_request(
    input: Input<'_>,
    policy: &Policy,
    flags: &BTreeMap<String, String>,
) -> Result<Decision, DiffError> {
    let body = match parse_documents(input.name, input.text)? {
        Documents::Json(_) => Cow::Borrowed(input.text.as_bytes()),
        Documents::Yaml(documents) => {
            let [request] = <[Value; 1]>::try_from(documents).map_err(|_| {
                DiffError::Shape(format!(
                    "{}: with one file, it must be a whole CanUpdateMachine or CanUpdateMachineSet request",
                    input.name
                ))
            })?;
            Cow::Owned(
                serde_json::to_vec(&request).map_err(|err| DiffError::Parse {
                    path: input.name.to_owned(),
                    detail: format!("cannot write the request as JSON: {err}"),
                })?,
            )
        }
    };
    let request = AnyCanUpdateRequest::decode(&body).map_err(|source| DiffError::Request {
        path: input.name.to_owned(),
        source,
    })?;
    match &request {
        AnyCanUpdateRequest::Machine(request) => {
            decide_question(Question::of(request), input.name, policy, flags)
        }
        AnyCanUpdateRequest::MachineSet(request) => {
            decide_question(Question::of(request), input.name, policy, flags)
        }
    }
}

/// Two object sets (one object, or a Machine + bootstrap + infrastructure set per file).
fn decide_object_sets(
    current: Input<'_>,
    desired: Input<'_>,
    policy: &Policy,
    flags: &BTreeMap<String, String>,
) -> Result<Decision, DiffError> {
    let documents = |input: Input<'_>| -> Result<_, DiffError> {
        classify(
            input.name,
            parse_documents(input.name, input.text)?.into_vec(),
        )
    };
    let (c, cs) = documents(current)?;
    let (d, ds) = documents(desired)?;
    let scope = cs.or(ds).unwrap_or(Scope::Object);
    check_object_sets(scope == Scope::Template, [c.slots(), d.slots()]).map_err(|err| {
        let file = if err.desired {
            desired.name
        } else {
            current.name
        };
        DiffError::Shape(format!("{file}: {err}"))
    })?;
    let roles = ["Machine", "bootstrap config", "infrastructure machine"];
    let present = |side: &Side| side.slots().map(|object| object.is_some());
    let (current_present, desired_present) = (present(&c), present(&d));
    for ((c, d), what) in current_present.iter().zip(&desired_present).zip(roles) {
        if c != d {
            return Err(DiffError::Shape(format!(
                "only one side has a {what}: give both or neither"
            )));
        }
    }
    if current_present.iter().all(|present| !present) {
        return Err(DiffError::Shape("no objects to compare".into()));
    }
    let (current_texts, desired_texts) = (c.texts()?, d.texts()?);
    let question = Question {
        scope,
        current: current_texts.each_ref().map(Option::as_ref),
        desired: desired_texts.each_ref().map(Option::as_ref),
        settings: &BTreeMap::new(),
        object: None,
    };
    let files = format!("{}, {}", current.name, desired.name);
    decide_question(question, &files, policy, flags)
}

/// Decides `question` as the hooks do, with the `--setting` flags over its settings.
fn decide_question(
    question: Question<'_>,
    files: &str,
    policy: &Policy,
    flags: &BTreeMap<String, String>,
) -> Result<Decision, DiffError> {
    let mut settings = question.settings.clone();
    settings.extend(flags.iter().map(|(k, v)| (k.clone(), v.clone())));
    let question = Question {
        settings: &settings,
        ..question
    };
    match question.decide(policy) {
        Ok(decided) => Ok(decided.decision),
        Err(Unanswerable::Settings(err)) => Err(DiffError::Shape(format!("settings: {err}"))),
        Err(Unanswerable::Objects(source)) => Err(DiffError::Request {
            path: files.to_owned(),
            source,
        }),
    }
}

/// The text rendering: one line per change, then the summary.
pub fn render_text(report: &DiffReport) -> String {
    let mut out = String::new();
    for change in &report.decision.changes {
        let verdict = match change.verdict {
            ChangeVerdict::Action => "in place",
            ChangeVerdict::Accept => "accepted",
            ChangeVerdict::Reject => "ROLLOUT ",
            ChangeVerdict::Ignored => "ignored ",
        };
        let values = match (&change.old, &change.new) {
            (Some(old), Some(new)) => format!(" {old} → {new}"),
            (None, Some(new)) => format!(" + {new}"),
            (Some(old), None) => format!(" - {old}"),
            (None, None) => String::new(),
        };
        out.push_str(&format!(
            "{verdict}  {} {}{values}  ({})\n",
            change.kind, change.path, change.reason
        ));
    }
    if report.decision.changes.is_empty() {
        out.push_str("no changes\n");
    }
    out.push_str(&format!("\n{}\n", report.decision.message));
    out
}

/// The JSON rendering.
pub fn render_json(report: &DiffReport) -> String {
    let value = serde_json::json!({
        "outcome": report.decision.outcome,
        "message": report.decision.message,
        "affectsAvailability": report.decision.affects_availability,
        "actions": report.decision.actions,
        "changes": report.decision.changes,
    });
    serde_json::to_string_pretty(&value).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests;

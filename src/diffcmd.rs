//! `inplace-updater diff`: what would go in place, before anyone applies the change. Reads current and desired
//! objects (YAML or JSON: one object, a multi-document Machine + bootstrap + infra set, or a whole CanUpdate
//! request body), runs the same decision the hooks run, and prints every change with its verdict.

use std::collections::BTreeMap;
use std::path::Path;

use inplace_core::{ChangeVerdict, Decision, Objects, Outcome, Policy, Scope, Settings, decide};
use serde_json::Value;

/// Exit code when every change goes in place (or nothing changed).
pub const EXIT_IN_PLACE: i32 = 0;
/// Exit code when some change needs a rollout (or in-place-only mode refuses it).
pub const EXIT_ROLLOUT: i32 = 3;
/// Exit code on bad input.
pub const EXIT_BAD_INPUT: i32 = 1;
/// Largest input file read.
pub const MAX_INPUT_BYTES: u64 = 20 * 1024 * 1024;

/// Why the inputs could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// A file could not be read.
    #[error("cannot read {path}: {detail}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        detail: String,
    },
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
}

#[derive(Default)]
struct Side {
    machine: Option<Value>,
    bootstrap: Option<Value>,
    infra: Option<Value>,
}

impl Side {
    fn objects(&self) -> Objects<'_> {
        Objects {
            machine: self.machine.as_ref(),
            bootstrap: self.bootstrap.as_ref(),
            infra: self.infra.as_ref(),
        }
    }
}

fn read_documents(path: &Path) -> Result<Vec<Value>, DiffError> {
    let shown = path.display().to_string();
    let read_err = |detail: String| DiffError::Read {
        path: shown.clone(),
        detail,
    };
    let size = std::fs::metadata(path)
        .map_err(|e| read_err(e.to_string()))?
        .len();
    if size > MAX_INPUT_BYTES {
        return Err(read_err(format!("larger than {MAX_INPUT_BYTES} bytes")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| read_err(e.to_string()))?;
    if let Ok(value) = serde_json::from_str::<Value>(&text) {
        return Ok(vec![value]);
    }
    let mut documents = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value: Value =
            serde::Deserialize::deserialize(document).map_err(|e| DiffError::Parse {
                path: shown.clone(),
                detail: format!("neither JSON nor YAML: {e}"),
            })?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    if documents.is_empty() {
        return Err(DiffError::Parse {
            path: shown,
            detail: "no object in the file".into(),
        });
    }
    Ok(documents)
}

fn kind(value: &Value) -> &str {
    value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn classify(path: &Path, documents: Vec<Value>) -> Result<(Side, Option<Scope>), DiffError> {
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
                "{}: every document needs `kind` and `apiVersion`",
                path.display()
            )));
        }
        let slot = match kind.as_str() {
            "Machine" | "MachineSet" => &mut side.machine,
            _ if group.starts_with("bootstrap.") => &mut side.bootstrap,
            _ => &mut side.infra,
        };
        if slot.is_some() {
            return Err(DiffError::Shape(format!(
                "{}: two objects of the same role ({kind})",
                path.display()
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

/// Reads the inputs and decides.
pub fn run(
    current: &Path,
    desired: Option<&Path>,
    policy: &Policy,
    settings: &BTreeMap<String, String>,
) -> Result<DiffReport, DiffError> {
    let current_docs = read_documents(current)?;
    let (current_side, desired_side, scope, request_settings) = match desired {
        None => from_request(current, current_docs)?,
        Some(desired) => {
            let (c, cs) = classify(current, current_docs)?;
            let (d, ds) = classify(desired, read_documents(desired)?)?;
            (c, d, cs.or(ds).unwrap_or(Scope::Object), BTreeMap::new())
        }
    };
    let mut merged = request_settings;
    merged.extend(settings.clone());
    let settings =
        Settings::from_map(&merged).map_err(|e| DiffError::Shape(format!("settings: {e}")))?;
    let roles = [
        (
            current_side.machine.is_some(),
            desired_side.machine.is_some(),
            "Machine",
        ),
        (
            current_side.bootstrap.is_some(),
            desired_side.bootstrap.is_some(),
            "bootstrap config",
        ),
        (
            current_side.infra.is_some(),
            desired_side.infra.is_some(),
            "infrastructure machine",
        ),
    ];
    for (c, d, what) in roles {
        if c != d {
            return Err(DiffError::Shape(format!(
                "only one side has a {what}: give both or neither"
            )));
        }
    }
    if roles.iter().all(|(c, _, _)| !c) {
        return Err(DiffError::Shape("no objects to compare".into()));
    }
    let decision = decide(
        scope,
        &current_side.objects(),
        &desired_side.objects(),
        policy,
        &settings,
    );
    let exit_code = if decision.outcome == Outcome::InPlace {
        EXIT_IN_PLACE
    } else {
        EXIT_ROLLOUT
    };
    Ok(DiffReport {
        decision,
        exit_code,
    })
}

type RequestSides = (Side, Side, Scope, BTreeMap<String, String>);

fn from_request(path: &Path, documents: Vec<Value>) -> Result<RequestSides, DiffError> {
    let [request] = <[Value; 1]>::try_from(documents).map_err(|_| {
        DiffError::Shape(format!(
            "{}: with one file, it must be a whole CanUpdateMachine or CanUpdateMachineSet request",
            path.display()
        ))
    })?;
    let settings: BTreeMap<String, String> = request
        .get("settings")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .unwrap_or_default();
    let side = |name: &str, template: bool| -> Result<Side, DiffError> {
        let objects = request.get(name).ok_or_else(|| {
            DiffError::Shape(format!("{}: no `{name}` in the request", path.display()))
        })?;
        let take = |key: &str| objects.get(key).filter(|v| v.is_object()).cloned();
        Ok(if template {
            Side {
                machine: take("machineSet"),
                bootstrap: take("bootstrapConfigTemplate"),
                infra: take("infrastructureMachineTemplate"),
            }
        } else {
            Side {
                machine: take("machine"),
                bootstrap: take("bootstrapConfig"),
                infra: take("infrastructureMachine"),
            }
        })
    };
    let template = request.pointer("/current/machineSet").is_some();
    let scope = if template {
        Scope::Template
    } else {
        Scope::Object
    };
    Ok((
        side("current", template)?,
        side("desired", template)?,
        scope,
        settings,
    ))
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

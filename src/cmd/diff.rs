//! `inplace-updater diff`: what would go in place, before anyone applies the change. Reads current and desired
//! objects (YAML or JSON: one object, a multi-document Machine + bootstrap + infra set, or a whole CanUpdate
//! request body), runs the same decision the hooks run, and prints every change with its verdict.

use std::collections::BTreeMap;
use std::path::Path;

use inplace_core::{ChangeVerdict, Decision, Objects, Outcome, Policy, Scope, Settings, decide};
use serde_json::Value;

use crate::api::validate::{self, Head, Role};

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

    fn objects(&self) -> Objects<'_> {
        Objects {
            machine: self.machine.as_ref(),
            bootstrap: self.bootstrap.as_ref(),
            infra: self.infra.as_ref(),
        }
    }
}

/// Reads one input file (at most [`MAX_INPUT_BYTES`], UTF-8; pipes and devices included).
fn read_input(path: &Path) -> Result<String, DiffError> {
    inplace_bounded_read::read_to_string(path, MAX_INPUT_BYTES).map_err(DiffError::Read)
}

/// Parses one input: a JSON value, or every non-empty YAML document. `name` is shown in errors.
fn parse_documents(name: &str, text: &str) -> Result<Vec<Value>, DiffError> {
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return Ok(vec![value]);
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
    Ok(documents)
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

/// Where one side's objects came from: the file (shown first in messages) and, for a whole request,
/// `current` or `desired` (the objects are then named as the request names them).
#[derive(Clone, Copy)]
struct Origin<'a> {
    file: &'a str,
    side: Option<&'a str>,
}

/// The request field names of each role, per scope.
fn role_fields(scope: Scope) -> ([Role; 3], [&'static str; 3]) {
    match scope {
        Scope::Object => (
            Role::MACHINE_SIDE,
            ["machine", "bootstrapConfig", "infrastructureMachine"],
        ),
        Scope::Template => (
            Role::MACHINE_SET_SIDE,
            [
                "machineSet",
                "bootstrapConfigTemplate",
                "infrastructureMachineTemplate",
            ],
        ),
    }
}

/// Checks both sides' objects with the hooks' own rules ([`crate::api::validate`]): role, names and the type of
/// every field read, and the same kind on both sides.
fn validate_sides(
    scope: Scope,
    current: (Origin<'_>, &Side),
    desired: (Origin<'_>, &Side),
) -> Result<(), DiffError> {
    let (roles, fields) = role_fields(scope);
    let at = |origin: Origin<'_>, index: usize| match origin.side {
        Some(side) => format!("{side}.{}", fields[index]),
        None => fields[index].to_owned(),
    };
    let invalid = |origin: Origin<'_>, err: validate::Invalid| {
        DiffError::Shape(format!("{}: {err}", origin.file))
    };
    let mut heads: [[Option<Head>; 3]; 2] = Default::default();
    for (heads, (origin, side)) in heads.iter_mut().zip([current, desired]) {
        for (index, object) in side.slots().into_iter().enumerate() {
            if let Some(object) = object {
                heads[index] = Some(
                    validate::check_value(roles[index], &at(origin, index), object)
                        .map_err(|err| invalid(origin, err))?,
                );
            }
        }
    }
    let [current_heads, desired_heads] = &heads;
    for (index, pair) in current_heads.iter().zip(desired_heads).enumerate() {
        if let (Some(c), Some(d)) = pair {
            validate::same_kind(&at(current.0, index), c, &at(desired.0, index), d)
                .map_err(|err| invalid(desired.0, err))?;
        }
    }
    Ok(())
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

/// Everything `diff` does after reading its files: parses CURRENT (and DESIRED), pairs the objects, merges
/// the request's settings with `settings` (the `--setting` flags win) and runs the hooks' decision. The one
/// code path of the CLI and of `fuzz/fuzz_targets/diff_inputs.rs`.
pub fn decide_inputs(
    current: Input<'_>,
    desired: Option<Input<'_>>,
    policy: &Policy,
    settings: &BTreeMap<String, String>,
) -> Result<DiffReport, DiffError> {
    let current_docs = parse_documents(current.name, current.text)?;
    let (current_side, desired_side, scope, request_settings) = match desired {
        None => {
            let sides = from_request(current.name, current_docs)?;
            let origin = |side| Origin {
                file: current.name,
                side: Some(side),
            };
            validate_sides(
                sides.2,
                (origin("current"), &sides.0),
                (origin("desired"), &sides.1),
            )?;
            sides
        }
        Some(desired) => {
            let (c, cs) = classify(current.name, current_docs)?;
            let (d, ds) = classify(desired.name, parse_documents(desired.name, desired.text)?)?;
            let scope = cs.or(ds).unwrap_or(Scope::Object);
            let origin = |file| Origin { file, side: None };
            validate_sides(
                scope,
                (origin(current.name), &c),
                (origin(desired.name), &d),
            )?;
            (c, d, scope, BTreeMap::new())
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

fn from_request(name: &str, documents: Vec<Value>) -> Result<RequestSides, DiffError> {
    let [request] = <[Value; 1]>::try_from(documents).map_err(|_| {
        DiffError::Shape(format!(
            "{name}: with one file, it must be a whole CanUpdateMachine or CanUpdateMachineSet request"
        ))
    })?;
    // As the hooks decode it: a map of strings, or the whole request is refused (never silently dropped).
    let settings: BTreeMap<String, String> = match request.get("settings") {
        None => BTreeMap::new(),
        Some(settings) => serde_json::from_value(settings.clone()).map_err(|err| {
            DiffError::Shape(format!(
                "{name}: `settings` must map names to strings: {err}"
            ))
        })?,
    };
    let side = |key: &str, template: bool| -> Result<Side, DiffError> {
        let objects = request
            .get(key)
            .ok_or_else(|| DiffError::Shape(format!("{name}: no `{key}` in the request")))?;
        // Present and not null: validation names anything else that is not an object.
        let take = |key: &str| objects.get(key).filter(|v| !v.is_null()).cloned();
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

    use super::*;

    fn fixture(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        std::fs::read_to_string(path).unwrap()
    }

    fn yaml_documents(side: &Value, keys: [&str; 3]) -> String {
        keys.iter()
            .filter_map(|key| side.get(key))
            .map(|object| serde_yaml_ng::to_string(object).unwrap())
            .collect::<Vec<_>>()
            .join("---\n")
    }

    fn summary(report: &DiffReport) -> (Outcome, usize, i32, String) {
        (
            report.decision.outcome,
            report.decision.changes.len(),
            report.exit_code,
            report.decision.message.clone(),
        )
    }

    #[test]
    fn yaml_object_sets_decide_like_the_whole_request() {
        let policy = Policy::builtin();
        let none = BTreeMap::new();
        for (name, keys) in [
            (
                "can-update-machine-kcp-mixed.json",
                ["machine", "bootstrapConfig", "infrastructureMachine"],
            ),
            (
                "can-update-machineset-md.json",
                [
                    "machineSet",
                    "bootstrapConfigTemplate",
                    "infrastructureMachineTemplate",
                ],
            ),
        ] {
            let body = fixture(name);
            let whole = decide_inputs(Input { name, text: &body }, None, &policy, &none).unwrap();
            assert!(!whole.decision.changes.is_empty(), "{name}");
            let request: Value = serde_json::from_str(&body).unwrap();
            let settings: BTreeMap<String, String> = request
                .get("settings")
                .map(|s| serde_json::from_value(s.clone()).unwrap())
                .unwrap_or_default();
            let current = yaml_documents(&request["current"], keys);
            let desired = yaml_documents(&request["desired"], keys);
            let pair = decide_inputs(
                Input {
                    name: "current.yaml",
                    text: &current,
                },
                Some(Input {
                    name: "desired.yaml",
                    text: &desired,
                }),
                &policy,
                &settings,
            )
            .unwrap();
            assert_eq!(summary(&pair), summary(&whole), "{name}");
        }
    }

    #[test]
    fn settings_flags_override_the_request_settings() {
        let body = fixture("can-update-machine-kcp-version.json");
        let input = Input {
            name: "request.json",
            text: &body,
        };
        let policy = Policy::builtin();
        let allowed = decide_inputs(input, None, &policy, &BTreeMap::new()).unwrap();
        let off = BTreeMap::from([parse_setting("inPlace=false").unwrap()]);
        let refused = decide_inputs(input, None, &policy, &off).unwrap();
        assert_eq!(
            allowed.exit_code, EXIT_IN_PLACE,
            "{}",
            allowed.decision.message
        );
        assert_eq!(
            refused.exit_code, EXIT_ROLLOUT,
            "{}",
            refused.decision.message
        );
    }

    #[test]
    fn request_settings_that_are_not_strings_are_refused_like_the_hook_refuses_them() {
        let machine = r#"{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": "m"}}"#;
        let body = format!(
            r#"{{"settings": {{"mode": "in-place-only", "inPlace": 7}}, "current": {{"machine": {machine}}}, "desired": {{"machine": {machine}}}}}"#
        );
        let err = decide_inputs(
            Input {
                name: "request.json",
                text: &body,
            },
            None,
            &Policy::builtin(),
            &BTreeMap::new(),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("request.json: `settings` must map names to strings"),
            "{err}"
        );
    }

    #[test]
    fn setting_flags_split_at_the_first_equals_sign() {
        assert_eq!(
            parse_setting("mode=a=b").unwrap(),
            ("mode".to_string(), "a=b".to_string())
        );
        assert!(parse_setting("mode").unwrap_err().contains("KEY=VALUE"));
    }

    #[test]
    fn packed_inputs_split_at_the_first_two_nul_bytes() {
        let packed = PackedInputs::unpack("a\0b\0mode=in-place-only\nbogus\n\0x=y");
        assert_eq!(packed.current.text, "a");
        assert_eq!(packed.desired.map(|d| d.text), Some("b"));
        assert_eq!(
            packed.settings,
            BTreeMap::from([
                ("mode".to_string(), "in-place-only".to_string()),
                ("\0x".to_string(), "y".to_string()),
            ])
        );
        let alone = PackedInputs::unpack("{}");
        assert!(alone.desired.is_none() && alone.settings.is_empty());
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let current = dir.path().join("current.yaml");
        std::fs::write(&current, "kind: [unclosed").unwrap();
        let missing = dir.path().join("missing.yaml");
        let policy = Policy::builtin();
        let none = BTreeMap::new();
        let err = run(&current, None, &policy, &none).unwrap_err();
        assert!(matches!(err, DiffError::Parse { .. }), "{err}");
        assert!(err.to_string().contains("current.yaml"), "{err}");
        let err = run(&missing, None, &policy, &none).unwrap_err();
        assert!(matches!(err, DiffError::Read(_)), "{err}");
        assert!(err.to_string().contains("missing.yaml"), "{err}");
    }
}

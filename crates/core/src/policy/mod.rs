//! The policy: which changed field paths the updater performs in place (an [`Action`]), accepts
//! without node work, or rejects — from a YAML rule file or the built-in default
//! ([`DEFAULT_POLICY_YAML`]). First matching rule wins; no match rejects.

mod image_field;
mod pattern;
pub mod version;

pub use image_field::ImageField;
pub use pattern::{Pattern, glob_match};

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::OnceLock;

use crate::action::Action;
use crate::drain::DrainRules;
use crate::objects::{self, ObjectRole, Objects, Scope};
use crate::path::Path;
use crate::settings::Settings;

/// The built-in policy as YAML (what `inplace-updater policy show` prints); [`Policy::builtin`] parses it.
pub const DEFAULT_POLICY_YAML: &str = include_str!("default.yaml");

/// The reason given for a change that no rule matches.
pub const NO_RULE: &str = "no rule";

/// A parsed, validated rule list.
#[derive(Clone, Debug)]
pub struct Policy {
    rules: Vec<Rule>,
    drain: DrainRules,
}

/// One rule.
#[derive(Clone, Debug)]
pub struct Rule {
    /// `name`, or `#N` (1-based position) when the file gives none.
    pub name: String,
    /// The objects it applies to (any of them).
    pub objects: Vec<ObjectMatcher>,
    /// The paths it covers (any of them, and everything below).
    pub paths: Vec<Pattern>,
    /// What it decides.
    pub verdict: Verdict,
    /// An extra check on the old and new values of an action.
    pub check: Option<Check>,
    /// A restriction to control-plane or worker machines.
    pub when: Option<When>,
    /// For an `os-image` rule: the field whose value is the image the node runs (`spec.image.url`).
    pub image: Option<ImageField>,
}

/// `{kind, apiGroup}` of a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMatcher {
    /// Kind glob, e.g. `KubeadmConfig`, `*Machine`, `*`.
    pub kind: String,
    /// API group glob; any group when absent.
    pub api_group: Option<String>,
}

/// What a rule decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The node agent performs the change.
    Action(Action),
    /// Accepted without node work; the reason says why that is safe.
    Accept(String),
    /// Needs a new machine, for this reason.
    Reject(String),
}

/// Value checks a rule can add to its action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// Only patch upgrades and upgrades to the next minor version (see [`version::upgrade_problem`]).
    KubernetesUpgrade,
}

/// Machines a rule is restricted to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum When {
    /// Control-plane Machines (CanUpdateMachine from KubeadmControlPlane, label `cluster.x-k8s.io/control-plane`).
    ControlPlane,
    /// Every other machine (MachineSets, and Machines without that label).
    Worker,
}

/// The object a change is in, as rules see it.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    /// The object's `kind`.
    pub kind: &'a str,
    /// The group of its `apiVersion`.
    pub api_group: &'a str,
    /// Whether it is a template (then rules for the templated kind apply too).
    pub scope: Scope,
    /// Whether it belongs to a control-plane Machine.
    pub control_plane: bool,
}

impl<'a> Subject<'a> {
    /// The subject of `object` in a request of `scope`.
    pub fn of(scope: Scope, object: &'a Value, control_plane: bool) -> Subject<'a> {
        Subject {
            kind: objects::kind_of(object),
            api_group: objects::api_group_of(object),
            scope,
            control_plane,
        }
    }
}

/// The verdict for one path, with the reason shown to operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathVerdict {
    /// Performed by this action.
    Action(Action),
    /// Accepted without node work, for this reason.
    Accept(String),
    /// Rejected, for this reason.
    Reject(String),
}

/// A policy file that cannot be used; the message names the rule and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Not YAML, or not the shape of a policy file (unknown field, wrong type); with line and column.
    #[error("policy file: {0}")]
    Yaml(String),
    /// A `drain:` key that cannot be set.
    #[error("policy drain.{key}: refused: {problem}")]
    Drain {
        /// The key under `drain:`.
        key: &'static str,
        /// Why.
        problem: &'static str,
    },
    /// A rule that parses but cannot work.
    #[error("policy rule {rule}: {problem}")]
    Rule {
        /// The rule's name or `#N`.
        rule: String,
        /// What is wrong with it.
        problem: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    rules: Vec<RuleFile>,
    drain: Option<DrainFile>,
}

/// The `drain:` section; a key left out keeps its default ([`DrainRules::default`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DrainFile {
    patch_version: Option<bool>,
    kubelet_args: Option<bool>,
    delete_empty_dir_data: Option<bool>,
    force_unmanaged: Option<bool>,
    /// Refused with a reason rather than as an unknown key: a minor version change always drains.
    minor_version: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    name: Option<String>,
    #[serde(default)]
    objects: Vec<ObjectFile>,
    #[serde(default)]
    paths: Vec<String>,
    action: Option<Action>,
    accept: Option<String>,
    reject: Option<String>,
    check: Option<Check>,
    when: Option<When>,
    #[serde(rename = "imageField")]
    image: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ObjectFile {
    kind: String,
    api_group: Option<String>,
}

impl Policy {
    /// The built-in default policy ([`DEFAULT_POLICY_YAML`]).
    pub fn builtin() -> Policy {
        static BUILTIN: OnceLock<Policy> = OnceLock::new();
        BUILTIN
            .get_or_init(|| {
                // The text is a constant of this crate, checked by its tests; not outside input.
                #[allow(clippy::expect_used)]
                Policy::from_yaml(DEFAULT_POLICY_YAML).expect("the built-in policy is valid")
            })
            .clone()
    }

    /// Parses and validates a rule file.
    pub fn from_yaml(text: &str) -> Result<Policy, PolicyError> {
        let file: PolicyFile =
            serde_yaml_ng::from_str(text).map_err(|e| PolicyError::Yaml(e.to_string()))?;
        let mut rules = Vec::with_capacity(file.rules.len());
        let mut names = BTreeSet::new();
        for (i, r) in file.rules.into_iter().enumerate() {
            let name = r.name.clone().unwrap_or_else(|| format!("#{}", i + 1));
            let fail = |problem: String| PolicyError::Rule {
                rule: name.clone(),
                problem,
            };
            if !names.insert(name.clone()) {
                return Err(fail("the name is used by an earlier rule".into()));
            }
            if r.objects.is_empty() {
                return Err(fail(
                    "`objects` is empty: name at least one {kind, apiGroup}".into(),
                ));
            }
            if r.objects.iter().any(|o| o.kind.is_empty()) {
                return Err(fail(
                    "an object has an empty kind (use \"*\" for any kind)".into(),
                ));
            }
            if r.paths.is_empty() {
                return Err(fail("`paths` is empty".into()));
            }
            let paths = r
                .paths
                .iter()
                .map(|p| Pattern::parse(p).map_err(|e| fail(format!("path {p:?}: {e}"))))
                .collect::<Result<Vec<_>, _>>()?;
            let verdict = match (r.action, r.accept, r.reject) {
                (Some(a), None, None) => Verdict::Action(a),
                (None, Some(reason), None) => Verdict::Accept(reason),
                (None, None, Some(reason)) => Verdict::Reject(reason),
                _ => {
                    return Err(fail(
                        "give exactly one of `action`, `accept`, `reject`".into(),
                    ));
                }
            };
            if r.check.is_some() && !matches!(verdict, Verdict::Action(_)) {
                return Err(fail("`check` only applies to `action` rules".into()));
            }
            let image = match (&verdict, r.image) {
                (Verdict::Action(Action::OsImage), Some(text)) => {
                    Some(ImageField::parse(&text).map_err(fail)?)
                }
                (Verdict::Action(Action::OsImage), None) => {
                    return Err(fail(
                        "an os-image rule needs `imageField:`, the field whose value is the image (e.g. spec.image.url)"
                            .into(),
                    ));
                }
                (_, Some(_)) => {
                    return Err(fail("`imageField` only applies to os-image rules".into()));
                }
                (_, None) => None,
            };
            let objects = r
                .objects
                .into_iter()
                .map(|o| ObjectMatcher {
                    kind: o.kind,
                    api_group: o.api_group,
                })
                .collect();
            rules.push(Rule {
                name,
                objects,
                paths,
                verdict,
                check: r.check,
                when: r.when,
                image,
            });
        }
        let drain = match file.drain {
            None => DrainRules::default(),
            Some(DrainFile {
                minor_version: Some(_),
                ..
            }) => {
                return Err(PolicyError::Drain {
                    key: "minorVersion",
                    problem: crate::settings::MINOR_DRAIN_IS_REQUIRED,
                });
            }
            Some(d) => {
                let default = DrainRules::default();
                DrainRules {
                    patch_version: d.patch_version.unwrap_or(default.patch_version),
                    kubelet_args: d.kubelet_args.unwrap_or(default.kubelet_args),
                    delete_empty_dir_data: d
                        .delete_empty_dir_data
                        .unwrap_or(default.delete_empty_dir_data),
                    force_unmanaged: d.force_unmanaged.unwrap_or(default.force_unmanaged),
                }
            }
        };
        Ok(Policy { rules, drain })
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The drain defaults (the `drain:` section), before any registration's settings.
    pub fn drain(&self) -> DrainRules {
        self.drain
    }

    /// The drain rules for a registration: the policy's, with its settings' overrides.
    pub fn drain_for(&self, settings: &Settings) -> DrainRules {
        self.drain.with(&settings.drain)
    }

    /// The first rule that applies to `path` of `subject`.
    pub fn rule_for(&self, subject: &Subject, path: &Path) -> Option<&Rule> {
        self.rules
            .iter()
            .find(|r| r.applies_to(subject) && r.paths.iter().any(|p| p.covers(path)))
    }

    /// The verdict for a change of `path` from `old` to `new` (either absent).
    pub fn judge(
        &self,
        subject: &Subject,
        path: &Path,
        old: Option<&Value>,
        new: Option<&Value>,
    ) -> PathVerdict {
        let Some(rule) = self.rule_for(subject, path) else {
            return PathVerdict::Reject(NO_RULE.to_owned());
        };
        match &rule.verdict {
            Verdict::Action(action) => match rule.check.and_then(|c| c.problem(old, new)) {
                Some(problem) => PathVerdict::Reject(problem),
                None => PathVerdict::Action(*action),
            },
            Verdict::Accept(reason) => PathVerdict::Accept(reason.clone()),
            Verdict::Reject(reason) => PathVerdict::Reject(reason.clone()),
        }
    }

    /// The actions this policy and these settings allow for the desired objects of a request — what
    /// an UpdateMachine plan may contain (`kubernetes-version` only for a kubeadm node:
    /// [`Action::refused_by_bootstrap`]). Empty when settings turn in-place updates off.
    pub fn actions_for(
        &self,
        scope: Scope,
        desired: &Objects,
        settings: &Settings,
    ) -> BTreeSet<Action> {
        let control_plane = objects::is_control_plane(scope, desired, desired);
        let bootstrap = desired.bootstrap.map(|b| {
            (
                objects::machine_level_kind(scope, b),
                objects::api_group_of(b),
            )
        });
        let mut out = BTreeSet::new();
        for role in ObjectRole::ALL {
            let Some(object) = desired.get(role) else {
                continue;
            };
            let subject = Subject::of(scope, object, control_plane);
            for rule in self.rules.iter().filter(|r| r.applies_to(&subject)) {
                if let Verdict::Action(a) = rule.verdict
                    && settings.allows(a)
                    && a.refused_by_bootstrap(bootstrap).is_none()
                {
                    out.insert(a);
                }
            }
        }
        out
    }
}

impl Policy {
    /// The field of the desired infrastructure machine that names its OS image: the `imageField:` of the first
    /// `os-image` rule that applies to it, when these settings allow the action (`None` otherwise: an
    /// UpdateMachine plan then has no OS image step).
    pub fn os_image_field(&self, desired: &Objects, settings: &Settings) -> Option<&ImageField> {
        if !settings.allows(Action::OsImage) {
            return None;
        }
        let control_plane = objects::is_control_plane(Scope::Object, desired, desired);
        let infra = desired.get(ObjectRole::Infra)?;
        let subject = Subject::of(Scope::Object, infra, control_plane);
        self.rules
            .iter()
            .filter(|r| r.verdict == Verdict::Action(Action::OsImage) && r.applies_to(&subject))
            .find_map(|r| r.image.as_ref())
    }
}

impl Rule {
    /// Whether the rule's objects and `when` match `subject`.
    pub fn applies_to(&self, subject: &Subject) -> bool {
        let when_ok = match self.when {
            None => true,
            Some(When::ControlPlane) => subject.control_plane,
            Some(When::Worker) => !subject.control_plane,
        };
        when_ok && self.objects.iter().any(|o| o.matches(subject))
    }
}

impl ObjectMatcher {
    /// Whether the matcher names `subject`'s kind (or, for a template, its templated kind) and group.
    pub fn matches(&self, subject: &Subject) -> bool {
        let templated = match subject.scope {
            Scope::Template => objects::templated_kind(subject.kind),
            Scope::Object => None,
        };
        let kind_ok = glob_match(&self.kind, subject.kind)
            || templated.is_some_and(|k| glob_match(&self.kind, k));
        kind_ok
            && self
                .api_group
                .as_deref()
                .is_none_or(|g| glob_match(g, subject.api_group))
    }
}

impl Check {
    /// Why the change fails the check, if it does.
    pub fn problem(self, old: Option<&Value>, new: Option<&Value>) -> Option<String> {
        match self {
            Check::KubernetesUpgrade => {
                fn text(v: Option<&Value>) -> Result<Option<&str>, String> {
                    match v {
                        None => Ok(None),
                        Some(Value::String(s)) => Ok(Some(s.as_str())),
                        Some(other) => Err(format!("version {other} is not a string")),
                    }
                }
                match (text(old), text(new)) {
                    (Ok(o), Ok(n)) => version::upgrade_problem(o, n),
                    (Err(e), _) | (_, Err(e)) => Some(e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;

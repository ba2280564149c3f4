//! Every object a hook (or `inplace-updater diff`) is given is checked here before anything is decided or
//! recorded: its `apiVersion`/`kind` must fit its role, its name and namespace must be Kubernetes names, and
//! every field this extension reads must have its Cluster API type (the shapes are in `rules`). Anything else
//! is an [`Invalid`] naming the field path and the shape expected, e.g.
//! `desired.machine.spec.version: expected a string, found a number`.
//!
//! Objects are checked straight from their JSON text ([`check_text`]) or from a parsed value
//! ([`check_value`], for `diff`'s YAML), by the same walk; neither builds a copy of the object.

mod names;
mod rules;
mod walk;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

pub use names::{MAX_LABEL_BYTES, MAX_NAME_BYTES, group_version, is_kind, is_label, is_subdomain};
pub use rules::{CLUSTER_API_GROUP, KUBEADM_BOOTSTRAP_GROUP};

use super::key::ObjectKey;
use walk::{MemberKey, Node, Shape, State, Walk, shown};

/// Why an object was refused: the field path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct Invalid {
    /// Where, e.g. `desired.bootstrapConfig.spec.files[2].path`.
    pub path: String,
    /// What is expected and what was found, e.g. `expected a string, found a number`.
    pub problem: String,
}

/// The place of an object in a request, which decides what it must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `machine`: a `cluster.x-k8s.io` Machine.
    Machine,
    /// `machineSet`: a `cluster.x-k8s.io` MachineSet with an object `spec.template.spec`.
    MachineSet,
    /// `bootstrapConfig`: any `group/version` kind with an object `spec` (KubeadmConfig fields typed).
    Bootstrap,
    /// `bootstrapConfigTemplate`: as [`Role::Bootstrap`], with an object `spec.template.spec`.
    BootstrapTemplate,
    /// `infrastructureMachine`: any `group/version` kind with an object `spec`.
    Infra,
    /// `infrastructureMachineTemplate`: as [`Role::Infra`], with an object `spec.template.spec`.
    InfraTemplate,
}

impl Role {
    /// The roles of a CanUpdateMachine / UpdateMachine side: machine, bootstrap config, infrastructure machine.
    pub const MACHINE_SIDE: [Role; 3] = [Role::Machine, Role::Bootstrap, Role::Infra];
    /// The roles of a CanUpdateMachineSet side.
    pub const MACHINE_SET_SIDE: [Role; 3] = [
        Role::MachineSet,
        Role::BootstrapTemplate,
        Role::InfraTemplate,
    ];

    /// The kind a Machine or MachineSet must be.
    fn required_kind(self) -> Option<&'static str> {
        match self {
            Role::Machine => Some("Machine"),
            Role::MachineSet => Some("MachineSet"),
            _ => None,
        }
    }

    fn expected_api_version(self) -> String {
        match self.required_kind() {
            Some(_) => format!("\"{CLUSTER_API_GROUP}/<version>\""),
            None => "\"<group>/<version>\" with a non-empty group (e.g. \
                     \"infrastructure.cluster.x-k8s.io/v1beta2\")"
                .into(),
        }
    }
}

/// What a valid object is: its type and name, read while it was checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// `apiVersion` (`group/version`).
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// `metadata.name` (a valid object name).
    pub name: String,
    /// `metadata.namespace` (a valid namespace), when present.
    pub namespace: Option<String>,
}

impl Head {
    /// The API group of `apiVersion`.
    pub fn group(&self) -> &str {
        self.api_version
            .split_once('/')
            .map_or("", |(group, _)| group)
    }

    /// `namespace/name` (namespace empty when absent).
    pub fn key(&self) -> ObjectKey {
        ObjectKey {
            namespace: self.namespace.clone().unwrap_or_default(),
            name: self.name.clone(),
        }
    }

    /// `{apiVersion, kind}` as an object: what decides which policy rules apply to it.
    pub fn type_meta(&self) -> Value {
        serde_json::json!({"apiVersion": self.api_version, "kind": self.kind})
    }
}

/// Why an object could not be read at all: not JSON (never the case for texts a request decoder has already
/// split out), or nested deeper than the JSON parser's recursion limit.
fn syntax(at: &str, err: &serde_json::Error) -> Invalid {
    Invalid {
        path: at.to_owned(),
        problem: format!("cannot be read: {err}"),
    }
}

/// Checks the object text at `at` (e.g. `desired.machine`) for `role`.
pub fn check_text(role: Role, at: &str, raw: &RawValue) -> Result<Head, Invalid> {
    let mut state = State::default();
    let mut deserializer = serde_json::Deserializer::from_str(raw.get());
    let walked = Top {
        role,
        at,
        state: &mut state,
    }
    .deserialize(&mut deserializer)
    .and_then(|()| deserializer.end());
    finish(role, at, state, walked.map_err(|err| syntax(at, &err)))
}

/// Checks the parsed object at `at` for `role`.
pub fn check_value(role: Role, at: &str, value: &Value) -> Result<Head, Invalid> {
    let mut state = State::default();
    let walked = Top {
        role,
        at,
        state: &mut state,
    }
    .deserialize(value);
    finish(role, at, state, walked.map_err(|err| syntax(at, &err)))
}

/// Checks that the desired object is of the current object's kind and API group.
pub fn same_kind(
    current_at: &str,
    current: &Head,
    desired_at: &str,
    desired: &Head,
) -> Result<(), Invalid> {
    if current.group() != desired.group() {
        return Err(Invalid {
            path: format!("{desired_at}.apiVersion"),
            problem: format!(
                "expected the API group of {current_at} ({:?}), found {}",
                current.group(),
                shown(&desired.api_version)
            ),
        });
    }
    if current.kind != desired.kind {
        return Err(Invalid {
            path: format!("{desired_at}.kind"),
            problem: format!(
                "expected the kind of {current_at} ({:?}), found {}",
                current.kind,
                shown(&desired.kind)
            ),
        });
    }
    Ok(())
}

fn finish(
    role: Role,
    at: &str,
    mut state: State,
    walked: Result<(), Invalid>,
) -> Result<Head, Invalid> {
    if let Some(problem) = state.problem.take() {
        return Err(problem);
    }
    walked?;
    if let Some(spec) = state.deferred.take() {
        // `spec` came before `apiVersion`/`kind`: now that the role check passed, walk it.
        let (group, kind) = head_type(&state);
        let node = Node::root(at);
        let node = node.field("spec");
        let walked = Walk {
            shape: rules::spec_shape(role, group, kind),
            node: &node,
            state: &mut state,
            nullable: false,
            capture: None,
        }
        .deserialize(&spec);
        if let Some(problem) = state.problem.take() {
            return Err(problem);
        }
        walked.map_err(|err| syntax(at, &err))?;
    }
    let (Some(api_version), Some(kind), Some(name)) = (state.api_version, state.kind, state.name)
    else {
        // The walk fails before this when one is missing.
        return Err(Invalid {
            path: at.to_owned(),
            problem: "expected apiVersion, kind and metadata.name".into(),
        });
    };
    Ok(Head {
        api_version,
        kind,
        name,
        namespace: state.namespace,
    })
}

fn head_type(state: &State) -> (&str, &str) {
    let group = state
        .api_version
        .as_deref()
        .and_then(|v| v.split_once('/'))
        .map_or("", |(group, _)| group);
    (group, state.kind.as_deref().unwrap_or_default())
}

/// The whole object: `apiVersion`, `kind`, `metadata`, `spec`, checked against the role as soon as the first
/// two are known (so a Pod sent as a Machine is named as such, not by whatever else it lacks).
struct Top<'s> {
    role: Role,
    at: &'s str,
    state: &'s mut State,
}

const TOP: &[walk::Member] = &[
    rules::API_VERSION,
    rules::KIND,
    rules::METADATA,
    walk::Member {
        name: "spec",
        shape: Shape::Any,
        required: true,
        capture: None,
    },
];

impl Top<'_> {
    /// Checks `apiVersion` and `kind` against the role once both are known; `Ok(true)` when they were.
    fn check_type<E: de::Error>(&mut self) -> Result<bool, E> {
        let (Some(api_version), Some(kind)) = (&self.state.api_version, &self.state.kind) else {
            return Ok(false);
        };
        let fits_group = match group_version(api_version) {
            Some((group, _)) => self.role.required_kind().is_none() || group == CLUSTER_API_GROUP,
            None => false,
        };
        let problem = if !fits_group {
            Some((
                "apiVersion",
                self.role.expected_api_version(),
                shown(api_version),
            ))
        } else {
            match self.role.required_kind() {
                Some(required) if kind != required => {
                    Some(("kind", format!("{required:?}"), shown(kind)))
                }
                None if !is_kind(kind) => Some(("kind", names::KIND_RULE.into(), shown(kind))),
                _ => None,
            }
        };
        match problem {
            Some((field, expected, found)) => {
                let path = format!("{}.{field}", self.at);
                Err(self
                    .state
                    .fail(path, format!("expected {expected}, found {found}")))
            }
            None => Ok(true),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Top<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Top<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let root = Node::root(self.at);
        let mut seen = [false; 4];
        let mut typed = false;
        while let Some(found) = map.next_key_seed(MemberKey(TOP))? {
            let Some(index) = found else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            seen[index] = true;
            let member = &TOP[index];
            let node = root.field(member.name);
            if index == 3 {
                if typed || self.check_type::<A::Error>()? {
                    let (group, kind) = head_type(self.state);
                    let shape = rules::spec_shape(self.role, group, kind);
                    map.next_value_seed(Walk {
                        shape,
                        node: &node,
                        state: &mut *self.state,
                        nullable: false,
                        capture: None,
                    })?;
                } else {
                    self.state.deferred = Some(map.next_value::<Value>()?);
                }
                continue;
            }
            map.next_value_seed(Walk {
                shape: &member.shape,
                node: &node,
                state: &mut *self.state,
                nullable: false,
                capture: member.capture,
            })?;
            if index < 2 && !typed {
                typed = self.check_type::<A::Error>()?;
            }
        }
        for (index, member) in TOP.iter().enumerate() {
            if !seen[index] {
                let expected = match index {
                    0 => self.role.expected_api_version(),
                    1 => match self.role.required_kind() {
                        Some(kind) => format!("{kind:?}"),
                        None => names::KIND_RULE.into(),
                    },
                    _ => "an object".into(),
                };
                return Err(self.state.fail(
                    root.field(member.name).to_string(),
                    format!("missing, expected {expected}"),
                ));
            }
        }
        Ok(())
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        self.not_an_object("a list")
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.not_an_object("a string")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.not_an_object("a boolean")
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.not_an_object("a number")
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.not_an_object("a number")
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.not_an_object("a number")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.not_an_object("null")
    }
}

impl Top<'_> {
    fn not_an_object<E: de::Error>(self, found: &str) -> Result<(), E> {
        Err(self.state.fail(
            self.at.to_owned(),
            format!("expected an object, found {found}"),
        ))
    }
}

#[cfg(test)]
mod tests;

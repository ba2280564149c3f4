//! Hook request bodies as CAPI sends them. Objects CAPI passes through untyped stay JSON maps;
//! only the shape (which objects exist, which are required) is typed here.

use std::collections::BTreeMap;

use inplace_core::decode_json;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::HOOKS_API_VERSION;
use super::error::DecodeError;
use super::key::ObjectKey;
use super::objects::{Object, parse};
use super::validate::{self, Head, Role};

/// A request type: what `kind` it is and how to check it after decoding.
pub trait HookRequest: DeserializeOwned {
    /// The request's `kind`.
    const KIND: &'static str;
    /// The TypeMeta the body carried.
    fn type_meta(&self) -> (&Option<String>, &Option<String>);
    /// Checks every object against its role ([`validate`]), and notes the types and names it read.
    fn validate(&mut self) -> Result<(), DecodeError> {
        Ok(())
    }
}

/// Decodes a hook request body, naming the first field that is wrong.
pub fn decode_request<R: HookRequest>(body: &[u8]) -> Result<R, DecodeError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(DecodeError::Empty { kind: R::KIND });
    }
    let mut request: R = decode_json(body).map_err(|detail| DecodeError::Json {
        kind: R::KIND,
        detail,
    })?;
    let (api_version, kind) = request.type_meta();
    check_type_meta("apiVersion", api_version, HOOKS_API_VERSION)?;
    check_type_meta("kind", kind, R::KIND)?;
    request.validate()?;
    Ok(request)
}

fn check_type_meta(
    field: &'static str,
    found: &Option<String>,
    expected: &'static str,
) -> Result<(), DecodeError> {
    match found {
        Some(value) if value != expected => Err(DecodeError::TypeMeta {
            field,
            found: value.chars().take(100).collect(),
            expected,
        }),
        _ => Ok(()),
    }
}

/// One side's object texts in role order (machine or MachineSet, bootstrap, infrastructure), with the paths
/// messages name them by.
pub(super) struct SideTexts<'a> {
    texts: [Option<&'a Object>; 3],
    paths: [&'static str; 3],
    roles: [Role; 3],
}

/// Checks every object of one side ([`validate::check_text`]); an object whose text equals the same role's
/// text on `twin` (the other side, already checked) takes its head instead of being walked again.
/// `checked` holds heads already known (an object checked in its parsed form); those are not walked again.
fn check_side(
    side: &SideTexts<'_>,
    twin: Option<(&SideTexts<'_>, &[Option<Head>; 3])>,
    checked: [Option<Head>; 3],
) -> Result<[Option<Head>; 3], DecodeError> {
    let mut heads = checked;
    for (index, head) in heads.iter_mut().enumerate() {
        let Some(text) = side.texts[index].filter(|_| head.is_none()) else {
            continue;
        };
        let known = twin.and_then(|(other, heads)| {
            let same = other.texts[index].is_some_and(|t| t.get() == text.get());
            same.then(|| heads[index].clone()).flatten()
        });
        *head = Some(match known {
            Some(head) => head,
            None => validate::check_text(side.roles[index], side.paths[index], text)?,
        });
    }
    if let Some((other, other_heads)) = twin {
        for (index, pair) in other_heads.iter().zip(&heads).enumerate() {
            if let (Some(current), Some(desired)) = pair {
                validate::same_kind(other.paths[index], current, side.paths[index], desired)?;
            }
        }
    }
    Ok(heads)
}

/// What validation needs of one side's objects, whichever request they belong to.
pub(super) trait SideObjects {
    /// The roles of the three objects.
    const ROLES: [Role; 3];
    /// Their field names in a side.
    const FIELDS: [&'static str; 3];
    /// Their paths on the current side and on the desired side.
    const PATHS: [[&'static str; 3]; 2];
    /// Their texts.
    fn objects(&self) -> [Option<&Object>; 3];
    /// Where the heads and the first object's key are kept.
    fn heads_mut(&mut self) -> (&mut Option<ObjectKey>, &mut [Option<Head>; 3]);

    fn texts(&self, side: Side) -> SideTexts<'_> {
        SideTexts {
            texts: self.objects(),
            paths: Self::PATHS[side as usize],
            roles: Self::ROLES,
        }
    }

    fn keep(&mut self, heads: [Option<Head>; 3]) {
        let (key, kept) = self.heads_mut();
        *key = heads[0].as_ref().map(Head::key);
        *kept = heads;
    }
}

impl SideObjects for MachineObjects {
    const ROLES: [Role; 3] = Role::MACHINE_SIDE;
    const FIELDS: [&'static str; 3] = ["machine", "bootstrapConfig", "infrastructureMachine"];
    const PATHS: [[&'static str; 3]; 2] = [
        [
            "current.machine",
            "current.bootstrapConfig",
            "current.infrastructureMachine",
        ],
        [
            "desired.machine",
            "desired.bootstrapConfig",
            "desired.infrastructureMachine",
        ],
    ];

    fn objects(&self) -> [Option<&Object>; 3] {
        [
            Some(&self.machine),
            self.bootstrap_config.as_ref(),
            self.infrastructure_machine.as_ref(),
        ]
    }

    fn heads_mut(&mut self) -> (&mut Option<ObjectKey>, &mut [Option<Head>; 3]) {
        (&mut self.key, &mut self.heads)
    }
}

impl SideObjects for MachineSetObjects {
    const ROLES: [Role; 3] = Role::MACHINE_SET_SIDE;
    const FIELDS: [&'static str; 3] = [
        "machineSet",
        "bootstrapConfigTemplate",
        "infrastructureMachineTemplate",
    ];
    const PATHS: [[&'static str; 3]; 2] = [
        [
            "current.machineSet",
            "current.bootstrapConfigTemplate",
            "current.infrastructureMachineTemplate",
        ],
        [
            "desired.machineSet",
            "desired.bootstrapConfigTemplate",
            "desired.infrastructureMachineTemplate",
        ],
    ];

    fn objects(&self) -> [Option<&Object>; 3] {
        [
            Some(&self.machine_set),
            self.bootstrap_config_template.as_ref(),
            self.infrastructure_machine_template.as_ref(),
        ]
    }

    fn heads_mut(&mut self) -> (&mut Option<ObjectKey>, &mut [Option<Head>; 3]) {
        (&mut self.key, &mut self.heads)
    }
}

/// Which side of a request (an index into [`SideObjects::PATHS`]).
#[derive(Clone, Copy)]
pub(super) enum Side {
    Current = 0,
    Desired = 1,
}

/// Validates both sides of a CanUpdate request: current first, then desired against it.
fn check_both<T: SideObjects>(current: &mut T, desired: &mut T) -> Result<(), DecodeError> {
    let current_texts = current.texts(Side::Current);
    let current_heads = check_side(&current_texts, None, Default::default())?;
    let desired_heads = check_side(
        &desired.texts(Side::Desired),
        Some((&current_texts, &current_heads)),
        Default::default(),
    )?;
    current.keep(current_heads);
    desired.keep(desired_heads);
    Ok(())
}

/// The objects of one side (`current` or `desired`) of a CanUpdateMachine request.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineObjects {
    /// The Machine (required).
    pub machine: Object,
    /// The infrastructure machine (e.g. DevMachine), any kind.
    #[serde(default)]
    pub infrastructure_machine: Option<Object>,
    /// The bootstrap config (e.g. KubeadmConfig).
    #[serde(default)]
    pub bootstrap_config: Option<Object>,
    /// The Machine's `namespace/name`, read when the request was validated.
    #[serde(skip)]
    pub key: Option<ObjectKey>,
    /// Type and name of each object (machine, bootstrap config, infrastructure machine), read when the
    /// request was validated.
    #[serde(skip)]
    pub heads: [Option<Head>; 3],
}

/// The objects of one side of a CanUpdateMachineSet request.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetObjects {
    /// The MachineSet (required).
    pub machine_set: Object,
    /// The infrastructure machine template.
    #[serde(default)]
    pub infrastructure_machine_template: Option<Object>,
    /// The bootstrap config template.
    #[serde(default)]
    pub bootstrap_config_template: Option<Object>,
    /// The MachineSet's `namespace/name`, read when the request was validated.
    #[serde(skip)]
    pub key: Option<ObjectKey>,
    /// Type and name of each object (MachineSet, bootstrap config template, infrastructure machine
    /// template), read when the request was validated.
    #[serde(skip)]
    pub heads: [Option<Head>; 3],
}

/// The desired objects of an UpdateMachine request.
pub type UpdateMachineObjects = MachineObjects;

/// `CanUpdateMachineRequest`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineRequest {
    /// TypeMeta `apiVersion`.
    #[serde(default)]
    pub api_version: Option<String>,
    /// TypeMeta `kind`.
    #[serde(default)]
    pub kind: Option<String>,
    /// ExtensionConfig `spec.settings`.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// The objects as they are.
    pub current: MachineObjects,
    /// The objects as they should become.
    pub desired: MachineObjects,
}

impl HookRequest for CanUpdateMachineRequest {
    const KIND: &'static str = "CanUpdateMachineRequest";
    fn type_meta(&self) -> (&Option<String>, &Option<String>) {
        (&self.api_version, &self.kind)
    }
    fn validate(&mut self) -> Result<(), DecodeError> {
        check_both(&mut self.current, &mut self.desired)
    }
}

/// `CanUpdateMachineSetRequest`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineSetRequest {
    /// TypeMeta `apiVersion`.
    #[serde(default)]
    pub api_version: Option<String>,
    /// TypeMeta `kind`.
    #[serde(default)]
    pub kind: Option<String>,
    /// ExtensionConfig `spec.settings`.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// The objects as they are.
    pub current: MachineSetObjects,
    /// The objects as they should become.
    pub desired: MachineSetObjects,
}

impl HookRequest for CanUpdateMachineSetRequest {
    const KIND: &'static str = "CanUpdateMachineSetRequest";
    fn type_meta(&self) -> (&Option<String>, &Option<String>) {
        (&self.api_version, &self.kind)
    }
    fn validate(&mut self) -> Result<(), DecodeError> {
        check_both(&mut self.current, &mut self.desired)
    }
}

/// `UpdateMachineRequest`: only the desired objects.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateMachineRequest {
    /// TypeMeta `apiVersion`.
    #[serde(default)]
    pub api_version: Option<String>,
    /// TypeMeta `kind`.
    #[serde(default)]
    pub kind: Option<String>,
    /// ExtensionConfig `spec.settings`.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// The objects with the desired spec already written by CAPI.
    pub desired: UpdateMachineObjects,
    /// `desired.machine` parsed, once the request was validated.
    #[serde(skip)]
    pub machine: Option<Value>,
}

impl HookRequest for UpdateMachineRequest {
    const KIND: &'static str = "UpdateMachineRequest";
    fn type_meta(&self) -> (&Option<String>, &Option<String>) {
        (&self.api_version, &self.kind)
    }
    fn validate(&mut self) -> Result<(), DecodeError> {
        // UpdateMachine reads the whole desired Machine (its facts), so it is parsed here once and checked in
        // that form rather than walked as text first.
        let machine = parse(&self.desired.machine, "desired.machine")?;
        let head = validate::check_value(Role::Machine, "desired.machine", &machine)?;
        let heads = check_side(
            &self.desired.texts(Side::Desired),
            None,
            [Some(head), None, None],
        )?;
        self.desired.keep(heads);
        self.machine = Some(machine);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(body: &str) -> Result<CanUpdateMachineRequest, DecodeError> {
        decode_request(body.as_bytes())
    }

    const MACHINE: &str = r#"{"apiVersion":"cluster.x-k8s.io/v1beta2","kind":"Machine","metadata":{"name":"m","namespace":"ns"},"spec":{}}"#;

    #[test]
    fn names_missing_and_mistyped_fields() {
        let err = decode(&format!(r#"{{"current":{{"machine":{MACHINE}}}}}"#)).unwrap_err();
        assert!(err.to_string().contains("missing field `desired`"), "{err}");
        let err = decode(&format!(
            r#"{{"current":{{"machine":{MACHINE}}},"desired":{{}}}}"#
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("desired: missing field `machine`"),
            "{err}"
        );
        let err = decode(&format!(
            r#"{{"current":{{"machine":{MACHINE}}},"desired":{{"machine":"oops"}}}}"#
        ))
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("desired.machine: expected an object, found a string"),
            "{err}"
        );
        let err = decode(&format!(
            r#"{{"settings":{{"mode":1}},"current":{{"machine":{MACHINE}}},"desired":{{"machine":{MACHINE}}}}}"#
        ))
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("settings.mode: invalid type: integer"),
            "{err}"
        );
    }

    #[test]
    fn refuses_wrong_kind_and_nameless_objects() {
        let err = decode(&format!(
            r#"{{"kind":"UpdateMachineRequest","current":{{"machine":{MACHINE}}},"desired":{{"machine":{MACHINE}}}}}"#
        ))
        .unwrap_err();
        assert!(err.to_string().contains("field `kind`"), "{err}");
        let err = decode(&format!(
            r#"{{"current":{{"machine":{MACHINE}}},"desired":{{"machine":{}}}}}"#,
            MACHINE.replace(r#""name":"m","#, "")
        ))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "desired.machine.metadata.name: missing, expected a Kubernetes object name (a DNS-1123 \
             subdomain: at most 253 lower-case letters, digits, '-' and '.', each dot-separated part \
             starting and ending with a letter or digit)"
        );
        assert!(matches!(decode("  "), Err(DecodeError::Empty { .. })));
    }

    #[test]
    fn accepts_null_optional_objects() {
        let request = decode(&format!(
            r#"{{"current":{{"machine":{MACHINE},"bootstrapConfig":null}},"desired":{{"machine":{MACHINE}}}}}"#
        ))
        .unwrap();
        assert!(request.current.bootstrap_config.is_none());
        assert_eq!(request.desired.key.unwrap().to_string(), "ns/m");
        assert_eq!(request.desired.heads[0].as_ref().unwrap().kind, "Machine");
    }

    #[test]
    fn an_object_spelled_alike_on_both_sides_is_checked_once_and_kinds_must_match() {
        let config = |kind: &str| {
            format!(
                r#"{{"apiVersion":"bootstrap.cluster.x-k8s.io/v1beta2","kind":"{kind}","metadata":{{"name":"b"}},"spec":{{}}}}"#
            )
        };
        let body = |current: &str, desired: &str| {
            format!(
                r#"{{"current":{{"machine":{MACHINE},"bootstrapConfig":{current}}},"desired":{{"machine":{MACHINE},"bootstrapConfig":{desired}}}}}"#
            )
        };
        let same = config("KubeadmConfig");
        let request = decode(&body(&same, &same)).unwrap();
        assert_eq!(request.current.heads, request.desired.heads);
        let err = decode(&body(&same, &config("TalosConfig"))).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "desired.bootstrapConfig.kind: expected the kind of current.bootstrapConfig"
            ),
            "{err}"
        );
    }
}

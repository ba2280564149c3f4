//! The validation rules, in one place: the shape of every field the hooks, the policy and the plan read, per
//! object role. A field not listed here is never read by this extension, so any value passes; a field listed
//! here must have its Cluster API (v1beta2) type, or the request is refused naming it.
//!
//! Who reads what (keep in step when a reader changes):
//! - `inplace_core::plan::MachineFacts`: Machine `metadata.name/namespace/labels`, `spec.clusterName`, `spec.version`,
//!   `spec.providerID`; the cluster-name label as a fallback cluster name.
//! - the policy (`crates/core`): `apiVersion`, `kind`, the control-plane label; `spec.version` (its
//!   `kubernetes-upgrade` check), `spec.failureDomain`, and the keyed lists the diff matches by key
//!   (`readinessGates[conditionType]`, `files[path]`, `users[name]`, `kubeletExtraArgs[name]`).
//! - `inplace_core::plan::build` (through its typed `KubeadmConfigView`): KubeadmConfig `spec.files`, `spec.users[].sshAuthorizedKeys`, `spec.ntp`,
//!   `spec.clusterConfiguration.etcd.local.imageTag/imageRepository`,
//!   `spec.{init,join}Configuration.nodeRegistration.kubeletExtraArgs`.

use super::walk::{Member, Shape, Slot, Text};

const fn optional(name: &'static str, shape: Shape) -> Member {
    Member {
        name,
        shape,
        required: false,
        capture: None,
    }
}

const fn required(name: &'static str, shape: Shape) -> Member {
    Member {
        name,
        shape,
        required: true,
        capture: None,
    }
}

const STRING: Shape = Shape::Text(Text::Any);
const STRINGS: Shape = Shape::List(&STRING);
const STRING_MAP: Shape = Shape::Map(&STRING, &[]);
const ANY_OBJECT: Shape = Shape::Object(&[]);

/// The label CAPI puts on every object of a cluster, naming it; read as the Machine's cluster when
/// `spec.clusterName` is empty, so it must be a name too.
const LABELS: Shape = Shape::Map(
    &STRING,
    &[(
        inplace_core::objects::CLUSTER_NAME_LABEL,
        Shape::Text(Text::NameOrEmpty),
    )],
);

/// `apiVersion` and `kind`: strings here, checked against the role once both are known.
pub(super) const API_VERSION: Member = Member {
    name: "apiVersion",
    shape: STRING,
    required: true,
    capture: Some(Slot::ApiVersion),
};
pub(super) const KIND: Member = Member {
    name: "kind",
    shape: STRING,
    required: true,
    capture: Some(Slot::Kind),
};

/// `metadata` of every object.
pub(super) const METADATA: Member = required(
    "metadata",
    Shape::Object(&[
        Member {
            name: "name",
            shape: Shape::Text(Text::Name),
            required: true,
            capture: Some(Slot::Name),
        },
        Member {
            name: "namespace",
            shape: Shape::Text(Text::Label),
            required: false,
            capture: Some(Slot::Namespace),
        },
        optional("labels", LABELS),
        optional("annotations", STRING_MAP),
    ]),
);

/// A Machine's `spec` (and a MachineSet's `spec.template.spec`).
const MACHINE_SPEC: Shape = Shape::Object(&[
    optional("clusterName", Shape::Text(Text::NameOrEmpty)),
    optional("version", STRING),
    optional("providerID", STRING),
    optional("failureDomain", STRING),
    optional(
        "readinessGates",
        Shape::List(&Shape::Object(&[required("conditionType", STRING)])),
    ),
]);

/// A MachineSet's `spec`: CanUpdateMachineSet compares `spec.template.spec`, so it must be there.
const MACHINE_SET_SPEC: Shape = Shape::Object(&[
    optional("clusterName", Shape::Text(Text::NameOrEmpty)),
    required(
        "template",
        Shape::Object(&[
            optional(
                "metadata",
                Shape::Object(&[
                    optional("labels", LABELS),
                    optional("annotations", STRING_MAP),
                ]),
            ),
            required("spec", MACHINE_SPEC),
        ]),
    ),
]);

/// The encodings CAPI's KubeadmConfig `files[].encoding` allows.
const FILE_ENCODINGS: &[&str] = &["base64", "gzip", "gzip+base64"];

/// `{name, value}` items (v1beta2 `Arg`).
const ARGS: Shape = Shape::List(&Shape::Object(&[
    required("name", STRING),
    required("value", STRING),
]));

/// `initConfiguration` / `joinConfiguration`.
const NODE_CONFIGURATION: Shape = Shape::Object(&[optional(
    "nodeRegistration",
    Shape::Object(&[optional("kubeletExtraArgs", ARGS)]),
)]);

/// A KubeadmConfig's `spec` (and a KubeadmConfigTemplate's `spec.template.spec`).
const KUBEADM_CONFIG_SPEC: Shape = Shape::Object(&[
    optional(
        "files",
        Shape::List(&Shape::Object(&[
            required("path", STRING),
            optional("content", STRING),
            optional("owner", STRING),
            optional("permissions", STRING),
            optional("encoding", Shape::Text(Text::OneOf(FILE_ENCODINGS))),
            optional("append", Shape::Bool),
            optional("contentFrom", ANY_OBJECT),
        ])),
    ),
    optional(
        "users",
        Shape::List(&Shape::Object(&[
            required("name", STRING),
            optional("sshAuthorizedKeys", STRINGS),
        ])),
    ),
    optional(
        "ntp",
        Shape::Object(&[
            optional("servers", STRINGS),
            optional("enabled", Shape::Bool),
        ]),
    ),
    optional(
        "clusterConfiguration",
        Shape::Object(&[optional(
            "etcd",
            Shape::Object(&[optional(
                "local",
                Shape::Object(&[
                    optional("imageTag", STRING),
                    optional("imageRepository", STRING),
                ]),
            )]),
        )]),
    ),
    optional("initConfiguration", NODE_CONFIGURATION),
    optional("joinConfiguration", NODE_CONFIGURATION),
]);

/// `spec` of a template whose `spec.template.spec` has this shape.
macro_rules! template_of {
    ($spec:expr) => {
        Shape::Object(&[required(
            "template",
            Shape::Object(&[required("spec", $spec)]),
        )])
    };
}

const KUBEADM_CONFIG_TEMPLATE_SPEC: Shape = template_of!(KUBEADM_CONFIG_SPEC);
const ANY_TEMPLATE_SPEC: Shape = template_of!(ANY_OBJECT);

/// The API group of Machines and MachineSets.
pub const CLUSTER_API_GROUP: &str = "cluster.x-k8s.io";
/// The API group of KubeadmConfig and KubeadmConfigTemplate.
pub const KUBEADM_BOOTSTRAP_GROUP: &str = "bootstrap.cluster.x-k8s.io";

/// The shape of `spec` for an object of this role, group and kind (already checked to fit the role).
pub(super) fn spec_shape(role: super::Role, group: &str, kind: &str) -> &'static Shape {
    use super::Role;
    match role {
        Role::Machine => &MACHINE_SPEC,
        Role::MachineSet => &MACHINE_SET_SPEC,
        Role::Bootstrap if group == KUBEADM_BOOTSTRAP_GROUP && kind == "KubeadmConfig" => {
            &KUBEADM_CONFIG_SPEC
        }
        Role::BootstrapTemplate
            if group == KUBEADM_BOOTSTRAP_GROUP && kind == "KubeadmConfigTemplate" =>
        {
            &KUBEADM_CONFIG_TEMPLATE_SPEC
        }
        Role::Bootstrap | Role::Infra => &ANY_OBJECT,
        Role::BootstrapTemplate | Role::InfraTemplate => &ANY_TEMPLATE_SPEC,
    }
}

#[cfg(test)]
pub(super) fn every_object_shape() -> Vec<&'static Shape> {
    fn collect(shape: &'static Shape, out: &mut Vec<&'static Shape>) {
        match shape {
            Shape::Object(members) => {
                out.push(shape);
                for member in *members {
                    collect(&member.shape, out);
                }
            }
            Shape::List(item) => collect(item, out),
            Shape::Map(values, special) => {
                collect(values, out);
                for (_, shape) in *special {
                    collect(shape, out);
                }
            }
            Shape::Any | Shape::Bool | Shape::Text(_) => {}
        }
    }
    let mut out = Vec::new();
    for shape in [
        &MACHINE_SPEC,
        &MACHINE_SET_SPEC,
        &KUBEADM_CONFIG_SPEC,
        &KUBEADM_CONFIG_TEMPLATE_SPEC,
        &ANY_TEMPLATE_SPEC,
        &METADATA.shape,
    ] {
        collect(shape, &mut out);
    }
    out
}

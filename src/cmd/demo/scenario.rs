//! What the demo's simulated CAPI rolls out: the Kubernetes upgrade v1.33.4 → v1.34.1 of the built-in
//! requests, or an OS image (the DevMachine's `spec.backend.docker.customImage`, mapped to the `os-image` action
//! by the built-in policy and turned on by the `enableActions` setting) at the Machines' current version. Pure:
//! it only rewrites request bodies.

use serde_json::{Value, json};

use super::sandbox::SANDBOX_OS_IMAGE;

/// The Kubernetes version the demo's Machines run before an upgrade.
pub const CURRENT_VERSION: &str = "v1.33.4";

/// What the demo rolls out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scenario {
    /// Kubernetes v1.33.4 → v1.34.1.
    Upgrade,
    /// This OS image, in place of [`SANDBOX_OS_IMAGE`], Kubernetes unchanged.
    OsImage(String),
}

impl Scenario {
    /// What changes, in a few words.
    pub fn what(&self) -> String {
        match self {
            Scenario::Upgrade => "upgrade v1.33.4 → v1.34.1".into(),
            Scenario::OsImage(image) => format!("OS image {SANDBOX_OS_IMAGE} → {image}"),
        }
    }

    /// The line printed before the rollout.
    pub fn headline(&self) -> String {
        match self {
            Scenario::Upgrade => format!(
                "CAPI: {} in place (control plane one by one, then workers)",
                self.what()
            ),
            Scenario::OsImage(_) => format!(
                "CAPI: {} in place (DevMachine spec.backend.docker.customImage; setting enableActions: \
                 os-image): drain, switch, reboot, verify, uncordon",
                self.what()
            ),
        }
    }

    /// A request of the Kubernetes upgrade (a CanUpdate question or an UpdateMachine call) rewritten for this
    /// scenario: for an OS image, the desired version is the current one, the infrastructure machine (or its
    /// template) changes its image, and the registration turns `os-image` on.
    pub fn request(&self, mut request: Value) -> Value {
        let Scenario::OsImage(image) = self else {
            return request;
        };
        let set_image = |object: &mut Value, spec: &str, image: &str| {
            if let Some(spec) = object.pointer_mut(spec).filter(|s| s.is_object()) {
                spec["backend"]["docker"]["customImage"] = json!(image);
            }
        };
        for (side, image) in [("current", SANDBOX_OS_IMAGE), ("desired", image.as_str())] {
            let objects = &mut request[side];
            set_image(&mut objects["infrastructureMachine"], "/spec", image);
            set_image(
                &mut objects["infrastructureMachineTemplate"],
                "/spec/template/spec",
                image,
            );
            for version in [
                "/machine/spec/version",
                "/machineSet/spec/template/spec/version",
            ] {
                if let Some(v) = objects.pointer_mut(version) {
                    *v = json!(CURRENT_VERSION);
                }
            }
        }
        request["settings"] = json!({ "enableActions": "os-image" });
        request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_os_image_request_changes_only_the_image_and_turns_the_action_on() {
        let question = json!({
            "current": {"machine": {"spec": {"version": "v1.33.4"}}, "infrastructureMachine": {"spec": {}}},
            "desired": {"machine": {"spec": {"version": "v1.34.1"}}, "infrastructureMachine": {"spec": {}}}
        });
        let image = Scenario::OsImage("registry.example/node-os:2.0".into());
        let asked = image.request(question.clone());
        assert_eq!(asked["desired"]["machine"]["spec"]["version"], "v1.33.4");
        assert_eq!(
            asked["current"]["infrastructureMachine"]["spec"]["backend"]["docker"]["customImage"],
            SANDBOX_OS_IMAGE
        );
        assert_eq!(
            asked["desired"]["infrastructureMachine"]["spec"]["backend"]["docker"]["customImage"],
            "registry.example/node-os:2.0"
        );
        assert_eq!(asked["settings"]["enableActions"], "os-image");
        assert_eq!(Scenario::Upgrade.request(question.clone()), question);
    }
}

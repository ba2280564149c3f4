//! Request bodies: the realistic fixtures of tests/fixtures, the worst case (a KubeadmConfig with 200 files of
//! 10 KiB, 20 of them changed) and UpdateMachine bodies for any Machine of any cluster.

use anyhow::Context as _;
use serde_json::{Value, json};

/// Files in the worst-case KubeadmConfig.
pub const WORST_FILES: usize = 200;
/// Size of each worst-case file's content.
pub const WORST_FILE_BYTES: usize = 10 * 1024;
/// How many of them differ between current and desired.
pub const WORST_CHANGED: usize = 20;

/// A fixture as CAPI would send it: compact JSON, as Go's `encoding/json` writes it (the files are indented
/// for readers; CAPI sends no whitespace).
pub fn fixture(name: &str) -> anyhow::Result<Vec<u8>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read(&path).with_context(|| path.display().to_string())?;
    let value: Value = serde_json::from_slice(&text).with_context(|| name.to_string())?;
    Ok(serde_json::to_vec(&value)?)
}

fn fixture_json(name: &str) -> anyhow::Result<Value> {
    serde_json::from_slice(&fixture(name)?).with_context(|| name.to_string())
}

/// Printable, non-repeating text of exactly `len` bytes (config-file-like lines).
fn file_text(file: usize, revision: usize, len: usize) -> String {
    let mut text = String::with_capacity(len + 64);
    let mut line = 0usize;
    while text.len() < len {
        // A cheap mixing function keeps lines distinct, as real configuration is.
        let noise = (file as u64 + 1)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add((line as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9))
            .wrapping_add(revision as u64);
        text.push_str(&format!(
            "setting.{file:03}.{line:04} = {noise:016x} # rev {revision}\n"
        ));
        line += 1;
    }
    text.truncate(len);
    text
}

fn worst_files(changed_revision: usize) -> Value {
    let files: Vec<Value> = (0..WORST_FILES)
        .map(|i| {
            // Every tenth file changes: 20 of 200.
            let revision = if i % (WORST_FILES / WORST_CHANGED) == 0 {
                changed_revision
            } else {
                0
            };
            json!({
                "path": format!("/etc/edge/conf.d/{i:03}-site.conf"),
                "owner": "root:root",
                "permissions": "0644",
                "content": file_text(i, revision, WORST_FILE_BYTES),
            })
        })
        .collect();
    Value::Array(files)
}

/// CanUpdateMachine whose KubeadmConfig holds 200 files of 10 KiB on both sides, 20 of them changed, and
/// nothing else changed.
pub fn worst_can_update_machine() -> anyhow::Result<Vec<u8>> {
    let mut request = fixture_json("can-update-machine-kcp-files-keys.json")?;
    let current_spec = request["current"]["bootstrapConfig"]["spec"].clone();
    let mut desired_spec = current_spec.clone();
    request["current"]["bootstrapConfig"]["spec"]["files"] = worst_files(0);
    desired_spec["files"] = worst_files(1);
    request["desired"]["bootstrapConfig"]["spec"] = desired_spec;
    Ok(serde_json::to_vec(&request)?)
}

/// The new MachineSet of cluster `cluster`'s MachineDeployment, which the worker Machines are moved to.
pub fn set_name(cluster: &str) -> String {
    format!("{cluster}-md-0-q9vdm")
}

/// What the MachineDeployment controller asks before it moves Machines to the new MachineSet of `cluster`
/// (the MD fixture, that MachineSet renamed), so their UpdateMachine calls find its verdict.
pub fn can_update_machine_set(cluster: &str) -> anyhow::Result<Vec<u8>> {
    let mut request = fixture_json("can-update-machineset-md.json")?;
    request["desired"]["machineSet"]["metadata"]["name"] = json!(set_name(cluster));
    Ok(serde_json::to_vec(&request)?)
}

/// An UpdateMachine body template (worker fixture) with `{{NAME}}`, `{{CLUSTER}}` placeholders, so each request
/// for another Machine costs one string replace.
pub struct UpdateTemplate {
    text: String,
}

const NAME: &str = "@@MACHINE@@";
const CLUSTER: &str = "@@CLUSTER@@";

impl UpdateTemplate {
    pub fn worker() -> anyhow::Result<UpdateTemplate> {
        Self::from_fixture("update-machine-worker.json")
    }

    fn from_fixture(name: &str) -> anyhow::Result<UpdateTemplate> {
        let mut request = fixture_json(name)?;
        for object in ["machine", "bootstrapConfig", "infrastructureMachine"] {
            let object = &mut request["desired"][object];
            if object.is_object() {
                object["metadata"]["name"] = json!(NAME);
                object["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!(CLUSTER);
            }
        }
        let machine = &mut request["desired"]["machine"];
        // Each cluster's MachineDeployment has its own MachineSet (see `can_update_machine_set`).
        machine["metadata"]["labels"]["cluster.x-k8s.io/set-name"] = json!(set_name(CLUSTER));
        machine["spec"]["clusterName"] = json!(CLUSTER);
        machine["spec"]["providerID"] = json!(format!("docker:////{NAME}"));
        machine["spec"]["bootstrap"]["configRef"]["name"] = json!(NAME);
        machine["spec"]["bootstrap"]["dataSecretName"] = json!(NAME);
        machine["spec"]["infrastructureRef"]["name"] = json!(NAME);
        let infra = &mut request["desired"]["infrastructureMachine"];
        if infra.is_object() {
            infra["spec"]["providerID"] = json!(format!("docker:////{NAME}"));
        }
        Ok(UpdateTemplate {
            text: serde_json::to_string(&request)?,
        })
    }

    /// The body for Machine `default/<machine>` of cluster `<cluster>`.
    pub fn body(&self, machine: &str, cluster: &str) -> Vec<u8> {
        self.text
            .replace(NAME, machine)
            .replace(CLUSTER, cluster)
            .into_bytes()
    }
}

/// A fixture whose object name is replaced on every call (a text replace over the compact JSON, so the name
/// stays consistent wherever the fixture repeats it: metadata, references, providerID).
pub struct Renamed {
    text: String,
    name: String,
}

impl Renamed {
    /// A CanUpdateMachine fixture; the desired Machine's name is replaced.
    pub fn machine(fixture_name: &str) -> anyhow::Result<Renamed> {
        Self::at(fixture_name, "/desired/machine/metadata/name")
    }

    /// A CanUpdateMachineSet fixture; the desired MachineSet's name is replaced.
    pub fn machine_set(fixture_name: &str) -> anyhow::Result<Renamed> {
        Self::at(fixture_name, "/desired/machineSet/metadata/name")
    }

    fn at(fixture_name: &str, pointer: &str) -> anyhow::Result<Renamed> {
        let request = fixture_json(fixture_name)?;
        let name = request
            .pointer(pointer)
            .and_then(Value::as_str)
            .with_context(|| format!("{fixture_name}: no name at {pointer}"))?
            .to_string();
        Ok(Renamed {
            text: serde_json::to_string(&request)?,
            name,
        })
    }

    /// The body with the object named `name`.
    pub fn body(&self, name: &str) -> Vec<u8> {
        self.text.replace(&self.name, name).into_bytes()
    }
}

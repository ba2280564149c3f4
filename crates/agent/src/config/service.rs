//! The sections of the agent's `--config` for the drivers that change a service's configuration and restart it
//! (`kubelet:`, `ntp:`, `etcd:`) and for the inventory's version commands (`inventory:`): paths and argv, each
//! with the default of a kubeadm-provisioned node.

use serde::Deserialize;

/// The kubelet-args driver.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletConfig {
    /// Node path of kubeadm's flags file.
    #[serde(default = "default_flags_file")]
    pub flags_file: String,
    /// Restarts kubelet after a change (argv).
    #[serde(default = "default_kubelet_restart")]
    pub restart: Vec<String>,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            flags_file: default_flags_file(),
            restart: default_kubelet_restart(),
        }
    }
}

fn default_flags_file() -> String {
    "/var/lib/kubelet/kubeadm-flags.env".to_owned()
}

fn default_kubelet_restart() -> Vec<String> {
    ["systemctl", "restart", "kubelet"]
        .map(String::from)
        .to_vec()
}

/// Which time service the node runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NtpFlavor {
    /// chrony: `server <host> iburst` lines in a conf.d drop-in.
    #[default]
    Chrony,
    /// systemd-timesyncd: `[Time] NTP=…` in a timesyncd.conf.d drop-in.
    Timesyncd,
}

/// The ntp driver.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NtpConfig {
    /// chrony (default) or timesyncd.
    #[serde(default)]
    pub flavor: NtpFlavor,
    /// Node path of the drop-in the agent owns. Default: chrony
    /// `/etc/chrony/conf.d/inplace-updater.conf`, timesyncd
    /// `/etc/systemd/timesyncd.conf.d/inplace-updater.conf`.
    #[serde(default)]
    pub config_file: Option<String>,
    /// Restart command. Default: `systemctl restart chrony` / `systemctl restart systemd-timesyncd`.
    #[serde(default)]
    pub restart: Option<Vec<String>>,
}

impl NtpConfig {
    /// The drop-in's node path.
    pub fn config_file(&self) -> String {
        self.config_file
            .clone()
            .unwrap_or_else(|| match self.flavor {
                NtpFlavor::Chrony => "/etc/chrony/conf.d/inplace-updater.conf".to_owned(),
                NtpFlavor::Timesyncd => {
                    "/etc/systemd/timesyncd.conf.d/inplace-updater.conf".to_owned()
                }
            })
    }

    /// The restart argv.
    pub fn restart(&self) -> Vec<String> {
        self.restart.clone().unwrap_or_else(|| {
            let unit = match self.flavor {
                NtpFlavor::Chrony => "chrony",
                NtpFlavor::Timesyncd => "systemd-timesyncd",
            };
            ["systemctl", "restart", unit].map(String::from).to_vec()
        })
    }
}

/// The etcd-image driver.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdConfig {
    /// Node path of the etcd static pod manifest.
    #[serde(default = "default_etcd_manifest")]
    pub manifest: String,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            manifest: default_etcd_manifest(),
        }
    }
}

fn default_etcd_manifest() -> String {
    "/etc/kubernetes/manifests/etcd.yaml".to_owned()
}

/// Inventory commands (argv); their trimmed first stdout line is reported.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InventoryConfig {
    /// Prints the kubelet version.
    #[serde(default = "default_kubelet_version")]
    pub kubelet_version: Vec<String>,
    /// Prints the kubeadm version.
    #[serde(default = "default_kubeadm_version")]
    pub kubeadm_version: Vec<String>,
}

impl Default for InventoryConfig {
    fn default() -> Self {
        Self {
            kubelet_version: default_kubelet_version(),
            kubeadm_version: default_kubeadm_version(),
        }
    }
}

fn default_kubelet_version() -> Vec<String> {
    ["kubelet", "--version"].map(String::from).to_vec()
}

fn default_kubeadm_version() -> Vec<String> {
    ["kubeadm", "version", "-o", "short"]
        .map(String::from)
        .to_vec()
}

//! Every bound on what the agent reads from disk, in one place. Each file is read through
//! `inplace_bounded_read`, which stops one byte past the bound whatever the file is (a pipe, a device, a
//! file that grows while read) and names the file and the bound. The agent config's bound is
//! [`crate::MAX_CONFIG_BYTES`]; server answers are bounded by `MAX_POLL_RESPONSE_BYTES` in the protocol.

/// `--token-file`, re-read before every request: one bearer token.
pub const MAX_TOKEN_FILE_BYTES: u64 = 4096;
/// `--ca-file`: the CA bundle the server's certificate is checked against.
pub const MAX_CA_FILE_BYTES: u64 = 1024 * 1024;
/// `state.json` and `plan-<id>.json` in `--state-dir` (a plan is at most 16 MiB on the wire).
pub const MAX_STATE_BYTES: u64 = 64 * 1024 * 1024;
/// The drivers' journals in `--state-dir` (`managed-files.json`, the kubelet flags journal).
pub const MAX_JOURNAL_BYTES: u64 = 16 * 1024 * 1024;
/// One-line node facts (`/proc/sys/kernel/random/boot_id`, hostname).
pub const MAX_NODE_FACT_BYTES: u64 = 64 * 1024;
/// The etcd static-pod manifest the etcd-image driver edits.
pub const MAX_ETCD_MANIFEST_BYTES: u64 = 1024 * 1024;
/// Each control-plane static-pod manifest (kube-apiserver, …) read to see which version a node runs before a
/// `kubeadmUpgrade` step.
pub const MAX_CONTROL_PLANE_MANIFEST_BYTES: u64 = 1024 * 1024;
/// The kubelet flags file (`kubeadm-flags.env`) the kubelet-args driver edits.
pub const MAX_KUBELET_FLAGS_BYTES: u64 = 1024 * 1024;
/// `<root>/etc/passwd` and `<root>/etc/group`, read to resolve file owners and SSH users.
pub const MAX_USER_DB_BYTES: u64 = 16 * 1024 * 1024;
/// A file the files driver appends to (its current content is read first), and a file it reads to
/// compare with what it would write: the largest decoded file a plan can carry.
pub const MAX_MANAGED_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// A node file backed up before the agent replaces it.
pub const MAX_BACKUP_BYTES: u64 = 64 * 1024 * 1024;
/// Each of the etcd CA, health-check client certificate and key the control-plane preflight reads.
pub const MAX_ETCD_PKI_FILE_BYTES: u64 = 64 * 1024;

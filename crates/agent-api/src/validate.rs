//! Pure checks both sides run: the server before it hands out a plan, the agent before it runs
//! one (and on each step's action, so a bad step fails with a clear message).

use std::collections::BTreeSet;

use crate::{
    MAX_OS_IMAGE_BYTES, MAX_PLAN_ID_BYTES, MAX_STEP_TIMEOUT_SECONDS, MAX_STEPS, MESSAGE_MAX_BYTES,
    MIN_STEP_TIMEOUT_SECONDS, Plan, STDERR_TAIL_MAX_BYTES, StepAction, StepReport,
};

/// Longest Kubernetes version string accepted, in bytes.
const MAX_VERSION_BYTES: usize = 64;
/// Longest file path in a `files` step, in bytes (Linux `PATH_MAX`).
const MAX_PATH_BYTES: usize = 4096;
/// Longest image tag (the OCI distribution spec's limit).
const MAX_IMAGE_TAG_BYTES: usize = 128;
/// Longest login name (Linux `useradd` limit).
const MAX_USER_NAME_BYTES: usize = 32;

/// Why a plan (or one of its steps) is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The id is empty, too long, or has characters other than `[A-Za-z0-9._-]`.
    #[error("plan id {0:?} is not 1..={MAX_PLAN_ID_BYTES} characters of [A-Za-z0-9._-]")]
    BadId(String),
    /// Machine namespace or name is empty.
    #[error("plan machine reference has an empty namespace or name")]
    BadMachine,
    /// More steps than [`MAX_STEPS`].
    #[error("plan has {0} steps, more than the limit of {MAX_STEPS}")]
    TooManySteps(usize),
    /// `steps[i].index != i`.
    #[error("step at position {position} has index {index}")]
    BadIndex {
        /// Position in the list.
        position: usize,
        /// Index the step claims.
        index: u32,
    },
    /// Timeout outside [`MIN_STEP_TIMEOUT_SECONDS`]..=[`MAX_STEP_TIMEOUT_SECONDS`].
    #[error(
        "step {index}: timeoutSeconds {timeout} outside {MIN_STEP_TIMEOUT_SECONDS}..={MAX_STEP_TIMEOUT_SECONDS}"
    )]
    BadTimeout {
        /// Step index.
        index: u32,
        /// The timeout asked for.
        timeout: u32,
    },
    /// A step's action is not acceptable.
    #[error("step {index} ({kind}): {reason}")]
    BadAction {
        /// Step index.
        index: u32,
        /// The action's kind.
        kind: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// Why a step report is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// The plan id is malformed.
    #[error("report plan id {0:?} is not 1..={MAX_PLAN_ID_BYTES} characters of [A-Za-z0-9._-]")]
    BadId(String),
    /// The stderr tail is over [`STDERR_TAIL_MAX_BYTES`].
    #[error("stderrTail has {0} bytes, more than {STDERR_TAIL_MAX_BYTES}")]
    StderrTooLong(usize),
    /// The message is over [`MESSAGE_MAX_BYTES`].
    #[error("message has {0} bytes, more than {MESSAGE_MAX_BYTES}")]
    MessageTooLong(usize),
}

/// True for `vMAJOR.MINOR.PATCH` with an optional `-pre.release` of `[0-9A-Za-z.]`, the only
/// version form the agent templates into commands. Build metadata (`+…`) is refused.
pub fn is_valid_kubernetes_version(version: &str) -> bool {
    if version.len() > MAX_VERSION_BYTES {
        return false;
    }
    let Some(rest) = version.strip_prefix('v') else {
        return false;
    };
    let (core, pre) = match rest.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (rest, None),
    };
    let numbers: Vec<&str> = core.split('.').collect();
    let core_ok = numbers.len() == 3
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.len() <= 5 && n.bytes().all(|b| b.is_ascii_digit()));
    let pre_ok = pre.is_none_or(|p| {
        !p.is_empty()
            && !p.starts_with('.')
            && !p.ends_with('.')
            && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.')
    });
    core_ok && pre_ok
}

fn is_valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_PLAN_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
        && id != "."
        && id != ".."
}

/// The last at most `max` bytes of `text`, cut on a character boundary.
pub fn truncate_tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// Checks a whole plan: structure and every step's action.
pub fn validate_plan(plan: &Plan) -> Result<(), PlanError> {
    validate_plan_structure(plan)?;
    for step in &plan.steps {
        validate_action(&step.action).map_err(|reason| PlanError::BadAction {
            index: step.index,
            kind: step.action.kind(),
            reason,
        })?;
    }
    Ok(())
}

/// Checks id, machine, step count, indexes and timeouts (not the actions).
pub fn validate_plan_structure(plan: &Plan) -> Result<(), PlanError> {
    if !is_valid_id(&plan.id) {
        return Err(PlanError::BadId(
            truncate_tail(&plan.id, MAX_PLAN_ID_BYTES + 8).to_owned(),
        ));
    }
    if plan.machine.namespace.is_empty() || plan.machine.name.is_empty() {
        return Err(PlanError::BadMachine);
    }
    if plan.steps.len() > MAX_STEPS {
        return Err(PlanError::TooManySteps(plan.steps.len()));
    }
    for (position, step) in plan.steps.iter().enumerate() {
        if usize::try_from(step.index).ok() != Some(position) {
            return Err(PlanError::BadIndex {
                position,
                index: step.index,
            });
        }
        if !(MIN_STEP_TIMEOUT_SECONDS..=MAX_STEP_TIMEOUT_SECONDS).contains(&step.timeout_seconds) {
            return Err(PlanError::BadTimeout {
                index: step.index,
                timeout: step.timeout_seconds,
            });
        }
    }
    Ok(())
}

/// Checks one action's fields; the error names the offending field.
pub fn validate_action(action: &StepAction) -> Result<(), String> {
    match action {
        StepAction::Files { files } => {
            let mut seen = BTreeSet::new();
            for file in files {
                check_path(&file.path)?;
                if !seen.insert(file.path.as_str()) {
                    return Err(format!("path {:?} appears twice", file.path));
                }
                if let Some(mode) = &file.permissions {
                    parse_mode(mode).ok_or_else(|| {
                        format!(
                            "{}: permissions {mode:?} is not an octal mode <= 07777",
                            file.path
                        )
                    })?;
                }
            }
            Ok(())
        }
        StepAction::SshKeys { users } => {
            let mut seen = BTreeSet::new();
            for user in users {
                check_user_name(&user.name)?;
                if !seen.insert(user.name.as_str()) {
                    return Err(format!("user {:?} appears twice", user.name));
                }
                if user
                    .authorized_keys
                    .iter()
                    .any(|k| k.expose().contains(['\n', '\r']))
                {
                    return Err(format!("user {:?}: a key contains a line break", user.name));
                }
            }
            Ok(())
        }
        StepAction::Ntp { servers, .. } => {
            for server in servers {
                let ok = !server.is_empty()
                    && server.len() <= 253
                    && server
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b));
                if !ok {
                    return Err(format!(
                        "ntp server {server:?} is not a host name or address"
                    ));
                }
            }
            Ok(())
        }
        StepAction::EtcdImage {
            image_tag,
            image_repository,
        } => {
            let tag_ok = !image_tag.is_empty()
                && image_tag.len() <= MAX_IMAGE_TAG_BYTES
                && !image_tag.starts_with(['.', '-'])
                && image_tag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !tag_ok {
                return Err(format!("imageTag {image_tag:?} is not a valid image tag"));
            }
            if let Some(repo) = image_repository {
                let ok = !repo.is_empty()
                    && repo.len() <= 255
                    && !repo.starts_with('/')
                    && !repo.ends_with('/')
                    && repo
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-/:".contains(&b));
                if !ok {
                    return Err(format!(
                        "imageRepository {repo:?} is not a valid repository"
                    ));
                }
            }
            Ok(())
        }
        StepAction::KubeletArgs { args } => {
            let mut seen = BTreeSet::new();
            for arg in args {
                let name_ok = !arg.name.is_empty()
                    && arg.name.len() <= 128
                    && !arg.name.starts_with('-')
                    && arg
                        .name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
                if !name_ok {
                    return Err(format!(
                        "kubelet flag name {:?} is not [a-z0-9.-]",
                        arg.name
                    ));
                }
                if !seen.insert(arg.name.as_str()) {
                    return Err(format!("kubelet flag {:?} appears twice", arg.name));
                }
                // kubeadm-flags.env is a systemd EnvironmentFile holding one quoted line:
                // whitespace, quotes, backslashes or `$` in a value would change its meaning.
                if arg
                    .value
                    .chars()
                    .any(|c| c.is_whitespace() || "\"'\\$`".contains(c))
                {
                    return Err(format!(
                        "kubelet flag {:?}: value contains whitespace, a quote, a backslash, `$` or a backtick",
                        arg.name
                    ));
                }
            }
            Ok(())
        }
        StepAction::InstallKubeadm { version }
        | StepAction::KubeadmUpgrade { version, .. }
        | StepAction::InstallKubelet { version } => {
            if is_valid_kubernetes_version(version) {
                Ok(())
            } else {
                Err(format!("version {version:?} is not of the form v1.2.3"))
            }
        }
        StepAction::ContainerRuntime { kubernetes_version } => {
            if is_valid_kubernetes_version(kubernetes_version) {
                Ok(())
            } else {
                Err(format!(
                    "kubernetesVersion {kubernetes_version:?} is not of the form v1.2.3"
                ))
            }
        }
        StepAction::WaitNodeReady {
            kubelet_version: Some(version),
        } if !is_valid_kubernetes_version(version) => Err(format!(
            "kubelet version {version:?} is not of the form v1.2.3"
        )),
        StepAction::OsImage { image } => {
            if image.trim().is_empty() {
                Err("image is empty".to_owned())
            } else if image.len() > MAX_OS_IMAGE_BYTES {
                Err(format!(
                    "image is {} bytes, over the limit of {MAX_OS_IMAGE_BYTES}",
                    image.len()
                ))
            } else if image.chars().any(char::is_control) || image.trim() != image {
                Err(format!(
                    "image {:?} has control characters or surrounding whitespace",
                    truncate_tail(image, 64)
                ))
            } else {
                Ok(())
            }
        }
        StepAction::DrainNode { .. }
        | StepAction::WaitNodeReady { .. }
        | StepAction::UncordonNode
        | StepAction::Reboot { .. } => Ok(()),
        StepAction::Unsupported => Err("step kind not supported by this agent".to_owned()),
    }
}

/// Checks a report's bounds (the server runs this on every report).
pub fn validate_report(report: &StepReport) -> Result<(), ReportError> {
    if !is_valid_id(&report.plan_id) {
        return Err(ReportError::BadId(
            truncate_tail(&report.plan_id, MAX_PLAN_ID_BYTES + 8).to_owned(),
        ));
    }
    if let Some(tail) = &report.stderr_tail
        && tail.len() > STDERR_TAIL_MAX_BYTES
    {
        return Err(ReportError::StderrTooLong(tail.len()));
    }
    if let Some(message) = &report.message
        && message.len() > MESSAGE_MAX_BYTES
    {
        return Err(ReportError::MessageTooLong(message.len()));
    }
    if let Some(rollback) = &report.rollback
        && rollback.message.len() > MESSAGE_MAX_BYTES
    {
        return Err(ReportError::MessageTooLong(rollback.message.len()));
    }
    Ok(())
}

/// Parses an octal mode such as `0644` or `644` (at most `07777`).
pub fn parse_mode(text: &str) -> Option<u32> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return None;
    }
    let mode = u32::from_str_radix(digits, 8).ok()?;
    (mode <= 0o7777).then_some(mode)
}

fn check_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("path {path:?} is not absolute"));
    }
    if path.len() > MAX_PATH_BYTES || path.contains('\0') {
        return Err(format!(
            "path {:?} is too long or has a NUL byte",
            truncate_tail(path, 64)
        ));
    }
    if path.ends_with('/') || path == "/" {
        return Err(format!("path {path:?} names a directory, not a file"));
    }
    if path.split('/').any(|part| part == ".." || part == ".") {
        return Err(format!("path {path:?} has a `.` or `..` component"));
    }
    Ok(())
}

fn check_user_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_USER_NAME_BYTES
        && !name.starts_with('-')
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!("user name {name:?} is not a valid login name"))
    }
}

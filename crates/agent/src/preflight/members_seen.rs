//! The etcd members the preflight saw last, kept in the state dir ([`MEMBERS_SEEN`]): when the local member
//! does not answer — it is down, or rejoining after the reboot a step or an undo made — the preflight asks the
//! others for the member list at the client URLs they had then, and still knows which member is this node's
//! by the id the local endpoint told earlier. A hint only: a missing or unreadable file means no other member
//! is known (the local endpoint must answer), and it is rewritten after every listing that differs.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil::{read_journal, write_journal};

/// The file in the state dir.
pub(crate) const MEMBERS_SEEN: &str = "etcd-members.json";

/// What the last listing showed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MembersSeen {
    /// This node's member id, as the local endpoint told it (`/v3/maintenance/status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_id: Option<u64>,
    /// The first client URL of every member listed.
    #[serde(default)]
    pub client_urls: Vec<String>,
}

impl MembersSeen {
    /// The client URLs other than `endpoint` (the local one, asked first).
    pub(crate) fn others(&self, endpoint: &str) -> Vec<String> {
        let local = endpoint.trim_end_matches('/');
        self.client_urls
            .iter()
            .filter(|url| url.trim_end_matches('/') != local)
            .cloned()
            .collect()
    }
}

fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(MEMBERS_SEEN)
}

/// What `state_dir` keeps (nothing known when it is missing or unreadable; the latter is logged).
pub(crate) async fn load(state_dir: &Path) -> MembersSeen {
    let path = path(state_dir);
    let read = tokio::task::spawn_blocking(move || {
        read_journal::<MembersSeen>(
            &path,
            "it is rewritten at the next listing of the etcd members",
        )
    })
    .await;
    match read {
        Ok(Ok(seen)) => seen,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the etcd members seen before are not known");
            MembersSeen::default()
        }
        Err(e) => {
            tracing::warn!(error = %e, "reading the etcd members seen before failed");
            MembersSeen::default()
        }
    }
}

/// Keeps `seen` in `state_dir` when it differs from `before` (a failure is logged: the next look tries again).
pub(crate) async fn save(state_dir: &Path, before: &MembersSeen, seen: MembersSeen) {
    if *before == seen {
        return;
    }
    let path = path(state_dir);
    let written = tokio::task::spawn_blocking(move || write_journal(&path, &seen)).await;
    match written {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot keep the etcd members seen"),
        Err(e) => tracing::warn!(error = %e, "keeping the etcd members seen failed"),
    }
}

//! What a rollback needs to undo one step (issue 28), as the step's record in `state.json` keeps it: the places
//! (files) a step may change as they were before its first effect, and the values a Kubernetes version step's
//! `record:` commands printed, the image an osImage step found. Data only: the drivers take and use these records (`drivers/undo.rs`), the
//! state keeps them.

use serde::{Deserialize, Serialize};

/// A file a step may change.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum Place {
    /// A node path (under `--root`).
    Node(String),
    /// A driver journal in the state dir (its file name), e.g. `managed-files.json`.
    State(String),
}

/// What a place held before the step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub(crate) enum Before {
    /// Nothing: the undo removes what is there, then `createdDirs` (deepest first) when empty.
    #[serde(rename_all = "camelCase")]
    Absent {
        /// The directories above it that did not exist either (node paths, or state-dir names), outermost
        /// first.
        created_dirs: Vec<String>,
    },
    /// A regular file; its content is the snapshot.
    #[serde(rename_all = "camelCase")]
    File {
        /// SHA-256 (hex) of the content.
        sha256: String,
        /// Permission bits.
        mode: u32,
        /// Owner uid.
        uid: u32,
        /// Owner gid.
        gid: u32,
    },
    /// Something else (a symlink, a directory): the file drivers refuse or replace it only by a rename, which
    /// this undo does not reverse; it is left as it is and the undo says so.
    Other,
}

/// One place and what it held.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PlaceBefore {
    /// Where.
    pub place: Place,
    /// What it held.
    pub before: Before,
}

/// What the undo of a step needs, written into the step's record in `state.json` before its first effect.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "family")]
pub(crate) enum UndoRecord {
    /// A step of the file family: the places it may change, as they were.
    #[serde(rename_all = "camelCase")]
    Files {
        /// Each place, as it was before the step.
        places: Vec<PlaceBefore>,
    },
    /// A Kubernetes version step (installKubeadm, installKubelet): what its `record:` commands printed, and
    /// the files its `writeFile` commands replace, as they were.
    #[serde(rename_all = "camelCase")]
    Commands {
        /// `{{record.<name>}}` values, by name.
        values: std::collections::BTreeMap<String, String>,
        /// The files the sequence's `writeFile` commands write, as they were.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        places: Vec<PlaceBefore>,
    },
    /// An osImage step: the image the node booted before it (its undo switches back to it).
    #[serde(rename_all = "camelCase")]
    OsImage {
        /// What `osImage.current` printed before the step.
        previous_image: String,
    },
}

impl UndoRecord {
    /// The places it snapshotted.
    pub(crate) fn places(&self) -> &[PlaceBefore] {
        match self {
            UndoRecord::Files { places } | UndoRecord::Commands { places, .. } => places,
            UndoRecord::OsImage { .. } => &[],
        }
    }
}

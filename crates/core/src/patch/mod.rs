//! Patches that move current towards desired on accepted paths only, and the CAPI way of applying
//! them (for the self-check).
//!
//! The accepted changes of one object form a tree ([`Accepted`]). From it we derive the *target*
//! value of every list or field a patch touches: accepted items as desired, everything else as
//! current. Keyed lists are merged item by item (a rejected file keeps its current content while an
//! accepted one changes; an accepted new file is placed after its desired predecessor). JSON Patch
//! addresses keyed items by their current index; merge patch replaces touched lists whole.

pub mod capi;
mod json;
mod merge;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::diff::{self, Change, ChangeKind};
use crate::objects::Scope;
use crate::path::{Path, Seg};

/// The patch formats CAPI understands (`patchType` on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PatchType {
    /// RFC 6902, `"JSONPatch"`.
    #[serde(rename = "JSONPatch")]
    JsonPatch,
    /// RFC 7386, `"JSONMergePatch"`.
    #[serde(rename = "JSONMergePatch")]
    JsonMergePatch,
}

impl PatchType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            PatchType::JsonPatch => "JSONPatch",
            PatchType::JsonMergePatch => "JSONMergePatch",
        }
    }
}

impl fmt::Display for PatchType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A patch for one object: raw JSON bytes (the HTTP layer base64-encodes them).
#[derive(Clone, PartialEq, Eq)]
pub struct Patch {
    /// Its format.
    pub patch_type: PatchType,
    /// The RFC 6902 array or RFC 7386 object, as JSON.
    pub bytes: Vec<u8>,
}

impl fmt::Debug for Patch {
    // The bytes carry desired file contents: show only their size.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Patch({}, {} bytes)", self.patch_type, self.bytes.len())
    }
}

/// The accepted changes of one object as a tree of path segments below `spec`.
#[derive(Clone, Debug, Default)]
pub struct Accepted {
    here: bool,
    reorder: Option<&'static str>,
    children: BTreeMap<Seg, Accepted>,
}

impl Accepted {
    /// Records an accepted change.
    pub fn insert(&mut self, change: &Change) {
        let mut node = self;
        for seg in change.path.below_spec() {
            node = node.children.entry(seg.clone()).or_default();
        }
        match change.kind {
            ChangeKind::Reordered => {
                if let Some(Seg::Field(name)) = change.path.last() {
                    node.reorder = diff::keyed_list_field(name);
                }
            }
            ChangeKind::Added | ChangeKind::Removed | ChangeKind::Changed => node.here = true,
        }
    }

    /// Whether nothing is accepted.
    pub fn is_empty(&self) -> bool {
        !self.here && self.reorder.is_none() && self.children.is_empty()
    }

    fn untouched(&self) -> bool {
        self.is_empty()
    }

    /// The key member of the keyed list at this node, when the changes address it by key.
    fn list_key(&self) -> Option<&str> {
        self.reorder.or_else(|| {
            self.children.keys().find_map(|s| match s {
                Seg::Key { field, .. } => Some(field.as_str()),
                _ => None,
            })
        })
    }

    fn keyed_children(&self) -> HashMap<&str, &Accepted> {
        self.children
            .iter()
            .filter_map(|(s, t)| match s {
                Seg::Key { value, .. } => Some((value.as_str(), t)),
                _ => None,
            })
            .collect()
    }
}

static EMPTY: Accepted = Accepted {
    here: false,
    reorder: None,
    children: BTreeMap::new(),
};

/// One item of a merged keyed list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    /// In both lists: the item merged from current index `cur` and desired index `des`.
    Common { cur: usize, des: usize },
    /// An accepted addition: desired item `des`.
    Added { des: usize },
    /// A removal that is not accepted: current item `cur` stays.
    Kept { cur: usize },
}

/// The keys of a keyed list in both versions, and where each key sits.
struct KeyedLists<'v> {
    cur_keys: Vec<&'v str>,
    des_keys: Vec<&'v str>,
    cur_at: HashMap<&'v str, usize>,
    des_at: HashMap<&'v str, usize>,
}

impl<'v> KeyedLists<'v> {
    fn new(cur: &'v [Value], des: &'v [Value], key: &str) -> Option<KeyedLists<'v>> {
        let cur_keys = diff::list_keys(cur, key)?;
        let des_keys = diff::list_keys(des, key)?;
        let cur_at = cur_keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
        let des_at = des_keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
        Some(KeyedLists {
            cur_keys,
            des_keys,
            cur_at,
            des_at,
        })
    }

    /// The merged list as entries: current order unless the reorder is accepted (then desired order);
    /// accepted additions right after their nearest desired predecessor that the merged list has,
    /// kept removals likewise after their nearest current predecessor. Linear in the list sizes.
    fn sequence(&self, node: &Accepted) -> Vec<Entry> {
        let kids = node.keyed_children();
        let accepted = |k: &str| kids.get(k).is_some_and(|t| t.here);
        let reorder = node.reorder.is_some();
        // The order we follow, and the version whose own items we slot in.
        let (base, other, in_base) = if reorder {
            (&self.des_keys, &self.cur_keys, &self.des_at)
        } else {
            (&self.cur_keys, &self.des_keys, &self.cur_at)
        };
        // Items only `other` has, grouped by the last item before them that both versions have
        // (`None`: at the start). Items between them only `other` has, so the nearest predecessor
        // in the merged list is either that common item or an earlier item of the same group.
        let mut groups: HashMap<Option<&str>, Vec<Entry>> = HashMap::new();
        let mut anchor: Option<&str> = None;
        for (i, k) in other.iter().enumerate() {
            if in_base.contains_key(k) {
                anchor = Some(k);
                continue;
            }
            let entry = if reorder {
                (!accepted(k)).then_some(Entry::Kept { cur: i })
            } else {
                accepted(k).then_some(Entry::Added { des: i })
            };
            if let Some(e) = entry {
                groups.entry(anchor).or_default().push(e);
            }
        }
        let mut out = Vec::with_capacity(self.cur_keys.len().max(self.des_keys.len()));
        out.extend(groups.remove(&None).unwrap_or_default());
        for (i, k) in base.iter().enumerate() {
            match (self.cur_at.get(k), self.des_at.get(k)) {
                (Some(&cur), Some(&des)) => {
                    out.push(Entry::Common { cur, des });
                    out.extend(groups.remove(&Some(*k)).unwrap_or_default());
                }
                _ if reorder => out.extend(accepted(k).then_some(Entry::Added { des: i })),
                _ => out.extend((!accepted(k)).then_some(Entry::Kept { cur: i })),
            }
        }
        out
    }
}

/// The value at a node after the accepted changes: desired where accepted, current elsewhere.
fn merged(cur: Option<&Value>, des: Option<&Value>, node: &Accepted) -> Option<Value> {
    if node.here {
        return des.cloned();
    }
    let c = cur?;
    if node.untouched() {
        return Some(c.clone());
    }
    match (c, des) {
        (Value::Object(cm), Some(Value::Object(dm))) => {
            let mut out = serde_json::Map::new();
            for (k, v) in cm {
                let kid = node.children.get(&Seg::Field(k.clone()));
                let value = match kid {
                    Some(t) => merged(Some(v), dm.get(k), t),
                    None => Some(v.clone()),
                };
                if let Some(value) = value {
                    out.insert(k.clone(), value);
                }
            }
            for (seg, t) in &node.children {
                if let Seg::Field(k) = seg
                    && !cm.contains_key(k)
                    && let Some(value) = merged(None, dm.get(k), t)
                {
                    out.insert(k.clone(), value);
                }
            }
            Some(Value::Object(out))
        }
        (Value::Array(ca), Some(Value::Array(da))) => Some(Value::Array(merged_list(ca, da, node))),
        _ => Some(c.clone()),
    }
}

fn merged_list(ca: &[Value], da: &[Value], node: &Accepted) -> Vec<Value> {
    if let Some(lists) = node.list_key().and_then(|key| KeyedLists::new(ca, da, key)) {
        let kids = node.keyed_children();
        return lists
            .sequence(node)
            .into_iter()
            .filter_map(|e| match e {
                Entry::Common { cur, des } => {
                    let t = kids.get(lists.cur_keys[cur]).copied().unwrap_or(&EMPTY);
                    merged(Some(&ca[cur]), Some(&da[des]), t)
                }
                Entry::Added { des } => Some(da[des].clone()),
                Entry::Kept { cur } => Some(ca[cur].clone()),
            })
            .collect();
    }
    (0..ca.len().max(da.len()))
        .filter_map(|i| match node.children.get(&Seg::Index(i)) {
            Some(t) => merged(ca.get(i), da.get(i), t),
            None => ca.get(i).cloned(),
        })
        .collect()
}

/// The compared part of one object in both versions, and the whole current object.
#[derive(Clone, Copy, Debug)]
pub struct Sides<'a> {
    /// Which part CAPI compares.
    pub scope: Scope,
    /// The whole current object (the patch applies to it).
    pub current_object: &'a Value,
    /// Its `spec` / `spec.template.spec`.
    pub current: Option<&'a Value>,
    /// The desired `spec` / `spec.template.spec`.
    pub desired: Option<&'a Value>,
}

/// The patch for one object, or `None` when nothing is accepted. A merge patch that cannot express
/// the accepted changes (merge patch `null` means delete) falls back to JSON Patch, with a note.
pub fn build(
    sides: &Sides,
    accepted: &Accepted,
    patch_type: PatchType,
) -> (Option<Patch>, Option<String>) {
    if accepted.is_empty() {
        return (None, None);
    }
    match patch_type {
        PatchType::JsonPatch => (json::build(sides, accepted), None),
        PatchType::JsonMergePatch => match merge::build(sides, accepted) {
            Ok(patch) => (patch, None),
            Err(at) => (
                json::build(sides, accepted),
                Some(format!(
                    "JSONMergePatch cannot set {} to a value containing null; sent JSONPatch",
                    at.display_in(sides.scope)
                )),
            ),
        },
    }
}

/// A path a merge patch cannot express.
type Unrepresentable = Path;

#[cfg(test)]
mod tests;

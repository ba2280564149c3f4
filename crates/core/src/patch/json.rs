//! RFC 6902 JSON Patch from the accepted-change tree. Paths are JSON Pointers into the whole
//! object (`/spec/...` or `/spec/template/spec/...`); keyed list items by their current index.
//! Only `add` creates; `replace` and `remove` only touch what current has.

use serde::Serialize;
use serde_json::Value;
use std::borrow::Cow;

use super::{Accepted, EMPTY, Entry, KeyedLists, Patch, PatchType, Sides, merged_list};
use crate::path::{Seg, push_pointer_token};

#[derive(Serialize)]
struct Op<'a> {
    op: &'static str,
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<Cow<'a, Value>>,
}

fn add<'a>(out: &mut Vec<Op<'a>>, path: &str, value: Cow<'a, Value>) {
    out.push(Op {
        op: "add",
        path: path.to_owned(),
        value: Some(value),
    });
}
fn replace<'a>(out: &mut Vec<Op<'a>>, path: &str, value: Cow<'a, Value>) {
    out.push(Op {
        op: "replace",
        path: path.to_owned(),
        value: Some(value),
    });
}
fn remove(out: &mut Vec<Op<'_>>, path: &str) {
    out.push(Op {
        op: "remove",
        path: path.to_owned(),
        value: None,
    });
}

pub(super) fn build(sides: &Sides, accepted: &Accepted) -> Option<Patch> {
    let mut out = Vec::new();
    let mut ptr = sides.scope.pointer().to_owned();
    match sides.current {
        Some(cur) => ops(&mut ptr, cur, sides.desired, accepted, &mut out),
        None => {
            if let (true, Some(des)) = (accepted.here, sides.desired) {
                add_region(sides, des, &mut out);
            }
        }
    }
    if out.is_empty() {
        return None;
    }
    let bytes = serde_json::to_vec(&out).ok()?;
    Some(Patch {
        patch_type: PatchType::JsonPatch,
        bytes,
    })
}

/// Adds a compared part the current object lacks, creating missing parents (`spec`, `spec.template`).
fn add_region<'a>(sides: &Sides<'a>, des: &'a Value, out: &mut Vec<Op<'a>>) {
    let names = sides.scope.segments();
    let mut node = sides.current_object;
    let mut ptr = String::new();
    for (depth, name) in names.iter().enumerate() {
        push_pointer_token(&mut ptr, name);
        let last = depth + 1 == names.len();
        match node.get(name) {
            Some(child) if child.is_object() && !last => node = child,
            found => {
                let mut value = des.clone();
                for wrap in names[depth + 1..].iter().rev() {
                    value = Value::Object([(wrap.to_string(), value)].into_iter().collect());
                }
                let value = Cow::Owned(value);
                match found {
                    Some(_) => replace(out, &ptr, value),
                    None => add(out, &ptr, value),
                }
                return;
            }
        }
    }
}

/// Ops for the node at `ptr`, which exists in current with value `cur`.
fn ops<'a>(
    ptr: &mut String,
    cur: &'a Value,
    des: Option<&'a Value>,
    node: &Accepted,
    out: &mut Vec<Op<'a>>,
) {
    if node.here {
        match des {
            Some(d) => replace(out, ptr, Cow::Borrowed(d)),
            None => remove(out, ptr),
        }
        return;
    }
    match (cur, des) {
        (Value::Object(cm), Some(Value::Object(dm))) => {
            for (seg, kid) in &node.children {
                let Seg::Field(k) = seg else { continue };
                let len = ptr.len();
                push_pointer_token(ptr, k);
                match (cm.get(k), dm.get(k)) {
                    (Some(cv), d) => ops(ptr, cv, d, kid, out),
                    (None, Some(d)) if kid.here => add(out, ptr, Cow::Borrowed(d)),
                    (None, _) => {}
                }
                ptr.truncate(len);
            }
        }
        (Value::Array(ca), Some(Value::Array(da))) => list_ops(ptr, ca, da, node, out),
        _ => {}
    }
}

fn at_index(ptr: &mut String, i: usize) -> usize {
    let len = ptr.len();
    push_pointer_token(ptr, &i.to_string());
    len
}

fn list_ops<'a>(
    ptr: &mut String,
    ca: &'a [Value],
    da: &'a [Value],
    node: &Accepted,
    out: &mut Vec<Op<'a>>,
) {
    if let Some(lists) = node.list_key().and_then(|key| KeyedLists::new(ca, da, key)) {
        if node.reorder.is_some() {
            // Common items move: express the merged list whole.
            return replace(
                out,
                ptr,
                Cow::Owned(Value::Array(merged_list(ca, da, node))),
            );
        }
        let kids = node.keyed_children();
        let sequence = lists.sequence(node);
        // 1. Changes inside items both versions have, at their current index (nothing has moved yet).
        for e in &sequence {
            if let Entry::Common { cur, des } = *e {
                let kid = kids.get(lists.cur_keys[cur]).copied().unwrap_or(&EMPTY);
                if !kid.untouched() {
                    let len = at_index(ptr, cur);
                    ops(ptr, &ca[cur], Some(&da[des]), kid, out);
                    ptr.truncate(len);
                }
            }
        }
        // 2. Accepted removals, highest index first so lower indices stay valid.
        let mut removed: Vec<usize> = (0..ca.len())
            .filter(|&i| {
                !lists.des_at.contains_key(lists.cur_keys[i])
                    && kids.get(lists.cur_keys[i]).is_some_and(|t| t.here)
            })
            .collect();
        removed.sort_unstable_by(|a, b| b.cmp(a));
        for i in removed {
            let len = at_index(ptr, i);
            remove(out, ptr);
            ptr.truncate(len);
        }
        // 3. Accepted additions at their merged position, lowest first: the list then holds exactly
        //    the merged items before that position.
        for (pos, e) in sequence.iter().enumerate() {
            if let Entry::Added { des } = *e {
                let len = at_index(ptr, pos);
                add(out, ptr, Cow::Borrowed(&da[des]));
                ptr.truncate(len);
            }
        }
        return;
    }
    let mut removals = Vec::new();
    let mut additions = Vec::new();
    for (seg, kid) in &node.children {
        let Seg::Index(i) = *seg else { continue };
        match (ca.get(i), da.get(i)) {
            (Some(c), Some(d)) => {
                let len = at_index(ptr, i);
                ops(ptr, c, Some(d), kid, out);
                ptr.truncate(len);
            }
            (Some(_), None) if kid.here => removals.push(i),
            (None, Some(_)) if kid.here => additions.push(i),
            _ => {}
        }
    }
    removals.sort_unstable_by(|a, b| b.cmp(a));
    for i in removals {
        let len = at_index(ptr, i);
        remove(out, ptr);
        ptr.truncate(len);
    }
    additions.sort_unstable();
    for i in additions {
        let len = at_index(ptr, i);
        add(out, ptr, Cow::Borrowed(&da[i]));
        ptr.truncate(len);
    }
}

//! The self-check: apply our own patch the way CAPI does and confirm CAPI will read exactly what we
//! mean — accepted paths equal desired, rejected paths equal current, and CAPI's whole-spec compare
//! agrees with our outcome. Messages name paths, never values.

use serde_json::Value;
use std::borrow::Cow;

use super::judge::{ChangeVerdict, Judged, MACHINE_FIELDS_IGNORED_BY_CAPI};
use crate::diff::{self, Change, ChangeKind};
use crate::objects::{ObjectRole, Scope};
use crate::patch::{Patch, Sides, capi};
use crate::path::{Resolver, Seg};
use std::collections::HashSet;

/// What CAPI compares of a spec: for a Machine (a typed Go struct) without the fields it drops and
/// without zero values; for everything else the JSON as is.
pub(crate) fn compared(role: ObjectRole, spec: Option<&Value>) -> Option<Cow<'_, Value>> {
    if role != ObjectRole::Machine {
        return spec.map(Cow::Borrowed);
    }
    let mut spec = spec?.clone();
    for fields in MACHINE_FIELDS_IGNORED_BY_CAPI {
        let (last, parents) = fields.split_last()?;
        let mut node = Some(&mut spec);
        for p in parents {
            node = node.and_then(|n| n.get_mut(*p));
        }
        if let Some(Value::Object(map)) = node {
            map.remove(*last);
        }
    }
    strip_typed_empty(&mut spec);
    (!diff::typed_empty(&spec)).then_some(Cow::Owned(spec))
}

fn strip_typed_empty(v: &mut Value) {
    if let Value::Object(map) = v {
        map.values_mut().for_each(strip_typed_empty);
        map.retain(|_, v| !diff::typed_empty(v));
    }
}

fn same(a: Option<&Value>, b: Option<&Value>, typed: bool) -> bool {
    if typed {
        fn norm(v: Option<&Value>) -> Option<&Value> {
            v.filter(|v| !diff::typed_empty(v))
        }
        return norm(a) == norm(b);
    }
    a == b
}

/// The keys of `list`, in order, that both versions of a reordered list contain.
fn common_order<'v>(
    list: Option<&'v Value>,
    key: &str,
    both: &HashSet<&str>,
) -> Option<Vec<&'v str>> {
    let items = list?.as_array()?;
    let keys = diff::list_keys(items, key)?;
    Some(keys.into_iter().filter(|k| both.contains(k)).collect())
}

/// Checks one object; returns the problems found (empty when CAPI reads the patch as intended).
pub(crate) fn check<'a>(
    sides: &Sides,
    role: ObjectRole,
    kind: &str,
    changes: &[Change<'a>],
    judged: &[Judged],
    patch: Option<&Patch>,
) -> Vec<String> {
    let scope: Scope = sides.scope;
    let after: Option<Cow<Value>> = match patch {
        Some(p) => match capi::apply(scope, sides.current_object, p) {
            Ok(v) => v.map(Cow::Owned),
            Err(e) => return vec![format!("{kind}: {e}")],
        },
        None => sides.current.map(Cow::Borrowed),
    };
    let after = after.as_deref();
    let typed = role == ObjectRole::Machine;
    let mut problems = Vec::new();
    let mut resolver = Resolver::new();
    for (c, j) in changes.iter().zip(judged) {
        let (want, side) = match j.verdict {
            ChangeVerdict::Ignored => continue,
            ChangeVerdict::Action | ChangeVerdict::Accept => (sides.desired, "desired"),
            ChangeVerdict::Reject => (sides.current, "current"),
        };
        let path = || c.path.display_in(scope);
        if c.kind == ChangeKind::Reordered {
            let Some(Seg::Field(name)) = c.path.last() else {
                continue;
            };
            let Some(key) = diff::keyed_list_field(name) else {
                continue;
            };
            let keys = |v: Option<&'a Value>| {
                v.and_then(Value::as_array)
                    .and_then(|a| diff::list_keys(a, key))
            };
            let (Some(old), Some(new)) = (keys(c.old), keys(c.new)) else {
                continue;
            };
            let new: HashSet<&str> = new.into_iter().collect();
            let both: HashSet<&str> = old.into_iter().filter(|k| new.contains(k)).collect();
            let got = common_order(resolver.resolve(after, &c.path), key, &both);
            let expected = common_order(resolver.resolve(want, &c.path), key, &both);
            if got.is_none() || got != expected {
                problems.push(format!(
                    "{kind} {}: order after our patch is not the {side} order",
                    path()
                ));
            }
        } else if !same(
            resolver.resolve(after, &c.path),
            resolver.resolve(want, &c.path),
            typed,
        ) {
            problems.push(format!(
                "{kind} {}: after our patch it differs from {side}",
                path()
            ));
        }
    }
    let all_accepted = judged.iter().all(|j| j.verdict != ChangeVerdict::Reject);
    let equal = compared(role, after) == compared(role, sides.desired);
    if all_accepted && !equal {
        problems.push(format!(
            "{kind}: CAPI would still see a difference after our patch"
        ));
    }
    if !all_accepted && equal {
        problems.push(format!(
            "{kind}: CAPI would see no difference although changes are rejected"
        ));
    }
    problems
}

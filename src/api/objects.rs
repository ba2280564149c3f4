//! The Kubernetes objects inside hook requests, kept as JSON text when the body is decoded and parsed only as
//! far as a hook needs them.
//!
//! A CanUpdate request carries every object twice, `current` and `desired`, and most of each pair is the
//! same text (CAPI marshals both with the same encoder). Parsing both sides into `serde_json::Value` trees
//! was most of a call's cost, so a pair is parsed once when its two texts are equal, and inside the compared
//! region (`spec`, or `spec.template.spec`) members whose texts are equal are left out of both sides: they
//! cannot differ, so the diff, the patch and its self-check see exactly the same changes. Text equality is
//! sufficient, never necessary: members whose texts differ are parsed and compared as values as before.
//! The members left out keep their text, so the whole desired object can be put back together for the
//! verdict ([`Pair::into_desired`]) by parsing only them, not the whole object a second time.

use std::collections::BTreeMap;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::error::DecodeError;

/// A Kubernetes object as CAPI put it in the request: its JSON text, checked to be an object.
pub type Object = Box<RawValue>;

/// Whether the text is a JSON object.
fn is_object(raw: &RawValue) -> bool {
    raw.get().starts_with('{')
}

fn json_error(path: &'static str, source: serde_json::Error) -> DecodeError {
    DecodeError::Object { path, source }
}

/// Parses a whole object.
pub fn parse(raw: &RawValue, path: &'static str) -> Result<Value, DecodeError> {
    serde_json::from_str(raw.get()).map_err(|err| json_error(path, err))
}

/// One object of a CanUpdate request, both sides parsed.
#[derive(Debug, Clone, PartialEq)]
pub enum Pair {
    /// The two texts were equal: one value stands for both sides.
    Same(Value),
    /// The two sides, with the members of the compared region that were equal text left out of both.
    Different {
        /// The current object.
        current: Value,
        /// The desired object.
        desired: Value,
        /// The members of the compared region left out of both sides: name and text.
        unchanged: Vec<(String, String)>,
    },
    /// Only the current side has this object.
    OnlyCurrent(Value),
    /// Only the desired side has this object.
    OnlyDesired(Value),
    /// Neither side has it.
    Neither,
}

impl Pair {
    /// Parses both sides of an object; `region` names the members leading to the compared part.
    pub fn parse(
        current: Option<&RawValue>,
        desired: Option<&RawValue>,
        region: &[&str],
        path: &'static str,
    ) -> Result<Pair, DecodeError> {
        Ok(match (current, desired) {
            (Some(current), Some(desired)) if current.get() == desired.get() => {
                Pair::Same(parse(current, path)?)
            }
            (Some(current), Some(desired)) => {
                let mut unchanged = Vec::new();
                let (current, desired) = pruned(current, desired, region, path, &mut unchanged)?;
                Pair::Different {
                    current,
                    desired,
                    unchanged,
                }
            }
            (Some(current), None) => Pair::OnlyCurrent(parse(current, path)?),
            (None, Some(desired)) => Pair::OnlyDesired(parse(desired, path)?),
            (None, None) => Pair::Neither,
        })
    }

    /// The current side.
    pub fn current(&self) -> Option<&Value> {
        match self {
            Pair::Same(value)
            | Pair::Different { current: value, .. }
            | Pair::OnlyCurrent(value) => Some(value),
            Pair::OnlyDesired(_) | Pair::Neither => None,
        }
    }

    /// The desired side.
    pub fn desired(&self) -> Option<&Value> {
        match self {
            Pair::Same(value)
            | Pair::Different { desired: value, .. }
            | Pair::OnlyDesired(value) => Some(value),
            Pair::OnlyCurrent(_) | Pair::Neither => None,
        }
    }

    /// The whole desired object, taken out of the pair: the members of the compared region left out of it
    /// (at `region`, as given to [`Pair::parse`]) parsed and put back.
    pub fn into_desired(
        self,
        region: &[&str],
        path: &'static str,
    ) -> Result<Option<Value>, DecodeError> {
        Ok(match self {
            Pair::Same(value) | Pair::OnlyDesired(value) => Some(value),
            Pair::Different {
                mut desired,
                unchanged,
                ..
            } => {
                if !unchanged.is_empty() {
                    // Members are only left out of a region that is an object on both sides.
                    let at = region
                        .iter()
                        .try_fold(&mut desired, |value, name| value.get_mut(*name));
                    if let Some(Value::Object(map)) = at {
                        for (name, text) in unchanged {
                            let value =
                                serde_json::from_str(&text).map_err(|err| json_error(path, err))?;
                            map.insert(name, value);
                        }
                    }
                }
                Some(desired)
            }
            Pair::OnlyCurrent(_) | Pair::Neither => None,
        })
    }
}

type Members<'a> = BTreeMap<String, &'a RawValue>;

fn members<'a>(raw: &'a RawValue, path: &'static str) -> Result<Members<'a>, DecodeError> {
    serde_json::from_str(raw.get()).map_err(|err| json_error(path, err))
}

/// Both sides parsed; below `region` (or at it, when `region` is empty) members with equal text on both
/// sides are dropped from both, and kept in `unchanged` as name and text.
fn pruned(
    current: &RawValue,
    desired: &RawValue,
    region: &[&str],
    path: &'static str,
    unchanged: &mut Vec<(String, String)>,
) -> Result<(Value, Value), DecodeError> {
    if !is_object(current) || !is_object(desired) {
        return Ok((parse(current, path)?, parse(desired, path)?));
    }
    let (current, desired) = (members(current, path)?, members(desired, path)?);
    let mut out = (Map::new(), Map::new());
    for (name, theirs) in &current {
        let ours = desired.get(name);
        match (region.split_first(), ours) {
            // At the region: a member both sides spell alike cannot be a change.
            (None, Some(ours)) if ours.get() == theirs.get() => {
                unchanged.push((name.clone(), ours.get().to_owned()));
            }
            (Some((next, rest)), Some(ours)) if name == next => {
                let (c, d) = pruned(theirs, ours, rest, path, unchanged)?;
                out.0.insert(name.clone(), c);
                out.1.insert(name.clone(), d);
            }
            _ => {
                out.0.insert(name.clone(), parse(theirs, path)?);
                if let Some(ours) = ours {
                    out.1.insert(name.clone(), parse(ours, path)?);
                }
            }
        }
    }
    for (name, ours) in &desired {
        if !current.contains_key(name) {
            out.1.insert(name.clone(), parse(ours, path)?);
        }
    }
    Ok((Value::Object(out.0), Value::Object(out.1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(value: &Value) -> Box<RawValue> {
        RawValue::from_string(value.to_string()).expect("valid JSON")
    }

    #[test]
    fn equal_texts_parse_once_and_equal_region_members_drop_from_both_sides() {
        let current = json!({"kind": "KubeadmConfig", "metadata": {"name": "a"},
            "spec": {"files": [{"path": "/a"}], "ntp": {"servers": ["a"]}, "users": []}});
        let mut desired = current.clone();
        assert_eq!(
            Pair::parse(Some(&raw(&current)), Some(&raw(&desired)), &["spec"], "x")
                .expect("parses"),
            Pair::Same(current.clone())
        );
        desired["spec"]["ntp"]["servers"] = json!(["b"]);
        desired["spec"]["diskSetup"] = json!({});
        desired["metadata"]["labels"] = json!({"l": "v"});
        let pair = Pair::parse(Some(&raw(&current)), Some(&raw(&desired)), &["spec"], "x")
            .expect("parses");
        // Outside the region everything is kept; inside, only what differs or exists on one side.
        assert_eq!(
            pair.current(),
            Some(
                &json!({"kind": "KubeadmConfig", "metadata": {"name": "a"}, "spec": {"ntp": {"servers": ["a"]}}})
            )
        );
        assert_eq!(
            pair.desired(),
            Some(
                &json!({"kind": "KubeadmConfig", "metadata": {"name": "a", "labels": {"l": "v"}},
                "spec": {"ntp": {"servers": ["b"]}, "diskSetup": {}}})
            )
        );
    }

    #[test]
    fn template_region_is_followed_and_removed_members_stay() {
        let current = json!({"spec": {"replicas": 1, "template": {"metadata": {}, "spec": {"version": "v1", "x": 1}}}});
        let desired =
            json!({"spec": {"replicas": 2, "template": {"metadata": {}, "spec": {"x": 1}}}});
        let pair = Pair::parse(
            Some(&raw(&current)),
            Some(&raw(&desired)),
            &["spec", "template", "spec"],
            "x",
        )
        .expect("parses");
        assert_eq!(
            pair.current(),
            Some(
                &json!({"spec": {"replicas": 1, "template": {"metadata": {}, "spec": {"version": "v1"}}}})
            )
        );
        assert_eq!(
            pair.desired(),
            Some(&json!({"spec": {"replicas": 2, "template": {"metadata": {}, "spec": {}}}}))
        );
    }

    #[test]
    fn the_whole_desired_object_comes_back_as_its_text_parses() {
        let current = json!({"kind": "KubeadmConfigTemplate", "metadata": {"name": "a"},
            "spec": {"template": {"spec": {"files": [{"path": "/a", "content": "x\ny"}],
                "ntp": {"servers": ["a"]}, "users": [], "format": "cloud-config"}}}});
        let mut desired = current.clone();
        let region = &["spec", "template", "spec"];
        desired["spec"]["template"]["spec"]["ntp"]["servers"] = json!(["b"]);
        desired["spec"]["template"]["spec"]["diskSetup"] = json!({"partitions": []});
        desired["spec"]["template"]["spec"]
            .as_object_mut()
            .expect("object")
            .remove("users");
        desired["metadata"]["labels"] = json!({"l": "v"});
        let cases = [
            (Some(raw(&current)), Some(raw(&desired))),
            (Some(raw(&current)), Some(raw(&current))),
            (None, Some(raw(&desired))),
            (Some(raw(&current)), None),
            // The region is not an object on one side: nothing is left out.
            (Some(raw(&json!({"spec": 1}))), Some(raw(&desired))),
        ];
        for (current, desired) in cases {
            let pair =
                Pair::parse(current.as_deref(), desired.as_deref(), region, "x").expect("parses");
            let whole = desired.map(|raw| parse(&raw, "x").expect("parses"));
            assert_eq!(pair.into_desired(region, "x").expect("parses"), whole);
        }
    }

    #[test]
    fn texts_that_differ_but_mean_the_same_are_still_compared_as_values() {
        let current =
            RawValue::from_string(r#"{"spec":{"a":"\u0041","b":1}}"#.into()).expect("json");
        let desired = RawValue::from_string(r#"{"spec":{"a":"A","b":1}}"#.into()).expect("json");
        let pair = Pair::parse(Some(&current), Some(&desired), &["spec"], "x").expect("parses");
        assert_eq!(pair.current(), pair.desired());
        assert_eq!(pair.current(), Some(&json!({"spec": {"a": "A"}})));
        let one = Pair::parse(None, Some(&desired), &["spec"], "x").expect("parses");
        assert_eq!((one.current(), one.desired().is_some()), (None, true));
    }
}

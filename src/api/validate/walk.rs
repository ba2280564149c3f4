//! The interpreter of the shapes in `rules`: a serde seed that walks an object's JSON (text or an already
//! parsed `Value`, through the same code) along its shape without building anything, and stops at the first
//! member whose type or form does not fit, remembering its path. Members the shapes do not name are skipped
//! unparsed (`IgnoredAny`), so validating costs a scan of the text, not a parse.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::Invalid;
use super::names;

/// What a value must be.
#[derive(Debug)]
pub(super) enum Shape {
    /// Anything (not looked at).
    Any,
    /// `true` or `false`.
    Bool,
    /// A string of this form.
    Text(Text),
    /// A list whose every item has this shape.
    List(&'static Shape),
    /// An object; the listed members have their shapes, others are anything.
    Object(&'static [Member]),
    /// An object whose every value has the first shape, except the listed keys, which have their own.
    Map(&'static Shape, &'static [(&'static str, Shape)]),
}

/// The form of a string.
#[derive(Debug)]
pub(super) enum Text {
    /// Any string.
    Any,
    /// A Kubernetes object name: a DNS-1123 subdomain.
    Name,
    /// A Kubernetes object name, or empty (Go's zero value: unset).
    NameOrEmpty,
    /// A namespace: a DNS-1123 label.
    Label,
    /// One of these words, or empty (unset).
    OneOf(&'static [&'static str]),
}

/// A member of an object shape.
#[derive(Debug)]
pub(super) struct Member {
    pub name: &'static str,
    pub shape: Shape,
    /// Whether the member must be present and not `null`.
    pub required: bool,
    /// Where the member's string is kept for the object's [`super::Head`].
    pub capture: Option<Slot>,
}

/// The head fields a walk keeps.
#[derive(Debug, Clone, Copy)]
pub(super) enum Slot {
    ApiVersion,
    Kind,
    Name,
    Namespace,
}

impl Shape {
    /// What the shape expects, for messages.
    pub(super) fn describe(&self) -> String {
        match self {
            Shape::Any => "anything".into(),
            Shape::Bool => "a boolean".into(),
            Shape::Text(text) => text.describe(),
            Shape::List(Shape::Text(Text::Any)) => "a list of strings".into(),
            Shape::List(Shape::Object(_)) => "a list of objects".into(),
            Shape::List(_) => "a list".into(),
            Shape::Object(_) => "an object".into(),
            Shape::Map(Shape::Text(Text::Any), _) => "an object of strings".into(),
            Shape::Map(..) => "an object".into(),
        }
    }
}

impl Text {
    fn describe(&self) -> String {
        match self {
            Text::Any => "a string".into(),
            Text::Name => names::NAME_RULE.into(),
            Text::NameOrEmpty => format!("{} or empty", names::NAME_RULE),
            Text::Label => names::LABEL_RULE.into(),
            Text::OneOf(words) => {
                let words: Vec<String> = words.iter().map(|w| format!("{w:?}")).collect();
                format!("one of {}", words.join(", "))
            }
        }
    }

    fn fits(&self, text: &str) -> bool {
        match self {
            Text::Any => true,
            Text::Name => names::is_subdomain(text),
            Text::NameOrEmpty => text.is_empty() || names::is_subdomain(text),
            Text::Label => names::is_label(text),
            Text::OneOf(words) => text.is_empty() || words.contains(&text),
        }
    }
}

/// One step of a path, linked to its parent on the stack: formatted only when something is wrong.
pub(super) struct Node<'a> {
    parent: Option<&'a Node<'a>>,
    step: Step<'a>,
}

enum Step<'a> {
    Root(&'a str),
    Field(&'a str),
    Index(usize),
    Key(&'a str),
}

/// Longest map key shown in a path.
const MAX_SHOWN_KEY_CHARS: usize = 100;

impl<'a> Node<'a> {
    pub(super) fn root(at: &'a str) -> Self {
        Node {
            parent: None,
            step: Step::Root(at),
        }
    }

    pub(super) fn field(&'a self, name: &'a str) -> Node<'a> {
        Node {
            parent: Some(self),
            step: Step::Field(name),
        }
    }

    fn index(&'a self, index: usize) -> Node<'a> {
        Node {
            parent: Some(self),
            step: Step::Index(index),
        }
    }

    fn key(&'a self, key: &'a str) -> Node<'a> {
        Node {
            parent: Some(self),
            step: Step::Key(key),
        }
    }
}

impl fmt::Display for Node<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(parent) = self.parent {
            parent.fmt(f)?;
        }
        match self.step {
            Step::Root(at) => f.write_str(at),
            Step::Field(name) => write!(f, ".{name}"),
            Step::Index(index) => write!(f, "[{index}]"),
            Step::Key(key) => {
                let shown: String = key.chars().take(MAX_SHOWN_KEY_CHARS).collect();
                write!(f, "[{shown}]")
            }
        }
    }
}

/// What one validation keeps while it walks: the first problem and the head strings.
#[derive(Debug, Default)]
pub(super) struct State {
    pub problem: Option<Invalid>,
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub name: Option<String>,
    pub namespace: Option<String>,
    /// `spec` when it came before `apiVersion` and `kind` (walked once they are known).
    pub deferred: Option<serde_json::Value>,
}

/// The message of the serde error that stops a walk; the real problem is in [`State::problem`].
const STOPPED: &str = "validation stopped";

impl State {
    /// Records a problem and gives the error that unwinds the walk.
    pub(super) fn fail<E: de::Error>(&mut self, path: String, problem: String) -> E {
        self.problem.get_or_insert(Invalid { path, problem });
        E::custom(STOPPED)
    }

    fn keep(&mut self, slot: Slot, text: &str) {
        let place = match slot {
            Slot::ApiVersion => &mut self.api_version,
            Slot::Kind => &mut self.kind,
            Slot::Name => &mut self.name,
            Slot::Namespace => &mut self.namespace,
        };
        *place = Some(text.to_owned());
    }
}

/// A string as shown in a message: quoted, and cut after 64 characters.
pub(super) fn shown(text: &str) -> String {
    const MAX: usize = 64;
    if text.chars().count() <= MAX {
        format!("{text:?}")
    } else {
        let head: String = text.chars().take(MAX).collect();
        format!("{head:?}…")
    }
}

/// Walks one value along `shape`.
pub(super) struct Walk<'s, 'n> {
    pub shape: &'static Shape,
    pub node: &'n Node<'n>,
    pub state: &'s mut State,
    /// Whether `null` is accepted (an optional member: Go decodes it as unset).
    pub nullable: bool,
    pub capture: Option<Slot>,
}

impl Walk<'_, '_> {
    fn mismatch<E: de::Error>(self, found: &str) -> Result<(), E> {
        let problem = format!("expected {}, found {found}", self.shape.describe());
        Err(self.state.fail(self.node.to_string(), problem))
    }

    fn child<'s, 'n>(
        state: &'s mut State,
        node: &'n Node<'n>,
        shape: &'static Shape,
    ) -> Walk<'s, 'n> {
        Walk {
            shape,
            node,
            state,
            nullable: false,
            capture: None,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        match self.shape {
            Shape::Any => deserializer.deserialize_ignored_any(IgnoredAny).map(|_| ()),
            _ => deserializer.deserialize_any(self),
        }
    }
}

impl<'de> Visitor<'de> for Walk<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shape.describe())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        match self.shape {
            Shape::Bool => Ok(()),
            _ => self.mismatch("a boolean"),
        }
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.mismatch("a number")
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.mismatch("a number")
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.mismatch("a number")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<(), E> {
        let Shape::Text(rule) = self.shape else {
            return self.mismatch("a string");
        };
        if !rule.fits(text) {
            return self.mismatch(&shown(text));
        }
        if let Some(slot) = self.capture {
            self.state.keep(slot, text);
        }
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        if self.nullable {
            Ok(())
        } else {
            self.mismatch("null")
        }
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Shape::List(item) = self.shape else {
            return self.mismatch("a list");
        };
        let mut index = 0;
        loop {
            let node = self.node.index(index);
            let walk = Walk::child(&mut *self.state, &node, item);
            if seq.next_element_seed(walk)?.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        match self.shape {
            Shape::Object(members) => {
                let mut seen = 0u64;
                while let Some(found) = map.next_key_seed(MemberKey(members))? {
                    let Some(index) = found else {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    };
                    seen |= 1 << index;
                    let member = &members[index];
                    let node = self.node.field(member.name);
                    map.next_value_seed(Walk {
                        shape: &member.shape,
                        node: &node,
                        state: &mut *self.state,
                        nullable: !member.required,
                        capture: member.capture,
                    })?;
                }
                let missing = members
                    .iter()
                    .enumerate()
                    .find(|(index, member)| member.required && seen & (1 << index) == 0);
                match missing {
                    Some((_, member)) => Err(self.state.fail(
                        self.node.field(member.name).to_string(),
                        format!("missing, expected {}", member.shape.describe()),
                    )),
                    None => Ok(()),
                }
            }
            Shape::Map(values, special) => {
                while let Some(key) = map.next_key_seed(BorrowedKey)? {
                    let shape = special
                        .iter()
                        .find(|(name, _)| *name == key)
                        .map_or(*values, |(_, shape)| shape);
                    let node = self.node.key(&key);
                    map.next_value_seed(Walk::child(&mut *self.state, &node, shape))?;
                }
                Ok(())
            }
            _ => self.mismatch("an object"),
        }
    }
}

/// Reads an object key as the index of the member of that name, without copying it.
pub(super) struct MemberKey(pub &'static [Member]);

impl<'de> DeserializeSeed<'de> for MemberKey {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for MemberKey {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|member| member.name == key))
    }
}

/// Reads a map key, borrowed from the input when it can be (no copy for keys without escapes).
struct BorrowedKey;

impl<'de> DeserializeSeed<'de> for BorrowedKey {
    type Value = std::borrow::Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for BorrowedKey {
    type Value = std::borrow::Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Borrowed(key))
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(key.to_owned()))
    }
}

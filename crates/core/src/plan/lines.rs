//! The line format: the bytes a value's serde form hashes as in input fingerprints ([`super::PlanInputs`]).
//! A derived `Serialize` is the whole schema, so a field added to a serialized struct is in every fingerprint
//! without anyone remembering it.
//!
//! Each field of the outer struct ends with `\n`; inside it, a struct's fields run together, a list's items
//! each end with `,`, a flag is `1` or `0`, a text or an enum variant's name is written as it is, a number in
//! decimal, and an absent value (`None`, `()`) is nothing. Floats, bytes, maps and enum variants with data
//! are refused: nothing hashed needs them, and each would need a rule of its own to stay unambiguous.

use serde::Serialize;
use serde::ser::{self, Impossible};

/// Why a value has no line form: it holds a shape the format does not define (see the module header).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the line format has no form for {0}")]
pub struct LinesError(String);

impl ser::Error for LinesError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        LinesError(msg.to_string())
    }
}

/// The line form of `value`, appended to `out`.
pub fn write<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), LinesError> {
    value.serialize(Lines { out, depth: 0 })
}

/// The serializer: `depth` 0 is the outer struct, whose fields end their lines.
struct Lines<'a> {
    out: &'a mut Vec<u8>,
    depth: usize,
}

impl<'a> Lines<'a> {
    fn inner(&mut self) -> Lines<'_> {
        Lines {
            out: self.out,
            depth: self.depth + 1,
        }
    }

    fn text(self, text: &str) -> Result<(), LinesError> {
        self.out.extend_from_slice(text.as_bytes());
        Ok(())
    }
}

fn refused(shape: &str) -> LinesError {
    LinesError(shape.to_owned())
}

impl<'a> ser::Serializer for Lines<'a> {
    type Ok = ();
    type Error = LinesError;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Impossible<(), LinesError>;
    type SerializeMap = Impossible<(), LinesError>;
    type SerializeStruct = Self;
    type SerializeStructVariant = Impossible<(), LinesError>;

    fn serialize_bool(self, v: bool) -> Result<(), LinesError> {
        self.text(if v { "1" } else { "0" })
    }
    fn serialize_i8(self, v: i8) -> Result<(), LinesError> {
        self.serialize_i64(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<(), LinesError> {
        self.serialize_i64(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<(), LinesError> {
        self.serialize_i64(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result<(), LinesError> {
        self.text(&v.to_string())
    }
    fn serialize_u8(self, v: u8) -> Result<(), LinesError> {
        self.serialize_u64(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result<(), LinesError> {
        self.serialize_u64(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result<(), LinesError> {
        self.serialize_u64(v.into())
    }
    fn serialize_u64(self, v: u64) -> Result<(), LinesError> {
        self.text(&v.to_string())
    }
    fn serialize_f32(self, _: f32) -> Result<(), LinesError> {
        Err(refused("a float"))
    }
    fn serialize_f64(self, _: f64) -> Result<(), LinesError> {
        Err(refused("a float"))
    }
    fn serialize_char(self, v: char) -> Result<(), LinesError> {
        self.text(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), LinesError> {
        self.text(v)
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<(), LinesError> {
        Err(refused("bytes"))
    }
    fn serialize_none(self) -> Result<(), LinesError> {
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), LinesError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), LinesError> {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), LinesError> {
        Ok(())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), LinesError> {
        self.text(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), LinesError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), LinesError> {
        Err(refused("an enum variant with data"))
    }
    fn serialize_seq(mut self, _: Option<usize>) -> Result<Self, LinesError> {
        self.depth += 1;
        Ok(self)
    }
    fn serialize_tuple(self, len: usize) -> Result<Self, LinesError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Self, LinesError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, LinesError> {
        Err(refused("an enum variant with data"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, LinesError> {
        Err(refused("a map (a flattened field is one)"))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, LinesError> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, LinesError> {
        Err(refused("an enum variant with data"))
    }
}

impl ser::SerializeSeq for Lines<'_> {
    type Ok = ();
    type Error = LinesError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), LinesError> {
        value.serialize(self.inner())?;
        self.out.push(b',');
        Ok(())
    }
    fn end(self) -> Result<(), LinesError> {
        Ok(())
    }
}

impl ser::SerializeTuple for Lines<'_> {
    type Ok = ();
    type Error = LinesError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), LinesError> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<(), LinesError> {
        Ok(())
    }
}

impl ser::SerializeTupleStruct for Lines<'_> {
    type Ok = ();
    type Error = LinesError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), LinesError> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<(), LinesError> {
        Ok(())
    }
}

impl ser::SerializeStruct for Lines<'_> {
    type Ok = ();
    type Error = LinesError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        _: &'static str,
        value: &T,
    ) -> Result<(), LinesError> {
        value.serialize(self.inner())?;
        if self.depth == 0 {
            self.out.push(b'\n');
        }
        Ok(())
    }
    fn end(self) -> Result<(), LinesError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde::Serialize;

    use super::*;

    #[derive(Serialize)]
    #[serde(rename_all = "kebab-case")]
    enum Colour {
        DeepRed,
    }

    #[derive(Serialize)]
    struct Flags {
        a: bool,
        b: bool,
    }

    #[derive(Serialize)]
    struct Outer {
        list: Vec<Colour>,
        flags: Flags,
        more: bool,
        name: Option<String>,
        none: Option<String>,
        count: u32,
    }

    fn lines<T: Serialize>(value: &T) -> Result<String, LinesError> {
        let mut out = Vec::new();
        write(value, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn outer_fields_end_lines_inner_structs_run_together_items_end_with_commas() {
        let value = Outer {
            list: vec![Colour::DeepRed, Colour::DeepRed],
            flags: Flags { a: true, b: false },
            more: true,
            name: Some("spec.image".into()),
            none: None,
            count: 7,
        };
        assert_eq!(
            lines(&value).unwrap(),
            "deep-red,deep-red,\n10\n1\nspec.image\n\n7\n"
        );
    }

    #[test]
    fn shapes_without_a_rule_are_refused_by_name() {
        #[derive(Serialize)]
        struct Flattened {
            #[serde(flatten)]
            flags: Flags,
        }
        let err = lines(&Flattened {
            flags: Flags { a: true, b: true },
        })
        .unwrap_err();
        assert!(err.to_string().contains("a map"), "{err}");
        assert!(lines(&1.5f64).unwrap_err().to_string().contains("float"));
    }
}

//! Tests of the gojson module.

use super::*;
use serde_json::Value;

fn obj(input: &str) -> GoJson {
    parse_document(input.as_bytes()).unwrap()
}

#[test]
fn keeps_member_order_duplicates_and_number_literals() {
    let v = obj(r#"{"b": 1.0, "a": -0, "b": 1e2}"#);
    let GoJson::Object(members) = &v else {
        panic!("not an object")
    };
    let keys: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["b", "a", "b"]);
    assert_eq!(members[0].1, GoJson::Number("1.0".into()));
    assert_eq!(members[1].1, GoJson::Number("-0".into()));
}

#[test]
fn unmarshal_rejects_trailing_data_but_decoder_ignores_it() {
    assert!(parse_document(br#"{"a":1} x"#).is_err());
    assert!(parse_document(b"{} \n").is_ok());
    assert_eq!(
        parse_first_value(br#"{"a":1}garbage"#).unwrap(),
        obj(r#"{"a":1}"#)
    );
    assert_eq!(
        parse_first_value(b"12x").unwrap(),
        GoJson::Number("12".into())
    );
    assert!(parse_first_value(b"   ").is_err());
    assert!(parse_first_value(b"{\"a\":").is_err());
}

#[test]
fn rejects_what_go_rejects() {
    for bad in [
        "{'a':1}",
        "[1,]",
        "{\"a\" 1}",
        "01",
        "1.",
        "-",
        "1e",
        "tru",
        "\"a\u{1}\"",
        "\"\\x\"",
        "nul",
        "[1 2]",
    ] {
        assert!(
            parse_document(bad.as_bytes()).is_err(),
            "{bad:?} should be rejected"
        );
    }
}

#[test]
fn strings_are_unescaped_the_go_way() {
    assert_eq!(
        obj(r#""\u00e9\ud83d\ude00\n""#),
        GoJson::String("é😀\n".into())
    );
    // Lone surrogates and invalid UTF-8 become U+FFFD instead of failing.
    assert_eq!(obj(r#""\ud800x""#), GoJson::String("\u{fffd}x".into()));
    assert_eq!(
        obj(r#""\udc00\ud800\u0041""#),
        GoJson::String("\u{fffd}\u{fffd}A".into())
    );
    let bytes = b"\"a\xff\xe2\x82\"";
    assert_eq!(
        parse_document(bytes).unwrap(),
        GoJson::String("a\u{fffd}\u{fffd}\u{fffd}".into())
    );
}

#[test]
fn go_depth_limit_is_enforced_without_overflowing_the_stack() {
    let ok = format!(
        "{}{}",
        "[".repeat(GO_MAX_NESTING_DEPTH),
        "]".repeat(GO_MAX_NESTING_DEPTH)
    );
    assert!(parse_document(ok.as_bytes()).is_ok());
    let too_deep = format!(
        "{}{}",
        "[".repeat(GO_MAX_NESTING_DEPTH + 1),
        "]".repeat(GO_MAX_NESTING_DEPTH + 1)
    );
    let e = parse_document(too_deep.as_bytes()).unwrap_err();
    assert!(e.message.contains("exceeded max depth"), "{e}");
}

#[test]
fn converts_numbers_like_the_unstructured_decoder() {
    let v = to_value(&obj(r#"{"i": 5, "f": 1.0, "e": 1e2, "z": -0, "big": 9223372036854775808, "d": {"k": 1, "k": 2}}"#)).unwrap();
    assert_eq!(v["i"], serde_json::json!(5));
    assert!(v["f"].is_f64() && v["e"].is_f64() && v["big"].is_f64());
    assert_eq!(v["z"], serde_json::json!(0));
    assert_eq!(v["d"]["k"], serde_json::json!(2));
    assert!(to_value(&obj("1e400")).is_err());
}

#[test]
fn prints_numbers_like_go() {
    let lit = |v: Value| go_number_literal(v.as_number().unwrap());
    assert_eq!(lit(serde_json::json!(1.0)), "1");
    assert_eq!(lit(serde_json::json!(1.5)), "1.5");
    assert_eq!(lit(serde_json::json!(1e21)), "1e+21");
    assert_eq!(lit(serde_json::json!(1e-7)), "1e-7");
    assert_eq!(lit(serde_json::json!(-3)), "-3");
}

#[test]
fn int_parsing_follows_strconv() {
    assert_eq!(parse_go_int("-0", 32), Some(0));
    assert_eq!(parse_go_int("2147483647", 32), Some(i64::from(i32::MAX)));
    assert_eq!(parse_go_int("2147483648", 32), None);
    assert_eq!(parse_go_int("1.0", 32), None);
    assert_eq!(parse_go_int("1e2", 32), None);
    assert_eq!(parse_go_uint("255", 255), Some(255));
    assert_eq!(parse_go_uint("-0", 255), None);
    assert_eq!(parse_go_uint("256", 255), None);
}

//! Tests of the godecode module.

use super::*;
use crate::gojson::parse_document;

go_struct! {
    #[derive(Debug, Default, PartialEq)]
    pub struct Sample {
        status: String = "status",
        retry: i32 = "retryAfterSeconds",
        timeout: Option<i32> = "timeoutSeconds" [omitempty],
        bytes: Vec<u8> = "patch" [omitempty],
        names: Vec<String> = "names" [omitempty],
        labels: BTreeMap<String, String> = "labels" [omitempty],
    }
}

fn decode(input: &str) -> (Sample, Option<DecodeError>) {
    let json = parse_document(input.as_bytes()).unwrap();
    let mut cx = DecodeCtx::default();
    let v: Sample = decode_partial(&json, &mut cx);
    (v, cx.first_error().cloned())
}

#[test]
fn keys_match_case_insensitively_and_last_duplicate_wins() {
    let (v, e) = decode(
        r#"{"STATUS": "Failure", "status": "Success", "ſtatus": "Success2", "unknown": [1, {}]}"#,
    );
    assert_eq!(e, None);
    assert_eq!(v.status, "Success2");
}

#[test]
fn wrong_types_are_errors_but_decoding_continues() {
    let (v, e) = decode(r#"{"retryAfterSeconds": 1.5, "status": "Success"}"#);
    assert!(
        matches!(e, Some(DecodeError::Type { ref path, .. }) if path == "retryAfterSeconds"),
        "{e:?}"
    );
    assert_eq!(v.status, "Success");
    for bad in [
        r#"{"retryAfterSeconds": "5"}"#,
        r#"{"retryAfterSeconds": 2147483648}"#,
        r#"{"retryAfterSeconds": 1e1}"#,
        r#"{"status": 5}"#,
        r#"{"names": "x"}"#,
        "[]",
    ] {
        assert!(decode(bad).1.is_some(), "{bad} should fail");
    }
    assert_eq!(
        decode(r#"{"retryAfterSeconds": -0}"#),
        (Sample::default(), None)
    );
}

#[test]
fn null_rules_follow_go() {
    let (v, e) = decode(
        r#"{"status": "Success", "status": null, "timeoutSeconds": 3, "timeoutSeconds": null, "names": ["a"], "names": null}"#,
    );
    assert_eq!(e, None);
    assert_eq!(v.status, "Success");
    assert_eq!(v.timeout, None);
    assert!(v.names.is_empty());
    // A pointer is allocated before its value fails to decode.
    let (v, e) = decode(r#"{"timeoutSeconds": "10"}"#);
    assert!(e.is_some());
    assert_eq!(v.timeout, Some(0));
}

#[test]
fn bytes_are_base64_or_number_arrays() {
    assert_eq!(decode(r#"{"patch": "W10="}"#).0.bytes, b"[]");
    assert_eq!(decode("{\"patch\": \"W1\\r\\n0=\"}").0.bytes, b"[]");
    assert_eq!(
        decode(r#"{"patch": "W10"}"#).1,
        Some(DecodeError::Base64 {
            path: "patch".into()
        })
    );
    assert!(decode(r#"{"patch": "W1 0="}"#).1.is_some());
    // Go decodes an array of small numbers into []byte; an array of objects is a type error.
    assert_eq!(
        decode(r#"{"patch": [91, 93]}"#),
        (
            Sample {
                bytes: b"[]".to_vec(),
                ..Default::default()
            },
            None
        )
    );
    let (v, e) = decode(r#"{"patch": [{"op": "add"}]}"#);
    assert!(e.is_some());
    assert_eq!(v.bytes, vec![0]);
    assert!(decode(r#"{"patch": [256]}"#).1.is_some());
}

#[test]
fn map_members_that_fail_are_stored_as_zero() {
    let (v, e) = decode(r#"{"labels": {"a": 5, "b": "x"}}"#);
    assert!(e.is_some());
    assert_eq!(v.labels.get("a").map(String::as_str), Some(""));
    assert_eq!(v.labels.get("b").map(String::as_str), Some("x"));
}

#[test]
fn strict_mode_reports_keys_an_encoder_would_not_write() {
    let json = parse_document(br#"{"Status": "x", "extra": 1}"#).unwrap();
    let mut cx = DecodeCtx::strict();
    let _: Sample = decode_partial(&json, &mut cx);
    assert_eq!(cx.unexpected_keys().len(), 2, "{:?}", cx.unexpected_keys());
}

#[test]
fn encodes_with_omitempty() {
    let v = Sample {
        status: String::new(),
        bytes: b"{}".to_vec(),
        ..Default::default()
    };
    assert_eq!(
        v.go_encode(),
        serde_json::json!({"status": "", "retryAfterSeconds": 0, "patch": "e30="})
    );
}

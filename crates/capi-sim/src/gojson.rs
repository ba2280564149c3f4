//! A JSON reader with the semantics of Go's `encoding/json`, which is what CAPI decodes answers with.
//!
//! serde_json differs from Go where it matters to a faithful simulator: it loses member order and
//! duplicate keys (Go: the last one wins, matched case-insensitively), it turns `-0` into a float and
//! forgets how a number was written (Go parses the literal into the target type: `1.0` is not an
//! `int32`), it rejects invalid UTF-8 and lone surrogates (Go replaces them with U+FFFD), and it
//! stops at 128 levels of nesting (Go: 10000). So the tree here keeps literals and order, and the
//! parser is iterative so that Go's depth limit cannot overflow the stack.

pub use crate::goconv::{from_value, go_number_literal, parse_go_int, parse_go_uint, to_value};

/// Go's `encoding/json` scanner refuses documents nested deeper than this (`maxNestingDepth`).
pub const GO_MAX_NESTING_DEPTH: usize = 10_000;

/// A parsed JSON value that keeps what Go's decoder sees: member order, duplicates, raw numbers.
#[derive(Debug, Clone, PartialEq)]
pub enum GoJson {
    /// `null`
    Null,
    /// `true` / `false`
    Bool(bool),
    /// A number literal exactly as written (always valid JSON number grammar).
    Number(String),
    /// A string, unescaped the Go way (invalid UTF-8 and lone surrogates become U+FFFD).
    String(String),
    /// An array.
    Array(Vec<GoJson>),
    /// An object's members in document order, duplicates kept.
    Object(Vec<(String, GoJson)>),
}

impl Drop for GoJson {
    // Iterative, so that dropping a 10000-deep document cannot overflow the stack.
    fn drop(&mut self) {
        let mut pending = Vec::new();
        take_children(self, &mut pending);
        while let Some(mut value) = pending.pop() {
            take_children(&mut value, &mut pending);
        }
    }
}

fn take_children(value: &mut GoJson, into: &mut Vec<GoJson>) {
    match value {
        GoJson::Array(items) => into.append(items),
        GoJson::Object(members) => into.extend(std::mem::take(members).into_iter().map(|(_, v)| v)),
        _ => {}
    }
}

impl GoJson {
    /// The JSON type name Go uses in `UnmarshalTypeError` messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            GoJson::Null => "null",
            GoJson::Bool(_) => "bool",
            GoJson::Number(_) => "number",
            GoJson::String(_) => "string",
            GoJson::Array(_) => "array",
            GoJson::Object(_) => "object",
        }
    }
}

/// Malformed JSON, with the byte offset where Go's scanner would stop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (at byte {offset})")]
pub struct SyntaxError {
    /// Byte offset of the offending input.
    pub offset: usize,
    /// What is wrong, worded like Go's scanner.
    pub message: String,
}

/// `json.Unmarshal` semantics: exactly one value, only whitespace after it.
pub fn parse_document(input: &[u8]) -> Result<GoJson, SyntaxError> {
    let (value, end) = parse_value(input)?;
    let rest = skip_ws(input, end);
    if rest < input.len() {
        return Err(err(
            rest,
            format!(
                "invalid character {} after top-level value",
                show(input[rest])
            ),
        ));
    }
    Ok(value)
}

/// `json.NewDecoder(body).Decode` semantics (how CAPI reads a 200 answer): the first value counts,
/// whatever follows it is never looked at.
pub fn parse_first_value(input: &[u8]) -> Result<GoJson, SyntaxError> {
    parse_value(input).map(|(value, _)| value)
}

enum Frame {
    Array(Vec<GoJson>),
    Object(Vec<(String, GoJson)>, String),
}

fn parse_value(input: &[u8]) -> Result<(GoJson, usize), SyntaxError> {
    let mut stack: Vec<Frame> = Vec::new();
    let mut pos = skip_ws(input, 0);
    if pos >= input.len() {
        return Err(err(pos, "unexpected end of JSON input (EOF)".into()));
    }
    'value: loop {
        pos = skip_ws(input, pos);
        let Some(&c) = input.get(pos) else {
            return Err(eof(pos));
        };
        let mut value = match c {
            b'{' | b'[' => {
                if stack.len() + 1 > GO_MAX_NESTING_DEPTH {
                    return Err(err(pos, "exceeded max depth".into()));
                }
                pos = skip_ws(input, pos + 1);
                let close = if c == b'{' { b'}' } else { b']' };
                if input.get(pos) == Some(&close) {
                    pos += 1;
                    if c == b'{' {
                        GoJson::Object(Vec::new())
                    } else {
                        GoJson::Array(Vec::new())
                    }
                } else if c == b'[' {
                    stack.push(Frame::Array(Vec::new()));
                    continue 'value;
                } else {
                    let key = parse_key(input, &mut pos)?;
                    stack.push(Frame::Object(Vec::new(), key));
                    continue 'value;
                }
            }
            b'"' => {
                let (s, end) = parse_string(input, pos)?;
                pos = end;
                GoJson::String(s)
            }
            b't' => literal(input, &mut pos, "true", GoJson::Bool(true))?,
            b'f' => literal(input, &mut pos, "false", GoJson::Bool(false))?,
            b'n' => literal(input, &mut pos, "null", GoJson::Null)?,
            b'-' | b'0'..=b'9' => {
                let end = scan_number(input, pos)?;
                let lit = String::from_utf8_lossy(&input[pos..end]).into_owned();
                pos = end;
                GoJson::Number(lit)
            }
            other => {
                return Err(err(
                    pos,
                    format!(
                        "invalid character {} looking for beginning of value",
                        show(other)
                    ),
                ));
            }
        };
        // Attach the finished value to its parent, closing every container that ends here.
        loop {
            let Some(frame) = stack.last_mut() else {
                return Ok((value, pos));
            };
            pos = skip_ws(input, pos);
            let next = input.get(pos).copied();
            match frame {
                Frame::Array(items) => {
                    items.push(value);
                    match next {
                        Some(b',') => {
                            pos += 1;
                            continue 'value;
                        }
                        Some(b']') => {
                            pos += 1;
                            let Some(Frame::Array(items)) = stack.pop() else {
                                unreachable!()
                            };
                            value = GoJson::Array(items);
                        }
                        Some(c) => {
                            return Err(err(
                                pos,
                                format!("invalid character {} after array element", show(c)),
                            ));
                        }
                        None => return Err(eof(pos)),
                    }
                }
                Frame::Object(members, key) => {
                    members.push((std::mem::take(key), value));
                    match next {
                        Some(b',') => {
                            pos = skip_ws(input, pos + 1);
                            *key = parse_key(input, &mut pos)?;
                            continue 'value;
                        }
                        Some(b'}') => {
                            pos += 1;
                            let Some(Frame::Object(members, _)) = stack.pop() else {
                                unreachable!()
                            };
                            value = GoJson::Object(members);
                        }
                        Some(c) => {
                            return Err(err(
                                pos,
                                format!(
                                    "invalid character {} after object key:value pair",
                                    show(c)
                                ),
                            ));
                        }
                        None => return Err(eof(pos)),
                    }
                }
            }
        }
    }
}

/// Parses `"key"` and the `:` after it; `pos` ends after the colon.
fn parse_key(input: &[u8], pos: &mut usize) -> Result<String, SyntaxError> {
    match input.get(*pos) {
        Some(b'"') => {}
        Some(&c) => {
            return Err(err(
                *pos,
                format!(
                    "invalid character {} looking for beginning of object key string",
                    show(c)
                ),
            ));
        }
        None => return Err(eof(*pos)),
    }
    let (key, end) = parse_string(input, *pos)?;
    *pos = skip_ws(input, end);
    match input.get(*pos) {
        Some(b':') => {
            *pos += 1;
            Ok(key)
        }
        Some(&c) => Err(err(
            *pos,
            format!("invalid character {} after object key", show(c)),
        )),
        None => Err(eof(*pos)),
    }
}

fn literal(
    input: &[u8],
    pos: &mut usize,
    word: &str,
    value: GoJson,
) -> Result<GoJson, SyntaxError> {
    for (i, expected) in word.bytes().enumerate() {
        match input.get(*pos + i) {
            Some(&c) if c == expected => {}
            Some(&c) => {
                return Err(err(
                    *pos + i,
                    format!("invalid character {} in literal {word}", show(c)),
                ));
            }
            None => return Err(eof(*pos + i)),
        }
    }
    *pos += word.len();
    Ok(value)
}

/// Returns the end of the number literal starting at `start` (JSON grammar, as Go's scanner).
fn scan_number(input: &[u8], start: usize) -> Result<usize, SyntaxError> {
    let digit = |i: usize| input.get(i).is_some_and(u8::is_ascii_digit);
    let mut i = start;
    if input[i] == b'-' {
        i += 1;
    }
    match input.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            while digit(i) {
                i += 1;
            }
        }
        Some(&c) => {
            return Err(err(
                i,
                format!("invalid character {} in numeric literal", show(c)),
            ));
        }
        None => return Err(eof(i)),
    }
    if input.get(i) == Some(&b'.') {
        i += 1;
        if !digit(i) {
            return number_error(input, i);
        }
        while digit(i) {
            i += 1;
        }
    }
    if matches!(input.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(input.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digit(i) {
            return number_error(input, i);
        }
        while digit(i) {
            i += 1;
        }
    }
    Ok(i)
}

fn number_error(input: &[u8], i: usize) -> Result<usize, SyntaxError> {
    match input.get(i) {
        Some(&c) => Err(err(
            i,
            format!("invalid character {} in numeric literal", show(c)),
        )),
        None => Err(eof(i)),
    }
}

/// Parses the string whose opening quote is at `start`; returns it and the offset after the closing quote.
fn parse_string(input: &[u8], start: usize) -> Result<(String, usize), SyntaxError> {
    let mut out = String::new();
    let mut i = start + 1;
    loop {
        let Some(&c) = input.get(i) else {
            return Err(eof(i));
        };
        match c {
            b'"' => return Ok((out, i + 1)),
            b'\\' => {
                let Some(&e) = input.get(i + 1) else {
                    return Err(eof(i + 1));
                };
                i += 2;
                match e {
                    b'"' => out.push('"'),
                    b'\\' => out.push('\\'),
                    b'/' => out.push('/'),
                    b'b' => out.push('\u{8}'),
                    b'f' => out.push('\u{c}'),
                    b'n' => out.push('\n'),
                    b'r' => out.push('\r'),
                    b't' => out.push('\t'),
                    b'u' => {
                        let first = hex4(input, i)?;
                        i += 4;
                        out.push(decode_utf16_escape(input, &mut i, first));
                    }
                    other => {
                        return Err(err(
                            i - 1,
                            format!("invalid character {} in string escape code", show(other)),
                        ));
                    }
                }
            }
            0x00..=0x1f => {
                return Err(err(
                    i,
                    format!("invalid character {} in string literal", show(c)),
                ));
            }
            0x20..=0x7f => {
                out.push(c as char);
                i += 1;
            }
            _ => {
                // Go's utf8.DecodeRune: a valid sequence is kept, every other byte becomes U+FFFD.
                let width = match c {
                    0xc2..=0xdf => 2,
                    0xe0..=0xef => 3,
                    0xf0..=0xf4 => 4,
                    _ => 0,
                };
                match input.get(i..i + width).map(std::str::from_utf8) {
                    Some(Ok(s)) if width > 0 => {
                        out.push_str(s);
                        i += width;
                    }
                    _ => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        i += 1;
                    }
                }
            }
        }
    }
}

/// Combines a `\uD8xx\uDCxx` pair; a lone surrogate becomes U+FFFD (the next escape is not consumed).
fn decode_utf16_escape(input: &[u8], i: &mut usize, first: u32) -> char {
    if !(0xd800..0xe000).contains(&first) {
        return char::from_u32(first).unwrap_or(char::REPLACEMENT_CHARACTER);
    }
    if first < 0xdc00
        && input.get(*i) == Some(&b'\\')
        && input.get(*i + 1) == Some(&b'u')
        && let Ok(second) = hex4(input, *i + 2)
        && (0xdc00..0xe000).contains(&second)
    {
        *i += 6;
        let code = 0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00);
        return char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER);
    }
    char::REPLACEMENT_CHARACTER
}

fn hex4(input: &[u8], at: usize) -> Result<u32, SyntaxError> {
    let mut value = 0u32;
    for k in 0..4 {
        let Some(&c) = input.get(at + k) else {
            return Err(eof(at + k));
        };
        let d = (c as char).to_digit(16).ok_or_else(|| {
            err(
                at + k,
                format!(
                    "invalid character {} in \\u hexadecimal character escape",
                    show(c)
                ),
            )
        })?;
        value = value * 16 + d;
    }
    Ok(value)
}

fn skip_ws(input: &[u8], mut pos: usize) -> usize {
    while matches!(input.get(pos), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        pos += 1;
    }
    pos
}

fn show(c: u8) -> String {
    if c.is_ascii_graphic() || c == b' ' {
        format!("'{}'", c as char)
    } else {
        format!("0x{c:02x}")
    }
}

fn err(offset: usize, message: String) -> SyntaxError {
    SyntaxError { offset, message }
}

fn eof(offset: usize) -> SyntaxError {
    err(offset, "unexpected end of JSON input".into())
}

#[cfg(test)]
#[path = "gojson_tests.rs"]
mod tests;

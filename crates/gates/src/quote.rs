//! Quotes of what failed, short enough for an UpdateMachine message: the first few items, then a count.

/// Items (series, alerts) a failing gate's quote lists before `and N more`.
pub const MAX_QUOTED_ITEMS: usize = 3;

/// Longest quote or cause, in characters (cut with `…`); also the most of an error answer's body quoted.
pub const MAX_QUOTE_CHARS: usize = 600;

/// `{lead}: a; b; c and 2 more`, cut at [`MAX_QUOTE_CHARS`].
pub(crate) fn list(lead: &str, items: &[String]) -> String {
    let shown = items.len().min(MAX_QUOTED_ITEMS);
    let mut text = format!("{lead}: {}", items[..shown].join("; "));
    if items.len() > shown {
        text.push_str(&format!(" and {} more", items.len() - shown));
    }
    cut(&text)
}

/// `text` on one line (control characters as spaces), at most [`MAX_QUOTE_CHARS`] characters.
pub(crate) fn cut(text: &str) -> String {
    let one_line: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match one_line.char_indices().nth(MAX_QUOTE_CHARS) {
        None => one_line,
        Some((at, _)) => format!("{}…", &one_line[..at]),
    }
}

/// An error answer's body, quoted: on one line, cut, `(empty body)` when there is none.
pub(crate) fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    if text.trim().is_empty() {
        "(empty body)".into()
    } else {
        cut(&text)
    }
}

/// A label value as Prometheus prints it: double-quoted, `\`, `"` and newlines escaped.
pub(crate) fn quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `name{a="1",b="2"}`, labels in the order given (callers pass them sorted); `{}` is left out when empty.
pub(crate) fn series<'a>(name: &str, labels: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let labels: Vec<String> = labels
        .map(|(key, value)| format!("{key}={}", quoted(value)))
        .collect();
    if labels.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{}}}", labels.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_the_first_few_then_counts_the_rest() {
        let items: Vec<String> = (1..=5).map(|i| format!("s{i}")).collect();
        assert_eq!(
            list("query returned 5 series", &items),
            "query returned 5 series: s1; s2; s3 and 2 more"
        );
        assert_eq!(list("x", &items[..1]), "x: s1");
    }

    #[test]
    fn cuts_long_text_on_a_character_boundary() {
        let long = "é".repeat(MAX_QUOTE_CHARS + 10);
        let cut = cut(&long);
        assert_eq!(cut.chars().count(), MAX_QUOTE_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(super::cut("a\nb"), "a b");
    }

    #[test]
    fn renders_series_like_prometheus() {
        assert_eq!(
            series("up", [("job", "a\"b")].into_iter()),
            r#"up{job="a\"b"}"#
        );
        assert_eq!(series("up", std::iter::empty()), "up");
    }
}

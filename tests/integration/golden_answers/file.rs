//! The golden files: one JSON line per call, and the comparison that names the first call whose line differs
//! (or, with `GOLDEN_BLESS=1`, the rewrite).

use std::path::PathBuf;

use serde::Serialize;

/// Environment variable that makes the test rewrite the golden files instead of comparing.
pub const BLESS_VARIABLE: &str = "GOLDEN_BLESS";

/// One recorded call, as a line of a golden file.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Line<'a> {
    label: &'a str,
    call: &'a str,
    request_sha256: &'a str,
    status: u16,
    answer: &'a str,
}

/// A line of a golden file, read back (its strings unescaped).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReadLine {
    label: String,
    call: String,
    request_sha256: String,
    status: u16,
    answer: String,
}

/// One call as a line of a golden file.
pub fn line(label: &str, call: &str, request_sha256: &str, status: u16, answer: &str) -> String {
    serde_json::to_string(&Line {
        label,
        call,
        request_sha256,
        status,
        answer,
    })
    .unwrap()
}

/// Compares `lines` with the scenario's golden file and fails on the first difference, or rewrites the file
/// when `GOLDEN_BLESS=1`.
pub fn check_or_bless(scenario: &str, lines: &[String]) {
    let path = golden_path(scenario);
    let recorded = lines.join("\n") + "\n";
    if std::env::var(BLESS_VARIABLE).is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &recorded).unwrap();
        println!("blessed {} ({} calls)", path.display(), lines.len());
        return;
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_else(|err| {
        panic!(
            "{}: {err}; record it with {BLESS_VARIABLE}=1 (see tests/golden/README.md)",
            path.display()
        )
    });
    if golden != recorded {
        panic!("{}", first_difference(scenario, &golden, lines));
    }
}

fn golden_path(scenario: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{scenario}.jsonl"))
}

/// The first call whose line differs, both answers side by side, and where they part.
fn first_difference(scenario: &str, golden: &str, recorded: &[String]) -> String {
    let expected: Vec<&str> = golden.lines().collect();
    let bless = format!(
        "only if this wire change is intended: {BLESS_VARIABLE}=1 cargo test --release --test integration \
         golden_answers (tests/golden/README.md)"
    );
    for (index, actual) in recorded.iter().enumerate() {
        let Some(wanted) = expected.get(index) else {
            return format!(
                "golden answers `{scenario}`: call {} is new (the golden file has {} calls): {actual}\n{bless}",
                index + 1,
                expected.len()
            );
        };
        if wanted == actual {
            continue;
        }
        let (Ok(want), Ok(got)) = (
            serde_json::from_str::<ReadLine>(wanted),
            serde_json::from_str::<ReadLine>(actual),
        ) else {
            return format!(
                "golden answers `{scenario}`: call {} differs:\n  golden   {wanted}\n  recorded {actual}\n{bless}",
                index + 1
            );
        };
        let mut report = format!(
            "golden answers `{scenario}`: call {} ({} {:?}) differs\n",
            index + 1,
            got.call,
            got.label
        );
        if (&want.label, &want.call) != (&got.label, &got.call) {
            report += &format!(
                "  the corpus changed: golden call is {} {:?}\n",
                want.call, want.label
            );
        }
        if want.request_sha256 != got.request_sha256 {
            report += "  the request bytes differ from the golden one's (sha256)\n";
        }
        if want.status != got.status {
            report += &format!(
                "  HTTP status: golden {}, now {}\n",
                want.status, got.status
            );
        }
        if want.answer != got.answer {
            let at = want
                .answer
                .char_indices()
                .zip(got.answer.chars())
                .find(|((_, a), b)| a != b)
                .map_or(want.answer.len().min(got.answer.len()), |((i, _), _)| i);
            report += &format!(
                "  golden answer: {}\n  now:           {}\n  first difference at byte {at}: golden …{}… now …{}…\n",
                want.answer,
                got.answer,
                excerpt(&want.answer, at),
                excerpt(&got.answer, at)
            );
        }
        return report + &bless;
    }
    format!(
        "golden answers `{scenario}`: {} calls recorded, the golden file has {} (next golden call: {})\n{bless}",
        recorded.len(),
        expected.len(),
        expected.get(recorded.len()).unwrap_or(&"none")
    )
}

/// About 40 characters of `text` around byte `at`.
fn excerpt(text: &str, at: usize) -> &str {
    let mut start = at.saturating_sub(20);
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (at + 20).min(text.len());
    while !text.is_char_boundary(end) {
        end += 1;
    }
    &text[start..end]
}

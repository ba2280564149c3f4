//! The layer rules of docs/architecture.md ("Invariants"), checked against the code: each rule line of that
//! section is parsed and checked, so the document and the code cannot drift apart.
//! - `` `src/X` never imports `a`, `b`. ``: no file under src/X names `crate::a` or `crate::b`.
//! - `` `crates/X` depends on none of `a`, `b`. ``: its Cargo.toml `[dependencies]` lists none of them.
//! - `` `crates/X` depends on no workspace crate but `a`, `b`. ``: every `path =` dependency is one of them.
//! - `` No import circle is longer than N files``: the file graph of `crate::`/`super::` paths (test code left
//!   out) of src/ and of every crate has no strongly connected component of more than N files, and none in
//!   src/dispatch spans two of its wings (its sub-directories).
//! - `` `src/dispatch/X` imports no part of `src/dispatch` but `a`, `b`. ``: in the same file graph, no file
//!   of the part X (a sub-directory) uses an item defined in another part than a or b, or in the dispatcher's
//!   own files above the parts, nor names another part in a path (a re-export does not launder it); every
//!   part has such a rule.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir` that is not test code (`tests.rs`, `*_tests.rs`, `tests/` directories).
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "tests" {
                    stack.push(path);
                }
            } else if name.ends_with(".rs")
                && name != "tests.rs"
                && !name.ends_with("_tests.rs")
                && !name.starts_with("faulty_")
            {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The file's text up to its test module (by house convention the last item of a file).
fn production_text(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let cut = text
        .find("#[cfg(test)]\nmod tests {")
        .or_else(|| text.find("#[cfg(test)]\n#[path"))
        .unwrap_or(text.len());
    // Line comments name paths in prose (`[`crate::x`]`): they are not imports.
    text[..cut]
        .lines()
        .filter(|line| {
            let line = line.trim_start();
            !line.starts_with("//")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path a file names, each as its segments (`crate::a::b::{c, d}` gives `crate a b c` and `crate a b d`).
/// Paths through one of the file's own child modules (`children`, as `use agent::X` names them) start with
/// `self`.
fn named_paths(text: &str, children: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &text[at..];
        let boundary = at == 0
            || !(bytes[at - 1].is_ascii_alphanumeric() || matches!(bytes[at - 1], b'_' | b':'));
        let rooted = ["crate::", "super::", "self::"]
            .iter()
            .any(|p| rest.starts_with(*p));
        let child = children
            .iter()
            .any(|c| rest.starts_with(c.as_str()) && rest[c.len()..].starts_with("::"));
        if boundary && (rooted || child) {
            let end = path_end(rest);
            let mut found = Vec::new();
            expand(&rest[..end], &mut found);
            for mut path in found {
                if child {
                    path.insert(0, "self".to_owned());
                }
                out.push(path);
            }
            at += end.max(1);
        } else {
            at += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}

/// The child modules a file declares (`mod x;`, `pub mod x;`, `pub(crate) mod x;`).
fn child_modules(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line
                .strip_prefix("pub(crate) ")
                .or_else(|| line.strip_prefix("pub "))
                .unwrap_or(line);
            let name = rest.strip_prefix("mod ")?.strip_suffix(';')?;
            (!name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_'))
                .then(|| name.to_owned())
        })
        .collect()
}

/// Where a path (with brace groups) starting at the beginning of `text` ends.
fn path_end(text: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            c if depth == 0 && !(c.is_alphanumeric() || c == '_' || c == ':') => return i,
            _ => {}
        }
    }
    text.len()
}

/// `a::b::{c, d::{e}}` → `[a b c] [a b d e]`.
fn expand(path: &str, out: &mut Vec<Vec<String>>) {
    let (head, group) = match path.find('{') {
        Some(open) => (
            &path[..open],
            Some(&path[open + 1..path.rfind('}').unwrap_or(path.len())]),
        ),
        None => (path, None),
    };
    let prefix: Vec<String> = head
        .split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let Some(group) = group else {
        out.push(prefix);
        return;
    };
    let mut depth = 0;
    let mut start = 0;
    let mut items = Vec::new();
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    for item in items {
        let item = item.split(" as ").next().unwrap_or(item).trim();
        if item.is_empty() {
            continue;
        }
        let mut inner = Vec::new();
        expand(item, &mut inner);
        for tail in inner {
            let mut full = prefix.clone();
            if tail != ["self"] {
                full.extend(tail);
            }
            out.push(full);
        }
    }
}

/// The module directory of a file: `src/a/mod.rs` and `src/a.rs` are module `a`, whose children live in `src/a/`.
fn module_dir(file: &Path) -> PathBuf {
    let name = file.file_stem().unwrap().to_string_lossy().into_owned();
    let parent = file.parent().unwrap();
    if name == "mod" || name == "lib" || name == "main" {
        parent.to_path_buf()
    } else {
        parent.join(name)
    }
}

/// The file a module path names, longest match first (`dir/a/b.rs`, `dir/a/b/mod.rs`, then `dir/a.rs` …),
/// else the module file of `dir` itself; with the segments left after the module path (the item).
fn locate(dir: &Path, segments: &[String], crate_src: &Path) -> Option<(PathBuf, Vec<String>)> {
    for len in (1..=segments.len()).rev() {
        let mut path = dir.to_path_buf();
        for seg in &segments[..len - 1] {
            path.push(seg);
        }
        let last = &segments[len - 1];
        for candidate in [
            path.join(format!("{last}.rs")),
            path.join(last).join("mod.rs"),
        ] {
            if candidate.is_file() {
                return Some((candidate, segments[len..].to_vec()));
            }
        }
    }
    module_file(dir, crate_src).map(|file| (file, segments.to_vec()))
}

/// The module file that holds the items of `dir` (its `mod.rs`, or the sibling `dir.rs`, or the crate root).
fn module_file(dir: &Path, crate_src: &Path) -> Option<PathBuf> {
    if dir == crate_src {
        return ["lib.rs", "main.rs"]
            .iter()
            .map(|f| dir.join(f))
            .find(|f| f.is_file());
    }
    let own = dir.join("mod.rs");
    if own.is_file() {
        return Some(own);
    }
    let sibling = dir.with_extension("rs");
    sibling.is_file().then_some(sibling)
}

/// A file's text without its re-exports (`pub use …;`), and the paths it re-exports.
fn split_reexports(text: &str) -> (String, Vec<Vec<String>>) {
    let children = child_modules(text);
    let mut kept = String::new();
    let mut reexported = Vec::new();
    let mut rest = text;
    loop {
        let next = ["pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .filter_map(|p| rest.find(p).map(|at| (at, p.len())))
            .min();
        let Some((at, len)) = next else {
            kept.push_str(rest);
            break;
        };
        kept.push_str(&rest[..at]);
        let end = rest[at..].find(';').map_or(rest.len(), |e| at + e);
        let statement = &rest[at + len..end];
        // `pub use foo::Bar` of an external crate `foo` names nothing of ours and adds nothing.
        reexported.extend(named_paths(statement, &children));
        rest = &rest[end..];
    }
    (kept, reexported)
}

/// Resolves `path` as written in `file` to the file that defines what it names, following re-exports.
fn resolve(
    file: &Path,
    path: &[String],
    crate_src: &Path,
    reexports: &BTreeMap<PathBuf, Vec<Vec<String>>>,
    depth: usize,
) -> Option<PathBuf> {
    let (dir, rest) = match path.first().map(String::as_str) {
        Some("crate") => (crate_src.to_path_buf(), &path[1..]),
        Some("self") => (module_dir(file), &path[1..]),
        Some("super") => {
            let mut dir = module_dir(file);
            let mut rest = path;
            while rest.first().map(String::as_str) == Some("super") {
                dir = dir.parent()?.to_path_buf();
                rest = &rest[1..];
            }
            (dir, rest)
        }
        _ => return None,
    };
    let (target, left) = locate(&dir, rest, crate_src)?;
    if depth < 8
        && let Some(item) = left.first()
        && let Some(via) = reexports
            .get(&target)
            .and_then(|paths| paths.iter().find(|p| p.last() == Some(item)))
    {
        return resolve(&target, via, crate_src, reexports, depth + 1).or(Some(target));
    }
    Some(target)
}

/// The files each file of the crate under `crate_src` uses items of (through `crate::`, `super::`, `self::`
/// and child-module paths; a re-export is followed to the file that defines the item, and is no use itself).
fn file_graph(crate_src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    file_graph_of(crate_src, true)
}

/// The files each file names as written: a path ends at the file it names first, re-exports not followed,
/// and a file's own re-exports count as uses (a wing that re-exports another wing's item names it).
fn written_graph(crate_src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    file_graph_of(crate_src, false)
}

fn file_graph_of(crate_src: &Path, follow: bool) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let files = sources(crate_src);
    let mut texts = BTreeMap::new();
    let mut reexports = BTreeMap::new();
    for file in &files {
        let (kept, reexported) = split_reexports(&production_text(file));
        texts.insert(file.clone(), kept);
        reexports.insert(file.clone(), reexported);
    }
    let mut graph = BTreeMap::new();
    for file in files {
        let text = &texts[&file];
        let children = child_modules(&std::fs::read_to_string(&file).unwrap());
        let mut paths = named_paths(text, &children);
        let targets = if follow {
            paths
                .iter()
                .filter_map(|path| resolve(&file, path, crate_src, &reexports, 0))
                .filter(|target| *target != file)
                .collect()
        } else {
            paths.extend(reexports[&file].iter().cloned());
            paths
                .iter()
                .filter_map(|path| resolve(&file, path, crate_src, &BTreeMap::new(), 0))
                .filter(|target| *target != file)
                .collect()
        };
        graph.insert(file, targets);
    }
    graph
}

/// Strongly connected components of more than one file (Tarjan).
fn circles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct Tarjan<'g> {
        graph: &'g BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'g PathBuf, (usize, usize)>,
        stack: Vec<&'g PathBuf>,
        on_stack: BTreeSet<&'g PathBuf>,
        next: usize,
        out: Vec<Vec<PathBuf>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g PathBuf) {
            self.index.insert(v, (self.next, self.next));
            self.next += 1;
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let Some((w, _)) = self.graph.get_key_value(w) else {
                    continue;
                };
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.index[w].1.min(self.index[v].1);
                    self.index.get_mut(v).unwrap().1 = low;
                } else if self.on_stack.contains(w) {
                    let low = self.index[w].0.min(self.index[v].1);
                    self.index.get_mut(v).unwrap().1 = low;
                }
            }
            if self.index[v].0 == self.index[v].1 {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.out.push(component);
                }
            }
        }
    }
    let mut tarjan = Tarjan {
        graph,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !tarjan.index.contains_key(v) {
            tarjan.visit(v);
        }
    }
    tarjan.out
}

/// The names between backquotes in `text`.
fn quoted(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The rule lines of docs/architecture.md's "Invariants" section.
fn rules() -> Vec<String> {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Invariants"))
        .expect("docs/architecture.md has an `## Invariants` section");
    section
        .lines()
        .filter_map(|line| line.strip_prefix("- "))
        .map(str::to_owned)
        .collect()
}

/// `[dependencies]` of a Cargo.toml: each dependency's name and whether it is a `path` (workspace) crate.
fn dependencies(manifest: &Path) -> Vec<(String, bool)> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if !inside || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let name = name.trim().trim_end_matches(".workspace").to_owned();
        out.push((name, value.contains("path =")));
    }
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn the_documented_layer_rules_hold() {
    let rules = rules();
    assert!(rules.len() >= 5, "too few rules parsed: {rules:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    for rule in &rules {
        let names = quoted(rule);
        let Some(subject) = names.first() else {
            continue;
        };
        if rule.contains("never imports") {
            checked += 1;
            for file in sources(&root().join(subject)) {
                for path in named_paths(&production_text(&file), &[]) {
                    if path.first().map(String::as_str) == Some("crate")
                        && let Some(module) = path.get(1)
                        && names[1..].contains(module)
                    {
                        broken.push(format!(
                            "{}: names crate::{module} ({rule})",
                            relative(&file)
                        ));
                    }
                }
            }
        } else if rule.contains("depends on none of") {
            checked += 1;
            for (dep, _) in dependencies(&root().join(subject).join("Cargo.toml")) {
                if names[1..].contains(&dep) {
                    broken.push(format!("{subject}/Cargo.toml: depends on {dep} ({rule})"));
                }
            }
        } else if rule.contains("depends on no workspace crate but") {
            checked += 1;
            for (dep, path) in dependencies(&root().join(subject).join("Cargo.toml")) {
                if path && !names[1..].contains(&dep) {
                    broken.push(format!("{subject}/Cargo.toml: depends on {dep} ({rule})"));
                }
            }
        }
    }
    assert!(checked >= 5, "rules parsed but not understood: {rules:?}");
    assert!(
        broken.is_empty(),
        "layer rules broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn import_circles_are_short_and_stay_inside_a_wing() {
    let rule = rules()
        .into_iter()
        .find(|r| r.starts_with("No import circle is longer than"))
        .expect("the import-circle rule is documented");
    let longest: usize = rule
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .expect("the rule names a number of files");
    let mut crate_srcs = vec![root().join("src")];
    for entry in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            crate_srcs.push(src);
        }
    }
    let dispatch = root().join("src/dispatch");
    let wing = |file: &Path| -> Option<String> {
        let rest = file.strip_prefix(&dispatch).ok()?;
        let first = rest
            .components()
            .next()?
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        rest.components().nth(1).map(|_| first)
    };
    let mut broken = Vec::new();
    for src in crate_srcs {
        for circle in circles(&file_graph(&src)) {
            let names: Vec<String> = circle.iter().map(|f| relative(f)).collect();
            if circle.len() > longest {
                broken.push(format!("{} files: {}", circle.len(), names.join(" ")));
            }
            let wings: BTreeSet<String> = circle.iter().filter_map(|f| wing(f)).collect();
            if wings.len() > 1 {
                broken.push(format!("across wings {wings:?}: {}", names.join(" ")));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "import circles ({rule}):\n{}",
        broken.join("\n")
    );
}

/// The part of `container` a file belongs to: its sub-directory, or `None` for the files directly in it (the
/// dispatcher's own) and files outside it.
fn part_of(container: &Path, file: &Path) -> Option<String> {
    let rest = file.strip_prefix(container).ok()?;
    let first = rest.components().next()?.as_os_str().to_string_lossy();
    rest.components().nth(1).map(|_| first.into_owned())
}

/// The uses that break "`subject` imports no part of `container` but `allowed`": a file of part `subject`
/// that uses an item defined in another part not allowed or directly in `container` (`defined`: re-exports
/// followed), or that names such a part in a path, even one that reaches an allowed part through a
/// re-export (`written`).
fn direction_breaks(
    defined: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
    written: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
    container: &Path,
    subject: &str,
    allowed: &[String],
) -> Vec<String> {
    let ok = |part: Option<String>, top_level_ok: bool| match part {
        Some(part) => part == subject || allowed.contains(&part),
        None => top_level_ok,
    };
    let mut broken = BTreeSet::new();
    for (graph, top_level_ok) in [(defined, false), (written, true)] {
        for (file, targets) in graph {
            if part_of(container, file).as_deref() != Some(subject) {
                continue;
            }
            for target in targets.iter().filter(|t| t.starts_with(container)) {
                if !ok(part_of(container, target), top_level_ok) {
                    broken.insert(format!("{} uses {}", relative(file), relative(target)));
                }
            }
        }
    }
    broken.into_iter().collect()
}

#[test]
fn the_dispatch_parts_import_one_way() {
    let rules: Vec<(String, Vec<String>)> = rules()
        .iter()
        .filter(|rule| rule.contains(" imports no part of "))
        .map(|rule| {
            let names = quoted(rule);
            assert!(names.len() >= 2, "a subject and a container: {rule}");
            (rule.clone(), names)
        })
        .collect();
    let mut broken = Vec::new();
    let src = root().join("src");
    let (defined, written) = (file_graph(&src), written_graph(&src));
    let mut covered: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    for (rule, names) in &rules {
        let container = root().join(&names[1]);
        let subject = Path::new(&names[0])
            .strip_prefix(&names[1])
            .unwrap_or_else(|_| panic!("the subject is a part of the container: {rule}"))
            .to_string_lossy()
            .into_owned();
        assert!(container.join(&subject).is_dir(), "no such part: {rule}");
        covered
            .entry(container.clone())
            .or_default()
            .insert(subject.clone());
        for found in direction_breaks(&defined, &written, &container, &subject, &names[2..]) {
            broken.push(format!("{found} ({rule})"));
        }
    }
    let dispatch = root().join("src/dispatch");
    let parts: BTreeSet<String> = std::fs::read_dir(&dispatch)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n != "tests"))
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        covered.get(&dispatch).cloned().unwrap_or_default(),
        parts,
        "every part of src/dispatch has a direction rule in docs/architecture.md"
    );
    assert!(
        broken.is_empty(),
        "dispatch parts import against their direction:\n{}",
        broken.join("\n")
    );
}

#[test]
fn a_use_against_the_direction_is_reported() {
    let container = root().join("src/dispatch");
    let file = |part: &str, name: &str| container.join(part).join(name);
    let status = file("fleet", "status.rs");
    let defined = BTreeMap::from([(
        status.clone(),
        BTreeSet::from([
            file("floor", "records.rs"),
            file("fleet", "mod.rs"),
            file("licence", "verdicts.rs"),
            container.join("mod.rs"),
        ]),
    )]);
    // As written: `crate::dispatch::X` (the dispatcher's re-export) is fine; `licence::Y` is not, even when
    // licence only re-exports the floor's Y.
    let written = BTreeMap::from([(
        status.clone(),
        BTreeSet::from([container.join("mod.rs"), file("licence", "mod.rs")]),
    )]);
    let floor_only = ["floor".to_string()];
    assert_eq!(
        direction_breaks(&defined, &written, &container, "fleet", &floor_only),
        [
            "src/dispatch/fleet/status.rs uses src/dispatch/licence/mod.rs",
            "src/dispatch/fleet/status.rs uses src/dispatch/licence/verdicts.rs",
            "src/dispatch/fleet/status.rs uses src/dispatch/mod.rs",
        ]
    );
    let with_licence = ["floor".to_string(), "licence".to_string()];
    assert_eq!(
        direction_breaks(&defined, &written, &container, "fleet", &with_licence),
        ["src/dispatch/fleet/status.rs uses src/dispatch/mod.rs"]
    );
}

#[test]
fn the_path_reader_sees_groups_and_nested_paths() {
    let source =
        "mod kid;\nuse super::{a::B, c::{d, e::F as G}};\nlet x = crate::m::n(1);\nuse kid::Y;";
    let paths = named_paths(source, &child_modules(source));
    let text: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        text,
        [
            "super::a::B",
            "super::c::d",
            "super::c::e::F",
            "crate::m::n",
            "self::kid::Y"
        ]
    );
    let mut graph = BTreeMap::new();
    let (a, b, c) = (PathBuf::from("a"), PathBuf::from("b"), PathBuf::from("c"));
    graph.insert(a.clone(), BTreeSet::from([b.clone()]));
    graph.insert(b.clone(), BTreeSet::from([c.clone()]));
    graph.insert(c.clone(), BTreeSet::from([a.clone()]));
    assert_eq!(circles(&graph), vec![vec![a, b, c]]);
}

// ---------------------------------------------------------------- the agent's floor plan
// The rules of docs/architecture.md's "Agent invariants" list, over the folders of crates/agent/src.

/// The rule lines of docs/architecture.md's "Agent invariants" list.
fn agent_rules() -> Vec<String> {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let section = doc
        .split("\n### ")
        .find(|s| s.starts_with("Agent invariants"))
        .expect("docs/architecture.md has an `### Agent invariants` list");
    let section = section.split("\n#").next().unwrap_or(section);
    section
        .lines()
        .filter_map(|line| line.strip_prefix("- "))
        .map(str::to_owned)
        .collect()
}

/// The folder of `src` a file belongs to: its first directory under `src`, or the file's own name for a file
/// directly in `src` (a toolbox module).
fn agent_folder(src: &Path, file: &Path) -> String {
    let first = file
        .strip_prefix(src)
        .unwrap()
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    first.strip_suffix(".rs").unwrap_or(&first).to_owned()
}

/// A file's production text: everything before its test module (by house convention the last item of a file).
fn production_part(text: &str) -> &str {
    let cut = text
        .find("#[cfg(test)]\nmod tests")
        .or_else(|| text.find("#[cfg(test)]\n#[path"))
        .unwrap_or(text.len());
    &text[..cut]
}

/// What breaks the rules of the agent's floor plan in the sources under `src`, one line each.
fn agent_floor_plan_broken(rules: &[String], base: &Path) -> (usize, Vec<String>) {
    let mut broken = Vec::new();
    let mut checked = 0;
    for rule in rules {
        let names = quoted(rule);
        let Some(subject) = names.first() else {
            continue;
        };
        let src = base.join(subject);
        if !src.is_dir() {
            broken.push(format!("{subject} is not a folder ({rule})"));
            continue;
        }
        if rule.contains("never imports") {
            checked += 1;
            let (banned, allowed) = rule.split_once(" but from ").unwrap_or((rule, ""));
            let banned = &quoted(banned)[1..];
            let allowed = quoted(allowed);
            for file in sources(&src) {
                let name = file.strip_prefix(&src).unwrap().display().to_string();
                if allowed.contains(&name) {
                    continue;
                }
                for path in named_paths(&production_text(&file), &[]) {
                    if path.first().map(String::as_str) == Some("crate")
                        && let Some(module) = path.get(1)
                        && banned.contains(module)
                        && !file.starts_with(src.join(module))
                    {
                        broken.push(format!(
                            "{}: names crate::{module} ({rule})",
                            relative(&file)
                        ));
                    }
                }
            }
        } else if rule.contains("no import circle between its folders") {
            checked += 1;
            let mut folders: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
            for (file, targets) in file_graph(&src) {
                if file.parent() == Some(src.as_path())
                    && matches!(
                        file.file_name().and_then(|n| n.to_str()),
                        Some("lib.rs" | "main.rs")
                    )
                {
                    continue;
                }
                let from = PathBuf::from(agent_folder(&src, &file));
                let uses = folders.entry(from.clone()).or_default();
                for target in targets {
                    let to = PathBuf::from(agent_folder(&src, &target));
                    if to != from && !matches!(to.to_str(), Some("lib" | "main")) {
                        uses.insert(to);
                    }
                }
            }
            for circle in circles(&folders) {
                let names: Vec<String> = circle.iter().map(|f| f.display().to_string()).collect();
                broken.push(format!(
                    "folders import one another: {} ({rule})",
                    names.join(" ")
                ));
            }
        } else if rule.contains("no production file longer than") {
            checked += 1;
            let longest: usize = rule
                .split_whitespace()
                .find_map(|w| w.parse().ok())
                .expect("the rule names a number of lines");
            for file in sources(&src) {
                let text = std::fs::read_to_string(&file).unwrap();
                let lines = production_part(&text).lines().count();
                if lines > longest {
                    broken.push(format!(
                        "{}: {lines} production lines ({rule})",
                        relative(&file)
                    ));
                }
            }
        }
    }
    (checked, broken)
}

#[test]
fn the_agent_keeps_its_floor_plan() {
    let rules = agent_rules();
    let (checked, broken) = agent_floor_plan_broken(&rules, &root());
    assert_eq!(checked, 5, "every agent rule is understood: {rules:?}");
    assert!(
        broken.is_empty(),
        "the agent's floor plan is broken:\n{}",
        broken.join("\n")
    );
}

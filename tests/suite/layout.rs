//! The layout tells the architecture, and stays so. In every crate of the workspace (the
//! service's library and binary, and each crate under `crates/`), the modules that share a
//! parent import one another in one direction only: no cycle among siblings, at any depth,
//! outside test code. And the crates depend in the direction docs/design.md §1 claims.
//!
//! What counts as a module importing another: any path that names it, however spelled —
//! `crate::a::X`, grouped (`use crate::{a::X, b}`), relative to the parent (`super::b::Y`,
//! `super::super::c`) or to the module itself (`self::d`) — and a name the parent re-exports
//! from a child (`use super::Reason` where the parent says `pub use reason::Reason`) counts as
//! that child. A module's use of its own parent or children is not an edge (a parent declares
//! and re-exports its children); glob imports (`use super::*`) are not resolved. Comments,
//! string literals and `#[cfg(test)]` items are left out: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module, as its path from the crate root (`["checkout", "decide"]`; the root is `[]`).
type ModPath = Vec<String>;

/// Edges among the children of each parent module: parent → (child → children it imports).
type Graphs = BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>>;

/// `text` without comments and literals (each replaced by a space, and the newlines it spanned,
/// so what is left keeps its lines): what the compiler reads as paths, and only that.
fn code_of(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    // Blanks `chars[from..to]`: one space, and its newlines.
    let blank = |out: &mut String, from: usize, to: usize| {
        out.push(' ');
        let newlines = chars[from..to.min(chars.len())]
            .iter()
            .filter(|c| **c == '\n');
        out.extend(newlines);
    };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            blank(&mut out, start, i);
        } else if c == 'r'
            && !ident_char(if i == 0 { ' ' } else { chars[i - 1] })
            && (at(i + 1) == '"' || at(i + 1) == '#')
        {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            if at(j) != '"' {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < chars.len() {
                if chars[j] == '"' && (1..=hashes).all(|k| at(j + k) == '#') {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
            blank(&mut out, start, i);
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            blank(&mut out, start, i);
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{1F600}'); otherwise a lifetime, kept.
            if at(i + 1) == '\\' {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push(' ');
            } else if at(i + 2) == '\'' {
                i += 3;
                out.push(' ');
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `code` without its `#[cfg(test)]` items (a test module, a test-only `use` or `mod`).
fn without_tests(code: &str) -> String {
    let mut code = code.to_owned();
    while let Some(start) = code.find("#[cfg(test)]") {
        let bytes = code.as_bytes();
        let mut end = start + "#[cfg(test)]".len();
        // Up to the item's `;`, or through its `{ … }`.
        while end < bytes.len() && bytes[end] != b';' && bytes[end] != b'{' {
            end += 1;
        }
        if end < bytes.len() && bytes[end] == b'{' {
            let mut depth = 0;
            while end < bytes.len() {
                match bytes[end] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                end += 1;
            }
        }
        // Blanked, keeping its newlines: lines keep their numbers.
        let end = (end + 1).min(code.len());
        let newlines = "\n".repeat(code[start..end].matches('\n').count());
        code.replace_range(start..end, &format!(" {newlines}"));
    }
    code
}

/// A path as written, its segments with the last one's alias (`X as Y`: `Y`), from a start at
/// byte `i` of `code`; a group (`{a, b::{c, d}}`) gives one path per leaf.
fn use_tree(
    code: &[u8],
    mut i: usize,
    prefix: Vec<String>,
    found: &mut Vec<(Vec<String>, String)>,
) {
    let skip_ws = |mut i: usize| {
        while i < code.len() && code[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    i = skip_ws(i);
    if i < code.len() && code[i] == b'{' {
        i += 1;
        loop {
            i = skip_ws(i);
            if i >= code.len() || code[i] == b'}' {
                return;
            }
            use_tree(code, i, prefix.clone(), found);
            // On to the next item of this group: past the item's own nested groups.
            let mut depth = 0;
            while i < code.len() {
                match code[i] {
                    b'{' => depth += 1,
                    b'}' if depth == 0 => return,
                    b'}' => depth -= 1,
                    b',' if depth == 0 => break,
                    _ => {}
                }
                i += 1;
            }
            i += 1;
        }
    }
    if i < code.len() && code[i] == b'*' {
        found.push((prefix, "*".to_owned()));
        return;
    }
    let start = i;
    while i < code.len() && (code[i].is_ascii_alphanumeric() || code[i] == b'_') {
        i += 1;
    }
    if start == i {
        return;
    }
    let segment = String::from_utf8_lossy(&code[start..i]).into_owned();
    let j = skip_ws(i);
    if code[j..].starts_with(b"::") {
        let mut prefix = prefix;
        prefix.push(segment);
        use_tree(code, j + 2, prefix, found);
        return;
    }
    let mut name = segment.clone();
    if code[j..].starts_with(b"as ") {
        let k = skip_ws(j + 2);
        let end = (k..code.len())
            .find(|&e| !(code[e].is_ascii_alphanumeric() || code[e] == b'_'))
            .unwrap_or(code.len());
        name = String::from_utf8_lossy(&code[k..end]).into_owned();
    }
    let mut path = prefix;
    if segment != "self" {
        path.push(segment);
    }
    found.push((path, name));
}

/// Every path of `code` that starts at `crate::`, `super::` or `self::`, each with the name it
/// binds if it is the leaf of a `use`.
fn paths(code: &str) -> Vec<(Vec<String>, String)> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    for root in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(root) {
            let before = at.checked_sub(1).map(|b| bytes[b]);
            if before
                .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b':')
            {
                continue;
            }
            let head = root.trim_end_matches("::").to_owned();
            use_tree(bytes, at + root.len(), vec![head], &mut found);
        }
    }
    found
}

/// The `pub use` declarations of `code` (also `pub(crate)`, `pub(super)`): each name it
/// re-exports and the path it comes from.
fn reexports(code: &str) -> Vec<(Vec<String>, String)> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("pub") {
        let at = from + at;
        from = at + 3;
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
            continue;
        }
        let mut i = at + 3;
        if bytes.get(i) == Some(&b'(') {
            while i < bytes.len() && bytes[i] != b')' {
                i += 1;
            }
            i += 1;
        }
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if code[i..].starts_with("use ") {
            use_tree(bytes, i + 4, Vec::new(), &mut found);
        }
    }
    found
}

/// The modules `mod` declarations in `code` name (`mod x;`, `pub mod x;`), each with the line
/// of its `#[path = "…"]` attribute if it has one (the attribute's string is blanked in `code`:
/// the caller reads it from the original text, whose lines `code` keeps). Inline modules
/// (`mod x { … }`) are part of their file.
fn declared(code: &str) -> Vec<(String, Option<usize>)> {
    let mut found = Vec::new();
    let lines: Vec<&str> = code.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        let line = line.trim();
        let rest = line
            .strip_prefix("pub ")
            .or_else(|| line.strip_prefix("pub(crate) "))
            .or_else(|| line.strip_prefix("pub(super) "))
            .unwrap_or(line);
        let Some(name) = rest.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) else {
            continue;
        };
        let path_attr = n
            .checked_sub(1)
            .filter(|above| lines[*above].trim().starts_with("#[path"));
        found.push((name.trim().to_owned(), path_attr));
    }
    found
}

/// One crate target's modules: each module's path and the code of its file.
struct Crate {
    modules: BTreeMap<ModPath, String>,
}

impl Crate {
    /// The modules reached from `root` (`src/lib.rs`, `src/main.rs`) through `mod` declarations,
    /// read by `read`.
    fn load(root: &Path, read: &dyn Fn(&Path) -> Option<String>) -> Self {
        let mut modules = BTreeMap::new();
        let mut todo = vec![(Vec::new(), root.to_path_buf())];
        while let Some((path, file)) = todo.pop() {
            let text =
                read(&file).unwrap_or_else(|| panic!("{} is declared but unread", file.display()));
            let code = without_tests(&code_of(&text));
            let dir = file.parent().unwrap().to_path_buf();
            let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
            // Where `mod x;` of this file looks: beside a mod.rs, lib.rs or main.rs; in a
            // directory named after any other file.
            let children_dir = if matches!(stem.as_str(), "mod" | "lib" | "main") {
                dir.clone()
            } else {
                dir.join(&stem)
            };
            let original: Vec<&str> = text.lines().collect();
            for (name, path_attr) in declared(&code) {
                let mut child = path.clone();
                child.push(name.clone());
                let child_file = match path_attr {
                    // Relative to the directory of the file that declares it.
                    Some(line) => {
                        let quoted = original[line].split('"').nth(1).expect("#[path = \"…\"]");
                        dir.join(quoted)
                    }
                    None => {
                        let flat = children_dir.join(format!("{name}.rs"));
                        if read(&flat).is_some() {
                            flat
                        } else {
                            children_dir.join(&name).join("mod.rs")
                        }
                    }
                };
                todo.push((child, child_file));
            }
            modules.insert(path, code);
        }
        Self { modules }
    }

    /// The module `path` leads to from `from` (a file's module), as far as it names modules,
    /// following its parents' re-exports of a child's names; `None` if it leaves the crate
    /// (an extern crate's path) or names no module.
    fn resolve(&self, from: &[String], path: &[String]) -> Option<ModPath> {
        let (first, rest) = path.split_first()?;
        let mut at: ModPath = match first.as_str() {
            "crate" => Vec::new(),
            "self" => from.to_vec(),
            "super" => from[..from.len().checked_sub(1)?].to_vec(),
            _ => return None,
        };
        let mut rest = rest;
        while rest.first().is_some_and(|s| s == "super") {
            at.pop()?;
            rest = &rest[1..];
        }
        self.walk(at, rest, 0)
    }

    /// From module `at`, down the segments of `rest` that are modules or re-exported names.
    fn walk(&self, mut at: ModPath, rest: &[String], depth: usize) -> Option<ModPath> {
        for segment in rest {
            let mut child = at.clone();
            child.push(segment.clone());
            if self.modules.contains_key(&child) {
                at = child;
                continue;
            }
            if depth < 8
                && let Some(source) = self.reexported(&at, segment, depth)
            {
                return Some(source);
            }
            break;
        }
        Some(at)
    }

    /// The module that module `at` re-exports `name` from, if it re-exports it from another.
    fn reexported(&self, at: &ModPath, name: &str, depth: usize) -> Option<ModPath> {
        let code = self.modules.get(at)?;
        for (path, bound) in reexports(code) {
            if bound != name || path.is_empty() {
                continue;
            }
            let from = &path[..path.len() - 1];
            let child = |name: &str| [at.as_slice(), &[name.to_owned()]].concat();
            let source = match from.first().map(String::as_str) {
                Some("crate" | "super" | "self") => self.resolve(at, from)?,
                // Relative to `at`: a child's path (anything else is another crate's).
                Some(name) if self.modules.contains_key(&child(name)) => {
                    self.walk(at.clone(), from, depth + 1)?
                }
                _ => continue,
            };
            if &source != at {
                return Some(source);
            }
        }
        None
    }

    /// The imports among each parent's children.
    fn graphs(&self) -> Graphs {
        let mut graphs: Graphs = BTreeMap::new();
        for (module, code) in &self.modules {
            // Every parent has a graph, even without edges.
            graphs.entry(module.clone()).or_default();
            if let Some((name, parent)) = module.split_last() {
                graphs
                    .entry(parent.to_vec())
                    .or_default()
                    .entry(name.clone())
                    .or_default();
            }
            for (path, _) in paths(code) {
                let Some(target) = self.resolve(module, &path) else {
                    continue;
                };
                let common = module
                    .iter()
                    .zip(&target)
                    .take_while(|(a, b)| a == b)
                    .count();
                // Itself, an ancestor or a descendant: no edge between siblings.
                if common == module.len() || common == target.len() {
                    continue;
                }
                graphs
                    .entry(module[..common].to_vec())
                    .or_default()
                    .entry(module[common].clone())
                    .or_default()
                    .insert(target[common].clone());
            }
        }
        graphs
    }
}

/// A cycle through `graph`, if there is one, as the modules along it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Every cycle among siblings in `krate`: the parent (`crate` for the root) and the cycle.
fn cycles(krate: &Crate) -> Vec<String> {
    krate
        .graphs()
        .iter()
        .filter_map(|(parent, graph)| {
            let cycle = cycle(graph)?;
            let parent = if parent.is_empty() {
                "crate".to_owned()
            } else {
                format!("crate::{}", parent.join("::"))
            };
            Some(format!("in {parent}: {}", cycle.join(" → ")))
        })
        .collect()
}

/// The workspace's root.
fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every crate target of the workspace: the service's library and binary, and each member's
/// library and binary, by a name for messages.
fn targets() -> Vec<(String, PathBuf)> {
    let root = workspace();
    let mut packages = vec![("checkout".to_owned(), root.clone())];
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("Cargo.toml").exists() {
            packages.push((dir.file_name().unwrap().to_string_lossy().into_owned(), dir));
        }
    }
    let mut targets = Vec::new();
    for (name, dir) in packages {
        for (kind, file) in [("lib", "src/lib.rs"), ("bin", "src/main.rs")] {
            let path = dir.join(file);
            if path.exists() {
                targets.push((format!("{name} ({kind})"), path));
            }
        }
    }
    targets
}

fn read_disk(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Within every crate of the workspace, no modules that share a parent import each other,
/// directly or around a loop, at any depth: `config` gathers policies from the modules that
/// use them, the checkout's rules are below its flow, the stubs' data below their services.
#[test]
fn every_crates_modules_import_in_one_direction() {
    let targets = targets();
    assert!(targets.len() >= 8, "{targets:?}");
    let mut found = Vec::new();
    for (name, root) in &targets {
        let krate = Crate::load(root, &read_disk);
        found.extend(cycles(&krate).into_iter().map(|c| format!("{name}: {c}")));
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

/// The service's library is read whole: its top-level modules are all there, with the edges
/// that make its layering (the flow reads the rules, the worker the checkout's rules, `config`
/// the modules whose policies it gathers), and the command line is the binary's alone.
#[test]
fn the_service_library_is_read_whole() {
    let lib = Crate::load(&workspace().join("src/lib.rs"), &read_disk);
    let graphs = lib.graphs();
    let top = &graphs[&Vec::new()];
    for module in [
        "checkout",
        "store",
        "worker",
        "config",
        "server",
        "downstream",
    ] {
        assert!(top.contains_key(module), "{module} missing: {top:?}");
    }
    assert!(
        !top.contains_key("cli"),
        "the command line is the binary's: {top:?}"
    );
    for (from, to) in [
        ("config", "worker"),
        ("config", "store"),
        ("worker", "checkout"),
    ] {
        assert!(top[from].contains(to), "{from} → {to} not seen: {top:#?}");
    }
    let checkout = &graphs[&vec!["checkout".to_owned()]];
    assert!(checkout["flow"].contains("decide"), "{checkout:#?}");
    // Through the parent's re-exports: `use super::{Held, Verdict}` is the verdict module.
    assert!(checkout["decide"].contains("verdict"), "{checkout:#?}");
}

/// The member crates are read whole too, down to their nested modules and the files a
/// `#[path]` names: the edges that make their layering are seen.
#[test]
fn the_member_crates_are_read_whole() {
    let load = |file: &str| Crate::load(&workspace().join(file), &read_disk);
    let edge = |krate: &Crate, parent: &[&str], from: &str, to: &str| {
        let graphs = krate.graphs();
        let parent: ModPath = parent.iter().map(|s| (*s).to_owned()).collect();
        let graph = &graphs[&parent];
        assert!(
            graph[from].contains(to),
            "{from} → {to} not seen: {graph:#?}"
        );
    };
    let stubs = load("crates/checkout-stubs/src/lib.rs");
    edge(&stubs, &[], "state", "ledger");
    edge(&stubs, &[], "handler", "applied");
    edge(&stubs, &[], "ledger", "applied");
    let telemetry = load("crates/checkout-telemetry/src/lib.rs");
    edge(&telemetry, &[], "trace", "spans");
    edge(&telemetry, &[], "server", "trace");
    let bench = load("crates/checkout-bench/src/lib.rs");
    edge(&bench, &["scenario"], "rig", "poll");
    let testkit = load("crates/checkout-testkit/src/lib.rs");
    assert!(testkit.modules.contains_key(&vec!["poll".to_owned()]));
}

/// The workspace crates each crate depends on (normal dependencies; tests and build scripts
/// may reach further), as `Cargo.toml` lists them.
fn workspace_dependencies(manifest: &str) -> BTreeSet<String> {
    let mut section = String::new();
    let mut found = BTreeSet::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line.to_owned();
            continue;
        }
        let normal = section == "[dependencies]"
            || (section.starts_with("[target.") && section.ends_with(".dependencies]"));
        if !normal {
            continue;
        }
        let name = line.split(['.', '=', ' ']).next().unwrap_or_default();
        if name == "checkout" || name.starts_with("checkout-") {
            found.insert(name.to_owned());
        }
    }
    found
}

/// What docs/design.md §1 says each crate may depend on within the workspace: the generated
/// code and telemetry on nothing of it; the stubs on those two; the service on the stubs,
/// telemetry and the generated code; the client on the generated code alone; the testkit and
/// the bench on the service and anything below it, never on each other.
fn allowed_dependencies() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    let below_the_service = [
        "checkout",
        "checkout-client",
        "checkout-proto",
        "checkout-stubs",
        "checkout-telemetry",
    ];
    [
        ("checkout-proto", vec![]),
        ("checkout-telemetry", vec![]),
        (
            "checkout-stubs",
            vec!["checkout-proto", "checkout-telemetry"],
        ),
        ("checkout-client", vec!["checkout-proto"]),
        (
            "checkout",
            vec!["checkout-proto", "checkout-stubs", "checkout-telemetry"],
        ),
        ("checkout-testkit", below_the_service.to_vec()),
        (
            "checkout-bench",
            [below_the_service.as_slice(), &["checkout-testkit"]].concat(),
        ),
    ]
    .into_iter()
    .map(|(name, deps)| (name, deps.into_iter().collect()))
    .collect()
}

/// The dependencies of each crate (by name) the rules forbid: a crate not in the rules at all,
/// or a workspace dependency it is not allowed.
fn forbidden(
    manifests: &BTreeMap<String, BTreeSet<String>>,
    allowed: &BTreeMap<&str, BTreeSet<&str>>,
) -> Vec<String> {
    let mut found = Vec::new();
    for (name, deps) in manifests {
        let Some(may) = allowed.get(name.as_str()) else {
            found.push(format!("{name}: not placed in the layering"));
            continue;
        };
        for dep in deps {
            if !may.contains(dep.as_str()) {
                found.push(format!("{name} depends on {dep}"));
            }
        }
    }
    found
}

/// The crates depend in the direction docs/design.md claims (the client on the generated code
/// alone; nothing below the service on the service).
#[test]
fn the_crates_depend_downward_as_the_design_says() {
    let root = workspace();
    let mut manifests = BTreeMap::new();
    let packages = std::iter::once(root.clone()).chain(
        std::fs::read_dir(root.join("crates"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|d| d.join("Cargo.toml").exists()),
    );
    for dir in packages {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let name = manifest
            .lines()
            .skip_while(|l| l.trim() != "[package]")
            .find_map(|l| l.trim().strip_prefix("name = "))
            .expect("a package name")
            .trim_matches('"')
            .to_owned();
        manifests.insert(name, workspace_dependencies(&manifest));
    }
    assert_eq!(
        manifests.len(),
        allowed_dependencies().len(),
        "{manifests:?}"
    );
    assert_eq!(
        manifests["checkout-client"],
        BTreeSet::from(["checkout-proto".to_owned()])
    );
    let found = forbidden(&manifests, &allowed_dependencies());
    assert!(found.is_empty(), "{found:#?}");
}

// -------------------------------------------------------------------------------------------
// The checkers fail when they should.

/// A crate made of `files` (path → text), rooted at `lib.rs`.
fn synthetic(files: &[(&str, &str)]) -> Crate {
    let files: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(path, text)| (PathBuf::from("/x/src").join(path), (*text).to_owned()))
        .collect();
    Crate::load(Path::new("/x/src/lib.rs"), &|path| files.get(path).cloned())
}

/// The cycle finder finds a cycle when there is one.
#[test]
fn a_cycle_is_found_when_there_is_one() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

/// Every spelling of an import is seen: a grouped `use crate::{…}`, a path written inline, a
/// `super::` path to a sibling (also from two levels down), and a name the parent re-exports
/// from a child; test code, comments and strings are not imports.
#[test]
fn every_spelling_of_a_cycle_is_found() {
    let grouped = synthetic(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::{b::{X, Y as Z}, c};\n"),
        ("b.rs", "fn f() -> crate::a::Q { todo!() }\n"),
    ]);
    assert_eq!(cycles(&grouped), ["in crate: a → b → a"]);

    let siblings = synthetic(&[
        ("lib.rs", "pub mod m;\n"),
        ("m/mod.rs", "mod a;\nmod b;\nmod c;\n"),
        ("m/a.rs", "use super::b::X;\n"),
        ("m/b.rs", "use super::c;\n"),
        ("m/c.rs", "mod deep;\n"),
        ("m/c/deep.rs", "use super::super::a::Y;\n"),
    ]);
    assert_eq!(cycles(&siblings), ["in crate::m: a → b → c → a"]);

    let reexported = synthetic(&[
        ("lib.rs", "mod m;\n"),
        (
            "m/mod.rs",
            "mod a;\nmod b;\npub use a::{Held, Verdict as V};\n",
        ),
        ("m/a.rs", "use super::b::Rules;\n"),
        ("m/b.rs", "use super::{V, Other};\n"),
    ]);
    assert_eq!(cycles(&reexported), ["in crate::m: a → b → a"]);

    let not_imports = synthetic(&[
        ("lib.rs", "mod a;\nmod b;\n#[cfg(test)]\nmod poll;\n"),
        ("a.rs", "use crate::b::X;\n"),
        (
            "b.rs",
            "// crate::a::Y\nconst S: &str = \"crate::a::Z\";\n/* use crate::a::W; */\n\
             #[cfg(test)]\nmod tests {\n    use crate::a::T;\n}\n",
        ),
    ]);
    assert_eq!(cycles(&not_imports), Vec::<String>::new());
    assert!(!not_imports.modules.contains_key(&vec!["poll".to_owned()]));
}

/// The dependency check refuses a crate below the service that depends on it, and a crate the
/// layering does not place.
#[test]
fn a_dependency_against_the_layering_is_refused() {
    let manifest = "[package]\nname = \"checkout-client\"\n\n[dependencies]\n\
                    checkout-proto.workspace = true\ncheckout = { workspace = true }\n\n\
                    [dev-dependencies]\ncheckout-testkit.workspace = true\n";
    let deps = workspace_dependencies(manifest);
    assert_eq!(
        deps,
        BTreeSet::from(["checkout".to_owned(), "checkout-proto".to_owned()]),
        "dev-dependencies are not counted"
    );
    let manifests = BTreeMap::from([
        ("checkout-client".to_owned(), deps),
        ("checkout-new".to_owned(), BTreeSet::new()),
    ]);
    assert_eq!(
        forbidden(&manifests, &allowed_dependencies()),
        [
            "checkout-client depends on checkout",
            "checkout-new: not placed in the layering"
        ]
    );
}

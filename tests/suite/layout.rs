//! The layout tells the architecture, and stays so: the service's top-level modules import
//! one another in one direction only (no cycle among `crate::…` references outside tests), and
//! the crates under `crates/` depend downward (the client on the generated code alone).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    found
}

/// `text` without its `#[cfg(test)]` module (tests may reach anywhere).
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at])
}

/// The top-level modules of `src/` each module's code names as `crate::<module>`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" || name == "main" || path.extension().is_some_and(|e| e != "rs") {
            continue;
        }
        let files = if path.is_dir() {
            sources(&path)
        } else {
            vec![path]
        };
        modules.insert(name, files);
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (name, files) in &modules {
        let mut uses = BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(file).unwrap();
            for (at, _) in without_tests(&text).match_indices("crate::") {
                let rest = &text[at + "crate::".len()..];
                let used: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if names.contains(&used) && &used != name {
                    uses.insert(used);
                }
            }
        }
        graph.insert(name.clone(), uses);
    }
    graph
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
        for next in &graph[node] {
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

/// No two of the service's modules import each other, directly or around a loop: `config`
/// gathers policies from the modules that use them, telemetry and the generated code are
/// crates below the service.
#[test]
fn the_services_modules_import_in_one_direction() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(
        graph.contains_key("checkout") && graph.contains_key("store"),
        "{graph:?}"
    );
    assert_eq!(
        cycle(&graph),
        None,
        "an import cycle among src/'s modules: {graph:#?}"
    );
}

/// The checker finds a cycle when there is one (so the test above can fail).
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

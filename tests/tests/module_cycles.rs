//! Imports point one way: within each crate of the workspace, the top-level
//! modules (a file `src/<m>.rs` or a directory `src/<m>/`) form no cycle.
//! A module's references to another are its `crate::<m>` paths and the
//! `super::` paths that climb to the crate root, outside comments and
//! outside its `#[cfg(test)]` part (tests may reach anywhere).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level modules of `src` and the files of each.
fn modules(src: &Path) -> BTreeMap<String, Vec<(PathBuf, usize)>> {
    let mut out: BTreeMap<String, Vec<(PathBuf, usize)>> = BTreeMap::new();
    for e in std::fs::read_dir(src).expect("read src").flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            let mut files = Vec::new();
            walk(&p, 1, &mut files);
            out.insert(name, files);
        } else if let Some(m) = name.strip_suffix(".rs") {
            if m != "lib" && m != "main" {
                out.entry(m.to_string()).or_default().push((p, 0));
            }
        }
    }
    out
}

/// Every `.rs` file under `dir` with how many `super::` climb from it to
/// the crate root (`src/m/mod.rs` and `src/m/x.rs` are one level down: a
/// `mod.rs` is its directory's module).
fn walk(dir: &Path, depth: usize, out: &mut Vec<(PathBuf, usize)>) {
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, depth + 1, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let climb = if p.file_name().is_some_and(|n| n == "mod.rs") { depth - 1 } else { depth };
            out.push((p, climb));
        }
    }
}

/// The top-level modules `text` (a file `climb` levels below the root)
/// refers to.
fn references(text: &str, climb: usize, known: &BTreeMap<String, Vec<(PathBuf, usize)>>) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    let root = "super::".repeat(climb + 1);
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    let mut out = BTreeSet::new();
    for line in code.lines().map(str::trim_start).filter(|l| !l.starts_with("//")) {
        for prefix in ["crate::", root.as_str()] {
            for (i, _) in line.match_indices(prefix) {
                // The start of a path only: not `$crate::`, `my_crate::`
                // or the tail of a longer `super::super::` chain.
                let rest = &line[i + prefix.len()..];
                if line[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '$')) || rest.starts_with("super::") {
                    continue;
                }
                // `crate::{a, b::c}`: every first segment of the group.
                let names: Vec<String> = match rest.strip_prefix('{') {
                    Some(group) => {
                        let group = &group[..group.find('}').unwrap_or(group.len())];
                        group.split(',').map(|s| ident(s.trim())).collect()
                    }
                    None => vec![ident(rest)],
                };
                out.extend(names.into_iter().filter(|n| known.contains_key(n)));
            }
        }
    }
    out
}

/// A cycle of `graph`, if any.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        u: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(u.to_string(), 1);
        path.push(u.to_string());
        for v in graph.get(u).into_iter().flatten() {
            match state.get(v) {
                Some(1) => {
                    let at = path.iter().position(|p| p == v).unwrap_or(0);
                    let mut c = path[at..].to_vec();
                    c.push(v.clone());
                    return Some(c);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(v, graph, state, path) {
                        return Some(c);
                    }
                }
            }
        }
        path.pop();
        state.insert(u.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for u in graph.keys() {
        if !state.contains_key(u) {
            if let Some(c) = visit(u, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    mods.iter()
        .map(|(m, files)| {
            let mut refs = BTreeSet::new();
            for (f, climb) in files {
                let text = std::fs::read_to_string(f).expect("read source");
                refs.extend(references(&text, *climb, &mods));
            }
            refs.remove(m);
            (m.clone(), refs)
        })
        .collect()
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut crates: Vec<PathBuf> =
        std::fs::read_dir(root.join("crates")).expect("crates/").flatten().map(|e| e.path().join("src")).collect();
    crates.extend([root.join("tests/src"), root.join("xtask/src")]);
    crates.sort();
    let mut found = Vec::new();
    for src in crates.iter().filter(|s| s.is_dir()) {
        let g = graph(src);
        if let Some(c) = cycle(&g) {
            found.push(format!("{}: {}", src.display(), c.join(" -> ")));
        }
    }
    assert!(found.is_empty(), "import cycles between top-level modules:\n{}", found.join("\n"));
}

#[test]
fn the_scan_sees_references_and_cycles() {
    let known: BTreeMap<String, Vec<(PathBuf, usize)>> = ["a", "b", "c"].iter().map(|m| (m.to_string(), Vec::new())).collect();
    let text =
        "use crate::{a::X, b};\n// crate::c in a comment\nfn f() { super::super::c::g(); }\n#[cfg(test)]\nmod tests { use crate::c; }\n";
    assert_eq!(references(text, 1, &known), ["a", "b", "c"].iter().map(|s| s.to_string()).collect());
    assert_eq!(
        references(text, 0, &known),
        ["a", "b"].iter().map(|s| s.to_string()).collect(),
        "super::super:: from a top-level file is outside the crate"
    );
    let g = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(cycle(&g(&[("a", "b"), ("b", "c")])), None);
    assert_eq!(cycle(&g(&[("a", "b"), ("b", "c"), ("c", "a")])), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
}

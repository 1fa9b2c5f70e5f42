//! Every `unsafe` in the workspace (blocks, functions, impls, unsafe
//! attributes) carries a `SAFETY:` comment on its line or within the five
//! lines before it, saying why it is sound.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Lines with an `unsafe` keyword in code (not in a comment or a string).
fn unsafe_lines(text: &str) -> Vec<usize> {
    let word = regex::Regex::new(r"\bunsafe\b").expect("regex");
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        // Drop string literals.
        let mut stripped = String::new();
        let mut in_str = false;
        for c in code.chars() {
            if c == '"' {
                in_str = !in_str;
            } else if !in_str {
                stripped.push(c);
            }
        }
        if word.is_match(&stripped) {
            out.push(i);
        }
    }
    out
}

fn missing(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().collect();
    unsafe_lines(text)
        .into_iter()
        .filter(|&i| !lines[i.saturating_sub(5)..=i].iter().any(|l| l.contains("SAFETY:")))
        .map(|i| i + 1)
        .collect()
}

#[test]
fn the_check_finds_what_it_should() {
    assert_eq!(missing("fn f() {\n    let x = unsafe { g() };\n}\n"), vec![2]);
    assert!(missing("// SAFETY: g has no preconditions.\nlet x = unsafe { g() };\n").is_empty());
    assert!(missing("// unsafe in a comment\nlet s = \"unsafe\";\n").is_empty());
}

#[test]
fn every_unsafe_has_a_safety_comment() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for d in ["crates", "tests", "xtask", "fuzz"] {
        rust_files(&root.join(d), &mut files);
    }
    assert!(files.len() > 50, "{} files", files.len());
    let mut bad = Vec::new();
    let mut total = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        total += unsafe_lines(&text).len();
        for line in missing(&text) {
            bad.push(format!("{}:{line}", f.strip_prefix(&root).unwrap_or(f).display()));
        }
    }
    assert!(total > 20, "{total} unsafe sites found: the scan is broken");
    assert!(bad.is_empty(), "unsafe without a SAFETY: comment:\n{}", bad.join("\n"));
}

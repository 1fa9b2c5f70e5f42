//! The documentation the code generates, and what the hand-written pages
//! say about the command line.
//!
//! - `docs/reference/flags.md` is generated from the command line the
//!   binary builds (`node_agent::cmd::command()`: the serve flags of
//!   `config::serve_args`, every host collector's and eBPF probe's from
//!   their registries) and node_exporter's flag catalog
//!   (`host::catalog`). This test regenerates it in memory and fails when
//!   the committed file differs; `cargo xtask docs` writes it (it runs
//!   this test with `NODE_AGENT_DOCS_WRITE=1`).
//! - `node-agent --help-man` prints the man page clap_mangen renders.
//! - Every serve flag README.md and docs/ name is one the agent accepts.
//!
//! There is no metrics reference to generate: collectors declare no
//! registry of the families they write (a collector is an `update` into a
//! sink), so docs/metrics.md stays written by hand.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, Command};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The generated files, relative to the repository, with their contents.
fn generated() -> Vec<(&'static str, String)> {
    vec![("docs/reference/flags.md", flags_reference())]
}

#[test]
fn generated_references_are_current() {
    let write = std::env::var("NODE_AGENT_DOCS_WRITE").is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    for (rel, text) in generated() {
        let path = root().join(rel);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &text).unwrap_or_else(|e| panic!("writing {rel}: {e}"));
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != text {
            let (old, new): (Vec<&str>, Vec<&str>) = (committed.lines().collect(), text.lines().collect());
            let line = old.iter().zip(&new).position(|(a, b)| a != b).unwrap_or(old.len().min(new.len())) + 1;
            stale.push(format!("{rel} is stale: run `cargo xtask docs` (the first difference is at line {line})"));
        }
    }
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}

/// A table cell of prose: escapes what Markdown would read as a table
/// separator, emphasis or HTML; code spans (between backticks, when they
/// pair up) are kept, their pipes escaped.
fn prose(s: &str) -> String {
    let unpaired = s.matches('`').count() % 2 == 1;
    let mut code = false;
    let mut out = String::with_capacity(s.len());
    for c in s.trim().chars() {
        match c {
            '\n' => out.push(' '),
            '`' if !unpaired => {
                code = !code;
                out.push(c);
            }
            '|' => out.push_str("\\|"),
            '*' | '_' | '`' | '\\' | '[' | ']' if !code => {
                out.push('\\');
                out.push(c);
            }
            '<' if !code => out.push_str("&lt;"),
            _ => out.push(c),
        }
    }
    out
}

/// A table cell of code: a code span, its pipes escaped (GFM tables read
/// `\|` as `|` inside code spans too).
fn code(s: &str) -> String {
    let fence = if s.contains('`') { "``" } else { "`" };
    let pad = if s.starts_with('`') || s.ends_with('`') { " " } else { "" };
    format!("{fence}{pad}{}{pad}{fence}", s.replace('|', "\\|"))
}

/// One flag of the reference.
struct Row {
    flag: String,
    default: String,
    help: String,
    collector: Option<&'static str>,
    node_exporter: bool,
}

/// The rows of a command's own flags, negations (`--no-X`, hidden) folded
/// into their flag's `--[no-]X`.
fn rows(cmd: &Command, owner: &HashMap<String, &'static str>) -> Vec<Row> {
    let ids: Vec<&str> = cmd.get_arguments().map(|a| a.get_id().as_str()).collect();
    let mut out = Vec::new();
    for a in cmd.get_arguments() {
        let id = a.get_id().as_str();
        if a.is_positional() || id.strip_prefix("no-").is_some_and(|x| ids.contains(&x)) {
            continue;
        }
        let negatable = ids.contains(&format!("no-{id}").as_str());
        out.push(row(a, negatable, owner));
    }
    out
}

fn row(a: &Arg, negatable: bool, owner: &HashMap<String, &'static str>) -> Row {
    let id = a.get_id().as_str();
    let long = a.get_long().unwrap_or(id);
    let mut flag = if negatable { format!("--[no-]{long}") } else { format!("--{long}") };
    if let Some(s) = a.get_short() {
        flag = format!("-{s}, {flag}");
    }
    let mut flag = code(&flag);
    if matches!(a.get_action(), ArgAction::Append) {
        flag.push_str(" (repeatable)");
    }
    if let Some(env) = a.get_env() {
        let _ = write!(flag, " (`${}`)", env.to_string_lossy());
    }
    if a.is_hide_set() {
        flag.push_str(" (hidden)");
    }
    let mut help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
    let default = match a.get_action() {
        ArgAction::SetTrue | ArgAction::SetFalse => {
            // host::flags::bool_args states the default in the help.
            let (text, on) = if let Some(h) = help.strip_suffix(" [default: enabled]") {
                (h.to_string(), true)
            } else if let Some(h) = help.strip_suffix(" [default: disabled]") {
                (h.to_string(), false)
            } else {
                (help.clone(), matches!(a.get_action(), ArgAction::SetFalse))
            };
            help = text;
            (if on { "on" } else { "off" }).to_string()
        }
        ArgAction::Set | ArgAction::Append => {
            let values: Vec<String> = a.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
            match values.as_slice() {
                // A default the flag works out itself, stated in its help.
                [] => match stated_default(&help) {
                    Some((text, default)) => {
                        help = text;
                        prose(&default)
                    }
                    None => "none".to_string(),
                },
                [v] if v.is_empty() => "\"\"".to_string(),
                vs => vs.iter().map(|v| code(v)).collect::<Vec<_>>().join(", "),
            }
        }
        _ => "—".to_string(),
    };
    let spec = host::catalog::find(id);
    Row {
        flag,
        default,
        help: prose(&help),
        collector: owner.get(id).copied().or_else(|| spec.and_then(|s| s.collector)),
        node_exporter: spec.is_some(),
    }
}

/// The help without its `[default: …]`, and that default.
fn stated_default(help: &str) -> Option<(String, String)> {
    let start = help.find("[default: ")?;
    let end = start + help[start..].find(']')?;
    let default = help[start + "[default: ".len()..end].to_string();
    Some((format!("{}{}", help[..start].trim_end(), &help[end + 1..]), default))
}

/// The collector each flag belongs to: `--collector.<name>` and the flags
/// its definition declares, host collectors' and eBPF probes' alike.
fn owners() -> HashMap<String, &'static str> {
    let mut owner = HashMap::new();
    let mut add = |name: &'static str, args: Vec<Arg>| {
        owner.insert(format!("collector.{name}"), name);
        for a in args {
            owner.insert(a.get_id().to_string(), name);
        }
    };
    for d in host::registry::definitions() {
        add(d.name, (d.args)());
    }
    for d in node_agent::probes::definitions() {
        add(d.name, (d.args)());
    }
    owner
}

/// The subcommands of `cmd` as (path, command), depth first, but `serve`
/// (the root's flags) and clap's `help`.
fn subcommands<'a>(cmd: &'a Command, path: &str, out: &mut Vec<(String, &'a Command)>) {
    for sub in cmd.get_subcommands() {
        if matches!(sub.get_name(), "serve" | "help") {
            continue;
        }
        let p = format!("{path} {}", sub.get_name());
        out.push((p.clone(), sub));
        subcommands(sub, &p, out);
    }
}

/// docs/reference/flags.md.
fn flags_reference() -> String {
    let mut cmd = node_agent::cmd::command();
    cmd.build();
    let owner = owners();
    let mut s = String::new();
    s.push_str(
        "<!-- Generated by `cargo xtask docs` from the code (tests/tests/docs.rs); do not edit: \
         tests/tests/docs.rs fails when this file is stale. -->\n\n",
    );
    s.push_str("# Flag reference\n\n");
    s.push_str(
        "Every flag `node-agent` accepts, as `node-agent --help` and `node-agent --help-man` \
         state them: read from the command line the binary builds (the serve flags, every \
         host collector's and eBPF probe's from their registries) and from node_exporter \
         1.12.1's flag catalog (`crates/host/src/catalog.rs`). How flags are read, and what \
         the global ones mean in more words: [flags.md](../flags.md).\n\n",
    );
    s.push_str(
        "Booleans are `--X` / `--no-X` (the last one given wins). \"node_exporter\" says \
         whether node_exporter 1.12.1 has the flag; a flag of node_exporter's that node-agent \
         does not use says so in its help. Values are as kingpin reads them (`--flag=value` \
         or `--flag value`; integers read as floats and truncated).\n\n",
    );
    let mut all = rows(&cmd, &owner);
    // Global flags first, in the command's order; then by collector.
    all.sort_by(|a, b| a.collector.cmp(&b.collector));
    s.push_str("## `node-agent` (`serve`)\n\n");
    s.push_str("| flag | default | help | collector | node_exporter |\n|---|---|---|---|---|\n");
    for r in &all {
        let collector = r.collector.map_or_else(|| "—".to_string(), code);
        let ne = if r.node_exporter { "yes" } else { "no" };
        let _ = writeln!(s, "| {} | {} | {} | {collector} | {ne} |", r.flag, r.default, r.help);
    }
    s.push_str("\n## Deprecated aliases\n\n");
    s.push_str(
        "node_exporter's deprecated names (`host::catalog::DEPRECATED`), still accepted: using \
         one logs node_exporter's warning, giving both names is its error.\n\n",
    );
    s.push_str("| deprecated | use |\n|---|---|\n");
    for d in host::catalog::DEPRECATED {
        let _ = writeln!(s, "| {} | {} |", code(&format!("--{}", d.alias)), code(&format!("--{}", d.replaced_by)));
    }
    let mut subs = Vec::new();
    subcommands(&cmd, "node-agent", &mut subs);
    for (path, sub) in subs {
        let _ = write!(s, "\n## `{path}`\n\n");
        if let Some(about) = sub.get_about() {
            let _ = writeln!(s, "{}\n", prose(&about.to_string()));
        }
        let rows = rows(sub, &HashMap::new());
        if rows.is_empty() {
            s.push_str("No flags of its own.\n");
            continue;
        }
        s.push_str("| flag | default | help |\n|---|---|---|\n");
        for r in rows {
            let _ = writeln!(s, "| {} | {} | {} |", r.flag, r.default, r.help);
        }
        let positionals: Vec<String> =
            sub.get_arguments().filter(|a| a.is_positional()).map(|a| code(&a.get_id().as_str().to_uppercase())).collect();
        if !positionals.is_empty() {
            let _ = writeln!(s, "\nArguments: {}.", positionals.join(", "));
        }
    }
    s
}

/// The serve flags README.md and docs/ name (`--collector.…`, `--web.…`,
/// `--path.…` and the other dotted families, with or without `no-`) are
/// flags the agent accepts, so a renamed or removed flag cannot linger in
/// the prose.
/// What docs/flags.md shows as unknown flags (refused at start-up).
const UNKNOWN_EXAMPLES: &[&str] = &["collector.nope", "collector.cpu.nope"];

#[test]
fn the_docs_name_only_flags_the_agent_accepts() {
    let mut cmd = node_agent::cmd::command();
    cmd.build();
    let accepted: std::collections::HashSet<String> = cmd.get_arguments().filter_map(|a| a.get_long().map(str::to_string)).collect();
    let re =
        regex::Regex::new(r"--((?:no-)?(?:collector|web|path|log|runtime|security|ebpf|compat)\.[A-Za-z0-9_.-]*[A-Za-z0-9_])(<?)").unwrap();
    let mut files = vec![root().join("README.md")];
    let mut dirs = vec![root().join("docs")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
    }
    let mut unknown = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for c in re.captures_iter(&text) {
            // `--collector.<name>`, `--collector.ebpf_<probe>`: placeholders.
            if !c[2].is_empty() || c[1].ends_with('.') {
                continue;
            }
            let name = &c[1];
            if UNKNOWN_EXAMPLES.contains(&name) {
                assert!(!accepted.contains(name), "--{name}, the docs' example of an unknown flag, is accepted");
            } else if !accepted.contains(name) {
                unknown.push(format!("{}: --{name}", f.strip_prefix(root()).unwrap_or(f).display()));
            }
        }
    }
    unknown.sort();
    unknown.dedup();
    assert!(unknown.is_empty(), "flags the agent does not accept:\n{}", unknown.join("\n"));
}

/// `node-agent --help-man` prints the man page, roff, naming the flags.
#[test]
fn help_man_prints_the_man_page() {
    let out = std::process::Command::new(node_agent_tests::agent_binary()).arg("--help-man").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let man = String::from_utf8(out.stdout).unwrap();
    assert_eq!(man.as_bytes(), node_agent::cmd::serve::man_page().unwrap(), "the binary prints cmd::serve::man_page()");
    // After roff's definition of the apostrophe string (`.ie`/`.el`), the title.
    let first = man.lines().find(|l| !l.starts_with(".ie ") && !l.starts_with(".el ")).unwrap_or_default();
    assert!(first.starts_with(".TH node-agent 1 "), "{first}");
    for section in [".SH NAME", ".SH SYNOPSIS", ".SH OPTIONS", ".SH SUBCOMMANDS"] {
        assert!(man.contains(section), "{section}");
    }
    for flag in ["web.listen-address", "collector.disable-defaults", "collector.filesystem.mount-points-exclude", "collector.ebpf_runqueue"]
    {
        assert!(man.contains(&format!("\\-\\-{}", flag.replace('-', "\\-"))), "--{flag} is in the man page");
    }
}

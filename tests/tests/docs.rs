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
//! - `docs/reference/metrics.md` is generated from the host collectors'
//!   registry (`host::registry::definitions()`): each collector node_exporter's
//!   end-to-end run enables is built from that command line and run once
//!   on node_exporter 1.12.1's own fixture trees (../shared, as the
//!   conformance test does), and every family it writes is listed with its
//!   type, label names and help; the exporter's own families come from one
//!   scrape of the agent over HTTP. A collector declares no families ahead
//!   of a scrape, so what it writes on those fixtures is its reference;
//!   the eBPF probes' families depend on the kernel and the pods and are
//!   documented by hand in docs/ebpf.md. Without ../shared (outside CI)
//!   this file is not checked, with a message.
//! - `node-agent --help-man` prints the man page clap_mangen renders.
//! - Every serve flag README.md and docs/ name is one the agent accepts.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, Command};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The generated files, relative to the repository, with their contents.
fn generated() -> Vec<(&'static str, String)> {
    let mut v = vec![("docs/reference/flags.md", flags_reference())];
    match node_agent_tests::conformance_dir() {
        Some(fixtures) => v.push(("docs/reference/metrics.md", metrics_reference(&fixtures))),
        None => eprintln!("SKIP: docs/reference/metrics.md not checked: it is generated on node_exporter's fixtures"),
    }
    v
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

/// One family of the metrics reference.
struct FamilyRow {
    kind: &'static str,
    labels: Vec<String>,
    help: String,
}

fn kind_name(k: expo::Kind) -> &'static str {
    match k {
        expo::Kind::Counter => "counter",
        expo::Kind::Gauge => "gauge",
        expo::Kind::Untyped => "untyped",
        expo::Kind::Histogram => "histogram",
    }
}

/// Label names in the order first seen, across samples.
fn add_labels(into: &mut Vec<String>, names: impl IntoIterator<Item = String>) {
    for n in names {
        if !into.contains(&n) {
            into.push(n);
        }
    }
}

fn family_table(s: &mut String, families: &BTreeMap<String, FamilyRow>) {
    s.push_str("| family | type | labels | help |\n|---|---|---|---|\n");
    for (name, f) in families {
        let labels = if f.labels.is_empty() { "—".to_string() } else { f.labels.iter().map(|l| code(l)).collect::<Vec<_>>().join(", ") };
        let _ = writeln!(s, "| {} | {} | {labels} | {} |", code(name), f.kind, prose(&f.help));
    }
}

/// docs/reference/metrics.md: every host collector's families as it writes
/// them on node_exporter's fixtures, and the exporter's own.
fn metrics_reference(fixtures: &Path) -> String {
    let tmp = tempfile::tempdir().expect("tempdir");
    node_agent_tests::materialize(fixtures, tmp.path()).expect("copy the fixtures");
    let text = std::fs::read_to_string(fixtures.join("e2e-args.txt")).expect("e2e-args.txt");
    let mut args = vec!["node-agent".to_string(), "--web.listen-address=127.0.0.1:0".to_string()];
    args.extend(text.lines().filter(|l| !l.trim().is_empty()).map(|l| l.trim().replace("FIXTURES", &tmp.path().display().to_string())));
    args.extend(node_agent::manifests::agent_only_collectors().iter().map(|c| format!("--no-collector.{c}")));
    let m = node_agent::cmd::command().try_get_matches_from(&args).expect("node_exporter's e2e command line");
    let f = host::flags::Flags::new(&m);
    let paths = host::registry::paths(&f);
    let defs = host::registry::definitions();

    // Each enabled host collector, run once into a sink of its own.
    let mut by_collector: BTreeMap<&'static str, BTreeMap<String, FamilyRow>> = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    let mut foreign = std::collections::BTreeSet::new();
    let built = host::registry::build(&f, &paths, &defs, &mut ()).expect("the e2e collectors build");
    for (name, mut collector) in built {
        let mut sink = expo::Sink::new();
        // A collector with nothing on these fixtures lists no family.
        let _ = collector.update(&mut sink);
        let families = by_collector.entry(name).or_default();
        for fam in sink.families() {
            seen.insert(fam.name().to_string());
            // Families that are the host's data, not the collector's (the
            // textfile collector's files): named after the table instead.
            if !fam.name().starts_with("node_") {
                foreign.insert(name);
                continue;
            }
            let row = families.entry(fam.name().to_string()).or_insert_with(|| FamilyRow {
                kind: kind_name(fam.kind()),
                labels: Vec::new(),
                help: fam.help().to_string(),
            });
            for (labels, _) in fam.samples() {
                add_labels(&mut row.labels, labels.iter().map(|(k, _)| k.to_string()));
            }
        }
    }

    // The exporter's own: what one scrape over HTTP adds to the collectors'.
    let agent = node_agent::agent::Agent::start(&m).expect("the agent starts on the e2e command line");
    let (status, body) =
        node_agent_tests::http_get(agent.addrs[0], "/metrics", std::time::Duration::from_secs(60)).expect("an answer from /metrics");
    assert_eq!(status, 200, "{body}");
    let mut own: BTreeMap<String, FamilyRow> = BTreeMap::new();
    for fam in expo::text::parse(&body).expect("the agent's answer parses") {
        if seen.contains(&fam.name) {
            continue;
        }
        let mut labels = Vec::new();
        for sample in &fam.samples {
            add_labels(&mut labels, sample.labels.iter().map(|(k, _)| k.clone()).filter(|k| k != "le"));
        }
        own.insert(fam.name.clone(), FamilyRow { kind: fam.kind.as_str(), labels, help: fam.help.clone().unwrap_or_default() });
    }

    let mut s = String::new();
    s.push_str(
        "<!-- Generated by `cargo xtask docs` from the code (tests/tests/docs.rs); do not edit: \
         tests/tests/docs.rs fails when this file is stale. -->\n\n",
    );
    s.push_str("# Metrics reference\n\n");
    s.push_str(
        "Every family the host collectors write, by collector, generated from their registry \
         (`host::registry::definitions()`): each collector node_exporter 1.12.1's end-to-end \
         run enables is built from that run's command line and run once on node_exporter's own \
         fixture trees, and what it writes is listed here (its type, its label names in the \
         order it writes them, its help). Then the exporter's own families, which one scrape \
         adds. Label values and which devices appear are the host's. A collector's families \
         that need hardware or services the fixtures do not have, and the collectors the \
         end-to-end run leaves off, are in [metrics.md](../metrics.md); the eBPF probes' \
         families (kernel events, per pod) are in [ebpf.md](../ebpf.md).\n\n",
    );
    let on: Vec<&str> = by_collector.keys().copied().collect();
    let off: Vec<String> = defs.iter().filter(|d| !on.contains(&d.name)).map(|d| code(d.name)).collect();
    let total: usize = by_collector.values().map(BTreeMap::len).sum();
    let _ = writeln!(
        s,
        "{total} families from {} collectors, and {} of the exporter's own. Not run here (off in \
         node_exporter's end-to-end run): {}.\n",
        by_collector.len(),
        own.len(),
        off.join(", ")
    );
    s.push_str("## Host collectors\n");
    for (name, families) in &by_collector {
        let d = defs.iter().find(|d| d.name == *name).expect("a registered collector");
        let _ = write!(s, "\n### `{name}`\n\n`--collector.{name}`, {} by default.\n\n", if d.enabled_by_default { "on" } else { "off" });
        if families.is_empty() {
            s.push_str("No family on node_exporter's fixtures (it reads what they lack): see [metrics.md](../metrics.md).\n");
            continue;
        }
        family_table(&mut s, families);
        if foreign.contains(name) {
            s.push_str("\nAnd the families of the files it reads, as they declare them.\n");
        }
    }
    s.push_str("\n## The exporter's own\n\n");
    s.push_str("Written by the scrape itself, the process and the HTTP server, whatever collectors run (`--web.disable-exporter-metrics` leaves out `process_*`, `promhttp_metric_handler_*`, `node_agent_*` and `node_exporter_build_info`).\n\n");
    family_table(&mut s, &own);
    s
}

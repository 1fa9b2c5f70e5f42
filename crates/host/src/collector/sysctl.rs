//! `sysctl`: the sysctls named by `--collector.sysctl.include` (numeric,
//! untyped `node_sysctl_<name>`: one value unlabelled, several by `index`, or
//! with `name:key1,key2,...` one `node_sysctl_<name>_<key>` per value) and
//! `--collector.sysctl.include-info` (text, `node_sysctl_info{index,name,value} 1`),
//! read from /proc/sys, as node_exporter does. A sysctl that can't be read,
//! has no value or doesn't match its keys fails the collector.

use std::path::{Path, PathBuf};

use clap::Arg;

use crate::flags::{self, Flags, StringsFlag};
use crate::parse::parse_go_int;
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const INCLUDE: StringsFlag =
    StringsFlag { name: "collector.sysctl.include", value_name: "VALUE", default: &[], help: "Select sysctl metrics to include" };
pub const INCLUDE_INFO: StringsFlag = StringsFlag {
    name: "collector.sysctl.include-info",
    value_name: "VALUE",
    default: &[],
    help: "Select sysctl metrics to include as info metrics",
};

const INFO: &str = "node_sysctl_info";
const INFO_HELP: &str = "sysctl info";

/// One selected sysctl, as node_exporter's `newSysctl` splits the flag's
/// value: `name` or `name:key1,key2,...`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sysctl {
    pub numeric: bool,
    pub name: String,
    pub keys: Vec<String>,
}

impl Sysctl {
    pub fn new(include: &str, numeric: bool) -> Sysctl {
        match include.split_once(':') {
            Some((name, keys)) => Sysctl { numeric, name: name.to_string(), keys: keys.split(',').map(str::to_string).collect() },
            None => Sysctl { numeric, name: include.to_string(), keys: Vec::new() },
        }
    }
}

/// node_exporter's `SanitizeMetricName`: every run of characters other
/// than `[0-9A-Za-z_]`, with the underscores around it, becomes one `_`.
pub fn sanitize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '_' || c.is_ascii_alphanumeric() {
            // A run of underscores followed by an invalid character joins it.
            if c == '_' {
                let mut run = 1;
                while chars.peek() == Some(&'_') {
                    chars.next();
                    run += 1;
                }
                if chars.peek().is_some_and(|n| !n.is_ascii_alphanumeric()) {
                    push_invalid_run(&mut out, &mut chars);
                } else {
                    out.extend(std::iter::repeat_n('_', run));
                }
                continue;
            }
            out.push(c);
        } else {
            push_invalid_run(&mut out, &mut chars);
        }
    }
    out
}

/// Consumes invalid characters and the underscores after them (the
/// regex's `[^0-9A-Za-z_]+_*`), leaving one `_`.
fn push_invalid_run(out: &mut String, chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while chars.peek().is_some_and(|n| *n != '_' && !n.is_ascii_alphanumeric()) {
        chars.next();
    }
    while chars.peek() == Some(&'_') {
        chars.next();
    }
    out.push('_');
}

/// A valid Prometheus metric name (the legacy character set).
fn valid_metric_name(name: &str) -> bool {
    let mut b = name.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_' || c == b':')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b':')
}

/// The file of sysctl `name` under `procfs/sys`: its dots become slashes
/// (so it has no `.` or `..` parts), and empty parts vanish, as Go's
/// `filepath.Join` cleans them; a leading slash stays under `sys`.
pub fn sysctl_path(procfs: &Path, name: &str) -> PathBuf {
    let mut out = procfs.join("sys");
    for part in name.split(['.', '/']).filter(|p| !p.is_empty()) {
        out.push(part);
    }
    out
}

/// A sysctl's values as procfs's `SysctlStrings` reads them: at most 128
/// bytes, split into words.
pub fn split_values(raw: &[u8]) -> Result<Vec<&str>, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "not valid UTF-8".to_string())?;
    Ok(text.split_whitespace().collect())
}

/// The values of a numeric sysctl, as procfs's `SysctlInts` (Go's
/// `strconv.ParseInt(s, 0, 64)`).
pub fn parse_ints(name: &str, values: &[&str]) -> Result<Vec<i64>, String> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| parse_go_int(v).ok_or_else(|| format!("field {i} in sysctl {name} is not a valid int: {v:?}")))
        .collect()
}

/// The collector's flags, parsed once.
pub struct Options {
    pub sysctls: Vec<Sysctl>,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        flags::args(&[&INCLUDE, &INCLUDE_INFO])
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        let numeric = INCLUDE.get(f).into_iter().map(|s| Sysctl::new(&s, true));
        let info = INCLUDE_INFO.get(f).into_iter().map(|s| Sysctl::new(&s, false));
        Ok(Options { sysctls: numeric.chain(info).collect() })
    }
}

/// A selected sysctl with its file and exposed names.
struct Selected {
    sysctl: Sysctl,
    path: PathBuf,
    family: String,
    help: String,
    /// Per key: the family name and help.
    keyed: Vec<(String, String)>,
}

pub struct Collector {
    sysctls: Vec<Selected>,
    /// The `index` label values "0", "1", ..., kept from scrape to scrape.
    indices: Vec<String>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        let sysctls = o
            .sysctls
            .into_iter()
            .map(|s| {
                let family = format!("node_sysctl_{}", sanitize(&s.name));
                let keyed =
                    s.keys.iter().enumerate().map(|(i, k)| (format!("{family}_{k}"), format!("sysctl {}, field {i}", s.name))).collect();
                Selected { path: sysctl_path(&p.procfs, &s.name), help: format!("sysctl {}", s.name), family, keyed, sysctl: s }
            })
            .collect();
        Ok(Collector { sysctls, indices: Vec::new() })
    }
}

fn invalid(path: &Path, msg: String) -> Error {
    Error::parse(path, msg)
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        for sel in &self.sysctls {
            let s = &sel.sysctl;
            let raw = crate::io::sys_read_file(&sel.path).map_err(|e| Error::io(&sel.path, e.into_io()))?;
            let words = split_values(&raw).map_err(|m| invalid(&sel.path, m))?;
            let ints = if s.numeric { parse_ints(&s.name, &words).map_err(|m| invalid(&sel.path, m))? } else { Vec::new() };
            while self.indices.len() < words.len() {
                self.indices.push(self.indices.len().to_string());
            }
            match (words.len(), s.keys.is_empty(), s.numeric) {
                (0, _, _) => return Err(invalid(&sel.path, format!("sysctl {} has no values", s.name))),
                (1, false, _) => {
                    return Err(invalid(&sel.path, format!("sysctl {} has only one value, but expected {:?}", s.name, s.keys)));
                }
                (1, true, true) => {
                    sink.family(&sel.family, &sel.help, Kind::Untyped).sample(&[], ints[0] as f64);
                }
                (_, true, true) => {
                    let mut f = sink.family(&sel.family, &sel.help, Kind::Untyped);
                    for (v, index) in ints.iter().zip(&self.indices) {
                        f.sample(&[("index", index)], *v as f64);
                    }
                }
                (_, true, false) => {
                    let mut f = sink.family(INFO, INFO_HELP, Kind::Gauge);
                    for (v, index) in words.iter().zip(&self.indices) {
                        f.sample(&[("index", index), ("name", &s.name), ("value", v)], 1.0);
                    }
                }
                (n, false, _) if n != s.keys.len() => {
                    return Err(invalid(&sel.path, format!("sysctl {} has {n} keys but only {} defined in flag", s.name, s.keys.len())));
                }
                (_, false, false) => return Err(invalid(&sel.path, "mapped sysctl string values not supported".to_string())),
                (_, false, true) => {
                    for ((name, help), v) in sel.keyed.iter().zip(&ints) {
                        if !valid_metric_name(name) {
                            return Err(invalid(&sel.path, format!("invalid metric name {name:?}")));
                        }
                        sink.family(name, help, Kind::Untyped).sample(&[], *v as f64);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;

    #[test]
    fn splits_the_flag_values() {
        assert_eq!(Sysctl::new("kernel.threads-max", true), Sysctl { numeric: true, name: "kernel.threads-max".into(), keys: vec![] });
        let s = Sysctl::new("fs.file-nr:total,current,max", true);
        assert_eq!((s.name.as_str(), s.keys.len(), s.keys[2].as_str()), ("fs.file-nr", 3, "max"));
        assert_eq!(Sysctl::new("a:b:c", false).keys, ["b:c"]);
        assert_eq!(Sysctl::new("a:", false).keys, [""]);
    }

    #[test]
    fn sanitizes_names_as_node_exporter() {
        assert_eq!(sanitize("fs.file-nr"), "fs_file_nr");
        assert_eq!(sanitize("kernel.threads-max"), "kernel_threads_max");
        assert_eq!(sanitize("net.ipv4.tcp_rmem"), "net_ipv4_tcp_rmem");
        assert_eq!(sanitize("a__.__b"), "a_b");
        assert_eq!(sanitize("a__b"), "a__b");
        assert_eq!(sanitize(".a."), "_a_");
        assert_eq!(sanitize("a-_-b"), "a__b");
        assert_eq!(sanitize("ünï"), "_n_");
    }

    #[test]
    fn paths_are_cleaned_as_filepath_join() {
        let p = Path::new("/host/proc");
        assert_eq!(sysctl_path(p, "fs.file-nr"), Path::new("/host/proc/sys/fs/file-nr"));
        assert_eq!(sysctl_path(p, "fs..file-nr"), Path::new("/host/proc/sys/fs/file-nr"));
        assert_eq!(sysctl_path(p, "/etc/passwd"), Path::new("/host/proc/sys/etc/passwd"));
        assert_eq!(sysctl_path(p, "..a"), Path::new("/host/proc/sys/a"));
    }

    #[test]
    fn parses_values() {
        assert_eq!(split_values(b"1024\t0\t1631329\n").unwrap(), ["1024", "0", "1631329"]);
        assert!(split_values(b"\xff").is_err());
        assert_eq!(parse_ints("x", &["1", "-2", "0x10", "010"]).unwrap(), [1, -2, 16, 8]);
        assert!(parse_ints("x", &["1", "y"]).unwrap_err().contains("field 1"));
        assert!(valid_metric_name("node_sysctl_a_b") && !valid_metric_name("node_sysctl_a-b") && !valid_metric_name(""));
    }

    fn scrape(flags: &[(&str, bool)], files: &[(&str, &str)]) -> Result<Vec<crate::testutil::Row>, Error> {
        let dir = tempfile::tempdir().unwrap();
        for (rel, text) in files {
            crate::testutil::write(dir.path(), &format!("proc/sys/{rel}"), text);
        }
        let sysctls = flags.iter().map(|(s, numeric)| Sysctl::new(s, *numeric)).collect();
        let mut c = Collector::new(Options { sysctls }, &crate::testutil::paths(dir.path())).unwrap();
        let mut sink = Sink::new();
        c.update(&mut sink)?;
        Ok(crate::testutil::rows(&sink))
    }

    fn row(name: &str, labels: &[(&str, &str)], v: f64) -> crate::testutil::Row {
        (name.to_string(), labels.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(), v)
    }

    #[test]
    fn update_writes_the_e2e_families() {
        let files = [
            ("fs/file-nr", "1024\t0\t1631329\n"),
            ("kernel/threads-max", "7801\n"),
            ("kernel/seccomp/actions_avail", "kill_process kill_thread trap\n"),
        ];
        let flags = [
            ("fs.file-nr", true),
            ("fs.file-nr:total,current,max", true),
            ("kernel.threads-max", true),
            ("kernel.seccomp.actions_avail", false),
        ];
        let rows = scrape(&flags, &files).unwrap();
        assert_eq!(
            rows,
            vec![
                row("node_sysctl_fs_file_nr", &[("index", "0")], 1024.0),
                row("node_sysctl_fs_file_nr", &[("index", "1")], 0.0),
                row("node_sysctl_fs_file_nr", &[("index", "2")], 1631329.0),
                row("node_sysctl_fs_file_nr_total", &[], 1024.0),
                row("node_sysctl_fs_file_nr_current", &[], 0.0),
                row("node_sysctl_fs_file_nr_max", &[], 1631329.0),
                row("node_sysctl_kernel_threads_max", &[], 7801.0),
                row(INFO, &[("index", "0"), ("name", "kernel.seccomp.actions_avail"), ("value", "kill_process")], 1.0),
                row(INFO, &[("index", "1"), ("name", "kernel.seccomp.actions_avail"), ("value", "kill_thread")], 1.0),
                row(INFO, &[("index", "2"), ("name", "kernel.seccomp.actions_avail"), ("value", "trap")], 1.0),
            ]
        );
        let one = scrape(&[("kernel.hostname", false)], &[("kernel/hostname", "box\n")]).unwrap();
        assert_eq!(one, vec![row(INFO, &[("index", "0"), ("name", "kernel.hostname"), ("value", "box")], 1.0)]);
        assert_eq!(scrape(&[], &[]).unwrap(), vec![], "nothing selected: success");
    }

    #[test]
    fn update_fails_as_node_exporter() {
        let fail = |flags: &[(&str, bool)], files: &[(&str, &str)]| scrape(flags, files).is_err();
        assert!(fail(&[("a.b", true)], &[]), "missing");
        assert!(fail(&[("a.b", true)], &[("a/b", " \n")]), "no values");
        assert!(fail(&[("a.b", true)], &[("a/b", "1 x\n")]), "not an int");
        assert!(fail(&[("a.b:x", true)], &[("a/b", "1\n")]), "one value with keys");
        assert!(fail(&[("a.b:x,y,z", true)], &[("a/b", "1 2\n")]), "key count");
        assert!(fail(&[("a.b:x,y", false)], &[("a/b", "p q\n")]), "mapped strings");
        assert!(fail(&[("a.b:x,y-z", true)], &[("a/b", "1 2\n")]), "invalid metric name");
        // Only the first 128 bytes are read.
        let long = format!("{} 5\n", "1 ".repeat(64));
        let rows = scrape(&[("a.b", true)], &[("a/b", &long)]).unwrap();
        assert_eq!(rows.len(), 64);
    }
}

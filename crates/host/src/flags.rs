//! Flags as node_exporter (kingpin) spells them: `--name=value` and
//! `--name value`, booleans as `--name` / `--no-name` (the last one wins).
//!
//! A collector declares each of its flags once, as a `const` holding its
//! name, default and help: a [`BoolFlag`], [`StringFlag`] (also read as a
//! regular expression, or an include/exclude pair through [`filter`]),
//! [`StringsFlag`] (repeatable), [`DurationFlag`] or [`SignedDurationFlag`]
//! (Go durations), [`IntFlag`] (any integer type), [`SizeFlag`] (bytes),
//! [`ParsedFlag`] (read by a parser of its own, optionally from an
//! environment variable too) or [`OptionalFlag`] (no default);
//! [`Hidden`] keeps one out of `--help`. For example:
//!
//! ```text
//! pub const GUEST: BoolFlag =
//!     BoolFlag { name: "collector.cpu.guest", default: true, help: "Enables metric node_cpu_guest_seconds_total" };
//! pub const STAT_WORKERS: IntFlag<usize> =
//!     IntFlag { name: "collector.filesystem.stat-workers", default: 4, help: "how many stat calls to process simultaneously" };
//! ```
//!
//! Both the clap arguments and the typed value come from the declaration:
//! the collector's `Options::args()` is [`args`]`(&[&GUEST, &STAT_WORKERS])`,
//! and its `Options::from_flags(&Flags)` reads each value once, typed
//! (`GUEST.get(f)`, `STAT_WORKERS.get(f)?`), a bad value being an error
//! that names the flag. No collector holds the command line or writes a
//! flag's name twice.
//!
//! The binary's own flags and its probes' are declared the same way. The
//! untyped pieces ([`string_arg`], [`bool_args`], [`Flags::string`], ...)
//! remain for the registry, whose flags are named at run time.

use std::fmt::Display;
use std::num::NonZeroU64;
use std::str::FromStr;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches};
use regex::Regex;

use crate::filter::DeviceFilter;
use crate::ConfigError;

/// A string-valued flag with a default.
pub fn string_arg(name: &str, default: &str, help: &str) -> Arg {
    Arg::new(name.to_string())
        .long(name.to_string())
        .value_name("VALUE")
        .default_value(default.to_string())
        .help(help.to_string())
        .action(ArgAction::Set)
}

/// A repeatable string flag (kingpin's `Strings()`), without a default.
pub fn strings_arg(name: &str, help: &str) -> Arg {
    Arg::new(name.to_string()).long(name.to_string()).value_name("VALUE").help(help.to_string()).action(ArgAction::Append)
}

/// A kingpin-style boolean flag: `--name` and `--no-name`, the last wins.
pub fn bool_args(name: &str, default: bool, help: &str) -> [Arg; 2] {
    let no = format!("no-{name}");
    let help_text = if default { format!("{help} [default: enabled]") } else { format!("{help} [default: disabled]") };
    [
        Arg::new(name.to_string()).long(name.to_string()).help(help_text).action(ArgAction::SetTrue).overrides_with(no.clone()),
        Arg::new(no.clone()).long(no).hide(true).action(ArgAction::SetTrue).overrides_with(name.to_string()),
    ]
}

/// Parses a Go duration (`time.ParseDuration`, as kingpin reads
/// `Duration()` flags): a sequence of decimal numbers with units `ns`,
/// `us`/`µs`, `ms`, `s`, `m`, `h`, e.g. `5s`, `1.5h`, `2h45m`; `0` alone is
/// zero. Negative durations are refused.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
        let (num, tail) = rest.split_at(num_end);
        if num.is_empty() || num == "." {
            return None;
        }
        let v: f64 = num.parse().ok()?;
        let unit_end = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += v * scale;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Parses a byte size: a whole number of bytes, or with a binary suffix
/// (`KiB`, `MiB`, `GiB`; `K`, `M`, `G` mean the same).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// Parses an integer as kingpin's `Int()` flags are read: as a float, then
/// truncated (`2.9` is 2, `1e1` is 10). The error says what was given.
pub fn parse_kingpin_int(s: &str) -> Result<i64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v.trunc() as i64),
        _ => Err(format!("not a number: {s:?}")),
    }
}

/// Parses a Go duration that may be negative (`-2ms`), in nanoseconds.
pub fn parse_go_duration_nanos(s: &str) -> Option<i64> {
    let s = s.trim();
    let (neg, rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let d = parse_go_duration(rest)?;
    let ns = i64::try_from(d.as_nanos()).ok()?;
    Some(if neg { -ns } else { ns })
}

/// A declared flag: its clap arguments, as `--help` shows them.
pub trait Flag {
    fn declare(&self) -> Vec<Arg>;
}

/// The clap arguments of `flags`, in order (`--help` lists them so): a
/// collector's `Options::args()`.
pub fn args(flags: &[&dyn Flag]) -> Vec<Arg> {
    flags.iter().flat_map(|f| f.declare()).collect()
}

/// For declarations of one argument (`arg()`): [`Flag`], and `invalid`,
/// the error for a bad value.
macro_rules! one_arg {
    ($($t:ty),*) => {$(
        impl Flag for $t {
            fn declare(&self) -> Vec<Arg> {
                vec![self.arg()]
            }
        }

        impl $t {
            /// The error for a bad value of this flag.
            pub fn invalid(&self, msg: impl Into<String>) -> ConfigError {
                invalid(self.name, msg)
            }
        }
    )*};
}

/// The error for a bad value of the flag `name`.
fn invalid(name: &str, msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { flag: name.to_string(), msg: msg.into() }
}

/// A kingpin boolean: `--name`, and `--no-name` (hidden) to turn it off;
/// the last one given wins. Its help states the default.
#[derive(Clone, Copy, Debug)]
pub struct BoolFlag {
    pub name: &'static str,
    pub default: bool,
    pub help: &'static str,
}

impl BoolFlag {
    /// `--name` and `--no-name` ([`bool_args`]).
    pub fn args(&self) -> [Arg; 2] {
        bool_args(self.name, self.default, self.help)
    }

    /// Its value: the last of `--name` / `--no-name` given, else the default.
    pub fn get(&self, f: &Flags) -> bool {
        f.bool(self.name, self.default)
    }
}

impl Flag for BoolFlag {
    fn declare(&self) -> Vec<Arg> {
        self.args().into()
    }
}

/// A string flag (`--name=VALUE`), with a default ("" for none).
#[derive(Clone, Copy, Debug)]
pub struct StringFlag {
    pub name: &'static str,
    pub default: &'static str,
    pub help: &'static str,
}

impl StringFlag {
    pub fn arg(&self) -> Arg {
        string_arg(self.name, self.default, self.help)
    }

    /// Its value (the default when not given).
    pub fn get(&self, f: &Flags) -> String {
        f.string(self.name)
    }

    /// Whether it was given on the command line (not its default).
    pub fn given(&self, f: &Flags) -> bool {
        f.given(self.name)
    }

    /// Its value, or that of the deprecated flag node_exporter keeps for it
    /// (`--collector.diskstats.ignored-devices` for
    /// `--collector.diskstats.device-exclude`, see
    /// [`crate::catalog::DEPRECATED`]), with node_exporter's warning; both
    /// given is node_exporter's error. Also whether it was given.
    pub fn value(&self, f: &Flags) -> Result<(String, bool), ConfigError> {
        let own = (self.get(f), self.given(f));
        let Some(d) = crate::catalog::DEPRECATED.iter().find(|d| d.replaced_by == self.name) else { return Ok(own) };
        let alias = f.string(d.alias);
        if alias.is_empty() {
            return Ok(own);
        }
        if own.1 {
            return Err(invalid(d.alias, d.conflict));
        }
        tracing::warn!("{}", d.warning);
        Ok((alias, true))
    }

    /// Its value ([`value`](Self::value)) as a regular expression; empty
    /// means "not set".
    pub fn regex(&self, f: &Flags) -> Result<Option<Regex>, ConfigError> {
        self.compile(self.value(f)?.0)
    }

    /// Its value ([`value`](Self::value)) as a regular expression, compiled
    /// even when empty (Go's empty pattern matches every name).
    pub fn pattern(&self, f: &Flags) -> Result<Regex, ConfigError> {
        let (value, _) = self.value(f)?;
        flag_regex(&value).map_err(|e| self.bad_regex(value, e))
    }

    /// `value` compiled as this flag's regular expression; empty means
    /// "not set".
    pub fn compile(&self, value: String) -> Result<Option<Regex>, ConfigError> {
        if value.is_empty() {
            return Ok(None);
        }
        flag_regex(&value).map(Some).map_err(|e| self.bad_regex(value, e))
    }

    /// The error for `value`, which is not a regular expression.
    pub fn bad_regex(&self, value: String, e: regex::Error) -> ConfigError {
        ConfigError::Regex { flag: self.name.to_string(), value, source: Box::new(e) }
    }

    /// Its value parsed by `parse`, whose error is the flag's.
    pub fn parse_with<T>(&self, f: &Flags, parse: impl FnOnce(&str) -> Result<T, String>) -> Result<T, ConfigError> {
        parse(&self.get(f)).map_err(|msg| self.invalid(msg))
    }
}

/// The most a flag's regular expression keeps of its lazy DFA's
/// transitions, per thread that runs it (the regex crate's default is
/// 2 MiB). A flag's pattern matches short names (devices, mount points,
/// fields), most of them once, as collectors keep what a name matched:
/// netstat's default fields pattern had grown its cache to 145 kB for
/// names it was never to match again. A search that would need more
/// clears the cache, and one that keeps needing more runs without it.
pub const FLAG_REGEX_CACHE: usize = 32 << 10;

/// `pattern` compiled as a flag's regular expression, its lazy DFA's cache
/// bounded by [`FLAG_REGEX_CACHE`].
pub fn flag_regex(pattern: &str) -> Result<Regex, regex::Error> {
    regex::RegexBuilder::new(pattern).dfa_size_limit(FLAG_REGEX_CACHE).build()
}

/// node_exporter's include/exclude pair: both given is an error; a given
/// include pattern replaces a default exclude pattern. Either may be given
/// under its deprecated name ([`StringFlag::value`]).
pub fn filter(f: &Flags, exclude: &StringFlag, include: &StringFlag) -> Result<DeviceFilter, ConfigError> {
    let ex = exclude.regex(f)?;
    let inc = include.regex(f)?;
    if ex.is_some() && inc.is_some() && exclude.value(f)?.1 {
        return Err(include.invalid(format!("cannot be used together with --{}", exclude.name)));
    }
    if inc.is_some() {
        return Ok(DeviceFilter::new(None, inc));
    }
    Ok(DeviceFilter::new(ex, None))
}

/// A repeatable string flag (kingpin's `Strings()`).
#[derive(Clone, Copy, Debug)]
pub struct StringsFlag {
    pub name: &'static str,
    /// What `--help` calls a value (`VALUE`, `DIR`).
    pub value_name: &'static str,
    /// The values when none is given (none for most); `--help` states them
    /// at the end of the help, as it does other defaults.
    pub default: &'static [&'static str],
    pub help: &'static str,
}

impl StringsFlag {
    pub fn arg(&self) -> Arg {
        let arg = strings_arg(self.name, self.help).value_name(self.value_name);
        if self.default.is_empty() {
            return arg;
        }
        arg.help(format!("{} [default: {}]", self.help, self.default.join(" ")))
    }

    /// Every value given, in command-line order; the default when none is.
    pub fn get(&self, f: &Flags) -> Vec<String> {
        let given = f.strings(self.name);
        if given.is_empty() {
            return self.default.iter().map(|s| s.to_string()).collect();
        }
        given
    }

    /// Its values parsed by `parse`, whose error is the flag's.
    pub fn parse_with<T>(&self, f: &Flags, parse: impl FnOnce(&[String]) -> Result<T, String>) -> Result<T, ConfigError> {
        parse(&self.get(f)).map_err(|msg| self.invalid(msg))
    }
}

/// A Go duration flag (`5s`, `1m30s`; [`parse_go_duration`]), not negative.
#[derive(Clone, Copy, Debug)]
pub struct DurationFlag {
    pub name: &'static str,
    /// As Go writes it.
    pub default: &'static str,
    pub help: &'static str,
}

impl DurationFlag {
    pub fn arg(&self) -> Arg {
        string_arg(self.name, self.default, self.help)
    }

    pub fn get(&self, f: &Flags) -> Result<Duration, ConfigError> {
        f.duration(self.name)
    }
}

/// A Go duration flag that may be negative, read in nanoseconds
/// ([`parse_go_duration_nanos`]).
#[derive(Clone, Copy, Debug)]
pub struct SignedDurationFlag {
    pub name: &'static str,
    /// As Go writes it.
    pub default: &'static str,
    pub help: &'static str,
}

impl SignedDurationFlag {
    pub fn arg(&self) -> Arg {
        string_arg(self.name, self.default, self.help)
    }

    /// Nanoseconds.
    pub fn get(&self, f: &Flags) -> Result<i64, ConfigError> {
        let value = f.string(self.name);
        parse_go_duration_nanos(&value).ok_or_else(|| self.invalid(format!("invalid duration {value:?}")))
    }
}

/// An integer flag of type `T`, declared (and shown) as a string as
/// kingpin does, parsed with `FromStr`.
#[derive(Clone, Copy, Debug)]
pub struct IntFlag<T> {
    pub name: &'static str,
    pub default: T,
    pub help: &'static str,
}

impl<T: FromStr + Display> IntFlag<T> {
    pub fn arg(&self) -> Arg {
        string_arg(self.name, &self.default.to_string(), self.help)
    }

    pub fn get(&self, f: &Flags) -> Result<T, ConfigError> {
        f.parse(self.name)
    }

    /// The error for a bad value of this flag.
    pub fn invalid(&self, msg: impl Into<String>) -> ConfigError {
        invalid(self.name, msg)
    }
}

impl<T: FromStr + Display> Flag for IntFlag<T> {
    fn declare(&self) -> Vec<Arg> {
        vec![self.arg()]
    }
}

/// A byte size flag (`65536`, `512KiB`, `8MiB`; [`parse_bytes`]), above zero.
#[derive(Clone, Copy, Debug)]
pub struct SizeFlag {
    pub name: &'static str,
    /// As written on the command line.
    pub default: &'static str,
    pub help: &'static str,
}

impl SizeFlag {
    pub fn arg(&self) -> Arg {
        string_arg(self.name, self.default, self.help)
    }

    pub fn get(&self, f: &Flags) -> Result<NonZeroU64, ConfigError> {
        let value = f.string(self.name);
        parse_bytes(&value)
            .and_then(NonZeroU64::new)
            .ok_or_else(|| self.invalid(format!("invalid size {value:?} (e.g. 65536, 512KiB, 8MiB)")))
    }
}

/// A flag read by a parser of its own into a `T` (a log level, kingpin's
/// float-read integer with [`parse_kingpin_int`]), the parser's error
/// prefixed with the flag. With `env`, the environment variable is read
/// when the flag is not given (`--help` shows it); as kingpin, an empty
/// one means the default (templated manifests produce `GOMAXPROCS=""`),
/// while an empty flag is parsed as given.
#[derive(Clone, Copy, Debug)]
pub struct ParsedFlag<T> {
    pub name: &'static str,
    /// What `--help` calls a value (`VALUE`, `N`, `DURATION`).
    pub value_name: &'static str,
    /// As written on the command line.
    pub default: &'static str,
    pub env: Option<&'static str>,
    pub help: &'static str,
    pub parse: fn(&str) -> Result<T, String>,
}

impl<T> ParsedFlag<T> {
    pub fn arg(&self) -> Arg {
        let arg = string_arg(self.name, self.default, self.help).value_name(self.value_name);
        match self.env {
            Some(var) => arg.env(var),
            None => arg,
        }
    }

    pub fn get(&self, f: &Flags) -> Result<T, ConfigError> {
        let mut value = f.string(self.name);
        if value.trim().is_empty() && f.env_given(self.name) {
            value = self.default.to_string();
        }
        (self.parse)(&value).map_err(|msg| self.invalid(msg))
    }

    /// The error for a bad value of this flag.
    pub fn invalid(&self, msg: impl Into<String>) -> ConfigError {
        invalid(self.name, msg)
    }
}

impl<T> Flag for ParsedFlag<T> {
    fn declare(&self) -> Vec<Arg> {
        vec![self.arg()]
    }
}

/// A string flag without a default (`--help` shows none; its help may say
/// what stands in for it).
#[derive(Clone, Copy, Debug)]
pub struct OptionalFlag {
    pub name: &'static str,
    /// What `--help` calls a value (`NAME`, `FILE`).
    pub value_name: &'static str,
    pub help: &'static str,
}

impl OptionalFlag {
    pub fn arg(&self) -> Arg {
        Arg::new(self.name).long(self.name).value_name(self.value_name).help(self.help)
    }

    /// Its value; None when not given, or given empty.
    pub fn get(&self, f: &Flags) -> Option<String> {
        Some(f.string(self.name)).filter(|s| !s.is_empty())
    }
}

one_arg!(StringFlag, StringsFlag, DurationFlag, SignedDurationFlag, SizeFlag, OptionalFlag);

/// A flag kept out of `--help` (a deprecated spelling, a test switch).
#[derive(Clone, Copy, Debug)]
pub struct Hidden<F>(pub F);

impl<F: Flag> Flag for Hidden<F> {
    fn declare(&self) -> Vec<Arg> {
        self.0.declare().into_iter().map(|a| a.hide(true)).collect()
    }
}

impl Hidden<BoolFlag> {
    pub fn get(&self, f: &Flags) -> bool {
        self.0.get(f)
    }
}

/// Reads flags from the parsed command line by name: the binary's own
/// flags; collectors read theirs through their declarations.
#[derive(Clone, Copy)]
pub struct Flags<'a> {
    m: &'a ArgMatches,
}

impl<'a> Flags<'a> {
    pub fn new(m: &'a ArgMatches) -> Self {
        Flags { m }
    }

    /// Whether `name` was given on the command line (not its default).
    fn given(&self, name: &str) -> bool {
        self.m.try_contains_id(name).unwrap_or(false) && self.m.value_source(name) == Some(ValueSource::CommandLine)
    }

    /// Whether `name`'s value comes from its environment variable.
    fn env_given(&self, name: &str) -> bool {
        self.m.try_contains_id(name).unwrap_or(false) && self.m.value_source(name) == Some(ValueSource::EnvVariable)
    }

    /// A kingpin-style boolean pair: `--name` or `--no-name`, else `default`.
    pub fn bool(&self, name: &str, default: bool) -> bool {
        let no = format!("no-{name}");
        let set = |n: &str| self.m.try_get_one::<bool>(n).ok().flatten().copied().unwrap_or(false) && self.given(n);
        if set(name) {
            return true;
        }
        if set(&no) {
            return false;
        }
        default
    }

    /// The value of a string flag ("" when it has none).
    pub fn string(&self, name: &str) -> String {
        self.m.try_get_one::<String>(name).ok().flatten().cloned().unwrap_or_default()
    }

    /// Every value of a repeatable flag, in command-line order.
    pub fn strings(&self, name: &str) -> Vec<String> {
        self.m.try_get_many::<String>(name).ok().flatten().map(|v| v.cloned().collect()).unwrap_or_default()
    }

    /// A value parsed with `FromStr`, the error naming the flag.
    pub fn parse<T: std::str::FromStr>(&self, name: &str) -> Result<T, ConfigError> {
        let value = self.string(name);
        value.trim().parse().map_err(|_| invalid(name, format!("invalid value {value:?}")))
    }

    /// A Go duration flag (`5s`, `1m30s`).
    pub fn duration(&self, name: &str) -> Result<Duration, ConfigError> {
        let value = self.string(name);
        parse_go_duration(&value).ok_or_else(|| invalid(name, format!("invalid duration {value:?} (e.g. 500ms, 5s, 1m)")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Command;

    const RE: StringFlag = StringFlag { name: "a.re", default: "^x$", help: "" };

    #[test]
    fn a_bounded_cache_matches_as_the_unbounded_one() {
        let pattern = crate::collector::netstat::FIELDS.default;
        let (bounded, unbounded) = (flag_regex(pattern).unwrap(), Regex::new(pattern).unwrap());
        let mut matched = 0;
        // More distinct names than the bounded cache holds states for, in
        // the shapes the pattern tells apart.
        for i in 0..20_000u32 {
            let name = match i % 5 {
                0 => format!("TcpExt_Listen{i:x}"),
                1 => format!("Udp{}_InDatagrams", if i % 2 == 0 { "6" } else { "" }),
                2 => format!("Ip_{i}_InErrors"),
                3 => format!("Icmp_Field{i:08x}Zz"),
                _ => format!("{i:016x}_{:x}", i.wrapping_mul(2_654_435_761)),
            };
            assert_eq!(bounded.is_match(&name), unbounded.is_match(&name), "{name}");
            matched += usize::from(bounded.is_match(&name));
        }
        assert_eq!(matched, 3 * 4000, "TcpExt_Listen*, Udp(6)_InDatagrams and *_InErrors; not the other two shapes");
    }
    const INC: StringFlag = StringFlag { name: "a.inc", default: "", help: "" };
    const ON: BoolFlag = BoolFlag { name: "a.on", default: true, help: "on" };
    const OFF: Hidden<BoolFlag> = Hidden(BoolFlag { name: "a.off", default: false, help: "off" });
    const DIR: StringsFlag = StringsFlag { name: "a.dir", value_name: "DIR", default: &[], help: "" };
    const WAIT: DurationFlag = DurationFlag { name: "a.wait", default: "5s", help: "" };
    const SKEW: SignedDurationFlag = SignedDurationFlag { name: "a.skew", default: "-1ms", help: "" };
    const N: IntFlag<u16> = IntFlag { name: "a.n", default: 4, help: "" };
    const SIZE: SizeFlag = SizeFlag { name: "a.size", default: "8MiB", help: "" };

    fn command() -> Command {
        Command::new("t").no_binary_name(true).args(args(&[&RE, &INC, &ON, &OFF, &DIR, &WAIT, &SKEW, &N, &SIZE]))
    }

    fn matches(args: &[&str]) -> ArgMatches {
        command().try_get_matches_from(args).unwrap()
    }

    #[test]
    fn declarations_are_today_s_args() {
        let cmd = command();
        let ids: Vec<&str> = cmd.get_arguments().map(|a| a.get_id().as_str()).collect();
        assert_eq!(ids, ["a.re", "a.inc", "a.on", "no-a.on", "a.off", "no-a.off", "a.dir", "a.wait", "a.skew", "a.n", "a.size"]);
        let same = |a: Arg, b: Arg| assert_eq!(format!("{a:?}"), format!("{b:?}"));
        let [on, no] = ON.args();
        let [on2, no2] = bool_args("a.on", true, "on");
        same(on, on2);
        same(no, no2);
        same(RE.arg(), string_arg("a.re", "^x$", ""));
        same(N.arg(), string_arg("a.n", "4", ""));
        same(SIZE.arg(), string_arg("a.size", "8MiB", ""));
        same(WAIT.arg(), string_arg("a.wait", "5s", ""));
        same(DIR.arg(), strings_arg("a.dir", "").value_name("DIR"));
        let arg = |id: &str| cmd.get_arguments().find(|a| a.get_id() == id).unwrap().clone();
        assert!(arg("a.off").is_hide_set() && arg("no-a.off").is_hide_set() && !arg("a.on").is_hide_set());
        assert_eq!(arg("a.dir").get_value_names().unwrap(), ["DIR"]);
    }

    #[test]
    fn booleans_last_one_wins() {
        let m = matches(&[]);
        assert!(ON.get(&Flags::new(&m)));
        assert!(!OFF.get(&Flags::new(&m)));
        assert!(Flags::new(&m).bool("a.on", true));
        assert!(!Flags::new(&m).bool("a.on", false), "the default is the caller's");
        let m = matches(&["--no-a.on", "--a.off"]);
        assert!(!ON.get(&Flags::new(&m)) && OFF.get(&Flags::new(&m)));
        let m = matches(&["--no-a.on", "--a.on"]);
        assert!(ON.get(&Flags::new(&m)));
    }

    #[test]
    fn strings_regexes_and_filters() {
        let m = matches(&["--a.dir=x", "--a.dir", "y"]);
        let f = Flags::new(&m);
        assert_eq!(DIR.get(&f), ["x", "y"]);
        assert_eq!(f.strings("a.dir"), ["x", "y"]);
        assert_eq!(DIR.parse_with(&f, |v| Ok::<_, String>(v.len())).unwrap(), 2);
        assert!(DIR.parse_with(&f, |_| Err::<(), _>("no".into())).unwrap_err().to_string().starts_with("--a.dir: no"));
        assert!(RE.regex(&f).unwrap().unwrap().is_match("x"));
        assert!(INC.regex(&f).unwrap().is_none());
        assert!(INC.pattern(&f).unwrap().is_match("anything"), "an empty pattern matches everything");
        assert!(!INC.given(&f) && RE.get(&f) == "^x$");
        assert!(filter(&f, &RE, &INC).unwrap().ignored("x"), "the default exclude applies");
        let m = matches(&["--a.inc=^y$"]);
        let filt = filter(&Flags::new(&m), &RE, &INC).unwrap();
        assert!(!filt.ignored("y") && filt.ignored("x"), "an include replaces the default exclude");
        let m = matches(&["--a.inc=^y$", "--a.re=^z$"]);
        let e = filter(&Flags::new(&m), &RE, &INC).unwrap_err().to_string();
        assert_eq!(e, "--a.inc: cannot be used together with --a.re");
        let m = matches(&["--a.re=(("]);
        assert!(RE.regex(&Flags::new(&m)).unwrap_err().to_string().starts_with("--a.re: invalid regular expression \"((\""));
        assert!(RE.pattern(&Flags::new(&m)).is_err());
    }

    #[test]
    fn deprecated_spellings() {
        const NEW: StringFlag = StringFlag { name: "collector.qdisc.device-include", default: "", help: "" };
        const OLD: Hidden<StringFlag> = Hidden(StringFlag { name: "collector.qdisk.device-include", default: "", help: "" });
        let cmd = Command::new("t").no_binary_name(true).args(args(&[&NEW, &OLD]));
        let value = |a: &[&str]| NEW.value(&Flags::new(&cmd.clone().try_get_matches_from(a).unwrap())).map_err(|e| e.to_string());
        assert_eq!(value(&[]).unwrap(), (String::new(), false));
        assert_eq!(value(&["--collector.qdisc.device-include=a"]).unwrap(), ("a".to_string(), true));
        assert_eq!(value(&["--collector.qdisk.device-include=b"]).unwrap(), ("b".to_string(), true));
        let e = value(&["--collector.qdisk.device-include=b", "--collector.qdisc.device-include=a"]).unwrap_err();
        assert!(e.starts_with("--collector.qdisk.device-include: ") && e.contains("mutually exclusive"), "{e}");
    }

    #[test]
    fn typed_values_and_their_errors() {
        let m = matches(&[]);
        let f = Flags::new(&m);
        assert_eq!(WAIT.get(&f).unwrap(), Duration::from_secs(5));
        assert_eq!(SKEW.get(&f).unwrap(), -1_000_000);
        assert_eq!(N.get(&f).unwrap(), 4);
        assert_eq!(SIZE.get(&f).unwrap().get(), 8 << 20);
        let m = matches(&["--a.wait=5", "--a.skew=x", "--a.n=70000", "--a.size=0"]);
        let f = Flags::new(&m);
        assert_eq!(WAIT.get(&f).unwrap_err().to_string(), "--a.wait: invalid duration \"5\" (e.g. 500ms, 5s, 1m)");
        assert_eq!(SKEW.get(&f).unwrap_err().to_string(), "--a.skew: invalid duration \"x\"");
        assert_eq!(N.get(&f).unwrap_err().to_string(), "--a.n: invalid value \"70000\"");
        assert_eq!(SIZE.get(&f).unwrap_err().to_string(), "--a.size: invalid size \"0\" (e.g. 65536, 512KiB, 8MiB)");
        assert_eq!(N.invalid("too many").to_string(), "--a.n: too many");
        let m = matches(&["--a.n", " 7 "]);
        assert_eq!(N.get(&Flags::new(&m)).unwrap(), 7);
    }

    #[test]
    fn repeatable_flags_with_a_default() {
        const ADDR: StringsFlag = StringsFlag { name: "a.addr", value_name: "ADDR", default: &[":1"], help: "Where." };
        let cmd = Command::new("t").no_binary_name(true).args(args(&[&ADDR]));
        let same = |a: Arg, b: Arg| assert_eq!(format!("{a:?}"), format!("{b:?}"));
        same(ADDR.arg(), strings_arg("a.addr", "Where. [default: :1]").value_name("ADDR"));
        let get = |a: &[&str]| ADDR.get(&Flags::new(&cmd.clone().try_get_matches_from(a).unwrap()));
        assert_eq!(get(&[]), [":1"]);
        assert_eq!(get(&["--a.addr=:2", "--a.addr", ":3"]), [":2", ":3"], "given values replace the default");
    }

    #[test]
    fn parsed_and_optional_flags() {
        fn level(s: &str) -> Result<u8, String> {
            s.strip_prefix('L').and_then(|n| n.parse().ok()).ok_or_else(|| format!("unknown level {s:?}"))
        }
        const LEVEL: ParsedFlag<u8> = ParsedFlag { name: "a.level", value_name: "VALUE", default: "L1", env: None, help: "", parse: level };
        const PROCS: ParsedFlag<i64> = ParsedFlag {
            name: "a.procs",
            value_name: "N",
            default: "1",
            env: Some("NODE_AGENT_HOST_FLAGS_TEST_PROCS"),
            help: "",
            parse: parse_kingpin_int,
        };
        const NAME: OptionalFlag = OptionalFlag { name: "a.name", value_name: "NAME", help: "Its name." };
        let same = |a: Arg, b: Arg| assert_eq!(format!("{a:?}"), format!("{b:?}"));
        same(LEVEL.arg(), string_arg("a.level", "L1", ""));
        same(PROCS.arg(), string_arg("a.procs", "1", "").value_name("N").env("NODE_AGENT_HOST_FLAGS_TEST_PROCS"));
        same(NAME.arg(), Arg::new("a.name").long("a.name").value_name("NAME").help("Its name."));
        // clap reads the environment when the argument is built.
        let m = |a: &[&str]| Command::new("t").no_binary_name(true).args(args(&[&LEVEL, &PROCS, &NAME])).try_get_matches_from(a).unwrap();
        let m0 = m(&[]);
        let f = Flags::new(&m0);
        assert_eq!((LEVEL.get(&f).unwrap(), PROCS.get(&f).unwrap(), NAME.get(&f)), (1, 1, None));
        let m1 = m(&["--a.level=L3", "--a.procs=2.9", "--a.name=n"]);
        let f = Flags::new(&m1);
        assert_eq!((LEVEL.get(&f).unwrap(), PROCS.get(&f).unwrap(), NAME.get(&f)), (3, 2, Some("n".to_string())));
        let m2 = m(&["--a.level=loud", "--a.procs=", "--a.name="]);
        let f = Flags::new(&m2);
        assert_eq!(LEVEL.get(&f).unwrap_err().to_string(), "--a.level: unknown level \"loud\"");
        assert_eq!(PROCS.get(&f).unwrap_err().to_string(), "--a.procs: not a number: \"\"", "an empty flag is an error");
        assert_eq!(NAME.get(&f), None, "given empty is not given");
        // The environment variable (this test's alone): read when the flag
        // is not given; empty, it means the default.
        std::env::set_var("NODE_AGENT_HOST_FLAGS_TEST_PROCS", "1e1");
        assert_eq!(PROCS.get(&Flags::new(&m(&[]))).unwrap(), 10);
        assert_eq!(PROCS.get(&Flags::new(&m(&["--a.procs=3"]))).unwrap(), 3);
        std::env::set_var("NODE_AGENT_HOST_FLAGS_TEST_PROCS", " ");
        assert_eq!(PROCS.get(&Flags::new(&m(&[]))).unwrap(), 1);
        std::env::set_var("NODE_AGENT_HOST_FLAGS_TEST_PROCS", "x");
        assert_eq!(PROCS.get(&Flags::new(&m(&[]))).unwrap_err().to_string(), "--a.procs: not a number: \"x\"");
        std::env::remove_var("NODE_AGENT_HOST_FLAGS_TEST_PROCS");
    }

    #[test]
    fn kingpin_integers_are_read_as_floats() {
        assert_eq!(parse_kingpin_int("2.9"), Ok(2));
        assert_eq!(parse_kingpin_int(" 1e1 "), Ok(10));
        assert_eq!(parse_kingpin_int("-0.5"), Ok(0));
        assert_eq!(parse_kingpin_int("-3"), Ok(-3));
        for bad in ["", "x", "inf", "NaN"] {
            assert_eq!(parse_kingpin_int(bad), Err(format!("not a number: {bad:?}")), "{bad:?}");
        }
    }

    #[test]
    fn signed_go_durations() {
        assert_eq!(parse_go_duration_nanos("-1ms"), Some(-1_000_000));
        assert_eq!(parse_go_duration_nanos("3.46608s"), Some(3_466_080_000));
        assert_eq!(parse_go_duration_nanos("x"), None);
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("65536"), Some(65536));
        assert_eq!(parse_bytes("512KiB"), Some(512 << 10));
        assert_eq!(parse_bytes("8MiB"), Some(8 << 20));
        assert_eq!(parse_bytes("1G"), Some(1 << 30));
        for bad in ["", "MiB", "1.5MiB", "-1", "8 parsecs", "99999999999999999999GiB"] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("300ms"), Some(Duration::from_millis(300)));
        assert_eq!(parse_go_duration("10us"), Some(Duration::from_micros(10)));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        for bad in ["", "5", "s", "5x", "-1s", "1..5s", "."] {
            assert_eq!(parse_go_duration(bad), None, "{bad:?}");
        }
    }
}

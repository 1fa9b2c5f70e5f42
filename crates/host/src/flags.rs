//! Flags as node_exporter (kingpin) spells them: `--name=value` and
//! `--name value`, booleans as `--name` / `--no-name` (the last one wins).
//!
//! Collectors declare their flags ([`string_arg`], [`bool_args`]) and read
//! them once, into their typed options, through [`Flags`]; no collector
//! holds the command line.

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

/// Reads declared flags from the parsed command line.
#[derive(Clone, Copy)]
pub struct Flags<'a> {
    m: &'a ArgMatches,
}

impl<'a> Flags<'a> {
    pub fn new(m: &'a ArgMatches) -> Self {
        Flags { m }
    }

    /// The parsed command line, for the binary's own flags.
    pub fn matches(&self) -> &'a ArgMatches {
        self.m
    }

    /// Whether `name` was given on the command line (not its default).
    pub fn given(&self, name: &str) -> bool {
        self.m.try_contains_id(name).unwrap_or(false) && self.m.value_source(name) == Some(ValueSource::CommandLine)
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

    /// The value of a string flag, or of the deprecated flag node_exporter
    /// keeps for it (`--collector.diskstats.ignored-devices` for
    /// `--collector.diskstats.device-exclude`), with node_exporter's warning;
    /// both given is node_exporter's error. Also whether it was given.
    pub fn value(&self, name: &str) -> Result<(String, bool), ConfigError> {
        let own = (self.string(name), self.given(name));
        let Some(d) = crate::catalog::DEPRECATED.iter().find(|d| d.replaced_by == name) else { return Ok(own) };
        let alias = self.string(d.alias);
        if alias.is_empty() {
            return Ok(own);
        }
        if own.1 {
            return Err(ConfigError::Invalid { flag: d.alias.to_string(), msg: d.conflict.to_string() });
        }
        tracing::warn!("{}", d.warning);
        Ok((alias, true))
    }

    /// Every value of a repeatable flag, in command-line order.
    pub fn strings(&self, name: &str) -> Vec<String> {
        self.m.try_get_many::<String>(name).ok().flatten().map(|v| v.cloned().collect()).unwrap_or_default()
    }

    /// A regular expression flag; an empty value means "not set".
    pub fn regex(&self, name: &str) -> Result<Option<Regex>, ConfigError> {
        let (value, _) = self.value(name)?;
        if value.is_empty() {
            return Ok(None);
        }
        Regex::new(&value).map(Some).map_err(|e| ConfigError::Regex { flag: name.to_string(), value, source: Box::new(e) })
    }

    /// A value parsed with `FromStr`, the error naming the flag.
    pub fn parse<T: std::str::FromStr>(&self, name: &str) -> Result<T, ConfigError> {
        let value = self.string(name);
        value.trim().parse().map_err(|_| ConfigError::Invalid { flag: name.to_string(), msg: format!("invalid value {value:?}") })
    }

    /// A Go duration flag (`5s`, `1m30s`).
    pub fn duration(&self, name: &str) -> Result<Duration, ConfigError> {
        let value = self.string(name);
        parse_go_duration(&value)
            .ok_or_else(|| ConfigError::Invalid { flag: name.to_string(), msg: format!("invalid duration {value:?} (e.g. 500ms, 5s, 1m)") })
    }

    /// node_exporter's include/exclude pair: both given is an error; a given
    /// include pattern replaces a default exclude pattern.
    pub fn filter(&self, exclude: &str, include: &str) -> Result<DeviceFilter, ConfigError> {
        let ex = self.regex(exclude)?;
        let inc = self.regex(include)?;
        if ex.is_some() && inc.is_some() && self.value(exclude)?.1 {
            return Err(ConfigError::Invalid { flag: include.to_string(), msg: format!("cannot be used together with --{exclude}") });
        }
        if inc.is_some() {
            return Ok(DeviceFilter::new(None, inc));
        }
        Ok(DeviceFilter::new(ex, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Command;

    fn matches(args: &[&str]) -> ArgMatches {
        let mut cmd = Command::new("t").no_binary_name(true).arg(string_arg("a.re", "^x$", "")).arg(string_arg("a.inc", "", ""));
        for a in bool_args("a.on", true, "") {
            cmd = cmd.arg(a);
        }
        cmd = cmd.arg(strings_arg("a.dir", ""));
        cmd.try_get_matches_from(args).unwrap()
    }

    #[test]
    fn booleans_last_one_wins() {
        let m = matches(&[]);
        assert!(Flags::new(&m).bool("a.on", true));
        assert!(!Flags::new(&m).bool("a.on", false), "the default is the caller's");
        let m = matches(&["--no-a.on"]);
        assert!(!Flags::new(&m).bool("a.on", true));
        let m = matches(&["--no-a.on", "--a.on"]);
        assert!(Flags::new(&m).bool("a.on", false));
    }

    #[test]
    fn strings_regexes_and_filters() {
        let m = matches(&["--a.dir=x", "--a.dir", "y"]);
        let f = Flags::new(&m);
        assert_eq!(f.strings("a.dir"), ["x", "y"]);
        assert!(f.regex("a.re").unwrap().unwrap().is_match("x"));
        assert!(f.regex("a.inc").unwrap().is_none());
        assert!(f.filter("a.re", "a.inc").unwrap().ignored("x"), "the default exclude applies");
        let m = matches(&["--a.inc=^y$"]);
        let filt = Flags::new(&m).filter("a.re", "a.inc").unwrap();
        assert!(!filt.ignored("y") && filt.ignored("x"), "an include replaces the default exclude");
        let m = matches(&["--a.inc=^y$", "--a.re=^z$"]);
        let e = Flags::new(&m).filter("a.re", "a.inc").unwrap_err().to_string();
        assert!(e.contains("--a.inc") && e.contains("--a.re"), "{e}");
        let m = matches(&["--a.re=(("]);
        assert!(Flags::new(&m).regex("a.re").unwrap_err().to_string().contains("--a.re"));
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

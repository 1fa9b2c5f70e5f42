//! `vmstat`: selected /proc/vmstat fields as untyped metrics.

use std::path::PathBuf;

use clap::{Arg, ArgMatches};
use regex::Regex;

use super::util::{self, fields, lines, parse_f64, read_file};
use super::{ConfigError, Error, Paths};
use crate::metrics::{Kind, Sink};

pub fn args() -> Vec<Arg> {
    vec![util::string_arg(
        "collector.vmstat.fields",
        "^(oom_kill|pgpg|pswp|pg.*fault).*",
        "Regexp of fields to return for vmstat collector.",
    )]
}

pub struct Collector {
    path: PathBuf,
    fields: Option<Regex>,
    buf: Vec<u8>,
    name: String,
    /// Field-name match results, so the regex runs once per field name.
    cache: util::MatchCache,
}

impl Collector {
    pub fn new(m: &ArgMatches, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector {
            path: p.proc("vmstat"),
            fields: util::regex_flag(m, "collector.vmstat.fields")?,
            buf: Vec::new(),
            name: String::new(),
            cache: util::MatchCache::default(),
        })
    }
}

impl super::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        for line in lines(&self.buf) {
            let mut f = fields(line);
            let (Some(k), Some(v), None) = (f.next(), f.next(), f.next()) else {
                return Err(Error::parse(&self.path, "expected `name value`"));
            };
            let key = std::str::from_utf8(k).map_err(|_| Error::parse(&self.path, "invalid UTF-8"))?;
            if !self.cache.matches(self.fields.as_ref(), key) {
                continue;
            }
            let v = parse_f64(v).ok_or_else(|| Error::parse(&self.path, format!("invalid value for {key}")))?;
            self.name.clear();
            self.name.push_str("node_vmstat_");
            self.name.push_str(key);
            sink.single(&self.name, "/proc/vmstat information field.", Kind::Untyped, v);
        }
        Ok(())
    }
}

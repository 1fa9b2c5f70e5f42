//! `vmstat`: selected /proc/vmstat fields as untyped metrics.

use std::path::PathBuf;

use clap::Arg;

use crate::flags::{Flags, StringFlag};
use regex::Regex;

use crate::io::read_file;
use crate::parse::{fields, lines, parse_f64};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const FIELDS: StringFlag = StringFlag {
    name: "collector.vmstat.fields",
    default: "^(oom_kill|pgpg|pswp|pg.*fault).*",
    help: "Regexp of fields to return for vmstat collector.",
};

/// The collector's flags, parsed once.
pub struct Options {
    pub fields: Option<Regex>,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        vec![FIELDS.arg()]
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { fields: FIELDS.regex(f)? })
    }
}

pub struct Collector {
    path: PathBuf,
    fields: Option<Regex>,
    buf: Vec<u8>,
    name: String,
    /// Field-name match results, so the regex runs once per field name.
    cache: crate::filter::MatchCache,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector {
            path: p.proc("vmstat"),
            fields: o.fields,
            buf: Vec::new(),
            name: String::new(),
            cache: crate::filter::MatchCache::default(),
        })
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        for line in lines(&self.buf) {
            let mut f = fields(line);
            let (Some(k), Some(v), None) = (f.next(), f.next(), f.next()) else {
                return Err(Error::parse(&self.path, "expected `name value`"));
            };
            let key = std::str::from_utf8(k).map_err(|_| Error::parse(&self.path, "invalid UTF-8"))?;
            // Every value is checked, selected or not, as node_exporter
            // parses before it filters.
            let v = parse_f64(v).ok_or_else(|| Error::parse(&self.path, format!("invalid value for {key}")))?;
            if !self.cache.matches(self.fields.as_ref(), key) {
                continue;
            }
            self.name.clear();
            self.name.push_str("node_vmstat_");
            self.name.push_str(key);
            sink.single(&self.name, "/proc/vmstat information field.", Kind::Untyped, v);
        }
        Ok(())
    }
}

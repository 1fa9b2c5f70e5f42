//! `netstat`: network statistics from /proc/net/netstat, /proc/net/snmp and
//! /proc/net/snmp6, filtered by `--collector.netstat.fields`.

use std::path::PathBuf;

use clap::Arg;

use crate::flags::{Flags, StringFlag};
use regex::Regex;

use crate::io::{read_file, read_into};
use crate::parse::{fields, lines, parse_f64};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const FIELDS: StringFlag = StringFlag {
    name: "collector.netstat.fields",
    default: "^(.*_(InErrors|InErrs)|Ip_Forwarding|Ip(6|Ext)_(InOctets|OutOctets)|Icmp6?_(InMsgs|OutMsgs)|TcpExt_(Listen.*|Syncookies.*|TCPSynRetrans|TCPTimeouts|TCPOFOQueue|TCPRcvQDrop)|Tcp_(ActiveOpens|InSegs|OutSegs|OutRsts|PassiveOpens|RetransSegs|CurrEstab)|Udp6?_(InDatagrams|OutDatagrams|NoPorts|RcvbufErrors|SndbufErrors))$",
    help: "Regexp of fields to return for netstat collector.",
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

/// Parses the header/value line pairs of /proc/net/netstat and /proc/net/snmp,
/// calling `f(protocol, name, value)`.
pub fn parse_pairs<'a>(buf: &'a [u8], mut f: impl FnMut(&'a [u8], &'a [u8], &'a [u8])) -> Result<(), String> {
    let mut it = lines(buf);
    while let Some(names) = it.next() {
        let values = it.next().ok_or("header line without values")?;
        let mut n = fields(names);
        let mut v = fields(values);
        let token = n.next().ok_or("empty line")?;
        if v.next() != Some(token) {
            return Err("values line does not match its header".into());
        }
        let proto = token.strip_suffix(b":").ok_or("protocol without colon")?;
        loop {
            match (n.next(), v.next()) {
                (Some(k), Some(x)) => f(proto, k, x),
                (None, None) => break,
                _ => return Err(format!("field count mismatch for {}", String::from_utf8_lossy(proto))),
            }
        }
    }
    Ok(())
}

/// Parses /proc/net/snmp6 lines `Ip6InReceives 7`, split at the `6`.
pub fn parse_snmp6<'a>(buf: &'a [u8], mut f: impl FnMut(&'a [u8], &'a [u8], &'a [u8])) -> Result<(), String> {
    for line in lines(buf) {
        let mut it = fields(line);
        let (Some(k), Some(v)) = (it.next(), it.next()) else { continue };
        if let Some(six) = k.iter().position(|&c| c == b'6') {
            f(&k[..=six], &k[six + 1..], v);
        }
    }
    Ok(())
}

pub struct Collector {
    netstat: PathBuf,
    snmp: PathBuf,
    snmp6: PathBuf,
    fields: Option<Regex>,
    cache: crate::filter::MatchCache,
    buf: Vec<u8>,
    key: String,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector {
            netstat: p.proc("net/netstat"),
            snmp: p.proc("net/snmp"),
            snmp6: p.proc("net/snmp6"),
            fields: o.fields,
            cache: crate::filter::MatchCache::default(),
            buf: Vec::new(),
            key: String::new(),
        })
    }

    fn emit(&mut self, sink: &mut Sink, which: u8) -> Result<(), Error> {
        let path = match which {
            0 => &self.netstat,
            1 => &self.snmp,
            _ => &self.snmp6,
        };
        let (key, cache, re) = (&mut self.key, &mut self.cache, self.fields.as_ref());
        let mut bad: Option<String> = None;
        let cb = |proto: &[u8], name: &[u8], value: &[u8]| {
            if bad.is_some() {
                return;
            }
            key.clear();
            key.push_str("node_netstat_");
            let (Ok(p), Ok(n)) = (std::str::from_utf8(proto), std::str::from_utf8(name)) else {
                bad = Some("invalid UTF-8".into());
                return;
            };
            key.push_str(p);
            key.push('_');
            key.push_str(n);
            // Every value is checked, selected or not, as node_exporter
            // parses before it filters.
            let Some(v) = parse_f64(value) else {
                bad = Some(format!("invalid value for {p}{n}"));
                return;
            };
            if cache.matches(re, &key["node_netstat_".len()..]) {
                sink.single(key, "Statistic from /proc/net/netstat, snmp or snmp6.", Kind::Untyped, v);
            }
        };
        if which == 2 { parse_snmp6(&self.buf, cb) } else { parse_pairs(&self.buf, cb) }.map_err(|e| Error::parse(path, e))?;
        match bad {
            Some(msg) => Err(Error::parse(path, msg)),
            None => Ok(()),
        }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.netstat, &mut self.buf)?;
        self.emit(sink, 0)?;
        read_file(&self.snmp, &mut self.buf)?;
        self.emit(sink, 1)?;
        match read_into(&self.snmp6, &mut self.buf) {
            Ok(()) => self.emit(sink, 2),
            // IPv6 disabled.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&self.snmp6, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs() {
        let mut got = Vec::new();
        parse_pairs(b"Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoMin\nTcp: 200\n", |p, n, v| {
            got.push(format!("{}_{}={}", String::from_utf8_lossy(p), String::from_utf8_lossy(n), String::from_utf8_lossy(v)))
        })
        .unwrap();
        assert_eq!(got, vec!["Ip_Forwarding=1", "Ip_DefaultTTL=64", "Tcp_RtoMin=200"]);
        assert!(parse_pairs(b"Ip: A B\nIp: 1\n", |_, _, _| {}).is_err());
        assert!(parse_pairs(b"Ip: A B\n", |_, _, _| {}).is_err());
        assert!(parse_pairs(b"Ip: A\nTcp: 1\n", |_, _, _| {}).is_err());
    }

    #[test]
    fn parses_snmp6() {
        let mut got = Vec::new();
        parse_snmp6(b"Ip6InReceives \t 7\nUdpLite6InErrors 0\n", |p, n, v| got.push((p.to_vec(), n.to_vec(), v.to_vec()))).unwrap();
        assert_eq!(got[0], (b"Ip6".to_vec(), b"InReceives".to_vec(), b"7".to_vec()));
        assert_eq!(got[1].0, b"UdpLite6".to_vec());
    }
}

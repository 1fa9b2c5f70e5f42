//! `supervisord` (deprecated in node_exporter, default off): every process
//! supervisord manages, from one XML-RPC call `supervisor.getAllProcessInfo`
//! to `--collector.supervisord.url` (env `SUPERVISORD_URL`; `http://` with
//! optional `user:password@` basic auth, or `unix:///path/to/socket` as
//! node_exporter 1.12.1 allows), exported as `node_supervisord_state`,
//! `node_supervisord_exit_status`, `node_supervisord_up` (1 for STARTING,
//! RUNNING, STOPPING) and, for running processes, `node_supervisord_start_time_seconds`
//! (a counter in node_exporter, untyped here: the exposition would append
//! `_total` to a counter's name), labelled `name` and `group`. A failed call (connection, non-2xx status,
//! XML-RPC fault, malformed XML) fails the scrape, as in node_exporter.
//!
//! The HTTP side is a hand-written blocking HTTP/1.1 POST over
//! `std::net::TcpStream` / `std::os::unix::net::UnixStream`: the request is
//! one fixed POST with `Connection: close`, no blocking client among the
//! dependencies speaks HTTP over a unix socket, and a whole HTTP client for
//! it would be more code to trust than this. Connect and I/O share node_exporter's
//! 10 s budget (its go-xmlrpc client's timeout). The unix socket is connected
//! non-blocking, so a listener with a full backlog fails the call at once
//! (`EAGAIN`, as Go's dialer reports it) instead of waiting. Name resolution
//! of the HTTP host (`getaddrinfo`, done per scrape as node_exporter does)
//! has no time limit of its own: it is bounded by the scraper's per-collector
//! deadline (`--collector.timeout`), past which the scrape goes on without
//! this collector. The response (status line, `Content-Length` or chunked
//! body) and the XML-RPC document (parsed with quick-xml, values nested at
//! most 32 deep) are decoded by pure functions. The URL appears in errors and
//! logs only redacted (`user:***@`, as Go's `net/http` prints it).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine as _;
use quick_xml::events::Event;
use quick_xml::Reader;

use crate::flags::{Flags, StringFlag};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const URL: StringFlag =
    StringFlag { name: "collector.supervisord.url", default: "http://localhost:9001/RPC2", help: "XML RPC endpoint." };
const ENV: &str = "SUPERVISORD_URL";
/// go-xmlrpc's `http.Client` timeout (and node_exporter's unix dial timeout).
const TIMEOUT: Duration = Duration::from_secs(10);
/// A response larger than this is refused (a process list is kilobytes).
const MAX_RESPONSE: usize = 64 << 20;
/// How deep XML-RPC values may nest (a process list nests 3 deep).
const MAX_DEPTH: usize = 32;
const BODY: &str = "<?xml version=\"1.0\"?><methodCall><methodName>supervisor.getAllProcessInfo</methodName><params></params></methodCall>";

pub struct Options {
    pub url: String,
}

impl Options {
    pub fn args() -> Vec<clap::Arg> {
        vec![URL.arg()]
    }

    /// The flag, else a non-empty `SUPERVISORD_URL` (kingpin's `Envar`), else the default.
    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        let mut url = URL.get(f);
        if !URL.given(f) {
            if let Some(v) = std::env::var_os(ENV).filter(|v| !v.is_empty()) {
                url = v.to_string_lossy().into_owned();
            }
        }
        Ok(Options { url })
    }
}

/// Where the XML-RPC endpoint is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Http {
        /// `host:port` to connect to.
        addr: String,
        /// The `Host` header (the URL's authority without user info).
        host: String,
        /// Path and query.
        path: String,
        /// `user:password` for basic auth, from the URL.
        auth: Option<String>,
    },
    /// node_exporter dials the socket and posts to `http://unix/RPC2`.
    Unix(PathBuf),
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if let Some(v) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `url` fit for errors and logs: a password in its user info is replaced
/// by `***` (`http://user:***@host/`), as Go's `net/http` prints a URL.
pub fn redact_url(url: &str) -> String {
    let Some(i) = url.find("://") else { return url.to_string() };
    let start = i + 3;
    // not stopping at `#`: a password holding one is still hidden
    let end = url[start..].find(['/', '?']).map_or(url.len(), |j| start + j);
    let Some(at) = url[start..end].rfind('@').map(|j| start + j) else { return url.to_string() };
    match url[start..at].split_once(':') {
        Some((user, _)) => format!("{}{user}:***{}", &url[..start], &url[at..]),
        None => url.to_string(),
    }
}

/// Parses the endpoint URL: `http://[user:pass@]host[:port][/path]` or
/// `unix://[host]/socket/path` (`unix:/socket/path`), as Go's `url.Parse`
/// splits them. Other schemes (`https`) are refused. Errors name the URL
/// redacted ([`redact_url`]).
pub fn parse_url(url: &str) -> Result<Endpoint, String> {
    let shown = redact_url(url);
    let (scheme, rest) = url.split_once(':').ok_or_else(|| format!("{shown:?} is not a URL"))?;
    let rest = rest.split('#').next().unwrap_or("");
    match scheme.to_ascii_lowercase().as_str() {
        "unix" => {
            let rest = rest.split('?').next().unwrap_or("");
            let path = match rest.strip_prefix("//") {
                Some(after) => after.find('/').map(|i| &after[i..]).unwrap_or(""),
                None => rest,
            };
            if path.is_empty() {
                return Err(format!("{shown:?} names no socket path"));
            }
            Ok(Endpoint::Unix(PathBuf::from(percent_decode(path))))
        }
        "http" => {
            let after = rest.strip_prefix("//").ok_or_else(|| format!("{shown:?}: expected http://host"))?;
            let (authority, path_q) = match after.find(['/', '?']) {
                Some(i) => (&after[..i], &after[i..]),
                None => (after, ""),
            };
            let (auth, hostport) = match authority.rsplit_once('@') {
                Some((u, h)) => (Some(percent_decode(u)), h),
                None => (None, authority),
            };
            if hostport.is_empty() {
                return Err(format!("{shown:?} names no host"));
            }
            let has_port = if hostport.starts_with('[') { hostport.contains("]:") } else { hostport.contains(':') };
            let addr = if has_port { hostport.to_string() } else { format!("{hostport}:80") };
            let path = if path_q.is_empty() || path_q.starts_with('?') { format!("/{path_q}") } else { path_q.to_string() };
            let auth = auth.map(|a| if a.contains(':') { a } else { format!("{a}:") });
            Ok(Endpoint::Http { addr, host: hostport.to_string(), path, auth })
        }
        other => Err(format!("unsupported URL scheme {other:?} (http:// or unix:// only)")),
    }
}

/// The request bytes node_exporter's client sends, less `Accept-Encoding`
/// and with `Connection: close`.
pub fn build_request(ep: &Endpoint) -> Vec<u8> {
    let (host, path, auth) = match ep {
        Endpoint::Http { host, path, auth, .. } => (host.as_str(), path.as_str(), auth.as_deref()),
        Endpoint::Unix(_) => ("unix", "/RPC2", None),
    };
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: node-agent\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n",
        BODY.len()
    );
    if let Some(a) = auth {
        req.push_str(&format!("Authorization: Basic {}\r\n", base64::engine::general_purpose::STANDARD.encode(a)));
    }
    req.push_str("\r\n");
    req.push_str(BODY);
    req.into_bytes()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Decodes a chunked body (extensions and trailers ignored).
pub fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = find(raw, b"\r\n").ok_or("truncated chunk size line")?;
        let line = std::str::from_utf8(&raw[..eol]).map_err(|_| "chunk size is not text")?;
        let hex = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(hex, 16).map_err(|_| format!("bad chunk size {hex:?}"))?;
        raw = &raw[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if raw.len() < size {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&raw[..size]);
        raw = raw.get(size..).and_then(|r| r.strip_prefix(b"\r\n")).ok_or("chunk without CRLF")?;
    }
}

/// The status and body framing of an HTTP/1.x response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub code: u16,
    /// `Content-Length`, when given.
    pub length: Option<usize>,
    /// `Transfer-Encoding: chunked` (which wins over a length).
    pub chunked: bool,
}

/// Parses a response head: the bytes before its `\r\n\r\n`.
pub fn parse_head(head: &[u8]) -> Result<Head, String> {
    let head = std::str::from_utf8(head).map_err(|_| "HTTP headers are not text")?;
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or("");
    let mut parts = status.split_whitespace();
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1 response: {status:?}"));
    }
    let code: u16 = parts.next().and_then(|c| c.parse().ok()).ok_or_else(|| format!("bad status line {status:?}"))?;
    let mut length = None;
    let mut chunked = false;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else { continue };
        let v = v.trim();
        if k.eq_ignore_ascii_case("content-length") {
            length = Some(v.parse::<usize>().map_err(|_| format!("bad Content-Length {v:?}"))?);
        } else if k.eq_ignore_ascii_case("transfer-encoding") && v.to_ascii_lowercase().contains("chunked") {
            chunked = true;
        }
    }
    Ok(Head { code, length, chunked })
}

/// Splits a whole HTTP/1.x response into its status code and body
/// (`Content-Length`, chunked, or everything to the close).
pub fn parse_http_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let end = find(raw, b"\r\n\r\n").ok_or("truncated HTTP response (no end of headers)")?;
    let head = parse_head(&raw[..end])?;
    let body = &raw[end + 4..];
    let body = if head.chunked {
        dechunk(body)?
    } else if let Some(n) = head.length {
        body.get(..n).ok_or_else(|| format!("truncated body: {} of {n} bytes", body.len()))?.to_vec()
    } else {
        body.to_vec()
    };
    Ok((head.code, body))
}

/// An XML-RPC value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    Double(f64),
    Array(Vec<Value>),
    Struct(Vec<(String, Value)>),
    Nil,
    /// `dateTime.iso8601`, `base64`: kept as text, unused here.
    Other(String),
}

#[derive(Debug, PartialEq)]
enum Tok {
    Start(String),
    End(String),
    Text(String),
}

fn tokens(xml: &str) -> Result<Vec<Tok>, String> {
    let mut r = Reader::from_str(xml);
    let mut out = Vec::new();
    let name = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let text = |out: &mut Vec<Tok>, s: &str| match out.last_mut() {
        Some(Tok::Text(t)) => t.push_str(s),
        _ => out.push(Tok::Text(s.to_string())),
    };
    loop {
        match r.read_event().map_err(|e| format!("malformed XML at byte {}: {e}", r.buffer_position()))? {
            Event::Start(e) => out.push(Tok::Start(name(e.local_name().as_ref()))),
            Event::End(e) => out.push(Tok::End(name(e.local_name().as_ref()))),
            Event::Empty(e) => {
                let n = name(e.local_name().as_ref());
                out.push(Tok::Start(n.clone()));
                out.push(Tok::End(n));
            }
            Event::Text(t) => text(&mut out, &t.xml10_content().map_err(|e| e.to_string())?),
            Event::CData(t) => text(&mut out, &t.decode().map_err(|e| e.to_string())?),
            Event::GeneralRef(g) => {
                let raw = format!("&{};", g.decode().map_err(|e| e.to_string())?);
                let s = quick_xml::escape::unescape(&raw).map_err(|e| format!("bad entity {raw}: {e}"))?;
                text(&mut out, &s);
            }
            Event::Eof => return Ok(out),
            Event::Decl(_) | Event::Comment(_) | Event::PI(_) | Event::DocType(_) => {}
        }
    }
}

struct Cursor {
    toks: Vec<Tok>,
    i: usize,
}

impl Cursor {
    /// Skips whitespace-only text between elements.
    fn skip_ws(&mut self) {
        while let Some(Tok::Text(t)) = self.toks.get(self.i) {
            if !t.trim().is_empty() {
                break;
            }
            self.i += 1;
        }
    }
    fn start(&mut self) -> Result<String, String> {
        self.skip_ws();
        match self.toks.get(self.i) {
            Some(Tok::Start(n)) => {
                self.i += 1;
                Ok(n.clone())
            }
            other => Err(format!("expected an element, found {other:?}")),
        }
    }
    fn expect_start(&mut self, want: &str) -> Result<(), String> {
        let n = self.start()?;
        if n != want {
            return Err(format!("expected <{want}>, found <{n}>"));
        }
        Ok(())
    }
    fn expect_end(&mut self, want: &str) -> Result<(), String> {
        self.skip_ws();
        match self.toks.get(self.i) {
            Some(Tok::End(n)) if n == want => {
                self.i += 1;
                Ok(())
            }
            other => Err(format!("expected </{want}>, found {other:?}")),
        }
    }
    fn at_end(&mut self, name: &str) -> bool {
        self.skip_ws();
        matches!(self.toks.get(self.i), Some(Tok::End(n)) if n == name)
    }
    /// The text of a leaf element whose start was consumed, and its end.
    fn leaf(&mut self, name: &str) -> Result<String, String> {
        let mut s = String::new();
        if let Some(Tok::Text(t)) = self.toks.get(self.i) {
            s = t.clone();
            self.i += 1;
        }
        match self.toks.get(self.i) {
            Some(Tok::End(n)) if n == name => {
                self.i += 1;
                Ok(s)
            }
            other => Err(format!("<{name}> holds {other:?}, not text")),
        }
    }

    /// A `<value>` whose start was consumed, through its end; `depth` is
    /// how many values enclose it (refused past [`MAX_DEPTH`], so a hostile
    /// reply cannot exhaust the stack).
    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(format!("XML-RPC nesting too deep (more than {MAX_DEPTH} levels)"));
        }
        // an untyped value is a string (XML-RPC spec)
        match self.toks.get(self.i) {
            Some(Tok::End(n)) if n == "value" => {
                self.i += 1;
                return Ok(Value::Str(String::new()));
            }
            Some(Tok::Text(t)) if matches!(self.toks.get(self.i + 1), Some(Tok::End(n)) if n == "value") => {
                let s = t.clone();
                self.i += 2;
                return Ok(Value::Str(s));
            }
            _ => {}
        }
        let ty = self.start()?;
        let v = match ty.as_str() {
            "string" => Value::Str(self.leaf(&ty)?),
            "int" | "i1" | "i2" | "i4" | "i8" => {
                let s = self.leaf(&ty)?;
                Value::Int(s.trim().parse().map_err(|_| format!("bad <{ty}> {s:?}"))?)
            }
            "boolean" => {
                let s = self.leaf(&ty)?;
                match s.trim() {
                    "1" | "true" => Value::Bool(true),
                    "0" | "false" => Value::Bool(false),
                    other => return Err(format!("invalid boolean value {other:?}")),
                }
            }
            "double" => {
                let s = self.leaf(&ty)?;
                Value::Double(s.trim().parse().map_err(|_| format!("bad <double> {s:?}"))?)
            }
            "dateTime.iso8601" | "base64" => Value::Other(self.leaf(&ty)?),
            "nil" => {
                self.leaf(&ty)?;
                Value::Nil
            }
            "array" => {
                self.expect_start("data")?;
                let mut items = Vec::new();
                while !self.at_end("data") {
                    self.expect_start("value")?;
                    items.push(self.value(depth + 1)?);
                }
                self.expect_end("data")?;
                self.expect_end("array")?;
                Value::Array(items)
            }
            "struct" => {
                let mut members = Vec::new();
                while !self.at_end("struct") {
                    self.expect_start("member")?;
                    self.expect_start("name")?;
                    let name = self.leaf("name")?;
                    self.expect_start("value")?;
                    let v = self.value(depth + 1)?;
                    self.expect_end("member")?;
                    members.push((name, v));
                }
                self.expect_end("struct")?;
                Value::Struct(members)
            }
            other => return Err(format!("unknown XML-RPC type <{other}>")),
        };
        self.expect_end("value")?;
        Ok(v)
    }
}

/// Decodes an XML-RPC `methodResponse`: the returned value, or the fault
/// as an error.
pub fn parse_method_response(xml: &str) -> Result<Value, String> {
    let mut c = Cursor { toks: tokens(xml)?, i: 0 };
    c.expect_start("methodResponse").map_err(|e| format!("invalid response: {e}"))?;
    match c.start()?.as_str() {
        "params" => {
            c.expect_start("param").map_err(|e| format!("invalid response: {e}"))?;
            c.expect_start("value").map_err(|e| format!("invalid response: {e}"))?;
            c.value(0)
        }
        "fault" => {
            c.expect_start("value")?;
            let v = c.value(0)?;
            let (mut code, mut msg) = (String::from("?"), String::new());
            if let Value::Struct(m) = &v {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("faultCode", Value::Int(i)) => code = i.to_string(),
                        ("faultString", Value::Str(s)) => msg = s.clone(),
                        _ => {}
                    }
                }
            }
            Err(format!("XML-RPC fault {code}: {msg}"))
        }
        other => Err(format!("invalid response: missing params, found <{other}>")),
    }
}

/// The fields of one `getAllProcessInfo` entry that node_exporter reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Process {
    pub name: String,
    pub group: String,
    pub start: i64,
    pub stop: i64,
    pub now: i64,
    pub state: i64,
    pub statename: String,
    pub exitstatus: i64,
    pub pid: i64,
}

/// The process list of a `getAllProcessInfo` result. As node_exporter,
/// one record is reused across entries, so a field an entry lacks keeps the
/// previous entry's value; a field of the wrong type is an error (a panic
/// in node_exporter).
pub fn processes(v: &Value) -> Result<Vec<Process>, String> {
    let Value::Array(items) = v else { return Err(format!("expected an array of process info, got {v:?}")) };
    let mut p = Process::default();
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::Struct(members) = item else { return Err(format!("expected a struct of process info, got {item:?}")) };
        for (k, v) in members {
            let int = |v: &Value| match v {
                Value::Int(i) => Ok(*i),
                other => Err(format!("process info field {k:?}: expected an int, got {other:?}")),
            };
            let string = |v: &Value| match v {
                Value::Str(s) => Ok(s.clone()),
                other => Err(format!("process info field {k:?}: expected a string, got {other:?}")),
            };
            match k.as_str() {
                "name" => p.name = string(v)?,
                "group" => p.group = string(v)?,
                "start" => p.start = int(v)?,
                "stop" => p.stop = int(v)?,
                "now" => p.now = int(v)?,
                "state" => p.state = int(v)?,
                "statename" => p.statename = string(v)?,
                "exitstatus" => p.exitstatus = int(v)?,
                "pid" => p.pid = int(v)?,
                _ => {}
            }
        }
        out.push(p.clone());
    }
    Ok(out)
}

/// STARTING, RUNNING, STOPPING (supervisord's process states 10, 20, 40).
pub fn is_running(state: i64) -> bool {
    matches!(state, 10 | 20 | 40)
}

/// Writes the families of `procs`.
pub fn write(sink: &mut Sink, procs: &[Process]) {
    for p in procs {
        let labels = [("group", p.group.as_str()), ("name", p.name.as_str())];
        sink.family("node_supervisord_state", "Process State", Kind::Gauge).sample(&labels, p.state as f64);
        sink.family("node_supervisord_exit_status", "Process Exit Status", Kind::Gauge).sample(&labels, p.exitstatus as f64);
        if is_running(p.state) {
            sink.family("node_supervisord_up", "Process Up", Kind::Gauge).sample(&labels, 1.0);
            // node_exporter declares this one a counter; the exposition
            // writes counters with a `_total` suffix, which would rename the
            // series, so it is untyped here (same name and value), as the
            // textfile collector exposes such counters.
            sink.family("node_supervisord_start_time_seconds", "Process start time", Kind::Untyped).sample(&labels, p.start as f64);
        } else {
            sink.family("node_supervisord_up", "Process Up", Kind::Gauge).sample(&labels, 0.0);
        }
        tracing::debug!(group = %p.group, name = %p.name, state = %p.statename, pid = p.pid, "process info");
    }
}

fn remaining(deadline: Instant) -> std::io::Result<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"))
}

/// Writes `req` and reads the whole response, every step within `deadline`.
fn exchange<S: Read + Write>(
    s: &mut S,
    req: &[u8],
    deadline: Instant,
    set_timeouts: impl Fn(&S, Duration) -> std::io::Result<()>,
) -> std::io::Result<Vec<u8>> {
    set_timeouts(s, remaining(deadline)?)?;
    s.write_all(req)?;
    let mut out = Vec::new();
    let mut buf = [0u8; 16 << 10];
    // the head is parsed once, when its end arrives; `total` is then the
    // whole length of a `Content-Length` response
    let (mut head_seen, mut total) = (false, None::<usize>);
    loop {
        set_timeouts(s, remaining(deadline)?)?;
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(out);
        }
        // the head's end may straddle two reads: look from 3 bytes back
        let scan_from = out.len().saturating_sub(3);
        out.extend_from_slice(&buf[..n]);
        if out.len() > MAX_RESPONSE {
            return Err(std::io::Error::other("response too large"));
        }
        if !head_seen {
            if let Some(i) = find(&out[scan_from..], b"\r\n\r\n") {
                head_seen = true;
                let end = scan_from + i;
                match parse_head(&out[..end]) {
                    // a chunked body, or one without a length, runs to the close
                    Ok(h) if !h.chunked => total = h.length.map(|n| end + 4 + n),
                    Ok(_) => {}
                    // a bad head: the caller's parse reports it
                    Err(_) => return Ok(out),
                }
            }
        }
        // stop at a complete Content-Length body even if the peer keeps the connection
        if total.is_some_and(|t| out.len() >= t) {
            return Ok(out);
        }
    }
}

/// Connects to a unix stream socket without blocking on a full backlog:
/// the socket is connected non-blocking, so such a listener fails the call
/// at once with `EAGAIN` (as Go's dialer, which node_exporter uses, reports
/// it); a connect still in progress is waited for until `deadline`. The
/// stream is returned blocking. std has no unix connect with a timeout,
/// hence the few libc calls.
fn connect_unix(path: &std::path::Path, deadline: Instant) -> std::io::Result<UnixStream> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data, for which all zero bytes are a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    // keep a NUL after the path
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "socket path too long or holds a NUL"));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: socket takes no pointers; a negative result is checked below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh, open descriptor that nothing else owns or closes.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is a valid, initialised sockaddr_un of `len` bytes that
    // outlives the call, and `fd` is an open socket.
    let rc = unsafe { libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) };
    let stream = UnixStream::from(fd);
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
        let wait = remaining(deadline)?;
        let mut pfd = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
        let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX).max(1);
        // SAFETY: `pfd` is one valid pollfd, and the count passed is 1.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"));
        }
        if let Some(e) = stream.take_error()? {
            return Err(e);
        }
    }
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// One `supervisor.getAllProcessInfo` round trip: the raw HTTP response.
pub fn call(ep: &Endpoint) -> std::io::Result<Vec<u8>> {
    let deadline = Instant::now() + TIMEOUT;
    let req = build_request(ep);
    match ep {
        Endpoint::Unix(path) => {
            let mut s = connect_unix(path, deadline)?;
            exchange(&mut s, &req, deadline, |s, d| {
                s.set_read_timeout(Some(d))?;
                s.set_write_timeout(Some(d))
            })
        }
        Endpoint::Http { addr, .. } => {
            let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, format!("{addr}: no address"));
            for a in addr.to_socket_addrs()? {
                match TcpStream::connect_timeout(&a, remaining(deadline)?) {
                    Ok(mut s) => {
                        return exchange(&mut s, &req, deadline, |s, d| {
                            s.set_read_timeout(Some(d))?;
                            s.set_write_timeout(Some(d))
                        })
                    }
                    Err(e) => last = e,
                }
            }
            Err(last)
        }
    }
}

/// The processes of a raw HTTP response.
pub fn parse_response(raw: &[u8]) -> Result<Vec<Process>, String> {
    let (code, body) = parse_http_response(raw)?;
    if code / 100 != 2 {
        return Err(format!("HTTP status {code}"));
    }
    let xml = std::str::from_utf8(&body).map_err(|_| "response body is not UTF-8")?;
    processes(&parse_method_response(xml)?)
}

pub struct Collector {
    endpoint: Endpoint,
    /// The URL for errors, its password hidden.
    shown: String,
}

impl Collector {
    pub fn new(o: Options, _p: &Paths) -> Result<Self, ConfigError> {
        let endpoint = parse_url(&o.url).map_err(|msg| URL.invalid(msg))?;
        tracing::warn!(collector = "supervisord", "This collector is deprecated and will be removed in the next major version release.");
        Ok(Collector { endpoint, shown: redact_url(&o.url) })
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let where_ = std::path::Path::new(&self.shown);
        let raw = call(&self.endpoint).map_err(|e| Error::Other(format!("unable to call supervisord: {}: {e}", self.shown).into()))?;
        let procs = parse_response(&raw).map_err(|m| Error::parse(where_, format!("unable to call supervisord: {m}")))?;
        write(sink, &procs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_xml(name: &str, group: &str, state: i64, start: i64, exit: i64) -> String {
        format!(
            "<value><struct>\n<member>\n<name>name</name>\n<value><string>{name}</string></value>\n</member>\n\
             <member>\n<name>group</name>\n<value><string>{group}</string></value>\n</member>\n\
             <member>\n<name>start</name>\n<value><int>{start}</int></value>\n</member>\n\
             <member>\n<name>stop</name>\n<value><int>0</int></value>\n</member>\n\
             <member>\n<name>now</name>\n<value><int>1700000100</int></value>\n</member>\n\
             <member>\n<name>state</name>\n<value><int>{state}</int></value>\n</member>\n\
             <member>\n<name>statename</name>\n<value><string>X</string></value>\n</member>\n\
             <member>\n<name>spawnerr</name>\n<value><string></string></value>\n</member>\n\
             <member>\n<name>exitstatus</name>\n<value><int>{exit}</int></value>\n</member>\n\
             <member>\n<name>logfile</name>\n<value><string>/tmp/x&amp;y.log</string></value>\n</member>\n\
             <member>\n<name>pid</name>\n<value><int>42</int></value>\n</member>\n\
             </struct></value>\n"
        )
    }

    /// What supervisord 4 (Python's xmlrpc.client.dumps) sends.
    fn response(items: &str) -> String {
        format!("<?xml version='1.0'?>\n<methodResponse>\n<params>\n<param>\n<value><array><data>\n{items}</data></array></value>\n</param>\n</params>\n</methodResponse>\n")
    }

    fn http(body: &str) -> Vec<u8> {
        format!("HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
    }

    #[test]
    fn parses_process_info() {
        let xml = response(&(proc_xml("web", "apps", 20, 1_700_000_000, 0) + &proc_xml("job", "job", 100, 1_699_999_000, 3)));
        let procs = parse_response(&http(&xml)).unwrap();
        assert_eq!(procs.len(), 2);
        assert_eq!(
            procs[0],
            Process {
                name: "web".into(),
                group: "apps".into(),
                start: 1_700_000_000,
                stop: 0,
                now: 1_700_000_100,
                state: 20,
                statename: "X".into(),
                exitstatus: 0,
                pid: 42
            }
        );
        assert_eq!((procs[1].state, procs[1].exitstatus), (100, 3));
        let mut sink = Sink::new();
        write(&mut sink, &procs);
        let mut rows: Vec<String> = crate::testutil::rows(&sink)
            .into_iter()
            .map(|(n, l, v)| format!("{n}{{{}}} {v}", l.iter().map(|(a, b)| format!("{a}={b}")).collect::<Vec<_>>().join(",")))
            .collect();
        rows.sort();
        for f in sink.families() {
            let want = if f.name() == "node_supervisord_start_time_seconds" { Kind::Untyped } else { Kind::Gauge };
            assert_eq!(f.kind(), want, "{}", f.name());
        }
        assert_eq!(
            rows,
            [
                "node_supervisord_exit_status{group=apps,name=web} 0",
                "node_supervisord_exit_status{group=job,name=job} 3",
                "node_supervisord_start_time_seconds{group=apps,name=web} 1700000000",
                "node_supervisord_state{group=apps,name=web} 20",
                "node_supervisord_state{group=job,name=job} 100",
                "node_supervisord_up{group=apps,name=web} 1",
                "node_supervisord_up{group=job,name=job} 0",
            ]
        );
    }

    #[test]
    fn running_states() {
        for (s, up) in [(0, false), (10, true), (20, true), (30, false), (40, true), (100, false), (200, false), (1000, false)] {
            assert_eq!(is_running(s), up, "state {s}");
        }
    }

    #[test]
    fn empty_list_and_xml_details() {
        assert_eq!(parse_response(&http(&response(""))).unwrap(), vec![]);
        // i4, untyped string value, CDATA, char refs, comments
        let xml = "<?xml version=\"1.0\"?><!-- c --><methodResponse><params><param><value><array><data><value><struct>\
                   <member><name>name</name><value>a&#x62;c</value></member>\
                   <member><name>group</name><value><string><![CDATA[g<1>]]></string></value></member>\
                   <member><name>state</name><value><i4> 20 </i4></value></member>\
                   <member><name>start</name><value><i8>5</i8></value></member>\
                   <member><name>x</name><value><boolean>1</boolean></value></member>\
                   <member><name>y</name><value><double>1.5</double></value></member>\
                   <member><name>z</name><value><nil/></value></member>\
                   </struct></value></data></array></value></param></params></methodResponse>";
        let p = processes(&parse_method_response(xml).unwrap()).unwrap();
        assert_eq!((p[0].name.as_str(), p[0].group.as_str(), p[0].state, p[0].start), ("abc", "g<1>", 20, 5));
    }

    #[test]
    fn fields_carry_over_like_node_exporter() {
        let xml = response(
            &(proc_xml("a", "g", 20, 7, 0)
                + "<value><struct><member><name>name</name><value><string>b</string></value></member></struct></value>"),
        );
        let p = parse_response(&http(&xml)).unwrap();
        assert_eq!((p[1].name.as_str(), p[1].group.as_str(), p[1].state, p[1].start), ("b", "g", 20, 7));
    }

    #[test]
    fn faults_and_bad_shapes_are_errors() {
        let fault = "<?xml version='1.0'?><methodResponse><fault><value><struct>\
                     <member><name>faultCode</name><value><int>1</int></value></member>\
                     <member><name>faultString</name><value><string>UNKNOWN_METHOD</string></value></member>\
                     </struct></value></fault></methodResponse>";
        let e = parse_response(&http(fault)).unwrap_err();
        assert!(e.contains("fault 1: UNKNOWN_METHOD"), "{e}");
        // not an array; an array of non-structs; a wrongly typed field
        let scalar = "<methodResponse><params><param><value><int>1</int></value></param></params></methodResponse>";
        assert!(parse_response(&http(scalar)).is_err());
        assert!(parse_response(&http(&response("<value><int>1</int></value>"))).is_err());
        let bad_type =
            response("<value><struct><member><name>state</name><value><string>RUNNING</string></value></member></struct></value>");
        assert!(parse_response(&http(&bad_type)).unwrap_err().contains("state"));
        // HTTP errors
        let e = parse_response(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n").unwrap_err();
        assert!(e.contains("401"), "{e}");
        assert!(parse_response(b"garbage").is_err());
        assert!(parse_response(b"SSH-2.0-x\r\n\r\n").is_err());
    }

    #[test]
    fn malformed_xml_never_panics() {
        let good = response(&proc_xml("a", "g", 20, 7, 0));
        for bad in [
            "",
            "<methodResponse>",
            "<methodResponse><params><param><value><int>1</value></param></params></methodResponse>",
            "<methodResponse><params><param><value><int>x</int></value></param></params></methodResponse>",
            "<methodResponse><params><param><value><boolean>2</boolean></value></param></params></methodResponse>",
            "<methodResponse><params><param><value><array><data><value><struct><member><value><int>1</int></value></member></struct></value></data></array></value></param></params></methodResponse>",
            "<methodResponse><params><param><value><blob>1</blob></value></param></params></methodResponse>",
            "<methodResponse><params><param><value><string>&bogus;</string></value></param></params></methodResponse>",
            "<notxml",
            "<a></b>",
        ] {
            assert!(parse_response(&http(bad)).is_err(), "{bad:?}");
        }
        // every truncation of a good document is refused, never a panic
        for n in 0..good.len() {
            if let Some(s) = good.get(..n) {
                let _ = parse_method_response(s).and_then(|v| processes(&v));
            }
        }
    }

    #[test]
    fn http_framing() {
        let body = "<methodResponse/>";
        let chunked = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n<meth\r\n{:x};ext=1\r\n{}\r\n0\r\n\r\n",
            body.len() - 5,
            &body[5..]
        );
        assert_eq!(parse_http_response(chunked.as_bytes()).unwrap(), (200, body.as_bytes().to_vec()));
        let to_close = format!("HTTP/1.0 200 OK\r\nServer: x\r\n\r\n{body}");
        assert_eq!(parse_http_response(to_close.as_bytes()).unwrap().1, body.as_bytes());
        assert!(parse_http_response(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc").is_err());
        assert!(parse_http_response(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
        assert!(dechunk(b"zz\r\n").is_err());
        assert!(dechunk(b"5\r\nab").is_err());
    }

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("http://localhost:9001/RPC2").unwrap(),
            Endpoint::Http { addr: "localhost:9001".into(), host: "localhost:9001".into(), path: "/RPC2".into(), auth: None }
        );
        assert_eq!(
            parse_url("http://u:p%40ss@127.0.0.1/RPC2?x=1").unwrap(),
            Endpoint::Http { addr: "127.0.0.1:80".into(), host: "127.0.0.1".into(), path: "/RPC2?x=1".into(), auth: Some("u:p@ss".into()) }
        );
        assert_eq!(
            parse_url("http://[::1]:9001").unwrap(),
            Endpoint::Http { addr: "[::1]:9001".into(), host: "[::1]:9001".into(), path: "/".into(), auth: None }
        );
        assert_eq!(parse_url("unix:///run/supervisor.sock").unwrap(), Endpoint::Unix("/run/supervisor.sock".into()));
        assert_eq!(parse_url("unix://host/tmp/s.sock").unwrap(), Endpoint::Unix("/tmp/s.sock".into()));
        assert_eq!(parse_url("unix:/tmp/s.sock").unwrap(), Endpoint::Unix("/tmp/s.sock".into()));
        assert!(parse_url("https://localhost:9001/RPC2").is_err());
        assert!(parse_url("localhost").is_err());
        assert!(parse_url("unix://").is_err());
        assert!(parse_url("http://").is_err());
        let req = String::from_utf8(build_request(&parse_url("http://u:p@h:1/RPC2").unwrap())).unwrap();
        assert!(req.starts_with("POST /RPC2 HTTP/1.1\r\nHost: h:1\r\n"), "{req}");
        assert!(req.contains("Authorization: Basic dTpw\r\n"), "{req}");
        assert!(req.ends_with(BODY));
        let req = String::from_utf8(build_request(&Endpoint::Unix("/s".into()))).unwrap();
        assert!(req.starts_with("POST /RPC2 HTTP/1.1\r\nHost: unix\r\n"), "{req}");
    }

    #[test]
    fn bad_url_fails_construction_naming_the_flag() {
        let p = crate::testutil::paths(std::path::Path::new("/nonexistent"));
        let e = Collector::new(Options { url: "ftp://x/RPC2".into() }, &p).err().unwrap();
        assert!(e.to_string().contains("--collector.supervisord.url"), "{e}");
    }

    #[test]
    fn passwords_never_reach_errors() {
        use crate::Collector as _;
        assert_eq!(redact_url("http://agent:s3cret@127.0.0.1:9001/RPC2"), "http://agent:***@127.0.0.1:9001/RPC2");
        assert_eq!(redact_url("http://a:p@ss:w@h/x?y=1@2"), "http://a:***@h/x?y=1@2");
        assert_eq!(redact_url("http://a:p#s@h/"), "http://a:***@h/");
        for same in ["http://agent@h:1/RPC2", "http://h:1/RPC2", "unix:///run/s.sock", "x"] {
            assert_eq!(redact_url(same), same);
        }
        let p = crate::testutil::paths(std::path::Path::new("/nonexistent"));
        // a bad URL at start-up
        for url in ["http://agent:s3cret@", "ftp://agent:s3cret@h/RPC2"] {
            let e = Collector::new(Options { url: url.into() }, &p).err().unwrap();
            assert!(!format!("{e} {e:?}").contains("s3cret"), "{e}");
        }
        // a failed connection
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut c = Collector::new(Options { url: format!("http://agent:s3cret@127.0.0.1:{port}/RPC2") }, &p).unwrap();
        let e = c.update(&mut Sink::new()).unwrap_err();
        let msg = format!("{e} {e:?}");
        assert!(!msg.contains("s3cret") && msg.contains("agent:***@"), "{msg}");
        // a malformed reply (the parse error's path is the URL)
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut req = [0u8; 4096];
            let _ = s.read(&mut req);
            s.write_all(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n").unwrap();
        });
        let mut c = Collector::new(Options { url: format!("http://agent:s3cret@127.0.0.1:{port}/RPC2") }, &p).unwrap();
        let e = c.update(&mut Sink::new()).unwrap_err();
        server.join().unwrap();
        let msg = format!("{e} {e:?}");
        assert!(msg.contains("500") && !msg.contains("s3cret"), "{msg}");
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let arrays = |n: usize| {
            format!(
                "<methodResponse><params><param><value>{}<int>1</int>{}</value></param></params></methodResponse>",
                "<array><data><value>".repeat(n),
                "</value></data></array>".repeat(n)
            )
        };
        let n = 10_000;
        let e = parse_method_response(&arrays(n)).unwrap_err();
        assert!(e.contains("nesting too deep"), "{e}");
        assert!(parse_method_response(&arrays(MAX_DEPTH + 1)).unwrap_err().contains("nesting too deep"));
        assert!(parse_method_response(&arrays(MAX_DEPTH)).is_ok());
        // structs count too
        let deep_struct = format!(
            "<methodResponse><params><param><value>{}<int>1</int>{}</value></param></params></methodResponse>",
            "<struct><member><name>a</name><value>".repeat(n),
            "</value></member></struct>".repeat(n)
        );
        assert!(parse_method_response(&deep_struct).unwrap_err().contains("nesting too deep"));
    }

    /// A peer that answers in `chunk`-byte pieces and then neither closes
    /// nor sends more (a read past the reply fails the test).
    struct Trickle {
        reply: Vec<u8>,
        at: usize,
        chunk: usize,
        reads: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            assert!(self.at < self.reply.len(), "read past a complete response");
            let n = self.chunk.min(buf.len()).min(self.reply.len() - self.at);
            buf[..n].copy_from_slice(&self.reply[self.at..self.at + n]);
            self.at += n;
            self.reads += 1;
            Ok(n)
        }
    }

    impl Write for Trickle {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn exchange_stops_at_the_content_length() {
        let body = response(&proc_xml("a", "g", 20, 7, 0)).repeat(50);
        let reply = http(&body);
        let deadline = Instant::now() + TIMEOUT;
        // the head's end split across reads at every offset, and big reads
        for chunk in [1, 2, 3, 5, 7, 16 << 10] {
            let mut t = Trickle { reply: reply.clone(), at: 0, chunk, reads: 0 };
            let got = exchange(&mut t, b"req", deadline, |_, _| Ok(())).unwrap();
            assert_eq!(got, reply, "chunk {chunk}");
            assert_eq!(parse_http_response(&got).unwrap().1, body.as_bytes());
        }
        // a bad head ends the exchange at once, for the parse to report
        let mut t = Trickle { reply: b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\nmore".to_vec(), at: 0, chunk: 8, reads: 0 };
        let got = exchange(&mut t, b"req", deadline, |_, _| Ok(())).unwrap();
        assert!(parse_http_response(&got).is_err());
        assert!(t.reads <= 5, "{} reads", t.reads);
    }

    #[test]
    fn unix_connect_to_a_full_backlog_fails_at_once() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // SAFETY: `l` is an open, bound socket; listen again only sets its backlog.
        assert_eq!(unsafe { libc::listen(l.as_raw_fd(), 0) }, 0);
        let t = Instant::now();
        let mut held = Vec::new();
        let err = loop {
            match connect_unix(&path, Instant::now() + TIMEOUT) {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
            assert!(held.len() < 100, "the backlog never filled");
        };
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock, "{err}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // a connected stream is blocking, and a missing socket is an error
        assert!(!held.is_empty());
        drop(l);
        assert!(connect_unix(&dir.path().join("none"), Instant::now() + TIMEOUT).is_err());
        assert!(connect_unix(std::path::Path::new(&"/x".repeat(100)), Instant::now() + TIMEOUT).is_err());
    }

    #[test]
    fn connection_refused_fails_the_scrape() {
        use crate::Collector as _;
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let p = crate::testutil::paths(std::path::Path::new("/nonexistent"));
        let mut c = Collector::new(Options { url: format!("http://127.0.0.1:{port}/RPC2") }, &p).unwrap();
        let e = c.update(&mut Sink::new()).unwrap_err();
        assert!(!e.is_no_data() && e.to_string().contains("unable to call supervisord"), "{e}");
    }
}

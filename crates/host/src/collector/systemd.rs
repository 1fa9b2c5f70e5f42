//! `systemd`: the state of systemd's units, read over D-Bus as node_exporter
//! 1.12 reads them through coreos/go-systemd: the manager's `Version`,
//! `Virtualization` and `SystemState` properties and `ListUnits`, then per
//! unit (those passing `--collector.systemd.unit-include`/`-exclude`, both
//! anchored, and loaded) the properties of its unit object
//! (`/org/freedesktop/systemd1/unit/<bus-escaped name>`): service and mount
//! `Type`, service `NRestarts`, `TasksCurrent`, `TasksMax`, unit
//! `ActiveEnterTimestamp`, timer `LastTriggerUSec` and socket `NAccepted`,
//! `NConnections`, `NRefused`. Exported as `node_systemd_unit_state` (five
//! states per unit), `node_systemd_units` (per active state, over all
//! units), `node_systemd_system_running`, `node_systemd_version`,
//! `node_systemd_virtualization_info` and the per-unit service, socket and
//! timer families. It talks to the system bus (`DBUS_SYSTEM_BUS_ADDRESS`, or
//! the default socket) or, with `--collector.systemd.private`, peer to peer
//! to systemd's `/run/systemd/private`. As go-systemd's `NewWithContext`,
//! which node_exporter uses, when the system bus cannot be reached and the
//! process runs as root (effective uid 0), it connects peer to peer to the
//! private socket instead (an error then names both attempts). The
//! connection is kept between scrapes (node_exporter opens one per scrape)
//! and dropped on a failure, and every call, the connection's set-up
//! included, has a timeout. A unit's property that systemd answers with an
//! error only leaves out its sample, as in node_exporter; a call that times
//! out or whose connection fails ends the scrape with an error at once (a
//! stalled systemd would otherwise cost one timeout per unit property).
//!
//! The D-Bus plumbing is in [`crate::dbus`], shared with the
//! `logind` collector.

use std::time::Duration;

use regex::Regex;
use zbus::blocking::Connection;
use zbus::zvariant::OwnedObjectPath;

use crate::dbus::{get_property, Bus, CallError, Prop, Target, DEFAULT_TIMEOUT};

use crate::flags::{self, BoolFlag, Flags, Hidden, StringFlag};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const INCLUDE: StringFlag = StringFlag {
    name: "collector.systemd.unit-include",
    default: ".+",
    help: "Regexp of systemd units to include. Units must both match include and not match exclude to be included.",
};
/// Read through [`INCLUDE`] (`StringFlag::value`).
pub const OLD_INCLUDE: Hidden<StringFlag> =
    Hidden(StringFlag { name: "collector.systemd.unit-whitelist", default: "", help: "DEPRECATED: Use --collector.systemd.unit-include" });
pub const EXCLUDE: StringFlag = StringFlag {
    name: "collector.systemd.unit-exclude",
    default: ".+\\.(automount|device|mount|scope|slice)",
    help: "Regexp of systemd units to exclude. Units must both match include and not match exclude to be included.",
};
/// Read through [`EXCLUDE`] (`StringFlag::value`).
pub const OLD_EXCLUDE: Hidden<StringFlag> =
    Hidden(StringFlag { name: "collector.systemd.unit-blacklist", default: "", help: "DEPRECATED: Use collector.systemd.unit-exclude" });
pub const PRIVATE: Hidden<BoolFlag> = Hidden(BoolFlag {
    name: "collector.systemd.private",
    default: false,
    help: "Establish a private, direct connection to systemd without dbus (Strongly discouraged since it requires root. For testing purposes only).",
});
pub const TASKS: BoolFlag = BoolFlag {
    name: "collector.systemd.enable-task-metrics",
    default: false,
    help: "Enables service unit tasks metrics unit_tasks_current and unit_tasks_max",
};
pub const RESTARTS: BoolFlag = BoolFlag {
    name: "collector.systemd.enable-restarts-metrics",
    default: false,
    help: "Enables service unit metric service_restart_total",
};
pub const START_TIME: BoolFlag = BoolFlag {
    name: "collector.systemd.enable-start-time-metrics",
    default: false,
    help: "Enables service unit metric unit_start_time_seconds",
};

/// systemd's private socket, as go-systemd dials it (not under the rootfs).
pub const PRIVATE_ADDRESS: &str = "unix:path=/run/systemd/private";

/// The minimum systemd version with the manager's `SystemState` and the
/// timers' `LastTriggerUSec`.
const MIN_VERSION_SYSTEM_STATE: f64 = 212.0;

/// The active states node_exporter reports, in its order.
pub const UNIT_STATES: [&str; 5] = ["active", "activating", "deactivating", "inactive", "failed"];

const DEST: &str = "org.freedesktop.systemd1";
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";

pub struct Options {
    /// `^(?:include)$`.
    pub include: Regex,
    /// `^(?:exclude)$`.
    pub exclude: Regex,
    pub private: bool,
    pub task_metrics: bool,
    pub restarts_metrics: bool,
    pub start_time_metrics: bool,
    /// A D-Bus address to use instead of the system bus (or, with
    /// `private`, of systemd's private socket); for tests.
    pub address: Option<String>,
    /// The peer address tried, as root, when the bus cannot be reached
    /// (go-systemd's fallback): [`PRIVATE_ADDRESS`] from the flags; `None`
    /// for no fallback. Not used with `private`.
    pub fallback: Option<String>,
    /// The bound of one D-Bus call and of a connection's set-up.
    pub timeout: Duration,
}

impl Options {
    pub fn args() -> Vec<clap::Arg> {
        flags::args(&[&INCLUDE, &OLD_INCLUDE, &EXCLUDE, &OLD_EXCLUDE, &PRIVATE, &TASKS, &RESTARTS, &START_TIME])
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        // `value` resolves the deprecated whitelist/blacklist spellings,
        // with node_exporter's warning, or its error when both are given.
        let (include, _) = INCLUDE.value(f)?;
        let (exclude, _) = EXCLUDE.value(f)?;
        Ok(Options {
            include: anchored(INCLUDE.name, &include)?,
            exclude: anchored(EXCLUDE.name, &exclude)?,
            private: PRIVATE.get(f),
            task_metrics: TASKS.get(f),
            restarts_metrics: RESTARTS.get(f),
            start_time_metrics: START_TIME.get(f),
            address: None,
            fallback: Some(PRIVATE_ADDRESS.to_string()),
            timeout: DEFAULT_TIMEOUT,
        })
    }
}

/// `^(?:value)$`, as node_exporter compiles the unit patterns.
pub fn anchored(flag: &str, value: &str) -> Result<Regex, ConfigError> {
    Regex::new(&format!("^(?:{value})$")).map_err(|e| ConfigError::Regex {
        flag: flag.to_string(),
        value: value.to_string(),
        source: Box::new(e),
    })
}

/// Go's `strconv.Quote`, as godbus prints a string variant (go-systemd's
/// `GetManagerProperty` returns that text).
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\x7f' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => {
                let n = c as u32;
                if n <= 0xffff {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// ---------------------------------------------------------------------------
// The collector's semantics, over any source of systemd's answers.

/// One entry of `ListUnits`, the fields node_exporter reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    pub name: String,
    pub load_state: String,
    pub active_state: String,
}

/// What the collector asks systemd.
pub trait Source {
    /// A property of the manager (`org.freedesktop.systemd1.Manager`).
    fn manager_property(&mut self, name: &str) -> Result<Prop, CallError>;
    fn list_units(&mut self) -> Result<Vec<Unit>, CallError>;
    /// A property of `unit`'s object on `iface` (`org.freedesktop.systemd1.<kind>`).
    fn unit_property(&mut self, unit: &str, iface: &str, name: &str) -> Result<Prop, CallError>;
}

/// go-systemd's `PathBusEscape`: every byte but `[A-Za-z0-9]` (and a
/// leading digit) as `_` and its hex value.
pub fn bus_escape(s: &str) -> String {
    if s.is_empty() {
        return "_".to_string();
    }
    let mut out = String::with_capacity(s.len());
    for (i, b) in s.bytes().enumerate() {
        if b.is_ascii_alphabetic() || (b.is_ascii_digit() && i > 0) {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:x}"));
        }
    }
    out
}

/// The object path of `unit`, as go-systemd computes it.
pub fn unit_path(unit: &str) -> String {
    format!("/org/freedesktop/systemd1/unit/{}", bus_escape(unit))
}

/// The version node_exporter reads from the manager's `Version` text (the
/// first `[0-9]{3,}(\.[0-9]+)?`) and the label (the text without its
/// surrounding quotes); `(0, "")` when there is no number.
pub fn parse_version(quoted: &str) -> (f64, String) {
    static RE: std::sync::OnceLock<Option<Regex>> = std::sync::OnceLock::new();
    let text = quoted.strip_suffix('"').unwrap_or(quoted);
    let text = text.strip_prefix('"').unwrap_or(text);
    let re = RE.get_or_init(|| Regex::new(r"[0-9]{3,}(\.[0-9]+)?").ok());
    match re.as_ref().and_then(|re| re.find(text)).and_then(|m| m.as_str().parse::<f64>().ok()) {
        Some(v) => (v, text.to_string()),
        None => (0.0, String::new()),
    }
}

/// The `virtualization_type` label for the manager's `Virtualization`
/// text: without quotes, `none` when empty.
pub fn virtualization_label(quoted: &str) -> String {
    let t = quoted.trim_matches('"');
    if t.is_empty() {
        "none".to_string()
    } else {
        t.to_string()
    }
}

/// godbus's text of a manager property, as go-systemd returns it
/// (strings quoted; other types only as far as the collector can tell).
fn manager_text(p: &Prop) -> String {
    match p {
        Prop::Str(s) => go_quote(s),
        Prop::Bool(b) => b.to_string(),
        Prop::U32(n) => format!("@u {n}"),
        Prop::U64(n) => format!("@t {n}"),
        Prop::Other(text) => text.clone(),
    }
}

/// Units counted by active state, over every listed unit: the five known
/// states always (0 when none), any other state seen as well.
pub fn summarize(units: &[Unit]) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = UNIT_STATES.iter().map(|s| (s.to_string(), 0.0)).collect();
    for u in units {
        match out.iter_mut().find(|(s, _)| *s == u.active_state) {
            Some((_, n)) => *n += 1.0,
            None => out.push((u.active_state.clone(), 1.0)),
        }
    }
    out
}

/// The units node_exporter reports on: matching `include`, not matching
/// `exclude`, and loaded.
pub fn filter_units<'a>(units: &'a [Unit], include: &Regex, exclude: &Regex) -> Vec<&'a Unit> {
    units.iter().filter(|u| include.is_match(&u.name) && !exclude.is_match(&u.name) && u.load_state == "loaded").collect()
}

fn iface(kind: &str) -> String {
    format!("org.freedesktop.systemd1.{kind}")
}

/// One scrape's samples from `src`, as node_exporter's `Update`: a failure
/// of `ListUnits` or (from version 212) of `SystemState` fails the
/// collector; a unit's missing property only leaves out its sample.
pub fn collect(src: &mut dyn Source, o: &Options, sink: &mut Sink) -> Result<(), CallError> {
    let (version, version_label) = match src.manager_property("Version") {
        Ok(p) => parse_version(&manager_text(&p)),
        Err(e) if e.lost => return Err(e.context("couldn't get the Version property")),
        Err(e) => {
            tracing::debug!(err = %e, "systemd: unable to get the Version property, defaulting to 0");
            (0.0, String::new())
        }
    };
    sink.family("node_systemd_version", "Detected systemd version", Kind::Gauge).sample(&[("version", &version_label)], version);
    let virt = match src.manager_property("Virtualization") {
        Ok(p) => virtualization_label(&manager_text(&p)),
        Err(e) if e.lost => return Err(e.context("couldn't get the Virtualization property")),
        Err(e) => {
            tracing::debug!(err = %e, "systemd: could not get the Virtualization property");
            "unknown".to_string()
        }
    };
    sink.family("node_systemd_virtualization_info", "Detected virtualization technology", Kind::Gauge)
        .sample(&[("virtualization_type", &virt)], 1.0);

    let all = src.list_units().map_err(|e| e.context("couldn't get units"))?;
    {
        let mut f = sink.family("node_systemd_units", "Summary of systemd unit states", Kind::Gauge);
        for (state, n) in summarize(&all) {
            f.sample(&[("state", &state)], n);
        }
    }
    let units = filter_units(&all, &o.include, &o.exclude);
    let new_enough = version >= MIN_VERSION_SYSTEM_STATE;

    for u in &units {
        let name = u.name.as_str();
        let kind = if name.ends_with(".service") {
            Some("Service")
        } else if name.ends_with(".mount") {
            Some("Mount")
        } else {
            None
        };
        let unit_type = match kind {
            None => String::new(),
            Some(kind) => match src.unit_property(name, &iface(kind), "Type") {
                Ok(Prop::Str(t)) => t,
                Ok(p) => {
                    tracing::debug!(unit = name, "systemd: unit Type is not a string: {p:?}");
                    String::new()
                }
                Err(e) if e.lost => return Err(e.context(&format!("couldn't get the Type of {name}"))),
                Err(e) => {
                    tracing::debug!(unit = name, err = %e, "systemd: couldn't get unit type");
                    String::new()
                }
            },
        };
        let mut f = sink.family("node_systemd_unit_state", "Systemd unit", Kind::Gauge);
        for state in UNIT_STATES {
            let v = if state == u.active_state { 1.0 } else { 0.0 };
            f.sample(&[("name", name), ("state", state), ("type", &unit_type)], v);
        }
        if o.restarts_metrics && name.ends_with(".service") {
            // NRestarts exists from systemd 235.
            if let Some(n) = unit_number(src, name, "Service", "NRestarts", Prop::as_u32)? {
                sink.family("node_systemd_service_restart_total", "Service unit count of Restart triggers", Kind::Counter)
                    .sample(&[("name", name)], f64::from(n));
            }
        }
    }

    if o.start_time_metrics {
        for u in &units {
            let usec = if u.active_state != "active" {
                0
            } else {
                match unit_number(src, &u.name, "Unit", "ActiveEnterTimestamp", Prop::as_u64)? {
                    Some(t) => t,
                    None => continue,
                }
            };
            sink.family("node_systemd_unit_start_time_seconds", "Start time of the unit since unix epoch in seconds.", Kind::Gauge)
                .sample(&[("name", &u.name)], usec as f64 / 1e6);
        }
    }

    if o.task_metrics {
        for u in units.iter().filter(|u| u.name.ends_with(".service")) {
            for (prop, family, help) in [
                ("TasksCurrent", "node_systemd_unit_tasks_current", "Current number of tasks per Systemd unit"),
                ("TasksMax", "node_systemd_unit_tasks_max", "Maximum number of tasks per Systemd unit"),
            ] {
                // u64::MAX is "no value" (no accounting, no limit).
                if let Some(n) = unit_number(src, &u.name, "Service", prop, Prop::as_u64)?.filter(|&n| n != u64::MAX) {
                    sink.family(family, help, Kind::Gauge).sample(&[("name", &u.name)], n as f64);
                }
            }
        }
    }

    if new_enough {
        for u in units.iter().filter(|u| u.name.ends_with(".timer")) {
            if let Some(t) = unit_number(src, &u.name, "Timer", "LastTriggerUSec", Prop::as_u64)? {
                sink.family("node_systemd_timer_last_trigger_seconds", "Seconds since epoch of last trigger.", Kind::Gauge)
                    .sample(&[("name", &u.name)], t as f64 / 1e6);
            }
        }
    }

    for u in units.iter().filter(|u| u.name.ends_with(".socket")) {
        let name = u.name.as_str();
        let Some(accepted) = unit_number(src, name, "Socket", "NAccepted", Prop::as_u32)? else { continue };
        sink.family("node_systemd_socket_accepted_connections_total", "Total number of accepted socket connections", Kind::Counter)
            .sample(&[("name", name)], f64::from(accepted));
        let Some(current) = unit_number(src, name, "Socket", "NConnections", Prop::as_u32)? else { continue };
        sink.family("node_systemd_socket_current_connections", "Current number of socket connections", Kind::Gauge)
            .sample(&[("name", name)], f64::from(current));
        // NRefused exists from systemd 239; node_exporter exports it as a gauge.
        if let Some(refused) = unit_number(src, name, "Socket", "NRefused", Prop::as_u32)? {
            sink.family("node_systemd_socket_refused_connections_total", "Total number of refused socket connections", Kind::Gauge)
                .sample(&[("name", name)], f64::from(refused));
        }
    }

    if new_enough {
        let state = src.manager_property("SystemState").map_err(|e| e.context("couldn't get system state"))?;
        let running = if manager_text(&state) == "\"running\"" { 1.0 } else { 0.0 };
        sink.family("node_systemd_system_running", "Whether the system is operational (see 'systemctl is-system-running')", Kind::Gauge)
            .sample(&[], running);
    }
    Ok(())
}

/// A numeric property of a unit, or `None` (logged at debug) when systemd
/// answers with an error or the value has another type; an error when the
/// call itself failed ([`CallError::lost`]: I/O, timeout).
fn unit_number<T>(src: &mut dyn Source, unit: &str, kind: &str, prop: &str, get: fn(&Prop) -> Option<T>) -> Result<Option<T>, CallError> {
    match src.unit_property(unit, &iface(kind), prop) {
        Ok(p) => {
            let v = get(&p);
            if v.is_none() {
                tracing::debug!(unit, "systemd: unit {prop} has an unexpected type: {p:?}");
            }
            Ok(v)
        }
        Err(e) if e.lost => Err(e.context(&format!("couldn't get the {prop} of {unit}"))),
        Err(e) => {
            tracing::debug!(unit, err = %e, "systemd: couldn't get unit {prop}");
            Ok(None)
        }
    }
}

/// Where to connect when the bus cannot be reached: go-systemd's
/// `NewWithContext` dials systemd's private socket then, if the process
/// runs as root. Never with `private` (already the private socket).
pub fn fallback_target(private: bool, fallback: Option<&str>, euid: u32) -> Option<Target> {
    match fallback {
        Some(a) if !private && euid == 0 => Some(Target::Peer(a.to_string())),
        _ => None,
    }
}

/// systemd over a D-Bus connection.
struct DbusSource<'a> {
    conn: &'a Connection,
}

impl Source for DbusSource<'_> {
    fn manager_property(&mut self, name: &str) -> Result<Prop, CallError> {
        get_property(self.conn, DEST, MANAGER_PATH, MANAGER, name)
    }

    fn list_units(&mut self) -> Result<Vec<Unit>, CallError> {
        type Entry = (String, String, String, String, String, String, OwnedObjectPath, u32, String, OwnedObjectPath);
        let reply = self.conn.call_method(Some(DEST), MANAGER_PATH, Some(MANAGER), "ListUnits", &())?;
        let entries: Vec<Entry> = reply.body().deserialize()?;
        Ok(entries.into_iter().map(|(name, _desc, load_state, active_state, ..)| Unit { name, load_state, active_state }).collect())
    }

    fn unit_property(&mut self, unit: &str, iface: &str, name: &str) -> Result<Prop, CallError> {
        get_property(self.conn, DEST, &unit_path(unit), iface, name)
    }
}

pub struct Collector {
    o: Options,
    bus: Bus,
    /// systemd's private socket, when the bus cannot be reached.
    fallback: Option<Bus>,
}

impl Collector {
    pub fn new(o: Options, _p: &Paths) -> Result<Self, ConfigError> {
        let target = match (&o.address, o.private) {
            (Some(a), false) => Target::Address(a.clone()),
            (Some(a), true) => Target::Peer(a.clone()),
            (None, false) => Target::System,
            (None, true) => Target::Peer(PRIVATE_ADDRESS.to_string()),
        };
        let bus = Bus::new(target, o.timeout);
        let fallback = fallback_target(o.private, o.fallback.as_deref(), crate::dbus::euid()).map(|t| Bus::new(t, o.timeout));
        Ok(Collector { o, bus, fallback })
    }

    /// The kept connection, else the bus, else (as root) the private socket.
    fn connect(&mut self) -> Result<(Connection, bool), CallError> {
        if let Some(fb) = self.fallback.as_mut().filter(|fb| fb.is_connected()) {
            return fb.connect();
        }
        match (self.bus.connect(), self.fallback.as_mut()) {
            (Ok(c), _) => Ok(c),
            (Err(e), None) => Err(e),
            (Err(e), Some(fb)) => {
                tracing::debug!(err = %e, "systemd: no system bus; trying systemd's private socket");
                fb.connect().map_err(|e2| CallError { msg: format!("{}; {}", e.msg, e2.msg), ..e2 })
            }
        }
    }

    fn scrape(&mut self, sink: &mut Sink) -> Result<bool, CallError> {
        // A failed set-up is final for this scrape (no second attempt).
        let (conn, reused) = self.connect().map_err(|e| CallError { lost: false, ..e.context("couldn't get dbus connection") })?;
        let r = collect(&mut DbusSource { conn: &conn }, &self.o, sink);
        if r.is_err() {
            self.bus.reset();
            if let Some(fb) = self.fallback.as_mut() {
                fb.reset();
            }
        }
        // Once more on a new connection only when a kept one broke (a
        // timeout would just cost another).
        r.map(|_| reused).map_err(|e| CallError { lost: e.lost && !e.timed_out && reused, ..e })
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        match self.scrape(sink) {
            Ok(_) => Ok(()),
            // A kept connection that broke: once more on a new one, as
            // node_exporter (which connects every scrape) would have.
            Err(e) if e.lost => {
                tracing::debug!(err = %e, "systemd: the kept D-Bus connection failed; reconnecting");
                sink.clear();
                self.scrape(sink).map(|_| ()).map_err(to_error)
            }
            Err(e) => Err(to_error(e)),
        }
    }
}

fn to_error(e: CallError) -> Error {
    Error::Other(format!("systemd: {}", e.msg).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn unit(name: &str, load: &str, active: &str) -> Unit {
        Unit { name: name.into(), load_state: load.into(), active_state: active.into() }
    }

    fn opts() -> Options {
        Options {
            include: anchored(INCLUDE.name, INCLUDE.default).unwrap(),
            exclude: anchored(EXCLUDE.name, EXCLUDE.default).unwrap(),
            private: false,
            task_metrics: false,
            restarts_metrics: false,
            start_time_metrics: false,
            address: None,
            fallback: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    #[derive(Default)]
    struct Fake {
        manager: HashMap<String, Prop>,
        units: Option<Vec<Unit>>,
        props: HashMap<(String, String, String), Prop>,
        /// Property names (manager's or units') whose calls time out.
        stalled: Vec<&'static str>,
        /// Every call made, in order.
        calls: Vec<String>,
    }

    impl Fake {
        fn stall(&mut self, name: &str) -> Result<(), CallError> {
            self.calls.push(name.to_string());
            if self.stalled.contains(&name) {
                return Err(CallError::lost("I/O error: timed out", true));
            }
            Ok(())
        }
    }

    impl Source for Fake {
        fn manager_property(&mut self, name: &str) -> Result<Prop, CallError> {
            self.stall(name)?;
            self.manager.get(name).cloned().ok_or_else(|| CallError::new("no such property"))
        }
        fn list_units(&mut self) -> Result<Vec<Unit>, CallError> {
            self.stall("ListUnits")?;
            self.units.clone().ok_or_else(|| CallError::new("no ListUnits"))
        }
        fn unit_property(&mut self, unit: &str, iface: &str, name: &str) -> Result<Prop, CallError> {
            self.stall(name)?;
            self.props.get(&(unit.into(), iface.into(), name.into())).cloned().ok_or_else(|| CallError::new("no such property"))
        }
    }

    impl Fake {
        fn prop(&mut self, unit: &str, kind: &str, name: &str, v: Prop) {
            self.props.insert((unit.into(), iface(kind), name.into()), v);
        }
    }

    fn samples(sink: &Sink) -> Vec<String> {
        let mut out = Vec::new();
        for f in sink.families() {
            for (labels, v) in f.samples() {
                let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
                out.push(format!("{}{{{}}} {v}", f.name(), l.join(",")));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn bus_escape_as_go_systemd() {
        assert_eq!(bus_escape("foo.service"), "foo_2eservice");
        assert_eq!(bus_escape("getty@tty1.service"), "getty_40tty1_2eservice");
        assert_eq!(bus_escape("dev-sda1.device"), "dev_2dsda1_2edevice");
        assert_eq!(bus_escape("1a"), "_31a");
        assert_eq!(bus_escape(""), "_");
        assert_eq!(bus_escape("a\x05"), "a_5");
        assert_eq!(unit_path("x.timer"), "/org/freedesktop/systemd1/unit/x_2etimer");
    }

    #[test]
    fn version_and_virtualization_texts() {
        assert_eq!(parse_version("\"252.22-1~deb12u1\""), (252.22, "252.22-1~deb12u1".to_string()));
        assert_eq!(parse_version("\"v246\""), (246.0, "v246".to_string()));
        assert_eq!(parse_version("\"99\""), (0.0, String::new()));
        assert_eq!(parse_version("\"\""), (0.0, String::new()));
        assert_eq!(virtualization_label("\"kvm\""), "kvm");
        assert_eq!(virtualization_label("\"\""), "none");
        assert_eq!(go_quote("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\x01\"");
    }

    #[test]
    fn filter_is_anchored_and_needs_loaded() {
        // node_exporter's TestSystemdIgnoreFilter fixtures.
        let units = vec![
            unit("foo", "loaded", "active"),
            unit("bar", "not-found", "inactive"),
            unit("foobar", "not-found", "inactive"),
            unit("baz", "not-found", "inactive"),
        ];
        let (inc, exc) = (anchored(INCLUDE.name, "foo").unwrap(), anchored(EXCLUDE.name, "bar").unwrap());
        let names: Vec<&str> = filter_units(&units, &inc, &exc).iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["foo"]);
        let o = opts();
        assert_eq!(filter_units(&units, &o.include, &o.exclude).len(), 1, "defaults keep all loaded units");
        let loaded = vec![unit("a.service", "loaded", "active"), unit("b.mount", "loaded", "active"), unit("c.slice", "loaded", "active")];
        let names: Vec<&str> = filter_units(&loaded, &o.include, &o.exclude).iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["a.service"]);
        // Anchoring: "a" does not match "a.service".
        assert!(filter_units(&loaded, &anchored(INCLUDE.name, "a").unwrap(), &o.exclude).is_empty());
    }

    #[test]
    fn summary_counts_all_units_and_unknown_states() {
        let units = vec![
            unit("foo", "loaded", "active"),
            unit("bar", "not-found", "inactive"),
            unit("baz", "not-found", "inactive"),
            unit("r", "loaded", "reloading"),
        ];
        let s = summarize(&units);
        let get = |k: &str| s.iter().find(|(n, _)| n == k).map(|x| x.1);
        assert_eq!(get("active"), Some(1.0));
        assert_eq!(get("inactive"), Some(2.0));
        assert_eq!(get("failed"), Some(0.0));
        assert_eq!(get("reloading"), Some(1.0));
        assert_eq!(s.len(), 6);
    }

    fn full_fake() -> Fake {
        let mut f = Fake::default();
        f.manager.insert("Version".into(), Prop::Str("252.22-1~deb12u1".into()));
        f.manager.insert("SystemState".into(), Prop::Str("degraded".into()));
        f.units = Some(vec![
            unit("a.service", "loaded", "active"),
            unit("b.socket", "loaded", "active"),
            unit("c.timer", "loaded", "inactive"),
            unit("d.mount", "loaded", "active"),
            unit("e.service", "not-found", "failed"),
        ]);
        f.prop("a.service", "Service", "Type", Prop::Str("notify".into()));
        f.prop("a.service", "Service", "NRestarts", Prop::U32(2));
        f.prop("a.service", "Service", "TasksCurrent", Prop::U64(7));
        f.prop("a.service", "Service", "TasksMax", Prop::U64(u64::MAX));
        f.prop("a.service", "Unit", "ActiveEnterTimestamp", Prop::U64(1_700_000_000_500_000));
        f.prop("b.socket", "Socket", "NAccepted", Prop::U32(10));
        f.prop("b.socket", "Socket", "NConnections", Prop::U32(1));
        // b.socket is active without ActiveEnterTimestamp: no start time.
        f.prop("c.timer", "Timer", "LastTriggerUSec", Prop::U64(1_600_000_000_000_000));
        f
    }

    #[test]
    fn collect_exports_node_exporters_series() {
        let mut f = full_fake();
        let mut o = opts();
        o.restarts_metrics = true;
        o.task_metrics = true;
        o.start_time_metrics = true;
        let mut sink = Sink::new();
        collect(&mut f, &o, &mut sink).unwrap();
        let mut want = vec![
            "node_systemd_version{version=\"252.22-1~deb12u1\"} 252.22".to_string(),
            "node_systemd_virtualization_info{virtualization_type=\"unknown\"} 1".into(),
            "node_systemd_units{state=\"active\"} 3".into(),
            "node_systemd_units{state=\"activating\"} 0".into(),
            "node_systemd_units{state=\"deactivating\"} 0".into(),
            "node_systemd_units{state=\"inactive\"} 1".into(),
            "node_systemd_units{state=\"failed\"} 1".into(),
            "node_systemd_service_restart_total{name=\"a.service\"} 2".into(),
            "node_systemd_unit_tasks_current{name=\"a.service\"} 7".into(),
            "node_systemd_unit_start_time_seconds{name=\"a.service\"} 1700000000.5".into(),
            "node_systemd_unit_start_time_seconds{name=\"c.timer\"} 0".into(),
            "node_systemd_timer_last_trigger_seconds{name=\"c.timer\"} 1600000000".into(),
            "node_systemd_socket_accepted_connections_total{name=\"b.socket\"} 10".into(),
            "node_systemd_socket_current_connections{name=\"b.socket\"} 1".into(),
            "node_systemd_system_running{} 0".into(),
        ];
        for (name, active, ty) in [("a.service", "active", "notify"), ("b.socket", "active", ""), ("c.timer", "inactive", "")] {
            for s in UNIT_STATES {
                let v = if s == active { 1 } else { 0 };
                want.push(format!("node_systemd_unit_state{{name={name:?},state={s:?},type={ty:?}}} {v}"));
            }
        }
        want.sort();
        assert_eq!(samples(&sink), want);
        let refused = sink.families().iter().any(|f| f.name() == "node_systemd_socket_refused_connections_total");
        assert!(!refused, "no NRefused, no sample");
    }

    #[test]
    fn refused_is_a_gauge_and_socket_stops_at_first_missing() {
        let mut f = full_fake();
        f.prop("b.socket", "Socket", "NRefused", Prop::U32(4));
        f.units = Some(vec![unit("b.socket", "loaded", "active"), unit("x.socket", "loaded", "active")]);
        f.prop("x.socket", "Socket", "NAccepted", Prop::U32(1));
        f.prop("x.socket", "Socket", "NRefused", Prop::U32(9));
        let mut sink = Sink::new();
        collect(&mut f, &opts(), &mut sink).unwrap();
        let fams = sink.families();
        let r = fams.iter().find(|f| f.name() == "node_systemd_socket_refused_connections_total").unwrap();
        assert_eq!(r.kind(), Kind::Gauge);
        let got = samples(&sink);
        assert!(got.contains(&"node_systemd_socket_refused_connections_total{name=\"b.socket\"} 4".to_string()));
        // x.socket lacks NConnections: node_exporter skips its NRefused too.
        assert!(!got.iter().any(|s| s.contains("refused") && s.contains("x.socket")), "{got:?}");
        assert!(got.contains(&"node_systemd_socket_accepted_connections_total{name=\"x.socket\"} 1".to_string()));
    }

    #[test]
    fn failures_as_node_exporter() {
        // No ListUnits: a failure.
        let mut f = full_fake();
        f.units = None;
        assert!(collect(&mut f, &opts(), &mut Sink::new()).unwrap_err().msg.contains("couldn't get units"));
        // No SystemState from version 212: a failure.
        let mut f = full_fake();
        f.manager.remove("SystemState");
        assert!(collect(&mut f, &opts(), &mut Sink::new()).unwrap_err().msg.contains("system state"));
        // No Version: version 0, no timers, no SystemState asked, success.
        let mut f = full_fake();
        f.manager.clear();
        let mut sink = Sink::new();
        collect(&mut f, &opts(), &mut sink).unwrap();
        let got = samples(&sink);
        assert!(got.contains(&"node_systemd_version{version=\"\"} 0".to_string()), "{got:?}");
        assert!(!got.iter().any(|s| s.starts_with("node_systemd_timer") || s.starts_with("node_systemd_system_running")));
        // Running.
        let mut f = full_fake();
        f.manager.insert("SystemState".into(), Prop::Str("running".into()));
        f.manager.insert("Virtualization".into(), Prop::Str(String::new()));
        let mut sink = Sink::new();
        collect(&mut f, &opts(), &mut sink).unwrap();
        let got = samples(&sink);
        assert!(got.contains(&"node_systemd_system_running{} 1".to_string()));
        assert!(got.contains(&"node_systemd_virtualization_info{virtualization_type=\"none\"} 1".to_string()));
    }

    #[test]
    fn a_lost_call_ends_the_scrape_at_once() {
        let mut o = opts();
        o.restarts_metrics = true;
        o.task_metrics = true;
        o.start_time_metrics = true;
        let mut f = full_fake();
        collect(&mut f, &o, &mut Sink::new()).unwrap();
        let all = f.calls.clone();
        assert_eq!(all.len(), 14, "{all:?}");
        // A call that times out fails the scrape, and no further call is made.
        for prop in
            ["Version", "Virtualization", "Type", "NRestarts", "ActiveEnterTimestamp", "TasksMax", "LastTriggerUSec", "NConnections"]
        {
            let mut f = full_fake();
            f.stalled = vec![prop];
            let e = collect(&mut f, &o, &mut Sink::new()).unwrap_err();
            assert!(e.lost && e.timed_out && e.msg.contains(prop) && e.msg.contains("timed out"), "{prop}: {e:?}");
            let first = all.iter().position(|c| c == prop).unwrap();
            assert_eq!(f.calls, all[..=first], "{prop}");
        }
        // The peer's own error replies still only leave samples out.
        let mut f = full_fake();
        f.props.clear();
        collect(&mut f, &o, &mut Sink::new()).unwrap();
        assert!(f.calls.len() > 10, "{:?}", f.calls);
    }

    #[test]
    fn fallback_to_the_private_socket_as_root_only() {
        let p = Some(PRIVATE_ADDRESS);
        assert!(matches!(fallback_target(false, p, 0), Some(Target::Peer(a)) if a == PRIVATE_ADDRESS));
        assert!(fallback_target(false, p, 1000).is_none(), "not root");
        assert!(fallback_target(true, p, 0).is_none(), "already the private socket");
        assert!(fallback_target(false, None, 0).is_none(), "no fallback");
        let m = clap::Command::new("t").no_binary_name(true).args(Options::args()).try_get_matches_from(Vec::<&str>::new()).unwrap();
        assert_eq!(Options::from_flags(&Flags::new(&m)).unwrap().fallback.as_deref(), Some(PRIVATE_ADDRESS));
    }

    #[test]
    fn both_connections_failing_names_both() {
        if crate::dbus::euid() != 0 {
            eprintln!("SKIP: the private-socket fallback needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts();
        o.address = Some(format!("unix:path={}", dir.path().join("bus").display()));
        o.fallback = Some(format!("unix:path={}", dir.path().join("private").display()));
        let mut c = Collector::new(o, &crate::testutil::paths(dir.path())).unwrap();
        let e = crate::Collector::update(&mut c, &mut Sink::new()).unwrap_err().to_string();
        assert!(e.contains("couldn't get dbus connection") && e.contains("/bus") && e.contains("/private"), "{e}");
    }

    /// systemd's manager, as a p2p peer serves it on its private socket.
    struct PrivateManager;

    #[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
    impl PrivateManager {
        #[zbus(property)]
        fn version(&self) -> String {
            "255.4-1".into()
        }
        #[zbus(property)]
        fn system_state(&self) -> String {
            "running".into()
        }
        #[zbus(property)]
        fn virtualization(&self) -> String {
            String::new()
        }
        #[allow(clippy::type_complexity)]
        fn list_units(&self) -> Vec<(String, String, String, String, String, String, OwnedObjectPath, u32, String, OwnedObjectPath)> {
            let root = || OwnedObjectPath::try_from("/").unwrap();
            vec![(
                "x.target".into(),
                String::new(),
                "loaded".into(),
                "failed".into(),
                String::new(),
                String::new(),
                root(),
                0,
                String::new(),
                root(),
            )]
        }
    }

    #[test]
    #[allow(deprecated)] // unix_stream: this crate does not enable zbus's tokio feature.
    fn no_bus_as_root_reads_systemds_private_socket() {
        if crate::dbus::euid() != 0 {
            eprintln!("SKIP: the private-socket fallback needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        let listener = std::os::unix::net::UnixListener::bind(&private).unwrap();
        let server = std::thread::spawn(move || {
            // Two scrapes over one kept connection.
            let (s, _) = listener.accept().unwrap();
            let conn = zbus::blocking::connection::Builder::unix_stream(s)
                .server(zbus::Guid::generate())
                .unwrap()
                .p2p()
                .serve_at(MANAGER_PATH, PrivateManager)
                .unwrap()
                .build()
                .unwrap();
            std::thread::sleep(Duration::from_secs(3));
            drop(conn);
        });
        let mut o = opts();
        o.address = Some(format!("unix:path={}", dir.path().join("no-bus").display()));
        o.fallback = Some(format!("unix:path={}", private.display()));
        let mut c = Collector::new(o, &crate::testutil::paths(dir.path())).unwrap();
        for _ in 0..2 {
            let mut sink = Sink::new();
            crate::Collector::update(&mut c, &mut sink).unwrap();
            let got = samples(&sink);
            assert!(got.contains(&"node_systemd_version{version=\"255.4-1\"} 255.4".to_string()), "{got:?}");
            assert!(got.contains(&"node_systemd_system_running{} 1".to_string()), "{got:?}");
            assert!(got.contains(&"node_systemd_units{state=\"failed\"} 1".to_string()), "{got:?}");
            assert!(got.contains(&"node_systemd_virtualization_info{virtualization_type=\"none\"} 1".to_string()), "{got:?}");
        }
        drop(c);
        server.join().unwrap();
    }

    #[test]
    fn wrong_types_leave_samples_out_without_panicking() {
        let mut f = full_fake();
        f.prop("a.service", "Service", "Type", Prop::U32(1));
        f.prop("a.service", "Service", "NRestarts", Prop::Str("2".into()));
        let mut o = opts();
        o.restarts_metrics = true;
        let mut sink = Sink::new();
        collect(&mut f, &o, &mut sink).unwrap();
        let got = samples(&sink);
        assert!(got.contains(&"node_systemd_unit_state{name=\"a.service\",state=\"active\",type=\"\"} 1".to_string()));
        assert!(!got.iter().any(|s| s.starts_with("node_systemd_service_restart_total")));
    }

    #[test]
    fn flags_defaults_and_deprecated_aliases() {
        let cmd = || {
            let mut c = clap::Command::new("t").no_binary_name(true);
            for a in Options::args() {
                c = c.arg(a);
            }
            c
        };
        let m = cmd().try_get_matches_from(Vec::<&str>::new()).unwrap();
        let o = Options::from_flags(&Flags::new(&m)).unwrap();
        assert_eq!(o.include.as_str(), "^(?:.+)$");
        assert_eq!(o.exclude.as_str(), "^(?:.+\\.(automount|device|mount|scope|slice))$");
        assert!(!o.private && !o.task_metrics && !o.restarts_metrics && !o.start_time_metrics);
        let m = cmd().try_get_matches_from(["--collector.systemd.unit-whitelist=a.*", "--collector.systemd.enable-task-metrics"]).unwrap();
        let o = Options::from_flags(&Flags::new(&m)).unwrap();
        assert_eq!(o.include.as_str(), "^(?:a.*)$");
        assert!(o.task_metrics);
        let m = cmd().try_get_matches_from(["--collector.systemd.unit-blacklist=x", "--collector.systemd.unit-exclude=y"]).unwrap();
        assert!(Options::from_flags(&Flags::new(&m)).is_err(), "alias and flag are mutually exclusive");
        let m = cmd().try_get_matches_from(["--collector.systemd.unit-include=("]).unwrap();
        assert!(Options::from_flags(&Flags::new(&m)).is_err());
    }

    #[test]
    fn missing_bus_fails_quickly() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts();
        o.address = Some(format!("unix:path={}", dir.path().join("none").display()));
        let mut c = Collector::new(o, &crate::testutil::paths(dir.path())).unwrap();
        let t = std::time::Instant::now();
        let e = crate::Collector::update(&mut c, &mut Sink::new()).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(3));
        assert!(e.to_string().contains("connecting to"), "{e}");
    }
}

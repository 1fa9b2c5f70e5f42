//! `logind`: the sessions systemd-logind knows, over the system bus as
//! node_exporter 1.12 reads them: `ListSeats` and `ListSessions` of
//! `org.freedesktop.login1.Manager`, then each session's `Remote`, `Type`
//! and `Class` properties. Exported as `node_logind_sessions{seat, remote,
//! type, class}`: every combination of the listed seats (plus the empty
//! seat of remote sessions), `true`/`false`, the known types and the known
//! classes (unknown values counted as `other`), 0 where no session has it.
//! A failed `ListSeats`/`ListSessions` fails the collector; a session whose
//! properties logind answers with an error is left out, while a property
//! call that times out or whose connection fails ends the scrape with an
//! error at once (a stalled logind would otherwise cost one timeout per
//! session property). The connection is kept between scrapes (see
//! [`crate::dbus::Bus`]).

use std::collections::HashMap;
use std::time::Duration;

use zbus::blocking::Connection;
use zbus::zvariant::OwnedObjectPath;

use crate::dbus::{get_property, Bus, CallError, Prop, Target, DEFAULT_TIMEOUT};
use crate::flags::Flags;
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

const DEST: &str = "org.freedesktop.login1";
const PATH: &str = "/org/freedesktop/login1";
const MANAGER: &str = "org.freedesktop.login1.Manager";
const SESSION: &str = "org.freedesktop.login1.Session";

/// logind's values as of systemd v229; anything else is `other`.
pub const REMOTE_VALUES: [&str; 2] = ["true", "false"];
pub const TYPE_VALUES: [&str; 7] = ["other", "unspecified", "tty", "x11", "wayland", "mir", "web"];
pub const CLASS_VALUES: [&str; 5] = ["other", "user", "greeter", "lock-screen", "background"];

pub struct Options {
    /// A D-Bus address to use instead of the system bus; for tests.
    pub address: Option<String>,
    /// The bound of one D-Bus call and of a connection's set-up.
    pub timeout: Duration,
}

impl Options {
    pub fn args() -> Vec<clap::Arg> {
        vec![]
    }

    pub fn from_flags(_f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { address: None, timeout: DEFAULT_TIMEOUT })
    }
}

/// One entry of `ListSessions`, the fields node_exporter reads.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionEntry {
    pub seat: String,
    pub path: String,
}

/// A session's labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Session {
    pub seat: String,
    pub remote: String,
    pub session_type: String,
    pub class: String,
}

/// What the collector asks logind.
pub trait Source {
    /// The seat ids, as listed.
    fn list_seats(&mut self) -> Result<Vec<String>, CallError>;
    fn list_sessions(&mut self) -> Result<Vec<SessionEntry>, CallError>;
    /// A property of the session object at `path`.
    fn session_property(&mut self, path: &str, name: &str) -> Result<Prop, CallError>;
}

/// `value` when it is one of `known`, else `other`.
pub fn known_or_other(value: &str, known: &[&str]) -> String {
    if known.contains(&value) {
        value.to_string()
    } else {
        "other".to_string()
    }
}

/// A session's property: `None` when logind answers with an error (logged
/// at debug), an error when the call itself failed ([`CallError::lost`]).
fn property(src: &mut dyn Source, path: &str, name: &str) -> Result<Option<Prop>, CallError> {
    match src.session_property(path, name) {
        Ok(p) => Ok(Some(p)),
        Err(e) if e.lost => Err(e.context(&format!("unable to get the {name} of session {path}"))),
        Err(e) => {
            tracing::debug!(session = path, err = %e, "logind: unable to get session {name}");
            Ok(None)
        }
    }
}

/// A session's labels, or `None` when a property is missing or of another
/// type (node_exporter leaves such a session out).
fn session(src: &mut dyn Source, e: &SessionEntry) -> Result<Option<Session>, CallError> {
    // godbus prints a boolean variant as true/false; any other type prints
    // as something that is neither, so it is counted under no series.
    let remote = match property(src, &e.path, "Remote")? {
        None => return Ok(None),
        Some(Prop::Bool(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
    };
    let Some(session_type) = property(src, &e.path, "Type")?.and_then(|p| p.as_str().map(str::to_string)) else {
        return Ok(None);
    };
    let Some(class) = property(src, &e.path, "Class")?.and_then(|p| p.as_str().map(str::to_string)) else {
        return Ok(None);
    };
    Ok(Some(Session {
        seat: e.seat.clone(),
        remote,
        session_type: known_or_other(&session_type, &TYPE_VALUES),
        class: known_or_other(&class, &CLASS_VALUES),
    }))
}

/// One scrape's `node_logind_sessions` from `src`.
pub fn collect(src: &mut dyn Source, sink: &mut Sink) -> Result<(), CallError> {
    let mut seats = src.list_seats().map_err(|e| e.context("unable to get seats"))?;
    // The empty seat, of remote sessions such as SSH, is always there.
    seats.push(String::new());
    // A repeated seat would repeat series (client_golang keeps the first).
    let mut seen = std::collections::HashSet::new();
    seats.retain(|s| seen.insert(s.clone()));
    let list = src.list_sessions().map_err(|e| e.context("unable to get sessions"))?;
    let mut counts: HashMap<Session, f64> = HashMap::new();
    for e in &list {
        if let Some(s) = session(src, e)? {
            *counts.entry(s).or_default() += 1.0;
        }
    }
    let mut f = sink.family("node_logind_sessions", "Number of sessions registered in logind.", Kind::Gauge);
    f.reserve(REMOTE_VALUES.len() * TYPE_VALUES.len() * CLASS_VALUES.len() * seats.len());
    for remote in REMOTE_VALUES {
        for session_type in TYPE_VALUES {
            for class in CLASS_VALUES {
                for seat in &seats {
                    let key = Session {
                        seat: seat.clone(),
                        remote: remote.to_string(),
                        session_type: session_type.to_string(),
                        class: class.to_string(),
                    };
                    let n = counts.get(&key).copied().unwrap_or(0.0);
                    f.sample(&[("class", class), ("remote", remote), ("seat", seat), ("type", session_type)], n);
                }
            }
        }
    }
    Ok(())
}

/// logind over a D-Bus connection.
struct DbusSource<'a> {
    conn: &'a Connection,
}

impl Source for DbusSource<'_> {
    fn list_seats(&mut self) -> Result<Vec<String>, CallError> {
        let reply = self.conn.call_method(Some(DEST), PATH, Some(MANAGER), "ListSeats", &())?;
        let seats: Vec<(String, OwnedObjectPath)> = reply.body().deserialize()?;
        Ok(seats.into_iter().map(|(id, _)| id).collect())
    }

    fn list_sessions(&mut self) -> Result<Vec<SessionEntry>, CallError> {
        let reply = self.conn.call_method(Some(DEST), PATH, Some(MANAGER), "ListSessions", &())?;
        let sessions: Vec<(String, u32, String, String, OwnedObjectPath)> = reply.body().deserialize()?;
        Ok(sessions.into_iter().map(|(_, _, _, seat, path)| SessionEntry { seat, path: path.as_str().to_string() }).collect())
    }

    fn session_property(&mut self, path: &str, name: &str) -> Result<Prop, CallError> {
        get_property(self.conn, DEST, path, SESSION, name)
    }
}

pub struct Collector {
    bus: Bus,
}

impl Collector {
    pub fn new(o: Options, _p: &Paths) -> Result<Self, ConfigError> {
        let target = match o.address {
            Some(a) => Target::Address(a),
            None => Target::System,
        };
        Ok(Collector { bus: Bus::new(target, o.timeout) })
    }

    fn scrape(&mut self, sink: &mut Sink) -> Result<(), CallError> {
        let (conn, reused) = self.bus.connect().map_err(|e| CallError { lost: false, ..e.context("unable to connect to dbus") })?;
        let r = collect(&mut DbusSource { conn: &conn }, sink);
        if r.is_err() {
            self.bus.reset();
        }
        // Once more on a new connection only when a kept one broke (a
        // timeout would just cost another).
        r.map_err(|e| CallError { lost: e.lost && !e.timed_out && reused, ..e })
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let r = match self.scrape(sink) {
            // A kept connection that broke: once more on a new one, as
            // node_exporter (which connects every scrape) would have.
            Err(e) if e.lost => {
                tracing::debug!(err = %e, "logind: the kept D-Bus connection failed; reconnecting");
                sink.clear();
                self.scrape(sink)
            }
            r => r,
        };
        r.map_err(|e| Error::Other(format!("logind: {}", e.msg).into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        seats: Vec<String>,
        sessions: Vec<SessionEntry>,
        props: HashMap<(String, String), Prop>,
        /// Property names whose calls time out.
        stalled: Vec<&'static str>,
        /// The property calls made, in order.
        calls: Vec<String>,
    }

    impl Source for Fake {
        fn list_seats(&mut self) -> Result<Vec<String>, CallError> {
            Ok(self.seats.clone())
        }
        fn list_sessions(&mut self) -> Result<Vec<SessionEntry>, CallError> {
            Ok(self.sessions.clone())
        }
        fn session_property(&mut self, path: &str, name: &str) -> Result<Prop, CallError> {
            self.calls.push(format!("{path} {name}"));
            if self.stalled.contains(&name) {
                return Err(CallError::lost("I/O error: timed out", true));
            }
            self.props.get(&(path.into(), name.into())).cloned().ok_or_else(|| CallError::new("no such property"))
        }
    }

    /// node_exporter's TestLogindCollectorCollectMetrics fixture: a remote
    /// tty user session without a seat, an x11 greeter on seat0.
    fn fake() -> Fake {
        let mut props = HashMap::new();
        let p1 = "/org/freedesktop/login1/session/1".to_string();
        let p2 = "/org/freedesktop/login1/session/2".to_string();
        props.insert((p1.clone(), "Remote".into()), Prop::Bool(true));
        props.insert((p1.clone(), "Type".into()), Prop::Str("tty".into()));
        props.insert((p1.clone(), "Class".into()), Prop::Str("user".into()));
        props.insert((p2.clone(), "Remote".into()), Prop::Bool(false));
        props.insert((p2.clone(), "Type".into()), Prop::Str("x11".into()));
        props.insert((p2.clone(), "Class".into()), Prop::Str("greeter".into()));
        Fake {
            seats: vec!["seat0".into()],
            sessions: vec![SessionEntry { seat: String::new(), path: p1 }, SessionEntry { seat: "seat0".into(), path: p2 }],
            props,
            stalled: Vec::new(),
            calls: Vec::new(),
        }
    }

    fn values(sink: &Sink) -> Vec<(Vec<(String, String)>, f64)> {
        let fams = sink.families();
        assert_eq!(fams.len(), 1);
        assert_eq!(fams[0].name(), "node_logind_sessions");
        assert_eq!(fams[0].kind(), Kind::Gauge);
        fams[0].samples().map(|(l, v)| (l.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), v)).collect()
    }

    fn lbl(class: &str, remote: &str, seat: &str, ty: &str) -> Vec<(String, String)> {
        vec![("class".into(), class.into()), ("remote".into(), remote.into()), ("seat".into(), seat.into()), ("type".into(), ty.into())]
    }

    #[test]
    fn every_combination_of_every_seat() {
        let mut sink = Sink::new();
        collect(&mut fake(), &mut sink).unwrap();
        let got = values(&sink);
        assert_eq!(got.len(), 2 * 2 * 7 * 5);
        let ones: Vec<_> = got.iter().filter(|(_, v)| *v != 0.0).collect();
        assert_eq!(ones.len(), 2);
        assert!(got.contains(&(lbl("user", "true", "", "tty"), 1.0)));
        assert!(got.contains(&(lbl("greeter", "false", "seat0", "x11"), 1.0)));
    }

    #[test]
    fn unknown_values_are_other_and_broken_sessions_left_out() {
        let mut f = fake();
        let p1 = "/org/freedesktop/login1/session/1".to_string();
        f.props.insert((p1.clone(), "Type".into()), Prop::Str("test".into()));
        f.props.insert((p1, "Class".into()), Prop::Str("manager".into()));
        // Session 2 has no Class property: not counted.
        f.props.remove(&("/org/freedesktop/login1/session/2".to_string(), "Class".to_string()));
        // A session on a seat ListSeats does not list: counted, not exported.
        f.sessions.push(SessionEntry { seat: "seat9".into(), path: "/org/freedesktop/login1/session/1".into() });
        let mut sink = Sink::new();
        collect(&mut f, &mut sink).unwrap();
        let got = values(&sink);
        let ones: Vec<_> = got.iter().filter(|(_, v)| *v != 0.0).collect();
        assert_eq!(ones, vec![&(lbl("other", "true", "", "other"), 1.0)]);
        assert!(!got.iter().any(|(l, _)| l[2].1 == "seat9"));
    }

    #[test]
    fn a_lost_property_call_ends_the_scrape_at_once() {
        let mut f = fake();
        f.stalled = vec!["Type"];
        let e = collect(&mut f, &mut Sink::new()).unwrap_err();
        assert!(e.lost && e.timed_out && e.msg.contains("Type") && e.msg.contains("timed out"), "{e:?}");
        assert_eq!(f.calls, ["/org/freedesktop/login1/session/1 Remote", "/org/freedesktop/login1/session/1 Type"]);
        // logind's own error replies leave the session out, nothing more.
        let mut f = fake();
        f.props.retain(|(_, n), _| n != "Remote");
        collect(&mut f, &mut Sink::new()).unwrap();
        assert_eq!(f.calls.len(), 2);
    }

    #[test]
    fn known_or_other_as_node_exporter() {
        assert_eq!(known_or_other("foo", &["foo", "bar"]), "foo");
        assert_eq!(known_or_other("baz", &["foo", "bar"]), "other");
    }

    #[test]
    fn missing_bus_fails_quickly() {
        let dir = tempfile::tempdir().unwrap();
        let o = Options { address: Some(format!("unix:path={}", dir.path().join("none").display())), timeout: DEFAULT_TIMEOUT };
        let mut c = Collector::new(o, &crate::testutil::paths(dir.path())).unwrap();
        let t = std::time::Instant::now();
        let e = crate::Collector::update(&mut c, &mut Sink::new()).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(3));
        assert!(e.to_string().contains("unable to connect to dbus"), "{e}");
    }
}

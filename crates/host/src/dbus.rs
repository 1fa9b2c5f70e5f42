//! D-Bus plumbing of the systemd and logind collectors, over zbus's
//! blocking API: a connection kept between scrapes, made on a thread of its
//! own and bounded by a timeout ([`Bus`]), property reads reduced to what
//! the collectors use ([`Prop`]) and one error type ([`CallError`]).

use std::sync::mpsc;
use std::time::Duration;

use zbus::blocking::connection::Builder;
use zbus::blocking::Connection;
use zbus::zvariant::Value;

/// The default bound of one D-Bus call (and of setting up a connection):
/// below the scraper's default collector deadline.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a [`Bus`] connects.
#[derive(Debug, Clone)]
pub enum Target {
    /// The system bus: `DBUS_SYSTEM_BUS_ADDRESS`, else the default socket.
    System,
    /// A message bus at this address.
    Address(String),
    /// A peer (no bus, no `Hello`) at this address: systemd's private socket.
    Peer(String),
}

/// A D-Bus property value, reduced to what the collectors read.
#[derive(Debug, Clone, PartialEq)]
pub enum Prop {
    Str(String),
    Bool(bool),
    U32(u32),
    U64(u64),
    /// Any other type, as godbus prints it (as far as the collectors care).
    Other(String),
}

impl Prop {
    fn from_value(v: &Value<'_>) -> Prop {
        match v {
            Value::Value(inner) => Prop::from_value(inner),
            Value::Str(s) => Prop::Str(s.to_string()),
            Value::Bool(b) => Prop::Bool(*b),
            Value::U32(n) => Prop::U32(*n),
            Value::U64(n) => Prop::U64(*n),
            // godbus's text of other types (int32 and booleans plain, other
            // numbers after their signature), for the manager's properties.
            Value::I32(n) => Prop::Other(n.to_string()),
            Value::I16(n) => Prop::Other(format!("@n {n}")),
            Value::U16(n) => Prop::Other(format!("@q {n}")),
            Value::I64(n) => Prop::Other(format!("@x {n}")),
            Value::F64(n) => Prop::Other(format!("@d {n}")),
            other => Prop::Other(format!("@{} …", other.value_signature())),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Prop::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_u32(&self) -> Option<u32> {
        match self {
            Prop::U32(n) => Some(*n),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Prop::U64(n) => Some(*n),
            _ => None,
        }
    }
}

/// A failed D-Bus call. `lost` when the connection failed rather than the
/// peer answering with an error: an I/O error, a connection that could not
/// be made, a call that timed out (zbus reports `method_timeout` as
/// `Error::InputOutput` of kind `TimedOut`) or the bus's `NoReply` for a
/// peer that never answered; `timed_out` for the timeouts among them.
#[derive(Debug, Clone)]
pub struct CallError {
    pub msg: String,
    pub lost: bool,
    pub timed_out: bool,
}

impl CallError {
    /// The peer's own error reply (or an answer of the wrong shape).
    pub fn new(msg: impl Into<String>) -> Self {
        CallError { msg: msg.into(), lost: false, timed_out: false }
    }

    /// A failure of the connection itself.
    pub fn lost(msg: impl Into<String>, timed_out: bool) -> Self {
        CallError { msg: msg.into(), lost: true, timed_out }
    }

    /// The same error, its message after `prefix: `.
    pub fn context(self, prefix: &str) -> Self {
        CallError { msg: format!("{prefix}: {}", self.msg), ..self }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl From<zbus::Error> for CallError {
    fn from(e: zbus::Error) -> Self {
        let (lost, timed_out) = match &e {
            zbus::Error::InputOutput(io) | zbus::Error::Connection(io, _) => (true, io.kind() == std::io::ErrorKind::TimedOut),
            zbus::Error::MethodError(name, ..) if name.as_str() == "org.freedesktop.DBus.Error.NoReply" => (true, true),
            _ => (false, false),
        };
        CallError { msg: e.to_string(), lost, timed_out }
    }
}

/// A D-Bus connection kept between scrapes: made on first use (on a thread
/// of its own, waited for at most the timeout; a set-up still running is
/// waited for by the next scrape instead of starting another), dropped by
/// [`Bus::reset`].
pub struct Bus {
    target: Target,
    timeout: Duration,
    conn: Option<Connection>,
    pending: Option<mpsc::Receiver<zbus::Result<Connection>>>,
}

impl Bus {
    pub fn new(target: Target, timeout: Duration) -> Self {
        Bus { target, timeout, conn: None, pending: None }
    }

    /// The connection, and whether it was kept from an earlier scrape.
    pub fn connect(&mut self) -> Result<(Connection, bool), CallError> {
        if let Some(c) = &self.conn {
            return Ok((c.clone(), true));
        }
        let rx = match self.pending.take() {
            Some(rx) => rx,
            None => self.spawn()?,
        };
        match rx.recv_timeout(self.timeout) {
            Ok(Ok(c)) => {
                self.conn = Some(c.clone());
                Ok((c, false))
            }
            Ok(Err(e)) => {
                let e = CallError::from(e);
                Err(CallError::lost(format!("connecting to {}: {}", self.describe(), e.msg), e.timed_out))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.pending = Some(rx);
                Err(CallError::lost(format!("connecting to {}: timed out after {:?}", self.describe(), self.timeout), true))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(CallError::lost(format!("connecting to {}: set-up thread ended", self.describe()), false))
            }
        }
    }

    /// Forgets the connection; the next [`connect`](Self::connect) makes a new one.
    pub fn reset(&mut self) {
        self.conn = None;
    }

    /// Whether a connection is kept.
    pub fn is_connected(&self) -> bool {
        self.conn.is_some()
    }

    fn describe(&self) -> String {
        match &self.target {
            Target::System => "the system bus".to_string(),
            Target::Address(a) => format!("the bus at {a}"),
            Target::Peer(a) => format!("the peer at {a}"),
        }
    }

    fn spawn(&self) -> Result<mpsc::Receiver<zbus::Result<Connection>>, CallError> {
        let (tx, rx) = mpsc::channel();
        let (target, timeout) = (self.target.clone(), self.timeout);
        std::thread::Builder::new()
            .name("dbus-connect".into())
            .spawn(move || {
                let _ = tx.send(build(&target, timeout));
            })
            .map_err(|e| CallError::lost(format!("starting the D-Bus set-up thread: {e}"), false))?;
        Ok(rx)
    }
}

fn build(target: &Target, timeout: Duration) -> zbus::Result<Connection> {
    let builder = match target {
        Target::System => Builder::system()?,
        Target::Address(a) => Builder::address(a.as_str())?,
        Target::Peer(a) => Builder::address(a.as_str())?.p2p(),
    };
    builder.method_timeout(timeout).build()
}

/// `org.freedesktop.DBus.Properties.Get(iface, name)` on `path` of `dest`.
pub fn get_property(conn: &Connection, dest: &str, path: &str, iface: &str, name: &str) -> Result<Prop, CallError> {
    let reply = conn.call_method(Some(dest), path, Some("org.freedesktop.DBus.Properties"), "Get", &(iface, name))?;
    let body = reply.body();
    let v: Value<'_> = body.deserialize()?;
    Ok(Prop::from_value(&v))
}

/// The effective user id of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_and_io_errors_are_lost_peer_errors_are_not() {
        let timeout = zbus::Error::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"));
        let e = CallError::from(timeout);
        assert!(e.lost && e.timed_out, "{e:?}");
        let eof = CallError::from(zbus::Error::from(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)));
        assert!(eof.lost && !eof.timed_out, "{eof:?}");
        let peer = CallError::from(zbus::Error::FDO(Box::new(zbus::fdo::Error::UnknownProperty("x".into()))));
        assert!(!peer.lost && !peer.timed_out, "{peer:?}");
        assert!(!CallError::from(zbus::Error::InvalidReply).lost);
        let c = CallError::lost("boom", true).context("ctx");
        assert_eq!((c.msg.as_str(), c.lost, c.timed_out), ("ctx: boom", true, true));
    }

    #[test]
    #[allow(deprecated)] // unix_stream: this crate does not enable zbus's tokio feature.
    fn a_method_call_timeout_is_lost() {
        // A peer that authenticates and then never answers: zbus's
        // method_timeout must come back as a lost, timed-out error.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p2p");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let conn = zbus::blocking::connection::Builder::unix_stream(s).server(zbus::Guid::generate()).unwrap().p2p().build().unwrap();
            std::thread::sleep(Duration::from_secs(3));
            drop(conn);
        });
        let mut bus = Bus::new(Target::Peer(format!("unix:path={}", path.display())), Duration::from_millis(300));
        let (conn, reused) = bus.connect().unwrap();
        assert!(!reused);
        // The server connection has no object server: it never replies...
        let e = get_property(&conn, "org.example", "/", "org.example.I", "P").unwrap_err();
        assert!(e.lost && e.timed_out, "{e:?}");
        drop(conn);
        server.join().unwrap();
    }
}

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

/// A failed D-Bus call; `lost` when the connection itself failed (I/O),
/// not the peer's answer.
#[derive(Debug, Clone)]
pub struct CallError {
    pub msg: String,
    pub lost: bool,
}

impl CallError {
    pub fn new(msg: impl Into<String>) -> Self {
        CallError { msg: msg.into(), lost: false }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl From<zbus::Error> for CallError {
    fn from(e: zbus::Error) -> Self {
        CallError { lost: matches!(e, zbus::Error::InputOutput(_)), msg: e.to_string() }
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
            Ok(Err(e)) => Err(CallError { msg: format!("connecting to {}: {e}", self.describe()), lost: true }),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.pending = Some(rx);
                Err(CallError { msg: format!("connecting to {}: timed out after {:?}", self.describe(), self.timeout), lost: true })
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(CallError { msg: format!("connecting to {}: set-up thread ended", self.describe()), lost: true })
            }
        }
    }

    /// Forgets the connection; the next [`connect`](Self::connect) makes a new one.
    pub fn reset(&mut self) {
        self.conn = None;
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
            .map_err(|e| CallError { msg: format!("starting the D-Bus set-up thread: {e}"), lost: true })?;
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

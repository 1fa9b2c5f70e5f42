//! Connection admission: which connections the HTTP server keeps when more
//! arrive than it will hold.
//!
//! An idle crowd must not starve the kubelet's probes or Prometheus's
//! scrapes, so the server never waits for a free slot before accepting:
//! - a connection must send its first byte within [`FIRST_BYTE_TIMEOUT`]
//!   (the kubelet's probe timeout is 1 s; Prometheus, the kubelet and curl
//!   send their request with the connection's first segment);
//! - one peer holds at most [`Admission::per_peer`] connections (a peer is
//!   an IPv4 address, or an IPv6 /64, which one host can fill on its own);
//! - at a cap (the peer's or `--web.max-connections`), the oldest *idle*
//!   connection is closed to make room: idle is a connection with no
//!   request in its handler (waiting for its first byte, for its next
//!   request, or for a slow client to read its answer);
//! - a peer whose connections are all busy may go over its share while the
//!   server has room; at the server's cap with none idle, the oldest
//!   connection of a peer over its share makes room for another peer's. A
//!   new connection is refused only when every connection is busy and no
//!   other peer is over its share.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a new connection may stay silent.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_millis(500);

/// The most connections one peer holds, at most (a quarter of the cap
/// below it, so at least four peers always fit).
pub const MAX_PER_PEER: usize = 64;

/// Why a connection was closed by admission (the label values of
/// `node_agent_http_connections_closed_total{reason}`: this bounded set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Closed {
    /// Sent nothing within [`FIRST_BYTE_TIMEOUT`].
    FirstByteTimeout,
    /// The oldest idle connection of a peer at its cap, for a new one.
    PeerCap,
    /// At `--web.max-connections`: the oldest idle connection of all, or,
    /// none idle, the oldest of the peer most over its share.
    ConnectionCap,
    /// New, refused: every connection busy and no other peer over its share.
    Refused,
}

impl Closed {
    pub const ALL: [Closed; 4] = [Closed::FirstByteTimeout, Closed::PeerCap, Closed::ConnectionCap, Closed::Refused];

    pub fn label(self) -> &'static str {
        match self {
            Closed::FirstByteTimeout => "first_byte_timeout",
            Closed::PeerCap => "peer_cap",
            Closed::ConnectionCap => "connection_cap",
            Closed::Refused => "refused",
        }
    }
}

/// The peer a connection counts against: an IPv4 address, or an IPv6 /64
/// (IPv4-mapped IPv6 addresses count as IPv4).
pub fn peer_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

/// One admitted connection, shared by its task and the table.
#[derive(Default)]
pub struct Slot {
    /// Requests in a handler now.
    busy: AtomicUsize,
    /// Told to close (to make room for a newer connection).
    close: tokio::sync::Notify,
}

impl Slot {
    /// Marks a request in a handler until the guard is dropped.
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Relaxed);
        Busy(Arc::clone(self))
    }

    /// Resolves when admission closes this connection.
    pub async fn closed(&self) {
        self.close.notified().await
    }

    fn idle(&self) -> bool {
        self.busy.load(Relaxed) == 0
    }
}

/// A request in a handler (see [`Slot::busy`]).
pub struct Busy(Arc<Slot>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Relaxed);
    }
}

#[derive(Default)]
struct Table {
    next: u64,
    /// By admission order: the first idle one is the oldest idle.
    conns: BTreeMap<u64, (IpAddr, Arc<Slot>)>,
    per_peer: HashMap<IpAddr, usize>,
}

/// What to do with a new connection, given what is open.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Admit,
    /// Admit after closing these (oldest idle) connections.
    Evict(Vec<(u64, Closed)>),
    Refuse,
}

/// The decision for a new connection from `peer` (pure: the table, in
/// admission order with whether each is idle, and the caps):
/// - a peer at its cap gives up its oldest idle connection; with none idle
///   it may still go over its share while the server has room;
/// - at the server's cap the oldest idle connection of anyone goes; with
///   none idle, the oldest connection of the peer holding the most, if that
///   peer is over its share and is not this one (a busy flood from one
///   address cannot hold every slot); otherwise the new one is refused.
fn decide(
    conns: impl Iterator<Item = (u64, IpAddr, bool)> + Clone,
    peer: IpAddr,
    peer_open: usize,
    open: usize,
    per_peer: usize,
    max: usize,
) -> Decision {
    let mut evict = Vec::new();
    let mut open = open;
    if peer_open >= per_peer {
        if let Some((id, _, _)) = conns.clone().find(|&(_, p, idle)| idle && p == peer) {
            evict.push((id, Closed::PeerCap));
            open -= 1;
        }
    }
    if open >= max {
        let chosen = evict.first().map(|(e, _)| *e);
        let victim = match conns.clone().find(|&(id, _, idle)| idle && Some(id) != chosen) {
            Some((id, _, _)) => Some(id),
            None => {
                let mut counts: HashMap<IpAddr, usize> = HashMap::new();
                for (_, p, _) in conns.clone() {
                    *counts.entry(p).or_default() += 1;
                }
                let hog = counts.into_iter().filter(|&(p, n)| p != peer && n > per_peer).max_by_key(|&(_, n)| n).map(|(p, _)| p);
                hog.and_then(|h| conns.clone().find(|&(_, p, _)| p == h)).map(|(id, _, _)| id)
            }
        };
        match victim {
            Some(id) => evict.push((id, Closed::ConnectionCap)),
            None => return Decision::Refuse,
        }
    }
    if evict.is_empty() {
        Decision::Admit
    } else {
        Decision::Evict(evict)
    }
}

/// The connections the server holds, and what admission closed.
pub struct Admission {
    table: Mutex<Table>,
    max: usize,
    per_peer: usize,
    closed: [AtomicU64; 4],
}

/// An admitted connection: removed from the table when dropped.
pub struct Ticket {
    admission: Arc<Admission>,
    id: u64,
    pub slot: Arc<Slot>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut t = self.admission.lock();
        if let Some((peer, _)) = t.conns.remove(&self.id) {
            if let Some(n) = t.per_peer.get_mut(&peer) {
                *n -= 1;
                if *n == 0 {
                    t.per_peer.remove(&peer);
                }
            }
        }
    }
}

impl Admission {
    /// At most `max` connections (at least 1), and at most a quarter of
    /// them (at least 1, at most [`MAX_PER_PEER`]) from one peer.
    pub fn new(max: usize) -> Arc<Admission> {
        let max = max.max(1);
        Arc::new(Admission { table: Mutex::default(), max, per_peer: (max / 4).clamp(1, MAX_PER_PEER), closed: Default::default() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most connections one peer holds.
    pub fn per_peer(&self) -> usize {
        self.per_peer
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections held now.
    pub fn open(&self) -> usize {
        self.lock().conns.len()
    }

    /// Counts a connection closed for `why`.
    pub fn count(&self, why: Closed) {
        self.closed[why as usize].fetch_add(1, Relaxed);
    }

    /// Connections closed by admission, by reason.
    pub fn closed(&self) -> impl Iterator<Item = (Closed, u64)> + '_ {
        Closed::ALL.into_iter().map(|c| (c, self.closed[c as usize].load(Relaxed)))
    }

    /// Admits a connection from `ip`, closing the oldest idle one at a
    /// cap; `None` when it is refused (counted).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Ticket> {
        let peer = peer_key(ip);
        let mut t = self.lock();
        let peer_open = t.per_peer.get(&peer).copied().unwrap_or(0);
        let conns = t.conns.iter().map(|(id, (p, s))| (*id, *p, s.idle()));
        match decide(conns, peer, peer_open, t.conns.len(), self.per_peer, self.max) {
            Decision::Admit => {}
            Decision::Refuse => {
                drop(t);
                self.count(Closed::Refused);
                return None;
            }
            Decision::Evict(ids) => {
                for (id, why) in ids {
                    if let Some((p, slot)) = t.conns.remove(&id) {
                        if let Some(n) = t.per_peer.get_mut(&p) {
                            *n -= 1;
                            if *n == 0 {
                                t.per_peer.remove(&p);
                            }
                        }
                        slot.close.notify_one();
                        self.count(why);
                    }
                }
            }
        }
        let id = t.next;
        t.next += 1;
        let slot = Arc::new(Slot::default());
        t.conns.insert(id, (peer, Arc::clone(&slot)));
        *t.per_peer.entry(peer).or_insert(0) += 1;
        drop(t);
        Some(Ticket { admission: Arc::clone(self), id, slot })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn peers_are_ipv4_addresses_or_ipv6_64s() {
        assert_eq!(peer_key(ip("10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(peer_key(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(peer_key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(peer_key(ip("2001:db8:1:2:bbbb::9")), peer_key(ip("2001:db8:1:2::7")));
        assert_ne!(peer_key(ip("2001:db8:1:3::1")), peer_key(ip("2001:db8:1:2::1")));
    }

    #[test]
    fn decisions_close_the_oldest_idle_first() {
        let a = ip("10.0.0.1");
        let b = ip("10.0.0.2");
        // Under both caps: admitted.
        let open = [(1, a, true)];
        assert_eq!(decide(open.iter().copied(), b, 0, 1, 2, 4), Decision::Admit);
        // a at its cap of 2: its oldest idle goes (1 is busy, 2 is idle).
        let open = [(1, a, false), (2, a, true), (3, b, true)];
        assert_eq!(decide(open.iter().copied(), a, 2, 3, 2, 8), Decision::Evict(vec![(2, Closed::PeerCap)]));
        // Every connection of a busy: a's new one goes over its share
        // while the server has room, and is refused when it has none.
        let open = [(1, a, false), (2, a, false)];
        assert_eq!(decide(open.iter().copied(), a, 2, 2, 2, 8), Decision::Admit);
        assert_eq!(decide(open.iter().copied(), a, 2, 2, 2, 2), Decision::Refuse);
        // At the cap, all busy, a over its share: b's new one takes a's oldest.
        let open = [(1, a, false), (2, b, false), (3, a, false), (4, a, false)];
        assert_eq!(decide(open.iter().copied(), b, 1, 4, 2, 4), Decision::Evict(vec![(1, Closed::ConnectionCap)]));
        // At the connection cap: the oldest idle of anyone goes.
        let open = [(1, a, false), (2, b, true), (3, a, true)];
        assert_eq!(decide(open.iter().copied(), ip("10.0.0.3"), 0, 3, 2, 3), Decision::Evict(vec![(2, Closed::ConnectionCap)]));
        // Both caps: one eviction makes room under both.
        let open = [(1, a, true), (2, a, true), (3, b, true)];
        assert_eq!(decide(open.iter().copied(), a, 2, 3, 2, 3), Decision::Evict(vec![(1, Closed::PeerCap)]));
        // Every connection busy at the cap: refused.
        let open = [(1, a, false), (2, b, false)];
        assert_eq!(decide(open.iter().copied(), ip("10.0.0.3"), 0, 2, 2, 2), Decision::Refuse);
    }

    #[tokio::test]
    async fn a_crowd_from_one_peer_cannot_fill_the_server() {
        let adm = Admission::new(16);
        assert_eq!(adm.per_peer(), 4);
        let crowd: Vec<Ticket> = (0..1000).filter_map(|_| adm.admit(ip("10.0.0.9"))).collect();
        // Every new one was admitted, closing the oldest idle one.
        assert_eq!(crowd.len(), 1000);
        assert_eq!(adm.open(), 4);
        let closed: HashMap<_, _> = adm.closed().collect();
        assert_eq!(closed[&Closed::PeerCap], 996);
        // The ones closed were told so.
        tokio::time::timeout(Duration::from_secs(1), crowd[0].slot.closed()).await.expect("the oldest was told to close");
        drop(crowd);
        assert_eq!(adm.open(), 0);
        // Others still get in, and a busy connection is never closed.
        let probe = adm.admit(ip("10.0.0.1")).expect("admitted");
        let _busy = probe.slot.busy();
        let crowd: Vec<Ticket> = (0..100).filter_map(|_| adm.admit(ip("10.0.0.1"))).collect();
        assert!(crowd.len() == 100 && adm.open() == 4);
        assert!(tokio::time::timeout(Duration::from_millis(50), probe.slot.closed()).await.is_err(), "a busy connection stays");
    }

    #[tokio::test]
    async fn the_cap_closes_the_oldest_idle_of_anyone() {
        let adm = Admission::new(8);
        let held: Vec<Ticket> = (0..8).filter_map(|i| adm.admit(ip(&format!("10.0.1.{i}")))).collect();
        assert_eq!(adm.open(), 8);
        let _busy: Vec<Busy> = held[..7].iter().map(|t| t.slot.busy()).collect();
        let new = adm.admit(ip("10.0.2.1")).expect("admitted");
        tokio::time::timeout(Duration::from_secs(1), held[7].slot.closed()).await.expect("the idle one closed");
        assert_eq!(adm.open(), 8);
        let _b = new.slot.busy();
        assert!(adm.admit(ip("10.0.2.2")).is_none(), "all busy, nobody over its share: refused");
        let closed: HashMap<_, _> = adm.closed().collect();
        assert_eq!((closed[&Closed::ConnectionCap], closed[&Closed::Refused]), (1, 1));
    }
}

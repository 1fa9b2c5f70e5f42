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
//! - at a cap, a connection that is *idle* or *waiting* is closed to make
//!   room: idle is a connection with no request in its handler (waiting
//!   for its first byte, for its next request, or for a slow client to
//!   read its answer); waiting, one whose request waits for its password
//!   check (queued for bcrypt: work the server does not owe a client it
//!   has not authenticated yet). At the peer's cap the peer gives up its
//!   own oldest idle or waiting one; at `--web.max-connections` the peer
//!   holding the most connections does (so a crowd, from one address or
//!   many, gives up its own before a peer holding a connection or two, the
//!   kubelet's or Prometheus's, loses any). Oldest first: a new connection
//!   is idle until its request is read, and the crowd's older ones go
//!   before it;
//! - a peer whose connections are all busy may go over its share while the
//!   server has room; at the server's cap with none idle or waiting, the
//!   oldest connection of a peer over its share makes room for another
//!   peer's. A new connection is refused only when every connection is
//!   busy and no other peer is over its share.

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
    /// An accept failed for want of descriptors: the one the cap would
    /// close, closed to give the listener one back.
    Descriptors,
}

impl Closed {
    pub const ALL: [Closed; 5] = [Closed::FirstByteTimeout, Closed::PeerCap, Closed::ConnectionCap, Closed::Refused, Closed::Descriptors];

    pub fn label(self) -> &'static str {
        match self {
            Closed::FirstByteTimeout => "first_byte_timeout",
            Closed::PeerCap => "peer_cap",
            Closed::ConnectionCap => "connection_cap",
            Closed::Refused => "refused",
            Closed::Descriptors => "descriptors",
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

/// What a connection is doing, for admission: the order in which
/// connections are closed to make room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// No request in a handler.
    Idle,
    /// Its request waits for its password check (queued for bcrypt).
    Waiting,
    /// A request in a handler: served (authenticated, or no
    /// authentication configured), or its password being checked now.
    Busy,
}

/// One admitted connection, shared by its task and the table.
#[derive(Default)]
pub struct Slot {
    /// Requests in a handler now.
    busy: AtomicUsize,
    /// Of those, requests waiting for their password check.
    waiting: AtomicUsize,
    /// Told to close (to make room for a newer connection).
    close: tokio::sync::Notify,
}

impl Slot {
    /// Marks a request in a handler until the guard is dropped.
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Relaxed);
        Busy(Arc::clone(self))
    }

    /// Marks a request of this connection (in a handler, marked
    /// [`Slot::busy`]) as waiting for its password check until the guard is
    /// dropped: the connection may be closed to make room meanwhile.
    pub fn waiting(self: &Arc<Self>) -> Waiting {
        self.waiting.fetch_add(1, Relaxed);
        Waiting(Arc::clone(self))
    }

    /// Resolves when admission closes this connection.
    pub async fn closed(&self) {
        self.close.notified().await
    }

    fn state(&self) -> State {
        let waiting = self.waiting.load(Relaxed);
        match self.busy.load(Relaxed) {
            0 => State::Idle,
            busy if busy > waiting => State::Busy,
            _ => State::Waiting,
        }
    }
}

/// A request in a handler (see [`Slot::busy`]).
pub struct Busy(Arc<Slot>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Relaxed);
    }
}

/// A request waiting for its password check (see [`Slot::waiting`]).
pub struct Waiting(Arc<Slot>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Relaxed);
    }
}

#[derive(Default)]
struct Table {
    next: u64,
    /// By admission order: the first idle one is the oldest idle.
    conns: BTreeMap<u64, (IpAddr, Arc<Slot>)>,
    per_peer: HashMap<IpAddr, usize>,
}

impl Table {
    /// Removes connection `id`, if it is still held.
    fn remove(&mut self, id: u64) -> Option<Arc<Slot>> {
        let (peer, slot) = self.conns.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&peer);
            }
        }
        Some(slot)
    }
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
/// admission order with each one's [`State`], and the caps):
/// - a peer at its cap gives up its oldest idle or waiting connection;
///   with every one busy it may still go over its share while the server
///   has room;
/// - at the server's cap, of the peers with an idle or waiting connection,
///   the one holding the most connections gives up its oldest idle or
///   waiting one ([`biggest_evictable`]); with every
///   connection busy, the oldest connection of the peer holding the most,
///   if that peer is over its share and is not this one (a busy flood from
///   one address cannot hold every slot); otherwise the new one is
///   refused.
fn decide(
    conns: impl Iterator<Item = (u64, IpAddr, State)> + Clone,
    peer: IpAddr,
    peer_open: usize,
    open: usize,
    per_peer: usize,
    max: usize,
) -> Decision {
    let mut evict = Vec::new();
    let mut open = open;
    if peer_open >= per_peer {
        if let Some((id, _, _)) = conns.clone().find(|&(_, p, s)| p == peer && s != State::Busy) {
            evict.push((id, Closed::PeerCap));
            open -= 1;
        }
    }
    if open >= max {
        let chosen = evict.first().map(|(e, _)| *e);
        let victim = biggest_evictable(conns.clone().filter(|&(id, _, _)| Some(id) != chosen)).or_else(|| {
            let mut counts: HashMap<IpAddr, usize> = HashMap::new();
            for (_, p, _) in conns.clone() {
                *counts.entry(p).or_default() += 1;
            }
            let hog = counts.into_iter().filter(|&(p, n)| p != peer && n > per_peer).max_by_key(|&(_, n)| n).map(|(p, _)| p);
            hog.and_then(|h| conns.clone().find(|&(_, p, _)| p == h)).map(|(id, _, _)| id)
        });
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

/// Of the peers with an idle or waiting connection, the one holding the
/// most connections (of peers holding as many, the one whose candidate
/// came first): its oldest idle or waiting connection.
fn biggest_evictable(conns: impl Iterator<Item = (u64, IpAddr, State)>) -> Option<u64> {
    // Per peer: connections held, and its oldest idle or waiting one.
    let mut peers: HashMap<IpAddr, (usize, Option<u64>)> = HashMap::new();
    for (id, p, s) in conns {
        let e = peers.entry(p).or_default();
        e.0 += 1;
        if s != State::Busy {
            e.1 = e.1.or(Some(id));
        }
    }
    peers
        .into_values()
        .filter_map(|(held, oldest)| oldest.map(|id| (held, id)))
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .map(|(_, id)| id)
}

/// The connections the server holds, and what admission closed.
pub struct Admission {
    table: Mutex<Table>,
    max: usize,
    per_peer: usize,
    closed: [AtomicU64; 5],
}

/// An admitted connection: removed from the table when dropped.
pub struct Ticket {
    admission: Arc<Admission>,
    id: u64,
    pub slot: Arc<Slot>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission.lock().remove(self.id);
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

    /// Closes the connection the server's cap would close (an idle or
    /// waiting one of the peer holding the most), for an accept that failed
    /// for want of descriptors; false when every connection is busy.
    pub fn shed(&self) -> bool {
        let mut t = self.lock();
        let conns = t.conns.iter().map(|(id, (p, s))| (*id, *p, s.state()));
        let Some(id) = biggest_evictable(conns) else { return false };
        if let Some(slot) = t.remove(id) {
            slot.close.notify_one();
        }
        drop(t);
        self.count(Closed::Descriptors);
        true
    }

    /// Admits a connection from `ip`, closing the oldest idle one at a
    /// cap; `None` when it is refused (counted).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Ticket> {
        let peer = peer_key(ip);
        let mut t = self.lock();
        let peer_open = t.per_peer.get(&peer).copied().unwrap_or(0);
        let conns = t.conns.iter().map(|(id, (p, s))| (*id, *p, s.state()));
        match decide(conns, peer, peer_open, t.conns.len(), self.per_peer, self.max) {
            Decision::Admit => {}
            Decision::Refuse => {
                drop(t);
                self.count(Closed::Refused);
                return None;
            }
            Decision::Evict(ids) => {
                for (id, why) in ids {
                    if let Some(slot) = t.remove(id) {
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

    const I: State = State::Idle;
    const W: State = State::Waiting;
    const B: State = State::Busy;

    #[test]
    fn decisions_close_the_oldest_idle_first() {
        let a = ip("10.0.0.1");
        let b = ip("10.0.0.2");
        // Under both caps: admitted.
        let open = [(1, a, I)];
        assert_eq!(decide(open.iter().copied(), b, 0, 1, 2, 4), Decision::Admit);
        // a at its cap of 2: its oldest idle goes (1 is busy, 2 is idle).
        let open = [(1, a, B), (2, a, I), (3, b, I)];
        assert_eq!(decide(open.iter().copied(), a, 2, 3, 2, 8), Decision::Evict(vec![(2, Closed::PeerCap)]));
        // Every connection of a busy: a's new one goes over its share
        // while the server has room, and is refused when it has none.
        let open = [(1, a, B), (2, a, B)];
        assert_eq!(decide(open.iter().copied(), a, 2, 2, 2, 8), Decision::Admit);
        assert_eq!(decide(open.iter().copied(), a, 2, 2, 2, 2), Decision::Refuse);
        // At the cap, all busy, a over its share: b's new one takes a's oldest.
        let open = [(1, a, B), (2, b, B), (3, a, B), (4, a, B)];
        assert_eq!(decide(open.iter().copied(), b, 1, 4, 2, 4), Decision::Evict(vec![(1, Closed::ConnectionCap)]));
        // At the connection cap: an idle one of the peer holding the most
        // goes (a holds two), though b's is older; of peers holding as
        // many, the oldest idle.
        let open = [(1, a, B), (2, b, I), (3, a, I)];
        assert_eq!(decide(open.iter().copied(), ip("10.0.0.3"), 0, 3, 2, 3), Decision::Evict(vec![(3, Closed::ConnectionCap)]));
        let open = [(1, a, B), (2, b, I), (3, a, I), (4, b, B)];
        assert_eq!(decide(open.iter().copied(), ip("10.0.0.3"), 0, 4, 2, 4), Decision::Evict(vec![(2, Closed::ConnectionCap)]));
        // Both caps: one eviction makes room under both.
        let open = [(1, a, I), (2, a, I), (3, b, I)];
        assert_eq!(decide(open.iter().copied(), a, 2, 3, 2, 3), Decision::Evict(vec![(1, Closed::PeerCap)]));
        // Every connection busy at the cap: refused.
        let open = [(1, a, B), (2, b, B)];
        assert_eq!(decide(open.iter().copied(), ip("10.0.0.3"), 0, 2, 2, 2), Decision::Refuse);
    }

    /// #47 row 7: a request waiting for its password check does not make
    /// its connection unevictable. With every peer at its share and every
    /// connection's request queued for bcrypt, the kubelet's new connection
    /// used to be refused.
    #[test]
    fn waiting_for_a_password_check_is_not_busy() {
        let (a, b, c) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"));
        let probe = ip("10.0.0.9");
        // Every peer at its share of 2, every request waiting: the oldest
        // waiting of the peer holding the most goes (a and b hold 2 each:
        // b's came first).
        let open = [(1, b, W), (2, a, W), (3, c, B), (4, a, W), (5, b, W)];
        assert_eq!(decide(open.iter().copied(), probe, 0, 5, 2, 5), Decision::Evict(vec![(1, Closed::ConnectionCap)]));
        let open = [(1, c, W), (2, a, W), (3, a, W), (4, b, W)];
        assert_eq!(decide(open.iter().copied(), probe, 0, 4, 2, 4), Decision::Evict(vec![(2, Closed::ConnectionCap)]));
        // Within a peer, the oldest of its idle and waiting ones.
        let open = [(1, a, B), (2, a, W), (3, a, I), (4, b, W)];
        assert_eq!(decide(open.iter().copied(), probe, 0, 4, 3, 4), Decision::Evict(vec![(2, Closed::ConnectionCap)]));
        // A peer holding one connection, new (idle until its request is
        // read) or waiting for its first check, keeps it while a crowd
        // holds more, waiting ones included.
        let open = [(1, probe, I), (2, a, W), (3, a, W)];
        assert_eq!(decide(open.iter().copied(), b, 0, 3, 2, 3), Decision::Evict(vec![(2, Closed::ConnectionCap)]));
        let open = [(1, probe, W), (2, a, W), (3, a, W)];
        assert_eq!(decide(open.iter().copied(), b, 0, 3, 2, 3), Decision::Evict(vec![(2, Closed::ConnectionCap)]));
        // A peer at its cap gives up its own oldest idle or waiting one,
        // not another's, and cannot go over its share with them; its new
        // connection (idle until its request is read) is the last to go.
        let open = [(1, b, W), (2, a, B), (3, a, W), (4, a, W)];
        assert_eq!(decide(open.iter().copied(), a, 3, 4, 3, 8), Decision::Evict(vec![(3, Closed::PeerCap)]));
        let open = [(1, a, W), (2, a, W), (3, a, I)];
        assert_eq!(decide(open.iter().copied(), a, 3, 3, 3, 8), Decision::Evict(vec![(1, Closed::PeerCap)]));
        // Busy ones (a check running, a served request) stay: all busy and
        // nobody over its share is still a refusal.
        let open = [(1, a, B), (2, b, B)];
        assert_eq!(decide(open.iter().copied(), probe, 0, 2, 2, 2), Decision::Refuse);
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

    /// An accept that ran out of descriptors closes the connection the
    /// cap would: an idle or waiting one of the peer holding the most.
    #[tokio::test]
    async fn shedding_for_descriptors_closes_what_the_cap_would() {
        let adm = Admission::new(64);
        let probe = adm.admit(ip("10.0.0.1")).expect("admitted");
        let crowd: Vec<Ticket> = (0..3).filter_map(|_| adm.admit(ip("10.0.0.2"))).collect();
        let _busy = crowd[0].slot.busy();
        assert!(adm.shed());
        tokio::time::timeout(Duration::from_secs(1), crowd[1].slot.closed()).await.expect("the crowd's oldest idle one");
        assert_eq!(adm.open(), 3);
        assert!(adm.shed() && adm.shed(), "then its next, then the probe's");
        let _b = probe.slot.busy();
        assert!(!adm.shed(), "every connection left is busy");
        let closed: HashMap<_, _> = adm.closed().collect();
        assert_eq!(closed[&Closed::Descriptors], 3);
    }

    #[tokio::test]
    async fn a_connection_waiting_for_its_password_check_makes_room() {
        let adm = Admission::new(4);
        let held: Vec<Ticket> = (0..4).filter_map(|i| adm.admit(ip(&format!("10.0.1.{i}")))).collect();
        let busy: Vec<Busy> = held.iter().map(|t| t.slot.busy()).collect();
        let waiting = held[2].slot.waiting();
        assert_eq!(held[2].slot.state(), State::Waiting);
        let new = adm.admit(ip("10.0.2.1")).expect("admitted: a waiting connection made room");
        tokio::time::timeout(Duration::from_secs(1), held[2].slot.closed()).await.expect("the waiting one was told to close");
        // Its check started (the guard gone): busy again, not taken.
        drop(waiting);
        let _b = new.slot.busy();
        assert_eq!(held[3].slot.state(), State::Busy);
        assert!(adm.admit(ip("10.0.2.2")).is_none(), "all busy, nobody over its share: refused");
        drop(busy);
        assert_eq!(held[0].slot.state(), State::Idle);
    }
}

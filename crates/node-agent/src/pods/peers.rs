//! From per-(cgroup, peer) kernel counters to bounded per-pod, per-peer
//! series (`ebpf_tcp_peers`; `ebpf_dns`'s servers and failing names too).
//! Pure: the caller passes the map entries, who owns each cgroup and what
//! each address is.
//!
//! - **Counters stay counters** while the kernel's map stays small: an
//!   entry unchanged over a whole scrape interval is folded into user
//!   space and deleted from the kernel (a busy peer's entry stays; an event
//!   racing the delete of an entry idle that long is the only loss).
//! - **A peer's name is decided once**, when its entry first appears: a
//!   Service by ClusterIP (`service`), a pod of this node by address
//!   (`pod`, `namespace/workload`), loopback (`local`), else `external`
//!   (a named address block holding it, or the address). An address reused by
//!   another pod later does not rename counts already made.
//! - **At most `max_peers` series per pod** (and for the host), per
//!   direction: peers are admitted while there is room, the busiest first
//!   (bytes) when several wait; the others are summed into
//!   `peer_kind="other"`. A peer idle for the grace period loses its series
//!   and its place. A peer admitted after it was counted in `other` starts
//!   its own series at 0 (what it had stays in `other`), so no series ever
//!   goes backwards; a pod talking to a million addresses has
//!   `max_peers + 1` series per direction, and user space keeps at most
//!   `max_peers` folded peers per pod (plus what the kernel holds).
//! - **Owners**: a cgroup's pod is decided once; a cgroup whose owner is
//!   not known within the grace period, and a pod gone from the index
//!   (deleted more than the grace period ago), take their counts and
//!   kernel entries with them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use agent_common::tcp_peers::{LatKey, PeerCounters, PeerKey, BYTES_RECEIVED, BYTES_SENT, NUM_WORDS};

/// A pod by namespace and name; both empty for the host.
pub type Owner = (String, String);

/// What a peer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A Service, by its ClusterIP.
    Service,
    /// A pod of this node, by its address.
    Pod,
    /// A loopback address.
    Local,
    /// An address of this node (the kubelet's probes, host-network pods
    /// seen from a pod), named by the node's name.
    Node,
    /// Anything else.
    External,
    /// The peers beyond the bound, summed.
    Other,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Service => "service",
            Kind::Pod => "pod",
            Kind::Local => "local",
            Kind::Node => "node",
            Kind::External => "external",
            Kind::Other => "other",
        }
    }
}

/// A series' peer labels: direction, kind, name, port (none for `other`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Label {
    pub dir: u8,
    pub kind: Kind,
    pub peer: String,
    pub port: Option<u16>,
}

impl Label {
    fn other(dir: u8) -> Label {
        Label { dir, kind: Kind::Other, peer: String::new(), port: None }
    }
}

/// One peer's counts: the kernel's words and its connect latency's native
/// buckets (slot to count).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub words: [u64; NUM_WORDS],
    pub lat: BTreeMap<u32, u64>,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        for (a, b) in self.words.iter_mut().zip(o.words) {
            *a = a.wrapping_add(b);
        }
        for (slot, n) in &o.lat {
            let v = self.lat.entry(*slot).or_default();
            *v = v.wrapping_add(*n);
        }
    }

    fn bytes(&self) -> u64 {
        self.words[BYTES_SENT].wrapping_add(self.words[BYTES_RECEIVED])
    }

    /// `self - o`, word by word and bucket by bucket (never below 0).
    fn minus(&self, o: &Counts) -> Counts {
        let mut r = self.clone();
        for (a, b) in r.words.iter_mut().zip(o.words) {
            *a = a.saturating_sub(b);
        }
        for (slot, n) in &o.lat {
            if let Some(v) = r.lat.get_mut(slot) {
                *v = v.saturating_sub(*n);
            }
        }
        r.lat.retain(|_, v| *v > 0);
        r
    }
}

/// The address of a kernel key (IPv4-mapped addresses as IPv4).
pub fn address(raw: [u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(raw);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// An address block (`10.0.0.0/8`, `2001:db8::/32`) with a name, to group
/// external peers by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub name: String,
    pub net: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    /// `NAME=ADDRESS/PREFIX`; the address's host bits must be 0.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let bad = || format!("not NAME=ADDRESS/PREFIX (e.g. corp=10.0.0.0/8): {s:?}");
        let (name, block) = s.split_once('=').ok_or_else(bad)?;
        let (addr, prefix) = block.split_once('/').ok_or_else(bad)?;
        let net: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.trim().parse().map_err(|_| bad())?;
        let bits = if net.is_ipv4() { 32 } else { 128 };
        if name.trim().is_empty() || prefix > bits {
            return Err(bad());
        }
        let c = Cidr { name: name.trim().to_string(), net, prefix };
        if !c.contains(net) || c.masked(net) != Cidr::bits(net) {
            return Err(format!("{s:?}: the address has bits set past the prefix /{prefix}"));
        }
        Ok(c)
    }

    fn bits(a: IpAddr) -> u128 {
        match a {
            IpAddr::V4(v4) => u32::from(v4) as u128,
            IpAddr::V6(v6) => u128::from(v6),
        }
    }

    fn masked(&self, a: IpAddr) -> u128 {
        let width = if a.is_ipv4() { 32 } else { 128 };
        let keep = u32::from(self.prefix);
        if keep == 0 {
            return 0;
        }
        let v = Cidr::bits(a);
        v >> (width - keep) << (width - keep)
    }

    pub fn contains(&self, a: IpAddr) -> bool {
        a.is_ipv4() == self.net.is_ipv4() && self.masked(a) == Cidr::bits(self.net)
    }
}

/// This node: its name, and which addresses are its own.
pub type Node<'a> = (&'a str, &'a dyn Fn(IpAddr) -> bool);

/// Names an address: a Service by ClusterIP (`services`), else `pods` maps
/// this node's pod addresses to `namespace/workload`, else loopback, else
/// an address of this node (`node`, its name), else the first of `cidrs`
/// holding it (`external`, its name), else the address (`external`).
pub fn name(
    addr: IpAddr,
    services: Option<&super::services::ServiceIndex>,
    pods: &HashMap<IpAddr, String>,
    node: Node<'_>,
    cidrs: &[Cidr],
) -> (Kind, String) {
    if let Some(s) = services.and_then(|s| s.get(&addr)) {
        return (Kind::Service, s.to_string());
    }
    if let Some(p) = pods.get(&addr) {
        return (Kind::Pod, p.clone());
    }
    if addr.is_loopback() {
        return (Kind::Local, addr.to_string());
    }
    if (node.1)(addr) {
        return (Kind::Node, node.0.to_string());
    }
    if let Some(c) = cidrs.iter().find(|c| c.contains(addr)) {
        return (Kind::External, c.name.clone());
    }
    (Kind::External, addr.to_string())
}

/// A kernel entry seen at the last pass, whose cgroup's owner is known.
#[derive(Debug)]
struct Live {
    owner: Owner,
    /// Its series' label, decided when the entry first appeared.
    label: Label,
    /// Its counts at the last pass.
    counts: Counts,
}

/// One pod's (or the host's) counts with one peer label: what kernel
/// entries folded into it, what it had in `other` before it was admitted.
#[derive(Debug, Default)]
struct Agg {
    /// Counts of kernel entries taken out (of every cgroup of its owner).
    folded: Counts,
    /// What was counted in `other` before the peer was admitted.
    offset: Counts,
    /// In a pass's series already (in `other`, if not admitted).
    reported: bool,
}

/// A cgroup with kernel entries: its owner, or since when it waits for one.
#[derive(Debug)]
enum CgroupOwner {
    Known(Owner),
    Pending(Instant),
}

/// The state kept between scrapes.
#[derive(Debug)]
pub struct Peers {
    /// The kernel's entries of cgroups whose owner is known.
    live: HashMap<PeerKey, Live>,
    /// Per owner and peer label: counts out of the kernel.
    aggs: HashMap<(Owner, Label), Agg>,
    /// Folded counts of peers beyond the bound, by owner and direction.
    other: HashMap<(Owner, u8), Counts>,
    /// Peers with series of their own, by owner, and when they last
    /// changed.
    admitted: HashMap<Owner, BTreeMap<Label, Instant>>,
    /// The cgroups with entries in the kernel (only those).
    cgroups: HashMap<u64, CgroupOwner>,
    /// The most peers with series of their own, per pod and direction.
    pub max_peers: usize,
    /// How long a peer may stay idle with a series of its own.
    pub grace: Duration,
    /// How busy a peer is, to admit the busiest first: bytes, unless the
    /// probe says otherwise ([`Peers::ranked_by`]).
    rank: fn(&Counts) -> u64,
    /// The direction of a key's series: its own, unless the probe keeps
    /// records of its own beside the kernel's ([`Peers::labelled_by`]).
    label_dir: fn(u8) -> u8,
    /// The word counting things open now, if the probe has one
    /// ([`Peers::open_in`]).
    open: Option<usize>,
}

/// The result of one pass.
#[derive(Debug, Default)]
pub struct Pass {
    /// Per pod and peer label, the counts so far.
    pub series: BTreeMap<(Owner, Label), Counts>,
    /// Kernel entries to take out (with their values, as
    /// `maps::hash_take` does) and hand to [`Peers::retire`]: entries
    /// unchanged for a whole pass, whose counts move to user space, and
    /// entries whose counts are dropped (their owner went, or none could
    /// be named).
    pub take: Vec<PeerKey>,
    pub take_lat: Vec<LatKey>,
    /// Peers (per owner and label) with counts in user space, and cgroups
    /// whose owner is not known yet.
    pub tracked: usize,
    pub pending: usize,
    /// Cgroups whose counts this pass dropped, no owner being known for them.
    pub unattributed: usize,
}

/// Who owns a cgroup, as far as the caller can tell now.
pub enum Resolution {
    Owner(Owner),
    /// Not known yet (a pod not listed yet, a cgroup not walked yet).
    Pending,
    /// Never to be known: its counts are dropped (and counted).
    Unattributable,
}

impl Peers {
    pub fn new(max_peers: usize, grace: Duration) -> Peers {
        Peers {
            live: HashMap::new(),
            aggs: HashMap::new(),
            other: HashMap::new(),
            admitted: HashMap::new(),
            cgroups: HashMap::new(),
            max_peers,
            grace,
            rank: Counts::bytes,
            label_dir: |d| d,
            open: None,
        }
    }

    /// Keys whose `dir` maps to the same direction are one series (and
    /// take one place of the bound) when their cgroup and address agree.
    pub fn labelled_by(mut self, label_dir: fn(u8) -> u8) -> Peers {
        self.label_dir = label_dir;
        self
    }

    /// Admits the waiting peers with the highest `rank` first.
    pub fn ranked_by(mut self, rank: fn(&Counts) -> u64) -> Peers {
        self.rank = rank;
        self
    }

    /// Word `word` counts things open now (a gauge the kernel adds to and
    /// takes from, e.g. connections): an entry holding some is active, is
    /// never taken out of the kernel (what closes them must find it), and
    /// when its peer is admitted after it was counted in `other` it takes
    /// them along (a gauge need not only grow).
    pub fn open_in(mut self, word: usize) -> Peers {
        self.open = Some(word);
        self
    }

    fn holds_open(&self, c: &Counts) -> bool {
        self.open.and_then(|w| c.words.get(w)).is_some_and(|n| (*n as i64) > 0)
    }

    /// One pass over the kernel's entries. `resolve` names a cgroup's owner
    /// (called for cgroups not decided yet, with when their counts were
    /// first seen), `alive` says whether a decided owner is still there,
    /// `name` names a peer's address ([`name`]).
    pub fn update(
        &mut self,
        stats: &[(PeerKey, PeerCounters)],
        lat: &[(LatKey, u64)],
        mut resolve: impl FnMut(u64, Instant) -> Resolution,
        alive: impl Fn(&Owner) -> bool,
        name: impl Fn(IpAddr) -> (Kind, String),
        now: Instant,
    ) -> Pass {
        let mut pass = Pass::default();
        // The kernel's counts now, by key.
        let mut kernel: HashMap<PeerKey, Counts> = HashMap::with_capacity(stats.len());
        for (k, c) in stats {
            kernel.entry(*k).or_default().words = c.words;
        }
        let mut lat_keys: HashMap<PeerKey, Vec<LatKey>> = HashMap::new();
        for (k, n) in lat {
            kernel.entry(k.peer).or_default().lat.insert(k.slot, *n);
            lat_keys.entry(k.peer).or_default().push(*k);
        }
        // Owners gone: their counts go, their kernel entries are dropped.
        self.admitted.retain(|o, _| alive(o));
        self.aggs.retain(|(o, _), _| alive(o));
        self.other.retain(|(o, _), _| alive(o));
        self.live.retain(|_, l| alive(&l.owner));
        let mut dropped: BTreeSet<u64> = BTreeSet::new();
        self.cgroups.retain(|cg, c| {
            let gone = matches!(c, CgroupOwner::Known(o) if !alive(o));
            if gone {
                dropped.insert(*cg);
            }
            !gone
        });
        // Owners of the cgroups counted, decided once.
        let counted: BTreeSet<u64> = kernel.keys().map(|k| k.cgroup).collect();
        self.cgroups.retain(|cg, _| counted.contains(cg));
        for cg in &counted {
            let since = match self.cgroups.get(cg) {
                Some(CgroupOwner::Known(_)) => continue,
                Some(CgroupOwner::Pending(since)) => *since,
                None if dropped.contains(cg) => continue,
                None => now,
            };
            match resolve(*cg, since) {
                Resolution::Owner(o) => {
                    self.cgroups.insert(*cg, CgroupOwner::Known(o));
                }
                Resolution::Pending => {
                    self.cgroups.insert(*cg, CgroupOwner::Pending(since));
                }
                Resolution::Unattributable => {
                    self.cgroups.remove(cg);
                    dropped.insert(*cg);
                    pass.unattributed += 1;
                }
            }
        }
        pass.pending = self.cgroups.values().filter(|c| matches!(c, CgroupOwner::Pending(_))).count();
        // The kernel's entries: new ones named, changed ones active,
        // unchanged ones taken out.
        let mut active: BTreeSet<(Owner, Label)> = BTreeSet::new();
        for (k, c) in kernel.iter() {
            let take = |pass: &mut Pass, lat_keys: &mut HashMap<PeerKey, Vec<LatKey>>| {
                pass.take.push(*k);
                pass.take_lat.extend(lat_keys.remove(k).unwrap_or_default());
            };
            if dropped.contains(&k.cgroup) {
                self.live.remove(k);
                take(&mut pass, &mut lat_keys);
                continue;
            }
            let Some(CgroupOwner::Known(o)) = self.cgroups.get(&k.cgroup) else { continue };
            let fresh = !self.live.contains_key(k);
            let label_dir = self.label_dir;
            let open = self.holds_open(c);
            let l = self.live.entry(*k).or_insert_with(|| {
                // The kernel's own record of a cgroup's peers beyond its
                // bound: part of its other, never a peer.
                let label = if k.is_other() {
                    Label::other(label_dir(k.dir))
                } else {
                    let (kind, peer) = name(address(k.addr));
                    Label { dir: label_dir(k.dir), kind, peer, port: Some(k.port) }
                };
                Live { owner: o.clone(), label, counts: Counts::default() }
            });
            self.aggs.entry((l.owner.clone(), l.label.clone())).or_default();
            if !fresh && l.counts == *c && !open {
                take(&mut pass, &mut lat_keys);
            } else if fresh || l.counts != *c || open {
                // Changed, or with something open: not idle.
                active.insert((l.owner.clone(), l.label.clone()));
            }
            l.counts = c.clone();
        }
        // Entries gone from the kernel without being taken: what they had
        // at the last pass stays their peer's.
        let aggs = &mut self.aggs;
        self.live.retain(|k, l| {
            if kernel.contains_key(k) {
                return true;
            }
            if let Some(a) = aggs.get_mut(&(l.owner.clone(), l.label.clone())) {
                a.folded.add(&l.counts);
            }
            false
        });
        // What the kernel holds now, per owner and label.
        let mut in_kernel: HashMap<(Owner, Label), Counts> = HashMap::new();
        for l in self.live.values() {
            in_kernel.entry((l.owner.clone(), l.label.clone())).or_default().add(&l.counts);
        }
        let own = |aggs: &HashMap<(Owner, Label), Agg>, key: &(Owner, Label)| -> Counts {
            let Some(a) = aggs.get(key) else { return Counts::default() };
            let mut t = a.folded.clone();
            if let Some(k) = in_kernel.get(key) {
                t.add(k);
            }
            t.minus(&a.offset)
        };
        // Admitted peers that changed are active now; idle ones past the
        // grace period (and not changed in this pass) lose their series,
        // their counts and their place.
        for (o, label) in &active {
            if let Some(t) = self.admitted.get_mut(o).and_then(|m| m.get_mut(label)) {
                *t = now;
            }
        }
        let grace = self.grace;
        let mut expired: Vec<(Owner, Label)> = Vec::new();
        for (o, m) in &mut self.admitted {
            m.retain(|l, t| {
                let keep = *t >= now || now.duration_since(*t) < grace;
                if !keep {
                    expired.push((o.clone(), l.clone()));
                }
                keep
            });
        }
        self.admitted.retain(|_, m| !m.is_empty());
        for key in expired {
            if !in_kernel.contains_key(&key) {
                self.aggs.remove(&key);
            }
        }
        // Admit waiting peers, the busiest first, while there is room.
        let mut waiting: BTreeMap<(Owner, u8), Vec<(u64, Label)>> = BTreeMap::new();
        for (o, label) in self.aggs.keys() {
            if label.kind == Kind::Other || self.admitted.get(o).is_some_and(|m| m.contains_key(label)) {
                continue;
            }
            let busy = (self.rank)(&own(&self.aggs, &(o.clone(), label.clone())));
            waiting.entry((o.clone(), label.dir)).or_default().push((busy, label.clone()));
        }
        let mut admitted_now: Vec<(Owner, Label)> = Vec::new();
        for ((o, dir), mut labels) in waiting {
            labels.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            let m = self.admitted.entry(o.clone()).or_default();
            let room = self.max_peers.saturating_sub(m.keys().filter(|x| x.dir == dir).count());
            for (_, l) in labels.into_iter().take(room) {
                m.insert(l.clone(), now);
                admitted_now.push((o.clone(), l));
            }
        }
        self.admitted.retain(|_, m| !m.is_empty());
        // A peer admitted after it was counted in other: what it had stays
        // there, and its own series starts at 0 (but for what is open now,
        // which it takes along: its closes will be its own).
        for key in admitted_now {
            let mut counted = own(&self.aggs, &key);
            if let Some(w) = self.open.and_then(|w| counted.words.get_mut(w)) {
                *w = 0;
            }
            if let Some(a) = self.aggs.get_mut(&key).filter(|a| a.reported) {
                self.other.entry((key.0.clone(), key.1.dir)).or_default().add(&counted);
                a.offset.add(&counted);
            }
        }
        // Peers left out, and out of the kernel: into their owner's other.
        let left_out: Vec<(Owner, Label)> = self
            .aggs
            .keys()
            .filter(|(o, l)| !self.admitted.get(o).is_some_and(|m| m.contains_key(l)) && !in_kernel.contains_key(&(o.clone(), l.clone())))
            .cloned()
            .collect();
        for key in left_out {
            let counted = own(&self.aggs, &key);
            self.other.entry((key.0.clone(), key.1.dir)).or_default().add(&counted);
            self.aggs.remove(&key);
        }
        // The series.
        let keys: Vec<(Owner, Label)> = self.aggs.keys().cloned().collect();
        for key in keys {
            let counted = own(&self.aggs, &key);
            let label =
                if self.admitted.get(&key.0).is_some_and(|m| m.contains_key(&key.1)) { key.1.clone() } else { Label::other(key.1.dir) };
            pass.series.entry((key.0.clone(), label)).or_default().add(&counted);
            if let Some(a) = self.aggs.get_mut(&key) {
                a.reported = true;
            }
        }
        for ((o, dir), c) in &self.other {
            pass.series.entry((o.clone(), Label::other(*dir))).or_default().add(c);
        }
        pass.tracked = self.aggs.len();
        pass
    }

    /// The entries [`Pass::take`] named, as taken out of the kernel (each
    /// with its value when it was deleted; entries already gone are not
    /// among them): their counts join their peer's in user space (those of
    /// dropped entries, no longer followed, are forgotten).
    pub fn retire(&mut self, stats: &[(PeerKey, PeerCounters)], lat: &[(LatKey, u64)]) {
        let mut taken: HashMap<PeerKey, Counts> = HashMap::new();
        for (k, c) in stats {
            taken.entry(*k).or_default().words = c.words;
        }
        for (k, n) in lat {
            taken.entry(k.peer).or_default().lat.insert(k.slot, *n);
        }
        for (k, c) in taken {
            let Some(l) = self.live.remove(&k) else { continue };
            self.aggs.entry((l.owner, l.label)).or_default().folded.add(&c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_common::tcp_peers::{ATTEMPTS, CLOSED, DIR_IN, DIR_OUT, ESTABLISHED, OPEN};

    /// No address is this node's.
    fn not_node(_: IpAddr) -> bool {
        false
    }
    const NO_NODE: Node<'static> = ("node-1", &not_node);

    #[test]
    fn external_peers_are_grouped_by_the_first_block_holding_them() {
        let cidrs =
            [Cidr::parse("corp=10.0.0.0/8").unwrap(), Cidr::parse("all=0.0.0.0/0").unwrap(), Cidr::parse("v6=2001:db8::/32").unwrap()];
        let n = |a: &str| name(a.parse().unwrap(), None, &HashMap::new(), NO_NODE, &cidrs);
        assert_eq!(n("10.1.2.3"), (Kind::External, "corp".into()));
        assert_eq!(n("192.0.2.1"), (Kind::External, "all".into()));
        assert_eq!(n("2001:db8::1"), (Kind::External, "v6".into()));
        assert_eq!(n("2001:db9::1"), (Kind::External, "2001:db9::1".into()));
        assert_eq!(n("127.0.0.1"), (Kind::Local, "127.0.0.1".into()), "loopback before any block");
        for bad in ["10.0.0.0/8", "=10.0.0.0/8", "x=10.0.0.1/8", "x=10.0.0.0/33", "x=10.0.0.0", "x=nope/8"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
        assert!(Cidr::parse("x=10.0.0.1/32").is_ok());
    }

    fn key(cgroup: u64, ip: [u8; 4], port: u16, dir: u8) -> PeerKey {
        let mut addr = [0u8; 16];
        addr[10] = 0xff;
        addr[11] = 0xff;
        addr[12..].copy_from_slice(&ip);
        PeerKey { cgroup, addr, port, dir, pad: [0; 5] }
    }

    fn web() -> Owner {
        ("web".into(), "web-0".into())
    }

    fn resolve(cg: u64, _: Instant) -> Resolution {
        match cg {
            1 | 2 => Resolution::Owner(web()),
            0 | 100.. => Resolution::Owner(Owner::default()),
            _ => Resolution::Pending,
        }
    }

    fn named(a: IpAddr) -> (Kind, String) {
        name(a, None, &HashMap::new(), NO_NODE, &[])
    }

    fn attempts_of(p: &Pass, o: &Owner, kind: Kind, peer: &str) -> u64 {
        p.series.iter().filter(|((x, l), _)| x == o && l.kind == kind && l.peer == peer).map(|(_, c)| c.words[ATTEMPTS]).sum()
    }

    fn attempts(p: &Pass, kind: Kind, peer: &str) -> u64 {
        attempts_of(p, &web(), kind, peer)
    }

    /// A kernel map the programs add to and a pass takes from, as the
    /// collectors do: `update`, then the entries it names taken out with
    /// what they hold then, and handed back to `retire`.
    #[derive(Default)]
    struct Kernel {
        stats: BTreeMap<PeerKey, PeerCounters>,
        lat: HashMap<LatKey, u64>,
    }

    impl Kernel {
        fn add(&mut self, k: PeerKey, attempts: u64, bytes: u64) {
            let c = self.stats.entry(k).or_insert(PeerCounters::ZERO);
            c.words[ATTEMPTS] += attempts;
            c.words[ESTABLISHED] += attempts;
            c.words[CLOSED] += attempts;
            c.words[BYTES_SENT] += bytes;
        }

        fn pass(&mut self, p: &mut Peers, resolve: impl FnMut(u64, Instant) -> Resolution, now: Instant) -> Pass {
            let stats: Vec<_> = self.stats.iter().map(|(k, v)| (*k, *v)).collect();
            let lat: Vec<_> = self.lat.iter().map(|(k, v)| (*k, *v)).collect();
            let pass = p.update(&stats, &lat, resolve, |_| true, named, now);
            let taken: Vec<_> = pass.take.iter().filter_map(|k| self.stats.remove(k).map(|v| (*k, v))).collect();
            let taken_lat: Vec<_> = pass.take_lat.iter().filter_map(|k| self.lat.remove(k).map(|v| (*k, v))).collect();
            p.retire(&taken, &taken_lat);
            pass
        }
    }

    #[test]
    fn names_addresses() {
        let pods: HashMap<IpAddr, String> = [("10.1.0.5".parse().expect("address"), "db/pg".to_string())].into();
        assert_eq!(address(key(0, [10, 1, 0, 5], 0, 0).addr), "10.1.0.5".parse::<IpAddr>().unwrap());
        let mut services = super::super::services::ServiceIndex::default();
        let svc = serde_json::json!({"metadata": {"uid": "s", "namespace": "web", "name": "front"}, "spec": {"clusterIP": "10.96.0.10"}});
        services.apply(&serde_json::from_value(svc).expect("service"));
        let node_ip: IpAddr = "192.0.2.2".parse().expect("address");
        let is_node = move |a: IpAddr| a == node_ip;
        let n = |a: &str| name(a.parse().expect("address"), Some(&services), &pods, ("node-1", &is_node), &[]);
        assert_eq!(n("10.96.0.10"), (Kind::Service, "web/front".into()));
        assert_eq!(n("10.1.0.5"), (Kind::Pod, "db/pg".into()));
        assert_eq!(n("127.0.0.1"), (Kind::Local, "127.0.0.1".into()));
        assert_eq!(n("::1"), (Kind::Local, "::1".into()));
        assert_eq!(n("192.0.2.2"), (Kind::Node, "node-1".into()), "the node's own address, as the kubelet's probes come from");
        assert_eq!(n("8.8.8.8"), (Kind::External, "8.8.8.8".into()));
    }

    #[test]
    fn idle_entries_leave_the_kernel_and_counts_never_go_back() {
        let mut p = Peers::new(20, Duration::from_secs(300));
        let mut kernel = Kernel::default();
        let t = Instant::now();
        let k = key(1, [10, 0, 0, 1], 80, DIR_OUT);
        kernel.add(k, 3, 30);
        let a = kernel.pass(&mut p, resolve, t);
        assert!(a.take.is_empty());
        assert_eq!(attempts(&a, Kind::External, "10.0.0.1"), 3);
        // Unchanged a whole interval: taken from the kernel, still counted;
        // a connect that came between the read and the take counts too.
        let stats: Vec<_> = kernel.stats.iter().map(|(k, v)| (*k, *v)).collect();
        let b = p.update(&stats, &[], resolve, |_| true, named, t);
        assert_eq!(b.take, vec![k]);
        assert_eq!(attempts(&b, Kind::External, "10.0.0.1"), 3);
        kernel.add(k, 1, 10);
        let taken: Vec<_> = kernel.stats.iter().map(|(k, v)| (*k, *v)).collect();
        kernel.stats.clear();
        p.retire(&taken, &[]);
        let c = kernel.pass(&mut p, resolve, t);
        assert_eq!(attempts(&c, Kind::External, "10.0.0.1"), 4);
        // Made again from zero by new connects.
        kernel.add(k, 2, 20);
        let d = kernel.pass(&mut p, resolve, t);
        assert_eq!(attempts(&d, Kind::External, "10.0.0.1"), 6);
    }

    #[test]
    fn a_thousand_peers_make_max_plus_one_series_that_never_decrease() {
        let mut p = Peers::new(20, Duration::from_secs(300));
        let mut kernel = Kernel::default();
        let t = Instant::now();
        for i in 0..1000u32 {
            kernel.add(key(1, [10, 78, (i >> 8) as u8, i as u8], 80, DIR_OUT), 1, u64::from(i));
        }
        let a = kernel.pass(&mut p, resolve, t);
        let out: Vec<_> = a.series.keys().filter(|(o, l)| *o == web() && l.dir == DIR_OUT).collect();
        assert_eq!(out.len(), 21);
        let total: u64 = a.series.iter().filter(|((o, _), _)| *o == web()).map(|(_, c)| c.words[ATTEMPTS]).sum();
        assert_eq!(total, 1000);
        // The busiest 20 (bytes 980..999) have their own series.
        assert_eq!(attempts(&a, Kind::External, "10.78.3.231"), 1);
        assert_eq!(attempts(&a, Kind::Other, ""), 980);
        // Idle: out of the kernel, and the others out of user space too.
        let b = kernel.pass(&mut p, resolve, t);
        assert_eq!(b.take.len(), 1000);
        let c = kernel.pass(&mut p, resolve, t);
        assert_eq!(c.tracked, 20);
        assert_eq!(attempts(&c, Kind::Other, ""), 980);
        // A new peer now goes to other; the admitted keep theirs.
        kernel.add(key(1, [10, 99, 0, 1], 80, DIR_OUT), 1, 1_000_000);
        let d = kernel.pass(&mut p, resolve, t);
        assert_eq!(attempts(&d, Kind::Other, ""), 981);
        assert_eq!(attempts(&d, Kind::External, "10.78.3.231"), 1);
    }

    #[test]
    fn idle_peers_give_their_place_and_a_late_one_starts_at_zero() {
        let mut p = Peers::new(1, Duration::from_secs(10));
        let mut kernel = Kernel::default();
        let t = Instant::now();
        let (a, b) = (key(1, [10, 0, 0, 1], 80, DIR_OUT), key(1, [10, 0, 0, 2], 80, DIR_OUT));
        // a is admitted (busier), b counted in other.
        kernel.add(a, 1, 100);
        kernel.add(b, 2, 1);
        let p1 = kernel.pass(&mut p, resolve, t);
        assert_eq!((attempts(&p1, Kind::External, "10.0.0.1"), attempts(&p1, Kind::Other, "")), (1, 2));
        // b keeps connecting; a goes quiet, is folded out, then idle past the grace.
        kernel.add(b, 1, 0);
        let p2 = kernel.pass(&mut p, resolve, t + Duration::from_secs(5));
        assert_eq!(attempts(&p2, Kind::Other, ""), 3);
        kernel.add(b, 1, 0);
        let p3 = kernel.pass(&mut p, resolve, t + Duration::from_secs(11));
        // a's series is gone; b took its place from 0, other keeps b's 4.
        assert!(!p3.series.keys().any(|(_, l)| l.peer == "10.0.0.1"), "{:?}", p3.series.keys());
        assert_eq!(attempts(&p3, Kind::Other, ""), 4, "other never goes back");
        assert_eq!(attempts(&p3, Kind::External, "10.0.0.2"), 0, "b's own series starts at its admission");
        kernel.add(b, 2, 0);
        let p4 = kernel.pass(&mut p, resolve, t + Duration::from_secs(12));
        assert_eq!((attempts(&p4, Kind::External, "10.0.0.2"), attempts(&p4, Kind::Other, "")), (2, 4));
    }

    #[test]
    fn a_peer_active_at_every_pass_keeps_its_series_whatever_the_grace_period() {
        // Even with no grace period at all (the flag refuses one under a
        // second): a peer that changed in a pass is not idle, so it never
        // loses its series to other.
        let mut p = Peers::new(20, Duration::ZERO);
        let mut kernel = Kernel::default();
        let t = Instant::now();
        let k = key(1, [10, 0, 0, 1], 80, DIR_OUT);
        for i in 1..=6u64 {
            kernel.add(k, 5, 1);
            let pass = kernel.pass(&mut p, resolve, t + Duration::from_secs(i));
            assert_eq!(attempts(&pass, Kind::External, "10.0.0.1"), 5 * i, "pass {i}");
            assert_eq!(attempts(&pass, Kind::Other, ""), 0, "pass {i}");
        }
    }

    #[test]
    fn directions_have_their_own_bound() {
        let mut p = Peers::new(1, Duration::from_secs(300));
        let mut kernel = Kernel::default();
        kernel.add(key(1, [10, 0, 0, 1], 80, DIR_OUT), 1, 1);
        kernel.add(key(1, [10, 0, 0, 2], 8080, DIR_IN), 1, 1);
        let a = kernel.pass(&mut p, resolve, Instant::now());
        assert!(a.series.keys().all(|(_, l)| l.kind == Kind::External), "{:?}", a.series.keys());
    }

    #[test]
    fn pending_cgroups_wait_unattributable_ones_are_dropped_and_gone_pods_take_their_counts() {
        let mut p = Peers::new(20, Duration::from_secs(10));
        let mut kernel = Kernel::default();
        let t = Instant::now();
        let k = key(7, [10, 0, 0, 1], 80, DIR_OUT);
        kernel.add(k, 1, 1);
        let a = kernel.pass(&mut p, resolve, t);
        assert_eq!((a.series.len(), a.pending, a.take.len()), (0, 1, 0));
        // Pending as long as the resolver says so, whatever the time.
        let b = kernel.pass(&mut p, resolve, t + Duration::from_secs(100));
        assert_eq!((b.series.len(), b.pending, b.take.len()), (0, 1, 0));
        // Then known: every count is the pod's.
        let mut known = |cg: u64, _: Instant| if cg == 7 { Resolution::Owner(web()) } else { resolve(cg, t) };
        kernel.add(k, 1, 1);
        let c = kernel.pass(&mut p, &mut known, t + Duration::from_secs(101));
        assert_eq!(attempts(&c, Kind::External, "10.0.0.1"), 2);
        // A cgroup no owner will ever be known for: dropped and counted.
        let k9 = key(9, [10, 0, 0, 1], 80, DIR_OUT);
        kernel.add(k9, 1, 1);
        let d = kernel.pass(&mut p, |cg, s| if cg == 9 { Resolution::Unattributable } else { known(cg, s) }, t + Duration::from_secs(102));
        assert_eq!((d.unattributed, d.take.contains(&k9)), (1, true));
        assert!(!kernel.stats.contains_key(&k9));
        // The pod goes: its series and kernel entries with it.
        kernel.add(k, 1, 1);
        let stats: Vec<_> = kernel.stats.iter().map(|(k, v)| (*k, *v)).collect();
        let e = p.update(&stats, &[], known, |o| *o != web(), named, t + Duration::from_secs(103));
        assert_eq!((e.series.len(), e.take), (0, vec![k]));
    }

    /// Thousands of short-lived cgroups of one owner, one connect each to
    /// the same server: one series with every connect, and the state held
    /// between passes is that of the last interval's cgroups only.
    #[test]
    fn short_lived_cgroups_fold_into_their_owner_and_leave_nothing_behind() {
        let mut p = Peers::new(20, Duration::from_secs(300));
        let mut kernel = Kernel::default();
        let mut t = Instant::now();
        for batch in 0..30u64 {
            for i in 0..100 {
                kernel.add(key(100 + batch * 100 + i, [10, 96, 0, 10], 53, DIR_OUT), 1, 0);
            }
            t += Duration::from_secs(15);
            let pass = kernel.pass(&mut p, resolve, t);
            assert!(p.live.len() <= 200 && p.cgroups.len() <= 200, "batch {batch}: {} entries, {} cgroups", p.live.len(), p.cgroups.len());
            assert_eq!(pass.tracked, 1);
        }
        let last = kernel.pass(&mut p, resolve, t + Duration::from_secs(15));
        assert_eq!(attempts_of(&last, &Owner::default(), Kind::External, "10.96.0.10"), 3000);
        assert_eq!(last.tracked, 1);
    }

    /// An entry with connections open stays in the kernel however long it
    /// is unchanged (their close is counted there), and its peer keeps its
    /// series.
    #[test]
    fn entries_with_connections_open_stay_in_the_kernel() {
        let mut p = Peers::new(20, Duration::from_secs(10)).open_in(OPEN);
        let mut kernel = Kernel::default();
        let t = Instant::now();
        let k = key(1, [10, 0, 0, 1], 80, DIR_OUT);
        kernel.stats.insert(k, {
            let mut c = PeerCounters::ZERO;
            c.words[ESTABLISHED] = 100;
            c.words[ATTEMPTS] = 100;
            c.words[OPEN] = 100;
            c
        });
        for s in [0, 15, 30, 45] {
            let pass = kernel.pass(&mut p, resolve, t + Duration::from_secs(s));
            assert!(pass.take.is_empty(), "at {s}s: open connections keep the entry");
            assert_eq!(attempts(&pass, Kind::External, "10.0.0.1"), 100, "at {s}s");
        }
        let c = kernel.stats.get_mut(&k).expect("entry");
        (c.words[CLOSED], c.words[OPEN]) = (100, 0);
        kernel.pass(&mut p, resolve, t + Duration::from_secs(50));
        let pass = kernel.pass(&mut p, resolve, t + Duration::from_secs(55));
        assert_eq!(pass.take, vec![k], "closed: taken out once idle");
    }

    #[test]
    fn latency_buckets_fold_with_their_peer() {
        let mut p = Peers::new(20, Duration::from_secs(300));
        let mut kernel = Kernel::default();
        let t = Instant::now();
        let k = key(1, [10, 0, 0, 1], 80, DIR_OUT);
        kernel.add(k, 2, 2);
        kernel.lat.insert(LatKey { peer: k, slot: 300, pad: 0 }, 2);
        kernel.pass(&mut p, resolve, t);
        let b = kernel.pass(&mut p, resolve, t);
        assert_eq!(b.take_lat, vec![LatKey { peer: k, slot: 300, pad: 0 }]);
        let c = kernel.pass(&mut p, resolve, t);
        let (_, counts) = c.series.iter().next().expect("a series");
        assert_eq!(counts.lat.get(&300), Some(&2));
    }

    #[test]
    fn the_kernels_other_record_is_the_cgroups_other_never_a_peer() {
        let mut p = Peers::new(20, Duration::from_secs(300));
        let mut kernel = Kernel::default();
        let t = Instant::now();
        let (k, o) = (key(1, [10, 0, 0, 1], 80, DIR_OUT), PeerKey::other(1, DIR_OUT));
        kernel.add(k, 1, 1);
        kernel.add(o, 4, 4);
        kernel.lat.insert(LatKey { peer: o, slot: 300, pad: 0 }, 4);
        // Room for twenty peers, yet the kernel's other is summed as other.
        let a = kernel.pass(&mut p, resolve, t);
        assert_eq!(a.series.len(), 2, "{:?}", a.series.keys());
        assert_eq!((attempts(&a, Kind::External, "10.0.0.1"), attempts(&a, Kind::Other, "")), (1, 4));
        let other = a.series.get(&(web(), Label::other(DIR_OUT))).expect("other");
        assert_eq!(other.lat.get(&300), Some(&4), "its buckets with it");
        // Idle: taken out of the kernel, still other, with what comes later.
        kernel.pass(&mut p, resolve, t);
        kernel.add(o, 2, 2);
        let c = kernel.pass(&mut p, resolve, t);
        assert_eq!(attempts(&c, Kind::Other, ""), 6);
        assert_eq!(c.series.len(), 2);
    }

    fn gauge(p: &Pass, kind: Kind, peer: &str) -> i64 {
        p.series.iter().filter(|((o, l), _)| *o == web() && l.kind == kind && l.peer == peer).map(|(_, c)| c.words[OPEN] as i64).sum()
    }

    #[test]
    fn a_peer_admitted_late_takes_its_open_connections_out_of_other() {
        let mut p = Peers::new(1, Duration::from_secs(10)).open_in(OPEN);
        let mut kernel = Kernel::default();
        let t = Instant::now();
        let (a, b) = (key(1, [10, 0, 0, 1], 80, DIR_OUT), key(1, [10, 0, 0, 2], 80, DIR_OUT));
        // a is admitted; b, with one connection open, is counted in other.
        kernel.add(a, 1, 100);
        kernel.stats.insert(b, {
            let mut c = PeerCounters::ZERO;
            (c.words[ATTEMPTS], c.words[ESTABLISHED], c.words[OPEN]) = (1, 1, 1);
            c
        });
        let x = kernel.pass(&mut p, resolve, t);
        assert_eq!((gauge(&x, Kind::External, "10.0.0.2"), gauge(&x, Kind::Other, "")), (0, 1));
        // a goes idle past the grace period; b takes its place, with its
        // open connection, and other's gauge comes down.
        kernel.pass(&mut p, resolve, t + Duration::from_secs(5));
        let x = kernel.pass(&mut p, resolve, t + Duration::from_secs(11));
        assert_eq!((gauge(&x, Kind::External, "10.0.0.2"), gauge(&x, Kind::Other, "")), (1, 0));
        assert_eq!(attempts(&x, Kind::External, "10.0.0.2"), 0, "its counters start at its admission");
        assert_eq!(attempts(&x, Kind::Other, ""), 1, "and other keeps what they had");
        // It closes: the peer's gauge to 0, other's stays 0.
        let c = kernel.stats.get_mut(&b).expect("b");
        (c.words[CLOSED], c.words[OPEN]) = (1, 0);
        let x = kernel.pass(&mut p, resolve, t + Duration::from_secs(12));
        assert_eq!((gauge(&x, Kind::External, "10.0.0.2"), gauge(&x, Kind::Other, "")), (0, 0));
    }
}

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

    fn is_zero(&self) -> bool {
        self.words.iter().all(|w| *w == 0) && self.lat.is_empty()
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

/// Names an address: a Service by ClusterIP (`services`), else `pods` maps
/// this node's pod addresses to `namespace/workload`, else loopback, else
/// the first of `cidrs` holding it (`external`, its name), else the
/// address (`external`).
pub fn name(
    addr: IpAddr,
    services: Option<&super::services::ServiceIndex>,
    pods: &HashMap<IpAddr, String>,
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
    if let Some(c) = cidrs.iter().find(|c| c.contains(addr)) {
        return (Kind::External, c.name.clone());
    }
    (Kind::External, addr.to_string())
}

#[derive(Debug)]
struct Entry {
    label: Label,
    /// Counts folded out of the kernel (entries deleted there).
    folded: Counts,
    /// The kernel entry's counts at the last pass.
    live: Counts,
    /// What was counted in `other` before the peer was admitted.
    offset: Counts,
    /// In a pass's series already (in `other`, if not admitted).
    reported: bool,
}

impl Entry {
    /// Its counts since it was admitted (or all, if it never was).
    fn own(&self) -> Counts {
        let mut t = self.folded.clone();
        t.add(&self.live);
        t.minus(&self.offset)
    }
}

/// The state kept between scrapes.
#[derive(Debug)]
pub struct Peers {
    entries: HashMap<PeerKey, Entry>,
    /// Folded counts of peers beyond the bound, by cgroup and direction.
    other: HashMap<(u64, u8), Counts>,
    /// Peers with series of their own, by owner, and when they last
    /// changed.
    admitted: HashMap<Owner, BTreeMap<Label, Instant>>,
    owners: HashMap<u64, Owner>,
    pending: HashMap<u64, Instant>,
    /// The most peers with series of their own, per pod and direction.
    pub max_peers: usize,
    /// How long a cgroup may stay without an owner, and a peer idle with a
    /// series of its own.
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
    /// Kernel entries to delete: folded, or their cgroup's counts dropped.
    pub delete: Vec<PeerKey>,
    pub delete_lat: Vec<LatKey>,
    /// Peers with counts of their own in user space, and cgroups whose
    /// owner is not known yet.
    pub tracked: usize,
    pub pending: usize,
}

/// Who owns a cgroup, as far as the caller can tell now.
pub enum Resolution {
    Owner(Owner),
    /// Not known yet (a pod not listed yet, a cgroup not walked yet).
    Pending,
}

impl Peers {
    pub fn new(max_peers: usize, grace: Duration) -> Peers {
        Peers {
            entries: HashMap::new(),
            other: HashMap::new(),
            admitted: HashMap::new(),
            owners: HashMap::new(),
            pending: HashMap::new(),
            max_peers,
            grace,
            rank: Counts::bytes,
            label_dir: |d| d,
            open: None,
        }
    }

    /// Word `word` counts things open now (a gauge the kernel adds to and
    /// takes from, e.g. connections): an entry holding some is active, is
    /// never folded out of the kernel (what closes them must find it), and
    /// when its peer is admitted after it was counted in `other` it takes
    /// them along (a gauge need not only grow).
    pub fn open_in(mut self, word: usize) -> Peers {
        self.open = Some(word);
        self
    }

    fn holds_open(&self, c: &Counts) -> bool {
        self.open.and_then(|w| c.words.get(w)).is_some_and(|n| (*n as i64) > 0)
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

    /// One pass over the kernel's entries. `resolve` names a cgroup's owner
    /// (called for cgroups not decided yet), `alive` says whether a decided
    /// owner is still there, `name` names a peer's address ([`name`]).
    pub fn update(
        &mut self,
        stats: &[(PeerKey, PeerCounters)],
        lat: &[(LatKey, u64)],
        mut resolve: impl FnMut(u64) -> Resolution,
        alive: impl Fn(&Owner) -> bool,
        name: impl Fn(IpAddr) -> (Kind, String),
        now: Instant,
    ) -> Pass {
        let mut pass = Pass::default();
        // The kernel's counts now, by peer.
        let mut live: HashMap<PeerKey, Counts> = HashMap::new();
        for (k, c) in stats {
            live.entry(*k).or_default().words = c.words;
        }
        let mut lat_keys: HashMap<PeerKey, Vec<LatKey>> = HashMap::new();
        for (k, n) in lat {
            live.entry(k.peer).or_default().lat.insert(k.slot, *n);
            lat_keys.entry(k.peer).or_default().push(*k);
        }
        // Owners gone: their cgroups' counts and kernel entries go.
        let gone: BTreeSet<u64> = self.owners.iter().filter(|(_, o)| !alive(o)).map(|(cg, _)| *cg).collect();
        for cg in &gone {
            self.owners.remove(cg);
        }
        self.admitted.retain(|o, _| alive(o));
        self.other.retain(|(cg, _), _| !gone.contains(cg));
        // Owners of new cgroups.
        let cgroups: BTreeSet<u64> = live.keys().chain(self.entries.keys()).map(|k| k.cgroup).filter(|cg| !gone.contains(cg)).collect();
        let mut dropped: BTreeSet<u64> = gone;
        for cg in cgroups {
            if self.owners.contains_key(&cg) {
                continue;
            }
            match resolve(cg) {
                Resolution::Owner(o) => {
                    self.pending.remove(&cg);
                    self.owners.insert(cg, o);
                }
                Resolution::Pending => {
                    let since = *self.pending.entry(cg).or_insert(now);
                    if now.duration_since(since) >= self.grace {
                        self.pending.remove(&cg);
                        dropped.insert(cg);
                    }
                }
            }
        }
        self.pending.retain(|cg, _| !dropped.contains(cg));
        pass.pending = self.pending.len();
        // Fold the kernel's counts in.
        let mut active: BTreeSet<(u64, Label)> = BTreeSet::new();
        for (k, c) in live {
            if dropped.contains(&k.cgroup) {
                pass.delete.push(k);
                pass.delete_lat.extend(lat_keys.remove(&k).unwrap_or_default());
                continue;
            }
            let label_dir = self.label_dir;
            let open = self.holds_open(&c);
            let e = self.entries.entry(k).or_insert_with(|| {
                // The kernel's own record of a cgroup's peers beyond its
                // bound: part of its other, never a peer.
                let label = if k.is_other() {
                    Label::other(label_dir(k.dir))
                } else {
                    let (kind, peer) = name(address(k.addr));
                    Label { dir: label_dir(k.dir), kind, peer, port: Some(k.port) }
                };
                Entry { label, folded: Counts::default(), live: Counts::default(), offset: Counts::default(), reported: false }
            });
            if e.live != c || open {
                active.insert((k.cgroup, e.label.clone()));
            }
            if e.live == c && !open {
                // Unchanged for a whole interval: out of the kernel.
                e.folded.add(&c);
                e.live = Counts::default();
                pass.delete.push(k);
                pass.delete_lat.extend(lat_keys.remove(&k).unwrap_or_default());
            } else {
                e.live = c;
            }
        }
        self.entries.retain(|k, _| !dropped.contains(&k.cgroup));
        // Admitted peers that changed are active now; idle ones past the
        // grace period lose their series and their place.
        for (cg, label) in &active {
            if let Some(t) = self.owners.get(cg).and_then(|o| self.admitted.get_mut(o)).and_then(|m| m.get_mut(label)) {
                *t = now;
            }
        }
        let grace = self.grace;
        let mut expired: BTreeSet<(Owner, Label)> = BTreeSet::new();
        for (o, m) in &mut self.admitted {
            m.retain(|l, t| {
                let keep = now.duration_since(*t) < grace;
                if !keep {
                    expired.insert((o.clone(), l.clone()));
                }
                keep
            });
        }
        let owners = &self.owners;
        self.entries.retain(|k, e| {
            let gone = owners.get(&k.cgroup).is_some_and(|o| expired.contains(&(o.clone(), e.label.clone())));
            !(gone && e.live.is_zero())
        });
        // Admit waiting peers, the busiest first, while there is room.
        let mut waiting: BTreeMap<(Owner, u8), BTreeMap<Label, u64>> = BTreeMap::new();
        for (k, e) in &self.entries {
            let Some(o) = self.owners.get(&k.cgroup) else { continue };
            if e.label.kind == Kind::Other || self.admitted.get(o).is_some_and(|m| m.contains_key(&e.label)) {
                continue;
            }
            *waiting.entry((o.clone(), e.label.dir)).or_default().entry(e.label.clone()).or_default() += (self.rank)(&e.own());
        }
        let mut admitted_now: BTreeSet<(Owner, Label)> = BTreeSet::new();
        for ((o, dir), labels) in waiting {
            let mut labels: Vec<(u64, Label)> = labels.into_iter().map(|(l, b)| (b, l)).collect();
            labels.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            let m = self.admitted.entry(o.clone()).or_default();
            let mut room = self.max_peers.saturating_sub(m.keys().filter(|x| x.dir == dir).count());
            for (_, l) in labels {
                if room == 0 {
                    break;
                }
                room -= 1;
                m.insert(l.clone(), now);
                admitted_now.insert((o.clone(), l));
            }
        }
        // A peer admitted after it was counted in other: what it had stays
        // there, and its own series starts at 0.
        for (k, e) in &mut self.entries {
            let Some(o) = self.owners.get(&k.cgroup) else { continue };
            if e.reported && admitted_now.contains(&(o.clone(), e.label.clone())) {
                let mut own = e.own();
                if let Some(w) = self.open.and_then(|w| own.words.get_mut(w)) {
                    *w = 0;
                }
                self.other.entry((k.cgroup, e.label.dir)).or_default().add(&own);
                e.offset.add(&own);
            }
        }
        // Peers left out, and out of the kernel: into their cgroup's other.
        let admitted = &self.admitted;
        let owners = &self.owners;
        let other = &mut self.other;
        self.entries.retain(|k, e| {
            let Some(o) = owners.get(&k.cgroup) else { return true };
            if admitted.get(o).is_some_and(|m| m.contains_key(&e.label)) || !e.live.is_zero() {
                return true;
            }
            other.entry((k.cgroup, e.label.dir)).or_default().add(&e.own());
            false
        });
        // The series.
        for (k, e) in &mut self.entries {
            let Some(o) = self.owners.get(&k.cgroup) else { continue };
            let label =
                if self.admitted.get(o).is_some_and(|m| m.contains_key(&e.label)) { e.label.clone() } else { Label::other(e.label.dir) };
            pass.series.entry((o.clone(), label)).or_default().add(&e.own());
            e.reported = true;
        }
        for ((cg, dir), c) in &self.other {
            if let Some(o) = self.owners.get(cg) {
                pass.series.entry((o.clone(), Label::other(*dir))).or_default().add(c);
            }
        }
        pass.tracked = self.entries.len();
        pass
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_peers_are_grouped_by_the_first_block_holding_them() {
        let cidrs =
            [Cidr::parse("corp=10.0.0.0/8").unwrap(), Cidr::parse("all=0.0.0.0/0").unwrap(), Cidr::parse("v6=2001:db8::/32").unwrap()];
        let n = |a: &str| name(a.parse().unwrap(), None, &HashMap::new(), &cidrs);
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
    use agent_common::tcp_peers::{ATTEMPTS, DIR_IN, DIR_OUT, ESTABLISHED};

    fn key(cgroup: u64, ip: [u8; 4], port: u16, dir: u8) -> PeerKey {
        let mut addr = [0u8; 16];
        addr[10] = 0xff;
        addr[11] = 0xff;
        addr[12..].copy_from_slice(&ip);
        PeerKey { cgroup, addr, port, dir, pad: [0; 5] }
    }

    fn counters(attempts: u64, bytes: u64) -> PeerCounters {
        let mut c = PeerCounters::ZERO;
        c.words[ATTEMPTS] = attempts;
        c.words[ESTABLISHED] = attempts;
        c.words[BYTES_SENT] = bytes;
        c
    }

    fn web() -> Owner {
        ("web".into(), "web-0".into())
    }

    fn resolve(cg: u64) -> Resolution {
        match cg {
            1 => Resolution::Owner(web()),
            0 => Resolution::Owner(Owner::default()),
            _ => Resolution::Pending,
        }
    }

    fn attempts(p: &Pass, kind: Kind, peer: &str) -> u64 {
        p.series.iter().filter(|((o, l), _)| *o == web() && l.kind == kind && l.peer == peer).map(|(_, c)| c.words[ATTEMPTS]).sum()
    }

    #[test]
    fn names_addresses() {
        let pods: HashMap<IpAddr, String> = [("10.1.0.5".parse().expect("address"), "db/pg".to_string())].into();
        assert_eq!(address(key(0, [10, 1, 0, 5], 0, 0).addr), "10.1.0.5".parse::<IpAddr>().unwrap());
        let mut services = super::super::services::ServiceIndex::default();
        let svc = serde_json::json!({"metadata": {"uid": "s", "namespace": "web", "name": "front"}, "spec": {"clusterIP": "10.96.0.10"}});
        services.apply(&serde_json::from_value(svc).expect("service"));
        let n = |a: &str| name(a.parse().expect("address"), Some(&services), &pods, &[]);
        assert_eq!(n("10.96.0.10"), (Kind::Service, "web/front".into()));
        assert_eq!(n("10.1.0.5"), (Kind::Pod, "db/pg".into()));
        assert_eq!(n("127.0.0.1"), (Kind::Local, "127.0.0.1".into()));
        assert_eq!(n("::1"), (Kind::Local, "::1".into()));
        assert_eq!(n("8.8.8.8"), (Kind::External, "8.8.8.8".into()));
    }

    #[test]
    fn idle_entries_leave_the_kernel_and_counts_never_go_back() {
        let mut p = Peers::new(20, Duration::from_secs(300));
        let t = Instant::now();
        let k = key(1, [10, 0, 0, 1], 80, DIR_OUT);
        let pods = |a: IpAddr| name(a, None, &HashMap::new(), &[]);
        let a = p.update(&[(k, counters(3, 30))], &[], resolve, |_| true, pods, t);
        assert!(a.delete.is_empty());
        assert_eq!(attempts(&a, Kind::External, "10.0.0.1"), 3);
        // Unchanged a whole interval: deleted from the kernel, still counted.
        let b = p.update(&[(k, counters(3, 30))], &[], resolve, |_| true, pods, t);
        assert_eq!(b.delete, vec![k]);
        assert_eq!(attempts(&b, Kind::External, "10.0.0.1"), 3);
        // Gone from the kernel; then made again from zero by new connects.
        let c = p.update(&[], &[], resolve, |_| true, pods, t);
        assert_eq!(attempts(&c, Kind::External, "10.0.0.1"), 3);
        let d = p.update(&[(k, counters(2, 20))], &[], resolve, |_| true, pods, t);
        assert_eq!(attempts(&d, Kind::External, "10.0.0.1"), 5);
    }

    #[test]
    fn a_thousand_peers_make_max_plus_one_series_that_never_decrease() {
        let mut p = Peers::new(20, Duration::from_secs(300));
        let t = Instant::now();
        let pods = |a: IpAddr| name(a, None, &HashMap::new(), &[]);
        let stats: Vec<_> =
            (0..1000u32).map(|i| (key(1, [10, 78, (i >> 8) as u8, i as u8], 80, DIR_OUT), counters(1, u64::from(i)))).collect();
        let a = p.update(&stats, &[], resolve, |_| true, pods, t);
        let out: Vec<_> = a.series.keys().filter(|(o, l)| *o == web() && l.dir == DIR_OUT).collect();
        assert_eq!(out.len(), 21);
        let total: u64 = a.series.iter().filter(|((o, _), _)| *o == web()).map(|(_, c)| c.words[ATTEMPTS]).sum();
        assert_eq!(total, 1000);
        // The busiest 20 (bytes 980..999) have their own series.
        assert_eq!(attempts(&a, Kind::External, "10.78.3.231"), 1);
        assert_eq!(attempts(&a, Kind::Other, ""), 980);
        // Idle: out of the kernel, and the others out of user space too.
        let b = p.update(&stats, &[], resolve, |_| true, pods, t);
        assert_eq!(b.delete.len(), 1000);
        let c = p.update(&[], &[], resolve, |_| true, pods, t);
        assert_eq!(c.tracked, 20);
        assert_eq!(attempts(&c, Kind::Other, ""), 980);
        // A new peer now goes to other; the admitted keep theirs.
        let d = p.update(&[(key(1, [10, 99, 0, 1], 80, DIR_OUT), counters(1, 1_000_000))], &[], resolve, |_| true, pods, t);
        assert_eq!(attempts(&d, Kind::Other, ""), 981);
        assert_eq!(attempts(&d, Kind::External, "10.78.3.231"), 1);
    }

    #[test]
    fn idle_peers_give_their_place_and_a_late_one_starts_at_zero() {
        let mut p = Peers::new(1, Duration::from_secs(10));
        let pods = |a: IpAddr| name(a, None, &HashMap::new(), &[]);
        let t = Instant::now();
        let (a, b) = (key(1, [10, 0, 0, 1], 80, DIR_OUT), key(1, [10, 0, 0, 2], 80, DIR_OUT));
        // a is admitted (busier), b counted in other.
        let p1 = p.update(&[(a, counters(1, 100)), (b, counters(2, 1))], &[], resolve, |_| true, pods, t);
        assert_eq!((attempts(&p1, Kind::External, "10.0.0.1"), attempts(&p1, Kind::Other, "")), (1, 2));
        // b keeps connecting; a goes quiet, is folded out, then idle past the grace.
        let p2 = p.update(&[(a, counters(1, 100)), (b, counters(3, 1))], &[], resolve, |_| true, pods, t + Duration::from_secs(5));
        assert_eq!(attempts(&p2, Kind::Other, ""), 3);
        let p3 = p.update(&[(b, counters(4, 1))], &[], resolve, |_| true, pods, t + Duration::from_secs(11));
        // a's series is gone; b took its place from 0, other keeps b's 4.
        assert!(!p3.series.keys().any(|(_, l)| l.peer == "10.0.0.1"), "{:?}", p3.series.keys());
        assert_eq!(attempts(&p3, Kind::Other, ""), 4, "other never goes back");
        assert_eq!(attempts(&p3, Kind::External, "10.0.0.2"), 0, "b's own series starts at its admission");
        let p4 = p.update(&[(b, counters(6, 1))], &[], resolve, |_| true, pods, t + Duration::from_secs(12));
        assert_eq!((attempts(&p4, Kind::External, "10.0.0.2"), attempts(&p4, Kind::Other, "")), (2, 4));
    }

    #[test]
    fn directions_have_their_own_bound() {
        let mut p = Peers::new(1, Duration::from_secs(300));
        let pods = |a: IpAddr| name(a, None, &HashMap::new(), &[]);
        let stats = [(key(1, [10, 0, 0, 1], 80, DIR_OUT), counters(1, 1)), (key(1, [10, 0, 0, 2], 8080, DIR_IN), counters(1, 1))];
        let a = p.update(&stats, &[], resolve, |_| true, pods, Instant::now());
        assert!(a.series.keys().all(|(_, l)| l.kind == Kind::External), "{:?}", a.series.keys());
    }

    #[test]
    fn pending_cgroups_wait_then_go_and_gone_pods_take_their_counts() {
        let mut p = Peers::new(20, Duration::from_secs(10));
        let pods = |a: IpAddr| name(a, None, &HashMap::new(), &[]);
        let t = Instant::now();
        let k = key(7, [10, 0, 0, 1], 80, DIR_OUT);
        let a = p.update(&[(k, counters(1, 1))], &[], resolve, |_| true, pods, t);
        assert_eq!((a.series.len(), a.pending, a.delete.len()), (0, 1, 0));
        let b = p.update(&[(k, counters(1, 1))], &[], resolve, |_| true, pods, t + Duration::from_secs(10));
        assert_eq!((b.series.len(), b.pending, b.delete), (0, 0, vec![k]));
        let k1 = key(1, [10, 0, 0, 1], 80, DIR_OUT);
        let c = p.update(&[(k1, counters(1, 1))], &[], resolve, |_| true, pods, t);
        assert_eq!(c.series.len(), 1);
        let d = p.update(&[(k1, counters(2, 1))], &[], resolve, |o| *o != web(), pods, t);
        assert_eq!((d.series.len(), d.delete), (0, vec![k1]));
    }

    #[test]
    fn latency_buckets_fold_with_their_peer() {
        let mut p = Peers::new(20, Duration::from_secs(300));
        let pods = |a: IpAddr| name(a, None, &HashMap::new(), &[]);
        let t = Instant::now();
        let k = key(1, [10, 0, 0, 1], 80, DIR_OUT);
        let lat = [(LatKey { peer: k, slot: 300, pad: 0 }, 2)];
        p.update(&[(k, counters(2, 2))], &lat, resolve, |_| true, pods, t);
        let b = p.update(&[(k, counters(2, 2))], &lat, resolve, |_| true, pods, t);
        assert_eq!(b.delete_lat, vec![lat[0].0]);
        let c = p.update(&[], &[], resolve, |_| true, pods, t);
        let (_, counts) = c.series.iter().next().expect("a series");
        assert_eq!(counts.lat.get(&300), Some(&2));
    }

    #[test]
    fn the_kernels_other_record_is_the_cgroups_other_never_a_peer() {
        let mut p = Peers::new(20, Duration::from_secs(300));
        let pods = |a: IpAddr| name(a, None, &HashMap::new(), &[]);
        let t = Instant::now();
        let (k, o) = (key(1, [10, 0, 0, 1], 80, DIR_OUT), PeerKey::other(1, DIR_OUT));
        let lat = [(LatKey { peer: o, slot: 300, pad: 0 }, 4)];
        // Room for twenty peers, yet the kernel's other is summed as other.
        let a = p.update(&[(k, counters(1, 1)), (o, counters(4, 4))], &lat, resolve, |_| true, pods, t);
        assert_eq!(a.series.len(), 2, "{:?}", a.series.keys());
        assert_eq!((attempts(&a, Kind::External, "10.0.0.1"), attempts(&a, Kind::Other, "")), (1, 4));
        let other = a.series.get(&(web(), Label::other(DIR_OUT))).expect("other");
        assert_eq!(other.lat.get(&300), Some(&4), "its buckets with it");
        // Idle: folded out of the kernel, still other, with what comes later.
        p.update(&[(k, counters(1, 1)), (o, counters(4, 4))], &lat, resolve, |_| true, pods, t);
        let c = p.update(&[(o, counters(2, 2))], &[], resolve, |_| true, pods, t);
        assert_eq!(attempts(&c, Kind::Other, ""), 6);
        assert_eq!(c.series.len(), 2);
    }

    use agent_common::tcp_peers::{CLOSED, OPEN};

    fn open(opened: u64, closed: u64) -> PeerCounters {
        let mut c = counters(opened, 10);
        c.words[OPEN] = opened.wrapping_sub(closed);
        c.words[CLOSED] = closed;
        c
    }

    fn gauge(p: &Pass, kind: Kind, peer: &str) -> i64 {
        p.series.iter().filter(|((o, l), _)| *o == web() && l.kind == kind && l.peer == peer).map(|(_, c)| c.words[OPEN] as i64).sum()
    }

    #[test]
    fn entries_holding_open_connections_stay_in_the_kernel_and_keep_their_series() {
        let mut p = Peers::new(20, Duration::from_secs(10)).open_in(OPEN);
        let pods = |a: IpAddr| name(a, None, &HashMap::new(), &[]);
        let t = Instant::now();
        let k = key(1, [10, 0, 0, 1], 80, DIR_OUT);
        // Two connections open, idle for longer than the grace period.
        for s in [0, 5, 11, 30] {
            let x = p.update(&[(k, open(2, 0))], &[], resolve, |_| true, pods, t + Duration::from_secs(s));
            assert!(x.delete.is_empty(), "deleted with connections open at {s} s");
            assert_eq!(gauge(&x, Kind::External, "10.0.0.1"), 2, "the peer keeps its series at {s} s");
        }
        // Both close: the close is in the same record, the gauge back to 0,
        // and the record leaves the kernel once unchanged.
        let x = p.update(&[(k, open(2, 2))], &[], resolve, |_| true, pods, t + Duration::from_secs(31));
        assert_eq!(gauge(&x, Kind::External, "10.0.0.1"), 0);
        let x = p.update(&[(k, open(2, 2))], &[], resolve, |_| true, pods, t + Duration::from_secs(32));
        assert_eq!(x.delete, vec![k]);
        // Without the open word, the same record would have gone at once.
        let mut q = Peers::new(20, Duration::from_secs(10));
        q.update(&[(k, open(2, 0))], &[], resolve, |_| true, pods, t);
        assert_eq!(q.update(&[(k, open(2, 0))], &[], resolve, |_| true, pods, t).delete, vec![k]);
    }

    #[test]
    fn a_peer_admitted_late_takes_its_open_connections_out_of_other() {
        let mut p = Peers::new(1, Duration::from_secs(10)).open_in(OPEN);
        let pods = |a: IpAddr| name(a, None, &HashMap::new(), &[]);
        let t = Instant::now();
        let (a, b) = (key(1, [10, 0, 0, 1], 80, DIR_OUT), key(1, [10, 0, 0, 2], 80, DIR_OUT));
        // a is admitted; b, with one connection open, is counted in other.
        let x = p.update(&[(a, counters(1, 100)), (b, open(1, 0))], &[], resolve, |_| true, pods, t);
        assert_eq!((gauge(&x, Kind::External, "10.0.0.2"), gauge(&x, Kind::Other, "")), (0, 1));
        // a goes idle past the grace period; b takes its place, with its
        // open connection, and other's gauge comes down.
        p.update(&[(a, counters(1, 100)), (b, open(1, 0))], &[], resolve, |_| true, pods, t + Duration::from_secs(5));
        let x = p.update(&[(b, open(1, 0))], &[], resolve, |_| true, pods, t + Duration::from_secs(11));
        assert_eq!((gauge(&x, Kind::External, "10.0.0.2"), gauge(&x, Kind::Other, "")), (1, 0));
        assert_eq!(attempts(&x, Kind::External, "10.0.0.2"), 0, "its counters start at its admission");
        assert_eq!(attempts(&x, Kind::Other, ""), 1, "and other keeps what they had");
        // It closes: the peer's gauge to 0, other's stays 0.
        let x = p.update(&[(b, open(1, 1))], &[], resolve, |_| true, pods, t + Duration::from_secs(12));
        assert_eq!((gauge(&x, Kind::External, "10.0.0.2"), gauge(&x, Kind::Other, "")), (0, 0));
    }
}

//! rtnetlink (NETLINK_ROUTE) dumps: links, addresses, neighbours, queueing
//! disciplines and routes; and a link's counters under node_exporter's
//! keys, which netdev and netclass both read.

use netlink_packet_core::{DecodeError, NetlinkDeserializable, NetlinkHeader, ParseableParametrized as _, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::link::{LinkAttribute, LinkHeader, LinkMessage};
use netlink_packet_route::neighbour::NeighbourMessage;
use netlink_packet_route::route::{RouteAttribute, RouteHeader, RouteLwEnCapType, RouteMessage};
use netlink_packet_route::tc::{TcAttribute, TcHeader, TcMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::protocols::NETLINK_ROUTE;

use super::{selected_attributes, Channel, Error};

/// A NETLINK_ROUTE socket: links, addresses, neighbours.
pub struct Route(Channel);

impl Default for Route {
    fn default() -> Self {
        Route::new()
    }
}

impl Route {
    /// Opens nothing yet: the socket is opened by the first dump, and
    /// again after any failure.
    pub fn new() -> Self {
        Route(Channel::new(NETLINK_ROUTE))
    }

    /// Every link (RTM_GETLINK dump).
    pub fn links(&mut self) -> Result<Vec<LinkMessage>, Error> {
        let all = self.0.request("RTM_GETLINK", NLM_F_DUMP | NLM_F_REQUEST, || RouteNetlinkMessage::GetLink(LinkMessage::default()))?;
        Ok(all
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(l),
                _ => None,
            })
            .collect())
    }

    /// Every link (RTM_GETLINK dump) with only the attributes of the kinds
    /// in `keep` (some of [`attr`]'s `IFLA_*` numbers) decoded. A link message
    /// carries some forty attributes, the nested per-family ones the
    /// largest; decoding only what a collector reads makes the dump several
    /// times cheaper in user time.
    ///
    /// The request asks the kernel to skip the statistics no collector
    /// reads (`RTEXT_FILTER_SKIP_STATS` in `IFLA_EXT_MASK`: each link's IPv6
    /// and ICMPv6 counters, which the kernel sums over every CPU for every
    /// link, and SR-IOV VFs' counters; a kernel without the flag ignores
    /// it). The link's own counters (`IFLA_STATS64`) stay.
    pub fn links_with(&mut self, keep: &'static [u16]) -> Result<Vec<LinkMessage>, Error> {
        let all: Vec<Selected> = self.0.request("RTM_GETLINK", NLM_F_DUMP | NLM_F_REQUEST, || {
            let mut req = LinkMessage::default();
            req.attributes.push(LinkAttribute::ExtMask(vec![netlink_packet_route::link::LinkExtentMask::SkipStats]));
            RouteNetlinkMessage::GetLink(req)
        })?;
        Ok(all
            .into_iter()
            .filter_map(|m| match m {
                Selected::Link(l) => Some(l),
                Selected::Other => None,
            })
            .map(|mut l| {
                l.attributes.retain(|a| keep.contains(&(netlink_packet_core::Nla::kind(a) & netlink_packet_core::NLA_TYPE_MASK)));
                l
            })
            .collect())
    }

    /// Every address of this network namespace's links: a point-to-point
    /// link's local address, else the address (as Go's
    /// `net.Interface.Addrs`).
    pub fn local_addresses(&mut self) -> Result<Vec<std::net::IpAddr>, Error> {
        use netlink_packet_route::address::AddressAttribute;
        Ok(self
            .addresses()?
            .iter()
            .filter_map(|m| {
                let local = m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Local(ip) => Some(*ip),
                    _ => None,
                });
                local.or_else(|| {
                    m.attributes.iter().find_map(|a| match a {
                        AddressAttribute::Address(ip) => Some(*ip),
                        _ => None,
                    })
                })
            })
            .collect())
    }

    /// Every address of every link (RTM_GETADDR dump, all families).
    pub fn addresses(&mut self) -> Result<Vec<AddressMessage>, Error> {
        let all =
            self.0.request("RTM_GETADDR", NLM_F_DUMP | NLM_F_REQUEST, || RouteNetlinkMessage::GetAddress(AddressMessage::default()))?;
        Ok(all
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) => Some(a),
                _ => None,
            })
            .collect())
    }

    /// The neighbour table of one family (RTM_GETNEIGH dump).
    pub fn neighbours(&mut self, family: AddressFamily) -> Result<Vec<NeighbourMessage>, Error> {
        let all = self.0.request("RTM_GETNEIGH", NLM_F_DUMP | NLM_F_REQUEST, || {
            let mut req = NeighbourMessage::default();
            req.header.family = family;
            RouteNetlinkMessage::GetNeighbour(req)
        })?;
        Ok(all
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewNeighbour(n) if n.header.family == family => Some(n),
                _ => None,
            })
            .collect())
    }
}

impl Route {
    /// Every queueing discipline of every device (RTM_GETQDISC dump), with
    /// only the attributes the qdisc collector reads decoded, in the order
    /// the kernel sent them: TCA_KIND, TCA_STATS and TCA_STATS2 (the
    /// kind-specific options and xstats are skipped unread, so a qdisc whose
    /// options this crate version cannot parse does not fail the dump).
    pub fn qdiscs(&mut self) -> Result<Vec<TcMessage>, Error> {
        let all: Vec<SelectedTc> =
            self.0.request("RTM_GETQDISC", NLM_F_DUMP | NLM_F_REQUEST, || RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()))?;
        Ok(all
            .into_iter()
            .filter_map(|m| match m {
                SelectedTc::Qdisc(q) => Some(q),
                SelectedTc::Other => None,
            })
            .collect())
    }

    /// Every route of every table and family (RTM_GETROUTE dump of
    /// AF_UNSPEC, as node_exporter's rtnetlink asks), with only the
    /// destination, output interface, gateway, priority, preferred source
    /// and multipath attributes decoded.
    pub fn routes(&mut self) -> Result<Vec<RouteMessage>, Error> {
        let all: Vec<SelectedRoute> =
            self.0.request("RTM_GETROUTE", NLM_F_DUMP | NLM_F_REQUEST, || RouteNetlinkMessage::GetRoute(RouteMessage::default()))?;
        Ok(all
            .into_iter()
            .filter_map(|m| match m {
                SelectedRoute::Route(r) => Some(r),
                SelectedRoute::Other => None,
            })
            .collect())
    }
}

/// `IFLA_*` attribute numbers for [`Route::links_with`].
pub mod attr {
    pub const IFNAME: u16 = 3;
    pub const STATS: u16 = 7;
    pub const IFALIAS: u16 = 20;
    pub const STATS64: u16 = 23;
}

/// The `IFLA_*` kinds a link dump decodes; the rest of a link message is
/// skipped unread.
const LINK_SELECTED: &[u16] = &[attr::IFNAME, attr::STATS, attr::IFALIAS, attr::STATS64];
const RTM_NEWLINK: u16 = 16;
const LINK_HEADER_LEN: usize = 16;

/// `TCA_*` numbers [`Route::qdiscs`] decodes: TCA_KIND, TCA_STATS, TCA_STATS2.
const TC_SELECTED: &[u16] = &[1, 3, 7];
const RTM_NEWQDISC: u16 = 36;
const TC_HEADER_LEN: usize = 20;

/// `RTA_*` numbers [`Route::routes`] decodes: RTA_DST, RTA_OIF,
/// RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC, RTA_MULTIPATH.
const ROUTE_SELECTED: &[u16] = &[1, 4, 5, 6, 7, 9];
const RTM_NEWROUTE: u16 = 24;
const ROUTE_HEADER_LEN: usize = 12;

/// A link dump's message with only the [`LINK_SELECTED`] attributes decoded.
#[derive(Debug)]
enum Selected {
    Link(LinkMessage),
    Other,
}

impl NetlinkDeserializable for Selected {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        if header.message_type != RTM_NEWLINK {
            return Ok(Selected::Other);
        }
        let mut m = LinkMessage::default();
        m.header = LinkHeader::parse(payload)?;
        let family = m.header.interface_family;
        m.attributes =
            selected_attributes(payload, LINK_HEADER_LEN, LINK_SELECTED, "link", |nla| LinkAttribute::parse_with_param(nla, family))?;
        Ok(Selected::Link(m))
    }
}

/// A qdisc dump's message with only the [`TC_SELECTED`] attributes decoded.
#[derive(Debug)]
enum SelectedTc {
    Qdisc(TcMessage),
    Other,
}

impl NetlinkDeserializable for SelectedTc {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        if header.message_type != RTM_NEWQDISC {
            return Ok(SelectedTc::Other);
        }
        let head = TcHeader::parse(payload)?;
        // An empty kind: TCA_STATS2's application statistics stay raw bytes
        // instead of being parsed per qdisc kind.
        let attributes = selected_attributes(payload, TC_HEADER_LEN, TC_SELECTED, "tc", |nla| TcAttribute::parse_with_param(nla, ""))?;
        Ok(SelectedTc::Qdisc(TcMessage::from_parts(head, attributes)))
    }
}

/// A route dump's message with only the [`ROUTE_SELECTED`] attributes decoded.
#[derive(Debug)]
enum SelectedRoute {
    Route(RouteMessage),
    Other,
}

impl NetlinkDeserializable for SelectedRoute {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        if header.message_type != RTM_NEWROUTE {
            return Ok(SelectedRoute::Other);
        }
        let mut m = RouteMessage::default();
        m.header = RouteHeader::parse(payload)?;
        let param = (m.header.address_family, m.header.kind, RouteLwEnCapType::default());
        m.attributes =
            selected_attributes(payload, ROUTE_HEADER_LEN, ROUTE_SELECTED, "route", |nla| RouteAttribute::parse_with_param(nla, param))?;
        Ok(SelectedRoute::Route(m))
    }
}

/// One device's counters under node_exporter's keys, in its order.
pub type Counters = Vec<(&'static str, u64)>;

/// node_exporter's keys of `struct rtnl_link_stats64` (and of its 32-bit
/// twin), in its order, for any struct with the kernel's field names.
macro_rules! link_stats {
    ($s:expr) => {{
        let s = $s;
        vec![
            ("receive_packets", u64::from(s.rx_packets)),
            ("transmit_packets", u64::from(s.tx_packets)),
            ("receive_bytes", u64::from(s.rx_bytes)),
            ("transmit_bytes", u64::from(s.tx_bytes)),
            ("receive_errors", u64::from(s.rx_errors)),
            ("transmit_errors", u64::from(s.tx_errors)),
            ("receive_dropped", u64::from(s.rx_dropped)),
            ("transmit_dropped", u64::from(s.tx_dropped)),
            ("multicast", u64::from(s.multicast)),
            ("collisions", u64::from(s.collisions)),
            ("receive_length_errors", u64::from(s.rx_length_errors)),
            ("receive_over_errors", u64::from(s.rx_over_errors)),
            ("receive_crc_errors", u64::from(s.rx_crc_errors)),
            ("receive_frame_errors", u64::from(s.rx_frame_errors)),
            ("receive_fifo_errors", u64::from(s.rx_fifo_errors)),
            ("receive_missed_errors", u64::from(s.rx_missed_errors)),
            ("transmit_aborted_errors", u64::from(s.tx_aborted_errors)),
            ("transmit_carrier_errors", u64::from(s.tx_carrier_errors)),
            ("transmit_fifo_errors", u64::from(s.tx_fifo_errors)),
            ("transmit_heartbeat_errors", u64::from(s.tx_heartbeat_errors)),
            ("transmit_window_errors", u64::from(s.tx_window_errors)),
            ("receive_compressed", u64::from(s.rx_compressed)),
            ("transmit_compressed", u64::from(s.tx_compressed)),
            ("receive_nohandler", u64::from(s.rx_nohandler)),
        ]
    }};
}

/// The counters of one rtnetlink link message (64-bit stats, or the 32-bit
/// ones of a driver that has no others); `None` when it carries neither.
pub fn link_counters(link: &LinkMessage) -> Option<Counters> {
    let stats64 = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Stats64(s) => Some(s),
        _ => None,
    });
    if let Some(s) = stats64 {
        return Some(link_stats!(s));
    }
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Stats(s) => Some(link_stats!(s)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{link, wire};
    use super::super::{decode, Part};
    use super::*;
    use netlink_packet_core::NetlinkPayload;

    /// The selective decoding keeps exactly the full decoding's attributes
    /// of the kinds asked for (loopback's name and counters; the counters
    /// may move between the two dumps, so they are compared by kind).
    #[test]
    fn a_selective_link_dump_keeps_the_attributes_asked_for() {
        use netlink_packet_core::Nla as _;
        use netlink_packet_route::link::LinkAttribute;
        let mut r = Route::new();
        const KEEP: &[u16] = &[attr::IFNAME, attr::STATS64];
        let keep = KEEP;
        let full = r.links().expect("full dump");
        let slim = r.links_with(keep).expect("selective dump");
        let lo = |ls: &[LinkMessage]| ls.iter().find(|l| l.header.index == 1).cloned().expect("lo");
        let (full, slim) = (lo(&full), lo(&slim));
        assert_eq!(full.header, slim.header);
        let kinds = |l: &LinkMessage| l.attributes.iter().map(|a| a.kind()).filter(|k| keep.contains(k)).collect::<Vec<_>>();
        assert_eq!(kinds(&slim), kinds(&full));
        assert_eq!(slim.attributes.len(), 2, "{:?}", slim.attributes);
        assert!(slim.attributes.contains(&LinkAttribute::IfName("lo".into())));
    }

    /// Asked to skip the counters (as [`Route::links_with`] asks), this
    /// kernel leaves each link's per-family (IPv6) counters out of the
    /// dump, while its name and its own counters stay.
    #[test]
    fn a_link_dump_without_counters_leaves_them_out() {
        use netlink_packet_route::link::LinkExtentMask;
        let mut r = Route::new();
        let dump = |r: &mut Route, mask: Vec<LinkExtentMask>| {
            let all =
                r.0.request("RTM_GETLINK", NLM_F_DUMP | NLM_F_REQUEST, || {
                    let mut req = LinkMessage::default();
                    req.attributes.push(LinkAttribute::ExtMask(mask.clone()));
                    RouteNetlinkMessage::GetLink(req)
                })
                .expect("link dump");
            all.into_iter()
                .find_map(|m| match m {
                    RouteNetlinkMessage::NewLink(l) if l.header.index == 1 => Some(l),
                    _ => None,
                })
                .expect("lo")
        };
        use netlink_packet_core::Emitable as _;
        let full = dump(&mut r, vec![]);
        let slim = dump(&mut r, vec![LinkExtentMask::SkipStats]);
        let af_spec =
            |l: &LinkMessage| l.attributes.iter().find(|a| matches!(a, LinkAttribute::AfSpecUnspec(_))).map_or(0, |a| a.buffer_len());
        // lo on this kernel: 1452 bytes, its IPv6 part 816; 1084 and 448
        // without the IPv6 counters.
        assert!(af_spec(&slim) < af_spec(&full), "the per-family counters left out: {} -> {}", af_spec(&full), af_spec(&slim));
        assert!(slim.buffer_len() < full.buffer_len());
        let kept = |l: &LinkMessage| {
            l.attributes
                .iter()
                .filter(|a| matches!(a, LinkAttribute::IfName(_) | LinkAttribute::Stats64(_) | LinkAttribute::Stats(_)))
                .count()
        };
        assert_eq!(kept(&slim), 3, "the name and the link's own counters stay: {:?}", slim.attributes);
        assert_eq!(kept(&full), 3);
    }

    /// Against this kernel: the loopback link is in the dump.
    #[test]
    fn dumps_this_hosts_links() {
        let mut r = Route::new();
        let links = r.links().expect("link dump");
        assert!(links.iter().any(|l| l.header.index == 1), "lo (ifindex 1) is in every network namespace");
        // The socket is reused.
        assert!(!r.links().expect("second dump").is_empty());
        assert!(r.addresses().is_ok());
        assert!(r.neighbours(AddressFamily::Inet).is_ok());
    }

    /// The selective qdisc decoding keeps the kind and statistics, in
    /// order, and drops the options; other message types are skipped.
    #[test]
    fn a_qdisc_dump_keeps_kind_and_stats() {
        use netlink_packet_route::tc::{TcAttribute, TcHeader, TcOption, TcStats, TcStats2, TcStatsBasic};
        let mut basic = TcStatsBasic::default();
        (basic.bytes, basic.packets) = (99, 3);
        let mut legacy = TcStats::default();
        legacy.bytes = 98;
        let header = TcHeader { index: 4, parent: u32::MAX.into(), ..Default::default() };
        let attrs = vec![
            TcAttribute::Kind("fq_codel".into()),
            TcAttribute::Options(vec![TcOption::Other(netlink_packet_core::DefaultNla::new(1, vec![0; 4]))]),
            TcAttribute::Stats2(vec![TcStats2::Basic(basic)]),
            TcAttribute::Stats(legacy),
        ];
        let mut d =
            wire(5, 0, NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewQueueDiscipline(TcMessage::from_parts(header, attrs.clone()))));
        d.extend(wire(5, 0, link(1)));
        let mut out: Vec<SelectedTc> = Vec::new();
        assert_eq!(decode("t", &d, 5, &mut out).unwrap(), Part::More(false));
        let [SelectedTc::Qdisc(q), SelectedTc::Other] = &out[..] else { panic!("{out:?}") };
        assert_eq!((q.header.index, u32::from(q.header.parent)), (4, u32::MAX));
        assert_eq!(q.attributes, vec![attrs[0].clone(), attrs[2].clone(), attrs[3].clone()]);
        // A truncated tc header is an error, not a panic.
        let mut short = wire(5, 0, NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewQueueDiscipline(TcMessage::default())));
        short[0] = 16 + 8;
        short.truncate(16 + 8);
        assert!(decode::<SelectedTc>("t", &short, 5, &mut Vec::new()).is_err());
    }

    /// The selective route decoding keeps the six attributes the
    /// network_route collector reads and drops the rest (here the table).
    #[test]
    fn a_route_dump_keeps_the_attributes_read() {
        use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteHeader, RouteType};
        let mut m = RouteMessage::default();
        let mut h = RouteHeader::default();
        (h.address_family, h.destination_prefix_length, h.kind) = (AddressFamily::Inet, 8, RouteType::Unicast);
        m.header = h;
        m.attributes = vec![
            RouteAttribute::Table(254),
            RouteAttribute::Destination(RouteAddress::Inet([10, 0, 0, 0].into())),
            RouteAttribute::Oif(3),
            RouteAttribute::Priority(7),
        ];
        let d = wire(9, 0, NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(m.clone())));
        let mut out: Vec<SelectedRoute> = Vec::new();
        decode("t", &d, 9, &mut out).unwrap();
        let [SelectedRoute::Route(r)] = &out[..] else { panic!("{out:?}") };
        assert_eq!(r.header, m.header);
        assert_eq!(r.attributes, m.attributes[1..].to_vec());
    }

    /// Against this kernel: loopback's root qdisc and its local route.
    #[test]
    fn dumps_this_hosts_qdiscs_and_routes() {
        let mut r = Route::new();
        let q = r.qdiscs().expect("qdisc dump");
        assert!(q.iter().any(|q| q.header.index == 1), "{q:?}");
        let routes = r.routes().expect("route dump");
        assert!(!routes.is_empty());
    }
}

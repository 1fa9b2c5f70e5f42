//! rtnetlink dumps: links, addresses and neighbours, as node_exporter 1.12
//! reads them by default (`--collector.netdev.netlink`,
//! `--collector.arp.netlink`, `--collector.netclass.netlink`).
//!
//! The socket and the buffer live in the collector between scrapes; a dump
//! is one request and its multipart answer, decoded by
//! `netlink-packet-route`. Netlink answers for the network namespace of
//! the agent (the host's, with `hostNetwork: true`), whatever
//! `--path.procfs` says, as node_exporter's does.

use std::time::Duration;

use ethtool::{EthtoolAttr, EthtoolHeader, EthtoolLinkModeAttr, EthtoolLinkModeDuplex, EthtoolMessage};
use netlink_packet_core::{
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
};
use netlink_packet_generic::ctrl::{nlas::GenlCtrlAttrs, GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlFamily, GenlMessage};
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::neighbour::NeighbourMessage;
use netlink_packet_route::route::RouteMessage;
use netlink_packet_route::tc::TcMessage;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::protocols::{NETLINK_GENERIC, NETLINK_ROUTE};
use netlink_sys::{Socket, SocketAddr};

/// How long one `recv` may wait for the kernel's next part of a dump.
const RECV_TIMEOUT: Duration = Duration::from_secs(5);
/// The kernel sends dump parts of at most 32 KiB unless the reader's
/// buffer is larger; twice that never truncates.
const RECV_BUF: usize = 64 * 1024;
/// A dump the kernel marks as interrupted (the table changed under it) is
/// retried this many times, then returned as it is.
const RETRIES: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("netlink: the kernel answered {request} with error {errno}")]
    Kernel { request: &'static str, errno: i32 },
    #[error("netlink: decoding the answer to {request}: {msg}")]
    Decode { request: &'static str, msg: String },
}

impl From<Error> for crate::Error {
    fn from(e: Error) -> Self {
        crate::Error::Other(Box::new(e))
    }
}

/// One netlink socket of one protocol, its receive buffer and its
/// sequence numbers. Shared with collectors that speak other netlink
/// families through the rust-netlink message crates.
pub(crate) struct Channel {
    protocol: isize,
    socket: Option<Socket>,
    buf: Vec<u8>,
    seq: u32,
}

impl Channel {
    /// A NETLINK_GENERIC channel.
    pub(crate) fn generic() -> Self {
        Channel::new(NETLINK_GENERIC)
    }

    fn new(protocol: isize) -> Self {
        Channel { protocol, socket: None, buf: Vec::new(), seq: 0 }
    }

    fn socket(&mut self) -> Result<&Socket, Error> {
        if self.socket.is_none() {
            let mut s = Socket::new(self.protocol).map_err(Error::Socket)?;
            s.bind_auto().map_err(Error::Socket)?;
            s.connect(&SocketAddr::new(0, 0)).map_err(Error::Socket)?;
            set_recv_timeout(&s, RECV_TIMEOUT).map_err(Error::Socket)?;
            self.socket = Some(s);
        }
        self.socket.as_ref().ok_or(Error::Socket(std::io::ErrorKind::NotConnected.into()))
    }

    /// Sends the request `make` builds (with `flags`) and collects every
    /// answer message. A dump the kernel flags interrupted is asked again.
    /// On any failure the socket is dropped, so a half-read answer never
    /// reaches the next request.
    pub(crate) fn request<Q, A>(&mut self, request: &'static str, flags: u16, make: impl Fn() -> Q) -> Result<Vec<A>, Error>
    where
        Q: NetlinkSerializable + std::fmt::Debug,
        A: NetlinkDeserializable + std::fmt::Debug,
    {
        let mut out = Vec::new();
        for attempt in 0..=RETRIES {
            out.clear();
            match self.once(request, flags, make(), &mut out) {
                Ok(true) if attempt < RETRIES => continue,
                Ok(_) => break,
                Err(e) => {
                    self.socket = None;
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// One request; `Ok(true)` when the kernel flagged the dump interrupted.
    fn once<Q, A>(&mut self, request: &'static str, flags: u16, payload: Q, out: &mut Vec<A>) -> Result<bool, Error>
    where
        Q: NetlinkSerializable + std::fmt::Debug,
        A: NetlinkDeserializable + std::fmt::Debug,
    {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut packet = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(payload));
        packet.header.flags = flags;
        packet.header.sequence_number = seq;
        packet.finalize();
        let mut wire = vec![0; packet.buffer_len()];
        packet.serialize(&mut wire);
        self.socket()?.send(&wire, 0).map_err(Error::Socket)?;

        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(RECV_BUF, 0);
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let result = (|| {
            let mut interrupted = false;
            loop {
                let n = self.socket()?.recv(&mut &mut buf[..], 0).map_err(Error::Socket)?;
                let before = out.len();
                match decode(request, &buf[..n], seq, out)? {
                    Part::More(intr) => interrupted |= intr,
                    Part::Done(intr) => return Ok(interrupted | intr),
                }
                // A request that is not a dump ends with its one answer.
                if !dump && out.len() > before {
                    return Ok(false);
                }
            }
        })();
        self.buf = buf;
        result
    }
}

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
    pub fn links_with(&mut self, keep: &'static [u16]) -> Result<Vec<LinkMessage>, Error> {
        let all: Vec<Selected> =
            self.0.request("RTM_GETLINK", NLM_F_DUMP | NLM_F_REQUEST, || RouteNetlinkMessage::GetLink(LinkMessage::default()))?;
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

/// `TCA_*` numbers [`Route::qdiscs`] decodes: TCA_KIND, TCA_STATS, TCA_STATS2.
const TC_SELECTED: &[u16] = &[1, 3, 7];
const RTM_NEWQDISC: u16 = 36;
const TC_HEADER_LEN: usize = 20;

/// A qdisc dump's message with only the [`TC_SELECTED`] attributes decoded.
#[derive(Debug)]
enum SelectedTc {
    Qdisc(TcMessage),
    Other,
}

impl NetlinkDeserializable for SelectedTc {
    type Error = netlink_packet_core::DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        use netlink_packet_core::ParseableParametrized as _;
        use netlink_packet_route::tc::{TcAttribute, TcHeader};
        if header.message_type != RTM_NEWQDISC {
            return Ok(SelectedTc::Other);
        }
        let head = TcHeader::parse(payload)?;
        let rest = payload.get(TC_HEADER_LEN..).ok_or_else(|| netlink_packet_core::DecodeError::from("short tc message"))?;
        let mut attributes = Vec::new();
        for nla in netlink_packet_core::NlasIterator::new(rest) {
            let nla = nla?;
            if TC_SELECTED.contains(&(nla.kind() & netlink_packet_core::NLA_TYPE_MASK)) {
                // An empty kind: TCA_STATS2's application statistics stay
                // raw bytes instead of being parsed per qdisc kind.
                attributes.push(TcAttribute::parse_with_param(&nla, "")?);
            }
        }
        Ok(SelectedTc::Qdisc(TcMessage::from_parts(head, attributes)))
    }
}

/// `RTA_*` numbers [`Route::routes`] decodes: RTA_DST, RTA_OIF,
/// RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC, RTA_MULTIPATH.
const ROUTE_SELECTED: &[u16] = &[1, 4, 5, 6, 7, 9];
const RTM_NEWROUTE: u16 = 24;
const ROUTE_HEADER_LEN: usize = 12;

/// A route dump's message with only the [`ROUTE_SELECTED`] attributes decoded.
#[derive(Debug)]
enum SelectedRoute {
    Route(RouteMessage),
    Other,
}

impl NetlinkDeserializable for SelectedRoute {
    type Error = netlink_packet_core::DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        use netlink_packet_core::ParseableParametrized as _;
        use netlink_packet_route::route::{RouteAttribute, RouteHeader, RouteLwEnCapType};
        if header.message_type != RTM_NEWROUTE {
            return Ok(SelectedRoute::Other);
        }
        let mut m = RouteMessage::default();
        m.header = RouteHeader::parse(payload)?;
        let rest = payload.get(ROUTE_HEADER_LEN..).ok_or_else(|| netlink_packet_core::DecodeError::from("short route message"))?;
        let param = (m.header.address_family, m.header.kind, RouteLwEnCapType::default());
        for nla in netlink_packet_core::NlasIterator::new(rest) {
            let nla = nla?;
            if ROUTE_SELECTED.contains(&(nla.kind() & netlink_packet_core::NLA_TYPE_MASK)) {
                m.attributes.push(RouteAttribute::parse_with_param(&nla, param)?);
            }
        }
        Ok(SelectedRoute::Route(m))
    }
}

/// One device's link modes from the ethtool netlink family.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkMode {
    pub index: u32,
    pub name: String,
    /// Mb/s; `None` when the device does not know (SPEED_UNKNOWN).
    pub speed: Option<u32>,
    pub duplex: Option<EthtoolLinkModeDuplex>,
}

/// The kernel's SPEED_UNKNOWN.
const SPEED_UNKNOWN: u32 = u32::MAX;

/// The link modes of one ETHTOOL_MSG_LINKMODES_GET answer.
pub fn link_mode(m: &EthtoolMessage) -> Option<LinkMode> {
    let mut lm = LinkMode { index: 0, name: String::new(), speed: None, duplex: None };
    let mut named = false;
    for a in &m.nlas {
        let EthtoolAttr::LinkMode(a) = a else { continue };
        match a {
            EthtoolLinkModeAttr::Header(h) => {
                for h in h {
                    match h {
                        EthtoolHeader::DevIndex(i) => lm.index = *i,
                        EthtoolHeader::DevName(n) => {
                            lm.name = n.clone();
                            named = true;
                        }
                        _ => {}
                    }
                }
            }
            EthtoolLinkModeAttr::Speed(s) => lm.speed = (*s != SPEED_UNKNOWN).then_some(*s),
            EthtoolLinkModeAttr::Duplex(d) => lm.duplex = Some(*d),
            _ => {}
        }
    }
    named.then_some(lm)
}

/// A NETLINK_GENERIC socket speaking the ethtool family.
pub struct Ethtool {
    ch: Channel,
    family: Option<u16>,
}

impl Default for Ethtool {
    fn default() -> Self {
        Ethtool::new()
    }
}

impl Ethtool {
    pub fn new() -> Self {
        Ethtool { ch: Channel::generic(), family: None }
    }

    /// The id of the "ethtool" generic netlink family (kernels since 5.6).
    fn family(&mut self) -> Result<u16, Error> {
        if let Some(id) = self.family {
            return Ok(id);
        }
        let id = genl_family_id(&mut self.ch, EthtoolMessage::family_name())?;
        self.family = Some(id);
        Ok(id)
    }

    /// Every device's link modes (ETHTOOL_MSG_LINKMODES_GET dump); devices
    /// whose driver has none are not in it.
    pub fn link_modes(&mut self) -> Result<Vec<LinkMode>, Error> {
        let id = self.family()?;
        let answer: Result<Vec<GenlMessage<EthtoolMessage>>, _> =
            self.ch.request("ETHTOOL_MSG_LINKMODES_GET", NLM_F_DUMP | NLM_F_REQUEST, || {
                let mut m = GenlMessage::from_payload(EthtoolMessage::new_link_mode_get(None));
                m.set_resolved_family_id(id);
                m
            });
        if answer.is_err() {
            // The family id may have changed (module reloaded).
            self.family = None;
        }
        Ok(answer?.iter().filter_map(|m| link_mode(&m.payload)).collect())
    }
}

/// What one datagram of a dump said.
#[derive(Debug, PartialEq)]
enum Part {
    /// More datagrams follow; `true` if one of its messages was flagged
    /// NLM_F_DUMP_INTR.
    More(bool),
    /// NLMSG_DONE was in it.
    Done(bool),
}

/// The id of the generic netlink family `name` (CTRL_CMD_GETFAMILY).
pub(crate) fn genl_family_id(ch: &mut Channel, name: &str) -> Result<u16, Error> {
    let answer: Vec<GenlMessage<GenlCtrl>> = ch.request("CTRL_CMD_GETFAMILY", NLM_F_REQUEST, || {
        GenlMessage::from_payload(GenlCtrl { cmd: GenlCtrlCmd::GetFamily, nlas: vec![GenlCtrlAttrs::FamilyName(name.to_string())] })
    })?;
    answer
        .iter()
        .flat_map(|m| &m.payload.nlas)
        .find_map(|a| match a {
            GenlCtrlAttrs::FamilyId(id) => Some(*id),
            _ => None,
        })
        .ok_or(Error::Decode { request: "CTRL_CMD_GETFAMILY", msg: "no family id in the answer".into() })
}

/// `IFLA_*` attribute numbers for [`Route::links_with`].
pub mod attr {
    pub const IFNAME: u16 = 3;
    pub const STATS: u16 = 7;
    pub const IFALIAS: u16 = 20;
    pub const STATS64: u16 = 23;
}

/// The kinds [`Selected`] decodes; the rest of a link message is skipped
/// unread.
const SELECTED: &[u16] = &[attr::IFNAME, attr::STATS, attr::IFALIAS, attr::STATS64];

/// A link dump's message with only the [`SELECTED`] attributes decoded.
#[derive(Debug)]
enum Selected {
    Link(LinkMessage),
    Other,
}

const RTM_NEWLINK: u16 = 16;
const LINK_HEADER_LEN: usize = 16;

impl NetlinkDeserializable for Selected {
    type Error = netlink_packet_core::DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        use netlink_packet_core::ParseableParametrized as _;
        use netlink_packet_route::link::{LinkAttribute, LinkHeader};
        if header.message_type != RTM_NEWLINK {
            return Ok(Selected::Other);
        }
        let mut m = LinkMessage::default();
        m.header = LinkHeader::parse(payload)?;
        let rest = payload.get(LINK_HEADER_LEN..).ok_or_else(|| netlink_packet_core::DecodeError::from("short link message"))?;
        for nla in netlink_packet_core::NlasIterator::new(rest) {
            let nla = nla?;
            if SELECTED.contains(&(nla.kind() & netlink_packet_core::NLA_TYPE_MASK)) {
                m.attributes.push(LinkAttribute::parse_with_param(&nla, m.header.interface_family)?);
            }
        }
        Ok(Selected::Link(m))
    }
}

/// Decodes one datagram of the answer to dump `seq`. Messages of other
/// sequence numbers (the leftovers of an earlier dump) are skipped.
fn decode<I>(request: &'static str, mut data: &[u8], seq: u32, out: &mut Vec<I>) -> Result<Part, Error>
where
    I: NetlinkDeserializable + std::fmt::Debug,
{
    let mut interrupted = false;
    while !data.is_empty() {
        let msg = NetlinkMessage::<I>::deserialize(data).map_err(|e| Error::Decode { request, msg: e.to_string() })?;
        let len = msg.header.length as usize;
        if len == 0 || len > data.len() {
            return Err(Error::Decode { request, msg: format!("message length {len} of a {} byte datagram", data.len()) });
        }
        // Messages are padded to 4 bytes.
        data = &data[((len + 3) & !3).min(data.len())..];
        if msg.header.sequence_number != seq {
            continue;
        }
        interrupted |= msg.header.flags & NLM_F_DUMP_INTR != 0;
        match msg.payload {
            NetlinkPayload::Done(_) => return Ok(Part::Done(interrupted)),
            NetlinkPayload::Error(e) => match e.code {
                Some(code) => return Err(Error::Kernel { request, errno: -code.get() }),
                None => continue,
            },
            NetlinkPayload::InnerMessage(m) => out.push(m),
            _ => {}
        }
    }
    Ok(Part::More(interrupted))
}

fn set_recv_timeout(s: &Socket, t: Duration) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let tv = libc::timeval { tv_sec: t.as_secs() as libc::time_t, tv_usec: t.subsec_micros() as libc::suseconds_t };
    // SAFETY: the fd is the socket's own and open; `tv` is a valid timeval
    // of the size passed, read by the kernel during the call only.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// NETLINK_SOCK_DIAG (inet_diag dumps, for `tcpstat` and `udp_queues`).
impl Channel {
    /// A NETLINK_SOCK_DIAG channel: send it an `inet_diag_req_v2` dump with
    /// [`Channel::request`], or use [`Channel::inet_sockets`].
    pub(crate) fn sock_diag() -> Self {
        Channel::new(netlink_sys::protocols::NETLINK_SOCK_DIAG)
    }

    /// The header of every socket of `family` (AF_INET or AF_INET6) and
    /// IP `protocol` in one of `states` (a bit per TCP_* state): one
    /// `SOCK_DIAG_BY_FAMILY` dump, without extensions. The kernel walks its
    /// socket table once for it (a /proc/net/{tcp,udp} read walks it again
    /// on every read call, the final one at end of file included).
    pub(crate) fn inet_sockets(&mut self, request: &'static str, family: u8, protocol: u8, states: u32) -> Result<Vec<DiagHeader>, Error> {
        self.request(request, NLM_F_REQUEST | NLM_F_DUMP, || inet_request(family, protocol, states))
    }
}

/// The `inet_diag_req_v2` of [`Channel::inet_sockets`]: any address and
/// port, no extensions.
fn inet_request(family: u8, protocol: u8, states: u32) -> netlink_packet_sock_diag::SockDiagMessage {
    use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
    netlink_packet_sock_diag::SockDiagMessage::InetRequest(InetRequest {
        family,
        protocol,
        extensions: ExtensionFlags::empty(),
        states: StateFlags::from_bits_retain(states),
        socket_id: if family == netlink_packet_sock_diag::AF_INET6 { SocketId::new_v6() } else { SocketId::new_v4() },
    })
}

/// The header of one `inet_diag_msg`: a socket's state and queue lengths
/// (`idiag_rqueue`, `idiag_wqueue`: what /proc/net/{tcp,udp}{,6} print as
/// `rx_queue` and `tx_queue`). Its attributes are skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiagHeader {
    pub state: u8,
    pub recv_queue: u32,
    pub send_queue: u32,
}

impl NetlinkDeserializable for DiagHeader {
    type Error = netlink_packet_core::DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        use netlink_packet_core::Parseable;
        if header.message_type != netlink_packet_sock_diag::SOCK_DIAG_BY_FAMILY {
            return Err(format!("unexpected message type {} in an inet_diag dump", header.message_type).into());
        }
        let h = netlink_packet_sock_diag::inet::InetResponseHeader::parse(payload)?;
        Ok(DiagHeader { state: h.state, recv_queue: h.recv_queue, send_queue: h.send_queue })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{DoneMessage, ErrorMessage};

    fn wire(seq: u32, flags: u16, payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<u8> {
        let mut m = NetlinkMessage::new(NetlinkHeader::default(), payload);
        m.header.sequence_number = seq;
        m.header.flags = flags;
        m.finalize();
        let mut b = vec![0; m.buffer_len()];
        m.serialize(&mut b);
        b
    }

    fn link(index: u32) -> NetlinkPayload<RouteNetlinkMessage> {
        let mut l = LinkMessage::default();
        l.header.index = index;
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l))
    }

    fn diag_answer(state: u8, rq: u32, wq: u32) -> Vec<u8> {
        use netlink_packet_core::Emitable;
        use netlink_packet_sock_diag::inet::{InetResponse, InetResponseHeader, SocketId};
        let mut socket_id = SocketId::new_v4();
        socket_id.source_port = 22;
        let msg = netlink_packet_sock_diag::SockDiagMessage::InetResponse(Box::new(InetResponse {
            header: InetResponseHeader {
                family: netlink_packet_sock_diag::AF_INET,
                state,
                timer: None,
                socket_id,
                recv_queue: rq,
                send_queue: wq,
                uid: 0,
                inode: 7,
            },
            nlas: Default::default(),
        }));
        let mut buf = vec![0; Emitable::buffer_len(&msg)];
        msg.emit(&mut buf);
        buf
    }

    #[test]
    fn decodes_the_header_of_an_inet_diag_answer() {
        let payload = diag_answer(1, 10, 20);
        let mut h = NetlinkHeader::default();
        h.message_type = netlink_packet_sock_diag::SOCK_DIAG_BY_FAMILY;
        assert_eq!(DiagHeader::deserialize(&h, &payload).unwrap(), DiagHeader { state: 1, recv_queue: 10, send_queue: 20 });
        // Truncated and of another type: decode errors, not panics.
        assert!(DiagHeader::deserialize(&h, &payload[..20]).is_err());
        h.message_type = 99;
        assert!(DiagHeader::deserialize(&h, &payload).is_err());
    }

    #[test]
    fn the_inet_diag_request_is_an_inet_diag_req_v2_for_any_socket() {
        use netlink_packet_sock_diag::{AF_INET6, IPPROTO_TCP, IPPROTO_UDP};
        let wire = |family: u8, protocol: u8, states: u32| {
            let mut m = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(inet_request(family, protocol, states)));
            m.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
            m.finalize();
            let mut wire = vec![0; m.buffer_len()];
            m.serialize(&mut wire);
            wire
        };
        // node_exporter's tcpstat request: nlmsghdr (16) + inet_diag_req_v2 (0x38).
        let w = wire(AF_INET6, IPPROTO_TCP, 0xFFF);
        assert_eq!(w.len(), 16 + 0x38);
        assert_eq!(u16::from_ne_bytes([w[4], w[5]]), 20, "SOCK_DIAG_BY_FAMILY");
        assert_eq!(&w[16..20], &[AF_INET6, IPPROTO_TCP, 0, 0]);
        assert_eq!(u32::from_ne_bytes([w[20], w[21], w[22], w[23]]), 0xFFF);
        // Every state, UDP: all that /proc/net/udp lists.
        let w = wire(netlink_packet_sock_diag::AF_INET, IPPROTO_UDP, u32::MAX);
        assert_eq!(&w[16..20], &[netlink_packet_sock_diag::AF_INET, IPPROTO_UDP, 0, 0]);
        assert_eq!(u32::from_ne_bytes([w[20], w[21], w[22], w[23]]), u32::MAX);
        // Any address and port: the socket id is all zeros.
        assert!(w[24..].iter().all(|&b| b == 0), "{:?}", &w[24..]);
    }

    #[test]
    fn decodes_a_multipart_dump_and_skips_other_sequences() {
        let mut d = wire(7, 0, link(1));
        d.extend(wire(6, 0, link(99)));
        d.extend(wire(7, NLM_F_DUMP_INTR, link(2)));
        let mut out = Vec::new();
        assert_eq!(decode("t", &d, 7, &mut out).unwrap(), Part::More(true));
        let done = wire(7, 0, NetlinkPayload::Done(DoneMessage::default()));
        assert_eq!(decode("t", &done, 7, &mut out).unwrap(), Part::Done(false));
        let idx: Vec<u32> = out
            .iter()
            .map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => l.header.index,
                _ => 0,
            })
            .collect();
        assert_eq!(idx, [1, 2]);
    }

    #[test]
    fn kernel_errors_and_garbage_are_errors() {
        let mut e = ErrorMessage::default();
        e.code = std::num::NonZeroI32::new(-libc::EPERM);
        let d = wire(3, 0, NetlinkPayload::Error(e));
        match decode::<RouteNetlinkMessage>("RTM_GETLINK", &d, 3, &mut Vec::new()) {
            Err(Error::Kernel { errno, .. }) => assert_eq!(errno, libc::EPERM),
            other => panic!("{other:?}"),
        }
        assert!(matches!(decode::<RouteNetlinkMessage>("t", &[1, 2, 3], 3, &mut Vec::new()), Err(Error::Decode { .. })));
        let mut d = wire(3, 0, link(1));
        d.truncate(d.len() - 4);
        assert!(decode::<RouteNetlinkMessage>("t", &d, 3, &mut Vec::new()).is_err());
    }

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
        // This kernel has the ethtool family; lo has no link modes.
        let modes = Ethtool::new().link_modes().expect("ethtool link modes dump");
        assert!(modes.iter().all(|m| m.name != "lo"), "{modes:?}");
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

    #[test]
    fn link_modes_of_an_ethtool_answer() {
        let m = EthtoolMessage {
            cmd: ethtool::EthtoolCmd::LinkModeGetReply,
            nlas: vec![
                EthtoolAttr::LinkMode(EthtoolLinkModeAttr::Header(vec![EthtoolHeader::DevIndex(2), EthtoolHeader::DevName("eth0".into())])),
                EthtoolAttr::LinkMode(EthtoolLinkModeAttr::Speed(1000)),
                EthtoolAttr::LinkMode(EthtoolLinkModeAttr::Duplex(EthtoolLinkModeDuplex::Full)),
            ],
        };
        assert_eq!(
            link_mode(&m),
            Some(LinkMode { index: 2, name: "eth0".into(), speed: Some(1000), duplex: Some(EthtoolLinkModeDuplex::Full) })
        );
        let unknown = EthtoolMessage {
            cmd: ethtool::EthtoolCmd::LinkModeGetReply,
            nlas: vec![
                EthtoolAttr::LinkMode(EthtoolLinkModeAttr::Header(vec![EthtoolHeader::DevName("veth0".into())])),
                EthtoolAttr::LinkMode(EthtoolLinkModeAttr::Speed(u32::MAX)),
            ],
        };
        assert_eq!(link_mode(&unknown).and_then(|m| m.speed), None);
        assert_eq!(link_mode(&EthtoolMessage { cmd: ethtool::EthtoolCmd::LinkModeGetReply, nlas: vec![] }), None);
    }
}

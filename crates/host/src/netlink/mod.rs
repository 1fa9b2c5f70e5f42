//! Netlink for the collectors: one socket type ([`Channel`]) that sends a
//! request and collects its (multipart) answer, and a module per protocol
//! or generic netlink family on top of it:
//!
//! - [`route`]: rtnetlink dumps (links, addresses, neighbours, qdiscs,
//!   routes), as node_exporter 1.12 reads them by default
//!   (`--collector.netdev.netlink`, `--collector.arp.netlink`,
//!   `--collector.netclass.netlink`), and the link counters two collectors
//!   share;
//! - [`ethtool`]: link modes from the ethtool generic family;
//! - [`nl80211`]: the wireless family's interface, BSS and station dumps;
//! - [`sock_diag`]: inet_diag socket dumps (tcpstat, udp_queues);
//! - [`genl`]: resolving a generic family's id.
//!
//! Messages are decoded by the rust-netlink crates (`netlink-packet-*`);
//! where a message carries many attributes a collector never reads,
//! [`selected_attributes`] decodes only the kinds asked for. The socket
//! and the buffer live in the collector between scrapes. Netlink answers
//! for the network namespace of the agent (the host's, with
//! `hostNetwork: true`), whatever `--path.procfs` says, as node_exporter's
//! does.

use std::time::Duration;

use netlink_packet_core::{
    DecodeError, NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable, NlaBuffer, NlasIterator,
    NLA_TYPE_MASK, NLM_F_DUMP, NLM_F_DUMP_INTR,
};
use netlink_sys::protocols::NETLINK_GENERIC;
use netlink_sys::{Socket, SocketAddr};

pub mod ethtool;
pub mod genl;
pub mod nl80211;
pub mod route;
pub mod sock_diag;

pub use ethtool::{link_mode, Ethtool, LinkMode};
pub(crate) use genl::genl_family_id;
pub use route::{attr, Route};
pub use sock_diag::DiagHeader;

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

    pub(crate) fn new(protocol: isize) -> Self {
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

/// The attributes of `payload` after its fixed header of `header_len`
/// bytes whose kinds are in `keep`, each decoded by `parse`; the others are
/// skipped unread. `what` names the message in the error of a payload
/// shorter than its header.
pub(crate) fn selected_attributes<A>(
    payload: &[u8],
    header_len: usize,
    keep: &[u16],
    what: &'static str,
    mut parse: impl FnMut(&NlaBuffer<&[u8]>) -> Result<A, DecodeError>,
) -> Result<Vec<A>, DecodeError> {
    let rest = payload.get(header_len..).ok_or_else(|| DecodeError::from(format!("short {what} message")))?;
    let mut out = Vec::new();
    for nla in NlasIterator::new(rest) {
        let nla = nla?;
        if keep.contains(&(nla.kind() & NLA_TYPE_MASK)) {
            out.push(parse(&nla)?);
        }
    }
    Ok(out)
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use netlink_packet_core::{DoneMessage, ErrorMessage};
    use netlink_packet_route::link::LinkMessage;
    use netlink_packet_route::RouteNetlinkMessage;

    pub(crate) fn wire(seq: u32, flags: u16, payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<u8> {
        let mut m = NetlinkMessage::new(NetlinkHeader::default(), payload);
        m.header.sequence_number = seq;
        m.header.flags = flags;
        m.finalize();
        let mut b = vec![0; m.buffer_len()];
        m.serialize(&mut b);
        b
    }

    pub(crate) fn link(index: u32) -> NetlinkPayload<RouteNetlinkMessage> {
        let mut l = LinkMessage::default();
        l.header.index = index;
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l))
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

    #[test]
    fn selected_attributes_keeps_the_kinds_asked_for_in_order() {
        use netlink_packet_core::{DefaultNla, Emitable};
        let nlas = vec![DefaultNla::new(1, vec![1; 4]), DefaultNla::new(2, vec![2; 4]), DefaultNla::new(3, vec![3; 8])];
        let mut payload = vec![9u8; 4];
        let mut body = vec![0; nlas.as_slice().buffer_len()];
        nlas.as_slice().emit(&mut body);
        payload.extend(body);
        let kept = selected_attributes(&payload, 4, &[3, 1], "t", |n| Ok((n.kind(), n.value().to_vec()))).unwrap();
        assert_eq!(kept, vec![(1, vec![1; 4]), (3, vec![3; 8])]);
        assert!(selected_attributes(&payload[..2], 4, &[1], "t", |n| Ok(n.kind())).is_err(), "shorter than its header");
    }
}

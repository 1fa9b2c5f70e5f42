//! NETLINK_SOCK_DIAG: inet_diag socket dumps, for `tcpstat` and
//! `udp_queues`.

use netlink_packet_core::{NetlinkDeserializable, NetlinkHeader, NLM_F_DUMP, NLM_F_REQUEST};

use super::{Channel, Error};

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
    use netlink_packet_core::{NetlinkMessage, NetlinkPayload};

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
}

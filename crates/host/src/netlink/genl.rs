//! Generic netlink: resolving a family's id by name (CTRL_CMD_GETFAMILY).

use netlink_packet_core::NLM_F_REQUEST;
use netlink_packet_generic::ctrl::{nlas::GenlCtrlAttrs, GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::GenlMessage;

use super::{Channel, Error};

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

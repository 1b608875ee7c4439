//! Medium messages (spec 3.2; MEDIUM_MSGRTM, MEDIUM_TAGRTM, DC_MEDIUM_*):
//! segments sent all at once, each a REQ with its offset. The first to
//! arrive in its msg_id's turn records the message; the others find it by
//! (peer, msg_id) and land. A runting read's runt segments (spec 4.5)
//! arrive the same way.

use super::dispatch::msg_proto;
use super::ops::{RxProto, RxState};
use super::types::{BufId, ReqInfo, RxId};
use super::{DropReason, Endpoint};
use crate::device::Device;

impl<D: Device> Endpoint<D> {
    /// A later packet of a message in progress (a medium or runting-read
    /// segment).
    pub(super) fn handle_segment(&mut self, buf: BufId, id: RxId, info: &ReqInfo) {
        let Some(op) = self.rx_ops.get(id) else {
            self.counters.drop(DropReason::StaleId);
            self.release_rx(buf);
            return;
        };
        let consistent = msg_proto(info)
            .is_some_and(|(p, t, _)| p == op.proto.name() && t == op.tagged)
            && info.msg_length == op.total;
        let limit = match op.proto {
            RxProto::RuntRead(r) => r.runt,
            _ => op.total,
        };
        let in_range =
            info.seg_offset.checked_add(info.payload_len as u64).is_some_and(|e| e <= limit);
        if !consistent || !in_range {
            self.counters.drop(if consistent {
                DropReason::SegmentOutOfRange
            } else {
                DropReason::Invalid
            });
            self.release_rx(buf);
            return;
        }
        if op.state == RxState::Unexpected {
            self.hold(id, buf);
            return;
        }
        let landed = self.land(id, buf, info.payload_off, info.payload_len, info.seg_offset);
        self.release_rx(buf);
        if landed {
            self.advance_rx(id);
        }
    }
}

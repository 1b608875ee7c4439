use efapoll::wire::{ReqField, ReqPacket, ReqRepr, golden};
use std::hint::black_box;
fn main() {
    let bytes = golden::EAGER_TAGRTM_ALL_OPT_HDRS;
    let mut acc = 0u64;
    let which = std::env::args().nth(1).unwrap_or_default();
    if which == "view" {
        for _ in 0..1_000_000 {
            let p = ReqPacket::new_checked(black_box(bytes)).unwrap();
            acc = acc.wrapping_add(
                p.field(ReqField::MsgId).unwrap()
                    ^ p.field(ReqField::Tag).unwrap()
                    ^ p.cq_data().unwrap_or(0)
                    ^ p.connid().unwrap_or(0) as u64
                    ^ p.payload().len() as u64
                    ^ p.raw_addr().map_or(0, |a| a.len() as u64),
            );
        }
    } else if which == "emit_typed" {
        let addr = golden::RAW_ADDR.to_req_hdr_bytes();
        let mut buf = [0u8; 128];
        for _ in 0..1_000_000 {
            let mut r = ReqRepr::new(efapoll::wire::PacketType::EagerTagRtm);
            r.msg_id = black_box(golden::MSG_ID);
            r.tag = black_box(golden::TAG);
            r.raw_addr = Some(black_box(&addr[..]));
            r.cq_data = Some(black_box(golden::CQ_DATA));
            r.connid = Some(black_box(golden::CONNID));
            acc += black_box(r.emit(black_box(&mut buf))) as u64;
        }
    } else if which == "emit" {
        let (repr, _) = ReqRepr::parse(bytes).unwrap();
        let mut buf = [0u8; 128];
        for _ in 0..1_000_000 {
            acc += black_box(&repr).emit(black_box(&mut buf)) as u64;
        }
    } else {
        for _ in 0..1_000_000 {
            let (repr, payload) = ReqRepr::parse(black_box(bytes)).unwrap();
            acc = acc.wrapping_add(
                repr.msg_id as u64
                    ^ repr.tag
                    ^ repr.cq_data.unwrap_or(0)
                    ^ repr.connid.unwrap_or(0) as u64
                    ^ payload.len() as u64
                    ^ repr.raw_addr.map_or(0, |a| a.len() as u64),
            );
        }
    }
    println!("{acc}");
}

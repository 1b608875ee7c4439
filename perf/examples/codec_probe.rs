use efapoll::wire::{PacketType, ReqRepr, golden};
use std::hint::black_box;

#[inline(never)]
fn emit_typed(buf: &mut [u8], addr: &[u8], msg_id: u32, tag: u64, cq: u64, connid: u32) -> usize {
    let mut r = ReqRepr::new(PacketType::EagerTagRtm);
    r.msg_id = msg_id;
    r.tag = tag;
    r.raw_addr = Some(addr);
    r.cq_data = Some(cq);
    r.connid = Some(connid);
    r.emit(buf)
}

fn main() {
    let addr = golden::RAW_ADDR.to_req_hdr_bytes();
    let mut buf = [0u8; 128];
    let mut acc = 0;
    for _ in 0..200_000_000 {
        acc += emit_typed(black_box(&mut buf), black_box(&addr), 1, 2, 3, 4);
    }
    println!("{acc}");
}

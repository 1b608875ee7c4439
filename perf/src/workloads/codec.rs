//! The wire codec, fed the golden packets of the unit tests.

use std::hint::black_box;

use efapoll::wire::{Packet, PacketType, ReqField, ReqPacket, ReqRepr, golden};

use super::{Kind, Unit, Workload};

/// About 50 ms of parses or emits (see [`Workload::iters`]).
const PARSE_ITERS: u64 = 2_000_000;
const EMIT_ITERS: u64 = 5_000_000;

/// Golden packets whose parse the small suite gates on: one per family.
const SMALL: &[&str] = &["CTS", "CTSDATA", "HANDSHAKE", "READRSP", "EAGER_MSGRTM", "FETCH_RTA"];

pub(super) fn workloads(v: &mut Vec<Workload>) {
    let op = |name: &str, iters: u64, run: fn() -> Box<dyn super::Runner>| {
        Workload::new(format!("codec/req_all_opt_hdrs/{name}"), Unit::Ops, Kind::Rate, iters, run)
    };
    // The headline case: a REQ with raw address, CQ data and connid headers.
    // The zero-copy view: every check, then the fields a receiver reads.
    v.push(op("parse", 6_000_000, || Box::new(|n| (0..n).for_each(|_| parse_view()))).small());
    // The value form: every field copied out.
    v.push(op("parse_repr", 4_000_000, || {
        Box::new(|n| {
            for _ in 0..n {
                black_box(ReqRepr::parse(black_box(golden::EAGER_TAGRTM_ALL_OPT_HDRS)).unwrap());
            }
        })
    }));
    // A sender building a header whose type is known at the call site.
    v.push(
        op("emit", 10_000_000, || {
            let addr = golden::RAW_ADDR.to_req_hdr_bytes();
            let mut buf = [0u8; 128];
            Box::new(move |n| {
                for _ in 0..n {
                    black_box(emit_eager_tagrtm(black_box(&mut buf), black_box(&addr)));
                }
            })
        })
        .small(),
    );
    // A header whose type the compiler cannot see.
    v.push(op("emit_dyn", 10_000_000, || {
        let (repr, _) = ReqRepr::parse(golden::EAGER_TAGRTM_ALL_OPT_HDRS).unwrap();
        let mut buf = [0u8; 128];
        Box::new(move |n| {
            for _ in 0..n {
                black_box(black_box(&repr).emit(black_box(&mut buf)));
            }
        })
    }));

    // Every packet type through the generic dispatcher.
    for &(name, bytes) in golden::ALL {
        let parse =
            Workload::new(format!("codec/parse/{name}"), Unit::Ops, Kind::Rate, PARSE_ITERS, {
                move || {
                    Box::new(move |n| {
                        for _ in 0..n {
                            black_box(Packet::parse(black_box(bytes)).unwrap());
                        }
                    })
                }
            });
        v.push(if SMALL.contains(&name) { parse.small() } else { parse });
    }
    for &(name, bytes) in golden::ALL {
        v.push(Workload::new(format!("codec/emit/{name}"), Unit::Ops, Kind::Rate, EMIT_ITERS, {
            move || {
                let packet = Packet::parse(bytes).unwrap();
                let mut buf = [0u8; 256];
                Box::new(move |n| {
                    for _ in 0..n {
                        black_box(black_box(&packet).emit(black_box(&mut buf)));
                    }
                })
            }
        }));
    }
}

#[inline(never)]
fn parse_view() {
    let p = ReqPacket::new_checked(black_box(golden::EAGER_TAGRTM_ALL_OPT_HDRS)).unwrap();
    // Every field a receiver reads, folded into one value: the optimiser
    // must compute them all, and the benchmark's barrier costs one store
    // rather than one per field (six would be a fifth of the time).
    let slice = |s: &[u8]| s.as_ptr() as u64 ^ s.len() as u64;
    black_box(
        p.field(ReqField::MsgId).unwrap_or(0)
            ^ p.field(ReqField::Tag).unwrap_or(0)
            ^ p.raw_addr().map_or(0, slice)
            ^ p.cq_data().unwrap_or(0)
            ^ p.connid().unwrap_or(0) as u64
            ^ slice(p.payload()),
    );
}

/// What a sender's code does: a REQ of a type fixed at the call site.
#[inline(never)]
fn emit_eager_tagrtm(buf: &mut [u8], addr: &[u8]) -> usize {
    let mut r = ReqRepr::new(PacketType::EagerTagRtm);
    r.msg_id = golden::MSG_ID;
    r.tag = golden::TAG;
    r.raw_addr = Some(addr);
    r.cq_data = Some(golden::CQ_DATA);
    r.connid = Some(golden::CONNID);
    r.emit(buf)
}

//! Wire codec: parse+validate and emit, per packet type, on the golden
//! packets the unit tests use.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use efapoll::wire::{Packet, PacketType, ReqField, ReqPacket, ReqRepr, golden};

/// The headline case: a REQ with raw address, CQ data and connid headers.
fn req_all_optional_headers(c: &mut Criterion) {
    let bytes = golden::EAGER_TAGRTM_ALL_OPT_HDRS;
    let mut g = c.benchmark_group("req_all_opt_hdrs");
    g.throughput(Throughput::Elements(1));
    // The zero-copy view: every check, then the fields a receiver reads.
    g.bench_function("parse", |b| {
        b.iter(|| {
            let p = ReqPacket::new_checked(black_box(bytes)).unwrap();
            black_box(p.field(ReqField::MsgId));
            black_box(p.field(ReqField::Tag));
            black_box(p.raw_addr());
            black_box(p.cq_data());
            black_box(p.connid());
            black_box(p.payload());
        })
    });
    // The value form: every field copied out.
    g.bench_function("parse_repr", |b| {
        b.iter(|| black_box(ReqRepr::parse(black_box(bytes)).unwrap()))
    });
    // A sender building the header where its type is known.
    let addr = golden::RAW_ADDR.to_req_hdr_bytes();
    let mut buf = [0u8; 128];
    g.bench_function("emit", |b| {
        b.iter(|| {
            emit_eager_tagrtm(
                black_box(&mut buf),
                black_box(&addr),
                golden::MSG_ID,
                golden::TAG,
                golden::CQ_DATA,
                golden::CONNID,
            )
        })
    });
    // A header whose type the compiler cannot see.
    let (repr, _) = ReqRepr::parse(bytes).unwrap();
    g.bench_function("emit_dyn", |b| {
        b.iter(|| black_box(black_box(&repr).emit(black_box(&mut buf))))
    });
    g.finish();
}

/// What a sender's code does: a REQ of a type fixed at the call site.
#[inline(never)]
fn emit_eager_tagrtm(
    buf: &mut [u8],
    addr: &[u8],
    msg_id: u32,
    tag: u64,
    cq: u64,
    connid: u32,
) -> usize {
    let mut r = ReqRepr::new(PacketType::EagerTagRtm);
    r.msg_id = msg_id;
    r.tag = tag;
    r.raw_addr = Some(addr);
    r.cq_data = Some(cq);
    r.connid = Some(connid);
    r.emit(buf)
}

/// Every golden packet through the generic dispatcher.
fn every_type(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse");
    g.throughput(Throughput::Elements(1));
    for (name, bytes) in golden::ALL {
        g.bench_function(*name, |b| b.iter(|| black_box(Packet::parse(black_box(bytes)).unwrap())));
    }
    g.finish();
    let mut g = c.benchmark_group("emit");
    g.throughput(Throughput::Elements(1));
    let mut buf = [0u8; 256];
    for (name, bytes) in golden::ALL {
        let packet = Packet::parse(bytes).unwrap();
        g.bench_function(*name, |b| b.iter(|| black_box(black_box(&packet).emit(&mut buf))));
    }
    g.finish();
}

criterion_group!(benches, req_all_optional_headers, every_type);
criterion_main!(benches);

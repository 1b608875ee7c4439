//! One-sided operations on the sim device: emulated and direct write and
//! read, the long-read and runting-read pipelines, delivery complete,
//! READ_NACK, protection, timeouts.

use crate::common;

use std::time::Duration;

use common::{Mem, World, iov, pattern, span};
use efapoll::device::Access;
use efapoll::device::fault::Faults;
use efapoll::device::sim::SimConfig;
use efapoll::endpoint::{Config, DropReason, Op, Status};
use efapoll::wire::{Packet, PacketType, PktFlags, ReceiptRepr, ReqFlags, RmaIov};

fn sim(seed: u64, rdma_read: bool, rdma_write: bool) -> SimConfig {
    SimConfig {
        seed,
        faults: Faults::reorder(seed, 8),
        rdma_read,
        rdma_write,
        max_rdma_size: 256 << 10,
        ..SimConfig::default()
    }
}

fn quick() -> Config {
    Config {
        handshake_on_insert: true,
        response_timeout: Duration::from_millis(200),
        ..Config::default()
    }
}

/// A pair whose handshake is done both ways.
fn ready(sim: SimConfig, cfg: Config) -> World {
    let mut w = World::pair(sim, cfg);
    let a = w.connect(0, 1);
    let b = w.connect(1, 0);
    w.drive_until(1000, |w| {
        w.eps[0].peer_handshake_received(a) && w.eps[1].peer_handshake_received(b)
    });
    w
}

/// The one REQ of type `ptype` in `wire`, re-sent after a READ_NACK: it
/// carries the READ_NACK flag (0x2000) and no data.
fn the_read_nack_retry(wire: &[(u16, u16, Vec<u8>)], ptype: PacketType) {
    let retry: Vec<_> = wire.iter().filter(|(_, _, p)| p[0] == ptype.id()).collect();
    assert_eq!(retry.len(), 1, "one {ptype:?}");
    let Packet::Req(r, payload) = Packet::parse(&retry[0].2).unwrap() else { panic!() };
    assert!(r.flags.contains(ReqFlags::READ_NACK), "flag 0x2000");
    assert!(payload.is_empty(), "no data in the re-sent REQ");
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().enumerate().fold(0xcbf2_9ce4_8422_2325u64, |h, (i, b)| {
        (h ^ (*b as u64 + i as u64)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Writes then reads back `len` bytes at an offset, checking both ways;
/// returns the packet types the requester sent.
fn write_then_read(w: &mut World, len: u64) {
    let to_b = efapoll::endpoint::PeerId(0);
    let src = w.register(0, len + 64);
    let back = w.register(0, len + 64);
    let target = w.register(1, len + 128);
    w.fill(0, &src, len);
    let (d0, d1) = (w.done[0].len(), w.done[1].len());
    loop {
        match w.eps[0].write(to_b, span(&src, 3, len), iov(&target, 17, len), 1) {
            Ok(()) => break,
            Err(efapoll::endpoint::Error::Again) => w.step(),
            Err(e) => panic!("write: {e}"),
        };
    }
    w.drive_until(100_000, |w| w.done[0].len() > d0);
    assert_eq!(w.done[0][d0].status, Status::Ok, "write {len}");
    assert_eq!(w.done[0][d0].op, Op::Write);
    w.settle();
    let got = &w.eps[1].mem(target.id)[17..17 + len as usize];
    assert!(got == &w.eps[0].mem(src.id)[3..3 + len as usize], "write of {len} landed byte-exact");
    assert!(w.eps[1].mem(target.id)[..17].iter().all(|b| *b == 0), "nothing before the target");
    assert!(w.eps[1].mem(target.id)[17 + len as usize..].iter().all(|b| *b == 0), "nothing after");
    w.eps[0].read(to_b, span(&back, 5, len), iov(&target, 17, len), 2).unwrap();
    w.drive_until(100_000, |w| w.done[0].len() > d0 + 1);
    assert_eq!(w.done[0][d0 + 1].status, Status::Ok, "read {len}");
    assert_eq!(
        &w.eps[0].mem(back.id)[5..5 + len as usize],
        &w.eps[0].mem(src.id)[3..3 + len as usize]
    );
    assert_eq!(w.done[1].len(), d1, "the target reports nothing without CQ data");
}

#[test]
fn emulated_write_and_read_at_their_thresholds() {
    // No device RDMA at all: EAGER_RTW / LONGCTS_RTW, SHORT_RTR / LONGCTS_RTR.
    for seed in 1..=4 {
        for &len in &[0u64, 1, 8000, 8100, 8200, 64 << 10, 300_000, 4 << 20] {
            let mut w = ready(sim(seed * 31 + len, false, false), quick());
            w.fabric.set_capture(true);
            write_then_read(&mut w, len);
            let sent: Vec<u8> = w
                .fabric
                .take_capture()
                .iter()
                .filter(|(f, _, _)| *f == 0)
                .map(|(_, _, p)| p[0])
                .collect();
            let has = |t: PacketType| sent.contains(&t.id());
            if len > 0 {
                assert!(has(PacketType::EagerRtw) || has(PacketType::LongCtsRtw), "len {len}");
                assert!(has(PacketType::ShortRtr) || has(PacketType::LongCtsRtr), "len {len}");
            }
            assert_eq!(has(PacketType::LongCtsRtw), len > 8100, "len {len}");
            assert_eq!(has(PacketType::LongCtsRtr), len > 8100, "len {len}");
        }
    }
}

#[test]
fn a_long_write_that_waited_for_a_receive_entry_lands_once_one_is_free() {
    // Emulated: no device RDMA.
    let cfg = Config { rx_ops: 2, ..quick() };
    let mut w =
        ready(SimConfig { rdma_read: false, rdma_write: false, ..SimConfig::default() }, cfg);
    let to_b = efapoll::endpoint::PeerId(0);
    let len = 100_000;
    let src = w.register(0, len);
    let target = w.register(1, len);
    let dst = w.register(1, 128);
    w.fill(0, &src, 5);
    // Two messages no receive takes yet hold the target's two entries.
    for i in 0..2 {
        w.eps[0].send(to_b, span(&src, i * 64, 64), 10 + i).unwrap();
    }
    w.settle();
    assert_eq!(w.eps[1].counters().unexpected, 2);
    // A long-CTS write waits at the target, its REQ held, for an entry...
    w.eps[0].write(to_b, span(&src, 0, len), iov(&target, 0, len), 1).unwrap();
    w.settle();
    assert!(w.eps[1].counters().rx_ops_exhausted > 0);
    assert!(!w.done[0].iter().any(|c| c.ctx == 1), "the write waits");
    // ...which receiving the two messages frees: the write goes on.
    for i in 0..2 {
        w.eps[1].recv(span(&dst, i * 64, 64), None, 20 + i).unwrap();
    }
    w.drive_until(10_000, |w| w.done[0].iter().any(|c| c.ctx == 1));
    let c = w.done[0].iter().find(|c| c.ctx == 1).unwrap();
    assert_eq!((c.op, c.status), (Op::Write, Status::Ok));
    w.settle();
    assert!(w.eps[1].mem(target.id) == w.eps[0].mem(src.id), "the write landed byte-exact");
    assert_eq!(w.eps[1].counters().drops(DropReason::Unsupported), 0);
}

#[test]
fn long_read_write_from_64k_when_the_target_can_read() {
    for &len in &[(64 << 10) - 1, 64 << 10, 1 << 20] {
        let mut w = ready(sim(len, true, false), quick());
        w.fabric.set_capture(true);
        write_then_read(&mut w, len);
        let wire = w.fabric.take_capture();
        let longread = wire.iter().any(|(f, _, p)| *f == 0 && p[0] == PacketType::LongReadRtw.id());
        assert_eq!(longread, len >= 64 << 10, "len {len}");
        let eor = wire.iter().any(|(f, _, p)| *f == 1 && p[0] == PacketType::Eor.id());
        assert_eq!(eor, longread);
    }
}

#[test]
fn direct_rdma_write_and_read_in_segments() {
    for &len in &[1u64, 4096, 256 << 10, (256 << 10) + 1, 16 << 20] {
        let mut w = ready(sim(len, true, true), quick());
        w.fabric.set_capture(true);
        write_then_read(&mut w, len);
        let wire = w.fabric.take_capture();
        assert!(
            wire.iter().all(|(f, _, p)| *f != 0 || p[0] < 64 || p[0] == PacketType::EagerRtw.id()),
            "no REQ: direct"
        );
        // One write and one read, each in 256 KiB segments, all counted.
        let segments = len.div_ceil(256 << 10);
        let c = w.eps[0].counters();
        assert_eq!((c.rdma_writes, c.rdma_reads, c.rdma_bytes), (segments, segments, 2 * len));
    }
}

#[test]
fn write_with_cq_data_is_reported_at_the_target() {
    let cases =
        [(true, 0u64), (true, 100), (true, 1 << 20), (false, 0), (false, 100), (false, 100_000)];
    for (rdma_write, len) in cases {
        let mut w = ready(sim(7, true, rdma_write), quick());
        let src = w.register(0, len.max(1));
        let target = w.register(1, len.max(1));
        w.fill(0, &src, 3);
        w.eps[0]
            .writedata(
                efapoll::endpoint::PeerId(0),
                span(&src, 0, len),
                iov(&target, 0, len),
                0xabcd,
                1,
            )
            .unwrap();
        w.drive_until(100_000, |w| w.done[1].len() == 1 && w.done[0].len() == 1);
        let c = w.done[1][0];
        assert_eq!(
            (c.op, c.cq_data, c.peer),
            (Op::RemoteWrite, Some(0xabcd), Some(efapoll::endpoint::PeerId(0))),
            "direct {rdma_write} len {len}"
        );
        // The direct path reports what the device does: the bytes of the
        // RDMA write that carried the data (here split at 256 KiB).
        let reported = if rdma_write { len.min(256 << 10) } else { len };
        assert_eq!(c.len, reported, "direct {rdma_write} len {len}");
        if len > 0 {
            assert_eq!(w.eps[1].mem(target.id), w.eps[0].mem(src.id));
        }
    }
}

#[test]
fn long_read_and_runting_read_messages() {
    // (size, runt_size): plain long-read when runting is off.
    for &(len, runt) in &[
        (1u64 << 20, 0u64),
        (1 << 20, 307_200),
        ((1 << 20) + 77, 307_200),
        (8 << 20, 1 << 20),
        (2 << 20, 5000),
    ] {
        for seed in 1..=3 {
            let cfg = Config { runt_size: runt, ..quick() };
            let mut w = ready(sim(seed + len, true, true), cfg);
            w.fabric.set_capture(true);
            let to_b = efapoll::endpoint::PeerId(0);
            let src = w.register(0, len);
            let dst = w.register(1, len);
            w.fill(0, &src, seed);
            w.eps[1].recv(span(&dst, 0, len), None, 1).unwrap();
            w.eps[0].send(to_b, span(&src, 0, len), 1).unwrap();
            w.drive_until(100_000, |w| w.done[0].len() == 1 && w.done[1].len() == 1);
            assert_eq!((w.done[1][0].status, w.done[1][0].len), (Status::Ok, len));
            assert_eq!(w.done[0][0].status, Status::Ok);
            assert!(
                w.eps[1].mem(dst.id) == w.eps[0].mem(src.id),
                "len {len} runt {runt} byte-exact"
            );
            let wire = w.fabric.take_capture();
            let count = |t: PacketType| wire.iter().filter(|(_, _, p)| p[0] == t.id()).count();
            if runt == 0 {
                assert_eq!(count(PacketType::LongReadMsgRtm), 1);
            } else {
                let runts = count(PacketType::RuntReadMsgRtm);
                assert!(
                    runts >= 1 && runts as u64 <= runt / 8000 + 1,
                    "{runts} runt packets for {runt}"
                );
                // Every runt packet repeats the whole read_iov and the total
                // runt length (interop notes).
                for (_, _, p) in
                    wire.iter().filter(|(_, _, p)| p[0] == PacketType::RuntReadMsgRtm.id())
                {
                    let Packet::Req(r, _) = Packet::parse(p).unwrap() else { panic!() };
                    assert_eq!(r.runt_length, runt.min(len));
                    assert_eq!(r.read_iov.iter().map(|v| v.len).sum::<u64>(), len);
                }
            }
            assert_eq!(count(PacketType::Eor), 1);
        }
    }
}

#[test]
fn a_runting_read_that_times_out_gives_its_runt_back() {
    // The whole budget goes to one message the receiver never takes: until
    // it times out, the next message goes by plain long-read; after, by
    // runting read again.
    let runt = 64 << 10;
    let cfg = Config { runt_size: runt, ..quick() };
    let mut w = ready(sim(3, true, true), cfg);
    let to_b = efapoll::endpoint::PeerId(0);
    let len = 1 << 20;
    let src = w.register(0, len);
    let sent = |w: &mut World, ctx| {
        w.fabric.set_capture(true);
        w.eps[0].send(to_b, span(&src, 0, len), ctx).unwrap();
        w.settle();
        let wire = w.fabric.take_capture();
        let (_, _, first) =
            wire.iter().find(|(_, _, p)| p[0] != PacketType::Handshake.id()).unwrap();
        PacketType::from(first[0])
    };
    assert_eq!(sent(&mut w, 1), PacketType::RuntReadMsgRtm);
    assert_eq!(sent(&mut w, 2), PacketType::LongReadMsgRtm, "the budget is spent");
    w.drive_for(Duration::from_secs(2), |w| w.done[0].len() == 2);
    assert!(w.done[0].iter().all(|c| c.status == Status::Timeout), "{:?}", w.done[0]);
    assert_eq!(sent(&mut w, 3), PacketType::RuntReadMsgRtm, "the budget is back");
}

/// Sends a 24-byte head and a 1 MiB body from two regions of endpoint 0
/// into a receive scattered over the same split at endpoint 1, by
/// `sendv_head` or, `head` false, by `sendv`; returns the wire and the
/// receiver's RDMA reads, checked byte-exact with the CQ data delivered.
fn head_and_body(
    w: &mut World,
    head: bool,
    cq_data: Option<u64>,
) -> (Vec<(u16, u16, Vec<u8>)>, u64) {
    let to_b = efapoll::endpoint::PeerId(0);
    let (hlen, blen) = (24u64, 1u64 << 20);
    let (hs, bs) = (w.register(0, hlen), w.register(0, blen));
    let (hd, bd) = (w.register(1, hlen), w.register(1, blen));
    w.fill(0, &hs, 5);
    w.fill(0, &bs, 6);
    let reads = w.eps[1].counters().rdma_reads;
    w.fabric.set_capture(true);
    w.eps[1].recvv(&[span(&hd, 0, hlen), span(&bd, 0, blen)], None, 1).unwrap();
    let (h, b) = (span(&hs, 0, hlen), span(&bs, 0, blen));
    match (head, cq_data) {
        (true, _) => w.eps[0].sendv_head(to_b, h, b, cq_data, 1).unwrap(),
        (false, None) => w.eps[0].sendv(to_b, &[h, b], 1).unwrap(),
        (false, Some(d)) => w.eps[0].sendvdata(to_b, &[h, b], d, 1).unwrap(),
    }
    w.drive_until(100_000, |w| !w.done[0].is_empty() && !w.done[1].is_empty());
    let (sent, got) = (w.done[0].remove(0), w.done[1].remove(0));
    assert_eq!((sent.status, got.status, got.len), (Status::Ok, Status::Ok, hlen + blen));
    assert_eq!(got.cq_data, cq_data);
    assert!(w.eps[1].mem(hd.id) == w.eps[0].mem(hs.id), "head byte-exact");
    assert!(w.eps[1].mem(bd.id) == w.eps[0].mem(bs.id), "body byte-exact");
    (w.fabric.take_capture(), w.eps[1].counters().rdma_reads - reads)
}

fn count(wire: &[(u16, u16, Vec<u8>)], t: PacketType) -> usize {
    wire.iter().filter(|(_, _, p)| p[0] == t.id()).count()
}

#[test]
fn a_head_sent_as_its_runt_leaves_the_body_alone_to_read() {
    // With runting off and with a budget: the head's runt takes none of it.
    for runt_size in [0u64, 307_200] {
        for cq_data in [None, Some(0xfeed)] {
            let cfg = Config { runt_size, ..quick() };
            let mut w = ready(sim(21, true, true), cfg);
            // By sendv the receiver reads the head apart: a read more.
            let (wire, reads) = head_and_body(&mut w, false, cq_data);
            match runt_size {
                0 => assert_eq!(count(&wire, PacketType::LongReadMsgRtm), 1),
                _ => assert!(count(&wire, PacketType::RuntReadMsgRtm) > 1, "the budget's runt"),
            }
            let (wire, head_reads) = head_and_body(&mut w, true, cq_data);
            assert_eq!(count(&wire, PacketType::LongReadMsgRtm), 0);
            let runts: Vec<_> =
                wire.iter().filter(|(_, _, p)| p[0] == PacketType::RuntReadMsgRtm.id()).collect();
            assert_eq!(runts.len(), 1, "runt {runt_size}: the head fits one REQ");
            let Packet::Req(r, data) = Packet::parse(&runts[0].2).unwrap() else { panic!() };
            assert_eq!((r.runt_length, r.seg_offset, data.len()), (24, 0, 24));
            // The whole message's read_iov, as every RUNTREAD carries it.
            assert_eq!(r.read_iov.iter().map(|v| v.len).collect::<Vec<_>>(), [24, 1 << 20]);
            // 1 MiB in 256 KiB reads; by sendv the head's own read besides,
            // unless the budget's runt covered it.
            assert_eq!(head_reads, 4, "runt {runt_size}");
            assert_eq!(reads, if runt_size == 0 { 5 } else { 3 }, "runt {runt_size}");
            assert_eq!(count(&wire, PacketType::Eor), 1);
        }
    }
}

#[test]
fn a_head_runt_lands_whatever_the_receive_is_cut_into() {
    // On host every message over a packet is read: heads from a byte to
    // more than a packet (a runt over two REQs), bodies from a byte to
    // over a read, into receives cut before, at and after the head's end.
    let cfg = Config { handshake_on_insert: true, ..Config::on_host() };
    let mut w = ready(sim(24, true, true), cfg);
    let to_b = efapoll::endpoint::PeerId(0);
    for head in [1u64, 24, 100, 9000] {
        for body in [1u64, 5000, 300_000] {
            let total = head + body;
            for cut in [1, head, (head + 7).min(total - 1)] {
                let (hs, bs) = (w.register(0, head), w.register(0, body));
                let dst = w.register(1, total);
                w.fill(0, &hs, head);
                w.fill(0, &bs, body + 1);
                w.fabric.set_capture(true);
                let spans = [span(&dst, 0, cut), span(&dst, cut, total - cut)];
                w.eps[1].recvv(&spans, None, 1).unwrap();
                w.eps[0].sendv_head(to_b, span(&hs, 0, head), span(&bs, 0, body), None, 1).unwrap();
                w.drive_until(100_000, |w| !w.done[0].is_empty() && !w.done[1].is_empty());
                let (sent, got) = (w.done[0].remove(0), w.done[1].remove(0));
                let what = format!("head {head} body {body} cut {cut}");
                assert_eq!(
                    (sent.status, got.status, got.len),
                    (Status::Ok, Status::Ok, total),
                    "{what}"
                );
                let mem = w.eps[1].mem(dst.id);
                assert!(mem[..head as usize] == w.eps[0].mem(hs.id)[..], "{what}: head");
                assert!(mem[head as usize..] == w.eps[0].mem(bs.id)[..], "{what}: body");
                let wire = w.fabric.take_capture();
                let read = wire.iter().any(|(_, _, p)| p[0] == PacketType::Eor.id());
                for (_, _, p) in
                    wire.iter().filter(|(_, _, p)| p[0] == PacketType::RuntReadMsgRtm.id())
                {
                    let Packet::Req(r, _) = Packet::parse(p).unwrap() else { panic!() };
                    assert_eq!(r.runt_length, head, "{what}");
                }
                // What a packet holds goes eagerly; the rest is read, its
                // head the runt.
                assert_eq!(read, total > 8000, "{what}");
                assert_eq!(count(&wire, PacketType::LongReadMsgRtm), 0, "{what}");
                assert_eq!(count(&wire, PacketType::RuntReadMsgRtm) > 0, read, "{what}");
            }
        }
    }
}

#[test]
fn a_head_runt_takes_nothing_from_the_runt_budget() {
    // A head message the receiver has not taken holds its runt; a message
    // sent behind it still finds the whole budget.
    let runt = 64 << 10;
    let mut w = ready(sim(22, true, true), Config { runt_size: runt, ..quick() });
    let to_b = efapoll::endpoint::PeerId(0);
    let len = 1 << 20;
    let (head, src) = (w.register(0, 24), w.register(0, len));
    w.fabric.set_capture(true);
    w.eps[0].sendv_head(to_b, span(&head, 0, 24), span(&src, 0, len), None, 1).unwrap();
    w.eps[0].send(to_b, span(&src, 0, len), 2).unwrap();
    w.settle();
    let wire = w.fabric.take_capture();
    let runts: Vec<u64> = wire
        .iter()
        .filter(|(_, _, p)| p[0] == PacketType::RuntReadMsgRtm.id())
        .map(|(_, _, p)| match Packet::parse(p).unwrap() {
            Packet::Req(r, _) => r.runt_length,
            _ => unreachable!(),
        })
        .collect();
    // The fabric reorders: the head's one REQ, and the budget's whole
    // runt (REQs of the one message behind it).
    assert_eq!(runts.iter().filter(|&&r| r == 24).count(), 1, "{runts:?}");
    assert!(runts.iter().all(|&r| r == 24 || r == runt), "{runts:?}");
    assert!(runts.len() >= 2, "{runts:?}");
}

#[test]
fn a_head_runt_the_receiver_cannot_read_goes_on_by_long_cts() {
    let mut w = ready(sim(23, true, true), Config { runt_size: 64 << 10, ..quick() });
    w.fabric.set_capture(true);
    let to_b = efapoll::endpoint::PeerId(0);
    let len = 2 << 20;
    let (head, src) = (w.register(0, 24), w.register(0, len));
    let (hd, dst) = (w.register(1, 24), w.register(1, len));
    w.fill(0, &head, 1);
    w.fill(0, &src, 2);
    let b = w.eps[1].addr();
    w.fabric.fail_registrations(&b, 1);
    w.eps[1].recvv(&[span(&hd, 0, 24), span(&dst, 0, len)], None, 1).unwrap();
    w.eps[0].sendv_head(to_b, span(&head, 0, 24), span(&src, 0, len), None, 1).unwrap();
    w.drive_until(100_000, |w| w.done[0].len() == 1 && w.done[1].len() == 1);
    assert_eq!((w.done[0][0].status, w.done[1][0].status), (Status::Ok, Status::Ok));
    assert!(w.eps[1].mem(hd.id) == w.eps[0].mem(head.id), "head byte-exact");
    assert!(w.eps[1].mem(dst.id) == w.eps[0].mem(src.id), "body byte-exact after the fallback");
    let wire = w.fabric.take_capture();
    assert_eq!(count(&wire, PacketType::ReadNack), 1);
    the_read_nack_retry(&wire, PacketType::LongCtsMsgRtm);
    // The budget is whole again: the next message runts all of it.
    w.fabric.set_capture(true);
    w.eps[0].send(to_b, span(&src, 0, len), 2).unwrap();
    w.settle();
    let wire = w.fabric.take_capture();
    let first = wire.iter().find(|(_, _, p)| p[0] == PacketType::RuntReadMsgRtm.id()).unwrap();
    let Packet::Req(r, _) = Packet::parse(&first.2).unwrap() else { panic!() };
    assert_eq!(r.runt_length, 64 << 10);
}

#[test]
fn unexpected_long_read_messages_are_read_once_matched() {
    let mut w = ready(sim(4, true, true), quick());
    let len = 3 << 20;
    let src = w.register(0, len);
    let dst = w.register(1, len);
    w.fill(0, &src, 8);
    w.eps[0].tsend(efapoll::endpoint::PeerId(0), span(&src, 0, len), 6, 1).unwrap();
    w.settle();
    assert!(w.done[0].is_empty(), "the sender waits for the EOR");
    w.eps[1]
        .trecv(span(&dst, 0, len / 2), efapoll::endpoint::TagMatch { tag: 6, ignore: 0 }, None, 2)
        .unwrap();
    w.drive_until(100_000, |w| w.done[0].len() == 1 && w.done[1].len() == 1);
    assert_eq!(w.done[1][0].status, Status::Truncated { olen: len });
    assert_eq!(
        &w.eps[1].mem(dst.id)[..len as usize / 2],
        &w.eps[0].mem(src.id)[..len as usize / 2]
    );
}

#[test]
fn read_nack_falls_back_to_long_cts_without_data() {
    for runt in [0u64, 307_200] {
        let cfg = Config { runt_size: runt, ..quick() };
        let mut w = ready(sim(9, true, true), cfg);
        w.fabric.set_capture(true);
        let len = 2 << 20;
        let src = w.register(0, len);
        let dst = w.register(1, len);
        w.fill(0, &src, 1);
        // The receiver's next attempt to prepare its buffer for RDMA fails.
        let b = w.eps[1].addr();
        w.fabric.fail_registrations(&b, 1);
        w.eps[1].recv(span(&dst, 0, len), None, 1).unwrap();
        w.eps[0].send(efapoll::endpoint::PeerId(0), span(&src, 0, len), 1).unwrap();
        w.drive_until(100_000, |w| w.done[0].len() == 1 && w.done[1].len() == 1);
        assert_eq!(w.done[1][0].status, Status::Ok);
        assert!(
            w.eps[1].mem(dst.id) == w.eps[0].mem(src.id),
            "runt {runt}: byte-exact after the fallback"
        );
        assert_eq!(w.eps[1].counters().read_nacks, 1);
        let wire = w.fabric.take_capture();
        assert_eq!(wire.iter().filter(|(_, _, p)| p[0] == PacketType::ReadNack.id()).count(), 1);
        the_read_nack_retry(&wire, PacketType::LongCtsMsgRtm);
        assert!(
            wire.iter().all(|(_, _, p)| p[0] != PacketType::Eor.id()),
            "no EOR: long-CTS finished it"
        );
    }
}

#[test]
fn a_long_read_write_the_target_cannot_read_falls_back_to_a_long_cts_write() {
    for dc in [false, true] {
        let cfg = Config { delivery_complete: dc, ..quick() };
        // Device read but no device write: a large write is a LONGREAD_RTW.
        let mut w = ready(sim(11, true, false), cfg);
        w.fabric.set_capture(true);
        let len = 1 << 20;
        let src = w.register(0, len);
        let target = w.register(1, len + 64);
        w.fill(0, &src, 3);
        // The target's next attempt to prepare its memory for RDMA fails.
        let b = w.eps[1].addr();
        w.fabric.fail_registrations(&b, 1);
        w.eps[0]
            .write(efapoll::endpoint::PeerId(0), span(&src, 0, len), iov(&target, 64, len), 7)
            .unwrap();
        w.drive_until(100_000, |w| !w.done[0].is_empty());
        assert_eq!((w.done[0][0].op, w.done[0][0].ctx), (Op::Write, 7));
        assert_eq!(w.done[0][0].status, Status::Ok, "dc {dc}");
        w.settle();
        assert!(
            w.eps[1].mem(target.id)[64..] == w.eps[0].mem(src.id)[..],
            "dc {dc}: byte-exact after the fallback"
        );
        assert!(w.eps[1].mem(target.id)[..64].iter().all(|b| *b == 0), "nothing before it");
        assert_eq!(w.eps[1].counters().read_nacks, 1);
        let wire = w.fabric.take_capture();
        let count = |t: PacketType| wire.iter().filter(|(_, _, p)| p[0] == t.id()).count();
        assert_eq!(count(PacketType::LongReadRtw), 1);
        assert_eq!(count(PacketType::ReadNack), 1);
        let retry_type = if dc { PacketType::DcLongCtsRtw } else { PacketType::LongCtsRtw };
        the_read_nack_retry(&wire, retry_type);
        assert!(count(PacketType::CtsData) >= (len / 8192) as usize, "the data came by CTSDATA");
        assert_eq!(count(PacketType::Eor), 0, "no EOR: long-CTS finished it");
        assert_eq!(count(PacketType::Receipt), dc as usize);
        // Nothing dropped: the target took the flagged RTW as a new write.
        assert_eq!(w.eps[0].counters().drops_total() + w.eps[1].counters().drops_total(), 0);
    }
}

#[test]
fn a_receipt_for_a_message_that_ends_with_eor_is_dropped() {
    let cfg = Config { delivery_complete: true, runt_size: 0, ..quick() };
    let mut w = ready(sim(5, true, false), cfg);
    w.fabric.set_capture(true);
    let len = 2 << 20;
    let src = w.register(0, len);
    let dst = w.register(1, len);
    w.fill(0, &src, 4);
    // No receive posted: the message waits, unread, at the receiver.
    w.eps[0].send(efapoll::endpoint::PeerId(0), span(&src, 0, len), 1).unwrap();
    w.settle();
    let wire = w.fabric.take_capture();
    let req = wire.iter().find(|(_, _, p)| p[0] == PacketType::LongReadMsgRtm.id());
    let Packet::Req(r, _) = Packet::parse(&req.expect("a long-read REQ").2).unwrap() else {
        panic!()
    };
    // A RECEIPT naming it, as from the receiver: not how a read ends.
    let (a, b) = (w.eps[0].addr(), w.eps[1].addr());
    let receipt = ReceiptRepr {
        flags: PktFlags::empty(),
        send_id: r.send_id,
        msg_id: r.msg_id,
        connid: Some(b.connid),
    };
    let mut pkt = [0u8; 64];
    let n = receipt.emit(&mut pkt);
    w.fabric.inject(&a, b.qpn, &pkt[..n]);
    w.settle();
    assert!(w.done[0].is_empty(), "the send waits for its EOR");
    assert_eq!(w.eps[0].counters().drops(DropReason::StaleId), 1);
    w.eps[1].recv(span(&dst, 0, len), None, 1).unwrap();
    w.drive_until(100_000, |w| w.done[0].len() == 1 && w.done[1].len() == 1);
    assert!(w.done.iter().flatten().all(|c| c.status == Status::Ok));
    assert!(w.eps[1].mem(dst.id) == w.eps[0].mem(src.id), "byte-exact");
}

#[test]
fn delivery_complete_completes_strictly_after_delivery() {
    for &len in &[64u64, 20_000, 200_000, 2 << 20] {
        let cfg = Config { delivery_complete: true, ..quick() };
        let mut w = ready(sim(len, true, true), cfg);
        w.fabric.set_capture(true);
        let src = w.register(0, len);
        let dst = w.register(1, len);
        w.fill(0, &src, 5);
        w.eps[0].send(efapoll::endpoint::PeerId(0), span(&src, 0, len), 1).unwrap();
        // Unexpected at the receiver: the sender must not complete.
        w.settle();
        assert!(w.done[0].is_empty(), "len {len}: no completion before delivery");
        w.eps[1].recv(span(&dst, 0, len), None, 1).unwrap();
        // Step one endpoint at a time: the receiver's completion comes
        // first, with the data in place, then the sender's.
        let mut order = Vec::new();
        for _ in 0..100_000 {
            for i in [1, 0] {
                w.eps[i].progress();
                while let Some(c) = w.eps[i].poll_cq() {
                    if i == 0 {
                        assert!(
                            w.eps[1].mem(dst.id) == w.eps[0].mem(src.id),
                            "data delivered before the sender's completion"
                        );
                    }
                    order.push(i);
                    w.done[i].push(c);
                }
            }
            if order.len() == 2 {
                break;
            }
        }
        assert_eq!(order, [1, 0], "len {len}");
        let wire = w.fabric.take_capture();
        let receipts = wire.iter().filter(|(_, _, p)| p[0] == PacketType::Receipt.id()).count();
        let eors = wire.iter().filter(|(_, _, p)| p[0] == PacketType::Eor.id()).count();
        assert_eq!(receipts + eors, 1, "len {len}: one RECEIPT (or EOR for long-read)");
    }
}

/// Every way a remote iov can be wrong, for every one-sided path: target
/// memory unchanged, requester error completion, responder counter.
#[test]
fn protection_violations_touch_nothing_and_fail_the_requester() {
    // (rdma_read, rdma_write, delivery_complete, len): direct RDMA,
    // emulated eager (DC) / long-CTS / long-read writes, emulated reads.
    let paths = [
        (true, true, false, 4096u64),
        (false, false, true, 100),
        (false, false, false, 200_000),
        (true, false, false, 200_000),
        (false, false, false, 100),
    ];
    for (rdma_read, rdma_write, dc, len) in paths {
        let cfg = Config { delivery_complete: dc, ..quick() };
        let mut w = ready(sim(len, rdma_read, rdma_write), cfg);
        let to_b = efapoll::endpoint::PeerId(0);
        let src = w.register(0, len);
        let target = w.register(1, len);
        let read_only = w.eps[1].register(len, Access::REMOTE_READ).unwrap();
        let write_only = w.eps[1].register(len, Access::REMOTE_WRITE).unwrap();
        w.fill(1, &target, 11);
        w.fill(1, &read_only, 12);
        w.fill(1, &write_only, 13);
        let sums =
            |w: &World| [target, read_only, write_only].map(|m| checksum(&w.eps[1].mem(m.id)));
        let before = sums(&w);
        let bad = [
            // Unknown key, below the region, past its end, wrapping.
            RmaIov { key: target.key ^ 0x5555_0000_0000, ..iov(&target, 0, len) },
            RmaIov { addr: target.addr - 1, ..iov(&target, 0, len) },
            iov(&target, 1, len),
            RmaIov { addr: u64::MAX - len / 2, len, key: target.key },
        ];
        let mut n = 0;
        for remote in bad {
            w.eps[0].write(to_b, span(&src, 0, len), remote, n).unwrap();
            w.eps[0].read(to_b, span(&src, 0, len), remote, n + 100).unwrap();
            n += 1;
        }
        // Missing rights: write to read-only memory, read write-only memory.
        w.eps[0].write(to_b, span(&src, 0, len), iov(&read_only, 0, len), 50).unwrap();
        w.eps[0].read(to_b, span(&src, 0, len), iov(&write_only, 0, len), 150).unwrap();
        let expected = 2 * n as usize + 2;
        w.drive_for(Duration::from_secs(10), |w| w.done[0].len() == expected);
        let eager_write_without_dc = !rdma_write && !dc && len < 8000;
        for c in &w.done[0] {
            if eager_write_without_dc && c.op == Op::Write {
                // Transmit complete: the data left; nothing comes back.
                continue;
            }
            assert!(
                matches!(c.status, Status::RemoteAccess | Status::Timeout),
                "{:?} on path {rdma_read}/{rdma_write}/{dc}/{len}",
                c
            );
        }
        assert_eq!(sums(&w), before, "target memory unchanged");
        // The responder counts what it refused: the endpoint for emulated
        // operations, the device for direct RDMA.
        let per_kind = n + 1;
        let emulated = per_kind * (!rdma_write as u64 + !rdma_read as u64);
        let direct = per_kind * (rdma_write as u64 + rdma_read as u64);
        let b = w.eps[1].addr();
        assert_eq!(
            w.eps[1].counters().drops(DropReason::RemoteAccess),
            emulated,
            "endpoint counted"
        );
        assert_eq!(w.fabric.stats(&b).remote_access_errors, direct, "device counted");
    }
}

#[test]
fn a_read_of_a_vanished_peer_times_out_on_virtual_time() {
    // An hour's timeout: on the wall clock this test could not finish.
    let cfg = Config { response_timeout: Duration::from_secs(3600), ..quick() };
    let mut w = ready(sim(1, false, false), cfg);
    let dst = w.register(0, 64);
    let target = w.register(1, 64);
    let b = w.eps[1].addr();
    w.fabric.kill(&b);
    w.eps[0].read(efapoll::endpoint::PeerId(0), span(&dst, 0, 64), iov(&target, 0, 64), 9).unwrap();
    // A minute short of the deadline, however many rounds: still waiting.
    w.fabric.advance(Duration::from_secs(3540));
    for _ in 0..1000 {
        w.step();
    }
    assert!(w.done[0].is_empty(), "not before its deadline: {:?}", w.done[0]);
    let start = std::time::Instant::now();
    w.drive_for(Duration::from_secs(120), |w| !w.done[0].is_empty());
    assert_eq!(w.done[0][0].status, Status::Timeout);
    assert_eq!(w.eps[0].counters().timeouts, 1);
    assert!(w.fabric.now_ns() >= 3600 * 1_000_000_000, "timed out on the virtual clock");
    assert!(start.elapsed() < Duration::from_secs(60), "and not on the wall clock");
}

#[test]
fn one_sided_operations_wait_for_the_handshake() {
    let mut w = World::pair(sim(1, true, true), Config::default());
    let to_b = w.connect(0, 1);
    let src = w.register(0, 8);
    let target = w.register(1, 8);
    assert_eq!(
        w.eps[0].write(to_b, span(&src, 0, 8), iov(&target, 0, 8), 1),
        Err(efapoll::endpoint::Error::Again)
    );
    w.drive_until(100, |w| w.eps[0].peer_handshake_received(to_b));
    w.eps[0].write(to_b, span(&src, 0, 8), iov(&target, 0, 8), 1).unwrap();
    w.drive_until(100, |w| w.done[0].len() == 1);
    assert_eq!(w.done[0][0].status, Status::Ok);
    let _ = pattern(0, 0);
}

#[test]
fn on_host_reads_every_message_past_one_packet_and_falls_back_without_read() {
    // Just past one packet, a medium message and a long-CTS one by the
    // defaults.
    for len in [8_200u64, 64 << 10, 200 << 10] {
        let packets =
            if len <= 64 << 10 { PacketType::MediumMsgRtm } else { PacketType::LongCtsMsgRtm };
        for (cfg, read, want) in [
            (Config::on_host(), true, PacketType::LongReadMsgRtm),
            (Config::on_host(), false, packets),
            (Config::default(), true, packets),
        ] {
            let cfg = Config { handshake_on_insert: true, ..cfg };
            let mut w = ready(sim(len, read, read), cfg);
            w.fabric.set_capture(true);
            let src = w.register(0, len);
            let dst = w.register(1, len);
            w.fill(0, &src, len);
            w.eps[1].recv(span(&dst, 0, len), None, 1).unwrap();
            w.eps[0].send(efapoll::endpoint::PeerId(0), span(&src, 0, len), 1).unwrap();
            w.drive_until(100_000, |w| w.done[0].len() == 1 && w.done[1].len() == 1);
            assert_eq!((w.done[1][0].status, w.done[1][0].len), (Status::Ok, len));
            assert!(w.eps[1].mem(dst.id) == w.eps[0].mem(src.id), "len {len}: byte-exact");
            let wire = w.fabric.take_capture();
            let first = wire.iter().find(|(f, _, p)| *f == 0 && p[0] != PacketType::Handshake.id());
            assert_eq!(first.map(|(_, _, p)| p[0]), Some(want.id()), "len {len} read {read}");
            let runts = wire.iter().filter(|(_, _, p)| p[0] == PacketType::RuntReadMsgRtm.id());
            assert_eq!(runts.count(), 0, "on_host sends no runt");
        }
    }
}

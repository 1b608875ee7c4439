//! Hostile and malformed packets injected mid-transfer are counted and
//! dropped, and the transfers in flight complete intact.

use crate::common;

use common::{Mem, World, span};
use efapoll::device::fault::Faults;
use efapoll::device::sim::SimConfig;
use efapoll::endpoint::{Config, DropReason, Status};
use efapoll::wire::{CtsDataRepr, CtsRepr, Packet, PacketType, PktFlags, ReqRepr, golden};

const LONG: u64 = 4 << 20;

/// Starts a long-CTS transfer and a stream of eager messages from 0 to 1,
/// and steps until the receiver's first CTS is on the wire.
fn start(seed: u64) -> (World, efapoll::device::Mr, efapoll::device::Mr, CtsRepr) {
    let mut w = World::pair(
        SimConfig { seed, faults: Faults::reorder(seed, 8), ..SimConfig::default() },
        Config::default(),
    );
    w.fabric.set_capture(true);
    let to_b = w.connect(0, 1);
    let src = w.register(0, LONG + 64 * 20);
    let dst = w.register(1, LONG + 64 * 20);
    w.fill(0, &src, seed);
    w.eps[1].recv(span(&dst, 0, LONG), None, 100).unwrap();
    w.eps[0].send(to_b, span(&src, 0, LONG), 100).unwrap();
    for i in 0..20 {
        let at = LONG + 64 * i;
        w.eps[1].recv(span(&dst, at, 64), None, i).unwrap();
        w.eps[0].send(to_b, span(&src, at, 64), i).unwrap();
    }
    let mut cts = None;
    for _ in 0..1000 {
        w.step();
        for (_, _, p) in w.fabric.take_capture() {
            if let Ok(Packet::Cts(c)) = Packet::parse(&p) {
                cts.get_or_insert(c);
            }
        }
        if cts.is_some() {
            break;
        }
    }
    (w, src, dst, cts.expect("a CTS went out"))
}

fn finish(w: &mut World, src: &efapoll::device::Mr, dst: &efapoll::device::Mr) {
    w.drive_until(1_000_000, |w| w.done[0].len() == 21 && w.done[1].len() == 21);
    assert!(w.done.iter().flatten().all(|c| c.status == Status::Ok));
    assert_eq!(w.eps[1].mem(dst.id), w.eps[0].mem(src.id), "every byte intact");
}

#[test]
fn forged_ids_and_out_of_range_data_are_dropped() {
    for seed in 1..=5 {
        let (mut w, src, dst, cts) = start(seed);
        let (a, b) = (w.eps[0].addr(), w.eps[1].addr());
        let mut pkt = [0u8; 64];
        // CTSDATA naming no live receive: a forged generation, then an
        // index past the slab.
        for recv_id in [cts.recv_id ^ 0x0001_0000, 0xffff] {
            let d = CtsDataRepr {
                flags: PktFlags::empty(),
                recv_id,
                seg_length: 8,
                seg_offset: 0,
                connid: None,
            };
            let n = d.emit(&mut pkt);
            w.fabric.inject(&b, a.qpn, &pkt[..n + 8]);
        }
        // CTSDATA for the real receive, beyond the message, and with an
        // offset that overflows.
        for seg_offset in [LONG, LONG - 4, u64::MAX - 2] {
            let d = CtsDataRepr {
                flags: PktFlags::empty(),
                recv_id: cts.recv_id,
                seg_length: 8,
                seg_offset,
                connid: None,
            };
            let n = d.emit(&mut pkt);
            w.fabric.inject(&b, a.qpn, &pkt[..n + 8]);
        }
        // A CTS naming no live send.
        let forged = CtsRepr { send_id: cts.send_id ^ 0x0003_0000, ..cts };
        let n = forged.emit(&mut pkt);
        w.fabric.inject(&a, b.qpn, &pkt[..n]);
        // A CTS granting nothing.
        let zero = CtsRepr { recv_length: 0, ..cts };
        let n = zero.emit(&mut pkt);
        w.fabric.inject(&a, b.qpn, &pkt[..n]);
        finish(&mut w, &src, &dst);
        let (ca, cb) = (w.eps[0].counters(), w.eps[1].counters());
        assert_eq!(cb.drops(DropReason::StaleId), 2, "seed {seed}");
        assert_eq!(cb.drops(DropReason::SegmentOutOfRange), 3, "seed {seed}");
        assert_eq!(ca.drops(DropReason::StaleId), 1, "seed {seed}");
        assert_eq!(ca.drops(DropReason::Invalid), 1, "seed {seed}");
    }
}

#[test]
fn a_duplicate_cts_does_not_disturb_the_transfer() {
    for seed in 1..=5 {
        let (mut w, src, dst, cts) = start(seed);
        let (a, b) = (w.eps[0].addr(), w.eps[1].addr());
        let mut pkt = [0u8; 24];
        let n = cts.emit(&mut pkt);
        w.fabric.inject(&a, b.qpn, &pkt[..n]);
        finish(&mut w, &src, &dst);
        // Replayed after the transfer, it names a finished send.
        w.fabric.inject(&a, b.qpn, &pkt[..n]);
        w.settle();
        assert!(w.eps[0].counters().drops(DropReason::StaleId) >= 1, "seed {seed}");
    }
}

#[test]
fn malformed_duplicate_and_unknown_packets_are_dropped() {
    let (mut w, src, dst, _) = start(7);
    let (a, b) = (w.eps[0].addr(), w.eps[1].addr());
    // A HANDSHAKE claiming 2^32 - 4 extra_info words.
    let mut hs = golden::HANDSHAKE.to_vec();
    hs[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    w.fabric.inject(&b, a.qpn, &hs);
    // Version 5, an unassigned type, a cut-short REQ.
    let mut v5 = golden::EAGER_TAGRTM.to_vec();
    v5[1] = 5;
    w.fabric.inject(&b, a.qpn, &v5);
    w.fabric.inject(&b, a.qpn, &[200, 4, 0, 0, 1, 2, 3, 4]);
    w.fabric.inject(&b, a.qpn, &golden::LONGCTS_MSGRTM[..20]);
    // From a QPN nobody inserted, without a raw address.
    w.fabric.inject(&b, 999, golden::EAGER_TAGRTM);
    // An unknown sender whose raw address names another QPN.
    w.fabric.inject(&b, 998, golden::EAGER_MSGRTM);
    finish(&mut w, &src, &dst);
    // A replayed eager message (msg_id 1, delivered) is a duplicate.
    let mut r = ReqRepr::new(PacketType::EagerMsgRtm);
    r.msg_id = 1;
    r.connid = Some(a.connid);
    let mut pkt = [0u8; 32];
    let n = r.emit(&mut pkt);
    w.fabric.inject(&b, a.qpn, &pkt[..n + 4]);
    w.settle();
    let c = w.eps[1].counters();
    assert_eq!(c.drops(DropReason::Malformed), 4);
    assert_eq!(c.drops(DropReason::UnknownSender), 1);
    assert_eq!(c.drops(DropReason::Invalid), 1);
    assert_eq!(c.drops(DropReason::MsgIdOutOfWindow), 1);
    assert_eq!(w.done[1].len(), 21, "nothing extra delivered");
}

#[test]
fn a_restarted_peer_with_the_same_qpn_is_not_the_old_peer() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let src = w.register(0, 64);
    let dst = w.register(1, 64);
    w.eps[1].recv(span(&dst, 0, 8), None, 1).unwrap();
    w.eps[0].send(to_b, span(&src, 0, 8), 1).unwrap();
    w.drive_until(100, |w| w.done[1].len() == 1);
    w.settle();
    let old_b = w.eps[1].addr();
    // B's process dies; a new one gets the same QPN and a new connid.
    let dev = w.fabric.restart(&old_b);
    w.eps[1] = efapoll::endpoint::Endpoint::new(dev, Config::default()).unwrap();
    let new_b = w.eps[1].addr();
    assert_eq!((new_b.gid, new_b.qpn), (old_b.gid, old_b.qpn));
    // Its packets without a raw address carry its connid: dropped.
    let cts = CtsRepr {
        connid: Some(new_b.connid),
        send_id: 0,
        recv_id: 0,
        recv_length: 8,
        ..CtsRepr::default()
    };
    let mut pkt = [0u8; 24];
    cts.emit(&mut pkt);
    w.fabric.inject(&w.eps[0].addr(), new_b.qpn, &pkt);
    w.settle();
    assert_eq!(w.eps[0].counters().drops(DropReason::ConnidMismatch), 1);
    // Its REQs introduce it with its raw address: a new peer, not old B.
    let to_a = w.connect(1, 0);
    let src_b = w.register(1, 8);
    let dst_a = w.register(0, 8);
    w.eps[0].recv(span(&dst_a, 0, 8), None, 2).unwrap();
    w.eps[1].send(to_a, span(&src_b, 0, 8), 2).unwrap();
    w.drive_until(100, |w| w.done[0].iter().any(|c| c.ctx == 2));
    let from = w.done[0].iter().find(|c| c.ctx == 2).unwrap().peer.unwrap();
    assert_ne!(from, to_b);
    assert_eq!(w.eps[0].peer_addr(from), Some(new_b));
}

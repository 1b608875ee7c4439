use super::*;
use crate::device::HeldBufs;

fn small() -> ShmConfig {
    ShmConfig { bufs: 256, tx_depth: 64, rx_depth: 64, ring_slots: 64, ..ShmConfig::default() }
}

fn pair(cfg: ShmConfig) -> (ShmDevice, ShmDevice) {
    (ShmDevice::new(cfg).unwrap(), ShmDevice::new(cfg).unwrap())
}

fn send(dev: &mut ShmDevice, ah: Ah, buf: BufId, bytes: &[u8], wr_id: u64) {
    dev.held_mut(buf)[..bytes.len()].copy_from_slice(bytes);
    let wr = SendWr { ah, buf, len: bytes.len() as u32, data: None, wr_id };
    assert_eq!(dev.post_send(&[wr]), 1);
}

fn poll_all(dev: &mut ShmDevice) -> Vec<Cqe> {
    let mut out = [Cqe::default(); 8];
    let mut all = Vec::new();
    loop {
        let n = dev.poll(&mut out);
        if n == 0 {
            return all;
        }
        all.extend_from_slice(&out[..n]);
    }
}

/// Polls until `n` completions arrived or a generous deadline passed.
fn poll_n(dev: &mut ShmDevice, n: usize) -> Vec<Cqe> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = [Cqe::default(); 8];
    let mut all = Vec::new();
    while all.len() < n && Instant::now() < deadline {
        let got = dev.poll(&mut out);
        all.extend_from_slice(&out[..got]);
    }
    all
}

/// A lane of `to`'s granted to `from`'s address, as `to`'s rendezvous
/// grants one, and mapped: for tests that write slots by hand, as a
/// hostile sender of our user could.
fn hand_lane(to: &ShmDevice, from: &ShmDevice) -> Lane {
    let (t, f) = (to.addr(), from.addr());
    let answer = rendezvous::hello(t.qpn, t.connid, f.qpn, f.connid).unwrap();
    assert_eq!(answer.status, rendezvous::OK);
    let map = Mapping::from_fd(answer.fd.unwrap().as_fd(), 0, true).unwrap();
    Lane::attach_peer(map).unwrap()
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(7)) as u8).collect()
}

#[test]
fn every_packet_size_arrives_in_order_with_its_content() {
    let (mut a, mut b) = pair(small());
    let ah = a.insert_addr(&b.addr()).unwrap();
    let mtu = a.caps().mtu;
    assert_eq!(mtu, 8192);
    let mut next_send = 1;
    let mut next_recv = 1;
    let mut sent_done = 0;
    b.post_recv(&(0..64).map(BufId).collect::<Vec<_>>());
    let mut out = [Cqe::default(); 32];
    while next_recv <= mtu {
        // A burst of up to 16 sizes, then drain both sides.
        let mut wrs = Vec::new();
        while next_send <= mtu && wrs.len() < 16 && a.tx_outstanding() + wrs.len() < 64 {
            let buf = BufId((next_send % 200) as u32);
            if wrs.iter().any(|w: &SendWr| w.buf == buf) {
                break;
            }
            a.held_mut(buf)[..next_send].copy_from_slice(&pattern(next_send, next_send));
            wrs.push(SendWr {
                ah,
                buf,
                len: next_send as u32,
                data: None,
                wr_id: next_send as u64,
            });
            next_send += 1;
        }
        assert_eq!(a.post_send(&wrs), wrs.len());
        let n = b.poll(&mut out);
        for c in &out[..n] {
            assert_eq!((c.op, c.status), (CqOp::Recv, CqStatus::Ok));
            assert_eq!(c.len as usize, next_recv, "in order");
            assert_eq!(
                b.held(BufId::from_wr_id(c.wr_id))[..next_recv],
                pattern(next_recv, next_recv)[..]
            );
            assert_eq!(b.post_recv(&[BufId::from_wr_id(c.wr_id)]), 1);
            next_recv += 1;
        }
        let n = a.poll(&mut out);
        for c in &out[..n] {
            assert_eq!((c.op, c.status), (CqOp::Send, CqStatus::Ok));
            sent_done += 1;
            assert_eq!(c.wr_id, sent_done, "send completions in order");
        }
    }
    sent_done += poll_all(&mut a).len() as u64;
    assert_eq!(sent_done as usize, mtu);
    assert_eq!(a.stats().sent, mtu as u64);
    assert_eq!(b.stats().delivered, mtu as u64);
    assert_eq!(a.tx_outstanding(), 0);
}

#[test]
fn delivery_reports_unknown_sender_until_inserted() {
    let (mut a, mut b) = pair(small());
    let ah_b = a.insert_addr(&b.addr()).unwrap();
    assert_eq!(a.insert_addr(&b.addr()).unwrap(), ah_b, "same address, same handle");
    assert_eq!(b.post_recv(&[BufId(10), BufId(11)]), 2);
    send(&mut a, ah_b, BufId(0), b"hello", 7);
    let got = poll_all(&mut b);
    assert_eq!(got.len(), 1);
    // The newest posted buffer first: the one still in cache.
    let rx = BufId::from_wr_id(got[0].wr_id);
    assert_eq!((got[0].op, rx, got[0].len), (CqOp::Recv, BufId(11), 5));
    assert_eq!(got[0].src, Source::Unknown { qpn: a.addr().qpn });
    assert_eq!(&b.held(rx)[..5], b"hello");
    assert_eq!(poll_all(&mut a), [Cqe { op: CqOp::Send, wr_id: 7, ..Cqe::default() }]);

    let ah_a = b.insert_addr(&a.addr()).unwrap();
    send(&mut a, ah_b, BufId(1), b"again", 8);
    assert_eq!(poll_all(&mut b)[0].src, Source::Known(ah_a));
    b.remove_addr(ah_a);
    assert_eq!(b.post_recv(&[BufId(12)]), 1);
    send(&mut a, ah_b, BufId(2), b"third", 9);
    assert_eq!(poll_all(&mut b)[0].src, Source::Unknown { qpn: a.addr().qpn });

    // The same QPN with another connid is another sender.
    let stranger = RawAddr { connid: a.addr().connid ^ 1, ..a.addr() };
    assert_eq!(b.insert_addr(&stranger), Err(DeviceError::BadAddress));
    // A removed handle no longer sends.
    a.remove_addr(ah_b);
    send(&mut a, ah_b, BufId(3), b"gone", 10);
    assert_eq!(poll_all(&mut a)[0].status, CqStatus::LocalError);
}

#[test]
fn addresses_that_name_no_live_segment_are_refused() {
    let (mut a, b) = pair(small());
    let other_host = RawAddr { gid: [1; 16], ..b.addr() };
    assert_eq!(a.insert_addr(&other_host), Err(DeviceError::BadAddress));
    let wrong_connid = RawAddr { connid: b.addr().connid.wrapping_add(1), ..b.addr() };
    assert_eq!(a.insert_addr(&wrong_connid), Err(DeviceError::BadAddress));
    let gone = b.addr();
    drop(b);
    assert_eq!(a.insert_addr(&gone), Err(DeviceError::BadAddress));
    assert_ne!(a.addr().qpn, gone.qpn);
}

#[test]
fn a_receiver_that_stops_polling_back_pressures_the_sender() {
    // The TX queue fills first.
    let cfg = ShmConfig { tx_depth: 8, ..small() };
    let (mut a, mut b) = pair(cfg);
    let ah = a.insert_addr(&b.addr()).unwrap();
    b.post_recv(&(0..64).map(BufId).collect::<Vec<_>>());
    let wrs: Vec<SendWr> = (0..12)
        .map(|i| SendWr { ah, buf: BufId(i), len: 4, data: None, wr_id: i as u64 })
        .collect();
    assert_eq!(a.post_send(&wrs), 8);
    assert!(poll_all(&mut a).is_empty(), "nothing completes before the receiver polls");
    assert_eq!(a.post_send(&wrs[8..]), 0);
    assert_eq!(poll_all(&mut b).len(), 8);
    assert_eq!(poll_all(&mut a).len(), 8);
    assert_eq!(a.post_send(&wrs[8..]), 4);

    // The ring fills first.
    let cfg = ShmConfig { tx_depth: 64, ring_slots: 8, ..small() };
    let (mut a, mut b) = pair(cfg);
    let ah = a.insert_addr(&b.addr()).unwrap();
    let wrs: Vec<SendWr> = (0..20)
        .map(|i| SendWr { ah, buf: BufId(i), len: 4, data: None, wr_id: i as u64 })
        .collect();
    assert_eq!(a.post_send(&wrs), 8, "a full ring takes fewer");
    assert_eq!(a.post_send(&wrs[8..]), 0);
    assert!(a.stats().ring_full >= 2);
    assert!(poll_all(&mut a).is_empty());
    b.post_recv(&[BufId(0), BufId(1), BufId(2)]);
    assert_eq!(poll_all(&mut b).len(), 3);
    assert_eq!(poll_all(&mut a).len(), 3);
    assert_eq!(a.post_send(&wrs[8..]), 3);
}

#[test]
fn no_posted_buffer_holds_packets_in_the_ring() {
    let (mut a, mut b) = pair(small());
    let ah = a.insert_addr(&b.addr()).unwrap();
    send(&mut a, ah, BufId(0), b"x", 0);
    send(&mut a, ah, BufId(1), b"y", 1);
    assert!(poll_all(&mut b).is_empty());
    assert!(b.stats().rnr_waits >= 1);
    assert!(poll_all(&mut a).is_empty(), "no send completes before delivery");
    b.post_recv(&[BufId(5)]);
    let got = poll_all(&mut b);
    assert_eq!((got.len(), got[0].wr_id), (1, 5));
    assert_eq!(b.held(BufId(5))[0], b'x');
    assert_eq!(poll_all(&mut a).len(), 1);
    b.post_recv(&[BufId(6)]);
    let got = poll_all(&mut b);
    assert_eq!(b.held(BufId::from_wr_id(got[0].wr_id))[0], b'y');
    assert_eq!(poll_all(&mut a)[0].wr_id, 1);
}

fn rdma(op: RdmaOp, ah: Ah, local: &Mr, remote: &Mr, len: u64, wr_id: u64) -> RdmaWr {
    RdmaWr {
        op,
        ah,
        local: local.id,
        local_offset: 0,
        len,
        remote_addr: remote.addr,
        remote_key: remote.key,
        wr_id,
    }
}

/// Posts `wrs` until every one is taken (or a generous deadline passed):
/// an operation on a region not mapped yet waits for its owner's answer.
fn post_rdma_all(dev: &mut ShmDevice, wrs: &[RdmaWr]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut taken = dev.post_rdma(wrs);
    while taken < wrs.len() && Instant::now() < deadline {
        taken += dev.post_rdma(&wrs[taken..]);
    }
    taken
}

#[test]
fn rdma_read_write_and_write_with_immediate() {
    let (mut a, mut b) = pair(small());
    let ah = a.insert_addr(&b.addr()).unwrap();
    let local = a.register(4096, Access::LOCAL).unwrap();
    let remote = b.register(4096, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap();
    assert!(b.region_vec(&remote).iter().all(|&x| x == 0), "registered memory is zeroed");
    b.write_region(remote.id, 0, &pattern(1, 4096));

    let rd = RdmaWr {
        local_offset: 100,
        remote_addr: remote.addr_at(200),
        ..rdma(RdmaOp::Read, ah, &local, &remote, 1000, 1)
    };
    assert_eq!(post_rdma_all(&mut a, &[rd]), 1);
    assert_eq!(poll_all(&mut a), [Cqe { op: CqOp::Read, wr_id: 1, ..Cqe::default() }]);
    assert_eq!(a.region_vec(&local)[100..1100], pattern(1, 4096)[200..1200]);

    a.write_region(local.id, 0, &pattern(2, 4096));
    let wr = rdma(RdmaOp::Write { imm: None }, ah, &local, &remote, 4096, 2);
    assert_eq!(a.post_rdma(&[wr]), 1);
    assert_eq!(poll_all(&mut a)[0], Cqe { op: CqOp::Write, wr_id: 2, ..Cqe::default() });
    assert_eq!(b.region_vec(&remote), &pattern(2, 4096)[..]);
    assert!(poll_all(&mut b).is_empty(), "a plain write tells the target nothing");

    let ah_a = b.insert_addr(&a.addr()).unwrap();
    a.write_region(local.id, 0, b"12345678");
    let wr = rdma(RdmaOp::Write { imm: Some(42) }, ah, &local, &remote, 8, 3);
    assert_eq!(a.post_rdma(&[wr]), 1);
    assert_eq!(b.region_vec(&remote)[..8], *b"12345678");
    assert!(poll_all(&mut b).is_empty(), "the notice waits for a receive buffer");
    assert!(poll_all(&mut a).is_empty(), "the write completes when its notice is consumed");
    b.post_recv(&[BufId(3)]);
    let got = poll_all(&mut b);
    let want = Cqe {
        op: CqOp::RecvWriteImm,
        wr_id: 3,
        imm: 42,
        len: 8,
        src: Source::Known(ah_a),
        ..Cqe::default()
    };
    assert_eq!(got, [want]);
    assert_eq!(poll_all(&mut a), [Cqe { op: CqOp::Write, wr_id: 3, ..Cqe::default() }]);

    // Loopback: a device reaches its own region.
    let me = a.insert_addr(&a.addr()).unwrap();
    let own = a.register(64, Access::REMOTE_READ).unwrap();
    a.write_region(own.id, 0, &[7; 64]);
    let rd = RdmaWr { local_offset: 0, ..rdma(RdmaOp::Read, me, &local, &own, 64, 4) };
    assert_eq!(post_rdma_all(&mut a, &[rd]), 1);
    assert_eq!(poll_all(&mut a)[0].status, CqStatus::Ok);
    assert_eq!(a.region_vec(&local)[..64], [7; 64]);
}

#[test]
fn rdma_protection_violations_leave_the_target_untouched() {
    let (mut a, mut b) = pair(small());
    let ah = a.insert_addr(&b.addr()).unwrap();
    let local = a.register(64, Access::LOCAL).unwrap();
    a.write_region(local.id, 0, &[1; 64]);
    let ro = b.register(32, Access::REMOTE_READ).unwrap();
    let wo = b.register(32, Access::REMOTE_WRITE).unwrap();
    let none = b.register(32, Access::LOCAL).unwrap();
    let gone = b.register(32, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap();
    for mr in [ro, wo, none, gone] {
        b.write_region(mr.id, 0, &[9; 32]);
    }
    let w = |remote: &Mr, wr_id| rdma(RdmaOp::Write { imm: None }, ah, &local, remote, 16, wr_id);
    let r = |remote: &Mr, wr_id| rdma(RdmaOp::Read, ah, &local, remote, 16, wr_id);
    // Map `gone` while registered, so its cached mapping is what is refused.
    assert_eq!(post_rdma_all(&mut a, &[r(&gone, 0)]), 1);
    b.deregister(gone.id).unwrap();
    a.write_region(local.id, 0, &[1; 64]);
    let bad = [
        RdmaWr { remote_key: wo.key ^ 1, ..w(&wo, 1) },
        RdmaWr { remote_addr: wo.addr - 1, ..w(&wo, 2) },
        RdmaWr { remote_addr: wo.addr_at(17), ..w(&wo, 3) },
        RdmaWr { remote_addr: u64::MAX - 7, ..w(&wo, 4) },
        w(&ro, 5),
        r(&wo, 6),
        w(&none, 7),
        r(&none, 8),
        w(&gone, 9),
        RdmaWr { op: RdmaOp::Write { imm: Some(1) }, ..w(&ro, 10) },
        // Another peer's key is not this peer's.
        RdmaWr { remote_key: local.key, remote_addr: local.addr, ..r(&ro, 11) },
    ];
    assert_eq!(post_rdma_all(&mut a, &bad), bad.len());
    let done = poll_all(&mut a);
    assert_eq!(done[0], Cqe { op: CqOp::Read, wr_id: 0, ..Cqe::default() });
    for (c, wr) in done[1..].iter().zip(&bad) {
        assert_eq!((c.wr_id, c.status), (wr.wr_id, CqStatus::RemoteAccess));
    }
    assert_eq!(a.stats().remote_access_errors, bad.len() as u64);
    for mr in [ro, wo, none] {
        assert_eq!(b.region_vec(&mr), &[9; 32], "target untouched");
    }
    b.post_recv(&[BufId(0)]);
    assert!(poll_all(&mut b).is_empty(), "a refused write with immediate tells the target nothing");

    // Local mistakes are local errors.
    let local_bad = [
        RdmaWr { local_offset: 60, ..r(&ro, 20) },
        RdmaWr { len: u64::MAX, ..r(&ro, 21) },
        RdmaWr { local: MrId(99), ..r(&ro, 22) },
        RdmaWr { ah: Ah(99), ..r(&ro, 23) },
    ];
    assert_eq!(a.post_rdma(&local_bad), local_bad.len());
    assert!(poll_all(&mut a).iter().all(|c| c.status == CqStatus::LocalError));
    assert_eq!(a.region_vec(&local), &[1; 64]);
}

#[test]
fn a_closed_peer_fails_what_was_sent_to_it() {
    let (mut a, mut b) = pair(small());
    let ah = a.insert_addr(&b.addr()).unwrap();
    let remote = b.register(64, Access::REMOTE_READ).unwrap();
    let local = a.register(64, Access::LOCAL).unwrap();
    send(&mut a, ah, BufId(0), b"doomed", 1);
    send(&mut a, ah, BufId(1), b"doomed", 2);
    drop(b);
    let got = poll_n(&mut a, 2);
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|c| c.status == CqStatus::PeerUnreachable && c.op == CqOp::Send));
    send(&mut a, ah, BufId(2), b"late", 4);
    assert_eq!(poll_all(&mut a)[0].status, CqStatus::PeerUnreachable);
    let rd = rdma(RdmaOp::Read, ah, &local, &remote, 8, 5);
    assert_eq!(a.post_rdma(&[rd]), 1);
    assert_eq!(poll_all(&mut a)[0].status, CqStatus::PeerUnreachable);
    assert_eq!(a.tx_outstanding(), 0);
    assert_eq!(a.stats().peers_lost, 1);
}

#[test]
fn what_a_peer_consumed_before_closing_completes_as_delivered() {
    let (mut a, mut b) = pair(small());
    let ah = a.insert_addr(&b.addr()).unwrap();
    b.post_recv(&[BufId(100)]);
    send(&mut a, ah, BufId(0), b"delivered", 1);
    send(&mut a, ah, BufId(1), b"stranded", 2);
    // b takes the first packet (one buffer posted), then closes.
    assert_eq!(poll_n(&mut b, 1)[0].len, 9);
    drop(b);
    // The next send finds the peer closed before any poll reaped the
    // first: the first still completes as delivered, in order.
    send(&mut a, ah, BufId(2), b"late", 3);
    let got = poll_all(&mut a);
    let status: Vec<_> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        status,
        [(1, CqStatus::Ok), (2, CqStatus::PeerUnreachable), (3, CqStatus::PeerUnreachable)]
    );
}

#[test]
fn malformed_slots_are_dropped_and_counted() {
    let (a, mut b) = pair(small());
    // A hostile peer of our user takes a lane of b's and writes slots by
    // hand.
    let lane = hand_lane(&b, &a);
    let bad = [
        Record { kind: Kind::Unknown(9), len: 0, imm: 0 },
        Record { kind: Kind::Packet, len: 1 << 20, imm: 0 },
    ];
    for (pos, rec) in bad.iter().enumerate() {
        lane.publish(pos as u32, rec, &[], None);
    }
    lane.publish(2, &Record { kind: Kind::Packet, len: 3, imm: 0 }, b"abc", None);
    b.post_recv(&[BufId(0)]);
    let got = poll_all(&mut b);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].len, &b.held(BufId(0))[..3]), (3, &b"abc"[..]));
    assert_eq!(got[0].src, Source::Unknown { qpn: a.addr().qpn });
    assert_eq!(b.stats().malformed, 2);
    assert!(b.counters().contains(&("malformed", 2)), "reported with the device's counters");
}

#[test]
fn two_threads_move_sequenced_packets_without_loss() {
    const PACKETS: u64 = 300_000;
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let receiver = std::thread::spawn(move || {
        let mut dev = ShmDevice::new(small()).unwrap();
        addr_tx.send(dev.addr()).unwrap();
        dev.post_recv(&(0..64).map(BufId).collect::<Vec<_>>());
        let mut out = [Cqe::default(); 32];
        let mut expect = 0u64;
        while expect < PACKETS {
            let n = dev.poll(&mut out);
            for c in &out[..n] {
                assert_eq!((c.op, c.status), (CqOp::Recv, CqStatus::Ok));
                let bytes = &dev.held(BufId::from_wr_id(c.wr_id))[..c.len as usize];
                let seq = u64::from_le_bytes(bytes[..8].try_into().unwrap());
                assert_eq!(seq, expect, "no loss, no duplicate, in order");
                assert_eq!(c.len as u64, 8 + seq % 300);
                assert!(bytes[8..].iter().all(|&x| x == seq as u8), "content of {seq}");
                expect += 1;
            }
            let bufs: Vec<BufId> = out[..n].iter().map(|c| BufId::from_wr_id(c.wr_id)).collect();
            assert_eq!(dev.post_recv(&bufs), n);
        }
        done_rx.recv().unwrap();
        dev.stats()
    });
    let mut dev = ShmDevice::new(small()).unwrap();
    let ah = dev.insert_addr(&addr_rx.recv().unwrap()).unwrap();
    let mut out = [Cqe::default(); 32];
    let mut free: Vec<BufId> = (0..64).map(BufId).collect();
    let (mut next, mut completed) = (0u64, 0u64);
    while completed < PACKETS {
        let mut wrs = [SendWr { ah, buf: BufId(0), len: 0, data: None, wr_id: 0 }; 32];
        let mut k = 0;
        while k < wrs.len() && next + (k as u64) < PACKETS && !free.is_empty() {
            let seq = next + k as u64;
            let buf = free.pop().unwrap();
            let len = 8 + (seq % 300) as usize;
            let b = dev.held_mut(buf);
            b[..8].copy_from_slice(&seq.to_le_bytes());
            b[8..len].fill(seq as u8);
            wrs[k] = SendWr { ah, buf, len: len as u32, data: None, wr_id: buf.wr_id() };
            k += 1;
        }
        let taken = dev.post_send(&wrs[..k]);
        free.extend(wrs[taken..k].iter().map(|w| w.buf));
        next += taken as u64;
        let n = dev.poll(&mut out);
        for c in &out[..n] {
            assert_eq!((c.op, c.status), (CqOp::Send, CqStatus::Ok));
            free.push(BufId::from_wr_id(c.wr_id));
        }
        completed += n as u64;
    }
    done_tx.send(()).unwrap();
    let stats = receiver.join().unwrap();
    assert_eq!(stats.delivered, PACKETS);
    assert_eq!(dev.stats().sent, PACKETS);
}

#[test]
fn a_dead_senders_lane_is_drained_then_freed_and_stalls_no_other() {
    let cfg = ShmConfig { lanes: 2, ..small() };
    let (mut a, mut b) = pair(cfg);
    let ah = a.insert_addr(&b.addr()).unwrap();
    // A sender that takes the other lane, publishes one packet and a half
    // (no control word), and dies: its lane is granted, then the pid it
    // was granted to is a dead one (a process of its own in the suites
    // across processes).
    let d = ShmDevice::new(cfg).unwrap();
    let lane = hand_lane(&b, &d);
    lane.publish(0, &Record { kind: Kind::Packet, len: 4, imm: 0 }, b"dead", None);
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    poll_all(&mut b);
    let d_qpn = d.addr().qpn;
    let held = b.rx_lanes.iter_mut().find(|l| l.qpn == d_qpn).expect("granted lane taken up");
    held.pid = dead;
    let mut c = ShmDevice::new(cfg).unwrap();
    assert_eq!(c.insert_addr(&b.addr()), Err(DeviceError::Again), "every lane taken");

    send(&mut a, ah, BufId(0), b"alive", 1);
    b.post_recv(&[BufId(0), BufId(1)]);
    let got = poll_n(&mut b, 2);
    let texts: Vec<&[u8]> =
        got.iter().map(|c| &b.held(BufId::from_wr_id(c.wr_id))[..c.len as usize]).collect();
    assert!(texts.contains(&&b"alive"[..]), "the live sender is not stalled");
    assert!(texts.contains(&&b"dead"[..]), "what the dead sender published arrives");
    assert_eq!(poll_n(&mut a, 1)[0].status, CqStatus::Ok);

    // The liveness check frees the dead sender's lane for a new one.
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.stats().lanes_reclaimed == 0 && Instant::now() < deadline {
        poll_all(&mut b);
    }
    assert_eq!(b.stats().lanes_reclaimed, 1);
    let ah_c = c.insert_addr(&b.addr()).expect("a lane is free again");
    send(&mut c, ah_c, BufId(0), b"new", 2);
    b.post_recv(&[BufId(2)]);
    let got = poll_n(&mut b, 1);
    assert_eq!(&b.held(BufId::from_wr_id(got[0].wr_id))[..3], b"new");
}

#[test]
fn a_closed_senders_lane_is_freed_for_the_next() {
    let cfg = ShmConfig { lanes: 1, ..small() };
    let (mut a, mut b) = pair(cfg);
    let ah = a.insert_addr(&b.addr()).unwrap();
    send(&mut a, ah, BufId(0), b"last", 1);
    drop(a);
    b.post_recv(&[BufId(0)]);
    let got = poll_n(&mut b, 1);
    assert_eq!(
        &b.held(BufId::from_wr_id(got[0].wr_id))[..4],
        b"last",
        "published before closing: delivered"
    );
    let mut c = ShmDevice::new(cfg).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.stats().lanes_reclaimed == 0 && Instant::now() < deadline {
        poll_all(&mut b);
    }
    let ah_c = c.insert_addr(&b.addr()).expect("the closed sender's lane is free");
    send(&mut c, ah_c, BufId(0), b"next", 2);
    b.post_recv(&[BufId(1)]);
    let got = poll_n(&mut b, 1);
    assert_eq!(&b.held(BufId::from_wr_id(got[0].wr_id))[..4], b"next");
}

#[test]
fn sixteen_senders_reach_one_receiver_by_default_and_the_next_is_told_again() {
    // Default lanes; short rings keep the lanes small.
    let cfg =
        ShmConfig { bufs: 64, tx_depth: 8, rx_depth: 32, ring_slots: 2, ..Default::default() };
    assert_eq!(ShmConfig::default().lanes, 16);
    let mut b = ShmDevice::new(cfg).unwrap();
    let mut senders: Vec<ShmDevice> = (0..16).map(|_| ShmDevice::new(cfg).unwrap()).collect();
    for (i, s) in senders.iter_mut().enumerate() {
        let ah = s.insert_addr(&b.addr()).expect("a lane for each of sixteen");
        send(s, ah, BufId(0), &pattern(i, 100), i as u64);
    }
    let mut extra = ShmDevice::new(cfg).unwrap();
    assert_eq!(extra.insert_addr(&b.addr()), Err(DeviceError::Again), "every lane taken");
    b.post_recv(&(0..16).map(BufId).collect::<Vec<_>>());
    let got = poll_n(&mut b, 16);
    assert_eq!(got.len(), 16);
    let mut seen: Vec<Vec<u8>> =
        got.iter().map(|c| b.held(BufId::from_wr_id(c.wr_id))[..100].to_vec()).collect();
    seen.sort();
    let mut want: Vec<Vec<u8>> = (0..16).map(|i| pattern(i, 100)).collect();
    want.sort();
    assert_eq!(seen, want, "one packet from each sender, intact");
}

#[test]
fn a_region_larger_than_the_memory_left_says_so() {
    let mut dev = ShmDevice::new(small()).unwrap();
    // More than any host has: refused before a page is reserved.
    let err = dev.register(1 << 50, Access::LOCAL).unwrap_err();
    let errno = libc::ENOMEM;
    assert_eq!(err, DeviceError::Os { what: "creating a region's shared memory", errno });
    let text = err.to_string();
    assert!(text.contains("shared memory") && text.contains("Cannot allocate memory"), "{text}");
    assert!(dev.register(4096, Access::LOCAL).is_ok(), "a region that fits still registers");
}

#[test]
fn no_one_can_resize_a_segment_and_an_unsealed_one_is_never_mapped() {
    use std::fs::File;
    use std::os::fd::FromRawFd;
    let (a, mut b) = pair(small());
    let mr = b.register(4096, Access::REMOTE_READ).unwrap();
    // What peers are handed: a lane of b's and its region's segment.
    let (t, f) = (b.addr(), a.addr());
    let lane = rendezvous::hello(t.qpn, t.connid, f.qpn, f.connid).unwrap().fd.unwrap();
    let region = rendezvous::region(t.qpn, t.connid, mr.key).unwrap().fd.unwrap();
    for fd in [&lane, &region] {
        // Truncating a segment under its mappings would be a SIGBUS in
        // every process that maps it: the kernel refuses, to anyone.
        let file = File::from(fd.try_clone().unwrap());
        let len = file.metadata().unwrap().len();
        assert_eq!(file.set_len(len / 2).unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(file.set_len(len * 2).unwrap_err().raw_os_error(), Some(libc::EPERM));
    }
    // A segment whose size is not sealed, as a hostile owner could hand
    // over, is never mapped.
    // SAFETY: the name is a NUL-terminated literal.
    let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: just made, owned by nothing else.
    let unsealed = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
    unsealed.set_len(1 << 16).unwrap();
    let err = Mapping::from_fd(unsealed.as_fd(), 0, true).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
}

/// The impostor's side of the next test: run as a process of its own. It
/// asks as a hostile process would, whoever answers; the last word says
/// whether our own asks would talk to `b` at all.
#[test]
fn impostor() {
    let Ok(plan) = std::env::var("EFAPOLL_IMPOSTOR") else { return };
    let n: Vec<u64> = plan.split(',').map(|x| x.parse().unwrap()).collect();
    let (b_qpn, b_connid, a_qpn, a_connid, key) =
        (n[0] as u16, n[1] as u32, n[2] as u16, n[3] as u32, n[4]);
    // Claims a lane as the peer `a`, whose address it learned.
    let as_a = rendezvous::ask_as_stranger(b_qpn, b_connid, Some((a_qpn, a_connid)), 0).unwrap();
    // Claims one as itself, a device of its own, and asks for a region.
    let dev = ShmDevice::new(small()).unwrap();
    let me = dev.addr();
    let own = rendezvous::ask_as_stranger(b_qpn, b_connid, Some((me.qpn, me.connid)), 0).unwrap();
    let region = rendezvous::ask_as_stranger(b_qpn, b_connid, None, key).unwrap();
    let ours = match rendezvous::hello(b_qpn, b_connid, me.qpn, me.connid) {
        Err(rendezvous::AskError::Stranger { .. }) => "stranger",
        _ => "ours",
    };
    let fd = region.fd.is_some();
    println!("@@ {} {} {} {fd} {ours}", as_a.status, own.status, region.status);
}

/// A user made for a test's other-user part with `useradd`
/// (`efapoll-test-<pid>-<n>`), and removed
/// when dropped, on failure too, with the copy of this test binary it
/// runs (the target directory may be closed to it).
struct OtherUser {
    name: String,
    uid: u32,
    gid: u32,
    dir: std::path::PathBuf,
}

impl OtherUser {
    /// `Err` says why this host cannot make one (not root, no `useradd`):
    /// the reason to skip with. Any other failure panics.
    fn new() -> Result<OtherUser, String> {
        use std::os::unix::fs::PermissionsExt;
        use std::process::Command;
        if rendezvous::my_uid() != 0 {
            return Err("not root".into());
        }
        OtherUser::sweep();
        // Tests in threads of one process each make their own.
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = MADE.fetch_add(1, Relaxed);
        let name = format!("efapoll-test-{}-{n}", std::process::id());
        let args = ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", &name];
        // Another test's useradd may hold the password files' lock.
        for tries in 1.. {
            let out = match Command::new("useradd").args(args).output() {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err("useradd is missing".into());
                }
                out => out.expect("useradd runs"),
            };
            if out.status.success() {
                break;
            }
            let why = String::from_utf8_lossy(&out.stderr);
            assert!(tries < 20, "useradd {name}: {}: {why}", out.status);
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut user = OtherUser { name, uid: 0, gid: 0, dir: std::env::temp_dir() };
        let id = |flag: &str| {
            let out = Command::new("id").args([flag, &user.name]).output().expect("id runs");
            String::from_utf8_lossy(&out.stdout).trim().parse::<u32>().expect("a number")
        };
        (user.uid, user.gid) = (id("-u"), id("-g"));
        user.dir = std::env::temp_dir().join(&user.name);
        std::fs::create_dir(&user.dir).unwrap();
        let exe = user.dir.join("efapoll-tests");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        for path in [&user.dir, &exe] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Ok(user)
    }

    /// Removes the users of runs that were killed before they could.
    fn sweep() {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        for name in passwd.lines().filter_map(|l| l.split(':').next()) {
            let pid = name.strip_prefix("efapoll-test-").and_then(|p| p.split('-').next());
            let pid = pid.and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|pid| !pid_alive(pid)) {
                let _ = std::process::Command::new("userdel").arg(name).status();
                let _ = std::fs::remove_dir_all(std::env::temp_dir().join(name));
            }
        }
    }

    /// This test binary, to run as the user.
    fn command(&self) -> std::process::Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(self.dir.join("efapoll-tests"));
        cmd.uid(self.uid).gid(self.gid).current_dir(&self.dir);
        cmd
    }
}

impl Drop for OtherUser {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        for _ in 0..20 {
            let status = std::process::Command::new("userdel").arg(&self.name).status();
            if status.is_ok_and(|s| s.success()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove user {}", self.name);
    }
}

/// Runs the impostor against `b` (as `a`'s address), as `user` if given;
/// returns its statuses: as `a`, as itself, for the region, whether a
/// descriptor came and whether `b` is one of its own user's (`ours`) or a
/// `stranger`; or what it printed, if it printed no statuses.
fn run_impostor(
    a: &ShmDevice,
    b: &ShmDevice,
    key: u64,
    user: Option<&OtherUser>,
) -> Result<String, String> {
    let (t, f) = (b.addr(), a.addr());
    let mut cmd = match user {
        Some(user) => user.command(),
        None => std::process::Command::new(std::env::current_exe().unwrap()),
    };
    cmd.args(["device::shm::tests::impostor", "--exact", "--nocapture", "--test-threads=1"])
        .env("EFAPOLL_IMPOSTOR", format!("{},{},{},{},{key}", t.qpn, t.connid, f.qpn, f.connid));
    let out = cmd.output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let Some(at) = text.find("@@ ") else {
        return Err(format!("{}: {text}{}", out.status, String::from_utf8_lossy(&out.stderr)));
    };
    Ok(text[at + 3..].lines().next().unwrap_or("").trim().to_owned())
}

#[test]
fn a_process_cannot_take_a_lane_as_another_and_another_user_gets_nothing() {
    let (mut a, mut b) = pair(small());
    let mr = b.register(4096, Access::REMOTE_READ).unwrap();
    let ah = a.insert_addr(&b.addr()).unwrap();
    let (ok, refused) = (rendezvous::OK, rendezvous::REFUSED);
    // Of our user: as `a` it is refused; as itself it gets a lane and the
    // region (a same-user process can map what it asks for: see the
    // module's threat model).
    let got = run_impostor(&a, &b, mr.key, None).expect("the impostor ran");
    assert_eq!(got, format!("{refused} {ok} {ok} true ours"));
    assert!(b.stats().refused >= 1, "{:?}", b.stats());
    // Nothing it did speaks for `a`: b's lanes from a's address are a's.
    send(&mut a, ah, BufId(0), b"mine", 1);
    b.post_recv(&[BufId(0)]);
    assert_eq!(poll_n(&mut b, 1).len(), 1);
    let me = std::process::id();
    let from_a: Vec<_> = b.rx_lanes.iter().filter(|l| l.qpn == a.addr().qpn).collect();
    assert!(from_a.len() == 1 && from_a[0].pid == me, "{from_a:?}");

    // Of another user: refused whatever it asks, and told so (its request
    // is refused unread: the answer must reach it all the same); and our
    // own asks, made there, would not talk to `b` (root's) either.
    let user = match OtherUser::new() {
        Ok(user) => user,
        Err(why) => {
            eprintln!("skipped the other user's part: {why}");
            return;
        }
    };
    let before = b.stats().refused;
    let got = run_impostor(&a, &b, mr.key, Some(&user)).expect("the impostor ran as another user");
    assert_eq!(got, format!("{refused} {refused} {refused} false stranger"));
    // Counted once the answering thread is done with the last: the three
    // requests and the connection our own ask opened and left unasked.
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.stats().refused < before + 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(b.stats().refused, before + 4);
    eprintln!("other user {} (uid {}) refused, and refusing: {got}", user.name, user.uid);
}

/// A process of another user playing a peer, for the next test: it listens
/// at two addresses of its own and hands whoever asks a segment that would
/// pass for a lane (with the address in it) or a region, its size
/// sealed at the first address and not at the second. It prints the two
/// addresses and its segments' inodes, serves until its stdin closes, then
/// prints how many requests reached it.
#[test]
fn stranger() {
    use std::io::Read;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd};
    use std::os::unix::fs::MetadataExt;
    if std::env::var("EFAPOLL_STRANGER").is_err() {
        return;
    }
    let addrs: Vec<(u16, u32)> = (0..2)
        .map(|_| {
            let r = random_u64();
            (r as u16, (r >> 32) as u32)
        })
        .collect();
    let listeners: Vec<_> = addrs.iter().map(|&(q, c)| Rendezvous::bind(q, c).unwrap()).collect();
    let (lane, lane_fd) = Lane::create(2, small().mtu).unwrap();
    lane.map().u32_at(hdr::QPN).store(addrs[0].0 as u32, Relaxed);
    lane.map().u32_at(hdr::CONNID).store(addrs[0].1, Relaxed);
    lane.open_for_business();
    let (region, region_fd) = Mapping::create(REGION_DATA + 4096).unwrap();
    region.u64_at(hdr::LEN).store(4096, Relaxed);
    region.u64_at(hdr::BASE).store(region.addr_at(REGION_DATA), Relaxed);
    region.u32_at(hdr::ACCESS).store(Access::all().bits(), Relaxed);
    region.u32_at(hdr::VERSION).store(hdr::VERSION_VALUE, Relaxed);
    region.u32_at(hdr::KIND).store(hdr::KIND_REGION, Relaxed);
    region.u32_at(hdr::STATE).store(hdr::STATE_READY, Relaxed);
    region.u64_at(hdr::MAGIC).store(hdr::MAGIC_VALUE, Release);
    // SAFETY: the name is a NUL-terminated literal.
    let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: just made, owned by nothing else.
    let unsealed = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(raw) });
    unsealed.set_len(lane.map().len() as u64).unwrap();
    let ino = |fd: BorrowedFd<'_>| {
        std::fs::File::from(fd.try_clone_to_owned().unwrap()).metadata().unwrap().ino()
    };
    let (q0, c0, q1, c1) = (addrs[0].0, addrs[0].1, addrs[1].0, addrs[1].1);
    let inodes = [ino(lane_fd.as_fd()), ino(region_fd.as_fd()), ino(unsealed.as_fd())];
    println!("@@ {q0} {c0} {q1} {c1} {} {} {}", inodes[0], inodes[1], inodes[2]);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = done.clone();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        stop.store(true, Release);
    });
    for l in &listeners {
        l.set_nonblocking(true).unwrap();
    }
    let mut requests = 0;
    while !done.load(Acquire) {
        for (i, l) in listeners.iter().enumerate() {
            let Ok((s, _)) = l.accept() else { continue };
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            let mut req = [0u8; 20];
            if (&s).read_exact(&mut req).is_err() {
                // It asked nothing: nothing to hand.
                continue;
            }
            requests += 1;
            let kind = u32::from_le_bytes(req[0..4].try_into().unwrap());
            let key = u64::from_le_bytes(req[12..20].try_into().unwrap());
            region.u64_at(hdr::KEY).store(key, Relaxed);
            let fd = match (i, kind) {
                (1, _) => unsealed.as_raw_fd(),
                (_, rendezvous::REGION) => region_fd.as_raw_fd(),
                _ => lane_fd.as_raw_fd(),
            };
            let _ = rendezvous::send_with_fd(&s, &[0; 8], Some(fd));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("@@ requests {requests}");
}

#[test]
fn a_strangers_segments_are_refused_unasked_and_never_mapped() {
    use std::io::{BufRead, Write};
    let user = match OtherUser::new() {
        Ok(user) => user,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let mut cmd = user.command();
    cmd.args(["device::shm::tests::stranger", "--exact", "--nocapture", "--test-threads=1"])
        .env("EFAPOLL_STRANGER", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    // Its lines after "@@ " (the harness may start the line).
    let mut said = |what: &str| {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the stranger ended before {what}");
            if let Some(at) = line.find("@@ ") {
                return line[at + 3..].split_whitespace().map(str::to_owned).collect::<Vec<_>>();
            }
        }
    };
    let n: Vec<u64> = said("its addresses").iter().map(|x| x.parse().unwrap()).collect();
    let (mut a, b) = pair(small());
    let at = |qpn: u64, connid: u64| RawAddr { qpn: qpn as u16, connid: connid as u32, ..a.addr() };
    let (sealed, unsealed) = (at(n[0], n[1]), at(n[2], n[3]));
    let stranger = DeviceError::OtherUser { uid: user.uid };
    assert_eq!(a.insert_addr(&sealed), Err(stranger), "a lane that would pass, sealed");
    assert_eq!(a.insert_addr(&unsealed), Err(stranger));
    // On the data path: a peer whose address a stranger holds now (the
    // peer's process went, and the stranger bound its name).
    let ah = a.insert_addr(&b.addr()).unwrap();
    a.peers[ah.0 as usize].addr = sealed;
    let local = a.register(64, Access::LOCAL).unwrap();
    let remote = Mr { id: MrId(0), key: 42, addr: 0x1000, len: 4096, access: Access::all() };
    assert_eq!(a.post_rdma(&[rdma(RdmaOp::Read, ah, &local, &remote, 8, 1)]), 1);
    assert_eq!(poll_all(&mut a)[0].status, CqStatus::RemoteAccess);
    assert_eq!(a.stats().strangers, 3);
    assert!(a.counters().contains(&("strangers", 3)));

    drop(child.stdin.take());
    let requests = said("its count");
    assert_eq!(requests, ["requests", "0"], "nothing was asked of it");
    child.wait().unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let inodes: Vec<&str> = maps.lines().filter_map(|l| l.split_whitespace().nth(4)).collect();
    for ino in &n[4..] {
        assert!(!inodes.contains(&ino.to_string().as_str()), "segment {ino} mapped");
    }
    let _ = std::io::stderr().flush();
    eprintln!(
        "stranger {} (uid {}): 2 addresses and a region refused unasked, {} requests reached it",
        user.name, user.uid, requests[1]
    );
}

#[test]
fn an_rdma_to_a_peer_that_does_not_answer_waits_without_holding_the_caller() {
    let (mut a, mut b) = pair(small());
    let ah = a.insert_addr(&b.addr()).unwrap();
    let local = a.register(64, Access::LOCAL).unwrap();
    let remote = b.register(64, Access::REMOTE_READ).unwrap();
    // The peer stopped (SIGSTOP, a debugger): its socket takes connections
    // and nothing answers them.
    let r = random_u64();
    let (qpn, connid) = (r as u16, (r >> 32) as u32);
    let stopped = Rendezvous::bind(qpn, connid).unwrap();
    a.peers[ah.0 as usize].addr = RawAddr { qpn, connid, ..b.addr() };
    let rd = |key, wr_id| RdmaWr {
        remote_key: key,
        ..rdma(RdmaOp::Read, ah, &local, &remote, 8, wr_id)
    };
    let started = Instant::now();
    assert_eq!(a.post_rdma(&[rd(remote.key, 1)]), 0, "waits, as back-pressure");
    assert_eq!(a.post_rdma(&[rd(remote.key, 1)]), 0);
    let held = started.elapsed();
    assert!(held < Duration::from_secs(1), "held the caller {held:?}");
    assert!(poll_all(&mut a).is_empty());
    // It answers late: the operation goes on from there.
    let (s, _) = stopped.accept().unwrap();
    rendezvous::send_with_fd(&s, &rendezvous::UNKNOWN.to_le_bytes().repeat(2), None).unwrap();
    assert_eq!(post_rdma_all(&mut a, &[rd(remote.key, 1)]), 1);
    assert_eq!(poll_all(&mut a)[0].status, CqStatus::RemoteAccess, "no such region");
    // It never answers: the operation fails once the ask times out.
    assert_eq!(a.post_rdma(&[rd(remote.key ^ 1, 2)]), 0);
    a.peers[ah.0 as usize].asks[0].ask.expire();
    assert_eq!(a.post_rdma(&[rd(remote.key ^ 1, 2)]), 1);
    assert_eq!(poll_all(&mut a)[0].status, CqStatus::PeerUnreachable);
    assert_eq!(a.stats().ask_timeouts, 1);
    // Nothing else waited on it.
    b.post_recv(&[BufId(0)]);
    let ah_a = b.insert_addr(&a.addr()).unwrap();
    send(&mut b, ah_a, BufId(1), b"alive", 1);
    a.post_recv(&[BufId(9)]);
    assert_eq!(poll_n(&mut a, 1)[0].len, 5);
}

#[test]
fn inserting_a_peer_that_does_not_answer_holds_the_caller_no_longer_than_told() {
    let hello_wait = Duration::from_millis(30);
    let mut a = ShmDevice::new(ShmConfig { hello_wait, ..small() }).unwrap();
    // A stopped peer: its socket takes connections, nothing answers them.
    let me = a.addr();
    let stopped = |r: u64| {
        let (qpn, connid) = (r as u16, (r >> 32) as u32);
        let addr = RawAddr { qpn, connid, ..me };
        (Rendezvous::bind(qpn, connid).unwrap(), addr)
    };
    let (late, late_addr) = stopped(random_u64());
    for _ in 0..3 {
        let started = Instant::now();
        assert_eq!(a.insert_addr(&late_addr), Err(DeviceError::Again));
        let held = started.elapsed();
        assert!(held >= hello_wait, "waited {held:?}");
        assert!(held < Duration::from_secs(1), "held the caller {held:?}");
    }
    assert_eq!(a.hellos.len(), 1, "one ask, waited on again");
    // It answers late (no lane: full): the call that finds the answer says so.
    let (s, _) = late.accept().unwrap();
    rendezvous::send_with_fd(&s, &rendezvous::FULL.to_le_bytes().repeat(2), None).unwrap();
    assert_eq!(a.insert_addr(&late_addr), Err(DeviceError::Again));
    assert!(a.hellos.is_empty(), "answered");
    // One that never answers: the insert fails once the ask times out.
    let (_never, never_addr) = stopped(random_u64());
    assert_eq!(a.insert_addr(&never_addr), Err(DeviceError::Again));
    a.hellos[0].1.expire();
    assert_eq!(a.insert_addr(&never_addr), Err(DeviceError::NoAnswer));
    assert_eq!(a.stats().ask_timeouts, 1);
    assert!(a.hellos.is_empty());
    // A live peer is inserted in one call, as before.
    let b = ShmDevice::new(small()).unwrap();
    assert!(a.insert_addr(&b.addr()).is_ok());
}

#[test]
fn update_region_fetches_combines_and_writes_back() {
    crate::device::checks::update_region_fetches_combines_and_writes_back(
        &mut ShmDevice::new(small()).unwrap(),
    );
}

#[test]
fn a_sender_cannot_write_in_another_senders_lane() {
    let cfg = ShmConfig { lanes: 3, ..small() };
    let (mut a, mut b) = pair(cfg);
    let ah = a.insert_addr(&b.addr()).unwrap();
    let ah_a = b.insert_addr(&a.addr()).unwrap();
    send(&mut a, ah, BufId(0), b"genuine", 1);
    // A sender of our user granted a lane of b's writes, wherever a slot
    // may start in all it was handed and nothing is published, the packet
    // that would come after a's: were a's lane in it, b would take the
    // forgery as a's.
    let h = ShmDevice::new(cfg).unwrap();
    let (t, f) = (b.addr(), h.addr());
    let fd = rendezvous::hello(t.qpn, t.connid, f.qpn, f.connid).unwrap().fd.unwrap();
    let handed = Mapping::from_fd(fd.as_fd(), 0, true).unwrap();
    for at in (128..handed.len() - 128).step_by(128) {
        if handed.u32_at(at).load(Acquire) != 0 {
            continue;
        }
        for (i, word) in [2u32, 1, 6, 0].into_iter().enumerate() {
            handed.u32_at(at + 4 * i).store(word, Release);
        }
        handed.write_bytes(at + 16, b"forged");
    }
    b.post_recv(&(0..8).map(BufId).collect::<Vec<_>>());
    let got = poll_all(&mut b);
    let from_a: Vec<&[u8]> = got
        .iter()
        .filter(|c| c.src == Source::Known(ah_a))
        .map(|c| &b.held(BufId::from_wr_id(c.wr_id))[..c.len as usize])
        .collect();
    assert_eq!(from_a, [&b"genuine"[..]], "only a's own packet is taken as a's");
    for c in got.iter().filter(|c| c.src != Source::Known(ah_a)) {
        // What it forged in its own lane is its own packet.
        assert_eq!(c.src, Source::Unknown { qpn: h.addr().qpn });
        assert_eq!(&b.held(BufId::from_wr_id(c.wr_id))[..c.len as usize], b"forged");
    }
    assert_eq!(poll_n(&mut a, 1)[0].status, CqStatus::Ok);
}

/// A peer's mapped regions, each told by its first byte: found by key
/// whatever was looked up before and whatever was removed, a removed
/// key never found again.
#[test]
fn remote_regions_find_each_key_through_lookups_and_removals() {
    let mut regions = RemoteRegions::default();
    let tag = |i: u8| {
        let (map, _fd) = Mapping::create(64).unwrap();
        map.write_bytes(0, &[i]);
        map
    };
    let first = |r: &RemoteRegions, i: usize| {
        let mut b = [0u8];
        r.at(i).read_bytes(0, &mut b);
        b[0]
    };
    let keys = [7u64, 1 << 40, 3, u64::MAX, 0];
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(regions.find(k), None, "{k} before it is mapped");
        regions.insert(k, tag(i as u8));
    }
    // Each key, in an order that alternates between the last found and
    // others, finds its own mapping.
    let order = [0, 1, 0, 1, 2, 2, 4, 3, 0, 4, 4, 1];
    for &j in &order {
        let i = regions.find(keys[j]).unwrap();
        assert_eq!(first(&regions, i), j as u8, "key {}", keys[j]);
    }
    // Removals move the last mapping into the hole: the recent ones now
    // point at other keys or past the end, and must miss.
    regions.find(keys[4]);
    regions.find(keys[1]);
    regions.remove(keys[1]);
    regions.remove(keys[1]);
    assert_eq!(regions.find(keys[1]), None);
    regions.remove(keys[0]);
    assert_eq!(regions.find(keys[0]), None);
    for j in [4, 2, 3, 4, 3, 2] {
        let i = regions.find(keys[j]).unwrap();
        assert_eq!(first(&regions, i), j as u8, "key {} after removals", keys[j]);
    }
    regions.insert(keys[1], tag(9));
    let i = regions.find(keys[1]).unwrap();
    assert_eq!(first(&regions, i), 9, "mapped again");
}

/// A burst of packets does not evict its own headers: the first line of
/// each of 48 consecutive buffers (the MTU a multiple of the page) falls
/// in an L1 set of its own, as a frame a cache line past the MTU has it.
#[test]
fn consecutive_packet_buffers_start_in_different_cache_sets() {
    let dev = ShmDevice::new(small()).unwrap();
    assert_eq!(dev.cfg.mtu % 4096, 0, "the case the stride is for");
    let sets: std::collections::HashSet<usize> =
        (0..48).map(|i| (dev.held(BufId(i)).as_ptr() as usize / 64) % 64).collect();
    assert_eq!(sets.len(), 48);
}

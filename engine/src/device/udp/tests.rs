use std::net::UdpSocket;
use std::time::{Duration, Instant};

use super::*;
use crate::device::HeldBufs;

fn cfg() -> UdpConfig {
    UdpConfig { bufs: 256, tx_depth: 128, rx_depth: 128, ..UdpConfig::default() }
}

fn pair(cfg: UdpConfig) -> (UdpDevice, UdpDevice) {
    (UdpDevice::new(cfg).unwrap(), UdpDevice::new(cfg).unwrap())
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + seed * 7 + 1) as u8).collect()
}

/// Polls both, collecting each one's completions, until `done` holds.
fn drive(
    a: &mut UdpDevice,
    b: &mut UdpDevice,
    within: Duration,
    mut done: impl FnMut(&[Cqe], &[Cqe]) -> bool,
) -> (Vec<Cqe>, Vec<Cqe>) {
    let (mut ca, mut cb) = (Vec::new(), Vec::new());
    let mut out = [Cqe::default(); 32];
    let end = Instant::now() + within;
    while !done(&ca, &cb) {
        assert!(Instant::now() < end, "not done: a {ca:?} b {cb:?}");
        let k = a.poll(&mut out);
        ca.extend_from_slice(&out[..k]);
        let k = b.poll(&mut out);
        cb.extend_from_slice(&out[..k]);
    }
    (ca, cb)
}

fn send(dev: &mut UdpDevice, ah: Ah, buf: BufId, bytes: &[u8], wr_id: u64) {
    dev.held_mut(buf)[..bytes.len()].copy_from_slice(bytes);
    let wr = SendWr { ah, buf, len: bytes.len() as u32, data: None, wr_id };
    assert_eq!(dev.post_send(&[wr]), 1);
}

const SEC: Duration = Duration::from_secs(10);

#[test]
fn every_packet_size_arrives_with_its_content_and_its_sender() {
    let (mut a, mut b) = pair(cfg());
    let to_b = a.insert_addr(&b.addr()).unwrap();
    let bufs: Vec<BufId> = (0..64).map(BufId).collect();
    assert_eq!(b.post_recv(&bufs), 64);
    let sizes = [0usize, 1, 63, 64, 1000, 4096, 8191, 8192];
    for (i, &len) in sizes.iter().enumerate() {
        send(&mut a, to_b, BufId(100 + i as u32), &pattern(i, len), i as u64);
    }
    let (ca, cb) =
        drive(&mut a, &mut b, SEC, |ca, cb| ca.len() == sizes.len() && cb.len() == sizes.len());
    assert!(ca.iter().all(|c| c.op == CqOp::Send && c.status == CqStatus::Ok), "{ca:?}");
    let mut seen = vec![false; sizes.len()];
    for c in &cb {
        assert_eq!(c.op, CqOp::Recv);
        // Unordered: find the size by length and content.
        let i = sizes.iter().position(|&l| l == c.len as usize).unwrap();
        assert_eq!(
            &b.held(BufId::from_wr_id(c.wr_id))[..c.len as usize],
            &pattern(i, sizes[i])[..]
        );
        assert_eq!(c.src, Source::Unknown { qpn: a.addr().qpn }, "not in b's book yet");
        assert!(!seen[i], "delivered twice");
        seen[i] = true;
    }
    // An unknown sender's address is there for the asking (EFA's sender GID).
    let c = cb[0];
    assert_eq!(b.sender(BufId::from_wr_id(c.wr_id)), Some(a.addr()));
    // Once in the book, the sender is known.
    let to_a = b.insert_addr(&a.addr()).unwrap();
    send(&mut a, to_b, BufId(1), b"known", 99);
    let (_, cb) = drive(&mut a, &mut b, SEC, |_, cb| !cb.is_empty());
    assert_eq!(cb[0].src, Source::Known(to_a));
    // A packet larger than the mtu is refused locally.
    let wr = SendWr { ah: to_b, buf: BufId(0), len: 8193, data: None, wr_id: 7 };
    assert_eq!(a.post_send(&[wr]), 1);
    let (ca, _) = drive(&mut a, &mut b, SEC, |ca, _| !ca.is_empty());
    assert_eq!((ca[0].wr_id, ca[0].status), (7, CqStatus::LocalError));
}

#[test]
fn the_address_is_the_socket_and_a_v4_gid_is_mapped() {
    let a = UdpDevice::new(cfg()).unwrap();
    let addr = a.addr();
    assert_eq!(addr.gid, Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets());
    assert_eq!(addr.qpn, a.local_addr().port());
    let b = UdpDevice::new(cfg()).unwrap();
    assert_ne!(addr.connid, b.addr().connid, "connids are drawn at random");
    let unspecified = UdpConfig { bind: "0.0.0.0:0".parse().unwrap(), ..cfg() };
    assert!(matches!(UdpDevice::new(unspecified), Err(UdpError::Config(_))));
    let (snd, rcv) = a.socket_buffers();
    assert!(snd > 0 && rcv > 0, "buffer sizes reported: {snd} {rcv}");
    // An IPv6 peer is unreachable from an IPv4 socket.
    let mut a = a;
    let v6 = RawAddr { gid: Ipv6Addr::LOCALHOST.octets(), qpn: 9, connid: 1 };
    assert_eq!(a.insert_addr(&v6), Err(DeviceError::BadAddress));
}

fn rdma(op: RdmaOp, ah: Ah, local: &Mr, remote: &Mr, off: u64, len: u64, wr_id: u64) -> RdmaWr {
    RdmaWr {
        op,
        ah,
        local: local.id,
        local_offset: 0,
        len,
        remote_addr: remote.addr_at(off),
        remote_key: remote.key,
        wr_id,
    }
}

#[test]
fn rdma_read_write_and_write_with_immediate_of_every_size() {
    let (mut a, mut b) = pair(cfg());
    let to_b = a.insert_addr(&b.addr()).unwrap();
    let len = 300_000u64;
    let local = a.register(len, Access::empty()).unwrap();
    let remote = b.register(len, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap();
    let bufs: Vec<BufId> = (0..8).map(BufId).collect();
    b.post_recv(&bufs);
    for (k, n) in [0u64, 1, 8151, 8152, 8153, 100_000, len].into_iter().enumerate() {
        let data = pattern(k, n as usize);
        a.write_region(local.id, 0, &data);
        let imm = (k % 2 == 1).then_some(0xabc0 + k as u32);
        let wr = rdma(RdmaOp::Write { imm }, to_b, &local, &remote, 0, n, 10 + k as u64);
        assert_eq!(a.post_rdma(&[wr]), 1);
        let want_b = usize::from(imm.is_some());
        let (ca, cb) = drive(&mut a, &mut b, SEC, |ca, cb| !ca.is_empty() && cb.len() == want_b);
        assert_eq!(
            (ca[0].op, ca[0].status, ca[0].wr_id),
            (CqOp::Write, CqStatus::Ok, 10 + k as u64)
        );
        let mut got = vec![0; n as usize];
        b.read_region(remote.id, 0, &mut got);
        assert!(got == data, "write of {n} bytes landed whole");
        if let Some(imm) = imm {
            assert_eq!((cb[0].op, cb[0].imm, cb[0].len), (CqOp::RecvWriteImm, imm, n as u32));
            b.post_recv(&[BufId::from_wr_id(cb[0].wr_id)]);
        }
        // And back: read what b holds, shifted.
        let back = pattern(k + 50, n as usize);
        b.write_region(remote.id, 0, &back);
        let wr = rdma(RdmaOp::Read, to_b, &local, &remote, 0, n, 20 + k as u64);
        assert_eq!(a.post_rdma(&[wr]), 1);
        let (ca, _) = drive(&mut a, &mut b, SEC, |ca, _| !ca.is_empty());
        assert_eq!((ca[0].op, ca[0].status), (CqOp::Read, CqStatus::Ok));
        let mut got = vec![0; n as usize];
        a.read_region(local.id, 0, &mut got);
        assert!(got == back, "read of {n} bytes");
    }
}

/// A region deregistered while a peer reads it goes at once, as on EFA:
/// the read fails at the reader (what was never sent comes as a notice),
/// unless its every byte had arrived; later reads are refused. A queue's
/// own read into a region keeps it until that read completes.
#[test]
fn a_region_revoked_while_served_fails_the_unfinished_read() {
    let mut a = UdpDevice::new(cfg()).unwrap();
    // Two packets in flight at most: a long read is served over many turns.
    let mut b = UdpDevice::new(UdpConfig { window: Window::Fixed(2), ..cfg() }).unwrap();
    let to_b = a.insert_addr(&b.addr()).unwrap();
    let len = 100_000u64;
    let local = a.register(len, Access::empty()).unwrap();
    let mut out = [Cqe::default(); 8];
    for (n, finished) in [(len, false), (100, true)] {
        let remote = b.register(len, Access::REMOTE_READ).unwrap();
        b.write_region(remote.id, 0, &pattern(3, len as usize));
        assert_eq!(a.post_rdma(&[rdma(RdmaOp::Read, to_b, &local, &remote, 0, n, 1)]), 1);
        assert_eq!(a.revoke(local.id), Err(DeviceError::Busy), "a's read writes it");
        let end = Instant::now() + SEC;
        while b.region_users(remote.id).unwrap().served == 0 {
            assert!(Instant::now() < end, "the request never came");
            assert_eq!(b.poll(&mut out), 0);
        }
        let mut ca = Vec::new();
        if finished {
            // Every byte arrives (one packet), its acknowledgement not yet.
            ca = drive_one(&mut a, |ca| !ca.is_empty());
            assert_eq!(b.region_users(remote.id).unwrap().served, 1, "held until acknowledged");
        }
        assert_eq!(b.revoke(remote.id), Ok(()));
        assert_eq!(b.region_users(remote.id), None, "gone at once");
        if !finished {
            ca = drive(&mut a, &mut b, SEC, |ca, _| !ca.is_empty()).0;
        }
        let want = if finished { CqStatus::Ok } else { CqStatus::RemoteAccess };
        assert_eq!((ca[0].op, ca[0].status), (CqOp::Read, want), "a read of {n} bytes");
        // Later reads of it are refused.
        assert_eq!(a.post_rdma(&[rdma(RdmaOp::Read, to_b, &local, &remote, 0, 10, 2)]), 1);
        let (ca, _) = drive(&mut a, &mut b, SEC, |ca, _| !ca.is_empty());
        assert_eq!((ca[0].wr_id, ca[0].status), (2, CqStatus::RemoteAccess));
    }
    assert_eq!(b.stats().reads_revoked, 2);
    // The serve slots were freed: nothing in flight is left behind.
    let end = Instant::now() + SEC;
    while !b.is_quiet() {
        assert!(Instant::now() < end, "b never settled");
        a.poll(&mut out);
        b.poll(&mut out);
    }
    assert_eq!(a.revoke(local.id), Ok(()), "a's reads are over");
}

#[test]
fn protection_violations_are_terminated_and_leave_the_target_untouched() {
    let (mut a, mut b) = pair(cfg());
    let to_b = a.insert_addr(&b.addr()).unwrap();
    let local = a.register(100_000, Access::empty()).unwrap();
    a.write_region(local.id, 0, &pattern(1, 100_000));
    let ro = b.register(50_000, Access::REMOTE_READ).unwrap();
    let wo = b.register(50_000, Access::REMOTE_WRITE).unwrap();
    let cases = [
        // Unknown key; past the end (a multi-fragment write whose first
        // fragments would fit); a right not granted; an address that
        // wraps.
        (
            RdmaOp::Write { imm: None },
            RdmaWr { remote_key: 12345, ..rdma(RdmaOp::Read, to_b, &local, &wo, 0, 10, 0) },
        ),
        (RdmaOp::Write { imm: None }, rdma(RdmaOp::Read, to_b, &local, &wo, 40_000, 20_000, 0)),
        (RdmaOp::Write { imm: None }, rdma(RdmaOp::Read, to_b, &local, &ro, 0, 10, 0)),
        (RdmaOp::Read, rdma(RdmaOp::Read, to_b, &local, &wo, 0, 10, 0)),
        (RdmaOp::Read, rdma(RdmaOp::Read, to_b, &local, &ro, 49_999, 2, 0)),
        (
            RdmaOp::Read,
            RdmaWr { remote_addr: u64::MAX - 3, ..rdma(RdmaOp::Read, to_b, &local, &ro, 0, 10, 0) },
        ),
    ];
    for (k, (op, wr)) in cases.into_iter().enumerate() {
        let wr = RdmaWr { op, wr_id: k as u64, ..wr };
        assert_eq!(a.post_rdma(&[wr]), 1);
        let (ca, _) = drive(&mut a, &mut b, SEC, |ca, _| !ca.is_empty());
        assert_eq!((ca[0].wr_id, ca[0].status), (k as u64, CqStatus::RemoteAccess), "case {k}");
    }
    assert!(b.region_vec(&wo).iter().all(|&x| x == 0), "nothing written");
    assert!(b.stats().terminates_sent >= 6 && a.stats().terminates_received >= 6);
    // The session goes on: a good write after the refusals.
    let wr = rdma(RdmaOp::Write { imm: None }, to_b, &local, &wo, 0, 50_000, 9);
    a.post_rdma(&[wr]);
    let (ca, _) = drive(&mut a, &mut b, SEC, |ca, _| !ca.is_empty());
    assert_eq!(ca[0].status, CqStatus::Ok);
    assert_eq!(b.region_vec(&wo), pattern(1, 50_000));
}

#[test]
fn scripted_drops_are_resent_and_delivered_once() {
    let (mut a, mut b) = pair(cfg());
    let to_b = a.insert_addr(&b.addr()).unwrap();
    let bufs: Vec<BufId> = (0..64).map(BufId).collect();
    b.post_recv(&bufs);
    a.please_drop(5);
    for i in 0..20u32 {
        send(&mut a, to_b, BufId(100 + i), &i.to_le_bytes(), u64::from(i));
    }
    let (ca, cb) = drive(&mut a, &mut b, SEC, |ca, cb| ca.len() == 20 && cb.len() == 20);
    assert!(ca.iter().all(|c| c.status == CqStatus::Ok));
    let mut got: Vec<u32> = cb
        .iter()
        .map(|c| u32::from_le_bytes(b.held(BufId::from_wr_id(c.wr_id))[..4].try_into().unwrap()))
        .collect();
    got.sort();
    assert_eq!(got, (0..20).collect::<Vec<_>>(), "each exactly once");
    assert_eq!(b.stats().please_dropped, 5);
    assert!(a.stats().retransmits >= 5, "{:?}", a.stats());
}

#[test]
fn a_receiver_without_buffers_is_back_pressure_not_loss() {
    let (mut a, mut b) = pair(cfg());
    let to_b = a.insert_addr(&b.addr()).unwrap();
    for i in 0..10u32 {
        send(&mut a, to_b, BufId(i), &[i as u8; 100], u64::from(i));
    }
    // Nothing posted: the sends wait, refused "not ready".
    let end = Instant::now() + Duration::from_millis(50);
    let mut out = [Cqe::default(); 16];
    while Instant::now() < end {
        assert_eq!(a.poll(&mut out), 0, "a send completed with no buffer at the receiver");
        assert_eq!(b.poll(&mut out), 0);
    }
    assert!(b.stats().rnr_sent > 0 && a.stats().rnr_received > 0, "{:?}", b.stats());
    let bufs: Vec<BufId> = (0..10).map(BufId).collect();
    b.post_recv(&bufs);
    let (ca, cb) = drive(&mut a, &mut b, SEC, |ca, cb| ca.len() == 10 && cb.len() == 10);
    assert!(ca.iter().all(|c| c.status == CqStatus::Ok));
    assert!(cb.iter().all(|c| c.len == 100));
}

/// A receiver that took a packet and is dropped before it would have
/// acknowledged it (the ack delay) acknowledges it as it goes: the send
/// completes, it is not resent to a closed socket until the peer timeout.
#[test]
fn a_device_dropped_right_after_receiving_still_acknowledges() {
    let ack_delay = Duration::from_secs(3600);
    let (mut a, mut b) = pair(UdpConfig { ack_delay, ..cfg() });
    let to_b = a.insert_addr(&b.addr()).unwrap();
    assert_eq!(b.post_recv(&[BufId(0)]), 1);
    send(&mut a, to_b, BufId(1), b"last words", 5);
    drive(&mut a, &mut b, SEC, |_, cb| !cb.is_empty());
    assert_eq!(b.stats().acks_sent, 0, "nothing asked for an ack yet");
    drop(b);
    let ca = drive_one(&mut a, |ca| !ca.is_empty());
    assert_eq!((ca[0].wr_id, ca[0].status), (5, CqStatus::Ok));
    assert_eq!(a.stats().retransmits, 0);
}

/// A device says when it has nothing to do until a datagram comes (a
/// host may then wait on its socket instead of polling it): not while a
/// packet is in flight, an acknowledgement owed or a completion waiting.
#[test]
fn a_device_is_quiet_only_with_nothing_in_flight_owed_or_waiting() {
    let (mut a, mut b) = pair(cfg());
    assert!(a.is_quiet() && b.is_quiet(), "new");
    let to_b = a.insert_addr(&b.addr()).unwrap();
    assert_eq!(b.post_recv(&[BufId(0)]), 1);
    send(&mut a, to_b, BufId(1), b"hi", 5);
    assert!(!a.is_quiet(), "in flight");
    // The datagram makes b's socket readable.
    let mut p = libc::pollfd { fd: b.rx_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd, of b's open socket.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 10_000) }, 1);
    let mut out = [Cqe::default(); 1];
    assert_eq!(b.poll(&mut out), 1);
    assert!(!b.is_quiet(), "an acknowledgement is owed");
    drive(&mut a, &mut b, SEC, |ca, _| !ca.is_empty());
    assert!(a.is_quiet() && b.is_quiet(), "all acknowledged and taken");
}

/// Polls `a` alone until `done` holds.
fn drive_one(a: &mut UdpDevice, mut done: impl FnMut(&[Cqe]) -> bool) -> Vec<Cqe> {
    let mut ca = Vec::new();
    let mut out = [Cqe::default(); 32];
    let end = Instant::now() + SEC;
    while !done(&ca) {
        assert!(Instant::now() < end, "not done: {ca:?}");
        let k = a.poll(&mut out);
        ca.extend_from_slice(&out[..k]);
    }
    ca
}

#[test]
fn a_silent_peer_fails_outstanding_work_after_the_peer_timeout() {
    let c = UdpConfig { peer_timeout: Duration::from_millis(100), ..cfg() };
    let (mut a, b) = pair(c);
    let to_b = a.insert_addr(&b.addr()).unwrap();
    drop(b);
    let start = Instant::now();
    send(&mut a, to_b, BufId(0), b"anyone?", 1);
    let got = drive_one(&mut a, |got| !got.is_empty());
    assert_eq!((got[0].wr_id, got[0].status), (1, CqStatus::PeerUnreachable));
    assert!(start.elapsed() >= Duration::from_millis(100), "{:?} {:?}", start.elapsed(), a.stats());
    assert!(a.stats().retransmits > 0 && a.stats().peers_lost == 1);
    // Work posted to a lost peer fails at once.
    send(&mut a, to_b, BufId(0), b"again", 2);
    let mut out = [Cqe::default(); 4];
    assert_eq!(a.poll(&mut out), 1);
    assert_eq!(out[0].status, CqStatus::PeerUnreachable);
}

#[test]
fn a_restarted_peer_is_told_apart_and_the_old_work_fails() {
    let (mut a, b) = pair(cfg());
    let port = b.local_addr();
    let old = b.addr();
    let to_old = a.insert_addr(&old).unwrap();
    drop(b);
    // The peer comes back on the same port with a new connid.
    let mut b2 = UdpDevice::new(UdpConfig { bind: port, ..cfg() }).unwrap();
    assert_ne!(b2.addr().connid, old.connid);
    b2.post_recv(&[BufId(0), BufId(1)]);
    // What a sends to the old incarnation is answered "bad session".
    send(&mut a, to_old, BufId(0), b"old", 1);
    let (ca, cb) = drive(&mut a, &mut b2, SEC, |ca, _| !ca.is_empty());
    assert_eq!(ca[0].status, CqStatus::PeerUnreachable);
    assert!(cb.is_empty(), "nothing for the old incarnation is delivered");
    assert_eq!(b2.stats().stale, 1);
    // The new one is reachable, and when it speaks, a knows it as new.
    let to_new = a.insert_addr(&b2.addr()).unwrap();
    assert_ne!(to_new, to_old);
    send(&mut a, to_new, BufId(0), b"new", 2);
    let (ca, cb) = drive(&mut a, &mut b2, SEC, |ca, cb| !ca.is_empty() && !cb.is_empty());
    assert_eq!(ca[0].status, CqStatus::Ok);
    assert_eq!(&b2.held(BufId::from_wr_id(cb[0].wr_id))[..3], b"new");
}

/// The header of the first Send of session 5 from the socket `raw` to `b`.
fn first_send(flags: u8, b: &UdpDevice, raw: &UdpSocket) -> Hdr {
    Hdr {
        ty: Type::Send,
        flags,
        src_connid: 5,
        dst_connid: b.addr().connid,
        seq: 0,
        base: 0,
        ack: 0,
        staging: 0,
        credits: 0,
        src_qpn: raw.local_addr().unwrap().port(),
    }
}

#[test]
fn malformed_datagrams_are_counted_and_dropped() {
    let (mut a, mut b) = pair(cfg());
    b.post_recv(&[BufId(0), BufId(1), BufId(2)]);
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = b.local_addr();
    let mut good = [0u8; hdr::HDR_LEN + 4];
    first_send(0, &b, &raw).emit(&mut good);
    let len = good.len();
    hdr::seal(&mut good[..hdr::HDR_LEN], len);
    let mut bad_version = good;
    bad_version[0] = 9;
    let mut bad_write = good;
    bad_write[1] = Type::Write as u8;
    for d in [&[][..], &[1, 2, 3][..], &bad_version[..], &bad_write[..], &good[..hdr::HDR_LEN - 1]]
    {
        raw.send_to(d, to).unwrap();
    }
    raw.send_to(&good, to).unwrap();
    let end = Instant::now() + SEC;
    let mut out = [Cqe::default(); 8];
    let mut got = Vec::new();
    while got.is_empty() || b.stats().malformed < 5 {
        assert!(Instant::now() < end, "{:?}", b.stats());
        let k = b.poll(&mut out);
        got.extend_from_slice(&out[..k]);
        a.poll(&mut out[..0]);
    }
    assert_eq!(got.len(), 1, "the good one, from an unknown sender");
    assert_eq!(got[0].len, 4);
    assert!(matches!(got[0].src, Source::Unknown { .. }));
    assert_eq!(b.stats().malformed, 5, "{:?}", b.stats());
}

/// Polls both until `done` holds of them; what a completed.
fn settle(
    a: &mut UdpDevice,
    b: &mut UdpDevice,
    done: impl Fn(&UdpDevice, &UdpDevice) -> bool,
) -> Vec<Cqe> {
    let mut ca = Vec::new();
    let mut out = [Cqe::default(); 32];
    let end = Instant::now() + SEC;
    while !done(a, b) {
        assert!(Instant::now() < end, "not settled: a {:?} b {:?}", a.stats(), b.stats());
        let k = a.poll(&mut out);
        ca.extend_from_slice(&out[..k]);
        b.poll(&mut out[..0]);
    }
    ca
}

/// Sends `n` messages of `len` bytes from a to b over a wire with
/// `faults`, which damage datagrams but lose none; every one must arrive
/// once, whole, and every damaged datagram must have been dropped by the
/// device that received it (what it carried, resent), none taken.
fn through_damage(faults: Faults, n: u32, len: usize) -> (UdpStats, UdpStats) {
    let c = UdpConfig { faults, min_rto: Duration::from_micros(100), ..cfg() };
    let (mut a, mut b) = pair(c);
    let to_b = a.insert_addr(&b.addr()).unwrap();
    let bufs: Vec<BufId> = (0..n).map(BufId).collect();
    assert_eq!(b.post_recv(&bufs), n as usize);
    for i in 0..n {
        send(&mut a, to_b, BufId(i), &pattern(i as usize, len), u64::from(i));
    }
    let n = n as usize;
    let (ca, cb) = drive(&mut a, &mut b, SEC, |ca, cb| ca.len() == n && cb.len() == n);
    assert!(ca.iter().all(|c| c.status == CqStatus::Ok), "{ca:?}");
    let mut got: Vec<&[u8]> =
        cb.iter().map(|c| &b.held(BufId::from_wr_id(c.wr_id))[..c.len as usize]).collect();
    let mut want: Vec<Vec<u8>> = (0..n).map(|i| pattern(i, len)).collect();
    got.sort();
    want.sort();
    assert!(got == want, "each exactly once, whole");
    // What is still on its way is caught when it lands.
    let damaged = |a: &UdpDevice, b: &UdpDevice| {
        let (fa, fb) = (a.fault_stats(), b.fault_stats());
        fa.corrupted + fa.truncated + fb.corrupted + fb.truncated
    };
    let caught = |s: UdpStats| s.bad_checksum + s.malformed;
    settle(&mut a, &mut b, |a, b| caught(a.stats()) + caught(b.stats()) >= damaged(a, b));
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(caught(sa) + caught(sb), damaged(&a, &b), "a {sa:?} b {sb:?}");
    // Acknowledgements, all header, cut short are too short to check.
    assert!(caught(sa) > 0 && sb.bad_checksum > 0, "a {sa:?} b {sb:?}");
    assert!(sa.retransmits > 0, "{sa:?}");
    for s in [sa, sb] {
        assert_eq!((s.peers_lost, s.stale, s.terminates_received), (0, 0, 0), "{s:?}");
    }
    (sa, sb)
}

/// A bit flipped anywhere in a datagram's headers (the Sends here have no
/// payload, so every flip lands in headers, theirs or the
/// acknowledgements'), or a datagram cut short, fails its checksum: it is
/// dropped as if lost, and resent; no session ends for it.
#[test]
fn damaged_headers_are_dropped_counted_and_resent() {
    for seed in 1..=3 {
        let corrupt = Faults { seed, corrupt_ppm: 300_000, ..Faults::default() };
        through_damage(corrupt, 120, 0);
        // Cut short: in the payload the length in the check catches it.
        let truncate = Faults { seed, truncate_ppm: 300_000, ..Faults::default() };
        through_damage(truncate, 100, 2000);
    }
}

/// A forged control packet that would end the session (Bad Session) or
/// fail an operation (Terminate), with any one bit of its headers flipped,
/// is dropped and counted, and ends nothing; intact, it does what it says.
#[test]
fn damaged_control_packets_end_nothing() {
    let (mut a, mut b) = pair(cfg());
    let to_b = a.insert_addr(&b.addr()).unwrap();
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (a_addr, b_addr) = (a.addr(), b.addr());
    // As b would send them: b's port in the header is where a answers.
    let forged = |ty: Type, seq: u32, ext: &dyn Fn(&mut [u8])| {
        let hdrs = hdr::HDR_LEN + ty.ext_len(0);
        let mut d = vec![0u8; hdrs];
        let h = Hdr {
            ty,
            flags: 0,
            src_connid: b_addr.connid,
            dst_connid: a_addr.connid,
            seq,
            base: 0,
            ack: 0,
            staging: 0,
            credits: 1,
            src_qpn: b_addr.qpn,
        };
        h.emit(&mut d);
        ext(&mut d);
        hdr::seal(&mut d, hdrs);
        d
    };
    // Sends every one-bit damage of `d` to a, and waits until a dropped
    // them all; a completes nothing meanwhile.
    let sweep = |a: &mut UdpDevice, b: &mut UdpDevice, d: &[u8]| {
        let before = a.stats().bad_checksum + a.stats().malformed;
        for bit in 0..d.len() * 8 {
            let mut c = d.to_vec();
            c[bit / 8] ^= 1 << (bit % 8);
            raw.send_to(&c, a.local_addr()).unwrap();
        }
        let want = before + d.len() as u64 * 8;
        let ca = settle(a, b, |a, _| a.stats().bad_checksum + a.stats().malformed >= want);
        assert!(ca.is_empty(), "{ca:?}");
        assert_eq!(a.stats().bad_checksum + a.stats().malformed, want, "{:?}", a.stats());
    };

    // A send waiting for a buffer at b (refused "not ready", resent).
    send(&mut a, to_b, BufId(0), b"m0", 0);
    let terminate = |seq: u32| {
        let t = TermHdr { seq: 0, layer_etype: term::LAYER_ETYPE, code: term::ACCESS_RIGHTS };
        forged(Type::Terminate, 0, &move |d: &mut [u8]| TermHdr { seq, ..t }.emit(d))
    };
    sweep(&mut a, &mut b, &terminate(0));
    b.post_recv(&[BufId(0)]);
    let (ca, _) = drive(&mut a, &mut b, SEC, |ca, cb| !ca.is_empty() && !cb.is_empty());
    assert_eq!((ca[0].status, &b.held(BufId(0))[..2]), (CqStatus::Ok, &b"m0"[..]));
    assert_eq!(a.stats().terminates_received, 0);
    // Intact, it refuses the next send.
    send(&mut a, to_b, BufId(1), b"m1", 1);
    raw.send_to(&terminate(1), a.local_addr()).unwrap();
    let (ca, _) = drive(&mut a, &mut b, SEC, |ca, _| !ca.is_empty());
    assert_eq!((ca[0].wr_id, ca[0].status), (1, CqStatus::RemoteAccess));

    // Bad Session: `seq` names the connid a addressed, b's.
    let bad_session = forged(Type::BadSession, b_addr.connid, &|_| {});
    sweep(&mut a, &mut b, &bad_session);
    b.post_recv(&[BufId(1)]);
    send(&mut a, to_b, BufId(2), b"m2", 2);
    let (ca, _) = drive(&mut a, &mut b, SEC, |ca, cb| !ca.is_empty() && !cb.is_empty());
    assert_eq!(ca[0].status, CqStatus::Ok, "the session goes on");
    assert_eq!((a.stats().peers_lost, b.stats().peers_lost), (0, 0));
    // Intact, it ends the session.
    raw.send_to(&bad_session, a.local_addr()).unwrap();
    settle(&mut a, &mut b, |a, _| a.stats().peers_lost == 1);
}

#[test]
fn faults_on_the_wire_lose_nothing_and_duplicate_nothing() {
    for (seed, drop_ppm) in [(1u64, 10_000u32), (2, 100_000), (3, 500_000)] {
        let faults = Faults {
            seed,
            drop_ppm,
            duplicate_ppm: 50_000,
            reorder_window: 4,
            delay_ppm: 50_000,
            delay_max_ns: 200_000,
            ..Faults::default()
        };
        let c = UdpConfig { faults, min_rto: Duration::from_micros(100), ..cfg() };
        let (mut a, mut b) = pair(c);
        let to_b = a.insert_addr(&b.addr()).unwrap();
        let bufs: Vec<BufId> = (0..128).map(BufId).collect();
        b.post_recv(&bufs);
        let n = 300u32;
        let mut sent = 0;
        let mut got = Vec::new();
        let mut acked = 0;
        let mut free: Vec<BufId> = (128..228).map(BufId).collect();
        let mut out = [Cqe::default(); 32];
        let end = Instant::now() + Duration::from_secs(60);
        while acked < n || got.len() < n as usize {
            assert!(Instant::now() < end, "drop {drop_ppm}: {acked} acked, {} got", got.len());
            if sent < n
                && let Some(buf) = free.pop()
            {
                send(&mut a, to_b, buf, &sent.to_le_bytes(), buf.wr_id());
                sent += 1;
            }
            let k = a.poll(&mut out);
            for c in &out[..k] {
                assert_eq!(c.status, CqStatus::Ok);
                free.push(BufId::from_wr_id(c.wr_id));
            }
            acked += k as u32;
            let k = b.poll(&mut out);
            for c in &out[..k] {
                let buf = BufId::from_wr_id(c.wr_id);
                got.push(u32::from_le_bytes(b.held(buf)[..4].try_into().unwrap()));
                b.post_recv(&[buf]);
            }
        }
        got.sort();
        assert_eq!(got, (0..n).collect::<Vec<_>>(), "drop {drop_ppm}: each exactly once");
        assert!(a.stats().retransmits > 0, "drop {drop_ppm}: {:?}", a.stats());
        let f = a.fault_stats();
        assert!(f.duplicated > 0, "drop {drop_ppm}: {f:?}");
        // How many datagrams meet a fate depends on how sends and
        // retransmits batch on the run's timing: at 1% of a few hundred,
        // possibly none is dropped (seen once in a loaded CI run).
        assert!(f.dropped > 0 || drop_ppm < 100_000, "drop {drop_ppm}: {f:?}");
    }
}

#[test]
fn a_domain_registration_serves_every_queue_that_attached_it() {
    let dom = UdpDomain::new(cfg());
    let mut a = dom.device().unwrap();
    let mut b = dom.device().unwrap();
    let mut c = UdpDevice::new(cfg()).unwrap();
    let mr = dom.register(4096, Access::REMOTE_WRITE).unwrap();
    a.attach(&mr).unwrap();
    b.attach(&mr).unwrap();
    assert_eq!(dom.deregister(&mr), Err(DeviceError::Busy), "queues use it");
    let src = c.register(16, Access::empty()).unwrap();
    c.write_region(src.id, 0, b"through either q");
    for (k, dev) in [&mut a, &mut b].into_iter().enumerate() {
        let ah = c.insert_addr(&dev.addr()).unwrap();
        let wr = RdmaWr {
            op: RdmaOp::Write { imm: None },
            ah,
            local: src.id,
            local_offset: 0,
            len: 16,
            remote_addr: mr.addr_at(100 * k as u64),
            remote_key: mr.key,
            wr_id: k as u64,
        };
        c.post_rdma(&[wr]);
        let (cc, _) = drive(&mut c, dev, SEC, |cc, _| !cc.is_empty());
        assert_eq!(cc[0].status, CqStatus::Ok);
    }
    let mut got = [0u8; 16];
    a.read_region(mr.id, 100, &mut got);
    assert_eq!(&got, b"through either q", "b's write, seen through a");
    a.deregister(mr.id).unwrap();
    b.deregister(mr.id).unwrap();
    assert_eq!(dom.deregister(&mr), Ok(()));
}

#[test]
fn update_region_fetches_combines_and_writes_back() {
    crate::device::checks::update_region_fetches_combines_and_writes_back(
        &mut UdpDevice::new(cfg()).unwrap(),
    );
}

#[test]
fn a_connid_set_before_traffic_is_the_one_peers_address() {
    let (mut a, mut b) = pair(cfg());
    b.set_connid(0x1234_5678);
    assert_eq!(b.addr().connid, 0x1234_5678);
    let to_b = a.insert_addr(&b.addr()).unwrap();
    assert_eq!(b.post_recv(&[BufId(0)]), 1);
    send(&mut a, to_b, BufId(1), b"qkey", 5);
    let (ca, cb) = drive(&mut a, &mut b, SEC, |ca, cb| !ca.is_empty() && !cb.is_empty());
    assert_eq!((ca[0].status, cb[0].len), (CqStatus::Ok, 4));
}

#[test]
fn short_keys_fit_32_bits_and_differ() {
    let domain = UdpDomain::new(UdpConfig { short_keys: true, ..cfg() });
    let mrs: Vec<Mr> = (0..64).map(|_| domain.register(64, Access::REMOTE_READ).unwrap()).collect();
    assert!(mrs.iter().all(|m| m.key <= u64::from(u32::MAX)), "{mrs:?}");
    let mut keys: Vec<u64> = mrs.iter().map(|m| m.key).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), mrs.len());
    assert!(keys.iter().any(|&k| k > 0xffff), "random over 32 bits, not a counter");
}

/// Receive buffers are taken in the order they were posted, as EFA takes
/// a QP's receives, whatever their numbers; by Sends and by Writes with
/// immediate data alike.
#[test]
fn receive_buffers_are_taken_in_the_order_posted() {
    let (mut a, mut b) = pair(cfg());
    let to_b = a.insert_addr(&b.addr()).unwrap();
    let order: Vec<BufId> = [5, 2, 9, 0, 7, 3, 8, 1].map(BufId).to_vec();
    assert_eq!(b.post_recv(&order[..4]), 4);
    assert_eq!(b.post_recv(&order[4..]), 4);
    let local = a.register(64, Access::empty()).unwrap();
    let remote = b.register(64, Access::REMOTE_WRITE).unwrap();
    for (i, &want) in order.iter().enumerate() {
        // One at a time, so that the wire's order does not matter.
        if i % 2 == 0 {
            send(&mut a, to_b, BufId(100), &pattern(i, 10), i as u64);
        } else {
            let wr = rdma(RdmaOp::Write { imm: Some(i as u32) }, to_b, &local, &remote, 0, 8, 0);
            assert_eq!(a.post_rdma(&[wr]), 1);
        }
        let (_, cb) = drive(&mut a, &mut b, SEC, |ca, cb| !ca.is_empty() && !cb.is_empty());
        assert_eq!(BufId::from_wr_id(cb[0].wr_id), want, "receive {i}");
        if i % 2 == 0 {
            assert_eq!(&b.held(want)[..10], &pattern(i, 10)[..]);
        } else {
            assert_eq!((cb[0].op, cb[0].imm), (CqOp::RecvWriteImm, i as u32));
        }
    }
}

/// A Send with immediate data delivers its payload, of any size up to
/// the mtu, into the next buffer, and completes there as a receive with
/// immediate data carrying the value; a Send without is a plain receive.
#[test]
fn a_send_with_immediate_data_carries_it_to_the_receiver() {
    let (mut a, mut b) = pair(cfg());
    let to_b = a.insert_addr(&b.addr()).unwrap();
    let bufs: Vec<BufId> = (0..16).map(BufId).collect();
    assert_eq!(b.post_recv(&bufs), 16);
    let sizes = [0usize, 1, 64, 8192];
    for (i, &len) in sizes.iter().enumerate() {
        let buf = BufId(100 + i as u32);
        a.held_mut(buf)[..len].copy_from_slice(&pattern(i, len));
        let wr = SendWr { ah: to_b, buf, len: len as u32, data: None, wr_id: i as u64 };
        // Byte order as given: the device passes the value through.
        let imm = 0x0102_0300 + i as u32;
        assert_eq!(a.post_send_imm(&[wr], &[Some(imm)]), 1);
        let (ca, cb) = drive(&mut a, &mut b, SEC, |ca, cb| !ca.is_empty() && !cb.is_empty());
        assert_eq!((ca[0].op, ca[0].status, ca[0].wr_id), (CqOp::Send, CqStatus::Ok, i as u64));
        let c = cb[0];
        let got = BufId::from_wr_id(c.wr_id);
        let want = (CqOp::RecvImm, CqStatus::Ok, len, imm);
        assert_eq!((c.op, c.status, c.len as usize, c.imm), want);
        assert!(b.held(got)[..len] == pattern(i, len)[..], "{len} bytes");
    }
    // One with and one without in one call; then a plain post_send.
    for k in 0..2u32 {
        a.held_mut(BufId(100 + k))[..2].copy_from_slice(b"ab");
    }
    let wr = |k: u32| SendWr { ah: to_b, buf: BufId(100 + k), len: 2, data: None, wr_id: 50 };
    assert_eq!(a.post_send_imm(&[wr(0), wr(1)], &[None, Some(0)]), 2);
    send(&mut a, to_b, BufId(102), b"cd", 51);
    let (_, cb) = drive(&mut a, &mut b, SEC, |ca, cb| ca.len() == 3 && cb.len() == 3);
    let mut imms: Vec<_> = cb.iter().map(|c| (c.op == CqOp::RecvImm).then_some(c.imm)).collect();
    imms.sort();
    assert_eq!(imms, [None, None, Some(0)], "an immediate of 0 is one");
    assert!(cb.iter().all(|c| c.status == CqStatus::Ok && c.len == 2), "{cb:?}");
    // Larger than the mtu: refused locally, as without immediate data.
    let big = SendWr { ah: to_b, buf: BufId(100), len: 8193, data: None, wr_id: 7 };
    assert_eq!(a.post_send_imm(&[big], &[Some(1)]), 1);
    let (ca, _) = drive(&mut a, &mut b, SEC, |ca, _| !ca.is_empty());
    assert_eq!((ca[0].wr_id, ca[0].status), (7, CqStatus::LocalError));
}

/// A Send with immediate data whose value (or its flag) was damaged on the
/// way fails the headers' check: dropped, counted, nothing delivered; the
/// same datagram intact is delivered with its value.
#[test]
fn a_send_with_damaged_immediate_data_fails_the_check() {
    let mut b = UdpDevice::new(cfg()).unwrap();
    assert_eq!(b.post_recv(&[BufId(0), BufId(1)]), 2);
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    let hdrs = hdr::HDR_LEN + SendImmHdr::LEN;
    let mut d = vec![0u8; hdrs + 4];
    first_send(flags::IMM, &b, &raw).emit(&mut d);
    SendImmHdr { imm: 0xcafe_f00d }.emit(&mut d);
    d[hdrs..].copy_from_slice(b"data");
    let len = d.len();
    hdr::seal(&mut d[..hdrs], len);
    let mut damaged = Vec::new();
    for bit in 0..32 {
        let mut c = d.clone();
        c[hdr::HDR_LEN + bit / 8] ^= 1 << (bit % 8);
        damaged.push(c);
    }
    // Its flag lost: the value would be taken for payload.
    let mut c = d.clone();
    c[2] &= !flags::IMM;
    damaged.push(c);
    for c in &damaged {
        raw.send_to(c, b.local_addr()).unwrap();
    }
    let mut out = [Cqe::default(); 8];
    let end = Instant::now() + SEC;
    while b.stats().bad_checksum < damaged.len() as u64 {
        assert!(Instant::now() < end, "{:?}", b.stats());
        assert_eq!(b.poll(&mut out), 0, "a damaged one delivered");
    }
    assert_eq!(b.stats().bad_checksum, damaged.len() as u64, "{:?}", b.stats());
    raw.send_to(&d, b.local_addr()).unwrap();
    let c = loop {
        assert!(Instant::now() < end, "the intact one never came");
        if b.poll(&mut out) > 0 {
            break out[0];
        }
    };
    assert_eq!((c.op, c.len, c.imm), (CqOp::RecvImm, 4, 0xcafe_f00d));
    assert_eq!(&b.held(BufId::from_wr_id(c.wr_id))[..4], b"data");
}

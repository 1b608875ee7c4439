//! Two-sided messaging on the sim device: every protocol at its sizes,
//! reordering, msg_id wrap-around, unexpected messages, tag matching,
//! directed receives, truncation, inject and CQ data, back-pressure. The
//! wire's faults, which udp shares, are `endpoint_wire.rs`'s.

use crate::common;

use common::{Mem, World, pattern, span};
use efapoll::device::Mr;
use efapoll::device::fault::Faults;
use efapoll::device::sim::SimConfig;
use efapoll::endpoint::{Config, Error, Op, PeerId, Span, Status, TagMatch};
use efapoll::wire::{Packet, PacketType, ReqFlags};

const MTU: u64 = 8192;

fn reordering(seed: u64) -> SimConfig {
    SimConfig { seed, faults: Faults::reorder(seed, 8), ..SimConfig::default() }
}

/// Sends `count` messages of `len` bytes from 0 to 1 (receives posted
/// first or last), and checks each landed byte-exact in the receive
/// posted for it, in send order.
fn transfer(w: &mut World, len: u64, count: usize, tagged: bool, post_first: bool) {
    let to_b = w.connect(0, 1);
    let stride = len.max(1);
    let src = w.register(0, stride * count as u64);
    let dst = w.register(1, stride * count as u64);
    w.fill(0, &src, len ^ 0x55);
    let (sends0, recvs0) = (w.done[0].len(), w.done[1].len());
    let post = |w: &mut World| {
        for i in 0..count as u64 {
            let s = span(&dst, i * stride, len);
            if tagged {
                w.eps[1].trecv(s, TagMatch { tag: 9, ignore: 0 }, None, i).unwrap();
            } else {
                w.eps[1].recv(s, None, i).unwrap();
            }
        }
    };
    if post_first {
        post(w);
    }
    for i in 0..count as u64 {
        let s = span(&src, i * stride, len);
        loop {
            let r = if tagged { w.eps[0].tsend(to_b, s, 9, i) } else { w.eps[0].send(to_b, s, i) };
            match r {
                Ok(()) => break,
                Err(Error::Again) => {
                    w.step();
                }
                Err(e) => panic!("send: {e}"),
            }
        }
    }
    if !post_first {
        w.settle();
        post(w);
    }
    w.drive_until(1_000_000, |w| {
        w.done[0].len() - sends0 == count && w.done[1].len() - recvs0 == count
    });
    let recvs: Vec<_> = w.done[1][recvs0..].to_vec();
    for c in &recvs {
        assert_eq!(
            (c.op, c.status, c.len, c.peer.is_some()),
            (Op::Recv, Status::Ok, len, true),
            "len {len}"
        );
    }
    let got = w.eps[1].mem(dst.id);
    for i in 0..count as u64 {
        for j in 0..len {
            let at = i * stride + j;
            assert_eq!(
                got[at as usize],
                pattern(len ^ 0x55, at),
                "len {len}: message {i} byte {j}"
            );
        }
    }
    // Eager messages complete in send order too.
    if len < 1024 {
        let order: Vec<u64> = recvs.iter().map(|c| c.ctx).collect();
        assert_eq!(order, (0..count as u64).collect::<Vec<_>>(), "len {len}");
    }
    assert!(w.done[0][sends0..].iter().all(|c| c.op == Op::Send && c.status == Status::Ok));
}

#[test]
fn every_protocol_around_every_threshold_with_reordering() {
    // Before the handshake a tagged eager REQ has 16 + 40 bytes of header;
    // after it, 16 + 4 (connid).
    let eager_before = MTU - 56;
    let eager_after = MTU - 20;
    let sizes = [
        0,
        1,
        eager_before - 1,
        eager_before,
        eager_before + 1,
        eager_after,
        eager_after + 1,
        65535,
        65536,
        65537,
        1 << 20,
    ];
    for seed in 1..=6 {
        for &len in &sizes {
            let mut w = World::pair(reordering(seed * 1000 + len), Config::default());
            transfer(&mut w, len, 3, seed % 2 == 0, seed % 3 != 0);
        }
    }
}

#[test]
fn the_eager_limit_grows_after_the_handshake() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    assert_eq!(w.eps[0].max_eager_size(to_b, true), MTU - 56);
    transfer(&mut w, 1, 1, true, true);
    assert!(w.eps[0].peer_handshake_received(to_b));
    assert_eq!(w.eps[0].max_eager_size(to_b, true), MTU - 20);
    assert_eq!(w.eps[0].max_eager_size(to_b, false), MTU - 12);
    // Exactly at the limit: one eager packet; one byte more: medium.
    let before = w.eps[0].counters().tx(PacketType::EagerTagRtm);
    transfer(&mut w, MTU - 20, 1, true, true);
    assert_eq!(w.eps[0].counters().tx(PacketType::EagerTagRtm), before + 1);
    transfer(&mut w, MTU - 19, 1, true, true);
    assert_eq!(w.eps[0].counters().tx(PacketType::MediumTagRtm), 2);
}

#[test]
fn sixteen_mib_long_cts() {
    for seed in [1, 2] {
        let mut w = World::pair(reordering(seed), Config::default());
        transfer(&mut w, 16 << 20, 1, false, seed == 1);
        let c = w.eps[1].counters();
        // CTS flow control: many windows, each granting 32 packets.
        assert!(c.tx(PacketType::Cts) > 50, "{}", c.tx(PacketType::Cts));
        assert_eq!(c.drops_total(), 0);
    }
}

#[test]
fn reordered_eager_messages_are_held_once_and_delivered_in_send_order() {
    // Receives posted before the messages arrive (each packet landed or
    // held on arrival, and drained, without its full parse) and after
    // (the full path: every message unexpected): the same deliveries, and
    // every packet counted once.
    for (seed, post_first) in [(1, true), (2, false), (3, true), (4, false)] {
        let mut w = World::pair(
            SimConfig { seed, faults: Faults::reorder(seed, 16), ..SimConfig::default() },
            Config::default(),
        );
        transfer(&mut w, 64, 1, false, true);
        let before = w.eps[1].counters().rx(PacketType::EagerMsgRtm);
        transfer(&mut w, 64, 300, false, post_first);
        let c = w.eps[1].counters();
        assert_eq!(c.rx(PacketType::EagerMsgRtm) - before, 300, "each packet counted once");
        assert!(c.reordered > 0, "the window reordered something");
        assert_eq!(c.unexpected, if post_first { 0 } else { 300 });
        assert_eq!(c.drops_total(), 0);
    }
}

#[test]
fn msg_id_wraps_around() {
    let cfg = Config { first_msg_id: u32::MAX - 20, ..Config::default() };
    for seed in 1..=3 {
        let mut w = World::pair(reordering(seed), cfg);
        transfer(&mut w, 100, 60, false, true);
        transfer(&mut w, 70_000, 4, true, false);
        assert_eq!(w.eps[1].counters().drops_total(), 0);
    }
}

#[test]
fn unexpected_messages_wait_for_their_receives() {
    for &len in &[5u64, 30_000, 200_000] {
        let mut w = World::pair(reordering(len), Config::default());
        transfer(&mut w, len, 10, true, false);
        assert_eq!(w.eps[1].counters().unexpected, 10, "len {len}");
    }
}

#[test]
fn a_receiver_that_reposts_after_each_progress_keeps_up_with_a_sender_far_ahead() {
    // Every message is in the receiver's device before it starts, and it
    // keeps 32 receives posted, reposting after each progress. A progress
    // call handles one burst of completions, so each message finds its
    // receive; one that drained the device would leave most unexpected.
    const N: u64 = 256;
    let sim = SimConfig { rx_depth: 512, ..SimConfig::default() };
    let mut w = World::pair(sim, Config::default());
    let to_b = w.connect(0, 1);
    let src = w.register(0, 64);
    let dst = w.register(1, 64);
    for i in 0..N {
        while let Err(e) = w.eps[0].send(to_b, span(&src, 0, 64), i) {
            assert_eq!(e, Error::Again);
            w.eps[0].progress();
        }
    }
    while w.eps[0].progress() {}
    assert!(w.fabric.pending_total() as u64 >= N, "all {N} in flight to the receiver");
    let (mut posted, mut received) = (0, 0);
    for _ in 0..10_000 {
        while posted < N && posted - received < 32 {
            w.eps[1].recv(span(&dst, 0, 64), None, posted).unwrap();
            posted += 1;
        }
        w.eps[1].progress();
        while let Some(c) = w.eps[1].poll_cq() {
            assert_eq!((c.status, c.ctx), (Status::Ok, received));
            received += 1;
        }
        if received == N {
            break;
        }
    }
    assert_eq!(received, N);
    assert_eq!(w.eps[1].counters().unexpected, 0);
}

#[test]
fn unordered_endpoints_deliver_everything() {
    let cfg = Config { ordered: false, ..Config::default() };
    let mut w = World::pair(reordering(9), cfg);
    let to_b = w.connect(0, 1);
    let src = w.register(0, 64 * 100);
    let dst = w.register(1, 64 * 100);
    w.fill(0, &src, 1);
    for i in 0..100 {
        w.eps[1].recv(span(&dst, i * 64, 64), None, i).unwrap();
        w.eps[0].send(to_b, span(&src, i * 64, 64), i).unwrap();
    }
    w.drive_until(10_000, |w| w.done[1].len() == 100);
    // Each receive got a whole message (any of them).
    let got = w.eps[1].mem(dst.id).to_vec();
    let sent = w.eps[0].mem(src.id).to_vec();
    let mut got_msgs: Vec<&[u8]> = got.chunks(64).collect();
    let mut sent_msgs: Vec<&[u8]> = sent.chunks(64).collect();
    got_msgs.sort();
    sent_msgs.sort();
    assert_eq!(got_msgs, sent_msgs);
}

#[test]
fn tag_matching_with_ignore_bits_takes_the_earliest_posted() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let src = w.register(0, 8);
    let dst = w.register(1, 8 * 8);
    // Posted in this order: exact 0x12, wildcard 0x1? (ignore low 4 bits),
    // exact 0x30, wildcard anything.
    let posts = [(0x12u64, 0u64, 1u64), (0x10, 0xf, 2), (0x30, 0, 3), (0, u64::MAX, 4)];
    for (i, (tag, ignore, ctx)) in posts.iter().enumerate() {
        w.eps[1]
            .trecv(span(&dst, i as u64 * 8, 8), TagMatch { tag: *tag, ignore: *ignore }, None, *ctx)
            .unwrap();
    }
    // 0x15 matches the first wildcard (posted before the catch-all); 0x12
    // the exact; 0x99 the catch-all; 0x30 the exact.
    for tag in [0x15u64, 0x12, 0x99, 0x30] {
        w.eps[0].tsend(to_b, span(&src, 0, 8), tag, tag).unwrap();
    }
    w.drive_until(1000, |w| w.done[1].len() == 4);
    let got: Vec<(u64, u64)> = w.done[1].iter().map(|c| (c.tag, c.ctx)).collect();
    assert_eq!(got, [(0x15, 2), (0x12, 1), (0x99, 4), (0x30, 3)]);

    // An exact receive posted before a matching wildcard wins, and vice
    // versa.
    w.done[1].clear();
    w.eps[1].trecv(span(&dst, 0, 8), TagMatch { tag: 0x40, ignore: 0 }, None, 10).unwrap();
    w.eps[1].trecv(span(&dst, 8, 8), TagMatch { tag: 0, ignore: u64::MAX }, None, 11).unwrap();
    w.eps[1].trecv(span(&dst, 16, 8), TagMatch { tag: 0x40, ignore: 0 }, None, 12).unwrap();
    for _ in 0..3 {
        w.eps[0].tsend(to_b, span(&src, 0, 8), 0x40, 0).unwrap();
    }
    w.drive_until(1000, |w| w.done[1].len() == 3);
    let ctxs: Vec<u64> = w.done[1].iter().map(|c| c.ctx).collect();
    assert_eq!(ctxs, [10, 11, 12]);
}

#[test]
fn untagged_and_tagged_receives_do_not_mix() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let src = w.register(0, 4);
    let dst = w.register(1, 8);
    w.eps[1].trecv(span(&dst, 0, 4), TagMatch { tag: 0, ignore: u64::MAX }, None, 1).unwrap();
    w.eps[0].send(to_b, span(&src, 0, 4), 0).unwrap();
    w.settle();
    assert!(w.done[1].is_empty(), "an untagged message does not match a tagged receive");
    w.eps[1].recv(span(&dst, 4, 4), None, 2).unwrap();
    w.eps[0].tsend(to_b, span(&src, 0, 4), 77, 0).unwrap();
    w.drive_until(1000, |w| w.done[1].len() == 2);
    let got: Vec<(u64, bool)> = w.done[1].iter().map(|c| (c.ctx, c.tagged)).collect();
    assert_eq!(got, [(2, false), (1, true)]);
}

#[test]
fn directed_receives_among_64_peers() {
    let n = 65;
    let mut w = World::new(
        n,
        SimConfig { seed: 5, faults: Faults::reorder(5, 4), ..SimConfig::default() },
        Config::default(),
    );
    let dst = w.register(0, 8 * n as u64);
    let peers: Vec<PeerId> = (1..n).map(|i| w.connect(0, i)).collect();
    // Receives posted for each peer, in reverse order, before anything
    // arrives; then every peer sends its index, twice (the second to an
    // any-source receive).
    for (k, p) in peers.iter().enumerate().rev() {
        w.eps[0]
            .trecv(
                span(&dst, 8 * (k as u64 + 1), 8),
                TagMatch { tag: 1, ignore: 0 },
                Some(*p),
                k as u64 + 1,
            )
            .unwrap();
    }
    for i in 1..n {
        let to0 = w.connect(i, 0);
        let src = w.register(i, 8);
        w.eps[i].write_mem(src.id, 0, &(i as u64).to_le_bytes()).unwrap();
        w.eps[i].tsend(to0, span(&src, 0, 8), 1, 0).unwrap();
    }
    w.drive_until(100_000, |w| w.done[0].len() == n - 1);
    for c in &w.done[0] {
        let k = c.ctx;
        assert_eq!(c.peer, Some(peers[k as usize - 1]), "receive {k}");
        let at = 8 * k as usize;
        let got = u64::from_le_bytes(w.eps[0].mem(dst.id)[at..at + 8].try_into().unwrap());
        assert_eq!(got, k, "receive posted for peer {k} got peer {got}'s message");
    }
}

/// Untagged receives for given peers, posted in the reverse of the order
/// their messages come in, and one withdrawn from the middle of the
/// queue: each message takes the earliest receive that takes its sender,
/// wherever it waits, and the others keep their order.
#[test]
fn untagged_receives_for_given_peers_are_taken_from_the_middle_of_the_queue() {
    let n = 5;
    let mut w = World::new(n, SimConfig::default(), Config::default());
    let dst = w.register(0, 8 * 32);
    let peers: Vec<PeerId> = (1..n).map(|i| w.connect(0, i)).collect();
    // Receive k (1 to 4) for peer k, the last peer's first; then one from
    // any peer (10) and a second for peer 2 (20).
    for k in (1..n as u64).rev() {
        w.eps[0].recv(span(&dst, 8 * k, 8), Some(peers[k as usize - 1]), k).unwrap();
    }
    w.eps[0].recv(span(&dst, 80, 8), None, 10).unwrap();
    w.eps[0].recv(span(&dst, 160, 8), Some(peers[1]), 20).unwrap();
    assert!(w.eps[0].cancel_recv(3), "peer 3's receive, from the middle");
    // Peers 1, 2 and 3 send their index, one at a time; then peer 2 again.
    for i in [1, 2, 3, 2] {
        let to0 = w.connect(i, 0);
        let src = w.register(i, 8);
        w.eps[i].write_mem(src.id, 0, &(i as u64).to_le_bytes()).unwrap();
        w.eps[i].send(to0, span(&src, 0, 8), 0).unwrap();
        let want = w.done[0].len() + 1;
        w.drive_until(10_000, |w| w.done[0].len() == want);
    }
    let got: Vec<(u64, Option<PeerId>)> = w.done[0].iter().map(|c| (c.ctx, c.peer)).collect();
    let from = |i: usize| Some(peers[i - 1]);
    assert_eq!(got, [(1, from(1)), (2, from(2)), (10, from(3)), (20, from(2))]);
    for (ctx, sender) in [(1u64, 1u64), (2, 2), (10, 3), (20, 2)] {
        let at = 8 * ctx as usize;
        let v = u64::from_le_bytes(w.eps[0].mem(dst.id)[at..at + 8].try_into().unwrap());
        assert_eq!(v, sender, "receive {ctx}");
    }
    // Peer 4's is left, the newest and the only one.
    assert!(w.eps[0].cancel_last_recv(4));
    assert!(!w.eps[0].cancel_recv(4) && !w.eps[0].cancel_recv(3), "withdrawn once");
}

#[test]
fn a_short_receive_buffer_is_truncated_with_both_lengths() {
    // Posted first, and posted after the message arrived (unexpected).
    for (&len, posted_first) in
        [100u64, 30_000, 500_000].iter().flat_map(|l| [(l, true), (l, false)])
    {
        let mut w = World::pair(reordering(3), Config::default());
        let to_b = w.connect(0, 1);
        let src = w.register(0, len);
        let dst = w.register(1, len);
        w.fill(0, &src, 2);
        if posted_first {
            w.eps[1].recv(span(&dst, 0, len / 2), None, 1).unwrap();
        }
        w.eps[0].senddata(to_b, span(&src, 0, len), 77, 2).unwrap();
        if !posted_first {
            w.settle();
            assert_eq!(w.eps[1].counters().unexpected, 1);
            w.eps[1].recv(span(&dst, 0, len / 2), None, 1).unwrap();
        }
        w.drive_until(100_000, |w| w.done[1].len() == 1 && w.done[0].len() == 1);
        let c = w.done[1][0];
        assert_eq!((c.len, c.status), (len / 2, Status::Truncated { olen: len }), "len {len}");
        assert_eq!((c.ctx, c.cq_data), (1, Some(77)), "len {len}");
        let h = (len / 2) as usize;
        assert_eq!(&w.eps[1].mem(dst.id)[..h], &w.eps[0].mem(src.id)[..h]);
        assert!(w.eps[1].mem(dst.id)[h..].iter().all(|b| *b == 0), "nothing past the buffer");
        assert_eq!(w.done[0][0].status, Status::Ok);
    }
}

#[test]
fn inject_and_cq_data() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let src = w.register(0, 100_000);
    let dst = w.register(1, 200_000);
    w.eps[1].recv(span(&dst, 0, 16), None, 1).unwrap();
    w.eps[1].trecv(span(&dst, 16, 100_000), TagMatch { tag: 3, ignore: 0 }, None, 2).unwrap();
    w.eps[1].recv(span(&dst, 100_016, 16), None, 3).unwrap();
    w.eps[0].inject(to_b, b"injected bytes!!").unwrap();
    w.eps[0].tsenddata(to_b, span(&src, 0, 100_000), 3, 0xfeed, 4).unwrap();
    w.eps[0].senddata(to_b, span(&src, 0, 16), 0xbeef, 5).unwrap();
    w.drive_until(10_000, |w| w.done[1].len() == 3 && w.done[0].len() == 2);
    assert_eq!(&w.eps[1].mem(dst.id)[..16], b"injected bytes!!");
    let by_ctx = |c: u64| *w.done[1].iter().find(|x| x.ctx == c).unwrap();
    assert_eq!(by_ctx(1).cq_data, None);
    assert_eq!(by_ctx(2).cq_data, Some(0xfeed));
    assert_eq!(by_ctx(3).cq_data, Some(0xbeef));
    // inject reports nothing; the two sends do.
    let ctxs: Vec<u64> = w.done[0].iter().map(|c| c.ctx).collect();
    assert_eq!(ctxs.len(), 2);
    assert!(ctxs.contains(&4) && ctxs.contains(&5));
    assert_eq!(w.eps[0].inject(to_b, &[0; 9000]), Err(Error::TooLarge));
}

#[test]
fn full_pools_push_back_and_nothing_is_lost() {
    let cfg = Config { tx_ops: 4, rx_ops: 8, ..Config::default() };
    let sim = SimConfig {
        tx_depth: 8,
        rx_depth: 8,
        bufs: 64,
        faults: Faults::reorder(1, 4),
        ..SimConfig::default()
    };
    let mut w = World::pair(sim, cfg);
    let to_b = w.connect(0, 1);
    let src = w.register(0, 20_000);
    let dst = w.register(1, 20_000 * 200);
    // Eager sends built at once need only a TX buffer (8 of them); then
    // they queue in operation entries (4) like every other send. With the
    // fast paths off, every send takes an entry.
    let taken = if cfg!(feature = "general-paths") { 4 } else { 12 };
    for i in 0..taken {
        w.eps[0].send(to_b, span(&src, 0, 64), i).unwrap();
    }
    assert_eq!(w.eps[0].send(to_b, span(&src, 0, 64), taken), Err(Error::Again));
    let mut w2 = World::pair(sim, cfg);
    let to_b2 = w2.connect(0, 1);
    let src2 = w2.register(0, 20_000);
    for i in 0..4 {
        w2.eps[0].send(to_b2, span(&src2, 0, 20_000), i).unwrap();
    }
    assert_eq!(w2.eps[0].send(to_b2, span(&src2, 0, 20_000), 4), Err(Error::Again));
    // A stream of both, with receives posted late and refused while every
    // receive entry holds an unexpected message: all arrive, in order.
    let len = |i: u64| if i.is_multiple_of(3) { 20_000 } else { 64 };
    let mut sent = taken;
    let mut posted = 0;
    let mut refused = 0;
    while w.done[1].len() < 200 {
        if sent < 200 {
            match w.eps[0].send(to_b, span(&src, 0, len(sent)), sent) {
                Ok(()) => sent += 1,
                Err(Error::Again) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        if posted < 200 && posted < w.done[1].len() as u64 + 3 {
            let l = if posted < taken { 64 } else { len(posted) };
            match w.eps[1].recv(span(&dst, posted * 20_000, l), None, posted) {
                Ok(()) => posted += 1,
                Err(Error::Again) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        w.step();
    }
    w.drive_until(1000, |w| w.done[0].len() == 200);
    let order: Vec<u64> = w.done[1].iter().map(|c| c.ctx).collect();
    assert_eq!(order.len(), 200);
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(sorted, (0..200).collect::<Vec<_>>());
    assert!(w.done[1].iter().all(|c| c.status == Status::Ok));
    assert!(refused > 0, "the pools pushed back");
    assert!(w.eps[1].counters().unexpected > 0);
}

#[test]
fn posted_receives_and_messages_in_progress_each_have_rx_ops_entries() {
    let cfg = Config { rx_ops: 4, ..Config::default() };
    let mut w = World::pair(SimConfig::default(), cfg);
    let to_b = w.connect(0, 1);
    let src = w.register(0, 4 * 20_000);
    let dst = w.register(1, 8 * 20_000);
    w.fill(0, &src, 3);
    let tag = |t| TagMatch { tag: t, ignore: 0 };
    // Four unexpected messages fill the entries for messages...
    for i in 0..4 {
        w.eps[0].tsend(to_b, span(&src, i * 64, 64), 1, i).unwrap();
    }
    w.settle();
    assert_eq!(w.eps[1].counters().unexpected, 4);
    // ...and leave room for four posted receives, no more.
    for i in 0..4 {
        w.eps[1].trecv(span(&dst, i * 20_000, 20_000), tag(2), None, 10 + i).unwrap();
    }
    assert_eq!(w.eps[1].trecv(span(&dst, 0, 8), tag(2), None, 99), Err(Error::Again));
    // Medium messages match those receives but need entries to land in
    // over several packets: they wait, holding their packets...
    for i in 0..4 {
        w.eps[0].tsend(to_b, span(&src, i * 20_000, 20_000), 2, 10 + i).unwrap();
    }
    w.settle();
    assert!(w.done[1].is_empty());
    assert!(w.eps[1].counters().rx_ops_exhausted > 0);
    // ...until receives for the unexpected ones free the entries.
    for i in 0..4 {
        w.eps[1].trecv(span(&dst, (4 + i) * 20_000, 64), tag(1), None, i).unwrap();
    }
    w.drive_until(10_000, |w| w.done[1].len() == 8);
    let mut got: Vec<(u64, Status, u64)> =
        w.done[1].iter().map(|c| (c.ctx, c.status, c.len)).collect();
    got.sort_by_key(|g| g.0);
    let want: Vec<(u64, Status, u64)> = (0..4)
        .map(|i| (i, Status::Ok, 64))
        .chain((10..14).map(|i| (i, Status::Ok, 20_000)))
        .collect();
    assert_eq!(got, want);
    let mem = w.eps[1].mem(dst.id).to_vec();
    assert_eq!(&mem[..4 * 20_000], w.eps[0].mem(src.id));
}

#[test]
fn an_unknown_sender_is_learned_from_its_raw_address() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    w.fabric.set_capture(true);
    let to_b = w.connect(0, 1);
    let src = w.register(0, 16);
    let dst = w.register(1, 16);
    w.eps[1].recv(span(&dst, 0, 8), None, 1).unwrap();
    w.eps[0].send(to_b, span(&src, 0, 8), 1).unwrap();
    w.drive_until(100, |w| w.done[1].len() == 1);
    w.settle();
    // B never inserted A: A's id at B comes from the REQ's raw address.
    let a_at_b = w.done[1][0].peer.unwrap();
    assert_eq!(w.eps[1].peer_addr(a_at_b), Some(w.eps[0].addr()));
    // B answers on it.
    w.eps[0].recv(span(&src, 8, 8), None, 2).unwrap();
    w.eps[1].send(a_at_b, span(&dst, 0, 8), 2).unwrap();
    w.drive_until(100, |w| w.done[0].iter().any(|c| c.op == Op::Recv));
    w.settle();
    // On the wire: A's first REQ carried its raw address; B answered with a
    // HANDSHAKE; B's REQ, sent after A's HANDSHAKE arrived, carried a
    // connid header instead.
    let wire = w.fabric.take_capture();
    let (a, b) = (w.eps[0].addr().qpn, w.eps[1].addr().qpn);
    let first = wire.iter().find(|(f, _, _)| *f == a).unwrap();
    let Packet::Req(req, _) = Packet::parse(&first.2).unwrap() else { panic!("not a REQ") };
    assert_eq!(req.ptype, PacketType::EagerMsgRtm);
    assert!(req.flags.contains(ReqFlags::RAW_ADDR_HDR | ReqFlags::MSG));
    assert_eq!(req.raw_addr.map(|r| r.len()), Some(36));
    let hs: Vec<_> = wire.iter().filter(|(_, _, p)| p[0] == PacketType::Handshake.id()).collect();
    assert_eq!(hs.len(), 2, "one HANDSHAKE each way");
    let b_req =
        wire.iter().find(|(f, _, p)| *f == b && p[0] == PacketType::EagerMsgRtm.id()).unwrap();
    let Packet::Req(req, _) = Packet::parse(&b_req.2).unwrap() else { panic!() };
    assert!(req.raw_addr.is_none());
    assert_eq!(req.connid, Some(w.eps[1].addr().connid));
    let Packet::Handshake(h) = Packet::parse(&hs[0].2).unwrap() else { panic!() };
    assert_eq!(h.nextra_p3(), 4);
    assert!(h.connid.is_some() && h.device_version.is_some());
}

#[test]
fn handshake_on_insert_is_answered_before_any_message() {
    let cfg = Config { handshake_on_insert: true, ..Config::default() };
    let mut w = World::pair(SimConfig::default(), cfg);
    let to_b = w.connect(0, 1);
    w.drive_until(100, |w| w.eps[0].peer_handshake_received(to_b));
    assert!(w.eps[0].counters().tx(PacketType::EagerRtw) == 1);
    assert!(w.done.iter().all(|d| d.is_empty()), "the trigger completes nothing");
    assert_eq!(w.eps[0].max_eager_size(to_b, false), MTU - 12);
}

#[test]
fn flush_posts_a_send_before_the_next_progress() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    w.connect(1, 0);
    let src = w.register(0, 64);
    let b_addr = w.eps[1].addr();
    w.eps[0].send(to_b, span(&src, 0, 64), 1).unwrap();
    // Built, and waiting for a burst: nothing on the fabric yet.
    assert_eq!(w.fabric.pending(&b_addr), 0);
    assert!(w.eps[0].flush());
    assert_eq!(w.fabric.pending(&b_addr), 1, "on its way without a progress call");
    assert!(!w.eps[0].flush(), "nothing more to post");
    let dst = w.register(1, 64);
    w.eps[1].recv(span(&dst, 0, 64), None, 2).unwrap();
    w.drive_until(100, |w| w.done[1].len() == 1 && w.done[0].len() == 1);
    assert_eq!(w.done[1][0].len, 64);
}

/// `n` messages of 16, 17, ... bytes from 0 (sends 20, 21, ...) into
/// receives 10, 11, ... at 1, their completions left queued on both
/// sides (progress only, no poll): the world, the way to 1, the source
/// and the destination.
fn queued_messages(n: u64) -> (World, PeerId, Mr, Mr) {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    w.connect(1, 0);
    let (src, dst) = (w.register(0, n * 64), w.register(1, n * 64));
    for i in 0..n {
        w.eps[1].recv(span(&dst, i * 64, 64), None, 10 + i).unwrap();
        w.eps[0].send(to_b, span(&src, i * 64, 16 + i), 20 + i).unwrap();
    }
    for _ in 0..10 {
        w.eps[0].progress();
        w.eps[1].progress();
    }
    (w, to_b, src, dst)
}

#[test]
fn a_peeked_completion_stays_until_skipped_or_polled() {
    let (mut w, to_b, src, dst) = queued_messages(3);
    let ep = &mut w.eps[1];
    assert_eq!(ep.cq_len(), 3);
    // Looked at twice, the same one, left where it is.
    let first = *ep.peek_cq().unwrap();
    assert_eq!((first.op, first.ctx, first.len), (Op::Recv, 10, 16));
    assert_eq!(ep.peek_cq(), Some(&first));
    assert_eq!(ep.cq_len(), 3);
    // Skipped: taken, unread; the next is what poll_cq hands over.
    ep.skip_cq();
    let second = *ep.peek_cq().unwrap();
    assert_eq!(ep.poll_cq(), Some(second));
    assert_eq!(second.ctx, 11);
    ep.skip_cq();
    assert_eq!((ep.peek_cq(), ep.cq_len()), (None, 0));
    // Skipping an empty queue takes nothing; what comes next is there.
    ep.skip_cq();
    w.eps[1].recv(span(&dst, 0, 64), None, 13).unwrap();
    w.eps[0].send(to_b, span(&src, 0, 5), 23).unwrap();
    w.drive_until(100, |w| w.done[1].len() == 1);
    assert_eq!((w.done[1][0].ctx, w.done[1][0].len), (13, 5));
}

#[test]
fn a_burst_poll_hands_over_what_poll_cq_would_and_stops_where_told() {
    // Progress only: the completions stay queued for the polls below.
    let (mut w, ..) = queued_messages(4);
    assert_eq!((w.eps[0].cq_len(), w.eps[1].cq_len()), (4, 4));
    // Told to stop at the second receive: two taken, in order.
    let mut got = Vec::new();
    let taken = w.eps[1].poll_cq_with(|c| {
        got.push((c.op, c.ctx, c.len, c.status));
        got.len() < 2
    });
    assert_eq!(taken, 2);
    assert_eq!(got, [(Op::Recv, 10, 16, Status::Ok), (Op::Recv, 11, 17, Status::Ok)]);
    // The rest as poll_cq hands them over.
    let rest: Vec<_> = std::iter::from_fn(|| w.eps[1].poll_cq()).map(|c| (c.ctx, c.len)).collect();
    assert_eq!(rest, [(12, 18), (13, 19)]);
    // All of them in one burst, then none.
    let mut sent = Vec::new();
    let taken = w.eps[0].poll_cq_with(|c| {
        sent.push((c.op, c.ctx));
        true
    });
    assert_eq!(taken, 4);
    assert_eq!(sent, (20..24).map(|ctx| (Op::Send, ctx)).collect::<Vec<_>>());
    assert_eq!(w.eps[0].poll_cq_with(|_| true), 0);
    assert!(w.eps[0].poll_cq().is_none());
}

/// A persistent receive, started again after each message, takes an
/// eager, a medium and a long one (the last before it is started, so
/// unexpected): each lands whole in its buffer, with its ctx, and the
/// receive is idle again after each. It cannot be started twice, keeps
/// its region in use until freed, and is gone once freed.
#[test]
fn a_persistent_receive_takes_a_message_each_time_it_is_started() {
    let lens = [100u64, 30_000, 500_000];
    let mut w = World::pair(reordering(5), Config::default());
    let to_b = w.connect(0, 1);
    let from_a = w.connect(1, 0);
    let max = lens[2];
    let src = w.register(0, max);
    let dst = w.register(1, max);
    let r = w.eps[1].recv_init(span(&dst, 0, max), Some(from_a), 42).unwrap();
    for (i, &len) in lens.iter().enumerate() {
        w.fill(0, &src, i as u64 + 1);
        let unexpected = i == 2;
        if !unexpected {
            w.eps[1].recv_start(r).unwrap();
            assert_eq!(w.eps[1].recv_start(r), Err(Error::Busy), "started twice");
        }
        w.eps[0].send(to_b, span(&src, 0, len), i as u64).unwrap();
        if unexpected {
            w.settle();
            assert_eq!(w.eps[1].counters().unexpected, 1);
            w.eps[1].recv_start(r).unwrap();
        }
        let want = i + 1;
        w.drive_until(100_000, |w| w.done[1].len() == want && w.done[0].len() == want);
        let c = w.done[1][i];
        assert_eq!((c.op, c.ctx, c.len, c.status), (Op::Recv, 42, len, Status::Ok), "len {len}");
        assert_eq!(c.peer, Some(from_a));
        let n = len as usize;
        assert_eq!(&w.eps[1].mem(dst.id)[..n], &w.eps[0].mem(src.id)[..n], "len {len}");
    }
    assert_eq!(w.eps[1].deregister(dst.id), Err(Error::Busy), "an idle receive keeps it");
    // Idle: started and withdrawn again, then freed.
    w.eps[1].recv_start(r).unwrap();
    assert!(w.eps[1].cancel_recv(42), "withdrawn, not freed");
    assert!(!w.eps[1].cancel_recv(42), "idle: nothing queued");
    w.eps[1].recv_start(r).unwrap();
    w.eps[1].recv_free(r).unwrap();
    assert_eq!(w.eps[1].recv_start(r), Err(Error::Invalid), "freed");
    assert_eq!(w.eps[1].recv_free(r), Err(Error::Invalid), "freed once");
    w.eps[1].deregister(dst.id).unwrap();
}

/// A persistent receive waits in the order receives were posted, and
/// queues again at the back each time it is started: with one-shot
/// receives posted around it, messages land in posting order; withdrawn
/// (freed while queued), it takes nothing.
#[test]
fn a_persistent_receive_takes_its_turn_among_posted_receives() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let src = w.register(0, 8);
    let dst = w.register(1, 8 * 8);
    let r = w.eps[1].recv_init(span(&dst, 0, 8), None, 100).unwrap();
    w.eps[1].recv(span(&dst, 8, 8), None, 1).unwrap();
    w.eps[1].recv_start(r).unwrap();
    w.eps[1].recv(span(&dst, 16, 8), None, 2).unwrap();
    let send = |w: &mut World, v: u64| {
        w.eps[0].write_mem(src.id, 0, &v.to_le_bytes()).unwrap();
        w.eps[0].send(to_b, span(&src, 0, 8), v).unwrap();
        let want = w.done[1].len() + 1;
        w.drive_until(10_000, |w| w.done[1].len() == want);
        w.done[1].last().unwrap().ctx
    };
    assert_eq!([send(&mut w, 7), send(&mut w, 8)], [1, 100]);
    // Started again, behind the one-shot receive still posted.
    w.eps[1].recv_start(r).unwrap();
    assert_eq!([send(&mut w, 9), send(&mut w, 10)], [2, 100]);
    let at = |w: &World, ctx: usize| {
        u64::from_le_bytes(w.eps[1].mem(dst.id)[8 * ctx..8 * ctx + 8].try_into().unwrap())
    };
    assert_eq!([at(&w, 1), at(&w, 0), at(&w, 2)], [7, 10, 9]);
    // Freed while queued: the next message waits unexpected.
    w.eps[1].recv_start(r).unwrap();
    w.eps[1].recv_free(r).unwrap();
    w.eps[0].send(to_b, span(&src, 0, 8), 11).unwrap();
    w.settle();
    assert_eq!(w.eps[1].counters().unexpected, 1);
    assert_eq!(w.done[1].len(), 4, "no receive took it");
}

/// A receive ring's slots take its peer's untagged messages in turn, 0,
/// 1, 2, 3, 0, .. whatever their protocol (eager, medium, long), each once
/// armed: a message whose slot is not armed waits as unexpected (though
/// later slots are armed) and takes it when it is. A short eager message
/// that lands in its slot, with no CQ data, is marked there and not
/// reported; any other completes with `ctx + slot`. A receive posted for
/// the peer before its messages came takes none of them while the ring
/// is there, a tagged message is not the ring's, and once the ring is
/// freed posted receives match again.
#[test]
fn a_receive_ring_takes_its_peers_messages_into_slots_in_turn() {
    let lens = [100u64, 30_000, 500_000, 64, 200, 30_000];
    let slot_len = 512 << 10;
    let mut w = World::pair(reordering(11), Config::default());
    let to_b = w.connect(0, 1);
    let from_a = w.connect(1, 0);
    let src = w.register(0, slot_len * lens.len() as u64);
    let slots = w.register(1, 4 * slot_len);
    let other = w.register(1, 64);
    let first = span(&slots, 0, slot_len);
    let ring = w.eps[1].recv_ring(first, 4, from_a, 1000).unwrap();
    w.eps[1].recv(span(&other, 0, 64), Some(from_a), 7).unwrap();
    w.eps[1].trecv(span(&other, 0, 64), TagMatch { tag: 5, ignore: 0 }, None, 8).unwrap();
    let arm = |w: &mut World, slot: u16| {
        w.eps[1].recv_ring_arm(ring, slot).unwrap();
        w.settle();
    };
    let ctxs = |w: &World| w.done[1].iter().map(|c| c.ctx).collect::<Vec<_>>();
    // Slots 1 and 2 armed, not slot 0, whose turn it is: every message
    // waits.
    arm(&mut w, 1);
    arm(&mut w, 2);
    w.fill(0, &src, 3);
    for (i, &len) in lens.iter().enumerate() {
        let at = i as u64 * slot_len;
        w.eps[0].send(to_b, span(&src, at, len), i as u64).unwrap();
    }
    w.eps[0].tsend(to_b, span(&src, 0, 16), 5, 99).unwrap();
    w.settle();
    assert_eq!(ctxs(&w), [8], "the tagged one only");
    assert_eq!(w.eps[1].counters().unexpected, 6);
    // Slot 0 armed: messages 0, 1 and 2 take slots 0, 1 and 2, in the
    // queue as they waited; then 3 takes slot 3, and 4 and 5 slots 0 and
    // 1 once those were read.
    arm(&mut w, 0);
    let mut got = ctxs(&w)[1..].to_vec();
    got.sort();
    assert_eq!(got, [1000, 1001, 1002]);
    // Three armed at once, the one in turn among them.
    w.eps[1].recv_ring_arm_each(ring, &[1, 3, 0]).unwrap();
    w.settle();
    assert_eq!(&ctxs(&w)[4..], [1003, 1000, 1001]);
    let taken = [0u64, 1, 2, 3, 0, 1];
    for (i, &len) in lens.iter().enumerate().skip(2) {
        let (at, got) = (i as u64 * slot_len, taken[i] * slot_len);
        let c = w.done[1].iter().rev().find(|c| c.ctx == 1000 + taken[i]).unwrap();
        assert_eq!((c.op, c.len, c.status, c.peer), (Op::Recv, len, Status::Ok, Some(from_a)));
        let want = &w.eps[0].mem(src.id)[at as usize..(at + len) as usize];
        assert_eq!(&w.eps[1].mem(slots.id)[got as usize..(got + len) as usize], want, "{i}");
    }
    assert!((0..4).all(|slot| w.eps[1].recv_ring_landed(ring, slot, &mut []).is_none()));
    // Slot 2's turn, armed before its message came: a short one is marked
    // there, once, with nothing in the queue.
    let reported = w.done[1].len();
    arm(&mut w, 2);
    w.fill(0, &src, 4);
    w.eps[0].send(to_b, span(&src, 0, 64), 10).unwrap();
    w.settle();
    assert_eq!(w.done[1].len(), reported, "a landed message is not reported");
    // Its first bytes read as the mark is taken.
    let mut head = [0u8; 20];
    assert_eq!(w.eps[1].recv_ring_landed(ring, 2, &mut head), Some(64));
    let mut again = [7u8; 20];
    assert_eq!(w.eps[1].recv_ring_landed(ring, 2, &mut again), None, "taken once");
    assert_eq!(again, [7; 20], "nothing read with no mark");
    let want = &w.eps[0].mem(src.id)[..64];
    assert_eq!(&w.eps[1].mem(slots.id)[2 * slot_len as usize..][..64], want);
    assert_eq!(head, want[..20]);
    // With CQ data, or longer than eager: reported, not marked.
    arm(&mut w, 3);
    w.eps[0].senddata(to_b, span(&src, 0, 32), 0xfeed, 11).unwrap();
    w.settle();
    let c = *w.done[1].last().unwrap();
    assert_eq!((c.ctx, c.len, c.cq_data), (1003, 32, Some(0xfeed)));
    arm(&mut w, 0);
    w.eps[0].send(to_b, span(&src, 0, 30_000), 12).unwrap();
    w.settle();
    let c = *w.done[1].last().unwrap();
    assert_eq!((c.ctx, c.len), (1000, 30_000));
    assert_eq!(w.eps[1].recv_ring_landed(ring, 3, &mut []), None);
    assert_eq!(w.eps[1].recv_ring_landed(ring, 0, &mut []), None);
    assert!(w.done[1].iter().all(|c| c.ctx != 7), "the posted receive took nothing");
    // One slot armed and the ring freed: it is withdrawn, and the posted
    // receive takes the next message.
    w.eps[1].recv_ring_arm(ring, 1).unwrap();
    assert_eq!(w.eps[1].recv_ring_free(ring), Ok(1));
    w.eps[0].send(to_b, span(&src, 0, 32), 50).unwrap();
    w.settle();
    let c = w.done[1].last().unwrap();
    assert_eq!((c.ctx, c.len), (7, 32));
}

/// A message of the ring's peer that waits for a slot is found by the
/// next arm whenever it came: before the ring was made, after an arm that
/// found none waiting, while another peer's messages wait unexpected too,
/// or after a posted receive took the one before it; the other peer's
/// stay for a receive of theirs.
#[test]
fn a_receive_ring_finds_its_peers_waiting_messages_among_others() {
    let mut w = World::new(3, SimConfig::default(), Config::default());
    let (a_to_b, c_to_b) = (w.connect(0, 1), w.connect(2, 1));
    let (from_a, from_c) = (w.connect(1, 0), w.connect(1, 2));
    let (src_a, src_c) = (w.register(0, 4096), w.register(2, 4096));
    w.fill(0, &src_a, 5);
    w.fill(2, &src_c, 6);
    let slots = w.register(1, 4 * 1024);
    let other = w.register(1, 1024);
    // Message i of a sender: 100 + i bytes from 100 * i.
    let send = |w: &mut World, from: usize, to: PeerId, src: &Mr, i: u64| {
        w.eps[from].send(to, span(src, i * 100, 100 + i), i).unwrap();
        w.settle();
    };
    // A's first message and C's two wait before the ring is made.
    send(&mut w, 0, a_to_b, &src_a, 0);
    send(&mut w, 2, c_to_b, &src_c, 0);
    send(&mut w, 2, c_to_b, &src_c, 1);
    assert_eq!(w.eps[1].counters().unexpected, 3);
    let ring = w.eps[1].recv_ring(span(&slots, 0, 1024), 4, from_a, 1000).unwrap();
    let arm = |w: &mut World, slot: u16| {
        w.eps[1].recv_ring_arm(ring, slot).unwrap();
        w.settle();
    };
    arm(&mut w, 0);
    // None of A's waits now: slot 1 takes A's next as it comes.
    arm(&mut w, 1);
    send(&mut w, 0, a_to_b, &src_a, 1);
    // A's third waits, and a receive for A takes it; the arm after finds
    // none, and A's fourth takes its slot.
    send(&mut w, 0, a_to_b, &src_a, 2);
    w.eps[1].recv(span(&other, 0, 512), Some(from_a), 8).unwrap();
    w.settle();
    arm(&mut w, 2);
    send(&mut w, 0, a_to_b, &src_a, 3);
    // A's fifth waits behind C's, a receive for any peer takes the oldest
    // (C's first), and the next arm A's fifth.
    send(&mut w, 0, a_to_b, &src_a, 4);
    w.eps[1].recv(span(&other, 512, 512), None, 7).unwrap();
    w.settle();
    arm(&mut w, 3);
    // Those that waited complete in the queue; A's second and fourth,
    // which found their slots armed, are marked there.
    let got: Vec<_> = w.done[1].iter().map(|c| (c.ctx, c.len, c.peer)).collect();
    let (a, c) = (Some(from_a), Some(from_c));
    assert_eq!(got, [(1000, 100, a), (8, 102, a), (7, 100, c), (1003, 104, a)]);
    assert_eq!(w.eps[1].recv_ring_landed(ring, 1, &mut []), Some(101));
    // A head longer than the slot: the slot's bytes, the rest untouched.
    let mut head = vec![0xee; 1500];
    assert_eq!(w.eps[1].recv_ring_landed(ring, 2, &mut head), Some(103));
    assert_eq!(head[..1024], w.eps[1].mem(slots.id)[2048..3072]);
    assert!(head[1024..].iter().all(|&b| b == 0xee));
    // C's second waited through every arm, for a receive of C's.
    w.eps[1].recv(span(&other, 0, 512), Some(from_c), 9).unwrap();
    w.settle();
    let last = w.done[1].last().unwrap();
    assert_eq!((last.ctx, last.len, last.peer), (9, 101, c));
    for (slot, i) in [(1usize, 1usize), (3, 4)] {
        let want = &w.eps[0].mem(src_a.id)[i * 100..i * 101 + 100];
        let at = slot * 1024;
        assert_eq!(&w.eps[1].mem(slots.id)[at..at + 100 + i], want, "slot {slot}");
    }
}

/// A run of a receive ring's slots ([`Endpoint::recv_ring_arm_run`])
/// arms them all, wrapping past the last slot to slot 0, or none when one
/// is armed already; a message that waited takes the slot in turn among
/// them as it would one armed alone.
#[test]
fn a_run_of_ring_slots_wraps_past_the_last_and_is_armed_whole_or_not_at_all() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let from_a = w.connect(1, 0);
    let src = w.register(0, 64);
    let slots = w.register(1, 4 * 64);
    let ring = w.eps[1].recv_ring(span(&slots, 0, 64), 4, from_a, 1000).unwrap();
    let send = |w: &mut World, n: u64| {
        for i in 0..n {
            w.eps[0].send(to_b, span(&src, 0, 8 + i), i).unwrap();
        }
        w.settle();
    };
    w.eps[1].recv_ring_arm_run(ring, 0, 4).unwrap();
    send(&mut w, 4);
    let landed: Vec<_> =
        (0..4).map(|slot| w.eps[1].recv_ring_landed(ring, slot, &mut [])).collect();
    assert_eq!(landed, [Some(8), Some(9), Some(10), Some(11)], "one in each, in turn");
    // None armed: three wait, slot 0's turn.
    send(&mut w, 3);
    assert_eq!(w.eps[1].counters().unexpected, 3);
    // Slots 3 and 0: the first to wait takes slot 0 (reported, as one that
    // waited is); slot 1, the next's turn, is not armed.
    w.eps[1].recv_ring_arm_run(ring, 3, 2).unwrap();
    w.settle();
    let ctxs = |w: &World| w.done[1].iter().map(|c| (c.ctx, c.len)).collect::<Vec<_>>();
    assert_eq!(ctxs(&w), [(1000, 8)]);
    // Slots 1, 2 and 3: 3 is armed, so none is.
    assert_eq!(w.eps[1].recv_ring_arm_run(ring, 1, 3), Err(Error::Busy));
    w.settle();
    assert_eq!(ctxs(&w), [(1000, 8)], "nothing armed by the refused run");
    w.eps[1].recv_ring_arm_run(ring, 1, 2).unwrap();
    w.settle();
    assert_eq!(ctxs(&w), [(1000, 8), (1001, 9), (1002, 10)]);
    assert_eq!(w.eps[1].recv_ring_arm(ring, 3), Err(Error::Busy), "slot 3 still armed");
}

/// A ring's handle and its set-up say what is wrong: one ring per peer,
/// slots within a registered region, a slot armed once until it takes a
/// message, no slot past the last; a freed ring (or a later one at its
/// index) is not its handle's; the region stays in use until the ring is
/// freed.
#[test]
fn a_receive_ring_refuses_what_it_cannot_do() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let from_a = w.connect(1, 0);
    let slots = w.register(1, 4096);
    let first = span(&slots, 0, 1024);
    let ep = &mut w.eps[1];
    assert_eq!(ep.recv_ring(first, 0, from_a, 0), Err(Error::Invalid), "no slots");
    assert_eq!(ep.recv_ring(first, 5, from_a, 0), Err(Error::BadSpan), "past the region");
    assert_eq!(ep.recv_ring(first, 4, PeerId(9), 0), Err(Error::UnknownPeer));
    let ring = ep.recv_ring(first, 4, from_a, 0).unwrap();
    assert_eq!(ep.recv_ring(first, 2, from_a, 0), Err(Error::Busy), "one per peer");
    ep.recv_ring_arm(ring, 3).unwrap();
    ep.recv_ring_arm(ring, 0).unwrap();
    assert_eq!(ep.recv_ring_arm(ring, 3), Err(Error::Busy), "armed twice");
    assert_eq!(ep.recv_ring_arm(ring, 4), Err(Error::Invalid), "no slot 4");
    // Several at once: all or none.
    assert_eq!(ep.recv_ring_arm_each(ring, &[1, 2, 3]), Err(Error::Busy), "3 is armed");
    assert_eq!(ep.recv_ring_arm_each(ring, &[1, 1]), Err(Error::Busy), "1 named twice");
    assert_eq!(ep.recv_ring_arm_each(ring, &[2, 4]), Err(Error::Invalid), "no slot 4");
    assert_eq!(ep.recv_ring_arm_each(ring, &[]), Ok(()));
    assert_eq!(ep.recv_ring_landed(ring, 4, &mut []), None, "no slot 4");
    assert_eq!(ep.deregister(slots.id), Err(Error::Busy), "the ring's region");
    assert_eq!(ep.recv_ring_arm_each(ring, &[2, 1]), Ok(()), "none of the refused armed");
    // A run: all or none, within the ring's slots.
    assert_eq!(ep.recv_ring_arm_run(ring, 4, 1), Err(Error::Invalid), "no slot 4");
    assert_eq!(ep.recv_ring_arm_run(ring, 0, 5), Err(Error::Invalid), "five of four");
    assert_eq!(ep.recv_ring_arm_run(ring, 2, 0), Ok(()), "none");
    assert_eq!(ep.recv_ring_free(ring), Ok(4));
    assert_eq!(ep.recv_ring_free(ring), Err(Error::Invalid), "freed once");
    let again = ep.recv_ring(Span { len: 2048, ..first }, 2, from_a, 0).unwrap();
    assert_ne!(again, ring);
    assert_eq!(ep.recv_ring_arm(ring, 1), Err(Error::Invalid), "a later ring's index");
    assert_eq!(ep.recv_ring_landed(ring, 1, &mut []), None, "a later ring's index");
    ep.recv_ring_free(again).unwrap();
    ep.deregister(slots.id).unwrap();
}

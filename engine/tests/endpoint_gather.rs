//! Gather sends (`sendv`), region-to-region copies (`copy_mem`) and
//! registrations found by key (`mr_by_key`) on the sim device.

use crate::common;

use common::{Mem, World, pattern, span};
use efapoll::device::Access;
use efapoll::device::fault::Faults;
use efapoll::device::sim::SimConfig;
use efapoll::endpoint::{Config, Error, Op, PeerId, Span, Status};

/// Whether the engine's fast paths are on (off with `general-paths`).
const FAST: bool = !cfg!(feature = "general-paths");

/// What a caller does when an inline head is declined: the head written
/// into registered memory, then the message gathered by `sendv`.
fn send_head_by_sendv(
    w: &mut World,
    to: PeerId,
    head: &[u8],
    src: Span,
    cq_data: Option<u64>,
    ctx: u64,
) {
    let mr = w.eps[0].register(head.len() as u64, Access::empty()).unwrap();
    w.eps[0].write_mem(mr.id, 0, head).unwrap();
    let spans = [span(&mr, 0, head.len() as u64), src];
    match cq_data {
        Some(d) => w.eps[0].sendvdata(to, &spans, d, ctx),
        None => w.eps[0].sendv(to, &spans, ctx),
    }
    .unwrap();
}

/// Sends `len` bytes from 0 to 1 as three spans of two regions (a
/// header-sized piece of one, then two pieces of the other), with CQ data
/// when `data` is given; checks the message arrived whole, in order.
fn gathered(w: &mut World, len: u64, remote_read: bool, data: Option<u64>) {
    let to_b = w.connect(0, 1);
    let access = if remote_read { Access::REMOTE_READ } else { Access::empty() };
    let hdr = w.eps[0].register(64, access).unwrap();
    let body = w.eps[0].register(len + 100, access).unwrap();
    let dst = w.register(1, len + 64);
    w.fill(0, &hdr, 1);
    w.fill(0, &body, 2);
    let head = len.min(24);
    let rest = len - head;
    let cut = rest / 3;
    let srcs = [span(&hdr, 8, head), span(&body, 100, cut), span(&body, 0, rest - cut)];
    let mut want: Vec<u8> = (8..8 + head).map(|i| pattern(1, i)).collect();
    want.extend((100..100 + cut).map(|i| pattern(2, i)));
    want.extend((0..rest - cut).map(|i| pattern(2, i)));
    let (s0, r0) = (w.done[0].len(), w.done[1].len());
    w.eps[1].recv(span(&dst, 0, len + 64), None, 5).unwrap();
    match data {
        Some(d) => w.eps[0].sendvdata(to_b, &srcs, d, 6).unwrap(),
        None => w.eps[0].sendv(to_b, &srcs, 6).unwrap(),
    }
    w.drive_until(1_000_000, |w| w.done[0].len() > s0 && w.done[1].len() > r0);
    let (sent, got) = (w.done[0][s0], w.done[1][r0]);
    assert_eq!((sent.op, sent.status, sent.len, sent.ctx), (Op::Send, Status::Ok, len, 6));
    assert_eq!((got.op, got.status, got.len, got.ctx), (Op::Recv, Status::Ok, len, 5));
    assert_eq!(got.cq_data, data, "len {len}");
    assert_eq!(&w.eps[1].mem(dst.id)[..len as usize], &want[..], "len {len}");
}

#[test]
fn a_gathered_message_arrives_whole_by_every_protocol() {
    // Eager, medium, long-CTS (no remote read), long-read and runting read
    // (2 MiB, remote read granted on every span).
    for (len, remote_read) in
        [(0, false), (7, false), (3000, false), (40_000, false), (200_000, false)]
    {
        let mut w = World::pair(SimConfig::default(), Config::default());
        gathered(&mut w, len, remote_read, None);
    }
    for runt in [0, 307_200] {
        let cfg = Config { runt_size: runt, handshake_on_insert: true, ..Config::default() };
        let mut w = World::pair(SimConfig::default(), cfg);
        w.connect(0, 1);
        w.connect(1, 0);
        w.settle();
        gathered(&mut w, 2 << 20, true, Some(0xfeed));
        assert!(w.eps[1].counters().rdma_reads > 0, "read by RDMA");
    }
}

#[test]
fn a_short_head_is_copied_and_the_payload_behind_it_gathered() {
    // A medium message sent as a 24-byte head and a 9000-byte body, the
    // peer not yet taking packets: what was copied when the packets were
    // built arrives as it was then, what was gathered as the region holds
    // it when the packets land. Both regions are rewritten in between
    // (no application would: this is to see which bytes were copied).
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    w.settle();
    let (head_len, body_len) = (24u64, 9000u64);
    let head = w.register(0, head_len);
    let body = w.register(0, body_len);
    let dst = w.register(1, head_len + body_len);
    w.fill(0, &head, 1);
    w.fill(0, &body, 2);
    w.eps[0].sendv(to_b, &[span(&head, 0, head_len), span(&body, 0, body_len)], 7).unwrap();
    w.eps[0].flush();
    w.fill(0, &head, 3);
    w.fill(0, &body, 4);
    w.eps[1].recv(span(&dst, 0, head_len + body_len), None, 8).unwrap();
    w.drive_until(1_000_000, |w| w.done[0].len() == 1 && w.done[1].len() == 1);
    assert_eq!((w.done[1][0].status, w.done[1][0].len), (Status::Ok, head_len + body_len));
    let got = w.eps[1].mem(dst.id);
    let (got_head, got_body) = got.split_at(head_len as usize);
    assert!(got_head.iter().enumerate().all(|(i, &b)| b == pattern(1, i as u64)), "head copied");
    assert!(
        got_body.iter().enumerate().all(|(i, &b)| b == pattern(4, i as u64)),
        "body gathered, in every packet"
    );
}

#[test]
fn gathered_messages_carry_cq_data_and_survive_reordering() {
    let sim = SimConfig { seed: 9, faults: Faults::reorder(9, 8), ..SimConfig::default() };
    let mut w = World::pair(sim, Config::default());
    for len in [1, 100, 9000, 70_000] {
        gathered(&mut w, len, false, Some(len));
    }
}

#[test]
fn a_gather_list_is_one_to_four_spans_of_registered_memory() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let mr = w.register(0, 100);
    let s = span(&mr, 0, 10);
    assert_eq!(w.eps[0].sendv(to_b, &[], 1), Err(Error::Invalid));
    assert_eq!(w.eps[0].sendv(to_b, &[s; 5], 1), Err(Error::Invalid));
    assert_eq!(w.eps[0].sendv(to_b, &[s, span(&mr, 95, 10)], 1), Err(Error::BadSpan));
    // Nothing was sent by the refused calls.
    w.settle();
    assert!(w.done[0].is_empty() && w.eps[0].in_flight().is_idle());
    assert_eq!(w.eps[0].sendv(to_b, &[s; 4], 1), Ok(()));
}

#[test]
fn a_region_a_gathered_send_uses_is_busy_until_it_completes() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let a = w.register(0, 100_000);
    let b = w.register(0, 100_000);
    let dst = w.register(1, 200_000);
    w.eps[1].recv(span(&dst, 0, 200_000), None, 1).unwrap();
    w.eps[0].sendv(to_b, &[span(&a, 0, 100_000), span(&b, 0, 100_000)], 2).unwrap();
    assert_eq!(w.eps[0].deregister(b.id), Err(Error::Busy));
    w.drive_until(100_000, |w| w.done[0].len() == 1 && w.done[1].len() == 1);
    assert_eq!(w.eps[0].deregister(b.id), Ok(()));
}

#[test]
fn copy_mem_copies_between_and_within_regions() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let a = w.register(0, 10_000);
    let b = w.register(0, 10_000);
    w.fill(0, &a, 3);
    let ep = &mut w.eps[0];
    ep.copy_mem(span(&a, 100, 9000), b.id, 1000).unwrap();
    let got = ep.mem(b.id);
    assert!((0..9000).all(|i| got[1000 + i] == pattern(3, 100 + i as u64)));
    assert!(got[..1000].iter().all(|&x| x == 0));
    // Overlapping, both ways: a memmove.
    let before = ep.mem(a.id);
    ep.copy_mem(span(&a, 0, 6000), a.id, 10).unwrap();
    assert_eq!(&ep.mem(a.id)[10..6010], &before[..6000]);
    let before = ep.mem(a.id);
    ep.copy_mem(span(&a, 10, 6000), a.id, 0).unwrap();
    assert_eq!(&ep.mem(a.id)[..6000], &before[10..6010]);
    assert_eq!(ep.copy_mem(span(&a, 9000, 1001), b.id, 0), Err(Error::BadSpan));
    assert_eq!(ep.copy_mem(span(&a, 0, 10), b.id, 9991), Err(Error::BadSpan));
    assert_eq!(ep.copy_mem(Span { len: 0, ..span(&a, 0, 0) }, b.id, 10_000), Ok(()));
}

#[test]
fn a_region_is_found_by_its_key_until_deregistered() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let a = w.register(0, 64);
    let b = w.register(0, 64);
    assert_eq!(w.eps[0].mr_by_key(a.key), Some(a));
    assert_eq!(w.eps[0].mr_by_key(b.key), Some(b));
    assert_eq!(w.eps[1].mr_by_key(a.key), None, "another endpoint's key");
    w.eps[0].deregister(a.id).unwrap();
    assert_eq!(w.eps[0].mr_by_key(a.key), None);
}

#[test]
fn a_cancelled_receive_takes_no_message_and_frees_its_region() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let src = w.register(0, 64);
    let a = w.register(1, 64);
    let b = w.register(1, 64);
    w.fill(0, &src, 4);
    w.eps[1].recv(span(&a, 0, 64), None, 1).unwrap();
    w.eps[1].recv(span(&b, 0, 64), None, 2).unwrap();
    assert_eq!(w.eps[1].deregister(a.id), Err(Error::Busy));
    assert!(w.eps[1].cancel_recv(1));
    assert!(!w.eps[1].cancel_recv(1), "withdrawn once");
    assert!(!w.eps[1].cancel_recv(9), "never posted");
    assert_eq!(w.eps[1].deregister(a.id), Ok(()));
    w.eps[0].send(to_b, span(&src, 0, 64), 3).unwrap();
    w.drive_until(10_000, |w| w.done[1].len() == 1);
    assert_eq!((w.done[1][0].ctx, w.done[1][0].len), (2, 64), "the other receive took it");
    assert_eq!(w.eps[1].mem(b.id), (0..64).map(|i| pattern(4, i)).collect::<Vec<_>>());
}

/// Of receives posted with one context, `cancel_recv` withdraws the
/// earliest and `cancel_last_recv` the latest: the other takes the next
/// message, into its own buffer.
#[test]
fn a_receive_is_withdrawn_from_the_oldest_or_from_the_newest() {
    for last in [false, true] {
        let mut w = World::pair(SimConfig::default(), Config::default());
        let to_b = w.connect(0, 1);
        let src = w.register(0, 64);
        let bufs = [w.register(1, 64), w.register(1, 64), w.register(1, 64)];
        w.fill(0, &src, 4);
        for b in &bufs {
            w.eps[1].recv(span(b, 0, 64), None, 7).unwrap();
        }
        let withdrawn = if last { w.eps[1].cancel_last_recv(7) } else { w.eps[1].cancel_recv(7) };
        assert!(withdrawn);
        assert!(!w.eps[1].cancel_last_recv(8), "never posted");
        let gone = if last { 2 } else { 0 };
        assert_eq!(w.eps[1].deregister(bufs[gone].id), Ok(()), "withdrawn: {gone}");
        w.eps[0].send(to_b, span(&src, 0, 64), 3).unwrap();
        w.drive_until(10_000, |w| w.done[1].len() == 1);
        let took = if last { 0 } else { 1 };
        assert_eq!(w.eps[1].mem(bufs[took].id), (0..64).map(|i| pattern(4, i)).collect::<Vec<_>>());
    }
}

/// Sends `len` bytes from 0 to 1 into a receive scattered over three
/// spans of two regions (posted before the message, or after it arrived
/// unexpected); checks each span got its part.
fn scattered(w: &mut World, len: u64, post_first: bool, remote_read: bool) {
    let to_b = w.connect(0, 1);
    let access = if remote_read { Access::REMOTE_READ } else { Access::empty() };
    let src = w.eps[0].register(len.max(1), access).unwrap();
    w.fill(0, &src, 7);
    let hdr = w.register(1, 64);
    let body = w.register(1, 2 * len + 64);
    let head = len.min(24);
    let cut = (len - head) / 2;
    // Room for the message and 10 bytes more: the last span is not filled.
    let dst =
        [span(&hdr, 8, head), span(&body, len + 40, cut), span(&body, 0, len - head - cut + 10)];
    let (s0, r0) = (w.done[0].len(), w.done[1].len());
    if post_first {
        w.eps[1].recvv(&dst, None, 5).unwrap();
    }
    w.eps[0].send(to_b, span(&src, 0, len), 6).unwrap();
    if !post_first {
        w.settle();
        w.eps[1].recvv(&dst, None, 5).unwrap();
    }
    w.drive_until(1_000_000, |w| w.done[0].len() > s0 && w.done[1].len() > r0);
    let got = w.done[1][r0];
    assert_eq!((got.status, got.len, got.ctx), (Status::Ok, len, 5), "len {len}");
    let want: Vec<u8> = (0..len).map(|i| pattern(7, i)).collect();
    let (h, b) = (w.eps[1].mem(hdr.id), w.eps[1].mem(body.id));
    let mut landed = h[8..8 + head as usize].to_vec();
    landed.extend_from_slice(&b[(len + 40) as usize..(len + 40 + cut) as usize]);
    landed.extend_from_slice(&b[..(len - head - cut) as usize]);
    let first_bad = landed.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(first_bad, None, "len {len} post_first {post_first}");
}

#[test]
fn a_scattered_receive_takes_a_message_by_every_protocol() {
    for post_first in [true, false] {
        for (len, remote_read) in
            [(0, false), (5, false), (3000, false), (40_000, false), (200_000, false)]
        {
            let mut w = World::pair(SimConfig::default(), Config::default());
            scattered(&mut w, len, post_first, remote_read);
        }
        let cfg = Config { handshake_on_insert: true, ..Config::on_host() };
        let mut w = World::pair(SimConfig::default(), cfg);
        w.connect(0, 1);
        w.connect(1, 0);
        w.settle();
        scattered(&mut w, 300_000, post_first, true);
        assert!(w.eps[1].counters().rdma_reads > 0, "read by RDMA");
    }
}

#[test]
fn a_scattered_receive_truncates_and_holds_its_regions() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let src = w.register(0, 100);
    let a = w.register(1, 64);
    let b = w.register(1, 64);
    assert_eq!(w.eps[1].recvv(&[], None, 1), Err(Error::Invalid));
    assert_eq!(w.eps[1].recvv(&[span(&a, 0, 1); 5], None, 1), Err(Error::Invalid));
    assert_eq!(w.eps[1].recvv(&[span(&a, 0, 1), span(&b, 60, 5)], None, 1), Err(Error::BadSpan));
    w.eps[1].recvv(&[span(&a, 0, 30), span(&b, 0, 30)], None, 1).unwrap();
    assert_eq!(w.eps[1].deregister(b.id), Err(Error::Busy), "a posted receive's span");
    w.eps[0].send(to_b, span(&src, 0, 100), 2).unwrap();
    w.drive_until(10_000, |w| w.done[1].len() == 1);
    assert_eq!(w.done[1][0].status, Status::Truncated { olen: 100 });
    assert_eq!(w.done[1][0].len, 60);
    assert_eq!(w.eps[1].deregister(b.id), Ok(()), "free once it completed");
    // Withdrawn, a scattered receive holds nothing either.
    w.eps[1].recvv(&[span(&a, 0, 30), span(&a, 30, 30)], None, 3).unwrap();
    assert!(w.eps[1].cancel_recv(3));
    assert_eq!(w.eps[1].deregister(a.id), Ok(()));
}

#[test]
fn a_head_sent_inline_goes_with_its_message_when_it_fits_one_packet() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let src = w.register(0, 100_000);
    let dst = w.register(1, 100_000);
    w.fill(0, &src, 9);
    let head = [0xabu8; 24];
    w.eps[1].recv(span(&dst, 0, 100_000), None, 1).unwrap();
    // Fits: sent at once, with the CQ data (with the fast paths off,
    // declined, and sent by the caller's general path: the same message).
    let sent = w.eps[0].send_inline_head(to_b, &head, span(&src, 0, 1000), Some(5), 2);
    assert_eq!(sent, Ok(FAST));
    if !FAST {
        send_head_by_sendv(&mut w, to_b, &head, span(&src, 0, 1000), Some(5), 2);
    }
    w.drive_until(10_000, |w| w.done[0].len() == 1 && w.done[1].len() == 1);
    let got = w.done[1][0];
    assert_eq!((got.len, got.cq_data, w.done[0][0].ctx), (1024, Some(5), 2));
    let mem = w.eps[1].mem(dst.id);
    assert_eq!(&mem[..24], &head);
    assert!((0..1000).all(|i| mem[24 + i] == pattern(9, i as u64)));
    // Does not fit one packet: nothing sent, for the caller to send otherwise.
    assert_eq!(w.eps[0].send_inline_head(to_b, &head, span(&src, 0, 50_000), None, 3), Ok(false));
    w.settle();
    assert_eq!(w.done[0].len(), 1);
    assert_eq!(
        w.eps[0].send_inline_head(to_b, &head, span(&src, 99_999, 2), None, 3),
        Err(Error::BadSpan)
    );
}

#[test]
fn a_head_written_into_the_packet_is_written_only_when_the_message_goes() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let src = w.register(0, 100_000);
    let dst = w.register(1, 100_000);
    w.fill(0, &src, 4);
    w.eps[1].recv(span(&dst, 0, 100_000), None, 1).unwrap();
    let mut calls = 0;
    // Too long for one packet: not written, nothing sent.
    let long = span(&src, 0, 50_000);
    let sent = w.eps[0].send_inline_head_with(to_b, 16, |_: &mut [u8]| calls += 1, long, None, 2);
    assert_eq!((sent, calls), (Ok(false), 0));
    let write = |b: &mut [u8]| {
        calls += 1;
        b.copy_from_slice(&[7; 16]);
    };
    let sent = w.eps[0].send_inline_head_with(to_b, 16, write, span(&src, 0, 100), None, 3);
    assert_eq!((sent, calls), (Ok(FAST), FAST as u32));
    if !FAST {
        send_head_by_sendv(&mut w, to_b, &[7; 16], span(&src, 0, 100), None, 3);
    }
    w.drive_until(10_000, |w| w.done[1].len() == 1);
    assert_eq!(w.done[1][0].len, 116);
    let mem = w.eps[1].mem(dst.id);
    assert_eq!(&mem[..16], &[7; 16]);
    assert!((0..100).all(|i| mem[16 + i] == pattern(4, i as u64)));
}

#[test]
fn a_head_injected_is_copied_at_once_and_completes_only_if_it_fails() {
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let src = w.register(0, 100_000);
    let dst = w.register(1, 4096);
    w.fill(0, &src, 6);
    for ctx in 1..=2 {
        w.eps[1].recv(span(&dst, 512 * ctx, 512), None, ctx).unwrap();
    }
    let write = |b: &mut [u8]| b.copy_from_slice(&[3; 24]);
    let sent = w.eps[0].inject_head_with(to_b, 24, write, span(&src, 0, 64), 7);
    assert_eq!(sent, Ok(FAST));
    if !FAST {
        return; // declined, as send_inline_head_with is: the caller's general path
    }
    // The source is the caller's again as the call returns: what is
    // written there now does not travel.
    w.fill(0, &src, 8);
    w.drive_until(10_000, |w| w.done[1].len() == 1);
    w.settle();
    assert!(w.done[0].is_empty(), "a success is not reported: {:?}", w.done[0]);
    assert_eq!(w.done[1][0].len, 88);
    let mem = w.eps[1].mem(dst.id);
    assert_eq!(&mem[512..536], &[3; 24]);
    assert!((0..64).all(|i| mem[536 + i] == pattern(6, i as u64)), "the bytes as they were");
    // A failed one is: with its context and the failure.
    let a = w.eps[0].addr();
    w.fabric.fail_sends(&a, 1);
    assert_eq!(w.eps[0].inject_head_with(to_b, 24, write, span(&src, 0, 64), 9), Ok(true));
    w.drive_until(10_000, |w| !w.done[0].is_empty());
    let c = w.done[0][0];
    assert_eq!((c.ctx, c.op), (9, Op::Send));
    assert!(!c.status.is_ok(), "{c:?}");
    // Too long for one packet: declined, nothing sent.
    let long = span(&src, 0, 50_000);
    assert_eq!(w.eps[0].inject_head_with(to_b, 24, write, long, 10), Ok(false));
}

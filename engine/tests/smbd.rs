//! SMB Direct data transfer (MS-SMBD 3.1.5.4) over two endpoints on the
//! sim device: one scenario per rule. A connection talks either to another
//! connection, or to a bare endpoint that plays the peer byte by byte, to
//! see exactly what went on the wire and to send what no connection would.

use crate::common;

use common::{Mem, World, pattern, span};
use efapoll::device::fault::Faults;
use efapoll::device::sim::{SimConfig, SimDevice};
use efapoll::device::{Access, Mr};
use efapoll::endpoint::{
    Completion, Config as EpConfig, Endpoint, Error as EpError, Op, PeerId, TagMatch,
};
use efapoll::ulp::smbd::{
    Config, Connection, Drained, Event, Flags, Flow, HEADER_LEN, Loan, Params, ProtocolError,
    RecvError, RecvStatus, Repr, SegmentError, SendError, SendStatus, SetupError,
};
use efapoll::wire::{Packet, PacketType};

/// Side 0 runs a connection; side 1 a connection too, or a bare endpoint
/// (the raw peer).
struct Pair {
    w: World,
    conns: [Option<Connection>; 2],
    events: [Vec<Event>; 2],
    /// Completions that were not a connection's (the raw peer's).
    others: [Vec<Completion>; 2],
    /// Lent messages' bytes, read when they were reported.
    lent: [Vec<Vec<u8>>; 2],
    /// Loans kept rather than given back at once.
    keep_loans: bool,
    loans: [Vec<Loan>; 2],
    /// Completions and events taken by `Connection::drain`, lent messages
    /// read inside it, rather than polled.
    drain: bool,
}

impl Pair {
    fn new(sim: SimConfig, params: [Params; 2], cfg: Config, raw_peer: bool) -> Pair {
        Pair::with_endpoints(sim, EpConfig::default(), params, cfg, raw_peer)
    }

    fn with_endpoints(
        sim: SimConfig,
        ep_cfg: EpConfig,
        params: [Params; 2],
        cfg: Config,
        raw_peer: bool,
    ) -> Pair {
        let mut w = World::pair(sim, ep_cfg);
        let to = [w.connect(0, 1), w.connect(1, 0)];
        let sides = if raw_peer { 1 } else { 2 };
        let mut conns = [None, None];
        for i in 0..sides {
            conns[i] = Some(Connection::new(&mut w.eps[i], to[i], params[i], cfg).unwrap());
        }
        Pair {
            w,
            conns,
            events: [vec![], vec![]],
            others: [vec![], vec![]],
            lent: [vec![], vec![]],
            keep_loans: false,
            loans: [vec![], vec![]],
            drain: false,
        }
    }

    fn symmetric(params: Params) -> Pair {
        Pair::new(SimConfig::default(), [params; 2], Config::default(), false)
    }

    fn raw(params: Params) -> Pair {
        Pair::new(SimConfig::default(), [params; 2], Config::default(), true)
    }

    fn conn(&mut self, i: usize) -> (&mut Connection, &mut Endpoint<SimDevice>) {
        (self.conns[i].as_mut().unwrap(), &mut self.w.eps[i])
    }

    fn step(&mut self) -> bool {
        let mut did = false;
        for i in 0..2 {
            let ep = &mut self.w.eps[i];
            did |= ep.progress();
            if self.drain
                && let Some(conn) = self.conns[i].as_mut()
            {
                let (events, others, lent) =
                    (&mut self.events[i], &mut self.others[i], &mut self.lent[i]);
                let (keep, loans) = (self.keep_loans, &mut self.loans[i]);
                did |= conn.drain(ep, |ep, d| {
                    let e = match d {
                        Drained::Other(c) => {
                            others.push(*c);
                            return Flow::Next;
                        }
                        Drained::Event(e) => e,
                    };
                    events.push(e);
                    let Event::Lent { loan, data, .. } = e else { return Flow::Next };
                    let mut bytes = vec![0u8; data.len as usize];
                    ep.read_mem(data.mr, data.offset, &mut bytes).unwrap();
                    lent.push(bytes);
                    if !keep {
                        return Flow::Next;
                    }
                    loans.push(loan);
                    Flow::Keep
                }) > 0;
                did |= conn.progress(ep);
                continue;
            }
            while let Some(c) = ep.poll_cq() {
                did = true;
                let mine =
                    self.conns[i].as_mut().is_some_and(|conn| conn.handle_completion(ep, &c));
                if !mine {
                    self.others[i].push(c);
                }
            }
            if let Some(conn) = self.conns[i].as_mut() {
                did |= conn.progress(ep);
                while let Some(e) = conn.poll_event() {
                    if let Event::Lent { loan, data, .. } = e {
                        let mut bytes = vec![0u8; data.len as usize];
                        ep.read_mem(data.mr, data.offset, &mut bytes).unwrap();
                        self.lent[i].push(bytes);
                        if self.keep_loans {
                            self.loans[i].push(loan);
                        } else {
                            conn.give_back(loan).unwrap();
                        }
                    }
                    self.events[i].push(e);
                    did = true;
                }
            }
        }
        did || self.w.fabric.skip_to_next_due()
    }

    fn drive_until(&mut self, max: usize, mut cond: impl FnMut(&Pair) -> bool) {
        for _ in 0..max {
            if cond(self) {
                return;
            }
            self.step();
        }
        assert!(cond(self), "not reached in {max} rounds: {:?}", self.events);
    }

    fn settle(&mut self) {
        let mut quiet = 0;
        while quiet < 4 {
            quiet = if self.step() { 0 } else { quiet + 1 };
        }
    }

    fn received(&self, i: usize) -> Vec<(u64, u64, RecvStatus, Option<u64>)> {
        let f = |e: &Event| match *e {
            Event::Received { ctx, len, status, invalidated } => {
                Some((ctx, len, status, invalidated))
            }
            _ => None,
        };
        self.events[i].iter().filter_map(f).collect()
    }

    fn sent(&self, i: usize) -> Vec<(u64, SendStatus)> {
        let f = |e: &Event| match *e {
            Event::Sent { ctx, status } => Some((ctx, status)),
            _ => None,
        };
        self.events[i].iter().filter_map(f).collect()
    }

    fn terminated(&self, i: usize) -> Option<ProtocolError> {
        self.events[i].iter().find_map(|e| match e {
            Event::Terminated(p) => Some(*p),
            _ => None,
        })
    }

    /// Raw peer (side 1): posts `n` receives of `len` bytes each into a
    /// fresh region, contexts from 1000.
    fn raw_recvs(&mut self, n: u64, len: u64) -> Mr {
        let mr = self.w.register(1, n * len);
        for i in 0..n {
            self.w.eps[1].recv(span(&mr, i * len, len), None, 1000 + i).unwrap();
        }
        mr
    }

    /// Raw peer: the segments received so far, as bytes with their CQ data.
    fn raw_segments(&self, mr: &Mr, len: u64) -> Vec<(Vec<u8>, Option<u64>)> {
        let mem = self.w.eps[1].mem(mr.id);
        self.others[1]
            .iter()
            .filter(|c| c.op == Op::Recv)
            .map(|c| {
                let at = ((c.ctx - 1000) * len) as usize;
                (mem[at..at + c.len as usize].to_vec(), c.cq_data)
            })
            .collect()
    }

    /// Raw peer: sends `bytes` to side 0 as one endpoint message, with
    /// `data` as CQ data when given.
    fn raw_send(&mut self, bytes: &[u8], data: Option<u64>) {
        let mr = self.w.eps[1].register(bytes.len().max(1) as u64, Access::REMOTE_READ).unwrap();
        self.w.eps[1].write_mem(mr.id, 0, bytes).unwrap();
        let to = PeerId(0);
        let s = span(&mr, 0, bytes.len() as u64);
        match data {
            Some(d) => self.w.eps[1].senddata(to, s, d, 77).unwrap(),
            None => self.w.eps[1].send(to, s, 77).unwrap(),
        }
    }
}

/// A segment's bytes, as a peer would build them.
fn segment(granted: u16, flags: Flags, remaining: u32, offset: u32, data: &[u8]) -> Vec<u8> {
    let r = Repr {
        credits_requested: 8,
        credits_granted: granted,
        flags,
        remaining_data_length: remaining,
        data_offset: offset,
        data_length: data.len() as u32,
    };
    let mut b = vec![0u8; r.buffer_len()];
    r.emit(&mut b);
    b.extend_from_slice(data);
    b
}

fn small(max_size: u32, credits: u16) -> Params {
    Params::symmetric(max_size, 1 << 20, credits)
}

/// Sends messages of `sizes` from 0 to 1 (all queued at once, receive
/// buffers posted first) and checks each arrived byte-exact, in order.
fn transfer(p: &mut Pair, sizes: &[u64], src_access: Access) {
    let total: u64 = sizes.iter().sum::<u64>() + 1;
    let src = p.w.eps[0].register(total, src_access).unwrap();
    let dst = p.w.register(1, total);
    p.w.fill(0, &src, total);
    let (s0, r0) = (p.sent(0).len(), p.received(1).len());
    let mut at = 0;
    let mut starts = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        starts.push(at);
        // A buffer for each message that is delivered (not the empty one),
        // then the message; either waits for room while the others move.
        if len > 0 {
            loop {
                let (c, ep) = p.conn(1);
                match c.recv(ep, span(&dst, at, len), i as u64) {
                    Ok(()) => break,
                    Err(RecvError::Again) => {
                        p.step();
                    }
                    Err(e) => panic!("recv: {e}"),
                }
            }
        }
        let s = span(&src, at, len);
        loop {
            let (c, ep) = p.conn(0);
            match c.send(ep, s, None, i as u64) {
                Ok(()) => break,
                Err(SendError::Again) => {
                    p.step();
                }
                Err(e) => panic!("send: {e}"),
            }
        }
        at += len;
    }
    let n = sizes.iter().filter(|&&l| l > 0).count();
    p.drive_until(1_000_000, |p| {
        p.sent(0).len() - s0 == sizes.len() && p.received(1).len() - r0 == n
    });
    let got = p.w.eps[1].mem(dst.id);
    let want_ctx: Vec<u64> = (0..sizes.len() as u64).filter(|&i| sizes[i as usize] > 0).collect();
    let recvd = &p.received(1)[r0..];
    assert_eq!(recvd.iter().map(|r| r.0).collect::<Vec<_>>(), want_ctx, "in send order");
    for (r, &i) in recvd.iter().zip(&want_ctx) {
        let (start, len) = (starts[i as usize], sizes[i as usize]);
        assert_eq!((r.1, r.2), (len, RecvStatus::Ok), "message {i} of {len}");
        for j in start..start + len {
            assert_eq!(
                got[j as usize],
                pattern(total, j),
                "message {i} of {len}, byte {}",
                j - start
            );
        }
    }
    assert!(p.sent(0)[s0..].iter().all(|&(_, s)| s == SendStatus::Ok));
    assert_eq!(p.terminated(0), None);
    assert_eq!(p.terminated(1), None);
}

#[test]
fn messages_of_many_sizes_arrive_byte_exact() {
    // Segments of 1364 bytes carry 1340 of data each; sizes on either side
    // of one, two and ten segments, and a whole 1 MiB message.
    let mut p = Pair::symmetric(Params::default());
    let sizes = [1, 1339, 1340, 1341, 2679, 2680, 2681, 13_400, 13_401, 65_536, 1 << 20, 7];
    transfer(&mut p, &sizes, Access::empty());
    let s = p.conns[0].as_ref().unwrap().stats();
    let segs: u64 = sizes.iter().map(|l| l.div_ceil(1340)).sum();
    assert_eq!(s.segments_sent - s.empty_sent, segs);
    assert_eq!(s.bytes_sent, sizes.iter().sum::<u64>());
}

/// Whether `len` bytes sent now from `src` on side 0 go whole at once:
/// reported sent before any progress, as only a message copied into its
/// packet is. Then checks it arrives byte-exact.
fn sent_at_once(p: &mut Pair, src: &Mr, len: u64, ctx: u64) -> bool {
    let dst = p.w.register(1, len);
    let (c, ep) = p.conn(1);
    c.recv(ep, span(&dst, 0, len), ctx).unwrap();
    let (c, ep) = p.conn(0);
    c.send(ep, span(src, 0, len), None, ctx).unwrap();
    let now = c.poll_event();
    if let Some(e) = now {
        p.events[0].push(e);
    }
    p.settle();
    assert!(p.sent(0).contains(&(ctx, SendStatus::Ok)), "{len} bytes sent");
    let got = p.received(1).into_iter().find(|r| r.0 == ctx);
    assert_eq!(got.map(|r| (r.1, r.2)), Some((len, RecvStatus::Ok)), "{len} bytes received");
    assert_eq!(p.w.eps[1].mem(dst.id), p.w.eps[0].mem(src.id)[..len as usize].to_vec());
    matches!(now, Some(Event::Sent { ctx: c, .. }) if c == ctx)
}

/// Within one packet, only a message up to `Config::inject_max` is copied
/// into it and reported sent at once; a longer one goes from the
/// application's memory and is reported as its send completes.
#[test]
fn only_a_message_up_to_inject_max_is_reported_sent_at_once() {
    let fast = !cfg!(feature = "general-paths");
    let mut p = Pair::symmetric(Params::symmetric(8 << 10, 1 << 20, 16));
    let max = p.conns[0].as_ref().unwrap().config().inject_max;
    let src = p.w.eps[0].register(4 << 10, Access::REMOTE_READ).unwrap();
    p.w.fill(0, &src, 4 << 10);
    assert_eq!(sent_at_once(&mut p, &src, max, 1), fast);
    assert!(!sent_at_once(&mut p, &src, max + 1, 2));
    assert!(!sent_at_once(&mut p, &src, 4 << 10, 3));
    assert_eq!(sent_at_once(&mut p, &src, 1, 4), fast);
    let s = p.conns[0].as_ref().unwrap().stats();
    assert_eq!((s.messages_sent, s.segments_sent - s.empty_sent), (4, 4));
}

#[test]
fn a_message_goes_whole_in_one_packet_as_soon_as_it_fits_one() {
    // Segments that carry more than a packet: whether a message goes
    // whole (copied into one packet, sent at once) is the packet's room,
    // which grows once the peer's HANDSHAKE is in and REQs stop carrying
    // the raw address. The general paths send nothing at once.
    let fast = !cfg!(feature = "general-paths");
    let params = Params::symmetric(32 << 10, 1 << 20, 16);
    let cfg = Config { inject_max: u64::MAX, ..Config::default() };
    let mut p = Pair::new(SimConfig::default(), [params; 2], cfg, false);
    let peer = p.conns[0].as_ref().unwrap().peer();
    let before = p.w.eps[0].max_eager_size(peer, false);
    let src = p.w.eps[0].register(16 << 10, Access::REMOTE_READ).unwrap();
    p.w.fill(0, &src, 16 << 10);
    // Fits the packet the first REQ goes in.
    let head = efapoll::ulp::smbd::DEFAULT_DATA_OFFSET as u64;
    assert_eq!(sent_at_once(&mut p, &src, before - head, 1), fast);
    let after = p.w.eps[0].max_eager_size(peer, false);
    assert!(after > before, "the handshake is in: {before} -> {after}");
    // Fits the packet now, though it did not at first.
    assert_eq!(sent_at_once(&mut p, &src, after - head, 2), fast);
    // Longer than a packet: from a header slot, reported sent once the
    // endpoint's send completes.
    assert!(!sent_at_once(&mut p, &src, after - head + 1, 3));
    assert_eq!(sent_at_once(&mut p, &src, after - head, 4), fast);
    assert_eq!(p.terminated(0), None);
}

/// A message of one segment too long for a packet goes from a header slot
/// and is reported sent only once its send completes: with delivery
/// complete, once the peer has it in a receive buffer. The raw peer posts
/// a receive for one message at a time: the others wait, undelivered and
/// unreported, however long the first takes.
#[test]
fn a_message_from_a_header_slot_is_reported_sent_once_its_send_completes() {
    let (n, len) = (4u64, 40u64 << 10);
    let seg = len + 24;
    let params = small(seg as u32, 16);
    let cfg = Config::default();
    let dc = EpConfig { delivery_complete: true, handshake_on_insert: true, ..EpConfig::default() };
    let mut p = Pair::with_endpoints(SimConfig::default(), dc, [params; 2], cfg, true);
    let src = p.w.register(0, n * len);
    p.w.fill(0, &src, 3);
    // The peer's HANDSHAKE first, without which no send goes with
    // delivery complete (they would wait in the connection's queue).
    p.settle();
    for k in 0..n {
        let (c, ep) = p.conn(0);
        c.send(ep, span(&src, k * len, len), None, k).unwrap();
    }
    let sent = |p: &Pair| p.sent(0).iter().map(|s| s.0).collect::<Vec<_>>();
    p.settle();
    assert_eq!(sent(&p), [0u64; 0], "none delivered");
    let mut segs = Vec::new();
    for k in 0..n {
        let mr = p.raw_recvs(1, seg);
        p.settle();
        segs.extend(p.raw_segments(&mr, seg));
        p.others[1].clear();
        assert_eq!(sent(&p), (0..=k).collect::<Vec<_>>(), "delivered up to message {k}");
    }
    let data: Vec<Vec<u8>> = segs.iter().map(|(b, _)| b[24..].to_vec()).collect();
    let want: Vec<Vec<u8>> = (0..n)
        .map(|k| p.w.eps[0].mem(src.id)[(k * len) as usize..][..len as usize].to_vec())
        .collect();
    assert_eq!(data, want);
    let s = p.conns[0].as_ref().unwrap().stats();
    assert_eq!(s.segments_sent - s.empty_sent, n, "one segment a message");
}

#[test]
fn large_segments_arrive_in_order_whatever_order_their_sends_complete_in() {
    // 200 KB segments go by long-read or long-CTS, the short last one
    // eagerly: completions come out of the order the segments matched.
    // On host, long-read takes every message that is not eager.
    for (ep_cfg, access) in [
        (EpConfig::on_host(), Access::REMOTE_READ),
        (EpConfig::default(), Access::REMOTE_READ),
        (EpConfig::default(), Access::empty()),
    ] {
        let sim = SimConfig { seed: 5, faults: Faults::reorder(5, 8), ..SimConfig::default() };
        let params = small(200_024, 8);
        let mut p = Pair::with_endpoints(sim, ep_cfg, [params; 2], Config::default(), false);
        transfer(&mut p, &[1 << 20, 200_001, 3, 400_000, 1, 60_000, 7], access);
    }
}

/// A segment the peer reads carries its header in its REQ (the runt of a
/// runting read): the peer reads the data alone, one RDMA read a segment,
/// into the buffer it placed the receive in.
#[test]
fn a_segment_the_peer_reads_carries_its_header_in_its_request() {
    let mut p = Pair::with_endpoints(
        SimConfig::default(),
        EpConfig { handshake_on_insert: true, ..EpConfig::on_host() },
        [small(8216, 8); 2],
        Config::default(),
        false,
    );
    // A peer is read from once its HANDSHAKE says it can be.
    let (a, b) = (PeerId(0), PeerId(0));
    p.drive_until(1000, |p| {
        p.w.eps[0].peer_handshake_received(a) && p.w.eps[1].peer_handshake_received(b)
    });
    p.w.fabric.set_capture(true);
    let reads = p.w.eps[1].counters().rdma_reads;
    // Four messages of 8 KiB, each a segment read; two eager between.
    transfer(&mut p, &[8192, 8192, 5000, 8192, 3, 8192], Access::REMOTE_READ);
    let wire = p.w.fabric.take_capture();
    let count = |t: PacketType| wire.iter().filter(|(_, _, b)| b[0] == t.id()).count();
    assert_eq!(count(PacketType::LongReadMsgRtm), 0);
    let runts: Vec<_> =
        wire.iter().filter(|(_, _, b)| b[0] == PacketType::RuntReadMsgRtm.id()).collect();
    assert_eq!(runts.len(), 4, "one REQ a read segment");
    for (_, _, b) in runts {
        let Packet::Req(r, data) = Packet::parse(b).unwrap() else { panic!("a REQ") };
        assert_eq!((r.runt_length, data.len()), (24, 24));
        // The whole segment's header: the data follows it, to be read.
        let h = Repr::parse_header(data, 24 + 8192).unwrap();
        assert_eq!((h.data_offset, h.data_length), (24, 8192));
    }
    assert_eq!(p.w.eps[1].counters().rdma_reads - reads, 4, "the data alone read");
    // Read into place, and the 5,000-byte one landed there eagerly.
    assert_eq!(p.conns[1].as_ref().unwrap().stats().in_place, 5);
}

/// In a receive ring (receives never placed), long segments complete in
/// the endpoint's queue and short ones are marked in their slots, out of
/// the order they took their slots: taken in order either way, by a
/// connection drained or polled.
#[test]
fn ring_segments_marked_and_reported_are_taken_in_order() {
    let cfg = Config { direct_min: u64::MAX, ..Config::default() };
    for drain in [false, true] {
        let sim = SimConfig { seed: 7, faults: Faults::reorder(5, 8), ..SimConfig::default() };
        let params = small(200_024, 8);
        let mut p = Pair::with_endpoints(sim, EpConfig::default(), [params; 2], cfg, false);
        p.drain = drain;
        let sizes = [1 << 20, 3, 200_001, 1, 64, 400_000, 1, 60_000, 7, 100, 5];
        transfer(&mut p, &sizes, Access::REMOTE_READ);
        let s = p.conns[1].as_ref().unwrap().stats();
        assert_eq!(s.messages_received, sizes.len() as u64, "drain {drain}");
    }
}

#[test]
fn many_small_messages_stream_with_few_credits() {
    // 4 credits each way: the sender stalls, asks for a response, and the
    // receiver's empty messages grant the receives it reposts.
    let mut p = Pair::symmetric(small(256, 4));
    let sizes: Vec<u64> = (0..300).map(|i| 1 + (i * 37) % 700).collect();
    transfer(&mut p, &sizes, Access::empty());
    let a = *p.conns[0].as_ref().unwrap().stats();
    let b = *p.conns[1].as_ref().unwrap().stats();
    assert!(a.credit_stalls > 0, "credits ran out: {a:?}");
    assert!(a.responses_requested > 0 && b.empty_sent > 0, "{a:?} {b:?}");
    assert_eq!(a.empty_sent, 0, "the sender's own segments carried its grants");
}

/// Messages that arrive before their buffers wait, holding their
/// credits, and go in order as buffers are posted; the connection is then
/// as it was before the wait (in test builds its state is checked at each
/// look of the fast path), and the next message goes as any.
#[test]
fn messages_that_waited_for_buffers_go_in_order_and_the_next_as_before() {
    let mut p = Pair::symmetric(small(1364, 8));
    let src = p.w.register(0, 400);
    let dst = p.w.register(1, 400);
    p.w.fill(0, &src, 3);
    for k in 0..3 {
        let (c, ep) = p.conn(0);
        c.send(ep, span(&src, k * 100, 100), None, k).unwrap();
    }
    p.settle();
    assert!(p.received(1).is_empty(), "no buffer yet");
    for k in 0..4 {
        let (c, ep) = p.conn(1);
        c.recv(ep, span(&dst, k * 100, 100), k).unwrap();
    }
    p.settle();
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 300, 100), None, 3).unwrap();
    p.settle();
    let got: Vec<(u64, u64)> = p.received(1).iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(got, [(0, 100), (1, 100), (2, 100), (3, 100)]);
    let mem = p.w.eps[1].mem(dst.id);
    assert!((0..400).all(|j| mem[j as usize] == pattern(3, j)), "byte-exact");
}

#[test]
fn both_ways_at_once() {
    let mut p = Pair::symmetric(small(512, 3));
    let len = 10_000u64;
    let src = [p.w.register(0, len), p.w.register(1, len)];
    let dst = [p.w.register(0, len), p.w.register(1, len)];
    p.w.fill(0, &src[0], 1);
    p.w.fill(1, &src[1], 2);
    for round in 0..20 {
        for i in 0..2 {
            let (c, ep) = p.conn(i);
            c.recv(ep, span(&dst[i], 0, len), round).unwrap();
            c.send(ep, span(&src[i], 0, len - round), None, round).unwrap();
        }
        p.drive_until(100_000, |p| {
            p.received(0).len() as u64 > round && p.received(1).len() as u64 > round
        });
    }
    for (i, seed) in [(0, 2), (1, 1)] {
        let got = p.w.eps[i].mem(dst[i].id);
        assert!((0..len - 19).all(|j| got[j as usize] == pattern(seed, j)), "side {i}");
    }
}

#[test]
fn a_message_longer_than_max_fragmented_send_size_is_a_local_error_and_sends_nothing() {
    let mut p = Pair::raw(Params::symmetric(1364, 5000, 8));
    let recvs = p.raw_recvs(4, 2000);
    let src = p.w.register(0, 6000);
    let (c, ep) = p.conn(0);
    assert_eq!(
        c.send(ep, span(&src, 0, 5001), None, 1),
        Err(SendError::TooLong { len: 5001, max: 5000 })
    );
    p.settle();
    assert!(p.raw_segments(&recvs, 2000).is_empty(), "nothing was sent");
    assert!(p.events[0].is_empty());
    // The longest allowed goes.
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, 5000), None, 2).unwrap();
    p.settle();
    assert_eq!(p.raw_segments(&recvs, 2000).len(), 4);
}

#[test]
fn an_empty_buffer_sends_the_empty_message_alone() {
    let mut p = Pair::raw(small(1364, 8));
    let recvs = p.raw_recvs(2, 2000);
    let src = p.w.register(0, 8);
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, 0), None, 5).unwrap();
    p.settle();
    let segs = p.raw_segments(&recvs, 2000);
    assert_eq!(segs.len(), 1);
    let (bytes, token) = &segs[0];
    assert_eq!(bytes.len(), HEADER_LEN, "no padding, no buffer");
    assert_eq!(
        &bytes[4..20],
        &[0; 16],
        "Flags, Reserved, RemainingDataLength, DataOffset, DataLength"
    );
    assert_eq!(u16::from_le_bytes([bytes[0], bytes[1]]), 8, "CreditsRequested");
    assert_eq!(*token, None);
    assert_eq!(p.sent(0), [(5, SendStatus::Ok)]);
}

/// The raw peer's view of one message of `len` bytes sent with `cfg`.
fn segments_of(
    len: u64,
    params: Params,
    cfg: Config,
    token: Option<u64>,
) -> Vec<(Repr, Vec<u8>, Option<u64>)> {
    let mut p = Pair::new(SimConfig::default(), [params; 2], cfg, true);
    let recvs = p.raw_recvs(64, 4096);
    let src = p.w.register(0, len);
    p.w.fill(0, &src, 3);
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, len), token, 9).unwrap();
    p.settle();
    assert_eq!(p.sent(0), [(9, SendStatus::Ok)]);
    p.raw_segments(&recvs, 4096)
        .into_iter()
        .map(|(bytes, t)| {
            let (r, data) = Repr::parse(&bytes).unwrap();
            // Padding is zero, Reserved too.
            assert!(bytes[HEADER_LEN..r.buffer_len()].iter().all(|&b| b == 0), "padding");
            assert_eq!(&bytes[6..8], &[0, 0], "Reserved");
            (r, data.to_vec(), t)
        })
        .collect()
}

#[test]
fn segments_start_data_at_24_and_fill_max_send_size() {
    let segs = segments_of(3000, small(1364, 16), Config::default(), None);
    let fields: Vec<(u32, u32, u32)> = segs
        .iter()
        .map(|(r, ..)| (r.data_offset, r.data_length, r.remaining_data_length))
        .collect();
    assert_eq!(fields, [(24, 1340, 1660), (24, 1340, 320), (24, 320, 0)]);
    let data: Vec<u8> = segs.iter().flat_map(|(_, d, _)| d.clone()).collect();
    assert_eq!(data, (0..3000).map(|i| pattern(3, i)).collect::<Vec<_>>(), "in strict order");
}

#[test]
fn data_offset_plus_data_length_never_exceeds_max_send_size() {
    for (max, offset) in [(64, 24), (65, 24), (1364, 32), (4096, 256), (33, 32)] {
        let cfg = Config { data_offset: offset, ..Config::default() };
        // 40 segments, the last of one byte: within the peer's credits.
        let len = 39 * (max - offset) as u64 + 1;
        let segs = segments_of(len, small(max, 64), cfg, None);
        for (r, d, _) in &segs {
            assert_eq!(r.data_offset, offset, "8-byte aligned, as configured");
            assert!(r.data_offset + r.data_length <= max, "{max}: {r:?}");
            assert_eq!(d.len() as u32, r.data_length);
        }
        assert_eq!(segs.len(), 40, "max {max} offset {offset}");
        assert_eq!(segs[39].0.data_length, 1);
    }
}

#[test]
fn remaining_data_length_counts_the_bytes_not_yet_sent() {
    let segs = segments_of(10_000, small(1000, 64), Config::default(), None);
    let mut sent = 0u32;
    for (r, ..) in &segs {
        sent += r.data_length;
        assert_eq!(r.remaining_data_length, 10_000 - sent);
    }
    assert_eq!(segs.last().unwrap().0.remaining_data_length, 0, "0 on the last");
}

#[test]
fn the_token_rides_the_first_segment_only() {
    for len in [0u64, 10, 5000] {
        let segs = segments_of(len, small(1364, 16), Config::default(), Some(0xabcd));
        let tokens: Vec<Option<u64>> = segs.iter().map(|s| s.2).collect();
        let mut want = vec![None; segs.len()];
        want[0] = Some(0xabcd);
        assert_eq!(tokens, want, "{len} bytes");
    }
}

#[test]
fn the_receiver_invalidates_the_token_before_delivering() {
    let mut p = Pair::symmetric(small(1364, 16));
    let lent = p.w.eps[1].register(4096, Access::REMOTE_WRITE).unwrap();
    let src = p.w.register(0, 5000);
    let dst = p.w.register(1, 5000);
    p.w.fill(0, &src, 6);
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, 5000), Some(lent.key), 2).unwrap();
    // All four segments arrive; with no buffer posted the message waits,
    // and the first segment's token is already invalidated.
    p.settle();
    assert!(p.received(1).is_empty());
    assert_eq!(p.w.eps[1].mr_by_key(lent.key), None, "deregistered on arrival");
    assert_eq!(p.w.eps[1].mr(lent.id), None);
    let (c, ep) = p.conn(1);
    c.recv(ep, span(&dst, 0, 5000), 1).unwrap();
    p.settle();
    assert_eq!(p.received(1), [(1, 5000, RecvStatus::Ok, Some(lent.key))]);
    assert_eq!(p.conns[1].as_ref().unwrap().stats().tokens_invalidated, 1);
    assert_eq!(p.w.eps[1].mem(dst.id), (0..5000).map(|i| pattern(6, i)).collect::<Vec<_>>());
}

#[test]
fn an_empty_message_can_carry_a_token() {
    let mut p = Pair::symmetric(small(1364, 16));
    let lent = p.w.eps[1].register(64, Access::REMOTE_WRITE).unwrap();
    let src = p.w.register(0, 8);
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, 0), Some(lent.key), 2).unwrap();
    p.drive_until(10_000, |p| !p.events[1].is_empty());
    assert_eq!(p.events[1], [Event::Invalidated { token: lent.key }]);
    assert_eq!(p.w.eps[1].mr(lent.id), None);
}

#[test]
fn a_token_the_receiver_cannot_invalidate_terminates() {
    // A key no region has; one of the connection's own; a region in use.
    type TokenOf = fn(&mut Pair) -> u64;
    let cases: [(&str, TokenOf); 3] = [
        ("unknown", |_| 0x5eed),
        ("own", |p| p.conns[0].as_ref().unwrap().receive_region().key),
        ("busy", |p| {
            // A tagged receive uses it (and takes none of the segments).
            let mr = p.w.register(0, 64);
            p.w.eps[0].trecv(span(&mr, 0, 64), TagMatch { tag: 1, ignore: 0 }, None, 5).unwrap();
            mr.key
        }),
    ];
    for (name, token) in cases {
        let mut p = Pair::raw(small(1364, 8));
        let token = token(&mut p);
        p.raw_send(&segment(0, Flags::empty(), 0, 24, b"x"), Some(token));
        p.settle();
        let want = match name {
            "busy" => ProtocolError::Invalidate { token, error: EpError::Busy },
            _ => ProtocolError::UnknownToken { token },
        };
        assert_eq!(p.terminated(0), Some(want), "{name}");
    }
}

#[test]
fn a_second_token_in_one_message_terminates() {
    let mut p = Pair::raw(small(1364, 8));
    let a = p.w.register(0, 64);
    let b = p.w.register(0, 64);
    p.raw_send(&segment(0, Flags::empty(), 1, 24, b"x"), Some(a.key));
    p.raw_send(&segment(0, Flags::empty(), 0, 24, b"y"), Some(b.key));
    p.settle();
    assert_eq!(p.terminated(0), Some(ProtocolError::TokenTwice { token: b.key }));
    assert!(p.w.eps[0].mr(b.id).is_some(), "the second was not invalidated");
}

/// What side 0 says of `bytes` sent to it by the raw peer (after `before`).
fn verdict(params: Params, before: &[&[u8]], bytes: &[u8]) -> Option<ProtocolError> {
    let mut p = Pair::raw(params);
    let dst = p.w.register(0, 1 << 20);
    let (c, ep) = p.conn(0);
    c.recv(ep, span(&dst, 0, 1 << 20), 1).unwrap();
    for b in before {
        p.raw_send(b, None);
    }
    p.raw_send(bytes, None);
    p.settle();
    p.conns[0].as_ref().unwrap().error()
}

#[test]
fn every_malformed_segment_is_a_typed_error_that_terminates() {
    let params = small(1364, 8);
    let ok = segment(0, Flags::empty(), 0, 24, b"data");
    assert_eq!(verdict(params, &[], &ok), None, "the well-formed one");
    let malformed = |s: SegmentError| Some(ProtocolError::Malformed(s));
    assert_eq!(
        verdict(params, &[], &ok[..19]),
        malformed(SegmentError::Truncated { need: 20, have: 19 }),
        "shorter than the header"
    );
    let mut bad = ok.clone();
    bad[12] = 28;
    assert_eq!(verdict(params, &[], &bad), malformed(SegmentError::Misaligned { data_offset: 28 }));
    bad[12] = 16;
    assert_eq!(
        verdict(params, &[], &bad),
        malformed(SegmentError::OffsetInHeader { data_offset: 16 })
    );
    let mut bad = ok.clone();
    bad[16] = 5;
    assert_eq!(
        verdict(params, &[], &bad),
        malformed(SegmentError::BeyondSegment { data_offset: 24, data_length: 5, segment_len: 28 }),
        "data beyond the packet"
    );
    assert_eq!(
        verdict(params, &[], &segment(0, Flags::empty(), 0, 24, &[7; 1341])),
        Some(ProtocolError::SegmentTooLong { len: 1365, max: 1364 }),
        "beyond MaxReceiveSize"
    );
    assert_eq!(
        verdict(params, &[], &segment(0, Flags::empty(), 1 << 20, 24, b"d")),
        Some(ProtocolError::MessageTooLong { len: (1 << 20) + 1, max: 1 << 20 }),
        "beyond MaxFragmentedSize"
    );
    let first = segment(0, Flags::empty(), 100, 24, &[1; 100]);
    assert_eq!(
        verdict(params, &[&first], &segment(0, Flags::empty(), 1, 24, &[2; 100])),
        Some(ProtocolError::RemainingMismatch { left: 100, data_length: 100, remaining: 1 }),
        "RemainingDataLength inconsistent with the message so far"
    );
    assert_eq!(
        verdict(params, &[&first], &segment(0, Flags::empty(), 0, 24, &[2; 99])),
        Some(ProtocolError::RemainingMismatch { left: 100, data_length: 99, remaining: 0 }),
        "the last segment before the message is whole"
    );
    let mut empty_more = segment(0, Flags::empty(), 0, 0, b"");
    empty_more[8] = 3;
    assert_eq!(
        verdict(params, &[], &empty_more),
        malformed(SegmentError::EmptyWithRemaining { remaining_data_length: 3 })
    );
}

/// A whole segment carrying more than MaxFragmentedReceiveSize ends the
/// connection where its message would otherwise be lent, polled or
/// drained: the paths that lend check its length by the segment's,
/// which must not let it through; the message before it, within, is lent.
#[test]
fn a_message_beyond_max_fragmented_size_is_refused_where_it_would_be_lent() {
    for drain in [false, true] {
        let params = Params::symmetric(1364, 100, 8);
        let cfg = Config { lend_max: 200, ..Config::default() };
        let mut p = Pair::new(SimConfig::default(), [params; 2], cfg, true);
        p.drain = drain;
        p.raw_send(&segment(0, Flags::empty(), 0, 24, &[5; 100]), None);
        p.raw_send(&segment(0, Flags::empty(), 0, 24, &[6; 101]), None);
        p.settle();
        assert_eq!(p.lent[0], [vec![5; 100]], "drained: {drain}");
        assert_eq!(
            p.terminated(0),
            Some(ProtocolError::MessageTooLong { len: 101, max: 100 }),
            "drained: {drain}"
        );
    }
}

#[test]
fn a_terminated_connection_sends_nothing_more_and_returns_every_buffer() {
    let mut p = Pair::raw(small(1364, 8));
    let recvs = p.raw_recvs(16, 2000);
    let src = p.w.register(0, 100_000);
    let dst = p.w.register(0, 100);
    let (c, ep) = p.conn(0);
    c.recv(ep, span(&dst, 0, 100), 1).unwrap();
    c.recv(ep, span(&dst, 0, 100), 2).unwrap();
    // More segments than the 8 credits: most of it waits.
    c.send(ep, span(&src, 0, 100_000), None, 3).unwrap();
    c.send(ep, span(&src, 0, 10), None, 4).unwrap();
    p.settle();
    let before = p.raw_segments(&recvs, 2000).len();
    assert_eq!(before, 7, "the last credit waits for a grant");
    let mut bad = segment(0, Flags::empty(), 0, 24, b"x");
    bad[12] = 25;
    p.raw_send(&bad, None);
    p.settle();
    assert_eq!(
        p.terminated(0),
        Some(ProtocolError::Malformed(SegmentError::Misaligned { data_offset: 25 }))
    );
    assert_eq!(p.sent(0), [(3, SendStatus::Terminated), (4, SendStatus::Terminated)]);
    let recvd = p.received(0);
    assert_eq!(
        recvd.iter().map(|r| (r.0, r.2)).collect::<Vec<_>>(),
        [(1, RecvStatus::Terminated), (2, RecvStatus::Terminated)]
    );
    // Grants arrive now, and nothing more goes.
    p.raw_send(&segment(100, Flags::empty(), 0, 0, b""), None);
    p.settle();
    assert_eq!(p.raw_segments(&recvs, 2000).len(), before);
    let (c, ep) = p.conn(0);
    let e = ProtocolError::Malformed(SegmentError::Misaligned { data_offset: 25 });
    assert_eq!(c.send(ep, span(&src, 0, 1), None, 5), Err(SendError::Terminated(e)));
    assert_eq!(c.recv(ep, span(&dst, 0, 1), 6), Err(RecvError::Terminated(e)));
    assert_eq!(p.events[0].iter().filter(|e| matches!(e, Event::Terminated(_))).count(), 1);
}

#[test]
fn a_sender_never_sends_without_a_credit() {
    // The peer granted 3 credits and grants nothing until told to.
    let params = Params { send_credits: 3, ..small(100, 8) };
    let mut p = Pair::new(SimConfig::default(), [params; 2], Config::default(), true);
    let recvs = p.raw_recvs(64, 200);
    let src = p.w.register(0, 7600);
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, 7600), None, 1).unwrap(); // 100 segments of 76
    p.settle();
    // Two: the third credit is the last, kept for a message that grants.
    let segs = p.raw_segments(&recvs, 200);
    assert_eq!(segs.len(), 2);
    let rr: Vec<bool> = segs
        .iter()
        .map(|(b, _)| Repr::parse(b).unwrap().0.flags.contains(Flags::RESPONSE_REQUESTED))
        .collect();
    assert_eq!(rr, [false, true], "the segment leaving one credit asks for a response");
    // The peer grants 5: five more, never six.
    p.raw_send(&segment(5, Flags::empty(), 0, 0, b""), None);
    p.settle();
    assert_eq!(p.raw_segments(&recvs, 200).len(), 7);
    // An empty message that grants nothing fills a receive, posted again:
    // the next segment may use the last credit, since it grants that one.
    p.raw_send(&segment(0, Flags::empty(), 0, 0, b""), None);
    p.settle();
    let segs = p.raw_segments(&recvs, 200);
    assert_eq!(segs.len(), 8);
    let last = Repr::parse(&segs[7].0).unwrap().0;
    assert_eq!(last.credits_granted, 1, "the empty message's receive");
    assert_eq!(p.conns[0].as_ref().unwrap().credits().send(), 0);
}

#[test]
fn try_send_starts_a_message_now_or_queues_nothing() {
    // The peer granted 3 credits and grants nothing until told to.
    let params = Params { send_credits: 3, ..small(100, 8) };
    let mut p = Pair::new(SimConfig::default(), [params; 2], Config::default(), true);
    let recvs = p.raw_recvs(64, 200);
    let src = p.w.register(0, 7600);
    p.w.fill(0, &src, 7600);
    for ctx in 1..=2 {
        let (c, ep) = p.conn(0);
        assert_eq!(c.try_send(ep, span(&src, 0, 50), None, ctx), Ok(()));
    }
    // The last credit is kept for a message that grants: none to grant.
    let (c, ep) = p.conn(0);
    let stalls = c.stats().credit_stalls;
    assert_eq!(c.try_send(ep, span(&src, 0, 50), None, 3), Err(SendError::Again));
    assert_eq!(c.stats().credit_stalls, stalls, "refused, not queued to wait");
    // A message longer than MaxFragmentedSendSize is the local error
    // still, credit or none.
    let long = p.w.register(0, (1 << 20) + 1);
    let (c, ep) = p.conn(0);
    let too_long = c.try_send(ep, span(&long, 0, (1 << 20) + 1), None, 9);
    assert_eq!(too_long, Err(SendError::TooLong { len: (1 << 20) + 1, max: 1 << 20 }));
    p.settle();
    assert_eq!(p.sent(0), [(1, SendStatus::Ok), (2, SendStatus::Ok)]);
    assert_eq!(p.raw_segments(&recvs, 200).len(), 2, "the held-back message never went");
    // Granted 5: it goes, and so does a message of many segments, which
    // starts now and waits for credits to finish.
    p.raw_send(&segment(5, Flags::empty(), 0, 0, b""), None);
    p.settle();
    let (c, ep) = p.conn(0);
    assert_eq!(c.try_send(ep, span(&src, 0, 50), None, 3), Ok(()));
    assert_eq!(c.try_send(ep, span(&src, 0, 7600), None, 4), Ok(()));
    assert_eq!(c.stats().credit_stalls, stalls + 1, "the long message waits for credits");
    // Behind it, nothing starts now: refused, where send queues.
    assert_eq!(c.try_send(ep, span(&src, 0, 50), None, 5), Err(SendError::Again));
    assert_eq!(c.send(ep, span(&src, 0, 50), None, 5), Ok(()));
    p.settle();
    let segs = p.raw_segments(&recvs, 200);
    assert_eq!(segs.len(), 7, "two, then five more granted");
    let (r, data) = Repr::parse(&segs[2].0).unwrap();
    assert_eq!((r.data_length, r.remaining_data_length), (50, 0));
    assert_eq!(data, &p.w.eps[0].mem(src.id)[..50], "message 3 whole");
    let (r, _) = Repr::parse(&segs[3].0).unwrap();
    assert_eq!(r.data_length + r.remaining_data_length, 7600, "then message 4's first");
    assert_eq!(p.sent(0).len(), 3, "4 and 5 wait for credits");
    // A terminated connection says so: DataOffset 20 is not 8-aligned.
    p.raw_send(&segment(0, Flags::empty(), 0, 20, b"a"), None);
    p.settle();
    assert!(p.terminated(0).is_some());
    let (c, ep) = p.conn(0);
    assert!(matches!(c.try_send(ep, span(&src, 0, 50), None, 6), Err(SendError::Terminated(_))));
}

/// A message sent at once is reported as every event is, in the order
/// things happened (its Sent is kept apart from the other events until
/// one comes after it): before a message that arrived after it, polled or
/// drained, and after one that arrived before it; and in the order the
/// messages went, whatever their contexts: those that follow one another
/// (a stream's sequence numbers, counted rather than queued) and those
/// that do not.
#[test]
fn a_message_sent_at_once_is_reported_in_its_place_among_the_events() {
    let fast = !cfg!(feature = "general-paths");
    for drain in [false, true] {
        let cfg = Config { lend_max: 0, ..Config::default() };
        // Credits enough that every message goes at once.
        let mut p = Pair::new(SimConfig::default(), [small(1364, 32); 2], cfg, true);
        p.raw_recvs(32, 2000);
        let src = p.w.register(0, 100);
        let dst = p.w.register(0, 100);
        let (c, ep) = p.conn(0);
        c.recv(ep, span(&dst, 0, 100), 10).unwrap();
        for ctx in [1, 2, 7, 5, 6] {
            assert_eq!(c.try_send(ep, span(&src, 0, 50), None, ctx), Ok(()), "{ctx}");
        }
        p.raw_send(&segment(0, Flags::empty(), 0, 24, b"first"), None);
        // Everything moves but the application's look at side 0's events.
        let mut rounds = 0;
        while p.conns[0].as_ref().unwrap().stats().messages_received < 1 {
            rounds += 1;
            assert!(rounds < 100, "the peer's message never arrived");
            for i in 0..2 {
                p.w.eps[i].progress();
            }
            let (c, ep) = p.conn(0);
            while let Some(comp) = ep.poll_cq() {
                assert!(c.handle_completion(ep, &comp), "{comp:?} is the connection's");
            }
            c.progress(ep);
            while p.w.eps[1].poll_cq().is_some() {}
            p.w.fabric.skip_to_next_due();
        }
        let (c, ep) = p.conn(0);
        for ctx in [3, 4, 9, u64::MAX, 0] {
            assert_eq!(c.try_send(ep, span(&src, 0, 50), None, ctx), Ok(()), "{ctx}");
        }
        let mut got = Vec::new();
        if drain {
            c.drain(ep, |_, d| {
                if let Drained::Event(e) = d {
                    got.push(e);
                }
                Flow::Next
            });
        } else {
            while let Some(e) = c.poll_event() {
                got.push(e);
            }
        }
        let sent = |ctx| Event::Sent { ctx, status: SendStatus::Ok };
        let first = Event::Received { ctx: 10, len: 5, status: RecvStatus::Ok, invalidated: None };
        let before = [1, 2, 7, 5, 6].map(sent);
        let after = [3, 4, 9, u64::MAX, 0].map(sent);
        if fast {
            let want: Vec<_> = before.iter().chain([&first]).chain(&after).copied().collect();
            assert_eq!(got, want, "drained: {drain}");
        } else {
            assert!(got.contains(&first), "drained: {drain}: {got:?}");
            let sents: Vec<_> = got.iter().filter(|e| matches!(e, Event::Sent { .. })).collect();
            let order: Vec<_> = before.iter().chain(&after).filter(|e| got.contains(e)).collect();
            assert_eq!(sents, order, "drained: {drain}: in the order they went");
        }
        assert!(!c.has_event(), "each reported once");
        assert_eq!(&p.w.eps[0].mem(dst.id)[..5], b"first");
    }
}

#[test]
fn a_receiver_that_gets_more_than_it_granted_terminates() {
    // 4 receives posted, 2 granted by the negotiation.
    let params = Params { receive_credits_granted: 2, ..small(1364, 4) };
    let mut p = Pair::new(SimConfig::default(), [params; 2], Config::default(), true);
    let dst = p.w.register(0, 100);
    let (c, ep) = p.conn(0);
    c.recv(ep, span(&dst, 0, 100), 1).unwrap();
    // Three at once, before any grant can come back: the third has none.
    p.raw_send(&segment(0, Flags::empty(), 0, 24, b"a"), None);
    p.raw_send(&segment(0, Flags::empty(), 0, 24, b"b"), None);
    p.raw_send(&segment(0, Flags::empty(), 0, 24, b"c"), None);
    p.settle();
    assert_eq!(p.terminated(0), Some(ProtocolError::CreditsExceeded));
}

/// `has_work` says whether a drain, or a poll of events after
/// `progress`, would find something: an event, or a segment marked in the
/// receive ring (which `progress` takes for a connection that is not
/// drained); `progress` with nothing to do does nothing and says so. A
/// busy loop tells a quiet connection by both without a call through its
/// queues.
#[test]
fn has_work_and_progress_tell_a_quiet_connection() {
    let mut p = Pair::symmetric(small(1364, 4));
    let src = p.w.register(0, 100);
    let dst = p.w.register(1, 100);
    p.w.fill(0, &src, 100);
    p.settle();
    for i in 0..2 {
        let (c, ep) = p.conn(i);
        assert!(!c.has_work(ep) && !c.progress(ep), "side {i} quiet after setup");
    }
    let (c, ep) = p.conn(1);
    c.recv(ep, span(&dst, 0, 100), 9).unwrap();
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, 100), None, 5).unwrap();
    // The endpoints driven by hand: completions handed over, nothing else.
    let working = |p: &Pair| (0..2).all(|i| p.conns[i].as_ref().unwrap().has_work(&p.w.eps[i]));
    for _ in 0..1000 {
        if working(&p) {
            break;
        }
        for i in 0..2 {
            let ep = &mut p.w.eps[i];
            ep.progress();
            while let Some(c) = ep.poll_cq() {
                assert!(p.conns[i].as_mut().unwrap().handle_completion(ep, &c));
            }
        }
        p.w.fabric.skip_to_next_due();
    }
    assert!(working(&p));
    // The message was marked in the receiver's ring, with no completion.
    let (c, ep) = p.conn(1);
    assert!(!c.has_event() && ep.cq_len() == 0);
    assert!(c.progress(ep), "the segment taken, its receive posted again");
    let mut taken = [vec![], vec![]];
    for (i, taken) in taken.iter_mut().enumerate() {
        let (c, ep) = p.conn(i);
        while c.has_work(ep) {
            taken.push(c.poll_event().expect("an event, as has_work said"));
        }
        assert!(c.poll_event().is_none());
    }
    assert!(matches!(taken[0][..], [Event::Sent { ctx: 5, status: SendStatus::Ok }]), "{taken:?}");
    assert!(matches!(taken[1][..], [Event::Received { ctx: 9, len: 100, .. }]), "{taken:?}");
    let (c, ep) = p.conn(1);
    assert!(!c.progress(ep) && !c.has_work(ep), "then nothing to do");
}

#[test]
fn credits_are_granted_as_receives_are_reposted() {
    let mut p = Pair::raw(small(1364, 4));
    let recvs = p.raw_recvs(8, 2000);
    let dst = p.w.register(0, 400);
    // Four segments use the four credits; the last asks for a response.
    for (i, flags) in [Flags::empty(), Flags::empty(), Flags::empty(), Flags::RESPONSE_REQUESTED]
        .into_iter()
        .enumerate()
    {
        p.raw_send(&segment(0, flags, 0, 24, &[i as u8; 100]), None);
    }
    p.settle();
    // No buffer posted: the segments hold their receives, nothing to grant.
    assert!(p.raw_segments(&recvs, 2000).is_empty());
    for i in 0..2 {
        let (c, ep) = p.conn(0);
        c.recv(ep, span(&dst, i * 100, 100), i).unwrap();
    }
    p.settle();
    let segs = p.raw_segments(&recvs, 2000);
    assert_eq!(segs.len(), 1, "one empty message answers");
    let (r, data) = Repr::parse(&segs[0].0).unwrap();
    assert_eq!((r.credits_granted, data.len()), (2, 0), "the two receives reposted");
    for i in 2..4 {
        let (c, ep) = p.conn(0);
        c.recv(ep, span(&dst, i * 100, 100), i).unwrap();
    }
    p.settle();
    assert_eq!(p.raw_segments(&recvs, 2000).len(), 1, "no new request, no new answer");
    let c = p.conns[0].as_ref().unwrap();
    assert_eq!((c.credits().posted(), c.credits().granted()), (4, 2));
    let got = p.w.eps[0].mem(dst.id);
    assert!((0..400).all(|i| got[i] == (i / 100) as u8));
}

#[test]
fn a_buffer_shorter_than_the_message_gets_its_start() {
    let mut p = Pair::symmetric(small(1364, 8));
    let src = p.w.register(0, 5000);
    let dst = p.w.register(1, 5000);
    p.w.fill(0, &src, 8);
    let (c, ep) = p.conn(1);
    c.recv(ep, span(&dst, 0, 2000), 1).unwrap();
    c.recv(ep, span(&dst, 2000, 3000), 2).unwrap();
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, 5000), None, 1).unwrap();
    c.send(ep, span(&src, 0, 3000), None, 2).unwrap();
    p.drive_until(10_000, |p| p.received(1).len() == 2);
    assert_eq!(
        p.received(1),
        [(1, 2000, RecvStatus::Truncated { olen: 5000 }, None), (2, 3000, RecvStatus::Ok, None)]
    );
    let got = p.w.eps[1].mem(dst.id);
    assert!((0..2000).all(|i| got[i] == pattern(8, i as u64)));
    assert!((0..3000).all(|i| got[2000 + i] == pattern(8, i as u64)));
}

#[test]
fn short_messages_arrive_byte_exact_whole_or_cut_to_their_buffer() {
    // Segments of 24 header bytes and 64 to 120 of data: about where the
    // receiver reads a segment whole rather than copying its data from the
    // slot; the third into a buffer shorter than the message.
    let mut p = Pair::symmetric(small(1364, 8));
    let src = p.w.register(0, 512);
    let dst = p.w.register(1, 512);
    p.w.fill(0, &src, 5);
    let (c, ep) = p.conn(1);
    c.recv(ep, span(&dst, 0, 64), 1).unwrap();
    c.recv(ep, span(&dst, 64, 104), 2).unwrap();
    c.recv(ep, span(&dst, 168, 30), 3).unwrap();
    c.recv(ep, span(&dst, 198, 120), 4).unwrap();
    let (c, ep) = p.conn(0);
    for (ctx, len) in [(1, 64), (2, 104), (3, 100), (4, 120)] {
        c.send(ep, span(&src, 0, len), None, ctx).unwrap();
    }
    p.drive_until(10_000, |p| p.received(1).len() == 4);
    assert_eq!(
        p.received(1),
        [
            (1, 64, RecvStatus::Ok, None),
            (2, 104, RecvStatus::Ok, None),
            (3, 30, RecvStatus::Truncated { olen: 100 }, None),
            (4, 120, RecvStatus::Ok, None)
        ]
    );
    let got = p.w.eps[1].mem(dst.id);
    for (at, len) in [(0, 64), (64, 104), (168, 30), (198, 120)] {
        assert!((0..len).all(|i| got[at + i] == pattern(5, i as u64)), "at {at}");
    }
    assert_eq!(got[318], 0, "nothing past the last buffer");
}

#[test]
fn setup_checks_the_parameters_and_the_endpoint() {
    let mut w = World::pair(SimConfig::default(), EpConfig::default());
    let to = w.connect(0, 1);
    let new =
        |w: &mut World, p: Params, c: Config| Connection::new(&mut w.eps[0], to, p, c).map(|_| ());
    let bad = |what| Err(SetupError::Params(what));
    let odd = Config { data_offset: 28, ..Config::default() };
    assert_eq!(
        new(&mut w, Params::default(), odd),
        bad("DataOffset must be 8-byte aligned, from 24 to 256")
    );
    assert_eq!(
        new(&mut w, small(24, 8), Config::default()),
        bad("MaxSendSize leaves no room for data after DataOffset")
    );
    assert_eq!(
        new(&mut w, Params { send_credits: 1, ..small(100, 8) }, Config::default()),
        bad("each side needs at least 2 credits: the last is kept for granting")
    );
    assert_eq!(
        Connection::new(&mut w.eps[0], PeerId(9), Params::default(), Config::default()).map(|_| ()),
        Err(SetupError::Endpoint(EpError::UnknownPeer))
    );
    // Slots in the endpoint's receive ring, of which a peer has one: one
    // such connection to a peer, another once it is closed.
    let mut first = Connection::new(&mut w.eps[0], to, small(1364, 8), Config::default()).unwrap();
    assert_eq!(
        new(&mut w, small(1364, 8), Config::default()),
        Err(SetupError::Endpoint(EpError::Busy))
    );
    assert_eq!(first.close(&mut w.eps[0]), Ok(()));
    assert_eq!(new(&mut w, small(1364, 8), Config::default()), Ok(()));
    let unordered = EpConfig { ordered: false, ..EpConfig::default() };
    let mut w2 = World::pair(SimConfig::default(), unordered);
    let to2 = w2.connect(0, 1);
    assert_eq!(
        Connection::new(&mut w2.eps[0], to2, Params::default(), Config::default()).map(|_| ()),
        Err(SetupError::Unordered)
    );
}

/// Segments marked in the receive ring and not yet taken go with it: they
/// do not hold `close`, which gives the regions back at once.
#[test]
fn segments_left_in_the_ring_do_not_hold_close() {
    let mut p = Pair::symmetric(small(1364, 4));
    let src = p.w.register(0, 64);
    p.settle();
    for k in 0..2 {
        let (c, ep) = p.conn(0);
        c.send(ep, span(&src, 0, 64), None, k).unwrap();
    }
    deliver_to_endpoint(&mut p);
    let (c, ep) = p.conn(1);
    assert!(c.has_work(ep) && !c.has_event() && ep.cq_len() == 0, "marked, not reported");
    let rx = *c.receive_region();
    assert_eq!(c.close(ep), Ok(()));
    assert_eq!(ep.mr(rx.id), None);
    // Nothing delivered from them: the close alone is told.
    let told: Vec<_> = std::iter::from_fn(|| c.poll_event()).collect();
    assert!(matches!(told[..], [Event::Terminated(ProtocolError::Closed)]), "{told:?}");
    assert!(!c.has_work(ep));
}

#[test]
fn a_closed_connection_gives_its_regions_back() {
    let mut p = Pair::symmetric(small(1364, 8));
    transfer(&mut p, &[100, 5000], Access::empty());
    p.settle();
    let regions: Vec<Mr> = (0..2)
        .flat_map(|i| {
            let c = p.conns[i].as_ref().unwrap();
            [*c.header_region(), *c.receive_region()]
        })
        .collect();
    for i in 0..2 {
        let (c, ep) = p.conn(i);
        assert_eq!(c.close(ep), Ok(()));
        assert_eq!(c.close(ep), Ok(()), "closing twice is closing");
    }
    for (i, r) in regions.iter().enumerate() {
        assert_eq!(p.w.eps[i / 2].mr(r.id), None);
    }
    assert_eq!(p.conns[0].as_ref().unwrap().error(), Some(ProtocolError::Closed));
}

/// A bounded fuzz: mutations of well-formed segments, three at a time,
/// never panic a receiver; each either passes or ends the connection with
/// a typed error.
#[test]
fn random_segments_never_panic_the_receiver() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut verdicts = std::collections::BTreeMap::new();
    for round in 0..150 {
        // Every other receiver lends the short messages.
        let cfg = Config { lend_max: (round % 2) * 100, ..Config::default() };
        let mut p = Pair::new(SimConfig::default(), [small(256, 4); 2], cfg, true);
        let dst = p.w.register(0, 4096);
        let (c, ep) = p.conn(0);
        c.recv(ep, span(&dst, 0, 4096), 1).unwrap();
        for _ in 0..3 {
            let len = (next() % 200) as usize;
            let mut seg = segment(0, Flags::empty(), (next() % 300) as u32, 24, &vec![1; len]);
            for _ in 0..next() % 4 {
                let at = (next() % seg.len() as u64) as usize;
                seg[at] = next() as u8;
            }
            seg.truncate(
                seg.len() - (next() % 3 == 0) as usize * (next() % seg.len() as u64) as usize,
            );
            let token = (next() % 5 == 0).then(&mut next);
            p.raw_send(&seg, token);
        }
        p.settle();
        let v = p.conns[0].as_ref().unwrap().error().map(|e| format!("{e:?}"));
        let kind =
            v.map_or("ok".to_string(), |v| v.split([' ', '(', '{']).next().unwrap().to_string());
        *verdicts.entry(kind).or_insert(0) += 1;
    }
    assert!(verdicts.len() >= 4, "the fuzz reaches several outcomes: {verdicts:?}");
}

/// With buffers posted further ahead than the receives that carry the
/// messages, a receive is posted into the buffer of the message it will
/// carry: single-segment messages land
/// where they go and nothing is copied; multi-segment ones, empty messages
/// between them and a DataOffset the receiver did not expect land
/// elsewhere and are copied, every byte still in its place.
#[test]
fn receives_posted_into_the_application_buffers_land_messages_in_place() {
    let run = |sizes: &[u64], empties_every: usize, data_offset: u32| {
        // Into buffers of any size, to see it on small messages.
        let cfg = Config { data_offset, direct_min: 1, ..Config::default() };
        let params = small(1364, 8);
        let mut p = Pair::new(SimConfig::default(), [params; 2], cfg, false);
        let total: u64 = sizes.iter().sum();
        let src = p.w.register(0, total);
        let dst = p.w.register(1, total);
        let empty = p.w.register(0, 8);
        p.w.fill(0, &src, 4);
        let mut at = 0;
        let mut spans = Vec::new();
        for &len in sizes {
            spans.push(span(&dst, at, len));
            at += len;
        }
        let mut next_recv = 0;
        let mut next_send = 0;
        let mut at = 0;
        while p.received(1).len() < sizes.len() {
            // The receiver keeps buffers ahead of what it has: more than
            // the 8 receives that carry the messages.
            while next_recv < sizes.len() && next_recv < p.received(1).len() + 16 {
                let (c, ep) = p.conn(1);
                c.recv(ep, spans[next_recv], next_recv as u64).unwrap();
                next_recv += 1;
            }
            if next_send < sizes.len() {
                let (c, ep) = p.conn(0);
                let s = span(&src, at, sizes[next_send]);
                if c.send(ep, s, None, next_send as u64).is_ok() {
                    at += sizes[next_send];
                    next_send += 1;
                    if empties_every > 0 && next_send % empties_every == 0 {
                        c.send(ep, span(&empty, 0, 0), None, 1 << 40).unwrap();
                    }
                }
            }
            p.step();
        }
        let got = p.w.eps[1].mem(dst.id);
        let bad = (0..total).find(|&i| got[i as usize] != pattern(4, i));
        assert_eq!(bad, None, "{sizes:?} empties {empties_every} offset {data_offset}");
        assert!(p.received(1).iter().all(|r| r.2 == RecvStatus::Ok));
        // Receives posted again into buffers were granted once: never
        // more credits than receives.
        let c = p.conns[1].as_ref().unwrap();
        assert!(c.credits().posted() <= 8, "{:?}", c.credits());
        c.stats().in_place
    };
    let single: Vec<u64> = (0..200).map(|i| 1 + (i * 131) % 1340).collect();
    let n = run(&single, 0, 24);
    assert_eq!(n, 200, "single-segment messages land in place");
    // Messages of 1 to 4 segments, empty messages, another DataOffset.
    let mixed: Vec<u64> = (0..200).map(|i| 1 + (i * 997) % 5000).collect();
    run(&mixed, 0, 24);
    run(&single, 3, 24);
    run(&mixed, 5, 24);
    let n = run(&single, 0, 32);
    assert!(n > 150, "once the receiver knows the peer's DataOffset: {n}");
}

/// A connection (side 0) granting `credits`, with a raw peer, that posts
/// receives into buffers of any size, and eight buffers of 100 bytes
/// posted (contexts 0 to 7) in the region returned.
fn placing_with_raw_peer(credits: u16) -> (Pair, Mr) {
    let cfg = Config { direct_min: 1, ..Config::default() };
    let mut p = Pair::new(SimConfig::default(), [small(1364, credits); 2], cfg, true);
    let dst = p.w.register(0, 800);
    for i in 0..8 {
        let (c, ep) = p.conn(0);
        c.recv(ep, span(&dst, i * 100, 100), i).unwrap();
    }
    (p, dst)
}

/// A terminated connection gives a buffer back only once no receive is
/// posted into it: at once for most, after `close` withdrew the receives
/// for the ones the next messages were to land in.
#[test]
fn a_buffer_a_receive_is_posted_into_comes_back_after_the_receive() {
    let (mut p, dst) = placing_with_raw_peer(4);
    // Two messages delivered; their receives, posted again, go into the
    // buffers of the messages they can carry at the latest.
    p.raw_send(&segment(0, Flags::empty(), 0, 24, &[1; 100]), None);
    p.raw_send(&segment(0, Flags::empty(), 0, 24, &[2; 100]), None);
    p.settle();
    assert_eq!(p.received(0).len(), 2);
    let mut bad = segment(0, Flags::empty(), 0, 24, b"x");
    bad[12] = 25;
    p.raw_send(&bad, None);
    p.settle();
    assert!(p.terminated(0).is_some());
    let back = |p: &Pair| {
        let mut v: Vec<u64> =
            p.received(0).iter().filter(|r| r.2 == RecvStatus::Terminated).map(|r| r.0).collect();
        v.sort_unstable();
        v
    };
    let at_once = back(&p);
    assert!(at_once.len() < 6, "some wait for their receives: {at_once:?}");
    // Written while posted: the endpoint will not let the region go.
    assert_eq!(p.w.eps[0].deregister(dst.id), Err(EpError::Busy));
    let (c, ep) = p.conn(0);
    assert_eq!(c.close(ep), Ok(()));
    p.step();
    assert_eq!(back(&p), (2..8).collect::<Vec<u64>>(), "every buffer, once");
    assert_eq!(p.w.eps[0].deregister(dst.id), Ok(()));
}

/// Sends `sizes` from 0 to 1, posting buffers only for the messages that
/// are not lent (longer than `lend_max`, or of several segments), and
/// returns each message's bytes as the receiver saw them, lent or landed
/// in a buffer, in the order they were reported.
fn lend_transfer(p: &mut Pair, sizes: &[u64], lend_max: u64, per_segment: u64) -> Vec<Vec<u8>> {
    let total: u64 = sizes.iter().sum::<u64>() + 1;
    let src = p.w.register(0, total);
    let dst = p.w.register(1, total);
    p.w.fill(0, &src, total);
    let lent = |len: u64| len > 0 && len <= lend_max && len <= per_segment;
    let mut at = 0;
    let mut bufs = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        if len > 0 && !lent(len) {
            bufs.push((i as u64, at, len));
        }
        at += len;
    }
    let (mut next_send, mut send_at, mut next_buf) = (0, 0, 0);
    let delivered = |p: &Pair| {
        p.events[1]
            .iter()
            .filter(|e| matches!(e, Event::Lent { .. } | Event::Received { .. }))
            .count()
    };
    let want = sizes.iter().filter(|&&l| l > 0).count();
    for _ in 0..1_000_000 {
        if delivered(p) == want {
            break;
        }
        if let Some(&(ctx, at, len)) = bufs.get(next_buf) {
            let (c, ep) = p.conn(1);
            if c.recv(ep, span(&dst, at, len), ctx).is_ok() {
                next_buf += 1;
            }
        }
        if let Some(&len) = sizes.get(next_send) {
            let (c, ep) = p.conn(0);
            if c.send(ep, span(&src, send_at, len), None, next_send as u64).is_ok() {
                next_send += 1;
                send_at += len;
            }
        }
        p.step();
    }
    assert_eq!(delivered(p), want, "every message delivered: {:?}", p.terminated(1));
    let mem = p.w.eps[1].mem(dst.id);
    let mut lent_bytes = p.lent[1].iter();
    p.events[1]
        .iter()
        .filter_map(|e| match *e {
            Event::Lent { .. } => Some(lent_bytes.next().unwrap().clone()),
            Event::Received { ctx, len, status, .. } => {
                assert_eq!(status, RecvStatus::Ok);
                let (_, at, _) = bufs.iter().find(|b| b.0 == ctx).unwrap();
                Some(mem[*at as usize..(at + len) as usize].to_vec())
            }
            _ => None,
        })
        .collect()
}

/// What `lend_transfer`'s messages should read.
fn expected(sizes: &[u64]) -> Vec<Vec<u8>> {
    let total: u64 = sizes.iter().sum::<u64>() + 1;
    let mut at = 0;
    let mut want = Vec::new();
    for &len in sizes {
        if len > 0 {
            want.push((at..at + len).map(|j| pattern(total, j)).collect());
        }
        at += len;
    }
    want
}

/// Short messages are lent where they landed, byte-exact and in order
/// among the longer ones that fill buffers; each loan given back posts its
/// receive again, so that 300 messages pass through 8 credits.
#[test]
fn lent_messages_arrive_byte_exact_in_order_and_their_receives_come_back() {
    let cfg = Config { lend_max: 600, ..Config::default() };
    let mut p = Pair::new(SimConfig::default(), [small(1364, 8); 2], cfg, false);
    // Lent (1 to 600), one segment in a buffer (601 to 1340), several
    // segments in a buffer (up to 4000).
    let sizes: Vec<u64> = (0..300)
        .map(|i| [1 + (i * 37) % 600, 601 + i % 700, 1341 + i * 9][(i % 7 % 3) as usize])
        .collect();
    let got = lend_transfer(&mut p, &sizes, 600, 1340);
    assert_eq!(got, expected(&sizes));
    let c = p.conns[1].as_ref().unwrap();
    let lendable = sizes.iter().filter(|&&l| l <= 600).count() as u64;
    assert_eq!(c.stats().lent, lendable);
    assert!(lendable > 100 && lendable < 300, "{lendable}");
    p.settle();
    let c = p.conns[1].as_ref().unwrap();
    assert_eq!(c.credits().posted(), 8, "every receive posted again");
}

/// A loan kept holds its receive, and so the peer's credit: the sender
/// stops once the receiver has lent all it granted, and goes on when the
/// loans come back. A loan comes back once.
#[test]
fn a_loan_kept_holds_its_credit_until_given_back() {
    let cfg = Config { lend_max: 64, ..Config::default() };
    let mut p = Pair::new(SimConfig::default(), [small(1364, 4); 2], cfg, false);
    p.keep_loans = true;
    let src = p.w.register(0, 64);
    for k in 0..12 {
        let (c, ep) = p.conn(0);
        c.send(ep, span(&src, 0, 64), None, k).unwrap();
    }
    p.settle();
    let held = p.loans[1].len();
    assert!((1..=4).contains(&held), "lent {held} of 12 on 4 credits");
    assert_eq!(p.conns[1].as_ref().unwrap().credits().posted(), (4 - held) as u32);
    for _ in 0..100 {
        p.step();
    }
    assert_eq!(p.loans[1].len(), held, "nothing more without the loans back");
    let loans = p.loans[1].clone();
    let c = p.conns[1].as_mut().unwrap();
    c.give_back(loans[0]).unwrap();
    assert_eq!(c.give_back(loans[0]), Err(RecvError::NotLent), "given back twice");
    for &loan in &loans[1..] {
        c.give_back(loan).unwrap();
    }
    p.loans[1].clear();
    p.keep_loans = false;
    p.drive_until(100_000, |p| p.lent[1].len() == 12);
    assert!(p.lent[1].iter().all(|b| b.len() == 64));
}

/// The receive ring fills its slots in turn: a loan still out when its
/// slot's turn comes round again holds the message that would take it,
/// waiting in the endpoint, though the others' receives were posted
/// again; given back, that message is lent.
#[test]
fn a_loan_kept_for_a_round_of_the_ring_holds_the_message_in_its_turn() {
    let cfg = Config { lend_max: 64, ..Config::default() };
    let mut p = Pair::new(SimConfig::default(), [small(1364, 4); 2], cfg, false);
    p.keep_loans = true;
    let src = p.w.register(0, 5 * 64);
    p.w.fill(0, &src, 5 * 64);
    let send = |p: &mut Pair, k: u64| {
        let (c, ep) = p.conn(0);
        c.send(ep, span(&src, k * 64, 64), None, k).unwrap();
    };
    send(&mut p, 0);
    p.drive_until(10_000, |p| p.loans[1].len() == 1);
    let first = p.loans[1].pop().unwrap();
    // Messages 1 to 3 take slots 1 to 3, each given back as it comes.
    for k in 1..4 {
        send(&mut p, k);
        p.drive_until(10_000, |p| p.loans[1].len() == 1);
        let loan = p.loans[1].pop().unwrap();
        p.conns[1].as_mut().unwrap().give_back(loan).unwrap();
    }
    // Message 4's turn is slot 0's, still lent.
    send(&mut p, 4);
    for _ in 0..1000 {
        p.step();
    }
    assert_eq!(p.lent[1].len(), 4, "message 4 held");
    assert_eq!(p.w.eps[1].counters().unexpected, 1, "waiting in the endpoint");
    p.conns[1].as_mut().unwrap().give_back(first).unwrap();
    p.drive_until(10_000, |p| p.lent[1].len() == 5);
    let want = p.w.eps[0].mem(src.id);
    for (k, got) in p.lent[1].iter().enumerate() {
        assert_eq!(got[..], want[k * 64..(k + 1) * 64], "message {k}");
    }
}

/// With loans out, `close` says Busy and keeps the receive region, whose
/// bytes the loans name; once they are back it closes.
#[test]
fn a_connection_with_loans_out_closes_once_they_are_back() {
    let cfg = Config { lend_max: 64, ..Config::default() };
    let mut p = Pair::new(SimConfig::default(), [small(1364, 4); 2], cfg, false);
    p.keep_loans = true;
    let src = p.w.register(0, 64);
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, 64), None, 1).unwrap();
    p.drive_until(10_000, |p| p.loans[1].len() == 1);
    let rx = *p.conns[1].as_ref().unwrap().receive_region();
    let loan = p.loans[1][0];
    let (c, ep) = p.conn(1);
    assert_eq!(c.close(ep), Err(EpError::Busy));
    assert!(ep.mr(rx.id).is_some(), "the lent bytes stay readable");
    c.give_back(loan).unwrap();
    assert_eq!(c.close(ep), Ok(()));
    assert_eq!(ep.mr(rx.id), None);
}

/// A token on a lent message is invalidated before the loan is reported,
/// and said with it.
#[test]
fn a_lent_message_reports_the_token_it_invalidated() {
    let cfg = Config { lend_max: 64, ..Config::default() };
    let mut p = Pair::new(SimConfig::default(), [small(1364, 8); 2], cfg, false);
    let token = p.w.eps[1].register(64, Access::REMOTE_WRITE).unwrap();
    let src = p.w.register(0, 32);
    p.w.fill(0, &src, 33);
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, 32), Some(token.key), 5).unwrap();
    p.drive_until(10_000, |p| !p.lent[1].is_empty());
    let lent: Vec<_> = p.events[1].iter().filter(|e| matches!(e, Event::Lent { .. })).collect();
    assert!(
        matches!(lent[..], [Event::Lent { invalidated: Some(k), data, .. }] if *k == token.key && data.len == 32)
    );
    assert_eq!(p.w.eps[1].mr(token.id), None);
    assert_eq!(p.lent[1], expected(&[32]));
}

/// A receive posted into a buffer takes the segment as it comes: a whole
/// message at the DataOffset it was posted for is where it goes and is
/// only reported; one at another DataOffset landed shifted and is copied
/// right; one longer than its buffer is reported truncated with the bytes
/// the buffer holds, in place.
#[test]
fn a_message_landed_in_its_buffer_is_reported_there_unless_it_landed_elsewhere() {
    let (mut p, dst) = placing_with_raw_peer(8);
    // (DataOffset, length): placed, shifted, placed, too long, placed.
    let msgs = [(24u32, 100u64), (32, 60), (24, 60), (24, 150), (24, 100)];
    let data = |k: usize, len: u64| -> Vec<u8> { (0..len).map(|j| pattern(k as u64, j)).collect() };
    for (k, &(offset, len)) in msgs.iter().enumerate() {
        p.raw_send(&segment(0, Flags::empty(), 0, offset, &data(k, len)), None);
        p.settle();
    }
    let truncated = RecvStatus::Truncated { olen: 150 };
    let want = [(0, 100, RecvStatus::Ok), (1, 60, RecvStatus::Ok), (2, 60, RecvStatus::Ok)]
        .into_iter()
        .chain([(3, 100, truncated), (4, 100, RecvStatus::Ok)]);
    let got: Vec<_> = p.received(0).iter().map(|r| (r.0, r.1, r.2)).collect();
    assert_eq!(got, want.collect::<Vec<_>>());
    let mem = p.w.eps[0].mem(dst.id);
    for (k, &(_, len)) in msgs.iter().enumerate() {
        let n = len.min(100) as usize;
        assert_eq!(&mem[k * 100..k * 100 + n], &data(k, len)[..n], "message {k}");
    }
    let s = p.conns[0].as_ref().unwrap().stats();
    assert_eq!(s.in_place, 4, "all but the shifted one: {s:?}");
}

/// Receives posted into buffers for the long messages (direct placement)
/// are sometimes filled by a short one, which is lent: its bytes come back
/// from the buffer into its slot first, and the buffer still gets its own
/// message.
#[test]
fn a_lent_message_that_landed_in_a_buffer_is_lent_from_its_slot() {
    let cfg = Config { lend_max: 100, direct_min: 1, ..Config::default() };
    let mut p = Pair::new(SimConfig::default(), [small(1364, 8); 2], cfg, false);
    let sizes: Vec<u64> =
        (0..200).map(|i| if i % 3 == 0 { 50 + i % 40 } else { 900 + i }).collect();
    let got = lend_transfer(&mut p, &sizes, 100, 1340);
    assert_eq!(got, expected(&sizes));
    let s = p.conns[1].as_ref().unwrap().stats();
    assert_eq!(s.lent, 67);
    assert!(s.in_place > 0, "the long ones still land in place: {s:?}");
}

/// An application that keeps fewer buffers posted than receives: each new
/// buffer could be placed only by posting again every receive behind the
/// one for its message, which is not done (those messages are copied);
/// the fresh connection's receives are posted again into the first
/// buffers once, all of them.
#[test]
fn receives_are_posted_again_into_buffers_only_when_most_would_be_placed() {
    let cfg = Config { direct_min: 1, ..Config::default() };
    let mut p = Pair::new(SimConfig::default(), [small(1364, 32); 2], cfg, false);
    let n = 300u64;
    let len = 1000u64;
    let src = p.w.register(0, len);
    let dst = p.w.register(1, n * len);
    p.w.fill(0, &src, len);
    let (mut posted, mut sent) = (0u64, 0u64);
    // 40 buffers first: the 32 receives go again into the first 32.
    let ahead = |p: &Pair, posted: u64| {
        posted < n && (posted < 40 || posted < p.received(1).len() as u64 + 4)
    };
    while p.received(1).len() < n as usize {
        while ahead(&p, posted) {
            let (c, ep) = p.conn(1);
            c.recv(ep, span(&dst, posted * len, len), posted).unwrap();
            posted += 1;
        }
        if sent < n {
            let (c, ep) = p.conn(0);
            if c.send(ep, span(&src, 0, len), None, sent).is_ok() {
                sent += 1;
            }
        }
        p.step();
    }
    let got = p.w.eps[1].mem(dst.id);
    let want: Vec<u8> = (0..len).map(|j| pattern(len, j)).collect();
    for k in 0..n as usize {
        assert_eq!(&got[k * len as usize..(k + 1) * len as usize], &want[..], "message {k}");
    }
    let s = p.conns[1].as_ref().unwrap().stats();
    assert!((32..=64).contains(&s.replaced), "posted again: {s:?}");
    assert!(s.in_place >= 32, "{s:?}");
}

/// The same transfer taken by `Connection::drain` as by polling: the same
/// messages in the same order, byte-exact, lent or landed; a message lent
/// and read inside `drain` has its receive posted again before it returns.
#[test]
fn drain_hands_out_what_polling_does() {
    let cfg = Config { lend_max: 600, ..Config::default() };
    let sizes: Vec<u64> = (0..300).map(|i| [64, 0, 700, 3000, 600, 1][i % 6]).collect();
    let mut runs = Vec::new();
    for drain in [false, true] {
        let mut p = Pair::new(SimConfig::default(), [small(1364, 8); 2], cfg, false);
        p.drain = drain;
        let got = lend_transfer(&mut p, &sizes, 600, 1340);
        assert_eq!(got, expected(&sizes), "drain {drain}");
        p.settle();
        let all_sent: Vec<_> = (0..300).map(|ctx| (ctx, SendStatus::Ok)).collect();
        assert_eq!(p.sent(0), all_sent, "drain {drain}: every send, in order");
        let s = p.conns[1].as_ref().unwrap().stats();
        assert_eq!(s.lent, 150, "drain {drain}");
        // Counted as they are lent, in the drain's loop as in polling;
        // a message of none is SMB Direct's empty one, which no one gets.
        let messages = sizes.iter().filter(|&&l| l > 0).count() as u64;
        assert_eq!(s.messages_received, messages, "drain {drain}");
        assert_eq!(s.bytes_received, sizes.iter().sum::<u64>(), "drain {drain}");
        // Every segment the sender sent, the messages lent whole among them.
        let sent = p.conns[0].as_ref().unwrap().stats().segments_sent;
        assert_eq!(s.segments_received, sent, "drain {drain}");
        runs.push(got);
    }
    assert_eq!(runs[0], runs[1]);
}

/// Side 1's endpoint takes every packet in flight, and its connection
/// none of their completions yet.
fn deliver_to_endpoint(p: &mut Pair) {
    for _ in 0..100 {
        p.w.eps[0].progress();
        p.w.eps[1].progress();
        p.w.fabric.skip_to_next_due();
    }
}

/// A pair with `credits` credits a side (a receive each) that lends
/// messages of 64 bytes, `n` such sent to side 1 and in its endpoint, none
/// taken by its connection yet.
fn lent_messages_delivered(credits: u16, n: u64) -> Pair {
    let cfg = Config { lend_max: 64, ..Config::default() };
    let mut p = Pair::new(SimConfig::default(), [small(1364, credits); 2], cfg, false);
    let src = p.w.register(0, 64);
    for k in 0..n {
        let (c, ep) = p.conn(0);
        c.send(ep, span(&src, 0, 64), None, k).unwrap();
    }
    deliver_to_endpoint(&mut p);
    p
}

/// What one `drain` of side 1 hands out, `flow` answered to each.
fn drain_once(p: &mut Pair, flow: Flow) -> Vec<Event> {
    let (c, ep) = p.conn(1);
    let mut seen = vec![];
    let n = c.drain(ep, |_, d| {
        let Drained::Event(e) = d else { panic!("{d:?}") };
        seen.push(e);
        flow
    });
    assert_eq!(n, seen.len());
    seen
}

/// A message read inside `drain` is given back as `f` returns: its
/// receive is posted again before any `progress`, and nothing is left for
/// `close` to wait on. `Flow::Stop` stops after the one it answers, which
/// is given back too; the rest wait for the next `drain`.
#[test]
fn a_message_read_inside_drain_has_its_receive_posted_again_at_once() {
    let mut p = lent_messages_delivered(4, 3);
    assert_eq!(p.conns[1].as_ref().unwrap().credits().posted(), 4);
    let first = drain_once(&mut p, Flow::Stop);
    assert!(matches!(first[..], [Event::Lent { data, .. }] if data.len == 64), "{first:?}");
    let c = p.conns[1].as_ref().unwrap();
    assert_eq!(c.credits().posted(), 4, "posted again, before any progress");
    let rest = drain_once(&mut p, Flow::Next);
    assert_eq!(rest.len(), 2, "{rest:?}");
    assert!(rest.iter().all(|e| matches!(e, Event::Lent { .. })));
    let (c, ep) = p.conn(1);
    assert_eq!(c.credits().posted(), 4);
    assert_eq!(c.stats().lent, 3);
    assert_eq!(c.close(ep), Ok(()), "no loan out");
}

/// The receives of the messages a drain went on from are posted again
/// together, as it returns: when it runs out, and when `f` stops it.
#[test]
fn a_drain_posts_again_all_it_was_given_back_as_it_returns() {
    let mut p = lent_messages_delivered(6, 5);
    let (c, ep) = p.conn(1);
    let mut answers = [Flow::Next, Flow::Next, Flow::Stop].into_iter();
    assert_eq!(c.drain(ep, |_, _| answers.next().expect("three handed out")), 3);
    // Two went on from and the one stopped at, posted again; two to take.
    assert_eq!(c.credits().posted(), 6, "stopped");
    assert_eq!(drain_once(&mut p, Flow::Next).len(), 2);
    let (c, ep) = p.conn(1);
    assert_eq!(c.credits().posted(), 6, "run out");
    assert_eq!(c.stats().lent, 5);
    assert_eq!(c.close(ep), Ok(()), "no loan out");
}

/// A message lent inside `drain` reads its own bytes whatever DataOffset
/// its sender puts them at: the stream's usual 24, which the receiver
/// recognizes by the header's words, or another, which it parses.
#[test]
fn a_message_lent_inside_drain_reads_its_bytes_at_any_data_offset() {
    for data_offset in [24, 32, 64] {
        let cfg = Config { lend_max: 64, data_offset, ..Config::default() };
        let mut p = Pair::new(SimConfig::default(), [small(1364, 4); 2], cfg, false);
        let src = p.w.register(0, 3 * 64);
        p.w.fill(0, &src, data_offset as u64);
        let sent: Vec<Vec<u8>> = p.w.eps[0].mem(src.id).chunks(64).map(|c| c.to_vec()).collect();
        for k in 0..3 {
            let (c, ep) = p.conn(0);
            c.send(ep, span(&src, k * 64, 64), None, k).unwrap();
        }
        deliver_to_endpoint(&mut p);
        let (c, ep) = p.conn(1);
        let mut got = vec![];
        c.drain(ep, |ep, d| {
            let Drained::Event(Event::Lent { data, .. }) = d else { panic!("{d:?}") };
            let mut bytes = vec![0; data.len as usize];
            ep.read_mem(data.mr, data.offset, &mut bytes).unwrap();
            got.push(bytes);
            Flow::Next
        });
        assert_eq!(got, sent, "DataOffset {data_offset}");
        assert_eq!(c.stats().lent, 3);
    }
}

/// `Flow::Keep` keeps the loan: its receive and credit stay held until
/// `give_back`, as a loan polled and not given back.
#[test]
fn a_message_kept_inside_drain_is_given_back_later() {
    let cfg = Config { lend_max: 64, ..Config::default() };
    let mut p = Pair::new(SimConfig::default(), [small(1364, 4); 2], cfg, false);
    let src = p.w.register(0, 64);
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, 64), None, 1).unwrap();
    deliver_to_endpoint(&mut p);
    let kept = drain_once(&mut p, Flow::Keep);
    let [Event::Lent { loan, .. }] = kept[..] else { panic!("{kept:?}") };
    let (c, ep) = p.conn(1);
    c.progress(ep);
    assert_eq!(c.credits().posted(), 3, "held by the loan");
    assert_eq!(c.close(ep), Err(EpError::Busy));
    c.give_back(loan).unwrap();
    assert_eq!(c.close(ep), Ok(()));
}

/// Loans kept inside `drain` between messages it is given back break the
/// run of receives it posts again as it returns: those given back are
/// posted again, the kept ones when given back, and the slots go round
/// the ring again in turn, each message read whole where it landed.
#[test]
fn a_drain_posts_again_around_the_loans_it_keeps_and_the_ring_goes_round() {
    let cfg = Config { lend_max: 64, ..Config::default() };
    // Six receives a side; five messages a round (a sender keeps its last
    // credit), three rounds round the ring of six slots.
    let mut p = Pair::new(SimConfig::default(), [small(1364, 6); 2], cfg, false);
    let src = p.w.register(0, 15 * 64);
    p.w.fill(0, &src, 7);
    let sent: Vec<Vec<u8>> = p.w.eps[0].mem(src.id).chunks(64).map(|c| c.to_vec()).collect();
    let mut got = vec![];
    let mut kept = vec![];
    for round in 0..3u64 {
        for k in round * 5..round * 5 + 5 {
            let (c, ep) = p.conn(0);
            c.send(ep, span(&src, k * 64, 64), None, k).unwrap();
        }
        deliver_to_endpoint(&mut p);
        // The second round keeps its second and fourth, the others none.
        let keeps = |i: usize| round == 1 && (i == 1 || i == 3);
        let mut i = 0;
        let (c, ep) = p.conn(1);
        let n = c.drain(ep, |ep, d| {
            let Drained::Event(Event::Lent { loan, data, .. }) = d else { panic!("{d:?}") };
            let mut bytes = vec![0; data.len as usize];
            ep.read_mem(data.mr, data.offset, &mut bytes).unwrap();
            got.push(bytes);
            i += 1;
            if keeps(i - 1) {
                kept.push(loan);
                Flow::Keep
            } else {
                Flow::Next
            }
        });
        assert_eq!(n, 5, "round {round}");
        let held = kept.len() as u32;
        assert_eq!(c.credits().posted(), 6 - held, "round {round}: all but the kept");
        for loan in kept.drain(..) {
            c.give_back(loan).unwrap();
        }
        c.progress(ep);
        assert_eq!(c.credits().posted(), 6, "round {round}: all posted again");
        p.settle();
    }
    assert_eq!(got, sent, "every message whole, in order");
    let (c, ep) = p.conn(1);
    assert_eq!(c.stats().lent, 15);
    assert_eq!(c.close(ep), Ok(()), "no loan out");
}

/// Completions that are not the connection's (a tagged message of the
/// application's own) come out of `drain` as they are, in their place.
#[test]
fn drain_hands_out_the_completions_that_are_not_the_connections() {
    let mut p = Pair::symmetric(small(1364, 4));
    p.drain = true;
    let src = p.w.register(0, 100);
    let dst = p.w.register(1, 100);
    p.w.eps[1].trecv(span(&dst, 0, 100), TagMatch { tag: 9, ignore: 0 }, None, 41).unwrap();
    p.w.eps[0].tsend(p.conns[0].as_ref().unwrap().peer(), span(&src, 0, 100), 9, 42).unwrap();
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, 10), None, 5).unwrap();
    p.settle();
    let ctx = |i: usize| p.others[i].iter().map(|c| (c.ctx, c.op)).collect::<Vec<_>>();
    assert_eq!(ctx(0), [(42, Op::Send)]);
    assert_eq!(ctx(1), [(41, Op::Recv)]);
    assert_eq!(p.sent(0), [(5, SendStatus::Ok)]);
}

/// A message of one segment goes by inject, its bytes copied into the
/// packet: sent as the call returns, the source the application's again.
/// Its send failing later still ends the connection (spec 3.1.5.4).
#[test]
fn a_whole_message_is_sent_as_the_call_returns_and_its_failed_send_terminates() {
    let fast = !cfg!(feature = "general-paths");
    let mut p = Pair::raw(small(1364, 8));
    let recvs = p.raw_recvs(16, 2000);
    let src = p.w.register(0, 1000);
    p.w.fill(0, &src, 3);
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, 64), None, 1).unwrap();
    let now = c.poll_event();
    if fast {
        assert_eq!(now, Some(Event::Sent { ctx: 1, status: SendStatus::Ok }));
        // Overwritten before anything was posted: the copy travels.
        p.w.fill(0, &src, 4);
    } else {
        assert_eq!(now, None, "the general path reports it as its send completes");
    }
    p.events[0].extend(now);
    p.settle();
    let segs = p.raw_segments(&recvs, 2000);
    assert_eq!(segs.len(), 1);
    assert!((0..64).all(|i| segs[0].0[24 + i] == pattern(3, i as u64)));
    let a = p.w.eps[0].addr();
    p.w.fabric.fail_sends(&a, 1);
    let (c, ep) = p.conn(0);
    c.send(ep, span(&src, 0, 64), None, 2).unwrap();
    p.settle();
    let Some(ProtocolError::SendFailed(status)) = p.terminated(0) else {
        panic!("not terminated by the failed send: {:?}", p.events[0]);
    };
    assert!(!status.is_ok());
    let second = if fast { SendStatus::Ok } else { SendStatus::Failed(status) };
    assert_eq!(p.sent(0), [(1, SendStatus::Ok), (2, second)]);
    assert_eq!(p.raw_segments(&recvs, 2000).len(), 1, "the failed one never arrived");
}

/// `inject` sends a short message as `send` sends it, copied into its
/// packet as the call returns, and reports nothing: the peer gets the same
/// segments, the connection no `Sent` for it. Its send failing later still
/// ends the connection, as any failed send does (spec 3.1.5.4).
#[test]
fn an_injected_message_goes_as_a_send_would_and_nothing_reports_it() {
    let fast = !cfg!(feature = "general-paths");
    let mut p = Pair::raw(small(1364, 8));
    let recvs = p.raw_recvs(16, 2000);
    let src = p.w.register(0, 2000);
    p.w.fill(0, &src, 3);
    let (c, ep) = p.conn(0);
    assert_eq!(c.inject(ep, span(&src, 0, 64)), Ok(fast));
    if !fast {
        // The general paths inject nothing: the message is send's.
        p.settle();
        assert!(p.raw_segments(&recvs, 2000).is_empty(), "nothing sent");
        return;
    }
    // Overwritten before anything was posted: the copy travels.
    p.w.fill(0, &src, 4);
    let (c, ep) = p.conn(0);
    assert_eq!(c.try_send(ep, span(&src, 0, 64), None, 1), Ok(()));
    assert_eq!(c.inject(ep, span(&src, 100, 64)), Ok(true));
    p.settle();
    let segs = p.raw_segments(&recvs, 2000);
    assert_eq!(segs.len(), 3, "in the order they went");
    let data = |seed: u64, from: u64| (from..from + 64).map(|i| pattern(seed, i)).collect();
    let want: [Vec<u8>; 3] = [data(3, 0), data(4, 0), data(4, 100)];
    for (k, (bytes, cq_data)) in segs.iter().enumerate() {
        assert_eq!(bytes.len(), 24 + 64, "segment {k}");
        assert_eq!(bytes[..24], segs[1].0[..24], "segment {k}: the header send writes");
        assert_eq!(bytes[24..], want[k], "segment {k}");
        assert_eq!(*cq_data, None);
    }
    let (r, _) = Repr::parse(&segs[0].0).unwrap();
    assert_eq!((r.data_offset, r.data_length, r.remaining_data_length), (24, 64, 0));
    assert_eq!(p.sent(0), [(1, SendStatus::Ok)], "only the message sent is reported");
    let s = p.conns[0].as_ref().unwrap().stats();
    assert_eq!((s.messages_sent, s.segments_sent, s.injected), (3, 3, 2));
    assert_eq!(p.conns[0].as_ref().unwrap().credits().send(), 8 - 3, "a credit each");
    // The next one fails; a message of two segments goes behind it, and
    // is not taken for it.
    let a = p.w.eps[0].addr();
    p.w.fabric.fail_sends(&a, 1);
    let (c, ep) = p.conn(0);
    assert_eq!(c.inject(ep, span(&src, 0, 64)), Ok(true));
    assert_eq!(c.send(ep, span(&src, 0, 2000), None, 7), Ok(()));
    p.settle();
    let Some(ProtocolError::SendFailed(status)) = p.terminated(0) else {
        panic!("not terminated by the failed send: {:?}", p.events[0]);
    };
    assert!(!status.is_ok());
    let sent = [(1, SendStatus::Ok), (7, SendStatus::Ok)];
    assert_eq!(p.sent(0), sent, "nothing reports the injected ones");
    // Nor those behind it: the peer's endpoint delivers in order.
    assert_eq!(p.raw_segments(&recvs, 2000).len(), 3, "the failed one never arrived");
    let (c, ep) = p.conn(0);
    assert_eq!(c.inject(ep, span(&src, 0, 64)), Err(SendError::Terminated(c.error().unwrap())));
}

/// `inject` sends nothing, and says so, when a message would not go whole
/// at once: empty, longer than a segment or `Config::inject_max`, behind
/// a message not yet sent, or without a credit to spare. `send` takes it
/// then, as ever.
#[test]
fn inject_sends_nothing_when_the_message_would_not_go_whole_at_once() {
    let fast = !cfg!(feature = "general-paths");
    // The peer granted 3 credits and grants nothing until told to;
    // segments of 100 bytes carry 76 of data.
    let params = Params { send_credits: 3, ..small(100, 8) };
    let cfg = Config { inject_max: 60, ..Config::default() };
    let mut p = Pair::new(SimConfig::default(), [params; 2], cfg, true);
    let recvs = p.raw_recvs(64, 200);
    let src = p.w.register(0, 7600);
    p.w.fill(0, &src, 5);
    let (c, ep) = p.conn(0);
    for len in [0, 61, 77, 7600] {
        assert_eq!(c.inject(ep, span(&src, 0, len)), Ok(false), "{len} bytes");
    }
    assert_eq!(c.inject(ep, span(&src, 7600 - 32, 33)), Err(SendError::BadSpan));
    assert_eq!(c.inject(ep, span(&src, 0, 60)), Ok(fast));
    assert_eq!(c.inject(ep, span(&src, 0, 1)), Ok(fast));
    // The last credit is kept for a message that grants: none to grant.
    let kept = fast as usize;
    for _ in 0..kept {
        assert_eq!(c.inject(ep, span(&src, 0, 1)), Ok(false), "the last credit");
    }
    p.settle();
    let went = if fast { 2 } else { 0 };
    assert_eq!(p.raw_segments(&recvs, 200).len(), went);
    assert_eq!(p.conns[0].as_ref().unwrap().stats().segments_sent, went as u64);
    // One header slot: a message from it in flight, the next waiting for
    // it; nothing is injected behind them, as nothing may pass them.
    let cfg = Config { send_slots: 1, inject_max: 100, ..Config::default() };
    let mut p = Pair::new(SimConfig::default(), [small(1364, 16); 2], cfg, true);
    let recvs = p.raw_recvs(16, 2000);
    let src = p.w.register(0, 1000);
    let (c, ep) = p.conn(0);
    assert_eq!(c.send(ep, span(&src, 0, 1000), None, 1), Ok(()));
    assert_eq!(c.send(ep, span(&src, 0, 900), None, 2), Ok(()));
    assert_eq!(c.inject(ep, span(&src, 0, 50)), Ok(false), "behind a message not yet sent");
    assert_eq!(c.send(ep, span(&src, 0, 50), None, 3), Ok(()));
    p.settle();
    let lens: Vec<_> = p.raw_segments(&recvs, 2000).iter().map(|s| s.0.len() - 24).collect();
    assert_eq!(lens, [1000, 900, 50], "in the order given");
    assert_eq!(p.sent(0).iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3]);
    // With nothing before it, it goes.
    let (c, ep) = p.conn(0);
    assert_eq!(c.inject(ep, span(&src, 0, 50)), Ok(fast));
}

//! Property round trips of SMB Direct framing: segmentation then
//! reassembly gives the message back, for sizes on either side of
//! multiples of a segment's data (and 0 and 1); headers emit and parse
//! back; and the same end to end over two connections on the sim device.

use crate::common;

use common::{Mem, World, pattern, span};
use efapoll::device::Mr;
use efapoll::device::fault::Faults;
use efapoll::device::sim::SimConfig;
use efapoll::endpoint::Config as EpConfig;
use efapoll::ulp::smbd::{
    Config, Connection, Drained, Event, Flags, Flow, HEADER_LEN, Params, Placement, Reassembler,
    RecvStatus, Repr, Segmenter, SendStatus,
};
use proptest::prelude::*;

/// A DataOffset and a MaxSendSize past it.
fn layout() -> impl Strategy<Value = (u32, u32)> {
    (3u32..=32).prop_flat_map(|o8| {
        let offset = o8 * 8;
        (Just(offset), offset + 1..offset + 70_000)
    })
}

/// A message length near `k` segments' worth of `per` bytes: one less,
/// exactly, one more; or 0, or 1.
fn near_multiple(per: u32) -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        1 => Just(1u64),
        8 => (1u64..40, -1i64..=1).prop_map(move |(k, d)| (k * per as u64).saturating_add_signed(d)),
    ]
}

/// Segments `msg` into whole segments' bytes, as they go on the wire.
fn wire_segments(msg: &[u8], offset: u32, max: u32) -> Vec<Vec<u8>> {
    Segmenter::new(msg.len() as u64, offset, max)
        .map(|s| {
            let mut b = vec![0xa5u8; s.repr.segment_len()];
            let at = s.repr.emit(&mut b);
            let n = s.repr.data_length as usize;
            b[at..at + n].copy_from_slice(&msg[s.offset as usize..][..n]);
            b
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn segmentation_then_reassembly_gives_the_message_back(
        ((offset, max), len) in layout().prop_flat_map(|(o, m)| ((Just(o), Just(m)), near_multiple(m - o))),
        seed in any::<u64>(),
    ) {
        let msg: Vec<u8> = (0..len).map(|i| pattern(seed, i)).collect();
        let segs = wire_segments(&msg, offset, max);
        let per = (max - offset) as u64;
        let want_count = if len == 0 { 1 } else { len.div_ceil(per) };
        prop_assert_eq!(segs.len() as u64, want_count);
        let mut r = Reassembler::new(u32::MAX);
        let mut out = vec![0u8; len as usize];
        let mut delivered = false;
        let mut sent = 0u64;
        for (i, bytes) in segs.iter().enumerate() {
            // The receiver copies only the header out of the segment.
            let h = Repr::parse_header(&bytes[..HEADER_LEN], bytes.len()).unwrap();
            let (full, data) = Repr::parse(bytes).unwrap();
            prop_assert_eq!(h, full);
            prop_assert!(bytes.len() <= max as usize, "DataOffset + DataLength <= MaxSendSize");
            prop_assert!(bytes[HEADER_LEN..h.buffer_len()].iter().all(|&b| b == 0), "padding zero");
            sent += h.data_length as u64;
            prop_assert_eq!(h.remaining_data_length as u64, len - sent);
            match r.accept(&h).unwrap() {
                Placement::Empty => {
                    prop_assert_eq!(len, 0);
                    prop_assert_eq!(bytes.len(), HEADER_LEN);
                    delivered = true;
                }
                Placement::Data { offset: at, len: n, total, first, last } => {
                    prop_assert_eq!(data.len(), n as usize);
                    prop_assert_eq!((first, last, total), (i == 0, i + 1 == segs.len(), len));
                    prop_assert_eq!(h.data_offset, offset);
                    out[at as usize..][..n as usize].copy_from_slice(data);
                    delivered |= last;
                }
            }
        }
        prop_assert!(delivered);
        prop_assert!(!r.in_progress());
        prop_assert_eq!(out, msg);
    }

    #[test]
    fn headers_emit_and_parse_back(
        credits_requested in any::<u16>(),
        credits_granted in any::<u16>(),
        flags in any::<u16>(),
        (remaining, offset, length) in prop_oneof![
            Just((0u32, 0u32, 0u32)),
            (any::<u32>(), 3u32..64, 1u32..5000).prop_map(|(r, o, l)| (r, o * 8, l)),
        ],
    ) {
        let r = Repr {
            credits_requested,
            credits_granted,
            flags: Flags::from_bits_retain(flags),
            remaining_data_length: remaining,
            data_offset: offset,
            data_length: length,
        };
        let mut seg = vec![0x5au8; r.segment_len()];
        let at = r.emit(&mut seg);
        prop_assert_eq!(at, r.buffer_len());
        let (back, data) = Repr::parse(&seg).unwrap();
        prop_assert_eq!(back, r);
        prop_assert_eq!(data.len(), length as usize);
    }

    /// Header prediction never disagrees with parsing: a header it
    /// recognizes parses to the same fields and is a whole message in one
    /// segment; and it recognizes every such message at the default
    /// DataOffset whose data runs to the segment's end.
    #[test]
    fn a_predicted_header_is_what_parsing_reads(
        words in any::<[u8; HEADER_LEN]>(),
        // Each field as emitted for a whole message, or as it came.
        usual in any::<[bool; 3]>(),
        data_length in prop_oneof![Just(0u32), Just(1), 1u32..100_000, any::<u32>()],
        past_end in prop_oneof![4 => Just(0u64), 1 => 0u64..64],
    ) {
        let mut h = words;
        if usual[0] { h[8..12].fill(0); }
        if usual[1] { h[12..16].copy_from_slice(&24u32.to_le_bytes()); }
        if usual[2] { h[16..20].copy_from_slice(&data_length.to_le_bytes()); }
        let segment_len = 24 + data_length as u64 + past_end;
        let parsed = Repr::parse_header(&h, segment_len as usize);
        match Repr::predict_whole(&h, segment_len) {
            Some(r) => {
                prop_assert_eq!(parsed, Ok(r));
                prop_assert!(r.remaining_data_length == 0 && r.data_length > 0);
            }
            None => {
                let whole_to_end = parsed.is_ok_and(|r| {
                    r.remaining_data_length == 0
                        && r.data_length > 0
                        && r.data_offset == 24
                        && r.data_length as u64 + 24 == segment_len
                });
                prop_assert!(!whole_to_end, "missed {:?}", parsed);
            }
        }
    }
}

proptest! {
    // Each case runs two endpoints: fewer of them.
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn messages_cross_two_connections_byte_exact(
        max in prop_oneof![Just(96u32), Just(200), Just(1364), Just(9000), Just(70_000)],
        credits in 2u16..12,
        seed in any::<u64>(),
        picks in proptest::collection::vec((0u64..6, -1i64..=1), 1..12),
        data_offset in prop_oneof![Just(24u32), Just(32), Just(64)],
    ) {
        let per = (max - data_offset) as u64;
        let sizes: Vec<u64> = picks
            .iter()
            .map(|&(k, d)| (k * per).saturating_add_signed(d).min(1 << 20))
            .collect();
        let sim = SimConfig { seed, faults: Faults::reorder(seed, 4), ..SimConfig::default() };
        let mut w = World::pair(sim, EpConfig::default());
        let to = [w.connect(0, 1), w.connect(1, 0)];
        let params = Params::symmetric(max, 1 << 20, credits);
        // The receiver's receives assume DataOffset 24 until a segment
        // says otherwise.
        let cfg = Config { data_offset, direct_min: 1, ..Config::default() };
        let mut c: Vec<Connection> = (0..2)
            .map(|i| Connection::new(&mut w.eps[i], to[i], params, cfg).unwrap())
            .collect();
        let total: u64 = sizes.iter().sum::<u64>() + 1;
        let src = w.register(0, total);
        let dst = w.register(1, total);
        w.fill(0, &src, seed);
        let mut at = 0;
        let mut want = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            if len > 0 {
                c[1].recv(&mut w.eps[1], span(&dst, at, len), i as u64).unwrap();
                want.push((i as u64, at, len));
            }
            c[0].send(&mut w.eps[0], span(&src, at, len), None, i as u64).unwrap();
            at += len;
        }
        let (mut sent, mut got) = (Vec::new(), Vec::new());
        for _ in 0..200_000 {
            if sent.len() == sizes.len() && got.len() == want.len() {
                break;
            }
            let mut did = false;
            for (ep, c) in w.eps.iter_mut().zip(c.iter_mut()) {
                did |= ep.progress();
                while let Some(comp) = ep.poll_cq() {
                    prop_assert!(c.handle_completion(ep, &comp));
                }
                did |= c.progress(ep);
                while let Some(e) = c.poll_event() {
                    match e {
                        Event::Sent { ctx, status } => sent.push((ctx, status)),
                        Event::Received { ctx, len, status, .. } => got.push((ctx, len, status)),
                        other => prop_assert!(false, "{:?}", other),
                    }
                }
            }
            if !did {
                w.fabric.skip_to_next_due();
            }
        }
        prop_assert_eq!(sent.len(), sizes.len());
        prop_assert!(sent.iter().enumerate().all(|(i, &(ctx, s))| ctx == i as u64 && s == SendStatus::Ok));
        prop_assert_eq!(got.len(), want.len());
        let mem = w.eps[1].mem(dst.id);
        for (&(ctx, len, status), &(i, at, l)) in got.iter().zip(&want) {
            prop_assert_eq!((ctx, len, status), (i, l, RecvStatus::Ok));
            for j in at..at + l {
                prop_assert_eq!(mem[j as usize], pattern(seed, j), "message {} byte {}", i, j - at);
            }
        }
    }
}

/// Two endpoints on a reordering sim, a connection each way with `cfg`,
/// and per side a region holding the messages it sends (`sizes[i]`,
/// filled with a pattern) and one for those it receives.
struct TwoWay {
    w: World,
    c: Vec<Connection>,
    src: Vec<Mr>,
    dst: Vec<Mr>,
}

fn two_way(sizes: &[Vec<u64>; 2], max: u32, credits: u16, seed: u64, cfg: Config) -> TwoWay {
    let sim = SimConfig { seed, faults: Faults::reorder(seed, 4), ..SimConfig::default() };
    let mut w = World::pair(sim, EpConfig::default());
    let to = [w.connect(0, 1), w.connect(1, 0)];
    let params = Params::symmetric(max, 1 << 20, credits);
    let cfg = Config { ..cfg };
    let c: Vec<Connection> =
        (0..2).map(|i| Connection::new(&mut w.eps[i], to[i], params, cfg).unwrap()).collect();
    let total = |s: &[u64]| s.iter().sum::<u64>() + 1;
    let src: Vec<_> = (0..2).map(|i| w.register(i, total(&sizes[i]))).collect();
    let dst: Vec<_> = (0..2).map(|i| w.register(i, total(&sizes[1 - i]))).collect();
    for (i, mr) in src.iter().enumerate() {
        w.fill(i, mr, seed ^ i as u64);
    }
    TwoWay { w, c, src, dst }
}

/// Both sides send each other `sizes[i]`, all queued at once; every
/// message must arrive byte-exact whatever the credits (none may wait on
/// the other forever).
fn both_ways(sizes: [Vec<u64>; 2], max: u32, credits: u16, seed: u64) -> Result<(), TestCaseError> {
    let cfg = Config { send_queue: 64, recv_queue: 64, direct_min: 1, ..Config::default() };
    let TwoWay { mut w, mut c, src, dst } = two_way(&sizes, max, credits, seed, cfg);
    let mut want: [Vec<(u64, u64, u64)>; 2] = [vec![], vec![]];
    for i in 0..2 {
        let mut at = 0;
        for (k, &len) in sizes[i].iter().enumerate() {
            if len > 0 {
                c[1 - i].recv(&mut w.eps[1 - i], span(&dst[1 - i], at, len), k as u64).unwrap();
                want[1 - i].push((k as u64, at, len));
            }
            c[i].send(&mut w.eps[i], span(&src[i], at, len), None, k as u64).unwrap();
            at += len;
        }
    }
    let mut sent = [0usize; 2];
    let mut got: [Vec<(u64, u64)>; 2] = [vec![], vec![]];
    for _ in 0..200_000 {
        if (0..2).all(|i| sent[i] == sizes[i].len() && got[i].len() == want[i].len()) {
            break;
        }
        let mut did = false;
        for i in 0..2 {
            did |= w.eps[i].progress();
            while let Some(comp) = w.eps[i].poll_cq() {
                prop_assert!(c[i].handle_completion(&mut w.eps[i], &comp));
            }
            did |= c[i].progress(&mut w.eps[i]);
            while let Some(e) = c[i].poll_event() {
                match e {
                    Event::Sent { status: SendStatus::Ok, .. } => sent[i] += 1,
                    Event::Received { ctx, len, status: RecvStatus::Ok, .. } => {
                        got[i].push((ctx, len))
                    }
                    other => prop_assert!(false, "{:?}", other),
                }
            }
        }
        if !did {
            w.fabric.skip_to_next_due();
        }
    }
    for i in 0..2 {
        prop_assert_eq!(sent[i], sizes[i].len(), "side {} sent; credits {:?}", i, c[i].credits());
        prop_assert_eq!(got[i].len(), want[i].len(), "side {} received", i);
        let mem = w.eps[i].mem(dst[i].id);
        for (&(ctx, len), &(k, at, l)) in got[i].iter().zip(&want[i]) {
            prop_assert_eq!((ctx, len), (k, l));
            for j in at..at + l {
                prop_assert_eq!(mem[j as usize], pattern(seed ^ (1 - i) as u64, j));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn both_ways_at_once_with_few_credits_nothing_waits_forever(
        max in prop_oneof![Just(32u32), Just(100), Just(1364)],
        credits in 2u16..6,
        seed in any::<u64>(),
        a in proptest::collection::vec(prop_oneof![Just(0u64), 1u64..3000], 0..40),
        b in proptest::collection::vec(prop_oneof![Just(0u64), 1u64..3000], 0..40),
    ) {
        both_ways([a, b], max, credits, seed)?;
    }
}

/// What one run of [`fast_or_general`] saw: the packets delivered (from,
/// to, bytes) and each side's events, in order.
/// The packets on the wire, each side's events, and the bytes of each
/// message lent to each side, read when it was handed out.
type Seen = (Vec<(u16, u16, Vec<u8>)>, [Vec<Event>; 2], [Vec<Vec<u8>>; 2]);

/// How a side takes its endpoint's completions and its connection's
/// events.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Taking {
    /// `handle_completion`, `poll_event`, `give_back`.
    Polled,
    /// `drain`, lent messages read inside it.
    Drained,
}

/// Both sides send each other `sizes[i]`, a message given whenever the
/// queue takes one, with the fast path on or off.
/// `lend_max`: messages of one segment up to it are lent, and given back
/// as soon as they are reported; the others get buffers.
/// `direct_min`: receives are posted into buffers of at least so many
/// bytes ([`Config::direct_min`]; 1 places every message given one).
fn fast_or_general(
    fast: bool,
    sizes: &[Vec<u64>; 2],
    max: u32,
    credits: u16,
    seed: u64,
    (lend_max, direct_min): (u64, u64),
) -> Seen {
    taken(settings(fast, lend_max, direct_min), Taking::Polled, sizes, max, credits, seed)
}

/// The local settings of the comparisons' connections.
fn settings(fast: bool, lend_max: u64, direct_min: u64) -> Config {
    let queues = Config { send_queue: 8, recv_queue: 64, ..Config::default() };
    Config { fast_path: fast, lend_max, direct_min, ..queues }
}

fn taken(
    cfg: Config,
    taking: Taking,
    sizes: &[Vec<u64>; 2],
    max: u32,
    credits: u16,
    seed: u64,
) -> Seen {
    let lend_max = cfg.lend_max;
    let TwoWay { mut w, mut c, src, dst } = two_way(sizes, max, credits, seed, cfg);
    let lent = |len: u64| len <= lend_max && len <= max as u64 - 24;
    for i in 0..2 {
        let mut at = 0;
        for (k, &len) in sizes[i].iter().enumerate() {
            if len > 0 && !lent(len) {
                c[1 - i].recv(&mut w.eps[1 - i], span(&dst[1 - i], at, len), k as u64).unwrap();
            }
            at += len;
        }
    }
    w.fabric.set_capture(true);
    let mut next = [0usize; 2];
    let mut at = [0u64; 2];
    let mut events: [Vec<Event>; 2] = [vec![], vec![]];
    let mut lent_bytes: [Vec<Vec<u8>>; 2] = [vec![], vec![]];
    let read = |ep: &efapoll::endpoint::Endpoint<_>, e: &Event| match *e {
        Event::Lent { data, .. } => {
            let mut b = vec![0u8; data.len as usize];
            ep.read_mem(data.mr, data.offset, &mut b).unwrap();
            Some(b)
        }
        _ => None,
    };
    for _ in 0..200_000 {
        let mut did = false;
        for i in 0..2 {
            // One message given per turn, so that some go when the queue
            // is empty and some behind others.
            if let Some(&len) = sizes[i].get(next[i]) {
                let s = span(&src[i], at[i], len);
                if c[i].send(&mut w.eps[i], s, None, next[i] as u64).is_ok() {
                    next[i] += 1;
                    at[i] += len;
                    did = true;
                }
            }
            did |= w.eps[i].progress();
            if taking == Taking::Drained {
                let (seen, bytes) = (&mut events[i], &mut lent_bytes[i]);
                did |= c[i].drain(&mut w.eps[i], |ep, d| {
                    let Drained::Event(e) = d else { panic!("not the connection's: {d:?}") };
                    bytes.extend(read(ep, &e));
                    seen.push(e);
                    Flow::Next
                }) > 0;
                did |= c[i].progress(&mut w.eps[i]);
                continue;
            }
            while let Some(comp) = w.eps[i].poll_cq() {
                assert!(c[i].handle_completion(&mut w.eps[i], &comp));
            }
            did |= c[i].progress(&mut w.eps[i]);
            while let Some(e) = c[i].poll_event() {
                lent_bytes[i].extend(read(&w.eps[i], &e));
                if let Event::Lent { loan, .. } = e {
                    c[i].give_back(loan).unwrap();
                    did = true;
                }
                events[i].push(e);
            }
        }
        if !did && !w.fabric.skip_to_next_due() {
            break;
        }
    }
    (w.fabric.take_capture(), events, lent_bytes)
}

/// MaxSendSize of the fast and general paths' comparisons: a segment of
/// 40 bytes of data, of 76, of 1340, and of 19,976, longer than a packet
/// (a message of one segment then goes through a header slot).
fn max_sizes() -> impl Strategy<Value = u32> {
    prop_oneof![Just(64u32), Just(100), Just(1364), Just(20_000)]
}

/// Credits scarce, some, and plentiful.
fn credit_counts() -> impl Strategy<Value = u16> {
    prop_oneof![2u16..6, 8u16..24, Just(255)]
}

/// Each side's messages, as (k, d) picks for [`picked_sizes`].
fn picks() -> impl Strategy<Value = Vec<Vec<(u64, i64)>>> {
    proptest::collection::vec(proptest::collection::vec((0u64..3, -1i64..=1), 0..48), 2..=2)
}

/// The sizes the picks name: 0, 1 or 24 bytes for k = 0, else k times a
/// segment's data `per`, give or take a byte.
fn picked_sizes(picks: &[Vec<(u64, i64)>], per: u64) -> [Vec<u64>; 2] {
    let size = |&(k, d): &(u64, i64)| {
        if k == 0 { [0, 1, 24][(d + 1) as usize] } else { (k * per).saturating_add_signed(d) }
    };
    [0, 1].map(|i: usize| picks[i].iter().map(size).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// The fast path (a whole message sent with no header slot, delivered
    /// in one pass) cannot drift from the general path: the same packets
    /// and the same events, with credits plentiful or scarce, for sizes
    /// on either side of a segment's data and of MaxSendSize.
    #[test]
    fn the_fast_path_sends_and_reports_what_the_general_path_does(
        max in max_sizes(),
        credits in credit_counts(),
        seed in any::<u64>(),
        picks in picks(),
        lend_max in prop_oneof![Just(0u64), Just(24), Just(u64::MAX)],
        direct_min in prop_oneof![Just(Config::default().direct_min), Just(1u64)],
    ) {
        let per = max as u64 - 24;
        let sizes = picked_sizes(&picks, per);
        let general = fast_or_general(false, &sizes, max, credits, seed, (lend_max, direct_min));
        let fast = fast_or_general(true, &sizes, max, credits, seed, (lend_max, direct_min));
        for (i, (events, sizes)) in fast.1.iter().zip(&sizes).enumerate() {
            let sent = events.iter().filter(|e| matches!(e, Event::Sent { status: SendStatus::Ok, .. })).count();
            prop_assert_eq!(sent, sizes.len(), "side {} sent all", i);
        }
        for (i, events) in fast.1.iter().enumerate() {
            let delivered = events
                .iter()
                .filter(|e| matches!(e, Event::Lent { .. } | Event::Received { status: RecvStatus::Ok, .. }))
                .count();
            let lent = events.iter().filter(|e| matches!(e, Event::Lent { .. })).count();
            let from_peer = &sizes[1 - i];
            prop_assert_eq!(delivered, from_peer.iter().filter(|&&l| l > 0).count(), "side {} received all", i);
            let lendable = from_peer.iter().filter(|&&l| l > 0 && l <= lend_max && l <= per).count();
            prop_assert_eq!(lent, lendable, "side {} lent", i);
        }
        // The same events in the same order, but for when a message is
        // reported sent: the fast path's inject tells it as the send
        // returns, the general path as its send completes.
        for (f, g) in fast.1.iter().zip(&general.1) {
            let (fs, fo): (Vec<&Event>, Vec<&Event>) = f.iter().partition(|e| matches!(e, Event::Sent { .. }));
            let (gs, go): (Vec<&Event>, Vec<&Event>) = g.iter().partition(|e| matches!(e, Event::Sent { .. }));
            prop_assert_eq!(fs, gs, "messages sent");
            prop_assert_eq!(fo, go, "events");
        }
        prop_assert_eq!(fast.0.len(), general.0.len(), "packets");
        for (k, (f, g)) in fast.0.iter().zip(&general.0).enumerate() {
            prop_assert_eq!(f, g, "packet {}", k);
        }
    }
}

/// A side's events with what may differ between taking them by polling
/// and by draining set aside: when a send is reported against the
/// receives (a lent receive drained is posted again sooner, so the peer
/// is granted sooner), and which receive slot a message was lent in.
fn comparable(events: &[Event]) -> (Vec<String>, Vec<String>) {
    let slotless = |e: &Event| match *e {
        Event::Lent { data, invalidated, .. } => format!("lent {} {invalidated:?}", data.len),
        e => format!("{e:?}"),
    };
    let (sent, others): (Vec<&Event>, Vec<&Event>) =
        events.iter().partition(|e| matches!(e, Event::Sent { .. }));
    (sent.into_iter().map(slotless).collect(), others.into_iter().map(slotless).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// A side that drains (`Connection::drain`, which hands out a message
    /// it lends as it takes it) gets what a side that polls gets: every
    /// message in order, lent or delivered as by polling, with the same
    /// bytes, and every send reported alike.
    #[test]
    fn draining_hands_out_what_polling_does(
        max in max_sizes(),
        credits in credit_counts(),
        seed in any::<u64>(),
        picks in picks(),
        lend_max in prop_oneof![Just(24u64), Just(u64::MAX)],
        direct_min in prop_oneof![Just(Config::default().direct_min), Just(1u64)],
    ) {
        let per = max as u64 - 24;
        let sizes = picked_sizes(&picks, per);
        let cfg = settings(true, lend_max, direct_min);
        let polled = taken(cfg, Taking::Polled, &sizes, max, credits, seed);
        let drained = taken(cfg, Taking::Drained, &sizes, max, credits, seed);
        for i in 0..2 {
            prop_assert_eq!(comparable(&drained.1[i]), comparable(&polled.1[i]), "side {}", i);
            prop_assert_eq!(&drained.2[i], &polled.2[i], "side {}: the bytes lent", i);
            let lendable = sizes[1 - i].iter().filter(|&&l| l > 0 && l <= lend_max && l <= per).count();
            prop_assert_eq!(drained.2[i].len(), lendable, "side {} lent", i);
        }
    }
}

/// A side that spent its credits on an empty message and on granting the
/// peer's answer is left with its last one and nothing to grant: its next
/// message goes on that credit and asks the peer, which holds credits, for
/// more, rather than waiting for a grant nobody owes it.
#[test]
fn an_empty_message_on_the_last_credit_goes_and_asks_for_more() {
    let sizes: [Vec<u64>; 2] = [vec![80], vec![0, 0]];
    for fast in [false, true] {
        let (_, events, _) =
            fast_or_general(fast, &sizes, 64, 3, 0, (0, Config::default().direct_min));
        for (i, (events, sizes)) in events.iter().zip(&sizes).enumerate() {
            let sent = events
                .iter()
                .filter(|e| matches!(e, Event::Sent { status: SendStatus::Ok, .. }))
                .count();
            assert_eq!(sent, sizes.len(), "side {i} sent all (fast path {fast})");
        }
    }
}

/// Both sides on their last credits at once, each with a message of
/// several segments: neither may spend its last credit on a segment that
/// grants nothing, or both end with none and each waits for the other.
#[test]
fn two_sides_short_of_credits_at_once_both_finish() {
    both_ways([vec![9], vec![17]], 32, 2, 0).unwrap();
}

//! SMB Direct framing (`efapoll::ulp::smbd`) against plain sends: the same
//! stream over shm in one thread, once as endpoint messages and once as
//! SMB Direct data transfer over a connection each way; the framed 64-byte
//! stream as `efapoll streaming -o smbd` takes it (drained), over sim; and
//! the Data Transfer header's codec on the unit tests' golden segments.

use std::hint::black_box;
use std::time::Duration;

use efapoll::device::Device;
use efapoll::device::shm::{ShmConfig, ShmDevice};
use efapoll::device::sim::SimConfig;
use efapoll::endpoint::{Config, Endpoint, Span};
use efapoll::ulp::smbd::{self, Connection, Drained, Event, Flow, Packet, Params, Repr, golden};

use super::sim::{MIB, Pair, Stream, region};
use super::{Kind, Runner, Unit, Workload};

/// Two endpoints over shm that know each other, as the apps make them
/// (`Config::on_host`: what exceeds a packet is read, one copy). A
/// response timeout of a minute, so that callgrind's slowness on a loaded
/// machine does not fail a 1 MiB read that waits for its turn.
fn endpoints() -> Pair<ShmDevice> {
    let cfg = Config {
        handshake_on_insert: true,
        response_timeout: Duration::from_secs(60),
        ..Config::on_host()
    };
    let dev = || ShmDevice::new(ShmConfig::default()).unwrap();
    Pair::connect(Endpoint::new(dev(), cfg).unwrap(), Endpoint::new(dev(), cfg).unwrap(), None)
}

/// Two endpoints on a sim fabric of their own, as `efapoll -p sim` makes
/// them.
fn sim_endpoints() -> Pair {
    Pair::new(SimConfig::default(), Config { handshake_on_insert: true, ..Config::default() })
}

/// The parameters `efapoll streaming -o smbd` negotiates for one size: a
/// segment holds a message (up to 1 MiB), 255 credits, fewer where the
/// receives would take over 64 MiB.
pub fn params(len: u64) -> Params {
    let segment = len + smbd::DEFAULT_DATA_OFFSET as u64;
    let credits = ((64 * MIB) / segment).clamp(4, 255);
    Params::symmetric(segment as u32, len as u32, credits as u16)
}

/// Messages of one size from a to b, `window` in flight, framed as SMB
/// Direct data transfer; one operation is one message. As `efapoll
/// streaming -o smbd` does, the sender injects a message short enough,
/// done as it goes (`inject`), and holds back one that cannot start now
/// (`try_send`), as a plain send is pushed back rather than queued (with
/// `queue`, it sends with `send`: a message that cannot start waits in
/// the connection's queue for a credit), and the receiver has
/// messages shorter than a placed buffer lent and gives them back, and
/// keeps buffers posted for the others two windows and its credits ahead:
/// more than its receives, so that they are posted into the buffers.
struct SmbdStream<D: Device> {
    p: Pair<D>,
    c: [Connection; 2],
    len: u64,
    window: u64,
    queue: bool,
    src: efapoll::device::Mr,
    dst: efapoll::device::Mr,
}

impl<D: Device> SmbdStream<D> {
    fn new(mut p: Pair<D>, len: u64, window: u64, queue: bool) -> Self {
        let params = params(len);
        let default = smbd::Config::default();
        // Room for the buffers the receiver keeps posted (`run`'s `ahead`).
        let ahead = 2 * window + params.receive_credit_max as u64;
        let recv_queue = default.recv_queue.max(ahead as u16);
        let cfg = smbd::Config { lend_max: default.direct_min - 1, recv_queue, ..default };
        let ca = Connection::new(&mut p.a, p.to_b, params, cfg).unwrap();
        let cb = Connection::new(&mut p.b, p.to_a, params, cfg).unwrap();
        let src = region(&mut p.a, len);
        let dst = region(&mut p.b, len);
        let mut s = SmbdStream { p, c: [ca, cb], len, window, queue, src, dst };
        // Warm-up: every receive slot and header slot used at least once.
        s.run(4 * params.receive_credit_max as u64 + 2 * window);
        s
    }
}

impl<D: Device> Runner for SmbdStream<D> {
    fn run(&mut self, n: u64) {
        let SmbdStream { p, c, len, window, queue, src, dst } = self;
        let (len, window, queue) = (*len, *window, *queue);
        let [ca, cb] = c;
        let lent = len <= cb.config().lend_max;
        let ahead = 2 * window + cb.params().receive_credit_max as u64;
        let (mut posted, mut sent, mut recvd, mut sdone) = (0u64, 0u64, 0u64, 0u64);
        while recvd < n || sdone < n {
            while !lent && posted < n && posted - recvd < ahead {
                cb.recv(&mut p.b, Span::new(dst, 0, len), posted).unwrap();
                posted += 1;
            }
            // A window at a time, as the app posts: the messages injected
            // are done once it is posted.
            let mut injected = 0;
            while sent < n && sent - sdone < window {
                let src = Span::new(src, 0, len);
                let posted = if queue {
                    ca.send(&mut p.a, src, None, sent)
                } else if let Ok(true) = ca.inject(&mut p.a, src) {
                    injected += 1;
                    Ok(())
                } else {
                    ca.try_send(&mut p.a, src, None, sent)
                };
                if posted.is_err() {
                    break;
                }
                sent += 1;
            }
            sdone += injected;
            for (ep, c) in [(&mut p.a, &mut *ca), (&mut p.b, &mut *cb)] {
                ep.progress();
                while let Some(comp) = ep.poll_cq() {
                    c.handle_completion(ep, &comp);
                }
                c.progress(ep);
                while let Some(e) = c.poll_event() {
                    match e {
                        Event::Sent { .. } => sdone += 1,
                        Event::Received { .. } => {
                            black_box(e);
                            recvd += 1;
                        }
                        Event::Lent { loan, .. } => {
                            black_box(e);
                            c.give_back(loan).unwrap();
                            recvd += 1;
                        }
                        other => panic!("{other:?}"),
                    }
                }
            }
        }
    }

    fn packets_sent(&self) -> Vec<u64> {
        self.p.packets_sent()
    }
}

/// [`SmbdStream`] of lent messages (injected), each side's
/// completions taken by `Connection::drain`, a lent message read inside it
/// and its slot armed again as the closure returns: the path of `efapoll
/// streaming -o smbd`. A type of its own, so that the connection's
/// functions for [`SmbdStream`]'s device keep the one caller they had, and
/// with it how they are inlined there (a second caller over shm moved
/// those workloads by 3 to 8%).
struct DrainedStream<D: Device>(SmbdStream<D>);

impl<D: Device> Runner for DrainedStream<D> {
    fn run(&mut self, n: u64) {
        let SmbdStream { p, c, len, window, src, .. } = &mut self.0;
        let (len, window) = (*len, *window);
        let [ca, cb] = c;
        assert!(len <= cb.config().lend_max, "the messages are lent");
        let (mut sent, mut recvd, mut sdone) = (0u64, 0u64, 0u64);
        while recvd < n || sdone < n {
            let mut injected = 0;
            while sent < n && sent - sdone < window {
                let src = Span::new(src, 0, len);
                if let Ok(true) = ca.inject(&mut p.a, src) {
                    injected += 1;
                } else if ca.try_send(&mut p.a, src, None, sent).is_err() {
                    break;
                }
                sent += 1;
            }
            sdone += injected;
            for (ep, c) in [(&mut p.a, &mut *ca), (&mut p.b, &mut *cb)] {
                ep.progress();
                c.drain(ep, |_, d| {
                    match d {
                        Drained::Event(Event::Sent { .. }) => sdone += 1,
                        Drained::Event(e @ Event::Lent { .. }) => {
                            black_box(e);
                            recvd += 1;
                        }
                        other => panic!("{other:?}"),
                    }
                    Flow::Next
                });
                c.progress(ep);
            }
        }
    }

    fn packets_sent(&self) -> Vec<u64> {
        self.0.p.packets_sent()
    }
}

pub(super) fn workloads(v: &mut Vec<Workload>) {
    // The header on its own: the checks and fields a receiver reads, and
    // what a sender writes for each segment.
    v.push(
        Workload::new("smbd/header/parse", Unit::Ops, Kind::Rate, 6_000_000, || {
            Box::new(|n| {
                for _ in 0..n {
                    let seg = black_box(golden::FIRST);
                    black_box(Repr::parse_header(&seg[..smbd::HEADER_LEN], seg.len()).unwrap());
                }
            })
        })
        .small(),
    );
    // A stream's usual header (a whole message at DataOffset 24, its data
    // to the segment's end), recognized by its words rather than parsed.
    v.push(
        Workload::new("smbd/header/predict", Unit::Ops, Kind::Rate, 6_000_000, || {
            let whole = Repr { remaining_data_length: 0, ..Repr::parse(golden::FIRST).unwrap().0 };
            let mut seg = [0u8; 32];
            whole.emit(&mut seg);
            Box::new(move |n| {
                for _ in 0..n {
                    let seg = black_box(&seg);
                    let head = seg.first_chunk().unwrap();
                    black_box(Repr::predict_whole(head, black_box(32)).unwrap());
                }
            })
        })
        .small(),
    );
    v.push(Workload::new("smbd/header/parse_view", Unit::Ops, Kind::Rate, 6_000_000, || {
        Box::new(|n| {
            for _ in 0..n {
                let p = Packet::new_checked(black_box(golden::FIRST)).unwrap();
                black_box((p.remaining_data_length(), p.data_length(), p.data()));
            }
        })
    }));
    v.push(
        Workload::new("smbd/header/emit", Unit::Ops, Kind::Rate, 10_000_000, || {
            let (repr, _) = Repr::parse(golden::FIRST).unwrap();
            let mut buf = [0u8; 64];
            Box::new(move |n| {
                for _ in 0..n {
                    black_box(black_box(&repr).emit(black_box(&mut buf)));
                }
            })
        })
        .small(),
    );
    // The comparison, side by side: 64-byte messages (window 64,
    // as `efapoll streaming -S 64`) and 1 MiB ones (window 8), plain and
    // framed, over shm in one thread; 4 KiB ones, the shortest the framed
    // receiver places in their buffers (`Config::direct_min`); and 8 KiB
    // ones, the shortest a segment of which is read (its header in the
    // request, `Endpoint::sendv_head`).
    let sizes = [
        ("64B", 64u64, 64u64, 200_000u64),
        ("4KiB", 4096, 64, 50_000),
        ("8KiB", 8192, 64, 40_000),
        ("1MiB", MIB, 8, 20_000),
    ];
    for (size, len, window, iters) in sizes {
        let unit = if len <= 64 { Unit::Ops } else { Unit::Bytes(len) };
        let plain = Workload::new(format!("smbd/stream_{size}/plain"), unit, Kind::Rate, iters, {
            move || Box::new(Stream::new(endpoints(), len, window))
        });
        let framed = Workload::new(format!("smbd/stream_{size}/smbd"), unit, Kind::Rate, iters, {
            move || Box::new(SmbdStream::new(endpoints(), len, window, false))
        });
        v.push(plain.small());
        v.push(framed.small());
    }
    // `send`'s queue at 64 B, which the app and the workloads above no
    // longer take (they hold a message back instead): a sender that runs
    // ahead of its credits has messages wait there and sent from
    // `progress`.
    let queued =
        Workload::new("smbd/stream_64B/smbd_queued", Unit::Ops, Kind::Rate, 200_000, || {
            Box::new(SmbdStream::new(endpoints(), 64, 64, true))
        });
    v.push(queued.small());
    // The path of `efapoll streaming -o smbd` at 64 B, which the workloads
    // above do not take. Over sim, as the app's figures in perf/README are
    // taken, and so that the stream over shm keeps its code as it was.
    let drained =
        Workload::new("smbd/stream_64B/smbd_drain_sim", Unit::Ops, Kind::Rate, 200_000, || {
            Box::new(DrainedStream(SmbdStream::new(sim_endpoints(), 64, 64, false)))
        });
    v.push(drained.small());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stream's sender: how many messages waited for a credit.
    fn credit_stalls(queue: bool) -> u64 {
        let mut s = SmbdStream::new(endpoints(), 64, 64, queue);
        s.run(20_000);
        s.c[0].stats().credit_stalls
    }

    #[test]
    fn the_queued_stream_waits_in_the_queue_and_the_held_back_one_never() {
        // Else `smbd/stream_64B/smbd_queued` would measure what
        // `smbd/stream_64B/smbd` does, and guard nothing of its own.
        assert!(credit_stalls(true) > 0, "messages waited for a credit in the queue");
        assert_eq!(credit_stalls(false), 0, "try_send queues nothing");
    }

    #[test]
    fn the_4kib_stream_lands_every_message_in_its_buffer() {
        // Else `smbd/stream_4KiB/smbd` would measure copies out of the
        // receive slots, not the placed path.
        let mut s = SmbdStream::new(endpoints(), 4096, 64, false);
        let before = *s.c[1].stats();
        s.run(5_000);
        let after = *s.c[1].stats();
        assert_eq!(after.messages_received - before.messages_received, 5_000);
        assert_eq!(after.in_place - before.in_place, 5_000, "every message placed");
        assert_eq!(after.lent, before.lent, "none lent");
    }

    #[test]
    fn the_8kib_stream_reads_each_message_once_into_its_buffer() {
        // Else `smbd/stream_8KiB/smbd` would measure a second read a
        // message (the header's, scattered apart from the data) or copies
        // out of the receive slots.
        let mut s = SmbdStream::new(endpoints(), 8192, 64, false);
        let (before, reads) = (*s.c[1].stats(), s.p.b.counters().rdma_reads);
        s.run(5_000);
        let after = *s.c[1].stats();
        assert_eq!(after.messages_received - before.messages_received, 5_000);
        assert_eq!(after.in_place - before.in_place, 5_000, "every message placed");
        assert_eq!(s.p.b.counters().rdma_reads - reads, 5_000, "one read a message");
    }

    #[test]
    fn the_drained_stream_lends_every_message() {
        // Else `smbd/stream_64B/smbd_drain_sim` would measure copies into
        // buffers, not the lending the app's stream has.
        let mut s = DrainedStream(SmbdStream::new(sim_endpoints(), 64, 64, false));
        let (before, injected) = (*s.0.c[1].stats(), s.0.c[0].stats().injected);
        s.run(20_000);
        let after = *s.0.c[1].stats();
        assert_eq!(after.lent - before.lent, 20_000, "every message lent");
        assert_eq!(after.in_place, before.in_place, "none placed in a buffer");
        assert_eq!(s.0.c[0].stats().credit_stalls, 0, "try_send queues nothing");
        // As the app's sender: no report a message to take.
        assert_eq!(s.0.c[0].stats().injected - injected, 20_000, "every message injected");
    }

    #[test]
    fn the_held_back_64b_stream_injects_every_message() {
        // Else `smbd/stream_64B/smbd` would measure a report a message
        // that the app's stream does not take.
        let mut s = SmbdStream::new(endpoints(), 64, 64, false);
        let injected = s.c[0].stats().injected;
        s.run(20_000);
        assert_eq!(s.c[0].stats().injected - injected, 20_000);
    }
}

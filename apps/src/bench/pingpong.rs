//! Pingpong: the initiator sends a message, the responder sends it back;
//! half the round trip is the latency.
//!
//! With `-o write` each side writes into the other's buffer with CQ data,
//! and learns of the other's write from the completion the CQ data makes
//! (fabtests' style; no polling of the buffer's last byte): half round
//! trips again, comparable to send. `-o read` and `-o atomic` (fetch-add)
//! are round trips by themselves: the initiator times whole ones against a
//! [`super::target::Target`], as perftest's ib_read_lat and ib_atomic_lat
//! do, and ends each size with a fence (see [`super::op`]).
//!
//! Timing: one clock read per round trip, at its end (which is the next
//! one's start), so a round trip pays for one read. Where that read would
//! cost more than 0.25% of a round trip (sub-µs round trips on sim and shm
//! against the ~20 ns of `Instant::now`), the initiator times batches of
//! round trips instead, sized from the warmup's fastest round trip, and
//! records each batch's mean: the average stays exact, the percentiles are
//! of batch means (the batch is in the JSON rows and noted on stderr).

use std::hint::black_box;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use efapoll::device::{Device, Mr};
use efapoll::endpoint::{Completion, Op, Span};
use hdrhistogram::Histogram;

use super::counts::{Counts, UNKNOWN};
use super::op::{
    self, CTL_LEN, Io, Ops, check_cq_data, check_len, check_passive_status, check_status,
};
use super::report::{HIST_MAX_NS, PingpongSample, new_histogram};
use super::{ActiveSide, Params, PassiveSide, Phase, RunError, Sample};

/// A clock read may cost at most 1/`CLOCK_SHARE` of the round trips it
/// times (0.25%: at 1% it was still 1 ns of a 180 ns round trip on sim).
const CLOCK_SHARE: f64 = 400.0;

/// The fewest batches a size's measured round trips are timed in, where
/// the count is known.
const MIN_SAMPLES: u64 = 16;

/// The most round trips one clock read may cover.
const MAX_BATCH: u64 = 1024;

/// What one `Instant::now` costs here, in ns (the best of a few tries).
pub fn clock_cost_ns() -> f64 {
    static COST: OnceLock<f64> = OnceLock::new();
    *COST.get_or_init(|| {
        (0..5)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..1000 {
                    black_box(Instant::now());
                }
                start.elapsed().as_nanos() as f64 / 1000.0
            })
            .fold(f64::INFINITY, f64::min)
    })
}

/// Round trips per clock read for a round trip of `rtt_ns`.
pub fn batch_for(rtt_ns: f64, clock_ns: f64) -> u64 {
    let mut batch = 1;
    while batch < MAX_BATCH && clock_ns * CLOCK_SHARE > rtt_ns * batch as f64 {
        batch *= 2;
    }
    batch
}

/// The halves of an exchange (a round trip, or the fence), as bits of
/// what is left of it to post and to complete: our message or operation,
/// and the reply (its receive; its arrival).
const OURS: u8 = 1;
const REPLY: u8 = 2;

/// The measuring side.
#[derive(Debug)]
pub struct Initiator<D: Device> {
    io: Io<D>,
    rx: Mr,
    /// Where an operation goes from (send, write) or lands (read, the
    /// fetched value of an atomic).
    local: Mr,
    params: Params,
    k: usize,
    size: u64,
    /// Next iteration of the size (warmup included) and the phase's end.
    seq: u64,
    end: u64,
    /// An exchange is under way, and what is left of it to post and to
    /// complete ([`OURS`], [`REPLY`]).
    in_flight: bool,
    unposted: u8,
    pending: u8,
    /// What an iteration posts and completes: only send needs a receive,
    /// and only send and write a reply.
    posts: u8,
    completes: u8,
    measuring: bool,
    /// The exchange under way is the fence that ends a one-sided size.
    fencing: bool,
    /// Warmup round trips, ns, to size the batch.
    warm_ns: Vec<u64>,
    counts: Arc<Counts>,
    /// Duration mode: when the measured phase's time is up.
    deadline: Option<Instant>,
    /// Duration mode: the count is announced, and the size's last round
    /// trip waits until the peer has it.
    announced: bool,
    batch: u64,
    in_batch: u64,
    stamp: Instant,
    start: Instant,
    hist: Histogram<u64>,
}

impl<D: Device> Initiator<D> {
    pub fn new(
        mut io: Io<D>,
        params: &Params,
        counts: Arc<Counts>,
    ) -> Result<Initiator<D>, RunError> {
        let tx = io.register(params.max_size())?;
        let rx = io.register(params.max_size())?;
        let now = Instant::now();
        let op = io.op;
        let local = if op.lands_here() { rx } else { tx };
        let posts = if op.is_one_sided() { OURS } else { OURS | REPLY };
        let completes = if op.echoes() { OURS | REPLY } else { OURS };
        Ok(Initiator {
            io,
            rx,
            local,
            params: params.clone(),
            k: 0,
            size: 0,
            seq: 0,
            end: 0,
            in_flight: false,
            unposted: 0,
            pending: 0,
            posts,
            completes,
            measuring: false,
            fencing: false,
            warm_ns: Vec::new(),
            counts,
            deadline: None,
            announced: false,
            batch: 1,
            in_batch: 0,
            stamp: now,
            start: now,
            hist: new_histogram(),
        })
    }

    #[inline]
    fn finish_iteration(&mut self) {
        self.seq += 1;
        self.in_flight = false;
        if !self.measuring {
            self.time_warmup_iteration();
            return;
        }
        self.in_batch += 1;
        if self.in_batch == self.batch || self.seq == self.end {
            self.time_batch();
        }
    }

    #[inline(never)]
    fn time_warmup_iteration(&mut self) {
        let now = Instant::now();
        self.warm_ns.push((now - self.stamp).as_nanos() as u64);
        self.stamp = now;
    }

    /// Records the batch of round trips that just ended.
    #[inline(never)]
    fn time_batch(&mut self) {
        let now = Instant::now();
        let ns = (now - self.stamp).as_nanos() as u64;
        let legs = self.io.op.legs();
        // Rounded to the nearest ns: a recorded mean is within half a ns
        // of the exact one, which the average is.
        let per = legs * self.in_batch;
        let t = ((ns + per / 2) / per).clamp(1, HIST_MAX_NS);
        self.hist.record_n(t, self.in_batch).expect("value within bounds");
        self.stamp = now;
        self.in_batch = 0;
        if self.deadline.is_some_and(|d| now >= d) && !self.announced {
            // One round trip more, once the peer knows it is the last.
            let n = self.seq + 1 - self.params.warmup_for(self.k);
            self.counts.announce(self.k, n);
            self.announced = true;
        }
    }

    /// Duration mode: whether the size's count is still to reach the peer.
    /// Once it has, the last round trip may go: the wait is left out of
    /// the measured time.
    fn awaiting_count(&mut self) -> bool {
        if !self.announced || self.end != UNKNOWN {
            return false;
        }
        if !self.counts.confirmed(self.k) {
            return true;
        }
        let now = Instant::now();
        self.start += now - self.stamp;
        self.stamp = now;
        self.end = self.seq + 1;
        false
    }

    fn begin_iteration(&mut self) {
        self.in_flight = true;
        self.unposted = self.posts;
        self.pending = self.completes;
        if self.params.verify {
            let (op, size, seq) = (self.io.op, self.size, self.seq);
            self.io.fill_in(self.local.id, 0, size, |buf| op::prepare_local(op, buf, size, seq));
        }
    }

    /// Starts the fence that ends a one-sided size: a control message
    /// there and back, untimed.
    fn begin_fence(&mut self) {
        self.fencing = true;
        self.in_flight = true;
        self.unposted = OURS | REPLY;
        self.pending = OURS | REPLY;
    }

    #[inline]
    fn complete(&mut self, c: &Completion) -> Result<(), RunError> {
        check_status(c)?;
        if self.fencing && matches!(c.op, Op::Recv | Op::Send) {
            if c.op == Op::Recv {
                check_len(c, CTL_LEN)?;
                self.pending &= !REPLY;
            } else {
                self.pending &= !OURS;
            }
        } else if c.op == Op::Recv || c.op == Op::RemoteWrite {
            // The reply: a message or a write's notice.
            if c.op == Op::Recv {
                check_len(c, self.size)?;
            } else {
                check_cq_data(c, self.seq)?;
            }
            if self.params.verify {
                self.check_reply()?;
            }
            self.pending &= !REPLY;
        } else {
            // Ours: a send, a write, or a read or an atomic, whose data
            // landed here.
            if self.params.verify {
                self.check_landed(c.op)?;
            }
            self.pending &= !OURS;
        }
        Ok(())
    }

    /// With `-c`: checks the reply to iteration `seq`.
    fn check_reply(&mut self) -> Result<(), RunError> {
        let (size, seq) = (self.size, self.seq);
        op::verify(self.io.copy_out(self.rx.id, 0, size), size, seq)
    }

    /// With `-c`: checks what a read or an atomic (`op`) brought back.
    fn check_landed(&mut self, op: Op) -> Result<(), RunError> {
        let (size, seq) = (self.size, self.seq);
        match op {
            Op::Read => op::verify_read(self.io.copy_out(self.rx.id, 0, size), size, seq, 0),
            Op::Atomic => {
                let got = op::fetched(self.io.copy_out(self.rx.id, 0, 8));
                op::verify_fetched(got, seq, self.params.total(self.k), true)
            }
            _ => Ok(()),
        }
    }

    /// Posts what the exchange has not posted yet; whether anything went.
    #[inline(always)]
    fn post_unposted(&mut self) -> Result<bool, RunError> {
        let mut worked = false;
        // The message leaves first and the receive for its reply is posted
        // while it travels: off the round trip's critical path. The reply
        // takes a round trip, far longer than posting a receive; were it
        // ever first, it would wait as unexpected and still match.
        if self.unposted & OURS != 0 {
            let sent = if self.fencing {
                self.io.send_ctl()?
            } else {
                self.io.post(Span::new(&self.local, 0, self.size), 0, self.seq, true)
            };
            if sent {
                self.io.flush();
                self.unposted &= !OURS;
                worked = true;
            }
        }
        if self.unposted & REPLY != 0 {
            let posted = if self.fencing {
                self.io.recv_ctl()?
            } else {
                self.io.recv(Span::new(&self.rx, 0, self.size), self.seq)
            };
            if posted {
                self.unposted &= !REPLY;
                worked = true;
            }
        }
        self.io.failure()?;
        Ok(worked)
    }
}

impl<D: Device> ActiveSide for Initiator<D> {
    fn start(&mut self, k: usize) {
        self.k = k;
        self.size = self.params.sizes[k];
        self.seq = 0;
        self.end = self.params.warmup_for(k);
        self.measuring = false;
        self.fencing = false;
        self.in_flight = false;
        self.warm_ns.clear();
        self.stamp = Instant::now();
    }

    fn start_measured(&mut self) {
        self.end = match self.counts.measured(self.k) {
            UNKNOWN => UNKNOWN,
            n => self.seq + n,
        };
        self.announced = false;
        self.measuring = true;
        // The fastest warmup round trip: the handshake and preemptions
        // only ever slow one down.
        let fastest = self.warm_ns.iter().copied().min();
        let batch = fastest.map_or(1, |ns| batch_for(ns as f64, clock_cost_ns()));
        // A short run keeps MIN_SAMPLES batches, so that its percentiles
        // are of more than one or two means.
        let samples_allow = match self.end {
            UNKNOWN => batch,
            end => ((end - self.seq) / MIN_SAMPLES).max(1),
        };
        self.batch = batch.min(samples_allow);
        self.in_batch = 0;
        self.hist.reset();
        self.start = Instant::now();
        self.stamp = self.start;
        self.deadline = self.params.duration().map(|d| self.start + d);
    }

    #[inline]
    fn step(&mut self) -> Result<Phase, RunError> {
        let mut worked = self.io.progress();
        while let Some(c) = self.io.poll_cq() {
            worked = true;
            self.complete(&c)?;
        }
        self.io.failure()?;
        if self.in_flight && self.pending == 0 {
            if self.fencing {
                return Ok(Phase::Done);
            }
            self.finish_iteration();
        }
        if !self.in_flight {
            if self.awaiting_count() {
                return Ok(worked.into());
            }
            if self.seq < self.end {
                self.begin_iteration();
            } else if self.measuring && !self.io.op.echoes() {
                // The target checks and readies its buffer.
                self.begin_fence();
            } else {
                return Ok(Phase::Done);
            }
        }
        if self.unposted != 0 {
            worked |= self.post_unposted()?;
        }
        Ok(worked.into())
    }

    fn progress(&self) -> (u64, u64) {
        let warmup = if self.measuring { self.params.warmup_for(self.k) } else { 0 };
        let total = if self.end == UNKNOWN { 0 } else { self.end - warmup };
        (self.seq - warmup, total)
    }

    fn sample(&mut self, _busy_pct: f64) -> Sample {
        let iterations = self.seq - self.params.warmup_for(self.k);
        Sample::Pingpong(PingpongSample {
            bytes: self.size,
            iterations,
            hist: self.hist.clone(),
            total_ns: (self.stamp - self.start).as_nanos() as u64,
            batch: self.batch,
            legs: self.io.op.legs(),
        })
    }
}

/// The side that sends (or writes) every message back.
#[derive(Debug)]
pub struct Responder<D: Device> {
    io: Io<D>,
    rx: Mr,
    params: Params,
    /// The next message to receive: size index and iteration, and the
    /// size's iterations ([`UNKNOWN`] until a duration run's count comes).
    k: usize,
    i: u64,
    total: u64,
    /// The size of message `i` (0 once every size is done).
    size: u64,
    counts: Arc<Counts>,
    recv_posted: bool,
    /// The echo to send: its size and sequence number.
    echo: Option<(u64, u64)>,
    sends_posted: u64,
    sends_done: u64,
}

impl<D: Device> Responder<D> {
    pub fn new(
        mut io: Io<D>,
        params: &Params,
        counts: Arc<Counts>,
    ) -> Result<Responder<D>, RunError> {
        let rx = io.register(params.max_size())?;
        Ok(Responder {
            io,
            rx,
            params: params.clone(),
            k: 0,
            i: 0,
            total: counts.total(params, 0),
            size: params.sizes.first().copied().unwrap_or(0),
            counts,
            recv_posted: false,
            echo: None,
            sends_posted: 0,
            sends_done: 0,
        })
    }

    /// Message `i` of the size arrived (a write's notice, with `-o
    /// write`): checks it and readies its echo.
    #[inline]
    fn take_message(&mut self, c: &Completion) -> Result<(), RunError> {
        let size = self.size;
        if c.op == Op::Recv {
            check_len(c, size)?;
        } else {
            check_cq_data(c, self.i)?;
        }
        if self.params.verify {
            op::verify(self.io.copy_out(self.rx.id, 0, size), size, self.i)?;
        }
        self.echo = Some((size, self.i));
        self.recv_posted = false;
        self.i += 1;
        if self.total == UNKNOWN {
            self.total = self.counts.total(&self.params, self.k);
        }
        if self.i == self.total {
            self.next_size();
        }
        Ok(())
    }

    fn next_size(&mut self) {
        self.k += 1;
        self.i = 0;
        (self.total, self.size) = match self.params.sizes.get(self.k) {
            Some(&size) => (self.counts.total(&self.params, self.k), size),
            None => (UNKNOWN, 0),
        };
    }
}

impl<D: Device> PassiveSide for Responder<D> {
    #[inline]
    fn step(&mut self) -> Result<bool, RunError> {
        // A message, or a write's notice; our echo's completion.
        const MESSAGE: Ops = Ops::of(&[Op::Recv, Op::RemoteWrite]);
        const ECHO: Ops = Ops::of(&[Op::Send, Op::Write]);
        let mut worked = self.io.progress();
        while let Some(c) = self.io.poll_cq() {
            worked = true;
            check_passive_status(&c, self.k == self.params.sizes.len())?;
            if MESSAGE.has(c.op) {
                self.take_message(&c)?;
            } else if ECHO.has(c.op) {
                self.sends_done += 1;
            }
        }
        self.io.failure()?;
        // The echo leaves first, then the receive for the next message is
        // posted while the echo travels (as the initiator does; a write
        // needs none: its CQ data tells of it). The echo goes from the
        // buffer the next message lands in: that message cannot come
        // before the echo has been read.
        if let Some((size, seq)) = self.echo
            && self.io.post(Span::new(&self.rx, 0, size), 0, seq, true)
        {
            self.io.flush();
            self.echo = None;
            self.sends_posted += 1;
            worked = true;
        }
        if !self.recv_posted && self.k < self.params.sizes.len() {
            let dst = Span::new(&self.rx, 0, self.size);
            self.recv_posted = self.io.op.is_one_sided() || self.io.recv(dst, 0);
            worked |= self.recv_posted;
        }
        self.io.failure()?;
        Ok(worked)
    }

    fn is_done(&self) -> bool {
        self.k == self.params.sizes.len()
            && self.echo.is_none()
            && self.sends_done == self.sends_posted
    }
}

impl_side!(Initiator, rx);
impl_side!(Responder, rx);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_only_when_the_clock_costs_over_a_quarter_percent() {
        assert_eq!(batch_for(8000.0, 20.0), 1);
        assert_eq!(batch_for(4000.0, 20.0), 2);
        assert_eq!(batch_for(200.0, 20.0), 64);
        assert_eq!(batch_for(0.0, 20.0), MAX_BATCH);
        assert!(clock_cost_ns() > 0.0);
    }
}

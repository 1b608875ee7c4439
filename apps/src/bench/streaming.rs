//! Streaming: the sender keeps `window` messages in flight, the receiver
//! keeps receives posted; when the receiver has a size's last message it
//! sends an 8-byte ack, which ends the sender's measurement (as fabtests'
//! bandwidth tests do), so the time covers delivery, not just posting.
//!
//! Without `-c` every message goes from, and lands in, the same buffer;
//! with it each message in flight has a buffer of its own and its own
//! pattern, checked on arrival.
//!
//! One-sided operations (`-o write|read|atomic`) keep `window` of them in
//! flight to the peer's buffer, a [`super::target::Target`]; as in
//! perftest's _bw tests, the completion of the initiator's last operation
//! ends the measurement. A fence then has the target check (with `-c`)
//! and ready its buffer before the next size. With `-c` each operation in
//! flight has its own slot, here and in the target: a write's pattern is
//! checked in the target at the end of the size, a read's on completion,
//! and the counter the fetch-adds hit by the target at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use efapoll::device::{Device, Mr};
use efapoll::endpoint::{Op, Span};

use super::counts::{Counts, UNKNOWN};
use super::op::{self, CTL_LEN, Io, OpKind, check_len, check_passive_status, check_status};
use super::report::StreamingSample;
use super::{ActiveSide, Params, PassiveSide, Phase, RunError, Sample};

/// Peak bandwidth is the best of intervals this long.
const PEAK_INTERVAL: Duration = Duration::from_millis(10);

/// The measuring side.
#[derive(Debug)]
pub struct Sender<D: Device> {
    io: Io<D>,
    /// Where operations go from (send, write) or land (read, atomic).
    src: Mr,
    params: Params,
    k: usize,
    size: u64,
    total: u64,
    window: u64,
    sent: u64,
    done: u64,
    /// Verifying: which buffers hold a message in flight, and the message
    /// whose pattern was last written (a send pushed back is retried
    /// without writing it again).
    slot_busy: Vec<bool>,
    filled: Option<u64>,
    /// Verifying: operations completed whose slots are still to free, and
    /// for reads and atomics to check (after the poll, which cannot reach
    /// the endpoint).
    completed: Vec<u64>,
    ack_posted: bool,
    ack_received: bool,
    /// One-sided: the fence that asks the target for the ack is out.
    fence_sent: bool,
    measuring: bool,
    start: Instant,
    done_at_start: u64,
    end: Instant,
    interval_start: Instant,
    interval_done: u64,
    checked_done: u64,
    peak: f64,
    counts: Arc<Counts>,
    /// Duration mode: when the measured phase's time is up; when the
    /// count was announced, and how long sending waited for the peer to
    /// have it (left out of the measured time).
    deadline: Option<Instant>,
    announced: Option<Instant>,
    waited: Duration,
}

impl<D: Device> Sender<D> {
    pub fn new(mut io: Io<D>, params: &Params, counts: Arc<Counts>) -> Result<Sender<D>, RunError> {
        let src = io.register(params.buffer_len(|s| params.window_for(s)))?;
        let now = Instant::now();
        Ok(Sender {
            io,
            src,
            params: params.clone(),
            k: 0,
            size: 0,
            total: 0,
            window: 1,
            sent: 0,
            done: 0,
            slot_busy: Vec::new(),
            filled: None,
            completed: Vec::new(),
            ack_posted: false,
            ack_received: false,
            fence_sent: false,
            measuring: false,
            start: now,
            done_at_start: 0,
            end: now,
            interval_start: now,
            interval_done: 0,
            checked_done: 0,
            peak: 0.0,
            counts,
            deadline: None,
            announced: None,
            waited: Duration::ZERO,
        })
    }

    /// The slot of operation `seq`.
    #[inline]
    fn slot(&self, seq: u64) -> u64 {
        if self.params.verify { seq % self.window } else { 0 }
    }

    fn track_peak(&mut self) {
        // A clock read per completion would cost as much as a small message.
        if self.done - self.checked_done < 64 && self.size < 64 << 10 {
            return;
        }
        self.checked_done = self.done;
        let now = Instant::now();
        if self.deadline.is_some_and(|d| now >= d) && self.announced.is_none() {
            self.announce(now);
        }
        let dt = now - self.interval_start;
        if dt >= PEAK_INTERVAL {
            let bytes = (self.done - self.interval_done) * self.size;
            self.peak = self.peak.max(bytes as f64 / dt.as_secs_f64());
            self.interval_start = now;
            self.interval_done = self.done;
        }
    }

    /// Duration mode, time up: fixes the size's count and tells the peer.
    /// A receiver keeps up to its depth of receives posted past what it
    /// got, so a send run ends that many messages later, sent once the
    /// receiver knows (it posts none past the count); a one-sided run ends
    /// with what is out.
    fn announce(&mut self, now: Instant) {
        self.total = match self.io.op.is_one_sided() {
            true => self.sent,
            false => self.sent + self.params.depth_for(self.size),
        };
        self.counts.announce(self.k, self.total - self.params.warmup_for(self.k));
        self.announced = Some(now);
        if self.done == self.total {
            self.end = now;
        }
    }

    /// Duration mode: whether sending waits for the peer to have the
    /// count.
    fn awaiting_count(&mut self) -> bool {
        let Some(at) = self.announced else { return false };
        if !self.counts.confirmed(self.k) {
            return true;
        }
        if self.waited.is_zero() && !self.io.op.is_one_sided() {
            self.waited = at.elapsed().max(Duration::from_nanos(1));
        }
        false
    }

    /// Takes the completions waiting; whether there were any. `NOTING`:
    /// a one-sided run's last one ends the measurement (as perftest's _bw
    /// tests), and with `-c` each notes its slot. Without, the poll loop
    /// does nothing that could reach the endpoint, not even a call on a
    /// path it never takes, and keeps the queue in registers.
    #[inline(always)]
    fn poll<const NOTING: bool>(&mut self) -> Result<bool, RunError> {
        let (local_op, total, verify) = (self.io.op.local_op(), self.total, self.params.verify);
        let last_ends = self.io.op.is_one_sided();
        let (end, completed) = (&mut self.end, &mut self.completed);
        let (mut done, mut acked) = (self.done, false);
        let polled = self.io.drain_cq(|c| {
            check_status(c)?;
            if c.op == local_op {
                done += 1;
                if NOTING && last_ends && done == total {
                    *end = Instant::now();
                }
                if NOTING && verify {
                    completed.push(c.ctx);
                }
            } else if c.op == Op::Recv {
                check_len(c, CTL_LEN)?;
                acked = true;
            }
            // Else the fence's.
            Ok::<(), RunError>(())
        });
        self.done = done;
        self.ack_received |= acked;
        let polled = polled?;
        self.io.failure()?;
        Ok(polled)
    }

    /// With `-c`: frees the slots of the operations that completed, once
    /// what the reads and atomics among them brought back is checked.
    fn free_slots(&mut self) -> Result<(), RunError> {
        let (size, op) = (self.size, self.io.op);
        for k in 0..self.completed.len() {
            let seq = self.completed[k];
            let slot = self.slot(seq);
            if op.lands_here() {
                let got = self.io.copy_out(self.src.id, slot * size, size);
                match op {
                    OpKind::Read => op::verify_read(got, size, seq, slot)?,
                    // No more adds than were posted (the count may not be
                    // fixed yet).
                    _ => op::verify_fetched(op::fetched(got), seq, self.sent, false)?,
                }
            }
            self.slot_busy[slot as usize] = false;
        }
        self.completed.clear();
        Ok(())
    }

    /// Posts operations while the window and `limit` allow; whether any
    /// went.
    // Out of line: the posting loop has the registers to itself, not
    // spilling around the inlined send what the step keeps live.
    #[inline(never)]
    fn post_window(&mut self, limit: u64) -> Result<bool, RunError> {
        if self.params.verify {
            return self.post_checked(limit);
        }
        // Every operation from (or into) the buffer's start, and every
        // fetch-add to the one counter: no slot to choose or keep.
        let end = limit.min(self.done + self.window);
        let span = Span::new(&self.src, 0, self.size);
        let first = self.sent;
        let mut seq = first;
        while seq < end && self.io.post_streamed(span, 0, seq) {
            seq += 1;
        }
        self.sent = seq;
        self.done += self.io.take_injected();
        self.io.failure()?;
        Ok(seq > first)
    }

    /// [`Sender::post_window`] with `-c`: each operation in flight has its
    /// slot, filled with its pattern before it goes.
    fn post_checked(&mut self, limit: u64) -> Result<bool, RunError> {
        let (size, first) = (self.size, self.sent);
        while self.sent < limit && self.sent - self.done < self.window {
            let seq = self.sent;
            let slot = self.slot(seq);
            if self.slot_busy[slot as usize] {
                break;
            }
            if self.filled != Some(seq) {
                let at = (slot * size) as usize;
                let kind = self.io.op;
                self.io.fill_in(self.src.id, at as u64, size, |buf| {
                    op::prepare_local(kind, buf, size, seq)
                });
                self.filled = Some(seq);
            }
            // Every fetch-add hits the one counter, as in ib_atomic_bw.
            let remote_at = if self.io.op == OpKind::Atomic { 0 } else { slot * size };
            if !self.io.post_streamed(Span::new(&self.src, slot * size, size), remote_at, seq) {
                break;
            }
            // A message sent by inject is done: its bytes were copied.
            match self.io.take_injected() {
                0 => self.slot_busy[slot as usize] = true,
                n => self.done += n,
            }
            self.sent += 1;
        }
        self.io.failure()?;
        Ok(self.sent > first)
    }
}

impl<D: Device> ActiveSide for Sender<D> {
    fn start(&mut self, k: usize) {
        self.k = k;
        self.size = self.params.sizes[k];
        self.total = self.counts.total(&self.params, k);
        self.window = self.params.window_for(self.size);
        self.sent = 0;
        self.done = 0;
        self.slot_busy = vec![false; if self.params.verify { self.window as usize } else { 0 }];
        self.filled = None;
        // No more complete at once than are in flight: no allocation in
        // the poll.
        self.completed = Vec::with_capacity(self.slot_busy.len());
        self.ack_posted = false;
        self.ack_received = false;
        self.fence_sent = false;
        self.measuring = false;
    }

    fn start_measured(&mut self) {
        self.measuring = true;
        self.start = Instant::now();
        self.done_at_start = self.done;
        self.interval_start = self.start;
        self.interval_done = self.done;
        self.checked_done = self.done;
        self.peak = 0.0;
        self.deadline = self.params.duration().map(|d| self.start + d);
        self.announced = None;
        self.waited = Duration::ZERO;
    }

    #[inline]
    fn step(&mut self) -> Result<Phase, RunError> {
        let mut worked = self.io.progress();
        let before = self.done;
        // A two-sided run's completions, unchecked, are only counted.
        worked |= match self.params.verify || self.io.op.is_one_sided() {
            false => self.poll::<false>()?,
            true => self.poll::<true>()?,
        };
        if !self.completed.is_empty() {
            self.free_slots()?;
        }
        if !self.ack_posted {
            self.ack_posted = self.io.recv_ctl()?;
            worked |= self.ack_posted;
        }
        // The warmup posts only its own operations, so that the measured
        // phase times exactly the measured ones (a window may outnumber
        // them).
        let warmup = self.params.warmup_for(self.k).min(self.total);
        let limit = if !self.measuring {
            warmup
        } else if self.awaiting_count() {
            self.sent
        } else {
            self.total
        };
        worked |= self.post_window(limit)?;
        if !self.measuring {
            return Ok(if self.done >= warmup { Phase::Done } else { worked.into() });
        }
        if self.done > before {
            self.track_peak();
        }
        if self.done < self.total {
            return Ok(worked.into());
        }
        // One-sided: a fence asks the target for the ack (which checks
        // against the count: it must have it first).
        if self.io.op.is_one_sided() && !self.fence_sent && self.counts.confirmed(self.k) {
            self.fence_sent = self.io.send_ctl()?;
            worked |= self.fence_sent;
        }
        if !self.ack_received {
            return Ok(worked.into());
        }
        if !self.io.op.is_one_sided() {
            // The receiver's ack says the last message was delivered.
            self.end = Instant::now();
        }
        Ok(Phase::Done)
    }

    fn progress(&self) -> (u64, u64) {
        let warmup = self.params.warmup_for(self.k);
        let total = if self.total == UNKNOWN { 0 } else { self.total - warmup };
        (self.done.saturating_sub(warmup), total)
    }

    fn sample(&mut self, busy_pct: f64) -> Sample {
        let elapsed = (self.end - self.start).saturating_sub(self.waited);
        let elapsed_ns = (elapsed.as_nanos() as u64).max(1);
        let messages = self.total - self.done_at_start;
        let avg = (messages * self.size) as f64 / (elapsed_ns as f64 / 1e9);
        // A run shorter than one interval has no peak but its average.
        let peak = if self.peak > 0.0 { self.peak.max(avg) } else { avg };
        Sample::Streaming(StreamingSample {
            bytes: self.size,
            iterations: self.total - self.params.warmup_for(self.k),
            window: self.window,
            messages,
            elapsed_ns,
            peak_bytes_per_s: peak,
            busy_pct,
        })
    }
}

/// The receiving side of send and tagged runs.
#[derive(Debug)]
pub struct Receiver<D: Device> {
    io: Io<D>,
    dst: Mr,
    params: Params,
    k: usize,
    size: u64,
    total: u64,
    depth: u64,
    posted: u64,
    received: u64,
    /// Verifying: which buffers a posted receive owns (messages of one
    /// size may complete out of order, medium ones segment by segment),
    /// and the messages arrived that are still to check (after the poll,
    /// which cannot reach the endpoint).
    slot_busy: Vec<bool>,
    arrived: Vec<u64>,
    sends_posted: u64,
    sends_done: u64,
    counts: Arc<Counts>,
}

impl<D: Device> Receiver<D> {
    pub fn new(
        mut io: Io<D>,
        params: &Params,
        counts: Arc<Counts>,
    ) -> Result<Receiver<D>, RunError> {
        let dst = io.register(params.buffer_len(|s| params.depth_for(s)))?;
        let mut r = Receiver {
            io,
            dst,
            params: params.clone(),
            k: 0,
            size: 0,
            total: 0,
            depth: 1,
            posted: 0,
            received: 0,
            slot_busy: Vec::new(),
            arrived: Vec::new(),
            sends_posted: 0,
            sends_done: 0,
            counts,
        };
        r.start_size(0);
        Ok(r)
    }

    fn start_size(&mut self, k: usize) {
        self.k = k;
        if k == self.params.sizes.len() {
            return;
        }
        self.size = self.params.sizes[k];
        self.total = self.counts.total(&self.params, k);
        self.depth = self.params.depth_for(self.size);
        self.posted = 0;
        self.received = 0;
        self.slot_busy = vec![false; if self.params.verify { self.depth as usize } else { 0 }];
        self.arrived = Vec::with_capacity(self.slot_busy.len());
    }

    /// Where message `seq` lands.
    #[inline]
    fn slot(&self, seq: u64) -> u64 {
        if self.params.verify { seq % self.depth } else { 0 }
    }

    /// Takes the completions waiting; whether there were any. `VERIFY`
    /// (`-c`): each message notes its slot to check; without, the poll
    /// loop does nothing that could reach the endpoint and keeps the queue
    /// in registers (see `Sender::poll`).
    #[inline(always)]
    fn poll<const VERIFY: bool>(&mut self) -> Result<bool, RunError> {
        let (size, all_received) = (self.size, self.k == self.params.sizes.len());
        let arrived = &mut self.arrived;
        let (mut received, mut sends_done) = (self.received, self.sends_done);
        let polled = self.io.drain_cq(|c| {
            check_passive_status(c, all_received)?;
            if c.op == Op::Recv {
                check_len(c, size)?;
                if VERIFY {
                    arrived.push(c.ctx);
                }
                received += 1;
            }
            // Added, not branched to: two counts behind one test end up
            // in memory.
            sends_done += u64::from(c.op == Op::Send);
            Ok::<(), RunError>(())
        });
        (self.received, self.sends_done) = (received, sends_done);
        let polled = polled?;
        self.io.failure()?;
        Ok(polled)
    }

    /// With `-c`: checks the messages that arrived in their slots, and
    /// frees the slots.
    fn check_arrived(&mut self) -> Result<(), RunError> {
        let size = self.size;
        for k in 0..self.arrived.len() {
            let seq = self.arrived[k];
            let slot = self.slot(seq);
            op::verify(self.io.copy_out(self.dst.id, slot * size, size), size, seq)?;
            self.slot_busy[slot as usize] = false;
        }
        self.arrived.clear();
        Ok(())
    }

    /// Posts receives up to the depth past what arrived, and no further
    /// than the size's count; whether any was posted.
    #[inline(always)]
    fn post_depth(&mut self) -> Result<bool, RunError> {
        let end = self.total.min(self.received + self.depth);
        let first = self.posted;
        if self.params.verify {
            while self.posted < end {
                let slot = self.slot(self.posted);
                if self.slot_busy[slot as usize] {
                    break;
                }
                let span = Span::new(&self.dst, slot * self.size, self.size);
                if !self.io.recv(span, self.posted) {
                    break;
                }
                self.slot_busy[slot as usize] = true;
                self.posted += 1;
            }
        } else if !self.io.keeps_receive(self.size) {
            // Taken at once: nothing to post.
            self.posted = end;
        } else {
            // Every message lands at the buffer's start.
            let span = Span::new(&self.dst, 0, self.size);
            let mut seq = first;
            while seq < end && self.io.recv(span, seq) {
                seq += 1;
            }
            self.posted = seq;
        }
        self.io.failure()?;
        Ok(self.posted > first)
    }
}

impl<D: Device> PassiveSide for Receiver<D> {
    #[inline]
    fn step(&mut self) -> Result<bool, RunError> {
        let mut worked = self.io.progress();
        worked |= match self.params.verify {
            false => self.poll::<false>()?,
            true => self.poll::<true>()?,
        };
        if !self.arrived.is_empty() {
            self.check_arrived()?;
        }
        if self.k == self.params.sizes.len() {
            return Ok(worked);
        }
        if self.total == UNKNOWN {
            // Duration mode: the sender sends the count before it sends
            // past our depth, so none is posted beyond it.
            self.total = self.counts.total(&self.params, self.k);
        }
        worked |= self.post_depth()?;
        if self.received == self.total && self.io.send_ctl()? {
            self.sends_posted += 1;
            self.start_size(self.k + 1);
            worked = true;
        }
        Ok(worked)
    }

    fn is_done(&self) -> bool {
        self.k == self.params.sizes.len() && self.sends_done == self.sends_posted
    }
}

impl_side!(Sender, src);
impl_side!(Receiver, dst);

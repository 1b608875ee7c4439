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
use efapoll::endpoint::{Completion, Op, Span};

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

    /// One of our data operations completed; with `-c`, checks what a read
    /// or an atomic brought back.
    fn complete_op(&mut self, c: &Completion) -> Result<(), RunError> {
        self.done += 1;
        if self.done == self.total && self.io.op.is_one_sided() {
            // As perftest's _bw tests: the last completion ends the
            // measurement.
            self.end = Instant::now();
        }
        if !self.params.verify {
            return Ok(());
        }
        let (size, slot) = (self.size, self.slot(c.ctx));
        let at = (slot * size) as usize;
        let op = self.io.op;
        let got = self.io.copy_out(self.src.id, at as u64, size);
        match op {
            OpKind::Read => op::verify_read(got, size, c.ctx, slot)?,
            // No more adds than were posted (the count may not be fixed yet).
            OpKind::Atomic => op::verify_fetched(op::fetched(got), c.ctx, self.sent, false)?,
            _ => {}
        }
        self.slot_busy[slot as usize] = false;
        Ok(())
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
        while let Some(ref c) = self.io.poll_cq() {
            worked = true;
            check_status(c)?;
            match c.op {
                op if op == self.io.op.local_op() => self.complete_op(c)?,
                Op::Recv => {
                    check_len(c, CTL_LEN)?;
                    self.ack_received = true;
                }
                // The fence's.
                _ => {}
            }
        }
        self.io.failure()?;
        if !self.ack_posted {
            self.ack_posted = self.io.recv_ctl()?;
            worked |= self.ack_posted;
        }
        let size = self.size;
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
        while self.sent < limit && self.sent - self.done < self.window {
            let seq = self.sent;
            let slot = self.slot(seq);
            if self.params.verify {
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
            }
            // Every fetch-add hits the one counter, as in ib_atomic_bw.
            let remote_at = if self.io.op == OpKind::Atomic { 0 } else { slot * size };
            if !self.io.post(Span::new(&self.src, slot * size, size), remote_at, seq, false)? {
                break;
            }
            if self.params.verify {
                self.slot_busy[slot as usize] = true;
            }
            self.sent += 1;
            worked = true;
        }
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
    /// size may complete out of order, medium ones segment by segment).
    slot_busy: Vec<bool>,
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
    }

    /// Where message `seq` lands.
    #[inline]
    fn slot(&self, seq: u64) -> u64 {
        if self.params.verify { seq % self.depth } else { 0 }
    }
}

impl<D: Device> PassiveSide for Receiver<D> {
    #[inline]
    fn step(&mut self) -> Result<bool, RunError> {
        let mut worked = self.io.progress();
        while let Some(ref c) = self.io.poll_cq() {
            worked = true;
            check_passive_status(c, self.k == self.params.sizes.len())?;
            match c.op {
                Op::Recv => {
                    check_len(c, self.size)?;
                    if self.params.verify {
                        let slot = self.slot(c.ctx);
                        let at = (slot * self.size) as usize;
                        let got = self.io.copy_out(self.dst.id, at as u64, self.size);
                        op::verify(got, self.size, c.ctx)?;
                        self.slot_busy[slot as usize] = false;
                    }
                    self.received += 1;
                }
                Op::Send => self.sends_done += 1,
                _ => {}
            }
        }
        self.io.failure()?;
        if self.k == self.params.sizes.len() {
            return Ok(worked);
        }
        if self.total == UNKNOWN {
            // Duration mode: the sender sends the count before it sends
            // past our depth, so none is posted beyond it.
            self.total = self.counts.total(&self.params, self.k);
        }
        while self.posted < self.total && self.posted - self.received < self.depth {
            let slot = self.slot(self.posted);
            if self.params.verify && self.slot_busy[slot as usize] {
                break;
            }
            let span = Span::new(&self.dst, slot * self.size, self.size);
            if !self.io.recv(span, self.posted)? {
                break;
            }
            if self.params.verify {
                self.slot_busy[slot as usize] = true;
            }
            self.posted += 1;
            worked = true;
        }
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

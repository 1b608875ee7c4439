//! Streaming: the sender keeps `window` messages in flight, the receiver
//! keeps receives posted; when the receiver has a size's last message it
//! sends an 8-byte ack, which ends the sender's measurement (as fabtests'
//! bandwidth tests do), so the time covers delivery, not just posting.
//!
//! Without `-c` every message goes from, and lands in, the same buffer;
//! with it each message in flight has a buffer of its own and its own
//! pattern, checked on arrival.

use std::time::{Duration, Instant};

use efapoll::device::{Access, Device, Mr};
use efapoll::endpoint::{Op, Span};

use super::op::{self, Io, check_len, check_status};
use super::report::StreamingSample;
use super::{ActiveSide, Params, PassiveSide, Phase, RunError, Sample};

/// Peak bandwidth is the best of intervals this long.
const PEAK_INTERVAL: Duration = Duration::from_millis(10);

const ACK_LEN: u64 = 8;

fn register<D: Device>(io: &mut Io<D>, len: u64) -> Result<Mr, RunError> {
    io.ep
        .register(len.max(8), Access::REMOTE_READ | Access::REMOTE_WRITE)
        .map_err(|e| RunError::Setup(format!("registering {len} bytes: {e}")))
}

/// Bytes of buffers for `per_size(size)` messages of each size.
fn buffer_len(params: &Params, per_size: impl Fn(u64) -> u64) -> u64 {
    if !params.verify {
        return params.max_size();
    }
    params.sizes.iter().map(|&s| per_size(s) * s).max().unwrap_or(0)
}

/// The measuring side.
#[derive(Debug)]
pub struct Sender<D: Device> {
    io: Io<D>,
    src: Mr,
    ack: Mr,
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
    measuring: bool,
    start: Instant,
    done_at_start: u64,
    end: Instant,
    interval_start: Instant,
    interval_done: u64,
    checked_done: u64,
    peak: f64,
}

impl<D: Device> Sender<D> {
    pub fn new(mut io: Io<D>, params: &Params) -> Result<Sender<D>, RunError> {
        let src = register(&mut io, buffer_len(params, |s| params.window_for(s)))?;
        let ack = register(&mut io, ACK_LEN)?;
        let now = Instant::now();
        Ok(Sender {
            io,
            src,
            ack,
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
            measuring: false,
            start: now,
            done_at_start: 0,
            end: now,
            interval_start: now,
            interval_done: 0,
            checked_done: 0,
            peak: 0.0,
        })
    }

    fn data_mr(&self) -> Mr {
        self.src
    }

    /// Where message `seq` goes from.
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
        let dt = now - self.interval_start;
        if dt >= PEAK_INTERVAL {
            let bytes = (self.done - self.interval_done) * self.size;
            self.peak = self.peak.max(bytes as f64 / dt.as_secs_f64());
            self.interval_start = now;
            self.interval_done = self.done;
        }
    }
}

impl<D: Device> ActiveSide for Sender<D> {
    fn start(&mut self, k: usize) {
        self.k = k;
        self.size = self.params.sizes[k];
        self.total = self.params.total(k);
        self.window = self.params.window_for(self.size);
        self.sent = 0;
        self.done = 0;
        self.slot_busy = vec![false; if self.params.verify { self.window as usize } else { 0 }];
        self.filled = None;
        self.ack_posted = false;
        self.ack_received = false;
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
    }

    #[inline]
    fn step(&mut self) -> Result<Phase, RunError> {
        let mut worked = self.io.ep.progress();
        let before = self.done;
        while let Some(c) = self.io.ep.poll_cq() {
            worked = true;
            check_status(&c)?;
            match c.op {
                Op::Send => {
                    self.done += 1;
                    if self.params.verify {
                        self.slot_busy[(c.ctx % self.window) as usize] = false;
                    }
                }
                Op::Recv => {
                    check_len(&c, ACK_LEN)?;
                    self.ack_received = true;
                }
                _ => {}
            }
        }
        if !self.ack_posted {
            self.ack_posted = self.io.recv(Span::new(&self.ack, 0, ACK_LEN), 0)?;
            worked |= self.ack_posted;
        }
        let size = self.size;
        while self.sent < self.total && self.sent - self.done < self.window {
            let seq = self.sent;
            let slot = self.slot(seq);
            if self.params.verify {
                if self.slot_busy[slot as usize] {
                    break;
                }
                if self.filled != Some(seq) {
                    let at = (slot * size) as usize;
                    let buf = &mut self.io.ep.mem_mut(self.src.id)[at..at + size as usize];
                    op::fill(buf, op::seed(size, seq));
                    self.filled = Some(seq);
                }
            }
            if !self.io.send(Span::new(&self.src, slot * size, size), seq)? {
                break;
            }
            if self.params.verify {
                self.slot_busy[slot as usize] = true;
            }
            self.sent += 1;
            worked = true;
        }
        if !self.measuring {
            let warm = self.done >= self.params.warmup_for(self.k).min(self.total);
            return Ok(if warm { Phase::Done } else { worked.into() });
        }
        if self.done > before {
            self.track_peak();
        }
        if self.ack_received && self.done == self.total {
            self.end = Instant::now();
            return Ok(Phase::Done);
        }
        Ok(worked.into())
    }

    fn progress(&self) -> (u64, u64) {
        let warmup = self.params.warmup_for(self.k);
        (self.done.saturating_sub(warmup), self.total - warmup)
    }

    fn sample(&mut self, busy_pct: f64) -> Sample {
        let elapsed_ns = ((self.end - self.start).as_nanos() as u64).max(1);
        let messages = self.total - self.done_at_start;
        let avg = (messages * self.size) as f64 / (elapsed_ns as f64 / 1e9);
        // A run shorter than one interval has no peak but its average.
        let peak = if self.peak > 0.0 { self.peak.max(avg) } else { avg };
        Sample::Streaming(StreamingSample {
            bytes: self.size,
            iterations: self.params.iterations[self.k],
            window: self.window,
            messages,
            elapsed_ns,
            peak_bytes_per_s: peak,
            busy_pct,
        })
    }
}

/// The receiving side.
#[derive(Debug)]
pub struct Receiver<D: Device> {
    io: Io<D>,
    dst: Mr,
    ack: Mr,
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
}

impl<D: Device> Receiver<D> {
    pub fn new(mut io: Io<D>, params: &Params) -> Result<Receiver<D>, RunError> {
        let dst = register(&mut io, buffer_len(params, |s| params.depth_for(s)))?;
        let ack = register(&mut io, ACK_LEN)?;
        let mut r = Receiver {
            io,
            dst,
            ack,
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
        };
        r.start_size(0);
        Ok(r)
    }

    fn data_mr(&self) -> Mr {
        self.dst
    }

    fn start_size(&mut self, k: usize) {
        self.k = k;
        if k == self.params.sizes.len() {
            return;
        }
        self.size = self.params.sizes[k];
        self.total = self.params.total(k);
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
        let mut worked = self.io.ep.progress();
        while let Some(c) = self.io.ep.poll_cq() {
            worked = true;
            check_status(&c)?;
            match c.op {
                Op::Recv => {
                    check_len(&c, self.size)?;
                    if self.params.verify {
                        let slot = self.slot(c.ctx);
                        let at = (slot * self.size) as usize;
                        let got = &self.io.ep.mem(self.dst.id)[at..at + self.size as usize];
                        op::verify(got, self.size, c.ctx)?;
                        self.slot_busy[slot as usize] = false;
                    }
                    self.received += 1;
                }
                Op::Send => self.sends_done += 1,
                _ => {}
            }
        }
        if self.k == self.params.sizes.len() {
            return Ok(worked);
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
        if self.received == self.total && self.io.send(Span::new(&self.ack, 0, ACK_LEN), 0)? {
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

impl_side!(Sender);
impl_side!(Receiver);

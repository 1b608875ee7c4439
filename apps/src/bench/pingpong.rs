//! Pingpong: the initiator sends a message, the responder sends it back;
//! half the round trip is the latency.
//!
//! Timing: one clock read per round trip, at its end (which is the next
//! one's start), so a round trip pays for one read. Where that read would
//! cost more than 1% of a round trip (sub-µs round trips on sim and shm
//! against the ~20 ns of `Instant::now`), the initiator times batches of
//! round trips instead, sized from the warmup's fastest round trip, and
//! records each batch's mean: the average stays exact, the percentiles are
//! of batch means (the batch is in the JSON rows and noted on stderr).

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::Instant;

use efapoll::device::{Access, Device, Mr};
use efapoll::endpoint::{Op, Span};
use hdrhistogram::Histogram;

use super::op::{self, Io, check_len, check_status};
use super::report::{HIST_MAX_NS, PingpongSample, new_histogram};
use super::{ActiveSide, Params, PassiveSide, Phase, RunError, Sample};

/// The most round trips one clock read may cover.
const MAX_BATCH: u64 = 1024;

fn register<D: Device>(io: &mut Io<D>, len: u64) -> Result<Mr, RunError> {
    // Remote rights: the one-sided operations will reach these buffers.
    io.ep
        .register(len.max(8), Access::REMOTE_READ | Access::REMOTE_WRITE)
        .map_err(|e| RunError::Setup(format!("registering {len} bytes: {e}")))
}

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
    while batch < MAX_BATCH && clock_ns * 100.0 > rtt_ns * batch as f64 {
        batch *= 2;
    }
    batch
}

/// The measuring side.
#[derive(Debug)]
pub struct Initiator<D: Device> {
    io: Io<D>,
    tx: Mr,
    rx: Mr,
    params: Params,
    k: usize,
    size: u64,
    /// Next iteration of the size (warmup included) and the phase's end.
    seq: u64,
    end: u64,
    in_flight: bool,
    recv_posted: bool,
    send_posted: bool,
    recv_done: bool,
    send_done: bool,
    measuring: bool,
    /// Warmup round trips, ns, to size the batch.
    warm_ns: Vec<u64>,
    batch: u64,
    in_batch: u64,
    stamp: Instant,
    start: Instant,
    hist: Histogram<u64>,
}

impl<D: Device> Initiator<D> {
    pub fn new(mut io: Io<D>, params: &Params) -> Result<Initiator<D>, RunError> {
        let tx = register(&mut io, params.max_size())?;
        let rx = register(&mut io, params.max_size())?;
        let now = Instant::now();
        Ok(Initiator {
            io,
            tx,
            rx,
            params: params.clone(),
            k: 0,
            size: 0,
            seq: 0,
            end: 0,
            in_flight: false,
            recv_posted: false,
            send_posted: false,
            recv_done: false,
            send_done: false,
            measuring: false,
            warm_ns: Vec::new(),
            batch: 1,
            in_batch: 0,
            stamp: now,
            start: now,
            hist: new_histogram(),
        })
    }

    /// The region the peer may reach.
    fn data_mr(&self) -> Mr {
        self.rx
    }

    fn finish_iteration(&mut self) {
        self.seq += 1;
        self.in_flight = false;
        if !self.measuring {
            let now = Instant::now();
            self.warm_ns.push((now - self.stamp).as_nanos() as u64);
            self.stamp = now;
            return;
        }
        self.in_batch += 1;
        if self.in_batch == self.batch || self.seq == self.end {
            let now = Instant::now();
            let ns = (now - self.stamp).as_nanos() as u64;
            let half = (ns / (2 * self.in_batch)).clamp(1, HIST_MAX_NS);
            self.hist.record_n(half, self.in_batch).expect("value within bounds");
            self.stamp = now;
            self.in_batch = 0;
        }
    }

    fn begin_iteration(&mut self) {
        self.in_flight = true;
        self.recv_posted = false;
        self.send_posted = false;
        self.recv_done = false;
        self.send_done = false;
        if self.params.verify {
            let size = self.size;
            op::fill(
                &mut self.io.ep.mem_mut(self.tx.id)[..size as usize],
                op::seed(size, self.seq),
            );
        }
    }
}

impl<D: Device> ActiveSide for Initiator<D> {
    fn start(&mut self, k: usize) {
        self.k = k;
        self.size = self.params.sizes[k];
        self.seq = 0;
        self.end = self.params.warmup_for(k);
        self.measuring = false;
        self.warm_ns.clear();
        self.stamp = Instant::now();
    }

    fn start_measured(&mut self) {
        self.end = self.seq + self.params.iterations[self.k];
        self.measuring = true;
        // The fastest warmup round trip: the handshake and preemptions
        // only ever slow one down.
        let fastest = self.warm_ns.iter().copied().min();
        self.batch = fastest.map_or(1, |ns| batch_for(ns as f64, clock_cost_ns()));
        self.in_batch = 0;
        self.hist.reset();
        self.start = Instant::now();
        self.stamp = self.start;
    }

    #[inline]
    fn step(&mut self) -> Result<Phase, RunError> {
        let mut worked = self.io.ep.progress();
        while let Some(c) = self.io.ep.poll_cq() {
            worked = true;
            check_status(&c)?;
            match c.op {
                Op::Recv => {
                    check_len(&c, self.size)?;
                    if self.params.verify {
                        let got = &self.io.ep.mem(self.rx.id)[..self.size as usize];
                        op::verify(got, self.size, self.seq)?;
                    }
                    self.recv_done = true;
                }
                Op::Send => self.send_done = true,
                _ => {}
            }
        }
        if self.in_flight && self.recv_done && self.send_done {
            self.finish_iteration();
        }
        if !self.in_flight {
            if self.seq >= self.end {
                return Ok(Phase::Done);
            }
            self.begin_iteration();
        }
        // The receive first, so the reply never arrives unexpected.
        if !self.recv_posted {
            self.recv_posted = self.io.recv(Span::new(&self.rx, 0, self.size), self.seq)?;
            worked |= self.recv_posted;
        }
        if self.recv_posted && !self.send_posted {
            self.send_posted = self.io.send(Span::new(&self.tx, 0, self.size), self.seq)?;
            worked |= self.send_posted;
        }
        Ok(worked.into())
    }

    fn progress(&self) -> (u64, u64) {
        let warmup = if self.measuring { self.params.warmup_for(self.k) } else { 0 };
        (self.seq - warmup, self.end - warmup)
    }

    fn sample(&mut self, _busy_pct: f64) -> Sample {
        let iterations = self.params.iterations[self.k];
        Sample::Pingpong(PingpongSample {
            bytes: self.size,
            iterations,
            hist: self.hist.clone(),
            total_ns: (self.stamp - self.start).as_nanos() as u64,
            batch: self.batch,
        })
    }
}

/// The side that sends every message back.
#[derive(Debug)]
pub struct Responder<D: Device> {
    io: Io<D>,
    rx: Mr,
    params: Params,
    /// The next message to receive: size index and iteration.
    k: usize,
    i: u64,
    recv_posted: bool,
    /// The echo to send, by size.
    echo: Option<u64>,
    sends_posted: u64,
    sends_done: u64,
}

impl<D: Device> Responder<D> {
    pub fn new(mut io: Io<D>, params: &Params) -> Result<Responder<D>, RunError> {
        let rx = register(&mut io, params.max_size())?;
        Ok(Responder {
            io,
            rx,
            params: params.clone(),
            k: 0,
            i: 0,
            recv_posted: false,
            echo: None,
            sends_posted: 0,
            sends_done: 0,
        })
    }

    fn data_mr(&self) -> Mr {
        self.rx
    }
}

impl<D: Device> PassiveSide for Responder<D> {
    #[inline]
    fn step(&mut self) -> Result<bool, RunError> {
        let mut worked = self.io.ep.progress();
        while let Some(c) = self.io.ep.poll_cq() {
            worked = true;
            check_status(&c)?;
            match c.op {
                Op::Recv => {
                    let size = self.params.sizes[self.k];
                    check_len(&c, size)?;
                    if self.params.verify {
                        let got = &self.io.ep.mem(self.rx.id)[..size as usize];
                        op::verify(got, size, self.i)?;
                    }
                    self.echo = Some(size);
                    self.recv_posted = false;
                    self.i += 1;
                    if self.i == self.params.total(self.k) {
                        self.k += 1;
                        self.i = 0;
                    }
                }
                Op::Send => self.sends_done += 1,
                _ => {}
            }
        }
        // The next receive before the echo, so the next message never
        // arrives unexpected. The echo is sent from the buffer the next
        // message lands in: that message cannot come before the echo has
        // been read.
        if !self.recv_posted && self.k < self.params.sizes.len() {
            let size = self.params.sizes[self.k];
            self.recv_posted = self.io.recv(Span::new(&self.rx, 0, size), 0)?;
            worked |= self.recv_posted;
        }
        if let Some(size) = self.echo
            && self.io.send(Span::new(&self.rx, 0, size), 0)?
        {
            self.echo = None;
            self.sends_posted += 1;
            worked = true;
        }
        Ok(worked)
    }

    fn is_done(&self) -> bool {
        self.k == self.params.sizes.len()
            && self.echo.is_none()
            && self.sends_done == self.sends_posted
    }
}

impl_side!(Initiator);
impl_side!(Responder);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_only_when_the_clock_costs_over_1_percent() {
        assert_eq!(batch_for(2000.0, 20.0), 1);
        assert_eq!(batch_for(1000.0, 20.0), 2);
        assert_eq!(batch_for(200.0, 20.0), 16);
        assert_eq!(batch_for(0.0, 20.0), MAX_BATCH);
        assert!(clock_cost_ns() > 0.0);
    }
}

//! The passive side of one-sided runs: the target of the initiator's
//! writes, reads and atomics (pingpong's reads and atomics, every
//! one-sided streaming op; pingpong's writes are echoed by its responder).
//!
//! The target's application takes no part in the operations. Before each
//! size it readies its buffer; at the end of the size the initiator's fence
//! arrives, the target checks what the operations left (with `-c`), readies
//! the next size and acks, so the initiator never starts a size on a buffer
//! not ready for it.
//!
//! Slot `j` of a size is `[j * size, (j + 1) * size)` of the buffer: with
//! `-c` the initiator's operation `seq` uses slot `seq % window`, and
//! without it slot 0.

use std::sync::Arc;

use efapoll::device::{Device, Mr};
use efapoll::endpoint::Op;

use super::counts::Counts;
use super::op::{self, ATOMIC_ADD, CTL_LEN, Io, OpKind, check_len, check_passive_status};
use super::{Params, PassiveSide, RunError};

#[derive(Debug)]
pub struct Target<D: Device> {
    io: Io<D>,
    buf: Mr,
    params: Params,
    /// The size whose fence is awaited.
    k: usize,
    fence_posted: bool,
    ack_due: bool,
    acks_posted: u64,
    acks_done: u64,
    /// Each size's count: known before its fence comes.
    counts: Arc<Counts>,
}

impl<D: Device> Target<D> {
    pub fn new(mut io: Io<D>, params: &Params, counts: Arc<Counts>) -> Result<Target<D>, RunError> {
        let buf = io.register(params.buffer_len(|s| params.window_for(s)))?;
        let mut t = Target {
            io,
            buf,
            params: params.clone(),
            k: 0,
            fence_posted: false,
            ack_due: false,
            acks_posted: 0,
            acks_done: 0,
            counts,
        };
        // Before the card goes out: the initiator may start at once.
        t.prepare(0);
        Ok(t)
    }

    /// Readies the buffer for size `k`: each slot holds its pattern for
    /// reads to check; the counter is zero.
    fn prepare(&mut self, k: usize) {
        let size = self.params.sizes[k];
        let buf = self.buf.id;
        match self.io.op {
            OpKind::Read if self.params.verify => {
                for j in 0..self.params.window_for(size) {
                    self.io.fill_in(buf, j * size, size, |b| op::fill(b, op::seed(size, j)));
                }
            }
            OpKind::Atomic => self.io.fill_in(buf, 0, 8, |b| b.fill(0)),
            _ => {}
        }
    }

    /// Checks, with `-c`, what the operations of size `k` left: each slot
    /// written holds its last write's pattern; the counter holds every add.
    fn check(&mut self, k: usize) -> Result<(), RunError> {
        if !self.params.verify {
            return Ok(());
        }
        let (size, total) = (self.params.sizes[k], self.counts.total(&self.params, k));
        let buf = self.buf.id;
        match self.io.op {
            OpKind::Write => {
                let window = self.params.window_for(size);
                for j in 0..window.min(total) {
                    // The last operation on slot j.
                    let last = j + (total - 1 - j) / window * window;
                    let slot = self.io.copy_out(buf, j * size, size);
                    if let Some(bad) = op::check(slot, op::seed(size, last)) {
                        return Err(RunError::Verify(format!(
                            "write {last} of {size} bytes did not land whole: the target's slot \
                             differs at byte {bad}"
                        )));
                    }
                }
            }
            OpKind::Atomic => {
                let got = op::fetched(self.io.copy_out(buf, 0, 8));
                let want = total.wrapping_mul(ATOMIC_ADD);
                if got != want {
                    return Err(RunError::Verify(format!(
                        "the target's counter holds {got:#x} after {total} fetch-adds of \
                         {ATOMIC_ADD:#x}; expected {want:#x}"
                    )));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl<D: Device> PassiveSide for Target<D> {
    #[inline]
    fn step(&mut self) -> Result<bool, RunError> {
        let mut worked = self.io.progress();
        while let Some(c) = self.io.poll_cq() {
            worked = true;
            check_passive_status(&c, self.k == self.params.sizes.len())?;
            match c.op {
                Op::Recv => {
                    check_len(&c, CTL_LEN)?;
                    self.check(self.k)?;
                    self.k += 1;
                    if self.k < self.params.sizes.len() {
                        self.prepare(self.k);
                    }
                    self.fence_posted = false;
                    self.ack_due = true;
                }
                Op::Send => self.acks_done += 1,
                _ => {}
            }
        }
        self.io.failure()?;
        // The next fence's receive before the ack, so it never arrives
        // unexpected.
        if !self.fence_posted && self.k < self.params.sizes.len() {
            self.fence_posted = self.io.recv_ctl()?;
            worked |= self.fence_posted;
        }
        if self.ack_due && self.io.send_ctl()? {
            self.ack_due = false;
            self.acks_posted += 1;
            worked = true;
        }
        Ok(worked)
    }

    fn is_done(&self) -> bool {
        self.k == self.params.sizes.len() && !self.ack_due && self.acks_done == self.acks_posted
    }

    fn sees_traffic(&self) -> bool {
        // The initiator's operations do not show here: silence until the
        // fence is no sign of a dead peer (the control link or the other
        // lcore's failure tells of one).
        false
    }
}

impl_side!(Target, buf);

#[cfg(test)]
mod tests {
    use efapoll::device::sim::{SimConfig, SimDevice, SimFabric};
    use efapoll::endpoint::{Config, Endpoint};

    use super::*;

    fn params(op: OpKind, size: u64, iterations: u64, warmup: u64, window: u32) -> Params {
        Params {
            app: "streaming".into(),
            device: "sim".into(),
            op: op.name().into(),
            sizes: vec![size],
            iterations: vec![iterations],
            warmup,
            window,
            verify: true,
            flows: 1,
            duration_ms: None,
            prime: true,
        }
    }

    /// A target on a sim fabric of its own (kept alive with it).
    fn target(op: OpKind, params: &Params) -> (SimFabric, Target<SimDevice>) {
        let fabric = SimFabric::new(SimConfig::default());
        let ep = Endpoint::new(fabric.device(), op.config(Config::default())).unwrap();
        let counts = Arc::new(Counts::new(params, 0));
        let t = Target::new(Io::new(ep, op, params).unwrap(), params, counts).unwrap();
        (fabric, t)
    }

    fn slot(t: &mut Target<SimDevice>, j: u64, size: u64) -> &[u8] {
        let buf = t.buf.id;
        t.io.copy_out(buf, j * size, size)
    }

    fn set_slot(t: &mut Target<SimDevice>, j: u64, size: u64, fill: impl FnOnce(&mut [u8])) {
        let buf = t.buf.id;
        t.io.fill_in(buf, j * size, size, fill);
    }

    #[test]
    fn each_slot_must_hold_its_last_write() {
        let p = params(OpKind::Write, 100, 10, 0, 4);
        // The first size warms up over 4096 writes: 4106 over 4 slots, the
        // last on slots 0-3 are 4104, 4105, 4102, 4103.
        assert_eq!(p.total(0), 4106);
        let (_f, mut t) = target(OpKind::Write, &p);
        for (j, last) in [(0, 4104), (1, 4105), (2, 4102), (3, 4103)] {
            set_slot(&mut t, j, 100, |b| op::fill(b, op::seed(100, last)));
        }
        t.check(0).unwrap();
        // Slot 2 still holds an earlier write.
        set_slot(&mut t, 2, 100, |b| op::fill(b, op::seed(100, 4098)));
        let err = t.check(0).unwrap_err().to_string();
        assert!(err.contains("write 4102 of 100 bytes"), "{err}");
    }

    #[test]
    fn the_counter_must_hold_every_add() {
        let p = params(OpKind::Atomic, 8, 5, 2, 64);
        assert_eq!(p.total(0), 4101, "4096 warmup adds");
        let (_f, mut t) = target(OpKind::Atomic, &p);
        assert_eq!(op::fetched(slot(&mut t, 0, 8)), 0, "zeroed for the first size");
        set_slot(&mut t, 0, 8, |b| b.copy_from_slice(&(4101 * ATOMIC_ADD).to_le_bytes()));
        t.check(0).unwrap();
        set_slot(&mut t, 0, 8, |b| b.copy_from_slice(&(4100 * ATOMIC_ADD).to_le_bytes()));
        let err = t.check(0).unwrap_err().to_string();
        assert!(err.contains("after 4101 fetch-adds"), "{err}");
    }

    #[test]
    fn reads_find_each_slot_s_pattern() {
        let p = params(OpKind::Read, 33, 10, 0, 3);
        let (_f, mut t) = target(OpKind::Read, &p);
        for j in 0..3 {
            op::verify_read(slot(&mut t, j, 33), 33, j, j).unwrap();
        }
        assert!(op::verify_read(slot(&mut t, 1, 33), 33, 0, 0).is_err(), "slots differ");
    }

    #[test]
    fn without_check_nothing_is_checked() {
        let mut p = params(OpKind::Atomic, 8, 5, 2, 64);
        p.verify = false;
        let (_f, mut t) = target(OpKind::Atomic, &p);
        set_slot(&mut t, 0, 8, |b| b.copy_from_slice(&1u64.to_le_bytes()));
        t.check(0).unwrap();
    }
}

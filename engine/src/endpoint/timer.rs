//! Deadlines for operations that wait on their peer: a read's data, an
//! atomic's response, a RECEIPT, an EOR, a CTS. The provider waits
//! forever; efapoll fails the operation with `Status::Timeout` after
//! `Config::response_timeout`, so a lost or hostile peer cannot hang it.
//!
//! Time is the device's ([`Device::now_ns`]: virtual on the sim). The
//! clock is read at most once every `TICK` progress calls, and only while
//! some operation waits; activity moves an operation's deadline with the
//! cached time, without reading the clock.

use std::collections::VecDeque;
use std::time::Duration;

use super::Endpoint;
use super::cq::{Completion, Op, Status};
use super::ops::RxKind;
use super::types::{RxId, TxId};
use crate::device::Device;

/// Progress calls between clock reads while something waits.
const TICK: u32 = 64;

/// An operation on the timer, in the slab it lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Tx(TxId),
    Rx(RxId),
}

#[derive(Debug)]
pub(crate) struct Timer {
    timeout_ns: u64,
    now_ns: u64,
    calls: u32,
    /// (deadline, operation), deadlines ascending: every deadline is
    /// `now + timeout` when pushed, and `now` only grows. Entries of
    /// operations that finished stay until pruned (at each tick, or when
    /// the queue reaches `limit`).
    queue: VecDeque<(u64, Side)>,
    /// Entries at which the whole queue is pruned: twice the operations
    /// that can wait at once, so the queue never outgrows the memory
    /// reserved for it.
    limit: usize,
}

impl Timer {
    pub(crate) fn new(timeout: Duration, capacity: usize) -> Timer {
        Timer {
            timeout_ns: timeout.as_nanos().min(u64::MAX as u128) as u64,
            now_ns: 0,
            calls: 0,
            queue: VecDeque::with_capacity(2 * capacity + 1),
            limit: 2 * capacity.max(1),
        }
    }

    #[inline]
    pub(crate) fn is_armed(&self) -> bool {
        !self.queue.is_empty()
    }

    /// The deadline of something that waits from now on.
    #[inline]
    pub(crate) fn deadline(&self) -> u64 {
        self.now_ns.saturating_add(self.timeout_ns)
    }

    /// Starts watching an operation at `now_ns` (read when the queue is
    /// empty: the cached time may be old after a quiet spell); returns its
    /// deadline.
    pub(crate) fn arm(&mut self, side: Side, now_ns: impl FnOnce() -> u64) -> u64 {
        if self.queue.is_empty() {
            self.now_ns = now_ns();
        }
        let d = self.deadline();
        self.queue.push_back((d, side));
        d
    }

    /// Whether this call is one of every `TICK`, when the clock is read.
    fn tick(&mut self) -> bool {
        self.calls += 1;
        if self.calls < TICK {
            return false;
        }
        self.calls = 0;
        true
    }

    /// The next entry whose deadline has passed.
    fn pop_due(&mut self) -> Option<(u64, Side)> {
        match self.queue.front() {
            Some(&(d, _)) if d <= self.now_ns => self.queue.pop_front(),
            _ => None,
        }
    }

    fn rearm(&mut self, deadline: u64, side: Side) {
        self.queue.push_back((deadline, side));
    }
}

impl<D: Device> Endpoint<D> {
    /// Fails operations whose peer went silent past their deadline.
    pub(super) fn expire_timeouts(&mut self) {
        if !self.timer.tick() {
            return;
        }
        self.timer.now_ns = self.dev.now_ns();
        self.prune_finished();
        while let Some((_, side)) = self.timer.pop_due() {
            match side {
                Side::Tx(id) => {
                    let Some(op) = self.tx_ops.get(id) else { continue };
                    if op.deadline > self.timer.now_ns {
                        self.timer.rearm(op.deadline, side);
                        continue;
                    }
                    let (ctx, peer) = (op.ctx, op.peer);
                    if let Some(what) = op.kind.reported_as() {
                        let mut c = Completion::new(what, ctx);
                        c.status = Status::Timeout;
                        c.peer = Some(peer);
                        self.cq.push(c);
                    }
                    self.counters.timeouts += 1;
                    self.free_tx_op(id);
                }
                Side::Rx(id) => {
                    let Some(op) = self.rx_ops.get(id) else { continue };
                    if op.deadline > self.timer.now_ns {
                        self.timer.rearm(op.deadline, side);
                        continue;
                    }
                    let (kind, ctx, peer, msg_id) = (op.kind, op.ctx, op.peer, op.msg_id);
                    if kind != RxKind::Write {
                        let mut c = Completion::new(
                            if kind == RxKind::Read { Op::Read } else { Op::Recv },
                            ctx,
                        );
                        c.status = Status::Timeout;
                        c.peer = Some(peer);
                        self.cq.push(c);
                    }
                    if kind == RxKind::Msg {
                        self.in_progress.remove(peer, msg_id);
                    }
                    self.counters.timeouts += 1;
                    self.free_rx_op(id);
                }
            }
        }
    }

    /// Whether the timer entry `side` still watches a live
    /// operation.
    fn watched(&self, side: Side) -> bool {
        match side {
            Side::Tx(id) => self.tx_ops.get(id).is_some(),
            Side::Rx(id) => self.rx_ops.get(id).is_some_and(|op| op.watched),
        }
    }

    /// Drops the timer entries of operations that finished from the
    /// front, where they gather (operations mostly finish in the order
    /// they started): at each clock tick, so that a stream of watched
    /// operations (atomics, reads) keeps the queue short.
    fn prune_finished(&mut self) {
        while let Some(&(_, side)) = self.timer.queue.front()
            && !self.watched(side)
        {
            self.timer.queue.pop_front();
        }
    }

    /// Drops every finished operation's entry once the queue reaches its
    /// limit (one that waits long holds the ones behind it at the front):
    /// the queue never outgrows the memory reserved for it.
    #[inline]
    fn bound_timer(&mut self) {
        if self.timer.queue.len() >= self.timer.limit {
            let mut queue = std::mem::take(&mut self.timer.queue);
            queue.retain(|&(_, side)| self.watched(side));
            self.timer.queue = queue;
        }
    }

    /// Starts the response clock of send-side operation `id`.
    pub(super) fn watch_tx(&mut self, id: TxId) {
        self.bound_timer();
        let d = self.timer.arm(Side::Tx(id), || self.dev.now_ns());
        if let Some(op) = self.tx_ops.get_mut(id) {
            op.deadline = d;
        }
    }

    /// Starts the response clock of receive-side operation `id`, once.
    pub(super) fn watch_rx(&mut self, id: RxId) {
        if self.rx_ops.get(id).is_none_or(|op| op.watched) {
            return;
        }
        self.bound_timer();
        let d = self.timer.arm(Side::Rx(id), || self.dev.now_ns());
        let op = self.rx_ops.get_mut(id).expect("live op");
        op.deadline = d;
        op.watched = true;
    }

    /// The deadline an operation that just heard from its peer moves to.
    #[inline]
    pub(super) fn fresh_deadline(&self) -> u64 {
        self.timer.deadline()
    }
}

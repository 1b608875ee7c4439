//! Emulated atomics (spec 3.3): WRITE_RTA, FETCH_RTA, COMPARE_RTA and
//! DC_WRITE_RTA, answered by ATOMRSP (fetch, compare) or RECEIPT (DC),
//! ordered with messages by msg_id.
//!
//! Datatypes and operations are libfabric's `enum fi_datatype` and `enum
//! fi_op`, by number, as the wire carries them. The responder applies an
//! operation element by element in its own thread: nothing else touches
//! the target in between, which is what makes it atomic.

use super::ops::{Answer, AtomicReq, MAX_IOV, Proto, Sgl, TxKind, TxPhase};
use super::types::{BufId, Ctrl, FAST_PATHS, Owner, RemoteId, ReqInfo, RtaClass, TxId};
use super::{DropReason, Endpoint, Error, PeerId, Span};
use crate::device::{Access, Device, HeldBufs};
use crate::wire::{AtomRspRepr, IovList, PacketType, PktFlags, ReqRepr, RmaIov, WireItem};

/// libfabric's `enum fi_datatype`: the ones the provider accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Datatype {
    Int8 = 0,
    Uint8 = 1,
    Int16 = 2,
    Uint16 = 3,
    Int32 = 4,
    Uint32 = 5,
    Int64 = 6,
    Uint64 = 7,
    Float = 8,
    Double = 9,
}

impl Datatype {
    /// Every datatype.
    pub const ALL: [Datatype; 10] = [
        Datatype::Int8,
        Datatype::Uint8,
        Datatype::Int16,
        Datatype::Uint16,
        Datatype::Int32,
        Datatype::Uint32,
        Datatype::Int64,
        Datatype::Uint64,
        Datatype::Float,
        Datatype::Double,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Datatype::Int8 | Datatype::Uint8 => 1,
            Datatype::Int16 | Datatype::Uint16 => 2,
            Datatype::Int32 | Datatype::Uint32 | Datatype::Float => 4,
            Datatype::Int64 | Datatype::Uint64 | Datatype::Double => 8,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Datatype::Float | Datatype::Double)
    }

    /// The datatype a wire number names.
    pub fn from_wire(n: u32) -> Option<Datatype> {
        Datatype::ALL.get(n as usize).copied()
    }
}

/// libfabric's `enum fi_op`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AtomicOp {
    Min = 0,
    Max = 1,
    Sum = 2,
    Prod = 3,
    Lor = 4,
    Land = 5,
    Bor = 6,
    Band = 7,
    Lxor = 8,
    Bxor = 9,
    Read = 10,
    Write = 11,
    Cswap = 12,
    CswapNe = 13,
    CswapLe = 14,
    CswapLt = 15,
    CswapGe = 16,
    CswapGt = 17,
    Mswap = 18,
}

impl AtomicOp {
    /// Every operation.
    pub const ALL: [AtomicOp; 19] = [
        AtomicOp::Min,
        AtomicOp::Max,
        AtomicOp::Sum,
        AtomicOp::Prod,
        AtomicOp::Lor,
        AtomicOp::Land,
        AtomicOp::Bor,
        AtomicOp::Band,
        AtomicOp::Lxor,
        AtomicOp::Bxor,
        AtomicOp::Read,
        AtomicOp::Write,
        AtomicOp::Cswap,
        AtomicOp::CswapNe,
        AtomicOp::CswapLe,
        AtomicOp::CswapLt,
        AtomicOp::CswapGe,
        AtomicOp::CswapGt,
        AtomicOp::Mswap,
    ];

    /// The operation a wire number names.
    pub fn from_wire(n: u32) -> Option<AtomicOp> {
        AtomicOp::ALL.get(n as usize).copied()
    }

    /// Which request carries it.
    pub(crate) fn class_ok(self, class: RtaClass) -> bool {
        let n = self as u32;
        match class {
            RtaClass::Write => n <= 9 || self == AtomicOp::Write,
            RtaClass::Fetch => n <= 11,
            RtaClass::Compare => n >= 12,
        }
    }

    /// Whether libfabric defines it on `dt` (no bitwise ops on floats).
    pub fn valid_for(self, dt: Datatype) -> bool {
        !(dt.is_float()
            && matches!(self, AtomicOp::Bor | AtomicOp::Band | AtomicOp::Bxor | AtomicOp::Mswap))
    }
}

/// One element: `target` updated in place, its old value returned.
fn apply_one(dt: Datatype, op: AtomicOp, target: &mut [u8], operand: &[u8], compare: &[u8]) {
    macro_rules! typed {
        ($t:ty, $float:tt) => {{
            const N: usize = std::mem::size_of::<$t>();
            let get = |b: &[u8]| <$t>::from_le_bytes(b[..N].try_into().expect("element size"));
            let cur = get(target);
            let v = get(operand);
            let cmp = if compare.len() >= N { get(compare) } else { 0 as $t };
            let truth = |x: $t| x != (0 as $t);
            let new = match op {
                AtomicOp::Min => if v < cur { v } else { cur },
                AtomicOp::Max => if v > cur { v } else { cur },
                AtomicOp::Sum => typed!(@add $t, $float, cur, v),
                AtomicOp::Prod => typed!(@mul $t, $float, cur, v),
                AtomicOp::Lor => ((truth(cur) || truth(v)) as u8) as $t,
                AtomicOp::Land => ((truth(cur) && truth(v)) as u8) as $t,
                AtomicOp::Lxor => ((truth(cur) ^ truth(v)) as u8) as $t,
                AtomicOp::Bor | AtomicOp::Band | AtomicOp::Bxor | AtomicOp::Mswap => {
                    typed!(@bits $t, $float, op, cur, v, cmp)
                }
                AtomicOp::Read => cur,
                AtomicOp::Write => v,
                AtomicOp::Cswap => if cmp == cur { v } else { cur },
                AtomicOp::CswapNe => if cmp != cur { v } else { cur },
                AtomicOp::CswapLe => if cmp <= cur { v } else { cur },
                AtomicOp::CswapLt => if cmp < cur { v } else { cur },
                AtomicOp::CswapGe => if cmp >= cur { v } else { cur },
                AtomicOp::CswapGt => if cmp > cur { v } else { cur },
            };
            target[..N].copy_from_slice(&new.to_le_bytes());
        }};
        (@add $t:ty, true, $a:expr, $b:expr) => { $a + $b };
        (@add $t:ty, false, $a:expr, $b:expr) => { $a.wrapping_add($b) };
        (@mul $t:ty, true, $a:expr, $b:expr) => { $a * $b };
        (@mul $t:ty, false, $a:expr, $b:expr) => { $a.wrapping_mul($b) };
        (@bits $t:ty, true, $op:expr, $a:expr, $b:expr, $c:expr) => {{
            // Refused for floats before any element is applied.
            unreachable!("bitwise {:?} on a float", $op)
        }};
        (@bits $t:ty, false, $op:expr, $a:expr, $b:expr, $c:expr) => {
            match $op {
                AtomicOp::Bor => $a | $b,
                AtomicOp::Band => $a & $b,
                AtomicOp::Bxor => $a ^ $b,
                // MSWAP: the compare operand is the mask.
                _ => ($b & $c) | ($a & !$c),
            }
        };
    }
    match dt {
        Datatype::Int8 => typed!(i8, false),
        Datatype::Uint8 => typed!(u8, false),
        Datatype::Int16 => typed!(i16, false),
        Datatype::Uint16 => typed!(u16, false),
        Datatype::Int32 => typed!(i32, false),
        Datatype::Uint32 => typed!(u32, false),
        Datatype::Int64 => typed!(i64, false),
        Datatype::Uint64 => typed!(u64, false),
        Datatype::Float => typed!(f32, true),
        Datatype::Double => typed!(f64, true),
    }
}

/// Applies `op` to every element of `target`, writing the old values to
/// `old` (when given). Operand slices hold as many elements as `target`.
pub fn apply(
    dt: Datatype,
    op: AtomicOp,
    target: &mut [u8],
    operand: &[u8],
    compare: &[u8],
    mut old: Option<&mut [u8]>,
) {
    let n = dt.size();
    for (i, t) in target.chunks_exact_mut(n).enumerate() {
        if let Some(o) = old.as_deref_mut() {
            o[i * n..(i + 1) * n].copy_from_slice(t);
        }
        let c = compare.get(i * n..(i + 1) * n).unwrap_or(&[]);
        apply_one(dt, op, t, &operand[i * n..(i + 1) * n], c);
    }
}

impl<D: Device> Endpoint<D> {
    /// Applies `op` with `operand` to the peer's memory `remote`; no
    /// result comes back (WRITE_RTA).
    pub fn atomic(
        &mut self,
        peer: PeerId,
        op: AtomicOp,
        dt: Datatype,
        operand: Span,
        remote: RmaIov,
        ctx: u64,
    ) -> Result<(), Error> {
        self.atomic_op(peer, RtaClass::Write, op, dt, operand, None, None, remote, ctx)
    }

    /// Applies `op` and brings the old values back into `result`
    /// (FETCH_RTA).
    #[allow(clippy::too_many_arguments)]
    pub fn fetch_atomic(
        &mut self,
        peer: PeerId,
        op: AtomicOp,
        dt: Datatype,
        operand: Span,
        result: Span,
        remote: RmaIov,
        ctx: u64,
    ) -> Result<(), Error> {
        self.atomic_op(peer, RtaClass::Fetch, op, dt, operand, None, Some(result), remote, ctx)
    }

    /// A compare operation (CSWAP family, MSWAP) with `compare` operands,
    /// old values into `result` (COMPARE_RTA).
    #[allow(clippy::too_many_arguments)]
    pub fn compare_atomic(
        &mut self,
        peer: PeerId,
        op: AtomicOp,
        dt: Datatype,
        operand: Span,
        compare: Span,
        result: Span,
        remote: RmaIov,
        ctx: u64,
    ) -> Result<(), Error> {
        self.atomic_op(
            peer,
            RtaClass::Compare,
            op,
            dt,
            operand,
            Some(compare),
            Some(result),
            remote,
            ctx,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn atomic_op(
        &mut self,
        peer: PeerId,
        class: RtaClass,
        op: AtomicOp,
        dt: Datatype,
        operand: Span,
        compare: Option<Span>,
        result: Option<Span>,
        remote: RmaIov,
        ctx: u64,
    ) -> Result<(), Error> {
        self.check_peer(peer)?;
        self.check_span(&operand)?;
        for s in compare.iter().chain(result.iter()) {
            self.check_span(s)?;
            if s.len != operand.len {
                return Err(Error::Invalid);
            }
        }
        if !op.class_ok(class)
            || !op.valid_for(dt)
            || !operand.len.is_multiple_of(dt.size() as u64)
            || remote.len != operand.len
        {
            return Err(Error::Invalid);
        }
        let ptype =
            if class == RtaClass::Write { PacketType::WriteRta } else { PacketType::FetchRta };
        let hdr = self.req_header_len(ptype, peer, false) + <RmaIov as WireItem>::LEN;
        let data = operand.len * if compare.is_some() { 2 } else { 1 };
        let rsp_room = (self.caps.mtu - AtomRspRepr::default().buffer_len()) as u64;
        if hdr as u64 + data > self.caps.mtu as u64 || operand.len > rsp_room {
            return Err(Error::TooLarge);
        }
        let dc = self.cfg.delivery_complete && class == RtaClass::Write;
        if dc {
            self.check_dc(peer)?;
        }
        if self.tx_ops.is_full() {
            return Err(Error::Again);
        }
        let msg_id = self.next_msg_id(peer);
        let id = self
            .tx_ops
            .insert_with(|t| {
                t.reset(TxKind::Atomic, peer, Proto::Eager, ctx);
                t.set_src(operand);
                t.atomic =
                    Some(AtomicReq { datatype: dt as u32, op: op as u32, class, result, compare });
                t.set_remote(remote);
                t.msg_id = msg_id;
                t.dc = dc;
            })
            .expect("checked room");
        if self.tx_ops.get(id).expect("live op").watches_peer() {
            self.watch_tx(id);
        }
        if FAST_PATHS && self.txq.has_free_buf() && self.txq.waiting() == 0 {
            self.build_rta(id, class);
            self.post_pending();
        } else {
            self.mark_ready(id);
            if self.txq.pending_len() == 0 {
                self.flush_tx();
            }
        }
        Ok(())
    }

    /// An RTA whose msg_id turn has come. Returns false, leaving the
    /// packet to the caller, when no buffer is free for the response.
    pub(super) fn handle_rta(&mut self, buf: BufId, peer: PeerId, info: &ReqInfo) -> bool {
        let class = match info.ptype {
            PacketType::WriteRta | PacketType::DcWriteRta => RtaClass::Write,
            PacketType::FetchRta => RtaClass::Fetch,
            _ => RtaClass::Compare,
        };
        let (dt, op) = match (
            Datatype::from_wire(info.atomic_datatype),
            AtomicOp::from_wire(info.atomic_op),
        ) {
            (Some(dt), Some(op)) if op.class_ok(class) && op.valid_for(dt) => (dt, op),
            _ => {
                self.counters.drop(DropReason::Invalid);
                self.release_rx(buf);
                return true;
            }
        };
        let iovs = self.req_iovs(buf, info.rma_iov);
        let total = super::msg::iov_total(iovs.as_slice()).unwrap_or(u64::MAX);
        let data = total.saturating_mul(if class == RtaClass::Compare { 2 } else { 1 });
        if iovs.is_empty()
            || data != info.payload_len as u64
            || !total.is_multiple_of(dt.size() as u64)
        {
            self.counters.drop(DropReason::Invalid);
            self.release_rx(buf);
            return true;
        }
        // A response needs a buffer; without one, wait (in order).
        let rsp = if class == RtaClass::Write {
            None
        } else {
            match self.take_tx_buf(Owner::Ctrl) {
                Some(b) => Some(b),
                None => return false,
            }
        };
        // Atomics need the write or the atomic right (libfabric checks
        // FI_REMOTE_WRITE; REMOTE_ATOMIC grants atomics alone).
        // One target, the common case, without a list.
        let (one, list);
        let targets = match iovs.as_slice() {
            [iov] if FAST_PATHS => match self.resolve_target(iov) {
                Some(s) => {
                    one = [s];
                    Some(&one[..])
                }
                None => None,
            },
            iovs => match self.resolve_targets(iovs) {
                Some(s) => {
                    list = s;
                    Some(list.segs())
                }
                None => None,
            },
        };
        let Some(targets) = targets else {
            if let Some(b) = rsp {
                self.release_tx_buf(b);
            }
            self.release_rx(buf);
            return true;
        };
        // The operands, copied out of the packet (at most a packet) into
        // scratch memory, so that the packet's buffer can be reposted.
        let off = info.payload_off as usize;
        let n = total as usize;
        // A few elements, the common case, on the stack.
        let mut small = [0u8; 64];
        let mut big = Box::default();
        let operands: &mut [u8] = if FAST_PATHS && info.payload_len as usize <= small.len() {
            &mut small
        } else {
            big = std::mem::take(&mut self.scratch);
            &mut big
        };
        self.dev.read_payload(buf, off, &mut operands[..info.payload_len as usize]);
        self.release_rx(buf);
        let (operand, rest) = operands.split_at(n);
        let compare = &rest[..if class == RtaClass::Compare { n } else { 0 }];
        let rsp_hdr = AtomRspRepr::default().buffer_len();
        // The target's values are read, combined and written back through
        // a copy (a region is never lent as a reference: a peer or the NIC
        // may write it), in one device call; the emulated atomic is the
        // responder's progress thread's alone, as in the provider.
        let mut at = 0usize;
        for t in targets {
            let len = t.len as usize;
            let o = &operand[at..at + len];
            let c = if compare.is_empty() { compare } else { &compare[at..at + len] };
            // A fetch answers with the values before the operation.
            let fetch = rsp.map(|b| (b, rsp_hdr + at));
            self.dev.update_region(t.mr, t.offset as usize, len, fetch, |i, values| {
                let end = i + values.len();
                let c = if c.is_empty() { c } else { &c[i..end] };
                apply(dt, op, values, &o[i..end], c, None);
            });
            at += len;
        }
        if !big.is_empty() {
            self.scratch = big;
        }
        if let Some(b) = rsp {
            let r = AtomRspRepr {
                flags: PktFlags::empty(),
                connid: self.ctrl_connid(peer),
                recv_id: info.recv_id,
                seg_length: total,
            };
            let hdr = r.emit(self.dev.held_mut(b));
            self.push_packet(peer, PacketType::AtomRsp, b, hdr + n, None);
        }
        if info.ptype == PacketType::DcWriteRta {
            let send_id = RemoteId(info.send_id);
            self.queue_ctrl(Ctrl::Receipt { peer, send_id, msg_id: info.msg_id });
        }
        true
    }

    /// The local spans of an RTA's iovs, or `None` (counted) when one is
    /// refused.
    fn resolve_targets(&mut self, iovs: &[RmaIov]) -> Option<Sgl> {
        let mut sgl = Sgl::EMPTY;
        for iov in iovs.iter().take(MAX_IOV) {
            sgl.push(self.resolve_target(iov)?);
        }
        Some(sgl)
    }

    /// [`Endpoint::resolve_targets`] of one iov.
    #[inline(always)]
    fn resolve_target(&mut self, iov: &RmaIov) -> Option<Span> {
        match self.mem.resolve(iov, Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) {
            Ok(s) => Some(s),
            Err(_) => {
                self.counters.drop(DropReason::RemoteAccess);
                self.counters.remote_access_refused += 1;
                None
            }
        }
    }

    /// ATOMRSP at the requester: the old values.
    pub(super) fn handle_atomrsp(
        &mut self,
        buf: BufId,
        peer: PeerId,
        r: &AtomRspRepr,
        payload_off: u32,
    ) {
        let id = TxId(r.recv_id);
        let Some(op) = self.tx_ops.get(id) else {
            self.counters.drop(DropReason::StaleId);
            return;
        };
        let result = op.atomic.and_then(|a| a.result);
        let fits =
            op.phase == TxPhase::Transfer { awaits: Some(Answer::AtomRsp) } && op.peer == peer;
        let Some(result) = result.filter(|_| fits) else {
            self.counters.drop(DropReason::StaleId);
            return;
        };
        if r.seg_length != result.len {
            self.counters.drop(DropReason::Invalid);
            return;
        }
        let (off, n) = (payload_off as usize, result.len as usize);
        self.dev.copy_to_region(buf, off, result.mr, result.offset as usize, n);
        let op = self.tx_ops.get_mut(id).expect("live op");
        op.phase = TxPhase::Transfer { awaits: None };
        if op.is_done() {
            self.finish_tx_op(id);
        }
    }

    /// Builds the one packet of atomic operation `id`: its RTA, operands
    /// and all. One call per type, each with its type a constant, so that
    /// the header's emit folds to its stores.
    pub(super) fn build_rta(&mut self, id: TxId, class: RtaClass) {
        let dc = self.tx_ops.get(id).expect("live op").dc;
        match class {
            RtaClass::Write if dc => self.build_rta_as(PacketType::DcWriteRta, id),
            RtaClass::Write => self.build_rta_as(PacketType::WriteRta, id),
            RtaClass::Fetch => self.build_rta_as(PacketType::FetchRta, id),
            RtaClass::Compare => self.build_rta_as(PacketType::CompareRta, id),
        }
    }

    #[inline(always)]
    fn build_rta_as(&mut self, ptype: PacketType, id: TxId) {
        let buf = self.take_tx_buf(Owner::Op(id)).expect("caller checked a free buffer");
        let peer = self.tx_ops.get(id).expect("live op").peer;
        let (raw, connid) = self.req_opt_headers(peer);
        let op = self.tx_ops.get(id).expect("live op");
        let (a, src) = (op.atomic.expect("atomic op"), op.src.single().expect("one operand span"));
        let mut r = ReqRepr::new(ptype);
        r.msg_id = op.msg_id;
        r.send_id = id.0;
        r.recv_id = id.0;
        r.rma_iov = IovList::Host(op.remote.as_slice());
        r.atomic_datatype = a.datatype;
        r.atomic_op = a.op;
        if raw {
            r.raw_addr = Some(&self.addr_hdr);
        }
        r.connid = connid;
        let hdr = r.emit(self.dev.held_mut(buf));
        let mut at = self.copy_operand(buf, hdr, &src);
        if let Some(c) = a.compare {
            at = self.copy_operand(buf, at, &c);
        }
        let op = self.tx_ops.get_mut(id).expect("live op");
        op.start_transfer();
        // The operands went in the REQ.
        op.sent = op.total;
        op.in_flight += 1;
        self.push_packet(peer, ptype, buf, at, None);
        self.peers.get_mut(peer).expect("live peer").req_sent = true;
    }

    /// Copies `s` into packet `buf` at `at`; returns where it ends.
    #[inline(always)]
    fn copy_operand(&mut self, buf: BufId, at: usize, s: &Span) -> usize {
        let n = s.len as usize;
        self.dev.copy_from_region(s.mr, s.offset as usize, buf, at, n);
        at + n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Copy>(
        dt: Datatype,
        op: AtomicOp,
        target: &[T],
        operand: &[T],
        compare: &[T],
        to_bytes: impl Fn(&[T]) -> Vec<u8>,
    ) -> (Vec<u8>, Vec<u8>) {
        let mut t = to_bytes(target);
        let mut old = vec![0u8; t.len()];
        apply(dt, op, &mut t, &to_bytes(operand), &to_bytes(compare), Some(&mut old));
        (t, old)
    }

    fn le64(v: &[i64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn integer_operations_match_their_definitions() {
        let t = [5i64, -3, 0, 7];
        let v = [2i64, 9, 0, -7];
        let c = [5i64, 4, 1, 7];
        let cases: [(AtomicOp, [i64; 4]); 19] = [
            (AtomicOp::Min, [2, -3, 0, -7]),
            (AtomicOp::Max, [5, 9, 0, 7]),
            (AtomicOp::Sum, [7, 6, 0, 0]),
            (AtomicOp::Prod, [10, -27, 0, -49]),
            (AtomicOp::Lor, [1, 1, 0, 1]),
            (AtomicOp::Land, [1, 1, 0, 1]),
            (AtomicOp::Bor, [7, -3 | 9, 0, 7 | -7]),
            (AtomicOp::Band, [0, -3 & 9, 0, 7 & -7]),
            (AtomicOp::Lxor, [0, 0, 0, 0]),
            (AtomicOp::Bxor, [7, -3 ^ 9, 0, 7 ^ -7]),
            (AtomicOp::Read, t),
            (AtomicOp::Write, v),
            (AtomicOp::Cswap, [2, -3, 0, -7]),
            (AtomicOp::CswapNe, [5, 9, 0, 7]),
            (AtomicOp::CswapLe, [2, -3, 0, -7]),
            (AtomicOp::CswapLt, [5, -3, 0, 7]),
            (AtomicOp::CswapGe, [2, 9, 0, -7]),
            (AtomicOp::CswapGt, [5, 9, 0, 7]),
            // (operand & mask) | (target & !mask), mask = compare
            (AtomicOp::Mswap, [0, -7, 0, 1]),
        ];
        for (op, want) in cases {
            let (new, old) = run(Datatype::Int64, op, &t, &v, &c, le64);
            assert_eq!(new, le64(&want), "{op:?}");
            assert_eq!(old, le64(&t), "{op:?} returns the old values");
        }
    }

    #[test]
    fn floats_and_narrow_integers() {
        let f = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (new, _) = run(Datatype::Double, AtomicOp::Sum, &[1.5, -2.0], &[0.25, 2.0], &[], f);
        assert_eq!(new, f(&[1.75, 0.0]));
        let (new, _) =
            run(Datatype::Double, AtomicOp::CswapLt, &[1.0, 3.0], &[9.0, 9.0], &[0.5, 3.0], f);
        assert_eq!(new, f(&[9.0, 3.0]));
        let u8s = |v: &[u8]| v.to_vec();
        let (new, old) = run(Datatype::Uint8, AtomicOp::Sum, &[250, 1], &[10, 1], &[], u8s);
        assert_eq!((new, old), (vec![4, 2], vec![250, 1]), "wraps like the C types");
        assert!(!AtomicOp::Bxor.valid_for(Datatype::Float));
        assert!(AtomicOp::Bxor.valid_for(Datatype::Int8));
        assert!(
            AtomicOp::Read.class_ok(RtaClass::Fetch) && !AtomicOp::Read.class_ok(RtaClass::Write)
        );
        assert!(
            AtomicOp::Cswap.class_ok(RtaClass::Compare)
                && !AtomicOp::Sum.class_ok(RtaClass::Compare)
        );
    }
}

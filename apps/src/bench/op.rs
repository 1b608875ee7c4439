//! The operation a benchmark moves data with (`-o`), the endpoint calls
//! behind it, and the byte pattern `-c` verifies.
//!
//! Adding an operation: a variant of [`OpKind`] (the CLI value), an arm in
//! [`Transfer::from_op`], and the step logic in the apps that use it
//! (one-sided operations post on one side only and complete on the other
//! through the target's memory).

use clap::ValueEnum;
use efapoll::device::Device;
use efapoll::endpoint::{Completion, Endpoint, Error, PeerId, Span, Status, TagMatch};

use super::RunError;

/// What `-o` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OpKind {
    /// Untagged send/recv.
    Send,
    /// Tagged send/recv.
    Tagged,
    /// RDMA write.
    Write,
    /// RDMA read.
    Read,
    /// Atomics.
    Atomic,
}

impl OpKind {
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Send => "send",
            OpKind::Tagged => "tagged",
            OpKind::Write => "write",
            OpKind::Read => "read",
            OpKind::Atomic => "atomic",
        }
    }
}

/// An operation the apps can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    Send,
    Tagged,
}

/// The tag of every tagged message: one flow per endpoint, so one tag.
const TAG: u64 = 0xefa9_0000_0000_0001;

impl Transfer {
    /// The operations the apps run now, for error messages.
    pub const ACCEPTED: &'static str = "send, tagged";

    /// The transfer for `-o op`, or why it cannot run yet.
    pub fn from_op(op: OpKind) -> Result<Transfer, String> {
        match op {
            OpKind::Send => Ok(Transfer::Send),
            OpKind::Tagged => Ok(Transfer::Tagged),
            OpKind::Write | OpKind::Read | OpKind::Atomic => Err(format!(
                "-o {}: the engine has no one-sided operations yet; accepted now: {}",
                op.name(),
                Transfer::ACCEPTED
            )),
        }
    }

    fn post_send<D: Device>(
        self,
        ep: &mut Endpoint<D>,
        peer: PeerId,
        src: Span,
        ctx: u64,
    ) -> Result<(), Error> {
        match self {
            Transfer::Send => ep.send(peer, src, ctx),
            Transfer::Tagged => ep.tsend(peer, src, TAG, ctx),
        }
    }

    fn post_recv<D: Device>(self, ep: &mut Endpoint<D>, dst: Span, ctx: u64) -> Result<(), Error> {
        match self {
            Transfer::Send => ep.recv(dst, None, ctx),
            Transfer::Tagged => ep.trecv(dst, TagMatch { tag: TAG, ignore: 0 }, None, ctx),
        }
    }
}

/// An endpoint, its one peer, and the operation to use.
#[derive(Debug)]
pub struct Io<D: Device> {
    pub ep: Endpoint<D>,
    pub peer: PeerId,
    pub transfer: Transfer,
}

impl<D: Device> Io<D> {
    /// An endpoint whose peer is not known yet.
    pub fn new(ep: Endpoint<D>, transfer: Transfer) -> Io<D> {
        Io { ep, peer: PeerId(u32::MAX), transfer }
    }

    /// Inserts the peer's address.
    pub fn connect(&mut self, addr: &efapoll::wire::RawAddr) -> Result<(), RunError> {
        self.peer = self.ep.insert_peer(addr).map_err(|e| {
            RunError::Setup(format!("cannot insert the peer's address {addr}: {e}"))
        })?;
        Ok(())
    }

    /// Posts a send; false when the endpoint pushed back (retry after
    /// progress).
    #[inline]
    pub fn send(&mut self, src: Span, ctx: u64) -> Result<bool, RunError> {
        posted(self.transfer.post_send(&mut self.ep, self.peer, src, ctx), "send")
    }

    /// Posts a receive; false when the endpoint pushed back.
    #[inline]
    pub fn recv(&mut self, dst: Span, ctx: u64) -> Result<bool, RunError> {
        posted(self.transfer.post_recv(&mut self.ep, dst, ctx), "receive")
    }

    /// Counters worth reporting.
    pub fn counters(&self) -> Vec<(String, u64)> {
        self.ep.counters().nonzero()
    }
}

fn posted(result: Result<(), Error>, what: &str) -> Result<bool, RunError> {
    match result {
        Ok(()) => Ok(true),
        Err(Error::Again) => Ok(false),
        Err(e) => Err(RunError::Engine(format!("posting a {what}: {e}"))),
    }
}

/// Fails a completion that is not a success.
pub fn check_status(c: &Completion) -> Result<(), RunError> {
    match c.status {
        Status::Ok => Ok(()),
        Status::PeerUnreachable => Err(RunError::PeerGone("the peer is unreachable".into())),
        Status::Truncated { olen } => Err(RunError::Verify(format!(
            "a {olen}-byte message arrived in a {}-byte receive: the sides disagree on sizes",
            c.len
        ))),
        s => Err(RunError::Engine(format!("{:?} completed with {s:?}", c.op))),
    }
}

/// Fails a receive that did not deliver `want` bytes.
pub fn check_len(c: &Completion, want: u64) -> Result<(), RunError> {
    if c.len == want {
        Ok(())
    } else {
        Err(RunError::Verify(format!("received {} bytes, expected {want}", c.len)))
    }
}

/// The seed of message `seq` of a `size`-byte run: each message's bytes
/// differ, so one landing in the wrong buffer, or not at all, is caught.
pub fn seed(size: u64, seq: u64) -> u64 {
    size.rotate_left(40) ^ seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xefa0_5eed
}

#[inline]
fn word(seed: u64, k: usize) -> u64 {
    (seed ^ (k as u64).wrapping_mul(0xd1b5_4a32_d192_ed03)).wrapping_add(k as u64)
}

/// Fills `buf` with the pattern of `seed`.
pub fn fill(buf: &mut [u8], seed: u64) {
    for (k, chunk) in buf.chunks_mut(8).enumerate() {
        let w = word(seed, k).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// The offset of the first byte of `buf` that is not the pattern of
/// `seed`, if any.
pub fn check(buf: &[u8], seed: u64) -> Option<usize> {
    let bad = buf.chunks(8).enumerate().position(|(k, chunk)| {
        let w = word(seed, k).to_le_bytes();
        chunk != &w[..chunk.len()]
    })?;
    let w = word(seed, bad).to_le_bytes();
    let chunk = &buf[bad * 8..(bad * 8 + 8).min(buf.len())];
    Some(bad * 8 + chunk.iter().zip(w).position(|(a, b)| *a != b).unwrap_or(0))
}

/// Verifies message `seq` of a `size`-byte run in `buf`.
pub fn verify(buf: &[u8], size: u64, seq: u64) -> Result<(), RunError> {
    match check(buf, seed(size, seq)) {
        None => Ok(()),
        Some(at) => Err(RunError::Verify(format!(
            "message {seq} of {size} bytes differs from what was sent at byte {at}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_round_trips_and_pinpoints_a_bad_byte() {
        for len in [0usize, 1, 7, 8, 9, 100, 4096] {
            let mut buf = vec![0u8; len];
            fill(&mut buf, seed(len as u64, 3));
            assert_eq!(check(&buf, seed(len as u64, 3)), None, "{len}");
            if len > 0 {
                let at = len / 2;
                buf[at] ^= 1;
                assert_eq!(check(&buf, seed(len as u64, 3)), Some(at), "{len}");
            }
        }
    }

    #[test]
    fn messages_differ_by_sequence_and_size() {
        let mut a = vec![0u8; 64];
        fill(&mut a, seed(64, 0));
        assert!(check(&a, seed(64, 1)).is_some());
        assert!(check(&a, seed(128, 0)).is_some());
    }

    #[test]
    fn one_sided_ops_are_refused_with_what_is_accepted() {
        assert_eq!(Transfer::from_op(OpKind::Send), Ok(Transfer::Send));
        assert_eq!(Transfer::from_op(OpKind::Tagged), Ok(Transfer::Tagged));
        for op in [OpKind::Write, OpKind::Read, OpKind::Atomic] {
            let err = Transfer::from_op(op).unwrap_err();
            assert!(err.starts_with(&format!("-o {}", op.name())), "{err}");
            assert!(err.contains("send, tagged"), "{err}");
        }
    }
}

//! Counters by packet type and by drop reason: plain integers the
//! endpoint's thread increments, cheap enough to keep on in production.

use crate::wire::{PacketType, WireError};

/// Why a received packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The codec rejected it (the wire error's kind is counted too).
    Malformed,
    /// From an unknown sender, and not a REQ with a raw address.
    UnknownSender,
    /// Its connid is not the one its sender's address carries (a restarted
    /// process that reused a QPN).
    ConnidMismatch,
    /// A send_id or recv_id that names no live operation of the sender.
    StaleId,
    /// A msg_id already delivered (a duplicate) or beyond the reorder
    /// window.
    MsgIdOutOfWindow,
    /// A segment outside its message (offset or length).
    SegmentOutOfRange,
    /// A field the protocol forbids (a CTS granting 0 bytes, a size that
    /// disagrees with an earlier packet of the same message).
    Invalid,
    /// A type this endpoint does not handle, or not in this state.
    Unsupported,
    /// A completion the device reported in error.
    DeviceError,
    /// A remote iov outside its registration: unknown key, out of bounds,
    /// or a right not granted (RDMAP 7.2). Target memory is untouched.
    RemoteAccess,
    /// Data of a message that arrived already (a copy of a segment).
    Duplicate,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 11] = [
        DropReason::Malformed,
        DropReason::UnknownSender,
        DropReason::ConnidMismatch,
        DropReason::StaleId,
        DropReason::MsgIdOutOfWindow,
        DropReason::SegmentOutOfRange,
        DropReason::Invalid,
        DropReason::Unsupported,
        DropReason::DeviceError,
        DropReason::RemoteAccess,
        DropReason::Duplicate,
    ];

    /// A short name, for reports.
    pub const fn name(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::UnknownSender => "unknown_sender",
            DropReason::ConnidMismatch => "connid_mismatch",
            DropReason::StaleId => "stale_id",
            DropReason::MsgIdOutOfWindow => "msg_id_out_of_window",
            DropReason::SegmentOutOfRange => "segment_out_of_range",
            DropReason::Invalid => "invalid",
            DropReason::Unsupported => "unsupported",
            DropReason::DeviceError => "device_error",
            DropReason::RemoteAccess => "remote_access",
            DropReason::Duplicate => "duplicate",
        }
    }
}

/// What an endpoint has done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counters {
    /// Packets received, by type id.
    pub rx_by_type: [u64; 256],
    /// Packets sent, by type id.
    pub tx_by_type: [u64; 256],
    /// Packets dropped, by [`DropReason`] (index in `DropReason::ALL`).
    pub drops: [u64; DropReason::ALL.len()],
    /// Malformed packets by [`WireError::kind`].
    pub malformed: [u64; WireError::KINDS],
    /// Messages that arrived before a matching receive was posted.
    pub unexpected: u64,
    /// Packets held because they arrived ahead of their turn (msg_id).
    pub reordered: u64,
    /// Times the endpoint could not post a receive buffer because every
    /// spare one holds an early or unexpected packet.
    pub rx_hold_exhausted: u64,
    /// Times a send could not be posted at once (queue or pool full).
    pub tx_queued: u64,
    /// Times a message waited because every receive entry was in use.
    pub rx_ops_exhausted: u64,
    /// Operations failed because their peer did not answer in time.
    pub timeouts: u64,
    /// Remote accesses refused by the registration checks, as responder.
    pub remote_access_refused: u64,
    /// READ_NACK packets sent (a long-read receiver could not prepare its
    /// buffer for RDMA).
    pub read_nacks: u64,
    /// HANDSHAKE packets sent and received.
    pub handshakes_sent: u64,
    pub handshakes_received: u64,
    /// Device RDMA reads and writes posted (direct operations and the
    /// long-read pulls, by segment), and their bytes.
    pub rdma_reads: u64,
    pub rdma_writes: u64,
    pub rdma_bytes: u64,
    /// Peers' direct writes with CQ data that landed here.
    pub remote_writes: u64,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            rx_by_type: [0; 256],
            tx_by_type: [0; 256],
            drops: [0; DropReason::ALL.len()],
            malformed: [0; WireError::KINDS],
            unexpected: 0,
            reordered: 0,
            rx_hold_exhausted: 0,
            tx_queued: 0,
            rx_ops_exhausted: 0,
            timeouts: 0,
            remote_access_refused: 0,
            read_nacks: 0,
            handshakes_sent: 0,
            handshakes_received: 0,
            rdma_reads: 0,
            rdma_writes: 0,
            rdma_bytes: 0,
            remote_writes: 0,
        }
    }
}

impl Counters {
    #[inline]
    pub(crate) fn drop(&mut self, reason: DropReason) {
        self.drops[reason as usize] += 1;
    }

    /// Packets dropped for `reason`.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize]
    }

    /// All packets dropped.
    pub fn drops_total(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Packets of type `t` received.
    pub fn rx(&self, t: PacketType) -> u64 {
        self.rx_by_type[t.id() as usize]
    }

    /// Packets of type `t` sent.
    pub fn tx(&self, t: PacketType) -> u64 {
        self.tx_by_type[t.id() as usize]
    }

    /// Non-zero counters as `(name, value)`, for reports and JSON.
    pub fn nonzero(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for t in PacketType::ALL {
            let (rx, tx) = (self.rx(*t), self.tx(*t));
            if rx > 0 {
                out.push((format!("rx.{}", t.name()), rx));
            }
            if tx > 0 {
                out.push((format!("tx.{}", t.name()), tx));
            }
        }
        for r in DropReason::ALL {
            if self.drops(r) > 0 {
                out.push((format!("drop.{}", r.name()), self.drops(r)));
            }
        }
        for (k, v) in self.malformed.iter().enumerate() {
            if *v > 0 {
                out.push((format!("malformed.{}", WireError::kind_name(k)), *v));
            }
        }
        let scalars = [
            ("unexpected", self.unexpected),
            ("reordered", self.reordered),
            ("rx_hold_exhausted", self.rx_hold_exhausted),
            ("tx_queued", self.tx_queued),
            ("rx_ops_exhausted", self.rx_ops_exhausted),
            ("timeouts", self.timeouts),
            ("remote_access_refused", self.remote_access_refused),
            ("read_nacks", self.read_nacks),
            ("handshakes_sent", self.handshakes_sent),
            ("handshakes_received", self.handshakes_received),
            ("rdma_reads", self.rdma_reads),
            ("rdma_writes", self.rdma_writes),
            ("rdma_bytes", self.rdma_bytes),
            ("remote_writes", self.remote_writes),
        ];
        out.extend(scalars.iter().filter(|(_, v)| *v > 0).map(|(k, v)| (k.to_string(), *v)));
        out
    }
}

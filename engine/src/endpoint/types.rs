//! What every part of the endpoint shares, in a leaf that imports nothing
//! of the endpoint: the ids of its entries (and what "none" is for each),
//! the links of the matcher's lists, the control packets and TX buffer
//! owners the protocols queue, and a received REQ's headers.

use crate::wire::{PacketType, RawAddr, ReqFlags, ReqPacket};

pub(crate) use crate::device::BufId;

pub(crate) use crate::FAST_PATHS;

/// Most iovs a REQ may name (libfabric's EFA_RDM_IOV_LIMIT).
pub(crate) const MAX_IOV: usize = 4;

/// A peer in the endpoint's address vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

/// Ids of entries in an endpoint slab: the slab index plus a generation
/// (see `slab`), so that an id from the wire naming a freed entry is
/// detected. None of them has a "none": where an entry may be absent, the
/// field is an `Option` or says what its absence means.
pub(crate) trait SlabId: Copy {
    fn from_raw(raw: u32) -> Self;
    fn raw(self) -> u32;
}

impl SlabId for u32 {
    #[inline(always)]
    fn from_raw(raw: u32) -> u32 {
        raw
    }
    #[inline(always)]
    fn raw(self) -> u32 {
        self
    }
}

macro_rules! slab_id {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub(crate) struct $name(pub(crate) u32);

        impl SlabId for $name {
            #[inline(always)]
            fn from_raw(raw: u32) -> $name {
                $name(raw)
            }
            #[inline(always)]
            fn raw(self) -> u32 {
                self.0
            }
        }
    )*};
}

slab_id! {
    /// A send-side operation (`tx_ops`): the `send_id` our packets carry.
    TxId;
    /// A receive-side operation (`rx_ops`): the `recv_id` our packets carry.
    RxId;
    /// A posted receive waiting for a message (`posted`).
    PostedId;
}

/// A persistent receive ([`super::Endpoint::recv_init`]): started again
/// and again, freed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PersistentRecv(pub(crate) PostedId);

/// A peer's operation, by the id its packets carry (its `send_id` or
/// `recv_id`): opaque here, echoed back in what answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RemoteId(pub(crate) u32);

impl RemoteId {
    /// An emulated read's responder, before its READRSP names its
    /// operation (the CTS packets it needs must wait for it).
    pub(crate) const UNKNOWN: RemoteId = RemoteId(u32::MAX);
}

/// A chain of held RX buffers (linked through the endpoint's per-buffer
/// metadata): an unexpected message's packets, or a reorder slot's. Empty
/// is its "none": a chain whose first buffer is `BufId::NONE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held(BufId);

impl Held {
    pub(crate) const EMPTY: Held = Held(BufId::NONE);

    /// A chain starting at `buf`.
    #[inline(always)]
    pub(crate) fn at(buf: BufId) -> Held {
        Held(buf)
    }

    /// Its first buffer, if any.
    #[inline(always)]
    pub(crate) fn first(self) -> Option<BufId> {
        (self != Held::EMPTY).then_some(self.0)
    }

    #[inline(always)]
    pub(crate) fn is_empty(self) -> bool {
        self == Held::EMPTY
    }
}

/// An entry's place in one of the matcher's lists, by raw slab id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Link {
    pub(crate) prev: u32,
    pub(crate) next: u32,
}

impl Link {
    /// Past either end of a list.
    pub(crate) const END: u32 = u32::MAX;
    /// Not on a list.
    pub(crate) const NONE: Link = Link { prev: Link::END, next: Link::END };
}

/// The three RTA requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RtaClass {
    /// No result (WRITE_RTA, DC_WRITE_RTA).
    Write,
    /// The old values come back (FETCH_RTA).
    Fetch,
    /// Compare operands follow the operands (COMPARE_RTA).
    Compare,
}

/// A control packet to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ctrl {
    /// Our capabilities, answering a peer's first packet (spec 2.1).
    Handshake { peer: PeerId },
    /// A zero-byte EAGER_RTW: makes the peer answer with its HANDSHAKE
    /// (libfabric: efa_rdm_ep_trigger_handshake).
    HandshakeTrigger { peer: PeerId },
    /// Clear to send `recv_length` more bytes (spec 3.2); `read` marks the
    /// CTS of an emulated read (flag 0x80).
    Cts { peer: PeerId, send_id: RemoteId, recv_id: RxId, recv_length: u64, read: bool },
    /// The data of a delivery-complete operation reached its target.
    Receipt { peer: PeerId, send_id: RemoteId, msg_id: u32 },
    /// The receiver finished reading a long-read transfer.
    Eor { peer: PeerId, send_id: RemoteId, recv_id: RxId },
    /// The receiver could not prepare to read: fall back to long-CTS.
    ReadNack { peer: PeerId, send_id: RemoteId, recv_id: RxId },
    /// The request of emulated read `rx` (SHORT_RTR or LONGCTS_RTR).
    Rtr { rx: RxId },
}

/// Who a TX buffer's packet belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A control packet or an inject: nothing waits for it.
    Ctrl,
    /// A send-side operation's packet.
    Op(TxId),
    /// An eager message built when it was sent: the whole operation, so
    /// that its completion needs no operation entry.
    Eager(EagerSend),
    /// An eager message injected ([`super::Endpoint::inject_head_with`]):
    /// reported only if it fails.
    Inject(EagerSend),
}

/// What an eager send reports when its packet completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EagerSend {
    pub(crate) ctx: u64,
    pub(crate) tag: u64,
    pub(crate) len: u32,
    pub(crate) peer: PeerId,
    pub(crate) tagged: bool,
}

/// The headers of a received REQ, copied out of its buffer so that the
/// endpoint can act on it while the buffer stays where it is. `repr(C)`
/// keeps the type first, where the wide stores that build the struct
/// start: its reads, the first of every handler, are then served from
/// those stores without waiting for them to reach the cache.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct ReqInfo {
    pub(crate) ptype: PacketType,
    /// The type's raw id, which the endpoint's routing tables are indexed
    /// by.
    pub(crate) type_id: u8,
    pub(crate) flags: ReqFlags,
    pub(crate) msg_id: u32,
    pub(crate) tag: u64,
    pub(crate) msg_length: u64,
    pub(crate) seg_offset: u64,
    pub(crate) send_id: u32,
    pub(crate) recv_id: u32,
    pub(crate) recv_length: u32,
    pub(crate) atomic_datatype: u32,
    pub(crate) atomic_op: u32,
    pub(crate) runt_length: u64,
    pub(crate) rma_iov: IovAt,
    pub(crate) read_iov: IovAt,
    /// More than `MAX_IOV` iovs of either kind.
    pub(crate) too_many_iovs: bool,
    pub(crate) cq_data: Option<u64>,
    /// The sender's connid: its raw address's, or the connid header.
    pub(crate) connid: Option<u32>,
    /// Where the raw address header's address starts in the packet, if
    /// it has one: parsed only for a sender not known yet.
    pub(crate) raw_addr_at: Option<u32>,
    pub(crate) payload_off: u32,
    pub(crate) payload_len: u32,
}

/// Where one of a REQ's iov arrays sits in its packet. Handlers that need
/// the iovs read them from the packet (`Endpoint::req_iovs`), so the
/// common REQ, which has none, copies none.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IovAt {
    pub(crate) at: u32,
    pub(crate) n: u8,
}

impl IovAt {
    fn new(list: crate::wire::IovList<'_>, at: usize) -> (IovAt, bool) {
        let n = list.len();
        (IovAt { at: at as u32, n: n.min(MAX_IOV) as u8 }, n > MAX_IOV)
    }
}

impl ReqInfo {
    /// Copies what the endpoint needs out of a checked REQ. Inlined: a
    /// call would return the struct through memory, and its caller read
    /// it back wider than it was written, stalling store forwarding.
    #[inline(always)]
    fn from_view(p: &ReqPacket<&[u8]>, type_id: u8) -> ReqInfo {
        let f = p.fields();
        // The codec checked the raw address is at least 24 bytes.
        let raw_connid = p.raw_addr().and_then(|a| RawAddr::from_bytes(a).ok()).map(|a| a.connid);
        let (rma_iov, more_rma) = IovAt::new(p.rma_iov(), p.layout().header_len());
        let (read_iov, more_read) = IovAt::new(p.read_iov(), p.header_len());
        ReqInfo {
            ptype: p.packet_type(),
            type_id,
            flags: p.flags(),
            msg_id: f.msg_id,
            tag: f.tag,
            msg_length: f.msg_length,
            seg_offset: f.seg_offset,
            send_id: f.send_id,
            recv_id: f.recv_id,
            recv_length: f.recv_length,
            atomic_datatype: f.atomic_datatype,
            atomic_op: f.atomic_op,
            runt_length: f.runt_length,
            rma_iov,
            read_iov,
            too_many_iovs: more_rma || more_read,
            cq_data: p.cq_data(),
            // A raw address and a connid header together: the address's
            // connid is the sender's (interop notes).
            connid: raw_connid.or(p.connid()),
            raw_addr_at: p.raw_addr_offset().map(|at| at as u32),
            payload_off: p.payload_offset() as u32,
            payload_len: p.payload().len() as u32,
        }
    }

    /// Checks and reads a REQ packet.
    #[inline(always)]
    pub(crate) fn parse(bytes: &[u8]) -> Result<ReqInfo, crate::wire::WireError> {
        // A checked packet has its type byte.
        ReqPacket::new_checked(bytes).map(|p| ReqInfo::from_view(&p, bytes[0]))
    }
}

//! Property round trips: emit → parse → equal, over random field values,
//! every REQ type, and every combination of optional headers.

use efapoll::wire::*;
use proptest::prelude::*;

const SENTINEL: u8 = 0x5a;

fn iov() -> impl Strategy<Value = RmaIov> {
    (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(addr, len, key)| RmaIov {
        addr,
        len,
        key,
    })
}

/// Owned inputs for a REQ: the fields, lists and optional headers.
#[derive(Debug, Clone)]
struct ReqInput {
    ptype: PacketType,
    extra_flags: u16,
    fields: [u64; 13],
    rma_iov: Vec<RmaIov>,
    read_iov: Vec<RmaIov>,
    raw_addr: Option<Vec<u8>>,
    cq_data: Option<u64>,
    connid: Option<u32>,
    payload: Vec<u8>,
}

fn req_input() -> impl Strategy<Value = ReqInput> {
    let types: Vec<PacketType> = PacketType::ALL.iter().copied().filter(|t| t.is_req()).collect();
    (
        proptest::sample::select(types),
        any::<u16>(),
        proptest::array::uniform13(any::<u64>()),
        proptest::collection::vec(iov(), 0..4),
        proptest::collection::vec(iov(), 0..4),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 24..48)),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u32>()),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(
            |(
                ptype,
                extra_flags,
                fields,
                rma_iov,
                read_iov,
                raw_addr,
                cq_data,
                connid,
                payload,
            )| {
                ReqInput {
                    ptype,
                    extra_flags,
                    fields,
                    rma_iov,
                    read_iov,
                    raw_addr,
                    cq_data,
                    connid,
                    payload,
                }
            },
        )
}

impl ReqInput {
    fn repr(&self) -> ReqRepr<'_> {
        let layout = ReqLayout::of(self.ptype).unwrap();
        let mut r = ReqRepr::new(self.ptype);
        // Random non-optional-header flag bits are carried as they are.
        r.flags |= ReqFlags::from_bits_retain(self.extra_flags).difference(ReqFlags::OPT_HDRS);
        let value = |f: ReqField| {
            let v = self.fields[ReqField::ALL.iter().position(|x| *x == f).unwrap()];
            if !layout.has(f) {
                0
            } else if f.is_u64() {
                v
            } else {
                v & 0xffff_ffff
            }
        };
        r.msg_id = value(ReqField::MsgId) as u32;
        r.tag = value(ReqField::Tag);
        r.msg_length = value(ReqField::MsgLength);
        r.seg_offset = value(ReqField::SegOffset);
        r.send_id = value(ReqField::SendId) as u32;
        r.recv_id = value(ReqField::RecvId) as u32;
        r.credit_request = value(ReqField::CreditRequest) as u32;
        r.recv_length = value(ReqField::RecvLength) as u32;
        r.atomic_datatype = value(ReqField::AtomicDatatype) as u32;
        r.atomic_op = value(ReqField::AtomicOp) as u32;
        r.runt_length = value(ReqField::RuntLength);
        if layout.has(ReqField::RmaIovCount) {
            r.rma_iov = IovList::Host(&self.rma_iov);
        }
        if layout.has(ReqField::ReadIovCount) {
            r.read_iov = IovList::Host(&self.read_iov);
        }
        r.raw_addr = self.raw_addr.as_deref();
        r.cq_data = self.cq_data;
        r.connid = self.connid;
        r
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn req_round_trip(input in req_input()) {
        let repr = input.repr();
        let mut buf = vec![SENTINEL; repr.buffer_len() + input.payload.len() + 16];
        let n = repr.emit(&mut buf);
        prop_assert_eq!(n, repr.buffer_len());
        prop_assert!(buf[n..].iter().all(|b| *b == SENTINEL), "wrote past buffer_len");
        buf[n..n + input.payload.len()].copy_from_slice(&input.payload);
        let (parsed, payload) = ReqRepr::parse(&buf[..n + input.payload.len()]).unwrap();
        let mut want = repr;
        want.flags = repr.wire_flags();
        prop_assert_eq!(parsed, want);
        prop_assert_eq!(payload, &input.payload[..]);
        let view = ReqPacket::new_checked(&buf[..n + input.payload.len()]).unwrap();
        prop_assert_eq!(view.header_len(), repr.header_len());
        prop_assert_eq!(view.payload_offset(), n);
    }

    /// The receive path's header prediction reads what the full parse
    /// reads, answers for every eager RTM in the common form, and for
    /// nothing the full parse would refuse (bytes flipped at random).
    #[test]
    fn eager_prediction_agrees_with_the_full_parse(
        input in req_input(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
    ) {
        let repr = input.repr();
        let mut buf = vec![0u8; repr.buffer_len() + input.payload.len()];
        let n = repr.emit(&mut buf);
        buf[n..].copy_from_slice(&input.payload);
        let common = matches!(input.ptype, PacketType::EagerMsgRtm | PacketType::EagerTagRtm)
            && !repr.wire_flags().intersects(ReqFlags::RAW_ADDR_HDR | ReqFlags::READ_NACK);
        prop_assert_eq!(EagerRtm::predict(&buf).is_some(), common);
        for (at, x) in flips {
            let i = at.index(buf.len());
            buf[i] ^= x;
        }
        for len in [buf.len(), buf.len() / 2] {
            let bytes = &buf[..len];
            let Some(e) = EagerRtm::predict(bytes) else { continue };
            let view = ReqPacket::new_checked(bytes).expect("the full parse takes it too");
            let tagged = view.packet_type() == PacketType::EagerTagRtm;
            prop_assert!(tagged || view.packet_type() == PacketType::EagerMsgRtm);
            prop_assert!(view.raw_addr().is_none() && !view.flags().contains(ReqFlags::READ_NACK));
            prop_assert_eq!(e.tagged, tagged);
            prop_assert_eq!(e.msg_id, view.fields().msg_id);
            prop_assert_eq!(e.tag, view.fields().tag);
            prop_assert_eq!(e.cq_data, view.cq_data());
            prop_assert_eq!(e.connid, view.connid());
            prop_assert_eq!(e.payload_off, view.payload_offset());
        }
    }

    /// The send path's eager header is the general emit's, byte for byte
    /// over whatever the buffer held, and says where the payload goes.
    #[test]
    fn the_eager_emit_writes_what_the_general_emit_writes(
        msg_id in any::<u32>(),
        tag in proptest::option::of(any::<u64>()),
        cq_data in proptest::option::of(any::<u64>()),
        connid in proptest::option::of(any::<u32>()),
        fill in any::<u8>(),
    ) {
        let ptype = if tag.is_some() { PacketType::EagerTagRtm } else { PacketType::EagerMsgRtm };
        let mut repr = ReqRepr::new(ptype);
        repr.msg_id = msg_id;
        repr.tag = tag.unwrap_or(0);
        repr.cq_data = cq_data;
        repr.connid = connid;
        let (mut want, mut got) = ([fill; 48], [fill; 48]);
        let n = repr.emit(&mut want);
        prop_assert_eq!(EagerRtm::emit(&mut got, msg_id, tag, cq_data, connid), n);
        prop_assert_eq!(got, want);
        let e = EagerRtm::predict(&got[..n]).expect("the common form");
        let read = (e.tagged, e.msg_id, e.tag, e.cq_data, e.connid, e.payload_off);
        prop_assert_eq!(read, (tag.is_some(), msg_id, tag.unwrap_or(0), cq_data, connid, n));
    }

    #[test]
    fn cts_round_trip(flags in any::<u16>(), connid in proptest::option::of(any::<u32>()),
                      send_id in any::<u32>(), recv_id in any::<u32>(), recv_length in any::<u64>()) {
        let repr = CtsRepr { flags: CtsFlags::from_bits_retain(flags), connid, send_id, recv_id, recv_length };
        let mut buf = [SENTINEL; 40];
        let n = repr.emit(&mut buf);
        prop_assert_eq!(n, 24);
        prop_assert!(buf[n..].iter().all(|b| *b == SENTINEL));
        let mut want = repr;
        want.flags.set(CtsFlags::CONNID_HDR, connid.is_some());
        prop_assert_eq!(CtsRepr::parse(&buf[..n]).unwrap(), want);
    }

    #[test]
    fn ctsdata_round_trip(flags in any::<u16>(), connid in proptest::option::of(any::<u32>()),
                          recv_id in any::<u32>(), seg_offset in any::<u64>(),
                          data in proptest::collection::vec(any::<u8>(), 0..128)) {
        let repr = CtsDataRepr {
            flags: PktFlags::from_bits_retain(flags), recv_id, seg_length: data.len() as u64, seg_offset, connid,
        };
        let mut buf = vec![SENTINEL; 32 + data.len() + 8];
        let n = repr.emit(&mut buf);
        prop_assert_eq!(n, repr.buffer_len());
        prop_assert!(buf[n..].iter().all(|b| *b == SENTINEL));
        buf[n..n + data.len()].copy_from_slice(&data);
        let (parsed, payload) = CtsDataRepr::parse(&buf[..n + data.len()]).unwrap();
        let mut want = repr;
        want.flags.set(PktFlags::CONNID_HDR, connid.is_some());
        prop_assert_eq!(parsed, want);
        prop_assert_eq!(payload, &data[..]);
    }

    #[test]
    fn responses_round_trip(flags in any::<u16>(), connid in proptest::option::of(any::<u32>()),
                            ids in any::<(u32, u32)>(), data in proptest::collection::vec(any::<u8>(), 0..64)) {
        let flags = PktFlags::from_bits_retain(flags).difference(PktFlags::CONNID_HDR)
            | if connid.is_some() { PktFlags::CONNID_HDR } else { PktFlags::empty() };
        let read = ReadRspRepr { flags, connid, recv_id: ids.0, send_id: ids.1, recv_length: data.len() as u64 };
        let atom = AtomRspRepr { flags, connid, recv_id: ids.0, seg_length: data.len() as u64 };
        let mut buf = vec![SENTINEL; 24 + data.len()];
        let n = read.emit(&mut buf);
        buf[n..].copy_from_slice(&data);
        prop_assert_eq!(ReadRspRepr::parse(&buf).unwrap(), (read, &data[..]));
        let n = atom.emit(&mut buf);
        buf[n..].copy_from_slice(&data);
        prop_assert_eq!(AtomRspRepr::parse(&buf).unwrap(), (atom, &data[..]));
    }

    #[test]
    fn control_packets_round_trip(flags in any::<u16>(), connid in proptest::option::of(any::<u32>()),
                                  ids in any::<(u32, u32)>()) {
        let flags = PktFlags::from_bits_retain(flags).difference(PktFlags::CONNID_HDR)
            | if connid.is_some() { PktFlags::CONNID_HDR } else { PktFlags::empty() };
        let mut buf = [SENTINEL; 20];
        let eor = EorRepr { flags, send_id: ids.0, recv_id: ids.1, connid };
        prop_assert_eq!(eor.emit(&mut buf), 16);
        prop_assert_eq!(EorRepr::parse(&buf[..16]).unwrap(), eor);
        let nack = ReadNackRepr { flags, send_id: ids.0, recv_id: ids.1, connid };
        nack.emit(&mut buf);
        prop_assert_eq!(ReadNackRepr::parse(&buf[..16]).unwrap(), nack);
        let receipt = ReceiptRepr { flags, send_id: ids.0, msg_id: ids.1, connid };
        receipt.emit(&mut buf);
        prop_assert_eq!(ReceiptRepr::parse(&buf[..16]).unwrap(), receipt);
        prop_assert!(buf[16..].iter().all(|b| *b == SENTINEL));
    }

    #[test]
    fn handshake_round_trip(flags in any::<u16>(), words in proptest::collection::vec(any::<u64>(), 0..6),
                            connid in proptest::option::of(any::<u32>()),
                            host_id in proptest::option::of(any::<u64>()),
                            device_version in proptest::option::of(any::<u32>()),
                            qp in proptest::option::of(any::<(u32, u32)>())) {
        let repr = HandshakeRepr {
            flags: HandshakeFlags::from_bits_retain(flags),
            extra_info: ExtraInfo::Host(&words),
            connid,
            host_id,
            device_version,
            user_recv_qp: qp.map(|(qpn, qkey)| UserRecvQp { qpn, qkey }),
        };
        let mut buf = vec![SENTINEL; repr.buffer_len() + 8];
        let n = repr.emit(&mut buf);
        prop_assert_eq!(n, repr.buffer_len());
        prop_assert!(buf[n..].iter().all(|b| *b == SENTINEL));
        let mut want = repr;
        want.flags = repr.wire_flags();
        prop_assert_eq!(HandshakeRepr::parse(&buf[..n]).unwrap(), want);
    }
}

/// Every combination of the three REQ optional headers, for every REQ
/// type, lands in flag order and parses back.
#[test]
fn every_optional_header_combination_for_every_req_type() {
    let addr = RawAddr { gid: [7; 16], qpn: 9, connid: 0xabcd }.to_req_hdr_bytes();
    let iovs = [RmaIov { addr: 1, len: 2, key: 3 }];
    for ptype in PacketType::ALL.iter().copied().filter(|t| t.is_req()) {
        for mask in 0..8u8 {
            let mut r = ReqRepr::new(ptype);
            r.msg_id = 77;
            r.rma_iov = IovList::Host(&iovs);
            r.read_iov = IovList::Host(&iovs);
            r.raw_addr = (mask & 1 != 0).then_some(&addr[..]);
            r.cq_data = (mask & 2 != 0).then_some(0x1122);
            r.connid = (mask & 4 != 0).then_some(0x3344);
            let mut buf = [0u8; 256];
            let n = r.emit(&mut buf);
            let (parsed, payload) = ReqRepr::parse(&buf[..n]).unwrap();
            assert!(payload.is_empty());
            assert_eq!(parsed.raw_addr, r.raw_addr, "{ptype} mask {mask}");
            assert_eq!(parsed.cq_data, r.cq_data, "{ptype} mask {mask}");
            assert_eq!(parsed.connid, r.connid, "{ptype} mask {mask}");
            let layout = ReqLayout::of(ptype).unwrap();
            // Optional headers follow rma_iov[] in flag-bit order.
            let mut at =
                layout.header_len() + if layout.has(ReqField::RmaIovCount) { 24 } else { 0 };
            if mask & 1 != 0 {
                assert_eq!(&buf[at..at + 4], &36u32.to_le_bytes());
                at += 40;
            }
            if mask & 2 != 0 {
                assert_eq!(&buf[at..at + 8], &0x1122u64.to_le_bytes());
                at += 8;
            }
            if mask & 4 != 0 {
                assert_eq!(&buf[at..at + 4], &0x3344u32.to_le_bytes());
                at += 4;
            }
            assert_eq!(parsed.header_len(), at);
        }
    }
}

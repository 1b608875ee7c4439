//! Golden packets: every packet type parses to the values its bytes were
//! written from, and re-emits byte for byte into a sentinel-filled buffer.

use efapoll::wire::golden::{self, ALL};
use efapoll::wire::*;

const SENTINEL: u8 = 0xa5;

/// The value each named REQ field holds in the golden packets.
fn golden_req_field(f: ReqField, repr: &ReqRepr) -> u64 {
    match f {
        ReqField::MsgId => golden::MSG_ID as u64,
        ReqField::Tag => golden::TAG,
        ReqField::MsgLength => golden::MSG_LENGTH,
        ReqField::SegOffset => golden::SEG_OFFSET,
        ReqField::SendId => golden::SEND_ID as u64,
        ReqField::RecvId => golden::RECV_ID as u64,
        ReqField::CreditRequest => golden::CREDIT_REQUEST as u64,
        ReqField::RecvLength => golden::RTR_RECV_LENGTH as u64,
        ReqField::RmaIovCount => repr.rma_iov.len() as u64,
        ReqField::ReadIovCount => repr.read_iov.len() as u64,
        ReqField::AtomicDatatype => golden::ATOMIC_DATATYPE as u64,
        ReqField::AtomicOp => golden::ATOMIC_OP as u64,
        ReqField::RuntLength => golden::RUNT_LENGTH,
    }
}

#[test]
fn every_type_the_provider_sends_has_a_golden_packet() {
    for t in PacketType::ALL {
        assert!(ALL.iter().any(|(name, _)| *name == t.name()), "no golden packet for {t}");
    }
}

#[test]
fn golden_packets_parse_and_re_emit_byte_exact() {
    for (name, bytes) in ALL {
        let packet = Packet::parse(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(packet.packet_type().id(), bytes[0], "{name}");
        let payload_at = packet.payload_offset();
        assert_eq!(packet.payload(), &bytes[payload_at..], "{name}: payload");
        assert!(packet.header_len() <= payload_at);

        let mut buf = [SENTINEL; 512];
        assert_eq!(packet.buffer_len(), payload_at, "{name}");
        let written = packet.emit(&mut buf);
        assert_eq!(written, payload_at, "{name}: emit length");
        assert_eq!(&buf[..written], &bytes[..written], "{name}: emitted headers");
        assert!(buf[written..].iter().all(|b| *b == SENTINEL), "{name}: wrote past its headers");
    }
}

#[test]
fn golden_req_fields_sit_where_the_notes_put_them() {
    for (name, bytes) in ALL {
        let Ok(Packet::Req(repr, payload)) = Packet::parse(bytes) else {
            continue;
        };
        let layout = ReqLayout::of(repr.ptype).unwrap();
        for f in layout.fields() {
            assert_eq!(repr.field(f), golden_req_field(f, &repr), "{name}: {}", f.name());
        }
        // The view agrees with the value form.
        let view = ReqPacket::new_checked(*bytes).unwrap();
        for f in ReqField::ALL {
            assert_eq!(view.field(f), layout.has(f).then(|| repr.field(f)), "{name}: {}", f.name());
        }
        // All at once, zero where the type has no such field.
        let all = view.fields();
        let at = |f: ReqField| if layout.has(f) { repr.field(f) } else { 0 };
        let expect = ReqFields {
            msg_id: at(ReqField::MsgId) as u32,
            tag: at(ReqField::Tag),
            msg_length: at(ReqField::MsgLength),
            seg_offset: at(ReqField::SegOffset),
            send_id: at(ReqField::SendId) as u32,
            recv_id: at(ReqField::RecvId) as u32,
            credit_request: at(ReqField::CreditRequest) as u32,
            recv_length: at(ReqField::RecvLength) as u32,
            atomic_datatype: at(ReqField::AtomicDatatype) as u32,
            atomic_op: at(ReqField::AtomicOp) as u32,
            runt_length: at(ReqField::RuntLength),
        };
        assert_eq!(all, expect, "{name}");
        if let Some(addr) = repr.raw_addr {
            assert_eq!(addr.len(), RawAddr::REQ_HDR_SIZE, "{name}");
            assert_eq!(RawAddr::from_bytes(addr).unwrap(), golden::RAW_ADDR, "{name}");
            assert_eq!(view.raw_addr(), Some(addr));
        }
        if repr.flags.contains(ReqFlags::CQ_DATA_HDR) {
            assert_eq!(repr.cq_data, Some(golden::CQ_DATA), "{name}");
        }
        if repr.flags.contains(ReqFlags::CONNID_HDR) {
            assert_eq!(repr.connid, Some(golden::CONNID), "{name}");
        }
        assert_eq!(view.cq_data(), repr.cq_data);
        assert_eq!(view.connid(), repr.connid);
        let iovs = [golden::IOV1, golden::IOV2];
        assert!(repr.rma_iov.iter().eq(iovs.iter().copied().take(repr.rma_iov.len())), "{name}");
        let read = [golden::IOV2, golden::IOV1];
        assert!(repr.read_iov.iter().eq(read.iter().copied().take(repr.read_iov.len())), "{name}");
        assert_eq!(view.rma_iov(), repr.rma_iov);
        assert_eq!(view.read_iov(), repr.read_iov);
        assert_eq!(view.payload(), payload);
        // The flags the provider sets for the type are there.
        assert!(repr.flags.contains(ReqFlags::for_type(repr.ptype)), "{name}");
        let no_data = matches!(layout.class, ReqClass::Rtr)
            || matches!(
                repr.ptype,
                PacketType::LongReadMsgRtm | PacketType::LongReadTagRtm | PacketType::LongReadRtw
            );
        assert_eq!(payload, if no_data { &[][..] } else { golden::PAYLOAD }, "{name}");
    }
}

#[test]
fn golden_req_header_lengths() {
    let cases: &[(&[u8], usize, usize)] = &[
        // (packet, header_len, payload_offset)
        (golden::EAGER_MSGRTM, 8 + 40, 48),
        (golden::EAGER_TAGRTM, 16 + 4, 20),
        (golden::MEDIUM_MSGRTM, 24 + 8 + 4, 36),
        (golden::LONGCTS_MSGRTM, 24 + 40 + 8, 72),
        (golden::EAGER_RTW, 8 + 24 + 4, 36),
        (golden::LONGCTS_RTR, 24 + 48 + 4, 76),
        (golden::LONGREAD_MSGRTM, 24 + 4, 28 + 48),
        (golden::LONGREAD_RTW, 24 + 24 + 4, 52 + 24),
        (golden::RUNTREAD_TAGRTM, 48 + 4, 52 + 24),
        (golden::DC_MEDIUM_TAGRTM, 40 + 8 + 4, 52),
    ];
    for (bytes, header_len, payload_offset) in cases {
        let p = Packet::parse(bytes).unwrap();
        assert_eq!(p.header_len(), *header_len, "{}", p.packet_type());
        assert_eq!(p.payload_offset(), *payload_offset, "{}", p.packet_type());
    }
}

#[test]
fn golden_non_req_values() {
    let cts = CtsRepr::parse(golden::CTS).unwrap();
    assert_eq!(
        cts,
        CtsRepr {
            flags: CtsFlags::EMULATED_READ | CtsFlags::CONNID_HDR,
            connid: Some(golden::CONNID),
            send_id: golden::SEND_ID,
            recv_id: golden::RECV_ID,
            recv_length: 0x40000,
        }
    );
    let view = CtsPacket::new_checked(golden::CTS).unwrap();
    assert_eq!(
        (view.send_id(), view.recv_id(), view.recv_length()),
        (cts.send_id, cts.recv_id, cts.recv_length)
    );

    let (data, payload) = CtsDataRepr::parse(golden::CTSDATA).unwrap();
    assert_eq!(data.recv_id, golden::RECV_ID);
    assert_eq!(data.seg_offset, golden::SEG_OFFSET);
    assert_eq!(data.seg_length, golden::PAYLOAD.len() as u64);
    assert_eq!(data.connid, Some(golden::CONNID));
    assert_eq!(data.buffer_len(), 32);
    assert_eq!(payload, golden::PAYLOAD);
    let (bare, payload) = CtsDataRepr::parse(golden::CTSDATA_NO_CONNID).unwrap();
    assert_eq!(bare.connid, None);
    assert_eq!(bare.buffer_len(), 24);
    assert_eq!(payload, golden::PAYLOAD);
    assert_eq!(CtsDataPacket::new_checked(golden::CTSDATA).unwrap().payload(), golden::PAYLOAD);

    let (rsp, payload) = ReadRspRepr::parse(golden::READRSP).unwrap();
    assert_eq!((rsp.recv_id, rsp.send_id), (golden::RECV_ID, golden::SEND_ID));
    assert_eq!(rsp.recv_length, 8);
    assert_eq!(rsp.connid, Some(golden::CONNID));
    assert_eq!(payload, golden::PAYLOAD);

    let (atom, payload) = AtomRspRepr::parse(golden::ATOMRSP).unwrap();
    assert_eq!(atom.recv_id, golden::RECV_ID);
    assert_eq!(atom.seg_length, 8);
    assert_eq!(atom.connid, Some(golden::CONNID));
    assert_eq!(payload, golden::PAYLOAD);
    let view = RspPacket::new_checked(golden::ATOMRSP, PacketType::AtomRsp).unwrap();
    assert_eq!(view.send_id(), None);

    let eor = EorRepr::parse(golden::EOR).unwrap();
    assert_eq!(
        (eor.send_id, eor.recv_id, eor.connid),
        (golden::SEND_ID, golden::RECV_ID, Some(golden::CONNID))
    );
    let nack = ReadNackRepr::parse(golden::READ_NACK).unwrap();
    assert_eq!(
        (nack.send_id, nack.recv_id, nack.connid),
        (golden::SEND_ID, golden::RECV_ID, Some(golden::CONNID))
    );
    let receipt = ReceiptRepr::parse(golden::RECEIPT).unwrap();
    assert_eq!((receipt.send_id, receipt.msg_id), (golden::SEND_ID, golden::MSG_ID));
    let view = CtrlPacket::new_checked(golden::RECEIPT, PacketType::Receipt).unwrap();
    assert_eq!(view.msg_id(), golden::MSG_ID);

    let hs = HandshakeRepr::parse(golden::HANDSHAKE).unwrap();
    assert_eq!(hs.nextra_p3(), 4);
    assert_eq!(
        hs.features(),
        extra::RDMA_READ
            | extra::DELIVERY_COMPLETE
            | extra::CONNID_HEADER
            | extra::RUNTING_READ
            | extra::RDMA_WRITE
            | extra::READ_NACK
    );
    assert_eq!(hs.connid, Some(golden::CONNID));
    assert_eq!(hs.host_id, Some(0x0a0b0c0d0e0f1011));
    assert_eq!(hs.device_version, Some(0xefa2));
    assert_eq!(hs.user_recv_qp, None);
    let hs = HandshakeRepr::parse(golden::HANDSHAKE_USER_RECV_QP).unwrap();
    assert_eq!(hs.extra_info.iter().collect::<Vec<_>>(), [0xfb, 0]);
    assert_eq!(hs.host_id, None);
    assert_eq!(hs.user_recv_qp, Some(UserRecvQp { qpn: 0x33, qkey: 0x44556677 }));
    let view = HandshakePacket::new_checked(golden::HANDSHAKE_USER_RECV_QP).unwrap();
    assert_eq!(view.nextra_p3(), 5);
    assert_eq!(view.device_version(), Some(0xefa2));
}

/// Padding and reserved bytes may hold anything on receive (the provider
/// does not clear its buffers); parse ignores them and emit writes zeros.
#[test]
fn dirty_padding_is_ignored_and_re_emitted_as_zero() {
    let cases: &[(&[u8], &[usize])] = &[
        (golden::CTSDATA, &[28, 29, 30, 31]),
        (golden::ATOMRSP, &[8, 9, 10, 11]),
        (golden::WRITE_RTA, &[20, 21, 22, 23]),
        (golden::DC_EAGER_MSGRTM, &[12, 13, 14, 15]),
        (golden::DC_EAGER_RTW, &[12, 15]),
        // raw address: pad after qpn, reserved word, padding to 40
        (golden::EAGER_MSGRTM, &[30, 31, 36, 40, 43, 44, 47]),
        // HANDSHAKE connid padding and device_version reserved word
        (golden::HANDSHAKE, &[20, 23, 36, 39]),
    ];
    for (clean, dirty_at) in cases {
        let mut dirty = clean.to_vec();
        for at in *dirty_at {
            dirty[*at] = 0xff;
        }
        let parsed_clean = Packet::parse(clean).unwrap();
        let parsed_dirty = Packet::parse(&dirty).unwrap();
        let (mut a, mut b) = ([0u8; 256], [0u8; 256]);
        let n = parsed_clean.emit(&mut a);
        parsed_dirty.emit(&mut b);
        // Raw address bytes are carried as received: compare what they mean.
        if let (Packet::Req(rc, _), Packet::Req(rd, _)) = (parsed_clean, parsed_dirty) {
            assert_eq!(
                RawAddr::from_bytes(rc.raw_addr.unwrap_or(&[0; 24])).unwrap(),
                RawAddr::from_bytes(rd.raw_addr.unwrap_or(&[0; 24])).unwrap()
            );
            assert_eq!(rc.msg_id, rd.msg_id);
            continue;
        }
        assert_eq!(parsed_clean, parsed_dirty, "{}", parsed_clean.packet_type());
        assert_eq!(&a[..n], &clean[..n], "{}", parsed_clean.packet_type());
        assert_eq!(&b[..n], &clean[..n], "{}", parsed_clean.packet_type());
    }
}

#[test]
fn req_repr_new_sets_the_providers_flags() {
    assert_eq!(ReqRepr::new(PacketType::EagerMsgRtm).flags, ReqFlags::MSG);
    assert_eq!(ReqRepr::new(PacketType::DcMediumTagRtm).flags, ReqFlags::MSG | ReqFlags::TAGGED);
    assert_eq!(ReqRepr::new(PacketType::FetchRta).flags, ReqFlags::ATOMIC);
    // REQ_RMA is never set by the provider.
    assert_eq!(ReqRepr::new(PacketType::LongCtsRtw).flags, ReqFlags::empty());
    assert_eq!(ReqRepr::new(PacketType::ShortRtr).flags, ReqFlags::empty());
}

#[test]
fn emitting_a_req_built_from_values_gives_the_golden_bytes() {
    let iov = [golden::IOV1];
    let read = [golden::IOV2];
    let mut r = ReqRepr::new(PacketType::LongReadRtw);
    r.msg_length = golden::MSG_LENGTH;
    r.send_id = golden::SEND_ID;
    r.rma_iov = IovList::Host(&iov);
    r.read_iov = IovList::Host(&read);
    r.connid = Some(golden::CONNID);
    let mut buf = [SENTINEL; 128];
    let n = r.emit(&mut buf);
    assert_eq!(&buf[..n], golden::LONGREAD_RTW);
    assert!(buf[n..].iter().all(|b| *b == SENTINEL));

    let addr = golden::RAW_ADDR.to_req_hdr_bytes();
    let mut r = ReqRepr::new(PacketType::EagerMsgRtm);
    r.msg_id = golden::MSG_ID;
    r.raw_addr = Some(&addr);
    let n = r.emit(&mut buf);
    assert_eq!(n, 48);
    buf[n..n + 8].copy_from_slice(golden::PAYLOAD);
    assert_eq!(&buf[..n + 8], golden::EAGER_MSGRTM);
}

#[test]
fn the_req_table_agrees_with_the_types() {
    for id in 0..=255u8 {
        assert_eq!(PacketType::is_req_id(id), PacketType::from(id).is_req(), "type id {id}");
    }
    assert!(PacketType::is_req_id(64) && PacketType::is_req_id(146));
    assert!(!PacketType::is_req_id(3) && !PacketType::is_req_id(142));
}

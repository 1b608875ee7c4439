//! Malformed input: each class returns its typed error, and no input of a
//! bounded random-mutation run panics.

use efapoll::wire::golden::{self, ALL};
use efapoll::wire::*;

fn with(bytes: &[u8], at: usize, patch: &[u8]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v[at..at + patch.len()].copy_from_slice(patch);
    v
}

#[test]
fn every_cut_inside_the_headers_is_truncated() {
    for (name, bytes) in ALL {
        let full = Packet::parse(bytes).unwrap();
        // Data-carrying non-REQ packets state their data length: any cut
        // disagrees with it. REQs infer it, so only cuts into the headers fail.
        let strict_len = matches!(
            full.packet_type(),
            PacketType::CtsData | PacketType::ReadRsp | PacketType::AtomRsp
        );
        let limit = if strict_len { bytes.len() } else { full.payload_offset() };
        for cut in 0..limit {
            let err = Packet::parse(&bytes[..cut]).expect_err(&format!("{name} cut at {cut}"));
            match err {
                WireError::Truncated { need, have, .. } => {
                    assert_eq!(have, cut, "{name}");
                    assert!(need > cut as u64, "{name}: {err}");
                }
                WireError::Length { present, .. } => {
                    assert!(strict_len, "{name} cut at {cut}: {err}");
                    assert!(present < bytes.len());
                }
                other => panic!("{name} cut at {cut}: unexpected {other}"),
            }
        }
    }
}

#[test]
fn version_other_than_4_is_rejected() {
    for (name, bytes) in ALL {
        for v in [0u8, 3, 5, 255] {
            let err = Packet::parse(&with(bytes, 1, &[v])).unwrap_err();
            assert_eq!(err, WireError::Version { found: v }, "{name}");
        }
    }
    assert_eq!(WireError::Version { found: 5 }.to_string(), "protocol version 5, expected 4");
}

#[test]
fn type_ids_not_sent_on_the_wire_are_rejected_with_the_reason() {
    let cases = [
        (1u8, TypeStatus::Retired),
        (2, TypeStatus::Retired),
        (6, TypeStatus::Internal),
        (131, TypeStatus::NeverSent),
        (132, TypeStatus::NeverSent),
        (142, TypeStatus::NeverSent),
        (143, TypeStatus::NeverSent),
        (144, TypeStatus::NeverSent),
        (147, TypeStatus::NeverSent),
        (0, TypeStatus::Unassigned),
        (12, TypeStatus::Unassigned),
        (63, TypeStatus::Unassigned),
        (77, TypeStatus::Unassigned),
        (127, TypeStatus::Unassigned),
        (148, TypeStatus::Unassigned),
        (255, TypeStatus::Unassigned),
    ];
    for (id, status) in cases {
        let packet = with(golden::EAGER_TAGRTM, 0, &[id]);
        assert_eq!(Packet::parse(&packet), Err(WireError::Type { id, status }), "type {id}");
    }
    assert_eq!(
        WireError::Type { id: 1, status: TypeStatus::Retired }.to_string(),
        "packet type 1 is retired"
    );
}

#[test]
fn handshake_nextra_p3_below_3_or_beyond_the_packet() {
    for n in [0u32, 1, 2] {
        let packet = with(golden::HANDSHAKE, 4, &n.to_le_bytes());
        assert_eq!(HandshakeRepr::parse(&packet), Err(WireError::NextraP3 { nextra_p3: n }));
    }
    // One word more than present: the optional fields no longer fit.
    let packet = with(golden::HANDSHAKE, 4, &8u32.to_le_bytes());
    assert!(matches!(HandshakeRepr::parse(&packet), Err(WireError::Truncated { .. })));
    // A huge count must not wrap: need = 8 + (2^32 - 4) * 8.
    let packet = with(golden::HANDSHAKE, 4, &u32::MAX.to_le_bytes());
    assert_eq!(
        HandshakeRepr::parse(&packet),
        Err(WireError::Truncated {
            what: "HANDSHAKE extra_info[]",
            need: 8 + (u32::MAX as u64 - 3) * 8,
            have: golden::HANDSHAKE.len(),
        })
    );
    // nextra_p3 = 3: no extra_info word, still valid.
    let mut hs = golden::HANDSHAKE[..8].to_vec();
    hs[2..4].copy_from_slice(&0u16.to_le_bytes());
    hs[4..8].copy_from_slice(&3u32.to_le_bytes());
    let repr = HandshakeRepr::parse(&hs).unwrap();
    assert!(repr.extra_info.is_empty());
    assert_eq!(repr.features(), 0);
}

#[test]
fn handshake_optional_field_cut_short() {
    // HOST_ID flagged but the packet ends after connid.
    let cut = &golden::HANDSHAKE[..24];
    assert_eq!(
        HandshakeRepr::parse(cut),
        Err(WireError::Truncated { what: "HANDSHAKE host_id", need: 32, have: 24 })
    );
    let mut qp = golden::HANDSHAKE.to_vec();
    qp[2..4].copy_from_slice(&(0x8000u16 | 0x7).to_le_bytes());
    assert_eq!(
        HandshakeRepr::parse(&qp),
        Err(WireError::Truncated { what: "HANDSHAKE qpn/qkey", need: 48, have: 40 })
    );
}

#[test]
fn raw_address_size_under_24_or_past_the_end() {
    // EAGER_MSGRTM: size at offset 8.
    for size in [0u32, 1, 16, 23] {
        let packet = with(golden::EAGER_MSGRTM, 8, &size.to_le_bytes());
        assert_eq!(Packet::parse(&packet), Err(WireError::RawAddrSize { size: size as u64 }));
    }
    // 24 is the shortest meaningful address; the rest becomes data.
    let packet = with(golden::EAGER_MSGRTM, 8, &24u32.to_le_bytes());
    let Packet::Req(repr, payload) = Packet::parse(&packet).unwrap() else { panic!() };
    assert_eq!(RawAddr::from_bytes(repr.raw_addr.unwrap()).unwrap(), golden::RAW_ADDR);
    assert_eq!(payload.len(), golden::EAGER_MSGRTM.len() - 8 - 4 - 24);
    for size in [45u32, 1 << 20, u32::MAX] {
        let packet = with(golden::EAGER_MSGRTM, 8, &size.to_le_bytes());
        assert_eq!(
            Packet::parse(&packet),
            Err(WireError::Truncated {
                what: "raw address",
                need: 8 + 4 + size as u64,
                have: golden::EAGER_MSGRTM.len()
            })
        );
    }
}

#[test]
fn req_optional_headers_cut_short() {
    // EAGER_MSGRTM with CQ data and connid flagged but absent.
    let base = [64u8, 4, 0x04, 0x00, 1, 0, 0, 0];
    let mut p = base.to_vec();
    p[2..4].copy_from_slice(&(0x0004u16 | 0x2).to_le_bytes());
    assert_eq!(
        Packet::parse(&p),
        Err(WireError::Truncated { what: "CQ data header", need: 16, have: 8 })
    );
    p[2..4].copy_from_slice(&(0x0004u16 | 0x8000).to_le_bytes());
    p.extend_from_slice(&[1, 2, 3]);
    assert_eq!(
        Packet::parse(&p),
        Err(WireError::Truncated { what: "connid header", need: 12, have: 11 })
    );
    p.push(4);
    let Packet::Req(repr, payload) = Packet::parse(&p).unwrap() else { panic!() };
    assert_eq!(repr.connid, Some(0x04030201));
    assert!(payload.is_empty());
    // Raw address flagged, not even its size present.
    p[2..4].copy_from_slice(&(0x0004u16 | 0x1).to_le_bytes());
    p.truncate(10);
    assert_eq!(
        Packet::parse(&p),
        Err(WireError::Truncated { what: "raw address header", need: 12, have: 10 })
    );
    // CTSDATA with CONNID_HDR but only the 24-byte header.
    let mut d = golden::CTSDATA_NO_CONNID[..24].to_vec();
    d[8..16].copy_from_slice(&0u64.to_le_bytes());
    d[2..4].copy_from_slice(&0x8000u16.to_le_bytes());
    assert_eq!(
        Packet::parse(&d),
        Err(WireError::Truncated { what: "CTSDATA connid header", need: 32, have: 24 })
    );
}

#[test]
fn iov_counts_cannot_wrap() {
    // EAGER_RTW rma_iov_count at 4: u32::MAX * 24 exceeds u32 but not u64.
    let packet = with(golden::EAGER_RTW, 4, &u32::MAX.to_le_bytes());
    assert_eq!(
        Packet::parse(&packet),
        Err(WireError::Truncated {
            what: "rma_iov[]",
            need: 8 + u32::MAX as u64 * 24,
            have: golden::EAGER_RTW.len()
        })
    );
    // A count whose product wraps a u32 to a small number: 0xAAAAAAAB * 24
    // = 0x1_0000_0000 + 8.
    let packet = with(golden::EAGER_RTW, 4, &0xAAAA_AAABu32.to_le_bytes());
    assert!(matches!(Packet::parse(&packet), Err(WireError::Truncated { what: "rma_iov[]", .. })));
    // read_iov_count of LONGREAD_MSGRTM at 20.
    let packet = with(golden::LONGREAD_MSGRTM, 20, &3u32.to_le_bytes());
    assert_eq!(
        Packet::parse(&packet),
        Err(WireError::Truncated { what: "read_iov[]", need: 28 + 72, have: 28 + 48 })
    );
}

#[test]
fn data_lengths_that_disagree_with_the_data_present() {
    let cases: &[(&[u8], usize, &str)] = &[
        (golden::CTSDATA, 8, "CTSDATA seg_length"),
        (golden::READRSP, 16, "READRSP recv_length"),
        (golden::ATOMRSP, 16, "ATOMRSP seg_length"),
    ];
    for (bytes, at, what) in cases {
        for len in [0u64, 7, 9, u64::MAX] {
            let packet = with(bytes, *at, &len.to_le_bytes());
            assert_eq!(
                Packet::parse(&packet),
                Err(WireError::Length { what, field: len, present: 8 }),
                "{what} = {len}"
            );
        }
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert_eq!(Packet::parse(&longer), Err(WireError::Length { what, field: 8, present: 9 }));
    }
}

#[test]
fn a_codec_given_another_type_says_so() {
    assert_eq!(
        CtsRepr::parse(golden::EOR),
        Err(WireError::WrongType { expected: PacketType::Cts, found: PacketType::Eor })
    );
    assert_eq!(
        ReqRepr::parse(golden::CTS).map(|_| ()),
        Err(WireError::NotReq { ptype: PacketType::Cts })
    );
}

/// xorshift64*: deterministic, so a failure reproduces from its iteration.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Hundreds of thousands of mutated golden packets: none panics, and every
/// one that parses re-emits to bytes that parse to the same packet.
#[test]
fn random_mutations_never_panic() {
    const ITERATIONS: usize = 400_000;
    const EXTREMES: [u32; 8] = [0, 1, 2, 3, 23, 24, 0x8000_0000, u32::MAX];
    let mut rng = Rng(0x5eed_efa0_4001);
    let (mut parsed, mut rejected) = (0usize, [0usize; WireError::KINDS]);
    let mut buf = Vec::with_capacity(4096);
    let mut out = vec![0u8; 4096];
    for i in 0..ITERATIONS {
        let (_, seed) = ALL[rng.below(ALL.len())];
        buf.clear();
        buf.extend_from_slice(seed);
        for _ in 0..1 + rng.below(3) {
            match rng.below(6) {
                0 if !buf.is_empty() => {
                    let at = rng.below(buf.len());
                    buf[at] ^= 1 << rng.below(8);
                }
                1 if !buf.is_empty() => {
                    let at = rng.below(buf.len());
                    buf[at] = rng.next() as u8;
                }
                2 if buf.len() >= 4 => {
                    let at = rng.below(buf.len() - 3);
                    let v = EXTREMES[rng.below(EXTREMES.len())];
                    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
                3 if buf.len() >= 4 => {
                    // Flags: every optional-header combination.
                    let v = rng.next() as u16;
                    buf[2..4].copy_from_slice(&v.to_le_bytes());
                }
                4 => {
                    let cut = rng.below(buf.len() + 1);
                    buf.truncate(cut);
                }
                _ => {
                    for _ in 0..rng.below(64) {
                        buf.push(rng.next() as u8);
                    }
                }
            }
        }
        match Packet::parse(&buf) {
            Ok(p) => {
                parsed += 1;
                let n = p.emit(&mut out);
                let payload = p.payload();
                out[n..n + payload.len()].copy_from_slice(payload);
                let again = Packet::parse(&out[..n + payload.len()])
                    .unwrap_or_else(|e| panic!("iteration {i}: re-emitted packet rejected: {e}"));
                assert_eq!(again, p, "iteration {i}");
            }
            Err(e) => rejected[e.kind()] += 1,
        }
    }
    // The run exercised both outcomes and the main rejection reasons.
    assert!(parsed > ITERATIONS / 20, "parsed {parsed}");
    for kind in [0, 1, 2, 5, 6, 7] {
        assert!(rejected[kind] > 100, "{}: {}", WireError::kind_name(kind), rejected[kind]);
    }
}

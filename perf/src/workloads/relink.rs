//! The Relink codec: parse and emit of the spec's example packets (relink
//! 2.3.3.3's short, small message; 2.3.2's sequence acknowledgement).

use std::hint::black_box;

use efapoll::relink::{IdSizes, MessageRepr, PacketRepr, Parsed, SequenceAck, Target, WireLimits};

use super::{Kind, Unit, Workload};

const PARTS: [&[u8]; 3] = [b"abc", b"", b"hello"];

/// A packet and the channel id sizes seen from its sender.
fn packet(which: &str) -> (PacketRepr<'static>, IdSizes) {
    match which {
        "message" => (
            PacketRepr::Message(MessageRepr::new(Target::Unicast(0x2a.into()), &PARTS)),
            IdSizes::new(1, 7),
        ),
        _ => (
            PacketRepr::SequenceAcknowledgement {
                target: Target::Unicast(0x0102_0304_0506_0708.into()),
                ack: SequenceAck::Consumed,
                seq: 0xdead_beef,
            },
            // Acknowledgements name the receiver's channels.
            IdSizes::new(2, 8),
        ),
    }
}

pub(super) fn workloads(v: &mut Vec<Workload>) {
    // About 50 ms each: (packet, parses, emits).
    for (which, parses, emits) in
        [("message", 3_500_000, 1_000_000), ("seq_ack", 3_000_000, 2_000_000)]
    {
        let parse =
            Workload::new(format!("relink/parse/{which}"), Unit::Ops, Kind::Rate, parses, {
                move || {
                    let (repr, ids) = packet(which);
                    let mut bytes = vec![0u8; repr.buffer_len(ids)];
                    repr.emit(&mut bytes, ids).unwrap();
                    let limits = WireLimits::default();
                    Box::new(move |n| {
                        for _ in 0..n {
                            let p = PacketRepr::parse(black_box(&bytes), ids, &limits).unwrap();
                            debug_assert!(matches!(p, Parsed::Complete { .. }));
                            black_box(p);
                        }
                    })
                }
            });
        v.push(if which == "message" { parse.small() } else { parse });
        let emit = Workload::new(format!("relink/emit/{which}"), Unit::Ops, Kind::Rate, emits, {
            move || {
                let (repr, ids) = packet(which);
                let mut buf = [0u8; 64];
                Box::new(move |n| {
                    for _ in 0..n {
                        black_box(black_box(&repr).emit(black_box(&mut buf), ids).unwrap());
                    }
                })
            }
        });
        v.push(if which == "message" { emit.small() } else { emit });
    }
}

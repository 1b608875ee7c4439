//! Parsing and emitting allocate nothing.

use efapoll::mem::allocations_on_this_thread;
use efapoll::wire::{Packet, ReqPacket, golden};

#[test]
fn parse_and_emit_allocate_nothing() {
    let mut buf = [0u8; 256];
    let mut bad = golden::EAGER_RTW.to_vec();
    bad[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let before = allocations_on_this_thread();
    let mut emitted = 0;
    for (_, bytes) in golden::ALL {
        let packet = Packet::parse(bytes).unwrap();
        emitted += packet.emit(&mut buf);
        if let Ok(view) = ReqPacket::new_checked(*bytes) {
            emitted += view.payload().len();
        }
    }
    // Rejections too: the error is a value, not a boxed message.
    assert!(Packet::parse(&bad).is_err());
    assert!(Packet::parse(&golden::EOR[..3]).is_err());
    assert_eq!(allocations_on_this_thread() - before, 0);
    assert!(emitted > 1000);
    // The counter does count: a Vec allocates once.
    let v: Vec<u8> = Vec::with_capacity(16);
    assert_eq!(allocations_on_this_thread() - before, 1);
    drop(v);
}

//! Emulated atomics: every (operation, datatype) pair the provider accepts
//! gives what a sequential reference model gives, in msg_id order with
//! messages, and protection violations touch nothing.

use crate::common;

use std::time::Duration;

use common::{Mem, World, iov, span};
use efapoll::device::Access;
use efapoll::device::fault::Faults;
use efapoll::device::sim::SimConfig;
use efapoll::endpoint::{AtomicOp, Config, Datatype, DropReason, Op, PeerId, Status, atomic_apply};
use efapoll::wire::RmaIov;

const TO_B: PeerId = PeerId(0);

fn world(seed: u64) -> World {
    let sim = SimConfig { seed, faults: Faults::reorder(seed, 8), ..SimConfig::default() };
    let cfg = Config { response_timeout: Duration::from_millis(200), ..Config::default() };
    World::pair(sim, cfg)
}

/// xorshift for operand values.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// An element of `dt` as bytes: small integers (so that products and
    /// sums stay meaningful), or exact binary fractions for floats.
    fn element(&mut self, dt: Datatype) -> Vec<u8> {
        let v = (self.next() % 7) as i64 - 3;
        match dt {
            Datatype::Float => (v as f32 * 0.5).to_le_bytes().to_vec(),
            Datatype::Double => (v as f64 * 0.25).to_le_bytes().to_vec(),
            _ => v.to_le_bytes()[..dt.size()].to_vec(),
        }
    }
}

/// Which call carries `op`.
fn calls(op: AtomicOp) -> &'static [&'static str] {
    match op as u32 {
        0..=9 => &["atomic", "fetch"],
        10 => &["fetch"],
        11 => &["atomic", "fetch"],
        _ => &["compare"],
    }
}

#[test]
fn every_operation_and_datatype_matches_a_sequential_model() {
    const ELEMS: u64 = 4;
    for (d, &dt) in Datatype::ALL.iter().enumerate() {
        let mut w = world(d as u64 + 1);
        let n = ELEMS * dt.size() as u64;
        let target = w.eps[1].register(n, Access::REMOTE_ATOMIC).unwrap();
        let _ = w.connect(0, 1);
        // Operands, compares and results for many operations at once.
        let ops: Vec<(AtomicOp, &str)> = AtomicOp::ALL
            .iter()
            .filter(|op| op.valid_for(dt))
            .flat_map(|op| calls(*op).iter().map(move |c| (*op, *c)))
            .collect();
        let count = ops.len() as u64 * 3;
        let operands = w.eps[0].register(n * count, Access::empty()).unwrap();
        let compares = w.eps[0].register(n * count, Access::empty()).unwrap();
        let results = w.eps[0].register(n * count, Access::empty()).unwrap();
        let mut rng = Rng(0x1234 + d as u64);
        let mut model = vec![0u8; n as usize];
        for e in 0..ELEMS as usize {
            let v = rng.element(dt);
            model[e * dt.size()..(e + 1) * dt.size()].copy_from_slice(&v);
        }
        w.eps[1].write_mem(target.id, 0, &model).unwrap();
        let mut expected_results = Vec::new();
        for (k, &(op, call)) in ops.iter().cycle().take(count as usize).enumerate() {
            let at = k as u64 * n;
            let mut operand = Vec::new();
            let mut compare = Vec::new();
            for _ in 0..ELEMS {
                operand.extend(rng.element(dt));
                // Compares equal to the current value half the time, so
                // that the swaps happen.
                compare.extend(rng.element(dt));
            }
            if k % 2 == 0 {
                compare.copy_from_slice(&model);
            }
            w.eps[0].write_mem(operands.id, at, &operand).unwrap();
            w.eps[0].write_mem(compares.id, at, &compare).unwrap();
            let mut old = vec![0u8; n as usize];
            atomic_apply(dt, op, &mut model, &operand, &compare, Some(&mut old));
            let remote = iov(&target, 0, n);
            let (o, c, r) = (span(&operands, at, n), span(&compares, at, n), span(&results, at, n));
            match call {
                "atomic" => w.eps[0].atomic(TO_B, op, dt, o, remote, k as u64).unwrap(),
                "fetch" => {
                    w.eps[0].fetch_atomic(TO_B, op, dt, o, r, remote, k as u64).unwrap();
                    expected_results.push((at, old));
                }
                _ => {
                    w.eps[0].compare_atomic(TO_B, op, dt, o, c, r, remote, k as u64).unwrap();
                    expected_results.push((at, old));
                }
            }
        }
        w.drive_for(Duration::from_secs(10), |w| w.done[0].len() == count as usize);
        assert!(w.done[0].iter().all(|c| c.status == Status::Ok && c.op == Op::Atomic), "{dt:?}");
        assert_eq!(w.eps[1].mem(target.id), &model[..], "{dt:?}: final values");
        for (at, old) in expected_results {
            assert_eq!(
                &w.eps[0].mem(results.id)[at as usize..(at + n) as usize],
                &old[..],
                "{dt:?}: fetched at {at}"
            );
        }
        assert!(w.eps[1].counters().reordered > 0 || d > 0, "reordering exercised");
    }
}

/// Atomics and messages land in msg_id order: a message that overwrites
/// the atomic target sits between two additions.
#[test]
fn atomics_are_ordered_with_messages() {
    for seed in 1..=20 {
        let mut w = world(seed);
        let _ = w.connect(0, 1);
        let target = w.eps[1].register(8, Access::REMOTE_ATOMIC).unwrap();
        let one = w.register(0, 8);
        let hundred = w.register(0, 8);
        w.eps[0].write_mem(one.id, 0, &1u64.to_le_bytes()).unwrap();
        w.eps[0].write_mem(hundred.id, 0, &100u64.to_le_bytes()).unwrap();
        // The receive for the message is the atomic target itself.
        w.eps[1].recv(span(&target, 0, 8), None, 7).unwrap();
        let remote = iov(&target, 0, 8);
        w.eps[0]
            .atomic(TO_B, AtomicOp::Sum, Datatype::Uint64, span(&one, 0, 8), remote, 1)
            .unwrap();
        w.eps[0].send(TO_B, span(&hundred, 0, 8), 2).unwrap();
        w.eps[0]
            .atomic(TO_B, AtomicOp::Sum, Datatype::Uint64, span(&one, 0, 8), remote, 3)
            .unwrap();
        w.drive_until(10_000, |w| w.done[0].len() == 3 && w.done[1].len() == 1);
        w.settle();
        let x = u64::from_le_bytes(w.eps[1].mem(target.id).try_into().unwrap());
        assert_eq!(x, 101, "seed {seed}: add, overwrite, add");
    }
}

#[test]
fn atomic_protection_violations_touch_nothing() {
    let mut w = world(3);
    let _ = w.connect(0, 1);
    let target = w.eps[1].register(64, Access::REMOTE_ATOMIC).unwrap();
    let read_only = w.eps[1].register(64, Access::REMOTE_READ).unwrap();
    w.fill(1, &target, 1);
    w.fill(1, &read_only, 2);
    let before = (w.eps[1].mem(target.id).to_vec(), w.eps[1].mem(read_only.id).to_vec());
    let o = w.register(0, 8);
    let r = w.register(0, 8);
    let bad = [
        RmaIov { key: target.key ^ 0x7777_0000_0000, ..iov(&target, 0, 8) },
        RmaIov { addr: target.addr - 8, ..iov(&target, 0, 8) },
        iov(&target, 60, 8),
        RmaIov { addr: u64::MAX - 3, len: 8, key: target.key },
        iov(&read_only, 0, 8),
    ];
    for (k, remote) in bad.iter().enumerate() {
        w.eps[0]
            .fetch_atomic(
                TO_B,
                AtomicOp::Sum,
                Datatype::Uint64,
                span(&o, 0, 8),
                span(&r, 0, 8),
                *remote,
                k as u64,
            )
            .unwrap();
        w.eps[0]
            .atomic(TO_B, AtomicOp::Write, Datatype::Uint64, span(&o, 0, 8), *remote, 10 + k as u64)
            .unwrap();
    }
    w.drive_for(Duration::from_secs(10), |w| w.done[0].len() == 2 * bad.len());
    for c in &w.done[0] {
        if c.ctx < 10 {
            assert_eq!(c.status, Status::Timeout, "a fetch with no answer fails");
        }
    }
    assert_eq!((w.eps[1].mem(target.id).to_vec(), w.eps[1].mem(read_only.id).to_vec()), before);
    assert_eq!(w.eps[1].counters().drops(DropReason::RemoteAccess), 2 * bad.len() as u64);
    assert_eq!(w.eps[0].counters().timeouts, bad.len() as u64);
}

#[test]
fn bad_atomic_arguments_are_refused_at_the_call() {
    let mut w = world(1);
    let _ = w.connect(0, 1);
    let target = w.eps[1].register(64, Access::REMOTE_ATOMIC).unwrap();
    let o = w.register(0, 16);
    let remote = iov(&target, 0, 8);
    use efapoll::endpoint::Error;
    // A bitwise operation on floats, a fetch-only operation without fetch,
    // a compare operation through the non-compare call, a ragged length.
    assert_eq!(
        w.eps[0].atomic(TO_B, AtomicOp::Bxor, Datatype::Double, span(&o, 0, 8), remote, 1),
        Err(Error::Invalid)
    );
    assert_eq!(
        w.eps[0].atomic(TO_B, AtomicOp::Read, Datatype::Uint64, span(&o, 0, 8), remote, 1),
        Err(Error::Invalid)
    );
    assert_eq!(
        w.eps[0].atomic(TO_B, AtomicOp::Cswap, Datatype::Uint64, span(&o, 0, 8), remote, 1),
        Err(Error::Invalid)
    );
    assert_eq!(
        w.eps[0].atomic(
            TO_B,
            AtomicOp::Sum,
            Datatype::Uint32,
            span(&o, 0, 6),
            iov(&target, 0, 6),
            1
        ),
        Err(Error::Invalid)
    );
    let big = w.register(0, 9000);
    assert_eq!(
        w.eps[0].atomic(
            TO_B,
            AtomicOp::Sum,
            Datatype::Uint8,
            span(&big, 0, 9000),
            iov(&target, 0, 9000),
            1
        ),
        Err(Error::TooLarge)
    );
}

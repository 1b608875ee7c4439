//! The SPSC ring: single-thread semantics, a two-thread sequenced transfer, and drops.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;

use efapoll_lcores::ring::{CapacityError, Consumer, NoRoom, Producer, spsc};

#[test]
fn ends_can_move_to_other_threads() {
    fn movable<T: Send>() {}
    movable::<Producer<String>>();
    movable::<Consumer<String>>();
}

#[test]
fn capacity_must_be_a_power_of_two() {
    for capacity in [0, 3, 6, 1000] {
        assert_eq!(spsc::<u8>(capacity).unwrap_err(), CapacityError { capacity });
    }
    for capacity in [1, 2, 1024] {
        let (tx, rx) = spsc::<u8>(capacity).unwrap();
        assert_eq!(tx.capacity(), capacity);
        assert_eq!(rx.capacity(), capacity);
    }
}

#[test]
fn full_ring_hands_the_item_back_and_empty_ring_gives_none() {
    let (mut tx, mut rx) = spsc::<String>(2).unwrap();
    assert_eq!(rx.pop(), None);
    tx.push("a".into()).unwrap();
    tx.push("b".into()).unwrap();
    assert_eq!(tx.push("c".into()), Err("c".to_string()));
    assert_eq!(tx.free_space(), 0);
    assert_eq!(rx.len(), 2);
    assert_eq!(rx.pop().as_deref(), Some("a"));
    tx.push("c".into()).unwrap();
    assert_eq!(rx.pop().as_deref(), Some("b"));
    assert_eq!(rx.pop().as_deref(), Some("c"));
    assert_eq!(rx.pop(), None);
    assert!(rx.is_empty());
}

#[test]
fn capacity_one_ring_alternates() {
    let (mut tx, mut rx) = spsc::<u32>(1).unwrap();
    for i in 0..100 {
        tx.push(i).unwrap();
        assert_eq!(tx.push(i), Err(i));
        assert_eq!(rx.pop(), Some(i));
        assert_eq!(rx.pop(), None);
    }
}

#[test]
fn wraps_around_many_times_in_order() {
    let (mut tx, mut rx) = spsc::<u64>(8).unwrap();
    let (mut next_in, mut next_out) = (0u64, 0u64);
    // Batch sizes that do not divide the capacity, so every slot offset is crossed.
    for round in 0..10_000u64 {
        let batch = 1 + round % 7;
        for _ in 0..batch {
            tx.push(next_in).unwrap();
            next_in += 1;
        }
        while let Some(item) = rx.pop() {
            assert_eq!(item, next_out);
            next_out += 1;
        }
    }
    assert_eq!(next_out, next_in);
    assert!(next_in > 1000 * 8, "the ring wrapped many times");
}

#[test]
fn push_burst_takes_what_fits_and_leaves_the_rest_in_the_iterator() {
    let (mut tx, mut rx) = spsc::<u32>(8).unwrap();
    let mut items = 0..10;
    assert_eq!(tx.push_burst(&mut items), 8);
    assert_eq!(items.next(), Some(8), "item 8 was not consumed");
    assert_eq!(tx.push_burst(&mut (100..105)), 0, "full ring takes nothing");
    assert_eq!(rx.pop_burst(3).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(tx.push_burst(&mut (8..10)), 2);
    assert_eq!(tx.push_burst(&mut std::iter::empty()), 0);
    assert_eq!(rx.pop_burst(usize::MAX).collect::<Vec<_>>(), [3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(rx.pop_burst(32).count(), 0);
}

#[test]
fn pop_burst_leaves_items_it_did_not_yield() {
    let (mut tx, mut rx) = spsc::<u32>(8).unwrap();
    tx.push_burst(&mut (0..6));
    let mut burst = rx.pop_burst(4);
    assert_eq!(burst.len(), 4);
    assert_eq!(burst.next(), Some(0));
    drop(burst);
    assert_eq!(rx.len(), 5);
    assert_eq!(tx.free_space(), 3, "the popped slot went back to the producer");
    assert_eq!(rx.pop_burst(32).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
}

#[test]
fn bulk_push_is_all_or_nothing() {
    let (mut tx, mut rx) = spsc::<u32>(4).unwrap();
    tx.push(0).unwrap();
    let mut too_many = vec![1, 2, 3, 4].into_iter();
    assert_eq!(tx.push_bulk(&mut too_many), Err(NoRoom { needed: 4, free: 3 }));
    assert_eq!(too_many.len(), 4, "nothing was taken");
    assert_eq!(rx.len(), 1, "nothing was pushed");
    let mut fits = vec![1, 2, 3].into_iter();
    tx.push_bulk(&mut fits).unwrap();
    assert_eq!(fits.len(), 0);
    assert_eq!(rx.pop_burst(8).collect::<Vec<_>>(), [0, 1, 2, 3]);
}

#[test]
fn bulk_pop_is_all_or_nothing() {
    let (mut tx, mut rx) = spsc::<u32>(8).unwrap();
    tx.push_burst(&mut (0..3));
    assert!(rx.pop_bulk(4).is_none());
    assert_eq!(rx.len(), 3, "nothing was popped");
    assert_eq!(rx.pop_bulk(2).unwrap().collect::<Vec<_>>(), [0, 1]);
    assert_eq!(rx.pop_bulk(1).unwrap().collect::<Vec<_>>(), [2]);
    assert!(rx.pop_bulk(1).is_none());
}

#[test]
fn abandoned_ends_are_reported() {
    let (tx, rx) = spsc::<u32>(2).unwrap();
    assert!(!tx.is_abandoned());
    drop(rx);
    assert!(tx.is_abandoned());
}

/// Counts how many of its values were dropped.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn counted_ring(capacity: usize) -> (Producer<Counted>, Consumer<Counted>, Arc<AtomicUsize>) {
    let (tx, rx) = spsc(capacity).unwrap();
    (tx, rx, Arc::new(AtomicUsize::new(0)))
}

#[test]
fn dropping_the_ring_drops_remaining_items_once() {
    for consumer_first in [false, true] {
        let (mut tx, mut rx, drops) = counted_ring(8);
        for _ in 0..6 {
            assert!(tx.push(Counted(drops.clone())).is_ok());
        }
        drop(rx.pop());
        drop(rx.pop());
        assert_eq!(drops.load(Ordering::Relaxed), 2);
        if consumer_first {
            drop(rx);
            drop(tx);
        } else {
            drop(tx);
            drop(rx);
        }
        assert_eq!(drops.load(Ordering::Relaxed), 6, "consumer_first={consumer_first}");
    }
}

#[test]
fn a_full_ring_hands_back_the_item_without_dropping_it() {
    let (mut tx, _rx, drops) = counted_ring(1);
    assert!(tx.push(Counted(drops.clone())).is_ok());
    let refused = tx.push(Counted(drops.clone())).unwrap_err();
    assert_eq!(drops.load(Ordering::Relaxed), 0);
    drop(refused);
    assert_eq!(drops.load(Ordering::Relaxed), 1);
}

#[test]
fn a_leaked_burst_does_not_cause_a_double_drop() {
    let (mut tx, mut rx, drops) = counted_ring(4);
    for _ in 0..4 {
        assert!(tx.push(Counted(drops.clone())).is_ok());
    }
    let mut burst = rx.pop_burst(4);
    drop(burst.next());
    drop(burst.next());
    // Leaking the burst skips its index store; the consumer must still publish on drop.
    std::mem::forget(burst);
    drop(rx);
    drop(tx);
    assert_eq!(drops.load(Ordering::Relaxed), 4);
}

#[test]
fn a_panicking_iterator_loses_no_pushed_item() {
    let (mut tx, mut rx, drops) = counted_ring(8);
    let counter = drops.clone();
    let mut made = 0;
    let mut items = std::iter::from_fn(move || {
        made += 1;
        assert!(made <= 3, "the iterator fails on its fourth item");
        Some(Counted(counter.clone()))
    });
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tx.push_burst(&mut items);
    }));
    assert!(outcome.is_err());
    drop(items);
    drop(tx);
    assert_eq!(rx.pop_burst(8).count(), 3);
    assert_eq!(drops.load(Ordering::Relaxed), 3);
}

/// Held by each two-thread test: both of its threads poll, and two is all the cores there are.
fn two_polling_threads() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Spins a little, then yields: the machine has two cores and these threads do not own them.
fn back_off(tries: &mut u32) {
    if *tries < 64 {
        std::hint::spin_loop();
        *tries += 1;
    } else {
        thread::yield_now();
    }
}

#[test]
fn two_threads_move_millions_of_items_without_loss_duplication_or_reordering() {
    const ITEMS: u64 = 4_000_000;
    let _cores = two_polling_threads();
    let (mut tx, mut rx) = spsc::<u64>(1024).unwrap();
    let producer = thread::spawn(move || {
        let mut next = 0u64;
        let mut tries = 0;
        while next < ITEMS {
            // Alternate single pushes with bursts of varying size to exercise both paths.
            let pushed = if next.is_multiple_of(3) {
                tx.push(next).map(|()| 1).unwrap_or(0)
            } else {
                let end = (next + 1 + next % 61).min(ITEMS);
                tx.push_burst(&mut (next..end)) as u64
            };
            if pushed == 0 {
                back_off(&mut tries);
            } else {
                tries = 0;
            }
            next += pushed;
        }
    });
    let mut expected = 0u64;
    let mut tries = 0;
    while expected < ITEMS {
        let before = expected;
        if expected.is_multiple_of(2) {
            if let Some(item) = rx.pop() {
                assert_eq!(item, expected);
                expected += 1;
            }
        } else {
            for item in rx.pop_burst(32) {
                assert_eq!(item, expected);
                expected += 1;
            }
        }
        if expected == before {
            back_off(&mut tries);
        } else {
            tries = 0;
        }
    }
    producer.join().unwrap();
    assert_eq!(rx.pop(), None, "no item beyond the last");
}

#[test]
fn two_threads_move_owned_items_and_every_one_is_dropped_once() {
    const ITEMS: usize = 200_000;
    let _cores = two_polling_threads();
    let (mut tx, mut rx, drops) = counted_ring(64);
    let counter = drops.clone();
    let producer = thread::spawn(move || {
        let mut tries = 0;
        let mut item = Some(Counted(counter.clone()));
        let mut sent = 0;
        while sent < ITEMS {
            match tx.push(item.take().unwrap()) {
                Ok(()) => {
                    sent += 1;
                    tries = 0;
                    item = Some(Counted(counter.clone()));
                }
                Err(back) => {
                    item = Some(back);
                    back_off(&mut tries);
                }
            }
        }
        // One item was made but never sent; it is dropped here.
    });
    let mut received = 0;
    let mut tries = 0;
    // Receive all but the last few, then drop the ring with those still inside.
    while received < ITEMS - 10 {
        match rx.pop() {
            Some(_) => {
                received += 1;
                tries = 0;
            }
            None => back_off(&mut tries),
        }
    }
    producer.join().unwrap();
    drop(rx);
    assert_eq!(drops.load(Ordering::Relaxed), ITEMS + 1);
}

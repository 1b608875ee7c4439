//! A bounded single-producer single-consumer ring for messages between two lcores.
//!
//! [`spsc`] makes a ring of a power-of-two capacity and splits it into a [`Producer`] and a
//! [`Consumer`], each `Send` but not `Clone`, so exactly one thread pushes and one pops.
//! Nothing blocks: a full ring hands the item back (back-pressure), an empty one returns
//! `None`. As in DPDK's `rte_ring`, `*_burst` moves up to n items and `*_bulk` all n or none.
//!
//! Layout, after rigtorp's SPSCQueue and DPDK: the consumer's index (`head`) and the
//! producer's (`tail`) sit on separate cache lines, and each side keeps its own index and a
//! cached copy of the other's in its handle, so it reads the other side's line only when
//! the cached copy says the ring is full (or empty). Indices run freely and wrap at
//! `usize::MAX`; a slot is `index & mask`.
//!
//! Ordering: the producer writes a slot, then stores `tail` with Release; the consumer loads
//! `tail` with Acquire before reading the slot. The consumer moves the item out, then stores
//! `head` with Release; the producer loads `head` with Acquire before reusing the slot.
//!
//! ```
//! use efapoll_lcores::ring::spsc;
//!
//! let (mut tx, mut rx) = spsc::<u32>(4)?;
//! assert_eq!(tx.push_burst(&mut (0..6)), 4); // room for four
//! assert_eq!(tx.push(9), Err(9)); // full: the item comes back
//! let popped: Vec<u32> = rx.pop_burst(32).collect();
//! assert_eq!(popped, [0, 1, 2, 3]);
//! # Ok::<(), efapoll_lcores::ring::CapacityError>(())
//! ```
//!
//! Each end has one owner; neither can be cloned:
//!
//! ```compile_fail
//! let (tx, _rx) = efapoll_lcores::ring::spsc::<u32>(4).unwrap();
//! let second_producer = tx.clone();
//! ```

use std::cell::UnsafeCell;
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

/// A ring capacity that is not a power of two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ring capacity {capacity} is not a power of two (1, 2, 4, ...)")]
pub struct CapacityError {
    /// The capacity asked for.
    pub capacity: usize,
}

/// A bulk push that did not fit: nothing was pushed, the items are still the caller's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the ring has room for {free} items but {needed} were offered; none was pushed")]
pub struct NoRoom {
    /// How many items the bulk push offered.
    pub needed: usize,
    /// How many slots were free.
    pub free: usize,
}

/// Makes a ring holding up to `capacity` items (a power of two) and returns its two ends.
pub fn spsc<T>(capacity: usize) -> Result<(Producer<T>, Consumer<T>), CapacityError> {
    spsc_from_index(capacity, 0)
}

/// A ring whose indices start at `start` rather than 0, so tests can cross `usize::MAX`.
fn spsc_from_index<T>(
    capacity: usize,
    start: usize,
) -> Result<(Producer<T>, Consumer<T>), CapacityError> {
    if !capacity.is_power_of_two() {
        return Err(CapacityError { capacity });
    }
    let ring = Arc::new(Ring {
        head: CachePadded::new(AtomicUsize::new(start)),
        tail: CachePadded::new(AtomicUsize::new(start)),
        slots: (0..capacity).map(|_| UnsafeCell::new(MaybeUninit::uninit())).collect(),
    });
    let mask = capacity - 1;
    Ok((
        Producer { ring: Arc::clone(&ring), mask, tail: start, cached_head: start },
        Consumer { ring, mask, head: start, cached_tail: start },
    ))
}

struct Ring<T> {
    /// Index of the next item to pop; stored by the consumer only.
    head: CachePadded<AtomicUsize>,
    /// Index of the next slot to fill; stored by the producer only.
    tail: CachePadded<AtomicUsize>,
    /// Slots in `head..tail` (wrapping, masked) hold items; the others are uninitialised.
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
}

// SAFETY: the ring moves `T`s between the producer's thread and the consumer's, hence
// `T: Send`. Shared access to a slot never overlaps: the producer only writes slots outside
// `head..tail` and the consumer only reads slots inside it, and each slot changes sides only
// through the Release/Acquire index stores and loads described in the module doc.
unsafe impl<T: Send> Sync for Ring<T> {}

impl<T> Ring<T> {
    /// Moves `item` into slot `slot`.
    ///
    /// # Safety
    /// Only the producer calls this, on a slot outside `head..tail` (free, so nothing is
    /// overwritten and the consumer does not read it).
    #[inline]
    unsafe fn write(&self, slot: usize, item: T) {
        // SAFETY: per this function's contract, the producer has the slot to itself.
        unsafe { (*self.slots[slot].get()).write(item) };
    }

    /// Moves the item out of slot `slot`, leaving it uninitialised.
    ///
    /// # Safety
    /// Only the consumer calls this, on a slot inside `head..tail` as last loaded with Acquire
    /// (initialised, and the producer does not touch it), and then advances past it so it is
    /// never read twice.
    #[inline]
    unsafe fn read(&self, slot: usize) -> T {
        // SAFETY: per this function's contract, the slot holds an item the consumer owns.
        unsafe { (*self.slots[slot].get()).assume_init_read() }
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // Both handles are gone and each published its index when it dropped, so the atomics
        // say exactly which slots still hold items.
        let mask = self.slots.len() - 1;
        let tail = *self.tail.get_mut();
        let mut index = *self.head.get_mut();
        while index != tail {
            // SAFETY: slots in `head..tail` hold initialised items that were never popped,
            // and `&mut self` means no handle can touch them any more.
            unsafe { self.slots[index & mask].get_mut().assume_init_drop() };
            index = index.wrapping_add(1);
        }
    }
}

/// The pushing end of a ring made by [`spsc`].
pub struct Producer<T> {
    ring: Arc<Ring<T>>,
    mask: usize,
    /// The next index to fill; the ring's `tail` is a published copy.
    tail: usize,
    /// The consumer's `head` as last loaded: never ahead of the real one, so free space
    /// computed from it is never overstated.
    cached_head: usize,
}

impl<T> Producer<T> {
    /// How many items the ring holds when full.
    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Free slots right now (the consumer may free more at any moment).
    pub fn free_space(&mut self) -> usize {
        self.cached_head = self.ring.head.load(Ordering::Acquire);
        self.cached_free()
    }

    /// Whether the consumer was dropped: pushed items would never be popped.
    pub fn is_abandoned(&self) -> bool {
        Arc::strong_count(&self.ring) == 1
    }

    #[inline]
    fn cached_free(&self) -> usize {
        self.capacity() - self.tail.wrapping_sub(self.cached_head)
    }

    /// Free slots, reading the consumer's index only when the cached one shows fewer than
    /// `wanted`.
    #[inline]
    fn free_for(&mut self, wanted: usize) -> usize {
        let free = self.cached_free();
        if free >= wanted {
            return free;
        }
        self.free_space()
    }

    #[inline]
    fn publish(&self) {
        self.ring.tail.store(self.tail, Ordering::Release);
    }

    /// Pushes one item, or hands it back if the ring is full.
    #[inline]
    pub fn push(&mut self, item: T) -> Result<(), T> {
        if self.free_for(1) == 0 {
            return Err(item);
        }
        // SAFETY: `free_for` found a free slot at `tail`, and this handle is the only producer.
        unsafe { self.ring.write(self.tail & self.mask, item) };
        self.tail = self.tail.wrapping_add(1);
        self.publish();
        Ok(())
    }

    /// Pushes items from `items` while there is room and returns how many it pushed
    /// (`rte_ring_enqueue_burst`). Items it did not take stay in the iterator, so pass
    /// `&mut vec.into_iter()` or a `Peekable`, not a `Drain` that drops what is left.
    pub fn push_burst<I: Iterator<Item = T>>(&mut self, items: &mut I) -> usize {
        let free = self.free_for(items.size_hint().0.max(1));
        let mut pushed = 0;
        while pushed < free {
            let Some(item) = items.next() else { break };
            // SAFETY: fewer than `free` slots from `tail` on were filled so far, and this
            // handle is the only producer.
            unsafe { self.ring.write(self.tail & self.mask, item) };
            self.tail = self.tail.wrapping_add(1);
            pushed += 1;
        }
        if pushed > 0 {
            self.publish();
        }
        pushed
    }

    /// Pushes every item of `items`, or none if they do not all fit
    /// (`rte_ring_enqueue_bulk`). On [`NoRoom`] the iterator is untouched.
    pub fn push_bulk<I: ExactSizeIterator<Item = T>>(
        &mut self,
        items: &mut I,
    ) -> Result<(), NoRoom> {
        let needed = items.len();
        let free = self.free_for(needed);
        if free < needed {
            return Err(NoRoom { needed, free });
        }
        // An iterator whose `len` overstated gets a partial push; one that understated keeps
        // its extra items.
        for item in items.take(needed) {
            // SAFETY: at most `needed <= free` slots from `tail` on are filled, and this
            // handle is the only producer.
            unsafe { self.ring.write(self.tail & self.mask, item) };
            self.tail = self.tail.wrapping_add(1);
        }
        self.publish();
        Ok(())
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        // A panic inside a burst's iterator can leave filled slots unpublished; publish them
        // so the ring drops (or the consumer gets) them.
        self.publish();
    }
}

impl<T> fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("capacity", &self.capacity())
            .field("tail", &self.tail)
            .field("cached_head", &self.cached_head)
            .finish()
    }
}

/// The popping end of a ring made by [`spsc`].
pub struct Consumer<T> {
    ring: Arc<Ring<T>>,
    mask: usize,
    /// The next index to pop; the ring's `head` is a published copy.
    head: usize,
    /// The producer's `tail` as last loaded: never ahead of the real one, so the count of
    /// ready items computed from it is never overstated.
    cached_tail: usize,
}

impl<T> Consumer<T> {
    /// How many items the ring holds when full.
    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Items ready to pop right now (the producer may add more at any moment).
    pub fn len(&mut self) -> usize {
        self.cached_tail = self.ring.tail.load(Ordering::Acquire);
        self.cached_len()
    }

    /// Whether no item is ready to pop right now.
    pub fn is_empty(&mut self) -> bool {
        self.len() == 0
    }

    /// Whether the producer was dropped: once empty, the ring stays empty.
    pub fn is_abandoned(&self) -> bool {
        Arc::strong_count(&self.ring) == 1
    }

    #[inline]
    fn cached_len(&self) -> usize {
        self.cached_tail.wrapping_sub(self.head)
    }

    /// Ready items, reading the producer's index only when the cached one shows fewer than
    /// `wanted`.
    #[inline]
    fn ready_for(&mut self, wanted: usize) -> usize {
        let ready = self.cached_len();
        if ready >= wanted {
            return ready;
        }
        self.len()
    }

    #[inline]
    fn publish(&self) {
        self.ring.head.store(self.head, Ordering::Release);
    }

    /// Takes the item at `head`. The caller checked that one is ready.
    #[inline]
    fn take_ready(&mut self) -> T {
        debug_assert!(self.head != self.cached_tail, "no item is ready");
        // SAFETY: the caller saw `head` inside `head..cached_tail`, which was loaded with
        // Acquire, and advancing `head` right after means the slot is read once.
        let item = unsafe { self.ring.read(self.head & self.mask) };
        self.head = self.head.wrapping_add(1);
        item
    }

    /// Pops one item, or `None` if the ring is empty.
    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        if self.ready_for(1) == 0 {
            return None;
        }
        let item = self.take_ready();
        self.publish();
        Some(item)
    }

    /// Pops up to `max` items (`rte_ring_dequeue_burst`): the returned iterator yields the
    /// items that were ready, oldest first. Items it does not yield stay in the ring.
    pub fn pop_burst(&mut self, max: usize) -> PopBurst<'_, T> {
        let ready = self.ready_for(max);
        PopBurst { remaining: ready.min(max), consumer: self }
    }

    /// Pops exactly `count` items, or none if fewer are ready (`rte_ring_dequeue_bulk`).
    pub fn pop_bulk(&mut self, count: usize) -> Option<PopBurst<'_, T>> {
        if self.ready_for(count) < count {
            return None;
        }
        Some(PopBurst { remaining: count, consumer: self })
    }
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        // A leaked `PopBurst` can leave popped slots unpublished; publish them so the ring
        // does not drop those items a second time.
        self.publish();
    }
}

impl<T> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("capacity", &self.capacity())
            .field("head", &self.head)
            .field("cached_tail", &self.cached_tail)
            .finish()
    }
}

/// Items popped by [`Consumer::pop_burst`] or [`Consumer::pop_bulk`], oldest first.
///
/// The freed slots go back to the producer when this is dropped, in one index store.
pub struct PopBurst<'a, T> {
    consumer: &'a mut Consumer<T>,
    remaining: usize,
}

impl<T> Iterator for PopBurst<'_, T> {
    type Item = T;

    #[inline]
    fn next(&mut self) -> Option<T> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        Some(self.consumer.take_ready())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl<T> ExactSizeIterator for PopBurst<'_, T> {}

impl<T> Drop for PopBurst<'_, T> {
    fn drop(&mut self) {
        self.consumer.publish();
    }
}

impl<T> fmt::Debug for PopBurst<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PopBurst").field("remaining", &self.remaining).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_wrap_past_usize_max() {
        let (mut tx, mut rx) = spsc_from_index::<usize>(4, usize::MAX - 5).unwrap();
        let mut next_in = 0;
        let mut next_out = 0;
        for round in 0..50 {
            let batch = 1 + round % 4;
            for _ in 0..batch {
                tx.push(next_in).unwrap();
                next_in += 1;
            }
            assert_eq!(tx.free_space(), 4 - batch);
            for item in rx.pop_burst(batch) {
                assert_eq!(item, next_out);
                next_out += 1;
            }
            assert!(rx.pop().is_none());
        }
        assert_eq!(next_out, next_in);
    }

    #[test]
    fn items_left_across_the_wrap_are_dropped_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        struct Counted(Arc<AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let (mut tx, rx) = spsc_from_index::<Counted>(4, usize::MAX - 1).unwrap();
        for _ in 0..4 {
            assert!(tx.push(Counted(drops.clone())).is_ok());
        }
        drop((tx, rx));
        assert_eq!(drops.load(Ordering::Relaxed), 4);
    }
}

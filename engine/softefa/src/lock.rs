//! A spin lock that may be held across calls, as rdma-core's providers
//! hold a pthread spin lock from `ibv_wr_start` to `ibv_wr_complete` and
//! from `ibv_start_poll` to `ibv_end_poll`: a guard cannot live across
//! those C calls, so the lock is also taken and released by hand.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug)]
pub(crate) struct SpinLock<T> {
    held: AtomicBool,
    data: UnsafeCell<T>,
}

// SAFETY: the data is reached only by the lock's holder (the guard, or a
// caller of `raw_lock` until its `raw_unlock`), one thread at a time.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves its data, which is `Send`.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub(crate) const fn new(data: T) -> SpinLock<T> {
        SpinLock { held: AtomicBool::new(false), data: UnsafeCell::new(data) }
    }

    /// Takes the lock; the caller releases it with [`SpinLock::raw_unlock`].
    pub(crate) fn raw_lock(&self) {
        let mut spins = 0u32;
        while self
            .held
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // A holder on a descheduled thread (2 cores, many pollers).
                std::thread::yield_now();
            }
        }
    }

    /// Releases the lock.
    ///
    /// # Safety
    /// The caller took it with [`SpinLock::raw_lock`] and holds no
    /// reference from [`SpinLock::data`] past this call.
    pub(crate) unsafe fn raw_unlock(&self) {
        self.held.store(false, Ordering::Release);
    }

    /// The data, for the holder of a raw lock.
    ///
    /// # Safety
    /// The caller holds the lock (by [`SpinLock::raw_lock`]) for as long as
    /// the reference lives, and makes no second one.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn data(&self) -> &mut T {
        // SAFETY: the caller holds the lock and makes one reference.
        unsafe { &mut *self.data.get() }
    }

    pub(crate) fn lock(&self) -> Guard<'_, T> {
        self.raw_lock();
        Guard { lock: self }
    }

    /// The lock if free now, else None: for a helper that should leave
    /// alone what someone is using rather than wait for it.
    pub(crate) fn try_lock(&self) -> Option<Guard<'_, T>> {
        let took = self.held.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed);
        took.ok().map(|_| Guard { lock: self })
    }
}

pub(crate) struct Guard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> std::ops::Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> std::ops::DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, and `&mut self` makes the
        // reference unique.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: the guard took the lock, and its references end with it.
        unsafe { self.lock.raw_unlock() }
    }
}

//! A first-in first-out queue of `Copy` values over a power-of-two array:
//! what the hot queues (posted receives, an SMB Direct connection's) need
//! of `VecDeque`, with a position that is a counter masked into the
//! array, so that a push or a pop is an index and an add (no wrap test, no
//! length to keep beside the ends).

use std::ops::{Index, IndexMut};

#[derive(Debug, Clone)]
pub(crate) struct Ring<T: Copy> {
    buf: Box<[T]>,
    /// `buf.len() - 1`, kept rather than loaded and computed per access.
    mask: usize,
    /// Counters of values popped and pushed; they wrap, their difference
    /// is the length.
    head: usize,
    tail: usize,
}

impl<T: Copy> Ring<T> {
    /// An empty queue with room for `cap` values before it grows; `fill`
    /// stands in the free places.
    pub(crate) fn with_capacity(cap: usize, fill: T) -> Ring<T> {
        let n = cap.max(1).next_power_of_two();
        Ring { buf: vec![fill; n].into(), mask: n - 1, head: 0, tail: 0 }
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.mask
    }

    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.tail.wrapping_sub(self.head)
    }

    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.tail == self.head
    }

    #[inline(always)]
    pub(crate) fn push_back(&mut self, v: T) {
        if self.len() > self.mask {
            self.grow();
        }
        let at = self.tail & self.mask();
        self.buf[at] = v;
        self.tail = self.tail.wrapping_add(1);
    }

    /// Twice the room, the values kept in order (only a queue the
    /// application never drains grows).
    #[cold]
    fn grow(&mut self) {
        let fill = self.buf[0];
        let mut buf = vec![fill; self.buf.len() * 2];
        let n = self.len();
        for (i, v) in buf.iter_mut().enumerate().take(n) {
            *v = self.buf[self.head.wrapping_add(i) & self.mask()];
        }
        self.buf = buf.into();
        self.mask = self.buf.len() - 1;
        self.head = 0;
        self.tail = n;
    }

    #[inline(always)]
    pub(crate) fn pop_front(&mut self) -> Option<T> {
        if self.is_empty() {
            return None;
        }
        let v = self.buf[self.head & self.mask()];
        self.head = self.head.wrapping_add(1);
        Some(v)
    }

    /// Drops the front value, if any.
    #[inline(always)]
    pub(crate) fn skip_front(&mut self) {
        if !self.is_empty() {
            self.head = self.head.wrapping_add(1);
        }
    }

    #[inline(always)]
    pub(crate) fn front(&self) -> Option<&T> {
        self.get(0)
    }

    pub(crate) fn back(&self) -> Option<&T> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// Drops the back value, if any.
    pub(crate) fn skip_back(&mut self) {
        if !self.is_empty() {
            self.tail = self.tail.wrapping_sub(1);
        }
    }

    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        if i >= self.len() {
            return None;
        }
        Some(&self.buf[self.head.wrapping_add(i) & self.mask()])
    }

    #[inline(always)]
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        if i >= self.len() {
            return None;
        }
        let at = self.head.wrapping_add(i) & self.mask();
        Some(&mut self.buf[at])
    }

    /// Takes out the value at `i`, those behind it moving up one place.
    pub(crate) fn remove(&mut self, i: usize) -> Option<T> {
        let v = *self.get(i)?;
        for j in i..self.len() - 1 {
            self[j] = self[j + 1];
        }
        self.tail = self.tail.wrapping_sub(1);
        Some(v)
    }

    pub(crate) fn clear(&mut self) {
        self.head = self.tail;
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        (0..self.len()).map(move |i| &self.buf[self.head.wrapping_add(i) & self.mask()])
    }

    /// Keeps the values `keep` says yes to, in order.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let n = self.len();
        let mut kept = 0;
        for i in 0..n {
            let v = self.buf[self.head.wrapping_add(i) & self.mask()];
            if keep(&v) {
                let at = self.head.wrapping_add(kept) & self.mask();
                self.buf[at] = v;
                kept += 1;
            }
        }
        self.tail = self.head.wrapping_add(kept);
    }
}

impl<T: Copy> Index<usize> for Ring<T> {
    type Output = T;

    #[inline(always)]
    fn index(&self, i: usize) -> &T {
        self.get(i).expect("index within the queue")
    }
}

impl<T: Copy> IndexMut<usize> for Ring<T> {
    #[inline(always)]
    fn index_mut(&mut self, i: usize) -> &mut T {
        self.get_mut(i).expect("index within the queue")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_out_in_order_across_the_wrap_and_a_growth() {
        let mut r = Ring::with_capacity(3, 0u32);
        let mut next_in = 0;
        let mut next_out = 0;
        for round in 0..50 {
            for _ in 0..(round % 7) {
                r.push_back(next_in);
                next_in += 1;
            }
            for _ in 0..(round % 5) {
                if let Some(v) = r.pop_front() {
                    assert_eq!(v, next_out);
                    next_out += 1;
                }
            }
            assert_eq!(r.len(), (next_in - next_out) as usize);
            let seen: Vec<u32> = r.iter().copied().collect();
            assert_eq!(seen, (next_out..next_in).collect::<Vec<_>>());
        }
        // Out of the middle, the rest kept in order.
        assert!(r.len() > 2);
        let before: Vec<u32> = r.iter().copied().collect();
        assert_eq!(r.remove(1), Some(before[1]));
        let after: Vec<u32> = r.iter().copied().collect();
        assert_eq!(after, [&before[..1], &before[2..]].concat());
        assert_eq!(r.remove(r.len()), None);
        r.retain(|v| v % 2 == 0);
        assert!(r.iter().all(|v| v % 2 == 0));
        assert_eq!(r.get(r.len()), None);
        r.clear();
        assert!(r.is_empty() && r.pop_front().is_none());
    }
}

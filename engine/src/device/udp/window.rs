//! The receiving half of a session's reliability (RAMCloud's
//! `firstMissingFrag` and `stagingVector`, over a 32-bit sequence that
//! wraps), and the sender's round-trip estimate (RFC 6298, in
//! nanoseconds: a datagram NIC's timers are microseconds, not TCP's
//! hundreds of milliseconds).

/// Packets beyond the first missing one that a receiver can hold a place
/// for: the staging vector's bits, and so a sender's window.
pub(crate) const SPAN: u32 = 64;

/// What a receiver makes of a sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Not taken yet: take it.
    New,
    /// Taken (or skipped) before: drop it, and acknowledge again.
    Duplicate,
    /// Past what the staging vector can hold: the sender overran its
    /// window; drop it.
    Beyond,
}

/// The numbers a receiver has taken from one sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RxWindow {
    /// Every number before it was taken; it was not.
    first_missing: u32,
    /// Bit i: `first_missing + 1 + i` was taken.
    staging: u64,
}

impl RxWindow {
    pub(crate) fn check(&self, seq: u32) -> Seen {
        let d = seq.wrapping_sub(self.first_missing) as i32;
        if d < 0 {
            Seen::Duplicate
        } else if d == 0 {
            Seen::New
        } else if d as u32 > SPAN {
            Seen::Beyond
        } else if self.staging >> (d - 1) & 1 == 1 {
            Seen::Duplicate
        } else {
            Seen::New
        }
    }

    /// Takes `seq`, which [`RxWindow::check`] found new.
    pub(crate) fn take(&mut self, seq: u32) {
        debug_assert_eq!(self.check(seq), Seen::New);
        let d = seq.wrapping_sub(self.first_missing);
        if d == 0 {
            self.advance();
        } else {
            self.staging |= 1 << (d - 1);
        }
    }

    /// Moves past the first missing number, and past every number after it
    /// already taken.
    fn advance(&mut self) {
        loop {
            let next_taken = self.staging & 1 == 1;
            self.staging >>= 1;
            self.first_missing = self.first_missing.wrapping_add(1);
            if !next_taken {
                return;
            }
        }
    }

    /// The sender resends nothing before `base`: stop waiting for it.
    pub(crate) fn skip_to(&mut self, base: u32) {
        let d = base.wrapping_sub(self.first_missing) as i32;
        if d <= 0 {
            return;
        }
        if d as u32 > SPAN {
            self.first_missing = base;
            self.staging = 0;
            return;
        }
        let mut taken = false;
        for _ in 0..d {
            taken = self.staging & 1 == 1;
            self.staging >>= 1;
            self.first_missing = self.first_missing.wrapping_add(1);
        }
        // The new first number may have been taken already.
        if taken {
            self.advance();
        }
    }

    /// The acknowledgement to send: first missing number, staging vector.
    pub(crate) fn ack(&self) -> (u32, u64) {
        (self.first_missing, self.staging)
    }
}

/// Whether an acknowledgement `(ack, staging)` covers `seq`.
pub(crate) fn acked(ack: u32, staging: u64, seq: u32) -> bool {
    let d = seq.wrapping_sub(ack) as i32;
    d < 0 || (d > 0 && d as u32 <= SPAN && staging >> (d - 1) & 1 == 1)
}

/// A sender's round-trip estimate and retransmission timeout (RFC 6298:
/// SRTT, RTTVAR, RTO = SRTT + 4 RTTVAR, bounded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rtt {
    srtt_ns: u64,
    rttvar_ns: u64,
    rto_ns: u64,
    min_ns: u64,
    max_ns: u64,
    sampled: bool,
}

impl Rtt {
    /// Before any sample the timeout is `initial_ns`.
    pub(crate) fn new(initial_ns: u64, min_ns: u64, max_ns: u64) -> Rtt {
        let rto_ns = initial_ns.clamp(min_ns, max_ns);
        Rtt { srtt_ns: 0, rttvar_ns: 0, rto_ns, min_ns, max_ns, sampled: false }
    }

    /// A round trip measured on a packet sent once (Karn's rule: never on a
    /// resent one).
    pub(crate) fn sample(&mut self, r_ns: u64) {
        if self.sampled {
            let err = self.srtt_ns.abs_diff(r_ns);
            self.rttvar_ns = (3 * self.rttvar_ns + err) / 4;
            self.srtt_ns = (7 * self.srtt_ns + r_ns) / 8;
        } else {
            self.srtt_ns = r_ns;
            self.rttvar_ns = r_ns / 2;
            self.sampled = true;
        }
        self.rto_ns = (self.srtt_ns + 4 * self.rttvar_ns).clamp(self.min_ns, self.max_ns);
    }

    /// The timeout of a packet sent `tries` times before (doubling).
    pub(crate) fn rto_ns(&self, tries: u32) -> u64 {
        self.rto_ns.saturating_mul(1 << tries.min(16)).min(self.max_ns)
    }

    pub(crate) fn srtt_ns(&self) -> u64 {
        self.srtt_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn in_order_out_of_order_and_duplicates() {
        let mut w = RxWindow::default();
        assert_eq!(w.check(0), Seen::New);
        w.take(0);
        assert_eq!(w.ack(), (1, 0));
        assert_eq!(w.check(0), Seen::Duplicate);
        w.take(3);
        w.take(2);
        assert_eq!(w.ack(), (1, 0b11), "2 and 3 staged past the hole at 1");
        assert_eq!(w.check(3), Seen::Duplicate);
        assert_eq!(w.check(1 + 64), Seen::New, "the last place the vector holds");
        assert_eq!(w.check(1 + 65), Seen::Beyond);
        w.take(1);
        assert_eq!(w.ack(), (4, 0), "the hole filled: everything to 3");
        assert!(acked(4, 0, 3) && !acked(4, 0, 4));
    }

    #[test]
    fn a_sender_that_gave_up_on_a_number_lets_the_receiver_move_on() {
        let mut w = RxWindow::default();
        w.take(1);
        w.take(2);
        w.skip_to(1);
        assert_eq!(w.ack(), (3, 0), "0 skipped, 1 and 2 taken");
        w.skip_to(100);
        assert_eq!(w.ack(), (100, 0));
        assert_eq!(w.check(99), Seen::Duplicate, "a late resend of a skipped number");
        w.skip_to(50);
        assert_eq!(w.ack(), (100, 0), "the base never moves back");
    }

    proptest! {
        /// Whatever the order, duplicates and the point of wrap-around,
        /// every number is taken exactly once, and the acknowledgement
        /// covers exactly what was taken.
        #[test]
        fn every_number_is_taken_once_in_any_order(
            start in prop_oneof![Just(u32::MAX - 40), Just(0u32), any::<u32>()],
            n in 1usize..200,
            swaps in proptest::collection::vec((0usize..200, 0usize..64), 0..300),
            dups in proptest::collection::vec((0usize..200, 0usize..200), 0..100),
        ) {
            // Arrivals: the numbers in order, locally shuffled by at most
            // the window (a sender never runs further ahead), plus repeats.
            let mut order: Vec<u32> = (0..n as u32).map(|i| start.wrapping_add(i)).collect();
            for (i, d) in swaps {
                let (i, j) = (i % n, (i + d).min(n - 1));
                order.swap(i, j);
            }
            for (at, which) in dups {
                let v = order[which % n];
                order.insert((at % n).max(which % n + 1).min(order.len()), v);
            }
            let mut w = RxWindow { first_missing: start, staging: 0 };
            let mut taken = std::collections::HashSet::new();
            let mut deferred = Vec::new();
            for &s in &order {
                match w.check(s) {
                    Seen::New => {
                        w.take(s);
                        prop_assert!(taken.insert(s), "{s} taken twice");
                    }
                    Seen::Duplicate => prop_assert!(taken.contains(&s), "{s} new, called a duplicate"),
                    Seen::Beyond => deferred.push(s),
                }
                let (ack, staging) = w.ack();
                for &t in &taken {
                    prop_assert!(acked(ack, staging, t), "{t} taken, not acknowledged");
                }
            }
            // A sender resends what the receiver could not hold,
            // in the order it sends them.
            deferred.sort_by_key(|&s| s.wrapping_sub(start));
            for s in deferred {
                if w.check(s) == Seen::New {
                    w.take(s);
                    taken.insert(s);
                }
            }
            prop_assert_eq!(taken.len(), n);
            prop_assert_eq!(w.ack(), (start.wrapping_add(n as u32), 0));
        }
    }

    #[test]
    fn the_timeout_follows_the_round_trip_within_its_bounds() {
        let mut r = Rtt::new(1_000_000, 50_000, 100_000_000);
        assert_eq!(r.rto_ns(0), 1_000_000);
        r.sample(20_000);
        assert_eq!((r.srtt_ns(), r.rto_ns(0)), (20_000, 60_000), "20 us + 4 x 10 us");
        for _ in 0..50 {
            r.sample(10_000);
        }
        assert_eq!(r.rto_ns(0), 50_000, "never under the floor");
        assert_eq!(r.rto_ns(3), 400_000, "doubled per try");
        assert_eq!(r.rto_ns(40), 100_000_000, "never over the ceiling");
    }
}

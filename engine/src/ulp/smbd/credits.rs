//! Credit accounting of one connection: pure counters, so that each rule
//! is tested alone.

use super::ProtocolError;

/// The credits of one connection, both ways.
///
/// * Send credits are receives the peer posted for us: one per segment
///   sent, empty messages included. The peer grants more in
///   CreditsGranted.
/// * Receive credits are the receives this side posted: `granted` of them
///   the peer was told of (it may fill those), the rest go out in the next
///   message's CreditsGranted. A segment that arrives when the peer holds
///   none ends the connection.
///
/// Two rules keep both sides from waiting on each other forever (the
/// spec text this module follows, 3.1.5.4, leaves credits to 3.1.5.1):
///
/// * the last send credit goes only to a message that grants credits, so
///   that the peer, which then holds one, can always answer: were both
///   sides out of credits, the last message sent would have granted the
///   other one some;
/// * a data segment that arrives when the peer holds fewer than half the
///   receives makes an answer owed as if asked;
/// * a segment of the application's (its empty message included) that
///   leaves its sender with `low` credits, or 1 or 0, sets
///   SMB_DIRECT_RESPONSE_REQUESTED; the peer owes an answer that grants
///   credits, and sends an empty message for it when it has nothing else
///   to send. Those empty messages ask for nothing, so that two peers do
///   not answer each other's answers;
/// * a peer that holds at most its last credit, which it keeps for
///   granting, is granted unasked once two receives or more are posted for
///   it: else a peer that spent its credits on empty messages (its own, or
///   answers to ours) and holds nothing to grant would wait forever for a
///   grant nobody owes it. One answer arriving frees one receive only, so
///   two peers never answer each other's answers by this rule either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credits {
    send: u32,
    posted: u32,
    granted: u32,
    /// Send credits at which a segment asks for a response.
    low: u32,
    /// Receives granted under which a data segment's arrival makes an
    /// answer owed unasked.
    refill_below: u32,
    response_owed: bool,
}

impl Credits {
    /// Credits as negotiation leaves them: `send` granted by the peer,
    /// `posted` receives of which `granted` were granted to it.
    pub fn new(send: u16, posted: u16, granted: u16) -> Credits {
        Credits {
            send: send as u32,
            posted: posted as u32,
            granted: (granted as u32).min(posted as u32),
            low: (send as u32 / 2).max(1),
            refill_below: (posted as u32 / 2).max(1),
            response_owed: false,
        }
    }

    /// Send credits held.
    pub fn send(&self) -> u32 {
        self.send
    }

    /// Receives posted.
    pub fn posted(&self) -> u32 {
        self.posted
    }

    /// Receives the peer was granted and has not filled.
    pub fn granted(&self) -> u32 {
        self.granted
    }

    /// What the next message grants: receives posted and not yet granted.
    #[inline]
    pub fn to_grant(&self) -> u16 {
        (self.posted - self.granted).min(u16::MAX as u32) as u16
    }

    /// Whether a message granting `grants` credits may go now.
    #[inline]
    pub fn may_send(&self, grants: u16) -> bool {
        self.send > 1 || (self.send == 1 && grants > 0)
    }

    /// Whether a segment of the application's sent now asks for a
    /// response.
    #[inline]
    pub fn asks_response(&self) -> bool {
        let after = self.send.saturating_sub(1);
        after == self.low || after <= 1
    }

    /// Whether a segment may go now granting nothing and asking for no
    /// response, as most of a stream's do: nothing to grant, and more
    /// than two credits but for the one that reaches the low mark. What
    /// [`Credits::to_grant`], [`Credits::may_send`] and
    /// [`Credits::asks_response`] would say together, in one test.
    #[inline(always)]
    pub fn may_send_quiet(&self) -> bool {
        self.send > 2 && self.send != self.low + 1 && self.posted == self.granted
    }

    /// A message went, granting `grants`: a send credit is used, the
    /// grants are the peer's, and a response owed is given if it granted.
    #[inline]
    pub fn on_send(&mut self, grants: u16) {
        debug_assert!(self.may_send(grants) && grants <= self.to_grant());
        self.send -= 1;
        self.granted += grants as u32;
        if grants > 0 {
            self.response_owed = false;
        }
    }

    /// A segment filled a posted receive: the peer must have held a credit.
    #[inline]
    pub fn on_arrival(&mut self) -> Result<(), ProtocolError> {
        if self.granted == 0 {
            return Err(ProtocolError::CreditsExceeded);
        }
        self.granted -= 1;
        self.posted -= 1;
        Ok(())
    }

    /// The arrived segment's header: its grants, and whether it asks for a
    /// response.
    #[inline]
    pub fn on_header(&mut self, credits_granted: u16, response_requested: bool) {
        self.send = self.send.saturating_add(credits_granted as u32);
        self.response_owed |= response_requested;
    }

    /// A data segment arrived: when the peer holds fewer than half the
    /// receives, an answer is owed unasked, so that a peer that streams is
    /// granted credits before it runs out rather than after it asked. Only
    /// data does this, never an empty message, so that two peers do not
    /// answer each other's answers.
    #[inline]
    pub fn on_data(&mut self) {
        self.response_owed |= self.granted < self.refill_below;
    }

    /// A receive was posted (again).
    #[inline]
    pub fn on_post(&mut self) {
        self.on_posts(1);
    }

    /// `n` receives were posted (again).
    #[inline]
    pub fn on_posts(&mut self, n: u32) {
        self.posted += n;
    }

    /// A posted receive was withdrawn (the connection is closing).
    pub fn on_withdraw(&mut self) {
        self.posted -= 1;
        self.granted = self.granted.min(self.posted);
    }

    /// Whether an empty message should answer the peer now: it asked, and
    /// there are credits to grant; or it holds at most its last credit and
    /// there are two or more to grant (see the type's rules).
    #[inline]
    pub fn response_due(&self) -> bool {
        let n = self.to_grant();
        (self.response_owed && n > 0) || (self.granted <= 1 && n >= 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sender_never_sends_without_a_credit() {
        let mut c = Credits::new(2, 4, 4);
        assert!(c.may_send(0));
        c.on_send(0);
        assert_eq!(c.send(), 1);
        assert!(!c.may_send(0), "the last credit is kept for a message that grants");
        assert_eq!(c.to_grant(), 0, "all posted were granted at negotiation");
        // A segment of the peer arrives and its receive is posted again.
        c.on_arrival().unwrap();
        c.on_post();
        assert_eq!(c.to_grant(), 1);
        assert!(c.may_send(1));
        c.on_send(1);
        assert_eq!(c.send(), 0);
        assert!(!c.may_send(0) && !c.may_send(1), "no credit, no send");
        c.on_header(3, false);
        assert_eq!(c.send(), 3);
    }

    #[test]
    fn may_send_quiet_is_what_the_rules_say_of_a_segment_that_grants_nothing() {
        for (initial, posted, granted) in [(2, 0, 0), (8, 4, 4), (8, 4, 3), (9, 2, 0), (255, 8, 8)]
        {
            let mut c = Credits::new(initial, posted, granted);
            for send in 0..=initial as u32 + 2 {
                c.send = send;
                let quiet = c.to_grant() == 0 && c.may_send(0) && !c.asks_response();
                assert_eq!(c.may_send_quiet(), quiet, "{c:?}");
            }
        }
        // The low mark's credit and the last two are not a stream's.
        let mut c = Credits::new(8, 4, 4);
        let streams: Vec<bool> = (0..=9)
            .map(|s| {
                c.send = s;
                c.may_send_quiet()
            })
            .collect();
        let want = [false, false, false, true, true, false, true, true, true, true];
        assert_eq!(streams, want);
    }

    #[test]
    fn a_receiver_refuses_a_segment_beyond_the_credits_it_granted() {
        let mut c = Credits::new(2, 3, 2);
        assert_eq!(c.to_grant(), 1);
        c.on_arrival().unwrap();
        c.on_arrival().unwrap();
        // One receive is still posted, but the peer was never granted it.
        assert_eq!((c.posted(), c.granted()), (1, 0));
        assert_eq!(c.on_arrival(), Err(ProtocolError::CreditsExceeded));
    }

    #[test]
    fn credits_are_granted_as_receives_are_reposted() {
        let mut c = Credits::new(10, 4, 4);
        for _ in 0..3 {
            c.on_arrival().unwrap();
        }
        assert_eq!(c.to_grant(), 0, "nothing reposted yet");
        c.on_post();
        c.on_post();
        assert_eq!(c.to_grant(), 2);
        c.on_send(2);
        assert_eq!((c.granted(), c.to_grant()), (3, 0));
    }

    #[test]
    fn data_arriving_when_the_peer_holds_under_half_the_receives_is_answered_unasked() {
        let mut c = Credits::new(8, 4, 4);
        for _ in 0..2 {
            c.on_arrival().unwrap();
            c.on_post();
            c.on_data();
        }
        assert!(!c.response_due(), "the peer still holds half");
        c.on_arrival().unwrap();
        c.on_post();
        c.on_data();
        assert!(c.response_due(), "under half: owed");
        c.on_send(c.to_grant());
        assert!(!c.response_due() && c.granted() == 4);
    }

    #[test]
    fn a_peer_left_with_its_last_credit_is_granted_unasked() {
        let mut c = Credits::new(8, 3, 3);
        // Two empty messages of the peer, asking nothing: it holds one.
        for _ in 0..2 {
            c.on_arrival().unwrap();
            c.on_header(0, false);
            c.on_post();
        }
        assert_eq!((c.granted(), c.to_grant()), (1, 2));
        assert!(c.response_due(), "its last credit is for granting: it cannot ask");
        c.on_send(2);
        assert!(!c.response_due());
        // The peer's answer to that frees one receive: not answered.
        c.on_arrival().unwrap();
        c.on_header(1, false);
        c.on_post();
        assert_eq!((c.granted(), c.to_grant()), (2, 1));
        assert!(!c.response_due(), "answers are not answered");
        // With two receives only, the peer on its last credit leaves one to
        // grant: answered only once it holds none.
        let mut c = Credits::new(8, 2, 2);
        c.on_arrival().unwrap();
        c.on_post();
        assert!(!c.response_due());
        c.on_arrival().unwrap();
        c.on_post();
        assert!(c.response_due(), "it holds none");
    }

    #[test]
    fn a_response_is_asked_when_credits_run_low_and_owed_until_credits_go() {
        let mut c = Credits::new(8, 4, 4);
        let asks: Vec<bool> = (0..7)
            .map(|_| {
                let a = c.asks_response();
                c.on_send(0);
                a
            })
            .collect();
        // 8 credits: asks when it leaves 4 (half), then 1 (and would at 0).
        assert_eq!(asks, [false, false, false, true, false, false, true]);
        let mut c = Credits::new(8, 4, 4);
        c.on_header(0, true);
        assert!(!c.response_due(), "nothing to grant yet");
        c.on_arrival().unwrap();
        c.on_post();
        assert!(c.response_due());
        c.on_send(0);
        assert!(c.response_due(), "a message without grants answers nothing");
        c.on_header(0, true);
        c.on_send(1);
        assert!(!c.response_due(), "answered");
    }
}

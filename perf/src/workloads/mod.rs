//! The benchmark suite: every workload the criterion benches and the
//! regression gate measure, named once here.
//!
//! A workload is set up by [`Workload::setup`] (warm-up included: peers
//! handshaken, pools touched) and then runs any number of operations; the
//! cost of one operation is what every tool reports. Names are
//! `area/case[/parameter]`, stable: baselines and dashboards key on them.

mod codec;
mod relink;
mod rma;
mod shm;
mod sim;
mod smbd;
mod udp;

use std::fmt;
use std::time::{Duration, Instant};

/// What one operation of a workload moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A message, a packet, a round trip: rates are in operations/s.
    Ops,
    /// This many bytes: rates are in bytes/s.
    Bytes(u64),
}

/// Which figure of merit the gate keeps for a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One operation is one request and its answer: the gate times each
    /// and keeps its p50 and p99.
    Latency,
    /// Operations overlap: the gate keeps the rate.
    Rate,
}

/// Runs `iters` operations of a set-up workload.
pub trait Runner {
    fn run(&mut self, iters: u64);

    /// Runs `iters` operations and returns the time they cost: all of it,
    /// unless the workload times only the side it measures (a receiver
    /// among many senders).
    fn run_timed(&mut self, iters: u64) -> Duration {
        let t = Instant::now();
        self.run(iters);
        t.elapsed()
    }

    /// Packets the workload's endpoints have sent so far, by type id
    /// (empty for workloads without endpoints): lets a test check that a
    /// workload runs the protocol its name says.
    fn packets_sent(&self) -> Vec<u64> {
        Vec::new()
    }
}

impl<F: FnMut(u64)> Runner for F {
    fn run(&mut self, iters: u64) {
        self(iters)
    }
}

/// One benchmark.
pub struct Workload {
    pub name: String,
    pub unit: Unit,
    pub kind: Kind,
    /// Operations that took about 50 ms on the 2-core VM the suite was
    /// written on: one wall-clock sample; the instruction count runs a
    /// fiftieth (callgrind is some 50 times slower).
    pub iters: u64,
    /// Part of the small suite that CI gates on.
    pub small: bool,
    setup: Box<dyn Fn() -> Box<dyn Runner>>,
}

impl Workload {
    fn new(
        name: impl Into<String>,
        unit: Unit,
        kind: Kind,
        iters: u64,
        setup: impl Fn() -> Box<dyn Runner> + 'static,
    ) -> Workload {
        Workload { name: name.into(), unit, kind, iters, small: false, setup: Box::new(setup) }
    }

    fn small(mut self) -> Workload {
        self.small = true;
        self
    }

    /// Builds the workload's state and warms it up.
    pub fn setup(&self) -> Box<dyn Runner> {
        (self.setup)()
    }

    /// Operations one instruction-count measurement runs.
    pub fn counted_iters(&self) -> u64 {
        (self.iters / 50).max(2)
    }
}

impl fmt::Debug for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workload")
            .field("name", &self.name)
            .field("unit", &self.unit)
            .field("kind", &self.kind)
            .field("iters", &self.iters)
            .field("small", &self.small)
            .finish()
    }
}

/// Every workload, in a stable order.
pub fn all() -> Vec<Workload> {
    let mut v = Vec::new();
    codec::workloads(&mut v);
    sim::workloads(&mut v);
    rma::workloads(&mut v);
    shm::workloads(&mut v);
    udp::workloads(&mut v);
    relink::workloads(&mut v);
    smbd::workloads(&mut v);
    v
}

/// The workload named `name`.
pub fn find(name: &str) -> Option<Workload> {
    all().into_iter().find(|w| w.name == name)
}

#[cfg(test)]
mod tests {
    use efapoll::wire::PacketType::{self, *};

    use super::*;

    /// What each endpoint workload must send, and what it must not: the
    /// protocol its name says, not a neighbour's.
    fn protocol(name: &str) -> (&'static [PacketType], &'static [PacketType]) {
        let n = name.split_once('/').map_or(name, |(_, case)| case);
        // Direct RDMA: no REQ packet at all.
        const ANY_REQ: &[PacketType] = &[EagerRtw, LongCtsRtw, LongReadRtw, ShortRtr, LongCtsRtr];
        match n.split('/').next().unwrap() {
            "eager_64B_stream" | "eager_64B_reorder" | "pingpong_64B" | "peers" | "stream_64B" => {
                (&[EagerMsgRtm], &[MediumMsgRtm, LongCtsMsgRtm])
            }
            "posted_tags" => (&[EagerTagRtm], &[MediumTagRtm, EagerMsgRtm]),
            "stream_64KiB" => (&[MediumMsgRtm], &[EagerMsgRtm, LongCtsMsgRtm, RuntReadMsgRtm]),
            // The default sends system memory LONGREAD, as the provider does.
            "stream_1MiB" => (&[LongReadMsgRtm, Eor], &[RuntReadMsgRtm, LongCtsMsgRtm]),
            "medium_32KiB_stream" => (&[MediumMsgRtm], &[EagerMsgRtm, LongCtsMsgRtm]),
            "longcts_1MiB" | "longcts_8MiB" => {
                (&[LongCtsMsgRtm, Cts, CtsData], &[LongReadMsgRtm, RuntReadMsgRtm, MediumMsgRtm])
            }
            "longread_8MiB" => (&[LongReadMsgRtm, Eor], &[RuntReadMsgRtm, LongCtsMsgRtm]),
            "stream_64KiB_on_host" => (&[LongReadMsgRtm, Eor], &[MediumMsgRtm, RuntReadMsgRtm]),
            "runtread_1MiB" => (&[RuntReadMsgRtm], &[LongReadMsgRtm, LongCtsMsgRtm]),
            "write_eager_4KiB" => (&[EagerRtw], &[LongCtsRtw, LongReadRtw]),
            "write_longcts_1MiB" => (&[LongCtsRtw, Cts, CtsData], &[EagerRtw, LongReadRtw]),
            "write_longread_1MiB" => (&[LongReadRtw, Eor], &[EagerRtw, LongCtsRtw]),
            "read_short_4KiB" => (&[ShortRtr, ReadRsp], &[LongCtsRtr]),
            "read_longcts_1MiB" => (&[LongCtsRtr, ReadRsp], &[ShortRtr]),
            "write_direct_1MiB" | "read_direct_1MiB" => (&[], ANY_REQ),
            "atomic_write_u64" => (&[WriteRta], &[FetchRta, CompareRta, AtomRsp]),
            "atomic_fetch_u64" => (&[FetchRta, AtomRsp], &[WriteRta, CompareRta]),
            "atomic_compare_u64" => (&[CompareRta, AtomRsp], &[WriteRta, FetchRta]),
            _ => panic!("{name}: add the protocol it runs to this table"),
        }
    }

    #[test]
    fn every_endpoint_workload_runs_the_protocol_it_names() {
        let endpoints = |n: &str| {
            n.starts_with("sim/")
                || n.starts_with("rma/")
                || n.starts_with("shm/pingpong")
                || n.starts_with("shm/stream")
                || n.starts_with("udp/pingpong")
                || n.starts_with("udp/stream")
        };
        for w in all().iter().filter(|w| endpoints(&w.name)) {
            let (must, must_not) = protocol(&w.name);
            let mut r = w.setup();
            // What the operations send, not the setup (a HANDSHAKE
            // request goes as an empty EAGER_RTW, as the provider's does).
            let before = r.packets_sent();
            r.run(3);
            let after = r.packets_sent();
            assert_eq!(after.len(), 256, "{}: reports its packets", w.name);
            let sent: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
            for t in must {
                assert!(sent[t.id() as usize] > 0, "{}: sends {}", w.name, t.name());
            }
            for t in must_not {
                assert_eq!(sent[t.id() as usize], 0, "{}: sends no {}", w.name, t.name());
            }
            if must.is_empty() {
                // Direct: the data goes by RDMA, not in packets.
                let reqs: u64 = PacketType::ALL
                    .iter()
                    .filter(|t| t.is_req())
                    .map(|t| sent[t.id() as usize])
                    .sum();
                assert_eq!(reqs, 0, "{}: direct RDMA sends no REQ", w.name);
            }
        }
    }

    #[test]
    fn names_are_unique_and_well_formed() {
        let all = all();
        let mut names: Vec<&str> = all.iter().map(|w| w.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len(), "unique names");
        for w in &all {
            let area = w.name.split('/').next().unwrap();
            assert!(
                ["codec", "sim", "rma", "shm", "udp", "relink", "smbd"].contains(&area),
                "{}",
                w.name
            );
            assert!(w.name.matches('/').count() >= 1, "{}: area/case", w.name);
            assert!(w.counted_iters() >= 2, "{}", w.name);
        }
        assert!(all.iter().filter(|w| w.small).count() >= 10, "a small suite");
    }

    #[test]
    fn every_workload_sets_up_and_runs() {
        // Not timed: each workload once, a few operations, so that none
        // panics on its first use (sim and rma are run above).
        for w in all().iter().filter(|w| !w.name.starts_with("sim/") && !w.name.starts_with("rma/"))
        {
            w.setup().run(2);
        }
    }
}

//! The udp device: the engine over it (both endpoints in one thread, over
//! loopback sockets) and the device on its own. Under callgrind these
//! count the user-space work, ours and libc's; the kernel's share of each
//! datagram is the floor's (`udp-floor`), not ours to gate.
//!
//! What depends on how fast the clock runs is set aside (a callgrind run
//! is some 50 times slower, and would retransmit where a real run does
//! not): acknowledgements go at once, the retransmission timeout is a
//! second, the window is fixed rather than driven by the round trip.
//! What is counted then repeats.

use std::hint::black_box;
use std::time::Duration;

use efapoll::device::udp::{UdpConfig, UdpDevice, Window};
use efapoll::device::{BufId, Cqe, Device, SendWr};
use efapoll::endpoint::{Config, Endpoint};

use super::sim::{KIB, MIB, Pair, PingPong, Stream};
use super::{Kind, Runner, Unit, Workload};

fn device() -> UdpDevice {
    let cfg = UdpConfig {
        ack_delay: Duration::ZERO,
        window: Window::Fixed(64),
        min_rto: Duration::from_secs(1),
        max_rto: Duration::from_secs(2),
        peer_timeout: Duration::from_secs(60),
        ..UdpConfig::default()
    };
    UdpDevice::new(cfg).expect("a loopback socket")
}

/// Two endpoints over udp that know each other.
fn endpoints(cfg: Config) -> Pair<UdpDevice> {
    let cfg = Config { handshake_on_insert: true, ..cfg };
    Pair::connect(
        Endpoint::new(device(), cfg).unwrap(),
        Endpoint::new(device(), cfg).unwrap(),
        None,
    )
}

/// 64-byte sends from a to b in bursts of 32 through the sockets, each
/// acknowledged; one operation is one packet.
struct Burst {
    a: UdpDevice,
    b: UdpDevice,
    wrs: Vec<SendWr>,
    bufs: Vec<BufId>,
    out: [Cqe; 32],
}

impl Burst {
    fn new() -> Burst {
        let (mut a, mut b) = (device(), device());
        let ah = a.insert_addr(&b.addr()).unwrap();
        b.insert_addr(&a.addr()).unwrap();
        let wrs = (0..32)
            .map(|i| SendWr { ah, buf: BufId(i), len: 64, data: None, wr_id: i as u64 })
            .collect();
        let bufs = (1000..1032).map(BufId).collect();
        let mut r = Burst { a, b, wrs, bufs, out: [Cqe::default(); 32] };
        r.run(64 * 32);
        r
    }
}

impl Runner for Burst {
    fn run(&mut self, packets: u64) {
        for _ in 0..packets.div_ceil(32) {
            self.b.post_recv(&self.bufs);
            assert_eq!(self.a.post_send(black_box(&self.wrs)), 32);
            let (mut got, mut sent) = (0, 0);
            while got < 32 || sent < 32 {
                let k = self.b.poll(&mut self.out);
                black_box(&self.out[..k]);
                got += k;
                sent += self.a.poll(&mut self.out);
            }
        }
    }
}

pub(super) fn workloads(v: &mut Vec<Workload>) {
    v.push(
        Workload::new("udp/pingpong_64B", Unit::Ops, Kind::Latency, 20_000, || {
            Box::new(PingPong::new(endpoints(Config::default())))
        })
        .small(),
    );
    v.push(
        Workload::new("udp/stream_64B", Unit::Ops, Kind::Rate, 50_000, || {
            Box::new(Stream::new(endpoints(Config::default()), 64, 64))
        })
        .small(),
    );
    v.push(
        Workload::new("udp/stream_64KiB", Unit::Bytes(64 * KIB), Kind::Rate, 3000, || {
            Box::new(Stream::new(endpoints(Config::default()), 64 * KIB, 64))
        })
        .small(),
    );
    v.push(Workload::new("udp/stream_1MiB", Unit::Bytes(MIB), Kind::Rate, 300, || {
        Box::new(Stream::new(endpoints(Config::default()), MIB, 1))
    }));
    v.push(
        Workload::new("udp/burst_64B", Unit::Ops, Kind::Rate, 64_000, || Box::new(Burst::new()))
            .small(),
    );
}

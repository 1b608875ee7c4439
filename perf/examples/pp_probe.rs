use efapoll::device::Access;
use efapoll::device::Device;
use efapoll::device::shm::{ShmConfig, ShmDevice};
use efapoll::device::sim::{SimConfig, SimFabric};
use efapoll::endpoint::{Config, Endpoint, Op, Span};
use std::time::Instant;

fn run<D: Device>(mut a: Endpoint<D>, mut b: Endpoint<D>, n: u64) {
    let to_b = a.insert_peer(&b.addr()).unwrap();
    let to_a = b.insert_peer(&a.addr()).unwrap();
    let sa = a.register(64, Access::empty()).unwrap();
    let sb = b.register(64, Access::empty()).unwrap();
    let t = Instant::now();
    for _ in 0..n {
        b.recv(Span::new(&sb, 0, 64), None, 0).unwrap();
        a.recv(Span::new(&sa, 0, 64), None, 0).unwrap();
        a.send(to_b, Span::new(&sa, 0, 64), 1).unwrap();
        let mut got = false;
        while !got {
            a.progress();
            b.progress();
            while let Some(c) = b.poll_cq() {
                got |= c.op == Op::Recv;
            }
        }
        b.send(to_a, Span::new(&sb, 0, 64), 2).unwrap();
        let mut got = false;
        while !got {
            b.progress();
            a.progress();
            while let Some(c) = a.poll_cq() {
                got |= c.op == Op::Recv;
            }
        }
        while b.poll_cq().is_some() {}
    }
    let dt = t.elapsed();
    println!("{:.1} ns per round trip", dt.as_nanos() as f64 / n as f64);
}

fn main() {
    let n: u64 = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(1_000_000);
    if std::env::args().nth(2).as_deref() == Some("shm") {
        let cfg = ShmConfig::default();
        let a = Endpoint::new(ShmDevice::new(cfg).unwrap(), Config::default()).unwrap();
        let b = Endpoint::new(ShmDevice::new(cfg).unwrap(), Config::default()).unwrap();
        run(a, b, n);
    } else {
        let fabric = SimFabric::new(SimConfig::default());
        let a = Endpoint::new(fabric.device(), Config::default()).unwrap();
        let b = Endpoint::new(fabric.device(), Config::default()).unwrap();
        run(a, b, n);
    }
}

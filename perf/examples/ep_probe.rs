use efapoll::device::Access;
use efapoll::device::sim::{SimConfig, SimFabric};
use efapoll::endpoint::{Config, Endpoint, Span};
use std::time::Instant;

fn main() {
    let fabric = SimFabric::new(SimConfig::default());
    let mut a = Endpoint::new(fabric.device(), Config::default()).unwrap();
    let mut b = Endpoint::new(fabric.device(), Config::default()).unwrap();
    let to_b = a.insert_peer(&b.addr()).unwrap();
    let src = a.register(64, Access::empty()).unwrap();
    let dst = b.register(64, Access::empty()).unwrap();
    let n: u64 = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(2_000_000);
    let window = 64;
    let t = Instant::now();
    let (mut posted, mut sent, mut recvd, mut sdone) = (0u64, 0u64, 0u64, 0u64);
    while recvd < n {
        while posted < n && posted - recvd < window {
            b.recv(Span::new(&dst, 0, 64), None, posted).unwrap();
            posted += 1;
        }
        while sent < n && sent - sdone < window {
            if a.send(to_b, Span::new(&src, 0, 64), sent).is_err() {
                break;
            }
            sent += 1;
        }
        a.progress();
        b.progress();
        while a.poll_cq().is_some() {
            sdone += 1;
        }
        while b.poll_cq().is_some() {
            recvd += 1;
        }
    }
    let dt = t.elapsed();
    println!(
        "{} msgs in {:?}: {:.2} Mmsg/s, {:.1} ns/msg",
        n,
        dt,
        n as f64 / dt.as_secs_f64() / 1e6,
        dt.as_nanos() as f64 / n as f64
    );
}

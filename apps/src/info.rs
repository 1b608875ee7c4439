//! `efapoll info`: the devices here and what they can do, like `fi_info`.
//! Each built device is probed by creating one.

use std::process::ExitCode;

use efapoll::device::Device;
use efapoll::device::shm::{ShmConfig, ShmDevice};
use efapoll::device::sim::{SimConfig, SimFabric};

fn print_device(name: &str, about: &str, probe: Result<(efapoll::device::Caps, String), String>) {
    println!("device: {name}");
    println!("    about: {about}");
    match probe {
        Ok((caps, addr)) => {
            let yes_no = |b: bool| if b { "yes" } else { "no" };
            println!("    status: available");
            println!("    address: {addr}");
            println!("    mtu: {}", caps.mtu);
            println!("    packet_buffers: {}", caps.bufs);
            println!("    tx_depth: {}", caps.tx_depth);
            println!("    rx_depth: {}", caps.rx_depth);
            println!("    inline_size: {}", caps.inline_size);
            println!("    max_rdma_size: {}", caps.max_rdma_size);
            println!("    rdma_read: {}", yes_no(caps.rdma_read));
            println!("    rdma_write: {}", yes_no(caps.rdma_write));
            println!("    device_version: {:#x}", caps.device_version);
        }
        Err(status) => println!("    status: {status}"),
    }
}

pub fn run() -> ExitCode {
    let sim = SimFabric::new(SimConfig::default()).device();
    print_device(
        "sim",
        "in-process model of EFA, one thread (tests; the engine's own cost)",
        Ok((sim.caps(), sim.addr().to_string())),
    );
    let shm = ShmDevice::new(ShmConfig::default())
        .map(|d| (d.caps(), d.addr().to_string()))
        .map_err(|e| format!("unavailable: {e}"));
    print_device("shm", "processes and threads of this host over POSIX shared memory", shm);
    print_device(
        "udp",
        "software SRD and RDMA over UDP, across hosts",
        Err("not built yet".into()),
    );
    print_device("efa", "AWS Elastic Fabric Adapter", Err("not built yet".into()));
    ExitCode::SUCCESS
}

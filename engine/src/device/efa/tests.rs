//! What needs no EFA device: opening without one fails with the reason,
//! and the rights a region is registered with. The queue's bookkeeping is
//! tested in `tx.rs` and `book.rs`; the device itself runs under softefa
//! (engine/tests/endpoint_wire.rs).

use super::*;

fn info(device_caps: u32) -> EfaInfo {
    EfaInfo {
        name: "efa0".into(),
        vendor_id: 0x1d0f,
        vendor_part_id: 0xefa1,
        hw_ver: 0,
        fw_ver: String::new(),
        gid: [0; 16],
        port_active: true,
        max_msg_sz: 8928,
        max_qp: 1,
        max_cq: 1,
        max_cqe: 1,
        max_mr: 1,
        max_mr_size: 1,
        max_ah: 1,
        max_sq_wr: 1,
        max_rq_wr: 1,
        max_sq_sge: 2,
        max_rq_sge: 1,
        inline_buf_size: 32,
        max_rdma_size: 1 << 30,
        device_caps,
    }
}

#[test]
fn regions_get_the_remote_rights_asked_for_that_the_device_has() {
    use efadv::{
        EFADV_DEVICE_ATTR_CAPS_RDMA_READ as READ, EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE as WRITE,
    };
    let lw = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
    let rr = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0 as i32;
    let rw = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0 as i32;
    let both = Access::REMOTE_READ | Access::REMOTE_WRITE;
    assert_eq!(mr_access(Access::LOCAL, &info(READ | WRITE)), lw, "local write always");
    assert_eq!(mr_access(both, &info(READ | WRITE)), lw | rr | rw);
    assert_eq!(mr_access(both, &info(READ)), lw | rr, "no RDMA write: no remote write");
    assert_eq!(mr_access(both, &info(0)), lw);
    // Atomics are emulated: no verbs right.
    assert_eq!(mr_access(Access::REMOTE_ATOMIC, &info(READ | WRITE)), lw);
}

#[test]
fn opening_without_an_efa_device_says_why() {
    match EfaDomain::open(EfaConfig::default()) {
        Err(EfaError::NoDevice(why)) => {
            assert!(why.starts_with("no EFA device") || why.starts_with("no RDMA"), "{why}");
            let err = DeviceError::from(EfaError::NoDevice(why));
            assert_eq!(err, DeviceError::NotSupported);
        }
        // An EFA device (or softefa) is here.
        Ok(d) => assert!(!d.info().name.is_empty()),
        Err(e) => panic!("unexpected: {e}"),
    }
    let named = EfaConfig { device: Some("no-such-device".into()), ..EfaConfig::default() };
    assert!(matches!(EfaDomain::open(named), Err(EfaError::NoDevice(_))));
}

#[test]
fn a_config_without_buffers_is_refused() {
    let cfg = EfaConfig { bufs: 0, ..EfaConfig::default() };
    assert!(matches!(EfaDomain::open(cfg), Err(EfaError::Config(_))));
}

//! `ibv_dereg_mr` deregisters at once, as EFA does: a read a peer is
//! making of the region is let finish for a short while (its reader's
//! acknowledgements), then revoked: it fails at the reader unless all of it
//! had arrived, and later reads are refused. A WR this process posted on
//! the region keeps it (EBUSY) until that WR completes.

mod common;

use std::time::{Duration, Instant};

use common::Verbs;
use efapoll::device::udp::{UdpConfig, UdpDevice};
use efapoll::device::{Access, CqOp, CqStatus, Cqe, Device, RdmaOp, RdmaWr};
use rdma_sys::*;
use softefa::ctx as sv;

const LOCAL_WRITE: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
const REMOTE_READ: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;

/// Polls `dev` (and the QP, as its program would) until a completion.
fn completion(dev: &mut UdpDevice, v: &Verbs) -> Cqe {
    let end = Instant::now() + Duration::from_secs(20);
    let mut out = [Cqe::default(); 8];
    loop {
        assert!(Instant::now() < end, "no completion");
        if dev.poll(&mut out) > 0 {
            return out[0];
        }
        // SAFETY: the QP is open.
        assert_eq!(unsafe { v.poll() }, None);
    }
}

#[test]
fn a_region_under_a_peers_read_deregisters_at_once_and_the_read_fails() {
    // SAFETY: a verbs program's calls, in order, on objects made here.
    unsafe {
        let v = Verbs::open(0x0bad_f00d);
        let len = 1 << 20;
        let mut src = vec![7u8; len];
        let mr = v.reg(&mut src, LOCAL_WRITE | REMOTE_READ);
        // The reader names softefa's 32-bit keys, and softefa its.
        let mut reader =
            UdpDevice::new(UdpConfig { short_keys: true, ..UdpConfig::default() }).unwrap();
        let to_qp = reader.insert_addr(&v.me).unwrap();
        let local = reader.register(len as u64, Access::REMOTE_READ).unwrap();
        let (at, rkey) = (src.as_ptr() as u64, u64::from((*mr).rkey));
        let read = |wr_id, len: usize| RdmaWr {
            op: RdmaOp::Read,
            ah: to_qp,
            local: local.id,
            local_offset: 0,
            len: len as u64,
            remote_addr: at,
            remote_key: rkey,
            wr_id,
        };
        assert_eq!(reader.post_rdma(&[read(1, len)]), 1);
        // The QP takes the request and answers a window's worth; the
        // reader, busy elsewhere, takes none of it and acknowledges none.
        let end = Instant::now() + Duration::from_millis(5);
        while Instant::now() < end {
            assert_eq!(v.poll(), None);
        }
        let t = Instant::now();
        assert_eq!(sv::ibv_dereg_mr(mr), 0, "deregistered under the read, as on EFA");
        let waited = t.elapsed();
        assert!(waited >= Duration::from_millis(10), "it let the read finish first: {waited:?}");
        assert!(waited < Duration::from_secs(1), "not for long: {waited:?}");
        drop(src);
        // The rest of the read never comes: it fails.
        let c = completion(&mut reader, &v);
        assert_eq!((c.op, c.wr_id, c.status), (CqOp::Read, 1, CqStatus::RemoteAccess));
        // And the region is gone for later reads.
        assert_eq!(reader.post_rdma(&[read(2, 64)]), 1);
        let c = completion(&mut reader, &v);
        assert_eq!((c.wr_id, c.status), (2, CqStatus::RemoteAccess));

        // A region a WR of this process reads into stays until it completes.
        let mut dst = vec![0u8; 4096];
        let mr2 = v.reg(&mut dst, LOCAL_WRITE);
        reader.write_region(local.id, 0, b"read back");
        let mut ah_attr: ibv_ah_attr = std::mem::zeroed();
        ah_attr.is_global = 1;
        ah_attr.grh.dgid.raw = reader.addr().gid;
        ah_attr.port_num = 1;
        let ah = sv::ibv_create_ah(v.pd, &mut ah_attr);
        assert!(!ah.is_null());
        ibv_wr_start(v.qpx);
        (*v.qpx).wr_id = 9;
        ibv_wr_rdma_read(v.qpx, local.key as u32, local.addr);
        ibv_wr_set_ud_addr(v.qpx, ah, u32::from(reader.addr().qpn), reader.addr().connid);
        ibv_wr_set_sge(v.qpx, (*mr2).lkey, dst.as_ptr() as u64, 9);
        assert_eq!(ibv_wr_complete(v.qpx), 0);
        assert_eq!(sv::ibv_dereg_mr(mr2), libc::EBUSY, "the read writes it");
        let end = Instant::now() + Duration::from_secs(20);
        let mut out = [Cqe::default(); 8];
        loop {
            assert!(Instant::now() < end, "the QP's read never completed");
            reader.poll(&mut out);
            if let Some((wr_id, status, _)) = v.poll() {
                assert_eq!((wr_id, status), (9, ibv_wc_status::IBV_WC_SUCCESS));
                break;
            }
        }
        assert_eq!(&dst[..9], b"read back");
        assert_eq!(sv::ibv_dereg_mr(mr2), 0);
        assert_eq!(sv::ibv_destroy_ah(ah), 0);
        v.close();
    }
}

//! Receives as EFA completes them: a QP's posted receives are consumed in
//! the order they were posted.

use std::time::{Duration, Instant};

mod common;

use common::Verbs;
use efapoll::device::udp::{UdpConfig, UdpDevice};
use efapoll::device::{BufId, Cqe, Device, SendWr};
use rdma_sys::*;
use softefa::ctx as sv;

const LOCAL_WRITE: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;

/// Posts one receive of `len` bytes at `addr` under `lkey`, named `wr_id`.
///
/// # Safety
/// `qp` is open; the span is registered and stays put until it completes.
unsafe fn post_recv(qp: *mut ibv_qp, wr_id: u64, addr: u64, len: u32, lkey: u32) {
    let mut sge = ibv_sge { addr, length: len, lkey };
    // SAFETY: C data: all-zero is valid.
    let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = wr_id;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    let mut bad = std::ptr::null_mut();
    // SAFETY: the caller's contract.
    assert_eq!(unsafe { ibv_post_recv(qp, &mut wr, &mut bad) }, 0);
}

#[test]
fn receives_complete_in_the_order_posted() {
    const N: usize = 8;
    const SLOT: usize = 512;
    // SAFETY: a verbs program's calls, in order, on objects made here.
    unsafe {
        let v = Verbs::open(0x0a11_0cde);
        let mut buf = vec![0u8; N * SLOT];
        let mr = v.reg(&mut buf, LOCAL_WRITE);
        // Distinct wr_ids in no order of their own, each with its SGE; in
        // one chain of five, then one at a time.
        let ids: [u64; N] = [30, 10, 70, 20, 50, 80, 40, 60];
        let sge = |i: usize| (buf.as_ptr() as u64 + (i * SLOT) as u64, SLOT as u32);
        let mut sges: Vec<ibv_sge> = (0..5)
            .map(|i| ibv_sge { addr: sge(i).0, length: sge(i).1, lkey: (*mr).lkey })
            .collect();
        let mut chain: Vec<ibv_recv_wr> = (0..5).map(|_| std::mem::zeroed()).collect();
        for i in (0..5).rev() {
            let next = chain.get_mut(i + 1).map_or(std::ptr::null_mut(), |w| w as *mut _);
            let w = &mut chain[i];
            (w.wr_id, w.sg_list, w.num_sge, w.next) = (ids[i], &mut sges[i], 1, next);
        }
        let mut bad = std::ptr::null_mut();
        assert_eq!(ibv_post_recv(v.qp, chain.as_mut_ptr(), &mut bad), 0);
        for (i, &id) in ids.iter().enumerate().skip(5) {
            post_recv(v.qp, id, sge(i).0, sge(i).1, (*mr).lkey);
        }

        let mut udp = UdpDevice::new(UdpConfig::default()).unwrap();
        let to_qp = udp.insert_addr(&v.me).unwrap();
        let end = Instant::now() + Duration::from_secs(20);
        let mut out = [Cqe::default(); 8];
        for (i, &want) in ids.iter().enumerate() {
            // One at a time, so that the wire's order does not matter.
            let msg = format!("packet {i}");
            udp.buf_mut(BufId(0))[..msg.len()].copy_from_slice(msg.as_bytes());
            let wr =
                SendWr { ah: to_qp, buf: BufId(0), len: msg.len() as u32, data: None, wr_id: 0 };
            assert_eq!(udp.post_send(&[wr]), 1);
            let (mut sent, mut got) = (false, None);
            while !sent || got.is_none() {
                assert!(Instant::now() < end, "receive {i}: sent {sent} got {got:?}");
                sent |= udp.poll(&mut out) > 0;
                got = got.or(v.poll());
            }
            let (wr_id, status, len) = got.unwrap();
            assert_eq!(status, ibv_wc_status::IBV_WC_SUCCESS);
            assert_eq!(wr_id, want, "receive {i} completes the WR posted {i}th");
            assert_eq!(len as usize, msg.len());
            let at = i * SLOT;
            assert_eq!(&buf[at..at + msg.len()], msg.as_bytes(), "into that WR's SGE");
        }
        assert_eq!(sv::ibv_dereg_mr(mr), 0);
        v.close();
    }
}

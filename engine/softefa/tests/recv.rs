//! Receives as EFA completes them: a QP's posted receives are consumed in
//! the order they were posted; a send with immediate data completes as a
//! receive flagged with it.

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

/// A completion's fields a receive test looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wc {
    wr_id: u64,
    status: u32,
    opcode: u32,
    flags: u32,
    imm: u32,
    byte_len: u32,
}

/// Takes a completion of `v`'s CQ if one came.
///
/// # Safety
/// The objects are open.
unsafe fn poll_wc(v: &Verbs) -> Option<Wc> {
    // SAFETY: the caller's contract.
    unsafe {
        let mut attr: ibv_poll_cq_attr = std::mem::zeroed();
        if ibv_start_poll(v.cq, &mut attr) != 0 {
            return None;
        }
        let flags = ibv_wc_read_wc_flags(v.cq);
        let with_imm = flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        let wc = Wc {
            wr_id: (*v.cq).wr_id,
            status: (*v.cq).status,
            opcode: ibv_wc_read_opcode(v.cq),
            flags,
            imm: if with_imm { ibv_wc_read_imm_data(v.cq) } else { 0 },
            byte_len: ibv_wc_read_byte_len(v.cq),
        };
        ibv_end_poll(v.cq);
        Some(wc)
    }
}

/// Sends with immediate data, through `ibv_wr_send_imm` and through
/// `ibv_post_send`'s `IBV_WR_SEND_WITH_IMM`, complete at the receiver as
/// EFA completes them: `IBV_WC_RECV`, flagged `IBV_WC_WITH_IMM`, the value
/// as given (no byte order conversion), the payload in the receive's SGE;
/// a plain send after them is not flagged.
#[test]
fn a_send_with_immediate_data_completes_with_it() {
    const SLOT: usize = 256;
    // SAFETY: a verbs program's calls, in order, on objects made here.
    unsafe {
        let a = Verbs::open(0x0100_0001);
        let b = Verbs::open(0x0200_0002);
        let mut src = vec![0u8; 3 * SLOT];
        let mut dst = vec![0u8; 3 * SLOT];
        let src_mr = a.reg(&mut src, LOCAL_WRITE);
        let dst_mr = b.reg(&mut dst, LOCAL_WRITE);
        for i in 0..3 {
            let at = dst.as_ptr() as u64 + (i * SLOT) as u64;
            post_recv(b.qp, 100 + i as u64, at, SLOT as u32, (*dst_mr).lkey);
        }
        let mut ah_attr: ibv_ah_attr = std::mem::zeroed();
        ah_attr.is_global = 1;
        ah_attr.port_num = 1;
        ah_attr.grh.dgid.raw = b.me.gid;
        let ah = sv::ibv_create_ah(a.pd, &mut ah_attr);
        assert!(!ah.is_null());
        let (b_qpn, b_qkey) = (u32::from(b.me.qpn), b.me.connid);

        let msgs: [&[u8]; 3] = [b"with imm, wr api", b"with imm, post_send", b"plain"];
        // (wr_id, immediate) of each; the values as a program gives them.
        let sends = [(1u64, Some(0x1122_3344u32)), (2, Some(0xa0b0_c0d0)), (3, None)];
        let end = Instant::now() + Duration::from_secs(20);
        for (i, (msg, (wr_id, imm))) in msgs.iter().zip(sends).enumerate() {
            let at = src.as_mut_ptr().add(i * SLOT);
            std::ptr::copy_nonoverlapping(msg.as_ptr(), at, msg.len());
            let (addr, len, lkey) = (at as u64, msg.len() as u32, (*src_mr).lkey);
            if i == 1 {
                let mut sge = ibv_sge { addr, length: len, lkey };
                let mut wr: ibv_send_wr = std::mem::zeroed();
                wr.wr_id = wr_id;
                wr.sg_list = &mut sge;
                wr.num_sge = 1;
                wr.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
                wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
                wr.imm_data_invalidated_rkey_union.imm_data = imm.unwrap();
                wr.wr.ud.ah = ah;
                wr.wr.ud.remote_qpn = b_qpn;
                wr.wr.ud.remote_qkey = b_qkey;
                let mut bad = std::ptr::null_mut();
                assert_eq!(ibv_post_send(a.qp, &mut wr, &mut bad), 0);
            } else {
                ibv_wr_start(a.qpx);
                (*a.qpx).wr_id = wr_id;
                (*a.qpx).wr_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
                match imm {
                    Some(imm) => ibv_wr_send_imm(a.qpx, imm),
                    None => ibv_wr_send(a.qpx),
                }
                ibv_wr_set_ud_addr(a.qpx, ah, b_qpn, b_qkey);
                ibv_wr_set_sge(a.qpx, lkey, addr, len);
                assert_eq!(ibv_wr_complete(a.qpx), 0);
            }
            let (mut sent, mut got) = (None, None);
            while sent.is_none() || got.is_none() {
                assert!(Instant::now() < end, "send {i}: sent {sent:?} got {got:?}");
                sent = sent.or(poll_wc(&a));
                got = got.or(poll_wc(&b));
            }
            let sent = sent.unwrap();
            assert_eq!((sent.wr_id, sent.status), (wr_id, ibv_wc_status::IBV_WC_SUCCESS));
            assert_eq!(sent.opcode, ibv_wc_opcode::IBV_WC_SEND);
            let flags = match imm {
                Some(_) => ibv_wc_flags::IBV_WC_WITH_IMM.0,
                None => 0,
            };
            let want = Wc {
                wr_id: 100 + i as u64,
                status: ibv_wc_status::IBV_WC_SUCCESS,
                opcode: ibv_wc_opcode::IBV_WC_RECV,
                flags,
                imm: imm.unwrap_or(0),
                byte_len: msg.len() as u32,
            };
            assert_eq!(got.unwrap(), want, "send {i}");
            assert_eq!(&dst[i * SLOT..i * SLOT + msg.len()], *msg, "send {i}'s payload");
        }
        assert_eq!(sv::ibv_destroy_ah(ah), 0);
        assert_eq!(sv::ibv_dereg_mr(src_mr), 0);
        assert_eq!(sv::ibv_dereg_mr(dst_mr), 0);
        a.close();
        b.close();
    }
}

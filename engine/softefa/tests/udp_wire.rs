//! softefa's wire is the udp device's: a softefa QP and a plain
//! `UdpDevice` (what `efapoll -p udp` runs) reach each other, with
//! GID = socket address, QPN = port and qkey = connid.

use std::time::{Duration, Instant};

mod common;

use efapoll::device::udp::{UdpConfig, UdpDevice};
use efapoll::device::{BufId, CqOp, CqStatus, Cqe, Device, SendWr, Source};
use rdma_sys::*;
use softefa::ctx as sv;
use softefa::efadv::*;

#[test]
fn a_softefa_qp_and_a_udp_device_exchange_sends() {
    // SAFETY: a verbs program's calls, in order, on objects made here.
    unsafe {
        let v = common::Verbs::open(0x0bad_cafe);
        let (cq, qp, qpx, me) = (v.cq, v.qp, v.qpx, v.me);
        let mut buf = vec![0u8; 8192];
        let mr = v.reg(&mut buf, ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);

        let mut udp = UdpDevice::new(UdpConfig::default()).unwrap();
        let to_qp = udp.insert_addr(&me).unwrap();
        // softefa receives from the udp device, an unknown sender.
        let mut sge = ibv_sge { addr: buf.as_ptr() as u64, length: 8192, lkey: (*mr).lkey };
        let mut rwr: ibv_recv_wr = std::mem::zeroed();
        rwr.wr_id = 77;
        rwr.sg_list = &mut sge;
        rwr.num_sge = 1;
        let mut bad = std::ptr::null_mut();
        assert_eq!(ibv_post_recv(qp, &mut rwr, &mut bad), 0);
        udp.buf_mut(BufId(0))[..5].copy_from_slice(b"hello");
        let wr = SendWr { ah: to_qp, buf: BufId(0), len: 5, data: None, wr_id: 1 };
        assert_eq!(udp.post_send(&[wr]), 1);
        let end = Instant::now() + Duration::from_secs(10);
        let mut out = [Cqe::default(); 8];
        let mut attr: ibv_poll_cq_attr = std::mem::zeroed();
        let (mut got, mut sent) = (false, false);
        while !(got && sent) {
            assert!(Instant::now() < end, "got {got} sent {sent}");
            let n = udp.poll(&mut out);
            for c in &out[..n] {
                assert_eq!((c.op, c.status, c.wr_id), (CqOp::Send, CqStatus::Ok, 1));
                sent = true;
            }
            if ibv_start_poll(cq, &mut attr) == 0 {
                assert_eq!(((*cq).wr_id, (*cq).status), (77, ibv_wc_status::IBV_WC_SUCCESS));
                assert_eq!(ibv_wc_read_byte_len(cq), 5);
                assert_eq!(ibv_wc_read_slid(cq), 0xffff);
                assert_eq!(ibv_wc_read_src_qp(cq), u32::from(udp.addr().qpn));
                let mut sgid: ibv_gid = std::mem::zeroed();
                assert_eq!(efadv_wc_read_sgid(efadv_cq_from_ibv_cq_ex(cq), &mut sgid), 0);
                assert_eq!(sgid.raw, udp.addr().gid);
                ibv_end_poll(cq);
                got = true;
            }
        }
        assert_eq!(&buf[..5], b"hello");

        // And back: softefa sends to the udp device's address.
        let mut ah_attr: ibv_ah_attr = std::mem::zeroed();
        ah_attr.is_global = 1;
        ah_attr.grh.dgid.raw = udp.addr().gid;
        ah_attr.port_num = 1;
        let ah = sv::ibv_create_ah(v.pd, &mut ah_attr);
        assert_eq!(udp.post_recv(&[BufId(3)]), 1);
        buf[..6].copy_from_slice(b"world!");
        ibv_wr_start(qpx);
        (*qpx).wr_id = 88;
        ibv_wr_send(qpx);
        ibv_wr_set_ud_addr(qpx, ah, u32::from(udp.addr().qpn), udp.addr().connid);
        ibv_wr_set_sge(qpx, (*mr).lkey, buf.as_ptr() as u64, 6);
        assert_eq!(ibv_wr_complete(qpx), 0);
        let (mut got, mut sent) = (false, false);
        while !(got && sent) {
            assert!(Instant::now() < end, "got {got} sent {sent}");
            let n = udp.poll(&mut out);
            for c in &out[..n] {
                assert_eq!((c.op, c.len, c.wr_id), (CqOp::Recv, 6, 3));
                assert_eq!(c.src, Source::Known(to_qp), "the udp device knows the QP's address");
                assert_eq!(&udp.buf(BufId(3))[..6], b"world!");
                got = true;
            }
            if ibv_start_poll(cq, &mut attr) == 0 {
                assert_eq!(((*cq).wr_id, (*cq).status), (88, ibv_wc_status::IBV_WC_SUCCESS));
                ibv_end_poll(cq);
                sent = true;
            }
        }
        assert_eq!(sv::ibv_destroy_ah(ah), 0);
        assert_eq!(sv::ibv_dereg_mr(mr), 0);
        v.close();
    }
}

/// A send's payload arrives whole however it was given: one span of
/// registered memory (sent from where it is when large), two spans,
/// inline data.
#[test]
fn sends_of_spans_large_small_and_inline_arrive_whole() {
    // SAFETY: a verbs program's calls, in order, on objects made here.
    unsafe {
        let v = common::Verbs::open(0x5eed);
        let mut mem: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
        let mr = v.reg(&mut mem, ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
        let lkey = (*mr).lkey;
        let at = mem.as_ptr() as u64;
        let mut udp = UdpDevice::new(UdpConfig::default()).unwrap();
        let bufs: Vec<BufId> = (0..8).map(BufId).collect();
        assert_eq!(udp.post_recv(&bufs), 8);
        let mut ah_attr: ibv_ah_attr = std::mem::zeroed();
        ah_attr.is_global = 1;
        ah_attr.grh.dgid.raw = udp.addr().gid;
        ah_attr.port_num = 1;
        let ah = sv::ibv_create_ah(v.pd, &mut ah_attr);
        let inline = *b"sixteen bytes!!!";
        let sge = |off: u64, len: u32| ibv_sge { addr: at + off, length: len, lkey };
        let cases: [(&[ibv_sge], bool); 5] = [
            (&[sge(0, 64)], false),
            (&[sge(100, 8000)], false),
            (&[sge(0, 3000), sge(5000, 1000)], false),
            (&[sge(10, 100), sge(2000, 4000)], false),
            (&[], true),
        ];
        let end = Instant::now() + Duration::from_secs(10);
        let mut out = [Cqe::default(); 8];
        for (k, (sges, with_inline)) in cases.iter().enumerate() {
            ibv_wr_start(v.qpx);
            (*v.qpx).wr_id = k as u64;
            ibv_wr_send(v.qpx);
            ibv_wr_set_ud_addr(v.qpx, ah, u32::from(udp.addr().qpn), udp.addr().connid);
            if *with_inline {
                ibv_wr_set_inline_data(v.qpx, inline.as_ptr() as *mut _, inline.len());
            } else {
                ibv_wr_set_sge_list(v.qpx, sges.len(), sges.as_ptr());
            }
            assert_eq!(ibv_wr_complete(v.qpx), 0, "case {k}");
            let want: Vec<u8> = match with_inline {
                true => inline.to_vec(),
                false => sges
                    .iter()
                    .flat_map(|g| mem[(g.addr - at) as usize..][..g.length as usize].to_vec())
                    .collect(),
            };
            let (mut got, mut sent) = (None, false);
            while got.is_none() || !sent {
                assert!(Instant::now() < end, "case {k}: got {got:?} sent {sent}");
                let n = udp.poll(&mut out);
                if let Some(c) = out[..n].first() {
                    got = Some((BufId::from_wr_id(c.wr_id), c.len as usize));
                }
                if let Some((wr_id, status, _)) = v.poll() {
                    assert_eq!((wr_id, status), (k as u64, ibv_wc_status::IBV_WC_SUCCESS));
                    sent = true;
                }
            }
            let (buf, len) = got.unwrap();
            assert!(udp.buf(buf)[..len] == want[..], "case {k}: {len} bytes");
            udp.post_recv(&[buf]);
        }
        assert_eq!(sv::ibv_destroy_ah(ah), 0);
        assert_eq!(sv::ibv_dereg_mr(mr), 0);
        v.close();
    }
}

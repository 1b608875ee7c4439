//! A verbs program's set-up through softefa's calls, for tests that drive
//! a softefa QP against a plain udp device.

#![allow(dead_code)]

use rdma_sys::*;
use softefa::ctx as sv;
use softefa::efadv::*;
use softefa::{cq::efadv_create_cq, qp::efadv_create_qp_ex};

use efapoll::wire::RawAddr;

/// A context, PD, CQ and SRD QP (in RTS) of softefa's one device.
pub struct Verbs {
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub cq: *mut ibv_cq_ex,
    pub qp: *mut ibv_qp,
    pub qpx: *mut ibv_qp_ex,
    /// The QP's raw address, as the efa device puts it in its handshake.
    pub me: RawAddr,
}

impl Verbs {
    /// Opens the device and makes a QP with qkey `qkey` that sends (with
    /// immediate data or not) and does RDMA read, its send and receive
    /// queues on one CQ that reports senders' GIDs.
    ///
    /// # Safety
    /// A verbs program's calls; the objects are the caller's until
    /// [`Verbs::close`].
    pub unsafe fn open(qkey: u32) -> Verbs {
        // SAFETY: the caller's contract.
        unsafe {
            let list = sv::ibv_get_device_list(std::ptr::null_mut());
            let ctx = sv::ibv_open_device(*list);
            sv::ibv_free_device_list(list);
            let pd = sv::ibv_alloc_pd(ctx);
            let mut ca: ibv_cq_init_attr_ex = std::mem::zeroed();
            ca.cqe = 64;
            ca.wc_flags = 0x7f;
            // With the sender's GID, as the efa device asks for it.
            let mut ea =
                efadv_cq_init_attr { wc_flags: EFADV_WC_EX_WITH_SGID, ..Default::default() };
            let cq = efadv_create_cq(ctx, &mut ca, &mut ea, inlen::<efadv_cq_init_attr>());
            assert!(!cq.is_null());
            let mut qa: ibv_qp_init_attr_ex = std::mem::zeroed();
            qa.send_cq = cq.cast();
            qa.recv_cq = cq.cast();
            qa.cap.max_send_wr = 16;
            qa.cap.max_recv_wr = 16;
            qa.cap.max_send_sge = 2;
            qa.cap.max_inline_data = 32;
            qa.cap.max_recv_sge = 1;
            qa.qp_type = ibv_qp_type::IBV_QPT_DRIVER;
            qa.sq_sig_all = 1;
            qa.comp_mask = ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0
                | ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
            qa.pd = pd;
            qa.send_ops_flags = (ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND.0
                | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_IMM.0
                | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_READ.0)
                as u64;
            let mut e = efadv_qp_init_attr::default();
            let qp = efadv_create_qp_ex(ctx, &mut qa, &mut e, inlen::<efadv_qp_init_attr>());
            assert!(!qp.is_null());
            for (state, mask) in [
                (ibv_qp_state::IBV_QPS_INIT, 1 | 16 | 32 | 64),
                (ibv_qp_state::IBV_QPS_RTR, 1),
                (ibv_qp_state::IBV_QPS_RTS, 1 | 65536),
            ] {
                let mut a: ibv_qp_attr = std::mem::zeroed();
                a.qp_state = state;
                a.qkey = qkey;
                a.port_num = 1;
                assert_eq!(softefa::qp::ibv_modify_qp(qp, &mut a, mask), 0);
            }
            let mut gid: ibv_gid = std::mem::zeroed();
            assert_eq!(sv::ibv_query_gid(ctx, 1, 0, &mut gid), 0);
            let me = RawAddr { gid: gid.raw, qpn: (*qp).qp_num as u16, connid: qkey };
            let qpx = softefa::qp::ibv_qp_to_qp_ex(qp);
            Verbs { ctx, pd, cq, qp, qpx, me }
        }
    }

    /// Registers `buf` with `access` (`ibv_access_flags`).
    ///
    /// # Safety
    /// `buf` stays put until the MR is deregistered.
    pub unsafe fn reg(&self, buf: &mut [u8], access: u32) -> *mut ibv_mr {
        // SAFETY: the caller's contract.
        let mr =
            unsafe { sv::ibv_reg_mr(self.pd, buf.as_mut_ptr().cast(), buf.len(), access as i32) };
        assert!(!mr.is_null());
        mr
    }

    /// Takes a completion if one came: (wr_id, status, byte_len).
    ///
    /// # Safety
    /// The objects are open.
    pub unsafe fn poll(&self) -> Option<(u64, u32, u32)> {
        // SAFETY: the caller's contract.
        unsafe {
            let mut attr: ibv_poll_cq_attr = std::mem::zeroed();
            if ibv_start_poll(self.cq, &mut attr) != 0 {
                return None;
            }
            let c = ((*self.cq).wr_id, (*self.cq).status, ibv_wc_read_byte_len(self.cq));
            ibv_end_poll(self.cq);
            Some(c)
        }
    }

    /// Destroys the QP, CQ and PD (whose MRs are gone) and closes the device.
    ///
    /// # Safety
    /// As [`Verbs::open`].
    pub unsafe fn close(self) {
        // SAFETY: the caller's contract.
        unsafe {
            assert_eq!(softefa::qp::ibv_destroy_qp(self.qp), 0);
            assert_eq!(softefa::cq::ibv_destroy_cq(self.cq.cast()), 0);
            assert_eq!(sv::ibv_dealloc_pd(self.pd), 0);
            assert_eq!(sv::ibv_close_device(self.ctx), 0);
        }
    }
}

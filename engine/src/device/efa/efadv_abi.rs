// The efadv ABI (rdma-core's infiniband/efadv.h, as of rdma-core 44),
// written once. `efadv.rs` expands it into the Rust declarations and
// compile-time checks of their layout; the engine's build script (feature
// `efa`) expands it into C static assertions compiled against the
// installed header, so neither side can drift from the other or from
// rdma-core. Layouts are the LP64 ones (x86_64, aarch64: where EFA runs).

efadv_structs! {
    /// `efadv_create_qp_ex`'s EFA-specific attributes.
    efadv_qp_init_attr (16) {
        pub comp_mask: u64 = 0,
        /// `EFADV_QP_DRIVER_TYPE_SRD`.
        pub driver_qp_type: u32 = 8,
        pub reserved: [u8; 4] = 12,
    }
    /// What `efadv_query_device` reports.
    efadv_device_attr (32) {
        pub comp_mask: u64 = 0,
        pub max_sq_wr: u32 = 8,
        pub max_rq_wr: u32 = 12,
        pub max_sq_sge: u16 = 16,
        pub max_rq_sge: u16 = 18,
        pub inline_buf_size: u16 = 20,
        pub reserved: [u8; 2] = 22,
        /// `EFADV_DEVICE_ATTR_CAPS_*`.
        pub device_caps: u32 = 24,
        /// Largest RDMA read or write, in bytes.
        pub max_rdma_size: u32 = 28,
    }
    /// What `efadv_query_ah` reports.
    efadv_ah_attr (16) {
        pub comp_mask: u64 = 0,
        /// The address handle number: what a receive completion's `slid`
        /// names its sender by.
        pub ahn: u16 = 8,
        pub reserved: [u8; 6] = 10,
    }
    /// The EFA view of an extended CQ (`efadv_cq_from_ibv_cq_ex`).
    efadv_cq (16) {
        pub comp_mask: u64 = 0,
        /// Reads the current completion's sender GID; called through
        /// [`efadv_wc_read_sgid`].
        pub wc_read_sgid: Option<unsafe extern "C" fn(*mut efadv_cq, *mut ibv_gid) -> c_int> = 8,
    }
    /// `efadv_create_cq`'s EFA-specific attributes.
    efadv_cq_init_attr (16) {
        pub comp_mask: u64 = 0,
        /// `EFADV_WC_EX_WITH_*`.
        pub wc_flags: u64 = 8,
    }
}

efadv_consts! {
    header {
        /// The SRD QP type of `efadv_create_qp_ex` and `efadv_create_driver_qp`.
        EFADV_QP_DRIVER_TYPE_SRD: u32 = 0,
        /// The device performs RDMA read.
        EFADV_DEVICE_ATTR_CAPS_RDMA_READ: u32 = 1 << 0,
        /// The QP honours `rnr_retry`.
        EFADV_DEVICE_ATTR_CAPS_RNR_RETRY: u32 = 1 << 1,
        /// A CQ can report the sender's GID (`EFADV_WC_EX_WITH_SGID`).
        EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID: u32 = 1 << 2,
        /// `efadv_create_cq`: completions carry the sender's GID.
        EFADV_WC_EX_WITH_SGID: u64 = 1 << 0,
    }
    // Newer than rdma-core 44: a newer library (or a preloaded provider)
    // may report them at run time. Checked against the header only where
    // it declares them.
    newer {
        /// The device performs RDMA write (rdma-core 45).
        EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE: u32 = 1 << 3,
    }
}

efadv_fns! {
    /// Fills `attr` (`inlen` = its size); fails on a device that is not
    /// EFA, which is how EFA devices are told from others.
    fn efadv_query_device(ibvctx: *mut ibv_context, attr: *mut efadv_device_attr, inlen: u32) -> c_int;
    /// An SRD QP from a plain `ibv_qp_init_attr` (no extended send ops).
    fn efadv_create_driver_qp(ibvpd: *mut ibv_pd, attr: *mut ibv_qp_init_attr, driver_qp_type: u32) -> *mut ibv_qp;
    /// An SRD QP with extended attributes (`ibv_wr_*` send ops).
    fn efadv_create_qp_ex(ibvctx: *mut ibv_context, attr_ex: *mut ibv_qp_init_attr_ex, efa_attr: *mut efadv_qp_init_attr, inlen: u32) -> *mut ibv_qp;
    /// The address handle number of `ibvah`.
    fn efadv_query_ah(ibvah: *mut ibv_ah, attr: *mut efadv_ah_attr, inlen: u32) -> c_int;
    /// An extended CQ with EFA-specific completion fields.
    fn efadv_create_cq(ibvctx: *mut ibv_context, attr_ex: *mut ibv_cq_init_attr_ex, efa_attr: *mut efadv_cq_init_attr, inlen: u32) -> *mut ibv_cq_ex;
    /// The EFA view of a CQ made by `efadv_create_cq`; null for other CQs.
    fn efadv_cq_from_ibv_cq_ex(ibvcqx: *mut ibv_cq_ex) -> *mut efadv_cq;
}

//! The `efa` device: libibverbs and EFA direct verbs (SRD queue pairs),
//! behind the `efa` cargo feature, so that default builds need no
//! rdma-core.

pub mod efadv;

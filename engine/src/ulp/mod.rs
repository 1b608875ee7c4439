//! Upper-layer protocols framed over the endpoint's messages.
//!
//! * [`smbd`]: SMB Direct's data transfer (MS-SMBD 3.1.5.4 and the
//!   message of 2.2.3): segmentation of a message into sends of at most
//!   MaxSendSize, reassembly on the other side, credits, and the remote
//!   invalidation of a memory token.
//!
//! A protocol here does no I/O of its own: it is driven, like the
//! endpoint, by the caller's poll loop, and reaches the network only
//! through the [`Endpoint`](crate::endpoint::Endpoint) it is handed.

pub mod smbd;

//! efapoll: a poll-mode, run-to-completion engine for the EFA RDM communication
//! protocol v4, the wire protocol of libfabric's EFA provider.
//!
//! Each worker core owns one endpoint and busy-polls it; nothing on the hot
//! path is shared between cores, allocates, locks or makes a system call.
//!
//! # Embedding
//!
//! An [`endpoint::Endpoint`] runs over a [`device::Device`], one lcore's
//! half of a NIC, whose [`device::Domain`] (registrations, keys) all of a
//! process's lcores share: [`device::sim`] (in-process, deterministic),
//! [`device::shm`] (processes or threads of one host) or [`device::udp`]
//! (across hosts without EFA). Create it on the
//! thread (lcore) that will poll it, insert
//! the peer's raw address (exchanged out of band, e.g. with [`relink`]),
//! register the memory operations use, post, and call
//! [`progress`](endpoint::Endpoint::progress) in the poll loop; completions
//! come out of [`poll_cq`](endpoint::Endpoint::poll_cq). A full pool
//! answers [`Again`](endpoint::Error::Again): progress, then retry.
//!
//! ```
//! use efapoll::device::Access;
//! use efapoll::device::sim::{SimConfig, SimFabric};
//! use efapoll::endpoint::{Config, Endpoint, Op, Span};
//!
//! let fabric = SimFabric::new(SimConfig::default());
//! let mut a = Endpoint::new(fabric.device(), Config::default())?;
//! let mut b = Endpoint::new(fabric.device(), Config::default())?;
//! let to_b = a.insert_peer(&b.addr())?;
//!
//! let src = a.register(64, Access::empty())?;
//! let dst = b.register(64, Access::empty())?;
//! a.write_mem(src.id, 0, b"hello")?;
//! b.recv(Span::new(&dst, 0, 64), None, 7)?;
//! a.send(to_b, Span::new(&src, 0, 5), 1)?;
//! // Latency-sensitive code posts at once rather than at the next
//! // progress call, which posts in bursts.
//! a.flush();
//!
//! let done = loop {
//!     a.progress();
//!     b.progress();
//!     if let Some(c) = b.poll_cq() {
//!         break c;
//!     }
//! };
//! assert_eq!((done.op, done.ctx, done.len), (Op::Recv, 7, 5));
//! let mut got = [0u8; 5];
//! b.read_mem(dst.id, 0, &mut got)?;
//! assert_eq!(&got, b"hello");
//! # Ok::<(), efapoll::endpoint::Error>(())
//! ```
//!
//! On shm, replace the fabric with a `device::shm::ShmDevice::new(ShmConfig::default())`
//! per endpoint (each in its own process or thread) and give it
//! `Config::on_host()`, which reads what does not fit one packet instead of
//! pushing it through the rings twice; `efapoll-lcores` pins
//! the threads and runs their poll loops; the `efapoll` apps (crate
//! `efapoll-apps`) are complete examples of both.
//!
//! A region can also be registered once on the domain, by every lcore's
//! device attached ([`Endpoint::attach`](endpoint::Endpoint::attach)), and
//! can be memory the caller owns
//! ([`Domain::register_external`](device::Domain::register_external)); an
//! endpoint [`drain`](endpoint::Endpoint::drain)s before its regions are
//! deregistered and it [`close`](endpoint::Endpoint::close)s. The
//! README's [embedding example](readme#embedding-the-engine) goes through
//! all of it, and the [`device`] module says what a device promises.
#![deny(unsafe_code)]

/// The project's README, here so that its embedding example sits beside
/// the API it uses; its Rust examples run with the doc tests.
#[doc = include_str!("../../README.md")]
pub mod readme {}

#[allow(unsafe_code)]
pub mod device;
pub mod endpoint;
mod intmap;
#[allow(unsafe_code)]
pub mod mem;
pub mod relink;
mod ring;
pub mod ulp;
pub mod wire;

/// Whether the fast paths are on: always, but in a test build with the
/// `general-paths` feature. A fast path is work the engine could leave to
/// a general path whose outcome would be the same: the endpoint's header
/// prediction, eager sends and receives without an operation entry, one
/// span or one target without a list, its caller's inline head; the
/// sim's send landed in one pass; shm's receive from its one lane and its
/// cached head of a ring; udp's lone datagram sent and received without
/// the burst calls; the inline copies of a short atomic operand and of a
/// short packet's payload. With them off the suites check that it is the
/// same. A constant, so that a normal build pays nothing for the switch.
pub(crate) const FAST_PATHS: bool = !cfg!(feature = "general-paths");

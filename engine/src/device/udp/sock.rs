//! The udp device's socket: non-blocking, busy-polled, datagrams moved in
//! bursts by `sendmmsg` and `recvmmsg` (one system call a burst), gathered
//! from and scattered into memory the device owns, so nothing is allocated
//! or copied on the way.
//!
//! Datagrams to a peer leave by a socket connected to it, where the
//! device keeps one (the first `connected_peers` peers): an unconnected
//! send looks the route up for every datagram, a good part of a loopback
//! pingpong's time (perf/README.md). Every datagram names the device's
//! own port in its header, where answers go.
//!
//! A lone datagram goes by `sendto` (copied whole when short) or
//! `sendmsg`, and an idle socket is polled by `recvmsg` until something
//! comes: the burst calls cost more each (their array handling, and a
//! `recvmmsg` that got one datagram tries for a second), which a pingpong
//! pays on every message. Both are fast paths: with the `general-paths`
//! feature every send and receive takes the burst calls.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

use crate::device::fault::Wire;

/// Datagrams a burst moves at most.
pub(crate) const BURST: usize = 32;
/// Pieces a datagram is gathered from: headers, packet, region bytes.
const PARTS: usize = 3;

/// One datagram to send: up to three pieces of memory, gathered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Out {
    pub to: SocketAddr,
    /// The socket it leaves by: one connected to `to` ([`Sock::connect`]),
    /// or [`MAIN`].
    pub via: u16,
    pub parts: [(*const u8, usize); PARTS],
}

/// [`Out::via`] of the device's own socket.
pub(crate) const MAIN: u16 = u16::MAX;

/// The socket and the system call arrays of its bursts.
#[derive(Debug)]
pub(crate) struct Sock {
    sock: UdpSocket,
    local: SocketAddr,
    sndbuf: usize,
    rcvbuf: usize,
    tx_hdrs: Box<[libc::mmsghdr; BURST]>,
    tx_iov: Box<[[libc::iovec; PARTS]; BURST]>,
    tx_addr: Box<[libc::sockaddr_storage; BURST]>,
    rx_hdrs: Box<[libc::mmsghdr; BURST]>,
    rx_iov: Box<[libc::iovec; BURST]>,
    rx_addr: Box<[libc::sockaddr_storage; BURST]>,
    /// The last receive got something: more may follow, ask for a burst.
    rx_flowing: bool,
    /// Sockets connected to one peer each, for sending.
    peers: Vec<UdpSocket>,
    /// Where datagrams land ([`Sock::set_frames`]); null before.
    rx_frames: Box<[*mut u8; BURST]>,
    /// A lone short datagram, made contiguous.
    flat: Box<[u8; FLAT_MAX]>,
}

// SAFETY: the raw pointers in the system call arrays are written before
// each call and read only during it, on the thread that owns the socket.
unsafe impl Send for Sock {}

fn zeroed_box<T>() -> Box<T> {
    // SAFETY: used only for arrays of C structs (mmsghdr, iovec,
    // sockaddr_storage) for which all-zero bytes are a valid value.
    Box::new(unsafe { zeroed::<T>() })
}

fn setsockopt(fd: i32, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: a plain syscall with a pointer to a live c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&v as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

fn getsockopt(fd: i32, opt: libc::c_int) -> usize {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a plain syscall writing one c_int into `v`.
    let r = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, opt, (&mut v as *mut libc::c_int).cast(), &mut len)
    };
    if r < 0 { 0 } else { v.max(0) as usize }
}

/// Writes `a` as a C socket address; returns its length.
fn to_c(a: &SocketAddr, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match a {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in.
            let s =
                unsafe { &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = a.port().to_be();
            s.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) };
            size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in6.
            let s =
                unsafe { &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = a.port().to_be();
            s.sin6_flowinfo = 0;
            s.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
            s.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Reads a C socket address the kernel wrote.
fn from_c(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match s.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let s = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(s.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(s.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let s = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(s.sin6_addr.s6_addr);
            let port = u16::from_be(s.sin6_port);
            Some(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, s.sin6_scope_id)))
        }
        _ => None,
    }
}

/// A lone datagram up to this long is copied whole and sent by `sendto`,
/// which takes no message header and no iovec array in from user space:
/// that saves a pingpong more than the copy costs.
const FLAT_MAX: usize = 1024;

/// Sends the datagrams of `hdrs` on `fd`: `sendto` or `sendmsg` for one,
/// `sendmmsg` for more; returns how many the kernel took. A datagram the
/// kernel refuses outright (an unreachable peer's ICMP, too large) counts
/// as taken: it is lost as on a wire, and reliability resends or gives up.
///
/// # Safety
/// Each header points at memory readable for the lengths it gives.
unsafe fn send_run(fd: i32, hdrs: &mut [libc::mmsghdr], flat: &mut [u8; FLAT_MAX]) -> usize {
    let mut sent = 0;
    while sent < hdrs.len() {
        let r = if crate::FAST_PATHS && hdrs.len() - sent == 1 {
            let h = &hdrs[sent].msg_hdr;
            // SAFETY: as the caller promises, for the one header's iovecs.
            let iov = unsafe { std::slice::from_raw_parts(h.msg_iov, h.msg_iovlen) };
            let len: usize = iov.iter().map(|v| v.iov_len).sum();
            let r = if len <= FLAT_MAX {
                let mut at = 0;
                for v in iov {
                    // SAFETY: each iovec is readable for its length (the
                    // caller's promise); `flat` holds all of them.
                    let part =
                        unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) };
                    flat[at..at + part.len()].copy_from_slice(part);
                    at += part.len();
                }
                // SAFETY: `flat` holds `len` bytes; the name is the
                // header's (null on a connected socket).
                unsafe {
                    libc::sendto(fd, flat.as_ptr().cast(), len, 0, h.msg_name.cast(), h.msg_namelen)
                }
            } else {
                // SAFETY: as the caller promises, for the one header.
                unsafe { libc::sendmsg(fd, h, 0) }
            };
            if r < 0 { -1 } else { 1 }
        } else {
            // SAFETY: as the caller promises, for every header from `sent`.
            unsafe {
                libc::sendmmsg(
                    fd,
                    hdrs.as_mut_ptr().add(sent),
                    (hdrs.len() - sent) as libc::c_uint,
                    0,
                )
            }
        };
        if r <= 0 {
            let e = io::Error::last_os_error();
            if r < 0 && e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if r < 0 && e.kind() != io::ErrorKind::WouldBlock {
                sent += 1;
                continue;
            }
            break;
        }
        sent += r as usize;
    }
    sent
}

impl Sock {
    /// A socket bound to `bind`, non-blocking, its buffers asked to hold
    /// `buffer` bytes (above the system's limit where we may: root).
    pub(crate) fn bind(bind: SocketAddr, buffer: usize) -> io::Result<Sock> {
        let sock = UdpSocket::bind(bind)?;
        sock.set_nonblocking(true)?;
        let fd = sock.as_raw_fd();
        let want = libc::c_int::try_from(buffer).unwrap_or(libc::c_int::MAX);
        for (force, plain) in
            [(libc::SO_SNDBUFFORCE, libc::SO_SNDBUF), (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF)]
        {
            if setsockopt(fd, force, want).is_err() {
                setsockopt(fd, plain, want)?;
            }
        }
        let local = sock.local_addr()?;
        Ok(Sock {
            sndbuf: getsockopt(fd, libc::SO_SNDBUF),
            rcvbuf: getsockopt(fd, libc::SO_RCVBUF),
            sock,
            local,
            tx_hdrs: zeroed_box(),
            tx_iov: zeroed_box(),
            tx_addr: zeroed_box(),
            rx_hdrs: zeroed_box(),
            rx_iov: zeroed_box(),
            rx_addr: zeroed_box(),
            rx_flowing: false,
            peers: Vec::new(),
            rx_frames: Box::new([std::ptr::null_mut(); BURST]),
            flat: Box::new([0; FLAT_MAX]),
        })
    }

    pub(crate) fn local(&self) -> SocketAddr {
        self.local
    }

    /// The socket's descriptor.
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }

    /// The socket buffers the kernel granted: (send, receive) bytes.
    pub(crate) fn buffers(&self) -> (usize, usize) {
        (self.sndbuf, self.rcvbuf)
    }

    /// A socket of our own connected to `peer`, for sending to it only
    /// (the kernel skips the route lookup an unconnected send makes for
    /// every datagram); its number for [`Out::via`]. None where the system
    /// refuses one (out of descriptors): the device's socket serves.
    pub(crate) fn connect(&mut self, peer: SocketAddr) -> Option<u16> {
        if self.peers.len() >= usize::from(MAIN) {
            return None;
        }
        let sock = UdpSocket::bind(SocketAddr::new(self.local.ip(), 0)).ok()?;
        sock.connect(peer).ok()?;
        sock.set_nonblocking(true).ok()?;
        let fd = sock.as_raw_fd();
        let want = libc::c_int::try_from(self.sndbuf / 2).unwrap_or(libc::c_int::MAX);
        if setsockopt(fd, libc::SO_SNDBUFFORCE, want).is_err() {
            setsockopt(fd, libc::SO_SNDBUF, want).ok()?;
        }
        // Nothing is sent to it but errors: the least buffer there is.
        setsockopt(fd, libc::SO_RCVBUF, 0).ok()?;
        self.peers.push(sock);
        Some((self.peers.len() - 1) as u16)
    }

    /// Sends up to [`BURST`] datagrams, a system call for each run that
    /// leaves by one socket; returns how many the kernel took (fewer: a
    /// buffer is full, try the rest later).
    ///
    /// # Safety
    /// Every part of every datagram is readable for its length.
    pub(crate) unsafe fn send(&mut self, out: &[Out]) -> usize {
        let n = out.len().min(BURST);
        for (i, o) in out[..n].iter().enumerate() {
            let mut parts = 0;
            for &(ptr, len) in &o.parts {
                if len > 0 {
                    self.tx_iov[i][parts] = libc::iovec { iov_base: ptr as *mut _, iov_len: len };
                    parts += 1;
                }
            }
            let h = &mut self.tx_hdrs[i].msg_hdr;
            if o.via == MAIN {
                let alen = to_c(&o.to, &mut self.tx_addr[i]);
                h.msg_name = (&mut self.tx_addr[i] as *mut libc::sockaddr_storage).cast();
                h.msg_namelen = alen;
            } else {
                h.msg_name = std::ptr::null_mut();
                h.msg_namelen = 0;
            }
            h.msg_iov = self.tx_iov[i].as_mut_ptr();
            h.msg_iovlen = parts;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
        }
        let mut sent = 0;
        while sent < n {
            let via = out[sent].via;
            let run = out[sent..n].iter().take_while(|o| o.via == via).count();
            let fd = match self.peers.get(usize::from(via)) {
                Some(peer) => peer.as_raw_fd(),
                None => self.sock.as_raw_fd(),
            };
            // SAFETY: the headers from `sent` point at addresses and
            // iovecs set above, whose memory the caller promises readable.
            let took = unsafe { send_run(fd, &mut self.tx_hdrs[sent..sent + run], &mut self.flat) };
            sent += took;
            if took < run {
                break;
            }
        }
        sent
    }

    /// Gives the socket the frames datagrams land in, `cap` bytes each, and
    /// sets the receive headers up once for them.
    ///
    /// # Safety
    /// Every frame is writable for `cap` bytes, for as long as the socket
    /// lives, and not used by anyone else during [`Sock::recv`].
    pub(crate) unsafe fn set_frames(&mut self, frames: &[*mut u8; BURST], cap: usize) {
        *self.rx_frames = *frames;
        for (i, &f) in frames.iter().enumerate() {
            self.rx_iov[i] = libc::iovec { iov_base: f.cast(), iov_len: cap };
            let h = &mut self.rx_hdrs[i].msg_hdr;
            h.msg_name = (&mut self.rx_addr[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut self.rx_iov[i];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
        }
    }

    /// Receives up to `got.len()` datagrams in one call, into the frames
    /// given by [`Sock::set_frames`], in order; writes each one's sender
    /// and length into `got` and returns how many.
    pub(crate) fn recv(&mut self, got: &mut [(SocketAddr, usize)]) -> usize {
        if self.rx_frames[0].is_null() {
            return 0;
        }
        let most = if self.rx_flowing || !crate::FAST_PATHS { BURST } else { 1 };
        let n = got.len().min(most);
        for h in &mut self.rx_hdrs[..n] {
            // The kernel wrote back the last sender's length.
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        }
        let fd = self.sock.as_raw_fd();
        let r = if crate::FAST_PATHS && n == 1 {
            // SAFETY: as below, for the first header.
            let r = unsafe { libc::recvmsg(fd, &mut self.rx_hdrs[0].msg_hdr, libc::MSG_DONTWAIT) };
            if r < 0 {
                -1
            } else {
                // One datagram, maybe empty (a length of 0 is not "none").
                self.rx_hdrs[0].msg_len = r as libc::c_uint;
                1
            }
        } else {
            // SAFETY: the headers point at the frames (writable, as
            // `set_frames`' caller promised) and our address storage.
            unsafe {
                libc::recvmmsg(
                    fd,
                    self.rx_hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            }
        };
        self.rx_flowing = r > 0;
        if r <= 0 {
            return 0;
        }
        let mut k = 0;
        for i in 0..r as usize {
            let h = &self.rx_hdrs[i];
            // A datagram cut to the frame is longer than any we send.
            if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                continue;
            }
            if let Some(from) = from_c(&self.rx_addr[i]) {
                got[k] = (from, h.msg_len as usize);
                // Keep frames and results aligned: move the frame's bytes
                // only when one was skipped, which is rare.
                if k != i {
                    let (from, to) = (self.rx_frames[i], self.rx_frames[k]);
                    // SAFETY: both frames are ours during the call and hold
                    // `msg_len` bytes at least (`set_frames`).
                    unsafe { std::ptr::copy(from, to, h.msg_len as usize) };
                }
                k += 1;
            }
        }
        k
    }
}

/// One datagram at a time, for the fault layer ([`crate::device::fault::Faulty`]).
impl Wire for Sock {
    type Addr = SocketAddr;

    fn send(&mut self, _now_ns: u64, to: SocketAddr, bytes: &[u8]) -> bool {
        match self.sock.send_to(bytes, to) {
            Ok(_) => true,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        }
    }

    fn recv(&mut self, _now_ns: u64, buf: &mut [u8]) -> Option<(SocketAddr, usize)> {
        self.sock.recv_from(buf).ok().map(|(n, from)| (from, n))
    }
}

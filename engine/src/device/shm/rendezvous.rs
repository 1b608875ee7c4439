//! How shm devices find each other without a name in a file system, and
//! know whom they talk to.
//!
//! Each device listens on an abstract Unix socket named by its address
//! (`efapoll-shm/<qpn>-<connid>`; the connid is random, so a stranger
//! cannot take a device's name ahead of it, and abstract names vanish with
//! their process: nothing is left behind to sweep). A thread of the device
//! answers on it, one short request at a time: another user's is refused
//! unread, our user's bounded by [`IO_TIMEOUT`]:
//!
//! * `Hello { qpn, connid }`: a sender asks for a lane. The kernel tells
//!   the caller's pid and uid (`SO_PEERCRED`); the thread grants a lane
//!   only to a process of our user that *is* the address it names (the
//!   socket of that address belongs to the caller's pid), makes the lane
//!   (a segment of its own, see `ring`), hands its descriptor to the
//!   caller alone and gives the lane to the device with who holds it
//!   ([`Claim`]). A process claiming another's address is refused.
//! * `Region { key }`: a peer of our user asks for registration `key`'s
//!   segment, to do RDMA by copy; the thread hands its descriptor over if
//!   the domain has it.
//! * `Ping`: answered, nothing else (the check that a socket is there).
//!
//! An asker trusts only answers of its own user: the kernel tells the uid
//! of the socket it reached (`SO_PEERCRED` again), and one of another
//! user's is refused ([`AskError::Stranger`]) before a byte goes to it, so
//! a stranger that took a peer's name (the peer's process went) never
//! hands us a segment. Root is no exception: a root device talks to root's
//! devices only, as other users' devices refuse root's requests. Nothing
//! waits on a connection that a socket's full backlog would hold: asks
//! connect without waiting, and a device asks on its data path without
//! waiting for the answer either (see [`Asking`]).

use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::ring::Lane;

/// How long the thread waits for a request of our user's to arrive, and
/// to go: one that stalls is dropped (another user's is refused before a
/// byte is read, so only our own processes can hold the thread).
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an asker waits for the answer: the answering thread may wait
/// for a CPU behind many busy lcores of its process.
pub(crate) const ASK_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests.
pub(crate) const HELLO: u32 = 1;
pub(crate) const REGION: u32 = 2;
const PING: u32 = 3;

/// Answers.
pub(crate) const OK: u32 = 0;
/// Every lane is taken: one may free.
pub(crate) const FULL: u32 = 1;
/// Not granted: another user, or not the process the address names.
pub(crate) const REFUSED: u32 = 2;
/// No such registration.
pub(crate) const UNKNOWN: u32 = 3;
/// No memory for another lane.
pub(crate) const NO_MEMORY: u32 = 4;

/// The abstract socket name of the device at (`qpn`, `connid`).
fn name(qpn: u16, connid: u32) -> String {
    format!("efapoll-shm/{qpn:04x}-{connid:08x}")
}

/// Who is at the other end of a Unix socket, as the kernel says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cred {
    pub pid: u32,
    pub uid: u32,
}

fn peer_cred(s: &impl AsRawFd) -> io::Result<Cred> {
    let mut c = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` and `len` are valid for the kernel to write, sized as it
    // expects for SO_PEERCRED.
    let ret = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Cred { pid: c.pid as u32, uid: c.uid })
}

/// This process's effective uid.
pub(crate) fn my_uid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Sends `msg` with `fd` attached (SCM_RIGHTS), or alone.
pub(crate) fn send_with_fd(s: &UnixStream, msg: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: msg.as_ptr() as *mut libc::c_void, iov_len: msg.len() };
    // Room for one descriptor's control message, aligned as cmsghdr.
    let mut cbuf = [0u64; 4];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE is arithmetic.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        assert!(space <= std::mem::size_of_val(&cbuf));
        mh.msg_control = cbuf.as_mut_ptr().cast();
        mh.msg_controllen = space;
        // SAFETY: the control buffer holds one header and an fd (checked
        // above); CMSG_FIRSTHDR of a buffer that large is not null.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&mh);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        }
    }
    // SAFETY: `mh` points at `iov` and `cbuf`, alive for the call.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &mh, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != msg.len() {
        return Err(io::ErrorKind::WriteZero.into());
    }
    Ok(())
}

/// Receives exactly `msg.len()` bytes and the descriptor sent with them,
/// if any (any other control message is closed and ignored).
fn recv_with_fd(s: &UnixStream, msg: &mut [u8]) -> io::Result<Option<OwnedFd>> {
    let mut iov = libc::iovec { iov_base: msg.as_mut_ptr().cast(), iov_len: msg.len() };
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr().cast();
    mh.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: `mh` points at `iov` (over `msg`) and `cbuf`, alive for the
    // call; descriptors come with close-on-exec set.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut mh, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fd = None;
    // SAFETY: the kernel filled `mh`'s control part; the CMSG macros walk
    // it within `msg_controllen`, and each SCM_RIGHTS descriptor is ours
    // to own (or to close).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let n = ((*c).cmsg_len as usize - (data as usize - c as usize))
                    / std::mem::size_of::<RawFd>();
                for i in 0..n {
                    let raw = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    let owned = OwnedFd::from_raw_fd(raw);
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    if mh.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::ErrorKind::InvalidData.into());
    }
    if (n as usize) < msg.len() {
        let got = n as usize;
        (&*s).read_exact(&mut msg[got..])?;
    }
    Ok(fd)
}

/// Connects to the device at (`qpn`, `connid`) without waiting, and
/// leaves the stream non-blocking: `Ok(None)` when its socket's backlog is
/// full (a blocking connect would wait until its thread accepts: for ever,
/// if it never does).
fn connect(qpn: u16, connid: u32) -> io::Result<Option<UnixStream>> {
    let name = name(qpn, connid);
    // SAFETY: sockaddr_un is plain data; zeroed is a valid empty address.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // An abstract name: a NUL, then its bytes, unterminated.
    assert!(name.len() < sa.sun_path.len(), "name fits");
    for (d, &b) in sa.sun_path[1..].iter_mut().zip(name.as_bytes()) {
        *d = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    let kind = libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: a plain syscall; the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_UNIX, kind, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just made and is owned by nothing else.
    let s = unsafe { UnixStream::from_raw_fd(fd) };
    // SAFETY: `sa` is an initialised sockaddr_un, `len` bytes of it used,
    // alive for the call.
    let ret = unsafe {
        libc::connect(fd, (&sa as *const libc::sockaddr_un).cast(), len as libc::socklen_t)
    };
    if ret != 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::EAGAIN) { Ok(None) } else { Err(e) };
    }
    Ok(Some(s))
}

/// Whether `s` has something to read (or its end) within `wait`; a signal
/// ends the wait early.
fn readable(s: &UnixStream, wait: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = wait.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: one pollfd, valid and alive for the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(e) };
    }
    Ok(n > 0)
}

/// A request: kind, qpn, connid, key.
fn request(kind: u32, qpn: u16, connid: u32, key: u64) -> [u8; 20] {
    let mut m = [0u8; 20];
    m[0..4].copy_from_slice(&kind.to_le_bytes());
    m[4..8].copy_from_slice(&(qpn as u32).to_le_bytes());
    m[8..12].copy_from_slice(&connid.to_le_bytes());
    m[12..20].copy_from_slice(&key.to_le_bytes());
    m
}

/// What a device at (`qpn`, `connid`) answered: a status, the descriptor
/// it handed over, and who it is.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: u32,
    pub fd: Option<OwnedFd>,
    pub peer: Cred,
}

/// Why an ask brought no answer.
#[derive(Debug)]
pub(crate) enum AskError {
    /// The socket at the address is another user's (`uid`): refused before
    /// a byte went to it.
    Stranger { uid: u32 },
    /// No socket there, a broken exchange, or no answer in time (what,
    /// for a failed test to say).
    Io(#[allow(dead_code)] io::Error),
}

impl From<io::Error> for AskError {
    fn from(e: io::Error) -> AskError {
        AskError::Io(e)
    }
}

/// An ask under way: the request sent to a device of our user, the answer
/// not yet read. Nothing in it waits but [`Asking::answer`], as long as
/// told.
#[derive(Debug)]
pub(crate) struct Asking {
    s: UnixStream,
    peer: Cred,
    /// Why the request did not go, if it did not: the answer may be there
    /// all the same.
    unsent: Option<io::Error>,
}

impl Asking {
    /// Sends `req` to the device at (`qpn`, `connid`); `Ok(None)` when its
    /// socket takes no connection now (ask again later). Unless `anyone`
    /// may answer (tests that play a stranger), a socket of another user's
    /// is refused before the request goes.
    fn start(
        qpn: u16,
        connid: u32,
        req: [u8; 20],
        anyone: bool,
    ) -> Result<Option<Asking>, AskError> {
        let Some(s) = connect(qpn, connid)? else { return Ok(None) };
        let peer = peer_cred(&s)?;
        if peer.uid != my_uid() && !anyone {
            return Err(AskError::Stranger { uid: peer.uid });
        }
        // Another user's request is refused unread and the socket closed, so
        // the request may find it closed (EPIPE; no SIGPIPE in an embedding
        // program): the refusal is there to read all the same.
        let unsent = send_with_fd(&s, &req, None).err();
        Ok(Some(Asking { s, peer, unsent }))
    }

    /// The answer, if it comes within `wait` (zero: if it is there now).
    pub(crate) fn answer(&mut self, wait: Duration) -> Result<Option<Answer>, AskError> {
        if !readable(&self.s, wait)? {
            return Ok(None);
        }
        let mut reply = [0u8; 8];
        let fd = recv_with_fd(&self.s, &mut reply).map_err(|e| self.unsent.take().unwrap_or(e))?;
        let status = u32::from_le_bytes(reply[0..4].try_into().expect("4 bytes"));
        // The second word is reserved.
        Ok(Some(Answer { status, fd, peer: self.peer }))
    }
}

/// An ask made and not yet answered: connected again while the answering
/// socket's backlog is full, waited for as long as each call says, so
/// that the caller may do other work or give up in between; it times out
/// [`ASK_TIMEOUT`] after it was made.
#[derive(Debug)]
pub(crate) struct Pending {
    qpn: u16,
    connid: u32,
    req: [u8; 20],
    anyone: bool,
    /// `None` while the peer's socket takes no connection.
    asking: Option<Asking>,
    deadline: Instant,
}

/// What waiting for a [`Pending`] ask brought.
#[derive(Debug)]
pub(crate) enum Waited {
    Answer(Answer),
    /// No answer yet: wait again later.
    NotYet,
    /// No answer within [`ASK_TIMEOUT`]: a stopped or stuck peer.
    TimedOut,
}

impl Pending {
    fn new(qpn: u16, connid: u32, req: [u8; 20], anyone: bool) -> Pending {
        let deadline = Instant::now() + ASK_TIMEOUT;
        Pending { qpn, connid, req, anyone, asking: None, deadline }
    }

    /// Asks the device at (`qpn`, `connid`) for a lane for the device at
    /// (`my_qpn`, `my_connid`).
    pub(crate) fn hello(qpn: u16, connid: u32, my_qpn: u16, my_connid: u32) -> Pending {
        Pending::new(qpn, connid, request(HELLO, my_qpn, my_connid, 0), false)
    }

    /// Asks the device at (`qpn`, `connid`) for its registration `key`.
    pub(crate) fn region(qpn: u16, connid: u32, key: u64) -> Pending {
        Pending::new(qpn, connid, request(REGION, 0, 0, key), false)
    }

    /// Past its deadline.
    pub(crate) fn expired(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Makes it time out at its next wait.
    #[cfg(test)]
    pub(crate) fn expire(&mut self) {
        self.deadline = Instant::now();
    }

    /// Waits up to `wait` (zero: looks) for the answer.
    pub(crate) fn wait(&mut self, wait: Duration) -> Result<Waited, AskError> {
        let until = (Instant::now() + wait).min(self.deadline);
        loop {
            let asking = match &mut self.asking {
                Some(asking) => asking,
                None => match Asking::start(self.qpn, self.connid, self.req, self.anyone)? {
                    Some(asking) => self.asking.insert(asking),
                    // Its backlog is full: the thread is behind.
                    None if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    None => break,
                },
            };
            let left = until.saturating_duration_since(Instant::now());
            if let Some(answer) = asking.answer(left)? {
                return Ok(Waited::Answer(answer));
            }
            if Instant::now() >= until {
                break;
            }
        }
        Ok(if Instant::now() >= self.deadline { Waited::TimedOut } else { Waited::NotYet })
    }
}

/// Asks and waits up to [`ASK_TIMEOUT`] for the answer: set-up work.
#[cfg(test)]
fn ask(qpn: u16, connid: u32, req: [u8; 20], anyone: bool) -> Result<Answer, AskError> {
    match Pending::new(qpn, connid, req, anyone).wait(ASK_TIMEOUT)? {
        Waited::Answer(answer) => Ok(answer),
        Waited::NotYet | Waited::TimedOut => Err(io::Error::from(io::ErrorKind::TimedOut).into()),
    }
}

/// Asks the device at (`qpn`, `connid`) for a lane, and waits for the
/// answer.
#[cfg(test)]
pub(crate) fn hello(
    qpn: u16,
    connid: u32,
    my_qpn: u16,
    my_connid: u32,
) -> Result<Answer, AskError> {
    ask(qpn, connid, request(HELLO, my_qpn, my_connid, 0), false)
}

/// Asks the device at (`qpn`, `connid`) for its registration `key`, and
/// waits for the answer.
#[cfg(test)]
pub(crate) fn region(qpn: u16, connid: u32, key: u64) -> Result<Answer, AskError> {
    ask(qpn, connid, request(REGION, 0, 0, key), false)
}

/// [`hello`] and [`region`] with no check of who answers, as a process of
/// another user would ask: for tests of the answering side.
#[cfg(test)]
pub(crate) fn ask_as_stranger(
    qpn: u16,
    connid: u32,
    hello_from: Option<(u16, u32)>,
    key: u64,
) -> Result<Answer, AskError> {
    let req = match hello_from {
        Some((my_qpn, my_connid)) => request(HELLO, my_qpn, my_connid, 0),
        None => request(REGION, 0, 0, key),
    };
    ask(qpn, connid, req, true)
}

/// A lane the thread granted: the receiver's side of it, and who holds
/// it, as verified.
#[derive(Debug)]
pub(crate) struct Claim {
    pub lane: Lane,
    pub qpn: u16,
    pub connid: u32,
    pub pid: u32,
}

/// What the answering thread shares with its device.
#[derive(Debug, Default)]
pub(crate) struct Grants {
    /// Lanes granted and not yet taken up by the device.
    pub claims: Mutex<Vec<Claim>>,
    /// Moves with every grant: the device looks at `claims` when it does.
    pub generation: AtomicU32,
    /// Lanes granted and not yet freed (the device frees them).
    pub held: AtomicU32,
    /// Requests refused (another user, a borrowed address, garbage).
    pub refused: AtomicU64,
}

/// What the thread needs to answer: how many lanes it may grant at once,
/// a new lane for a sender (`lane`: its descriptor is handed over) and a
/// registration's segment by key (`region`: a descriptor to hand over).
pub(crate) trait Serve: Send + 'static {
    fn lanes(&self) -> u32;
    fn lane(&self) -> io::Result<(Lane, OwnedFd)>;
    fn region(&self, key: u64) -> Option<OwnedFd>;
}

/// A device's socket and the thread that answers on it; dropping it stops
/// the thread.
#[derive(Debug)]
pub(crate) struct Rendezvous {
    listener: Arc<UnixListener>,
    thread: Option<JoinHandle<()>>,
    pub grants: Arc<Grants>,
}

impl Rendezvous {
    /// Takes the name of address (`qpn`, `connid`); `AddrInUse` if a
    /// socket has it.
    pub(crate) fn bind(qpn: u16, connid: u32) -> io::Result<UnixListener> {
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(name(qpn, connid))?)
    }

    /// Answers on `listener` with `serve`, in a thread of its own.
    pub(crate) fn start(listener: UnixListener, serve: impl Serve) -> io::Result<Rendezvous> {
        let listener = Arc::new(listener);
        let grants = Arc::new(Grants::default());
        let (l, g) = (listener.clone(), grants.clone());
        let thread = std::thread::Builder::new()
            .name("efapoll-shm".into())
            .spawn(move || answer_loop(&l, &g, &serve))?;
        Ok(Rendezvous { listener, thread: Some(thread), grants })
    }

    /// Stops the thread: no grant after this.
    pub(crate) fn stop(&mut self) {
        // Wakes the thread's accept with an error; it ends there.
        // SAFETY: a plain syscall on a descriptor the listener holds.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        self.stop();
    }
}

fn answer_loop(l: &UnixListener, grants: &Grants, serve: &impl Serve) {
    let uid = my_uid();
    loop {
        let s = match l.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            // Shut down (EINVAL), or the socket is gone.
            Err(_) => return,
        };
        if answer(&s, grants, serve, uid).is_err() {
            grants.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Answers one request; an error is a request refused or broken off.
fn answer(s: &UnixStream, grants: &Grants, serve: &impl Serve, uid: u32) -> io::Result<()> {
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let cred = peer_cred(s)?;
    let reply = |status: u32, fd: Option<RawFd>| {
        let mut m = [0u8; 8];
        m[0..4].copy_from_slice(&status.to_le_bytes());
        send_with_fd(s, &m, fd)
    };
    let refuse = || {
        let _ = reply(REFUSED, None);
        Err(io::Error::from(io::ErrorKind::PermissionDenied))
    };
    if cred.uid != uid {
        // Refused before a byte is read (the answer fits the socket's
        // buffer): another user cannot hold the thread.
        return refuse();
    }
    let mut req = [0u8; 20];
    let mut r = s;
    r.read_exact(&mut req)?;
    let kind = u32::from_le_bytes(req[0..4].try_into().expect("4 bytes"));
    let qpn = u32::from_le_bytes(req[4..8].try_into().expect("4 bytes"));
    let connid = u32::from_le_bytes(req[8..12].try_into().expect("4 bytes"));
    let key = u64::from_le_bytes(req[12..20].try_into().expect("8 bytes"));
    match kind {
        PING => reply(OK, None),
        HELLO => {
            let Ok(qpn) = u16::try_from(qpn) else { return refuse() };
            // Only the process the address names (and of our user: a
            // sender can write every lane of the segment).
            if !owns(cred.pid, qpn, connid) {
                return refuse();
            }
            // Only this thread grants: the count cannot move up meanwhile.
            if grants.held.load(Ordering::Acquire) >= serve.lanes() {
                return reply(FULL, None);
            }
            let (lane, fd) = match serve.lane() {
                Ok(made) => made,
                Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => {
                    return reply(NO_MEMORY, None);
                }
                Err(e) => return Err(e),
            };
            // The device has the lane before its sender does, so that a
            // packet sent right after the grant is seen at the next poll.
            grants.held.fetch_add(1, Ordering::Relaxed);
            let claim = Claim { lane, qpn, connid, pid: cred.pid };
            grants.claims.lock().unwrap_or_else(|e| e.into_inner()).push(claim);
            grants.generation.fetch_add(1, Ordering::Release);
            reply(OK, Some(fd.as_raw_fd()))
        }
        REGION => match serve.region(key) {
            Some(fd) => reply(OK, Some(fd.as_raw_fd())),
            None => reply(UNKNOWN, None),
        },
        _ => refuse(),
    }
}

/// Whether the socket of address (`qpn`, `connid`) belongs to process
/// `pid`: the kernel's word, not the caller's.
fn owns(pid: u32, qpn: u16, connid: u32) -> bool {
    // A socket whose backlog is full does not hold the thread: refused.
    let Ok(Some(s)) = connect(qpn, connid) else { return false };
    let owner = peer_cred(&s).is_ok_and(|c| c.pid == pid);
    // A polite end to the other side's read.
    let _ = send_with_fd(&s, &request(PING, 0, 0, 0), None);
    owner
}

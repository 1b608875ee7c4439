//! The shm device across processes: the test binary re-executes itself as
//! the peer (`shm_child` runs only with `EFAPOLL_SHM_CHILD` set), and talks
//! to it over the device, with stdin/stdout lines for the test's own
//! coordination.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use efapoll::device::shm::{ShmConfig, ShmDevice};
use efapoll::device::{
    Access, Ah, BufId, CqOp, CqStatus, Cqe, Device, DeviceError, Mr, RdmaOp, RdmaWr, SendWr, Source,
};
use efapoll::mem::{CountingAlloc, allocations_on_this_thread};
use efapoll::wire::RawAddr;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const ROLE: &str = "EFAPOLL_SHM_CHILD";
const PEER: &str = "EFAPOLL_SHM_PEER";
const PACKETS: u64 = 2000;
const REGION: u64 = 4096;

fn cfg() -> ShmConfig {
    ShmConfig { bufs: 256, tx_depth: 64, rx_depth: 64, ring_slots: 64, ..ShmConfig::default() }
}

/// What one side tells the other: its address and one region.
#[derive(Debug, Clone, Copy)]
struct Card {
    addr: RawAddr,
    key: u64,
    base: u64,
    len: u64,
}

impl Card {
    fn new(dev: &ShmDevice, mr: &Mr) -> Card {
        Card { addr: dev.addr(), key: mr.key, base: mr.addr, len: mr.len }
    }

    fn to_line(self) -> String {
        format!("{} {} {} {} {}", self.addr.qpn, self.addr.connid, self.key, self.base, self.len)
    }

    fn parse(line: &str, gid: [u8; 16]) -> Card {
        let v: Vec<u64> = line.split_whitespace().map(|f| f.parse().unwrap()).collect();
        let addr = RawAddr { gid, qpn: v[0] as u16, connid: v[1] as u32 };
        Card { addr, key: v[2], base: v[3], len: v[4] }
    }

    fn rdma(&self, op: RdmaOp, ah: Ah, local: &Mr, offset: u64, len: u64, wr_id: u64) -> RdmaWr {
        RdmaWr {
            op,
            ah,
            local: local.id,
            local_offset: offset,
            len,
            remote_addr: self.base + offset,
            remote_key: self.key,
            wr_id,
        }
    }
}

struct Peer {
    child: Child,
    lines: BufReader<ChildStdout>,
}

impl Peer {
    fn spawn(role: &str, me: Option<Card>) -> Peer {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["shm_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(me) = me {
            cmd.env(PEER, me.to_line());
        }
        let mut child = cmd.spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap());
        Peer { child, lines }
    }

    /// The next line the child wrote for us (libtest writes others).
    fn expect(&mut self, tag: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.lines.read_line(&mut line).unwrap() > 0, "child ended before {tag}");
            // libtest may have begun the line with the test's name.
            let marker = format!("@@ {tag}");
            if let Some(at) = line.find(&marker) {
                return line[at + marker.len()..].trim().to_string();
            }
        }
    }

    fn tell(&mut self, line: &str) {
        writeln!(self.child.stdin.as_mut().unwrap(), "{line}").unwrap();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fill(seq: u64) -> u8 {
    (seq as u8).wrapping_mul(13)
}

/// Sends `PACKETS` sequenced packets to `ah` and receives as many from
/// anyone, checking order and content; returns the sources seen.
fn exchange(dev: &mut ShmDevice, ah: Ah) -> Vec<Source> {
    let mut out = [Cqe::default(); 32];
    let mut free: Vec<BufId> = (64..256).map(BufId).collect();
    dev.post_recv(&(0..64).map(BufId).collect::<Vec<_>>());
    let (mut sent, mut sends_done, mut recvd) = (0u64, 0u64, 0u64);
    let mut sources = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while sends_done < PACKETS || recvd < PACKETS {
        assert!(Instant::now() < deadline, "exchange stalled: {sent} {sends_done} {recvd}");
        if sent < PACKETS
            && let Some(buf) = free.pop()
        {
            let len = 8 + (sent % 1000) as usize;
            // SAFETY: `buf` is from the free list: not posted.
            let b = unsafe { dev.buf_mut(buf) };
            b[..8].copy_from_slice(&sent.to_le_bytes());
            b[8..len].fill(fill(sent));
            if dev.post_send(&[SendWr { ah, buf, len: len as u32, data: None, wr_id: buf.wr_id() }])
                == 1
            {
                sent += 1;
            } else {
                free.push(buf);
            }
        }
        let n = dev.poll(&mut out);
        for c in &out[..n] {
            assert_eq!(c.status, CqStatus::Ok);
            match c.op {
                CqOp::Send => {
                    sends_done += 1;
                    free.push(BufId::from_wr_id(c.wr_id));
                }
                CqOp::Recv => {
                    let mut bytes = vec![0; c.len as usize];
                    dev.read_payload(BufId::from_wr_id(c.wr_id), 0, &mut bytes);
                    let seq = u64::from_le_bytes(bytes[..8].try_into().unwrap());
                    assert_eq!(seq, recvd, "in order, none lost");
                    assert_eq!(c.len as u64, 8 + seq % 1000);
                    assert!(bytes[8..].iter().all(|&x| x == fill(seq)));
                    recvd += 1;
                    sources.push(c.src);
                    assert_eq!(dev.post_recv(&[BufId::from_wr_id(c.wr_id)]), 1);
                }
                op => panic!("unexpected {op:?}"),
            }
        }
    }
    sources
}

fn poll_until(dev: &mut ShmDevice, n: usize, within: Duration) -> Vec<Cqe> {
    let deadline = Instant::now() + within;
    let mut out = [Cqe::default(); 32];
    let mut all = Vec::new();
    while all.len() < n && Instant::now() < deadline {
        let got = dev.poll(&mut out);
        all.extend_from_slice(&out[..got]);
    }
    all
}

/// Posts `wr` until it is taken: one on a region not mapped yet waits
/// for its owner's answer.
fn post_rdma_one(dev: &mut ShmDevice, wr: RdmaWr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while dev.post_rdma(&[wr]) == 0 {
        assert!(Instant::now() < deadline, "{wr:?} taken");
    }
}

fn rdma_one(dev: &mut ShmDevice, wr: RdmaWr) -> Cqe {
    post_rdma_one(dev, wr);
    let got = poll_until(dev, 1, Duration::from_secs(10));
    assert_eq!(got.len(), 1, "{wr:?} completes");
    got[0]
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..REGION).map(|i| (i as u8) ^ seed).collect()
}

/// The peer's side of every cross-process test.
#[test]
fn shm_child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let mut dev = ShmDevice::new(cfg()).unwrap();
    let mr = dev.register(REGION, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap();
    dev.write_region(mr.id, 0, &pattern(0xb0));
    let local = dev.register(REGION, Access::LOCAL).unwrap();
    let parent = std::env::var(PEER).ok().map(|l| Card::parse(&l, dev.addr().gid));
    println!("@@ READY {}", Card::new(&dev, &mr).to_line());
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    match role.as_str() {
        "exchange" => {
            let parent = parent.unwrap();
            let ah = dev.insert_addr(&parent.addr).unwrap();
            exchange(&mut dev, ah);
            let c = rdma_one(&mut dev, parent.rdma(RdmaOp::Read, ah, &local, 0, REGION, 1));
            assert_eq!(c, Cqe { op: CqOp::Read, wr_id: 1, ..Cqe::default() });
            assert_eq!(dev.region_vec(&local), &pattern(0xa0)[..]);
            dev.write_region(local.id, 1024, &[0x5a; 2048 - 1024]);
            let wr = parent.rdma(RdmaOp::Write { imm: None }, ah, &local, 1024, 1024, 2);
            assert_eq!(rdma_one(&mut dev, wr).status, CqStatus::Ok);
            println!("@@ DONE");
            stdin.read_line(&mut line).unwrap();
            assert_eq!(line.trim(), "CHECK");
            assert!(dev.region_vec(&mr)[..512].iter().all(|&x| x == 0x77), "parent's write");
            assert_eq!(dev.region_vec(&mr)[512..], pattern(0xb0)[512..]);
            println!("@@ OK");
        }
        // Never polls: the parent's sends stay outstanding until it is
        // killed.
        "idle" => {
            let _ = stdin.read_line(&mut line);
        }
        // Sends to the parent as fast as it can until it is killed.
        "flood" => {
            let ah = dev.insert_addr(&parent.unwrap().addr).unwrap();
            let mut out = [Cqe::default(); 32];
            let wrs: Vec<SendWr> = (0..64)
                .map(|b| SendWr { ah, buf: BufId(b), len: 256, data: None, wr_id: b as u64 })
                .collect();
            let mut next = 0;
            loop {
                next = (next + dev.post_send(&wrs[next..])) % wrs.len();
                dev.poll(&mut out);
            }
        }
        // Exits without cleaning up, as if it had crashed.
        "vanish" => std::process::exit(0),
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn packets_and_rdma_between_two_processes() {
    let mut dev = ShmDevice::new(cfg()).unwrap();
    let mr = dev.register(REGION, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap();
    dev.write_region(mr.id, 0, &pattern(0xa0));
    let local = dev.register(REGION, Access::LOCAL).unwrap();
    let mut child = Peer::spawn("exchange", Some(Card::new(&dev, &mr)));
    let card = Card::parse(&child.expect("READY"), dev.addr().gid);
    let ah = dev.insert_addr(&card.addr).unwrap();
    let sources = exchange(&mut dev, ah);
    // The child inserted us before it sent; we inserted it before polling.
    assert!(sources.iter().all(|&s| s == Source::Known(ah)));

    let c = rdma_one(&mut dev, card.rdma(RdmaOp::Read, ah, &local, 0, REGION, 1));
    assert_eq!(c, Cqe { op: CqOp::Read, wr_id: 1, ..Cqe::default() });
    assert_eq!(dev.region_vec(&local), &pattern(0xb0)[..]);
    dev.write_region(local.id, 0, &[0x77; 512]);
    let wr = card.rdma(RdmaOp::Write { imm: None }, ah, &local, 0, 512, 2);
    assert_eq!(rdma_one(&mut dev, wr).status, CqStatus::Ok);
    let beyond = card.rdma(RdmaOp::Write { imm: None }, ah, &local, 0, 16, 3);
    let beyond = RdmaWr { remote_addr: card.base + REGION - 8, ..beyond };
    assert_eq!(rdma_one(&mut dev, beyond).status, CqStatus::RemoteAccess);

    child.expect("DONE");
    assert!(dev.region_vec(&mr)[1024..2048].iter().all(|&x| x == 0x5a), "child's write");
    assert_eq!(dev.region_vec(&mr)[..1024], pattern(0xa0)[..1024]);
    child.tell("CHECK");
    child.expect("OK");
    assert!(child.child.wait().unwrap().success());
}

#[test]
fn a_killed_receiver_fails_outstanding_operations() {
    let mut dev = ShmDevice::new(cfg()).unwrap();
    let local = dev.register(REGION, Access::LOCAL).unwrap();
    let mut child = Peer::spawn("idle", None);
    let card = Card::parse(&child.expect("READY"), dev.addr().gid);
    let ah = dev.insert_addr(&card.addr).unwrap();
    let imm = card.rdma(RdmaOp::Write { imm: Some(7) }, ah, &local, 0, 64, 1000);
    post_rdma_one(&mut dev, imm);
    let wrs: Vec<SendWr> = (0..100)
        .map(|b| SendWr { ah, buf: BufId(b), len: 100, data: None, wr_id: b as u64 })
        .collect();
    let posted = dev.post_send(&wrs);
    assert_eq!(posted, 63, "the ring (64 slots, one holding the notice) back-pressures");
    assert!(poll_until(&mut dev, 1, Duration::from_millis(20)).is_empty(), "nothing consumed");

    child.child.kill().unwrap();
    child.child.wait().unwrap();
    let started = Instant::now();
    let got = poll_until(&mut dev, posted + 1, Duration::from_secs(10));
    assert_eq!(got.len(), posted + 1, "every outstanding operation completes");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(got.iter().all(|c| c.status == CqStatus::PeerUnreachable));
    assert_eq!(got.iter().filter(|c| c.op == CqOp::Write).count(), 1);

    // Posting to the dead peer fails at once.
    assert_eq!(dev.post_send(&wrs[..1]), 1);
    let rd = card.rdma(RdmaOp::Read, ah, &local, 0, 64, 2000);
    assert_eq!(dev.post_rdma(&[rd]), 1);
    let got = poll_until(&mut dev, 2, Duration::from_secs(1));
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|c| c.status == CqStatus::PeerUnreachable));
    assert_eq!(dev.insert_addr(&card.addr), Err(DeviceError::BadAddress));
    assert_eq!(dev.tx_outstanding(), 0);
}

#[test]
fn a_killed_sender_does_not_stall_the_receiver() {
    let mut dev = ShmDevice::new(cfg()).unwrap();
    let mr = dev.register(64, Access::LOCAL).unwrap();
    let mut child = Peer::spawn("flood", Some(Card::new(&dev, &mr)));
    let card = Card::parse(&child.expect("READY"), dev.addr().gid);
    dev.post_recv(&(0..64).map(BufId).collect::<Vec<_>>());
    let mut out = [Cqe::default(); 32];
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    for round in 0.. {
        assert!(Instant::now() < deadline, "the flood did not arrive");
        let n = dev.poll(&mut out);
        got += n;
        let bufs: Vec<BufId> = out[..n].iter().map(|c| BufId::from_wr_id(c.wr_id)).collect();
        dev.post_recv(&bufs);
        if got >= 10_000 && round % 7 == 0 {
            break;
        }
    }
    child.child.kill().unwrap();
    child.child.wait().unwrap();
    // Whatever it had published still arrives; then the ring is free for
    // others, even if it died holding a slot.
    let mut other = ShmDevice::new(cfg()).unwrap();
    let ah = other.insert_addr(&dev.addr()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut from_other = 0;
    let mut sent = 0;
    while from_other < 10 {
        assert!(Instant::now() < deadline, "receiver stalled");
        if sent < 10
            && other.post_send(&[SendWr { ah, buf: BufId(0), len: 3, data: None, wr_id: 0 }]) == 1
        {
            sent += 1;
        }
        other.poll(&mut out);
        let n = dev.poll(&mut out);
        for c in &out[..n] {
            assert_eq!(c.status, CqStatus::Ok);
            if c.src == (Source::Unknown { qpn: other.addr().qpn }) {
                from_other += 1;
            } else {
                assert_eq!(c.src, Source::Unknown { qpn: card.addr.qpn });
            }
        }
        let bufs: Vec<BufId> = out[..n].iter().map(|c| BufId::from_wr_id(c.wr_id)).collect();
        dev.post_recv(&bufs);
    }
}

#[test]
fn a_process_that_vanished_leaves_nothing_to_reach_or_sweep() {
    let mut child = Peer::spawn("vanish", None);
    let line = child.expect("READY");
    assert!(child.child.wait().unwrap().success());
    let mut dev = ShmDevice::new(cfg()).unwrap();
    let card = Card::parse(&line, dev.addr().gid);
    // Its segments had no names, and its socket went with it.
    assert_eq!(dev.insert_addr(&card.addr), Err(DeviceError::BadAddress));
    let named = std::fs::read_dir("/dev/shm").unwrap().flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.contains(&format!("{:08x}", card.addr.connid))
    });
    assert!(!named, "nothing of it in /dev/shm");
}

#[test]
fn the_steady_state_allocates_nothing() {
    let mut a = ShmDevice::new(cfg()).unwrap();
    let mut b = ShmDevice::new(cfg()).unwrap();
    let ah = a.insert_addr(&b.addr()).unwrap();
    b.insert_addr(&a.addr()).unwrap();
    let src = a.register(1 << 16, Access::LOCAL).unwrap();
    let dst = b.register(1 << 16, Access::REMOTE_WRITE).unwrap();
    let card = Card::new(&b, &dst);
    let wrs: Vec<SendWr> = (0..32)
        .map(|i| SendWr { ah, buf: BufId(i), len: 64, data: None, wr_id: i as u64 })
        .collect();
    let bufs: Vec<BufId> = (100..164).map(BufId).collect();
    let mut out = [Cqe::default(); 64];
    let write = card.rdma(RdmaOp::Write { imm: Some(1) }, ah, &src, 0, 1 << 16, 99);
    let mut round = |a: &mut ShmDevice, b: &mut ShmDevice| {
        assert_eq!(a.post_send(&wrs), 32);
        post_rdma_one(a, write);
        b.post_recv(&bufs);
        assert_eq!(b.poll(&mut out), 33);
        assert_eq!(a.poll(&mut out), 33);
    };
    // The first round maps the region.
    round(&mut a, &mut b);
    let before = allocations_on_this_thread();
    for _ in 0..1000 {
        round(&mut a, &mut b);
    }
    assert_eq!(allocations_on_this_thread() - before, 0);
}

/// Files planted where segments once had names: removed when dropped.
struct Planted(Vec<std::path::PathBuf>);

impl Drop for Planted {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[test]
fn files_planted_in_dev_shm_neither_block_nor_exhaust_nor_reach_a_device() {
    // What another local user (or a clumsy one) can leave in /dev/shm: a
    // FIFO that blocks whoever opens it, a file with a valid-looking
    // segment header, and every name of the old endpoint numbers.
    let dir = std::path::Path::new("/dev/shm");
    let mut planted = Planted(Vec::new());
    let fifo = dir.join("efapoll-fifo");
    if !fifo.exists() {
        assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        planted.0.push(fifo);
    }
    let mut header = vec![0u8; 4096];
    header[..8].copy_from_slice(b"EFAPSHM\0");
    for n in 0..=u16::MAX {
        let p = dir.join(format!("efapoll-{n}"));
        if std::fs::OpenOptions::new().write(true).create_new(true).open(&p).is_ok() {
            if n == 7 {
                std::fs::write(&p, &header).unwrap();
            }
            planted.0.push(p);
        }
    }
    // Devices are made, and talk, as if nothing were there (bounded: the
    // old sweep blocked in open() on the FIFO for good).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let made = (ShmDevice::new(cfg()), ShmDevice::new(cfg()));
        let _ = tx.send(made);
    });
    let (a, b) = rx.recv_timeout(Duration::from_secs(30)).expect("devices made");
    let (mut a, mut b) = (a.unwrap(), b.unwrap());
    let ah = a.insert_addr(&b.addr()).unwrap();
    b.post_recv(&[BufId(0)]);
    // SAFETY: nothing is posted from `a` yet.
    let frame = unsafe { a.buf_mut(BufId(0)) };
    frame[..2].copy_from_slice(b"ok");
    assert_eq!(a.post_send(&[SendWr { ah, buf: BufId(0), len: 2, data: None, wr_id: 1 }]), 1);
    assert_eq!(poll_until(&mut b, 1, Duration::from_secs(10)).len(), 1);
    let mut got = [0; 2];
    b.read_payload(BufId(0), 0, &mut got);
    assert_eq!(&got, b"ok");
    // The planted "segment" is no address: nothing maps it.
    let planted_addr = RawAddr { qpn: 7, connid: 0, ..a.addr() };
    assert_eq!(a.insert_addr(&planted_addr), Err(DeviceError::BadAddress));
}

#[test]
fn regions_copy_into_one_another_directly() {
    let mut dev = ShmDevice::new(cfg()).unwrap();
    let a = dev.register(10_000, Access::empty()).unwrap();
    let b = dev.register(10_000, Access::REMOTE_READ).unwrap();
    let p = pattern(9);
    let src: Vec<u8> = (0..10_000).map(|i| p[i % p.len()] ^ (i / 256) as u8).collect();
    dev.write_region(a.id, 0, &src);
    dev.copy_region(a.id, 10, b.id, 3000, 7000);
    let got = dev.region_vec(&b);
    assert!(got[..3000].iter().all(|&x| x == 0));
    assert_eq!(&got[3000..], &src[10..7010]);
    // Within one region, overlapping: a memmove.
    dev.copy_region(a.id, 0, a.id, 1, 9000);
    let got = dev.region_vec(&a);
    assert_eq!(&got[1..9001], &src[..9000]);
}

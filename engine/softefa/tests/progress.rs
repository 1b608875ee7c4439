//! A NIC acknowledges what it took whatever its program does next: a
//! softefa QP whose program took a packet and then stopped polling (as
//! fi_pingpong blocks in its control socket's sync) still acknowledges it,
//! through the progress thread, and the sender's send completes. Without
//! the thread (`SOFTEFA_PROGRESS=0`) the acknowledgement waits for a poll
//! that never comes and the sender gives up on the receiver.

use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::Verbs;
use efapoll::device::udp::{UdpConfig, UdpDevice};
use efapoll::device::{BufId, CqOp, CqStatus, Cqe, Device, SendWr};
use rdma_sys::*;
use softefa::ctx as sv;

const NAME: &str = "a_receiver_that_stops_polling_still_acknowledges";

/// How long the sender waits for a silent receiver before it fails the
/// send: far beyond the thread's millisecond, short for the test without it.
const PEER_TIMEOUT: Duration = Duration::from_secs(1);

#[test]
fn a_receiver_that_stops_polling_still_acknowledges() {
    if std::env::var_os("SOFTEFA_PROGRESS").is_some() {
        // The child: no thread, so the send fails once the peer timed out.
        let (status, _) = stop_polling_after_one_receive(false);
        assert_eq!(status, CqStatus::PeerUnreachable, "acknowledged without the thread?");
        return;
    }
    let (status, took) = stop_polling_after_one_receive(true);
    assert_eq!(status, CqStatus::Ok, "the thread acknowledged the packet");
    assert!(took < PEER_TIMEOUT / 2, "acknowledged after {took:?}");
    // The setting is read once per process: without the thread, in a child.
    let out = Command::new("timeout")
        .arg("60")
        .arg(std::env::current_exe().unwrap())
        .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env("SOFTEFA_PROGRESS", "0")
        .output()
        .expect("running the test again");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "without the thread:\n{text}");
}

/// A child after `fork` gets a progress thread of its own (fork copies
/// only the calling thread): its QP, which it stops polling, still
/// acknowledges, as in the parent.
#[test]
fn a_forked_child_gets_a_progress_thread() {
    if std::env::var_os("SOFTEFA_PROGRESS").is_some() {
        return; // The run without the thread is the test above's.
    }
    // The parent's thread starts with its first QP.
    // SAFETY: a verbs program's calls, in order, on objects made here.
    unsafe { Verbs::open(0x0f0f_0001).close() };
    // SAFETY: the child calls only what a forked child of this
    // single-threaded test (bar the progress thread) may: the library's
    // own fork handlers made its state whole; it ends with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let r = std::panic::catch_unwind(|| stop_polling_after_one_receive(true));
        let ok = matches!(r, Ok((CqStatus::Ok, took)) if took < PEER_TIMEOUT / 2);
        if !ok {
            eprintln!("the child: {r:?}");
        }
        // SAFETY: ends the child without the parent's exit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: `pid` is our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's QP did not acknowledge without polling: status {status:#x}"
    );
}

/// A softefa QP takes a send from a udp device, and its program polls no
/// more; returns how the udp device's send completed, and when. With the
/// thread, a second send is taken meanwhile, and its completion waits in
/// the CQ for the program's next poll.
fn stop_polling_after_one_receive(thread: bool) -> (CqStatus, Duration) {
    // SAFETY: a verbs program's calls, in order, on objects made here.
    unsafe {
        let v = Verbs::open(0x0123_4567);
        let mut buf = vec![0u8; 8192];
        let mr = v.reg(&mut buf, ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
        for i in 0..2 {
            let mut sge =
                ibv_sge { addr: buf.as_ptr() as u64 + 4096 * i, length: 4096, lkey: (*mr).lkey };
            let mut rwr: ibv_recv_wr = std::mem::zeroed();
            rwr.wr_id = 70 + i;
            rwr.sg_list = &mut sge;
            rwr.num_sge = 1;
            let mut bad = std::ptr::null_mut();
            assert_eq!(ibv_post_recv(v.qp, &mut rwr, &mut bad), 0);
        }

        let cfg = UdpConfig { peer_timeout: PEER_TIMEOUT, ..UdpConfig::default() };
        let mut udp = UdpDevice::new(cfg).unwrap();
        let to_qp = udp.insert_addr(&v.me).unwrap();
        udp.buf_mut(BufId(0))[..5].copy_from_slice(b"hello");
        assert_eq!(
            udp.post_send(&[SendWr { ah: to_qp, buf: BufId(0), len: 5, data: None, wr_id: 1 }]),
            1
        );
        let end = Instant::now() + Duration::from_secs(20);
        let mut out = [Cqe::default(); 8];
        let mut sent = None;
        // The receive comes; this is the program's last poll.
        let first = loop {
            assert!(Instant::now() < end, "no receive");
            let n = udp.poll(&mut out);
            sent = sent.or(out[..n].first().map(|c| c.status));
            if let Some((wr_id, status, _)) = v.poll() {
                assert_eq!(status, ibv_wc_status::IBV_WC_SUCCESS);
                assert!(matches!(wr_id, 70 | 71));
                break wr_id;
            }
        };
        let took = Instant::now();
        // (Already acknowledged only if the program was held up for the
        // thread's millisecond before it took the receive.)
        let sent = match sent {
            Some(s) => s,
            None => loop {
                assert!(Instant::now() < end, "the send never completed");
                let n = udp.poll(&mut out);
                if let Some(c) = out[..n].first() {
                    assert_eq!((c.op, c.wr_id), (CqOp::Send, 1));
                    break c.status;
                }
            },
        };
        let took = took.elapsed();
        eprintln!("the send completed {took:?} after the receiver's last poll: {sent:?}");

        if thread {
            // Another send while the program still does not poll: taken
            // and acknowledged, and its completion waits for the CQ.
            udp.buf_mut(BufId(1))[..6].copy_from_slice(b"second");
            let wr = SendWr { ah: to_qp, buf: BufId(1), len: 6, data: None, wr_id: 2 };
            assert_eq!(udp.post_send(&[wr]), 1);
            let c = loop {
                assert!(Instant::now() < end, "the second send never completed");
                let n = udp.poll(&mut out);
                if let Some(c) = out[..n].first() {
                    break *c;
                }
            };
            assert_eq!((c.wr_id, c.status), (2, CqStatus::Ok));
            let at = 4096 * (141 - first as usize - 70);
            assert_eq!(&buf[at..at + 6], b"second", "landed before the program polled");
            let held = v.poll();
            assert_eq!(held, Some((141 - first, ibv_wc_status::IBV_WC_SUCCESS, 6)), "held for it");
        }
        let at = 4096 * (first as usize - 70);
        assert_eq!(&buf[at..at + 5], b"hello");
        assert_eq!(sv::ibv_dereg_mr(mr), 0);
        v.close();
        (sent, took)
    }
}

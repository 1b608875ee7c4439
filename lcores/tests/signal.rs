//! Ctrl-C/SIGTERM raises the stop flags. A binary of its own: it signals its own process.

use std::time::Duration;

use efapoll_lcores::{StopFlag, install_ctrlc_handler};

#[test]
fn sigterm_raises_every_installed_flag_once_installed_twice() {
    let first = StopFlag::new();
    let second = StopFlag::new();
    install_ctrlc_handler(&first).unwrap();
    install_ctrlc_handler(&first).unwrap();
    install_ctrlc_handler(&second).unwrap();
    assert!(!first.is_stopped() && !second.is_stopped());

    let pid = libc::pid_t::try_from(std::process::id()).unwrap();
    // SAFETY: kill(2) on our own pid with a signal the handler above now catches; it takes
    // no pointers.
    let sent = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(sent, 0);

    // The handler runs on its own thread; give it up to ten seconds to be scheduled.
    for _ in 0..10_000 {
        if first.is_stopped() && second.is_stopped() {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("SIGTERM did not raise the stop flags");
}

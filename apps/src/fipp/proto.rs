//! What fi_pingpong (libfabric 1.17, util/pingpong.c) says and expects
//! beside its data messages: the TCP control exchange, the sizes and
//! iterations it runs, the bytes it sends and checks with `-c`, the table
//! it prints. Each piece follows the C function named at it; nothing here
//! does I/O but through the `Read`/`Write` it is given.

use std::io::{self, Read, Write};

/// pingpong.c `default_ctrl`: the control port of both roles.
pub const DEFAULT_PORT: u16 = 47592;

/// libfabric's `FI_ADDR_EFA` (rdma/fabric.h, the 13th address format):
/// what an EFA endpoint's name is, sent beside it.
pub const FI_ADDR_EFA: u32 = 12;

/// pingpong.c `PP_MAX_ADDRLEN`: a longer name is refused.
pub const MAX_ADDRLEN: u32 = 1024;

/// pingpong.c `PP_MSG_SYNC_Q`, `PP_MSG_SYNC_A`, with their NUL (the C
/// sends `sizeof`).
pub const SYNC_Q: &[u8; 2] = b"q\0";
pub const SYNC_A: &[u8; 2] = b"a\0";

/// pingpong.c `PP_MSG_CHECK_CNT_OK`, with its NUL.
pub const CNT_OK: &[u8; 7] = b"cnt ok\0";

/// pingpong.c `PP_MSG_LEN_CNT`: the count is sent in this many bytes.
pub const CNT_LEN: usize = 10;

/// pp_finalize's last message, with its NUL: each side sends it (with
/// FI_TRANSMIT_COMPLETE) and waits for the other's. fi_pingpong's own
/// 4 bytes are not these (see `Pp::finish`): only the length is checked.
pub const FIN: &[u8; 4] = b"fin\0";

/// pingpong.c `PP_MAX_CTRL_MSG`: receives are never smaller.
pub const MAX_CTRL_MSG: u64 = 64;

/// pingpong.c `PP_MAX_DATA_MSG`: 4 MiB + 2 MiB, the buffers' size and the
/// largest size of `-S all` (the provider's max_msg_size is larger).
pub const MAX_DATA_MSG: u64 = (1 << 22) + (1 << 21);

/// Iterations per size without `-I` (pingpong.c main).
pub const DEFAULT_ITERATIONS: u64 = 10;

/// generate_test_sizes' `defaults`: the sizes without `-S`.
pub const DEFAULT_SIZES: [u64; 6] = [64, 256, 1024, 4096, 65536, 1048576];

/// fi_pingpong's `-S`: nothing, `all`, or one size (it takes no lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeSpec {
    Default,
    All,
    One(u64),
}

impl SizeSpec {
    /// pp_alloc_msgs' `tx_size`: the size given, else [`MAX_DATA_MSG`];
    /// the largest message and every receive's length (at least
    /// [`MAX_CTRL_MSG`]).
    pub fn tx_size(self) -> u64 {
        match self {
            SizeSpec::One(size) => size,
            SizeSpec::Default | SizeSpec::All => MAX_DATA_MSG,
        }
    }

    /// generate_test_sizes: the sizes run, in order. `All` is 0, 1, then
    /// each power of two from 2 followed by itself and a half, up to
    /// `tx_size`: 0, 1, 2, 3, 4, 6, 8, 12, ..., 4 MiB, 6 MiB.
    pub fn sizes(self) -> Vec<u64> {
        let tx_size = self.tx_size();
        match self {
            SizeSpec::One(size) => vec![size],
            SizeSpec::Default => DEFAULT_SIZES.into_iter().take_while(|&s| s <= tx_size).collect(),
            SizeSpec::All => {
                let mut out = Vec::new();
                for i in 0..63 {
                    let power = if i == 0 { 0 } else { 1u64 << i };
                    let half_up = if i == 0 { 1 } else { power + power / 2 };
                    if power > tx_size {
                        break;
                    }
                    out.push(power);
                    if half_up > tx_size {
                        break;
                    }
                    out.push(half_up);
                }
                out
            }
        }
    }
}

/// pingpong.c `integ_alphabet`.
const ALPHABET: &[u8; 62] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// pingpong.c `INTEG_SEED`.
const SEED: u32 = 7;

/// pp_fill_buf / pp_check_buf: message `n` (counted from 0 over the whole
/// run, every size, a zero-byte one too) is the alphabet from index
/// `7n mod 62`, wrapping. Each side keeps one counter for what it sends
/// and one for what it checks, as the C's two `static unsigned iter`.
#[derive(Debug, Clone, Default)]
pub struct Pattern {
    iter: u32,
}

impl Pattern {
    fn next_start(&mut self) -> usize {
        // The C's unsigned arithmetic: iter * 7 wraps at 2^32.
        let start = self.iter.wrapping_mul(SEED) % ALPHABET.len() as u32;
        self.iter = self.iter.wrapping_add(1);
        start as usize
    }

    /// Fills `buf` as the next message sent.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut at = self.next_start();
        for b in buf {
            *b = ALPHABET[at];
            at = if at + 1 == ALPHABET.len() { 0 } else { at + 1 };
        }
    }

    /// Checks `buf` as the next message received: the index of its first
    /// wrong byte, if any.
    pub fn check(&mut self, buf: &[u8]) -> Option<usize> {
        let mut at = self.next_start();
        for (i, &b) in buf.iter().enumerate() {
            if b != ALPHABET[at] {
                return Some(i);
            }
            at = if at + 1 == ALPHABET.len() { 0 } else { at + 1 };
        }
        None
    }
}

/// pp_send_name: the name's length (u32, network order), the address
/// format (the C's `uint32_t` as it sits in memory: little-endian here),
/// the name; one buffer, so that it goes in one write.
pub fn encode_name(format: u32, name: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + name.len());
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(&format.to_le_bytes());
    out.extend_from_slice(name);
    out
}

/// pp_recv_name: the peer's address format and name.
pub fn read_name(r: &mut impl Read) -> io::Result<(u32, Vec<u8>)> {
    let mut word = [0; 4];
    r.read_exact(&mut word)?;
    let len = u32::from_be_bytes(word);
    if len > MAX_ADDRLEN {
        return Err(bad(format!("a {len}-byte name (fi_pingpong's limit is {MAX_ADDRLEN})")));
    }
    r.read_exact(&mut word)?;
    let format = u32::from_le_bytes(word);
    let mut name = vec![0; len as usize];
    r.read_exact(&mut name)?;
    Ok((format, name))
}

/// pp_ctrl_txrx_msg_count, client: `"%ld"` of the count in a
/// zero-filled [`CNT_LEN`]-byte buffer (snprintf's cut at 10 characters
/// included).
pub fn encode_count(count: u64) -> [u8; CNT_LEN] {
    let mut out = [0; CNT_LEN];
    let text = count.to_string();
    let n = text.len().min(CNT_LEN);
    out[..n].copy_from_slice(&text.as_bytes()[..n]);
    out
}

/// The server's reading of it (parse_ulong: strtol over the text up to
/// the first NUL, all of it digits).
pub fn parse_count(buf: &[u8; CNT_LEN]) -> Option<u64> {
    let text = buf.split(|&b| b == 0).next().unwrap_or(&[]);
    if text.is_empty() {
        return Some(0);
    }
    if !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Reads exactly `want.len()` bytes and checks them: pp_ctrl_recv_str
/// compares the text before the NUL.
fn expect(r: &mut impl Read, want: &[u8], what: &str) -> io::Result<()> {
    let mut got = vec![0; want.len()];
    r.read_exact(&mut got)?;
    let text =
        |b: &[u8]| String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap_or(&[])).into_owned();
    if text(&got) != text(want) {
        return Err(bad(format!("{what}: expected {:?}, got {:?}", text(want), text(&got))));
    }
    Ok(())
}

/// Which end of the control link: the client connects (fi_pingpong's
/// `<srv_addr>`), the server listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// The control link from one side's point of view, in the order
/// pingpong.c runs it.
#[derive(Debug)]
pub struct Ctrl<S> {
    pub stream: S,
    pub role: Role,
}

impl<S: Read + Write> Ctrl<S> {
    /// pp_init_fabric's name exchange: the server sends its name first,
    /// the client first receives. Returns the peer's (format, name).
    pub fn exchange_names(&mut self, format: u32, name: &[u8]) -> io::Result<(u32, Vec<u8>)> {
        let mine = encode_name(format, name);
        match self.role {
            Role::Server => {
                self.stream.write_all(&mine)?;
                read_name(&mut self.stream)
            }
            Role::Client => {
                let theirs = read_name(&mut self.stream)?;
                self.stream.write_all(&mine)?;
                Ok(theirs)
            }
        }
    }

    /// pp_ctrl_sync, before each size: the client's "q", the server's "a".
    pub fn sync(&mut self) -> io::Result<()> {
        match self.role {
            Role::Client => {
                self.stream.write_all(SYNC_Q)?;
                expect(&mut self.stream, SYNC_A, "sync")
            }
            Role::Server => {
                expect(&mut self.stream, SYNC_Q, "sync")?;
                self.stream.write_all(SYNC_A)
            }
        }
    }

    /// pp_ctrl_txrx_msg_count, after each size: the client sends how many
    /// messages it received, the server answers "cnt ok". Returns the
    /// client's count (the client: its own).
    pub fn count(&mut self, received: u64) -> io::Result<u64> {
        match self.role {
            Role::Client => {
                self.stream.write_all(&encode_count(received))?;
                expect(&mut self.stream, CNT_OK, "count")?;
                Ok(received)
            }
            Role::Server => {
                let mut buf = [0; CNT_LEN];
                self.stream.read_exact(&mut buf)?;
                let count = parse_count(&buf).ok_or_else(|| {
                    bad(format!("count: not a number: {:?}", String::from_utf8_lossy(&buf)))
                })?;
                self.stream.write_all(CNT_OK)?;
                Ok(count)
            }
        }
    }
}

/// pingpong.c size_str: 1.5k, 64, 4m (one decimal below ten units).
pub fn size_str(size: u64) -> String {
    let (base, mag) = match size {
        s if s >= 1 << 30 => (1 << 30, "g"),
        s if s >= 1 << 20 => (1 << 20, "m"),
        s if s >= 1 << 10 => (1 << 10, "k"),
        _ => (1, ""),
    };
    let fraction = if size / base < 10 { (size % base) * 10 / base } else { 0 };
    if fraction != 0 {
        format!("{}.{fraction}{mag}", size / base)
    } else {
        format!("{}{mag}", size / base)
    }
}

/// pingpong.c cnt_str: 10k, 1m.
pub fn cnt_str(cnt: u64) -> String {
    match cnt {
        c if c >= 1_000_000_000 => format!("{}b", c / 1_000_000_000),
        c if c >= 1_000_000 => format!("{}m", c / 1_000_000),
        c if c >= 1000 => format!("{}k", c / 1000),
        c => c.to_string(),
    }
}

/// show_perf's header line.
pub fn perf_header() -> String {
    format!(
        "{:<8}{:<8}{:<9}{:<8}{:>8} {:>10}{:>13}{:>13}",
        "bytes", "#sent", "#ack", "total", "time", "MB/sec", "usec/xfer", "Mxfers/sec"
    )
}

/// show_perf's row for a size: `sent` iterations of two transfers each,
/// `acked` the client's count, `elapsed_us` from after the sync to the last
/// transfer. usec/xfer is the average half round trip.
pub fn perf_row(size: u64, sent: u64, acked: u64, elapsed_us: u64) -> String {
    const XFERS: u64 = 2;
    let bytes = sent * size * XFERS;
    let ack = match sent.cmp(&acked) {
        std::cmp::Ordering::Equal => format!("={:<8}", cnt_str(acked)),
        std::cmp::Ordering::Less => format!("-{:<8}", cnt_str(acked - sent)),
        std::cmp::Ordering::Greater => format!("+{:<8}", cnt_str(sent - acked)),
    };
    // The C computes usec/xfer in float.
    let usec_per_xfer = elapsed_us as f32 / sent as f32 / XFERS as f32;
    format!(
        "{:<8}{:<8}{ack}{:<8}{:>8.2}s{:>10.2}{:>11.2}{:>11.2}",
        size_str(size),
        cnt_str(sent),
        size_str(bytes),
        elapsed_us as f64 / 1e6,
        bytes as f64 / elapsed_us as f64,
        usec_per_xfer,
        1.0 / usec_per_xfer
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_sizes_are_pingpong_c_s_powers_and_halves_up_to_6_mib() {
        let all = SizeSpec::All.sizes();
        assert_eq!(&all[..10], [0, 1, 2, 3, 4, 6, 8, 12, 16, 24]);
        assert_eq!(all.len(), 46);
        assert_eq!(&all[44..], [4 << 20, 6 << 20]);
        assert_eq!(*all.last().unwrap(), MAX_DATA_MSG);
    }

    #[test]
    fn default_and_single_sizes() {
        assert_eq!(SizeSpec::Default.sizes(), [64, 256, 1024, 4096, 65536, 1048576]);
        assert_eq!(SizeSpec::One(3000).sizes(), [3000]);
        assert_eq!(SizeSpec::One(3000).tx_size(), 3000);
        assert_eq!(SizeSpec::Default.tx_size(), 6 << 20);
    }

    #[test]
    fn pattern_matches_pp_fill_buf() {
        let mut p = Pattern::default();
        let mut buf = [0; 70];
        p.fill(&mut buf);
        // Message 0 starts at '0' and wraps after 'Z'.
        assert_eq!(&buf[..12], b"0123456789ab");
        assert_eq!(&buf[60..70], b"YZ01234567");
        // Message 1 starts 7 letters on, message 9 at 63 mod 62 = 1.
        let mut one = [0; 3];
        p.fill(&mut one);
        assert_eq!(&one, b"789");
        for _ in 2..9 {
            p.fill(&mut []);
        }
        p.fill(&mut one);
        assert_eq!(&one, b"123");
    }

    #[test]
    fn pattern_check_counts_messages_and_finds_the_first_bad_byte() {
        let (mut tx, mut rx) = (Pattern::default(), Pattern::default());
        for size in [0, 1, 5, 300] {
            let mut buf = vec![0; size];
            tx.fill(&mut buf);
            assert_eq!(rx.check(&buf), None, "size {size}");
        }
        let mut buf = vec![0; 10];
        tx.fill(&mut buf);
        buf[4] ^= 1;
        assert_eq!(rx.check(&buf), Some(4));
        // A check out of step with the fills fails: the counters matter.
        let mut buf = vec![0; 10];
        tx.fill(&mut buf);
        tx.fill(&mut buf);
        assert_eq!(rx.check(&buf), Some(0));
    }

    #[test]
    fn pattern_index_wraps_as_unsigned_c() {
        let mut p = Pattern { iter: u32::MAX };
        let mut b = [0; 1];
        p.fill(&mut b);
        // (2^32 - 1) * 7 mod 2^32 = 2^32 - 7 = 4294967289; mod 62 = 45.
        assert_eq!(b[0], ALPHABET[(4_294_967_289u64 % 62) as usize]);
        assert_eq!(p.iter, 0);
    }

    #[test]
    fn name_is_length_big_endian_format_then_bytes() {
        let name = [0xaa; 32];
        let bytes = encode_name(FI_ADDR_EFA, &name);
        assert_eq!(&bytes[..8], [0, 0, 0, 32, 12, 0, 0, 0]);
        assert_eq!(&bytes[8..], name);
        let (format, back) = read_name(&mut &bytes[..]).unwrap();
        assert_eq!((format, back.as_slice()), (FI_ADDR_EFA, &name[..]));
        let long = [0, 0, 4, 1, 12, 0, 0, 0];
        assert_eq!(read_name(&mut &long[..]).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn count_is_ten_bytes_of_decimal_zero_filled() {
        assert_eq!(&encode_count(10), b"10\0\0\0\0\0\0\0\0");
        assert_eq!(parse_count(&encode_count(10)), Some(10));
        assert_eq!(parse_count(&encode_count(0)), Some(0));
        assert_eq!(&encode_count(12_345_678_901), b"1234567890");
        assert_eq!(parse_count(b"1x\0\0\0\0\0\0\0\0"), None);
    }

    /// Bytes in, bytes out: one side of the link, the peer's bytes given.
    struct Script {
        input: io::Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl Read for Script {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Script {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.write(buf)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn side(role: Role, input: &[u8]) -> Ctrl<Script> {
        Ctrl { stream: Script { input: io::Cursor::new(input.to_vec()), output: Vec::new() }, role }
    }

    #[test]
    fn client_session_bytes_are_pingpong_c_s() {
        // A two-size run seen from the client: the server's name, then per
        // size "a" and "cnt ok".
        let server_name = [7u8; 32];
        let mut input = encode_name(FI_ADDR_EFA, &server_name);
        for _ in 0..2 {
            input.extend_from_slice(SYNC_A);
            input.extend_from_slice(CNT_OK);
        }
        let mut c = side(Role::Client, &input);
        let (format, name) = c.exchange_names(FI_ADDR_EFA, &[9; 32]).unwrap();
        assert_eq!((format, name), (FI_ADDR_EFA, server_name.to_vec()));
        for _ in 0..2 {
            c.sync().unwrap();
            assert_eq!(c.count(10).unwrap(), 10);
        }
        let mut want = encode_name(FI_ADDR_EFA, &[9; 32]);
        for _ in 0..2 {
            want.extend_from_slice(b"q\0");
            want.extend_from_slice(b"10\0\0\0\0\0\0\0\0");
        }
        assert_eq!(c.stream.output, want);
    }

    #[test]
    fn server_session_bytes_are_pingpong_c_s() {
        let mut input = encode_name(FI_ADDR_EFA, &[9; 32]);
        input.extend_from_slice(SYNC_Q);
        input.extend_from_slice(&encode_count(1000));
        let mut s = side(Role::Server, &input);
        let (_, name) = s.exchange_names(FI_ADDR_EFA, &[7; 32]).unwrap();
        assert_eq!(name, [9; 32]);
        s.sync().unwrap();
        assert_eq!(s.count(0).unwrap(), 1000);
        let mut want = encode_name(FI_ADDR_EFA, &[7; 32]);
        want.extend_from_slice(b"a\0cnt ok\0");
        assert_eq!(s.stream.output, want);
    }

    #[test]
    fn a_wrong_sync_word_is_an_error() {
        let mut s = side(Role::Server, b"x\0");
        assert_eq!(s.sync().unwrap_err().kind(), io::ErrorKind::InvalidData);
        let mut c = side(Role::Client, b"cnt no\0");
        assert!(c.count(1).is_err());
        let mut short = side(Role::Client, b"");
        assert_eq!(short.sync().unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn perf_table_is_show_perf_s() {
        assert_eq!(
            perf_header(),
            "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec"
        );
        // 64 B, 10000 round trips in 0.2 s: 1.28 MB each way.
        assert_eq!(
            perf_row(64, 10_000, 10_000, 200_000),
            "64      10k     =10k     1.2m        0.20s      6.40      10.00       0.10"
        );
        assert_eq!(size_str(1536), "1.5k");
        assert_eq!(size_str(6 << 20), "6m");
        assert_eq!(size_str(12 << 10), "12k");
        assert_eq!(cnt_str(999), "999");
        assert!(perf_row(1, 10, 9, 100).contains("+1 "));
    }
}

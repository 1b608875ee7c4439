//! `efapoll decode`: a dissector for EFA RDM v4 packets, and with `--smbd`
//! for SMB Direct Data Transfer messages (MS-SMBD 2.2.3).
//!
//! One JSON object per packet, one per line:
//! `{"name", "header_len", "payload_offset", "fields": {...}}`, or
//! `{"error": "..."}` (with `"line"`, its line number, when the packet came
//! from standard input). Field names are the spec's; integers are exact.
//! Next to the integer `flags`, `flag_names` names its set bits as the spec
//! does for the packet's type, lowest first; a bit the type does not define
//! is its value (`"0x0100"`).

use std::io::{self, BufRead, Read, Write};
use std::process::ExitCode;

use efapoll::ulp::smbd;
use efapoll::wire::{
    AtomRspRepr, CtsRepr, HandshakeRepr, IovList, Packet, RawAddr, ReqField, ReqRepr,
};
use serde_json::{Map, Value, json};

/// The longest line of standard input decoded, in bytes: a packet of the
/// largest MTU (9 KiB), written with a separator after every byte, takes
/// under 28 KiB. Past it the line is an error, so memory stays bounded
/// whatever the input.
pub const MAX_LINE: usize = 64 << 10;

/// What the bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// EFA RDM v4 packets.
    Efa,
    /// SMB Direct Data Transfer messages.
    Smbd,
}

/// Decodes the packets in `args`, or each non-empty line of stdin when
/// there are none. Exit status 0 when every packet decoded, 1 otherwise.
pub fn run(args: &[String], format: Format) -> ExitCode {
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let mut all_ok = true;
    let result = if args.is_empty() {
        decode_lines(&mut io::stdin().lock(), &mut out, &mut all_ok, format)
    } else {
        args.iter().filter(|a| !a.trim().is_empty()).try_for_each(|a| {
            let (value, ok) = decode_line(a, format);
            all_ok &= ok;
            writeln!(out, "{value}")
        })
    };
    if let Err(e) = crate::reader_gone_is_ok(result.and_then(|()| out.flush())) {
        eprintln!("efapoll decode: {e}");
        return ExitCode::FAILURE;
    }
    if all_ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Decodes `input` line by line into `out`; a line that fails (too long,
/// not UTF-8, not a packet) is an error object naming it, and the next
/// line goes on.
fn decode_lines(
    input: &mut impl BufRead,
    out: &mut impl Write,
    all_ok: &mut bool,
    format: Format,
) -> io::Result<()> {
    let mut buf = Vec::new();
    let mut number = 0u64;
    loop {
        let read = read_line(input, &mut buf, MAX_LINE)?;
        number += 1;
        let value = match read {
            LineRead::Eof => return Ok(()),
            LineRead::TooLong => {
                let e = format!("line longer than {MAX_LINE} bytes, the longest decoded");
                writeln!(out, "{}", json!({ "error": e, "line": number }))?;
                *all_ok = false;
                // Said at once, since an endless line is skipped to its end.
                out.flush()?;
                input.skip_until(b'\n')?;
                continue;
            }
            LineRead::Line if buf.trim_ascii().is_empty() => continue,
            LineRead::Line => match std::str::from_utf8(&buf) {
                Ok(line) => decode_line(line, format),
                Err(e) => {
                    let e = format!("not UTF-8 text: invalid byte at offset {}", e.valid_up_to());
                    (json!({ "error": e }), false)
                }
            },
        };
        let (mut value, ok) = value;
        if !ok {
            value["line"] = json!(number);
        }
        *all_ok &= ok;
        writeln!(out, "{value}")?;
    }
}

/// What [`read_line`] found.
#[derive(Debug, PartialEq, Eq)]
enum LineRead {
    /// A line, in the buffer without its end of line.
    Line,
    /// A line longer than the bound, consumed only up to where it passed
    /// it.
    TooLong,
    Eof,
}

/// Reads one line of at most `max` bytes into `buf`, without its `\n` (or
/// `\r\n`). A longer line is consumed only up to where it passed `max`
/// (the caller skips the rest with `skip_until`), so memory stays bounded.
fn read_line(input: &mut impl BufRead, buf: &mut Vec<u8>, max: usize) -> io::Result<LineRead> {
    buf.clear();
    // One byte past the bound tells a line of `max` bytes from a longer one.
    if Read::take(&mut *input, max as u64 + 1).read_until(b'\n', buf)? == 0 {
        return Ok(LineRead::Eof);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    } else if buf.len() > max {
        return Ok(LineRead::TooLong);
    }
    Ok(LineRead::Line)
}

/// One line of hex to its JSON object, and whether it decoded.
pub fn decode_line(line: &str, format: Format) -> (Value, bool) {
    let bytes = match parse_hex(line) {
        Ok(b) => b,
        Err(e) => return (json!({ "error": e }), false),
    };
    if format == Format::Smbd {
        return match smbd::Repr::parse(&bytes) {
            Ok((r, data)) => (dissect_smbd(&r, data, &bytes), true),
            Err(e) => (json!({ "error": e.to_string() }), false),
        };
    }
    match Packet::parse(&bytes) {
        Ok(p) => (dissect(&p, &bytes), true),
        Err(e) => (json!({ "error": e.to_string() }), false),
    }
}

/// An SMB Direct Data Transfer message, fields named as in MS-SMBD 2.2.3.
/// `payload_offset` is where Buffer starts (DataOffset; the 20-byte header
/// for the empty message, which has no padding, `"empty": true`); bytes
/// after Buffer, if any, are `trailing`.
fn dissect_smbd(r: &smbd::Repr, data: &[u8], bytes: &[u8]) -> Value {
    let mut flags = Vec::new();
    if r.flags.contains(smbd::Flags::RESPONSE_REQUESTED) {
        flags.push("SMB_DIRECT_RESPONSE_REQUESTED");
    }
    let offset = r.buffer_len();
    let reserved = u16::from_le_bytes([bytes[6], bytes[7]]);
    let mut f = Map::new();
    let mut put = |name: &str, v: Value| {
        f.insert(name.into(), v);
    };
    put("CreditsRequested", json!(r.credits_requested));
    put("CreditsGranted", json!(r.credits_granted));
    put("Flags", json!(r.flags.bits()));
    put("flag_names", json!(flags));
    put("Reserved", json!(reserved));
    put("RemainingDataLength", json!(r.remaining_data_length));
    put("DataOffset", json!(r.data_offset));
    put("DataLength", json!(r.data_length));
    put("Padding", json!(hex(&bytes[smbd::HEADER_LEN..offset])));
    put("Buffer", json!(hex(data)));
    let end = offset + data.len();
    if bytes.len() > end {
        put("trailing", json!(hex(&bytes[end..])));
    }
    json!({
        "name": "SMBD_DATA_TRANSFER",
        "empty": r.is_empty(),
        "header_len": smbd::HEADER_LEN,
        "payload_offset": offset,
        "fields": f,
    })
}

/// Hex digits, optionally prefixed by `0x`; spaces, colons and dashes
/// between bytes are allowed.
fn parse_hex(line: &str) -> Result<Vec<u8>, String> {
    let s = line.trim();
    let s = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    let digits: Vec<u8> = s.bytes().filter(|c| !matches!(c, b' ' | b'\t' | b':' | b'-')).collect();
    if !digits.len().is_multiple_of(2) {
        return Err(format!("invalid hex: odd number of digits ({})", digits.len()));
    }
    digits
        .chunks_exact(2)
        .map(|pair| {
            let hi = (pair[0] as char).to_digit(16);
            let lo = (pair[1] as char).to_digit(16);
            match (hi, lo) {
                (Some(h), Some(l)) => Ok((h * 16 + l) as u8),
                _ => Err(format!(
                    "invalid hex: {:?} is not a hex byte",
                    String::from_utf8_lossy(pair)
                )),
            }
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn iovs(list: &IovList) -> Value {
    list.iter().map(|v| json!({ "addr": v.addr, "len": v.len, "key": v.key })).collect()
}

fn dissect(packet: &Packet, bytes: &[u8]) -> Value {
    let mut f = Map::new();
    f.insert("type".into(), json!(bytes[0]));
    f.insert("version".into(), json!(bytes[1]));
    let flags = u16::from_le_bytes([bytes[2], bytes[3]]);
    f.insert("flags".into(), json!(flags));
    let names = packet.packet_type().flag_names(flags).map(|n| json!(n.to_string()));
    f.insert("flag_names".into(), names.collect());
    let mut put = |name: &str, v: Value| {
        f.insert(name.into(), v);
    };
    let mut payload = None;
    match packet {
        Packet::Cts(CtsRepr { connid, send_id, recv_id, recv_length, .. }) => {
            if let Some(c) = connid {
                put("connid", json!(c));
            }
            put("send_id", json!(send_id));
            put("recv_id", json!(recv_id));
            put("recv_length", json!(recv_length));
        }
        Packet::CtsData(r, data) => {
            put("recv_id", json!(r.recv_id));
            put("seg_length", json!(r.seg_length));
            put("seg_offset", json!(r.seg_offset));
            if let Some(c) = r.connid {
                put("connid", json!(c));
            }
            payload = Some(*data);
        }
        Packet::ReadRsp(r, data) => {
            if let Some(c) = r.connid {
                put("connid", json!(c));
            }
            put("recv_id", json!(r.recv_id));
            put("send_id", json!(r.send_id));
            put("recv_length", json!(r.recv_length));
            payload = Some(*data);
        }
        Packet::AtomRsp(AtomRspRepr { connid, recv_id, seg_length, .. }, data) => {
            if let Some(c) = connid {
                put("connid", json!(c));
            }
            put("recv_id", json!(recv_id));
            put("seg_length", json!(seg_length));
            payload = Some(*data);
        }
        Packet::Eor(r) => {
            put("send_id", json!(r.send_id));
            put("recv_id", json!(r.recv_id));
            if let Some(c) = r.connid {
                put("connid", json!(c));
            }
        }
        Packet::ReadNack(r) => {
            put("send_id", json!(r.send_id));
            put("recv_id", json!(r.recv_id));
            if let Some(c) = r.connid {
                put("connid", json!(c));
            }
        }
        Packet::Receipt(r) => {
            put("send_id", json!(r.send_id));
            put("msg_id", json!(r.msg_id));
            if let Some(c) = r.connid {
                put("connid", json!(c));
            }
        }
        Packet::Handshake(r) => dissect_handshake(r, &mut put),
        Packet::Req(r, data) => {
            dissect_req(r, &mut put);
            payload = Some(*data);
        }
    }
    if let Some(data) = payload {
        put("payload", json!(hex(data)));
    }
    json!({
        "name": packet.packet_type().name(),
        "header_len": packet.header_len(),
        "payload_offset": packet.payload_offset(),
        "fields": f,
    })
}

fn dissect_handshake(r: &HandshakeRepr, put: &mut impl FnMut(&str, Value)) {
    put("nextra_p3", json!(r.nextra_p3()));
    put("extra_info", r.extra_info.iter().map(|w| json!(w)).collect());
    if let Some(c) = r.connid {
        put("connid", json!(c));
    }
    if let Some(h) = r.host_id {
        put("host_id", json!(h));
    }
    if let Some(v) = r.device_version {
        put("device_version", json!(v));
    }
    if let Some(q) = r.user_recv_qp {
        put("qpn", json!(q.qpn));
        put("qkey", json!(q.qkey));
    }
}

fn dissect_req(r: &ReqRepr, put: &mut impl FnMut(&str, Value)) {
    let layout = r.layout();
    for field in layout.fields() {
        put(field.name(), json!(r.field(field)));
        match field {
            ReqField::RmaIovCount => put("rma_iov", iovs(&r.rma_iov)),
            ReqField::ReadIovCount => put("read_iov", iovs(&r.read_iov)),
            _ => {}
        }
    }
    if let Some(addr) = r.raw_addr {
        put("raw_addr_size", json!(addr.len()));
        put("raw_addr", json!(hex(addr)));
        // The codec guarantees at least 24 bytes.
        if let Ok(a) = RawAddr::from_bytes(addr) {
            put("raw_addr_gid", json!(hex(&a.gid)));
            put("raw_addr_qpn", json!(a.qpn));
            put("raw_addr_connid", json!(a.connid));
        }
    }
    if let Some(cq) = r.cq_data {
        put("cq_data", json!(cq));
    }
    if let Some(c) = r.connid {
        put("connid", json!(c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_forms() {
        assert_eq!(parse_hex("0x40 04:00-00").unwrap(), [0x40, 4, 0, 0]);
        assert_eq!(parse_hex(" 4004 ").unwrap(), [0x40, 4]);
        assert!(parse_hex("400").unwrap_err().contains("odd number"));
        assert!(parse_hex("40zz").unwrap_err().contains("\"zz\""));
    }

    fn lines(input: &[u8], max: usize) -> Vec<(LineRead, Vec<u8>)> {
        // A small buffer, so lines span several reads.
        let mut r = io::BufReader::with_capacity(3, input);
        let mut buf = Vec::new();
        let mut got = Vec::new();
        loop {
            let read = read_line(&mut r, &mut buf, max).unwrap();
            if read == LineRead::Eof {
                return got;
            }
            if read == LineRead::TooLong {
                r.skip_until(b'\n').unwrap();
            }
            got.push((read, buf.clone()));
        }
    }

    #[test]
    fn lines_are_bounded_and_a_long_one_is_skipped_to_its_end() {
        let got = lines(b"ab\r\n123456789\n\ncd\nefghij", 5);
        let line = |s: &[u8]| (LineRead::Line, s.to_vec());
        assert_eq!(got[0], line(b"ab"));
        assert_eq!(got[1].0, LineRead::TooLong);
        assert_eq!(got[2], line(b""));
        assert_eq!(got[3], line(b"cd"));
        assert_eq!(got[4].0, LineRead::TooLong);
        assert_eq!(got.len(), 5);
        // A line of exactly the bound is a line; one byte more is not.
        assert_eq!(lines(b"12345\n", 5), [line(b"12345")]);
        assert_eq!(lines(b"123456\nx", 5)[1], line(b"x"));
        assert_eq!(lines(b"", 5), []);
    }
}

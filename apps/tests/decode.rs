//! `efapoll decode` end to end: golden packets in, one JSON object out per
//! packet, with the spec's field names and exact integers.

use std::io::Write;
use std::process::{Command, Stdio};

use efapoll::wire::{PacketType, golden};
use serde_json::{Value, json};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Runs `efapoll decode` with `args` and `stdin`; returns the JSON lines and
/// whether it exited 0.
fn decode(args: &[&str], stdin: &str) -> (Vec<Value>, bool) {
    let (lines, status) = decode_bytes(args, stdin.as_bytes());
    (lines, status == Some(0))
}

/// [`decode`] of any bytes; returns the JSON lines and the exit code.
fn decode_bytes(args: &[&str], stdin: &[u8]) -> (Vec<Value>, Option<i32>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_efapoll"))
        .arg("decode")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    (json_lines(&out.stdout), out.status.code())
}

fn json_lines(stdout: &[u8]) -> Vec<Value> {
    let text = String::from_utf8(stdout.to_vec()).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn every_golden_packet_decodes_from_stdin() {
    let input: String = golden::ALL.iter().map(|(_, b)| hex(b) + "\n\n").collect();
    let (lines, ok) = decode(&[], &input);
    assert!(ok);
    assert_eq!(lines.len(), golden::ALL.len(), "empty lines are ignored");
    for ((name, bytes), v) in golden::ALL.iter().zip(&lines) {
        assert_eq!(v["name"], PacketType::from(bytes[0]).name(), "{name}");
        let f = &v["fields"];
        assert_eq!(f["type"], bytes[0]);
        assert_eq!(f["version"], 4);
        let flags = u16::from_le_bytes([bytes[2], bytes[3]]);
        assert_eq!(f["flags"], flags);
        assert_eq!(f["flag_names"].as_array().unwrap().len(), flags.count_ones() as usize);
        let offset = v["payload_offset"].as_u64().unwrap() as usize;
        assert!(v["header_len"].as_u64().unwrap() as usize <= offset);
        if let Some(p) = f.get("payload") {
            assert_eq!(p, &json!(hex(&bytes[offset..])), "{name}");
        }
        // connid appears only with CONNID_HDR.
        assert_eq!(f.get("connid").is_some(), bytes[3] & 0x80 != 0, "{name}");
    }
}

fn names(v: &Value) -> Vec<&str> {
    v["fields"]["flag_names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect()
}

#[test]
fn flag_bits_are_named_as_the_spec_names_them_for_the_type() {
    let packets = [
        golden::EAGER_TAGRTM,
        golden::LONGCTS_MSGRTM,
        golden::FETCH_RTA,
        golden::CTS,
        golden::HANDSHAKE_USER_RECV_QP,
        golden::EOR,
        golden::CTSDATA_NO_CONNID,
    ];
    let (lines, ok) = decode(&packets.map(hex).iter().map(String::as_str).collect::<Vec<_>>(), "");
    assert!(ok);
    assert_eq!(names(&lines[0]), ["REQ_MSG", "REQ_TAGGED", "CONNID_HDR"]);
    assert_eq!(names(&lines[1]), ["REQ_OPT_RAW_ADDR_HDR", "REQ_OPT_CQ_DATA_HDR", "REQ_MSG"]);
    assert_eq!(names(&lines[2]), ["REQ_ATOMIC", "CONNID_HDR"]);
    assert_eq!(names(&lines[3]), ["CTS_EMULATED_READ", "CONNID_HDR"]);
    assert_eq!(
        names(&lines[4]),
        ["HANDSHAKE_DEVICE_VERSION_HDR", "HANDSHAKE_USER_RECV_QP_HDR", "CONNID_HDR"]
    );
    assert_eq!(names(&lines[5]), ["CONNID_HDR"]);
    assert!(names(&lines[6]).is_empty(), "flags 0: {}", lines[6]);
    // The integer stays, beside its names.
    assert_eq!(lines[0]["fields"]["flags"], 0x800c);
}

#[test]
fn a_flag_bit_the_type_does_not_define_is_named_by_its_value() {
    // CTS_EMULATED_READ's bit on an EOR, bit 8 on a REQ; REQ_READ_NACK's,
    // which only the provider names, on a REQ.
    let mut eor = golden::EOR.to_vec();
    eor[2] |= 0x80;
    let mut eager = golden::EAGER_TAGRTM.to_vec();
    eager[3] |= 0x21;
    let (lines, ok) = decode(&[&hex(&eor), &hex(&eager)], "");
    assert!(ok, "unknown bits are kept, not rejected: {lines:?}");
    assert_eq!(names(&lines[0]), ["0x0080", "CONNID_HDR"]);
    assert_eq!(
        names(&lines[1]),
        ["REQ_MSG", "REQ_TAGGED", "0x0100", "REQ_READ_NACK", "CONNID_HDR"]
    );
}

#[test]
fn req_fields_are_named_as_in_the_spec() {
    let (lines, ok) = decode(&[&hex(golden::RUNTREAD_MSGRTM), &hex(golden::LONGCTS_RTR)], "");
    assert!(ok);
    let runt = &lines[0];
    assert_eq!(runt["name"], "RUNTREAD_MSGRTM");
    assert_eq!(runt["header_len"], 40 + 40 + 8);
    assert_eq!(runt["payload_offset"], 40 + 40 + 8 + 24);
    let f = &runt["fields"];
    assert_eq!(f["msg_id"], golden::MSG_ID);
    assert_eq!(f["msg_length"], golden::MSG_LENGTH);
    assert_eq!(f["send_id"], golden::SEND_ID);
    assert_eq!(f["read_iov_count"], 1);
    assert_eq!(f["seg_offset"], golden::SEG_OFFSET);
    assert_eq!(f["runt_length"], golden::RUNT_LENGTH);
    assert_eq!(
        f["read_iov"],
        json!([{"addr": golden::IOV2.addr, "len": golden::IOV2.len, "key": golden::IOV2.key}])
    );
    assert_eq!(f["raw_addr_size"], 36);
    assert_eq!(f["raw_addr"], hex(&golden::RAW_ADDR.to_req_hdr_bytes()));
    assert_eq!(f["raw_addr_gid"], hex(&golden::RAW_ADDR.gid));
    assert_eq!(f["raw_addr_qpn"], golden::RAW_ADDR.qpn);
    assert_eq!(f["raw_addr_connid"], golden::CONNID);
    assert_eq!(f["cq_data"], golden::CQ_DATA);
    assert_eq!(f["payload"], hex(golden::PAYLOAD));
    assert!(f.get("connid").is_none());
    assert!(f.get("tag").is_none());

    let rtr = &lines[1]["fields"];
    assert_eq!(rtr["rma_iov_count"], 2);
    assert_eq!(rtr["rma_iov"].as_array().unwrap().len(), 2);
    assert_eq!(rtr["recv_id"], golden::RECV_ID);
    assert_eq!(rtr["recv_length"], golden::RTR_RECV_LENGTH);
    assert_eq!(rtr["payload"], "");
}

#[test]
fn renamed_fields_and_exact_u64() {
    let (lines, _) = decode(
        &[
            &hex(golden::READRSP),
            &hex(golden::MEDIUM_TAGRTM),
            &hex(golden::RECEIPT),
            &hex(golden::HANDSHAKE_USER_RECV_QP),
        ],
        "",
    );
    assert_eq!(lines[0]["fields"]["recv_length"], 8);
    let medium = &lines[1]["fields"];
    assert_eq!(medium["msg_length"], golden::MSG_LENGTH);
    // Above 2^63: printed as an exact JSON integer, not a float.
    assert_eq!(medium["tag"].as_u64(), Some(golden::TAG));
    assert_eq!(lines[2]["fields"]["send_id"], golden::SEND_ID);
    assert_eq!(lines[2]["fields"]["msg_id"], golden::MSG_ID);
    let hs = &lines[3];
    assert_eq!(hs["header_len"], golden::HANDSHAKE_USER_RECV_QP.len());
    assert_eq!(hs["fields"]["nextra_p3"], 5);
    assert_eq!(hs["fields"]["extra_info"], json!([0xfb, 0]));
    assert_eq!(hs["fields"]["qpn"], 0x33);
    assert_eq!(hs["fields"]["qkey"], 0x44556677);
    assert_eq!(hs["fields"]["device_version"], 0xefa2);
    assert!(hs["fields"].get("host_id").is_none());
    assert!(hs["fields"].get("payload").is_none());
    let ctsdata = decode(&[&hex(golden::CTSDATA)], "").0;
    assert_eq!(ctsdata[0]["header_len"], 32);
}

#[test]
fn bad_packets_give_an_error_object_and_exit_1() {
    let mut bad_version = golden::EAGER_TAGRTM.to_vec();
    bad_version[1] = 3;
    let (lines, ok) =
        decode(&[], &format!("{}\n4004\nxyz\n{}\n", hex(&bad_version), hex(golden::EOR)));
    assert!(!ok);
    assert_eq!(lines.len(), 4);
    // From standard input, an error names its line.
    assert_eq!(lines[0], json!({"error": "protocol version 3, expected 4", "line": 1}));
    assert_eq!(
        lines[1],
        json!({"error": "base header cut short: need 4 bytes, have 2", "line": 2})
    );
    assert!(lines[2]["error"].as_str().unwrap().starts_with("invalid hex"));
    assert_eq!(lines[2]["line"], 3);
    assert_eq!(lines[3]["name"], "EOR");
    let (lines, ok) = decode(&["01040000"], "");
    assert!(!ok);
    assert!(lines[0]["error"].as_str().unwrap().contains("retired"));
}

/// The longest line decoded (`decode --help` says so).
const MAX_LINE: usize = 65536;

#[test]
fn a_line_over_the_limit_is_an_error_for_that_line_and_the_next_decodes() {
    let mut input = vec![b'0'; 3 * MAX_LINE];
    input.extend_from_slice(format!("\n\n{}\n", hex(golden::EOR)).as_bytes());
    let (lines, code) = decode_bytes(&[], &input);
    assert_eq!(code, Some(1), "a failed line exits 1");
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["line"], 1);
    let e = lines[0]["error"].as_str().unwrap();
    assert!(e.contains("longer than 65536 bytes"), "{e}");
    assert_eq!(lines[1]["name"], "EOR");
    // At the limit, a line is decoded (this one is bad hex, not too long).
    let (lines, _) = decode_bytes(&[], &[b'z'; MAX_LINE]);
    assert!(lines[0]["error"].as_str().unwrap().starts_with("invalid hex"), "{lines:?}");
    let help = Command::new(env!("CARGO_BIN_EXE_efapoll")).args(["decode", "--help"]).output();
    let help = String::from_utf8(help.unwrap().stdout).unwrap();
    assert!(help.contains("longer than 65536 bytes") && help.contains("Exit status"), "{help}");
}

#[test]
fn a_line_that_is_not_utf8_is_an_error_for_that_line_only() {
    let mut input = format!("{}\n", hex(golden::EAGER_TAGRTM)).into_bytes();
    input.extend_from_slice(b"41\xff\xfe04\n");
    input.extend_from_slice(format!("{}\n", hex(golden::EOR)).as_bytes());
    let (lines, code) = decode_bytes(&[], &input);
    assert_eq!(code, Some(1));
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0]["name"], "EAGER_TAGRTM");
    assert_eq!(lines[1]["line"], 2);
    assert!(lines[1]["error"].as_str().unwrap().contains("not UTF-8"), "{lines:?}");
    assert_eq!(lines[2]["name"], "EOR");
}

#[test]
fn an_endless_line_of_zero_bytes_ends_in_an_error_with_bounded_memory() {
    // 300 MB of NUL bytes and no newline, as from /dev/zero, into a decode
    // whose address space is capped at 64 MiB (the process needs some 12):
    // buffering the line would abort on allocation failure.
    const TOTAL: usize = 300 << 20;
    let mut child = Command::new("sh")
        .args(["-c", "ulimit -v 65536 && exec \"$0\" decode", env!("CARGO_BIN_EXE_efapoll")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let chunk = vec![0u8; 1 << 20];
        // A decode that dies early closes the pipe: the test fails below.
        for _ in 0..TOTAL / chunk.len() {
            if stdin.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}: {stderr}", out.status);
    let lines = json_lines(&out.stdout);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["line"], 1);
    assert!(lines[0]["error"].as_str().unwrap().contains("longer than"), "{lines:?}");
}

#[test]
fn smbd_segments_decode_with_the_fields_of_ms_smbd() {
    use efapoll::ulp::smbd::golden as smbd;
    let (lines, ok) = decode(&["--smbd", &hex(smbd::FIRST), &hex(smbd::LAST_AT_32)], "");
    assert!(ok);
    let first = &lines[0];
    assert_eq!(first["name"], "SMBD_DATA_TRANSFER");
    assert_eq!(first["empty"], false);
    assert_eq!(first["header_len"], 20);
    assert_eq!(first["payload_offset"], 24);
    assert_eq!(
        first["fields"],
        json!({
            "CreditsRequested": smbd::CREDITS_REQUESTED,
            "CreditsGranted": smbd::CREDITS_GRANTED,
            "Flags": 1,
            "flag_names": ["SMB_DIRECT_RESPONSE_REQUESTED"],
            "Reserved": 0,
            "RemainingDataLength": smbd::REMAINING,
            "DataOffset": 24,
            "DataLength": 8,
            "Padding": "00000000",
            "Buffer": hex(smbd::DATA),
        })
    );
    let last = &lines[1];
    assert_eq!(last["payload_offset"], 32);
    assert_eq!(last["fields"]["RemainingDataLength"], 0);
    assert_eq!(last["fields"]["Padding"], "00".repeat(12));
    assert_eq!(last["fields"]["flag_names"], json!([]));
    assert!(last["fields"].get("trailing").is_none());
}

#[test]
fn the_smbd_empty_message_has_no_padding_and_no_buffer() {
    use efapoll::ulp::smbd::golden as smbd;
    // From standard input, as any packet; and bytes past the data shown.
    let mut longer = smbd::FIRST.to_vec();
    longer.extend_from_slice(&[0xee, 0xff]);
    let (lines, ok) = decode(&["--smbd"], &format!("{}\n{}\n", hex(smbd::EMPTY), hex(&longer)));
    assert!(ok);
    let empty = &lines[0];
    assert_eq!((empty["empty"].clone(), empty["payload_offset"].clone()), (json!(true), json!(20)));
    assert_eq!(empty["fields"]["Padding"], "");
    assert_eq!(empty["fields"]["Buffer"], "");
    assert_eq!(empty["fields"]["DataOffset"], 0);
    assert_eq!(lines[1]["fields"]["trailing"], "eeff");
}

#[test]
fn malformed_smbd_segments_are_typed_errors_and_exit_1() {
    use efapoll::ulp::smbd::golden as smbd;
    let with = |at: usize, v: u8| {
        let mut s = smbd::FIRST.to_vec();
        s[at] = v;
        hex(&s)
    };
    let (lines, ok) = decode(
        &[
            "--smbd",
            &hex(&smbd::FIRST[..19]),
            &with(12, 28),
            &with(12, 16),
            &with(16, 9),
            &hex(smbd::FIRST),
        ],
        "",
    );
    assert!(!ok, "a failed segment exits 1");
    let errors: Vec<&str> = lines.iter().map(|l| l["error"].as_str().unwrap_or("")).collect();
    assert_eq!(
        errors,
        [
            "segment cut short: need 20 bytes, have 19",
            "DataOffset 28 is not 8-byte aligned",
            "DataOffset 16 is inside the header",
            "data at 24 of 9 bytes is beyond the 32-byte segment",
            "",
        ]
    );
    assert_eq!(lines[4]["name"], "SMBD_DATA_TRANSFER");
    // Without --smbd, the same bytes are an EFA packet (and no valid one).
    let (lines, ok) = decode(&[&hex(smbd::FIRST)], "");
    assert!(!ok && lines[0].get("error").is_some());
}

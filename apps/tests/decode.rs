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
    let mut child = Command::new(env!("CARGO_BIN_EXE_efapoll"))
        .arg("decode")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (lines, out.status.success())
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
        assert_eq!(f["flags"], u16::from_le_bytes([bytes[2], bytes[3]]));
        let offset = v["payload_offset"].as_u64().unwrap() as usize;
        assert!(v["header_len"].as_u64().unwrap() as usize <= offset);
        if let Some(p) = f.get("payload") {
            assert_eq!(p, &json!(hex(&bytes[offset..])), "{name}");
        }
        // connid appears only with CONNID_HDR.
        assert_eq!(f.get("connid").is_some(), bytes[3] & 0x80 != 0, "{name}");
    }
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
    assert_eq!(lines[0], json!({"error": "protocol version 3, expected 4"}));
    assert_eq!(lines[1], json!({"error": "base header cut short: need 4 bytes, have 2"}));
    assert!(lines[2]["error"].as_str().unwrap().starts_with("invalid hex"));
    assert_eq!(lines[3]["name"], "EOR");
    let (lines, ok) = decode(&["01040000"], "");
    assert!(!ok);
    assert!(lines[0]["error"].as_str().unwrap().contains("retired"));
}

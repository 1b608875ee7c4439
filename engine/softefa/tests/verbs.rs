//! Runs verbs programs written in C against rdma-core's headers and
//! libraries, with softefa preloaded in front of them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The built `libsoftefa.so`: cargo builds the package's cdylib with its
/// tests, beside their executables (`target/<profile>/deps`), looked at
/// first; then the profile's directory, where `cargo build -p softefa`
/// puts it (and an older build of it may lie).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let deps = exe.parent().expect("deps/");
    for dir in [deps, deps.parent().expect("the profile's directory")] {
        let lib = dir.join("libsoftefa.so");
        if lib.exists() {
            return lib;
        }
    }
    panic!("libsoftefa.so not found beside {}", deps.display());
}

/// Compiles `tests/<name>.c` with the system C compiler, linked with
/// libibverbs and libefa as an EFA program is.
fn compile(name: &str, tag: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(format!("{name}.c"));
    compile_file(&src, &format!("{name}-{tag}"))
}

fn compile_file(src: &Path, tag: &str) -> PathBuf {
    let out = std::env::temp_dir().join(format!("softefa-{tag}-{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(src)
        .args(["-libverbs", "-lefa"])
        .status()
        .unwrap_or_else(|e| panic!("{cc}: {e}"));
    assert!(st.success(), "compiling {}", src.display());
    out
}

/// Runs `exe` under softefa with `env`; returns its standard output.
fn run(exe: &Path, env: &[(&str, &str)]) -> String {
    let out = Command::new("timeout")
        .arg("120")
        .arg(exe)
        .env("LD_PRELOAD", library())
        .envs(env.iter().copied())
        .output()
        .expect("running the program");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {}\n{stdout}{stderr}", exe.display(), out.status);
    stdout
}

#[test]
fn a_verbs_program_sends_reads_writes_and_meets_efa_quirks() {
    let exe = compile("verbs", "default");
    let out = run(&exe, &[]);
    let _ = std::fs::remove_file(&exe);
    for check in [
        "ok device list",
        "ok queries",
        "ok send, unknown sender with sgid",
        "ok known sender by AH number",
        "ok post_send with two SGEs, poll_cq",
        "ok rdma write with immediate",
        "ok send with immediate",
        "ok rdma read completes with IBV_WC_SEND",
        "ok bad rkey: vendor error 7",
        "ok bad lkey: vendor error 5",
        "ok SQ full: ENOMEM, the batch rolled back",
        "ok unsignaled WR refused",
        "ok a full SQ's worth",
        "ok receive SGE limit",
        "ok teardown",
        "all passed",
    ] {
        assert!(out.lines().any(|l| l == check), "missing {check:?} in:\n{out}");
    }
}

#[test]
fn the_mtu_is_max_msg_sz_and_configurable() {
    let exe = compile("verbs", "mtu");
    let out = run(&exe, &[("SOFTEFA_MTU", "9000")]);
    let _ = std::fs::remove_file(&exe);
    assert!(out.contains("all passed"), "{out}");
}

/// The rdma-core objects softefa hands out are laid out as verbs.h lays
/// them out: inline functions there reach their function pointers by
/// offset. Each size and offset below, as rdma-sys's bindgen has it, is
/// checked against the C compiler's view of the installed headers.
#[test]
fn the_objects_are_laid_out_as_verbs_h_lays_them_out() {
    use rdma_sys::*;
    use std::mem::{offset_of, size_of};
    macro_rules! layout {
        ($($ty:ident { $($($f:ident).+),* })*) => {{
            let mut v: Vec<(String, usize)> = Vec::new();
            $(
                v.push((format!("sizeof(struct {})", stringify!($ty)), size_of::<$ty>()));
                $(v.push((
                    format!("offsetof(struct {}, {})", stringify!($ty), stringify!($($f).+).replace(' ', "")),
                    offset_of!($ty, $($f).+),
                ));)*
            )*
            v
        }};
    }
    let rust = layout! {
        verbs_context { query_port, create_cq_ex, create_qp_ex, query_device_ex, sz, context }
        ibv_context { device, ops.poll_cq, ops.req_notify_cq, ops.post_send, ops.post_recv, cmd_fd, abi_compat }
        ibv_device { node_type, transport_type, name, ibdev_path }
        ibv_cq_ex { context, status, wr_id, start_poll, next_poll, end_poll, read_opcode,
            read_vendor_err, read_byte_len, read_imm_data, read_qp_num, read_src_qp,
            read_wc_flags, read_slid, read_sl, read_dlid_path_bits }
        ibv_qp { context, send_cq, recv_cq, qp_num, state, qp_type }
        ibv_qp_ex { qp_base, wr_id, wr_flags, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm,
            wr_send, wr_send_imm, wr_set_ud_addr, wr_set_inline_data, wr_set_inline_data_list,
            wr_set_sge, wr_set_sge_list, wr_start, wr_complete, wr_abort }
        ibv_pd { context, handle }
        ibv_mr { context, pd, addr, length, lkey, rkey }
        ibv_ah { context, pd, handle }
        ibv_wc { wr_id, status, opcode, vendor_err, byte_len, qp_num, src_qp, wc_flags, slid }
        ibv_send_wr { wr_id, next, sg_list, num_sge, opcode, send_flags, wr }
        ibv_recv_wr { wr_id, next, sg_list, num_sge }
        ibv_ah_attr { grh, is_global, port_num }
        ibv_port_attr { state, max_msg_sz, lid, link_layer }
        ibv_device_attr { fw_ver, vendor_id, vendor_part_id, max_sge, max_sge_rd, phys_port_cnt }
        ibv_qp_attr { qp_state, qkey, sq_psn, cap, port_num, rnr_retry }
        ibv_qp_init_attr_ex { send_cq, recv_cq, cap, qp_type, sq_sig_all, comp_mask, pd, send_ops_flags }
        ibv_cq_init_attr_ex { cqe, cq_context, channel, wc_flags, comp_mask }
    };
    let mut c = String::from(
        "#include <infiniband/verbs.h>\n#include <stddef.h>\n#include <stdio.h>\nint main(void) {\n",
    );
    for (expr, _) in &rust {
        c += &format!("    printf(\"%zu\\n\", (size_t)({expr}));\n");
    }
    c += "    return 0;\n}\n";
    let src = std::env::temp_dir().join(format!("softefa-layout-{}.c", std::process::id()));
    std::fs::write(&src, c).unwrap();
    let exe = compile_file(&src, "layout");
    let out = Command::new(&exe).output().expect("running the layout program");
    let _ = (std::fs::remove_file(&src), std::fs::remove_file(&exe));
    let got: Vec<usize> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(got.len(), rust.len());
    for ((expr, r), c) in rust.iter().zip(got) {
        assert_eq!(*r, c, "{expr}: Rust {r}, C {c}");
    }
}

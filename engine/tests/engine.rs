//! The engine's integration tests, one binary (engine/Cargo.toml says
//! why): each file beside this one is a module of it, but for `alloc.rs`'s
//! and `shm.rs`'s.

mod common;

mod endpoint_atomic;
mod endpoint_gather;
mod endpoint_hostile;
mod endpoint_mem;
mod endpoint_msg;
mod endpoint_rma;
mod endpoint_wire;
mod relink;
mod smbd;
mod smbd_props;
mod wire_golden;
mod wire_malformed;
mod wire_props;

/// With `autotests = false` a file added under tests/ and declared
/// nowhere would never be built: every one is a module of a binary here,
/// or the root of one.
#[test]
fn every_file_under_tests_is_built() {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = manifest.join("tests");
    // The binaries' roots, as Cargo.toml's [[test]]s name them.
    let toml = std::fs::read_to_string(manifest.join("Cargo.toml")).unwrap();
    let roots: Vec<&str> = toml
        .lines()
        .filter_map(|l| l.strip_prefix("path = \"tests/")?.strip_suffix(".rs\""))
        .collect();
    let declared: String = roots
        .iter()
        .map(|r| std::fs::read_to_string(dir.join(format!("{r}.rs"))).unwrap())
        .collect();
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()?.strip_suffix(".rs")) else {
            continue;
        };
        files += 1;
        assert!(
            roots.contains(&name) || declared.contains(&format!("\nmod {name};\n")),
            "tests/{name}.rs is in no test binary: declare it in tests/engine.rs (or alloc.rs)"
        );
    }
    assert!(files > roots.len(), "tests/ read: {files} files");
}

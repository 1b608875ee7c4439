//! Embeds the git commit the binary is built from as `EFAPOLL_COMMIT`, for
//! the `--json` reports' `meta.commit`: "unknown" where git or the
//! repository is absent (a source archive, a vendored copy), so that the
//! build never depends on either.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).current_dir(&dir).output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        out.status.success().then(|| text.trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short", "HEAD"])
        .filter(|c| !c.is_empty() && c.chars().all(|ch| ch.is_ascii_hexdigit()));
    // Built from a tree with changes to tracked files: not what the commit
    // names, so the reports say so, as `git describe --dirty` does.
    let dirty =
        || git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let commit = match commit {
        Some(c) if dirty() => format!("{c}-dirty"),
        Some(c) => c,
        None => "unknown".to_owned(),
    };
    println!("cargo:rustc-env=EFAPOLL_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
    // An edit to the crates' sources can make the tree dirty or clean
    // again (cargo watches a directory's files; target/ is not among them).
    for src in ["src", "../engine", "../lcores", "../perf/src", "../Cargo.toml", "../Cargo.lock"] {
        if dir.join(src).exists() {
            println!("cargo:rerun-if-changed={src}");
        }
    }
    // A new commit moves HEAD or the branch it names (loose or packed), a
    // commit or checkout rewrites the index; a path that does not exist
    // would make cargo rerun this on every build.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned(), "index".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            let path = dir.join(Path::new(&path));
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
}

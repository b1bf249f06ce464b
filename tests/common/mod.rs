//! Helpers shared by integration tests (each test file that uses them says `mod common;`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A workspace binary next to `drivelab` in the target dir. It is built by the
/// same command `make test` builds with (`cargo test --workspace --no-run`),
/// not by `cargo build -p NAME`: that one unifies features over the crate's
/// own dependencies and recompiled most of the tree inside a test (minutes of
/// CI) for a binary the workspace build had just made.
pub fn workspace_bin(name: &str) -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_drivelab"))
        .parent()
        .expect("target dir")
        .join(name);
    static BUILD: std::sync::Once = std::sync::Once::new();
    BUILD.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = cargo_as_make_runs_it(&mut Command::new(cargo))
            .args(["test", "--locked", "--workspace", "--no-run", "--quiet"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("running cargo test --workspace --no-run");
        assert!(status.success(), "cargo test --workspace --no-run failed");
    });
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}

/// `cmd`, a cargo, without the variables cargo sets for a test process.
/// ring's build script watches `CARGO_MANIFEST_DIR`: a cargo started from a
/// test saw it set, re-ran that script and rebuilt ring, rustls, kube-client,
/// bollard and drivelab (~70 s of 2 cores), and the next `make` step, without
/// it, rebuilt them back.
fn cargo_as_make_runs_it(cmd: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let set_for_tests = matches!(
            key,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_BIN_NAME"
                | "CARGO_RUSTC_CURRENT_DIR"
        ) || key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_BIN_EXE_");
        if set_for_tests {
            cmd.env_remove(key);
        }
    }
    cmd
}

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
        let status = Command::new(cargo)
            .args(["test", "--locked", "--workspace", "--no-run", "--quiet"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("running cargo test --workspace --no-run");
        assert!(status.success(), "cargo test --workspace --no-run failed");
    });
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}

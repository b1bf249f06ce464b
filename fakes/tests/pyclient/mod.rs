//! Shared by the tests that run third-party Python clients against a fake:
//! find the interpreter, refuse plainly when a package is missing (never a
//! skip), and run pytest from the workspace root with the fake's endpoints.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

/// The interpreter: `DRIVELAB_PYTHON`, else `python3`.
pub fn python() -> String {
    std::env::var("DRIVELAB_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Panic with the fix unless `import <imports>` works.
pub async fn require(imports: &str) {
    let probe = tokio::process::Command::new(python())
        .args(["-c", &format!("import {imports}")])
        .output()
        .await;
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "Python packages are missing ({}): run `pip install -r tests/python/requirements.txt`",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!(
            "cannot run {} ({e}): install Python 3, then `pip install -r tests/python/requirements.txt`",
            python()
        ),
    }
}

/// Run pytest on `files` (paths from the workspace root) with `env`, within
/// `limit`; print its output, assert it passed, and return its stdout.
pub async fn pytest(files: &[&str], env: &[(&str, String)], limit: Duration) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let run = tokio::process::Command::new(python())
        .args(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"])
        .args(files)
        .current_dir(&root)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(limit, run)
        .await
        .unwrap_or_else(|_| panic!("pytest did not finish within {limit:?}"))
        .expect("pytest could not be started");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(
        out.status.success(),
        "pytest failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

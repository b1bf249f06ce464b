//! Runs clients nobody here wrote (boto3, minio-py's MinioAdmin, the aws CLI)
//! against the S3 fake on real loopback listeners, one per backend profile:
//! `tests/python/test_s3_clients.py` and `test_s3_fidelity.py`.
//! Missing Python packages fail this test; they never skip it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use drivelab_fakes::clock::SimClock;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::s3::{Backend, S3Config, S3Fake};
use drivelab_fakes::serve::loopback;
use drivelab_fakes::store::MemStore;

fn python() -> String {
    std::env::var("DRIVELAB_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boto3_and_minio_admin_against_the_fake() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let probe = tokio::process::Command::new(python())
        .args([
            "-c",
            "import boto3, botocore, minio, minio.minioadmin, pytest, argon2, Crypto",
        ])
        .output()
        .await;
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "the Python clients are missing ({}): run `pip install -r tests/python/requirements.txt`",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("cannot run {} ({e}): install Python 3, then `pip install -r tests/python/requirements.txt`", python()),
    }

    let config = S3Config {
        admin_access_key: "drivelabroot".into(),
        admin_secret_key: "drivelab-root-secret".into(),
        // None configured: any signing region is accepted (as MinIO does).
        region: String::new(),
        backend: Backend::Rustfs,
    };
    let history = History::new(SimClock::new());
    let fake = S3Fake::new(
        Arc::new(MemStore::default()),
        Gate::new(history.clone()),
        config.clone(),
    )
    .unwrap();
    let listener = fake.serve(loopback()).await.unwrap();
    let minio = S3Fake::new(
        Arc::new(MemStore::default()),
        Gate::new(history.clone()),
        S3Config {
            backend: Backend::Minio,
            ..config.clone()
        },
    )
    .unwrap();
    let minio_listener = minio.serve(loopback()).await.unwrap();

    let run = tokio::process::Command::new(python())
        .args([
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests/python/test_s3_clients.py",
            "tests/python/test_s3_fidelity.py",
        ])
        .current_dir(&root)
        .env("S3_ENDPOINT", listener.url())
        .env("S3_MINIO_ENDPOINT", minio_listener.url())
        .env("S3_ADMIN_ACCESS_KEY", &config.admin_access_key)
        .env("S3_ADMIN_SECRET_KEY", &config.admin_secret_key)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .expect("pytest did not finish within 10 minutes")
        .expect("pytest could not be started");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(
        out.status.success(),
        "pytest failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // The only skip allowed is the aws CLI's, and it says so plainly.
    let skips_ok = stdout
        .lines()
        .filter(|l| l.starts_with("SKIPPED"))
        .all(|l| l.contains("aws CLI is not installed"));
    assert!(
        stdout.contains("passed") && skips_ok,
        "pytest ran no test or skipped some:\n{stdout}"
    );
    // Every client request went through the gate.
    assert!(history.len() > 20, "only {} events recorded", history.len());
    listener.stop().await;
    minio_listener.stop().await;
}

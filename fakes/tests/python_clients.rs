//! Runs clients nobody here wrote (boto3, minio-py's MinioAdmin, the aws CLI)
//! against the S3 fake on real loopback listeners, one per backend profile:
//! `tests/python/test_s3_clients.py` and `test_s3_fidelity.py`.
//! Missing Python packages fail this test; they never skip it.

mod pyclient;

use std::sync::Arc;
use std::time::Duration;

use drivelab_fakes::clock::SimClock;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::s3::{Backend, S3Config, S3Fake};
use drivelab_fakes::serve::loopback;
use drivelab_fakes::store::MemStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boto3_and_minio_admin_against_the_fake() {
    pyclient::require("boto3, botocore, minio, minio.minioadmin, pytest, argon2, Crypto").await;

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

    let stdout = pyclient::pytest(
        &[
            "tests/python/test_s3_clients.py",
            "tests/python/test_s3_fidelity.py",
        ],
        &[
            ("S3_ENDPOINT", listener.url()),
            ("S3_MINIO_ENDPOINT", minio_listener.url()),
            ("S3_ADMIN_ACCESS_KEY", config.admin_access_key.clone()),
            ("S3_ADMIN_SECRET_KEY", config.admin_secret_key.clone()),
        ],
        Duration::from_secs(600),
    )
    .await;
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

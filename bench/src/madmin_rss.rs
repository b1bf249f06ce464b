//! Peak RSS of the S3 fake while N madmin-encrypted admin calls (add-user on
//! `/minio/admin/v3`) are in flight at once: each one's Argon2id key
//! derivation takes 64 MiB, so without a bound N calls take N × 64 MiB
//! (48 took 2.5 GB, issue 19). The fake bounds them (`madmin::KDF_CONCURRENCY`).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::s3::{madmin, Backend, S3Config, S3Fake, S3Probe};
use drivelab_fakes::serve::loopback;
use drivelab_fakes::store::MemStore;
use serde_json::{json, Value};

use crate::measure::peak_rss_mib;

const AK: &str = "benchadmin";
const SK: &str = "bench-admin-secret";

fn current_rss_mib() -> f64 {
    crate::measure::rss_mib_of(std::process::id()).unwrap_or(f64::NAN)
}

/// `n` concurrent encrypted add-user calls; peak RSS measured from a reset
/// high-water mark, so the client's one key derivation before it is not counted.
pub async fn run(n: usize) -> anyhow::Result<Value> {
    let cfg = S3Config {
        admin_access_key: AK.into(),
        admin_secret_key: SK.into(),
        region: String::new(),
        backend: Backend::Minio,
    };
    let fake = S3Fake::new(
        Arc::new(MemStore::default()),
        Gate::new(History::new(SimClock::new())),
        cfg,
    )?;
    let listener = fake.serve(loopback()).await?;
    let probe = Arc::new(S3Probe::new(listener.url(), "us-east-1"));
    // One body for every call: the server derives the key again for each.
    let plain = br#"{"secretKey":"bench-user-secret","status":"enabled"}"#.to_vec();
    let body = tokio::task::spawn_blocking(move || madmin::encrypt(SK, &plain)).await??;
    // "5" resets VmHWM to the current RSS (Linux >= 4.0; proc(5) clear_refs).
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = current_rss_mib();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let (probe, body) = (probe.clone(), body.clone());
        tasks.spawn(async move {
            probe
                .send(
                    "PUT",
                    &format!("/minio/admin/v3/add-user?accessKey=bench-user-{i}"),
                    AK,
                    SK,
                    body,
                )
                .await
        });
    }
    let mut ok = 0;
    while let Some(r) = tasks.join_next().await {
        let reply = r.context("a call panicked")??;
        anyhow::ensure!(
            reply.status == 200,
            "add-user answered {} {:?}",
            reply.status,
            reply.code
        );
        ok += 1;
    }
    let wall = started.elapsed().as_secs_f64();
    listener.stop().await;
    Ok(json!({
        "calls": n,
        "succeeded": ok,
        "kdf_concurrency": madmin::KDF_CONCURRENCY,
        "rss_before_mib": before,
        "peak_rss_mib": peak_rss_mib(),
        "peak_counts_from_before": reset,
        "wall_s": wall,
    }))
}

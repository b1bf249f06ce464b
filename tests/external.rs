//! External drivers: the reference COSI driver as a spawned binary through the
//! whole suite (same verdicts, same ownership snapshots as built in); drivers
//! that exit at start, never open their socket, or hang on DriverGetInfo;
//! `drivelab serve` end to end; and, with a Docker engine, `image:` drivers.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use drivelab::engine::{self, RunOptions, RunOutcome};
use drivelab::scenario::{self, driver::parse_cli, Scenario};

mod common;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn load(rel: &str) -> Scenario {
    scenario::load(&root().join("scenarios").join(rel)).unwrap_or_else(|e| panic!("{e}"))
}

/// The `cosi-s3` binary next to `drivelab` (see `common::workspace_bin`).
fn cosi_s3_bin() -> PathBuf {
    common::workspace_bin("cosi-s3")
}

async fn run_with(scn: &Scenario, driver: Option<&str>) -> anyhow::Result<RunOutcome> {
    drivelab::logcap::init(false);
    let mut scn = scn.clone();
    if let Some(d) = driver {
        let spec = parse_cli(d).unwrap_or_else(|e| panic!("{e}"));
        scn.driver.launch = spec.launch;
        scn.driver.start_timeout = spec.start_timeout;
    }
    engine::run(&scn, &RunOptions::default()).await
}

fn verdicts(o: &RunOutcome) -> Vec<(String, bool)> {
    o.verdicts
        .iter()
        .map(|v| (v.invariant.to_string(), v.passed))
        .collect()
}

/// The command declaration for the spawned reference driver: it finds the fake
/// Kubernetes API through the KUBECONFIG the lab sets, as kube-rs does.
fn spawned_cosi_s3() -> String {
    format!(
        r#"{{command: ["{}", --endpoint, "{{endpoint}}"], env: {{RUST_LOG: info}}}}"#,
        cosi_s3_bin().display()
    )
}

/// The spawned reference driver with 64-character secrets: neither RustFS nor
/// MinIO caps add-user secrets at 40, so a correct driver with longer ones
/// must pass every scenario as the builtin (40) does (issue 19).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_reference_driver_with_64_character_secrets_matches_the_builtin_on_every_scenario()
{
    let driver = format!(
        r#"{{command: ["{}", --endpoint, "{{endpoint}}", --secret-length, "64"], env: {{RUST_LOG: info}}}}"#,
        cosi_s3_bin().display()
    );
    let files = scenario::discover(&[root().join("scenarios/cosi")]).unwrap();
    assert!(files.len() >= 20, "{files:?}");
    let mut compared = 0;
    for f in files {
        let scn = scenario::load(&f).unwrap_or_else(|e| panic!("{e}"));
        let builtin = run_with(&scn, None)
            .await
            .unwrap_or_else(|e| panic!("{}: {e:#}", scn.name));
        let spawned = run_with(&scn, Some(&driver))
            .await
            .unwrap_or_else(|e| panic!("{} (spawned): {e:#}", scn.name));
        assert_eq!(spawned.driver_name, builtin.driver_name, "{}", scn.name);
        assert_eq!(
            verdicts(&spawned),
            verdicts(&builtin),
            "{}: verdicts differ",
            scn.name
        );
        assert_eq!(spawned.passed(), builtin.passed(), "{}", scn.name);
        assert_eq!(
            spawned.expect_failures, builtin.expect_failures,
            "{}: expectations differ",
            scn.name
        );
        assert_eq!(
            spawned.snapshot.text(),
            builtin.snapshot.text(),
            "{}: ownership snapshots differ",
            scn.name
        );
        compared += 1;
    }
    assert!(compared >= 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_driver_output_is_in_the_history_redacted_and_crash_respawns_it() {
    let scn = load("cosi/crash-after-add-user.yaml");
    let o = run_with(&scn, Some(&spawned_cosi_s3())).await.unwrap();
    assert!(o.passed(), "{}", drivelab::report::console(&o));
    let notes: Vec<String> = o
        .history
        .iter()
        .filter_map(|e| match e.kind {
            drivelab_fakes::history::EventKind::Note { component, text }
                if component == drivelab_fakes::history::Component::Driver =>
            {
                Some(text)
            }
            _ => None,
        })
        .collect();
    // Two starts (the crash respawned it), each announcing its socket, redacted.
    let serving: Vec<&String> = notes
        .iter()
        .filter(|t| t.contains("serving COSI"))
        .collect();
    assert_eq!(serving.len(), 2, "{notes:#?}");
    assert!(
        serving
            .iter()
            .all(|t| t.contains("<run-dir>/driver/cosi.sock")),
        "{serving:?}"
    );
    assert!(
        !o.history_text.text().contains("/tmp/"),
        "an absolute path reached the history"
    );
    assert!(
        !notes.iter().any(|t| t.contains('\u{1b}')),
        "ANSI escapes kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_exits_at_start_is_reported_with_its_output() {
    let scn = load("cosi/happy-path.yaml");
    let e = run_with(&scn, Some("command: [/bin/false]"))
        .await
        .unwrap_err();
    let msg = format!("{e:#}");
    assert!(msg.contains("exited with status 1"), "{msg}");
    assert!(msg.contains("<run-dir>/driver/cosi.sock"), "{msg}");
    assert!(msg.contains("command: /bin/false"), "{msg}");

    let e = run_with(
        &scn,
        Some(r#"command: [sh, -c, "echo bad flag --zap >&2; exit 3"]"#),
    )
    .await
    .unwrap_err();
    let msg = format!("{e:#}");
    assert!(msg.contains("exited with status 3"), "{msg}");
    assert!(msg.contains("stderr: bad flag --zap"), "{msg}");

    let e = run_with(&scn, Some("command: [/nonexistent/driver]"))
        .await
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("cannot start the driver"),
        "{e:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_never_opens_its_socket_times_out_clearly() {
    let scn = load("cosi/happy-path.yaml");
    let t0 = std::time::Instant::now();
    let e = run_with(
        &scn,
        Some(r#"{command: [sh, -c, "echo starting up; exec sleep 60"], start_timeout: 1s}"#),
    )
    .await
    .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("did not open its socket <run-dir>/driver/cosi.sock within 1s"),
        "{msg}"
    );
    assert!(msg.contains("stdout: starting up"), "{msg}");
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_hangs_on_driver_get_info_hits_the_deadline() {
    // Accepts connections on the socket and never answers.
    let script = r#"import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1]); s.listen(16)
print("listening", flush=True)
held = []
while True:
    c, _ = s.accept(); held.append(c)
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hang.py");
    std::fs::write(&path, script).unwrap();
    let scn = load("cosi/happy-path.yaml");
    let e = run_with(
        &scn,
        Some(&format!(
            r#"{{command: [python3, "{}", "{{socket}}"], start_timeout: 2s}}"#,
            path.display()
        )),
    )
    .await
    .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("accepted connections on its socket <run-dir>/driver/cosi.sock but DriverGetInfo did not answer within 2s"),
        "{msg}"
    );
    assert!(msg.contains("stdout: listening"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutants_are_builtin_only() {
    let mut scn = load("cosi/happy-path.yaml");
    scn.driver.mutants = vec![drivelab::scenario::Mutant::Cosi(
        cosi_s3::Mutant::RotateOnRetry,
    )];
    let e = run_with(&scn, Some("command: [/bin/true]"))
        .await
        .unwrap_err();
    assert!(format!("{e:#}").contains("builtin-only"), "{e:#}");
}

#[test]
fn cli_reports_a_failing_driver_and_goes_on_with_the_next_scenario() {
    let out = Command::new(env!("CARGO_BIN_EXE_drivelab"))
        .current_dir(root())
        .args([
            "run",
            "scenarios/cosi/happy-path.yaml",
            "scenarios/cosi/retried-grant.yaml",
            "--driver",
            "command: [/bin/false]",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    let errors = stdout.lines().filter(|l| l.starts_with("ERROR ")).count();
    assert_eq!(
        errors, 2,
        "both scenarios reported, the second after the first: {stdout}"
    );
    assert!(stdout.contains("0 passed, 2 failed"), "{stdout}");
    assert!(stdout.contains("exited with status 1"), "{stdout}");
    assert!(
        stdout.contains("--driver '{ command: [/bin/false] }'"),
        "replay lacks --driver: {stdout}"
    );
    let bad = Command::new(env!("CARGO_BIN_EXE_drivelab"))
        .current_dir(root())
        .args([
            "run",
            "scenarios/cosi/happy-path.yaml",
            "--driver",
            "command: []",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("`command` is empty"));
}

/// Lines of `drivelab serve` up to `ready`, as key → value.
fn read_serve_banner(
    child: &mut std::process::Child,
) -> std::collections::BTreeMap<String, String> {
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    let mut out = std::collections::BTreeMap::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line == "ready" {
            break;
        }
        if let Some((k, v)) = line.split_once(": ") {
            out.insert(k.to_string(), v.to_string());
        }
    }
    // Keep reading in the background so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        std::fs::write(
            std::env::temp_dir().join(format!("serve-tail-{}", std::process::id())),
            rest.join("\n"),
        )
        .ok();
    });
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_exposes_the_fakes_until_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("lab.yaml");
    std::fs::write(
        &cfg,
        "users:\n  - { access_key: app-key, secret_key: app-secret-123, buckets: [photos] }\nbuckets: [photos, other]\nbucket_classes:\n  - { name: standard, deletion_policy: Delete }\n",
    )
    .unwrap();
    let faults = dir.path().join("faults.yaml");
    std::fs::write(
        &faults,
        "faults:\n  - error: { on: s3.put_object, nth: 2, status: 503, code: SlowDown }\n",
    )
    .unwrap();
    // Wall-clock instants as the API writes them (RFC 3339 UTC seconds sort as text).
    let wall_now = || {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        drivelab_fakes::clock::SimClock::following(ms, std::sync::Arc::new(|| Duration::ZERO))
            .rfc3339(0)
    };
    let started = wall_now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_drivelab"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .arg("--faults")
        .arg(&faults)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let banner = read_serve_banner(&mut child);
    let s3 = banner["s3_endpoint"].clone();
    let kube = banner["kube_url"].clone();
    assert!(s3.starts_with("http://127.0.0.1:"), "{banner:?}");
    assert_eq!(banner["faults_armed"], "1");
    let admin_secret = banner["admin_secret_key"].clone();
    assert_eq!(admin_secret.len(), 40);

    // Real SigV4-signed requests.
    let probe = drivelab_fakes::s3::S3Probe::new(&s3, "us-east-1");
    let put = |key: &'static str, secret: String, bucket: &'static str| {
        let probe = &probe;
        async move {
            probe
                .put_object(key, &secret, bucket, "hello.txt", b"hi".to_vec())
                .await
                .unwrap()
        }
    };
    assert_eq!(
        put("app-key", "app-secret-123".into(), "photos")
            .await
            .status,
        200
    );
    let faulted = put("app-key", "app-secret-123".into(), "photos").await;
    assert_eq!(
        (faulted.status, faulted.code.as_deref()),
        (503, Some("SlowDown")),
        "the armed fault"
    );
    assert_eq!(
        put("app-key", "app-secret-123".into(), "other")
            .await
            .status,
        403,
        "policy scoped to photos"
    );
    assert_eq!(
        put("app-key", "wrong-secret-1".into(), "photos")
            .await
            .code
            .as_deref(),
        Some("SignatureDoesNotMatch")
    );
    assert_eq!(
        put("drivelab-admin", admin_secret.clone(), "other")
            .await
            .status,
        200
    );

    // The Kubernetes API is https under the session's CA, and authenticates:
    // no token or one it never issued is 401; the driver's token (the one in
    // `kubeconfig`) reads the admin Secret, as a COSI driver's RBAC allows,
    // but not the BucketClass it does not manage.
    assert!(kube.starts_with("https://127.0.0.1:"), "{banner:?}");
    let ca = std::fs::read_to_string(&banner["kube_ca_file"]).unwrap();
    let get = |path: &'static str, token: Option<String>| {
        let (kube, ca) = (kube.clone(), ca.clone());
        async move {
            drivelab_fakes::tls::get(&kube, path, token.as_deref(), &ca)
                .await
                .unwrap()
        }
    };
    let secret_path = "/api/v1/namespaces/drivelab-system/secrets/s3-admin";
    let class_path = "/apis/objectstorage.k8s.io/v1alpha1/bucketclasses/standard";
    assert_eq!(get(secret_path, None).await.0, 401);
    assert_eq!(get(secret_path, Some("made-up".into())).await.0, 401);
    let driver_token = banner["kube_token"].clone();
    let (status, body) = get(secret_path, Some(driver_token.clone())).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"secretKey\""), "{body}");
    let (status, body) = get(class_path, Some(driver_token.clone())).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("cannot get resource \\\"bucketclasses\\\""),
        "{body}"
    );
    // Its own namespace (where it keeps state) is its to use; another is not.
    let own = "/api/v1/namespaces/cosi-s3-system/configmaps";
    let (status, body) = get(own, Some(driver_token.clone())).await;
    assert_eq!(status, 200, "{body}");
    let other = "/api/v1/namespaces/default/configmaps";
    let (status, body) = get(other, Some(driver_token.clone())).await;
    assert_eq!(status, 403, "{body}");
    let kc = std::fs::read_to_string(&banner["kubeconfig"]).unwrap();
    assert!(kc.contains(&format!("server: {kube}")), "{kc}");
    assert!(kc.contains(&format!("token: {driver_token}")), "{kc}");
    // The operator's kubeconfig is cluster-admin.
    let admin_kc = std::fs::read_to_string(&banner["admin_kubeconfig"]).unwrap();
    let admin_token = admin_kc
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .expect("a token in the admin kubeconfig");
    let (status, body) = get(class_path, Some(admin_token.to_string())).await;
    assert_eq!(status, 200, "{body}");
    // serve's clock is the wall clock (a run's starts at 2025-01-01 and moves
    // only with its schedule): the admin Secret was created while serve started.
    let (status, body) = get(secret_path, Some(admin_token.to_string())).await;
    assert_eq!(status, 200, "{body}");
    let json = body
        .split_once("\r\n\r\n")
        .map_or(body.as_str(), |(_, b)| b);
    let created: serde_json::Value = serde_json::from_str(json).unwrap();
    let created = created["metadata"]["creationTimestamp"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        started <= created && created <= wall_now(),
        "creationTimestamp {created} is not between serve's start {started} and now"
    );

    // SIGINT: a clean stop.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
    let status = wait_timeout(&mut child, Duration::from_secs(20));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "serve did not exit cleanly on SIGINT"
    );
    assert!(
        !Path::new(&banner["kubeconfig"]).exists(),
        "the session dir was not removed"
    );
}

#[test]
fn serve_rejects_bad_config_with_file_line_col() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(
        &cfg,
        "users:\n  - { access_key: x, secret_key: app-secret-123 }\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_drivelab"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml:2:"), "{err}");
    assert!(err.contains("access key `x` is invalid"), "{err}");
}

fn wait_timeout(child: &mut std::process::Child, t: Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + t;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Is a Docker engine reachable? (`docker info` exits 0.)
fn docker_available() -> bool {
    Command::new("docker")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine; run by `make test-containers`, which says SKIPPED without one"]
async fn container_image_driver_and_lab_container() {
    if !docker_available() {
        println!("SKIPPED: container_image_driver_and_lab_container: no Docker engine (`docker info` failed); the image: path was NOT tested");
        return;
    }
    let tag = "external-test";
    let status = Command::new(root().join("scripts/build-image.sh"))
        .env("TAG", tag)
        // The binary this test build made: the images hold what the suite tested.
        .env("DRIVELAB_BIN", env!("CARGO_BIN_EXE_drivelab"))
        .current_dir(root())
        .status()
        .expect("running scripts/build-image.sh");
    assert!(status.success(), "scripts/build-image.sh failed");

    // The reference driver as an image, through scenarios with and without a crash.
    let driver = format!(
        r#"{{image: "drivelab-cosi-s3:{tag}", args: [--endpoint, "{{endpoint}}", --kube-url, "{{kube_url}}", --kube-token-file, "{{kube_token_file}}", --kube-ca-file, "{{kube_ca_file}}"], start_timeout: 30s}}"#
    );
    for rel in [
        "cosi/happy-path.yaml",
        "cosi/crash-after-add-user.yaml",
        "cosi/retried-grant.yaml",
    ] {
        let scn = load(rel);
        let builtin = run_with(&scn, None).await.unwrap();
        let boxed = run_with(&scn, Some(&driver))
            .await
            .unwrap_or_else(|e| panic!("{rel} (image): {e:#}"));
        assert_eq!(verdicts(&boxed), verdicts(&builtin), "{rel}");
        assert_eq!(
            boxed.snapshot.text(),
            builtin.snapshot.text(),
            "{rel}: snapshots differ"
        );
        assert!(boxed.passed(), "{}", drivelab::report::console(&boxed));
        println!("container: {rel} passed through image drivelab-cosi-s3:{tag}");
    }
    // A CSI driver as an image: the reference bosh-csi (`drivelab driver bosh-csi`
    // in the lab's image), one container for the controller and one per node,
    // each on its own socket, against the BOSH backend; a crash restarts the
    // controller's container. Same verdicts and ownership as built in.
    let csi_driver = format!(
        r#"{{image: "drivelab:{tag}", args: [driver, bosh-csi, --endpoint, "{{endpoint}}",
            --mode, "{{mode}}", --director-url, "{{director_url}}", --client-id, "{{client_id}}",
            --node-id, "{{node_id}}", --mounter-url, "{{mounter_url}}",
            --block-api-url, "{{block_api_url}}", --task-timeout, "{{task_timeout}}",
            --poll-interval, "{{poll_interval}}"],
          env: {{BOSH_CLIENT_SECRET: "{{client_secret}}", BLOCK_API_CREDENTIAL: "{{block_api_credential}}"}},
          protocol: csi, start_timeout: 30s}}"#
    );
    for rel in [
        "bosh/lifecycle.yaml",
        "bosh/controller-crash-after-create.yaml",
        "bosh/read-only.yaml",
    ] {
        let scn = load(rel);
        let builtin = run_with(&scn, None).await.unwrap();
        let boxed = run_with(&scn, Some(&csi_driver))
            .await
            .unwrap_or_else(|e| panic!("{rel} (CSI image): {e:#}"));
        assert_eq!(verdicts(&boxed), verdicts(&builtin), "{rel}");
        assert_eq!(
            boxed.snapshot.text(),
            builtin.snapshot.text(),
            "{rel}: snapshots differ"
        );
        assert!(boxed.passed(), "{}", drivelab::report::console(&boxed));
        println!("container: {rel} passed through image drivelab:{tag} (driver bosh-csi)");
    }

    // An image that is not there: a clear error, nothing pulled.
    let e = run_with(
        &load("cosi/happy-path.yaml"),
        Some("image: drivelab-no-such-image:none"),
    )
    .await
    .unwrap_err();
    assert!(format!("{e:#}").contains("nothing is pulled"), "{e:#}");

    // The lab itself in a container, through drivelab::testcontainers.
    let lab = drivelab::testcontainers::LabContainer::start(
        &format!("drivelab:{tag}"),
        Some("buckets: [photos]\n"),
    )
    .await
    .expect("lab container");
    let probe = drivelab_fakes::s3::S3Probe::new(&lab.s3_url, "us-east-1");
    let r = probe
        .put_object(
            &lab.admin_access_key,
            lab.admin_secret.expose(),
            "photos",
            "x",
            b"x".to_vec(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let (status, _) = drivelab_fakes::tls::get(
        &lab.kube_url,
        "/api/v1/namespaces/drivelab-system/secrets/s3-admin",
        Some(lab.kube_token.expose()),
        &lab.kube_ca_pem,
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    lab.stop().await.unwrap();
    println!(
        "container: drivelab:{tag} served S3 and the Kubernetes API from a FROM scratch image"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_logs_the_admin_secret_fails_no_secret_leak_and_the_history_is_redacted() {
    let scn = load("cosi/happy-path.yaml");
    let driver = format!(
        r#"{{command: [sh, -c, "echo admin key is {{admin_secret_key}} >&2; exec {} --endpoint {{endpoint}}"]}}"#,
        cosi_s3_bin().display()
    );
    let o = run_with(&scn, Some(&driver)).await.unwrap();
    let leak = o
        .verdicts
        .iter()
        .find(|v| v.invariant == "no-secret-leak")
        .expect("no-secret-leak checked");
    assert!(
        !leak.passed,
        "a logged admin secret went unnoticed: {leak:?}"
    );
    assert!(
        o.history_text
            .text()
            .contains("admin key is <admin-secret>"),
        "note not redacted"
    );
    // The clean run of the same driver passes it.
    let clean = run_with(&scn, Some(&spawned_cosi_s3())).await.unwrap();
    assert!(clean.passed(), "{}", drivelab::report::console(&clean));
}

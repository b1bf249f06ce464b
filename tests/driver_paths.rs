//! The driver under test is never swapped: external CSI drivers in the
//! BOSH/CSI lab (a controller process and one node process per node), drivers
//! that cannot start failing every BOSH/CSI scenario with the reason, the
//! reference bosh-csi as a spawned binary matching the built-in run, and
//! `--driver` carried by `run --seeds` and every replay line.

use std::path::{Path, PathBuf};
use std::process::Command;

use drivelab::engine::{self, RunOptions, RunOutcome};
use drivelab::scenario::{self, driver::parse_cli, Scenario};

mod common;
use common::workspace_bin;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every scenario of the BOSH/CSI system.
fn bosh_scenarios() -> Vec<Scenario> {
    let files = scenario::discover(&[
        root().join("scenarios/bosh"),
        root().join("scenarios/csi"),
        root().join("scenarios/csi-spec/bosh-csi.yaml"),
    ])
    .unwrap();
    assert!(files.len() >= 20, "{files:?}");
    files
        .iter()
        .map(|f| scenario::load(f).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// The reference bosh-csi as an external CSI driver: one declaration, the lab
/// starts it as the controller and once per node.
fn spawned_bosh_csi(extra: &str) -> String {
    format!(
        r#"{{command: ["{}", --endpoint, "{{endpoint}}", --mode, "{{mode}}",
            --director-url, "{{director_url}}", --client-id, "{{client_id}}",
            --node-id, "{{node_id}}", --mounter-url, "{{mounter_url}}",
            --block-api-url, "{{block_api_url}}", --task-timeout, "{{task_timeout}}",
            --poll-interval, "{{poll_interval}}", --http-timeout, 2s,
            --max-volumes-per-node, "{{max_volumes_per_node}}"{extra}],
          env: {{BOSH_CLIENT_SECRET: "{{client_secret}}", BLOCK_API_CREDENTIAL: "{{block_api_credential}}"}},
          protocol: csi}}"#,
        workspace_bin("bosh-csi").display()
    )
}

async fn run_with(scn: &Scenario, driver: Option<&str>) -> anyhow::Result<RunOutcome> {
    drivelab::logcap::init(false);
    let mut scn = scn.clone();
    if let Some(d) = driver {
        let spec = parse_cli(d).unwrap_or_else(|e| panic!("{e}"));
        scn.driver.launch = spec.launch;
        scn.driver.start_timeout = spec.start_timeout;
        scn.driver.from_flag = true;
    }
    engine::run(&scn, &RunOptions::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csi_driver_that_cannot_start_fails_every_bosh_scenario_with_the_reason() {
    let exits = r#"{command: [sh, -c, "echo 'no backend configured' >&2; exit 3"], protocol: csi}"#;
    for (driver, reason) in [
        (
            "{command: [/bin/false], protocol: csi}",
            "exited with status 1",
        ),
        (exits, "exited with status 3"),
    ] {
        for scn in bosh_scenarios() {
            let e = match run_with(&scn, Some(driver)).await {
                Ok(o) => panic!(
                    "{} ran with {driver} and said {}: the lab drove something else",
                    scn.name,
                    if o.passed() { "PASS" } else { "FAIL" }
                ),
                Err(e) => format!("{e:#}"),
            };
            assert!(e.contains(reason), "{}: {e}", scn.name);
            assert!(e.contains("CSI controller"), "{}: {e}", scn.name);
        }
    }
    let e = run_with(&bosh_scenarios()[0], Some(exits))
        .await
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("no backend configured"),
        "the driver's last output is quoted: {e:#}"
    );
}

fn verdicts(o: &RunOutcome) -> Vec<(String, bool)> {
    o.verdicts
        .iter()
        .map(|v| (v.invariant.to_string(), v.passed))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_bosh_csi_matches_the_builtin_on_every_scenario() {
    let driver = spawned_bosh_csi("");
    let mut compared = Vec::new();
    for scn in bosh_scenarios() {
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
        assert!(spawned.replay.contains("--driver '"), "{}", spawned.replay);
        compared.push(scn.name.clone());
    }
    assert!(compared.len() >= 20, "{compared:?}");
}

#[test]
fn cli_never_substitutes_the_driver() {
    let drivelab = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_drivelab"))
            .current_dir(root())
            .args(args)
            .arg("--no-record")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    // A BOSH scenario with a CSI command that cannot run: the scenario did
    // not run (exit 2, as for any scenario that produced no verdicts), and
    // never the reference driver's PASS.
    let (code, out) = drivelab(&[
        "run",
        "scenarios/bosh/lifecycle.yaml",
        "--driver",
        "{command: [/bin/false], protocol: csi}",
    ]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("did not run"), "{out}");
    assert!(out.contains("exited with status 1"), "{out}");
    assert!(!out.contains("PASS"), "{out}");
    assert!(out.contains("0 passed, 1 failed"), "{out}");
    assert!(
        out.contains("--driver '{ command: [/bin/false], protocol: csi }'"),
        "the replay names the driver: {out}"
    );
    // A driver that speaks the other protocol is refused with the reason.
    let (code, out) = drivelab(&[
        "run",
        "scenarios/hostpath/lifecycle.yaml",
        "--driver",
        "{command: [/bin/true]}",
    ]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("speaks cosi, but this scenario drives a csi driver"),
        "{out}"
    );
    // --seeds carries --driver too.
    let (code, out) = drivelab(&[
        "run",
        "--seeds",
        "3",
        "scenarios/cosi/happy-path.yaml",
        "--driver",
        "{command: [/bin/false]}",
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("0 passed, 3 failed"), "{out}");
    assert!(out.contains("exited with status 1"), "{out}");
    assert!(
        out.contains("--driver '{ command: [/bin/false] }'"),
        "{out}"
    );
}

#[test]
fn a_sweep_writes_failing_runs_and_an_index_naming_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_drivelab"))
        .current_dir(root())
        .args(["run", "--seeds", "2", "scenarios/cosi/happy-path.yaml"])
        .args(["--driver", "{command: [/bin/false]}", "--report-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert!(summary.contains("--seeds 2"), "{summary}");
    assert!(
        summary.contains("--driver '{ command: [/bin/false] }'"),
        "{summary}"
    );
    for seed in [1, 2] {
        let d = dir.path().join(format!("cosi-happy-path-seed-{seed}"));
        assert!(d.join("junit.xml").exists(), "{}", d.display());
        let junit = std::fs::read_to_string(d.join("junit.xml")).unwrap();
        assert!(junit.contains("--driver"), "{junit}");
    }
}

#[test]
fn explore_with_an_external_mutant_writes_a_found_file_that_names_it() {
    let cosi = workspace_bin("cosi-s3");
    let driver = |mutant: &str| {
        format!(
            r#"{{command: ["{}", --endpoint, "{{endpoint}}"{mutant}]}}"#,
            cosi.display()
        )
    };
    let mutant = driver(", --mutant, shared-preferred-key");
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_drivelab"))
        .current_dir(root())
        .args([
            "explore",
            "scenarios/explore/cosi-lifecycle.yaml",
            "--seed",
            "1",
        ])
        .args([
            "--cases",
            "200",
            "--time-budget",
            "300s",
            "--driver",
            &mutant,
        ])
        .arg("--out-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FOUND after"), "{stdout}");
    let found: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    let text = std::fs::read_to_string(&found[0]).unwrap();
    assert!(text.contains("shared-preferred-key"), "{text}");
    assert!(text.contains(&cosi.display().to_string()), "{text}");
    assert!(!text.contains("builtin"), "{text}");
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_drivelab"))
            .current_dir(root())
            .arg("run")
            .arg(&found[0])
            .args(extra)
            .arg("--no-record")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    // Replayed as written: the mutant binary again, and it fails again.
    let (code, out) = run(&[]);
    assert_eq!(code, Some(1), "{out}");
    // The correct binary passes the same schedule.
    let (code, out) = run(&["--driver", &driver("")]);
    assert_eq!(code, Some(0), "{out}");
}

/// Every seeded bug of bosh-csi, switched on in the spawned binary
/// (`--mutant X` on its command line, not the lab's), is killed by the scenario
/// that kills it built in: the lab judges the external process, not a copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bosh_csi_mutant_is_killed_as_a_spawned_binary() {
    use drivelab::scenario::Mutant;
    let mut scenarios = bosh_scenarios();
    scenarios.sort_by_key(|s| s.steps.len());
    let mutants: Vec<Mutant> = Mutant::all()
        .into_iter()
        .filter(|m| m.driver().name() == "bosh-csi")
        .collect();
    assert!(mutants.len() >= 9, "{mutants:?}");
    for m in mutants {
        let mut killer = None;
        for scn in &scenarios {
            let opts = RunOptions {
                mutants: vec![m],
                ..Default::default()
            };
            let o = engine::run(scn, &opts).await.unwrap();
            if !o.passed() {
                killer = Some(scn);
                break;
            }
        }
        let scn = killer.unwrap_or_else(|| panic!("no scenario kills {} built in", m.name()));
        let driver = spawned_bosh_csi(&format!(", --mutant, {}", m.name()));
        let o = run_with(scn, Some(&driver))
            .await
            .unwrap_or_else(|e| panic!("{} with {}: {e:#}", scn.name, m.name()));
        assert!(
            !o.passed(),
            "the spawned binary with --mutant {} passed {}, which kills it built in",
            m.name(),
            scn.name
        );
    }
}

/// `drivelab serve --system csi` is enough to run the reference bosh-csi
/// binary by hand: its controller and node plugin, pointed at what the banner
/// prints, create, publish, stage and delete a volume over plain gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_csi_backs_the_bosh_csi_binary_over_plain_grpc() {
    use drivelab_proto::csi::controller_client::ControllerClient;
    use drivelab_proto::csi::node_client::NodeClient;
    use drivelab_proto::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType};
    use drivelab_proto::csi::*;
    use std::io::BufRead;
    let mut serve = Command::new(env!("CARGO_BIN_EXE_drivelab"))
        .args(["serve", "--system", "csi"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut banner = std::collections::BTreeMap::new();
    let stdout = serve.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line == "ready" {
            break;
        }
        if let Some((k, v)) = line.split_once(": ") {
            banner.insert(k.to_string(), v.to_string());
        }
    }
    let (node_id, mounter) = {
        let v = &banner["node node-0"];
        let (id, url) = v.split_once(" mounter_url=").unwrap();
        (
            id.trim_start_matches("node_id=").to_string(),
            url.to_string(),
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let bin = workspace_bin("bosh-csi");
    let spawn = |args: &[&str], sock: &Path| {
        Command::new(&bin)
            .args(args)
            .arg("--endpoint")
            .arg(format!("unix://{}", sock.display()))
            .env("BOSH_CLIENT_SECRET", &banner["client_secret"])
            .spawn()
            .unwrap()
    };
    let ctl_sock = dir.path().join("ctl.sock");
    let node_sock = dir.path().join("node.sock");
    let mut ctl = spawn(
        &[
            "--mode",
            "controller",
            "--director-url",
            &banner["director_url"],
            "--client-id",
            &banner["client_id"],
        ],
        &ctl_sock,
    );
    let mut node = spawn(
        &[
            "--mode",
            "node",
            "--node-id",
            &node_id,
            "--mounter-url",
            &mounter,
        ],
        &node_sock,
    );
    let connect = |p: PathBuf| async move {
        for _ in 0..200 {
            if let Ok(ch) = drivelab_fakes::cosi_sidecar::connect_unix(&p).await {
                return ch;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("{} never answered", p.display());
    };
    let mut c = ControllerClient::new(connect(ctl_sock).await);
    let mut n = NodeClient::new(connect(node_sock).await);
    let cap = VolumeCapability {
        access_type: Some(AccessType::Mount(Default::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    };
    let vol = c
        .create_volume(CreateVolumeRequest {
            name: "pvc-by-hand".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 1 << 30,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap.clone()],
            parameters: [
                ("disk_pool_name".to_string(), "default".to_string()),
                ("deployment_name".to_string(), "k8s".to_string()),
            ]
            .into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let published = c
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            node_id: node_id.clone(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let staging = "/var/lib/kubelet/plugins/staging/pv-by-hand";
    n.node_stage_volume(NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        publish_context: published.publish_context.clone(),
        staging_target_path: staging.into(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    let target = "/var/lib/kubelet/pods/p/volumes/v";
    n.node_publish_volume(NodePublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        publish_context: published.publish_context,
        staging_target_path: staging.into(),
        target_path: target.into(),
        volume_capability: Some(cap),
        ..Default::default()
    })
    .await
    .unwrap();
    n.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        target_path: target.into(),
    })
    .await
    .unwrap();
    n.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.into(),
    })
    .await
    .unwrap();
    c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id,
        ..Default::default()
    })
    .await
    .unwrap();
    c.delete_volume(DeleteVolumeRequest {
        volume_id: vol.volume_id,
        ..Default::default()
    })
    .await
    .unwrap();
    for p in [&mut ctl, &mut node] {
        let _ = p.kill();
        let _ = p.wait();
    }
    unsafe { libc::kill(serve.id() as i32, libc::SIGTERM) };
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(serve.wait().unwrap().success());
    assert!(
        rest.iter().any(|l| l.contains("stopped cleanly")),
        "{rest:?}"
    );
}

/// The second reference CSI driver, with its own backend, as spawned binaries
/// (one controller, one node process per node, sharing a state directory as
/// its processes on one host would) gives the same verdicts and ownership
/// snapshots as built in: the CSI system is not bosh-csi's harness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_hostpath_csi_matches_the_builtin_without_the_bosh_backend() {
    let driver = format!(
        r#"{{command: ["{}", --endpoint, "{{endpoint}}", --mode, "{{mode}}",
            --node-id, "{{node_id}}", --mounter-url, "{{mounter_url}}",
            --state-dir, "{{socket_dir}}/hostpath-state"], protocol: csi}}"#,
        workspace_bin("hostpath-csi").display()
    );
    let files = scenario::discover(&[root().join("scenarios/hostpath")]).unwrap();
    assert!(files.len() >= 3, "{files:?}");
    for f in files {
        let scn = scenario::load(&f).unwrap_or_else(|e| panic!("{e}"));
        assert!(scn.bosh().is_none(), "{}: no BOSH backend", scn.name);
        let builtin = run_with(&scn, None)
            .await
            .unwrap_or_else(|e| panic!("{}: {e:#}", scn.name));
        let spawned = run_with(&scn, Some(&driver))
            .await
            .unwrap_or_else(|e| panic!("{} (spawned): {e:#}", scn.name));
        assert!(builtin.passed(), "{}", drivelab::report::console(&builtin));
        assert_eq!(spawned.driver_name, builtin.driver_name, "{}", scn.name);
        assert_eq!(verdicts(&spawned), verdicts(&builtin), "{}", scn.name);
        assert_eq!(
            spawned.expect_failures, builtin.expect_failures,
            "{}",
            scn.name
        );
        assert_eq!(
            spawned.snapshot.text(),
            builtin.snapshot.text(),
            "{}",
            scn.name
        );
    }
}

/// The twin lab for unpredictable-secrets freezes a spawned driver's wall
/// clock at one instant in both labs (libfaketime): the cosi-s3 binary with
/// `--mutant time-seeded-secret` then hands out the same secrets twice and
/// fails; the correct binary passes the same scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_seeded_secret_repeats_under_the_twin_labs_frozen_clock() {
    let scn = scenario::load(&root().join("scenarios/cosi/read-only-access.yaml")).unwrap();
    let cosi = workspace_bin("cosi-s3");
    let driver = |extra: &str| {
        format!(
            r#"{{command: ["{}", --endpoint, "{{endpoint}}"{extra}]}}"#,
            cosi.display()
        )
    };
    let o = run_with(&scn, Some(&driver(", --mutant, time-seeded-secret")))
        .await
        .unwrap();
    let failed: Vec<&str> = o
        .verdicts
        .iter()
        .filter(|v| !v.passed)
        .map(|v| v.invariant)
        .collect();
    assert_eq!(
        failed,
        ["unpredictable-secrets"],
        "is libfaketime installed (make faketime-deps)? {:?}",
        o.verdicts
    );
    let o = run_with(&scn, Some(&driver(""))).await.unwrap();
    assert!(o.passed(), "{:?}", o.verdicts);
}

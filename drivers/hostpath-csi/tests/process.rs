//! The `hostpath-csi` binary as its own process: SIGKILLed between calls and
//! restarted on the same state directory, it answers a retry with the volume
//! its first life made; its command line refuses bad flags without a panic,
//! and `--mutant` switches a seeded bug on in the spawned process.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::{connect, create_req};
use drivelab_proto::csi::controller_client::ControllerClient;

const BIN: &str = env!("CARGO_BIN_EXE_hostpath-csi");

fn spawn(state: &Path, socket: &Path, extra: &[&str]) -> Child {
    Command::new(BIN)
        .args(["--mode", "controller", "--state-dir"])
        .arg(state)
        .arg(format!("--endpoint=unix://{}", socket.display()))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning hostpath-csi")
}

fn kill(mut child: Child) {
    child.kill().unwrap(); // SIGKILL: no shutdown path runs
    child.wait().unwrap();
}

async fn create(socket: &Path, name: &str) -> String {
    let mut ctl = ControllerClient::new(connect(socket).await);
    ctl.create_volume(create_req(name, 0))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id
}

fn volume_dirs(state: &Path) -> Vec<String> {
    hostpath_csi::inspect(state).unwrap().volume_dirs
}

#[tokio::test]
async fn sigkill_and_restart_keeps_create_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let (state, socket) = (dir.path().join("state"), dir.path().join("ctl.sock"));
    let first = spawn(&state, &socket, &[]);
    let a = create(&socket, "pvc-1").await;
    kill(first);
    let second = spawn(&state, &socket, &[]);
    assert_eq!(create(&socket, "pvc-1").await, a);
    kill(second);
    assert_eq!(volume_dirs(&state), vec![a]);
}

#[tokio::test]
async fn the_mutant_flag_reaches_the_spawned_process() {
    let dir = tempfile::tempdir().unwrap();
    let (state, socket) = (dir.path().join("state"), dir.path().join("ctl.sock"));
    let child = spawn(&state, &socket, &["--mutant", "retry-makes-second-dir"]);
    let a = create(&socket, "pvc-1").await;
    let b = create(&socket, "pvc-1").await;
    kill(child);
    assert_ne!(a, b);
    assert_eq!(volume_dirs(&state).len(), 2);
}

#[test]
fn bad_command_lines_fail_cleanly() {
    let run = |args: &[&str]| Command::new(BIN).args(args).output().unwrap();
    for args in [
        &["--bogus"][..],
        &["--mode", "controller"],
        &["--state-dir", "/tmp/x", "--mutant", "nope"],
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(err.contains("Error"), "{args:?}: {err}");
    }
    let out = run(&["--list-mutants"]);
    assert!(out.status.success());
    let listed = String::from_utf8_lossy(&out.stdout);
    for m in hostpath_csi::Mutant::all() {
        assert!(listed.contains(m.name()));
    }
    assert!(run(&["--help"]).status.success());
}

//! `drivelab cpi` as the Director runs an external CPI: a fresh process per
//! call, real JSON on stdin, `{result, error, log}` on stdout, state in sled
//! between invocations, fault markers, and a malformed request.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

fn cpi_raw(args: &[&str], input: &[u8]) -> (Value, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_drivelab"))
        .arg("cpi")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn drivelab cpi");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let v: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON reply ({e}): {stdout:?}"));
    // all three keys, always
    for k in ["result", "error", "log"] {
        assert!(v.get(k).is_some(), "reply lacks {k}: {v}");
    }
    (v, String::from_utf8_lossy(&out.stderr).to_string())
}

fn call(dir: &Path, method: &str, arguments: Value) -> Value {
    let req = json!({
        "method": method,
        "arguments": arguments,
        "context": {"director_uuid": "uuid-1", "request_id": "cpi-000042"},
        "api_version": 2,
    });
    let d = dir.to_str().unwrap();
    cpi_raw(&["--state-dir", d], req.to_string().as_bytes()).0
}

fn ok(v: Value) -> Value {
    assert_eq!(v["error"], Value::Null, "{v}");
    v["result"].clone()
}

fn err_type(v: &Value) -> String {
    assert_eq!(v["result"], Value::Null, "{v}");
    v["error"]["type"].as_str().unwrap_or("").to_string()
}

#[test]
fn json_round_trip_with_state_between_processes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let info = ok(call(d, "info", json!([])));
    assert_eq!(info["api_version"], 2);
    let st = ok(call(d, "create_stemcell", json!(["/tmp/image", {}])));
    let vm = ok(call(
        d,
        "create_vm",
        json!(["agent-1", st, {}, {"default": {"type": "dynamic"}}, [], {}]),
    ));
    let vm_cid = vm[0].as_str().unwrap().to_string();
    assert!(
        vm[1].is_object(),
        "v2 create_vm returns [cid, networks]: {vm}"
    );
    assert_eq!(ok(call(d, "has_vm", json!([vm_cid]))), true);
    let disk = ok(call(d, "create_disk", json!([1024, {}, vm_cid])));
    let hint = ok(call(d, "attach_disk", json!([vm_cid, disk])));
    assert_eq!(hint["id"], disk);
    assert_eq!(ok(call(d, "get_disks", json!([vm_cid]))), json!([disk]));
    // a second VM cannot take it
    let vm2 = ok(call(d, "create_vm", json!(["agent-2", st, {}, {}, [], {}])))[0].clone();
    let e = call(d, "attach_disk", json!([vm2, disk]));
    assert_eq!(err_type(&e), "Bosh::Clouds::CloudError");
    assert_eq!(e["error"]["ok_to_retry"], false);
    ok(call(d, "detach_disk", json!([vm_cid, disk])));
    let e = call(d, "detach_disk", json!([vm_cid, disk]));
    assert_eq!(err_type(&e), "Bosh::Clouds::DiskNotAttached");
    ok(call(d, "delete_vm", json!([vm_cid])));
    assert_eq!(
        err_type(&call(d, "delete_vm", json!([vm_cid]))),
        "Bosh::Clouds::VMNotFound"
    );
    assert_eq!(
        err_type(&call(d, "delete_disk", json!(["disk-999999"]))),
        "Bosh::Clouds::DiskNotFound"
    );
    assert_eq!(
        err_type(&call(d, "no_such_method", json!([]))),
        "Bosh::Clouds::NotImplemented"
    );
    // every call is recorded with its context, like the Director's test CPI
    let log = std::fs::read_to_string(d.join("calls.jsonl")).unwrap();
    assert!(log.lines().count() >= 12);
    assert!(log.contains("cpi-000042"));
}

#[test]
fn malformed_requests_get_a_cpi_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    for input in [&b"{not json"[..], b"", b"[1,2]", br#"{"method": 5}"#] {
        let (v, stderr) = cpi_raw(&["--state-dir", d], input);
        assert_eq!(v["error"]["type"], "Bosh::Clouds::CpiError", "{v}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // wrong argument types
    let req = json!({"method": "attach_disk", "arguments": [1, null], "context": {}});
    let (v, _) = cpi_raw(&["--state-dir", d], req.to_string().as_bytes());
    assert_eq!(v["error"]["type"], "Bosh::Clouds::CpiError", "{v}");
    // no state dir at all
    let (v, _) = cpi_raw(&[], b"{}");
    assert_eq!(v["error"]["type"], "Bosh::Clouds::CpiError", "{v}");
}

#[test]
fn fail_marker_and_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cfg = dir.path().join("cpi.json");
    std::fs::write(
        &cfg,
        json!({"state_dir": state, "cpi": {"max_disks_per_vm": 1}}).to_string(),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let run = |m: &str, a: Value| {
        let req = json!({"method": m, "arguments": a, "context": {}});
        cpi_raw(&["--config", c], req.to_string().as_bytes()).0
    };
    let st = ok(run("create_stemcell", json!(["/i", {}])));
    let vm = ok(run("create_vm", json!(["a", st, {}, {}, [], {}])))[0].clone();
    let d1 = ok(run("create_disk", json!([1, {}, null])));
    let d2 = ok(run("create_disk", json!([1, {}, null])));
    ok(run("attach_disk", json!([vm, d1])));
    let e = run("attach_disk", json!([vm, d2]));
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no free attachment slot"),
        "{e}"
    );
    std::fs::create_dir_all(state.join("markers")).unwrap();
    std::fs::write(
        state.join("markers/fail_create_disk"),
        json!({"type": "Bosh::Clouds::NoDiskSpace", "message": "full", "ok_to_retry": true})
            .to_string(),
    )
    .unwrap();
    let e = run("create_disk", json!([1, {}, null]));
    assert_eq!(err_type(&e), "Bosh::Clouds::NoDiskSpace");
    assert_eq!(e["error"]["ok_to_retry"], true);
    std::fs::remove_file(state.join("markers/fail_create_disk")).unwrap();
    ok(run("create_disk", json!([1, {}, null])));
    // a bad config file is a clear CPI error
    std::fs::write(&cfg, "{\"nope\": 1}").unwrap();
    let (v, _) = cpi_raw(&["--config", c], b"{}");
    assert_eq!(v["error"]["type"], "Bosh::Clouds::CpiError", "{v}");
}

#[test]
fn pause_marker_holds_the_call_until_removed() {
    let dir = tempfile::tempdir().unwrap();
    let markers = dir.path().join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    std::fs::write(markers.join("pause_info"), "").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_drivelab"))
        .args(["cpi", "--state-dir", dir.path().to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"method":"info","arguments":[],"context":{}}"#)
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(child.try_wait().unwrap().is_none(), "paused call answered");
    std::fs::remove_file(markers.join("pause_info")).unwrap();
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["result"]["api_version"], 2, "{v}");
}

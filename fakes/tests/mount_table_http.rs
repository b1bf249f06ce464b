//! The node mount table over its HTTP JSON API on 127.0.0.1, as a node
//! plugin's `--mounter-url` client sees it: shapes, error codes and the gate.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::csi::mounts::{Device, Filesystems, MountTable};
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::{calls, Component, History, Outcome};
use drivelab_fakes::serve::loopback;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde_json::{json, Value};

async fn call(
    client: &Client<HttpConnector, Full<Bytes>>,
    base: &str,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status().as_u16();
    assert!(
        resp.headers().get("x-drivelab-error-code").is_none(),
        "the gate strips its header"
    );
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn mount_table_http_api() {
    let history = History::new(SimClock::new());
    let devices = Arc::new(Mutex::new(vec![Device::for_disk("disk-1")]));
    let d2 = devices.clone();
    let table = MountTable::new(
        "node-a",
        Arc::new(move || d2.lock().unwrap().clone()),
        Filesystems::default(),
        Gate::new(history.clone()),
    );
    let listener = table.serve(loopback()).await.unwrap();
    assert!(listener.url().starts_with("http://127.0.0.1:"));
    let base = listener.url();
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let c = |m: &'static str, p: &'static str, b: &'static str| call(&client, &base, m, p, b);

    assert_eq!(
        c("GET", "/devices", "").await,
        (
            200,
            json!([{"path": "/dev/disk/by-id/disk-1", "disk_cid": "disk-1"}])
        )
    );
    let dev = "/dev/disk/by-id/disk-1";
    let (s, v) = c("GET", "/format?device=/dev/disk/by-id/disk-1", "").await;
    assert_eq!((s, v), (200, json!({"fstype": null})));
    assert_eq!(
        c(
            "POST",
            "/format",
            r#"{"device":"/dev/disk/by-id/disk-1","fstype":"ext4"}"#
        )
        .await
        .0,
        200
    );
    assert_eq!(
        c(
            "POST",
            "/format",
            r#"{"device":"/dev/disk/by-id/disk-1","fstype":"ext4"}"#
        )
        .await
        .0,
        200,
        "formatting again with the same type is idempotent"
    );
    let (s, v) = c(
        "POST",
        "/format",
        r#"{"device":"/dev/disk/by-id/disk-1","fstype":"xfs"}"#,
    )
    .await;
    assert_eq!((s, code(&v)), (409, "AlreadyFormatted"));
    let (s, v) = c("GET", "/format?device=/dev/disk/by-id/nope", "").await;
    assert_eq!((s, code(&v)), (404, "NoSuchDevice"));

    let stage = r#"{"source":"/dev/disk/by-id/disk-1","target":"/stage/g","fstype":"ext4","read_only":true,"bind":false}"#;
    assert_eq!(c("POST", "/mount", stage).await.0, 200);
    assert_eq!(
        c("POST", "/mount", stage).await.0,
        200,
        "same mount again is idempotent"
    );
    let (s, v) = c(
        "POST",
        "/mount",
        r#"{"source":"/dev/disk/by-id/disk-1","target":"/stage/g","read_only":false,"bind":false}"#,
    )
    .await;
    assert_eq!((s, code(&v)), (409, "AlreadyMounted"));
    let (s, v) = c(
        "POST",
        "/mount",
        r#"{"source":"/stage/g","target":"/pod/m","read_only":false,"bind":true}"#,
    )
    .await;
    assert_eq!((s, code(&v)), (400, "ReadOnlySource"));
    let (s, v) = c(
        "POST",
        "/mount",
        r#"{"source":"/nowhere","target":"/pod/m","read_only":true,"bind":true}"#,
    )
    .await;
    assert_eq!((s, code(&v)), (404, "NoSuchSource"));
    assert_eq!(
        c(
            "POST",
            "/mount",
            r#"{"source":"/stage/g","target":"/pod/m","read_only":true,"bind":true}"#
        )
        .await
        .0,
        200
    );
    let (s, v) = c("GET", "/mounts", "").await;
    assert_eq!(s, 200);
    assert_eq!(
        v,
        json!([
            {"source": "/stage/g", "target": "/pod/m", "fstype": "ext4", "read_only": true, "bind": true},
            {"source": dev, "target": "/stage/g", "fstype": "ext4", "read_only": true, "bind": false},
        ])
    );
    let (s, v) = c("POST", "/unmount", r#"{"target":"/stage/g"}"#).await;
    assert_eq!((s, code(&v)), (409, "Busy"));
    assert_eq!(c("POST", "/unmount", r#"{"target":"/pod/m"}"#).await.0, 200);
    assert_eq!(
        c("POST", "/unmount", r#"{"target":"/stage/g"}"#).await.0,
        200
    );
    let (s, v) = c("POST", "/unmount", r#"{"target":"/stage/g"}"#).await;
    assert_eq!((s, code(&v)), (404, "NotMounted"));

    // Bad input: clear errors in the same shape, never a panic.
    for body in [
        "not json",
        "{}",
        r#"{"target": 5}"#,
        r#"{"target":"relative"}"#,
    ] {
        let (s, v) = c("POST", "/unmount", body).await;
        assert_eq!((s, code(&v)), (400, "InvalidRequest"), "{body}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    let (s, v) = c("GET", "/nope", "").await;
    assert_eq!((s, code(&v)), (404, "NotFound"));

    // Every request went through the gate, from the driver to this node's table.
    let seen = calls(&history.events());
    assert!(seen.iter().all(|c| c.from == Component::Driver
        && c.to == Component::Mounts
        && c.subject == "node-a"));
    assert!(seen.iter().any(|c| c.op == "mount"
        && c.outcome
            == Some(Outcome::Http {
                status: 400,
                code: Some("ReadOnlySource".into())
            })));
    assert!(seen.iter().any(|c| c.op == "get_format"));
}

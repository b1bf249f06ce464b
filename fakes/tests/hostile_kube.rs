//! Hostile requests to the Kubernetes API fake over a real loopback socket: a
//! stale resourceVersion, patch bombs (10 001 operations, a self-copy that
//! doubles the object, nesting built up patch by patch, a deeply nested body),
//! oversized and non-UTF-8 bodies and paths. Each answer is a `Status` with
//! the real server's code and reason (or, for what the HTTP layer refuses, a
//! bare 4xx), costs bounded time, and nothing panics.

mod common;

use std::net::SocketAddr;
use std::time::Instant;

use common::{panics, raw, watch_panics, Reply};
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::serve::loopback;
use serde_json::json;

/// The bearer token every request below carries (cluster-admin).
const TOKEN: &str = "hostile-kube-test-token";

fn http(method: &str, path: &str, ctype: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

#[track_caller]
fn status(r: &Reply, code: u16, reason: &str) {
    assert_eq!(r.status, code, "{} {}", r.head, r.text());
    let v = r.json();
    assert_eq!(v["kind"], "Status", "{v}");
    assert_eq!(v["status"], "Failure", "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(v["reason"], reason, "{v}");
}

const CM: &str = "/api/v1/namespaces/drv/configmaps";

async fn create(a: SocketAddr, name: &str) -> Reply {
    let body =
        json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name},"data":{"k":"v"}});
    raw(
        a,
        &http("POST", CM, "application/json", body.to_string().as_bytes()),
    )
    .await
}

async fn patch(a: SocketAddr, name: &str, ctype: &str, body: &[u8]) -> Reply {
    raw(a, &http("PATCH", &format!("{CM}/{name}"), ctype, body)).await
}

#[tokio::test]
async fn hostile_kube_requests() {
    watch_panics();
    let before = panics();
    let fake =
        drivelab_fakes::kube::in_memory(Gate::new(History::new(SimClock::new())), 1).unwrap();
    fake.access()
        .register(TOKEN, drivelab_fakes::kube::Grant::cluster_admin("hostile"));
    // The namespace the requests write into exists, as on a real cluster.
    fake.declare_namespace("drv").unwrap();
    let l = fake.serve(loopback()).await.unwrap();
    let a = l.addr;
    assert_eq!(create(a, "ckpt").await.status, 201);

    // No credentials, or a token nobody issued: 401 before the body is looked at.
    let anonymous = format!("GET {CM} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    status(&raw(a, anonymous.as_bytes()).await, 401, "Unauthorized");
    let forged = String::from_utf8(http("GET", CM, "application/json", b""))
        .unwrap()
        .replace(TOKEN, "forged");
    status(&raw(a, forged.as_bytes()).await, 401, "Unauthorized");

    // Stale resourceVersion: 409 Conflict naming the object.
    let upd = |rv: &str| {
        json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"ckpt","resourceVersion":rv},"data":{"k":"2"}}).to_string()
    };
    assert_eq!(
        raw(
            a,
            &http(
                "PUT",
                &format!("{CM}/ckpt"),
                "application/json",
                upd("1").as_bytes()
            )
        )
        .await
        .status,
        200
    );
    let r = raw(
        a,
        &http(
            "PUT",
            &format!("{CM}/ckpt"),
            "application/json",
            upd("1").as_bytes(),
        ),
    )
    .await;
    status(&r, 409, "Conflict");
    assert_eq!(r.json()["details"]["name"], "ckpt");
    let r = patch(
        a,
        "ckpt",
        "application/merge-patch+json",
        br#"{"metadata":{"resourceVersion":"1"},"data":{"x":"y"}}"#,
    )
    .await;
    status(&r, 409, "Conflict");

    // 10 001 operations: refused on the count, before any is applied.
    let ops: Vec<_> = (0..10_001)
        .map(|_| json!({"op":"test","path":"/data/k","value":"2"}))
        .collect();
    let t = Instant::now();
    let r = patch(
        a,
        "ckpt",
        "application/json-patch+json",
        json!(ops).to_string().as_bytes(),
    )
    .await;
    status(&r, 413, "RequestEntityTooLarge");
    // 10 000 are allowed (and cheap).
    let ops: Vec<_> = (0..10_000)
        .map(|_| json!({"op":"test","path":"/data/k","value":"2"}))
        .collect();
    assert_eq!(
        patch(
            a,
            "ckpt",
            "application/json-patch+json",
            json!(ops).to_string().as_bytes()
        )
        .await
        .status,
        200
    );

    // Copy bomb: each op copies the whole object into itself (2^40 bytes unchecked).
    let ops: Vec<_> = (0..40)
        .map(|i| json!({"op":"copy","from":"","path":format!("/data/c{i}")}))
        .collect();
    let r = patch(
        a,
        "ckpt",
        "application/json-patch+json",
        json!(ops).to_string().as_bytes(),
    )
    .await;
    status(&r, 422, "Invalid");
    assert!(r.text().contains("accumulated size"), "{}", r.text());

    // Nesting built up patch by patch until the store could not read it back.
    let mut deep = json!("x");
    for _ in 0..100 {
        deep = json!({ "d": deep });
    }
    let mut refused = false;
    let mut path = String::from("/metadata/annotations");
    let r = patch(
        a,
        "ckpt",
        "application/json-patch+json",
        json!([{"op":"add","path":path,"value":{}}])
            .to_string()
            .as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    for _ in 0..5 {
        let r = patch(
            a,
            "ckpt",
            "application/json-patch+json",
            json!([{"op":"add","path":format!("{path}/n"),"value":deep}])
                .to_string()
                .as_bytes(),
        )
        .await;
        if r.status == 422 {
            status(&r, 422, "Invalid");
            refused = true;
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text());
        path.push_str("/n");
        for _ in 0..99 {
            path.push_str("/d");
        }
    }
    assert!(refused, "nesting grew without bound");
    // The object is still readable (nothing unloadable was stored).
    assert_eq!(
        raw(
            a,
            &http("GET", &format!("{CM}/ckpt"), "application/json", b"")
        )
        .await
        .status,
        200
    );

    // A deeply nested body is refused by the parser, not by the stack.
    let bomb = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000));
    status(
        &patch(a, "ckpt", "application/merge-patch+json", bomb.as_bytes()).await,
        400,
        "BadRequest",
    );
    status(
        &raw(a, &http("POST", CM, "application/json", bomb.as_bytes())).await,
        400,
        "BadRequest",
    );

    // Over the 3 MiB request limit.
    let big = vec![b' '; 4 << 20];
    status(
        &raw(a, &http("POST", CM, "application/json", &big)).await,
        413,
        "RequestEntityTooLarge",
    );

    // Non-UTF-8 body, name and header value.
    status(
        &raw(
            a,
            &http("POST", CM, "application/json", b"{\"a\":\"\xff\xfe\"}"),
        )
        .await,
        400,
        "BadRequest",
    );
    let r = raw(
        a,
        &http("GET", &format!("{CM}/%FF%FE"), "application/json", b""),
    )
    .await;
    assert!((400..500).contains(&r.status));
    status(&r, r.status, r.json()["reason"].as_str().unwrap_or(""));
    let r = raw(a, b"GET /api/v1/namespaces/drv/configmaps HTTP/1.1\r\nhost: x\r\ncontent-type: \xff\xfe\r\nconnection: close\r\n\r\n").await;
    assert!(r.status < 500, "{}", r.head);
    let r = raw(
        a,
        b"GET /api/v1/\xff HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!((400..500).contains(&r.status), "{}", r.head);
    assert!(
        t.elapsed().as_secs() < 60,
        "hostile requests took {:?}",
        t.elapsed()
    );
    assert_eq!(panics(), before, "a request panicked");
}

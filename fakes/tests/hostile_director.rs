//! Hostile requests to the BOSH Director fake and its UAA over a real loopback
//! socket: forged, expired, under-scoped and cross-deployment tokens; bad UAA
//! grants; malformed, mistyped, oversized and non-UTF-8 bodies, headers and
//! paths; traversal and NUL in names; odd task ids; a burst of 200 bad
//! requests. Each answer is the Director's `{code, description}` JSON (the
//! UAA's `{error, error_description}`; for what the HTTP layer refuses before
//! any handler, a bare 4xx) with the real status, and nothing panics.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use common::{
    assert_huge_header_refused, director_client, panics, raw, rss_kib, watch_panics, Reply,
};
use drivelab_fakes::clock::{SimClock, VTime};
use drivelab_fakes::cpi::{Cpi, CpiConfig};
use drivelab_fakes::director::auth::{self, Claims};
use drivelab_fakes::director::{DeploymentConfig, Director, DirectorConfig, InstanceGroupConfig};
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::secret::Secret;
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::MemStore;
use serde_json::{json, Value};

const KEY: &str = "hostile-director-key";
const DISK_SCOPES: [&str; 6] = [
    "bosh.dynamic-disks.create",
    "bosh.dynamic-disks.attach",
    "bosh.dynamic-disks.detach",
    "bosh.dynamic-disks.delete",
    "bosh.dynamic-disks.list",
    "bosh.read",
];

fn deployment(name: &str, instances: u32) -> DeploymentConfig {
    DeploymentConfig {
        name: name.into(),
        instance_groups: vec![InstanceGroupConfig {
            name: "worker".into(),
            instances,
            azs: vec!["z1".into()],
        }],
    }
}

struct Lab {
    director: Director,
    clock: SimClock,
    history: History,
    addr: SocketAddr,
    _listener: Listener,
}

/// Deployments `a` and `b`, per-deployment scoping on, one disk worker;
/// clients `csi-a`/`csi-b` (disk scopes and bosh.read, their deployment only),
/// `admin`, and `reader` (list only).
async fn lab() -> Lab {
    let clock = SimClock::new();
    let history = History::new(clock.clone());
    let gate = Gate::new(history.clone());
    let cpi = Cpi::new(
        Arc::new(MemStore::default()),
        gate.clone(),
        CpiConfig::default(),
    );
    let cfg = DirectorConfig {
        deployments: vec![deployment("a", 2), deployment("b", 1)],
        clients: vec![
            director_client("csi-a", &DISK_SCOPES, &["a"]),
            director_client("csi-b", &DISK_SCOPES, &["b"]),
            director_client("admin", &["bosh.admin"], &[]),
            director_client("reader", &["bosh.dynamic-disks.list"], &[]),
        ],
        per_deployment_scoping: true,
        dynamic_disks_workers: 1,
        token_signing_key: Secret::new(KEY),
        ..DirectorConfig::default()
    };
    let director = Director::new(Arc::new(MemStore::default()), gate, cpi, cfg)
        .await
        .expect("director");
    let listener = director.serve(loopback()).await.expect("listen");
    Lab {
        director,
        clock,
        history,
        addr: listener.addr,
        _listener: listener,
    }
}

fn http(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nhost: x\r\n").into_bytes();
    for (k, v) in headers {
        r.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    r.extend_from_slice(
        format!(
            "content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    r.extend_from_slice(body);
    r
}

impl Lab {
    async fn token(&self, id: &str) -> String {
        let form =
            format!("grant_type=client_credentials&client_id={id}&client_secret={id}-secret");
        let r = self.uaa(form.as_bytes()).await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["access_token"]
            .as_str()
            .expect("token")
            .to_string()
    }

    async fn uaa(&self, form: &[u8]) -> Reply {
        raw(
            self.addr,
            &http(
                "POST",
                "/oauth/token",
                &[("content-type", "application/x-www-form-urlencoded")],
                form,
            ),
        )
        .await
    }

    /// `method path` with a bearer token (none if empty) and a JSON body.
    async fn call(&self, method: &str, path: &str, token: &str, body: &[u8]) -> Reply {
        let auth = format!("Bearer {token}");
        let mut h = vec![("content-type", "application/json")];
        if !token.is_empty() {
            h.push(("authorization", auth.as_str()));
        }
        raw(self.addr, &http(method, path, &h, body)).await
    }

    fn instance(&self, deployment: &str) -> String {
        self.director
            .instances()
            .into_iter()
            .find(|i| i.deployment == deployment)
            .expect("an instance")
            .id
    }

    /// Provide `name` on deployment `dep` as `token` and wait for the task.
    async fn provide(&self, token: &str, dep: &str, name: &str) -> u64 {
        let body = json!({"instance_id": self.instance(dep), "disk_name": name,
            "disk_pool_name": "default", "disk_size": 1024});
        let r = self
            .call(
                "POST",
                "/dynamic_disks/provide",
                token,
                body.to_string().as_bytes(),
            )
            .await;
        assert_eq!(r.status, 302, "{} {}", r.head, r.text());
        let id = task_id(&r);
        let t = self.director.wait_task(id).await.expect("task");
        assert_eq!(t.state.as_str(), "done", "{t:?}");
        id
    }
}

fn task_id(r: &Reply) -> u64 {
    r.head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("location: /tasks/")
                .map(str::to_string)
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no task Location: {}", r.head))
}

#[track_caller]
fn director_error(r: &Reply, status: u16, code: u64) {
    assert_eq!(r.status, status, "{} {}", r.head, r.text());
    let v = r.json();
    assert_eq!(v["code"], code, "{v}");
    assert!(
        v["description"].as_str().is_some_and(|d| !d.is_empty()),
        "{v}"
    );
}

#[track_caller]
fn uaa_error(r: &Reply, status: u16, error: &str) {
    assert_eq!(r.status, status, "{} {}", r.head, r.text());
    let v = r.json();
    assert_eq!(v["error"], error, "{v}");
    assert!(v["error_description"].is_string(), "{v}");
}

fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(v.to_string())
}

fn admin_claims(exp: u64) -> Claims {
    Claims {
        jti: "jti-forged".into(),
        client_id: "admin".into(),
        scope: vec![auth::ADMIN.into()],
        deployments: vec![],
        iat: 0,
        exp,
    }
}

#[tokio::test]
async fn bad_tokens_are_refused_with_the_directors_401() {
    watch_panics();
    let before = panics();
    let lab = lab().await;
    let csi_a = lab.token("csi-a").await;
    let parts: Vec<&str> = csi_a.split('.').collect();
    // The same signature over an admin payload.
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        b64(&serde_json::to_value(admin_claims(u64::MAX / 4)).unwrap()),
        parts[2]
    );
    // `alg: none`, unsigned, as a careless verifier would accept.
    let alg_none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&serde_json::to_value(admin_claims(u64::MAX / 4)).unwrap())
    );
    // Properly signed, by another UAA's key.
    let other_key = auth::issue(&Secret::new("another-uaa"), &admin_claims(u64::MAX / 4));
    for (what, tok) in [
        ("garbage", "garbage"),
        ("two parts", "a.b"),
        ("forged signature", forged.as_str()),
        ("alg none", alg_none.as_str()),
        ("another key", other_key.expose()),
        ("four parts", "a.b.c.d"),
        ("not base64", "!!.??.**"),
    ] {
        for (m, p) in [
            ("GET", "/deployments"),
            ("GET", "/dynamic_disks"),
            ("GET", "/tasks/1"),
            ("POST", "/dynamic_disks/x/detach"),
        ] {
            let r = lab.call(m, p, tok, b"").await;
            assert_eq!(r.status, 401, "{what}: {m} {p}: {}", r.text());
            director_error(&r, 401, 600000);
        }
    }
    // No Authorization, another scheme, an empty bearer, non-UTF-8 bytes.
    director_error(&lab.call("GET", "/deployments", "", b"").await, 401, 600000);
    for h in [
        &b"Basic YWRtaW46YWRtaW4tc2VjcmV0"[..],
        b"Bearer ",
        b"Bearer \xff\xfe",
    ] {
        let mut req = b"GET /deployments HTTP/1.1\r\nhost: x\r\nauthorization: ".to_vec();
        req.extend_from_slice(h);
        req.extend_from_slice(b"\r\nconnection: close\r\n\r\n");
        director_error(&raw(lab.addr, &req).await, 401, 600000);
    }
    // The token's scope lacks the operation.
    let reader = lab.token("reader").await;
    for (m, p, body) in [
        ("POST", "/dynamic_disks/provide", &b"{}"[..]),
        ("POST", "/dynamic_disks", b"{}"),
        ("POST", "/dynamic_disks/x/attach", b"{}"),
        ("POST", "/dynamic_disks/x/detach", b""),
        ("POST", "/dynamic_disks/x/resize", b"{}"),
        ("DELETE", "/dynamic_disks/x", b""),
        ("GET", "/deployments", b""),
        ("GET", "/deployments/a/instances", b""),
    ] {
        let r = lab.call(m, p, &reader, body).await;
        director_error(&r, 401, 600000);
        assert!(
            r.json()["description"]
                .as_str()
                .unwrap_or("")
                .starts_with("Require one of the scopes"),
            "{m} {p}: {}",
            r.text()
        );
    }
    // Expired on the virtual clock (one hour of token life).
    lab.clock.advance_to(VTime(3601 * 1000));
    let r = lab.call("GET", "/dynamic_disks", &csi_a, b"").await;
    director_error(&r, 401, 600000);
    assert_eq!(r.json()["description"], "Token expired");
    // A fresh one works again.
    let csi_a = lab.token("csi-a").await;
    assert_eq!(
        lab.call("GET", "/dynamic_disks", &csi_a, b"").await.status,
        200
    );
    assert_eq!(panics(), before, "a request panicked");
}

#[tokio::test]
async fn a_deployment_a_token_cannot_reach_deployment_b() {
    watch_panics();
    let before = panics();
    let lab = lab().await;
    let csi_a = lab.token("csi-a").await;
    let csi_b = lab.token("csi-b").await;
    let b_task = lab.provide(&csi_b, "b", "bdisk").await;
    let a_inst = lab.instance("a");
    let b_inst = lab.instance("b");
    let attach_a = json!({"instance_id": a_inst}).to_string();
    let attach_b = json!({"instance_id": b_inst}).to_string();
    let provide_b = json!({"instance_id": b_inst, "disk_name": "sneaky",
        "disk_pool_name": "default", "disk_size": 1})
    .to_string();
    let create_b = json!({"deployment_name": "b", "disk_name": "sneaky",
        "disk_pool_name": "default", "disk_size": 1})
    .to_string();
    for (m, p, body) in [
        ("GET", "/deployments/b/instances", &b""[..]),
        ("GET", "/deployments/b/vms", b""),
        ("POST", "/dynamic_disks/provide", provide_b.as_bytes()),
        ("POST", "/dynamic_disks", create_b.as_bytes()),
        // B's disk onto A's VM, and a new disk onto B's VM.
        ("POST", "/dynamic_disks/bdisk/attach", attach_a.as_bytes()),
        ("POST", "/dynamic_disks/adisk/attach", attach_b.as_bytes()),
        ("POST", "/dynamic_disks/bdisk/detach", b""),
        (
            "POST",
            "/dynamic_disks/bdisk/resize",
            b"{\"disk_size\":4096}",
        ),
        ("POST", "/dynamic_disks/bdisk/snapshots", b""),
        ("DELETE", "/dynamic_disks/bdisk", b""),
        // B's task: its state, its output, cancelling it.
        ("GET", &format!("/tasks/{b_task}"), b""),
        ("GET", &format!("/tasks/{b_task}/output?type=result"), b""),
        ("DELETE", &format!("/task/{b_task}"), b""),
    ] {
        let r = lab.call(m, p, &csi_a, body).await;
        assert_eq!(r.status, 401, "{m} {p}: {}", r.text());
        director_error(&r, 401, 600000);
    }
    // B's disk and tasks stay out of A's listings.
    let disks = lab.call("GET", "/dynamic_disks", &csi_a, b"").await.json();
    assert_eq!(disks, json!([]));
    let tasks = lab.call("GET", "/tasks", &csi_a, b"").await.json();
    assert!(
        tasks.as_array().is_some_and(|t| t.is_empty()),
        "A sees tasks: {tasks}"
    );
    let deps = lab.call("GET", "/deployments", &csi_a, b"").await.json();
    assert_eq!(deps.as_array().map(Vec::len), Some(1), "{deps}");
    // Nothing about B changed.
    let d = lab.director.disks();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].instance_id.as_deref(), Some(b_inst.as_str()));
    assert_eq!(d[0].size_mib, 1024);
    assert_eq!(panics(), before, "a request panicked");
}

#[tokio::test]
async fn uaa_refusals_use_the_uaa_error_json() {
    watch_panics();
    let before = panics();
    let lab = lab().await;
    for (form, status, error) in [
        (
            &b"grant_type=client_credentials&client_id=csi-a&client_secret=wrong"[..],
            401,
            "unauthorized",
        ),
        (
            b"grant_type=client_credentials&client_id=nobody&client_secret=x",
            401,
            "unauthorized",
        ),
        // No credentials at all, or half of them.
        (b"grant_type=client_credentials", 401, "unauthorized"),
        (
            b"grant_type=client_credentials&client_id=csi-a",
            401,
            "unauthorized",
        ),
        (b"", 401, "unauthorized"),
        // Bad credentials are refused before the grant type is looked at.
        (
            b"grant_type=password&client_id=csi-a&client_secret=wrong",
            401,
            "unauthorized",
        ),
        (
            b"grant_type=nonsense&client_id=csi-a&client_secret=csi-a-secret",
            400,
            "unsupported_grant_type",
        ),
        (
            b"client_id=csi-a&client_secret=csi-a-secret",
            400,
            "invalid_request",
        ),
        (
            b"grant_type=client_credentials&client_id=csi-a&client_secret=csi-a-secret&scope=bosh.admin",
            400,
            "invalid_scope",
        ),
        // Not a form at all; non-UTF-8; broken escapes.
        (b"{\"grant_type\":\"client_credentials\"}", 401, "unauthorized"),
        (
            b"grant_type=client_credentials&client_id=\xff\xfe&client_secret=\xff",
            401,
            "unauthorized",
        ),
        (
            b"grant_type=client_credentials&client_id=%&client_secret=%zz%",
            401,
            "unauthorized",
        ),
    ] {
        uaa_error(&lab.uaa(form).await, status, error);
    }
    // HTTP Basic with a wrong secret, and with a header that is not base64.
    for basic in ["Basic Y3NpLWE6d3Jvbmc=", "Basic !!!", "Basic "] {
        let r = raw(
            lab.addr,
            &http(
                "POST",
                "/oauth/token",
                &[("authorization", basic)],
                b"grant_type=client_credentials",
            ),
        )
        .await;
        uaa_error(&r, 401, "unauthorized");
    }
    // A 4 MiB form: refused on its declared length, in UAA's shape.
    let mut huge = b"grant_type=client_credentials&client_id=".to_vec();
    huge.resize(4 << 20, b'a');
    uaa_error(&lab.uaa(&huge).await, 413, "invalid_request");
    // The token endpoint with the wrong method.
    let r = raw(lab.addr, &http("PUT", "/oauth/token", &[], b"")).await;
    uaa_error(&r, 405, "method_not_allowed");
    // Neither the secrets sent nor a token issued reach the history.
    let tok = lab.token("csi-a").await;
    let hist = serde_json::to_string(&lab.history.events()).expect("history JSON");
    assert!(!hist.contains("csi-a-secret") && !hist.contains(&tok));
    assert_eq!(panics(), before, "a request panicked");
}

#[tokio::test]
async fn bad_bodies_get_validation_errors() {
    watch_panics();
    let before = panics();
    let lab = lab().await;
    let tok = lab.token("csi-a").await;
    let inst = lab.instance("a");
    let provide = |v: Value| {
        let mut b = json!({"instance_id": inst, "disk_name": "d1",
            "disk_pool_name": "default", "disk_size": 1024});
        for (k, x) in v.as_object().expect("object") {
            b[k] = x.clone();
        }
        b.to_string().into_bytes()
    };
    let cases: Vec<(Vec<u8>, u64)> = vec![
        (b"{nope".to_vec(), 40000),
        (b"".to_vec(), 40000),
        (b"[]".to_vec(), 40000),
        (b"null".to_vec(), 40000),
        (b"{\"disk_name\":\"\xff\xfe\"}".to_vec(), 40000),
        (
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
            40000,
        ),
        (provide(json!({"disk_size": "10"})), 40000),
        (provide(json!({"disk_size": -1})), 40002),
        (provide(json!({"disk_size": 0})), 40002),
        (provide(json!({"disk_size": 1.5})), 40000),
        (provide(json!({"disk_size": u64::MAX})), 40000),
        (
            String::from_utf8(provide(json!({})))
                .unwrap()
                .replace("1024", "18446744073709551616")
                .into_bytes(),
            40000,
        ),
        (provide(json!({"disk_name": 7})), 40000),
        (provide(json!({"disk_name": ""})), 40001),
        (provide(json!({"instance_id": null})), 40001),
        (provide(json!({"metadata": "x"})), 40000),
        (provide(json!({"instance_id": "no-such"})), 520001),
    ];
    for (body, code) in cases {
        let r = lab
            .call("POST", "/dynamic_disks/provide", &tok, &body)
            .await;
        director_error(&r, 400, code);
    }
    for (p, body) in [
        ("/dynamic_disks/d/resize", &b"{\"disk_size\":\"big\"}"[..]),
        ("/dynamic_disks/d/attach", b"{\"instance_id\":[]}"),
        ("/dynamic_disks/d/snapshots", b"{\"metadata\":[1]}"),
    ] {
        director_error(&lab.call("POST", p, &tok, body).await, 400, 40000);
    }
    // A real client's unknown fields are ignored, as Ruby's JSON hashes are.
    let r = lab
        .call(
            "POST",
            "/dynamic_disks/provide",
            &tok,
            &provide(json!({"surprise": {"nested": [1, 2]}})),
        )
        .await;
    assert_eq!(r.status, 302, "{}", r.text());
    // X-Bosh-Context-Id longer than the Director's 64 characters.
    let long = "c".repeat(65);
    let auth = format!("Bearer {tok}");
    let r = raw(
        lab.addr,
        &http(
            "POST",
            "/dynamic_disks/provide",
            &[("authorization", &auth), ("x-bosh-context-id", &long)],
            &provide(json!({"disk_name": "d2"})),
        ),
    )
    .await;
    director_error(&r, 400, 70010);
    assert_eq!(panics(), before, "a request panicked");
}

#[tokio::test]
async fn oversized_requests_are_refused_without_buffering() {
    watch_panics();
    let before = panics();
    let lab = lab().await;
    let tok = lab.token("csi-a").await;
    let auth = format!("Bearer {tok}");
    let a = lab.addr;
    let rss0 = rss_kib();
    // 10 GiB declared, a few bytes sent: refused on the header.
    let req = format!("POST /dynamic_disks/provide HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\ncontent-length: 10737418240\r\nconnection: close\r\n\r\n{{\"disk_name\":\"");
    director_error(&raw(a, req.as_bytes()).await, 413, 100);
    // A 10 MB disk name, really sent.
    let name = "n".repeat(10 << 20);
    let body = json!({"instance_id": lab.instance("a"), "disk_name": name,
        "disk_pool_name": "default", "disk_size": 1});
    let r = lab
        .call(
            "POST",
            "/dynamic_disks/provide",
            &tok,
            body.to_string().as_bytes(),
        )
        .await;
    director_error(&r, 413, 100);
    // Over the limit in chunks, no length declared.
    let mut req = format!("POST /dynamic_disks HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n").into_bytes();
    let chunk = vec![b' '; 256 * 1024];
    for _ in 0..6 {
        req.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        req.extend_from_slice(&chunk);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    director_error(&raw(a, &req).await, 413, 100);
    // Any route, even one that takes no body.
    director_error(
        &raw(
            a,
            b"GET /info HTTP/1.1\r\nhost: x\r\ncontent-length: 99999999999\r\nconnection: close\r\n\r\n",
        )
        .await,
        413,
        100,
    );
    assert!(
        rss_kib() < rss0 + 64 * 1024,
        "memory grew by {} KiB",
        rss_kib().saturating_sub(rss0)
    );

    // nginx's 8 KiB header line (large_client_header_buffers 4 8k): 400.
    let big = "v".repeat(9000);
    let r = raw(
        a,
        &http(
            "GET",
            "/dynamic_disks",
            &[("authorization", &auth), ("x-big", &big)],
            b"",
        ),
    )
    .await;
    director_error(&r, 400, 100);
    // A bearer token that long is refused the same way, not verified.
    let r = lab.call("GET", "/dynamic_disks", &big, b"").await;
    director_error(&r, 400, 100);
    // A request line over 8 KiB: 414.
    let r = lab
        .call("GET", &format!("/tasks/{}", "1".repeat(9000)), &tok, b"")
        .await;
    director_error(&r, 414, 100);
    // Far past any sane size the HTTP layer refuses before a handler runs.
    assert_huge_header_refused(a, "/info").await;
    assert_eq!(panics(), before, "a request panicked");
}

#[tokio::test]
async fn names_paths_and_methods() {
    watch_panics();
    let before = panics();
    let lab = lab().await;
    let admin = lab.token("admin").await;
    let t = Instant::now();
    // Traversal, encoded slashes, NUL and a long name stay literal names:
    // nothing is found under them and nothing is created.
    let long = "x".repeat(7000);
    for n in [
        "..",
        "%2e%2e",
        "..%2f..%2finfo",
        "%2e%2e%2f%2e%2e%2f",
        "a%2Fb",
        "a%5cb",
        "%00",
        "a%00b",
        "%20",
        long.as_str(),
    ] {
        let r = lab
            .call("GET", &format!("/deployments/{n}/instances"), &admin, b"")
            .await;
        director_error(&r, 404, 70000);
        let r = lab
            .call(
                "POST",
                &format!("/dynamic_disks/{n}/snapshots"),
                &admin,
                b"",
            )
            .await;
        director_error(&r, 404, 520002);
        for p in [
            format!("/tasks/{n}"),
            format!("/tasks/{n}/output?type=result"),
        ] {
            director_error(&lab.call("GET", &p, &admin, b"").await, 404, 10000);
        }
        director_error(
            &lab.call("DELETE", &format!("/task/{n}"), &admin, b"").await,
            404,
            10000,
        );
    }
    assert!(lab.director.disks().is_empty());
    assert!(lab.director.cpi().disks().is_empty());
    // Unencoded dot segments are not resolved into another route.
    for p in [
        "/deployments/../info",
        "/dynamic_disks/../../info",
        "/dynamic_disks/a/b/c",
        "/nope",
        "/",
        "//info",
        "/info/",
        "/tasks/1/output/x",
    ] {
        let r = lab.call("GET", p, &admin, b"").await;
        assert_eq!(r.status, 404, "{p}: {}", r.text());
        director_error(&r, 404, 100);
    }
    // Known routes, wrong methods (including OPTIONS); HEAD is GET without a body.
    for (m, p) in [
        ("PUT", "/info"),
        ("DELETE", "/deployments"),
        ("POST", "/tasks/1"),
        ("GET", "/task/1"),
        ("PATCH", "/dynamic_disks/x"),
        ("OPTIONS", "/info"),
        ("OPTIONS", "/dynamic_disks"),
    ] {
        director_error(&lab.call(m, p, &admin, b"").await, 405, 100);
    }
    let r = lab.call("HEAD", "/info", "", b"").await;
    assert_eq!((r.status, r.body.len()), (200, 0), "{}", r.head);
    let r = lab.call("HEAD", "/deployments", "", b"").await;
    assert_eq!((r.status, r.body.len()), (401, 0), "{}", r.head);
    // Non-UTF-8 in a path segment and in the query.
    for p in [
        "/tasks/%FF%FE",
        "/deployments/%C3%28/instances",
        "/dynamic_disks/%FF/snapshots",
        "/tasks/1/output?type=%FF",
        "/tasks/1/output?%FF=result",
    ] {
        let m = if p.contains("snapshots") {
            "POST"
        } else {
            "GET"
        };
        let r = lab.call(m, p, &admin, b"").await;
        director_error(&r, 400, 40000);
    }
    // Raw bytes no URI may hold: the HTTP layer's bare 400.
    for req in [
        &b"GET /tasks/\xff HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"[..],
        b"GET /tasks/\x00 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        b"GET /info HTTP/1.1\r\nhost: x\r\nx-a: \x00\r\nconnection: close\r\n\r\n",
    ] {
        let r = raw(lab.addr, req).await;
        assert!((400..500).contains(&r.status), "{}", r.head);
    }
    assert!(t.elapsed().as_secs() < 60, "took {:?}", t.elapsed());
    assert_eq!(panics(), before, "a request panicked");
}

#[tokio::test]
async fn odd_task_ids() {
    watch_panics();
    let before = panics();
    let lab = lab().await;
    let admin = lab.token("admin").await;
    let csi_a = lab.token("csi-a").await;
    for id in [
        "abc",
        "-1",
        "0",
        "1.0",
        "0x1",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999999999999",
    ] {
        for tok in [&admin, &csi_a] {
            for (m, p) in [
                ("GET", format!("/tasks/{id}")),
                ("GET", format!("/tasks/{id}/output?type=result")),
                ("DELETE", format!("/task/{id}")),
            ] {
                let r = lab.call(m, &p, tok, b"").await;
                director_error(&r, 404, 10000);
            }
        }
    }
    // The setup deploy task belongs to admin: a scoped client may not read it.
    let r = lab.call("GET", "/tasks/1", &csi_a, b"").await;
    director_error(&r, 401, 600000);
    assert_eq!(lab.call("GET", "/tasks/1", &admin, b"").await.status, 200);
    let r = lab
        .call("GET", "/tasks/1/output?type=bogus", &admin, b"")
        .await;
    director_error(&r, 400, 40000);
    assert_eq!(panics(), before, "a request panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_bad_requests_does_not_wedge_the_fake() {
    watch_panics();
    let before = panics();
    let lab = lab().await;
    let a = lab.addr;
    let tok = lab.token("csi-a").await;
    let rss0 = rss_kib();
    let bad: Vec<Vec<u8>> = vec![
        http("GET", "/deployments", &[("authorization", "Bearer garbage")], b""),
        http(
            "POST",
            "/dynamic_disks/provide",
            &[("authorization", &format!("Bearer {tok}"))],
            b"{nope",
        ),
        b"POST /dynamic_disks HTTP/1.1\r\nhost: x\r\ncontent-length: 10737418240\r\nconnection: close\r\n\r\n".to_vec(),
        http("GET", "/tasks/%FF", &[("authorization", &format!("Bearer {tok}"))], b""),
        http("PUT", "/info", &[], b""),
        http("POST", "/oauth/token", &[], b"grant_type=client_credentials&client_id=x&client_secret=y"),
    ];
    let mut set = tokio::task::JoinSet::new();
    for i in 0..200 {
        let req = bad[i % bad.len()].clone();
        set.spawn(async move { raw(a, &req).await });
    }
    let mut n = 0;
    while let Some(r) = set.join_next().await {
        let r = r.expect("request task");
        assert!((400..500).contains(&r.status), "{} {}", r.head, r.text());
        let v = r.json();
        assert!(
            v["code"].is_u64() || v["error"].is_string(),
            "not the Director's or UAA's shape: {v}"
        );
        n += 1;
    }
    assert_eq!(n, 200);
    assert!(
        rss_kib() < rss0 + 64 * 1024,
        "memory grew by {} KiB",
        rss_kib().saturating_sub(rss0)
    );
    // Still answering, and still doing real work.
    lab.provide(&tok, "a", "after-burst").await;
    assert_eq!(panics(), before, "a request panicked");
}

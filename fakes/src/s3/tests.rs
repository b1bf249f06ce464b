//! In-process tests of the fake through its router: requests signed by the
//! `aws-sigv4` crate, verified by ours, checked against policies and state.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::probe::{error_code, signed_request};
use super::*;
use crate::clock::SimClock;
use crate::history::{calls, History};
use crate::store::{MemStore, SledStore};

const AK: &str = "rootadmin";
const SK: &str = "rootsecret123";

fn config() -> S3Config {
    S3Config {
        admin_access_key: AK.into(),
        admin_secret_key: SK.into(),
        region: "us-east-1".into(),
        backend: Default::default(),
    }
}

fn fake_on(store: Arc<dyn Store>) -> (S3Fake, History) {
    let history = History::new(SimClock::new());
    let fake = S3Fake::new(store, Gate::new(history.clone()), config()).unwrap();
    (fake, history)
}

fn fake() -> (S3Fake, History) {
    fake_on(Arc::new(MemStore::default()))
}

struct Reply {
    status: u16,
    body: Vec<u8>,
}

impl Reply {
    fn code(&self) -> Option<String> {
        error_code(&self.body)
    }
}

async fn send(fake: &S3Fake, req: http::Request<Vec<u8>>) -> Reply {
    let resp = fake.router().oneshot(req.map(Body::from)).await.unwrap();
    let status = resp.status().as_u16();
    assert!(
        resp.headers().get(crate::gate::ERROR_CODE_HEADER).is_none(),
        "the gate strips its header"
    );
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Reply { status, body }
}

fn signed(method: &str, path: &str, ak: &str, sk: &str, body: &[u8]) -> http::Request<Vec<u8>> {
    signed_at(method, path, ak, sk, body, SystemTime::now())
}

fn signed_at(
    method: &str,
    path: &str,
    ak: &str,
    sk: &str,
    body: &[u8],
    at: SystemTime,
) -> http::Request<Vec<u8>> {
    signed_request(
        method,
        &format!("http://127.0.0.1:9000{path}"),
        "us-east-1",
        ak,
        sk,
        body.to_vec(),
        at,
    )
    .unwrap()
}

async fn call(fake: &S3Fake, method: &str, path: &str, ak: &str, sk: &str, body: &[u8]) -> Reply {
    send(fake, signed(method, path, ak, sk, body)).await
}

/// Admin call on /rustfs (plain JSON bodies).
async fn admin(fake: &S3Fake, method: &str, route: &str, body: &[u8]) -> Reply {
    call(
        fake,
        method,
        &format!("/rustfs/admin/v3/{route}"),
        AK,
        SK,
        body,
    )
    .await
}

async fn add_user(fake: &S3Fake, ak: &str, sk: &str) {
    let body = serde_json::json!({"secretKey": sk, "status": "enabled"}).to_string();
    let r = admin(
        fake,
        "PUT",
        &format!("add-user?accessKey={ak}"),
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

fn bucket_policy(bucket: &str) -> String {
    serde_json::json!({"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:*"],
        "Resource":[format!("arn:aws:s3:::{bucket}"), format!("arn:aws:s3:::{bucket}/*")]}]})
    .to_string()
}

#[tokio::test]
async fn root_bucket_and_object_lifecycle() {
    let (f, _) = fake();
    assert_eq!(call(&f, "PUT", "/bkt1", AK, SK, b"").await.status, 200);
    let again = call(&f, "PUT", "/bkt1", AK, SK, b"").await;
    assert_eq!(
        (again.status, again.code().as_deref()),
        (409, Some("BucketAlreadyOwnedByYou"))
    );
    assert_eq!(
        call(
            &f,
            "PUT",
            "/bkt1/dir/hello%20world.txt",
            AK,
            SK,
            b"hi there"
        )
        .await
        .status,
        200
    );
    let got = call(&f, "GET", "/bkt1/dir/hello%20world.txt", AK, SK, b"").await;
    assert_eq!((got.status, got.body.as_slice()), (200, &b"hi there"[..]));
    let list = call(&f, "GET", "/bkt1?list-type=2&prefix=dir%2F", AK, SK, b"").await;
    assert!(String::from_utf8_lossy(&list.body).contains("<Key>dir/hello world.txt</Key>"));
    assert_eq!(call(&f, "HEAD", "/bkt1", AK, SK, b"").await.status, 200);
    let missing = call(&f, "GET", "/bkt1/nope", AK, SK, b"").await;
    assert_eq!(
        (missing.status, missing.code().as_deref()),
        (404, Some("NoSuchKey"))
    );
    let nb = call(&f, "GET", "/nobucket/k", AK, SK, b"").await;
    assert_eq!(
        (nb.status, nb.code().as_deref()),
        (404, Some("NoSuchBucket"))
    );
    let busy = call(&f, "DELETE", "/bkt1", AK, SK, b"").await;
    assert_eq!(
        (busy.status, busy.code().as_deref()),
        (409, Some("BucketNotEmpty"))
    );
    assert_eq!(
        call(&f, "DELETE", "/bkt1/dir/hello%20world.txt", AK, SK, b"")
            .await
            .status,
        204
    );
    assert_eq!(call(&f, "DELETE", "/bkt1", AK, SK, b"").await.status, 204);
    assert!(f.buckets().is_empty());
    let bad = call(&f, "PUT", "/Not_Valid", AK, SK, b"").await;
    assert_eq!(bad.code().as_deref(), Some("InvalidBucketName"));
}

#[tokio::test]
async fn signature_failures_have_real_codes() {
    let (f, _) = fake();
    let r = call(&f, "PUT", "/bkt", AK, "wrong-secret", b"").await;
    assert_eq!(
        (r.status, r.code().as_deref()),
        (403, Some("SignatureDoesNotMatch"))
    );
    let r = call(&f, "PUT", "/bkt", "nobody", "whatever1", b"").await;
    assert_eq!(
        (r.status, r.code().as_deref()),
        (403, Some("InvalidAccessKeyId"))
    );
    let old = SystemTime::now() - Duration::from_secs(20 * 60);
    let r = send(&f, signed_at("PUT", "/bkt", AK, SK, b"", old)).await;
    assert_eq!(
        (r.status, r.code().as_deref()),
        (403, Some("RequestTimeTooSkewed"))
    );
    let near = SystemTime::now() - Duration::from_secs(10 * 60);
    assert_eq!(
        send(&f, signed_at("PUT", "/bkt", AK, SK, b"", near))
            .await
            .status,
        200
    );

    // Same signature, different body: the payload hash no longer matches.
    let mut req = signed("PUT", "/bkt/k", AK, SK, b"original");
    *req.body_mut() = b"tampered".to_vec();
    let r = send(&f, req).await;
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("XAmzContentSHA256Mismatch"))
    );
    // Changing the signed hash too breaks the signature.
    let mut req = signed("PUT", "/bkt/k", AK, SK, b"original");
    let h = super::sigv4::sha256_hex(b"tampered");
    req.headers_mut()
        .insert("x-amz-content-sha256", h.parse().unwrap());
    *req.body_mut() = b"tampered".to_vec();
    assert_eq!(
        send(&f, req).await.code().as_deref(),
        Some("SignatureDoesNotMatch")
    );
    // A path changed after signing.
    let mut req = signed("GET", "/bkt/k", AK, SK, b"");
    *req.uri_mut() = "http://127.0.0.1:9000/bkt/other".parse().unwrap();
    assert_eq!(
        send(&f, req).await.code().as_deref(),
        Some("SignatureDoesNotMatch")
    );
    // Anonymous.
    let anon = http::Request::builder()
        .method("GET")
        .uri("/")
        .body(Vec::new())
        .unwrap();
    let r = send(&f, anon).await;
    assert_eq!((r.status, r.code().as_deref()), (403, Some("AccessDenied")));
}

#[tokio::test]
async fn unsigned_payload_and_aws_chunked_bodies() {
    let (f, _) = fake();
    call(&f, "PUT", "/bkt", AK, SK, b"").await;
    // Sign an aws-chunked upload by hand with our own key derivation (the
    // aws-sigv4 crate does not produce chunk signatures).
    let now = time::OffsetDateTime::now_utc();
    let fmt = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let amz = now.format(&fmt).unwrap();
    let date = &amz[..8];
    let scope = format!("{date}/us-east-1/s3/aws4_request");
    let key = super::sigv4::signing_key(SK, date, "us-east-1", "s3");
    let mut req = http::Request::builder()
        .method("PUT")
        .uri("http://127.0.0.1:9000/bkt/chunked")
        .header("host", "127.0.0.1:9000")
        .header("x-amz-date", &amz)
        .header("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
        .header("content-encoding", "aws-chunked")
        .body(Vec::new())
        .unwrap();
    let (parts, _) = req.into_parts();
    let auth0 = super::sigv4::Auth {
        access_key: AK.into(),
        scope_date: date.into(),
        region: "us-east-1".into(),
        service: "s3".into(),
        signed_headers: vec![
            "content-encoding".into(),
            "host".into(),
            "x-amz-content-sha256".into(),
            "x-amz-date".into(),
        ],
        signature: String::new(),
        amz_date: amz.clone(),
        presigned: None,
    };
    let creq =
        super::sigv4::canonical_request(&parts, &[], &auth0, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
            .unwrap();
    let mac = |k: &[u8], d: &str| {
        use hmac::Mac;
        let mut m = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(k).unwrap();
        m.update(d.as_bytes());
        hex::encode(m.finalize().into_bytes())
    };
    let seed = mac(
        &key,
        &format!(
            "AWS4-HMAC-SHA256\n{amz}\n{scope}\n{}",
            super::sigv4::sha256_hex(creq.as_bytes())
        ),
    );
    let empty = super::sigv4::sha256_hex(b"");
    let mut body = Vec::new();
    let mut prev = seed.clone();
    for chunk in [&b"hello "[..], &b"world"[..], &b""[..]] {
        let sig = mac(
            &key,
            &format!(
                "AWS4-HMAC-SHA256-PAYLOAD\n{amz}\n{scope}\n{prev}\n{empty}\n{}",
                super::sigv4::sha256_hex(chunk)
            ),
        );
        body.extend_from_slice(format!("{:x};chunk-signature={sig}\r\n", chunk.len()).as_bytes());
        body.extend_from_slice(chunk);
        body.extend_from_slice(b"\r\n");
        prev = sig;
    }
    req = http::Request::from_parts(parts, body.clone());
    req.headers_mut().insert(
        "authorization",
        format!("AWS4-HMAC-SHA256 Credential={AK}/{scope}, SignedHeaders=content-encoding;host;x-amz-content-sha256;x-amz-date, Signature={seed}")
            .parse()
            .unwrap(),
    );
    let (parts, _) = req.into_parts();
    let ok = send(&f, http::Request::from_parts(parts.clone(), body.clone())).await;
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
    assert_eq!(
        call(&f, "GET", "/bkt/chunked", AK, SK, b"").await.body,
        b"hello world"
    );
    // Flip one data byte: its chunk signature fails.
    let mut bad = body.clone();
    let at = bad.windows(5).position(|w| w == b"hello").unwrap();
    bad[at] = b'j';
    let r = send(&f, http::Request::from_parts(parts, bad)).await;
    assert_eq!(r.code().as_deref(), Some("SignatureDoesNotMatch"));
}

#[tokio::test]
async fn policies_limit_users_and_explicit_deny_wins() {
    let (f, _) = fake();
    call(&f, "PUT", "/mine", AK, SK, b"").await;
    call(&f, "PUT", "/theirs", AK, SK, b"").await;
    add_user(&f, "alice", "alicesecret1").await;
    // No policy yet: default deny.
    let r = call(&f, "PUT", "/mine/k", "alice", "alicesecret1", b"x").await;
    assert_eq!((r.status, r.code().as_deref()), (403, Some("AccessDenied")));
    assert_eq!(
        admin(
            &f,
            "PUT",
            "add-canned-policy?name=p-mine",
            bucket_policy("mine").as_bytes()
        )
        .await
        .status,
        200
    );
    let attach = serde_json::json!({"policies": ["p-mine"], "user": "alice"}).to_string();
    let r = admin(&f, "POST", "idp/builtin/policy/attach", attach.as_bytes()).await;
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["policiesAttached"], serde_json::json!(["p-mine"]));
    // RustFS: a change already in effect is success, the empty list left out.
    let again = admin(&f, "POST", "idp/builtin/policy/attach", attach.as_bytes()).await;
    assert_eq!(again.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&again.body).unwrap();
    assert!(v.get("policiesAttached").is_none(), "{v}");

    assert_eq!(
        call(&f, "PUT", "/mine/k", "alice", "alicesecret1", b"x")
            .await
            .status,
        200
    );
    let r = call(&f, "PUT", "/theirs/k", "alice", "alicesecret1", b"x").await;
    assert_eq!((r.status, r.code().as_deref()), (403, Some("AccessDenied")));
    let r = call(&f, "GET", "/", "alice", "alicesecret1", b"").await;
    let text = String::from_utf8_lossy(&r.body).to_string();
    assert!(
        text.contains("<Name>mine</Name>") && !text.contains("theirs"),
        "{text}"
    );

    let deny = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Deny","Action":["s3:Put*"],"Resource":["arn:aws:s3:::mine/locked/*"]}]}"#;
    admin(
        &f,
        "PUT",
        "add-canned-policy?name=deny-locked",
        deny.as_bytes(),
    )
    .await;
    let r = admin(
        &f,
        "PUT",
        "set-user-or-group-policy?policyName=p-mine,deny-locked&userOrGroup=alice&isGroup=false",
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        call(&f, "PUT", "/mine/locked/x", "alice", "alicesecret1", b"x")
            .await
            .code()
            .as_deref(),
        Some("AccessDenied")
    );
    assert_eq!(
        call(&f, "PUT", "/mine/open/x", "alice", "alicesecret1", b"x")
            .await
            .status,
        200
    );

    // A user is not an admin.
    let r = call(
        &f,
        "GET",
        "/rustfs/admin/v3/list-users",
        "alice",
        "alicesecret1",
        b"",
    )
    .await;
    assert_eq!((r.status, r.code().as_deref()), (403, Some("AccessDenied")));
    // RustFS: an s3s error, in XML.
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code><Message>Access Denied.</Message></Error>"
    );
    // Disabled users cannot authenticate.
    admin(
        &f,
        "PUT",
        "set-user-status?accessKey=alice&status=disabled",
        b"",
    )
    .await;
    assert_eq!(
        call(&f, "PUT", "/mine/k2", "alice", "alicesecret1", b"x")
            .await
            .code()
            .as_deref(),
        Some("InvalidAccessKeyId")
    );
}

#[tokio::test]
async fn add_canned_policy_replaces_the_document() {
    let (f, _) = fake();
    call(&f, "PUT", "/aaa", AK, SK, b"").await;
    call(&f, "PUT", "/bkt", AK, SK, b"").await;
    add_user(&f, "u01", "u1secret12").await;
    admin(
        &f,
        "PUT",
        "add-canned-policy?name=shared",
        bucket_policy("aaa").as_bytes(),
    )
    .await;
    admin(
        &f,
        "PUT",
        "set-policy?policyName=shared&userOrGroup=u01&isGroup=false",
        b"",
    )
    .await;
    assert_eq!(
        call(&f, "PUT", "/aaa/k", "u01", "u1secret12", b"x")
            .await
            .status,
        200
    );
    // A later grant reuses the name: the earlier user's permissions change.
    admin(
        &f,
        "PUT",
        "add-canned-policy?name=shared",
        bucket_policy("bkt").as_bytes(),
    )
    .await;
    assert_eq!(
        call(&f, "PUT", "/aaa/k", "u01", "u1secret12", b"x")
            .await
            .code()
            .as_deref(),
        Some("AccessDenied")
    );
    assert_eq!(
        call(&f, "PUT", "/bkt/k", "u01", "u1secret12", b"x")
            .await
            .status,
        200
    );
    let p = f
        .policies()
        .into_iter()
        .find(|p| p.name == "shared")
        .unwrap();
    assert_eq!(
        p.document["Statement"][0]["Resource"][0],
        "arn:aws:s3:::bkt"
    );
    let info = admin(&f, "GET", "info-canned-policy?name=shared", b"").await;
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&info.body).unwrap(),
        p.document
    );

    let bad = admin(&f, "PUT", "add-canned-policy?name=bad", b"{not json").await;
    assert_eq!(
        (bad.status, bad.code().as_deref()),
        (400, Some("InvalidRequest"))
    );
    // RustFS's info-canned-policy answers a missing policy as InternalError, in XML.
    let missing = admin(&f, "GET", "info-canned-policy?name=none", b"").await;
    assert_eq!(
        (missing.status, missing.code().as_deref()),
        (500, Some("InternalError"))
    );
    assert!(String::from_utf8_lossy(&missing.body).contains(
        "<Error><Code>InternalError</Code><Message>policy does not exist</Message></Error>"
    ));
    // add-user on an existing user rotates its secret and keeps its policies.
    add_user(&f, "u01", "rotated-secret").await;
    assert_eq!(
        call(&f, "PUT", "/bkt/k", "u01", "u1secret12", b"x")
            .await
            .code()
            .as_deref(),
        Some("SignatureDoesNotMatch")
    );
    assert_eq!(
        call(&f, "PUT", "/bkt/k", "u01", "rotated-secret", b"x")
            .await
            .status,
        200
    );
    let info = admin(&f, "GET", "user-info?accessKey=u01", b"").await;
    let v: serde_json::Value = serde_json::from_slice(&info.body).unwrap();
    assert_eq!(
        (v["policyName"].as_str(), v["status"].as_str()),
        (Some("shared"), Some("enabled"))
    );
    assert!(v.get("secretKey").is_none());
}

#[tokio::test]
async fn restart_over_the_same_sled_dir_keeps_state() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = sled::open(dir.path()).unwrap();
        let (f, _) = fake_on(Arc::new(SledStore::open(&db, "s3").unwrap()));
        call(&f, "PUT", "/keep", AK, SK, b"").await;
        call(&f, "PUT", "/keep/obj", AK, SK, b"data").await;
        add_user(&f, "bob", "bobsecret12").await;
        admin(
            &f,
            "PUT",
            "add-canned-policy?name=p-keep",
            bucket_policy("keep").as_bytes(),
        )
        .await;
        admin(
            &f,
            "PUT",
            "set-policy?policyName=p-keep&userOrGroup=bob&isGroup=false",
            b"",
        )
        .await;
    }
    let db = crate::store::reopen(dir.path());
    let (f, _) = fake_on(Arc::new(SledStore::open(&db, "s3").unwrap()));
    let users = f.users();
    assert_eq!(users.len(), 1);
    assert_eq!(
        (users[0].access_key.as_str(), users[0].policies.clone()),
        ("bob", vec!["p-keep".to_string()])
    );
    assert!(
        !format!("{:?}", users[0]).contains("bobsecret12"),
        "Debug redacts the secret"
    );
    assert_eq!(f.buckets()[0].name, "keep");
    assert_eq!(f.buckets()[0].objects, vec!["obj".to_string()]);
    assert!(f
        .policies()
        .iter()
        .any(|p| p.name == "p-keep" && !p.builtin));
    assert_eq!(
        call(&f, "GET", "/keep/obj", "bob", "bobsecret12", b"")
            .await
            .body,
        b"data"
    );
}

#[tokio::test]
async fn minio_admin_bodies_are_madmin_encrypted_both_ways() {
    let (f, _) = fake();
    let body = madmin::encrypt(SK, br#"{"secretKey":"carolsecret1","status":"enabled"}"#).unwrap();
    let r = call(
        &f,
        "PUT",
        "/minio/admin/v3/add-user?accessKey=carol",
        AK,
        SK,
        &body,
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(f.users()[0].secret_key, "carolsecret1");
    let r = call(&f, "GET", "/minio/admin/v3/list-users", AK, SK, b"").await;
    let plain = madmin::decrypt(SK, &r.body).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&plain).unwrap();
    assert_eq!(v["carol"]["status"], "enabled");
    // Plain JSON where madmin encrypts, or encrypted with another key: the real error.
    let r = call(
        &f,
        "PUT",
        "/minio/admin/v3/add-user?accessKey=dave",
        AK,
        SK,
        br#"{"secretKey":"davesecret1"}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("InvalidRequest"))
    );
    let other = madmin::encrypt("another-secret", br#"{"secretKey":"davesecret1"}"#).unwrap();
    let r = call(
        &f,
        "PUT",
        "/minio/admin/v3/add-user?accessKey=dave",
        AK,
        SK,
        &other,
    )
    .await;
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("InvalidRequest"))
    );
    // RustFS's router answers a route it does not have with NotImplemented.
    let r = call(&f, "GET", "/minio/admin/v3/no-such-api", AK, SK, b"").await;
    assert_eq!(
        (r.status, r.code().as_deref()),
        (501, Some("NotImplemented"))
    );
    let r = call(&f, "GET", "/minio/admin/v2/info", AK, SK, b"").await;
    assert_eq!(r.status, 501);
}

#[tokio::test]
async fn hostile_inputs_are_4xx_not_panics() {
    let (f, _) = fake();
    let garbage: &[&[u8]] = &[
        b"",
        b"\x00\xff\xfe",
        b"{",
        b"[1,2",
        &[0u8; 50],
        &[0xAB; 100],
    ];
    for g in garbage {
        for route in [
            "PUT /rustfs/admin/v3/add-user?accessKey=eve",
            "PUT /minio/admin/v3/add-user?accessKey=eve",
            "POST /minio/admin/v3/idp/builtin/policy/attach",
            "POST /rustfs/admin/v3/idp/builtin/policy/detach",
            "PUT /rustfs/admin/v3/add-canned-policy?name=x",
            "PUT /rustfs/admin/v3/set-user-status?accessKey=eve&status=sideways",
            "GET /rustfs/admin/v3/user-info",
        ] {
            let (m, p) = route.split_once(' ').unwrap();
            let r = call(&f, m, p, AK, SK, g).await;
            assert!(
                (400..500).contains(&r.status),
                "{route} with {g:?}: {}",
                r.status
            );
        }
    }
    for (auth, path) in [
        ("AWS4-HMAC-SHA256 Credential=%%%", "/bkt"),
        ("AWS4-HMAC-SHA256 Credential=a/b/c/d/aws4_request, SignedHeaders=host, Signature=00", "/bkt"),
        ("AWS4-HMAC-SHA256 Credential=rootadmin/20200101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00", "/bkt%ZZ"),
    ] {
        let req = http::Request::builder()
            .method("PUT")
            .uri(path)
            .header("authorization", auth)
            .header("x-amz-date", "20200101T000000Z")
            .body(Vec::new())
            .unwrap();
        let r = send(&f, req).await;
        assert!((400..500).contains(&r.status), "{auth}: {}", r.status);
    }
    let r = call(
        &f,
        "GET",
        "/bkt?list-type=2&continuation-token=zz",
        AK,
        SK,
        b"",
    )
    .await;
    assert!((400..500).contains(&r.status));
}

#[tokio::test]
async fn the_gate_names_callers_ops_and_subjects() {
    let (f, history) = fake();
    call(&f, "PUT", "/gbk", AK, SK, b"").await;
    add_user(&f, "wl1", "wlsecret123").await;
    call(&f, "PUT", "/gbk/obj", "wl1", "wlsecret123", b"x").await;
    admin(
        &f,
        "PUT",
        "add-canned-policy?name=pol",
        bucket_policy("gbk").as_bytes(),
    )
    .await;
    let cs = calls(&history.events());
    let got: Vec<(Component, Component, &str, &str, Option<u16>)> = cs
        .iter()
        .map(|c| {
            let status = match &c.outcome {
                Some(crate::history::Outcome::Http { status, .. }) => Some(*status),
                _ => None,
            };
            (c.from, c.to, c.op.as_str(), c.subject.as_str(), status)
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                Component::Driver,
                Component::S3,
                "create_bucket",
                "gbk",
                Some(200)
            ),
            (
                Component::Driver,
                Component::S3Admin,
                "add_user",
                "wl1",
                Some(200)
            ),
            (
                Component::Workload,
                Component::S3,
                "put_object",
                "gbk/obj",
                Some(403)
            ),
            (
                Component::Driver,
                Component::S3Admin,
                "add_canned_policy",
                "pol",
                Some(200)
            ),
        ]
    );
    match &cs[2].outcome {
        Some(crate::history::Outcome::Http { code, .. }) => {
            assert_eq!(code.as_deref(), Some("AccessDenied"))
        }
        o => panic!("{o:?}"),
    }
}

#[tokio::test]
async fn probe_talks_to_a_real_listener() {
    let (f, _) = fake();
    let listener = f.serve(crate::serve::loopback()).await.unwrap();
    let probe = S3Probe::new(listener.url(), "us-east-1");
    assert_eq!(
        probe.create_bucket(AK, SK, "pbk").await.unwrap().status,
        200
    );
    assert!(probe
        .put_object(AK, SK, "pbk", "a/b c+d~e.txt", "payload")
        .await
        .unwrap()
        .is_success());
    let got = probe
        .get_object(AK, SK, "pbk", "a/b c+d~e.txt")
        .await
        .unwrap();
    assert_eq!((got.status, got.body.as_slice()), (200, &b"payload"[..]));
    let bad = probe
        .put_object(AK, "wrong-secret", "pbk", "k", "x")
        .await
        .unwrap();
    assert_eq!(
        (bad.status, bad.code.as_deref()),
        (403, Some("SignatureDoesNotMatch"))
    );
    listener.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_attaches_lose_no_update() {
    let (f, _) = fake();
    add_user(&f, "racer", "racersecret1").await;
    for i in 0..12 {
        admin(
            &f,
            "PUT",
            &format!("add-canned-policy?name=p{i}"),
            bucket_policy(&format!("bkt{i}")).as_bytes(),
        )
        .await;
    }
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let f = f.clone();
            tokio::spawn(async move {
                let body =
                    serde_json::json!({"policies": [format!("p{i}")], "user": "racer"}).to_string();
                admin(&f, "POST", "idp/builtin/policy/attach", body.as_bytes())
                    .await
                    .status
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert_eq!(f.users()[0].policies.len(), 12);
}

#[tokio::test]
async fn written_since_reads_only_what_is_new_and_still_there() {
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    let (f, _) = fake_on(store.clone());
    let (w, c0) = f.written_since(WriteCursor::default());
    assert_eq!(
        w,
        WrittenNames::default(),
        "a fresh fake has written nothing"
    );
    add_user(&f, "alice", "alicesecret1").await;
    assert_eq!(call(&f, "PUT", "/bkt1", AK, SK, b"").await.status, 200);
    let (w, c1) = f.written_since(c0);
    assert_eq!(w.users, vec!["alice"]);
    assert_eq!(w.buckets, vec!["bkt1"]);
    // Nothing new: nothing read.
    let (w, c2) = f.written_since(c1);
    assert_eq!(w, WrittenNames::default());
    assert_eq!(c1, c2);
    // Written and gone before the next read: not reported (a listing would not show it).
    add_user(&f, "bob", "bobsecret123").await;
    admin(&f, "DELETE", "remove-user?accessKey=bob", b"").await;
    add_user(&f, "carol", "carolsecret1").await;
    let (w, c3) = f.written_since(c2);
    assert_eq!(w.users, vec!["carol"]);
    assert!(w.buckets.is_empty());
    // A fake reopened over the same store: an old cursor reads everything present.
    let (g, _) = fake_on(store);
    let (w, _) = g.written_since(c3);
    assert_eq!(w.users, vec!["alice", "carol"]);
    assert_eq!(w.buckets, vec!["bkt1"]);
    // user() / policy() read one record.
    assert_eq!(g.user("carol").map(|u| u.access_key), Some("carol".into()));
    assert!(g.user("bob").is_none());
    assert!(g.policy("readwrite").is_some_and(|p| p.builtin));
}

#[tokio::test]
async fn changed_since_names_every_put_and_removal_once() {
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    let (f, _) = fake_on(store.clone());
    // The first read from a default cursor: anything may have changed.
    let (first, c0) = f.changed_since(WriteCursor::default());
    assert!(first.is_none());
    add_user(&f, "alice", "alicesecret1").await;
    add_user(&f, "bob", "bobsecret123").await;
    admin(&f, "DELETE", "remove-user?accessKey=bob", b"").await;
    let doc = bucket_policy("bkt1");
    let put = |name: &'static str| admin(&f, "PUT", name, doc.as_bytes());
    assert_eq!(put("add-canned-policy?name=p1").await.status, 200);
    assert_eq!(put("add-canned-policy?name=p2").await.status, 200);
    let gone = admin(&f, "DELETE", "remove-canned-policy?name=p2", b"").await;
    assert_eq!(gone.status, 200);
    assert_eq!(call(&f, "PUT", "/bkt1", AK, SK, b"").await.status, 200);
    assert_eq!(call(&f, "PUT", "/bkt2", AK, SK, b"").await.status, 200);
    assert_eq!(call(&f, "DELETE", "/bkt2", AK, SK, b"").await.status, 204);
    let (changed, c1) = f.changed_since(c0);
    let changed = changed.expect("same instance");
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    assert_eq!(changed.users, names(&["alice", "bob"]), "removed ones too");
    assert_eq!(changed.policies, names(&["p1", "p2"]));
    assert_eq!(changed.buckets, names(&["bkt1", "bkt2"]));
    // An object written is its bucket changed; nothing else is.
    assert_eq!(call(&f, "PUT", "/bkt1/k", AK, SK, b"x").await.status, 200);
    let (changed, c2) = f.changed_since(c1);
    assert_eq!(
        changed,
        Some(ChangedNames {
            buckets: names(&["bkt1"]),
            ..Default::default()
        })
    );
    assert_eq!(f.bucket_objects("bkt1"), Some(vec!["k".to_string()]));
    assert_eq!(f.bucket_objects("bkt2"), None);
    assert_eq!(f.changed_since(c2).0, Some(ChangedNames::default()));
    // A fake reopened over the same store: the old cursor says nothing about it.
    let (g, _) = fake_on(store);
    assert!(g.changed_since(c2).0.is_none());
}

mod fidelity;

/// RustFS reads add-user's `status` as an enum with no default; MinIO takes
/// a missing one as enabled.
#[tokio::test]
async fn add_user_status_is_required_on_rustfs() {
    let (f, _) = fake();
    let r = admin(
        &f,
        "PUT",
        "add-user?accessKey=nostatus",
        br#"{"secretKey":"secret-123"}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("InvalidRequest"))
    );
    let r = admin(
        &f,
        "PUT",
        "add-user?accessKey=nostatus",
        br#"{"secretKey":"secret-123","status":"on"}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("InvalidRequest"))
    );
    assert!(f.users().is_empty());
}

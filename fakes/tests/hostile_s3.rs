//! Hostile requests to the S3 fake and its admin API over a real loopback
//! socket: bad, missing and stale signatures, a signature over another body,
//! oversized bodies and headers, traversal in bucket names, non-UTF-8, bad
//! policy JSON, unknown admin routes. Each must get the real server's error
//! shape (S3 `<Error><Code>` XML, MinIO's admin JSON, or — for what the HTTP
//! layer refuses before any handler, as Go's net/http does — a bare 4xx), and
//! no panic anywhere in the process.
//!
//! The fake checks request time against the wall clock (SigV4 dates are real
//! time, not the lab's virtual clock), with S3's 15-minute window.

mod common;
#[path = "../../fuzz/src/fakes_harness.rs"]
mod harness;

use std::net::SocketAddr;
use std::sync::Arc;

use common::{assert_huge_header_refused, panics, raw, rss_kib, watch_panics, Reply};
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::s3::{S3Config, S3Fake};
use drivelab_fakes::serve::loopback;
use drivelab_fakes::store::MemStore;

async fn start() -> (S3Fake, drivelab_fakes::serve::Listener) {
    let fake = S3Fake::new(
        Arc::new(MemStore::default()),
        Gate::new(History::new(SimClock::new())),
        S3Config {
            admin_access_key: harness::ROOT_AK.into(),
            admin_secret_key: harness::ROOT_SK.into(),
            region: "us-east-1".into(),
            backend: Default::default(),
        },
    )
    .expect("fake");
    let l = fake.serve(loopback()).await.expect("listen");
    (fake, l)
}

/// Send one request written in the fuzz harness's script form (signed as its
/// `x-fuzz-sign` says).
async fn script(addr: SocketAddr, text: &[u8]) -> Reply {
    let reqs = harness::parse_script(text);
    let r = reqs.first().expect("one request");
    let bytes = harness::wire(r).await.expect("expressible as HTTP");
    raw(addr, &bytes).await
}

#[track_caller]
fn s3_error(r: &Reply, status: u16, code: &str) {
    assert_eq!(r.status, status, "{} {}", r.head, r.text());
    assert!(r.text().starts_with("<?xml"), "not XML: {}", r.text());
    assert_eq!(r.s3_code().as_deref(), Some(code), "{}", r.text());
}

/// The default profile is RustFS, whose admin errors are s3s XML too.
#[track_caller]
fn admin_error(r: &Reply, status: u16, code: &str) {
    s3_error(r, status, code);
}

#[tokio::test]
async fn signatures_missing_bad_stale_or_over_another_body() {
    watch_panics();
    let before = panics();
    let (_f, l) = start().await;
    let a = l.addr;
    assert_eq!(
        script(a, b"PUT /bkt-ok\nx-fuzz-sign: root\n\n")
            .await
            .status,
        200
    );

    s3_error(&script(a, b"GET /bkt-ok\n\n").await, 403, "AccessDenied");
    s3_error(
        &script(a, b"GET /bkt-ok\nx-fuzz-sign: wrong\n\n").await,
        403,
        "SignatureDoesNotMatch",
    );
    s3_error(
        &script(
            a,
            b"GET /bkt-ok\nx-fuzz-sign: user nobody-here somesecret\n\n",
        )
        .await,
        403,
        "InvalidAccessKeyId",
    );
    s3_error(
        &script(a, b"GET /bkt-ok\nauthorization: AWS4-HMAC-SHA256 Credential=x\nx-amz-date: 20250101T000000Z\n\n").await,
        400,
        "AuthorizationHeaderMalformed",
    );
    s3_error(
        &script(a, b"GET /bkt-ok\nauthorization: AWS AKID:c2ln\n\n").await,
        400,
        "InvalidRequest",
    );
    // Signed over the hash of "other", sent with "body".
    let other = harness_sha(b"other");
    let req = format!("PUT /bkt-ok/k\nx-fuzz-sign: root\nx-amz-content-sha256: {other}\n\nbody");
    s3_error(
        &script(a, req.as_bytes()).await,
        400,
        "XAmzContentSHA256Mismatch",
    );
    s3_error(
        &script(
            a,
            b"PUT /bkt-ok/k\nx-fuzz-sign: root\nx-amz-content-sha256: not-a-hash\n\nbody",
        )
        .await,
        400,
        "InvalidArgument",
    );
    // 20 minutes old: outside S3's 15-minute window.
    s3_error(
        &script(a, b"GET /bkt-ok\nx-fuzz-sign: skew\n\n").await,
        403,
        "RequestTimeTooSkewed",
    );
    // Inside the window a replay is answered again, as S3 does (SigV4 has no nonce).
    let reqs = harness::parse_script(b"GET /bkt-ok\nx-fuzz-sign: root\n\n");
    let bytes = harness::wire(&reqs[0]).await.unwrap();
    assert_eq!(raw(a, &bytes).await.status, 200);
    assert_eq!(raw(a, &bytes).await.status, 200);
    // A presigned URL past its expiry.
    s3_error(
        &script(a, b"GET /bkt-ok?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=fuzzadmin%2F20200101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20200101T000000Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature=00\n\n").await,
        403,
        "AccessDenied",
    );
    assert_eq!(panics(), before, "a request panicked");
}

fn harness_sha(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

#[tokio::test]
async fn oversized_bodies_and_headers_are_refused_without_buffering() {
    watch_panics();
    let before = panics();
    let (_f, l) = start().await;
    let a = l.addr;
    // 10 GiB declared, nothing sent: refused on the header, not after reading.
    let rss0 = rss_kib();
    let r = raw(a, b"PUT /bkt-big/k HTTP/1.1\r\nhost: x\r\ncontent-length: 10737418240\r\nconnection: close\r\n\r\nabc").await;
    s3_error(&r, 400, "EntityTooLarge");
    let r = raw(a, b"PUT /rustfs/admin/v3/add-user?accessKey=abc HTTP/1.1\r\nhost: x\r\ncontent-length: 300000\r\nconnection: close\r\n\r\n").await;
    admin_error(&r, 400, "InvalidRequest");
    // A body just over the admin limit, really sent (chunked, no length declared).
    let mut req = b"PUT /rustfs/admin/v3/add-canned-policy?name=p HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n".to_vec();
    let chunk = vec![b'a'; 64 * 1024];
    for _ in 0..5 {
        req.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        req.extend_from_slice(&chunk);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    admin_error(&raw(a, &req).await, 400, "InvalidRequest");
    assert!(
        rss_kib() < rss0 + 64 * 1024,
        "memory grew by {} KiB",
        rss_kib() - rss0
    );

    // S3's 8 KiB header section.
    let big = "v".repeat(9000);
    let req = format!(
        "GET /bkt-big HTTP/1.1\r\nhost: x\r\nx-amz-meta-a: {big}\r\nconnection: close\r\n\r\n"
    );
    s3_error(
        &raw(a, req.as_bytes()).await,
        400,
        "RequestHeaderSectionTooLarge",
    );
    // Far past any sane size the HTTP layer refuses before a handler runs (431).
    assert_huge_header_refused(a, "/bkt-big").await;
    assert_eq!(panics(), before, "a request panicked");
}

#[tokio::test]
async fn traversal_names_and_non_utf8() {
    watch_panics();
    let before = panics();
    let (f, l) = start().await;
    let a = l.addr;
    for path in [
        "/..",
        "/%2e%2e",
        "/%2E%2E/x",
        "/a/../b",
        "/Bad_Name/k",
        "/.bkt/k",
        "/bkt..x",
    ] {
        for m in ["PUT", "GET", "DELETE"] {
            let req = format!("{m} {path}\nx-fuzz-sign: root\n\n");
            s3_error(&script(a, req.as_bytes()).await, 400, "InvalidBucketName");
        }
    }
    assert!(f.buckets().is_empty(), "a traversal name became a bucket");
    // A key whose bytes are not UTF-8.
    assert_eq!(
        script(a, b"PUT /bkt-u\nx-fuzz-sign: root\n\n").await.status,
        200
    );
    s3_error(
        &script(a, b"PUT /bkt-u/%FF%FE\nx-fuzz-sign: root\n\nx").await,
        400,
        "InvalidURI",
    );
    // Raw non-UTF-8 bytes in the request line and in a header value.
    let r = raw(
        a,
        b"GET /bkt-u/\xff\xfe HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!((400..500).contains(&r.status), "{}", r.head);
    let r = raw(a, b"GET /bkt-u HTTP/1.1\r\nhost: x\r\nx-amz-date: \xff\xfe\r\nauthorization: AWS4-HMAC-SHA256 Credential=fuzzadmin/20250101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00\r\nconnection: close\r\n\r\n").await;
    s3_error(&r, 403, "AccessDenied");
    // A non-UTF-8 JSON body on the admin API.
    let r = script(a, b"PUT /rustfs/admin/v3/add-user?accessKey=abcd\nx-fuzz-sign: root\n\n{\"secretKey\":\"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8\"}").await;
    admin_error(&r, 400, "InvalidRequest");
    assert_eq!(panics(), before, "a request panicked");
}

#[tokio::test]
async fn bad_policy_json_and_unknown_admin_routes() {
    watch_panics();
    let before = panics();
    let (f, l) = start().await;
    let a = l.addr;
    for body in [
        &b"not json"[..],
        b"{\"Version\":\"2012-10-17\",\"Statement\":[{\"Effect\":\"Maybe\"}]}",
        b"[]",
        b"{\"Statement\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
    ] {
        let mut req =
            b"PUT /rustfs/admin/v3/add-canned-policy?name=p1\nx-fuzz-sign: root\n\n".to_vec();
        req.extend_from_slice(body);
        admin_error(&script(a, &req).await, 400, "InvalidRequest");
    }
    assert!(
        f.policies().iter().all(|p| p.name != "p1"),
        "a malformed policy was stored"
    );
    for route in [
        "/minio/admin/v3/no-such-api",
        "/rustfs/admin/v3/",
        "/minio/admin/",
        "/minio/admin/v2/info",
    ] {
        let req = format!("GET {route}\nx-fuzz-sign: root\n\n");
        // RustFS's router: NotImplemented for a route it does not have.
        admin_error(&script(a, req.as_bytes()).await, 501, "NotImplemented");
    }
    // Not root: the admin API refuses before looking at the route.
    admin_error(
        &script(a, b"GET /minio/admin/v3/list-users\nx-fuzz-sign: wrong\n\n").await,
        403,
        "SignatureDoesNotMatch",
    );
    assert_eq!(panics(), before, "a request panicked");
}

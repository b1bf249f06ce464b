//! Issue 19: the backend profiles and the data path (ranges, metadata,
//! integrity, copy, delete-objects, multipart, virtual-host addressing).

use base64::Engine as _;

use super::*;

fn with_headers(
    mut req: http::Request<Vec<u8>>,
    headers: &[(&str, &str)],
) -> http::Request<Vec<u8>> {
    // Added after signing: unsigned headers, which SigV4 allows.
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            http::HeaderValue::from_str(v).unwrap(),
        );
    }
    req
}

async fn call_h(
    f: &S3Fake,
    method: &str,
    path: &str,
    body: &[u8],
    h: &[(&str, &str)],
) -> (Reply, http::HeaderMap) {
    let req = with_headers(signed(method, path, AK, SK, body), h);
    let resp = f.router().oneshot(req.map(Body::from)).await.unwrap();
    let headers = resp.headers().clone();
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (Reply { status, body }, headers)
}

fn md5_b64(data: &[u8]) -> String {
    use md5::Digest;
    base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(data))
}

#[tokio::test]
async fn ranges_metadata_and_integrity() {
    let (f, _) = fake();
    assert_eq!(call(&f, "PUT", "/data", AK, SK, b"").await.status, 200);
    let body: Vec<u8> = (0..100u8).collect();
    let md5 = md5_b64(&body);
    let (r, h) = call_h(
        &f,
        "PUT",
        "/data/obj",
        &body,
        &[("content-md5", &md5), ("x-amz-meta-color", "blue")],
    )
    .await;
    assert_eq!(r.status, 200);
    let etag = h["etag"].to_str().unwrap().to_string();
    assert_eq!(etag, format!("\"{}\"", integrity::md5_etag(&body)));
    let (r, h) = call_h(&f, "GET", "/data/obj", b"", &[("range", "bytes=10-19")]).await;
    assert_eq!((r.status, r.body.as_slice()), (206, &body[10..20]));
    assert_eq!(h["content-range"], "bytes 10-19/100");
    assert_eq!(h["x-amz-meta-color"], "blue");
    let (r, h) = call_h(&f, "GET", "/data/obj", b"", &[("range", "bytes=100-")]).await;
    assert_eq!((r.status, r.code().as_deref()), (416, Some("InvalidRange")));
    assert_eq!(h["content-range"], "bytes */100");
    let (r, _) = call_h(&f, "PUT", "/data/bad", b"abc", &[("content-md5", &md5)]).await;
    assert_eq!(r.code().as_deref(), Some("BadDigest"));
    let (r, _) = call_h(
        &f,
        "PUT",
        "/data/bad",
        b"abc",
        &[("x-amz-checksum-crc32", "AAAAAA==")],
    )
    .await;
    assert_eq!(r.code().as_deref(), Some("BadDigest"));
    let sha = integrity::checksum("sha256", b"abc").unwrap();
    let (r, h) = call_h(
        &f,
        "PUT",
        "/data/good",
        b"abc",
        &[("x-amz-checksum-sha256", &sha)],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(h["x-amz-checksum-sha256"].to_str().unwrap(), sha);
    let (r, _) = call_h(
        &f,
        "PUT",
        "/data/x",
        b"abc",
        &[("x-amz-server-side-encryption", "AES256")],
    )
    .await;
    assert_eq!(
        (r.status, r.code().as_deref()),
        (501, Some("NotImplemented"))
    );
    assert!(
        f.buckets()[0]
            .objects
            .iter()
            .all(|k| k != "bad" && k != "x"),
        "a refused PUT stored bytes"
    );
}

#[tokio::test]
async fn copy_delete_objects_multipart_and_virtual_host() {
    let (f, _) = fake();
    assert_eq!(call(&f, "PUT", "/mpu", AK, SK, b"").await.status, 200);
    let (r, _) = call_h(
        &f,
        "PUT",
        "/mpu/copy",
        b"",
        &[("x-amz-copy-source", "/mpu/missing")],
    )
    .await;
    assert_eq!(r.code().as_deref(), Some("NoSuchKey"));
    assert_eq!(
        call(&f, "PUT", "/mpu/src", AK, SK, b"source").await.status,
        200
    );
    let (r, _) = call_h(
        &f,
        "PUT",
        "/mpu/copy",
        b"",
        &[("x-amz-copy-source", "mpu/src")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        call(&f, "GET", "/mpu/copy", AK, SK, b"").await.body,
        b"source"
    );

    // Multipart: a 5 MiB part and a short last one; the ETag is md5-of-md5s "-2".
    let r = call(&f, "POST", "/mpu/big?uploads", AK, SK, b"").await;
    let xml = String::from_utf8(r.body).unwrap();
    let id = objects::xml_texts(&xml, "UploadId")[0].to_string();
    let p1 = vec![7u8; 5 * 1024 * 1024];
    let mut etags = vec![];
    for (n, data) in [(1, p1.as_slice()), (2, b"tail".as_slice())] {
        let (r, h) = call_h(
            &f,
            "PUT",
            &format!("/mpu/big?partNumber={n}&uploadId={id}"),
            data,
            &[],
        )
        .await;
        assert_eq!(r.status, 200);
        etags.push(h["etag"].to_str().unwrap().trim_matches('"').to_string());
    }
    let listed = call(&f, "GET", &format!("/mpu/big?uploadId={id}"), AK, SK, b"").await;
    assert_eq!(
        objects::xml_texts(std::str::from_utf8(&listed.body).unwrap(), "Part").len(),
        2
    );
    let out_of_order = format!("<CompleteMultipartUpload><Part><PartNumber>2</PartNumber><ETag>\"{}\"</ETag></Part><Part><PartNumber>1</PartNumber><ETag>\"{}\"</ETag></Part></CompleteMultipartUpload>", etags[1], etags[0]);
    let r = call(
        &f,
        "POST",
        &format!("/mpu/big?uploadId={id}"),
        AK,
        SK,
        out_of_order.as_bytes(),
    )
    .await;
    assert_eq!(r.code().as_deref(), Some("InvalidPartOrder"));
    let done = format!("<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>\"{}\"</ETag></Part><Part><PartNumber>2</PartNumber><ETag>\"{}\"</ETag></Part></CompleteMultipartUpload>", etags[0], etags[1]);
    let r = call(
        &f,
        "POST",
        &format!("/mpu/big?uploadId={id}"),
        AK,
        SK,
        done.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let (_, h) = call_h(&f, "HEAD", "/mpu/big", b"", &[]).await;
    assert_eq!(
        h["etag"].to_str().unwrap(),
        format!("\"{}\"", integrity::multipart_etag(&etags))
    );
    assert_eq!(h["content-length"], (p1.len() + 4).to_string().as_str());
    let r = call(
        &f,
        "DELETE",
        &format!("/mpu/big?uploadId={id}"),
        AK,
        SK,
        b"",
    )
    .await;
    assert_eq!(r.code().as_deref(), Some("NoSuchUpload"));

    let del = b"<Delete><Object><Key>src</Key></Object><Object><Key>copy</Key></Object></Delete>";
    let r = call(&f, "POST", "/mpu?delete", AK, SK, del).await;
    assert_eq!(
        objects::xml_texts(std::str::from_utf8(&r.body).unwrap(), "Deleted").len(),
        2
    );
    assert_eq!(f.buckets()[0].objects, vec!["big".to_string()]);

    // Virtual-host style on BUCKET.localhost: the key is the whole path.
    let req = signed_request(
        "PUT",
        "http://mpu.localhost:9000/vh/key",
        "us-east-1",
        AK,
        SK,
        b"v".to_vec(),
        SystemTime::now(),
    )
    .unwrap();
    assert_eq!(send(&f, req).await.status, 200);
    assert!(f.buckets()[0].objects.contains(&"vh/key".to_string()));
    assert!(
        f.buckets().iter().all(|b| b.name != "vh"),
        "a virtual-host PUT made a bucket"
    );
}

fn fake_with(backend: Backend, region: &str) -> S3Fake {
    let cfg = S3Config {
        region: region.into(),
        backend,
        ..config()
    };
    S3Fake::new(
        Arc::new(MemStore::default()),
        Gate::new(History::new(SimClock::new())),
        cfg,
    )
    .unwrap()
}

#[tokio::test]
async fn backend_profiles_and_regions() {
    let long = "s".repeat(64);
    for backend in Backend::ALL {
        let f = fake_with(backend, "");
        add_user_on(&f, backend, "longsecret", &long).await;
        let pol = admin_on(
            &f,
            backend,
            "PUT",
            "add-canned-policy?name=p",
            bucket_policy("b").as_bytes(),
        )
        .await;
        assert_eq!(pol.status, 200);
        let set = admin_on(
            &f,
            backend,
            "PUT",
            "set-user-or-group-policy?policyName=p&userOrGroup=longsecret&isGroup=false",
            b"",
        )
        .await;
        assert_eq!(set.status, 200);
        let r = admin_on(&f, backend, "DELETE", "remove-canned-policy?name=p", b"").await;
        let want = match backend {
            Backend::Minio => (400, "XMinioAdminPolicyInUse"),
            Backend::Rustfs => (500, "InternalError"),
        };
        assert_eq!(
            (r.status, r.code().as_deref()),
            (want.0, Some(want.1)),
            "{backend}"
        );
        assert!(f.policy("p").is_some() && f.user("longsecret").unwrap().policies == ["p"]);
        let r = admin_on(
            &f,
            backend,
            "GET",
            "list-service-accounts?user=longsecret",
            b"",
        )
        .await;
        assert_eq!(r.status, 501, "{backend}");
        assert!(String::from_utf8_lossy(&r.body).contains("list-service-accounts"));
        // The 64-character secret signs data-plane requests.
        let req = signed_request(
            "GET",
            "http://127.0.0.1:9000/",
            "eu-north-1",
            "longsecret",
            &long,
            vec![],
            SystemTime::now(),
        )
        .unwrap();
        assert_ne!(
            send(&f, req).await.code().as_deref(),
            Some("SignatureDoesNotMatch")
        );
    }
    // MinIO has no /rustfs/admin: it is an S3 path (bucket "rustfs").
    let f = fake_with(Backend::Minio, "us-east-1");
    let r = admin(&f, "GET", "list-users", b"").await;
    assert_eq!(r.code().as_deref(), Some("NoSuchBucket"));
    // A configured region is enforced.
    let req = signed_request(
        "GET",
        "http://127.0.0.1:9000/",
        "eu-north-1",
        AK,
        SK,
        vec![],
        SystemTime::now(),
    )
    .unwrap();
    assert_eq!(
        send(&f, req).await.code().as_deref(),
        Some("AuthorizationHeaderMalformed")
    );
}

async fn admin_on(f: &S3Fake, backend: Backend, method: &str, route: &str, body: &[u8]) -> Reply {
    match backend {
        Backend::Rustfs => admin(f, method, route, body).await,
        Backend::Minio => call(f, method, &format!("/minio/admin/v3/{route}"), AK, SK, body).await,
    }
}

async fn add_user_on(f: &S3Fake, backend: Backend, ak: &str, sk: &str) {
    let plain = serde_json::json!({"secretKey": sk, "status": "enabled"}).to_string();
    let body = match backend {
        Backend::Rustfs => plain.into_bytes(),
        Backend::Minio => madmin::encrypt(SK, plain.as_bytes()).unwrap(),
    };
    let r = admin_on(
        f,
        backend,
        "PUT",
        &format!("add-user?accessKey={ak}"),
        &body,
    )
    .await;
    assert_eq!(
        r.status,
        200,
        "{backend}: {}",
        String::from_utf8_lossy(&r.body)
    );
}

/// Each profile answers a missing user or policy as its server's handler
/// does: RustFS per handler in s3s XML, MinIO with its admin JSON codes.
#[tokio::test]
async fn a_missing_user_or_policy_is_answered_as_each_server_does() {
    let cases: [(&str, &str, Backend, u16, &str); 12] = [
        (
            "DELETE",
            "remove-user?accessKey=rootadmin",
            Backend::Rustfs,
            400,
            "InvalidArgument",
        ),
        (
            "PUT",
            "set-user-status?accessKey=rootadmin&status=disabled",
            Backend::Rustfs,
            400,
            "InvalidArgument",
        ),
        (
            "GET",
            "user-info?accessKey=ghost",
            Backend::Rustfs,
            404,
            "NoSuchResource",
        ),
        (
            "DELETE",
            "remove-user?accessKey=ghost",
            Backend::Rustfs,
            500,
            "InternalError",
        ),
        (
            "PUT",
            "set-user-status?accessKey=ghost&status=enabled",
            Backend::Rustfs,
            500,
            "InternalError",
        ),
        (
            "GET",
            "info-canned-policy?name=ghost",
            Backend::Rustfs,
            500,
            "InternalError",
        ),
        (
            "DELETE",
            "remove-canned-policy?name=ghost",
            Backend::Rustfs,
            200,
            "",
        ),
        (
            "PUT",
            "set-user-or-group-policy?policyName=ghost&userOrGroup=ghost&isGroup=false",
            Backend::Rustfs,
            400,
            "InvalidArgument",
        ),
        (
            "GET",
            "user-info?accessKey=ghost",
            Backend::Minio,
            404,
            "XMinioAdminNoSuchUser",
        ),
        (
            "DELETE",
            "remove-user?accessKey=ghost",
            Backend::Minio,
            404,
            "XMinioAdminNoSuchUser",
        ),
        (
            "GET",
            "info-canned-policy?name=ghost",
            Backend::Minio,
            404,
            "XMinioAdminNoSuchPolicy",
        ),
        (
            "DELETE",
            "remove-canned-policy?name=ghost",
            Backend::Minio,
            404,
            "XMinioAdminNoSuchPolicy",
        ),
    ];
    for (method, route, backend, status, code) in cases {
        let f = fake_with(backend, "us-east-1");
        let r = admin_on(&f, backend, method, route, b"").await;
        assert_eq!(
            (r.status, r.code().unwrap_or_default().as_str()),
            (status, code),
            "{backend} {method} {route}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let body = String::from_utf8_lossy(&r.body);
        match (backend, status) {
            (_, 200) => {}
            (Backend::Rustfs, _) => assert!(
                body.starts_with("<?xml") && !body.contains("<Resource>"),
                "{body}"
            ),
            (Backend::Minio, _) => assert!(body.starts_with('{'), "{body}"),
        }
    }
}

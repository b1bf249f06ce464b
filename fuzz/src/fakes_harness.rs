//! Fuzz harness for the fakes' request handling: shared by the cargo-fuzz
//! targets (`fuzz/fuzz_targets/*.rs`) and by `fakes/tests/fuzz_replay.rs`, which
//! replays every committed corpus and regression input under `make test`.
//!
//! An input is a small text script of HTTP requests (readable seeds, and
//! libFuzzer's mutations stay mostly well-formed), requests separated by
//! `\n~~~\n`:
//!
//! ```text
//! METHOD TARGET
//! header: value
//! x-fuzz-sign: root
//!
//! body bytes…
//! ```
//!
//! The pseudo-header `x-fuzz-sign: MODE` makes the harness sign the request
//! with SigV4 (`root`, `wrong` secret, `skew` 20 minutes old, `chunked`
//! aws-chunked body, `presign` query auth, `user AK SK`); without it the
//! request goes exactly as written. Each input runs against a fresh fake over
//! an in-memory store, so state (and memory) never carries over between runs.
//! A panic, a hang (10 s), a 500, or an error not in the real server's shape
//! is a crash.
//!
//! Adding a target for another HTTP fake is one function here (build the
//! router, pick the error-shape check) and a three-line file in fuzz_targets/.

#![allow(dead_code)]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::s3::{S3Config, S3Fake};
use drivelab_fakes::store::{MemStore, Store};
use hmac::{Hmac, Mac};
use http::{HeaderName, HeaderValue, Method, Uri};
use sha2::{Digest, Sha256};
use tower::ServiceExt;

/// Separates the requests of one input.
pub const SEP: &[u8] = b"\n~~~\n";
/// The fuzzed S3 fake's root credentials.
pub const ROOT_AK: &str = "fuzzadmin";
/// Root secret (also keys the madmin bodies on `/minio/admin`).
pub const ROOT_SK: &str = "fuzzadmin-secret";
const REGION: &str = "us-east-1";
const HOST: &str = "127.0.0.1:9000";
/// More requests than this per input add nothing but time.
const MAX_REQUESTS: usize = 16;
/// Answers are read up to this size (bodies a fuzzer can make are far smaller).
const MAX_RESPONSE: usize = 8 << 20;
/// A request that takes longer than this has hung.
const HANG: Duration = Duration::from_secs(10);

/// One request of a script, as written (not yet validated as HTTP).
#[derive(Debug, Clone, Default)]
pub struct RawRequest {
    pub method: Vec<u8>,
    pub target: Vec<u8>,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub sign: Option<String>,
    /// `x-fuzz-seal`: madmin-encrypt the body with the root secret (PBKDF2 scheme).
    pub seal: bool,
    pub body: Vec<u8>,
}

fn split<'a>(mut data: &'a [u8], sep: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    while let Some(i) = data.windows(sep.len()).position(|w| w == sep) {
        out.push(&data[..i]);
        data = &data[i + sep.len()..];
    }
    out.push(data);
    out
}

fn trim_cr(l: &[u8]) -> &[u8] {
    l.strip_suffix(b"\r").unwrap_or(l)
}

/// The requests of a script (at most [`MAX_REQUESTS`]).
pub fn parse_script(data: &[u8]) -> Vec<RawRequest> {
    split(data, SEP)
        .into_iter()
        .take(MAX_REQUESTS)
        .filter_map(parse_request)
        .collect()
}

fn parse_request(chunk: &[u8]) -> Option<RawRequest> {
    let (head, body) = match chunk.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&chunk[..i], &chunk[i + 2..]),
        None => (chunk, &[][..]),
    };
    let mut lines = head.split(|&b| b == b'\n').map(trim_cr);
    let first = lines.next()?;
    let sp = first.iter().position(|&b| b == b' ')?;
    let mut r = RawRequest {
        method: first[..sp].to_vec(),
        target: first[sp + 1..].to_vec(),
        body: body.to_vec(),
        ..Default::default()
    };
    for l in lines {
        let Some(c) = l.iter().position(|&b| b == b':') else {
            continue;
        };
        let name = l[..c].to_vec();
        let mut value = &l[c + 1..];
        while let Some(v) = value.strip_prefix(b" ") {
            value = v;
        }
        if name.eq_ignore_ascii_case(b"x-fuzz-sign") {
            r.sign = Some(String::from_utf8_lossy(value).into_owned());
        } else if name.eq_ignore_ascii_case(b"x-fuzz-seal") {
            r.seal = true;
        } else {
            r.headers.push((name, value.to_vec()));
        }
    }
    Some(r)
}

// ---- SigV4, written from the spec (the fake's verifier is the thing under test)

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("hmac takes any key");
    m.update(data);
    m.finalize().into_bytes().into()
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn uri_encode(input: &[u8], keep_slash: bool) -> String {
    let mut out = String::new();
    for &b in input {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(s: &[u8], plus_as_space: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let hex = s
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (s[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) if plus_as_space => {
                out.push(b' ');
                i += 1;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

struct Signer<'a> {
    access_key: &'a str,
    secret: &'a str,
    when: time::OffsetDateTime,
}

impl Signer<'_> {
    fn dates(&self) -> (String, String) {
        let f = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
        let amz = self.when.format(&f).unwrap_or_default();
        (amz.clone(), amz[..8.min(amz.len())].to_string())
    }

    fn key(&self, date: &str) -> [u8; 32] {
        let k = hmac(format!("AWS4{}", self.secret).as_bytes(), date.as_bytes());
        let k = hmac(&k, REGION.as_bytes());
        let k = hmac(&k, b"s3");
        hmac(&k, b"aws4_request")
    }

    fn canonical_query(query: &[u8], skip_signature: bool) -> String {
        let mut pairs: Vec<(String, String)> = query
            .split(|&b| b == b'&')
            .filter(|p| !p.is_empty())
            .map(|p| match p.iter().position(|&b| b == b'=') {
                Some(i) => (&p[..i], &p[i + 1..]),
                None => (p, &[][..]),
            })
            .filter(|(k, _)| !(skip_signature && *k == b"X-Amz-Signature"))
            .map(|(k, v)| {
                (
                    uri_encode(&percent_decode(k, true), false),
                    uri_encode(&percent_decode(v, true), false),
                )
            })
            .collect();
        pairs.sort();
        pairs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&")
    }

    fn signature(&self, creq: &str, amz: &str, date: &str) -> String {
        let scope = format!("{date}/{REGION}/s3/aws4_request");
        let sts = format!(
            "AWS4-HMAC-SHA256\n{amz}\n{scope}\n{}",
            sha256_hex(creq.as_bytes())
        );
        hex::encode(hmac(&self.key(date), sts.as_bytes()))
    }

    /// Header auth: adds x-amz-date, x-amz-content-sha256 (unless the script set
    /// one, which may lie about the body) and Authorization.
    fn sign(&self, req: &mut http::Request<Body>, body: &mut Vec<u8>, chunked: bool) {
        let (amz, date) = self.dates();
        let h = req.headers_mut();
        h.insert("host", HeaderValue::from_static(HOST));
        if let Ok(v) = HeaderValue::from_str(&amz) {
            h.insert("x-amz-date", v);
        }
        if chunked {
            h.insert(
                "x-amz-content-sha256",
                HeaderValue::from_static("STREAMING-AWS4-HMAC-SHA256-PAYLOAD"),
            );
        } else if !h.contains_key("x-amz-content-sha256") {
            if let Ok(v) = HeaderValue::from_str(&sha256_hex(body)) {
                h.insert("x-amz-content-sha256", v);
            }
        }
        let payload = h
            .get("x-amz-content-sha256")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        let path = req.uri().path().as_bytes();
        let cpath = uri_encode(&percent_decode(path, false), true);
        let cquery = Self::canonical_query(req.uri().query().unwrap_or("").as_bytes(), false);
        let creq = format!(
            "{}\n{}\n{cquery}\nhost:{HOST}\nx-amz-content-sha256:{payload}\nx-amz-date:{amz}\n\nhost;x-amz-content-sha256;x-amz-date\n{payload}",
            req.method(),
            if cpath.is_empty() { "/".into() } else { cpath }
        );
        let sig = self.signature(&creq, &amz, &date);
        if chunked {
            *body = self.chunk(body, &amz, &date, &sig);
        }
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential={}/{date}/{REGION}/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={sig}",
            self.access_key
        );
        if let Ok(v) = HeaderValue::from_str(&auth) {
            req.headers_mut().insert("authorization", v);
        }
    }

    /// aws-chunked encoding with chunk signatures chained from the seed.
    fn chunk(&self, data: &[u8], amz: &str, date: &str, seed: &str) -> Vec<u8> {
        let key = self.key(date);
        let scope = format!("{date}/{REGION}/s3/aws4_request");
        let empty = sha256_hex(b"");
        let mut prev = seed.to_string();
        let mut out = Vec::new();
        let mut pieces: Vec<&[u8]> = data.chunks(64).collect();
        pieces.push(&[]);
        for p in pieces {
            let sts = format!(
                "AWS4-HMAC-SHA256-PAYLOAD\n{amz}\n{scope}\n{prev}\n{empty}\n{}",
                sha256_hex(p)
            );
            prev = hex::encode(hmac(&key, sts.as_bytes()));
            out.extend_from_slice(format!("{:x};chunk-signature={prev}\r\n", p.len()).as_bytes());
            out.extend_from_slice(p);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    /// Query (presigned URL) auth, signed over the host header only.
    fn presign(&self, req: &mut http::Request<Body>) {
        let (amz, date) = self.dates();
        req.headers_mut()
            .insert("host", HeaderValue::from_static(HOST));
        let cred = format!("{}/{date}/{REGION}/s3/aws4_request", self.access_key);
        let extra = format!(
            "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={}&X-Amz-Date={amz}&X-Amz-Expires=300&X-Amz-SignedHeaders=host",
            uri_encode(cred.as_bytes(), false)
        );
        let query = match req.uri().query() {
            Some(q) if !q.is_empty() => format!("{q}&{extra}"),
            _ => extra,
        };
        let path = req.uri().path().to_string();
        let cpath = uri_encode(&percent_decode(path.as_bytes(), false), true);
        let creq = format!(
            "{}\n{}\n{}\nhost:{HOST}\n\nhost\nUNSIGNED-PAYLOAD",
            req.method(),
            if cpath.is_empty() { "/".into() } else { cpath },
            Self::canonical_query(query.as_bytes(), true)
        );
        let sig = self.signature(&creq, &amz, &date);
        if let Ok(u) = format!("{path}?{query}&X-Amz-Signature={sig}").parse::<Uri>() {
            *req.uri_mut() = u;
        }
    }
}

/// The request as http types (`None`: not expressible as HTTP, which hyper
/// would have refused before any fake saw it).
fn build(r: &RawRequest) -> Option<http::Request<Body>> {
    let method = Method::from_bytes(&r.method).ok()?;
    let uri = Uri::try_from(r.target.as_slice()).ok()?;
    if uri.path().is_empty() || !uri.path().starts_with('/') {
        return None;
    }
    let mut req = http::Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
        .ok()?;
    for (n, v) in &r.headers {
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(n), HeaderValue::from_bytes(v)) {
            req.headers_mut().append(n, v);
        }
    }
    let mut body = r.body.clone();
    if r.seal {
        // PBKDF2 rather than Argon2id: the same framing at a few ms, not ~100.
        body = drivelab_fakes::s3::madmin::encrypt_with(
            ROOT_SK,
            &body,
            drivelab_fakes::s3::madmin::Scheme::Pbkdf2AesGcm,
            [1; 32],
            [2; 8],
        )
        .expect("sealing cannot fail");
    }
    if let Some(mode) = &r.sign {
        let now = time::OffsetDateTime::now_utc();
        let mut words = mode.split_whitespace();
        let (ak, sk, when, chunked, presign) = match words.next().unwrap_or("") {
            "root" => (ROOT_AK.to_string(), ROOT_SK.to_string(), now, false, false),
            "wrong" => (ROOT_AK.into(), "not-the-secret".into(), now, false, false),
            "skew" => (
                ROOT_AK.into(),
                ROOT_SK.into(),
                now - time::Duration::minutes(20),
                false,
                false,
            ),
            "chunked" => (ROOT_AK.into(), ROOT_SK.into(), now, true, false),
            "presign" => (ROOT_AK.into(), ROOT_SK.into(), now, false, true),
            "user" => (
                words.next().unwrap_or("").to_string(),
                words.next().unwrap_or("").to_string(),
                now,
                false,
                false,
            ),
            _ => (ROOT_AK.into(), ROOT_SK.into(), now, false, false),
        };
        let s = Signer {
            access_key: &ak,
            secret: &sk,
            when,
        };
        if presign {
            s.presign(&mut req);
        } else {
            s.sign(&mut req, &mut body, chunked);
        }
    }
    *req.body_mut() = Body::from(body);
    Some(req)
}

/// The request as HTTP/1.1 bytes for a real socket (signed as the script
/// says, `Connection: close`, Content-Length set); for the hostile tests.
pub async fn wire(r: &RawRequest) -> Option<Vec<u8>> {
    let req = build(r)?;
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.ok()?;
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = format!("{} {target} HTTP/1.1\r\n", parts.method).into_bytes();
    for (n, v) in &parts.headers {
        if n == http::header::CONTENT_LENGTH || n == http::header::CONNECTION {
            continue;
        }
        out.extend_from_slice(n.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !parts.headers.contains_key("host") {
        out.extend_from_slice(format!("host: {HOST}\r\n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(&body);
    Some(out)
}

/// An answer as the harness saw it.
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

/// `FUZZ_TRACE=1`: print every request's answer (to see what a seed reaches).
fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("FUZZ_TRACE").is_some())
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("tokio runtime")
    })
}

/// What a watch stream sent until it went quiet for a moment (bounded in size).
async fn watch_events(body: axum::body::Body) -> bytes::Bytes {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut out = Vec::new();
    while out.len() < MAX_RESPONSE {
        let quiet = std::time::Duration::from_millis(100);
        match tokio::time::timeout(quiet, body.frame()).await {
            Ok(Some(Ok(f))) => {
                if let Ok(data) = f.into_data() {
                    out.extend_from_slice(&data);
                }
            }
            _ => break,
        }
    }
    out.into()
}

/// Send every request of `data` through `router`; `check` judges each answer.
fn run_script(
    router: Router,
    data: &[u8],
    prepare: fn(&mut RawRequest),
    check: fn(&http::Method, &str, &Answer),
) {
    let mut reqs = parse_script(data);
    reqs.iter_mut().for_each(prepare);
    runtime().block_on(async move {
        for r in &reqs {
            let Some(req) = build(r) else { continue };
            let method = req.method().clone();
            let path = req.uri().path().to_string();
            let watch = drivelab_fakes::kube::is_watch(req.uri().query());
            let fut = async {
                let resp = router.clone().oneshot(req).await.expect("infallible");
                let (parts, body) = resp.into_parts();
                // A served watch streams until its timeout: take what it has
                // sent once it goes quiet, as a client reading events would.
                let body = if watch && parts.status.is_success() {
                    watch_events(body).await
                } else {
                    axum::body::to_bytes(body, MAX_RESPONSE)
                        .await
                        .expect("answer body readable")
                };
                Answer {
                    status: parts.status.as_u16(),
                    headers: parts.headers,
                    body: body.to_vec(),
                }
            };
            let answer = tokio::time::timeout(HANG, fut)
                .await
                .unwrap_or_else(|_| panic!("{method} {path}: no answer within {HANG:?}"));
            if trace() {
                eprintln!(
                    "{method} {path} -> {} {}",
                    answer.status,
                    text(&answer.body)
                );
            }
            check(&method, &path, &answer);
        }
    });
}

fn s3_fake() -> S3Fake {
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    S3Fake::new(
        store,
        Gate::new(History::new(SimClock::new())),
        S3Config {
            admin_access_key: ROOT_AK.into(),
            admin_secret_key: ROOT_SK.into(),
            region: REGION.into(),
            backend: Default::default(),
        },
    )
    .expect("fuzz S3 config is valid")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(400)]).into_owned()
}

/// 500s are bugs in a fake over an in-memory store; 501 (not implemented) is
/// honest, and so are the 500s the real servers answer: RustFS's admin
/// handlers answer several refusals as InternalError (a policy in use or
/// built-in, a user or policy that does not exist where `is_temp_user` or
/// `info_policy` is asked, add-user's key rules: `backend.rs` cites each),
/// and the API server's server-side apply of a configuration with a field
/// its type does not declare (structured-merge-diff's plain `failed to
/// create typed patch object` error). The fake's own failures always say
/// "We encountered an internal error" (`ApiError::internal`).
fn no_server_error(method: &Method, path: &str, a: &Answer) {
    let body = String::from_utf8_lossy(&a.body);
    let rustfs_refusal = (path.starts_with("/rustfs/admin/") || path.starts_with("/minio/admin/"))
        && a.status == 500
        && body.contains("<Code>InternalError</Code>")
        && !body.contains("We encountered an internal error");
    let untyped_apply = *method == Method::PATCH
        && a.status == 500
        && body.contains("\"message\":\"failed to create typed patch object (");
    assert!(
        a.status < 500 || a.status == 501 || rustfs_refusal || untyped_apply,
        "{method} {path}: {} {}",
        a.status,
        text(&a.body)
    );
}

/// S3 errors are `<Error><Code>…` XML (HEAD answers carry no body); so are
/// admin errors on the RustFS profile these targets run (s3s renders them).
pub fn check_s3_answer(method: &Method, path: &str, a: &Answer) {
    no_server_error(method, path, a);
    if a.status < 400 || *method == Method::HEAD {
        return;
    }
    let s = String::from_utf8_lossy(&a.body);
    assert!(
        s.starts_with("<?xml") && s.contains("<Error><Code>") && s.contains("</Code><Message>"),
        "{method} {path}: error is not <Error><Code> XML: {}",
        text(&a.body)
    );
}

/// Kubernetes errors are `Status` objects whose `code` is the HTTP status.
pub fn check_kube_answer(method: &Method, path: &str, a: &Answer) {
    no_server_error(method, path, a);
    if a.status < 400 {
        return;
    }
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap_or_else(|e| {
        panic!(
            "{method} {path}: error is not JSON ({e}): {}",
            text(&a.body)
        )
    });
    assert_eq!(v["kind"], "Status", "{method} {path}: {v}");
    assert_eq!(v["status"], "Failure", "{method} {path}: {v}");
    assert_eq!(
        v["code"].as_u64(),
        Some(u64::from(a.status)),
        "{method} {path}: {v}"
    );
    // Every Status names a reason but the API server's plain errors (500, reason Unknown, omitted).
    assert!(
        v["reason"].as_str().is_some_and(|r| !r.is_empty()) || a.status == 500,
        "{method} {path}: {v}"
    );
}

/// Target `s3_http`: the S3 data plane and the admin API behind one router,
/// SigV4 parsing and verification included.
pub fn s3_http(data: &[u8]) {
    run_script(s3_fake().router(), data, |_| {}, check_s3_answer);
}

/// Target `admin_http`: like [`s3_http`], but a path outside the admin API is
/// put under `/rustfs/admin/v3/` (plain JSON bodies), so the fuzzer spends its
/// time on admin routes, query arguments and bodies; `/minio/admin/…` paths
/// stay as written, and `x-fuzz-seal: 1` madmin-encrypts their body.
pub fn admin_http(data: &[u8]) {
    fn under_admin(r: &mut RawRequest) {
        if !(r.target.starts_with(b"/minio/admin/") || r.target.starts_with(b"/rustfs/admin/")) {
            let rest = r.target.strip_prefix(b"/").unwrap_or(&r.target).to_vec();
            r.target = [&b"/rustfs/admin/v3/"[..], &rest].concat();
        }
    }
    run_script(s3_fake().router(), data, under_admin, check_s3_answer);
}

/// Target `kube_http`: the Kubernetes API (routes, JSON bodies, the three
/// patch formats, preconditions) over a fresh fake.
pub fn kube_http(data: &[u8]) {
    const TOKEN: &str = "fuzz-admin-token";
    // A script's request carries the admin token unless it sets its own
    // Authorization, so inputs reach the API and still probe authentication.
    fn as_admin(r: &mut RawRequest) {
        if !r
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case(b"authorization"))
        {
            r.headers.push((
                b"authorization".to_vec(),
                format!("Bearer {TOKEN}").into_bytes(),
            ));
        }
    }
    let fake = drivelab_fakes::kube::in_memory(Gate::new(History::new(SimClock::new())), 7)
        .expect("in-memory kube fake");
    fake.access()
        .register(TOKEN, drivelab_fakes::kube::Grant::cluster_admin("fuzz"));
    run_script(fake.router(), data, as_admin, check_kube_answer);
}

/// Target `madmin`: the encrypted-body decoder on arbitrary bytes. The key
/// derivation (Argon2id, 64 MiB) is skipped on most inputs — it is a fixed
/// library call, and at ~100 ms a run it would leave no time for the framing
/// this target is about: header, AEAD id, package splitting, the final-package
/// flag. The first byte picks: even → open `data[1..]` under a fixed derived
/// key, and seal-then-open the same bytes as plaintext (must round-trip, and
/// any truncation must fail); odd → the full `decrypt` with the secret, but
/// only when the body names no Argon2 scheme.
pub fn madmin(data: &[u8]) {
    use drivelab_fakes::s3::madmin;
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        let key = [mode; 32];
        let _ = madmin::decrypt_with_key(&key, rest);
        let scheme = if mode & 2 == 0 {
            madmin::Scheme::Argon2idAesGcm
        } else {
            madmin::Scheme::Argon2idChaCha20Poly1305
        };
        let sealed = madmin::encrypt_with_key(&key, rest, scheme, [mode; 32], [mode ^ 0x5a; 8])
            .expect("sealing cannot fail");
        assert_eq!(
            madmin::decrypt_with_key(&key, &sealed).as_deref(),
            Ok(rest),
            "madmin round trip"
        );
        // A cut at exactly the header opens as empty (sio reads an empty
        // stream as empty plaintext, and minio-py sends no package for ""):
        // inherent to the format, and the empty JSON is then refused.
        for cut in [usize::from(mode) % sealed.len(), sealed.len() - 1, 41] {
            if cut < sealed.len() {
                if let Ok(p) = madmin::decrypt_with_key(&key, &sealed[..cut]) {
                    assert!(
                        p.is_empty() && cut == 41,
                        "a truncated body ({cut} of {} bytes) opened",
                        sealed.len()
                    );
                }
            }
        }
    } else if rest.get(32).is_some_and(|&id| id >= 2) {
        let _ = madmin::decrypt(ROOT_SK, rest);
    }
}

/// The fuzzed Director's UAA client (`x-fuzz-auth` issues its tokens directly).
pub const DIRECTOR_CLIENT: &str = "fuzz-client";
/// Its secret (for scripts that go through `/oauth/token`).
pub const DIRECTOR_SECRET: &str = "fuzz-client-secret";
const DIRECTOR_KEY: &str = "fuzz-director-signing-key";

fn director_config() -> drivelab_fakes::director::DirectorConfig {
    use drivelab_fakes::director::*;
    use drivelab_fakes::secret::Secret;
    DirectorConfig {
        deployments: vec![DeploymentConfig {
            name: "dep".into(),
            instance_groups: vec![InstanceGroupConfig {
                name: "w".into(),
                instances: 2,
                azs: vec!["z1".into()],
            }],
        }],
        clients: vec![ClientConfig {
            id: DIRECTOR_CLIENT.into(),
            secret: Secret::new(DIRECTOR_SECRET),
            scopes: vec![
                auth::ADMIN.into(),
                "bosh.dynamic-disks.attach".into(),
                "bosh.dynamic-disks.delete".into(),
            ],
            deployments: vec![],
        }],
        dynamic_disks_workers: 1,
        token_signing_key: Secret::new(DIRECTOR_KEY),
        ..DirectorConfig::default()
    }
}

/// `x-fuzz-auth: admin|SCOPE…|expired`: a bearer token signed with the
/// fake's key, so inputs reach the handlers without a token round trip.
fn director_auth(r: &mut RawRequest) {
    use drivelab_fakes::director::auth;
    let Some(i) = r
        .headers
        .iter()
        .position(|(n, _)| n.eq_ignore_ascii_case(b"x-fuzz-auth"))
    else {
        return;
    };
    let (_, v) = r.headers.remove(i);
    let v = String::from_utf8_lossy(&v).into_owned();
    let (scope, exp) = match v.trim() {
        "expired" => (vec![auth::ADMIN.to_string()], 0),
        "admin" | "" => (vec![auth::ADMIN.to_string()], u64::MAX / 4),
        other => (
            other.split_whitespace().map(str::to_string).collect(),
            u64::MAX / 4,
        ),
    };
    let claims = auth::Claims {
        jti: "jti-fuzz".into(),
        client_id: DIRECTOR_CLIENT.into(),
        scope,
        deployments: vec![],
        iat: 0,
        exp,
    };
    let token = auth::issue(&drivelab_fakes::secret::Secret::new(DIRECTOR_KEY), &claims);
    r.headers.push((
        b"authorization".to_vec(),
        format!("Bearer {}", token.expose()).into_bytes(),
    ));
}

/// Director errors are `{"code": N, "description": "…"}`; the fake UAA's are
/// `{"error", "error_description"}` on `/oauth/token`.
pub fn check_director_answer(method: &Method, path: &str, a: &Answer) {
    no_server_error(method, path, a);
    // A HEAD answer has no body by HTTP's rules (the router strips it), so an
    // error's shape can only be checked on the other methods.
    if a.status < 400 || *method == Method::HEAD {
        return;
    }
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap_or_else(|e| {
        panic!(
            "{method} {path}: error is not JSON ({e}): {}",
            text(&a.body)
        )
    });
    if path == "/oauth/token" && v.get("error").is_some() {
        assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty())
                && v["error_description"].is_string(),
            "{method} {path}: UAA error without error/error_description: {v}"
        );
        return;
    }
    assert!(
        v["code"].as_u64().is_some() && v["description"].is_string(),
        "{method} {path}: Director error without code/description: {v}"
    );
}

/// Target `director_http`: the Director API and its fake UAA (tokens, tasks,
/// `/dynamic_disks` bodies, locks) over a fresh Director with one deployment
/// of two VMs and one disk-job worker.
pub fn director_http(data: &[u8]) {
    use drivelab_fakes::cpi::{Cpi, CpiConfig};
    use drivelab_fakes::director::Director;
    let director = runtime().block_on(async {
        let gate = Gate::new(History::new(SimClock::new()));
        let cpi = Cpi::new(
            Arc::new(MemStore::default()),
            gate.clone(),
            CpiConfig::default(),
        );
        Director::new(Arc::new(MemStore::default()), gate, cpi, director_config())
            .await
            .expect("fuzz Director setup")
    });
    run_script(
        director.router(),
        data,
        director_auth,
        check_director_answer,
    );
    drop(director);
}

/// Target `cpi_json`: the external CPI's stdin request parser and method
/// dispatcher (no process, no state dir) — `\n~~~\n`-separated requests
/// against one in-memory IaaS, so a create_vm can be followed by its
/// attach_disk. Every reply must be `{result, error, log}` with either a
/// result or a typed error, never a panic.
pub fn cpi_json(data: &[u8]) {
    use drivelab_fakes::cpi::{external, CpiConfig, CpiCore};
    let core = CpiCore::new(Arc::new(MemStore::default()), CpiConfig::default());
    for raw in split(data, SEP).into_iter().take(MAX_REQUESTS) {
        let v = external::answer(&core, raw);
        let obj = v.as_object().expect("a CPI reply is an object");
        assert!(
            obj.contains_key("result") && obj.contains_key("error") && obj.contains_key("log"),
            "CPI reply without result/error/log: {v}"
        );
        if let Some(e) = obj["error"].as_object() {
            assert!(
                e["type"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("Bosh::Clouds::"))
                    && e["message"].is_string()
                    && e["ok_to_retry"].is_boolean(),
                "CPI error not in the {{type, message, ok_to_retry}} shape: {v}"
            );
            assert!(
                obj["result"].is_null(),
                "CPI reply with result and error: {v}"
            );
        }
    }
}

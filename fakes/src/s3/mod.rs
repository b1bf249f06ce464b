//! Fake S3 data plane (SigV4-verified, policy-checked) and the MinIO/RustFS
//! admin API (`/minio/admin/v3/...`, `/rustfs/admin/v3/...`), over durable
//! state, with every request passing the fake's gate.
//!
//! # Which server it follows
//!
//! A [`Backend`] profile picks the server where the two differ (see
//! `backend.rs`, each rule citing the file and function it follows):
//! **RustFS** (rustfs/rustfs, source read at commit `05ba13fa`: admin handlers
//! in `rustfs/src/admin/handlers/{user,policies,iam_error}.rs`, IAM in
//! `crates/iam/src/{sys,manager}.rs`) — the default, serving both prefixes
//! as RustFS does (`rustfs/src/admin/utils.rs` `read_compatible_admin_body`:
//! plain JSON on its own prefix, madmin-encrypted on `/minio/admin`); or
//! **MinIO** (minio/minio, `cmd/iam.go` `IAMSys.CreateUser`,
//! `internal/auth/credentials.go`, with madmin-go v3's encrypted bodies),
//! which has no `/rustfs/admin` (there it is an ordinary S3 path). The S3
//! data plane follows the S3 API as both serve it.
//!
//! # Known deviations (each answers 501 NotImplemented naming what, unless said)
//!
//! - Service accounts (add/update/info/list/delete) and groups: 501.
//! - Admin errors on the rustfs profile are s3s XML errors with RustFS's
//!   codes and statuses per handler (`Backend::no_such_user` and friends,
//!   each citing its handler); their messages follow RustFS's texts where
//!   the source read gives them.
//! - add-canned-policy keeps MinIO's 20 KiB document limit on both profiles
//!   (RustFS reads up to 1 MiB).
//! - info-canned-policy answers MinIO's shapes on both profiles (the bare
//!   document, or with `v=2` `{PolicyName, Policy, CreateDate, UpdateDate}`):
//!   RustFS always answers its `PolicyInfo` with the document as an object,
//!   whose exact field names at the commit followed could not be read.
//! - Virtual-host-style addressing is served for `BUCKET.localhost` hosts
//!   only (no configurable domain); any other Host is path-style, as on a
//!   server with no domain configured.
//! - Not served: ListMultipartUploads, UploadPartCopy, ListParts paging,
//!   versioning (`versionId`), GetObject `partNumber`, multiple byte ranges,
//!   If-Modified-Since/If-Unmodified-Since, SSE, tagging, object lock, ACLs
//!   other than `private`, bucket sub-resources (policy, lifecycle, cors, ...),
//!   the signed-trailer and ECDSA streaming payloads, checksums other than
//!   CRC32/CRC32C/SHA1/SHA256, composite (multipart) checksums.
//! - Objects are limited to 64 MiB (the lab's own limit), in one store value.
//! - With no region configured any signing region is accepted and
//!   `us-east-1` is reported (HeadBucket's `x-amz-bucket-region`).
//! - Listings carry the owner `drivelab`, not real owner IDs.

mod admin;
mod backend;
mod errors;
mod integrity;
pub mod madmin;
mod multipart;
mod objects;
mod policy;
mod probe;
mod s3api;
mod sigv4;
mod state;

pub use admin::ops as admin_ops;
pub use backend::Backend;
pub use s3api::ops as s3_ops;

use std::sync::Arc;

use axum::extract::Request;
use axum::middleware::{from_fn_with_state, Next};
use axum::response::Response;
use axum::routing::any;
use axum::Router;
use http::request::Parts;

use crate::gate::{http_gate, CallSpec, Gate, HttpTap};
use crate::history::Component;
use crate::store::{Store, StoreError};

pub use probe::{ProbeError, ProbeReply, S3Probe};

use errors::ApiError;
use state::State;

/// Errors constructing or inspecting the fake.
#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    /// The backing store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The configuration cannot work (what to fix is in the message).
    #[error("invalid S3 fake configuration: {0}")]
    Config(String),
}

/// The fake's root credentials, region and backend profile.
#[derive(Clone, serde::Serialize)]
pub struct S3Config {
    /// Root (admin) access key; allowed everything, including the admin API.
    pub admin_access_key: String,
    /// Root secret key.
    pub admin_secret_key: String,
    /// The region requests must be signed for; empty: none configured, so any
    /// region is accepted and `us-east-1` reported, as MinIO and RustFS do.
    pub region: String,
    /// The real server whose rules the admin API follows.
    pub backend: Backend,
}

impl S3Config {
    /// The region the fake reports (HeadBucket, GetBucketLocation, info).
    pub fn reported_region(&self) -> &str {
        if self.region.is_empty() {
            "us-east-1"
        } else {
            &self.region
        }
    }
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("admin_access_key", &self.admin_access_key)
            .field("admin_secret_key", &"<redacted>")
            .field("region", &self.region)
            .field("backend", &self.backend)
            .finish()
    }
}

/// A user as the backend holds it. Carries the secret: never log it.
#[derive(Clone, serde::Serialize)]
pub struct UserView {
    /// Access key.
    pub access_key: String,
    /// Secret key (for snapshot labelling and probes only).
    pub secret_key: String,
    /// `enabled` or `disabled`.
    pub status: String,
    /// Attached canned policies, sorted.
    pub policies: Vec<String>,
}

impl std::fmt::Debug for UserView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserView")
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .field("status", &self.status)
            .field("policies", &self.policies)
            .finish()
    }
}

/// A position in the S3 fake's log of written users and buckets (see
/// [`S3Fake::written_since`]); the default reads from the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteCursor {
    instance: u64,
    pos: usize,
}

impl WriteCursor {
    /// Just past the last entry of `j`.
    fn at_end(j: &state::Journal) -> Self {
        Self {
            instance: j.instance,
            pos: j.entries.len(),
        }
    }
}

/// Names put or removed since a cursor (see [`S3Fake::changed_since`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangedNames {
    /// Access keys.
    pub users: std::collections::BTreeSet<String>,
    /// Canned policies.
    pub policies: std::collections::BTreeSet<String>,
    /// Buckets, including those whose objects changed.
    pub buckets: std::collections::BTreeSet<String>,
}

/// Users (access keys) and buckets written since a cursor, in write order
/// (a name written twice appears twice).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WrittenNames {
    /// Access keys.
    pub users: Vec<String>,
    /// Bucket names.
    pub buckets: Vec<String>,
}

/// A canned policy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PolicyView {
    /// Policy name.
    pub name: String,
    /// The document as stored (the last add-canned-policy replaced it whole).
    pub document: serde_json::Value,
    /// One of MinIO's built-in policies present on a fresh server (readwrite, readonly, writeonly).
    pub builtin: bool,
}

/// A bucket and its object keys.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BucketView {
    /// Bucket name.
    pub name: String,
    /// Object keys, sorted.
    pub objects: Vec<String>,
}

pub(crate) struct Inner {
    pub state: State,
    pub gate: Gate,
    pub config: S3Config,
    /// See [`S3Fake::lab_marker`].
    pub lab_marker: Arc<str>,
}

/// The header that marks the lab's own requests (with [`S3Fake::lab_marker`]).
pub const LAB_HEADER: &str = "x-drivelab-lab";

/// The fake S3 + admin API. Cheap to clone.
#[derive(Clone)]
pub struct S3Fake {
    inner: Arc<Inner>,
}

/// Stashed in request extensions before the gate so the (plain-fn) classifier
/// can tell the driver's root key from a workload's key, and the lab's own
/// root-key requests (which carry the marker) from the driver's.
#[derive(Clone)]
struct RootKey {
    key: Arc<str>,
    lab_marker: Arc<str>,
    backend: Backend,
}

impl S3Fake {
    /// A fake over `store` (reopening a sled tree keeps its users, policies, buckets).
    pub fn new(store: Arc<dyn Store>, gate: Gate, config: S3Config) -> Result<Self, S3Error> {
        if config.admin_access_key.len() < 3 || config.admin_access_key.contains(['/', ' ', ',']) {
            return Err(S3Error::Config(
                "admin_access_key must be at least 3 characters, without '/', ',' or spaces".into(),
            ));
        }
        if config.admin_secret_key.len() < 8 {
            return Err(S3Error::Config(
                "admin_secret_key must be at least 8 characters".into(),
            ));
        }
        if config
            .region
            .contains(|c: char| c.is_whitespace() || c == '/')
        {
            return Err(S3Error::Config(format!(
                "region {:?} is not a region name (empty accepts any region)",
                config.region
            )));
        }
        let state = State::open(store)?;
        // Random, never handed to a driver: a driver cannot pass for the lab.
        let lab_marker: String = {
            use rand::Rng;
            let mut rng = rand::rng();
            (0..32)
                .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
                .collect()
        };
        Ok(Self {
            inner: Arc::new(Inner {
                state,
                gate,
                config,
                lab_marker: Arc::from(lab_marker),
            }),
        })
    }

    /// The value of [`LAB_HEADER`] that marks a root-key request as the lab's
    /// own (a foreign bucket it plants, its canary): the history then does not
    /// show it as the driver's, and faults aimed at the driver's calls neither
    /// hit it nor count it. Give it to nothing under test.
    pub fn lab_marker(&self) -> &str {
        &self.inner.lab_marker
    }

    /// The HTTP router, with the gate applied to every route.
    pub fn router(&self) -> Router {
        let gate = self.inner.gate.clone();
        let s3_tap = HttpTap {
            gate: gate.clone(),
            classify,
            render: errors::render_s3_rejection,
        };
        let admin_tap = HttpTap {
            gate,
            classify,
            render: match self.inner.config.backend {
                Backend::Minio => errors::render_admin_rejection,
                Backend::Rustfs => errors::render_rustfs_admin_rejection,
            },
        };
        let root = RootKey {
            key: Arc::from(self.inner.config.admin_access_key.as_str()),
            lab_marker: self.inner.lab_marker.clone(),
            backend: self.inner.config.backend,
        };
        let admin_route =
            || any(admin::handle).layer(from_fn_with_state(admin_tap.clone(), http_gate));
        // `{*rest}` does not match an empty rest: the bare prefixes are routed
        // too, so every path `surface` calls admin gets the admin API's answer.
        let mut router = Router::new()
            .route("/minio/admin/{*rest}", admin_route())
            .route("/minio/admin/", admin_route());
        // MinIO has no /rustfs/admin: there it is an S3 request like any other.
        if self.inner.config.backend.serves_prefix("/rustfs/admin/") {
            router = router
                .route("/rustfs/admin/{*rest}", admin_route())
                .route("/rustfs/admin/", admin_route());
        }
        router
            .fallback(any(s3api::handle).layer(from_fn_with_state(s3_tap, http_gate)))
            .layer(from_fn_with_state(root, mark_root))
            .with_state(self.inner.clone())
    }

    /// Serve on `addr` (use [`crate::serve::loopback`] for 127.0.0.1 and a free port).
    pub async fn serve(
        &self,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<crate::serve::Listener> {
        crate::serve::serve_http(self.router(), addr).await
    }

    /// Every user, sorted by access key.
    pub fn users(&self) -> Vec<UserView> {
        let users = self.inner.state.users().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "s3 fake: reading users failed");
            vec![]
        });
        users
            .into_iter()
            .map(|(access_key, u)| {
                let mut policies = u.policies;
                policies.sort();
                UserView {
                    access_key,
                    secret_key: u.secret_key,
                    status: u.status,
                    policies,
                }
            })
            .collect()
    }

    /// The user `access_key`, if it exists (one read, not a scan).
    pub fn user(&self, access_key: &str) -> Option<UserView> {
        let u = self.inner.state.user(access_key).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "s3 fake: reading a user failed");
            None
        })?;
        let mut policies = u.policies;
        policies.sort();
        Some(UserView {
            access_key: access_key.to_string(),
            secret_key: u.secret_key,
            status: u.status,
            policies,
        })
    }

    /// The canned policy `name`, if it exists (one read, not a scan).
    pub fn policy(&self, name: &str) -> Option<PolicyView> {
        let p = self.inner.state.policy(name).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "s3 fake: reading a policy failed");
            None
        })?;
        Some(PolicyView {
            name: name.to_string(),
            document: p.document,
            builtin: p.builtin,
        })
    }

    /// Users and buckets written since `cursor` that still exist, and the
    /// cursor to pass next time. A cursor from another instance (the fake was
    /// restarted) reads everything. Costs what changed, not what exists: the
    /// engine calls it after every step.
    pub fn written_since(&self, cursor: WriteCursor) -> (WrittenNames, WriteCursor) {
        let (next, entries) = {
            let j = self.inner.state.journal();
            let from = if j.instance == cursor.instance {
                cursor.pos.min(j.entries.len())
            } else {
                0
            };
            (WriteCursor::at_end(&j), j.entries[from..].to_vec())
        };
        let st = &self.inner.state;
        let mut out = WrittenNames::default();
        for e in entries {
            match e {
                state::Written::User(ak) => {
                    if matches!(st.user(&ak), Ok(Some(_))) {
                        out.users.push(ak);
                    }
                }
                state::Written::Bucket(b) => {
                    if matches!(st.bucket(&b), Ok(Some(_))) {
                        out.buckets.push(b);
                    }
                }
                state::Written::Policy(_) => {}
            }
        }
        (out, next)
    }

    /// Where the log of writes is now: [`S3Fake::changed_since`] it names
    /// what is written from here on.
    pub fn cursor(&self) -> WriteCursor {
        WriteCursor::at_end(&self.inner.state.journal())
    }

    /// The users, policies and buckets (with their objects) put or removed
    /// since `cursor`, each named once, and the cursor to pass next time;
    /// `None` if the cursor is from another instance (the fake was
    /// restarted): then anything may have changed.
    pub fn changed_since(&self, cursor: WriteCursor) -> (Option<ChangedNames>, WriteCursor) {
        let j = self.inner.state.journal();
        let next = WriteCursor::at_end(&j);
        if j.instance != cursor.instance {
            return (None, next);
        }
        let mut out = ChangedNames::default();
        for e in &j.entries[cursor.pos.min(j.entries.len())..] {
            let (set, name) = match e {
                state::Written::User(n) => (&mut out.users, n),
                state::Written::Policy(n) => (&mut out.policies, n),
                state::Written::Bucket(n) => (&mut out.buckets, n),
            };
            set.insert(name.clone());
        }
        (Some(out), next)
    }

    /// The object keys of `bucket`, sorted, if it exists.
    pub fn bucket_objects(&self, bucket: &str) -> Option<Vec<String>> {
        let st = &self.inner.state;
        st.bucket(bucket).ok().flatten()?;
        Some(
            st.objects(bucket)
                .map(|o| o.into_iter().map(|(k, _)| k).collect())
                .unwrap_or_default(),
        )
    }

    /// Every canned policy, sorted by name.
    pub fn policies(&self) -> Vec<PolicyView> {
        self.policies_as(|p| p)
    }

    /// Every canned policy, sorted by name, as `view` makes it of each: one
    /// document's tree is held at a time, not all of them.
    pub fn policies_as<T>(&self, mut view: impl FnMut(PolicyView) -> T) -> Vec<T> {
        let mut out = Vec::new();
        let read = self.inner.state.each_policy(|name, p| {
            out.push(view(PolicyView {
                name,
                document: p.document,
                builtin: p.builtin,
            }))
        });
        read.map(|()| out).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "s3 fake: reading policies failed");
            vec![]
        })
    }

    /// Every bucket with its object keys, sorted.
    pub fn buckets(&self) -> Vec<BucketView> {
        let st = &self.inner.state;
        let bs = st.buckets().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "s3 fake: reading buckets failed");
            vec![]
        });
        bs.into_iter()
            .map(|(name, _)| {
                let objects = st
                    .objects(&name)
                    .map(|o| o.into_iter().map(|(k, _)| k).collect())
                    .unwrap_or_default();
                BucketView { name, objects }
            })
            .collect()
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &S3Config {
        &self.inner.config
    }
}

async fn mark_root(
    axum::extract::State(root): axum::extract::State<RootKey>,
    mut req: Request,
    next: Next,
) -> Response {
    req.extensions_mut().insert(root);
    next.run(req).await
}

/// Which surface a path belongs to, and the admin route below `/v3/`.
pub(crate) enum Surface<'a> {
    Admin {
        flavour: admin::Flavour,
        route: Option<&'a str>,
    },
    S3,
}

pub(crate) fn surface(path: &str, backend: Backend) -> Surface<'_> {
    for (prefix, flavour) in [
        ("/minio/admin/", admin::Flavour::Minio),
        ("/rustfs/admin/", admin::Flavour::Rustfs),
    ] {
        if !backend.serves_prefix(prefix) {
            continue;
        }
        if let Some(rest) = path.strip_prefix(prefix) {
            return Surface::Admin {
                flavour,
                route: rest.strip_prefix("v3/"),
            };
        }
    }
    Surface::S3
}

/// The gate's name for a request (never looks at secrets, verifies nothing).
fn classify(parts: &Parts) -> CallSpec {
    let root = parts.extensions.get::<RootKey>();
    let from = match (sigv4::access_key_hint(parts), root) {
        (Some(k), Some(r)) if k == *r.key => {
            let marked = parts
                .headers
                .get(LAB_HEADER)
                .is_some_and(|v| v.as_bytes() == r.lab_marker.as_bytes());
            if marked {
                Component::Lab
            } else {
                Component::Driver
            }
        }
        _ => Component::Workload,
    };
    let query = sigv4::parse_query(parts.uri.query()).unwrap_or_default();
    let backend = root.map(|r| r.backend).unwrap_or_default();
    match surface(parts.uri.path(), backend) {
        Surface::Admin { route, .. } => {
            let (op, subject) = admin::classify(&parts.method, route, &query);
            CallSpec::new(from, Component::S3Admin, op, subject)
        }
        Surface::S3 => {
            let (op, bucket, key) = s3api::classify(parts, &query);
            let subject = match (bucket.as_str(), key.as_str()) {
                ("", _) => String::new(),
                (b, "") => b.to_string(),
                (b, k) => format!("{b}/{k}"),
            };
            CallSpec::new(from, Component::S3, op, subject)
        }
    }
}

/// Who a verified request is.
pub(crate) enum Principal {
    Root,
    User { policies: Vec<String> },
}

/// Verify the request's signature and payload; returns the caller, the
/// (decoded) body and its aws-chunked trailers.
pub(crate) fn authenticate(
    inner: &Inner,
    parts: &Parts,
    query: &[(Vec<u8>, Vec<u8>)],
    body: bytes::Bytes,
) -> Result<(Principal, sigv4::Payload), ApiError> {
    let auth = sigv4::parse_auth(parts, query)?.ok_or_else(ApiError::access_denied)?;
    let cfg = &inner.config;
    let (principal, secret) = if auth.access_key == cfg.admin_access_key {
        (Principal::Root, cfg.admin_secret_key.clone())
    } else {
        let user = inner
            .state
            .user(&auth.access_key)?
            .ok_or_else(ApiError::invalid_access_key)?;
        if user.status != "enabled" {
            return Err(ApiError::new(
                403,
                "InvalidAccessKeyId",
                "Your account is disabled; please contact your administrator.",
            ));
        }
        (
            Principal::User {
                policies: user.policies,
            },
            user.secret_key,
        )
    };
    let key = sigv4::verify(
        parts,
        query,
        &auth,
        &secret,
        (!cfg.region.is_empty()).then_some(cfg.region.as_str()),
        time::OffsetDateTime::now_utc(),
    )?;
    let payload = sigv4::resolve_payload(parts, &auth, &key, body)?;
    Ok((principal, payload))
}

/// The data plane's body limit: the lab's own, far below S3's 5 GiB single PUT
/// (a driver's probes and workloads write bytes, not gigabytes).
pub(crate) const MAX_OBJECT_BODY: usize = 64 * 1024 * 1024;
/// The admin API's body limit: MinIO's `maxEConfigJSONSize`.
pub(crate) const MAX_ADMIN_BODY: usize = 262_272;
/// How long a request body may take to arrive.
pub(crate) const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// S3 refuses a request header section larger than 8 KiB.
pub(crate) const MAX_HEADER_SECTION: usize = 8 * 1024;

/// Which limits and error codes a body read answers with.
#[derive(Clone, Copy)]
pub(crate) enum BodyLimit {
    /// S3: `EntityTooLarge` above [`MAX_OBJECT_BODY`].
    Object,
    /// Admin API: above [`MAX_ADMIN_BODY`], `XMinioAdminConfigTooLarge` on
    /// MinIO, InvalidRequest on RustFS.
    Admin(Backend),
}

impl BodyLimit {
    fn bytes(self) -> usize {
        match self {
            BodyLimit::Object => MAX_OBJECT_BODY,
            BodyLimit::Admin(_) => MAX_ADMIN_BODY,
        }
    }
    fn too_large(self) -> ApiError {
        match self {
            BodyLimit::Object => ApiError::new(
                400,
                "EntityTooLarge",
                format!("Your proposed upload exceeds the maximum allowed object size ({MAX_OBJECT_BODY} bytes in the drivelab S3 fake)."),
            ),
            BodyLimit::Admin(Backend::Rustfs) => ApiError::new(
                400,
                "InvalidRequest",
                "policy configuration body too large or failed to read",
            ),
            BodyLimit::Admin(Backend::Minio) => ApiError::new(
                400,
                "XMinioAdminConfigTooLarge",
                format!("Configuration data provided exceeds the allowed maximum of {MAX_ADMIN_BODY} bytes"),
            ),
        }
    }
}

/// S3's header-section limit (the sum of `name: value\r\n` lines).
pub(crate) fn check_header_section(parts: &Parts) -> Result<(), ApiError> {
    let size: usize = parts
        .headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum();
    if size > MAX_HEADER_SECTION {
        return Err(ApiError::new(
            400,
            "RequestHeaderSectionTooLarge",
            format!("Your request header section exceeds the maximum allowed size ({MAX_HEADER_SECTION} bytes)."),
        ));
    }
    Ok(())
}

/// Read a request body up to `limit`. A declared Content-Length over the
/// limit is refused before a byte is read, so a huge upload costs nothing.
pub(crate) async fn read_body(
    parts: &Parts,
    body: axum::body::Body,
    limit: BodyLimit,
) -> Result<bytes::Bytes, ApiError> {
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit.bytes() as u64) {
        return Err(limit.too_large());
    }
    // A client that stops sending mid-body gets S3's RequestTimeout instead
    // of holding the connection and its task for ever.
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, axum::body::to_bytes(body, limit.bytes()));
    let read = read.await.map_err(|_| {
        ApiError::new(
            400,
            "RequestTimeout",
            "Your socket connection to the server was not read from or written to within the timeout period.",
        )
    })?;
    read.map_err(|e| {
        let over = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if over {
            limit.too_large()
        } else {
            ApiError::new(
                400,
                "IncompleteBody",
                format!("You did not provide the number of bytes specified by the Content-Length HTTP header ({e})."),
            )
        }
    })
}

/// The secret of the caller of an admin request (madmin keys its bodies with it).
pub(crate) fn caller_secret(inner: &Inner, principal: &Principal) -> Option<String> {
    match principal {
        Principal::Root => Some(inner.config.admin_secret_key.clone()),
        Principal::User { .. } => None,
    }
}

#[cfg(test)]
mod tests;

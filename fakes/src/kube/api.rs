//! The HTTP front end: paths, verbs, content types, query parameters and
//! response shapes of the real API server, mapped onto the state layer. One
//! fallback handler parses the path itself so every unknown URL still gets a
//! real-shaped Status, and the gate classifier shares that parser.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::Engine as _;
use http::{header, Method, StatusCode};
use serde_json::{json, Value};

use super::schema::{validate_fields, FieldValidation};
use super::selector::{FieldSelector, LabelSelector};
use super::state::{Deleted, KubeFake, PatchBody, Preconditions, WriteOpts};
use super::status::{render_rejection, ApiError};
use super::{Kind, Stored};
use crate::gate::{http_gate, CallSpec, HttpTap};
use crate::history::Component;
use crate::ops::Op;

/// The real server's request body limit (3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// Discovery documents the fake serves.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Discovery {
    Api,
    CoreV1,
    Apis,
    Group(&'static str),
    GroupVersion(&'static str, &'static str),
    Version,
    Health,
    /// `/openapi/v2`.
    OpenApiV2,
    /// `/openapi/v3`: the index of group-version documents.
    OpenApiV3Index,
    /// `/openapi/v3/{api/v1 | apis/g/v}`.
    OpenApiV3(String),
}

/// What a URL path names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Discovery(Discovery),
    /// `.../{plural}`: list or create. `ns` is `None` for cluster-scoped kinds
    /// and for the all-namespaces list of namespaced ones.
    Collection {
        kind: Kind,
        ns: Option<String>,
    },
    /// `.../{plural}/{name}[/status]`.
    Item {
        kind: Kind,
        ns: Option<String>,
        name: String,
        status: bool,
    },
    Unknown,
}

const GROUPS: [(&str, &str); 5] = [
    ("coordination.k8s.io", "v1"),
    ("objectstorage.k8s.io", "v1alpha1"),
    ("storage.k8s.io", "v1"),
    ("snapshot.storage.k8s.io", "v1"),
    ("cbt.storage.k8s.io", "v1alpha1"),
];

fn known_group(g: &str) -> Option<&'static str> {
    GROUPS
        .iter()
        .find(|(name, _)| *name == g)
        .map(|(name, _)| *name)
}

fn known_group_version(g: &str, v: &str) -> Option<(&'static str, &'static str)> {
    GROUPS
        .iter()
        .find(|(name, ver)| *name == g && *ver == v)
        .copied()
}

fn parse_route(path: &str) -> Route {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["api"] => Route::Discovery(Discovery::Api),
        ["api", "v1"] => Route::Discovery(Discovery::CoreV1),
        ["api", "v1", rest @ ..] => resource_route("", "v1", rest),
        ["apis"] => Route::Discovery(Discovery::Apis),
        ["apis", g] => {
            known_group(g).map_or(Route::Unknown, |g| Route::Discovery(Discovery::Group(g)))
        }
        ["apis", g, v] => known_group_version(g, v).map_or(Route::Unknown, |(g, v)| {
            Route::Discovery(Discovery::GroupVersion(g, v))
        }),
        ["apis", g, v, rest @ ..] => resource_route(g, v, rest),
        ["version"] => Route::Discovery(Discovery::Version),
        ["healthz"] | ["livez"] | ["readyz"] => Route::Discovery(Discovery::Health),
        ["openapi", "v2"] => Route::Discovery(Discovery::OpenApiV2),
        ["openapi", "v3"] => Route::Discovery(Discovery::OpenApiV3Index),
        ["openapi", "v3", rest @ ..] => {
            let gv = rest.join("/");
            if super::openapi::group_versions().contains(&gv) {
                Route::Discovery(Discovery::OpenApiV3(gv))
            } else {
                Route::Unknown
            }
        }
        _ => Route::Unknown,
    }
}

fn resource_route(group: &str, version: &str, rest: &[&str]) -> Route {
    let kind = |plural: &str| Kind::from_path(group, version, plural);
    let item = |kind: Kind, ns: Option<&str>, name: &str, status: bool| {
        if name.is_empty() || (status && !kind.has_status_subresource()) {
            Route::Unknown
        } else {
            Route::Item {
                kind,
                ns: ns.map(str::to_string),
                name: name.to_string(),
                status,
            }
        }
    };
    match rest {
        // A namespace's own status, not a kind named `status` inside it.
        ["namespaces", name, "status"] if group.is_empty() => {
            item(Kind::Namespace, None, name, true)
        }
        ["namespaces", ns, plural, tail @ ..] if !ns.is_empty() => match (kind(plural), tail) {
            (Some(k), []) if k.namespaced() => Route::Collection {
                kind: k,
                ns: Some(ns.to_string()),
            },
            (Some(k), [name]) if k.namespaced() => item(k, Some(ns), name, false),
            (Some(k), [name, "status"]) if k.namespaced() => item(k, Some(ns), name, true),
            _ => Route::Unknown,
        },
        [plural, tail @ ..] => match (kind(plural), tail) {
            (Some(k), []) => Route::Collection { kind: k, ns: None },
            (Some(k), [name]) if !k.namespaced() => item(k, None, name, false),
            (Some(k), [name, "status"]) if !k.namespaced() => item(k, None, name, true),
            _ => Route::Unknown,
        },
        [] => Route::Unknown,
    }
}

/// A watch request (`?watch=1`, `watch=true`, `watch`), by its query.
pub fn is_watch(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        q.split('&')
            .any(|p| p == "watch=true" || p == "watch=1" || p == "watch")
    })
}

/// What a request does to a kind; with the kind it names the operation
/// (`create_secret`, `list_bucketclaims`, `patch_bucketaccess_status`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    /// GET on a collection with `watch`.
    Watch,
    /// GET on a collection.
    List,
    /// POST on a collection.
    Create,
    /// DELETE on a collection.
    DeleteCollection,
    /// GET on an object (or its status).
    Get,
    /// PUT on an object (or its status).
    Replace,
    /// PATCH on an object (or its status).
    Patch,
    /// DELETE on an object.
    Delete,
}

impl Verb {
    /// Every verb.
    pub const ALL: [Verb; 8] = [
        Verb::Watch,
        Verb::List,
        Verb::Create,
        Verb::DeleteCollection,
        Verb::Get,
        Verb::Replace,
        Verb::Patch,
        Verb::Delete,
    ];

    /// The operation's name: verb, kind (plural for collections), `_status`.
    fn name(self, kind: Kind, status: bool) -> String {
        let (verb, noun) = match self {
            Verb::Watch | Verb::List | Verb::DeleteCollection => (self.rbac_name(), kind.plural()),
            Verb::Replace => ("replace", kind.singular()),
            Verb::Create | Verb::Get | Verb::Patch | Verb::Delete => {
                (self.rbac_name(), kind.singular())
            }
        };
        let suffix = if status { "_status" } else { "" };
        format!("{verb}_{noun}{suffix}")
    }

    /// The verb as RBAC rules and the authorizer name it (`update` for a PUT).
    pub fn rbac_name(self) -> &'static str {
        match self {
            Verb::Watch => "watch",
            Verb::List => "list",
            Verb::Create => "create",
            Verb::DeleteCollection => "deletecollection",
            Verb::Get => "get",
            Verb::Replace => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
        }
    }

    /// Whether `/status` takes this verb.
    fn on_status(self) -> bool {
        matches!(self, Verb::Get | Verb::Replace | Verb::Patch)
    }
}

/// The Kubernetes API's operations that are not about one kind.
pub mod ops {
    crate::declare_ops!(
        /// Discovery and unrecognised requests.
        pub OTHER {
            DISCOVERY = "discovery",
            UNKNOWN = "unknown",
        }
    );
}

struct OpTable {
    all: Vec<Op>,
    by: HashMap<(Kind, Verb, bool), Op>,
}

fn table() -> &'static OpTable {
    static TABLE: std::sync::OnceLock<OpTable> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut all = ops::OTHER.to_vec();
        let mut by = HashMap::new();
        for kind in Kind::ALL {
            for verb in Verb::ALL {
                for status in [false, true] {
                    if status && !(verb.on_status() && kind.has_status_subresource()) {
                        continue;
                    }
                    // Built once per process from a finite set: the leak is bounded.
                    let name: &'static str = Box::leak(verb.name(kind, status).into_boxed_str());
                    let op = Op::declare(name);
                    all.push(op);
                    by.insert((kind, verb, status), op);
                }
            }
        }
        OpTable { all, by }
    })
}

/// Every operation of the Kubernetes API over HTTP.
pub fn all_ops() -> &'static [Op] {
    &table().all
}

/// The operation `verb` on `kind` (its `/status` when `status`).
pub fn op(verb: Verb, kind: Kind, status: bool) -> Op {
    table()
        .by
        .get(&(kind, verb, status))
        .copied()
        .unwrap_or(ops::UNKNOWN)
}

/// The verb a request on `route` is (None: a method the route does not take).
fn verb_of(method: &Method, route: &Route, query: Option<&str>) -> Option<Verb> {
    match route {
        Route::Collection { .. } => match *method {
            Method::GET if is_watch(query) => Some(Verb::Watch),
            Method::GET => Some(Verb::List),
            Method::POST => Some(Verb::Create),
            Method::DELETE => Some(Verb::DeleteCollection),
            _ => None,
        },
        Route::Item { status, .. } => match *method {
            Method::GET => Some(Verb::Get),
            Method::PUT => Some(Verb::Replace),
            Method::PATCH => Some(Verb::Patch),
            Method::DELETE if !status => Some(Verb::Delete),
            _ => None,
        },
        Route::Discovery(_) | Route::Unknown => None,
    }
}

/// Names an HTTP request for the history: `<verb>_<kind>` and `<namespace>/<name>`.
pub(crate) fn classify(parts: &http::request::Parts) -> CallSpec {
    let path = parts.uri.path();
    let route = parse_route(path);
    let verb = verb_of(&parts.method, &route, parts.uri.query());
    let (op, subject) = match route {
        Route::Collection { kind, ns } => {
            // The name of a created object is in the body, which the gate does not see.
            let op = verb.map_or(ops::UNKNOWN, |v| op(v, kind, false));
            (op, ns.unwrap_or_default())
        }
        Route::Item {
            kind,
            ns,
            name,
            status,
        } => {
            let op = verb.map_or(ops::UNKNOWN, |v| op(v, kind, status));
            (op, subject_of(ns.as_deref(), &name))
        }
        Route::Discovery(_) => (ops::DISCOVERY, path.to_string()),
        Route::Unknown => (ops::UNKNOWN, path.to_string()),
    };
    CallSpec::new(Component::Driver, Component::Kube, op, subject)
}

/// Authenticate the caller (401 without a token this fake issued) and, for a
/// resource request, authorize it (403 without a rule for it). Discovery is open
/// to every authenticated user, as `system:discovery` is.
fn admit(fake: &KubeFake, req: &Request, route: &Route) -> Result<(), ApiError> {
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|h| h.as_bytes());
    let Some(grant) = fake.access().authenticate(header) else {
        return Err(ApiError::new(401, "Unauthorized", "Unauthorized"));
    };
    let (kind, ns, name, status) = match route {
        Route::Collection { kind, ns } => (*kind, ns.as_deref(), None, false),
        Route::Item {
            kind,
            ns,
            name,
            status,
        } => (*kind, ns.as_deref(), Some(name.as_str()), *status),
        Route::Discovery(_) | Route::Unknown => return Ok(()),
    };
    let Some(verb) = verb_of(req.method(), route, req.uri().query()) else {
        return Ok(()); // dispatch answers 405
    };
    if grant.allows(verb, kind, ns) {
        return Ok(());
    }
    let mut e = ApiError::new(
        403,
        "Forbidden",
        super::auth::forbidden_message(&grant.user, verb, kind, status, ns, name),
    );
    e.details = Some(serde_json::json!({"name": name.unwrap_or_default(), "kind": kind.plural()}));
    Err(e)
}

fn subject_of(ns: Option<&str>, name: &str) -> String {
    match ns {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

impl KubeFake {
    /// The HTTP API, with the gate layer applied.
    pub fn router(&self) -> Router {
        self.keep_watch_history();
        let tap = HttpTap {
            gate: self.inner.gate.clone(),
            classify,
            render: render_rejection,
        };
        Router::new()
            .fallback(handle)
            .with_state(self.clone())
            .layer(axum::middleware::from_fn_with_state(tap, http_gate))
    }

    /// Serve the HTTP API on `addr` (e.g. [`crate::serve::loopback`]).
    pub async fn serve(
        &self,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<crate::serve::Listener> {
        crate::serve::serve_http(self.router(), addr).await
    }

    /// Serve the API over TLS as `identity` on `addr`, as a real API server
    /// is reached: client-go sends credentials only over https.
    pub async fn serve_tls(
        &self,
        addr: std::net::SocketAddr,
        identity: &crate::tls::TlsIdentity,
    ) -> std::io::Result<crate::serve::Listener> {
        crate::serve::serve_https(self.router(), addr, identity).await
    }
}

async fn handle(State(fake): State<KubeFake>, req: Request) -> Response {
    match dispatch(&fake, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

fn reply(code: StatusCode, body: &Value) -> Response {
    (code, axum::Json(body)).into_response()
}

/// [`reply`] with the body's JSON text already written (as `axum::Json` would).
fn reply_text(code: StatusCode, json: String) -> Response {
    let ct = [(header::CONTENT_TYPE, "application/json")];
    (code, ct, bytes::Bytes::from(json)).into_response()
}

struct Params(HashMap<String, String>);

impl Params {
    fn parse(uri: &http::Uri) -> Result<Self, ApiError> {
        let q = axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))?;
        Ok(Self(q.0.into_iter().collect()))
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    /// `fieldValidation` of a write whose options are `options`
    /// (`CreateOptions`); an unknown value is 422 as `ValidateFieldValidation`.
    fn field_validation(&self, options: &str) -> Result<FieldValidation, ApiError> {
        let v = self.get("fieldValidation");
        FieldValidation::parse(v).ok_or_else(|| {
            ApiError::new(
                422,
                "Invalid",
                format!(
                    "{options}.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: {:?}: supported values: \"\", \"Ignore\", \"Strict\", \"Warn\"",
                    v.unwrap_or("")
                ),
            )
        })
    }

    fn dry_run(&self) -> Result<bool, ApiError> {
        match self.get("dryRun") {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(v) => Err(ApiError::bad_request(format!(
                "Invalid dryRun value: {v:?}; supported values: \"All\""
            ))),
        }
    }
}

async fn read_body(req: Request) -> Result<Vec<u8>, ApiError> {
    let too_large = || {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {MAX_BODY}"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
        Ok(b) => Ok(b.to_vec()),
        Err(e) => {
            let limited = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                || e.to_string().contains("length limit");
            if limited {
                Err(too_large())
            } else {
                Err(ApiError::bad_request(format!(
                    "could not read the request body: {e}"
                )))
            }
        }
    }
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid UTF-8: {e}")))?;
    if text.trim().is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    serde_json::from_str(text).map_err(|e| {
        ApiError::bad_request(format!("the body of the request is not valid JSON: {e}"))
    })
}

fn media_type(req: &Request) -> String {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

fn unsupported_media(got: &str, accepted: &str) -> ApiError {
    ApiError::new(
        415,
        "UnsupportedMediaType",
        format!("the body of the request was in an unknown format ({got:?}) - accepted media types include: {accepted}"),
    )
}

/// The field manager a write is recorded for: `fieldManager`, else the
/// user agent up to its first `/` (apiserver `managerOrUserAgent`).
fn field_manager(params: &Params, req: &Request) -> String {
    match params.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(m) => m.to_string(),
        None => {
            let ua = req
                .headers()
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let product = ua.split('/').next().unwrap_or("");
            product.chars().take(128).collect()
        }
    }
}

/// The object of a POST or PUT: JSON, or for the kinds `protobuf` decodes,
/// the Kubernetes protobuf wire format client-go's typed clients send. The
/// media type is judged before the body is read (415 before 400).
async fn read_object(kind: Kind, req: Request) -> Result<Value, ApiError> {
    use super::protobuf::{self, ProtobufError};
    let decoded = protobuf::DECODED.contains(&kind);
    match media_type(&req).as_str() {
        "" | "application/json" => parse_json(&read_body(req).await?),
        protobuf::MEDIA_TYPE if decoded => {
            protobuf::decode(kind, &read_body(req).await?).map_err(|e| match e {
                ProtobufError::Malformed(m) => ApiError::bad_request(format!(
                    "{k} in version \"{v}\" cannot be handled as a {k}: {m}",
                    k = kind.kind_name(),
                    v = kind.version()
                )),
                ProtobufError::Unsupported(m) => ApiError::new(415, "UnsupportedMediaType", m),
            })
        }
        protobuf::MEDIA_TYPE => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            protobuf::unsupported_message(kind),
        )),
        other if decoded => Err(unsupported_media(
            other,
            "application/json, application/vnd.kubernetes.protobuf",
        )),
        other => Err(unsupported_media(other, "application/json")),
    }
}

async fn dispatch(fake: &KubeFake, req: Request) -> Result<Response, ApiError> {
    let path = req.uri().path().to_string();
    let route = parse_route(&path);
    // Who is asking comes first: a stranger learns nothing, not even that a query is malformed.
    admit(fake, &req, &route)?;
    let params = Params::parse(req.uri())?;
    let method = req.method().clone();
    match route {
        Route::Unknown => Err(ApiError::not_found_path(&path)),
        Route::Discovery(d) => {
            if method != Method::GET {
                return Err(ApiError::method_not_allowed(format!(
                    "{method} is not supported on {path}"
                )));
            }
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("127.0.0.1")
                .to_string();
            let accept = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("")
                .to_string();
            discovery(&d, &host, &accept)
        }
        Route::Collection { kind, ns } => match method {
            Method::GET => {
                if is_watch(req.uri().query()) {
                    return watch(fake, kind, ns, &params);
                }
                list(fake, kind, ns.as_deref(), &params)
            }
            Method::POST if ns.is_some() || !kind.namespaced() => {
                let mode = params.field_validation("CreateOptions")?;
                let opts = WriteOpts {
                    http: true,
                    status_only: false,
                    dry_run: params.dry_run()?,
                    field_validation: Some(mode),
                    manager: Some(field_manager(&params, &req).into()),
                    force: false,
                    text: false,
                };
                let mut body = read_object(kind, req).await?;
                let warnings = validate_fields(&mut body, kind, mode, true)?;
                let created = fake.create_in(kind, ns.as_deref(), body, opts)?;
                Ok(with_warnings(
                    reply(StatusCode::CREATED, &created),
                    &warnings,
                ))
            }
            _ => Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method} {path})"
            ))),
        },
        Route::Item {
            kind,
            ns,
            name,
            status,
        } => {
            let ns = ns.as_deref();
            let mut opts = WriteOpts {
                http: true,
                status_only: status,
                dry_run: params.dry_run()?,
                field_validation: None,
                manager: Some(field_manager(&params, &req).into()),
                force: false,
                text: false,
            };
            match method {
                Method::GET => match fake.get_stored(kind, ns, &name)? {
                    Some(Stored::Tree(o)) => Ok(reply(StatusCode::OK, &o)),
                    Some(Stored::Text(json)) => Ok(reply_text(StatusCode::OK, json.text())),
                    None => Err(super::KubeError::NotFound { kind, name }.into()),
                },
                Method::PUT => {
                    let mode = params.field_validation("UpdateOptions")?;
                    opts.field_validation = Some(mode);
                    let mut body = read_object(kind, req).await?;
                    let warnings = validate_fields(&mut body, kind, mode, true)?;
                    let out = fake.replace_in(kind, ns, Some(&name), body, opts)?;
                    Ok(with_warnings(reply(StatusCode::OK, &out), &warnings))
                }
                Method::PATCH => {
                    opts.field_validation = Some(params.field_validation("PatchOptions")?);
                    patch(fake, kind, ns, &name, &params, opts, req).await
                }
                Method::DELETE => delete(fake, kind, ns, &name, opts, req).await,
                _ => Err(ApiError::method_not_allowed(format!(
                    "the server does not allow this method on the requested resource ({method} {path})"
                ))),
            }
        }
    }
}

/// A watch: JSON event lines on a chunked 200 response, until
/// `timeoutSeconds`, the client going away, or the client falling so far
/// behind that its changes are gone (then an ERROR 410 event ends it).
fn watch(
    fake: &KubeFake,
    kind: Kind,
    ns: Option<String>,
    params: &Params,
) -> Result<Response, ApiError> {
    use super::watch::{bookmark, Filter, BOOKMARK_EVERY, DEFAULT_TIMEOUT};
    let filter = Filter {
        kind,
        ns,
        labels: LabelSelector::parse(params.get("labelSelector").unwrap_or(""))
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
        fields: FieldSelector::parse(params.get("fieldSelector").unwrap_or(""), kind)
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
    };
    let flag = |k: &str| matches!(params.get(k), Some("true" | "1"));
    let after = match params.get("resourceVersion") {
        None | Some("" | "0") => None,
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {v:?}")))?,
        ),
    };
    let timeout = match params.get("timeoutSeconds") {
        None | Some("") => DEFAULT_TIMEOUT,
        Some(t) => std::time::Duration::from_secs(
            t.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {t:?}")))?,
        ),
    };
    let initial_end = flag("sendInitialEvents");
    let bookmarks = flag("allowWatchBookmarks") || initial_end;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::convert::Infallible>>(64);
    let line = |v: &Value| bytes::Bytes::from(format!("{v}\n"));
    let start = fake.watch_start(&filter, if initial_end { None } else { after });
    tokio::spawn(async move {
        let mut start = match start {
            Ok(s) => s,
            Err(gone) => {
                let _ = tx
                    .send(Ok(line(&super::watch::event("ERROR", &gone.status()))))
                    .await;
                return;
            }
        };
        for e in &start.events {
            if tx.send(Ok(line(e))).await.is_err() {
                return;
            }
        }
        let mut last_rv = start.rv;
        if initial_end
            && tx
                .send(Ok(line(&bookmark(kind, last_rv, true))))
                .await
                .is_err()
        {
            return;
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(BOOKMARK_EVERY);
        tick.tick().await;
        loop {
            let e = tokio::select! {
                _ = &mut deadline => return,
                _ = tick.tick(), if bookmarks => bookmark(kind, last_rv, false),
                got = start.rx.recv() => match got {
                    Ok(c) if c.rv <= start.rv => continue,
                    Ok(c) => {
                        last_rv = c.rv;
                        match filter.event(&c) {
                            Some(e) => e,
                            None => continue,
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        let status = super::watch::expired(
                            "the watch fell too far behind; list again".into(),
                        );
                        let _ = tx.send(Ok(line(&super::watch::event("ERROR", &status)))).await;
                        return;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                _ = tx.closed() => return,
            };
            if tx.send(Ok(line(&e))).await.is_err() {
                return;
            }
        }
    });
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

fn list(
    fake: &KubeFake,
    kind: Kind,
    ns: Option<&str>,
    params: &Params,
) -> Result<Response, ApiError> {
    let labels = LabelSelector::parse(params.get("labelSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let fields = FieldSelector::parse(params.get("fieldSelector").unwrap_or(""), kind)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let limit = match params.get("limit") {
        None | Some("") => None,
        Some(l) => match l.parse::<usize>() {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(_) => return Err(ApiError::bad_request(format!("invalid limit {l:?}"))),
        },
    };
    let (items, rv) = fake.list_in(kind, ns, &labels, &fields)?;
    let key = |o: &Value| {
        let m = |f: &str| {
            o.pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        format!("{}/{}", m("namespace"), m("name"))
    };
    // Continue tokens are opaque to clients; ours is the last (namespace/name) served.
    let after = match params.get("continue").filter(|c| !c.is_empty()) {
        None => None,
        Some(c) => Some(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(c)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?,
        ),
    };
    let mut items: Vec<Value> = match &after {
        Some(a) => items
            .into_iter()
            .filter(|o| key(o).as_str() > a.as_str())
            .collect(),
        None => items,
    };
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(n) = limit {
        if items.len() > n {
            let remaining = items.len() - n;
            items.truncate(n);
            let last = items.last().map(&key).unwrap_or_default();
            metadata["continue"] =
                json!(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(last));
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    Ok(reply(
        StatusCode::OK,
        &json!({
            "kind": format!("{}List", kind.kind_name()),
            "apiVersion": kind.api_version(),
            "metadata": metadata,
            "items": items,
        }),
    ))
}

async fn patch(
    fake: &KubeFake,
    kind: Kind,
    ns: Option<&str>,
    name: &str,
    params: &Params,
    opts: WriteOpts,
    req: Request,
) -> Result<Response, ApiError> {
    const ACCEPTED: &str =
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml";
    #[derive(PartialEq)]
    enum Format {
        Merge,
        Strategic,
        Json,
        Apply,
    }
    let mt = media_type(&req);
    // The media type is judged before the body, as the real server does (415 before 400).
    let format = match mt.as_str() {
        "application/merge-patch+json" => Format::Merge,
        // Only built-in kinds have strategic-merge metadata; custom resources refuse it.
        "application/strategic-merge-patch+json" if !kind.is_custom() => Format::Strategic,
        "application/json-patch+json" => Format::Json,
        "application/apply-patch+yaml" => Format::Apply,
        other => return Err(unsupported_media(other, ACCEPTED)),
    };
    if format == Format::Apply && params.get("fieldManager").is_none_or(str::is_empty) {
        return Err(ApiError::bad_request(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    }
    let mut opts = opts;
    match (params.get("force"), format == Format::Apply) {
        (None | Some("" | "false"), _) => {}
        (Some("true"), true) => opts.force = true,
        (Some("true"), false) => {
            return Err(ApiError::new(
                422,
                "Invalid",
                "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch",
            ))
        }
        (Some(v), _) => return Err(ApiError::bad_request(format!("invalid force {v:?}"))),
    }
    let body = parse_json(&read_body(req).await?)?;
    let existed = format == Format::Apply && fake.get_in(kind, ns, name)?.is_some();
    let patch = match format {
        Format::Merge => PatchBody::Merge(body),
        Format::Strategic => PatchBody::Strategic(body),
        Format::Json => {
            // Counted before anything is applied, as the real server does (413).
            let n = body.as_array().map_or(0, Vec::len);
            if n > super::patch::MAX_JSON_PATCH_OPS {
                return Err(ApiError::new(
                    413,
                    "RequestEntityTooLarge",
                    format!(
                        "The allowed maximum operations in a JSON patch is {}, got {n}",
                        super::patch::MAX_JSON_PATCH_OPS
                    ),
                ));
            }
            PatchBody::Json(body)
        }
        Format::Apply => {
            if body.get("apiVersion").is_none() || body.get("kind").is_none() {
                return Err(ApiError::bad_request(
                    "apply patches must set apiVersion and kind",
                ));
            }
            PatchBody::Apply(body)
        }
    };
    let is_apply = matches!(patch, PatchBody::Apply(_));
    let (out, warnings) = fake.patch_in(kind, ns, name, patch, opts)?;
    let code = if is_apply && !existed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(with_warnings(reply(code, &out), &warnings))
}

/// Adds each warning as a `Warning: 299 - "text"` header (RFC 7234), as the
/// server's warning recorder does.
fn with_warnings(mut r: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let text = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = http::HeaderValue::from_str(&format!("299 - \"{text}\"")) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

async fn delete(
    fake: &KubeFake,
    kind: Kind,
    ns: Option<&str>,
    name: &str,
    mut opts: WriteOpts,
    req: Request,
) -> Result<Response, ApiError> {
    let query = Params::parse(req.uri())?;
    let body = read_body(req).await?;
    let mut pre = Preconditions::default();
    if let Some(g) = query.get("gracePeriodSeconds").filter(|g| !g.is_empty()) {
        pre.grace_period_seconds = Some(
            g.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}")))?,
        );
    }
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v = parse_json(&body)?;
        if !v.is_object() {
            return Err(ApiError::bad_request("DeleteOptions must be a JSON object"));
        }
        let s = |p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        pre.uid = s("/preconditions/uid");
        pre.resource_version = s("/preconditions/resourceVersion");
        match v.get("gracePeriodSeconds") {
            None | Some(Value::Null) => {}
            Some(g) => {
                pre.grace_period_seconds = Some(g.as_i64().ok_or_else(|| {
                    ApiError::bad_request("DeleteOptions.gracePeriodSeconds must be an integer")
                })?)
            }
        }
        match v.get("dryRun") {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) if a.iter().all(|x| x == "All") => opts.dry_run |= !a.is_empty(),
            Some(_) => {
                return Err(ApiError::bad_request(
                    "DeleteOptions.dryRun: supported values: \"All\"",
                ))
            }
        }
    }
    match fake.delete_in(kind, ns, name, &pre, opts)? {
        None => Err(super::KubeError::NotFound {
            kind,
            name: name.to_string(),
        }
        .into()),
        Some(Deleted { object, gone }) => {
            // Built-in kinds answer an immediate delete with a Success Status;
            // custom resources (and anything kept by finalizers) with the object.
            if gone && !kind.returns_deleted_object() {
                let mut details = json!({"name": name, "kind": kind.plural(), "uid": object.pointer("/metadata/uid").cloned().unwrap_or(Value::Null)});
                if !kind.group().is_empty() {
                    details["group"] = json!(kind.group());
                }
                Ok(reply(
                    StatusCode::OK,
                    &json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","details":details}),
                ))
            } else {
                Ok(reply(StatusCode::OK, &object))
            }
        }
    }
}

const RESOURCE_VERBS: [&str; 6] = ["create", "delete", "get", "list", "patch", "update"];

fn resource_entries(group: &str, version: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for k in Kind::ALL
        .into_iter()
        .filter(|k| k.group() == group && k.version() == version)
    {
        let short = k.short_names();
        out.push(json!({
            "name": k.plural(),
            "singularName": k.singular(),
            "namespaced": k.namespaced(),
            "kind": k.kind_name(),
            "verbs": RESOURCE_VERBS,
            "shortNames": short,
        }));
        if k.has_status_subresource() {
            out.push(json!({
                "name": format!("{}/status", k.plural()),
                "singularName": "",
                "namespaced": k.namespaced(),
                "kind": k.kind_name(),
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    out
}

fn group_doc(name: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{name}/{version}"), "version": version});
    json!({"name": name, "versions": [gv.clone()], "preferredVersion": gv})
}

/// True when `accept` admits a JSON answer (no header, `*/*`, `application/*`, JSON).
fn accepts_json(accept: &str) -> bool {
    accept.trim().is_empty()
        || accept.split(',').any(|t| {
            let t = t.split(';').next().unwrap_or("").trim();
            matches!(t, "*/*" | "application/*" | "application/json")
        })
}

fn discovery(d: &Discovery, host: &str, accept: &str) -> Result<Response, ApiError> {
    let body = match d {
        Discovery::OpenApiV2 | Discovery::OpenApiV3Index | Discovery::OpenApiV3(_)
            if !accepts_json(accept) =>
        {
            // client-go asks for the v2 document as gnostic protobuf; the fake
            // serves JSON only, and says so rather than send bytes it cannot parse.
            return Err(ApiError::new(
                406,
                "NotAcceptable",
                format!("only the following media types are accepted: application/json (this fake does not serve the OpenAPI documents as protobuf; asked for {accept:?})"),
            ));
        }
        Discovery::OpenApiV2 => super::openapi::v2_document(),
        Discovery::OpenApiV3Index => super::openapi::v3_index(),
        Discovery::OpenApiV3(gv) => super::openapi::v3_document(gv)
            .ok_or_else(|| ApiError::not_found_path(&format!("/openapi/v3/{gv}")))?,
        Discovery::Api => json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
        }),
        Discovery::CoreV1 => json!({
            "kind": "APIResourceList",
            "groupVersion": "v1",
            "resources": resource_entries("", "v1"),
        }),
        Discovery::Apis => json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": GROUPS.iter().map(|(g, v)| group_doc(g, v)).collect::<Vec<_>>(),
        }),
        Discovery::Group(g) => {
            let v = GROUPS
                .iter()
                .find(|(name, _)| name == g)
                .map_or("v1", |(_, v)| *v);
            let mut doc = group_doc(g, v);
            doc["kind"] = json!("APIGroup");
            doc["apiVersion"] = json!("v1");
            doc
        }
        Discovery::GroupVersion(g, v) => json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": format!("{g}/{v}"),
            "resources": resource_entries(g, v),
        }),
        Discovery::Version => json!({
            "major": "1",
            "minor": "33",
            "gitVersion": "v1.33.0-drivelab",
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2025-01-01T00:00:00Z",
            "goVersion": "go1.24.0",
            "compiler": "gc",
            "platform": "linux/amd64",
        }),
        Discovery::Health => {
            let mut r = Response::new(Body::from("ok"));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            return Ok(r);
        }
    };
    Ok(reply(StatusCode::OK, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            parse_route("/api/v1/namespaces/ns/secrets/s"),
            Route::Item {
                kind: Kind::Secret,
                ns: Some("ns".into()),
                name: "s".into(),
                status: false
            }
        );
        assert_eq!(
            parse_route("/api/v1/secrets"),
            Route::Collection {
                kind: Kind::Secret,
                ns: None
            }
        );
        assert_eq!(parse_route("/api/v1/secrets/s"), Route::Unknown);
        assert_eq!(
            parse_route("/apis/objectstorage.k8s.io/v1alpha1/buckets/b/status"),
            Route::Item {
                kind: Kind::Bucket,
                ns: None,
                name: "b".into(),
                status: true
            }
        );
        assert_eq!(
            parse_route("/apis/objectstorage.k8s.io/v1alpha1/bucketclasses/c/status"),
            Route::Unknown
        );
        assert_eq!(
            parse_route("/apis/objectstorage.k8s.io/v1alpha1/namespaces/n/bucketclaims"),
            Route::Collection {
                kind: Kind::BucketClaim,
                ns: Some("n".into())
            }
        );
        assert_eq!(
            parse_route("/apis/objectstorage.k8s.io/v1alpha1/namespaces/n/buckets"),
            Route::Unknown
        );
        assert_eq!(
            parse_route("/apis/coordination.k8s.io/v1"),
            Route::Discovery(Discovery::GroupVersion("coordination.k8s.io", "v1"))
        );
        assert_eq!(parse_route("/apis/apps/v1"), Route::Unknown);
        assert_eq!(
            parse_route("/api/v1/namespaces/n/pods"),
            Route::Collection {
                kind: Kind::Pod,
                ns: Some("n".into())
            }
        );
        assert_eq!(
            parse_route("/api/v1/namespaces/n/persistentvolumeclaims/c/status"),
            Route::Item {
                kind: Kind::PersistentVolumeClaim,
                ns: Some("n".into()),
                name: "c".into(),
                status: true
            }
        );
        assert_eq!(
            parse_route("/api/v1/persistentvolumes/pv1"),
            Route::Item {
                kind: Kind::PersistentVolume,
                ns: None,
                name: "pv1".into(),
                status: false
            }
        );
        assert_eq!(
            parse_route("/apis/storage.k8s.io/v1/volumeattachments/va/status"),
            Route::Item {
                kind: Kind::VolumeAttachment,
                ns: None,
                name: "va".into(),
                status: true
            }
        );
        assert_eq!(
            parse_route("/apis/storage.k8s.io/v1/storageclasses/sc/status"),
            Route::Unknown
        );
        assert_eq!(
            parse_route("/apis/storage.k8s.io/v1/namespaces/n/csinodes"),
            Route::Unknown
        );
        assert_eq!(parse_route("/api/v1/namespaces/n/services"), Route::Unknown);
    }

    #[test]
    fn namespaces_are_a_cluster_scoped_core_kind() {
        assert_eq!(
            parse_route("/api/v1/namespaces"),
            Route::Collection {
                kind: Kind::Namespace,
                ns: None
            }
        );
        let item = |name: &str, status| Route::Item {
            kind: Kind::Namespace,
            ns: None,
            name: name.into(),
            status,
        };
        assert_eq!(parse_route("/api/v1/namespaces/team"), item("team", false));
        assert_eq!(
            parse_route("/api/v1/namespaces/team/status"),
            item("team", true)
        );
        assert_eq!(
            parse_route("/api/v1/namespaces/team/configmaps"),
            Route::Collection {
                kind: Kind::ConfigMap,
                ns: Some("team".into())
            }
        );
        assert_eq!(
            parse_route("/api/v1/namespaces/team/finalize"),
            Route::Unknown
        );
        let core = resource_entries("", "v1");
        let ns = core
            .iter()
            .find(|r| r["name"] == "namespaces")
            .expect("namespaces in /api/v1 discovery");
        assert_eq!(ns["kind"], "Namespace");
        assert_eq!(ns["namespaced"], false);
        assert_eq!(ns["shortNames"], json!(["ns"]));
        assert!(core.iter().any(|r| r["name"] == "namespaces/status"));
    }

    #[test]
    fn classifies_ops() {
        let parts = |m: &str, uri: &str| {
            let (p, _) = http::Request::builder()
                .method(m)
                .uri(uri)
                .body(())
                .unwrap()
                .into_parts();
            classify(&p)
        };
        let c = parts("POST", "/api/v1/namespaces/drv/secrets");
        assert_eq!(
            (c.op.as_str(), c.subject.as_str()),
            ("create_secret", "drv")
        );
        let c = parts("PUT", "/api/v1/namespaces/drv/configmaps/ckpt");
        assert_eq!(
            (c.op.as_str(), c.subject.as_str()),
            ("replace_configmap", "drv/ckpt")
        );
        assert_eq!(
            parts("GET", "/api/v1/secrets?labelSelector=a%3Db").op,
            "list_secrets"
        );
        assert_eq!(
            parts(
                "PATCH",
                "/apis/objectstorage.k8s.io/v1alpha1/namespaces/n/bucketclaims/c/status"
            )
            .op,
            "patch_bucketclaim_status"
        );
        assert_eq!(
            parts("GET", "/apis/objectstorage.k8s.io/v1alpha1/buckets/b").subject,
            "b"
        );
        assert_eq!(
            parts("GET", "/api/v1/namespaces/n/configmaps?watch=true").op,
            "watch_configmaps"
        );
        assert_eq!(parts("GET", "/apis").op, "discovery");
    }
}

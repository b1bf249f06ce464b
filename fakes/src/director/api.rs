//! The Director's HTTP surface: `/info`, the fake UAA's `/oauth/token`,
//! deployments, tasks and `/dynamic_disks`, every route behind the gate, errors
//! in the Director's `{"code", "description"}` shape.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use http::request::Parts;
use http::{HeaderMap, StatusCode};
use serde_json::{json, Map, Value};

use super::auth::{self, Claims, Permission};
use super::state::{DiskRec, Job, TaskRec};
use super::Inner;
use crate::gate::{http_gate, CallSpec, HttpTap, Rejection, ERROR_CODE_HEADER};
use crate::history::Component;

type Shared = Arc<Inner>;

/// A Director API error.
pub(crate) struct ApiError {
    status: u16,
    code: u32,
    description: String,
}

impl ApiError {
    fn new(status: u16, code: u32, description: impl Into<String>) -> Self {
        Self {
            status,
            code,
            description: description.into(),
        }
    }
    fn unauthorized(description: impl Into<String>) -> Self {
        // UnauthorizedToAccessDeployment
        Self::new(401, 600000, description)
    }
    fn bad_json(why: impl std::fmt::Display) -> Self {
        // ValidationInvalidType
        Self::new(400, 40000, format!("Request body is not valid JSON: {why}"))
    }
    fn missing(field: &str) -> Self {
        // ValidationMissingField
        Self::new(
            400,
            40001,
            format!("Required property '{field}' was not specified in object"),
        )
    }
    fn internal(e: impl std::fmt::Display) -> Self {
        // SystemError
        Self::new(500, 500000, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            axum::Json(json!({"code": self.code, "description": self.description})),
        )
            .into_response();
        if let Ok(v) = http::HeaderValue::from_str(&self.code.to_string()) {
            r.headers_mut().insert(ERROR_CODE_HEADER, v);
        }
        r
    }
}

fn render_rejection(r: &Rejection) -> Response {
    let code = r.code.parse::<u32>().unwrap_or(100);
    let mut resp = ApiError::new(r.http_status, code, r.message.clone()).into_response();
    if let Ok(v) = http::HeaderValue::from_str(&r.code) {
        resp.headers_mut().insert(ERROR_CODE_HEADER, v);
    }
    resp
}

/// The body's `disk_name`, peeked before the gate so the history can name it.
#[derive(Clone)]
struct BodySubject(String);

/// The request body limit. The real Director's nginx allows
/// `director.max_upload_size` (10000m) for release and stemcell tarballs; the
/// fake has no upload routes and its JSON bodies are tiny, so it keeps nginx's
/// default `client_max_body_size` of 1m.
const MAX_BODY: usize = 1024 * 1024;
/// nginx's `large_client_header_buffers 4 8k`: the request line and each
/// header line must fit one 8 KiB buffer, the whole head four of them.
const HEADER_BUFFER: usize = 8 * 1024;

/// What nginx in front of the Director refuses before the Director sees it
/// (nginx answers with an HTML page; the fake keeps the Director's JSON shape
/// with nginx's status so clients and the fuzz oracle see one error shape),
/// then the body, read to the limit and no further, the `disk_name` peeked.
async fn limit_request(req: Request, next: Next) -> Response {
    let token_route = req.uri().path() == "/oauth/token";
    let refuse = |status: u16, description: String| {
        if token_route {
            uaa_error(status, "invalid_request", &description)
        } else {
            ApiError::new(status, 100, description).into_response()
        }
    };
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target > HEADER_BUFFER {
        return refuse(414, "Request-URI Too Large".into());
    }
    let lines: Vec<usize> = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .collect();
    if lines.iter().any(|&n| n > HEADER_BUFFER) || lines.iter().sum::<usize>() > 4 * HEADER_BUFFER {
        return refuse(400, "Request Header Or Cookie Too Large".into());
    }
    // Path parameters are percent-decoded into strings; say so here rather
    // than let the extractor answer in plain text.
    if std::str::from_utf8(&pct_decode_bytes(req.uri().path())).is_err() {
        return ApiError::new(
            400,
            40000,
            format!("Request path {} is not valid UTF-8", req.uri().path()),
        )
        .into_response();
    }
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let too_large = || {
        refuse(
            413,
            format!("Request Entity Too Large: the body limit is {MAX_BODY} bytes"),
        )
    };
    // Refused on the declared length before a byte of the body is read.
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return too_large();
    }
    let (mut parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e)
            if std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>()) =>
        {
            return too_large()
        }
        Err(e) => return refuse(400, format!("Could not read the request body: {e}")),
    };
    if parts.method == http::Method::POST && parts.uri.path().starts_with("/dynamic_disks") {
        if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
            if let Some(n) = v.get("disk_name").and_then(Value::as_str) {
                parts.extensions.insert(BodySubject(n.to_string()));
            }
        }
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The Director API's operations: what its gate records and faults aim at.
pub mod ops {
    crate::declare_ops!(
        /// Every Director API operation.
        pub ALL {
            INFO = "info",
            OAUTH_TOKEN = "oauth.token",
            DEPLOYMENTS_LIST = "deployments.list",
            DEPLOYMENTS_INSTANCES = "deployments.instances",
            TASKS_LIST = "tasks.list",
            TASKS_GET = "tasks.get",
            TASKS_OUTPUT = "tasks.output",
            TASKS_CANCEL = "tasks.cancel",
            DYNAMIC_DISKS_LIST = "dynamic_disks.list",
            DYNAMIC_DISKS_PROVIDE = "dynamic_disks.provide",
            DYNAMIC_DISKS_CREATE = "dynamic_disks.create",
            DYNAMIC_DISKS_ATTACH = "dynamic_disks.attach",
            DYNAMIC_DISKS_DETACH = "dynamic_disks.detach",
            DYNAMIC_DISKS_RESIZE = "dynamic_disks.resize",
            DYNAMIC_DISKS_SNAPSHOTS = "dynamic_disks.snapshots",
            DYNAMIC_DISKS_SNAPSHOT = "dynamic_disks.snapshot",
            DYNAMIC_DISKS_DELETE_SNAPSHOT = "dynamic_disks.delete_snapshot",
            DYNAMIC_DISKS_DELETE = "dynamic_disks.delete",
            UNKNOWN = "unknown",
        }
    );
}

fn classify(parts: &Parts) -> CallSpec {
    use ops::*;
    let path = parts.uri.path();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let m = &parts.method;
    let body_subject = parts
        .extensions
        .get::<BodySubject>()
        .map(|b| b.0.clone())
        .unwrap_or_default();
    let (op, subject) = match (m.as_str(), segs.as_slice()) {
        ("GET", ["info"]) => (INFO, String::new()),
        ("POST", ["oauth", "token"]) => (OAUTH_TOKEN, String::new()),
        ("GET", ["deployments"]) => (DEPLOYMENTS_LIST, String::new()),
        ("GET", ["deployments", d, "instances"]) | ("GET", ["deployments", d, "vms"]) => {
            (DEPLOYMENTS_INSTANCES, d.to_string())
        }
        ("GET", ["tasks"]) => (TASKS_LIST, String::new()),
        ("GET", ["tasks", id]) => (TASKS_GET, id.to_string()),
        ("GET", ["tasks", id, "output"]) => (TASKS_OUTPUT, id.to_string()),
        ("DELETE", ["task", id]) => (TASKS_CANCEL, id.to_string()),
        ("GET", ["dynamic_disks"]) => (DYNAMIC_DISKS_LIST, String::new()),
        ("POST", ["dynamic_disks", "provide"]) => (DYNAMIC_DISKS_PROVIDE, body_subject),
        ("POST", ["dynamic_disks"]) => (DYNAMIC_DISKS_CREATE, body_subject),
        ("POST", ["dynamic_disks", n, "attach"]) => (DYNAMIC_DISKS_ATTACH, n.to_string()),
        ("POST", ["dynamic_disks", n, "detach"]) => (DYNAMIC_DISKS_DETACH, n.to_string()),
        ("POST", ["dynamic_disks", n, "resize"]) => (DYNAMIC_DISKS_RESIZE, n.to_string()),
        ("GET", ["dynamic_disks", "snapshots"]) => (DYNAMIC_DISKS_SNAPSHOTS, String::new()),
        ("POST", ["dynamic_disks", n, "snapshots"]) => (DYNAMIC_DISKS_SNAPSHOT, n.to_string()),
        ("DELETE", ["dynamic_disks", "snapshots", c]) => {
            (DYNAMIC_DISKS_DELETE_SNAPSHOT, c.to_string())
        }
        ("DELETE", ["dynamic_disks", n]) => (DYNAMIC_DISKS_DELETE, n.to_string()),
        _ => (UNKNOWN, path.to_string()),
    };
    CallSpec::new(Component::Driver, Component::Director, op, subject)
}

pub(crate) fn router(inner: Shared) -> Router {
    let tap = HttpTap {
        gate: inner.gate.clone(),
        classify,
        render: render_rejection,
    };
    Router::new()
        .route("/info", get(info))
        .route("/oauth/token", post(token))
        .route("/deployments", get(deployments))
        .route("/deployments/{name}/instances", get(instances))
        .route("/deployments/{name}/vms", get(instances))
        .route("/tasks", get(list_tasks))
        .route("/tasks/{id}", get(get_task))
        .route("/tasks/{id}/output", get(task_output))
        .route("/task/{id}", delete(cancel_task))
        .route("/dynamic_disks", get(list_disks).post(create_disk))
        .route("/dynamic_disks/provide", post(provide))
        .route("/dynamic_disks/{name}/attach", post(attach))
        .route("/dynamic_disks/{name}/detach", post(detach))
        .route("/dynamic_disks/{name}/resize", post(resize))
        .route("/dynamic_disks/{name}", delete(delete_disk))
        .route("/dynamic_disks/snapshots", get(list_snapshots))
        .route("/dynamic_disks/{name}/snapshots", post(take_snapshot))
        .route("/dynamic_disks/snapshots/{cid}", delete(delete_snapshot))
        .fallback(not_found)
        // A known path with the wrong method: axum's default is an empty 405,
        // the Director answers in its error shape (found by fuzz director_http).
        .method_not_allowed_fallback(method_not_allowed)
        .layer(from_fn_with_state(tap, http_gate))
        .layer(from_fn(limit_request))
        .with_state(inner)
}

async fn method_not_allowed(req: Request) -> Response {
    // The token endpoint is UAA's (Spring's answer to a wrong method).
    if req.uri().path() == "/oauth/token" {
        return uaa_error(
            405,
            "method_not_allowed",
            &format!("Request method '{}' is not supported", req.method()),
        );
    }
    ApiError::new(
        405,
        100,
        format!("{} not allowed on {}", req.method(), req.uri().path()),
    )
    .into_response()
}

async fn not_found(req: Request) -> ApiError {
    // The Director's words (its Sinatra `not_found`), in its error shape.
    ApiError::new(
        404,
        100,
        format!("Endpoint '{}' not found.", req.uri().path()),
    )
}

fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    format!("http://{host}")
}

async fn info(State(inner): State<Shared>, headers: HeaderMap) -> Response {
    let c = &inner.config;
    axum::Json(json!({
        "name": c.name,
        "uuid": c.uuid,
        "version": "282.0.0 (drivelab fake)",
        "user": null,
        "cpi": c.cpi_name,
        "stemcell_os": "ubuntu-jammy",
        "stemcell_version": "1.0",
        "user_authentication": {
            "type": "uaa",
            "options": {"url": base_url(&headers), "urls": [base_url(&headers)]},
        },
        "features": {
            "dns": {"status": false, "extras": {"domain_name": "bosh"}},
            "snapshots": {"status": false},
            "config_server": {"status": false, "extras": {"urls": []}},
            "dynamic_disks": {"status": true, "extras": {"workers": inner.sched().workers}},
        },
    }))
    .into_response()
}

fn uaa_error(status: u16, error: &str, description: &str) -> Response {
    let mut r = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
        axum::Json(json!({"error": error, "error_description": description})),
    )
        .into_response();
    if let Ok(v) = http::HeaderValue::from_str(error) {
        r.headers_mut().insert(ERROR_CODE_HEADER, v);
    }
    r
}

fn form(body: &[u8]) -> Vec<(String, String)> {
    url_decode_pairs(std::str::from_utf8(body).unwrap_or(""))
}

fn url_decode_pairs(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (pct_decode(k), pct_decode(v))
        })
        .collect()
}

fn pct_decode(s: &str) -> String {
    String::from_utf8_lossy(&pct_decode_bytes(s)).into_owned()
}

/// `%XX` escapes and `+` decoded; a `%` without two hex digits stays as is.
fn pct_decode_bytes(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len()
                && b[i + 1].is_ascii_hexdigit()
                && b[i + 2].is_ascii_hexdigit() =>
            {
                let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
                out.push(hex(b[i + 1]) << 4 | hex(b[i + 2]));
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// The fake UAA's client-credentials grant (form fields or HTTP Basic).
async fn token(
    State(inner): State<Shared>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let fields = form(&body);
    let field = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.clone());
    let basic = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Basic "));
    let basic_pair = basic
        .and_then(|b| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| {
            s.split_once(':')
                .map(|(a, b)| (pct_decode(a), pct_decode(b)))
        });
    // As UAA (Spring Security): the client authenticates before the grant is
    // looked at, so a bad secret is a 401 whatever the grant type says.
    let (id, secret) = match (basic_pair, field("client_id"), field("client_secret")) {
        (Some(b), _, _) => b,
        (None, Some(i), Some(s)) if basic.is_none() => (i, s),
        (None, None, None) if basic.is_none() => {
            return uaa_error(
                401,
                "unauthorized",
                "Full authentication is required to access this resource",
            )
        }
        _ => return uaa_error(401, "unauthorized", "Bad credentials"),
    };
    let Some(client) = inner
        .config
        .clients
        .iter()
        .find(|c| c.id == id && c.secret.expose() == secret)
    else {
        return uaa_error(401, "unauthorized", "Bad credentials");
    };
    match field("grant_type").as_deref() {
        Some("client_credentials") => {}
        None | Some("") => return uaa_error(400, "invalid_request", "Missing grant type"),
        Some(other) => {
            return uaa_error(
                400,
                "unsupported_grant_type",
                &format!("Unsupported grant type: {other}"),
            )
        }
    }
    // As UAA: a `scope` field narrows the token to those scopes, and asking
    // for one the client does not hold is refused; no field = all of them.
    let scope = match field("scope").filter(|s| !s.trim().is_empty()) {
        None => client.scopes.clone(),
        Some(asked) => {
            let asked: Vec<&str> = asked.split_whitespace().collect();
            if let Some(bad) = asked
                .iter()
                .find(|a| !client.scopes.iter().any(|c| c == *a))
            {
                return uaa_error(
                    400,
                    "invalid_scope",
                    &format!("Invalid scope: {bad}. Did you know that you can get default scopes by simply sending no value?"),
                );
            }
            client
                .scopes
                .iter()
                .filter(|c| asked.contains(&c.as_str()))
                .cloned()
                .collect()
        }
    };
    let now = inner.now_secs();
    let ttl = inner.config.token_ttl.as_secs().max(1);
    let claims = Claims {
        jti: format!("jti-{}", inner.next_jti()),
        client_id: client.id.clone(),
        scope,
        deployments: client.deployments.clone(),
        iat: now,
        exp: now + ttl,
    };
    let tok = auth::issue(&inner.config.token_signing_key, &claims);
    axum::Json(json!({
        "access_token": tok.expose(),
        "token_type": "bearer",
        "expires_in": ttl,
        "scope": claims.scope.join(" "),
        "jti": claims.jti,
    }))
    .into_response()
}

/// The bearer token's claims, or 401.
fn authenticate(inner: &Inner, headers: &HeaderMap, path: &str) -> Result<Claims, ApiError> {
    let Some(h) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
    else {
        return Err(ApiError::unauthorized(format!(
            "Not authorized: '{path}' requires authentication"
        )));
    };
    let Some(tok) = h
        .strip_prefix("Bearer ")
        .or_else(|| h.strip_prefix("bearer "))
    else {
        return Err(ApiError::unauthorized(format!(
            "Not authorized: '{path}' requires a bearer token"
        )));
    };
    let claims = inner
        .verified
        .verify(
            &inner.config.token_signing_key,
            tok.trim(),
            inner.now_secs(),
        )
        .map_err(|e| match e {
            auth::TokenError::Expired => ApiError::unauthorized("Token expired"),
            auth::TokenError::Invalid => ApiError::unauthorized("Invalid token"),
        })?;
    // The Director checks the context id right after authentication, on every route.
    if context_id(headers).chars().count() > 64 {
        // ContextIdViolatedMax
        return Err(ApiError::new(
            400,
            70010,
            "X-Bosh-Context-Id cannot be more than 64 characters in length",
        ));
    }
    Ok(claims)
}

fn require(claims: &Claims, perms: &[Permission]) -> Result<(), ApiError> {
    for p in perms {
        if !claims.has(*p) {
            return Err(ApiError::unauthorized(format!(
                "Require one of the scopes: {}, {}",
                auth::ADMIN,
                p.scope()
            )));
        }
    }
    Ok(())
}

fn require_deployment(inner: &Inner, claims: &Claims, deployment: &str) -> Result<(), ApiError> {
    if inner.config.per_deployment_scoping && !claims.may_touch(deployment) {
        return Err(ApiError::unauthorized(format!(
            "Require one of the scopes: {} (client '{}' is not granted deployment '{deployment}')",
            auth::ADMIN,
            claims.client_id
        )));
    }
    Ok(())
}

async fn deployments(
    State(inner): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/deployments")?;
    require(&c, &[Permission::Read])?;
    let ds = inner.state.deployments().map_err(ApiError::internal)?;
    let out: Vec<Value> = ds
        .iter()
        .filter(|d| !inner.config.per_deployment_scoping || c.may_touch(d))
        .map(|d| json!({"name": d, "releases": [], "stemcells": [], "cloud_config": "latest", "teams": []}))
        .collect();
    Ok(axum::Json(out).into_response())
}

async fn instances(
    State(inner): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/deployments")?;
    require(&c, &[Permission::Read])?;
    require_deployment(&inner, &c, &name)?;
    if !inner
        .state
        .deployments()
        .map_err(ApiError::internal)?
        .contains(&name)
    {
        return Err(ApiError::new(
            404,
            70000,
            format!("Deployment '{name}' doesn't exist"),
        ));
    }
    let out: Vec<Value> = inner
        .state
        .instances()
        .map_err(ApiError::internal)?
        .into_iter()
        .filter(|i| i.deployment == name)
        .map(|i| {
            json!({
                "agent_id": i.agent_id,
                "cid": i.vm_cid,
                "job": i.group,
                "index": i.index,
                "id": i.id,
                "az": i.az,
                "expects_vm": true,
                "state": i.state,
            })
        })
        .collect();
    Ok(axum::Json(out).into_response())
}

fn task_json(t: &TaskRec) -> Value {
    json!({
        "id": t.id,
        "state": t.state.as_str(),
        "description": t.description,
        "timestamp": t.timestamp,
        "started_at": t.started_at,
        "result": t.result,
        "user": t.user,
        "deployment": t.deployment,
        "context_id": t.context_id,
    })
}

fn parse_task_id(s: &str) -> Result<u64, ApiError> {
    s.parse()
        .map_err(|_| ApiError::new(404, 10000, format!("Task {s} not found")))
}

/// The task, if this caller may see it (admin, or the client that queued it).
fn visible_task(inner: &Inner, claims: &Claims, id: &str) -> Result<TaskRec, ApiError> {
    let n = parse_task_id(id)?;
    let t = inner
        .state
        .task(n)
        .map_err(ApiError::internal)?
        .ok_or_else(|| ApiError::new(404, 10000, format!("Task {n} not found")))?;
    if !claims.is_admin() && t.user != claims.client_id {
        return Err(ApiError::unauthorized(format!(
            "Require one of the scopes: {}, bosh.read",
            auth::ADMIN
        )));
    }
    Ok(t)
}

async fn list_tasks(State(inner): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/tasks")?;
    let mut out: Vec<Value> = inner
        .state
        .tasks()
        .map_err(ApiError::internal)?
        .iter()
        .rev()
        .filter(|t| c.is_admin() || t.user == c.client_id)
        .map(task_json)
        .collect();
    out.truncate(200);
    Ok(axum::Json(out).into_response())
}

async fn get_task(
    State(inner): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/tasks")?;
    let t = visible_task(&inner, &c, &id)?;
    Ok(axum::Json(task_json(&t)).into_response())
}

async fn task_output(
    State(inner): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<Vec<(String, String)>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/tasks")?;
    let t = visible_task(&inner, &c, &id)?;
    let kind = q
        .iter()
        .find(|(k, _)| k == "type")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    let text = match kind {
        "result" => t.output.clone().map(|o| o + "\n").unwrap_or_default(),
        "event" => {
            json!({"time": t.timestamp, "stage": t.description, "state": t.state.as_str()})
                .to_string()
                + "\n"
        }
        "debug" | "cpi" => String::new(),
        other => {
            return Err(ApiError::new(
                400,
                40000,
                format!("Invalid output type '{other}' (result, event, debug, cpi)"),
            ))
        }
    };
    Ok(([(http::header::CONTENT_TYPE, "text/plain")], text).into_response())
}

async fn cancel_task(
    State(inner): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/task")?;
    let t = visible_task(&inner, &c, &id)?;
    if t.state.is_finished() {
        // TaskCancelled's sibling: the Director refuses a finished task.
        return Err(ApiError::new(
            400,
            10001,
            format!(
                "Cannot cancel task {}: invalid state ({})",
                t.id,
                t.state.as_str()
            ),
        ));
    }
    inner.cancel(t.id).map_err(ApiError::internal)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn parse_body(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_json("expected a JSON object")),
        Err(e) => Err(ApiError::bad_json(e)),
    }
}

fn str_field(m: &Map<String, Value>, k: &str) -> Result<String, ApiError> {
    match m.get(k) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) | None | Some(Value::Null) => Err(ApiError::missing(k)),
        Some(_) => Err(ApiError::new(
            400,
            40000,
            format!("Property '{k}' value did not match the required type 'String'"),
        )),
    }
}

fn size_field(m: &Map<String, Value>) -> Result<u64, ApiError> {
    match m.get("disk_size") {
        None | Some(Value::Null) => Err(ApiError::missing("disk_size")),
        Some(v) => match v.as_i64() {
            Some(n) if n >= 1 => Ok(n as u64),
            Some(_) => Err(ApiError::new(
                400,
                40002,
                "'disk_size' value (less than 1) should be greater than 1",
            )),
            None => Err(ApiError::new(
                400,
                40000,
                "Property 'disk_size' value did not match the required type 'Integer'",
            )),
        },
    }
}

fn metadata_field(m: &Map<String, Value>) -> Result<Option<Map<String, Value>>, ApiError> {
    match m.get("metadata") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o.clone())),
        Some(_) => Err(ApiError::new(
            400,
            40000,
            "Property 'metadata' value did not match the required type 'Hash'",
        )),
    }
}

fn context_id(headers: &HeaderMap) -> String {
    headers
        .get("x-bosh-context-id")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// Queue `job` and answer 302 to its task once the task has run as far as it
/// can without waiting (see [`Inner::settle`]: the lab's determinism rule).
async fn queued(
    inner: &Shared,
    job: Job,
    claims: &Claims,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let id = inner
        .create_task(job, &claims.client_id, &context_id(headers))
        .map_err(ApiError::internal)?;
    inner.settle(id).await;
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::FOUND;
    if let Ok(v) = http::HeaderValue::from_str(&format!("/tasks/{id}")) {
        r.headers_mut().insert(http::header::LOCATION, v);
    }
    Ok(r)
}

fn instance_deployment(inner: &Inner, instance_id: &str) -> Result<String, ApiError> {
    match inner
        .state
        .instance(instance_id)
        .map_err(ApiError::internal)?
    {
        Some(i) => Ok(i.deployment),
        // AttachDiskErrorUnknownInstance
        None => Err(ApiError::new(
            400,
            520001,
            format!("Instance '{instance_id}' not found"),
        )),
    }
}

async fn provide(
    State(inner): State<Shared>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/dynamic_disks/provide")?;
    require(&c, &[Permission::Create, Permission::Attach])?;
    let m = parse_body(&body)?;
    let instance_id = str_field(&m, "instance_id")?;
    let disk_name = str_field(&m, "disk_name")?;
    let disk_pool_name = str_field(&m, "disk_pool_name")?;
    let disk_size = size_field(&m)?;
    let metadata = metadata_field(&m)?;
    let dep = instance_deployment(&inner, &instance_id)?;
    require_deployment(&inner, &c, &dep)?;
    if let Some(d) = inner.state.disk(&disk_name).map_err(ApiError::internal)? {
        require_deployment(&inner, &c, &d.deployment)?;
    }
    queued(
        &inner,
        Job::Provide {
            instance_id,
            disk_name,
            disk_pool_name,
            disk_size,
            metadata,
        },
        &c,
        &headers,
    )
    .await
}

async fn create_disk(
    State(inner): State<Shared>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/dynamic_disks")?;
    require(&c, &[Permission::Create])?;
    let m = parse_body(&body)?;
    let deployment_name = str_field(&m, "deployment_name")?;
    let disk_name = str_field(&m, "disk_name")?;
    let disk_pool_name = str_field(&m, "disk_pool_name")?;
    let disk_size = size_field(&m)?;
    let metadata = metadata_field(&m)?;
    let az = match m.get("az") {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    };
    require_deployment(&inner, &c, &deployment_name)?;
    if let Some(d) = inner.state.disk(&disk_name).map_err(ApiError::internal)? {
        require_deployment(&inner, &c, &d.deployment)?;
    }
    queued(
        &inner,
        Job::Create {
            deployment_name,
            az,
            disk_name,
            disk_pool_name,
            disk_size,
            metadata,
        },
        &c,
        &headers,
    )
    .await
}

/// A token scoped to other deployments may not touch this disk.
fn check_disk_scope(inner: &Inner, c: &Claims, name: &str) -> Result<(), ApiError> {
    if let Some(d) = inner.state.disk(name).map_err(ApiError::internal)? {
        require_deployment(inner, c, &d.deployment)?;
    }
    Ok(())
}

async fn attach(
    State(inner): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/dynamic_disks")?;
    require(&c, &[Permission::Attach])?;
    let m = parse_body(&body)?;
    let instance_id = str_field(&m, "instance_id")?;
    let metadata = metadata_field(&m)?;
    let dep = instance_deployment(&inner, &instance_id)?;
    require_deployment(&inner, &c, &dep)?;
    check_disk_scope(&inner, &c, &name)?;
    queued(
        &inner,
        Job::Attach {
            disk_name: name,
            instance_id,
            metadata,
        },
        &c,
        &headers,
    )
    .await
}

async fn detach(
    State(inner): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/dynamic_disks")?;
    require(&c, &[Permission::Detach])?;
    check_disk_scope(&inner, &c, &name)?;
    queued(&inner, Job::Detach { disk_name: name }, &c, &headers).await
}

/// `POST /dynamic_disks/:name/resize {"disk_size": MiB}` (the create scope; grow only, detached only).
async fn resize(
    State(inner): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/dynamic_disks")?;
    require(&c, &[Permission::Create])?;
    check_disk_scope(&inner, &c, &name)?;
    let m = parse_body(&body)?;
    let disk_size = size_field(&m)?;
    queued(
        &inner,
        Job::Resize {
            disk_name: name,
            disk_size,
        },
        &c,
        &headers,
    )
    .await
}

async fn delete_disk(
    State(inner): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/dynamic_disks")?;
    require(&c, &[Permission::Delete])?;
    check_disk_scope(&inner, &c, &name)?;
    queued(&inner, Job::Delete { disk_name: name }, &c, &headers).await
}

async fn list_disks(State(inner): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/dynamic_disks")?;
    require(&c, &[Permission::List])?;
    // Scoped lists differ by caller; each disk's entry is the same for all.
    let scoped = inner.config.per_deployment_scoping;
    let body = inner
        .state
        .listed_disks(
            !scoped,
            |d| c.may_touch(&d.deployment),
            |d| serde_json::to_vec(&ListedDisk::from(d)).unwrap_or_default(),
        )
        .map_err(ApiError::internal)?;
    Ok(([(http::header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// One entry of `GET /dynamic_disks`, borrowed from the record (the list is
/// every disk on every call, so no copies). Fields in name order: the same
/// bytes the `json!` object (a sorted map) gave before.
#[derive(serde::Serialize)]
struct ListedDisk<'a> {
    availability_zone: &'a Option<String>,
    cpi: &'a str,
    deployment: &'a str,
    disk_cid: &'a str,
    disk_pool_name: &'a str,
    instance: &'a Option<String>,
    metadata: &'a Map<String, Value>,
    name: &'a str,
    size: u64,
}

impl<'a> From<&'a DiskRec> for ListedDisk<'a> {
    fn from(d: &'a DiskRec) -> Self {
        ListedDisk {
            availability_zone: &d.az,
            cpi: &d.cpi,
            deployment: &d.deployment,
            disk_cid: &d.cid,
            disk_pool_name: &d.pool,
            instance: &d.instance_id,
            metadata: &d.metadata,
            name: &d.name,
            size: d.size_mib,
        }
    }
}

/// `POST /dynamic_disks/:name/snapshots {metadata}`: a task whose result is
/// `{"snapshot_cid": ...}` (BOSH's per-instance snapshot endpoint, per disk).
async fn take_snapshot(
    State(inner): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/dynamic_disks")?;
    require(&c, &[Permission::Create])?;
    let metadata = if body.is_empty() {
        None
    } else {
        metadata_field(&parse_body(&body)?)?
    };
    if inner
        .state
        .disk(&name)
        .map_err(ApiError::internal)?
        .is_none()
    {
        return Err(ApiError::new(
            404,
            520002,
            format!("Disk '{name}' not found"),
        ));
    }
    check_disk_scope(&inner, &c, &name)?;
    queued(
        &inner,
        Job::Snapshot {
            disk_name: name,
            metadata,
        },
        &c,
        &headers,
    )
    .await
}

/// `DELETE /dynamic_disks/snapshots/:cid` (OK for an unknown cid, like disks).
async fn delete_snapshot(
    State(inner): State<Shared>,
    Path(cid): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/dynamic_disks")?;
    require(&c, &[Permission::Delete])?;
    if let Some(s) = inner.state.snapshot(&cid).map_err(ApiError::internal)? {
        require_deployment(&inner, &c, &s.deployment)?;
    }
    queued(
        &inner,
        Job::DeleteSnapshot { snapshot_cid: cid },
        &c,
        &headers,
    )
    .await
}

/// `GET /dynamic_disks/snapshots` (BOSH: `GET /deployments/:d/snapshots`).
async fn list_snapshots(
    State(inner): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let c = authenticate(&inner, &headers, "/dynamic_disks")?;
    require(&c, &[Permission::List])?;
    let out: Vec<Value> = inner
        .state
        .snapshots()
        .map_err(ApiError::internal)?
        .into_iter()
        .filter(|s| !inner.config.per_deployment_scoping || c.may_touch(&s.deployment))
        .map(|s| {
            json!({
                "snapshot_cid": s.snapshot_cid,
                "disk_name": s.disk_name,
                "disk_cid": s.disk_cid,
                "deployment": s.deployment,
                "size": s.size_mib,
                "created_at": s.created_at,
                "clean": true,
                "metadata": s.metadata,
            })
        })
        .collect();
    Ok(axum::Json(out).into_response())
}

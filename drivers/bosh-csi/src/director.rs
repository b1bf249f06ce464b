//! Client for the BOSH Director's dynamic-disks API: a UAA client-credentials
//! token with only the scopes the driver needs (cached, refreshed on expiry and
//! on 401), the write endpoints that answer `302 Location: /tasks/<id>`, task
//! polling, and the mapping of Director answers to CSI error codes.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::Mutex;

use crate::config::{DriverConfig, Mutant, ADMIN_SCOPE, NARROW_SCOPES};
use crate::error::DriverError;
use crate::http::{form, HttpClient, HttpError};
use crate::secret::Secret;

/// A token is refreshed this long before UAA says it expires.
const TOKEN_EXPIRY_MARGIN: Duration = Duration::from_secs(30);

/// One disk as `GET /dynamic_disks` lists it (read through [`ListedDisk`],
/// which holds the wire shape).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DynamicDisk {
    /// Disk name (our volume id).
    pub name: String,
    /// IaaS disk id.
    pub disk_cid: String,
    /// Owning deployment.
    pub deployment: Option<String>,
    /// Instance the disk is attached to, if any.
    pub instance: Option<String>,
    /// Availability zone.
    pub availability_zone: Option<String>,
    /// Size in MiB.
    pub size: i64,
    /// Disk pool.
    pub disk_pool_name: Option<String>,
    /// CPI the disk lives in.
    pub cpi: Option<String>,
}

impl DynamicDisk {
    /// The instance it is attached to, if any ("" and null both mean none).
    pub fn attached_instance(&self) -> Option<&str> {
        self.instance.as_deref().filter(|s| !s.is_empty())
    }

    /// Whether it is attached to `instance_id`. The Director may list an
    /// instance as `group/uuid`; the node id is the uuid.
    pub fn attached_to(&self, instance_id: &str) -> bool {
        self.attached_instance().is_some_and(|i| {
            i == instance_id
                || i.rsplit_once('/')
                    .is_some_and(|(_, uuid)| uuid == instance_id)
        })
    }
}

/// One entry of `GET /dynamic_disks` as it is on the wire, read in place: its
/// strings borrow the list's body (unless escaped), so a lookup in a list of
/// thousands copies only the disk it returns. Fields the driver does not act
/// on are lenient (absent or null is fine) so a richer Director still parses.
#[derive(Deserialize)]
struct ListedDisk<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    disk_cid: Cow<'a, str>,
    #[serde(borrow, default)]
    deployment: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    instance: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    availability_zone: Option<Cow<'a, str>>,
    #[serde(default)]
    size: i64,
    #[serde(borrow, default)]
    disk_pool_name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    cpi: Option<Cow<'a, str>>,
}

impl From<ListedDisk<'_>> for DynamicDisk {
    fn from(d: ListedDisk<'_>) -> Self {
        let owned = |s: Option<Cow<str>>| s.map(Cow::into_owned);
        DynamicDisk {
            name: d.name.into_owned(),
            disk_cid: d.disk_cid.into_owned(),
            deployment: owned(d.deployment),
            instance: owned(d.instance),
            availability_zone: owned(d.availability_zone),
            size: d.size,
            disk_pool_name: owned(d.disk_pool_name),
            cpi: owned(d.cpi),
        }
    }
}

/// Every disk in a disk list's body.
fn list_in(body: &[u8]) -> Result<Vec<DynamicDisk>, DriverError> {
    let listed: Vec<ListedDisk> = serde_json::from_slice(body).map_err(|e| not_a_list(&e))?;
    Ok(listed.into_iter().map(DynamicDisk::from).collect())
}

/// The entry called `name` in a disk list's body (the first, if several are).
fn find_in(body: &[u8], name: &str) -> Result<Option<DynamicDisk>, DriverError> {
    // Checked as UTF-8 once, so the parser need not check each string again.
    let body = std::str::from_utf8(body).map_err(|e| not_a_list(&e))?;
    let mut de = serde_json::Deserializer::from_str(body);
    serde::Deserializer::deserialize_seq(&mut de, FindNamed(name))
        .and_then(|found| de.end().map(|()| found))
        .map_err(|e| not_a_list(&e))
}

/// Visits a disk list keeping only the first entry called `.0`: no list of
/// entries is built, and the others are read in place and dropped.
struct FindNamed<'n>(&'n str);

impl<'de> serde::de::Visitor<'de> for FindNamed<'_> {
    type Value = Option<DynamicDisk>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of dynamic disks")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(d) = seq.next_element::<ListedDisk<'de>>()? {
            if found.is_none() && d.name == self.0 {
                found = Some(d.into());
            }
        }
        Ok(found)
    }
}

/// Why a body is not a disk list, as the driver reports it.
fn not_a_list(e: &dyn std::fmt::Display) -> DriverError {
    DriverError::Internal(format!(
        "GET /dynamic_disks answered something that is not a disk list: {e}"
    ))
}

/// The body of `POST /dynamic_disks`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateDisk {
    /// Disk name.
    pub disk_name: String,
    /// Disk pool.
    pub disk_pool_name: String,
    /// Deployment.
    pub deployment_name: String,
    /// AZ, if pinned.
    pub az: Option<String>,
    /// Size in MiB.
    pub disk_size: i64,
    /// The CSI name, stored as disk metadata for operators.
    pub csi_name: String,
}

/// A Director task as `GET /tasks/:id` answers.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Task {
    /// Task id.
    pub id: u64,
    /// queued, processing, cancelling, cancelled, done, error, timeout.
    pub state: String,
    /// Description.
    #[serde(default)]
    pub description: Option<String>,
    /// Result text (the error message for failed tasks).
    #[serde(default)]
    pub result: Option<String>,
}

struct Token {
    value: Secret,
    expires: Instant,
}

/// A client for one Director with one UAA client. Shared by all controller calls.
pub struct Director {
    http: HttpClient,
    base: String,
    uaa_url: Mutex<Option<String>>,
    client_id: String,
    client_secret: Secret,
    scopes: String,
    token: Mutex<Option<Token>>,
    poll_interval: Duration,
    task_timeout: Duration,
}

impl std::fmt::Debug for Director {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Director")
            .field("base", &self.base)
            .field("client_id", &self.client_id)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

/// A disk snapshot as `GET /dynamic_disks/snapshots` lists it.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct DiskSnapshot {
    /// The IaaS snapshot id (= the CSI snapshot id).
    pub snapshot_cid: String,
    /// The dynamic disk it was taken of (= the CSI volume id).
    pub disk_name: String,
    /// The IaaS disk id.
    pub disk_cid: String,
    /// Disk size in MiB when taken.
    pub size: u64,
    /// Seconds since the epoch of the Director's clock.
    #[serde(default)]
    pub created_at: u64,
    /// What the driver stored with it (`csi_snapshot_name`).
    #[serde(default)]
    pub metadata: serde_json::Map<String, Value>,
}

impl Director {
    /// A client as the config says. Contacts nothing yet.
    pub fn new(config: &DriverConfig) -> Self {
        let scopes = if config.has(Mutant::AdminToken) {
            tracing::warn!(mutant = Mutant::AdminToken.name(), "seeded bug active");
            ADMIN_SCOPE.to_string()
        } else {
            NARROW_SCOPES.join(" ")
        };
        Director {
            http: HttpClient::new(config.http_timeout),
            base: config.director_url.trim_end_matches('/').to_string(),
            uaa_url: Mutex::new(
                Some(config.uaa_url.trim_end_matches('/').to_string()).filter(|u| !u.is_empty()),
            ),
            client_id: config.client_id.clone(),
            client_secret: config.client_secret.clone(),
            scopes,
            token: Mutex::new(None),
            poll_interval: config.poll_interval,
            task_timeout: config.task_timeout,
        }
    }

    /// The scopes the token request asks for (space separated).
    pub fn scopes(&self) -> &str {
        &self.scopes
    }

    /// Every dynamic disk the token may see.
    pub async fn list(&self) -> Result<Vec<DynamicDisk>, DriverError> {
        list_in(&self.list_body().await?)
    }

    /// The disk called `name`, if any. Only its entry is copied out of the
    /// body: the list holds every disk of the deployment, and a fleet's
    /// lookups would otherwise spend their time copying thousands they drop.
    pub async fn find(&self, name: &str) -> Result<Option<DynamicDisk>, DriverError> {
        find_in(&self.list_body().await?, name)
    }

    /// The body of `GET /dynamic_disks`, undecoded.
    async fn list_body(&self) -> Result<Bytes, DriverError> {
        let a = self
            .call("list dynamic disks", Method::GET, "/dynamic_disks", None)
            .await?;
        if a.status != StatusCode::OK {
            return Err(director_error("list dynamic disks", a.status, &a.body));
        }
        Ok(a.body)
    }

    /// Create a disk (not attached) and wait for the task; returns its disk_cid.
    pub async fn create(&self, req: &CreateDisk) -> Result<String, DriverError> {
        let mut body = json!({
            "deployment_name": req.deployment_name,
            "disk_name": req.disk_name,
            "disk_pool_name": req.disk_pool_name,
            "disk_size": req.disk_size,
            "metadata": { "csi_volume_name": req.csi_name },
        });
        if let Some(az) = &req.az {
            body["az"] = json!(az);
        }
        let op = "create dynamic disk";
        let task = self
            .write(op, Method::POST, "/dynamic_disks", Some(body))
            .await?;
        let a = self
            .call(
                op,
                Method::GET,
                &format!("/tasks/{}/output?type=result", task.id),
                None,
            )
            .await?;
        if a.status != StatusCode::OK {
            return Err(director_error(op, a.status, &a.body));
        }
        let v: Value = serde_json::from_slice(&a.body).map_err(|e| {
            DriverError::Internal(format!("task {} result is not JSON: {e}", task.id))
        })?;
        v.get("disk_cid")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                DriverError::Internal(format!("task {} result has no disk_cid", task.id))
            })
    }

    /// Attach `name` to `instance_id` and wait for the task.
    pub async fn attach(&self, name: &str, instance_id: &str) -> Result<(), DriverError> {
        let path = format!("/dynamic_disks/{}/attach", crate::http::encode(name));
        self.write(
            "attach dynamic disk",
            Method::POST,
            &path,
            Some(json!({ "instance_id": instance_id })),
        )
        .await
        .map(drop)
    }

    /// Detach `name` from wherever it is attached and wait for the task.
    pub async fn detach(&self, name: &str) -> Result<(), DriverError> {
        let path = format!("/dynamic_disks/{}/detach", crate::http::encode(name));
        self.write("detach dynamic disk", Method::POST, &path, None)
            .await
            .map(drop)
    }

    /// Delete `name` and wait for the task (the Director answers OK for an unknown name).
    pub async fn delete(&self, name: &str) -> Result<(), DriverError> {
        let path = format!("/dynamic_disks/{}", crate::http::encode(name));
        self.write("delete dynamic disk", Method::DELETE, &path, None)
            .await
            .map(drop)
    }

    /// Every disk snapshot the token may see (`GET /dynamic_disks/snapshots`).
    pub async fn snapshots(&self) -> Result<Vec<DiskSnapshot>, DriverError> {
        let op = "list snapshots";
        let a = self
            .call(op, Method::GET, "/dynamic_disks/snapshots", None)
            .await?;
        if a.status != StatusCode::OK {
            return Err(director_error(op, a.status, &a.body));
        }
        serde_json::from_slice(&a.body).map_err(|e| {
            DriverError::Internal(format!(
                "GET /dynamic_disks/snapshots answered something that is not a snapshot list: {e}"
            ))
        })
    }

    /// Snapshot disk `name` with `metadata` and wait for the task; returns the snapshot cid.
    pub async fn snapshot(&self, name: &str, metadata: Value) -> Result<String, DriverError> {
        let op = "snapshot dynamic disk";
        let path = format!("/dynamic_disks/{}/snapshots", crate::http::encode(name));
        let task = self
            .write(
                op,
                Method::POST,
                &path,
                Some(json!({ "metadata": metadata })),
            )
            .await?;
        let a = self
            .call(
                op,
                Method::GET,
                &format!("/tasks/{}/output?type=result", task.id),
                None,
            )
            .await?;
        if a.status != StatusCode::OK {
            return Err(director_error(op, a.status, &a.body));
        }
        let v: Value = serde_json::from_slice(&a.body).map_err(|e| {
            DriverError::Internal(format!("task {} result is not JSON: {e}", task.id))
        })?;
        v.get("snapshot_cid")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                DriverError::Internal(format!("task {} result has no snapshot_cid", task.id))
            })
    }

    /// Delete snapshot `cid` and wait for the task (OK for an unknown cid).
    pub async fn delete_snapshot(&self, cid: &str) -> Result<(), DriverError> {
        let path = format!("/dynamic_disks/snapshots/{}", crate::http::encode(cid));
        self.write("delete snapshot", Method::DELETE, &path, None)
            .await
            .map(drop)
    }

    /// A write endpoint: expect `302 Location: /tasks/<id>`, then wait for the task.
    async fn write(
        &self,
        op: &'static str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Task, DriverError> {
        let a = self.call(op, method, path, body).await?;
        if !a.status.is_redirection() {
            return Err(director_error(op, a.status, &a.body));
        }
        let location = a
            .headers
            .get(http::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let id = task_id(location).ok_or_else(|| {
            DriverError::Internal(format!(
                "{op}: the Director answered {} with Location {location:?}, not /tasks/<id>",
                a.status
            ))
        })?;
        self.wait_task(op, id).await
    }

    /// Poll `/tasks/<id>` until it ends or the task timeout passes.
    pub async fn wait_task(&self, op: &'static str, id: u64) -> Result<Task, DriverError> {
        let deadline = Instant::now() + self.task_timeout;
        loop {
            let a = self
                .call(op, Method::GET, &format!("/tasks/{id}"), None)
                .await?;
            if a.status != StatusCode::OK {
                return Err(director_error(op, a.status, &a.body));
            }
            let task: Task = serde_json::from_slice(&a.body).map_err(|e| {
                DriverError::Internal(format!("{op}: task {id} answer is not a task: {e}"))
            })?;
            let why = || {
                task.result
                    .clone()
                    .or_else(|| task.description.clone())
                    .unwrap_or_default()
            };
            match task.state.as_str() {
                "done" => return Ok(task),
                "error" => {
                    return Err(DriverError::Aborted(format!(
                        "{op}: Director task {id} failed: {}",
                        why()
                    )))
                }
                "cancelled" => {
                    return Err(DriverError::Aborted(format!(
                        "{op}: Director task {id} was cancelled"
                    )))
                }
                "timeout" => {
                    return Err(DriverError::DeadlineExceeded(format!(
                        "{op}: Director task {id} timed out"
                    )))
                }
                "queued" | "processing" | "cancelling" => {}
                other => {
                    return Err(DriverError::Internal(format!(
                        "{op}: Director task {id} is in unknown state {other:?}"
                    )))
                }
            }
            if Instant::now() >= deadline {
                // It may still run (0 disk workers keep it queued for ever):
                // the CO retries and the name finds whatever it made.
                return Err(DriverError::DeadlineExceeded(format!(
                    "{op}: Director task {id} still {} after {:?}",
                    task.state, self.task_timeout
                )));
            }
            tokio::time::sleep(self.poll_interval).await;
        }
    }

    /// One authenticated call; a 401 gets one fresh token and one retry.
    async fn call(
        &self,
        op: &'static str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<crate::http::Answer, DriverError> {
        let url = format!("{}{path}", self.base);
        let payload = body.map(|b| b.to_string().into_bytes());
        let mut refreshed = false;
        loop {
            let token = self.token(refreshed).await?;
            let auth = format!("Bearer {}", token.expose());
            let headers = [
                ("authorization", auth.as_str()),
                ("accept", "application/json"),
            ];
            let a = self
                .http
                .send(
                    method.clone(),
                    &url,
                    &headers,
                    payload.clone().map(|p| ("application/json", p)),
                )
                .await
                .map_err(|e| unreachable(op, e))?;
            if a.status == StatusCode::UNAUTHORIZED && !refreshed {
                tracing::info!(op, "Director refused the token; fetching a fresh one");
                refreshed = true;
                continue;
            }
            if a.status == StatusCode::UNAUTHORIZED {
                // A fresh token refused too: not an expiry but a missing grant
                // (the Director says 401 UnauthorizedToAccessDeployment for that).
                let e = director_error(op, a.status, &a.body);
                return Err(DriverError::PermissionDenied(format!(
                    "{e} (with a freshly issued token: client {:?} is not authorized for this)",
                    self.client_id
                )));
            }
            return Ok(a);
        }
    }

    /// Fetch a token now, best effort: a controller that starts with bad
    /// credentials says so in its log at once, and its first requests do not
    /// all queue behind one token fetch.
    pub async fn warm_up(&self) {
        if let Err(e) = self.token(false).await {
            tracing::warn!(error = %e, "no UAA token at start; requests will retry");
        }
    }

    /// The cached token, or a fresh one when it is missing, expiring or `force`d.
    async fn token(&self, force: bool) -> Result<Secret, DriverError> {
        let mut slot = self.token.lock().await;
        if let Some(t) = slot.as_ref() {
            if !force && Instant::now() < t.expires {
                return Ok(t.value.clone());
            }
        }
        let uaa = self.uaa_url().await?;
        let url = format!("{uaa}/oauth/token");
        let body = form(&[
            ("grant_type", "client_credentials"),
            ("client_id", &self.client_id),
            ("client_secret", self.client_secret.expose()),
            ("scope", &self.scopes),
        ]);
        let a = self
            .http
            .send(
                Method::POST,
                &url,
                &[("accept", "application/json")],
                Some(("application/x-www-form-urlencoded", body)),
            )
            .await
            .map_err(|e| unreachable("fetch UAA token", e))?;
        if !a.status.is_success() {
            let detail = uaa_error(&a.body);
            return Err(match a.status.as_u16() {
                400 | 401 | 403 => DriverError::Unauthenticated(format!(
                    "UAA refused client {:?} (HTTP {}): {detail}",
                    self.client_id, a.status
                )),
                s if s >= 500 || s == 429 => DriverError::Unavailable(format!(
                    "UAA answered HTTP {}: {detail}; retry",
                    a.status
                )),
                _ => DriverError::Internal(format!("UAA answered HTTP {}: {detail}", a.status)),
            });
        }
        #[derive(Deserialize)]
        struct TokenAnswer {
            access_token: String,
            #[serde(default)]
            expires_in: Option<u64>,
            #[serde(default)]
            scope: Option<String>,
        }
        let t: TokenAnswer = serde_json::from_slice(&a.body).map_err(|e| {
            // Never echo the body: it may hold a token.
            DriverError::Internal(format!("UAA token answer is not a token: {e}"))
        })?;
        if t.access_token.is_empty() {
            return Err(DriverError::Internal(
                "UAA answered an empty access_token".into(),
            ));
        }
        let life = Duration::from_secs(t.expires_in.unwrap_or(60));
        let expires = Instant::now() + life.saturating_sub(TOKEN_EXPIRY_MARGIN.min(life / 2));
        tracing::info!(client = %self.client_id, scope = t.scope.as_deref().unwrap_or(""), expires_in = life.as_secs(), "got UAA token");
        let value = Secret::new(t.access_token);
        *slot = Some(Token {
            value: value.clone(),
            expires,
        });
        Ok(value)
    }

    /// UAA's base URL: configured, or what the Director's `/info` advertises.
    async fn uaa_url(&self) -> Result<String, DriverError> {
        let mut slot = self.uaa_url.lock().await;
        if let Some(u) = slot.as_ref() {
            return Ok(u.clone());
        }
        let a = self
            .http
            .send(Method::GET, &format!("{}/info", self.base), &[], None)
            .await
            .map_err(|e| unreachable("read Director /info", e))?;
        if a.status != StatusCode::OK {
            return Err(director_error("read Director /info", a.status, &a.body));
        }
        let v: Value = serde_json::from_slice(&a.body)
            .map_err(|e| DriverError::Internal(format!("Director /info is not JSON: {e}")))?;
        let auth = &v["user_authentication"];
        let url = match (auth["type"].as_str(), auth["options"]["url"].as_str()) {
            (Some("uaa"), Some(u)) if !u.is_empty() => u.trim_end_matches('/').to_string(),
            (t, _) => {
                return Err(DriverError::FailedPrecondition(format!(
                    "the Director's /info advertises user_authentication type {:?}, not uaa with a url; pass --uaa-url",
                    t.unwrap_or("none")
                )))
            }
        };
        *slot = Some(url.clone());
        Ok(url)
    }
}

/// The task id in a `Location` header (`/tasks/7` or `http://host/tasks/7`).
pub fn task_id(location: &str) -> Option<u64> {
    let path = location.split('?').next()?;
    let (_, id) = path.trim_end_matches('/').rsplit_once("/tasks/")?;
    id.parse().ok()
}

fn unreachable(op: &str, e: HttpError) -> DriverError {
    match e {
        HttpError::Local { .. } => DriverError::Internal(format!("{op}: {e}")),
        // A write that timed out may have been accepted: retrying by name is safe.
        _ => DriverError::Unavailable(format!("{op}: {e}; retry")),
    }
}

fn uaa_error(body: &[u8]) -> String {
    // UAA errors are {"error": ..., "error_description": ...}; nothing else is echoed.
    serde_json::from_slice::<Value>(body)
        .ok()
        .map(|v| {
            format!(
                "{} {}",
                v["error"].as_str().unwrap_or(""),
                v["error_description"].as_str().unwrap_or("")
            )
            .trim()
            .to_string()
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "(no error body)".into())
}

/// The Director's error shape `{"code": n, "description": "..."}`, classified.
pub fn director_error(op: &str, status: StatusCode, body: &[u8]) -> DriverError {
    let (code, description) = serde_json::from_slice::<Value>(body)
        .ok()
        .map(|v| {
            (
                v["code"].as_i64(),
                v["description"].as_str().unwrap_or("").to_string(),
            )
        })
        .unwrap_or((None, String::new()));
    let msg = format!(
        "{op}: Director answered HTTP {}{}{}",
        status.as_u16(),
        code.map(|c| format!(" code {c}")).unwrap_or_default(),
        if description.is_empty() {
            String::new()
        } else {
            format!(": {description}")
        }
    );
    // Director error codes the driver must tell apart from a plain bad request.
    const UNKNOWN_INSTANCE: i64 = 520001;
    match status.as_u16() {
        _ if code == Some(UNKNOWN_INSTANCE) => DriverError::NotFound(msg),
        400 | 422 => DriverError::InvalidArgument(msg),
        401 => DriverError::Unauthenticated(msg),
        403 => DriverError::PermissionDenied(msg),
        404 => DriverError::NotFound(msg),
        409 => DriverError::Aborted(msg),
        429 | 500..=599 => DriverError::Unavailable(format!("{msg}; retry")),
        _ => DriverError::Internal(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids() {
        assert_eq!(task_id("/tasks/7"), Some(7));
        assert_eq!(task_id("http://127.0.0.1:25555/tasks/42"), Some(42));
        assert_eq!(task_id("/tasks/42/"), Some(42));
        assert_eq!(task_id("/tasks/42?x=1"), Some(42));
        for bad in ["", "/tasks/", "/tasks/x", "/task/7", "/deployments/7"] {
            assert_eq!(task_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn director_errors_are_classified() {
        let body = br#"{"code": 100, "description": "disk pool 'x' not found"}"#;
        let e = director_error("create", StatusCode::BAD_REQUEST, body);
        assert!(
            matches!(&e, DriverError::InvalidArgument(s) if s.contains("code 100") && s.contains("disk pool")),
            "{e}"
        );
        assert_eq!(
            director_error("x", StatusCode::FORBIDDEN, b"").code(),
            tonic::Code::PermissionDenied
        );
        assert_eq!(
            director_error("x", StatusCode::NOT_FOUND, b"").code(),
            tonic::Code::NotFound
        );
        assert_eq!(
            director_error("x", StatusCode::SERVICE_UNAVAILABLE, b"<html>").code(),
            tonic::Code::Unavailable
        );
        assert_eq!(
            director_error("x", StatusCode::CONFLICT, b"{}").code(),
            tonic::Code::Aborted
        );
        assert_eq!(
            director_error("x", StatusCode::IM_A_TEAPOT, b"{}").code(),
            tonic::Code::Internal
        );
    }

    #[test]
    fn attachment() {
        let d = DynamicDisk {
            instance: Some("worker/abc-1".into()),
            ..Default::default()
        };
        assert!(d.attached_to("abc-1"));
        assert!(d.attached_to("worker/abc-1"));
        assert!(!d.attached_to("abc"));
        let none = DynamicDisk {
            instance: Some(String::new()),
            ..Default::default()
        };
        assert_eq!(none.attached_instance(), None);
        let listed = list_in(
            br#"[{"name":"csi-1","disk_cid":"d-1","deployment":"k8s","instance":null,"availability_zone":"z1","size":1024,"disk_pool_name":"fast","cpi":"c","metadata":{"a":"b"}},{"name":"csi-2"}]"#,
        )
        .unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].size, 1024);
        assert_eq!(listed[1].attached_instance(), None);
    }

    #[test]
    fn a_lookup_copies_the_entry_it_finds() {
        let body = br#"[{"name":"csi-0","extra":[1,{"x":null}]},
            {"name":"csi-\u0031","disk_cid":"d-1","deployment":"k8s","instance":"worker/abc",
             "availability_zone":"z1","size":2048,"disk_pool_name":"fast","cpi":"c","metadata":{"a":"b"}},
            {"name":"csi-1","disk_cid":"a later twin"}]"#;
        let found = find_in(body, "csi-1").unwrap().unwrap();
        let listed = list_in(body).unwrap();
        assert_eq!(
            found, listed[1],
            "the first entry of that name, read as a list reads it"
        );
        let want = DynamicDisk {
            name: "csi-1".into(),
            disk_cid: "d-1".into(),
            deployment: Some("k8s".into()),
            instance: Some("worker/abc".into()),
            availability_zone: Some("z1".into()),
            size: 2048,
            disk_pool_name: Some("fast".into()),
            cpi: Some("c".into()),
        };
        assert_eq!(found, want);
        assert!(found.attached_to("abc"));
        assert_eq!(find_in(body, "csi-2").unwrap(), None);
        for bad in [
            &b"{}"[..],
            b"[{\"size\":1}]",
            b"[{\"name\":1}]",
            b"[{\"name\":\"csi-0\",\"size\":\"big\"},{\"name\":\"csi-1\"}]",
            b"<html>",
            b"[] trailing",
            b"[{\"name\":\"\xff\"}]",
        ] {
            assert!(
                matches!(find_in(bad, "csi-1"), Err(DriverError::Internal(m)) if m.contains("not a disk list")),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn debug_has_no_secret() {
        let c = DriverConfig {
            director_url: "http://127.0.0.1:1".into(),
            client_id: "csi".into(),
            client_secret: Secret::new("topsecret"),
            ..Default::default()
        };
        let d = Director::new(&c);
        assert!(!format!("{d:?}").contains("topsecret"));
        assert_eq!(d.scopes(), NARROW_SCOPES.join(" "));
        let admin = Director::new(&DriverConfig {
            mutants: vec![Mutant::AdminToken],
            ..c
        });
        assert_eq!(admin.scopes(), "bosh.admin");
    }
}

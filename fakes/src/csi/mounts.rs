//! The fake node mount table: what the kernel's mount table and mkfs are to a
//! CSI node plugin, one per node, served as HTTP JSON on 127.0.0.1 (the plugin's
//! `--mounter-url`). It enforces the rules a real node does: read-only bind
//! mounts stay read-only, a target holds one mount, a busy mount cannot go,
//! and a disk keeps the one filesystem it was formatted with.
//!
//! A bind source is a path at or under a mount of the table, or, as the kernel
//! allows, a directory that exists on the real host filesystem (how a
//! directory-backed driver such as hostpath-csi exposes its volumes); a source
//! that is neither is ENOENT (`NoSuchSource`). Such a mount has no disk: its
//! `disk_cid` is empty and `host_dir` names the directory behind it, through
//! binds of binds too (like the root field of /proc/self/mountinfo).
//!
//! Mounts live in memory: they survive a node-plugin restart (the kernel keeps
//! them) and are lost with the node (the lab makes a fresh table on a VM recreate).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::gate::{http_gate, CallSpec, Gate, HttpTap, Rejection, ERROR_CODE_HEADER};
use crate::history::Component;

/// A block device visible on the node (the agent made it appear there).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Device {
    /// `/dev/disk/by-id/<disk_cid>`
    pub path: String,
    /// The IaaS disk id behind it.
    pub disk_cid: String,
}

impl Device {
    /// The device a disk shows up as, named as udev's by-id links are.
    pub fn for_disk(disk_cid: &str) -> Self {
        Self {
            path: format!("/dev/disk/by-id/{disk_cid}"),
            disk_cid: disk_cid.to_string(),
        }
    }
}

/// Where a node's visible devices come from; the lab feeds it from the
/// Director's agent (add/remove dynamic disk) calls.
pub type DeviceSource = Arc<dyn Fn() -> Vec<Device> + Send + Sync>;

/// Filesystems on disks, keyed by disk cid and shared by every node's table:
/// a filesystem travels with its disk when it is attached elsewhere.
#[derive(Clone, Debug, Default)]
pub struct Filesystems(Arc<Mutex<BTreeMap<String, String>>>);

impl Filesystems {
    /// The filesystem type on `disk_cid`, if it was ever formatted.
    pub fn fstype(&self, disk_cid: &str) -> Option<String> {
        lock(&self.0).get(disk_cid).cloned()
    }

    /// Every formatted disk and its filesystem type.
    pub fn all(&self) -> BTreeMap<String, String> {
        lock(&self.0).clone()
    }

    /// The disk was deleted: its filesystem goes with it.
    pub fn forget(&self, disk_cid: &str) {
        lock(&self.0).remove(disk_cid);
    }
}

/// A mount request, as `POST /mount` carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountRequest {
    /// A device path, or (for a bind mount) a path at or under a mount target
    /// or an existing host directory.
    pub source: String,
    /// Where to mount.
    pub target: String,
    /// Filesystem type; optional (detected) for device mounts, ignored for binds.
    #[serde(default)]
    pub fstype: Option<String>,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
    /// A bind mount of `source`.
    #[serde(default)]
    pub bind: bool,
}

/// One entry of the mount table, as `GET /mounts` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountEntry {
    /// Device path or bind source.
    pub source: String,
    /// Mount point.
    pub target: String,
    /// Filesystem type (a bind shows the filesystem it exposes).
    pub fstype: String,
    /// Read-only.
    pub read_only: bool,
    /// A bind mount.
    pub bind: bool,
    /// The host directory behind a mount that has no disk (empty otherwise;
    /// left out of the JSON then, so disk-backed entries read as before).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_dir: String,
}

/// A mount as checks and snapshots see it (not on the wire).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MountView {
    /// The node this table belongs to.
    pub node: String,
    /// Device path or bind source.
    pub source: String,
    /// Mount point.
    pub target: String,
    /// Filesystem type.
    pub fstype: String,
    /// Read-only.
    pub read_only: bool,
    /// A bind mount.
    pub bind: bool,
    /// The disk whose filesystem this mount exposes (through binds too);
    /// empty for a bind of a host directory.
    pub disk_cid: String,
    /// The host directory this mount exposes (through binds too); empty for a disk.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_dir: String,
    /// False when what backs the mount is gone: the disk is no longer visible
    /// on the node (detached under a mount), or the host directory was removed.
    pub device_present: bool,
}

/// Why the table refused a request; each has the contract's code and status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    /// 400: malformed JSON, a missing field, a relative or `..` path.
    #[error("{0}")]
    InvalidRequest(String),
    /// 404: the device is not visible on this node.
    #[error("no such device on node: {0}")]
    NoSuchDevice(String),
    /// 404: a bind source that is not at or under a mount.
    #[error("bind source is not a mounted path: {0}")]
    NoSuchSource(String),
    /// 409: the target has a different mount.
    #[error("{target} is already mounted from {source_path} with other flags")]
    AlreadyMounted { target: String, source_path: String },
    /// 400: a read-write bind of a read-only mount.
    #[error("{0} is mounted read-only; a bind of it cannot be read-write")]
    ReadOnlySource(String),
    /// 400: a device mount whose filesystem does not match (or does not exist).
    #[error("wrong fs type on {device}: want {want}, device has {have}")]
    WrongFsType {
        device: String,
        want: String,
        have: String,
    },
    /// 404: nothing mounted at the target.
    #[error("not mounted: {0}")]
    NotMounted(String),
    /// 409: another mount uses the target (a bind of it, or a mount under it).
    #[error("target is busy: {target} is used by {by}")]
    Busy { target: String, by: String },
    /// 409: the device already has another filesystem.
    #[error("{device} already has a {have} filesystem")]
    AlreadyFormatted { device: String, have: String },
    /// 404: `rmdir` of a path that does not exist.
    #[error("no such path: {0}")]
    NoSuchPath(String),
    /// 501: something the kernel would do that this table does not model.
    #[error("not implemented by the lab's mount table: {0}")]
    NotImplemented(String),
}

impl MountError {
    /// The contract's error code.
    pub fn code(&self) -> &'static str {
        match self {
            MountError::InvalidRequest(_) => "InvalidRequest",
            MountError::NoSuchDevice(_) => "NoSuchDevice",
            MountError::NoSuchSource(_) => "NoSuchSource",
            MountError::AlreadyMounted { .. } => "AlreadyMounted",
            MountError::ReadOnlySource(_) => "ReadOnlySource",
            MountError::WrongFsType { .. } => "WrongFsType",
            MountError::NotMounted(_) => "NotMounted",
            MountError::Busy { .. } => "Busy",
            MountError::AlreadyFormatted { .. } => "AlreadyFormatted",
            MountError::NoSuchPath(_) => "NoSuchPath",
            MountError::NotImplemented(_) => "NotImplemented",
        }
    }

    /// The HTTP status it is answered with.
    pub fn http_status(&self) -> u16 {
        match self {
            MountError::InvalidRequest(_)
            | MountError::ReadOnlySource(_)
            | MountError::WrongFsType { .. } => 400,
            MountError::NoSuchDevice(_)
            | MountError::NoSuchSource(_)
            | MountError::NotMounted(_)
            | MountError::NoSuchPath(_) => 404,
            MountError::AlreadyMounted { .. }
            | MountError::Busy { .. }
            | MountError::AlreadyFormatted { .. } => 409,
            MountError::NotImplemented(_) => 501,
        }
    }
}

impl IntoResponse for MountError {
    fn into_response(self) -> Response {
        error_response(self.http_status(), self.code(), &self.to_string())
    }
}

fn error_response(status: u16, code: &str, message: &str) -> Response {
    let mut r = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response();
    if let Ok(v) = http::HeaderValue::from_str(code) {
        r.headers_mut().insert(ERROR_CODE_HEADER, v);
    }
    r
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Mount {
    source: String,
    fstype: String,
    read_only: bool,
    bind: bool,
    disk_cid: String,
    /// The host directory behind a mount with no disk (see the module doc).
    host_dir: String,
}

/// One node's mount table. Cheap to clone (shared state).
#[derive(Clone)]
pub struct MountTable {
    inner: Arc<Inner>,
}

struct Inner {
    node: String,
    devices: DeviceSource,
    filesystems: Filesystems,
    gate: Gate,
    mounts: Mutex<BTreeMap<String, Mount>>,
    /// Mount points that exist as directories: a mount creates its target
    /// (as `mkdir -p` before mount(8) does) and only `rmdir` removes it, so
    /// a target path left behind after its unmount is visible.
    dirs: Mutex<std::collections::BTreeSet<String>>,
    /// Mounts and unmounts so far, counted under the `mounts` lock.
    changes: std::sync::atomic::AtomicU64,
}

/// A path must be absolute and plain: no `..`, `.`, or empty components.
fn clean_path(p: &str, what: &str) -> Result<String, MountError> {
    if !p.starts_with('/') {
        return Err(MountError::InvalidRequest(format!(
            "{what} must be an absolute path: {p:?}"
        )));
    }
    let trimmed = if p.len() > 1 {
        p.trim_end_matches('/')
    } else {
        p
    };
    if trimmed
        .split('/')
        .skip(1)
        .any(|c| c.is_empty() || c == "." || c == "..")
        && trimmed != "/"
    {
        return Err(MountError::InvalidRequest(format!(
            "{what} must not contain empty, '.' or '..' components: {p:?}"
        )));
    }
    Ok(trimmed.to_string())
}

/// A bind of a host directory: allowed when `source` exists as a directory on
/// the real host filesystem (followed through symlinks, as mount(2) does).
fn host_dir_bind(source: &str, read_only: bool) -> Result<Mount, MountError> {
    match std::fs::metadata(source) {
        Ok(m) if m.is_dir() => Ok(Mount {
            source: source.to_string(),
            // The table does not model the host's filesystems.
            fstype: String::new(),
            read_only,
            bind: true,
            disk_cid: String::new(),
            host_dir: source.to_string(),
        }),
        Ok(_) => Err(MountError::NotImplemented(format!(
            "bind of {source}: binding a host file (not a directory) is not modelled"
        ))),
        Err(_) => Err(MountError::NoSuchSource(source.to_string())),
    }
}

/// The rest of `path` below `dir` (`/x/y` for `/d/x/y` under `/d`), given `under(path, dir)`.
fn subpath<'a>(path: &'a str, dir: &str) -> &'a str {
    if dir == "/" {
        if path == "/" {
            ""
        } else {
            path
        }
    } else {
        &path[dir.len()..]
    }
}

/// True when `path` is `dir` or inside it.
fn under(path: &str, dir: &str) -> bool {
    path == dir || dir == "/" || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

impl MountTable {
    /// An empty table for `node`; HTTP requests pass `gate` (Component::Mounts).
    pub fn new(node: &str, devices: DeviceSource, filesystems: Filesystems, gate: Gate) -> Self {
        Self {
            inner: Arc::new(Inner {
                node: node.to_string(),
                devices,
                filesystems,
                gate,
                mounts: Mutex::default(),
                dirs: Mutex::default(),
                changes: Default::default(),
            }),
        }
    }

    /// The node this table belongs to.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The shared filesystem registry.
    pub fn filesystems(&self) -> &Filesystems {
        &self.inner.filesystems
    }

    /// Devices visible on the node now, sorted by path.
    pub fn devices(&self) -> Vec<Device> {
        let mut d = (self.inner.devices)();
        d.sort();
        d.dedup();
        d
    }

    fn device(&self, path: &str) -> Result<Device, MountError> {
        self.devices()
            .into_iter()
            .find(|d| d.path == path)
            .ok_or_else(|| MountError::NoSuchDevice(path.to_string()))
    }

    fn mounts_lock(&self) -> MutexGuard<'_, BTreeMap<String, Mount>> {
        lock(&self.inner.mounts)
    }

    /// `mkfs`: idempotent for the same type; refuses another type.
    pub fn format(&self, device: &str, fstype: &str) -> Result<(), MountError> {
        if fstype.is_empty()
            || !fstype
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            return Err(MountError::InvalidRequest(format!(
                "fstype must be a filesystem name like ext4: {fstype:?}"
            )));
        }
        let dev = self.device(device)?;
        let mut fs = lock(&self.inner.filesystems.0);
        match fs.get(&dev.disk_cid) {
            Some(have) if have == fstype => Ok(()),
            Some(have) => Err(MountError::AlreadyFormatted {
                device: device.to_string(),
                have: have.clone(),
            }),
            None => {
                fs.insert(dev.disk_cid, fstype.to_string());
                Ok(())
            }
        }
    }

    /// `blkid`: the filesystem on a visible device.
    pub fn fstype(&self, device: &str) -> Result<Option<String>, MountError> {
        let dev = self.device(device)?;
        Ok(self.inner.filesystems.fstype(&dev.disk_cid))
    }

    /// `mount`, with the table's rules (see the module doc).
    pub fn mount(&self, req: &MountRequest) -> Result<(), MountError> {
        let target = clean_path(&req.target, "target")?;
        let source = clean_path(&req.source, "source")?;
        let mut mounts = self.mounts_lock();
        let want = if req.bind {
            // The mount that covers the source path (the innermost one).
            let cover = mounts
                .iter()
                .filter(|(t, _)| under(&source, t) && **t != target)
                .max_by_key(|(t, _)| t.len());
            match cover {
                Some((cover_target, cover)) => {
                    if cover.read_only && !req.read_only {
                        return Err(MountError::ReadOnlySource(cover_target.clone()));
                    }
                    // A path under a host-dir bind is that directory's subpath,
                    // which (unlike a disk's contents) the table can see exists.
                    let host_dir = if cover.host_dir.is_empty() {
                        String::new()
                    } else {
                        let dir = format!("{}{}", cover.host_dir, subpath(&source, cover_target));
                        host_dir_bind(&dir, req.read_only)?;
                        dir
                    };
                    Mount {
                        source: source.clone(),
                        fstype: cover.fstype.clone(),
                        read_only: req.read_only,
                        bind: true,
                        disk_cid: cover.disk_cid.clone(),
                        host_dir,
                    }
                }
                None => host_dir_bind(&source, req.read_only)?,
            }
        } else {
            let dev = self.device(&source)?;
            let have = self.inner.filesystems.fstype(&dev.disk_cid);
            let asked = req.fstype.clone().filter(|f| !f.is_empty());
            let fstype = match (have, asked) {
                (Some(h), None) => h,
                (Some(h), Some(a)) if h == a => h,
                (have, asked) => {
                    return Err(MountError::WrongFsType {
                        device: source.clone(),
                        want: asked.unwrap_or_else(|| "any".into()),
                        have: have.unwrap_or_else(|| "no filesystem".into()),
                    })
                }
            };
            Mount {
                source: source.clone(),
                fstype,
                read_only: req.read_only,
                bind: false,
                disk_cid: dev.disk_cid,
                host_dir: String::new(),
            }
        };
        match mounts.get(&target) {
            Some(m) if *m == want => Ok(()),
            Some(m) => Err(MountError::AlreadyMounted {
                target,
                source_path: m.source.clone(),
            }),
            None => {
                lock(&self.inner.dirs).insert(target.clone());
                mounts.insert(target, want);
                self.changed();
                Ok(())
            }
        }
    }

    /// `rmdir` of a mount point: refused while anything is mounted at or
    /// under it; a path that does not exist is `NoSuchPath`.
    pub fn remove_dir(&self, path: &str) -> Result<(), MountError> {
        let path = clean_path(path, "path")?;
        let mounts = self.mounts_lock();
        if let Some((t, _)) = mounts.iter().find(|(t, _)| under(t, &path)) {
            return Err(MountError::Busy {
                target: path.clone(),
                by: t.clone(),
            });
        }
        if !lock(&self.inner.dirs).remove(&path) {
            return Err(MountError::NoSuchPath(path));
        }
        Ok(())
    }

    /// Whether `path` exists on the node: a mount point made and not removed.
    pub fn path_exists(&self, path: &str) -> bool {
        let p = path.trim_end_matches('/');
        let mounted = self.mounts_lock().contains_key(p);
        mounted || lock(&self.inner.dirs).contains(p)
    }

    /// `umount`: refused while another mount uses the target.
    pub fn unmount(&self, target: &str) -> Result<(), MountError> {
        let target = clean_path(target, "target")?;
        let mut mounts = self.mounts_lock();
        if !mounts.contains_key(&target) {
            return Err(MountError::NotMounted(target));
        }
        let user = mounts.iter().find(|(t, m)| {
            **t != target && ((m.bind && under(&m.source, &target)) || under(t, &target))
        });
        if let Some((t, _)) = user {
            return Err(MountError::Busy {
                target: target.clone(),
                by: t.clone(),
            });
        }
        mounts.remove(&target);
        self.changed();
        Ok(())
    }

    fn changed(&self) {
        self.inner
            .changes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many mounts and unmounts the table has taken: while it reads the
    /// same, the table is the same (a cheap test for "anything changed?").
    pub fn changes(&self) -> u64 {
        self.inner
            .changes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The table as `GET /mounts` lists it, sorted by target.
    pub fn entries(&self) -> Vec<MountEntry> {
        self.mounts_lock()
            .iter()
            .map(|(t, m)| MountEntry {
                source: m.source.clone(),
                target: t.clone(),
                fstype: m.fstype.clone(),
                read_only: m.read_only,
                bind: m.bind,
                host_dir: m.host_dir.clone(),
            })
            .collect()
    }

    /// The table for checks and snapshots, sorted by target.
    pub fn mounts(&self) -> Vec<MountView> {
        let present: Vec<String> = self.devices().into_iter().map(|d| d.disk_cid).collect();
        self.mounts_lock()
            .iter()
            .map(|(t, m)| MountView {
                node: self.inner.node.clone(),
                source: m.source.clone(),
                target: t.clone(),
                fstype: m.fstype.clone(),
                read_only: m.read_only,
                bind: m.bind,
                disk_cid: m.disk_cid.clone(),
                host_dir: m.host_dir.clone(),
                device_present: if m.host_dir.is_empty() {
                    present.contains(&m.disk_cid)
                } else {
                    std::path::Path::new(&m.host_dir).is_dir()
                },
            })
            .collect()
    }

    /// Mounts at or under `dir` (e.g. a pod's volume directory), for leak checks.
    pub fn mounts_under(&self, dir: &str) -> Vec<MountView> {
        self.mounts()
            .into_iter()
            .filter(|m| under(&m.target, dir.trim_end_matches('/')))
            .collect()
    }

    /// The HTTP API, with the gate layer applied.
    pub fn router(&self) -> Router {
        let tap = HttpTap {
            gate: self.inner.gate.clone(),
            classify,
            render: render_rejection,
        };
        Router::new()
            .route("/devices", get(list_devices))
            .route("/mounts", get(list_mounts))
            .route("/format", post(format).get(get_format))
            .route("/mount", post(mount))
            .route("/unmount", post(unmount))
            .route("/rmdir", post(rmdir))
            .fallback(not_found)
            .with_state(self.clone())
            .layer(axum::middleware::from_fn_with_state(tap, http_gate))
            // Outermost, so the gate's classifier can name the node.
            .layer(Extension(NodeTag(self.inner.node.clone())))
    }

    /// Serve the HTTP API on `addr` (e.g. [`crate::serve::loopback`]).
    pub async fn serve(
        &self,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<crate::serve::Listener> {
        crate::serve::serve_http(self.router(), addr).await
    }
}

/// The node a request's table belongs to, for the history's subject.
#[derive(Clone, Debug)]
struct NodeTag(String);

crate::declare_ops!(
    /// The mount table's operations (what its gate records and faults aim at).
    pub OPS {
        LIST_DEVICES = "list_devices",
        LIST_MOUNTS = "list_mounts",
        FORMAT = "format",
        GET_FORMAT = "get_format",
        MOUNT = "mount",
        UNMOUNT = "unmount",
        REMOVE_DIR = "remove_dir",
        UNKNOWN = "unknown",
    }
);

fn classify(parts: &http::request::Parts) -> CallSpec {
    let op = match (parts.method.as_str(), parts.uri.path()) {
        ("GET", "/devices") => LIST_DEVICES,
        ("GET", "/mounts") => LIST_MOUNTS,
        ("POST", "/format") => FORMAT,
        ("GET", "/format") => GET_FORMAT,
        ("POST", "/mount") => MOUNT,
        ("POST", "/unmount") => UNMOUNT,
        ("POST", "/rmdir") => REMOVE_DIR,
        _ => UNKNOWN,
    };
    let node = parts
        .extensions
        .get::<NodeTag>()
        .map(|n| n.0.clone())
        .unwrap_or_default();
    CallSpec::new(Component::Driver, Component::Mounts, op, node)
}

/// A gate rejection in the table's error shape.
pub fn render_rejection(r: &Rejection) -> Response {
    error_response(r.http_status, &r.code, &r.message)
}

fn ok() -> Response {
    Json(json!({})).into_response()
}

fn body<T: serde::de::DeserializeOwned>(b: &Bytes) -> Result<T, MountError> {
    serde_json::from_slice(b)
        .map_err(|e| MountError::InvalidRequest(format!("bad request body: {e}")))
}

async fn list_devices(State(t): State<MountTable>) -> Response {
    Json(t.devices()).into_response()
}

async fn list_mounts(State(t): State<MountTable>) -> Response {
    Json(t.entries()).into_response()
}

#[derive(Deserialize)]
struct FormatBody {
    device: String,
    fstype: String,
}

async fn format(State(t): State<MountTable>, b: Bytes) -> Result<Response, MountError> {
    let req: FormatBody = body(&b)?;
    t.format(&req.device, &req.fstype)?;
    Ok(ok())
}

async fn get_format(
    State(t): State<MountTable>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, MountError> {
    let device = q
        .get("device")
        .filter(|d| !d.is_empty())
        .ok_or_else(|| MountError::InvalidRequest("query parameter device is required".into()))?;
    Ok(Json(json!({"fstype": t.fstype(device)?})).into_response())
}

async fn mount(State(t): State<MountTable>, b: Bytes) -> Result<Response, MountError> {
    let req: MountRequest = body(&b)?;
    t.mount(&req)?;
    Ok(ok())
}

#[derive(Deserialize)]
struct UnmountBody {
    target: String,
}

async fn unmount(State(t): State<MountTable>, b: Bytes) -> Result<Response, MountError> {
    let req: UnmountBody = body(&b)?;
    t.unmount(&req.target)?;
    Ok(ok())
}

#[derive(Deserialize)]
struct RmdirBody {
    path: String,
}

async fn rmdir(State(t): State<MountTable>, b: Bytes) -> Result<Response, MountError> {
    let req: RmdirBody = body(&b)?;
    t.remove_dir(&req.path)?;
    Ok(ok())
}

async fn not_found(req: axum::extract::Request) -> Response {
    error_response(
        404,
        "NotFound",
        &format!("no such endpoint: {} {}", req.method(), req.uri().path()),
    )
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Parse a JSON error body of this API into (code, message); for clients and tests.
pub fn parse_error(v: &Value) -> Option<(String, String)> {
    let e = v.get("error")?;
    Some((
        e.get("code")?.as_str()?.to_string(),
        e.get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SimClock;
    use crate::history::History;

    fn table(cids: &[&str]) -> (MountTable, Arc<Mutex<Vec<Device>>>) {
        let devs = Arc::new(Mutex::new(
            cids.iter().map(|c| Device::for_disk(c)).collect::<Vec<_>>(),
        ));
        let d2 = devs.clone();
        let t = MountTable::new(
            "node-a",
            Arc::new(move || lock(&d2).clone()),
            Filesystems::default(),
            Gate::new(History::new(SimClock::new())),
        );
        (t, devs)
    }

    fn dev_mount(dev: &str, target: &str, ro: bool) -> MountRequest {
        MountRequest {
            source: dev.into(),
            target: target.into(),
            fstype: Some("ext4".into()),
            read_only: ro,
            bind: false,
        }
    }

    fn bind(src: &str, target: &str, ro: bool) -> MountRequest {
        MountRequest {
            source: src.into(),
            target: target.into(),
            fstype: None,
            read_only: ro,
            bind: true,
        }
    }

    const DEV: &str = "/dev/disk/by-id/disk-1";

    #[test]
    fn format_is_idempotent_and_refuses_another_type() {
        let (t, _) = table(&["disk-1"]);
        assert_eq!(t.fstype(DEV).unwrap(), None);
        t.format(DEV, "ext4").unwrap();
        t.format(DEV, "ext4").unwrap();
        assert_eq!(t.fstype(DEV).unwrap().as_deref(), Some("ext4"));
        assert_eq!(t.format(DEV, "xfs").unwrap_err().code(), "AlreadyFormatted");
        assert_eq!(
            t.format("/dev/disk/by-id/other", "ext4")
                .unwrap_err()
                .code(),
            "NoSuchDevice"
        );
        assert_eq!(t.format(DEV, "").unwrap_err().code(), "InvalidRequest");
    }

    #[test]
    fn device_mount_needs_a_visible_formatted_device() {
        let (t, _) = table(&["disk-1"]);
        assert_eq!(
            t.mount(&dev_mount(DEV, "/g", false)).unwrap_err().code(),
            "WrongFsType"
        );
        t.format(DEV, "ext4").unwrap();
        let mut xfs = dev_mount(DEV, "/g", false);
        xfs.fstype = Some("xfs".into());
        assert_eq!(t.mount(&xfs).unwrap_err().code(), "WrongFsType");
        assert_eq!(
            t.mount(&dev_mount("/dev/disk/by-id/nope", "/g", false))
                .unwrap_err()
                .code(),
            "NoSuchDevice"
        );
        t.mount(&dev_mount(DEV, "/g", false)).unwrap();
        assert_eq!(t.mounts().len(), 1);
    }

    #[test]
    fn changes_count_what_the_table_took_not_what_it_refused() {
        let (t, _) = table(&["disk-1"]);
        t.format(DEV, "ext4").unwrap();
        assert_eq!(t.changes(), 0);
        t.mount(&dev_mount(DEV, "/g", false)).unwrap();
        assert_eq!(t.changes(), 1);
        // The same mount again is a no-op; another one on the target is refused.
        t.mount(&dev_mount(DEV, "/g", false)).unwrap();
        assert!(t.mount(&dev_mount(DEV, "/g", true)).is_err());
        assert_eq!(t.changes(), 1);
        t.unmount("/g").unwrap();
        assert!(t.unmount("/g").is_err());
        assert_eq!(t.changes(), 2);
    }

    #[test]
    fn a_target_holds_one_mount_and_same_flags_is_idempotent() {
        let (t, _) = table(&["disk-1"]);
        t.format(DEV, "ext4").unwrap();
        t.mount(&dev_mount(DEV, "/g", false)).unwrap();
        t.mount(&dev_mount(DEV, "/g/", false)).unwrap();
        assert_eq!(
            t.mount(&dev_mount(DEV, "/g", true)).unwrap_err().code(),
            "AlreadyMounted"
        );
        t.mount(&bind("/g", "/p", false)).unwrap();
        assert_eq!(
            t.mount(&bind("/g", "/p", true)).unwrap_err().code(),
            "AlreadyMounted"
        );
        assert_eq!(t.mounts().len(), 2);
    }

    #[test]
    fn read_only_source_never_binds_read_write() {
        let (t, _) = table(&["disk-1"]);
        t.format(DEV, "ext4").unwrap();
        t.mount(&dev_mount(DEV, "/g", true)).unwrap();
        assert_eq!(
            t.mount(&bind("/g", "/p", false)).unwrap_err().code(),
            "ReadOnlySource"
        );
        assert_eq!(
            t.mount(&bind("/g/sub", "/p", false)).unwrap_err().code(),
            "ReadOnlySource"
        );
        t.mount(&bind("/g", "/p", true)).unwrap();
        // A bind of the read-only bind is read-only too.
        assert_eq!(
            t.mount(&bind("/p", "/q", false)).unwrap_err().code(),
            "ReadOnlySource"
        );
        assert!(t.mounts().iter().all(|m| m.read_only));
    }

    #[test]
    fn bind_needs_a_mounted_source() {
        let (t, _) = table(&["disk-1"]);
        assert_eq!(
            t.mount(&bind("/nowhere", "/p", false)).unwrap_err().code(),
            "NoSuchSource"
        );
        assert_eq!(
            t.mount(&bind("relative", "/p", false)).unwrap_err().code(),
            "InvalidRequest"
        );
        assert_eq!(
            t.mount(&bind("/a/../b", "/p", false)).unwrap_err().code(),
            "InvalidRequest"
        );
    }

    #[test]
    fn busy_source_cannot_be_unmounted() {
        let (t, devs) = table(&["disk-1"]);
        t.format(DEV, "ext4").unwrap();
        t.mount(&dev_mount(DEV, "/g", false)).unwrap();
        t.mount(&bind("/g", "/p", false)).unwrap();
        assert_eq!(t.unmount("/g").unwrap_err().code(), "Busy");
        assert_eq!(t.unmount("/nothing").unwrap_err().code(), "NotMounted");
        // The disk vanishing under a mount is visible to checks.
        lock(&devs).clear();
        assert!(t.mounts().iter().all(|m| !m.device_present));
        assert!(t.mounts().iter().all(|m| m.disk_cid == "disk-1"));
        t.unmount("/p").unwrap();
        t.unmount("/g").unwrap();
        assert!(t.mounts().is_empty());
        assert_eq!(t.unmount("/g").unwrap_err().code(), "NotMounted");
    }

    #[test]
    fn a_mount_makes_its_target_and_only_rmdir_removes_it() {
        let (t, _) = table(&[]);
        let host = tempfile::tempdir().unwrap();
        let dir = host.path().to_str().unwrap().to_string();
        t.mount(&bind(&dir, "/p", false)).unwrap();
        assert!(t.path_exists("/p"));
        assert_eq!(t.remove_dir("/p").unwrap_err().code(), "Busy");
        t.unmount("/p").unwrap();
        assert!(t.path_exists("/p"), "umount leaves the directory");
        t.remove_dir("/p").unwrap();
        assert!(!t.path_exists("/p"));
        assert_eq!(t.remove_dir("/p").unwrap_err().code(), "NoSuchPath");
    }

    #[test]
    fn bind_of_an_existing_host_directory() {
        let (t, _) = table(&[]);
        let host = tempfile::tempdir().unwrap();
        let dir = host.path().join("vol-1");
        std::fs::create_dir(&dir).unwrap();
        let dir = dir.to_str().unwrap().to_string();
        t.mount(&bind(&dir, "/g", false)).unwrap();
        t.mount(&bind(&dir, "/g", false)).unwrap();
        assert_eq!(
            t.mount(&bind(&dir, "/g", true)).unwrap_err().code(),
            "AlreadyMounted"
        );
        // Binds of the bind, and of a path under it, name the directory behind them.
        t.mount(&bind("/g", "/p", true)).unwrap();
        assert_eq!(
            t.mount(&bind("/g/sub", "/q", false)).unwrap_err().code(),
            "NoSuchSource"
        );
        std::fs::create_dir(format!("{dir}/sub")).unwrap();
        t.mount(&bind("/g/sub", "/q", false)).unwrap();
        let views = t.mounts();
        let at = |target: &str| views.iter().find(|m| m.target == target).unwrap();
        assert_eq!(
            (at("/g").source.as_str(), at("/g").host_dir.as_str()),
            (dir.as_str(), dir.as_str())
        );
        assert_eq!(at("/p").host_dir, dir);
        assert_eq!(at("/q").host_dir, format!("{dir}/sub"));
        assert!(views
            .iter()
            .all(|m| m.disk_cid.is_empty() && m.bind && m.device_present));
        let entries = t.entries();
        assert!(entries.iter().all(|e| e.host_dir.starts_with(&dir)));
        assert_eq!(t.unmount("/g").unwrap_err().code(), "Busy");
        // The directory removed under its mounts is visible to checks.
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(t.mounts().iter().all(|m| !m.device_present));
    }

    #[test]
    fn host_directory_binds_keep_the_read_only_rules() {
        let (t, _) = table(&[]);
        let host = tempfile::tempdir().unwrap();
        let dir = host.path().to_str().unwrap().to_string();
        t.mount(&bind(&dir, "/g", true)).unwrap();
        assert_eq!(
            t.mount(&bind("/g", "/p", false)).unwrap_err().code(),
            "ReadOnlySource"
        );
        t.mount(&bind("/g", "/p", true)).unwrap();
        // The host directory itself is writable: a second read-write bind is fine.
        t.mount(&bind(&dir, "/w", false)).unwrap();
        assert!(
            !t.mounts()
                .iter()
                .find(|m| m.target == "/w")
                .unwrap()
                .read_only
        );
    }

    #[test]
    fn host_bind_source_must_exist_as_a_directory() {
        let (t, _) = table(&[]);
        let host = tempfile::tempdir().unwrap();
        let missing = host.path().join("never-made");
        let missing = missing.to_str().unwrap();
        let e = t.mount(&bind(missing, "/g", false)).unwrap_err();
        assert_eq!((e.code(), e.http_status()), ("NoSuchSource", 404));
        let file = host.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let e = t
            .mount(&bind(file.to_str().unwrap(), "/g", false))
            .unwrap_err();
        assert_eq!((e.code(), e.http_status()), ("NotImplemented", 501));
        assert!(t.mounts().is_empty());
        // Disk-backed entries carry no host_dir on the wire, as before.
        let v = serde_json::to_value(MountEntry {
            source: DEV.into(),
            target: "/g".into(),
            fstype: "ext4".into(),
            read_only: false,
            bind: false,
            host_dir: String::new(),
        })
        .unwrap();
        assert!(v.get("host_dir").is_none());
    }

    #[test]
    fn filesystem_travels_with_the_disk() {
        let fs = Filesystems::default();
        let mk = |node: &str| {
            MountTable::new(
                node,
                Arc::new(|| vec![Device::for_disk("disk-1")]),
                fs.clone(),
                Gate::new(History::new(SimClock::new())),
            )
        };
        mk("a").format(DEV, "ext4").unwrap();
        assert_eq!(mk("b").fstype(DEV).unwrap().as_deref(), Some("ext4"));
    }
}

//! How the node plugin sees devices and mounts: the [`Mounter`] trait, its HTTP
//! implementation against the lab's per-node mount table (the path every test
//! takes), and a minimal real implementation with mount(8)/umount(8) for
//! production use, which no test exercises.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use http::Method;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::DriverError;
use crate::http::{encode, HttpClient};

/// A boxed future, so `Mounter` can be used as `dyn`.
pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Mount-table error code: the target has another mount.
pub const ALREADY_MOUNTED: &str = "AlreadyMounted";
/// Mount-table error code: the device has another filesystem.
pub const ALREADY_FORMATTED: &str = "AlreadyFormatted";
/// Mount-table error code: nothing is mounted at the target.
pub const NOT_MOUNTED: &str = "NotMounted";
/// Mount-table error code: another mount uses the target as its source.
pub const BUSY: &str = "Busy";
/// Mount-table error code: no such device.
pub const NO_SUCH_DEVICE: &str = "NoSuchDevice";
/// Mount-table error code: the bind source is not mounted.
pub const NO_SUCH_SOURCE: &str = "NoSuchSource";
/// Mount-table error code: a read-write bind of a read-only source.
pub const READ_ONLY_SOURCE: &str = "ReadOnlySource";
/// Mount-table error code: `rmdir` of a path that does not exist.
pub const NO_SUCH_PATH: &str = "NoSuchPath";

/// A block device visible on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// Device path, e.g. `/dev/disk/by-id/<disk_cid>`.
    pub path: String,
    /// The IaaS disk id it belongs to.
    pub disk_cid: String,
}

/// One entry of the mount table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountEntry {
    /// Device or (for binds) source directory.
    pub source: String,
    /// Mount point.
    pub target: String,
    /// Filesystem type (empty for binds).
    #[serde(default)]
    pub fstype: Option<String>,
    /// Mounted read-only.
    #[serde(default)]
    pub read_only: bool,
    /// A bind mount.
    #[serde(default)]
    pub bind: bool,
}

/// A mount to make.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MountRequest {
    /// Device or bind source.
    pub source: String,
    /// Mount point.
    pub target: String,
    /// Filesystem (None for binds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fstype: Option<String>,
    /// Read-only.
    pub read_only: bool,
    /// Bind mount.
    pub bind: bool,
}

impl MountRequest {
    /// Whether `m` is exactly this mount (same source and flags).
    pub fn matches(&self, m: &MountEntry) -> bool {
        m.target == self.target
            && m.source == self.source
            && m.read_only == self.read_only
            && m.bind == self.bind
    }
}

/// A failed mount-table operation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    /// The mount table answered with an error.
    #[error("{op}: mount table answered HTTP {status} {code}: {message}")]
    Refused {
        /// What we were doing.
        op: &'static str,
        /// HTTP status (or 0 for a command's failure).
        status: u16,
        /// Error code (`AlreadyMounted`, ...).
        code: String,
        /// Message.
        message: String,
    },
    /// No answer: the operation may or may not have happened.
    #[error("{op}: {detail}")]
    NoAnswer {
        /// What we were doing.
        op: &'static str,
        /// Why.
        detail: String,
    },
}

impl MountError {
    /// The error code, if the mount table answered.
    pub fn code(&self) -> Option<&str> {
        match self {
            MountError::Refused { code, .. } => Some(code),
            MountError::NoAnswer { .. } => None,
        }
    }

    /// Whether the operation may have taken effect even though it failed.
    pub fn ambiguous(&self) -> bool {
        match self {
            MountError::NoAnswer { .. } => true,
            MountError::Refused { status, .. } => *status >= 500,
        }
    }
}

impl From<MountError> for DriverError {
    fn from(e: MountError) -> DriverError {
        let msg = e.to_string();
        match &e {
            MountError::NoAnswer { .. } => DriverError::Unavailable(format!("{msg}; retry")),
            MountError::Refused { status, code, .. } => match code.as_str() {
                NO_SUCH_DEVICE | NO_SUCH_SOURCE => DriverError::NotFound(msg),
                ALREADY_MOUNTED => DriverError::AlreadyExists(msg),
                BUSY | READ_ONLY_SOURCE | ALREADY_FORMATTED => DriverError::FailedPrecondition(msg),
                _ if *status >= 500 || *status == 429 => {
                    DriverError::Unavailable(format!("{msg}; retry"))
                }
                _ => DriverError::Internal(msg),
            },
        }
    }
}

/// What the node plugin needs from the OS (or the lab's stand-in for it).
pub trait Mounter: Send + Sync {
    /// The block devices visible on this node.
    fn devices(&self) -> BoxFut<'_, Result<Vec<Device>, MountError>>;
    /// The current mounts.
    fn mounts(&self) -> BoxFut<'_, Result<Vec<MountEntry>, MountError>>;
    /// The filesystem on `device`, None if unformatted.
    fn fs_type<'a>(&'a self, device: &'a str) -> BoxFut<'a, Result<Option<String>, MountError>>;
    /// Make a `fstype` filesystem on `device`.
    fn format<'a>(&'a self, device: &'a str, fstype: &'a str)
        -> BoxFut<'a, Result<(), MountError>>;
    /// Mount.
    fn mount<'a>(&'a self, req: &'a MountRequest) -> BoxFut<'a, Result<(), MountError>>;
    /// Unmount whatever is at `target`.
    fn unmount<'a>(&'a self, target: &'a str) -> BoxFut<'a, Result<(), MountError>>;
    /// Remove the (empty, unmounted) directory at `path` (rmdir(2)).
    fn remove_dir<'a>(&'a self, path: &'a str) -> BoxFut<'a, Result<(), MountError>>;

    /// The device of IaaS disk `disk_cid`, if visible (like udev's by-id link).
    fn device_for<'a>(
        &'a self,
        disk_cid: &'a str,
    ) -> BoxFut<'a, Result<Option<Device>, MountError>> {
        Box::pin(async move {
            Ok(self
                .devices()
                .await?
                .into_iter()
                .find(|d| d.disk_cid == disk_cid))
        })
    }
}

/// Remove the target path a publish created (the CSI spec: NodeUnpublishVolume
/// deletes what NodePublishVolume made at target_path); already gone is done.
pub async fn remove_target(m: &dyn Mounter, path: &str) -> Result<(), MountError> {
    match m.remove_dir(path).await {
        Err(e) if e.code() == Some(NO_SUCH_PATH) => Ok(()),
        other => other,
    }
}

/// The lab's per-node mount table over HTTP JSON (BOSH-CONTRACT.md "Node side").
pub struct HttpMounter {
    http: HttpClient,
    base: String,
}

impl HttpMounter {
    /// A client for the mount table at `base_url`.
    pub fn new(base_url: &str, timeout: Duration) -> Self {
        HttpMounter {
            http: HttpClient::new(timeout),
            base: base_url.trim_end_matches('/').to_string(),
        }
    }

    async fn call(
        &self,
        op: &'static str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<bytes::Bytes, MountError> {
        let url = format!("{}{path}", self.base);
        let a = self
            .http
            .send(
                method,
                &url,
                &[("accept", "application/json")],
                body.map(|b| ("application/json", b.to_string().into_bytes())),
            )
            .await
            .map_err(|e| MountError::NoAnswer {
                op,
                detail: e.to_string(),
            })?;
        if a.status.is_success() {
            return Ok(a.body);
        }
        let v: Value = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
        Err(MountError::Refused {
            op,
            status: a.status.as_u16(),
            code: v["error"]["code"].as_str().unwrap_or("").to_string(),
            message: v["error"]["message"].as_str().unwrap_or("").to_string(),
        })
    }

    fn parse<T: for<'de> Deserialize<'de>>(op: &'static str, body: &[u8]) -> Result<T, MountError> {
        serde_json::from_slice(body).map_err(|e| MountError::Refused {
            op,
            status: 200,
            code: "BadAnswer".into(),
            message: format!("answer does not parse: {e}"),
        })
    }
}

impl Mounter for HttpMounter {
    fn devices(&self) -> BoxFut<'_, Result<Vec<Device>, MountError>> {
        Box::pin(async move {
            let b = self
                .call("list devices", Method::GET, "/devices", None)
                .await?;
            Self::parse("list devices", &b)
        })
    }

    fn mounts(&self) -> BoxFut<'_, Result<Vec<MountEntry>, MountError>> {
        Box::pin(async move {
            let b = self
                .call("list mounts", Method::GET, "/mounts", None)
                .await?;
            Self::parse("list mounts", &b)
        })
    }

    fn fs_type<'a>(&'a self, device: &'a str) -> BoxFut<'a, Result<Option<String>, MountError>> {
        Box::pin(async move {
            let path = format!("/format?device={}", encode(device));
            let b = self
                .call("read filesystem", Method::GET, &path, None)
                .await?;
            let v: Value = Self::parse("read filesystem", &b)?;
            Ok(v["fstype"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_string))
        })
    }

    fn format<'a>(
        &'a self,
        device: &'a str,
        fstype: &'a str,
    ) -> BoxFut<'a, Result<(), MountError>> {
        Box::pin(async move {
            let body = serde_json::json!({ "device": device, "fstype": fstype });
            self.call("format", Method::POST, "/format", Some(body))
                .await
                .map(drop)
        })
    }

    fn mount<'a>(&'a self, req: &'a MountRequest) -> BoxFut<'a, Result<(), MountError>> {
        Box::pin(async move {
            let body = serde_json::to_value(req).unwrap_or(Value::Null);
            self.call("mount", Method::POST, "/mount", Some(body))
                .await
                .map(drop)
        })
    }

    fn unmount<'a>(&'a self, target: &'a str) -> BoxFut<'a, Result<(), MountError>> {
        Box::pin(async move {
            let body = serde_json::json!({ "target": target });
            self.call("unmount", Method::POST, "/unmount", Some(body))
                .await
                .map(drop)
        })
    }

    fn remove_dir<'a>(&'a self, path: &'a str) -> BoxFut<'a, Result<(), MountError>> {
        Box::pin(async move {
            let body = serde_json::json!({ "path": path });
            self.call("rmdir", Method::POST, "/rmdir", Some(body))
                .await
                .map(drop)
        })
    }
}

/// Real mounts through mount(8), umount(8), blkid(8) and mkfs(8), for running
/// the driver on an actual BOSH VM. Minimal on purpose and not used by any
/// test: devices are the `/dev/disk/by-id` links whose name contains the disk
/// cid (the agent's udev naming), mounts come from `/proc/self/mounts` (which
/// cannot tell a bind mount from its source, so `bind` is always false), and a
/// read-only bind is a bind followed by a read-only remount.
pub struct SystemMounter;

impl SystemMounter {
    async fn run(op: &'static str, cmd: &str, args: &[&str]) -> Result<String, MountError> {
        let out = tokio::process::Command::new(cmd)
            .args(args)
            .output()
            .await
            .map_err(|e| MountError::NoAnswer {
                op,
                detail: format!("running {cmd}: {e}"),
            })?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        // umount(8) says "not mounted"; the HTTP table says NotMounted: keep one vocabulary.
        let code = if stderr.contains("not mounted") {
            NOT_MOUNTED
        } else if stderr.contains("busy") {
            BUSY
        } else {
            "CommandFailed"
        };
        Err(MountError::Refused {
            op,
            status: 0,
            code: code.into(),
            message: format!("{cmd} {}: {stderr}", args.join(" ")),
        })
    }
}

impl Mounter for SystemMounter {
    fn devices(&self) -> BoxFut<'_, Result<Vec<Device>, MountError>> {
        Box::pin(async move {
            let dir = "/dev/disk/by-id";
            let mut out = Vec::new();
            let mut rd = tokio::fs::read_dir(dir)
                .await
                .map_err(|e| MountError::NoAnswer {
                    op: "list devices",
                    detail: format!("reading {dir}: {e}"),
                })?;
            while let Ok(Some(entry)) = rd.next_entry().await {
                let name = entry.file_name().to_string_lossy().into_owned();
                out.push(Device {
                    path: format!("{dir}/{name}"),
                    // The link name holds the cid among other words; see device_for.
                    disk_cid: name,
                });
            }
            Ok(out)
        })
    }

    fn device_for<'a>(
        &'a self,
        disk_cid: &'a str,
    ) -> BoxFut<'a, Result<Option<Device>, MountError>> {
        Box::pin(async move {
            // by-id names are "<bus>-<vendor>_<serial>"; the serial carries the cid.
            Ok(self
                .devices()
                .await?
                .into_iter()
                .find(|d| {
                    d.disk_cid.ends_with(disk_cid) || d.disk_cid.ends_with(&format!("_{disk_cid}"))
                })
                .map(|d| Device {
                    disk_cid: disk_cid.to_string(),
                    ..d
                }))
        })
    }

    fn mounts(&self) -> BoxFut<'_, Result<Vec<MountEntry>, MountError>> {
        Box::pin(async move {
            let text = tokio::fs::read_to_string("/proc/self/mounts")
                .await
                .map_err(|e| MountError::NoAnswer {
                    op: "list mounts",
                    detail: format!("reading /proc/self/mounts: {e}"),
                })?;
            Ok(text
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.len() >= 4).then(|| MountEntry {
                        source: f[0].to_string(),
                        target: f[1].replace("\\040", " "),
                        fstype: Some(f[2].to_string()),
                        read_only: f[3].split(',').any(|o| o == "ro"),
                        bind: false,
                    })
                })
                .collect())
        })
    }

    fn fs_type<'a>(&'a self, device: &'a str) -> BoxFut<'a, Result<Option<String>, MountError>> {
        Box::pin(async move {
            match Self::run(
                "read filesystem",
                "blkid",
                &["-o", "value", "-s", "TYPE", device],
            )
            .await
            {
                Ok(s) => Ok(Some(s.trim().to_string()).filter(|s| !s.is_empty())),
                // blkid exits 2 when it finds no filesystem.
                Err(MountError::Refused { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    fn format<'a>(
        &'a self,
        device: &'a str,
        fstype: &'a str,
    ) -> BoxFut<'a, Result<(), MountError>> {
        Box::pin(async move {
            let cmd = format!("mkfs.{fstype}");
            Self::run("format", &cmd, &[device]).await.map(drop)
        })
    }

    fn mount<'a>(&'a self, req: &'a MountRequest) -> BoxFut<'a, Result<(), MountError>> {
        Box::pin(async move {
            tokio::fs::create_dir_all(&req.target)
                .await
                .map_err(|e| MountError::NoAnswer {
                    op: "mount",
                    detail: format!("creating {}: {e}", req.target),
                })?;
            if req.bind {
                Self::run("mount", "mount", &["--bind", &req.source, &req.target]).await?;
                if req.read_only {
                    Self::run("mount", "mount", &["-o", "remount,bind,ro", &req.target]).await?;
                }
                return Ok(());
            }
            let fstype = req.fstype.as_deref().unwrap_or("ext4");
            let opts = if req.read_only { "ro" } else { "rw" };
            Self::run(
                "mount",
                "mount",
                &["-t", fstype, "-o", opts, &req.source, &req.target],
            )
            .await
            .map(drop)
        })
    }

    fn unmount<'a>(&'a self, target: &'a str) -> BoxFut<'a, Result<(), MountError>> {
        Box::pin(async move { Self::run("unmount", "umount", &[target]).await.map(drop) })
    }

    fn remove_dir<'a>(&'a self, path: &'a str) -> BoxFut<'a, Result<(), MountError>> {
        Box::pin(async move {
            match tokio::fs::remove_dir(path).await {
                Ok(()) => Ok(()),
                Err(e) => Err(MountError::Refused {
                    op: "rmdir",
                    status: 0,
                    code: match e.kind() {
                        std::io::ErrorKind::NotFound => NO_SUCH_PATH.into(),
                        _ => BUSY.into(),
                    },
                    message: format!("rmdir {path}: {e}"),
                }),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_errors_map_to_csi_codes() {
        let refused = |status, code: &str| MountError::Refused {
            op: "mount",
            status,
            code: code.into(),
            message: String::new(),
        };
        let code = |e: MountError| DriverError::from(e).code();
        assert_eq!(
            code(refused(409, ALREADY_MOUNTED)),
            tonic::Code::AlreadyExists
        );
        assert_eq!(code(refused(404, NO_SUCH_DEVICE)), tonic::Code::NotFound);
        assert_eq!(code(refused(409, BUSY)), tonic::Code::FailedPrecondition);
        assert_eq!(
            code(refused(400, READ_ONLY_SOURCE)),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(code(refused(503, "")), tonic::Code::Unavailable);
        assert_eq!(code(refused(418, "Odd")), tonic::Code::Internal);
        let lost = MountError::NoAnswer {
            op: "mount",
            detail: "reset".into(),
        };
        assert!(lost.ambiguous());
        assert!(!refused(409, ALREADY_MOUNTED).ambiguous());
        assert_eq!(code(lost), tonic::Code::Unavailable);
    }

    #[test]
    fn mount_request_shape() {
        let r = MountRequest {
            source: "/staging".into(),
            target: "/pod".into(),
            fstype: None,
            read_only: true,
            bind: true,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"source": "/staging", "target": "/pod", "read_only": true, "bind": true})
        );
        let m: MountEntry = serde_json::from_value(
            serde_json::json!({"source": "/staging", "target": "/pod", "fstype": null, "read_only": true, "bind": true}),
        )
        .unwrap();
        assert!(r.matches(&m));
        assert!(!MountRequest {
            read_only: false,
            ..r
        }
        .matches(&m));
    }
}

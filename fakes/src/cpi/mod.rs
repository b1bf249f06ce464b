//! Fake IaaS behind the BOSH CPI API v2: every method, the Director's error
//! types with `ok_to_retry`, one VM per disk, bounded attachment slots. Two
//! faces over one model ([`core`]): the in-process [`Cpi`] (every call through
//! the Director→Cpi gate) and the external executable ([`external`]).
//!
//! Semantics followed (checked against public sources): `delete_vm` with disks
//! attached succeeds and leaves the disks, disassociated — the CPI API v2 docs
//! (docs-bosh `delete_vm`: "will be called while the VM still has persistent
//! disks attached ... properly disassociates") and the warden CPI's delete_vm,
//! which deletes the container and keeps its disks. `detach_disk` of a disk not
//! on that VM raises `DiskNotAttached`. Attaching a disk attached to another VM
//! raises a `CloudError` (the Director's dummy CPI: "already attached");
//! attaching it again to the same VM answers its hint again. `delete_disk` of an
//! attached disk is refused (as EBS refuses a volume in use).

pub mod core;
pub mod external;

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::gate::{CallSpec, Delivery, Gate, Verdict};
use crate::history::{Component, Outcome};
use crate::ops::Op;
use crate::store::Store;

pub mod block_api;

pub use self::core::{
    blocks_in, slot_device, BlockMap, BlockRange, BlockVersion, CpiCore, DiskRec, SnapshotRec,
    VmRec, BLOCK_SIZE, METHODS,
};

/// The error classes the Director's external CPI caller knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorType {
    /// `Bosh::Clouds::CpiError` (bad request, unknown method arguments).
    CpiError,
    /// `Bosh::Clouds::NotSupported`.
    NotSupported,
    /// `Bosh::Clouds::NotImplemented` (unknown method).
    NotImplemented,
    /// `Bosh::Clouds::CloudError` (the IaaS refused).
    CloudError,
    /// `Bosh::Clouds::VMNotFound`.
    VmNotFound,
    /// `Bosh::Clouds::NetworkNotFound`.
    NetworkNotFound,
    /// `Bosh::Clouds::NoDiskSpace`.
    NoDiskSpace,
    /// `Bosh::Clouds::DiskNotAttached`.
    DiskNotAttached,
    /// `Bosh::Clouds::DiskNotFound`.
    DiskNotFound,
    /// `Bosh::Clouds::VMCreationFailed`.
    VmCreationFailed,
}

impl ErrorType {
    /// The `type` string on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::CpiError => "Bosh::Clouds::CpiError",
            ErrorType::NotSupported => "Bosh::Clouds::NotSupported",
            ErrorType::NotImplemented => "Bosh::Clouds::NotImplemented",
            ErrorType::CloudError => "Bosh::Clouds::CloudError",
            ErrorType::VmNotFound => "Bosh::Clouds::VMNotFound",
            ErrorType::NetworkNotFound => "Bosh::Clouds::NetworkNotFound",
            ErrorType::NoDiskSpace => "Bosh::Clouds::NoDiskSpace",
            ErrorType::DiskNotAttached => "Bosh::Clouds::DiskNotAttached",
            ErrorType::DiskNotFound => "Bosh::Clouds::DiskNotFound",
            ErrorType::VmCreationFailed => "Bosh::Clouds::VMCreationFailed",
        }
    }

    /// Every type, for parsers and tests.
    pub fn all() -> [ErrorType; 10] {
        use ErrorType::*;
        [
            CpiError,
            NotSupported,
            NotImplemented,
            CloudError,
            VmNotFound,
            NetworkNotFound,
            NoDiskSpace,
            DiskNotAttached,
            DiskNotFound,
            VmCreationFailed,
        ]
    }

    /// Parse a wire type (with or without the `Bosh::Clouds::` prefix).
    pub fn parse(s: &str) -> Option<ErrorType> {
        let short = s.strip_prefix("Bosh::Clouds::").unwrap_or(s);
        Self::all()
            .into_iter()
            .find(|t| t.as_str().strip_prefix("Bosh::Clouds::") == Some(short))
    }
}

/// A CPI error reply: `{type, message, ok_to_retry}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{error_type}: {message}")]
pub struct CpiFault {
    /// The wire type (`Bosh::Clouds::DiskNotAttached`, ...); free text when a
    /// fault injected an unknown one (the Director then treats it as unknown).
    #[serde(rename = "type")]
    pub error_type: String,
    /// What went wrong.
    pub message: String,
    /// Whether the Director may retry the call as is.
    pub ok_to_retry: bool,
}

impl CpiFault {
    /// A fault of a known type.
    pub fn new(t: ErrorType, message: impl Into<String>, ok_to_retry: bool) -> Self {
        Self {
            error_type: t.as_str().to_string(),
            message: message.into(),
            ok_to_retry,
        }
    }

    /// A malformed call (`Bosh::Clouds::CpiError`, never retried).
    pub fn bad_argument(method: &str, why: impl std::fmt::Display) -> Self {
        Self::new(
            ErrorType::CpiError,
            format!("Invalid arguments to '{method}': {why}"),
            false,
        )
    }

    /// The known type, if it is one.
    pub fn kind(&self) -> Option<ErrorType> {
        ErrorType::parse(&self.error_type)
    }

    /// True when this is the given type.
    pub fn is(&self, t: ErrorType) -> bool {
        self.error_type == t.as_str()
    }
}

/// The IaaS's shape.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CpiConfig {
    /// Attachment slots per VM (AWS Nitro allows ~27, GCP 128; small makes the limit testable).
    pub max_disks_per_vm: usize,
    /// Largest disk the IaaS creates (beyond it: `NoDiskSpace`).
    pub max_disk_size_mib: u64,
    /// What `info` advertises.
    pub stemcell_formats: Vec<String>,
    /// Virtual time a successful call of a method takes (`attach_disk`: 3s);
    /// the IaaS answers one call at a time, so latencies add up on the clock.
    pub latency: std::collections::BTreeMap<String, std::time::Duration>,
}

impl Default for CpiConfig {
    fn default() -> Self {
        Self {
            max_disks_per_vm: 8,
            max_disk_size_mib: 16 * 1024 * 1024,
            stemcell_formats: vec!["warden-tar".into(), "general-tar".into()],
            latency: Default::default(),
        }
    }
}

/// A VM as the IaaS sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpiVmView {
    /// VM cid.
    pub cid: String,
    /// Agent id it was created for.
    pub agent_id: String,
    /// Disk cids in the VM's slots (attach order by slot).
    pub disks: Vec<String>,
    /// The VM metadata last set.
    pub metadata: serde_json::Map<String, Value>,
}

/// A disk as the IaaS sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpiDiskView {
    /// Disk cid.
    pub cid: String,
    /// Size in MiB.
    pub size_mib: u64,
    /// The VM it is attached to.
    pub attached_to: Option<String>,
    /// The VM it was created next to.
    pub locality: Option<String>,
    /// The disk metadata last set.
    pub metadata: serde_json::Map<String, Value>,
}

/// One attachment (disk → VM) in the IaaS.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Attachment {
    /// Disk cid.
    pub disk_cid: String,
    /// VM cid.
    pub vm_cid: String,
}

impl Attachment {
    /// The attachments `disks` show, sorted by disk cid (what
    /// [`Cpi::attachments`] gives for the disks [`Cpi::disks`] gives).
    pub fn of_disks(disks: &[CpiDiskView]) -> Vec<Attachment> {
        let mut out: Vec<Attachment> = (disks.iter())
            .filter_map(|d| {
                Some(Attachment {
                    disk_cid: d.cid.clone(),
                    vm_cid: d.attached_to.clone()?,
                })
            })
            .collect();
        out.sort();
        out
    }
}

tokio::task_local! {
    /// Virtual milliseconds of CPI latency charged to the Director job running
    /// in this task (set by the Director when it models its worker pool in
    /// virtual time; unset, each call's latency advances the lab's clock).
    pub static LANE_MS: std::cell::Cell<u64>;
}

/// The in-process CPI the Director fake calls. Cheap to clone.
#[derive(Clone)]
pub struct Cpi {
    inner: Arc<CpiInner>,
}

struct CpiInner {
    // One method at a time, like one IaaS account's consistent view.
    core: Mutex<CpiCore>,
    gate: Gate,
    latency: std::collections::BTreeMap<String, std::time::Duration>,
}

/// The gate's subject for a call: the VM, the disk, or `vm/disk` for attachments.
pub fn subject_of(method: &str, args: &[Value]) -> String {
    let s = |i: usize| {
        args.get(i)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    match method {
        "attach_disk" | "detach_disk" => format!("{}/{}", s(0), s(1)),
        "create_vm" => s(0),
        "create_disk" => args
            .get(2)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        "info" | "calculate_vm_cloud_properties" | "create_stemcell" => String::new(),
        _ => s(0),
    }
}

impl Cpi {
    /// A CPI over `store` (a sled tree keeps the IaaS across a restart).
    pub fn new(store: Arc<dyn Store>, gate: Gate, config: CpiConfig) -> Self {
        Self {
            inner: Arc::new(CpiInner {
                latency: config.latency.clone(),
                core: Mutex::new(CpiCore::new(store, config)),
                gate,
            }),
        }
    }

    /// The gate every call passes.
    pub fn gate(&self) -> &Gate {
        &self.inner.gate
    }

    /// Call `method` as the Director would (from Director, through the gate).
    pub async fn call(&self, method: &str, args: Vec<Value>) -> Result<Value, CpiFault> {
        // An unknown method is still recorded (the CPI answers NotImplemented),
        // under one declared name with the method it asked for as the subject.
        let (op, subject) = match Op::find(METHODS, method) {
            Some(op) => (op, subject_of(method, &args)),
            None => (self::core::UNKNOWN_METHOD, method.to_string()),
        };
        let spec = CallSpec::new(Component::Director, Component::Cpi, op, subject);
        let gate = &self.inner.gate;
        let (id, verdict) = gate.enter(&spec).await;
        match verdict {
            Verdict::Proceed => {}
            Verdict::Reject(r) => {
                let fault = CpiFault {
                    error_type: ErrorType::parse(&r.code)
                        .map(|t| t.as_str().to_string())
                        .unwrap_or(r.code.clone()),
                    message: r.message.clone(),
                    ok_to_retry: false,
                };
                gate.leave(id, &spec, outcome(&Err(fault.clone()))).await;
                return Err(fault);
            }
            Verdict::Cut => {
                gate.cut_before(id);
                return Err(lost(method, "the CPI process died before it answered"));
            }
        }
        let result = {
            let core = self.inner.core.lock().unwrap_or_else(|p| p.into_inner());
            core.dispatch(method, &args)
        };
        if result.is_ok() {
            if let Some(d) = self.inner.latency.get(method) {
                // A Director job on a modelled worker lane is charged the
                // latency on its lane; otherwise the whole lab waits for it.
                let charged = LANE_MS.try_with(|c| c.set(c.get() + d.as_millis() as u64));
                if charged.is_err() {
                    let clock = gate.history().clock();
                    clock.advance_to(clock.now().after(*d));
                }
            }
        }
        match gate.leave(id, &spec, outcome(&result)).await {
            Delivery::Deliver => result,
            Delivery::Cut => Err(lost(method, "the CPI's reply was lost after it committed")),
        }
    }

    /// `info`.
    pub async fn info(&self) -> Result<Value, CpiFault> {
        self.call("info", vec![]).await
    }

    /// `create_stemcell(image_path, cloud_properties)` → stemcell cid.
    pub async fn create_stemcell(&self, image_path: &str) -> Result<String, CpiFault> {
        let v = self
            .call("create_stemcell", vec![json!(image_path), json!({})])
            .await?;
        as_cid("create_stemcell", v)
    }

    /// V2 `create_vm` → (vm cid, networks).
    pub async fn create_vm(
        &self,
        agent_id: &str,
        stemcell_cid: &str,
        cloud_properties: Value,
        networks: Value,
        disk_locality: Vec<String>,
        env: Value,
    ) -> Result<(String, Value), CpiFault> {
        let v = self
            .call(
                "create_vm",
                vec![
                    json!(agent_id),
                    json!(stemcell_cid),
                    cloud_properties,
                    networks,
                    json!(disk_locality),
                    env,
                ],
            )
            .await?;
        match v {
            Value::Array(mut a) if a.len() == 2 => {
                let nets = a.pop().unwrap_or(Value::Null);
                let cid = as_cid("create_vm", a.pop().unwrap_or(Value::Null))?;
                Ok((cid, nets))
            }
            other => Err(CpiFault::bad_argument(
                "create_vm",
                format!("CPI answered {other}, expected [vm_cid, networks]"),
            )),
        }
    }

    /// `delete_vm(vm_cid)`.
    pub async fn delete_vm(&self, vm_cid: &str) -> Result<(), CpiFault> {
        self.call("delete_vm", vec![json!(vm_cid)]).await.map(drop)
    }

    /// `create_disk(size_mib, cloud_properties, vm_locality)` → disk cid.
    pub async fn create_disk(
        &self,
        size_mib: u64,
        cloud_properties: Value,
        vm_locality: Option<&str>,
    ) -> Result<String, CpiFault> {
        let v = self
            .call(
                "create_disk",
                vec![json!(size_mib), cloud_properties, json!(vm_locality)],
            )
            .await?;
        as_cid("create_disk", v)
    }

    /// `delete_disk(disk_cid)`.
    pub async fn delete_disk(&self, disk_cid: &str) -> Result<(), CpiFault> {
        self.call("delete_disk", vec![json!(disk_cid)])
            .await
            .map(drop)
    }

    /// `resize_disk(disk_cid, new_size)` (MiB; the disk must be detached).
    pub async fn resize_disk(&self, disk_cid: &str, new_size_mib: u64) -> Result<(), CpiFault> {
        self.call("resize_disk", vec![json!(disk_cid), json!(new_size_mib)])
            .await
            .map(drop)
    }

    /// V2 `attach_disk(vm_cid, disk_cid)` → the disk hint.
    pub async fn attach_disk(&self, vm_cid: &str, disk_cid: &str) -> Result<Value, CpiFault> {
        self.call("attach_disk", vec![json!(vm_cid), json!(disk_cid)])
            .await
    }

    /// `detach_disk(vm_cid, disk_cid)`.
    pub async fn detach_disk(&self, vm_cid: &str, disk_cid: &str) -> Result<(), CpiFault> {
        self.call("detach_disk", vec![json!(vm_cid), json!(disk_cid)])
            .await
            .map(drop)
    }

    /// `set_disk_metadata(disk_cid, metadata)`.
    pub async fn set_disk_metadata(&self, disk_cid: &str, metadata: Value) -> Result<(), CpiFault> {
        self.call("set_disk_metadata", vec![json!(disk_cid), metadata])
            .await
            .map(drop)
    }

    /// `set_vm_metadata(vm_cid, metadata)`.
    pub async fn set_vm_metadata(&self, vm_cid: &str, metadata: Value) -> Result<(), CpiFault> {
        self.call("set_vm_metadata", vec![json!(vm_cid), metadata])
            .await
            .map(drop)
    }

    /// `snapshot_disk(disk_cid, metadata)` → snapshot cid.
    pub async fn snapshot_disk(&self, disk_cid: &str, metadata: Value) -> Result<String, CpiFault> {
        let v = self
            .call("snapshot_disk", vec![json!(disk_cid), metadata])
            .await?;
        as_cid("snapshot_disk", v)
    }

    /// `delete_snapshot(snapshot_cid)`.
    pub async fn delete_snapshot(&self, snapshot_cid: &str) -> Result<(), CpiFault> {
        self.call("delete_snapshot", vec![json!(snapshot_cid)])
            .await
            .map(drop)
    }

    /// The lab writing blocks on a disk (the workload on its VM): not a CPI
    /// call, so it bypasses the gate. Returns the write's sequence number.
    pub fn write_blocks(&self, disk_cid: &str, ranges: &[BlockRange]) -> Result<u64, CpiFault> {
        self.with_core(|c| c.write_blocks(disk_cid, ranges))
    }

    /// Ground truth: the written blocks of a snapshot, ascending.
    pub fn allocated_blocks(&self, snapshot_cid: &str) -> Result<Vec<u64>, CpiFault> {
        self.with_core(|c| c.snapshot_blocks(snapshot_cid))
            .map(|(_, m)| m.into_keys().collect())
    }

    /// Ground truth: the blocks whose content differs between two snapshots of
    /// one disk (written in one and not the other, or rewritten), ascending.
    pub fn changed_blocks(&self, base: &str, target: &str) -> Result<Vec<u64>, CpiFault> {
        let (b, bm) = self.with_core(|c| c.snapshot_blocks(base))?;
        let (t, tm) = self.with_core(|c| c.snapshot_blocks(target))?;
        if b.disk_cid != t.disk_cid {
            return Err(CpiFault::bad_argument(
                "changed_blocks",
                format!("snapshots '{base}' and '{target}' are of different disks"),
            ));
        }
        Ok(block_api::diff(&bm, &tm))
    }

    /// Every snapshot the IaaS holds (a view; bypasses the gate).
    pub fn snapshots(&self) -> Vec<SnapshotRec> {
        self.with_core(|c| c.snapshots()).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cpi fake: reading snapshots failed");
            vec![]
        })
    }

    pub(crate) fn with_core<T>(&self, f: impl FnOnce(&CpiCore) -> T) -> T {
        let core = self.inner.core.lock().unwrap_or_else(|p| p.into_inner());
        f(&core)
    }

    /// Whether the IaaS has VM `cid` (one read; bypasses the gate).
    pub fn has_vm_record(&self, cid: &str) -> bool {
        self.with_core(|c| matches!(c.vm(cid), Ok(Some(_))))
    }

    /// Every VM (a view for snapshots; bypasses the gate).
    pub fn vms(&self) -> Vec<CpiVmView> {
        self.with_core(|c| c.vms()).map_or_else(
            |e| {
                tracing::warn!(error = %e, "cpi fake: reading VMs failed");
                vec![]
            },
            |vms| {
                vms.into_iter()
                    .map(|v| CpiVmView {
                        disks: v.slots.iter().flatten().cloned().collect(),
                        cid: v.cid,
                        agent_id: v.agent_id,
                        metadata: v.metadata.into_iter().collect(),
                    })
                    .collect()
            },
        )
    }

    /// Every disk (a view for snapshots; bypasses the gate).
    pub fn disks(&self) -> Vec<CpiDiskView> {
        self.with_core(|c| c.disks()).map_or_else(
            |e| {
                tracing::warn!(error = %e, "cpi fake: reading disks failed");
                vec![]
            },
            |ds| {
                ds.into_iter()
                    .map(|d| CpiDiskView {
                        cid: d.cid,
                        size_mib: d.size_mib,
                        attached_to: d.attached_to,
                        locality: d.locality,
                        metadata: d.metadata.into_iter().collect(),
                    })
                    .collect()
            },
        )
    }

    /// Every attachment, sorted by disk cid.
    pub fn attachments(&self) -> Vec<Attachment> {
        Attachment::of_disks(&self.disks())
    }
}

fn as_cid(method: &str, v: Value) -> Result<String, CpiFault> {
    match v {
        Value::String(s) => Ok(s),
        other => Err(CpiFault::bad_argument(
            method,
            format!("CPI answered {other}, expected a cid string"),
        )),
    }
}

/// What the Director sees when the CPI process dies or its output is lost:
/// no parseable reply (the external caller raises InvalidResponse).
fn lost(method: &str, why: &str) -> CpiFault {
    CpiFault {
        error_type: "Bosh::Clouds::ExternalCpi::InvalidResponse".into(),
        message: format!("CPI '{method}' gave no valid response: {why}"),
        ok_to_retry: false,
    }
}

/// CPI replies are recorded gRPC-style: `OK`, or the error type as the code.
fn outcome(r: &Result<Value, CpiFault>) -> Outcome {
    match r {
        Ok(_) => Outcome::Grpc {
            code: "OK".into(),
            message: String::new(),
        },
        Err(f) => Outcome::Grpc {
            code: f.error_type.clone(),
            message: f.message.clone(),
        },
    }
}

#[cfg(test)]
mod tests;

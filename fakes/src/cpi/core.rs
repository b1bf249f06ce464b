//! The CPI's IaaS model: stemcells, VMs, disks, attachments and snapshots over
//! a [`Store`], one method per CPI v2 call. Both faces (in-process and the
//! external executable) dispatch here, so they cannot drift apart.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{CpiConfig, CpiFault, ErrorType};
use crate::ops::Op;
use crate::store::{Store, StoreError, StoreExt};

/// A VM as the IaaS holds it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct VmRec {
    pub cid: String,
    pub agent_id: String,
    pub stemcell_cid: String,
    pub cloud_properties: Value,
    pub networks: Value,
    pub env: Value,
    pub metadata: BTreeMap<String, Value>,
    /// Disks attached, by slot: index i is device `/dev/sd{c+i}`; `None` = free slot.
    pub slots: Vec<Option<String>>,
    pub reboots: u64,
}

/// A disk as the IaaS holds it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DiskRec {
    pub cid: String,
    pub size_mib: u64,
    pub cloud_properties: Value,
    /// The VM it was created next to (create_disk's locality argument).
    pub locality: Option<String>,
    /// The VM it is attached to (at most one: block devices attach to one VM).
    pub attached_to: Option<String>,
    pub metadata: BTreeMap<String, Value>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct StemcellRec {
    cid: String,
    image_path: String,
    cloud_properties: Value,
}

/// A snapshot as the IaaS holds it; its frozen block map lives beside it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SnapshotRec {
    pub cid: String,
    pub disk_cid: String,
    pub metadata: Value,
    /// The disk's size when it was taken (a later resize does not change it).
    #[serde(default)]
    pub size_mib: u64,
}

/// The IaaS block size (the EBS direct APIs' 512 KiB).
pub const BLOCK_SIZE: u64 = 512 * 1024;

/// What one block holds: which write put it there and a hash standing for
/// its content (no data is ever stored; the hash is what a BlockToken names).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BlockVersion {
    /// The global write sequence number of the write that last touched the block.
    pub seq: u64,
    /// A content hash derived from (disk, block, seq).
    pub hash: u64,
}

/// A sparse block map: only written blocks, by block index.
pub type BlockMap = BTreeMap<u64, BlockVersion>;

/// A run of blocks `[start, start + count)`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockRange {
    /// First block index.
    pub start: u64,
    /// Number of blocks (at least 1).
    pub count: u64,
}

/// Blocks in a disk of `size_mib` MiB.
pub fn blocks_in(size_mib: u64) -> u64 {
    (size_mib * 1024 * 1024).div_ceil(BLOCK_SIZE)
}

fn content_hash(disk: &str, index: u64, seq: u64) -> u64 {
    // FNV-1a over the three: stable across runs and platforms.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in disk
        .bytes()
        .chain(index.to_le_bytes())
        .chain(seq.to_le_bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The CPI's state machine. Callers serialize access (one method at a time).
pub struct CpiCore {
    store: Arc<dyn Store>,
    config: CpiConfig,
}

fn store_err(e: StoreError) -> CpiFault {
    CpiFault::new(
        ErrorType::CloudError,
        format!("IaaS state store failed: {e}"),
        true,
    )
}

/// Positional argument `i` as a string.
fn arg_str<'a>(method: &str, args: &'a [Value], i: usize, name: &str) -> Result<&'a str, CpiFault> {
    match args.get(i) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(CpiFault::bad_argument(
            method,
            format!("argument {i} ({name}) must be a string, got {other}"),
        )),
        None => Err(CpiFault::bad_argument(
            method,
            format!("missing argument {i} ({name})"),
        )),
    }
}

fn arg_u64(method: &str, args: &[Value], i: usize, name: &str) -> Result<u64, CpiFault> {
    args.get(i).and_then(Value::as_u64).ok_or_else(|| {
        CpiFault::bad_argument(
            method,
            format!("argument {i} ({name}) must be a non-negative integer"),
        )
    })
}

/// Optional positional argument (missing and `null` both read as `Null`).
fn arg_opt(args: &[Value], i: usize) -> Value {
    args.get(i).cloned().unwrap_or(Value::Null)
}

fn metadata_map(method: &str, v: &Value) -> Result<BTreeMap<String, Value>, CpiFault> {
    match v {
        Value::Object(m) => Ok(m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        Value::Null => Ok(BTreeMap::new()),
        other => Err(CpiFault::bad_argument(
            method,
            format!("metadata must be a hash, got {other}"),
        )),
    }
}

/// The device a slot maps to (slot 0 → `/dev/sdc`; sda/sdb are root and ephemeral).
pub fn slot_device(slot: usize) -> String {
    let letter = (b'c' + (slot % 24) as u8) as char;
    format!("/dev/sd{letter}")
}

crate::declare_ops!(
    /// The CPI API v2 methods this fake answers (what the Director→Cpi gate
    /// records and faults aim at).
    pub METHODS {
        INFO = "info",
        CREATE_STEMCELL = "create_stemcell",
        DELETE_STEMCELL = "delete_stemcell",
        CREATE_VM = "create_vm",
        DELETE_VM = "delete_vm",
        HAS_VM = "has_vm",
        REBOOT_VM = "reboot_vm",
        SET_VM_METADATA = "set_vm_metadata",
        CALCULATE_VM_CLOUD_PROPERTIES = "calculate_vm_cloud_properties",
        CREATE_DISK = "create_disk",
        DELETE_DISK = "delete_disk",
        RESIZE_DISK = "resize_disk",
        HAS_DISK = "has_disk",
        ATTACH_DISK = "attach_disk",
        DETACH_DISK = "detach_disk",
        GET_DISKS = "get_disks",
        SET_DISK_METADATA = "set_disk_metadata",
        SNAPSHOT_DISK = "snapshot_disk",
        DELETE_SNAPSHOT = "delete_snapshot",
        UNKNOWN_METHOD = "unknown_method",
    }
);

impl CpiCore {
    /// The model over `store`.
    pub fn new(store: Arc<dyn Store>, config: CpiConfig) -> Self {
        Self { store, config }
    }

    fn next_id(&self, kind: &str) -> Result<String, CpiFault> {
        let key = format!("counter/{kind}");
        let n: u64 = self.store.get_json(&key).map_err(store_err)?.unwrap_or(0) + 1;
        self.store.put_json(&key, &n).map_err(store_err)?;
        Ok(format!("{kind}-{n:06}"))
    }

    pub(crate) fn vm(&self, cid: &str) -> Result<Option<VmRec>, CpiFault> {
        self.store.get_json(&format!("vm/{cid}")).map_err(store_err)
    }

    fn put_vm(&self, vm: &VmRec) -> Result<(), CpiFault> {
        self.store
            .put_json(&format!("vm/{}", vm.cid), vm)
            .map_err(store_err)
    }

    fn disk(&self, cid: &str) -> Result<Option<DiskRec>, CpiFault> {
        self.store
            .get_json(&format!("disk/{cid}"))
            .map_err(store_err)
    }

    fn put_disk(&self, d: &DiskRec) -> Result<(), CpiFault> {
        self.store
            .put_json(&format!("disk/{}", d.cid), d)
            .map_err(store_err)
    }

    fn need_vm(&self, cid: &str) -> Result<VmRec, CpiFault> {
        self.vm(cid)?.ok_or_else(|| {
            CpiFault::new(
                ErrorType::VmNotFound,
                format!("VM '{cid}' not found"),
                false,
            )
        })
    }

    fn need_disk(&self, cid: &str) -> Result<DiskRec, CpiFault> {
        self.disk(cid)?.ok_or_else(|| {
            CpiFault::new(
                ErrorType::DiskNotFound,
                format!("Disk '{cid}' not found"),
                false,
            )
        })
    }

    /// Every VM, by cid.
    pub fn vms(&self) -> Result<Vec<VmRec>, StoreError> {
        Ok(self
            .store
            .scan_json::<VmRec>("vm/")?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }

    /// Every disk, by cid.
    pub fn disks(&self) -> Result<Vec<DiskRec>, StoreError> {
        Ok(self
            .store
            .scan_json::<DiskRec>("disk/")?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }

    /// The live block map of a disk (empty when never written).
    pub fn block_map(&self, disk_cid: &str) -> Result<BlockMap, CpiFault> {
        Ok(self
            .store
            .get_json(&format!("blocks/disk/{disk_cid}"))
            .map_err(store_err)?
            .unwrap_or_default())
    }

    /// A snapshot's record, if it exists.
    pub fn snapshot(&self, cid: &str) -> Result<Option<SnapshotRec>, CpiFault> {
        self.store
            .get_json(&format!("snapshot/{cid}"))
            .map_err(store_err)
    }

    /// Every snapshot, by cid.
    pub fn snapshots(&self) -> Result<Vec<SnapshotRec>, CpiFault> {
        Ok(self
            .store
            .scan_json::<SnapshotRec>("snapshot/")
            .map_err(store_err)?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }

    /// The frozen block map of a snapshot (`SnapshotNotFound`-like `DiskNotFound`
    /// fault when it is gone).
    pub fn snapshot_blocks(&self, cid: &str) -> Result<(SnapshotRec, BlockMap), CpiFault> {
        let Some(rec) = self.snapshot(cid)? else {
            return Err(CpiFault::new(
                ErrorType::CloudError,
                format!("Snapshot '{cid}' not found"),
                false,
            ));
        };
        let map = self
            .store
            .get_json(&format!("blocks/snap/{cid}"))
            .map_err(store_err)?
            .unwrap_or_default();
        Ok((rec, map))
    }

    /// Write `ranges` of blocks on a disk (the workload on the VM writing):
    /// every block gets this write's sequence number. Returns the sequence number.
    pub fn write_blocks(&self, disk_cid: &str, ranges: &[BlockRange]) -> Result<u64, CpiFault> {
        let d = self.need_disk(disk_cid)?;
        let total = blocks_in(d.size_mib);
        for r in ranges {
            let end = r.start.checked_add(r.count);
            if r.count == 0 || end.is_none_or(|e| e > total) {
                return Err(CpiFault::bad_argument(
                    "write_blocks",
                    format!(
                        "range {}+{} is empty or beyond the disk's {total} blocks",
                        r.start, r.count
                    ),
                ));
            }
        }
        let key = "counter/write";
        let seq: u64 = self.store.get_json(key).map_err(store_err)?.unwrap_or(0) + 1;
        self.store.put_json(key, &seq).map_err(store_err)?;
        let mut map = self.block_map(disk_cid)?;
        for r in ranges {
            for i in r.start..r.start + r.count {
                map.insert(
                    i,
                    BlockVersion {
                        seq,
                        hash: content_hash(disk_cid, i, seq),
                    },
                );
            }
        }
        self.store
            .put_json(&format!("blocks/disk/{disk_cid}"), &map)
            .map_err(store_err)?;
        self.store.flush().map_err(store_err)?;
        Ok(seq)
    }

    /// Run one CPI method with its positional arguments.
    pub fn dispatch(&self, method: &str, args: &[Value]) -> Result<Value, CpiFault> {
        let r = match Op::find(METHODS, method) {
            Some(INFO) => Ok(json!({
                "stemcell_formats": self.config.stemcell_formats,
                "api_version": 2,
            })),
            Some(CREATE_STEMCELL) => self.create_stemcell(args),
            Some(DELETE_STEMCELL) => {
                let cid = arg_str(method, args, 0, "stemcell_cid")?;
                // Real CPIs treat deleting a missing image as done.
                self.store
                    .remove(&format!("stemcell/{cid}"))
                    .map_err(store_err)?;
                Ok(Value::Null)
            }
            Some(CREATE_VM) => self.create_vm(args),
            Some(DELETE_VM) => self.delete_vm(args),
            Some(HAS_VM) => {
                let cid = arg_str(method, args, 0, "vm_cid")?;
                Ok(Value::Bool(self.vm(cid)?.is_some()))
            }
            Some(REBOOT_VM) => {
                let mut vm = self.need_vm(arg_str(method, args, 0, "vm_cid")?)?;
                vm.reboots += 1;
                self.put_vm(&vm)?;
                Ok(Value::Null)
            }
            Some(SET_VM_METADATA) => {
                let mut vm = self.need_vm(arg_str(method, args, 0, "vm_cid")?)?;
                vm.metadata = metadata_map(method, &arg_opt(args, 1))?;
                self.put_vm(&vm)?;
                Ok(Value::Null)
            }
            Some(CALCULATE_VM_CLOUD_PROPERTIES) => {
                let req = arg_opt(args, 0);
                let cpu = req.get("cpu").and_then(Value::as_u64);
                let ram = req.get("ram").and_then(Value::as_u64);
                let eph = req.get("ephemeral_disk_size").and_then(Value::as_u64);
                match (cpu, ram, eph) {
                    (Some(cpu), Some(ram), Some(eph)) => Ok(json!({
                        "instance_type": format!("fake.c{cpu}.m{ram}"),
                        "cpu": cpu,
                        "ram": ram,
                        "ephemeral_disk": {"size": eph},
                    })),
                    _ => Err(CpiFault::bad_argument(
                        method,
                        "argument 0 must be a hash with integer cpu, ram and ephemeral_disk_size",
                    )),
                }
            }
            Some(CREATE_DISK) => self.create_disk(args),
            Some(DELETE_DISK) => self.delete_disk(args),
            Some(RESIZE_DISK) => self.resize_disk(args),
            Some(HAS_DISK) => {
                let cid = arg_str(method, args, 0, "disk_cid")?;
                Ok(Value::Bool(self.disk(cid)?.is_some()))
            }
            Some(ATTACH_DISK) => self.attach_disk(args),
            Some(DETACH_DISK) => self.detach_disk(args),
            Some(GET_DISKS) => {
                let vm = self.need_vm(arg_str(method, args, 0, "vm_cid")?)?;
                Ok(Value::Array(
                    vm.slots
                        .iter()
                        .flatten()
                        .map(|d| Value::String(d.clone()))
                        .collect(),
                ))
            }
            Some(SET_DISK_METADATA) => {
                let mut d = self.need_disk(arg_str(method, args, 0, "disk_cid")?)?;
                d.metadata = metadata_map(method, &arg_opt(args, 1))?;
                self.put_disk(&d)?;
                Ok(Value::Null)
            }
            Some(SNAPSHOT_DISK) => {
                let d = self.need_disk(arg_str(method, args, 0, "disk_cid")?)?;
                let cid = self.next_id("snapshot")?;
                // Freeze the disk's blocks as they are now: the snapshot's
                // version is the block map at this instant.
                let frozen = self.block_map(&d.cid)?;
                self.store
                    .put_json(&format!("blocks/snap/{cid}"), &frozen)
                    .map_err(store_err)?;
                let rec = SnapshotRec {
                    cid: cid.clone(),
                    disk_cid: d.cid,
                    metadata: arg_opt(args, 1),
                    size_mib: d.size_mib,
                };
                self.store
                    .put_json(&format!("snapshot/{cid}"), &rec)
                    .map_err(store_err)?;
                Ok(Value::String(cid))
            }
            Some(DELETE_SNAPSHOT) => {
                let cid = arg_str(method, args, 0, "snapshot_cid")?;
                self.store
                    .remove(&format!("snapshot/{cid}"))
                    .map_err(store_err)?;
                self.store
                    .remove(&format!("blocks/snap/{cid}"))
                    .map_err(store_err)?;
                Ok(Value::Null)
            }
            Some(_) | None => Err(CpiFault::new(
                ErrorType::NotImplemented,
                format!("Method is not known, got '{method}'"),
                false,
            )),
        };
        if r.is_ok() {
            self.store.flush().map_err(store_err)?;
        }
        r
    }

    fn create_stemcell(&self, args: &[Value]) -> Result<Value, CpiFault> {
        let image_path = arg_str("create_stemcell", args, 0, "image_path")?.to_string();
        let cid = self.next_id("stemcell")?;
        let rec = StemcellRec {
            cid: cid.clone(),
            image_path,
            cloud_properties: arg_opt(args, 1),
        };
        self.store
            .put_json(&format!("stemcell/{cid}"), &rec)
            .map_err(store_err)?;
        Ok(Value::String(cid))
    }

    fn create_vm(&self, args: &[Value]) -> Result<Value, CpiFault> {
        let m = "create_vm";
        let agent_id = arg_str(m, args, 0, "agent_id")?.to_string();
        let stemcell_cid = arg_str(m, args, 1, "stemcell_cid")?.to_string();
        let stemcell: Option<StemcellRec> = self
            .store
            .get_json(&format!("stemcell/{stemcell_cid}"))
            .map_err(store_err)?;
        if stemcell.is_none() {
            return Err(CpiFault::new(
                ErrorType::VmCreationFailed,
                format!("Stemcell '{stemcell_cid}' not found"),
                false,
            ));
        }
        let networks = arg_opt(args, 3);
        if !matches!(networks, Value::Object(_) | Value::Null) {
            return Err(CpiFault::bad_argument(
                m,
                "argument 3 (networks) must be a hash",
            ));
        }
        let cid = self.next_id("vm")?;
        let vm = VmRec {
            cid: cid.clone(),
            agent_id,
            stemcell_cid,
            cloud_properties: arg_opt(args, 2),
            networks: networks.clone(),
            env: arg_opt(args, 5),
            metadata: BTreeMap::new(),
            slots: vec![None; self.config.max_disks_per_vm],
            reboots: 0,
        };
        self.put_vm(&vm)?;
        // V2: [vm_cid, networks] (the networks as the IaaS configured them).
        Ok(json!([cid, networks]))
    }

    /// Like the warden and AWS CPIs: deleting a VM with disks attached is
    /// allowed; the disks survive, disassociated (the IaaS detaches them when
    /// the instance goes away). A missing VM raises VMNotFound.
    fn delete_vm(&self, args: &[Value]) -> Result<Value, CpiFault> {
        let vm = self.need_vm(arg_str("delete_vm", args, 0, "vm_cid")?)?;
        for disk_cid in vm.slots.iter().flatten() {
            if let Some(mut d) = self.disk(disk_cid)? {
                if d.attached_to.as_deref() == Some(vm.cid.as_str()) {
                    d.attached_to = None;
                    self.put_disk(&d)?;
                }
            }
        }
        self.store
            .remove(&format!("vm/{}", vm.cid))
            .map_err(store_err)?;
        Ok(Value::Null)
    }

    fn create_disk(&self, args: &[Value]) -> Result<Value, CpiFault> {
        let m = "create_disk";
        let size_mib = arg_u64(m, args, 0, "size")?;
        if size_mib == 0 {
            return Err(CpiFault::bad_argument(
                m,
                "disk size must be at least 1 MiB",
            ));
        }
        if size_mib > self.config.max_disk_size_mib {
            return Err(CpiFault::new(
                ErrorType::NoDiskSpace,
                format!(
                    "Cannot create a disk of {size_mib} MiB (the IaaS allows at most {} MiB)",
                    self.config.max_disk_size_mib
                ),
                false,
            ));
        }
        let locality = match arg_opt(args, 2) {
            Value::Null => None,
            Value::String(vm) => {
                self.need_vm(&vm)?;
                Some(vm)
            }
            other => {
                return Err(CpiFault::bad_argument(
                    m,
                    format!("argument 2 (vm_locality) must be a VM cid or null, got {other}"),
                ))
            }
        };
        let cid = self.next_id("disk")?;
        let d = DiskRec {
            cid: cid.clone(),
            size_mib,
            cloud_properties: arg_opt(args, 1),
            locality,
            attached_to: None,
            metadata: BTreeMap::new(),
        };
        self.put_disk(&d)?;
        Ok(Value::String(cid))
    }

    /// An attached disk is in use: real IaaSes refuse to delete it (EBS VolumeInUse).
    fn delete_disk(&self, args: &[Value]) -> Result<Value, CpiFault> {
        let d = self.need_disk(arg_str("delete_disk", args, 0, "disk_cid")?)?;
        if let Some(vm) = &d.attached_to {
            return Err(CpiFault::new(
                ErrorType::CloudError,
                format!("Disk '{}' is attached to VM '{vm}'; detach it first", d.cid),
                false,
            ));
        }
        self.store
            .remove(&format!("disk/{}", d.cid))
            .map_err(store_err)?;
        // Snapshots outlive their disk (as EBS snapshots do); the live blocks do not.
        self.store
            .remove(&format!("blocks/disk/{}", d.cid))
            .map_err(store_err)?;
        Ok(Value::Null)
    }

    fn resize_disk(&self, args: &[Value]) -> Result<Value, CpiFault> {
        let m = "resize_disk";
        let mut d = self.need_disk(arg_str(m, args, 0, "disk_cid")?)?;
        let new = arg_u64(m, args, 1, "new_size")?;
        if let Some(vm) = &d.attached_to {
            return Err(CpiFault::new(
                ErrorType::CloudError,
                format!(
                    "Disk '{}' is attached to VM '{vm}'; resize needs it detached",
                    d.cid
                ),
                false,
            ));
        }
        if new < d.size_mib {
            return Err(CpiFault::new(
                ErrorType::NotSupported,
                format!(
                    "Disk '{}' cannot shrink from {} MiB to {new} MiB",
                    d.cid, d.size_mib
                ),
                false,
            ));
        }
        d.size_mib = new;
        self.put_disk(&d)?;
        Ok(Value::Null)
    }

    /// One VM per disk; bounded slots per VM. Attaching to the VM it is already
    /// on answers the same hint again (a retried attach after a lost reply).
    fn attach_disk(&self, args: &[Value]) -> Result<Value, CpiFault> {
        let m = "attach_disk";
        let mut vm = self.need_vm(arg_str(m, args, 0, "vm_cid")?)?;
        let mut d = self.need_disk(arg_str(m, args, 1, "disk_cid")?)?;
        match d.attached_to.as_deref() {
            Some(on) if on == vm.cid => {
                let slot = vm
                    .slots
                    .iter()
                    .position(|s| s.as_deref() == Some(d.cid.as_str()))
                    .unwrap_or(0);
                return Ok(hint(&d.cid, slot));
            }
            Some(other) => {
                return Err(CpiFault::new(
                    ErrorType::CloudError,
                    format!("Disk '{}' is already attached to VM '{other}'", d.cid),
                    false,
                ))
            }
            None => {}
        }
        let Some(slot) = vm.slots.iter().position(Option::is_none) else {
            return Err(CpiFault::new(
                ErrorType::CloudError,
                format!(
                    "VM '{}' has no free attachment slot ({} disks attached)",
                    vm.cid,
                    vm.slots.len()
                ),
                false,
            ));
        };
        vm.slots[slot] = Some(d.cid.clone());
        d.attached_to = Some(vm.cid.clone());
        self.put_vm(&vm)?;
        self.put_disk(&d)?;
        Ok(hint(&d.cid, slot))
    }

    fn detach_disk(&self, args: &[Value]) -> Result<Value, CpiFault> {
        let m = "detach_disk";
        let mut vm = self.need_vm(arg_str(m, args, 0, "vm_cid")?)?;
        let mut d = self.need_disk(arg_str(m, args, 1, "disk_cid")?)?;
        if d.attached_to.as_deref() != Some(vm.cid.as_str()) {
            return Err(CpiFault::new(
                ErrorType::DiskNotAttached,
                format!("Disk '{}' is not attached to VM '{}'", d.cid, vm.cid),
                false,
            ));
        }
        for s in vm.slots.iter_mut() {
            if s.as_deref() == Some(d.cid.as_str()) {
                *s = None;
            }
        }
        d.attached_to = None;
        self.put_vm(&vm)?;
        self.put_disk(&d)?;
        Ok(Value::Null)
    }
}

/// The V2 disk hint: a hash the Director stores and hands to the agent.
fn hint(disk_cid: &str, slot: usize) -> Value {
    json!({
        "path": slot_device(slot),
        "id": disk_cid,
        "lun": slot.to_string(),
    })
}

//! The CSI ownership snapshot: claims and their volumes, VolumeAttachments,
//! pods, and what is mounted where on each node; with the BOSH backend also
//! who owns which IaaS disk (Director disk → PersistentVolume → claim →
//! deployment), which VM it is attached to, which Director tasks ran and which
//! locks are held. Ids are labelled in first-seen order, as in the COSI snapshot.

use std::fmt::Write as _;
use std::sync::Arc;

use drivelab_fakes::cpi::{Attachment, CpiDiskView};
use drivelab_fakes::csi::mounts::MountView;
use drivelab_fakes::director::{DiskView, InstanceView, LockView, TaskView};
use drivelab_fakes::json::str_at;
use serde_json::Value;

use crate::snapshot::Normalizer;

/// What one BOSH snapshot is rendered from.
pub struct CsiSnapshotInput {
    /// Director instances.
    pub instances: Vec<InstanceView>,
    /// Director disks.
    pub disks: Vec<DiskView>,
    /// IaaS disks.
    pub iaas_disks: Vec<CpiDiskView>,
    /// IaaS attachments.
    pub attachments: Vec<Attachment>,
    /// PVCs (shared with the Kubernetes fake's decoded copy, not copied out).
    pub pvcs: Vec<Arc<Value>>,
    /// PVs.
    pub pvs: Vec<Arc<Value>>,
    /// VolumeAttachments.
    pub volume_attachments: Vec<Arc<Value>>,
    /// Pods.
    pub pods: Vec<Arc<Value>>,
    /// Every node's mounts.
    pub mounts: Vec<MountView>,
    /// Director tasks.
    pub tasks: Vec<TaskView>,
    /// Director locks held.
    pub locks: Vec<LockView>,
    /// IaaS snapshots.
    pub snapshots: Vec<drivelab_fakes::cpi::SnapshotRec>,
    /// Whether the BOSH backend stood behind the driver: without it the
    /// Director and IaaS sections say nothing and are left out.
    pub bosh: bool,
}

/// The snapshot text (deterministic for one seed; no secrets in any input).
pub fn render(i: &CsiSnapshotInput, n: &mut Normalizer) -> String {
    let mut out = String::new();
    // Label in a stable order first, so every later mention reads the same.
    let mut instances = i.instances.clone();
    instances.sort_by(|a, b| (&a.deployment, &a.name).cmp(&(&b.deployment, &b.name)));
    for inst in &instances {
        n.id("instance", &inst.id);
        if let Some(vm) = &inst.vm_cid {
            n.id("vm", vm);
        }
    }
    let mut disks = i.disks.clone();
    disks.sort_by(|a, b| a.name.cmp(&b.name));
    for d in &disks {
        n.id("volume", &d.name);
        n.id("disk", &d.cid);
    }
    let mut iaas = i.iaas_disks.clone();
    iaas.sort_by(|a, b| a.cid.cmp(&b.cid));
    for d in &iaas {
        n.id("disk", &d.cid);
    }

    if i.bosh {
        render_backend(i, &instances, &disks, &iaas, n, &mut out);
    }
    render_kube(i, n, &mut out);
    if i.bosh {
        render_director_work(i, n, &mut out);
    }
    n.end_kept_snapshot();
    out
}

/// The BOSH backend's side: instances, Director disks, IaaS disks and snapshots.
fn render_backend(
    i: &CsiSnapshotInput,
    instances: &[InstanceView],
    disks: &[DiskView],
    iaas: &[CpiDiskView],
    n: &mut Normalizer,
    out: &mut String,
) {
    let _ = writeln!(out, "instances:");
    for inst in instances {
        let _ = writeln!(
            out,
            "  {}/{} {} vm {} ({})",
            inst.deployment,
            inst.name,
            n.text_kept(&inst.id),
            inst.vm_cid
                .as_deref()
                .map(|v| n.text_kept(v))
                .unwrap_or_else(|| "none".into()),
            inst.state
        );
    }
    let _ = writeln!(out, "director disks:");
    for d in disks {
        let _ = writeln!(
            out,
            "  {} cid {} deployment {} {} MiB attached to {}",
            n.text_kept(&d.name),
            n.text_kept(&d.cid),
            d.deployment,
            d.size_mib,
            d.instance_id
                .as_deref()
                .map(|x| n.text_kept(x))
                .unwrap_or_else(|| "nothing".into())
        );
    }
    let _ = writeln!(out, "iaas disks:");
    let mut owners: std::collections::HashMap<&str, &str> = Default::default();
    for x in disks.iter().rev() {
        owners.insert(&x.cid, &x.name);
    }
    let mut attached: std::collections::HashMap<&str, Vec<&str>> = Default::default();
    for a in &i.attachments {
        attached.entry(&a.disk_cid).or_default().push(&a.vm_cid);
    }
    for d in iaas {
        let owner = owners
            .get(d.cid.as_str())
            .map(|name| n.text_kept(name))
            .unwrap_or_else(|| "NO DIRECTOR DISK".into());
        let vms: Vec<String> = attached
            .get(d.cid.as_str())
            .into_iter()
            .flatten()
            .map(|vm| n.text_kept(vm))
            .collect();
        let _ = writeln!(
            out,
            "  {} {} MiB of {owner} attached to [{}]",
            n.text_kept(&d.cid),
            d.size_mib,
            vms.join(", ")
        );
    }
    let _ = writeln!(out, "iaas snapshots:");
    let mut snaps = i.snapshots.clone();
    snaps.sort_by(|a, b| a.cid.cmp(&b.cid));
    for s in &snaps {
        let label = n.id("snapshot", &s.cid);
        let _ = writeln!(
            out,
            "  {label} of {} {} MiB",
            n.text_kept(&s.disk_cid),
            s.size_mib
        );
    }
}

/// What Kubernetes and the nodes show, whatever the backend: claims,
/// VolumeAttachments, pods and mounts.
fn render_kube(i: &CsiSnapshotInput, n: &mut Normalizer, out: &mut String) {
    let handles: std::collections::HashMap<String, String> = i
        .pvs
        .iter()
        .map(|p| {
            (
                str_at(p, &["metadata", "name"]),
                str_at(p, &["spec", "csi", "volumeHandle"]),
            )
        })
        .collect();
    // Every PV label first (in the order the lines name them), so the lines
    // below only read labels: a text that holds a value labelled since the
    // normaliser's automaton was built makes it rebuild, which interleaving
    // labels and lines could do once per claim at fleet scale.
    let claim_pvs: Vec<String> = i
        .pvcs
        .iter()
        .map(|c| str_at(c, &["spec", "volumeName"]))
        .collect();
    for pv in claim_pvs.iter().filter(|pv| !pv.is_empty()) {
        n.id("pv", pv);
    }
    for va in &i.volume_attachments {
        n.id(
            "pv",
            &str_at(va, &["spec", "source", "persistentVolumeName"]),
        );
    }
    let _ = writeln!(out, "claims:");
    for (c, pv) in i.pvcs.iter().zip(&claim_pvs) {
        let handle = handles.get(pv).cloned().unwrap_or_default();
        let _ = writeln!(
            out,
            "  {}/{} {} pv {} volume {}{}",
            str_at(c, &["metadata", "namespace"]),
            str_at(c, &["metadata", "name"]),
            str_at(c, &["status", "phase"]),
            if pv.is_empty() {
                "none".into()
            } else {
                n.id("pv", pv)
            },
            if handle.is_empty() {
                "none".into()
            } else {
                n.text_kept(&handle)
            },
            deleting(c)
        );
    }
    let _ = writeln!(out, "volume attachments:");
    for va in &i.volume_attachments {
        let _ = writeln!(
            out,
            "  {} on {} attached={}{}",
            n.id(
                "pv",
                &str_at(va, &["spec", "source", "persistentVolumeName"])
            ),
            str_at(va, &["spec", "nodeName"]),
            va["status"]["attached"].as_bool().unwrap_or(false),
            deleting(va)
        );
    }
    let _ = writeln!(out, "pods:");
    for p in &i.pods {
        let _ = writeln!(
            out,
            "  {}/{} on {} {}{}",
            str_at(p, &["metadata", "namespace"]),
            str_at(p, &["metadata", "name"]),
            str_at(p, &["spec", "nodeName"]),
            str_at(p, &["status", "phase"]),
            deleting(p)
        );
    }
    let _ = writeln!(out, "mounts:");
    let mut mounts = i.mounts.clone();
    mounts.sort_by(|a, b| (&a.node, &a.target).cmp(&(&b.node, &b.target)));
    for m in &mounts {
        // A driver's directory (its own backend) or a disk behind the mount.
        let backing = if m.disk_cid.is_empty() && !m.host_dir.is_empty() {
            format!("directory {}", n.text_all_kept(&m.host_dir))
        } else {
            format!("disk {}", n.text_kept(&m.disk_cid))
        };
        let _ = writeln!(
            out,
            "  {} {} {} of {backing} {}{}",
            m.node,
            if m.bind { "bind" } else { "stage" },
            n.text_all_kept(&m.target),
            if m.read_only { "ro" } else { "rw" },
            if m.device_present {
                ""
            } else {
                " (device gone)"
            }
        );
    }
}

/// The Director's tasks and locks.
fn render_director_work(i: &CsiSnapshotInput, n: &mut Normalizer, out: &mut String) {
    let _ = writeln!(out, "director tasks:");
    let mut by_state: std::collections::BTreeMap<String, usize> = Default::default();
    for t in &i.tasks {
        *by_state
            .entry(format!(
                "{} {:?}",
                if t.disk_job { "disk" } else { "vm" },
                t.state
            ))
            .or_default() += 1;
    }
    for (k, c) in by_state {
        let _ = writeln!(out, "  {k}: {c}");
    }
    let _ = writeln!(out, "locks held:");
    for l in &i.locks {
        let _ = writeln!(out, "  {}", n.text_kept(&l.name));
    }
}

fn deleting(o: &Value) -> &'static str {
    if str_at(o, &["metadata", "deletionTimestamp"]).is_empty() {
        ""
    } else {
        " (deleting)"
    }
}

//! The CSI invariants: what the Kubernetes objects, the mount tables and the
//! driver's own answers must show at every step boundary and after the final
//! convergence — and, with the BOSH backend, the IaaS and the Director too.
//! Each failure names the calls that show it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use drivelab_fakes::csi::mounts::MountView;
use drivelab_fakes::csi::{DriverReply, DriverRequest, Exchange};
use drivelab_fakes::director::{DiskView, TaskView};
use drivelab_fakes::history::{CallId, CallRecord, Component};
use drivelab_fakes::json::str_at;
use drivelab_fakes::secret::Secret;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checks::{LeakScan, Verdict};
use crate::scenario::Invariant;

/// The state at one step boundary.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// 0-based step (the final convergence is `steps.len()`).
    pub step: usize,
    /// IaaS attachments: (disk cid, VM cid).
    pub attachments: Vec<(String, String)>,
    /// Every node's mounts.
    pub mounts: Vec<MountView>,
    /// VolumeAttachments: (PV, node, attached).
    pub volume_attachments: Vec<(String, String, bool)>,
    /// PVs: name → (volume handle, access modes).
    pub pvs: BTreeMap<String, (String, Vec<String>)>,
    /// The Director's disks.
    pub disks: Vec<DiskView>,
}

/// One backup a scenario made, beside the ground truth.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BackupRecord {
    /// Its name in the scenario.
    pub name: String,
    /// 0-based step.
    pub step: usize,
    /// The token the client presented.
    pub token: crate::scenario::BackupToken,
    /// A delta (true) or the allocated blocks (false).
    pub incremental: bool,
    /// The IaaS's ground truth at the time (None: a snapshot was gone).
    pub expected: Option<Vec<u64>>,
    /// The blocks the stream reported.
    pub got: Vec<u64>,
    /// How the stream ended (`OK` or a gRPC code).
    pub code: String,
    /// Calls the sidecar relayed to the driver for it.
    pub driver_calls: usize,
    /// The driver's session token, if it gave one.
    pub session: Option<Secret>,
    /// The Kubernetes token the client presented.
    pub client_token: Secret,
    /// The stream's stretches: the first, and after a break the resumed one.
    pub segments: Vec<StreamSegment>,
}

/// One stretch of a backup's stream, from where it (re)started to where it
/// ended, broke or paused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSegment {
    /// `starting_offset` of the call (-1: the rest of a paused stream).
    pub starting_offset: i64,
    /// Blocks it added.
    pub blocks: usize,
    /// How it ended (`OK`, a gRPC code, or `PAUSED`).
    pub code: String,
}

/// One replay of an earlier backup's session.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplayRecord {
    /// 0-based step.
    pub step: usize,
    /// Whose session.
    pub backup: String,
    /// The backup had a session token to replay.
    pub had_session: bool,
    /// How the replayed stream ended.
    pub code: String,
}

/// Everything the CSI checks read: what a run records, and all a
/// re-judgement of it sees (secrets as fingerprints; see `crate::systems::Record`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CsiObservations {
    /// One sample per step, the final convergence last.
    pub samples: super::samples::Samples,
    /// Every call in the history: not kept in the record, read again from the
    /// recorded history (`with_history`).
    #[serde(skip)]
    pub calls: Vec<CallRecord>,
    /// Every CSI sidecar → driver exchange.
    pub exchanges: Vec<Exchange>,
    /// Every disk cid the Director ever showed, with its disk (= volume) name.
    pub disk_names: BTreeMap<String, String>,
    /// IaaS disks at the end.
    pub iaas_disks: Vec<String>,
    /// Director disks at the end.
    pub director_disks: Vec<DiskView>,
    /// IaaS snapshot cids at the end.
    pub iaas_snapshots: Vec<String>,
    /// `status.snapshotHandle` of every VolumeSnapshotContent at the end.
    pub snapshot_handles: BTreeSet<String>,
    /// Director tasks at the end.
    pub tasks: Vec<TaskView>,
    /// The driver's UAA client.
    pub client_id: String,
    /// Deployments that client is granted (empty: all).
    pub client_deployments: Vec<String>,
    /// Pod uid → whether its volume was published read-only.
    pub read_only_pods: BTreeMap<String, bool>,
    /// (node, path) of mounts the scenario itself asked for (node_stage/node_publish).
    pub lab_mounts: BTreeSet<(String, String)>,
    /// Pods at the end.
    pub pods: Vec<Value>,
    /// PVCs at the end.
    pub pvcs: Vec<Value>,
    /// Sidecar work still requeued after the final convergence.
    pub pending: Vec<String>,
    /// Backups, by name.
    pub backups: BTreeMap<String, BackupRecord>,
    /// Session replays, in order.
    pub replays: Vec<ReplayRecord>,
    /// What the secret scan found in the run's artifacts (no-secret-leak).
    pub leak_scan: LeakScan,
    /// Whether the BOSH backend stood behind the driver (its IaaS is then
    /// the ground truth of what the driver made).
    pub bosh_backend: bool,
    /// What the driver lists at the end (ListVolumes), when it advertises
    /// LIST_VOLUMES: the only view of its own backend a CSI driver gives.
    pub listed_volumes: Option<Vec<String>>,
    /// What it lists of snapshots (ListSnapshots, LIST_SNAPSHOTS).
    pub listed_snapshots: Option<Vec<String>>,
    /// The driver's name (GetPluginInfo): the kubelet's staging paths carry it.
    pub driver_name: String,
    /// The spec sweep's cases, when a `spec_sweep:` step ran (plain data).
    pub sweep: Option<Vec<super::sweep::SweepCase>>,
    /// What the sweep's own calls made and removed (no-orphans judges them too).
    #[serde(default)]
    pub sweep_ledger: super::sweep::SweepLedger,
    /// Reference-driver specific: what the linked-in hostpath-csi's own state
    /// directory holds that no volume or snapshot record names (the lab reads
    /// that directory; for any other driver this view does not exist).
    pub reference_orphans: Vec<String>,
}

impl CsiObservations {
    /// The calls, from the run's history (what a record is judged with).
    pub fn with_history(mut self, events: impl drivelab_fakes::history::Events) -> Self {
        self.calls = drivelab_fakes::history::calls(events);
        self
    }

    fn last(&self) -> Sample {
        self.samples.last().cloned().unwrap_or_default()
    }

    /// Successful CPI calls of `method`.
    fn cpi_calls<'a>(&'a self, method: &'a str) -> impl Iterator<Item = &'a CallRecord> + 'a {
        self.calls.iter().filter(move |c| {
            c.to == Component::Cpi
                && c.op == method
                && c.outcome.as_ref().is_some_and(|o| o.is_success())
        })
    }
}

/// Evaluate one invariant over a CSI run.
pub fn check(inv: Invariant, obs: &CsiObservations) -> Verdict {
    match inv {
        Invariant::SingleAttach => single_attach(obs),
        Invariant::NoOrphans => no_orphans(obs),
        Invariant::OwnerOnlyDelete => owner_only_delete(obs),
        Invariant::ScopedAccess => scoped_access(obs),
        Invariant::NoLeakedMounts => no_leaked_mounts(obs),
        Invariant::ReadOnlyEnforced => read_only_enforced(obs),
        Invariant::NoAttachDuringRecreate => no_attach_during_recreate(obs),
        Invariant::Converges => converges(obs),
        Invariant::SpecCodes => spec_codes(obs),
        Invariant::NoSecretLeak => crate::checks::no_secret_leak(&obs.leak_scan),
        Invariant::DeltaExact => delta_exact(obs),
        Invariant::TokenBound => token_bound(obs),
        Invariant::CsiSpec => csi_spec(obs),
        other => {
            let mut v = Verdict::new(other);
            v.fail("a COSI invariant asked of a CSI run".into(), []);
            v
        }
    }
}

/// A volume that only one node may use at a time.
fn single_node(modes: &[String]) -> bool {
    modes.is_empty()
        || modes
            .iter()
            .all(|m| m == "ReadWriteOnce" || m == "ReadWriteOncePod")
}

fn single_attach(obs: &CsiObservations) -> Verdict {
    let mut v = Verdict::new(Invariant::SingleAttach);
    let mut reported = BTreeSet::new();
    // The kubelet's staging path of each handle (a sha256), made once.
    let mut staging: HashMap<String, String> = HashMap::new();
    // Judged: step boundaries that had a volume or an attachment to look at.
    let mut judged = 0;
    obs.samples.visit(|s| {
        if !s.pvs.is_empty() || !s.attachments.is_empty() || !s.mounts.is_empty() {
            judged += 1;
        }
        let modes_of_handle: BTreeMap<&str, &[String]> = s
            .pvs
            .values()
            .map(|(h, m)| (h.as_str(), m.as_slice()))
            .collect();
        let single = |cid: &str| {
            obs.disk_names
                .get(cid)
                .and_then(|name| modes_of_handle.get(name.as_str()))
                .is_none_or(|m| single_node(m))
        };
        let mut vms: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (d, vm) in &s.attachments {
            vms.entry(d).or_default().insert(vm);
        }
        for (d, set) in vms {
            if set.len() > 1 && reported.insert(("iaas", d.to_string())) {
                let calls: Vec<CallId> = obs
                    .cpi_calls("attach_disk")
                    .filter(|c| c.subject.ends_with(&format!("/{d}")))
                    .map(|c| c.id)
                    .collect();
                v.fail(
                    format!(
                        "after step {}: disk {d} is attached to {} VMs at once",
                        s.step + 1,
                        set.len()
                    ),
                    calls,
                );
            }
        }
        let mut nodes: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (pv, node, attached) in &s.volume_attachments {
            if *attached {
                nodes.entry(pv).or_default().insert(node);
            }
        }
        for (pv, set) in nodes {
            let modes = s.pvs.get(pv).map(|x| x.1.as_slice()).unwrap_or(&[]);
            if set.len() > 1 && single_node(modes) && reported.insert(("va", pv.to_string())) {
                let calls = publish_calls(obs, s.pvs.get(pv).map(|x| x.0.as_str()));
                v.fail(
                    format!(
                        "after step {}: single-node volume {pv} is attached on {} nodes ({})",
                        s.step + 1,
                        set.len(),
                        set.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                    calls,
                );
            }
        }
        // Whatever backs it (a device, a driver's directory), a single-node
        // volume is staged on one node at a time: the kubelet's staging path
        // of its handle is mounted on at most one node.
        let mut on_path: HashMap<&str, BTreeSet<&str>> = HashMap::new();
        for m in &s.mounts {
            on_path.entry(&m.target).or_default().insert(&m.node);
        }
        let mut staged: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (pv, (handle, modes)) in &s.pvs {
            if !single_node(modes) || handle.is_empty() {
                continue;
            }
            let path = staging.entry(handle.clone()).or_insert_with(|| {
                drivelab_fakes::csi::kubelet::staging_path(&obs.driver_name, handle)
            });
            if let Some(nodes) = on_path.get(path.as_str()).filter(|n| n.len() > 1) {
                staged.insert(pv.as_str(), nodes.clone());
            }
        }
        for (pv, set) in staged {
            if reported.insert(("staged", pv.to_string())) {
                v.fail(
                    format!(
                        "after step {}: single-node volume {pv} is staged on {} nodes at once ({})",
                        s.step + 1,
                        set.len(),
                        set.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                    publish_calls(obs, s.pvs.get(pv).map(|x| x.0.as_str())),
                );
            }
        }
        let mut mounted: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for m in s.mounts.iter().filter(|m| !m.bind && m.device_present) {
            mounted.entry(&m.disk_cid).or_default().insert(&m.node);
        }
        for (d, set) in mounted {
            if set.len() > 1 && single(d) && reported.insert(("mount", d.to_string())) {
                v.fail(
                    format!(
                        "after step {}: disk {d} is mounted on {} nodes at once",
                        s.step + 1,
                        set.len()
                    ),
                    publish_calls(obs, obs.disk_names.get(d).map(String::as_str)),
                );
            }
        }
    });
    let what = if obs.bosh_backend {
        "every disk on at most one VM, every single-node volume attached and mounted on at most one node"
    } else {
        "every single-node volume attached (VolumeAttachments) and staged on at most one node"
    };
    v.finish(
        judged,
        format!("{} step boundaries: {what}", obs.samples.len()),
    )
}

/// ControllerPublish calls for a volume handle.
fn publish_calls(obs: &CsiObservations, handle: Option<&str>) -> Vec<CallId> {
    let Some(h) = handle else { return vec![] };
    obs.exchanges
        .iter()
        .filter(|e| matches!(&e.request, DriverRequest::ControllerPublish(r) if r.volume_id == h))
        .map(|e| e.call)
        .collect()
}

/// A ListVolumes/ListSnapshots answer as a set of ids (None: not listed).
fn listed_set(l: &Option<Vec<String>>) -> Option<BTreeSet<&str>> {
    l.as_ref().map(|l| l.iter().map(String::as_str).collect())
}

fn no_orphans(obs: &CsiObservations) -> Verdict {
    if !obs.bosh_backend {
        return no_orphans_by_csi(obs);
    }
    let mut v = Verdict::new(Invariant::NoOrphans);
    let last = obs.last();
    let handles: BTreeSet<&str> = last.pvs.values().map(|(h, _)| h.as_str()).collect();
    // By cid, the first disk of each as a scan found it: a scan per IaaS
    // disk made the check quadratic in the disks a run keeps.
    let mut by_cid: HashMap<&str, &DiskView> = HashMap::new();
    for d in &obs.director_disks {
        by_cid.entry(d.cid.as_str()).or_insert(d);
    }
    for cid in &obs.iaas_disks {
        let owner = by_cid.get(cid.as_str()).copied();
        match owner {
            None => v.fail(
                format!("IaaS disk {cid} belongs to no Director disk"),
                creates_of(obs, cid),
            ),
            Some(d) if !handles.contains(d.name.as_str()) => v.fail(
                format!(
                    "IaaS disk {cid} (Director disk {}) is owned by no live PersistentVolume",
                    d.name
                ),
                creates_of(obs, cid),
            ),
            Some(_) => {}
        }
    }
    for cid in &obs.iaas_snapshots {
        if !obs.snapshot_handles.contains(cid) {
            v.fail(
                format!("IaaS snapshot {cid} is owned by no VolumeSnapshotContent"),
                snapshot_creates_of(obs, cid),
            );
        }
    }
    // Judged: every disk the Director ever showed, every volume and snapshot
    // the sweep's calls made (their disks are in the end state above), and
    // the snapshots at the end.
    let swept = obs.sweep_ledger.volumes.len() + obs.sweep_ledger.snapshots.len();
    v.finish(
        obs.disk_names.len() + swept + obs.iaas_snapshots.len(),
        format!(
            "{} IaaS disks, each owned by a Director disk of a live PersistentVolume; {} IaaS snapshots, each owned by a VolumeSnapshotContent{}",
            obs.iaas_disks.len(),
            obs.iaas_snapshots.len(),
            if swept > 0 {
                format!(" (the spec sweep made {swept} volumes and snapshots; none is left)")
            } else {
                String::new()
            }
        ),
    )
}

/// no-orphans for a driver with its own backend, which the lab cannot see:
/// every volume and snapshot the driver handed out (its replies) and every one
/// it lists at the end (ListVolumes/ListSnapshots, when advertised) is owned
/// by a live PersistentVolume / VolumeSnapshotContent or was deleted (OK).
fn no_orphans_by_csi(obs: &CsiObservations) -> Verdict {
    let mut v = Verdict::new(Invariant::NoOrphans);
    let last = obs.last();
    let live: BTreeSet<&str> = last.pvs.values().map(|(h, _)| h.as_str()).collect();
    let mut made: BTreeMap<String, Vec<CallId>> = BTreeMap::new();
    let mut snaps: BTreeMap<String, Vec<CallId>> = BTreeMap::new();
    let mut deleted = BTreeSet::new();
    let mut snaps_deleted = BTreeSet::new();
    for e in &obs.exchanges {
        match (&e.request, &e.reply) {
            (DriverRequest::CreateVolume(_), DriverReply::Created(Some(vol))) => {
                made.entry(vol.volume_id.clone()).or_default().push(e.call);
            }
            (DriverRequest::CreateSnapshot(_), DriverReply::Snapshot(Some(sn))) => {
                snaps
                    .entry(sn.snapshot_id.clone())
                    .or_default()
                    .push(e.call);
            }
            (DriverRequest::DeleteVolume(r), r2) if r2.is_ok() => {
                deleted.insert(r.volume_id.clone());
            }
            (DriverRequest::DeleteSnapshot(r), r2) if r2.is_ok() => {
                snaps_deleted.insert(r.snapshot_id.clone());
            }
            _ => {}
        }
    }
    let sw = &obs.sweep_ledger;
    for (id, calls) in &sw.volumes {
        made.entry(id.clone())
            .or_default()
            .extend(calls.iter().map(|c| CallId(*c)));
    }
    for (id, calls) in &sw.snapshots {
        snaps
            .entry(id.clone())
            .or_default()
            .extend(calls.iter().map(|c| CallId(*c)));
    }
    deleted.extend(sw.volumes_deleted.iter().cloned());
    snaps_deleted.extend(sw.snapshots_deleted.iter().cloned());
    for id in obs.listed_volumes.iter().flatten() {
        made.entry(id.clone()).or_default();
    }
    for id in obs.listed_snapshots.iter().flatten() {
        snaps.entry(id.clone()).or_default();
    }
    // As sets: a search of the list per volume was quadratic in the volumes.
    let listed_volumes = listed_set(&obs.listed_volumes);
    let listed_snapshots = listed_set(&obs.listed_snapshots);
    let listed = |l: &Option<BTreeSet<&str>>, id: &str| l.as_ref().is_some_and(|l| l.contains(id));
    for (id, calls) in &made {
        let gone = deleted.contains(id) && !listed(&listed_volumes, id);
        if !live.contains(id.as_str()) && !gone {
            let how = if listed(&listed_volumes, id) {
                "the driver still lists it"
            } else {
                "the driver handed it out"
            };
            v.fail(
                format!("volume {id} is owned by no live PersistentVolume ({how}, and no DeleteVolume removed it)"),
                calls.clone(),
            );
        }
    }
    for (id, calls) in &snaps {
        let gone = snaps_deleted.contains(id) && !listed(&listed_snapshots, id);
        if !obs.snapshot_handles.contains(id) && !gone {
            v.fail(
                format!("snapshot {id} is owned by no VolumeSnapshotContent"),
                calls.clone(),
            );
        }
    }
    for dir in &obs.reference_orphans {
        v.fail(
            format!("the reference driver's backend keeps {dir}, which no volume or snapshot record names (hostpath-csi's state directory, read by the lab)"),
            [],
        );
    }
    let seen = |l: &Option<Vec<String>>, what: &str| match l {
        Some(l) => format!("{} listed by the driver", l.len()),
        None => format!("the driver does not advertise {what}: judged from its replies only"),
    };
    v.finish(made.len() + snaps.len() + obs.reference_orphans.len(), format!(
        "{} volumes ({}) and {} snapshots ({}) the driver made, each owned by a live PersistentVolume / VolumeSnapshotContent or deleted",
        made.len(),
        seen(&obs.listed_volumes, "LIST_VOLUMES"),
        snaps.len(),
        seen(&obs.listed_snapshots, "LIST_SNAPSHOTS"),
    ))
}

/// The CreateSnapshot calls that made `cid`, or whose reply was lost.
fn snapshot_creates_of(obs: &CsiObservations, cid: &str) -> Vec<CallId> {
    obs.exchanges
        .iter()
        .filter(|e| matches!(&e.request, DriverRequest::CreateSnapshot(_)))
        .filter(|e| match &e.reply {
            DriverReply::Snapshot(Some(s)) => s.snapshot_id == cid,
            DriverReply::Failed { .. } => true,
            _ => false,
        })
        .map(|e| e.call)
        .collect()
}

fn creates_of(obs: &CsiObservations, cid: &str) -> Vec<CallId> {
    let name = obs.disk_names.get(cid);
    obs.exchanges
        .iter()
        .filter(|e| matches!(&e.request, DriverRequest::CreateVolume(_)))
        .filter(|e| match (&e.reply, name) {
            (DriverReply::Created(Some(vol)), Some(n)) => &vol.volume_id == n,
            // A create whose reply was lost is the usual source of an orphan.
            (DriverReply::Failed { .. }, _) => true,
            _ => false,
        })
        .map(|e| e.call)
        .collect()
}

fn owner_only_delete(obs: &CsiObservations) -> Verdict {
    let mut v = Verdict::new(Invariant::OwnerOnlyDelete);
    let deleted: BTreeSet<&str> = obs
        .exchanges
        .iter()
        .filter_map(|e| match &e.request {
            DriverRequest::DeleteVolume(r) => Some(r.volume_id.as_str()),
            _ => None,
        })
        .collect();
    let mut n = 0;
    for c in obs.cpi_calls("delete_disk") {
        n += 1;
        let name = obs.disk_names.get(&c.subject).map(String::as_str);
        match name {
            Some(name) if deleted.contains(name) => {}
            _ => v.fail(
                format!(
                    "the IaaS deleted disk {} ({}), which no DeleteVolume asked for",
                    c.subject,
                    name.unwrap_or("unknown to the Director")
                ),
                [c.id],
            ),
        }
    }
    v.finish(
        n,
        format!("{n} IaaS disk deletions, each of a volume a DeleteVolume named"),
    )
}

fn scoped_access(obs: &CsiObservations) -> Verdict {
    let mut v = Verdict::new(Invariant::ScopedAccess);
    for c in &obs.calls {
        if c.to == Component::Director && c.op == "oauth.token" {
            if let Some(o) = &c.outcome {
                if !o.is_success() && !matches!(o, drivelab_fakes::history::Outcome::NoReply { .. })
                {
                    v.fail(
                        format!(
                            "UAA refused the driver's token request ({}): it asked for scopes its client is not granted",
                            o.label()
                        ),
                        [c.id],
                    );
                }
            }
        }
    }
    if !obs.client_deployments.is_empty() {
        for t in obs
            .tasks
            .iter()
            .filter(|t| t.disk_job && t.user == obs.client_id)
        {
            if let Some(d) = &t.deployment {
                if !obs.client_deployments.contains(d) {
                    v.fail(
                        format!(
                            "Director task {} ({}) ran on deployment {d}, outside the driver's grant",
                            t.id, t.description
                        ),
                        [],
                    );
                }
            }
        }
    }
    let tokens = obs
        .calls
        .iter()
        .filter(|c| c.to == Component::Director && c.op == "oauth.token")
        .count();
    let tasks = obs.tasks.iter().filter(|t| t.disk_job).count();
    v.finish(
        tokens + tasks,
        format!(
            "every token request granted with the dynamic-disks scopes; {tasks} disk tasks, all on granted deployments"
        ),
    )
}

/// Pods that exist and are not being deleted: uid → node.
fn live_pods(obs: &CsiObservations) -> BTreeMap<String, String> {
    obs.pods
        .iter()
        .filter(|p| str_at(p, &["metadata", "deletionTimestamp"]).is_empty())
        .map(|p| {
            (
                str_at(p, &["metadata", "uid"]),
                str_at(p, &["spec", "nodeName"]),
            )
        })
        .collect()
}

fn no_leaked_mounts(obs: &CsiObservations) -> Verdict {
    let mut v = Verdict::new(Invariant::NoLeakedMounts);
    let last = obs.last();
    let pods = live_pods(obs);
    let node_calls = |node: &str, path: &str| -> Vec<CallId> {
        obs.exchanges
            .iter()
            .filter(|e| {
                e.from == Component::Kubelet
                    && e.request.subject().ends_with(path)
                    && !node.is_empty()
            })
            .map(|e| e.call)
            .collect()
    };
    for m in &last.mounts {
        if obs.lab_mounts.contains(&(m.node.clone(), m.target.clone())) {
            continue;
        }
        if m.bind {
            let owner = pods
                .iter()
                .find(|(uid, node)| m.target.contains(uid.as_str()) && **node == m.node);
            if owner.is_none() {
                v.fail(
                    format!(
                        "{}: bind mount {} belongs to no running pod on the node",
                        m.node, m.target
                    ),
                    node_calls(&m.node, &m.target),
                );
            }
        } else {
            let used = last
                .mounts
                .iter()
                .any(|b| b.bind && b.node == m.node && b.source == m.target);
            if !used {
                v.fail(
                    format!(
                        "{}: staging mount {} of disk {} is used by no pod",
                        m.node, m.target, m.disk_cid
                    ),
                    node_calls(&m.node, &m.target),
                );
            }
        }
    }
    // Judged: every mount seen at any step boundary must be gone or used at the end.
    let mounts_seen: BTreeSet<(&str, &str)> = (obs.samples.mounts_ever())
        .map(|m| (m.node.as_str(), m.target.as_str()))
        .collect();
    v.finish(
        mounts_seen.len(),
        format!(
            "{} mounts after convergence, each used by a running pod on its node",
            last.mounts.len()
        ),
    )
}

fn read_only_enforced(obs: &CsiObservations) -> Verdict {
    let mut v = Verdict::new(Invariant::ReadOnlyEnforced);
    let mut seen = BTreeSet::new();
    let mut checked = 0;
    let read_only: Vec<&str> = (obs.read_only_pods.iter())
        .filter(|(_, ro)| **ro)
        .map(|(uid, _)| uid.as_str())
        .collect();
    obs.samples.visit(|s| {
        for m in s.mounts.iter().filter(|m| m.bind) {
            let Some(uid) = read_only.iter().find(|uid| m.target.contains(*uid)) else {
                continue;
            };
            checked += 1;
            if !m.read_only && seen.insert(m.target.clone()) {
                let calls: Vec<CallId> = obs
                    .exchanges
                    .iter()
                    .filter(|e| matches!(&e.request, DriverRequest::NodePublish(r) if r.target_path == m.target))
                    .map(|e| e.call)
                    .collect();
                v.fail(
                    format!(
                        "after step {}: pod {uid} asked for its volume read-only, but {} on {} is mounted read-write",
                        s.step + 1,
                        m.target,
                        m.node
                    ),
                    calls,
                );
            }
        }
    });
    v.finish(
        checked,
        format!("{checked} read-only bind mounts seen, all read-only"),
    )
}

fn no_attach_during_recreate(obs: &CsiObservations) -> Verdict {
    let mut v = Verdict::new(Invariant::NoAttachDuringRecreate);
    // An attach to a VM that is then deleted without that disk being detached
    // first slipped in between a recreate's detach sweep and its delete_vm.
    let cpi: Vec<&CallRecord> = obs
        .calls
        .iter()
        .filter(|c| c.to == Component::Cpi && c.outcome.as_ref().is_some_and(|o| o.is_success()))
        .collect();
    let mut recreates = 0;
    for (i, c) in cpi.iter().enumerate() {
        if c.op != "delete_vm" {
            continue;
        }
        recreates += 1;
        let vm = c.subject.as_str();
        let prefix = format!("{vm}/");
        let mut attached: BTreeMap<&str, CallId> = BTreeMap::new();
        for e in &cpi[..i] {
            if let Some(disk) = e.subject.strip_prefix(&prefix) {
                match e.op.as_str() {
                    "attach_disk" => {
                        attached.insert(disk, e.id);
                    }
                    "detach_disk" => {
                        attached.remove(disk);
                    }
                    _ => {}
                }
            }
        }
        for (disk, attach) in attached {
            v.fail(
                format!(
                    "disk {disk} was attached to VM {vm} and the VM was then deleted with the disk still on it: the attach interleaved with the VM's recreate"
                ),
                [attach, c.id],
            );
        }
    }
    v.finish(
        recreates,
        format!(
            "{recreates} VM deletions, none with a dynamic disk attached behind the recreate's back"
        ),
    )
}

/// After faults heal, no sidecar is retrying anything, every PVC is Bound and
/// every pod Running. The sidecars' rule is `csi::retry::requeues` (every
/// driver error is retried for ever, INVALID_ARGUMENT included), which the
/// fakes apply, so whatever they still have queued is not converged.
fn converges(obs: &CsiObservations) -> Verdict {
    let mut v = Verdict::new(Invariant::Converges);
    for p in &obs.pending {
        v.fail(
            format!(
                "still requeued after the final convergence (the CSI sidecars retry every driver error for ever): {p}"
            ),
            [],
        );
    }
    for c in &obs.pvcs {
        if str_at(c, &["metadata", "deletionTimestamp"]).is_empty()
            && str_at(c, &["status", "phase"]) != "Bound"
        {
            v.fail(
                format!(
                    "PVC {}/{} is {}, not Bound",
                    str_at(c, &["metadata", "namespace"]),
                    str_at(c, &["metadata", "name"]),
                    str_at(c, &["status", "phase"])
                ),
                [],
            );
        }
    }
    for p in &obs.pods {
        if str_at(p, &["metadata", "deletionTimestamp"]).is_empty()
            && str_at(p, &["status", "phase"]) != "Running"
        {
            v.fail(
                format!(
                    "pod {}/{} is {:?}, not Running",
                    str_at(p, &["metadata", "namespace"]),
                    str_at(p, &["metadata", "name"]),
                    str_at(p, &["status", "phase"])
                ),
                [],
            );
        }
    }
    v.finish(
        obs.exchanges.len(),
        format!(
            "every PVC Bound, every pod Running, nothing requeued ({} PVCs, {} pods)",
            obs.pvcs.len(),
            obs.pods.len()
        ),
    )
}

fn delta_exact(obs: &CsiObservations) -> Verdict {
    let mut v = Verdict::new(Invariant::DeltaExact);
    let mut n = 0;
    for b in obs.backups.values().filter(|b| b.code == "OK") {
        n += 1;
        let what = if b.incremental {
            "changed"
        } else {
            "allocated"
        };
        match &b.expected {
            None => v.fail(
                format!(
                    "backup {} (step {}) got OK with {} blocks, but a snapshot it reads is gone",
                    b.name,
                    b.step + 1,
                    b.got.len()
                ),
                [],
            ),
            Some(want) if *want != b.got => {
                let want_set: BTreeSet<u64> = want.iter().copied().collect();
                let got_set: BTreeSet<u64> = b.got.iter().copied().collect();
                let missing: Vec<u64> = want_set.difference(&got_set).copied().take(8).collect();
                let extra: Vec<u64> = got_set.difference(&want_set).copied().take(8).collect();
                v.fail(
                    format!(
                        "backup {} (step {}): {} {what} blocks reported, {} written; missing {missing:?}, extra {extra:?}",
                        b.name,
                        b.step + 1,
                        b.got.len(),
                        want.len()
                    ),
                    [],
                );
            }
            Some(_) => {}
        }
    }
    // A stream that failed (a snapshot deleted under it, a broken relay) may
    // stop early, but every block it did report must be one the IaaS holds:
    // the client may already have copied it.
    let mut partial = 0;
    for b in obs.backups.values().filter(|b| b.code != "OK") {
        let Some(want) = &b.expected else { continue };
        if b.got.is_empty() {
            continue;
        }
        partial += 1;
        let want_set: BTreeSet<u64> = want.iter().copied().collect();
        let extra: Vec<u64> = b
            .got
            .iter()
            .filter(|i| !want_set.contains(i))
            .copied()
            .take(8)
            .collect();
        if !extra.is_empty() {
            v.fail(
                format!(
                    "backup {} (step {}) ended {} after reporting {} blocks, some never written: {extra:?}",
                    b.name,
                    b.step + 1,
                    b.code,
                    b.got.len()
                ),
                [],
            );
        }
    }
    let resumed = obs
        .backups
        .values()
        .filter(|b| b.code == "OK" && b.segments.len() > 1)
        .count();
    let mut summary = format!("{n} completed backups, each reporting exactly the blocks written");
    if resumed > 0 {
        summary.push_str(&format!(
            " ({resumed} of them resumed from starting_offset after a broken stream)"
        ));
    }
    if partial > 0 {
        summary.push_str(&format!(
            "; {partial} failed streams reported only written blocks before failing"
        ));
    }
    v.finish(n + partial, summary)
}

fn token_bound(obs: &CsiObservations) -> Verdict {
    use crate::scenario::BackupToken;
    let mut v = Verdict::new(Invariant::TokenBound);
    for b in obs
        .backups
        .values()
        .filter(|b| b.token != BackupToken::Valid)
    {
        if b.code == "OK" {
            v.fail(
                format!(
                    "backup {} with a {} token was served",
                    b.name,
                    b.token.as_str()
                ),
                [],
            );
        } else if b.driver_calls > 0 {
            v.fail(
                format!(
                    "backup {} with a {} token reached the driver ({} calls) before it was refused",
                    b.name,
                    b.token.as_str(),
                    b.driver_calls
                ),
                [],
            );
        }
    }
    for r in &obs.replays {
        // Served is what breaks the claim. A replay cut short (a crash the
        // lab fired mid-call answers UNKNOWN: transport error) served
        // nothing; it is named, not counted as accepted.
        let refused = r.code == "PERMISSION_DENIED" || r.code == "UNAUTHENTICATED";
        if r.had_session && !refused && r.code != "OK" {
            v.details.push(format!(
                "the session replay of backup {} at step {} was neither served nor refused (answer {})",
                r.backup,
                r.step + 1,
                r.code
            ));
            continue;
        }
        if r.had_session && !refused {
            v.fail(
                format!(
                    "the session token of backup {} was accepted again at step {} (answer {})",
                    r.backup,
                    r.step + 1,
                    r.code
                ),
                [],
            );
        }
    }
    let cut_short = obs
        .replays
        .iter()
        .filter(|r| {
            r.had_session
                && r.code != "OK"
                && r.code != "PERMISSION_DENIED"
                && r.code != "UNAUTHENTICATED"
        })
        .count();
    let replays = if cut_short == 0 {
        format!("{} session replays, all refused", obs.replays.len())
    } else {
        format!(
            "{} session replays, none served ({cut_short} cut short, not judged)",
            obs.replays.len()
        )
    };
    let refused = obs
        .backups
        .values()
        .filter(|b| b.token != crate::scenario::BackupToken::Valid)
        .count();
    v.finish(
        refused + obs.replays.len() - cut_short,
        format!("{refused} refused clients, each stopped before the driver; {replays}"),
    )
}

fn spec_codes(obs: &CsiObservations) -> Verdict {
    let mut v = Verdict::new(Invariant::SpecCodes);
    let mut n = 0;
    for e in &obs.exchanges {
        // A volume that does not fit the capacity range asked for is ALREADY_EXISTS, not OK.
        if let (DriverRequest::CreateVolume(req), DriverReply::Created(Some(vol))) =
            (&e.request, &e.reply)
        {
            if let Some(r) = &req.capacity_range {
                let fits = (r.required_bytes == 0 || vol.capacity_bytes >= r.required_bytes)
                    && (r.limit_bytes == 0 || vol.capacity_bytes <= r.limit_bytes);
                if !fits {
                    v.fail(
                        format!(
                            "CreateVolume {} asked {}..{} bytes and got OK with a {}-byte volume; the spec says ALREADY_EXISTS",
                            req.name, r.required_bytes, r.limit_bytes, vol.capacity_bytes
                        ),
                        [e.call],
                    );
                }
            }
        }
        let DriverReply::Failed { code, message } = &e.reply else {
            continue;
        };
        let rpc = e.request.rpc();
        let bad = match (&e.request, code) {
            // CSI: unpublishing or deleting what is already gone is success.
            (DriverRequest::ControllerUnpublish(_), tonic::Code::NotFound)
            | (DriverRequest::DeleteVolume(_), tonic::Code::NotFound)
            | (DriverRequest::NodeUnpublish(_), tonic::Code::NotFound)
            | (DriverRequest::NodeUnstage(_), tonic::Code::NotFound) => true,
            _ => false,
        };
        n += 1;
        if bad {
            v.fail(
                format!(
                    "{rpc} {} answered NOT_FOUND ({message}); the CSI spec says an already-gone volume or attachment is OK",
                    e.request.subject()
                ),
                [e.call],
            );
        }
    }
    v.finish(
        obs.exchanges.len(),
        format!("{n} error replies, none where the spec requires OK"),
    )
}

/// csi-spec: every case of the sweep, one detail line each — failures with
/// their calls as evidence, passes and not-applicable cases listed too.
fn csi_spec(obs: &CsiObservations) -> Verdict {
    use super::sweep::CaseOutcome;
    let mut v = Verdict::new(Invariant::CsiSpec);
    let Some(cases) = &obs.sweep else {
        return v.finish(0, "no `spec_sweep:` step ran: nothing to judge".into());
    };
    let mut lines = Vec::new();
    let (mut pass, mut na) = (0, 0);
    for c in cases {
        let calls = c.calls.iter().map(|n| CallId(*n));
        match c.outcome {
            CaseOutcome::Fail => v.fail(
                format!("FAIL {}: {} — spec: {}", c.id, c.detail, c.rule),
                calls,
            ),
            CaseOutcome::Pass => {
                pass += 1;
                lines.push(format!("pass {}: {} — spec: {}", c.id, c.detail, c.rule));
            }
            CaseOutcome::NotApplicable => {
                na += 1;
                lines.push(format!(
                    "not applicable {}: {} — spec: {}",
                    c.id, c.detail, c.rule
                ));
            }
        }
    }
    let summary = format!(
        "{pass} of {} sweep cases pass, {na} not applicable (not exercised)",
        cases.len()
    );
    if v.passed {
        v.details.extend(lines);
    } else {
        v.details.push(summary.clone());
        v.details.extend(lines);
    }
    v.finish(pass, summary)
}

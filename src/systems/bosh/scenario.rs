//! The `bosh:` section and the BOSH/CSI steps: the Director's deployments, the
//! Kubernetes nodes that run on their instances, the StorageClasses, and what a
//! scenario does to them (volumes, pods, VM operations, Director outages).

use std::time::Duration;

use serde::Deserialize;

/// The BOSH side of a scenario, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bosh {
    /// Deployments the Director starts with.
    pub deployments: Vec<DeploymentSpec>,
    /// Kubernetes nodes and the instance each runs on.
    pub nodes: Vec<NodeSpec>,
    /// StorageClasses the lab creates for the driver.
    pub storage_classes: Vec<StorageClassSpec>,
    /// Size of the Director's dynamic-disks worker pool (0: feature off).
    pub workers: usize,
    /// Deployments the driver's UAA client is granted (empty: all of them).
    pub client_deployments: Vec<String>,
    /// Disk jobs take the VM lock (false: the Director bug that lets attach and recreate interleave).
    pub disk_jobs_take_vm_lock: bool,
    /// Disk jobs also take the deployment lock (the design the upgrade-deadlock concern is about).
    pub disk_jobs_take_deployment_lock: bool,
    /// The Director refuses a token on disks of deployments it is not scoped to.
    pub per_deployment_scoping: bool,
    /// How long (real time) the driver waits for a Director task before giving up the call.
    pub task_timeout: Duration,
    /// Virtual time each successful CPI method takes (`attach_disk: 3s`).
    pub iaas_latency: std::collections::BTreeMap<String, Duration>,
    /// The attach limit the node plugins are deployed with (NodeGetInfo's
    /// max_volumes_per_node; 0: none) — also the IaaS's disk slots per VM.
    pub max_volumes_per_node: u32,
    /// A generated fleet and churn (`scale:`): the deployment and nodes above
    /// are its, and its steps come before the file's own.
    pub scale: Option<super::scale::Scale>,
    /// The Director's worker pool modelled in virtual time (on with `scale:`).
    pub virtual_lanes: bool,
}

/// A deployment with one instance group.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DeploymentSpec {
    /// Deployment name.
    pub name: String,
    /// Instances of its one instance group.
    #[serde(default = "two")]
    pub instances: u32,
    /// The instance group's name.
    #[serde(default = "worker")]
    pub instance_group: String,
}

/// A Kubernetes node and the BOSH instance (`deployment/index`) it runs on.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Node name.
    pub name: String,
    /// `deployment/index` of the instance.
    pub instance: String,
}

impl NodeSpec {
    /// The deployment and 0-based index of its instance.
    pub fn instance_ref(&self) -> Option<(&str, u32)> {
        let (d, i) = self.instance.split_once('/')?;
        Some((d, i.parse().ok()?))
    }
}

/// A StorageClass of the driver.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StorageClassSpec {
    /// Object name.
    pub name: String,
    /// The deployment its disks belong to.
    pub deployment: String,
    /// Director disk pool.
    #[serde(default = "default_pool")]
    pub disk_pool: String,
    /// Filesystem the node plugin makes.
    #[serde(default = "ext4")]
    pub fstype: String,
    /// `Delete` or `Retain`.
    #[serde(default = "delete")]
    pub reclaim_policy: String,
}

/// What the file holds under `bosh:`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBosh {
    #[serde(default)]
    deployments: Vec<DeploymentSpec>,
    #[serde(default)]
    nodes: Vec<NodeSpec>,
    #[serde(default)]
    storage_classes: Vec<StorageClassSpec>,
    #[serde(default = "two_workers")]
    workers: usize,
    #[serde(default)]
    client_deployments: Vec<String>,
    #[serde(default = "yes")]
    disk_jobs_take_vm_lock: bool,
    #[serde(default)]
    disk_jobs_take_deployment_lock: bool,
    #[serde(default = "yes")]
    per_deployment_scoping: bool,
    #[serde(default)]
    task_timeout: Option<String>,
    #[serde(default)]
    iaas_latency: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    max_volumes_per_node: u32,
    #[serde(default)]
    scale: Option<super::scale::RawScale>,
    #[serde(default)]
    virtual_lanes: Option<bool>,
}

impl RawBosh {
    /// Whether the section has a `scale:` block.
    pub(crate) fn has_scale(&self) -> bool {
        self.scale.is_some()
    }
}

fn two() -> u32 {
    2
}
fn two_workers() -> usize {
    2
}
fn yes() -> bool {
    true
}
fn worker() -> String {
    "worker".into()
}
fn default_pool() -> String {
    "default".into()
}
fn ext4() -> String {
    "ext4".into()
}
fn delete() -> String {
    "Delete".into()
}

/// The BOSH CPI API v2 methods (what `iaas_latency` may name).
pub const CPI_METHODS: &[&str] = &[
    "info",
    "create_stemcell",
    "delete_stemcell",
    "create_vm",
    "delete_vm",
    "has_vm",
    "reboot_vm",
    "set_vm_metadata",
    "calculate_vm_cloud_properties",
    "create_disk",
    "delete_disk",
    "resize_disk",
    "has_disk",
    "attach_disk",
    "detach_disk",
    "get_disks",
    "set_disk_metadata",
    "snapshot_disk",
    "delete_snapshot",
];

/// The deployment every default refers to.
pub const DEFAULT_DEPLOYMENT: &str = "k8s";
/// The StorageClass a `create_volume` without `class:` uses.
pub const DEFAULT_CLASS: &str = "bosh";

impl RawBosh {
    /// Fill in defaults and check references; errors are message + hint.
    pub(crate) fn resolve(mut self) -> Result<Bosh, (String, Option<&'static str>)> {
        let scale = match self.scale.take() {
            None => None,
            Some(s) => {
                if !self.deployments.is_empty() || !self.nodes.is_empty() {
                    return Err((
                        "`scale:` generates the deployment and its nodes; drop `deployments:` and `nodes:`".into(),
                        Some("scale: { nodes: 100, volumes: 1000 } makes deployment k8s with 100 instances, nodes node-0..node-99"),
                    ));
                }
                let s = s.resolve()?;
                self.deployments = vec![DeploymentSpec {
                    name: DEFAULT_DEPLOYMENT.into(),
                    instances: s.nodes,
                    instance_group: worker(),
                }];
                Some(s)
            }
        };
        let deployments = if self.deployments.is_empty() {
            vec![DeploymentSpec {
                name: DEFAULT_DEPLOYMENT.into(),
                instances: 2,
                instance_group: worker(),
            }]
        } else {
            self.deployments
        };
        let mut names = std::collections::BTreeSet::new();
        for d in &deployments {
            if d.name.is_empty() || d.name.contains('/') || !names.insert(d.name.clone()) {
                return Err((
                    format!(
                        "deployment `{}` is empty, has a '/', or is listed twice",
                        d.name
                    ),
                    None,
                ));
            }
            if d.instances == 0 || d.instances > super::scale::MAX_NODES {
                return Err((
                    format!(
                        "deployment `{}` needs 1..={} instances",
                        d.name,
                        super::scale::MAX_NODES
                    ),
                    None,
                ));
            }
        }
        let nodes = if self.nodes.is_empty() {
            let d = &deployments[0];
            (0..d.instances)
                .map(|i| NodeSpec {
                    name: format!("node-{i}"),
                    instance: format!("{}/{i}", d.name),
                })
                .collect()
        } else {
            self.nodes
        };
        let mut seen_nodes = std::collections::BTreeSet::new();
        let mut seen_instances = std::collections::BTreeSet::new();
        for n in &nodes {
            let Some((d, i)) = n.instance_ref() else {
                return Err((
                    format!(
                        "node `{}`: instance `{}` is not `deployment/index`",
                        n.name, n.instance
                    ),
                    Some("e.g. instance: k8s/0"),
                ));
            };
            match deployments.iter().find(|x| x.name == d) {
                Some(dep) if i < dep.instances => {}
                _ => {
                    return Err((
                        format!(
                            "node `{}` runs on `{}`, which no deployment has",
                            n.name, n.instance
                        ),
                        Some("indexes start at 0 and must be below the deployment's instances"),
                    ))
                }
            }
            if !seen_nodes.insert(n.name.clone()) || !seen_instances.insert(n.instance.clone()) {
                return Err((
                    format!("node `{}` or its instance is listed twice", n.name),
                    None,
                ));
            }
        }
        let storage_classes = if self.storage_classes.is_empty() {
            vec![StorageClassSpec {
                name: DEFAULT_CLASS.into(),
                deployment: deployments[0].name.clone(),
                disk_pool: default_pool(),
                fstype: ext4(),
                reclaim_policy: delete(),
            }]
        } else {
            self.storage_classes
        };
        for c in &storage_classes {
            if !deployments.iter().any(|d| d.name == c.deployment) {
                return Err((
                    format!(
                        "storage class `{}` is for deployment `{}`, which is not declared",
                        c.name, c.deployment
                    ),
                    None,
                ));
            }
            if !["Delete", "Retain"].contains(&c.reclaim_policy.as_str()) {
                return Err((
                    format!(
                        "reclaim_policy `{}` is not Delete or Retain",
                        c.reclaim_policy
                    ),
                    None,
                ));
            }
        }
        for d in &self.client_deployments {
            if !deployments.iter().any(|x| &x.name == d) {
                return Err((
                    format!("client_deployments names `{d}`, which is not declared"),
                    None,
                ));
            }
        }
        if self.workers > 64 {
            return Err(("`workers` is at most 64".into(), None));
        }
        let task_timeout = match &self.task_timeout {
            None => Duration::from_secs(2),
            Some(s) => crate::scenario::parse_duration(s)
                .filter(|d| !d.is_zero() && *d <= Duration::from_secs(600))
                .ok_or_else(|| {
                    (
                        format!("task_timeout `{s}` is not a duration up to 10m"),
                        Some("write e.g. 500ms, 2s"),
                    )
                })?,
        };
        let mut iaas_latency = std::collections::BTreeMap::new();
        for (method, d) in &self.iaas_latency {
            if !CPI_METHODS.contains(&method.as_str()) {
                return Err((
                    format!("iaas_latency: `{method}` is not a CPI method"),
                    Some("e.g. create_disk, attach_disk, detach_disk, delete_disk, create_vm, delete_vm"),
                ));
            }
            let d = crate::scenario::parse_duration(d)
                .filter(|d| *d <= Duration::from_secs(3600))
                .ok_or_else(|| {
                    (
                        format!("iaas_latency.{method}: `{d}` is not a duration up to 1h"),
                        Some("write e.g. 500ms, 3s"),
                    )
                })?;
            iaas_latency.insert(method.clone(), d);
        }
        Ok(Bosh {
            iaas_latency,
            deployments,
            nodes,
            storage_classes,
            workers: self.workers,
            client_deployments: self.client_deployments,
            disk_jobs_take_vm_lock: self.disk_jobs_take_vm_lock,
            disk_jobs_take_deployment_lock: self.disk_jobs_take_deployment_lock,
            per_deployment_scoping: self.per_deployment_scoping,
            task_timeout,
            max_volumes_per_node: self.max_volumes_per_node,
            virtual_lanes: self.virtual_lanes.unwrap_or(scale.is_some()),
            scale,
        })
    }
}

/// How a volume may be used (the PVC's access mode).
#[derive(Copy, Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub enum AccessMode {
    /// One node reads and writes.
    #[default]
    ReadWriteOnce,
    /// Many nodes read.
    ReadOnlyMany,
    /// Many nodes read and write (BOSH disks cannot; the driver must refuse).
    ReadWriteMany,
    /// One pod reads and writes.
    ReadWriteOncePod,
}

impl AccessMode {
    /// As Kubernetes spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::ReadWriteOnce => "ReadWriteOnce",
            AccessMode::ReadOnlyMany => "ReadOnlyMany",
            AccessMode::ReadWriteMany => "ReadWriteMany",
            AccessMode::ReadWriteOncePod => "ReadWriteOncePod",
        }
    }
}

fn default_ns() -> String {
    "default".into()
}
/// Empty: the scenario's first StorageClass (resolved by the validator).
fn default_class() -> String {
    String::new()
}
fn one_gi() -> String {
    "1Gi".into()
}

/// `create_volume:` — a PVC the external-provisioner provisions.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct VolumeStep {
    /// PVC name.
    pub name: String,
    /// StorageClass (default: the scenario's first, `bosh` or `standard` unless declared).
    #[serde(default = "default_class")]
    pub class: String,
    /// Namespace (default `default`).
    #[serde(default = "default_ns")]
    pub namespace: String,
    /// Requested size, Kubernetes quantity (default `1Gi`).
    #[serde(default = "one_gi")]
    pub size: String,
    /// Access mode (default ReadWriteOnce).
    #[serde(default)]
    pub access: AccessMode,
}

/// `delete_volume:` — delete a PVC (the PV follows its reclaim policy).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct VolumeRef {
    /// PVC name.
    pub name: String,
    /// Namespace (default `default`).
    #[serde(default = "default_ns")]
    pub namespace: String,
}

/// `publish:` — a pod on a node using a volume: attach, stage, bind-mount.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PublishStep {
    /// Pod name.
    pub pod: String,
    /// PVC name.
    pub volume: String,
    /// Node the pod is scheduled to.
    pub node: String,
    /// Namespace of pod and PVC (default `default`).
    #[serde(default = "default_ns")]
    pub namespace: String,
    /// Mount the volume read-only in the pod.
    #[serde(default)]
    pub read_only: bool,
}

/// `unpublish:` — delete a pod: unmount, unstage, detach.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PodRef {
    /// Pod name.
    pub pod: String,
    /// Namespace (default `default`).
    #[serde(default = "default_ns")]
    pub namespace: String,
}

/// `deploy:` / `rolling_update:` — a Director task on a whole deployment.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DeploymentRef {
    /// Deployment name.
    pub deployment: String,
}

/// `recreate_vm:` — the Director recreates the VM a node runs on.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodeRef {
    /// Node name.
    pub node: String,
}

/// `director_down:` / `director_up:` (no fields; write `{}`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Nothing {}

/// `node_stage:` / `node_publish:` — one CSI node call, as the kubelet would send it,
/// for a volume already attached to the node (outside any pod's lifecycle).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodeCallStep {
    /// PVC name.
    pub volume: String,
    /// Node whose plugin is called.
    pub node: String,
    /// Namespace of the PVC (default `default`).
    #[serde(default = "default_ns")]
    pub namespace: String,
    /// Read-only (node_publish).
    #[serde(default)]
    pub read_only: bool,
}

/// `resend_create_volume:` — the provisioner's CreateVolume for a PVC sent again
/// with another size (the csi-sanity probe for ALREADY_EXISTS).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ResendStep {
    /// PVC name.
    pub name: String,
    /// Namespace (default `default`).
    #[serde(default = "default_ns")]
    pub namespace: String,
    /// The size to ask for this time.
    pub size: String,
}

/// Bytes in a Kubernetes quantity (`1Gi`, `512Mi`, `10G`, `1000`), if it is one.
pub fn parse_quantity(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let mul: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(mul).filter(|b| *b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("1Gi"), Some(1 << 30));
        assert_eq!(parse_quantity("512Mi"), Some(512 << 20));
        assert_eq!(parse_quantity("10G"), Some(10_000_000_000));
        assert_eq!(parse_quantity("0"), None);
        assert_eq!(parse_quantity("1Xi"), None);
        assert_eq!(parse_quantity("99999999999999Ti"), None);
    }
}

/// `write_blocks:` — a workload writes blocks of a volume's disk (the lab's ground truth).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WriteBlocksStep {
    /// PVC name.
    pub volume: String,
    /// Namespace (default `default`).
    #[serde(default = "default_ns")]
    pub namespace: String,
    /// `[first block, count]` pairs (512 KiB blocks).
    pub ranges: Vec<[u64; 2]>,
}

/// `snapshot:` — a VolumeSnapshot of a volume (the lab calls CreateSnapshot as
/// the external-snapshotter would, and binds the VolumeSnapshot to it).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SnapshotStep {
    /// VolumeSnapshot name.
    pub name: String,
    /// PVC name.
    pub volume: String,
    /// Namespace of both (default `default`).
    #[serde(default = "default_ns")]
    pub namespace: String,
}

/// `delete_snapshot:`
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRef {
    /// VolumeSnapshot name.
    pub name: String,
    /// Namespace (default `default`).
    #[serde(default = "default_ns")]
    pub namespace: String,
}

/// Which Kubernetes token a backup client presents to the snapshot-metadata sidecar.
#[derive(Copy, Clone, Debug, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum BackupToken {
    /// The backup service account's token for the service's audience.
    #[default]
    Valid,
    /// The same, expired.
    Expired,
    /// A token for another audience.
    WrongAudience,
    /// A service account without the role to read VolumeSnapshots here.
    NoRole,
    /// Not a token the API server issued.
    Forged,
}

impl BackupToken {
    /// As written in files.
    pub fn as_str(self) -> &'static str {
        match self {
            BackupToken::Valid => "valid",
            BackupToken::Expired => "expired",
            BackupToken::WrongAudience => "wrong-audience",
            BackupToken::NoRole => "no-role",
            BackupToken::Forged => "forged",
        }
    }
}

/// `backup:` — a backup client asks which blocks are allocated in `snapshot`
/// (no `base`) or changed from `base` to `snapshot`, through the sidecar.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BackupStep {
    /// A name for this backup (later steps refer to its session).
    pub name: String,
    /// The target VolumeSnapshot.
    pub snapshot: String,
    /// The base VolumeSnapshot of an incremental backup.
    #[serde(default)]
    pub base: Option<String>,
    /// Namespace of the snapshots (default `default`).
    #[serde(default = "default_ns")]
    pub namespace: String,
    /// The Kubernetes token the client presents (default `valid`).
    #[serde(default)]
    pub token: BackupToken,
    /// Stop reading after this many messages, keeping the stream open, until
    /// a later `resume_backup` reads the rest (so other steps act mid-stream).
    #[serde(default)]
    pub pause_after: Option<u32>,
}

/// `resume_backup:` — the client of a paused backup reads the rest of its
/// stream; when the stream broke (UNAVAILABLE) it reopens it once from the
/// next byte offset with the driver's session token, as a real backup client does.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ResumeStep {
    /// The paused backup.
    pub name: String,
}

/// `replay_session:` — resume a stream with an earlier backup's session token,
/// for another pair of snapshots or after `after` of virtual time.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ReplayStep {
    /// The earlier backup whose session token is replayed.
    pub backup: String,
    /// The target VolumeSnapshot this time.
    pub snapshot: String,
    /// The base VolumeSnapshot this time.
    #[serde(default)]
    pub base: Option<String>,
    /// Namespace (default `default`).
    #[serde(default = "default_ns")]
    pub namespace: String,
    /// Virtual time to let pass first (to replay an expired session).
    #[serde(default)]
    pub after: Option<String>,
}

/// A file holding only a `bosh:` section, as in a scenario (`drivelab serve
/// --system csi --config lab.yaml`); errors as `file:line:col`.
pub fn parse_section(
    path: &std::path::Path,
    text: &str,
) -> Result<Bosh, crate::scenario::ScenarioError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Section {
        #[serde(default)]
        bosh: Option<serde_saphyr::Spanned<RawBosh>>,
    }
    let raw: Section =
        crate::scenario::from_yaml(text).map_err(|e| crate::scenario::yaml_error(path, &e))?;
    let Some(b) = raw.bosh else {
        return Ok(RawBosh::default()
            .resolve()
            .expect("the defaults are valid"));
    };
    let at = serde_saphyr::Spanned::new((), b.referenced, b.defined);
    b.value
        .resolve()
        .map_err(|(m, hint)| crate::scenario::error_at(path, &at, m, hint))
}

impl Default for RawBosh {
    fn default() -> Self {
        RawBosh {
            deployments: Vec::new(),
            nodes: Vec::new(),
            storage_classes: Vec::new(),
            workers: two_workers(),
            client_deployments: Vec::new(),
            disk_jobs_take_vm_lock: true,
            disk_jobs_take_deployment_lock: false,
            per_deployment_scoping: true,
            task_timeout: None,
            iaas_latency: Default::default(),
            max_volumes_per_node: 0,
            scale: None,
            virtual_lanes: None,
        }
    }
}

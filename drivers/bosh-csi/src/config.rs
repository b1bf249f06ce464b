//! Driver configuration, the seeded bugs ("mutants"), and the pure rules the
//! services apply: StorageClass parameters, CSI name → BOSH disk name, capacity
//! ranges → MiB, and which volume capabilities a BOSH disk can serve.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use drivelab_proto::csi::{
    volume_capability::{access_mode::Mode as AccessMode, AccessType},
    CapacityRange, VolumeCapability,
};
use sha2::{Digest, Sha256};

use crate::error::DriverError;
use crate::secret::Secret;

/// One MiB: BOSH disk sizes are whole MiB.
pub const MIB: i64 = 1024 * 1024;
/// Size of a volume whose request names no capacity (1 GiB).
pub const DEFAULT_SIZE_MIB: i64 = 1024;
/// Prefix of every disk name this driver creates; also how it recognises its own.
pub const DISK_NAME_PREFIX: &str = "csi-";
/// Hex digits of sha256(CSI name) in a disk name (128 bits: no accidental collisions).
pub const DISK_NAME_HASH_HEX: usize = 32;
/// The filesystem NodeStage makes when the capability names none.
pub const DEFAULT_FS_TYPE: &str = "ext4";
/// Filesystems the node plugin will make.
pub const SUPPORTED_FS_TYPES: &[&str] = &["ext4", "xfs"];
/// CSI: string fields are at most 128 bytes (node ids and paths are exempt).
pub const MAX_STRING_BYTES: usize = 128;
/// Scopes the driver asks UAA for: exactly the dynamic-disks operations it uses.
pub const NARROW_SCOPES: &[&str] = &[
    "bosh.dynamic-disks.create",
    "bosh.dynamic-disks.attach",
    "bosh.dynamic-disks.detach",
    "bosh.dynamic-disks.delete",
    "bosh.dynamic-disks.list",
];
/// The all-powerful scope; only the `admin-token` mutant asks for it.
pub const ADMIN_SCOPE: &str = "bosh.admin";

/// StorageClass parameter: the Director's disk pool (cloud-config disk type). Required.
pub const P_DISK_POOL: &str = "disk_pool_name";
/// StorageClass parameter: the deployment that owns the disks. Required.
pub const P_DEPLOYMENT: &str = "deployment_name";
/// StorageClass parameter: availability zone of the disks. Optional.
pub const P_AZ: &str = "az";
/// Parameters the CO's sidecars add under this prefix are theirs, not ours.
pub const CO_PARAM_PREFIX: &str = "csi.storage.k8s.io/";

/// Which CSI services a process serves (Identity always).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// Identity + Controller: the plugin beside the provisioner and attacher.
    Controller,
    /// Identity + Node: the plugin on each BOSH instance, beside the kubelet.
    Node,
    /// All three on one socket (tests, single-node setups).
    #[default]
    All,
}

impl Mode {
    /// Parse `controller`, `node` or `all`.
    pub fn parse(s: &str) -> Option<Mode> {
        match s.trim() {
            "controller" => Some(Mode::Controller),
            "node" => Some(Mode::Node),
            "all" => Some(Mode::All),
            _ => None,
        }
    }

    /// Whether the Controller service is served.
    pub fn controller(self) -> bool {
        matches!(self, Mode::Controller | Mode::All)
    }

    /// Whether the Node service is served.
    pub fn node(self) -> bool {
        matches!(self, Mode::Node | Mode::All)
    }
}

/// How the driver is started. `Debug` is safe: the client secret is a [`Secret`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverConfig {
    /// Which services to serve.
    pub mode: Mode,
    /// Director base URL, `http://host:port` (controller).
    pub director_url: String,
    /// UAA base URL; empty means "ask the Director's /info".
    pub uaa_url: String,
    /// UAA client id (controller).
    pub client_id: String,
    /// UAA client secret (controller).
    pub client_secret: Secret,
    /// How often a Director task is polled.
    pub poll_interval: Duration,
    /// How long a Director task may take before the call answers DEADLINE_EXCEEDED.
    pub task_timeout: Duration,
    /// Bound on each single HTTP call (Director, UAA, mount table).
    pub http_timeout: Duration,
    /// This node's id = the BOSH instance id (node).
    pub node_id: String,
    /// Base URL of the node's mount table (node, lab path); empty = real mounts.
    pub mounter_url: String,
    /// NodeGetInfo.max_volumes_per_node (0 = no limit reported).
    pub max_volumes_per_node: i64,
    /// Seeded bugs switched on; empty is the correct driver.
    pub mutants: Vec<Mutant>,
    /// Base URL of the IaaS block API (snapshot metadata); empty = not served.
    pub block_api_url: String,
    /// The IaaS credential for the block API.
    pub block_api_credential: Secret,
    /// Blocks asked per block-API page (the API allows 100..=10000).
    pub block_api_page: u64,
    /// Report snapshot metadata as VARIABLE_LENGTH extents instead of FIXED_LENGTH blocks.
    pub variable_length_metadata: bool,
    /// How long a snapshot-metadata session token stays valid.
    pub session_ttl: Duration,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            mode: Mode::All,
            director_url: String::new(),
            uaa_url: String::new(),
            client_id: String::new(),
            client_secret: Secret::default(),
            poll_interval: Duration::from_secs(1),
            task_timeout: Duration::from_secs(300),
            http_timeout: Duration::from_secs(10),
            node_id: String::new(),
            mounter_url: String::new(),
            max_volumes_per_node: 0,
            mutants: Vec::new(),
            block_api_url: String::new(),
            block_api_credential: Secret::default(),
            block_api_page: 10_000,
            variable_length_metadata: false,
            session_ttl: Duration::from_secs(600),
        }
    }
}

impl DriverConfig {
    /// Whether `m` is switched on.
    pub fn has(&self, m: Mutant) -> bool {
        self.mutants.contains(&m)
    }

    /// Check what the chosen mode needs, before anything is served.
    pub fn validate(&self) -> Result<(), String> {
        if self.mode.controller() {
            if self.director_url.is_empty() {
                return Err("--director-url is required for the controller".into());
            }
            check_http_url("--director-url", &self.director_url)?;
            if !self.uaa_url.is_empty() {
                check_http_url("--uaa-url", &self.uaa_url)?;
            }
            if self.client_id.is_empty() || self.client_secret.is_empty() {
                return Err(
                    "--client-id and --client-secret (or BOSH_CLIENT / BOSH_CLIENT_SECRET) are required for the controller".into(),
                );
            }
        }
        if self.mode.node() {
            if self.node_id.is_empty() {
                return Err(
                    "--node-id (the BOSH instance id) is required for the node plugin".into(),
                );
            }
            if self.node_id.len() > 256 {
                return Err("--node-id is longer than the 256 bytes CSI allows".into());
            }
            if !self.mounter_url.is_empty() {
                check_http_url("--mounter-url", &self.mounter_url)?;
            }
        }
        if self.poll_interval.is_zero() {
            return Err("--poll-interval must be > 0".into());
        }
        Ok(())
    }
}

fn check_http_url(flag: &str, url: &str) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{flag} {url:?} is not a URL ({e}); use http://host:port"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!(
            "{flag} {url:?}: use http://host:port (this build has no TLS stack)"
        ));
    }
    Ok(())
}

/// Parse `250ms`, `5s`, `2m` or a bare number of milliseconds.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, mul) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000)
    } else {
        (s, 1)
    };
    let n: u64 = num.trim().parse().ok()?;
    n.checked_mul(mul).map(Duration::from_millis)
}

/// A seeded bug the lab must be able to catch; the default path is the fixed one.
/// Serialized by its kebab-case [`Mutant::name`], as scenario files write it.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Mutant {
    /// CreateVolume skips the lookup and names each disk with a generation number.
    CreateNotIdempotent,
    /// CreateVolume returns an existing volume whatever size is asked for.
    IgnoreIncompatibleSize,
    /// ControllerPublish detaches the disk from its other node and attaches it here.
    PublishStealsAttachment,
    /// ControllerUnpublish of a volume not attached answers NOT_FOUND.
    UnpublishMissingIsError,
    /// A NodeStage that fails after mounting leaves the staging mount behind.
    LeakMountOnFailedStage,
    /// NodeStage/NodePublish ignore readonly and *_READER_ONLY modes.
    WritableReadonlyPublish,
    /// The token request asks UAA for bosh.admin instead of the dynamic-disks scopes.
    AdminToken,
    /// GetMetadataDelta caches change lists by base snapshot only, so a later
    /// target from the same base gets the earlier target's (stale) delta.
    StaleDelta,
    /// A snapshot-metadata session token is accepted for any client, volume,
    /// snapshot pair and after its expiry.
    ReplayableToken,
    /// NodeUnpublish unmounts but leaves the target directory behind.
    UnpublishLeavesTarget,
    /// ControllerPublish does not check the node's attach limit; the IaaS's
    /// refusal comes back as ABORTED instead of RESOURCE_EXHAUSTED.
    WrongCodeAtAttachLimit,
    /// ValidateVolumeCapabilities without capabilities answers OK.
    MissingFieldAccepted,
    /// ValidateVolumeCapabilities of an unknown volume answers OK (unconfirmed).
    NotFoundAsOk,
    /// ListSnapshots ignores max_entries and returns everything in one page.
    PagingIgnored,
}

impl Mutant {
    /// Every mutant, in declaration order.
    pub fn all() -> &'static [Mutant] {
        &[
            Mutant::CreateNotIdempotent,
            Mutant::IgnoreIncompatibleSize,
            Mutant::PublishStealsAttachment,
            Mutant::UnpublishMissingIsError,
            Mutant::LeakMountOnFailedStage,
            Mutant::WritableReadonlyPublish,
            Mutant::AdminToken,
            Mutant::StaleDelta,
            Mutant::ReplayableToken,
            Mutant::UnpublishLeavesTarget,
            Mutant::WrongCodeAtAttachLimit,
            Mutant::MissingFieldAccepted,
            Mutant::NotFoundAsOk,
            Mutant::PagingIgnored,
        ]
    }

    /// The kebab-case name used on the command line and in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Mutant::CreateNotIdempotent => "create-not-idempotent",
            Mutant::IgnoreIncompatibleSize => "ignore-incompatible-size",
            Mutant::PublishStealsAttachment => "publish-steals-attachment",
            Mutant::UnpublishMissingIsError => "unpublish-missing-is-error",
            Mutant::LeakMountOnFailedStage => "leak-mount-on-failed-stage",
            Mutant::WritableReadonlyPublish => "writable-readonly-publish",
            Mutant::AdminToken => "admin-token",
            Mutant::StaleDelta => "stale-delta",
            Mutant::ReplayableToken => "replayable-token",
            Mutant::UnpublishLeavesTarget => "unpublish-leaves-target",
            Mutant::WrongCodeAtAttachLimit => "wrong-code-at-attach-limit",
            Mutant::MissingFieldAccepted => "missing-field-accepted",
            Mutant::NotFoundAsOk => "not-found-as-ok",
            Mutant::PagingIgnored => "paging-ignored",
        }
    }

    /// One line on what the bug does and which check should catch it.
    pub fn describe(self) -> &'static str {
        match self {
            Mutant::CreateNotIdempotent => {
                "CreateVolume does not look for the name's disk and appends a generation number, so a retried create makes a second disk (no-orphans)"
            }
            Mutant::IgnoreIncompatibleSize => {
                "CreateVolume with a known name returns the existing volume even when its size does not fit the capacity range, instead of ALREADY_EXISTS (spec-codes)"
            }
            Mutant::PublishStealsAttachment => {
                "ControllerPublish of a single-node volume attached to another node detaches it there and attaches here, instead of FAILED_PRECONDITION (single-attach)"
            }
            Mutant::UnpublishMissingIsError => {
                "ControllerUnpublish of a volume that is not attached answers NOT_FOUND instead of OK, so the attacher never finishes (converges)"
            }
            Mutant::LeakMountOnFailedStage => {
                "a NodeStage that fails after its mount does not unmount the staging path (no leaked mounts)"
            }
            Mutant::WritableReadonlyPublish => {
                "NodeStage/NodePublish mount read-write even for readonly publishes and *_READER_ONLY modes (read-only bind mounts)"
            }
            Mutant::AdminToken => {
                "the controller asks UAA for bosh.admin instead of the bosh.dynamic-disks.* scopes (scoped-access / least privilege)"
            }
            Mutant::StaleDelta => {
                "GetMetadataDelta keys its change-list cache on the base snapshot alone, so a newer target reports the older delta and misses the last writes (delta-exact)"
            }
            Mutant::ReplayableToken => {
                "the snapshot-metadata session token is not checked against its client, volume, snapshot pair or expiry, so a replayed token resumes any stream (token-bound)"
            }
            Mutant::UnpublishLeavesTarget => {
                "NodeUnpublishVolume unmounts the target but leaves the directory NodePublishVolume made there (csi-spec: unpublish removes the target path)"
            }
            Mutant::WrongCodeAtAttachLimit => {
                "ControllerPublishVolume does not count the node's attachments against its limit, so the IaaS's refusal comes back ABORTED instead of RESOURCE_EXHAUSTED (csi-spec: attach limit)"
            }
            Mutant::MissingFieldAccepted => {
                "ValidateVolumeCapabilities without volume_capabilities answers OK instead of INVALID_ARGUMENT (csi-spec: missing required fields)"
            }
            Mutant::NotFoundAsOk => {
                "ValidateVolumeCapabilities of a volume that does not exist answers OK (unconfirmed) instead of NOT_FOUND (csi-spec: unknown volume)"
            }
            Mutant::PagingIgnored => {
                "ListSnapshots ignores max_entries and answers every snapshot in one page (csi-spec: paging)"
            }
        }
    }

    /// Parse a kebab-case name (as printed by [`Mutant::name`]).
    pub fn parse(s: &str) -> Option<Mutant> {
        let s = s.trim();
        Mutant::all().iter().copied().find(|m| m.name() == s)
    }
}

impl std::fmt::Display for Mutant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Parsed StorageClass parameters: where the Director puts the disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassParams {
    /// Director disk pool (cloud-config disk type).
    pub disk_pool_name: String,
    /// Deployment owning the disk.
    pub deployment_name: String,
    /// Availability zone, if the class pins one.
    pub az: Option<String>,
}

impl ClassParams {
    /// Parameters as ValidateVolumeCapabilities confirms them.
    pub fn to_map(&self) -> HashMap<String, String> {
        let mut m = HashMap::new();
        m.insert(P_DISK_POOL.to_string(), self.disk_pool_name.clone());
        m.insert(P_DEPLOYMENT.to_string(), self.deployment_name.clone());
        if let Some(az) = &self.az {
            m.insert(P_AZ.to_string(), az.clone());
        }
        m
    }
}

fn invalid(msg: String) -> DriverError {
    DriverError::InvalidArgument(msg)
}

/// Parse and check CreateVolume parameters. Unknown keys are errors (a typo
/// must not silently land a disk in the wrong pool), except the CO's own.
pub fn parse_class_params(params: &HashMap<String, String>) -> Result<ClassParams, DriverError> {
    let sorted: BTreeMap<&String, &String> = params.iter().collect();
    for k in sorted.keys() {
        if ![P_DISK_POOL, P_DEPLOYMENT, P_AZ].contains(&k.as_str())
            && !k.starts_with(CO_PARAM_PREFIX)
        {
            return Err(invalid(format!(
                "unknown StorageClass parameter {k:?}; this driver takes `{P_DISK_POOL}`, `{P_DEPLOYMENT}` and optionally `{P_AZ}`"
            )));
        }
    }
    let get = |k: &str| params.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let disk_pool_name = get(P_DISK_POOL)
        .ok_or_else(|| invalid(format!("StorageClass parameter `{P_DISK_POOL}` is required (a disk type of the Director's cloud config)")))?;
    let deployment_name = get(P_DEPLOYMENT)
        .ok_or_else(|| invalid(format!("StorageClass parameter `{P_DEPLOYMENT}` is required (the deployment that owns the disks)")))?;
    let az = get(P_AZ);
    for (k, v) in [
        (P_DISK_POOL, Some(disk_pool_name)),
        (P_DEPLOYMENT, Some(deployment_name)),
        (P_AZ, az),
    ] {
        if let Some(v) = v {
            if !is_bosh_name(v) {
                return Err(invalid(format!(
                    "StorageClass parameter `{k}` = {v:?} is not a BOSH name (letters, digits, '-', '_', '.'; at most 128 bytes)"
                )));
            }
        }
    }
    Ok(ClassParams {
        disk_pool_name: disk_pool_name.to_string(),
        deployment_name: deployment_name.to_string(),
        az: az.map(str::to_string),
    })
}

/// The names the Director takes for deployments, pools and AZs.
pub fn is_bosh_name(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_STRING_BYTES
        && v.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c))
}

/// The BOSH disk name for a CSI volume name: `csi-` + 32 hex of sha256(name).
/// Deterministic (a retried CreateVolume finds the same disk), within the
/// Director's name rules whatever the CSI name contains, and recognisable.
pub fn disk_name_for(csi_name: &str) -> String {
    let digest = Sha256::digest(csi_name.as_bytes());
    let hex = hex::encode(digest);
    format!("{DISK_NAME_PREFIX}{}", &hex[..DISK_NAME_HASH_HEX])
}

/// Whether `volume_id` is a disk name this driver makes (`csi-<32 hex>`, or
/// with the `-<n>` generation suffix the `create-not-idempotent` mutant adds).
pub fn is_our_volume_id(volume_id: &str) -> bool {
    let Some(rest) = volume_id.strip_prefix(DISK_NAME_PREFIX) else {
        return false;
    };
    let (hash, gen) = match rest.split_once('-') {
        Some((h, g)) => (h, Some(g)),
        None => (rest, None),
    };
    hash.len() == DISK_NAME_HASH_HEX
        && hash
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        && gen
            .is_none_or(|g| !g.is_empty() && g.len() <= 6 && g.bytes().all(|c| c.is_ascii_digit()))
}

/// Check a CSI name: required, at most 128 bytes, none of the control characters the spec bans.
pub fn check_name(field: &str, v: &str) -> Result<(), DriverError> {
    if v.is_empty() {
        return Err(invalid(format!("`{field}` is required")));
    }
    if v.len() > MAX_STRING_BYTES {
        return Err(invalid(format!(
            "`{field}` is {} bytes; CSI allows at most {MAX_STRING_BYTES}",
            v.len()
        )));
    }
    let banned =
        |c: char| matches!(c as u32, 0x00..=0x08 | 0x0B | 0x0C | 0x0E..=0x1F | 0x7F..=0x9F);
    if v.chars().any(banned) {
        return Err(invalid(format!(
            "`{field}` contains a control character CSI bans"
        )));
    }
    Ok(())
}

/// The disk size (MiB) to create for a capacity range: the smallest whole MiB
/// ≥ required_bytes (default 1 GiB), which must not pass limit_bytes.
pub fn size_mib_for(range: Option<&CapacityRange>) -> Result<i64, DriverError> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return Err(invalid("capacity_range bytes must not be negative".into()));
    }
    if limit > 0 && required > limit {
        return Err(invalid(format!(
            "capacity_range.required_bytes {required} > limit_bytes {limit}"
        )));
    }
    let mib = if required > 0 {
        (required + MIB - 1) / MIB
    } else if limit > 0 {
        // No minimum: the default size, shrunk to fit the limit.
        DEFAULT_SIZE_MIB.min(limit / MIB)
    } else {
        DEFAULT_SIZE_MIB
    };
    if mib < 1 || (limit > 0 && mib * MIB > limit) {
        return Err(DriverError::OutOfRange(format!(
            "no whole number of MiB fits capacity_range [{required}, {limit}] bytes (BOSH disks are sized in MiB)"
        )));
    }
    Ok(mib)
}

/// Whether an existing disk of `size_mib` satisfies the capacity range.
pub fn size_fits(size_mib: i64, range: Option<&CapacityRange>) -> bool {
    let bytes = size_mib.saturating_mul(MIB);
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    bytes >= required && (limit == 0 || bytes <= limit)
}

/// The access mode of a capability, defaulting unknown numbers to UNKNOWN.
pub fn access_mode(cap: &VolumeCapability) -> AccessMode {
    cap.access_mode
        .as_ref()
        .and_then(|m| AccessMode::try_from(m.mode).ok())
        .unwrap_or(AccessMode::Unknown)
}

/// Whether the mode only allows reading.
pub fn is_reader_only(mode: AccessMode) -> bool {
    matches!(
        mode,
        AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly
    )
}

/// Why a capability cannot be served by a BOSH disk, or None if it can.
/// A BOSH disk attaches to one VM at a time, so only single-node modes work;
/// the node plugin mounts filesystems only (no raw block publishing).
pub fn unsupported_capability(cap: &VolumeCapability) -> Option<String> {
    match &cap.access_type {
        Some(AccessType::Mount(m)) => {
            if !m.fs_type.is_empty() && !SUPPORTED_FS_TYPES.contains(&m.fs_type.as_str()) {
                return Some(format!(
                    "fs_type {:?} is not supported (use one of {})",
                    m.fs_type,
                    SUPPORTED_FS_TYPES.join(", ")
                ));
            }
        }
        Some(AccessType::Block(_)) => {
            return Some("block access is not supported: this driver publishes filesystems".into())
        }
        None => return Some("volume capability has no access_type (mount or block)".into()),
    }
    match access_mode(cap) {
        AccessMode::SingleNodeWriter
        | AccessMode::SingleNodeReaderOnly
        | AccessMode::SingleNodeSingleWriter
        | AccessMode::SingleNodeMultiWriter => None,
        AccessMode::Unknown => Some("volume capability has no access_mode".into()),
        other => Some(format!(
            "access mode {} is not supported: a BOSH disk attaches to one VM at a time",
            other.as_str_name()
        )),
    }
}

/// Check every capability of a request (at least one required).
pub fn check_capabilities(caps: &[VolumeCapability]) -> Result<(), DriverError> {
    if caps.is_empty() {
        return Err(invalid("`volume_capabilities` is required".into()));
    }
    for c in caps {
        if let Some(why) = unsupported_capability(c) {
            return Err(invalid(why));
        }
    }
    Ok(())
}

/// Check the single capability of a publish/stage request.
pub fn check_capability(cap: Option<&VolumeCapability>) -> Result<&VolumeCapability, DriverError> {
    let cap = cap.ok_or_else(|| invalid("`volume_capability` is required".into()))?;
    match unsupported_capability(cap) {
        Some(why) => Err(invalid(why)),
        None => Ok(cap),
    }
}

/// The filesystem a mount capability asks for (default ext4).
pub fn fs_type(cap: &VolumeCapability) -> &str {
    match &cap.access_type {
        Some(AccessType::Mount(m)) if !m.fs_type.is_empty() => &m.fs_type,
        _ => DEFAULT_FS_TYPE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drivelab_proto::csi::volume_capability::{
        AccessMode as AccessModeMsg, BlockVolume, MountVolume,
    };

    fn p(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    pub(crate) fn mount_cap(mode: AccessMode, fs: &str) -> VolumeCapability {
        VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: fs.into(),
                ..Default::default()
            })),
            access_mode: Some(AccessModeMsg { mode: mode as i32 }),
        }
    }

    #[test]
    fn mutant_names_round_trip() {
        for m in Mutant::all() {
            assert_eq!(Mutant::parse(m.name()), Some(*m));
            assert!(!m.describe().is_empty());
            let json = serde_json::to_string(m).unwrap();
            assert_eq!(json, format!("\"{}\"", m.name()));
            assert_eq!(serde_json::from_str::<Mutant>(&json).unwrap(), *m);
        }
        assert_eq!(Mutant::all().len(), 14);
        assert_eq!(Mutant::parse("nope"), None);
    }

    #[test]
    fn disk_names_are_deterministic_and_ours() {
        let a = disk_name_for("pvc-0f6e7c1a-2b3c-4d5e-8f90-123456789abc");
        assert_eq!(a, disk_name_for("pvc-0f6e7c1a-2b3c-4d5e-8f90-123456789abc"));
        assert_ne!(a, disk_name_for("pvc-other"));
        assert_eq!(a.len(), 4 + 32);
        assert!(is_bosh_name(&a));
        assert!(is_our_volume_id(&a));
        assert!(is_our_volume_id(&format!("{a}-2")));
        // Whatever the CSI name holds, the disk name is tame.
        let weird = disk_name_for("ünïcode / spaces\tand:colons");
        assert!(is_our_volume_id(&weird) && is_bosh_name(&weird));
        for bad in [
            "",
            "csi-",
            "disk-1",
            &a[..20],
            &format!("{a}-"),
            &format!("{a}-x"),
            &a.to_uppercase(),
            "csi-zz",
        ] {
            assert!(!is_our_volume_id(bad), "{bad}");
        }
    }

    #[test]
    fn class_params() {
        let ok = parse_class_params(&p(&[
            ("disk_pool_name", "fast"),
            ("deployment_name", "k8s"),
        ]))
        .unwrap();
        assert_eq!(ok.az, None);
        assert_eq!(ok.disk_pool_name, "fast");
        let with_az = parse_class_params(&p(&[
            ("disk_pool_name", "fast"),
            ("deployment_name", "k8s"),
            ("az", "z1"),
            ("csi.storage.k8s.io/pv/name", "pv-1"),
        ]))
        .unwrap();
        assert_eq!(with_az.az.as_deref(), Some("z1"));
        for (params, needle) in [
            (p(&[("deployment_name", "k8s")]), "disk_pool_name"),
            (p(&[("disk_pool_name", "fast")]), "deployment_name"),
            (
                p(&[("disk_pool_name", "fast"), ("deployment_name", "k 8s")]),
                "deployment_name",
            ),
            (
                p(&[
                    ("disk_pool_name", "fast"),
                    ("deployment_name", "k8s"),
                    ("disk_pool", "x"),
                ]),
                "disk_pool",
            ),
            (
                p(&[("disk_pool_name", " "), ("deployment_name", "k8s")]),
                "disk_pool_name",
            ),
        ] {
            let err = parse_class_params(&params).unwrap_err();
            assert!(
                matches!(&err, DriverError::InvalidArgument(s) if s.contains(needle)),
                "{err}"
            );
        }
    }

    #[test]
    fn capacity() {
        let r = |req, lim| CapacityRange {
            required_bytes: req,
            limit_bytes: lim,
        };
        assert_eq!(size_mib_for(None).unwrap(), DEFAULT_SIZE_MIB);
        assert_eq!(size_mib_for(Some(&r(1, 0))).unwrap(), 1);
        assert_eq!(size_mib_for(Some(&r(MIB, 0))).unwrap(), 1);
        assert_eq!(size_mib_for(Some(&r(MIB + 1, 0))).unwrap(), 2);
        assert_eq!(size_mib_for(Some(&r(0, 10 * MIB))).unwrap(), 10);
        assert_eq!(
            size_mib_for(Some(&r(0, 4 * 1024 * MIB))).unwrap(),
            DEFAULT_SIZE_MIB
        );
        assert!(matches!(
            size_mib_for(Some(&r(MIB + 1, MIB + 2))),
            Err(DriverError::OutOfRange(_))
        ));
        assert!(matches!(
            size_mib_for(Some(&r(0, MIB - 1))),
            Err(DriverError::OutOfRange(_))
        ));
        assert!(matches!(
            size_mib_for(Some(&r(5, 4))),
            Err(DriverError::InvalidArgument(_))
        ));
        assert!(matches!(
            size_mib_for(Some(&r(-1, 0))),
            Err(DriverError::InvalidArgument(_))
        ));
        assert!(size_fits(10, Some(&r(10 * MIB, 0))));
        assert!(size_fits(10, Some(&r(10 * MIB, 10 * MIB))));
        assert!(!size_fits(10, Some(&r(11 * MIB, 0))));
        assert!(!size_fits(10, Some(&r(0, 9 * MIB))));
        assert!(size_fits(10, None));
    }

    #[test]
    fn capabilities() {
        assert!(unsupported_capability(&mount_cap(AccessMode::SingleNodeWriter, "")).is_none());
        assert!(
            unsupported_capability(&mount_cap(AccessMode::SingleNodeReaderOnly, "xfs")).is_none()
        );
        assert!(unsupported_capability(&mount_cap(AccessMode::MultiNodeMultiWriter, "")).is_some());
        assert!(unsupported_capability(&mount_cap(AccessMode::MultiNodeReaderOnly, "")).is_some());
        assert!(unsupported_capability(&mount_cap(AccessMode::Unknown, "")).is_some());
        assert!(unsupported_capability(&mount_cap(AccessMode::SingleNodeWriter, "zfs")).is_some());
        let block = VolumeCapability {
            access_type: Some(AccessType::Block(BlockVolume {})),
            access_mode: Some(AccessModeMsg {
                mode: AccessMode::SingleNodeWriter as i32,
            }),
        };
        assert!(unsupported_capability(&block).is_some());
        let mut none = mount_cap(AccessMode::SingleNodeWriter, "");
        none.access_type = None;
        assert!(unsupported_capability(&none).is_some());
        let mut bogus = mount_cap(AccessMode::SingleNodeWriter, "");
        bogus.access_mode = Some(AccessModeMsg { mode: 99 });
        assert!(unsupported_capability(&bogus).is_some());
        assert!(check_capabilities(&[]).is_err());
        assert_eq!(
            fs_type(&mount_cap(AccessMode::SingleNodeWriter, "")),
            "ext4"
        );
        assert_eq!(
            fs_type(&mount_cap(AccessMode::SingleNodeWriter, "xfs")),
            "xfs"
        );
        assert!(is_reader_only(AccessMode::SingleNodeReaderOnly));
        assert!(!is_reader_only(AccessMode::SingleNodeWriter));
    }

    #[test]
    fn names_follow_the_spec() {
        assert!(check_name("name", "pvc-1").is_ok());
        assert!(check_name("name", "").is_err());
        assert!(check_name("name", &"a".repeat(129)).is_err());
        assert!(check_name("name", "a\u{1}b").is_err());
        assert!(check_name("name", "tab\tok").is_ok());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5ms"), Some(Duration::from_millis(5)));
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("250"), Some(Duration::from_millis(250)));
        for bad in ["", "x", "-1s", "5h", "1.5s"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn config_validation() {
        let mut c = DriverConfig {
            mode: Mode::Controller,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().contains("--director-url"));
        c.director_url = "http://127.0.0.1:1".into();
        assert!(c.validate().unwrap_err().contains("--client-id"));
        c.client_id = "csi".into();
        c.client_secret = Secret::new("s3cr3t");
        assert!(c.validate().is_ok());
        assert!(!format!("{c:?}").contains("s3cr3t"));
        c.director_url = "https://x:1".into();
        assert!(c.validate().is_err());
        let mut n = DriverConfig {
            mode: Mode::Node,
            ..Default::default()
        };
        assert!(n.validate().unwrap_err().contains("--node-id"));
        n.node_id = "i-1".into();
        assert!(n.validate().is_ok());
        n.mounter_url = "127.0.0.1:9".into();
        assert!(n.validate().is_err());
    }
}

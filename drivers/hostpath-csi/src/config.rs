//! Driver configuration, the seeded bugs ("mutants"), and the pure rules the
//! services apply: CSI names → volume and snapshot ids, capacity ranges →
//! bytes, StorageClass parameters, and which volume capabilities a directory serves.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use drivelab_proto::csi::{
    volume_capability::{access_mode::Mode as AccessMode, AccessType},
    CapacityRange, VolumeCapability,
};
use sha2::{Digest, Sha256};

use crate::error::DriverError;

/// One GiB.
pub const GIB: i64 = 1 << 30;
/// Capacity of a volume whose request names none.
pub const DEFAULT_CAPACITY_BYTES: i64 = GIB;
/// The largest volume the driver records (1 TiB, csi-driver-host-path's default).
pub const MAX_CAPACITY_BYTES: i64 = 1024 * GIB;
/// Prefix of every volume id; also how the driver recognises its own.
pub const VOLUME_ID_PREFIX: &str = "hp-";
/// Prefix of every snapshot id.
pub const SNAPSHOT_ID_PREFIX: &str = "hps-";
/// Hex digits of sha256(CSI name) in an id (128 bits: no accidental collisions).
pub const ID_HASH_HEX: usize = 32;
/// CSI: string fields are at most 128 bytes (node ids and paths are exempt).
pub const MAX_STRING_BYTES: usize = 128;
/// Parameters the CO's sidecars add under this prefix are theirs, not ours.
pub const CO_PARAM_PREFIX: &str = "csi.storage.k8s.io/";

/// Which CSI services a process serves (Identity always).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// Identity + Controller.
    Controller,
    /// Identity + Node.
    Node,
    /// All three on one socket.
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

/// How the driver is started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverConfig {
    /// Which services to serve.
    pub mode: Mode,
    /// This node's id (node).
    pub node_id: String,
    /// The backend: volume directories, snapshots and the driver's state.
    /// Controller and node processes on one host share it. Required.
    pub state_dir: PathBuf,
    /// Base URL of the node's mount table, `http://host:port` (node). Required
    /// for the node: this driver never touches the real mount table.
    pub mounter_url: String,
    /// NodeGetInfo.max_volumes_per_node (0 = no limit); ControllerPublish
    /// enforces it with RESOURCE_EXHAUSTED.
    pub max_volumes_per_node: i64,
    /// Seeded bugs switched on; empty is the correct driver.
    pub mutants: Vec<Mutant>,
    /// Bound on each call to the mount table.
    pub http_timeout: Duration,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            mode: Mode::All,
            node_id: String::new(),
            state_dir: PathBuf::new(),
            mounter_url: String::new(),
            max_volumes_per_node: 0,
            mutants: Vec::new(),
            http_timeout: Duration::from_secs(10),
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
        if self.state_dir.as_os_str().is_empty() {
            return Err("--state-dir is required: the directory holding volumes, snapshots and the driver's state".into());
        }
        if self.max_volumes_per_node < 0 {
            return Err("--max-volumes-per-node must be >= 0".into());
        }
        if self.mode.node() {
            if self.node_id.is_empty() {
                return Err("--node-id is required for the node plugin".into());
            }
            if self.node_id.len() > 256 {
                return Err("--node-id is longer than the 256 bytes CSI allows".into());
            }
            if self.mounter_url.is_empty() {
                return Err("--mounter-url is required for the node plugin: hostpath-csi mounts only through the lab's mount table, never the host's".into());
            }
            check_http_url("--mounter-url", &self.mounter_url)?;
        }
        Ok(())
    }
}

fn check_http_url(flag: &str, url: &str) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{flag} {url:?} is not a URL ({e}); use http://host:port"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!("{flag} {url:?}: use http://host:port"));
    }
    Ok(())
}

/// A seeded bug the lab must be able to catch; the default path is the fixed one.
/// Serialized by its kebab-case [`Mutant::name`], as scenario files write it.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Mutant {
    /// CreateVolume skips the name lookup and makes a new directory every call.
    RetryMakesSecondDir,
    /// NodePublish binds read-write whatever `readonly` or the access mode say.
    PublishIgnoresReadonly,
    /// ControllerPublish moves a single-node volume off its other node.
    AttachSteals,
    /// DeleteVolume forgets the volume but leaves its directory.
    DeleteLeavesData,
    /// ControllerGetCapabilities advertises GET_CAPACITY, which answers UNIMPLEMENTED.
    AdvertisedUnimplemented,
    /// A volume restored from a snapshot does not name it as its content_source.
    RestoreIgnoresSource,
    /// A clone of a volume that does not exist is made empty instead of NOT_FOUND.
    CloneMissingSourceEmpty,
}

impl Mutant {
    /// Every mutant, in declaration order.
    pub fn all() -> &'static [Mutant] {
        &[
            Mutant::RetryMakesSecondDir,
            Mutant::PublishIgnoresReadonly,
            Mutant::AttachSteals,
            Mutant::DeleteLeavesData,
            Mutant::AdvertisedUnimplemented,
            Mutant::RestoreIgnoresSource,
            Mutant::CloneMissingSourceEmpty,
        ]
    }

    /// The kebab-case name used on the command line and in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Mutant::RetryMakesSecondDir => "retry-makes-second-dir",
            Mutant::PublishIgnoresReadonly => "publish-ignores-readonly",
            Mutant::AttachSteals => "attach-steals",
            Mutant::DeleteLeavesData => "delete-leaves-data",
            Mutant::AdvertisedUnimplemented => "advertised-unimplemented",
            Mutant::RestoreIgnoresSource => "restore-ignores-source",
            Mutant::CloneMissingSourceEmpty => "clone-missing-source-empty",
        }
    }

    /// One line on what the bug does and which invariant it breaks.
    pub fn describe(self) -> &'static str {
        match self {
            Mutant::RetryMakesSecondDir => {
                "CreateVolume does not look the name up and makes a new directory with a generation-numbered id, so a retried create leaves the first directory behind (idempotent-replay, no-orphans)"
            }
            Mutant::PublishIgnoresReadonly => {
                "NodePublish bind-mounts read-write even when the publish is readonly or the access mode is *_READER_ONLY (read-only-enforced)"
            }
            Mutant::AttachSteals => {
                "ControllerPublish of a single-node volume attached to another node moves the attachment here instead of answering FAILED_PRECONDITION (single-attach, spec-codes)"
            }
            Mutant::DeleteLeavesData => {
                "DeleteVolume answers OK and forgets the volume but leaves its directory and data behind (no-orphans)"
            }
            Mutant::AdvertisedUnimplemented => {
                "ControllerGetCapabilities advertises GET_CAPACITY while GetCapacity answers UNIMPLEMENTED (csi-spec: advertised means implemented)"
            }
            Mutant::RestoreIgnoresSource => {
                "CreateVolume from a snapshot answers a volume whose content_source is unset (csi-spec: restore)"
            }
            Mutant::CloneMissingSourceEmpty => {
                "CreateVolume cloning a volume that does not exist makes an empty volume and answers OK instead of NOT_FOUND (csi-spec: clone)"
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

fn hashed(prefix: &str, name: &str) -> String {
    let digest = hex::encode(Sha256::digest(name.as_bytes()));
    format!("{prefix}{}", &digest[..ID_HASH_HEX])
}

/// The volume id for a CSI name: `hp-` + 32 hex digits of sha256(name), so a
/// retry after a crash finds the directory its first try made.
pub fn volume_id_for(name: &str) -> String {
    hashed(VOLUME_ID_PREFIX, name)
}

/// The snapshot id for a CSI snapshot name: `hps-` + 32 hex digits of sha256(name).
pub fn snapshot_id_for(name: &str) -> String {
    hashed(SNAPSHOT_ID_PREFIX, name)
}

/// Whether `id` has the shape of an id with `prefix` this driver issues (the
/// hash, optionally `-N` as the retry-makes-second-dir mutant makes). Only such
/// ids are ever joined onto the state directory.
fn is_our_id(prefix: &str, id: &str) -> bool {
    let Some(rest) = id.strip_prefix(prefix) else {
        return false;
    };
    let (hash, gen) = match rest.split_once('-') {
        Some((h, g)) => (h, Some(g)),
        None => (rest, None),
    };
    hash.len() == ID_HASH_HEX
        && hash
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        && gen
            .is_none_or(|g| !g.is_empty() && g.len() <= 6 && g.bytes().all(|c| c.is_ascii_digit()))
}

/// Whether `id` is a volume id this driver could have issued.
pub fn is_volume_id(id: &str) -> bool {
    is_our_id(VOLUME_ID_PREFIX, id)
}

/// Whether `id` is a snapshot id this driver could have issued.
pub fn is_snapshot_id(id: &str) -> bool {
    is_our_id(SNAPSHOT_ID_PREFIX, id)
}

fn invalid(msg: String) -> DriverError {
    DriverError::InvalidArgument(msg)
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

/// The driver takes no StorageClass (or VolumeSnapshotClass) parameters: any
/// key but the CO's own `csi.storage.k8s.io/*` is INVALID_ARGUMENT.
pub fn check_params(params: &HashMap<String, String>) -> Result<(), DriverError> {
    let mut unknown: Vec<&str> = params
        .keys()
        .filter(|k| !k.starts_with(CO_PARAM_PREFIX))
        .map(String::as_str)
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    unknown.sort_unstable();
    Err(invalid(format!(
        "unknown parameter(s) {}: hostpath-csi takes none (only the CO's {CO_PARAM_PREFIX}* keys are accepted)",
        unknown.join(", ")
    )))
}

/// The capacity to record for a new volume: `required_bytes` (default 1 GiB,
/// shrunk to `limit_bytes`), raised to `floor` (the size of the content
/// source), within `limit_bytes` and [`MAX_CAPACITY_BYTES`].
pub fn capacity_for(range: Option<&CapacityRange>, floor: i64) -> Result<i64, DriverError> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return Err(invalid("capacity_range bytes must not be negative".into()));
    }
    if limit > 0 && required > limit {
        return Err(invalid(format!(
            "capacity_range.required_bytes {required} > limit_bytes {limit}"
        )));
    }
    let asked = match (required, limit) {
        (0, 0) => DEFAULT_CAPACITY_BYTES,
        (0, l) => DEFAULT_CAPACITY_BYTES.min(l),
        (r, _) => r,
    };
    let bytes = asked.max(floor);
    if limit > 0 && bytes > limit {
        return Err(DriverError::OutOfRange(format!(
            "the content source holds {floor} bytes, more than capacity_range.limit_bytes {limit}"
        )));
    }
    if bytes > MAX_CAPACITY_BYTES {
        return Err(DriverError::OutOfRange(format!(
            "{bytes} bytes asked; hostpath-csi volumes are at most {MAX_CAPACITY_BYTES} bytes"
        )));
    }
    Ok(bytes)
}

/// Whether an existing volume of `bytes` satisfies the capacity range.
pub fn capacity_fits(bytes: i64, range: Option<&CapacityRange>) -> bool {
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

/// Whether the mode allows the volume on one node at a time.
pub fn is_single_node(mode: AccessMode) -> bool {
    matches!(
        mode,
        AccessMode::SingleNodeWriter
            | AccessMode::SingleNodeReaderOnly
            | AccessMode::SingleNodeSingleWriter
            | AccessMode::SingleNodeMultiWriter
    )
}

/// Why a capability cannot be served by a directory, or None if it can.
/// Every access mode is served (a host directory can be bound on any node of
/// the host); raw block is not (a directory is no block device). `fs_type`
/// and `mount_flags` are accepted and not applied: the directory lives on the
/// host's filesystem.
pub fn unsupported_capability(cap: &VolumeCapability) -> Option<String> {
    match &cap.access_type {
        Some(AccessType::Mount(_)) => {}
        Some(AccessType::Block(_)) => {
            return Some(
                "block access is not supported: hostpath-csi volumes are directories".into(),
            )
        }
        None => return Some("volume capability has no access_type (mount or block)".into()),
    }
    match access_mode(cap) {
        AccessMode::Unknown => Some("volume capability has no known access_mode".into()),
        _ => None,
    }
}

/// Check every capability of a request (at least one required).
pub fn check_capabilities(caps: &[VolumeCapability]) -> Result<(), DriverError> {
    if caps.is_empty() {
        return Err(invalid("`volume_capabilities` is required".into()));
    }
    caps.iter()
        .find_map(unsupported_capability)
        .map_or(Ok(()), |why| Err(invalid(why)))
}

/// Check the single capability of a publish/stage request.
pub fn check_capability(cap: Option<&VolumeCapability>) -> Result<&VolumeCapability, DriverError> {
    let cap = cap.ok_or_else(|| invalid("`volume_capability` is required".into()))?;
    match unsupported_capability(cap) {
        Some(why) => Err(invalid(why)),
        None => Ok(cap),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drivelab_proto::csi::volume_capability::{
        AccessMode as AccessModeMsg, BlockVolume, MountVolume,
    };

    pub(crate) fn mount_cap(mode: AccessMode) -> VolumeCapability {
        VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
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
        assert_eq!(Mutant::all().len(), 7);
        assert_eq!(Mutant::parse("nope"), None);
    }

    #[test]
    fn ids_are_deterministic_and_path_safe() {
        let a = volume_id_for("pvc-1");
        assert_eq!(a, volume_id_for("pvc-1"));
        assert_ne!(a, volume_id_for("pvc-2"));
        assert!(is_volume_id(&a) && !is_snapshot_id(&a));
        assert!(is_volume_id(&format!("{a}-2")));
        let s = snapshot_id_for("snap-1");
        assert!(is_snapshot_id(&s) && !is_volume_id(&s));
        for bad in [
            "",
            "hp-",
            "../etc",
            &format!("{a}/x"),
            &format!("{a}-"),
            &a.to_uppercase(),
            "hp-zz",
        ] {
            assert!(!is_volume_id(bad), "{bad}");
        }
    }

    #[test]
    fn params_only_the_cos_own() {
        let p = |k: &str| HashMap::from([(k.to_string(), "x".to_string())]);
        assert!(check_params(&HashMap::new()).is_ok());
        assert!(check_params(&p("csi.storage.k8s.io/pv/name")).is_ok());
        let e = check_params(&p("size")).unwrap_err();
        assert!(
            matches!(&e, DriverError::InvalidArgument(m) if m.contains("size")),
            "{e}"
        );
    }

    #[test]
    fn capacity() {
        let r = |req, lim| CapacityRange {
            required_bytes: req,
            limit_bytes: lim,
        };
        assert_eq!(capacity_for(None, 0).unwrap(), GIB);
        assert_eq!(capacity_for(Some(&r(5, 0)), 0).unwrap(), 5);
        assert_eq!(capacity_for(Some(&r(0, 10)), 0).unwrap(), 10);
        assert_eq!(capacity_for(Some(&r(0, 2 * GIB)), 0).unwrap(), GIB);
        // A content source raises the size, within the limit.
        assert_eq!(capacity_for(Some(&r(5, 0)), 100).unwrap(), 100);
        assert!(matches!(
            capacity_for(Some(&r(5, 50)), 100),
            Err(DriverError::OutOfRange(_))
        ));
        assert!(matches!(
            capacity_for(Some(&r(MAX_CAPACITY_BYTES + 1, 0)), 0),
            Err(DriverError::OutOfRange(_))
        ));
        assert!(matches!(
            capacity_for(Some(&r(5, 4)), 0),
            Err(DriverError::InvalidArgument(_))
        ));
        assert!(matches!(
            capacity_for(Some(&r(-1, 0)), 0),
            Err(DriverError::InvalidArgument(_))
        ));
        assert!(capacity_fits(10, Some(&r(10, 10))));
        assert!(!capacity_fits(10, Some(&r(11, 0))));
        assert!(!capacity_fits(10, Some(&r(0, 9))));
        assert!(capacity_fits(10, None));
    }

    #[test]
    fn capabilities() {
        assert!(unsupported_capability(&mount_cap(AccessMode::SingleNodeWriter)).is_none());
        assert!(unsupported_capability(&mount_cap(AccessMode::MultiNodeMultiWriter)).is_none());
        assert!(unsupported_capability(&mount_cap(AccessMode::Unknown)).is_some());
        let block = VolumeCapability {
            access_type: Some(AccessType::Block(BlockVolume {})),
            access_mode: Some(AccessModeMsg {
                mode: AccessMode::SingleNodeWriter as i32,
            }),
        };
        assert!(unsupported_capability(&block).unwrap().contains("block"));
        let mut none = mount_cap(AccessMode::SingleNodeWriter);
        none.access_type = None;
        assert!(unsupported_capability(&none).is_some());
        assert!(check_capabilities(&[]).is_err());
        assert!(check_capability(None).is_err());
        assert!(is_single_node(AccessMode::SingleNodeMultiWriter));
        assert!(!is_single_node(AccessMode::MultiNodeReaderOnly));
        assert!(is_reader_only(AccessMode::MultiNodeReaderOnly));
    }

    #[test]
    fn config_validation() {
        let mut c = DriverConfig {
            mode: Mode::Controller,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().contains("--state-dir"));
        c.state_dir = "/tmp/hp".into();
        assert!(c.validate().is_ok());
        let mut n = DriverConfig {
            mode: Mode::Node,
            state_dir: "/tmp/hp".into(),
            ..Default::default()
        };
        assert!(n.validate().unwrap_err().contains("--node-id"));
        n.node_id = "node-a".into();
        assert!(n.validate().unwrap_err().contains("--mounter-url"));
        n.mounter_url = "127.0.0.1:9".into();
        assert!(n.validate().is_err());
        n.mounter_url = "http://127.0.0.1:9".into();
        assert!(n.validate().is_ok());
        n.max_volumes_per_node = -1;
        assert!(n.validate().is_err());
    }
}

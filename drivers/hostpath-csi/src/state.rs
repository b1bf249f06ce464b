//! The backend on disk: the state directory's layout, the driver's persisted
//! records (volumes, snapshots, attachments) written atomically as JSON, the
//! node registry, and the lock that serialises every change across processes.
//!
//! ```text
//! <state-dir>/state.json          volumes (by CSI name), snapshots, attachments
//! <state-dir>/state.lock          flock(2)ed around every read-modify-write
//! <state-dir>/volumes/<id>/       a volume's data
//! <state-dir>/snapshots/<id>/     a snapshot: a copy of its volume's directory
//! <state-dir>/nodes/<hash>.json   one per node plugin: its id and volume limit
//! <state-dir>/*/.tmp-<id>/        a copy in progress (removed on start)
//! ```

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write as _};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::DriverError;

/// Version of the state.json layout this build reads and writes.
pub const STATE_VERSION: u32 = 1;
const STATE_FILE: &str = "state.json";
const LOCK_FILE: &str = "state.lock";
const VOLUMES: &str = "volumes";
const SNAPSHOTS: &str = "snapshots";
const NODES: &str = "nodes";
const TMP_PREFIX: &str = ".tmp-";

/// What a volume was made from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ContentSource {
    /// Restored from this snapshot id.
    Snapshot {
        /// The snapshot id.
        id: String,
    },
    /// Cloned from this volume id.
    Volume {
        /// The volume id.
        id: String,
    },
}

/// A volume published to one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// Published read-only (ControllerPublishVolumeRequest.readonly).
    pub readonly: bool,
    /// The access mode it was published with, e.g. `SINGLE_NODE_WRITER`.
    pub access_mode: String,
}

/// One volume: a directory `volumes/<id>` once `ready`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// The volume id.
    pub id: String,
    /// The CSI name it was created for (the idempotency key).
    pub name: String,
    /// Recorded capacity; a directory does not enforce it.
    pub capacity_bytes: i64,
    /// What it was populated from, if anything.
    #[serde(default)]
    pub source: Option<ContentSource>,
    /// False between the intent being recorded and the directory being complete.
    pub ready: bool,
    /// Node id → attachment.
    #[serde(default)]
    pub attachments: BTreeMap<String, Attachment>,
}

/// One snapshot: a directory `snapshots/<id>` once `ready`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// The snapshot id.
    pub id: String,
    /// The CSI name it was created for.
    pub name: String,
    /// The volume it copies.
    pub source_volume_id: String,
    /// The source volume's capacity when taken.
    pub size_bytes: i64,
    /// Creation time, seconds since the epoch.
    pub created_secs: i64,
    /// Creation time, nanoseconds within the second.
    pub created_nanos: i32,
    /// False until the copy is complete.
    pub ready: bool,
}

/// Everything state.json holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Layout version ([`STATE_VERSION`]).
    #[serde(default)]
    pub version: u32,
    /// CSI volume name → volume.
    #[serde(default)]
    pub volumes: BTreeMap<String, VolumeRecord>,
    /// CSI snapshot name → snapshot.
    #[serde(default)]
    pub snapshots: BTreeMap<String, SnapshotRecord>,
}

impl State {
    /// The volume with this id.
    pub fn volume(&self, id: &str) -> Option<&VolumeRecord> {
        self.volumes.values().find(|v| v.id == id)
    }

    /// The volume with this id, to change.
    pub fn volume_mut(&mut self, id: &str) -> Option<&mut VolumeRecord> {
        self.volumes.values_mut().find(|v| v.id == id)
    }

    /// The snapshot with this id.
    pub fn snapshot(&self, id: &str) -> Option<&SnapshotRecord> {
        self.snapshots.values().find(|s| s.id == id)
    }

    /// Volumes attached to `node`.
    pub fn attached_to(&self, node: &str) -> usize {
        self.volumes
            .values()
            .filter(|v| v.attachments.contains_key(node))
            .count()
    }
}

/// A node plugin's registration, written when it starts, so the controller
/// can tell a node that exists from one that does not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node id NodeGetInfo reports.
    pub node_id: String,
    /// Its volume limit (0 = none).
    pub max_volumes_per_node: i64,
}

/// The state directory, opened. Every change goes through [`Backend::transaction`].
#[derive(Debug)]
pub struct Backend {
    root: PathBuf,
    /// Serialises this process's threads before they queue on the flock.
    local: Mutex<()>,
}

/// Holds the directory's flock until dropped (closing the file releases it).
struct Locked {
    _file: File,
}

fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock(2) on a descriptor this File owns for the whole call.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Write `bytes` to `path` so a crash leaves the old or the new file, never half.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_file_name(format!("{TMP_PREFIX}{name}-{}-{seq}", std::process::id()));
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Copy a directory tree (files, directories, symlinks as links).
pub fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&src, &dst)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&src)?, &dst)?;
        } else {
            fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

/// Remove a directory tree; one already gone is fine.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

impl Backend {
    /// Open (creating if needed) the state directory, check its state.json
    /// parses, and remove copies a crash left half done.
    pub fn open(state_dir: &Path) -> Result<Backend, DriverError> {
        for sub in [VOLUMES, SNAPSHOTS, NODES] {
            let dir = state_dir.join(sub);
            fs::create_dir_all(&dir)
                .map_err(|e| DriverError::io(format!("creating {}", dir.display()), e))?;
        }
        // Canonical, so the mount table sees plain absolute bind sources.
        let root = fs::canonicalize(state_dir)
            .map_err(|e| DriverError::io(format!("resolving {}", state_dir.display()), e))?;
        let backend = Backend {
            root,
            local: Mutex::new(()),
        };
        // Under the lock no copy or state write is in progress: a temporary
        // here is a crash's. (nodes/ is written without the lock: left alone.)
        backend.transaction(|txn| {
            for sub in ["", VOLUMES, SNAPSHOTS] {
                txn.backend.remove_tmp(sub)?;
            }
            Ok(())
        })?;
        Ok(backend)
    }

    /// The canonical state directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where volume `id`'s data lives (the id must be one [`crate::config::is_volume_id`] accepts).
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        self.root.join(VOLUMES).join(id)
    }

    /// Where snapshot `id`'s copy lives.
    pub fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.root.join(SNAPSHOTS).join(id)
    }

    fn lock(&self) -> Result<(std::sync::MutexGuard<'_, ()>, Locked), DriverError> {
        let local = self.local.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.root.join(LOCK_FILE);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| DriverError::io(format!("opening {}", path.display()), e))?;
        flock(&file, libc::LOCK_EX)
            .map_err(|e| DriverError::io(format!("locking {}", path.display()), e))?;
        Ok((local, Locked { _file: file }))
    }

    fn load(&self) -> Result<State, DriverError> {
        let path = self.root.join(STATE_FILE);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(State {
                    version: STATE_VERSION,
                    ..State::default()
                })
            }
            Err(e) => return Err(DriverError::io(format!("reading {}", path.display()), e)),
        };
        let state: State = serde_json::from_slice(&bytes).map_err(|e| {
            DriverError::Internal(format!(
                "{} does not parse ({e}); refusing to guess what the backend holds",
                path.display()
            ))
        })?;
        if state.version != STATE_VERSION {
            return Err(DriverError::Internal(format!(
                "{} has layout version {}, this build reads {STATE_VERSION}",
                path.display(),
                state.version
            )));
        }
        Ok(state)
    }

    /// Run `f` on the current state under the directory's lock. `f` persists
    /// with [`Txn::save`] at each point a crash must find (intent before data).
    /// Blocking: call it from a blocking thread.
    pub fn transaction<T>(
        &self,
        f: impl FnOnce(&mut Txn<'_>) -> Result<T, DriverError>,
    ) -> Result<T, DriverError> {
        let _held = self.lock()?;
        let state = self.load()?;
        f(&mut Txn {
            backend: self,
            state,
        })
    }

    /// The state as it is now (under the lock, so never a half-written view).
    pub fn read(&self) -> Result<State, DriverError> {
        self.transaction(|txn| Ok(txn.state.clone()))
    }

    fn remove_tmp(&self, sub: &str) -> Result<(), DriverError> {
        let dir = self.root.join(sub);
        let entries = fs::read_dir(&dir)
            .map_err(|e| DriverError::io(format!("listing {}", dir.display()), e))?;
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                let p = entry.path();
                let r = if p.is_dir() {
                    remove_tree(&p)
                } else {
                    fs::remove_file(&p)
                };
                r.map_err(|e| DriverError::io(format!("removing leftover {}", p.display()), e))?;
                tracing::info!(path = %p.display(), "removed a copy a crash left half done");
            }
        }
        Ok(())
    }

    fn node_file(&self, node_id: &str) -> PathBuf {
        let h = hex::encode(Sha256::digest(node_id.as_bytes()));
        self.root.join(NODES).join(format!("{}.json", &h[..32]))
    }

    /// Record that a node plugin runs (written atomically; a restart rewrites it).
    pub fn register_node(&self, rec: &NodeRecord) -> Result<(), DriverError> {
        let path = self.node_file(&rec.node_id);
        let bytes =
            serde_json::to_vec_pretty(rec).map_err(|e| DriverError::Internal(e.to_string()))?;
        write_atomic(&path, &bytes)
            .map_err(|e| DriverError::io(format!("writing {}", path.display()), e))
    }

    /// The registration of `node_id`, if its node plugin ever started.
    pub fn node(&self, node_id: &str) -> Result<Option<NodeRecord>, DriverError> {
        let path = self.node_file(node_id);
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                DriverError::Internal(format!("{} does not parse: {e}", path.display()))
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(DriverError::io(format!("reading {}", path.display()), e)),
        }
    }

    /// Make `dest` hold a copy of `from` (or an empty directory), all or
    /// nothing: built under a temporary name, then renamed into place. A
    /// `dest` that exists is complete (the rename is the last step) and kept.
    pub fn populate(&self, dest: &Path, from: Option<&Path>) -> Result<(), DriverError> {
        if dest.is_dir() {
            return Ok(());
        }
        let name = dest.file_name().and_then(|n| n.to_str()).unwrap_or("dir");
        let tmp = dest.with_file_name(format!("{TMP_PREFIX}{name}"));
        let ctx = |what: String| format!("{what} {} (for {})", tmp.display(), dest.display());
        remove_tree(&tmp).map_err(|e| DriverError::io(ctx("clearing".into()), e))?;
        match from {
            Some(src) => copy_tree(src, &tmp)
                .map_err(|e| DriverError::io(ctx(format!("copying {} to", src.display())), e))?,
            None => fs::create_dir(&tmp).map_err(|e| DriverError::io(ctx("creating".into()), e))?,
        }
        fs::rename(&tmp, dest).map_err(|e| DriverError::io(ctx("renaming".into()), e))?;
        Ok(())
    }
}

/// One transaction's view of the state; see [`Backend::transaction`].
pub struct Txn<'a> {
    /// The state directory.
    pub backend: &'a Backend,
    /// The state, as loaded under the lock; change it, then [`Txn::save`].
    pub state: State,
}

impl Txn<'_> {
    /// Persist the state atomically (tmp + fsync + rename).
    pub fn save(&mut self) -> Result<(), DriverError> {
        self.state.version = STATE_VERSION;
        let path = self.backend.root.join(STATE_FILE);
        let bytes = serde_json::to_vec_pretty(&self.state)
            .map_err(|e| DriverError::Internal(e.to_string()))?;
        write_atomic(&path, &bytes)
            .map_err(|e| DriverError::io(format!("writing {}", path.display()), e))
    }
}

/// What the backend holds, for the lab's observations and checks: the
/// records and the directories actually on disk (orphans are the difference).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BackendView {
    /// Every volume record, by CSI name.
    pub volumes: Vec<VolumeRecord>,
    /// Every snapshot record, by CSI name.
    pub snapshots: Vec<SnapshotRecord>,
    /// Directory names under volumes/ (ids), sorted.
    pub volume_dirs: Vec<String>,
    /// Directory names under snapshots/ (ids), sorted.
    pub snapshot_dirs: Vec<String>,
    /// Registered node plugins, by node id.
    pub nodes: Vec<NodeRecord>,
}

fn list_dirs(dir: &Path) -> Result<Vec<String>, DriverError> {
    let mut out: Vec<String> = fs::read_dir(dir)
        .map_err(|e| DriverError::io(format!("listing {}", dir.display()), e))?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(TMP_PREFIX))
        .collect();
    out.sort();
    Ok(out)
}

/// Read what the state directory at `state_dir` holds, under its lock,
/// changing nothing (no cleanup, no registration; only the lock file is
/// created if missing). For the lab's observations: orphans are
/// `volume_dirs` that no record's id names.
pub fn inspect(state_dir: &Path) -> Result<BackendView, DriverError> {
    let backend = Backend {
        root: state_dir.to_path_buf(),
        local: Mutex::new(()),
    };
    backend.transaction(|txn| {
        let mut nodes = Vec::new();
        if let Ok(entries) = fs::read_dir(state_dir.join(NODES)) {
            for e in entries.flatten() {
                if let Ok(rec) =
                    fs::read(e.path()).map(|b| serde_json::from_slice::<NodeRecord>(&b))
                {
                    nodes.extend(rec.ok());
                }
            }
        }
        nodes.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        Ok(BackendView {
            volumes: txn.state.volumes.values().cloned().collect(),
            snapshots: txn.state.snapshots.values().cloned().collect(),
            volume_dirs: list_dirs(&state_dir.join(VOLUMES))?,
            snapshot_dirs: list_dirs(&state_dir.join(SNAPSHOTS))?,
            nodes,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_survives_a_reopen_and_leftovers_are_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::open(dir.path()).unwrap();
        b.transaction(|txn| {
            txn.state.volumes.insert(
                "pvc-1".into(),
                VolumeRecord {
                    id: "hp-1".into(),
                    name: "pvc-1".into(),
                    capacity_bytes: 5,
                    source: Some(ContentSource::Snapshot { id: "hps-1".into() }),
                    ready: true,
                    attachments: BTreeMap::new(),
                },
            );
            txn.save()
        })
        .unwrap();
        fs::create_dir(dir.path().join("volumes/.tmp-hp-2")).unwrap();
        drop(b);
        let b = Backend::open(dir.path()).unwrap();
        let st = b.read().unwrap();
        assert_eq!(st.volume("hp-1").unwrap().capacity_bytes, 5);
        assert!(!dir.path().join("volumes/.tmp-hp-2").exists());
        let view = inspect(dir.path()).unwrap();
        assert_eq!(view.volumes.len(), 1);
        assert!(view.volume_dirs.is_empty());
    }

    #[test]
    fn a_corrupt_state_file_is_refused_not_reset() {
        let dir = tempfile::tempdir().unwrap();
        Backend::open(dir.path()).unwrap();
        fs::write(dir.path().join(STATE_FILE), b"{not json").unwrap();
        let e = Backend::open(dir.path()).unwrap_err();
        assert!(e.to_string().contains("does not parse"), "{e}");
    }

    #[test]
    fn populate_is_all_or_nothing_and_copies_trees() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::open(dir.path()).unwrap();
        let src = b.volume_dir("hp-src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("sub/file"), b"data").unwrap();
        std::os::unix::fs::symlink("sub/file", src.join("link")).unwrap();
        let dst = b.snapshot_dir("hps-1");
        b.populate(&dst, Some(&src)).unwrap();
        assert_eq!(fs::read(dst.join("sub/file")).unwrap(), b"data");
        assert_eq!(
            fs::read_link(dst.join("link")).unwrap(),
            Path::new("sub/file")
        );
        // Already there: kept as is.
        fs::write(dst.join("extra"), b"x").unwrap();
        b.populate(&dst, Some(&src)).unwrap();
        assert!(dst.join("extra").exists());
        b.populate(&b.volume_dir("hp-empty"), None).unwrap();
        assert!(b.volume_dir("hp-empty").is_dir());
    }

    #[test]
    fn nodes_register_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::open(dir.path()).unwrap();
        assert_eq!(b.node("node-a").unwrap(), None);
        let rec = NodeRecord {
            node_id: "node-a".into(),
            max_volumes_per_node: 3,
        };
        b.register_node(&rec).unwrap();
        assert_eq!(b.node("node-a").unwrap(), Some(rec));
        assert_eq!(inspect(dir.path()).unwrap().nodes.len(), 1);
    }
}

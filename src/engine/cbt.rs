//! Changed-block tracking in the BOSH lab: the IaaS block API, the fake
//! external-snapshot-metadata sidecar with the Kubernetes token and access
//! reviews, the lab as external-snapshotter (CreateSnapshot/DeleteSnapshot),
//! and the backup client whose every answer is kept beside the ground truth.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context};
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::cpi::{Cpi, BLOCK_SIZE};
use drivelab_fakes::csi::snapshot_metadata::{
    AllocatedRequest, DeltaRequest, SnapshotIndex, SnapshotMetadataSidecar,
};
use drivelab_fakes::csi::DriverConn;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::{Component, EventKind, History};
use drivelab_fakes::kube::review::{Grant, Reviews};
use drivelab_fakes::secret::Secret;
use drivelab_fakes::serve::Listener;
use drivelab_proto::csi::{controller_client::ControllerClient, BlockMetadata};
use rand::Rng;
use rand_chacha::ChaCha20Rng;

use crate::checks::bosh::{BackupRecord, ReplayRecord};
use crate::scenario::{BackupStep, BackupToken, ReplayStep, SnapshotRef, SnapshotStep};

/// The audience the SnapshotMetadataService advertises (tokens are requested for it).
pub const AUDIENCE: &str = "bosh-csi-snapshot-metadata";
/// How long a driver session token lasts (virtual time).
pub const SESSION_TTL: Duration = Duration::from_secs(300);
const BACKUP_NS: &str = "backup";
const BACKUP_SA: &str = "backup-sa";

/// The CBT side of a BOSH lab and what its backups got.
pub(super) struct Cbt {
    sidecar: SnapshotMetadataSidecar,
    reviews: Reviews,
    index: SnapshotIndex,
    snapshotter: DriverConn,
    _block_l: Listener,
    /// (namespace, VolumeSnapshot) → CSI snapshot id.
    snapshots: BTreeMap<(String, String), String>,
    /// Each backup, by name.
    pub backups: BTreeMap<String, BackupRecord>,
    /// Each session replay, in order.
    pub replays: Vec<ReplayRecord>,
    /// The block API credential and every Kubernetes token handed out (for no-secret-leak).
    pub secrets: Vec<Secret>,
    forged: String,
}

impl Cbt {
    /// The sidecar and the snapshotter's connection on the controller's socket.
    pub(super) async fn start(
        controller: &Path,
        clock: &SimClock,
        rng: &mut ChaCha20Rng,
        sidecar_gate: Gate,
        snapshotter_gate: Gate,
        block_l: Listener,
        block_secret: Secret,
    ) -> anyhow::Result<Self> {
        let reviews = Reviews::new(clock.clone(), rng.random());
        // The backup service account may read VolumeSnapshots in the scenario namespace.
        reviews.grant(Grant {
            user: format!("system:serviceaccount:{BACKUP_NS}:{BACKUP_SA}"),
            verb: "get".into(),
            group: "snapshot.storage.k8s.io".into(),
            resource: "volumesnapshots".into(),
            namespace: "default".into(),
        });
        let index = SnapshotIndex::default();
        let sidecar = SnapshotMetadataSidecar::connect(
            controller,
            reviews.clone(),
            index.clone(),
            sidecar_gate,
            AUDIENCE,
        )
        .await
        .context("the snapshot-metadata sidecar could not reach the controller")?;
        let snapshotter =
            DriverConn::connect(controller, Component::CsiSnapshotter, snapshotter_gate)
                .await
                .map_err(|e| anyhow!("the snapshotter could not reach the controller: {e}"))?;
        let forged = format!("forged.{}", super::random_token(rng, 24));
        Ok(Self {
            sidecar,
            reviews,
            index,
            snapshotter,
            _block_l: block_l,
            snapshots: BTreeMap::new(),
            backups: BTreeMap::new(),
            replays: Vec::new(),
            secrets: vec![block_secret],
            forged,
        })
    }

    /// CreateSnapshot as the external-snapshotter sends it; the VolumeSnapshot
    /// is bound to the answer. Returns the reply's code.
    pub(super) async fn snapshot(&mut self, s: &SnapshotStep, handle: &str) -> String {
        let req = drivelab_proto::csi::CreateSnapshotRequest {
            source_volume_id: handle.to_string(),
            name: format!("snapshot-{}-{}", s.namespace, s.name),
            ..Default::default()
        };
        let r = self
            .snapshotter
            .startup("CreateSnapshot", |ch| async move {
                ControllerClient::new(ch).create_snapshot(req).await
            })
            .await;
        match r {
            Ok(resp) => match resp.snapshot {
                Some(snap) => {
                    self.index.bind(&s.namespace, &s.name, &snap.snapshot_id);
                    self.snapshots
                        .insert((s.namespace.clone(), s.name.clone()), snap.snapshot_id);
                    "OK".into()
                }
                None => "INTERNAL".into(),
            },
            Err(e) => code_of(&e),
        }
    }

    /// DeleteSnapshot of a VolumeSnapshot's snapshot (the binding stays, as a
    /// VolumeSnapshot's status would until it is gone).
    pub(super) async fn delete_snapshot(&mut self, s: &SnapshotRef) -> String {
        let Some(id) = self
            .snapshots
            .get(&(s.namespace.clone(), s.name.clone()))
            .cloned()
        else {
            return "NOT_FOUND".into();
        };
        let req = drivelab_proto::csi::DeleteSnapshotRequest {
            snapshot_id: id,
            ..Default::default()
        };
        match self
            .snapshotter
            .startup("DeleteSnapshot", |ch| async move {
                ControllerClient::new(ch).delete_snapshot(req).await
            })
            .await
        {
            Ok(_) => "OK".into(),
            Err(e) => code_of(&e),
        }
    }

    fn token(&mut self, kind: BackupToken, clock: &SimClock) -> String {
        let hour = Duration::from_secs(3600);
        let t = match kind {
            BackupToken::Valid => self
                .reviews
                .issue_token(BACKUP_NS, BACKUP_SA, AUDIENCE, hour),
            BackupToken::Expired => {
                let t = self.reviews.issue_token(
                    BACKUP_NS,
                    BACKUP_SA,
                    AUDIENCE,
                    Duration::from_secs(1),
                );
                clock.advance_to(clock.now().after(Duration::from_secs(2)));
                t
            }
            BackupToken::WrongAudience => {
                self.reviews
                    .issue_token(BACKUP_NS, BACKUP_SA, "someone-else", hour)
            }
            BackupToken::NoRole => self
                .reviews
                .issue_token(BACKUP_NS, "intruder", AUDIENCE, hour),
            BackupToken::Forged => self.forged.clone(),
        };
        self.secrets.push(Secret::new(t.clone()));
        t
    }

    /// One backup: the allocated or changed blocks, drained, beside the ground truth.
    pub(super) async fn backup(
        &mut self,
        step: usize,
        b: &BackupStep,
        history: &History,
        clock: &SimClock,
        cpi: &Cpi,
    ) -> String {
        let token = self.token(b.token, clock);
        let id = |n: &str| {
            self.snapshots
                .get(&(b.namespace.clone(), n.to_string()))
                .cloned()
        };
        let target = id(&b.snapshot);
        let base = b.base.as_deref().and_then(id);
        // The ground truth as the IaaS knows it right now (None: a snapshot is gone).
        let expected = match (&base, &target) {
            (None, Some(t)) if b.base.is_none() => cpi.allocated_blocks(t).ok(),
            (Some(x), Some(t)) => cpi.changed_blocks(x, t).ok(),
            _ => None,
        };
        let from = history.len();
        let got = self
            .stream(
                &token,
                &b.namespace,
                &b.snapshot,
                b.base.as_deref(),
                0,
                None,
            )
            .await;
        let driver_calls = driver_calls_since(history, from);
        history.record(EventKind::Note {
            component: Component::BackupClient,
            text: format!(
                "backup {}: {} blocks reported, answer {}",
                b.name,
                got.blocks.len(),
                got.code
            ),
        });
        let code = got.code.clone();
        self.backups.insert(
            b.name.clone(),
            BackupRecord {
                name: b.name.clone(),
                step,
                token: b.token,
                incremental: b.base.is_some(),
                expected,
                got: got.blocks,
                code: got.code,
                driver_calls,
                session: got.session.map(Secret::new),
                client_token: Secret::new(token),
            },
        );
        code
    }

    /// An earlier backup's session (and its client's Kubernetes token) on
    /// another pair or later; the driver must refuse it.
    pub(super) async fn replay(
        &mut self,
        step: usize,
        r: &ReplayStep,
        history: &History,
        clock: &SimClock,
    ) -> String {
        let Some(orig) = self.backups.get(&r.backup).cloned() else {
            return "NOT_FOUND".into();
        };
        if let Some(d) = r.after.as_deref().and_then(crate::scenario::parse_duration) {
            clock.advance_to(clock.now().after(d));
        }
        let session = orig.session.as_ref().map(|s| s.expose().to_string());
        let got = self
            .stream(
                orig.client_token.expose(),
                &r.namespace,
                &r.snapshot,
                r.base.as_deref(),
                // A resume: only a stream's first call may open a session.
                1,
                session.as_deref(),
            )
            .await;
        history.record(EventKind::Note {
            component: Component::BackupClient,
            text: format!(
                "replayed the session of backup {} on {}: answer {}",
                r.backup, r.snapshot, got.code
            ),
        });
        let code = got.code.clone();
        self.replays.push(ReplayRecord {
            step,
            backup: r.backup.clone(),
            had_session: session.is_some(),
            code: got.code,
        });
        code
    }

    async fn stream(
        &self,
        token: &str,
        ns: &str,
        snapshot: &str,
        base: Option<&str>,
        offset: i64,
        session: Option<&str>,
    ) -> Got {
        let mut got = Got::default();
        let mut tuples: Vec<BlockMetadata> = Vec::new();
        let fail = |e: tonic::Status| code_name(e.code());
        match base {
            None => {
                let req = AllocatedRequest {
                    security_token: token.to_string(),
                    namespace: ns.to_string(),
                    snapshot_name: snapshot.to_string(),
                    starting_offset: offset,
                    max_results: 0,
                };
                match self.sidecar.get_metadata_allocated(req, session).await {
                    Err(e) => got.code = fail(e),
                    Ok(mut s) => {
                        got.session = s.session.clone();
                        got.code = drain(&mut s, &mut tuples, |m| m.block_metadata).await;
                    }
                }
            }
            Some(base) => {
                let req = DeltaRequest {
                    security_token: token.to_string(),
                    namespace: ns.to_string(),
                    base_snapshot_name: base.to_string(),
                    target_snapshot_name: snapshot.to_string(),
                    starting_offset: offset,
                    max_results: 0,
                };
                match self.sidecar.get_metadata_delta(req, session).await {
                    Err(e) => got.code = fail(e),
                    Ok(mut s) => {
                        got.session = s.session.clone();
                        got.code = drain(&mut s, &mut tuples, |m| m.block_metadata).await;
                    }
                }
            }
        }
        got.blocks = blocks_of(&tuples);
        got
    }
}

/// Read a metadata stream to its end into `tuples`; how it ended (`OK` or a code).
async fn drain<T>(
    s: &mut drivelab_fakes::csi::snapshot_metadata::MetadataStream<T>,
    tuples: &mut Vec<BlockMetadata>,
    blocks: fn(T) -> Vec<BlockMetadata>,
) -> String {
    loop {
        match s.next().await {
            Ok(Some(m)) => tuples.extend(blocks(m)),
            Ok(None) => return "OK".into(),
            Err(e) => return code_name(e.code()),
        }
    }
}

#[derive(Default)]
struct Got {
    blocks: Vec<u64>,
    code: String,
    session: Option<String>,
}

/// The blocks a list of (offset, size) tuples covers, in order.
fn blocks_of(tuples: &[BlockMetadata]) -> Vec<u64> {
    let bs = BLOCK_SIZE as i64;
    let mut out = std::collections::BTreeSet::new();
    for t in tuples {
        if t.size_bytes <= 0 || t.byte_offset < 0 {
            continue;
        }
        let first = t.byte_offset / bs;
        let end = (t.byte_offset + t.size_bytes + bs - 1) / bs;
        // A driver reporting absurd ranges must not make the lab allocate them.
        if end - first > 1 << 24 {
            continue;
        }
        out.extend((first..end).map(|b| b as u64));
    }
    out.into_iter().collect()
}

/// Calls the sidecar relayed to the driver since history index `from`.
fn driver_calls_since(history: &History, from: usize) -> usize {
    drivelab_fakes::history::calls(&history.events_from(from))
        .iter()
        .filter(|c| c.from == Component::CsiSnapshotMetadata && c.to == Component::Driver)
        .count()
}

fn code_name(c: tonic::Code) -> String {
    drivelab_fakes::csi::code_name(c)
}

fn code_of(e: &drivelab_fakes::csi::CsiError) -> String {
    match e {
        drivelab_fakes::csi::CsiError::Startup { status, .. } => code_name(status.code()),
        _ => "UNAVAILABLE".into(),
    }
}

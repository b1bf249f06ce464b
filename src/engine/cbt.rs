//! Changed-block tracking in the BOSH lab: the IaaS block API, the fake
//! external-snapshot-metadata sidecar with the Kubernetes token and access
//! reviews, VolumeSnapshots (the fake external-snapshotter makes them real),
//! and the backup client whose every answer is kept beside the ground truth.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context};
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::cpi::{Cpi, BLOCK_SIZE};
use drivelab_fakes::csi::snapshot_metadata::{
    AllocatedRequest, DeltaRequest, SnapshotMetadataService, SnapshotMetadataSidecar,
};
use drivelab_fakes::csi::KubeSlot;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::{Component, EventKind, History};
use drivelab_fakes::json::str_at;
use drivelab_fakes::kube::review::{Grant, Reviews};
use drivelab_fakes::kube::{Kind, KubeFake, SNAPSHOT_API_VERSION};
use drivelab_fakes::secret::Secret;
use drivelab_fakes::serve::Listener;
use drivelab_proto::csi::BlockMetadata;
use serde_json::json;
use rand::Rng;
use rand_chacha::ChaCha20Rng;

use crate::checks::bosh::{BackupRecord, ReplayRecord};
use crate::scenario::{BackupStep, BackupToken, ReplayStep, SnapshotRef, SnapshotStep};

/// The audience the SnapshotMetadataService advertises (tokens are requested for it).
pub const AUDIENCE: &str = "bosh-csi-snapshot-metadata";
/// The VolumeSnapshotClass the lab creates (the driver's default, deletionPolicy Delete).
pub const SNAPSHOT_CLASS: &str = "bosh-snapshots";
/// How long a driver session token lasts (virtual time).
pub const SESSION_TTL: Duration = Duration::from_secs(300);
const BACKUP_NS: &str = "backup";
const BACKUP_SA: &str = "backup-sa";

/// The CBT side of a BOSH lab and what its backups got.
pub(super) struct Cbt {
    sidecar: SnapshotMetadataSidecar,
    reviews: Reviews,
    kube: KubeFake,
    /// The audience read from the SnapshotMetadataService object, as a client finds it.
    audience: String,
    _block_l: Listener,
    /// Each backup, by name.
    pub backups: BTreeMap<String, BackupRecord>,
    /// Each session replay, in order.
    pub replays: Vec<ReplayRecord>,
    /// The block API credential and every Kubernetes token handed out (for no-secret-leak).
    pub secrets: Vec<Secret>,
    forged: String,
}

impl Cbt {
    /// The sidecar on the controller's socket, the default VolumeSnapshotClass
    /// and the SnapshotMetadataService object that advertises the sidecar.
    pub(super) async fn start(
        controller: &Path,
        clock: &SimClock,
        rng: &mut ChaCha20Rng,
        kube: &KubeSlot,
        sidecar_gate: Gate,
        block_l: Listener,
        block_secret: Secret,
    ) -> anyhow::Result<Self> {
        let api = drivelab_fakes::csi::kube_of(kube);
        api.create(
            Kind::VolumeSnapshotClass,
            json!({"apiVersion": SNAPSHOT_API_VERSION, "kind": "VolumeSnapshotClass",
                "metadata": {"name": SNAPSHOT_CLASS, "annotations":
                    {drivelab_fakes::csi::snapshotter::DEFAULT_CLASS: "true"}},
                "driver": bosh_csi::DRIVER_NAME, "deletionPolicy": "Delete"}),
        )
        .map_err(|e| anyhow!("creating VolumeSnapshotClass {SNAPSHOT_CLASS}: {e}"))?;
        let service = SnapshotMetadataService {
            name: bosh_csi::DRIVER_NAME.into(),
            address: "csi-snapshot-metadata.kube-system.svc:6443".into(),
            ca_cert: "-----BEGIN CERTIFICATE-----\nlab\n-----END CERTIFICATE-----\n".into(),
            audience: AUDIENCE.into(),
        };
        let sms = api
            .create(Kind::SnapshotMetadataService, service.to_object())
            .map_err(|e| anyhow!("creating the SnapshotMetadataService: {e}"))?;
        // The backup client learns the audience from the object, as a real one does.
        let audience = str_at(&sms, &["spec", "audience"]);
        let reviews = Reviews::new(clock.clone(), rng.random());
        // The backup service account may read VolumeSnapshots in the scenario namespace.
        reviews.grant(Grant {
            user: format!("system:serviceaccount:{BACKUP_NS}:{BACKUP_SA}"),
            verb: "get".into(),
            group: "snapshot.storage.k8s.io".into(),
            resource: "volumesnapshots".into(),
            namespace: "default".into(),
        });
        let sidecar = SnapshotMetadataSidecar::connect(
            controller,
            reviews.clone(),
            kube.clone(),
            sidecar_gate,
            &service.audience,
        )
        .await
        .context("the snapshot-metadata sidecar could not reach the controller")?;
        let forged = format!("forged.{}", super::random_token(rng, 24));
        Ok(Self {
            sidecar,
            reviews,
            kube: api,
            audience,
            _block_l: block_l,
            backups: BTreeMap::new(),
            replays: Vec::new(),
            secrets: vec![block_secret],
            forged,
        })
    }

    /// Create the VolumeSnapshot of a step (the snapshotter makes it real
    /// when the lab converges); its uid.
    pub(super) fn snapshot(&self, s: &SnapshotStep) -> anyhow::Result<String> {
        let vs = self
            .kube
            .create(
                Kind::VolumeSnapshot,
                json!({"apiVersion": SNAPSHOT_API_VERSION, "kind": "VolumeSnapshot",
                    "metadata": {"name": s.name, "namespace": s.namespace},
                    "spec": {"volumeSnapshotClassName": SNAPSHOT_CLASS,
                        "source": {"persistentVolumeClaimName": s.volume}}}),
            )
            .map_err(|e| anyhow!("creating VolumeSnapshot {}/{}: {e}", s.namespace, s.name))?;
        Ok(str_at(&vs, &["metadata", "uid"]))
    }

    /// Delete the VolumeSnapshot of a step (gone already: nothing to do).
    pub(super) fn delete_snapshot(&self, s: &SnapshotRef) -> anyhow::Result<()> {
        self.kube
            .delete(Kind::VolumeSnapshot, Some(&s.namespace), &s.name)
            .map_err(|e| anyhow!("deleting VolumeSnapshot {}/{}: {e}", s.namespace, s.name))?;
        Ok(())
    }

    /// The CSI snapshot id a VolumeSnapshot is bound to, read as the lab's
    /// ground truth (not through any gate).
    fn handle(&self, ns: &str, name: &str) -> Option<String> {
        let vs = self.kube.get(Kind::VolumeSnapshot, Some(ns), name).ok()??;
        let content = str_at(&vs, &["status", "boundVolumeSnapshotContentName"]);
        let c = self
            .kube
            .get(Kind::VolumeSnapshotContent, None, &content)
            .ok()??;
        Some(str_at(&c, &["status", "snapshotHandle"])).filter(|h| !h.is_empty())
    }

    fn token(&mut self, kind: BackupToken, clock: &SimClock) -> String {
        let hour = Duration::from_secs(3600);
        let t = match kind {
            BackupToken::Valid => self
                .reviews
                .issue_token(BACKUP_NS, BACKUP_SA, &self.audience, hour),
            BackupToken::Expired => {
                let t = self.reviews.issue_token(
                    BACKUP_NS,
                    BACKUP_SA,
                    &self.audience,
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
                .issue_token(BACKUP_NS, "intruder", &self.audience, hour),
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
        let id = |n: &str| self.handle(&b.namespace, n);
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

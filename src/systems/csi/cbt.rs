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
    AllocatedRequest, DeltaRequest, MetadataStream, SnapshotMetadataService,
    SnapshotMetadataSidecar,
};
use drivelab_fakes::csi::KubeSlot;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::{Component, EventKind, History};
use drivelab_fakes::json::str_at;
use drivelab_fakes::kube::review::{Grant, Reviews};
use drivelab_fakes::kube::{Kind, KubeFake, SNAPSHOT_API_VERSION};
use drivelab_fakes::secret::Secret;
use drivelab_fakes::serve::Listener;
use drivelab_proto::csi::{BlockMetadata, GetMetadataAllocatedResponse, GetMetadataDeltaResponse};
use rand::Rng;
use rand_chacha::ChaCha20Rng;
use serde_json::json;

use super::checks::{BackupRecord, ReplayRecord, StreamSegment};
use crate::scenario::{BackupStep, BackupToken, ReplayStep, ResumeStep, SnapshotRef, SnapshotStep};

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
    /// The IaaS block API (the BOSH backend's), which the driver reads changed blocks from.
    _block_l: Option<Listener>,
    /// Each backup, by name.
    pub backups: BTreeMap<String, BackupRecord>,
    /// Each session replay, in order.
    pub replays: Vec<ReplayRecord>,
    /// Backups whose client stopped reading (`pause_after`), streams still open.
    paused: BTreeMap<String, Paused>,
    /// The block API credential and every Kubernetes token handed out (for no-secret-leak).
    pub secrets: Vec<Secret>,
    forged: String,
}

impl Cbt {
    /// The sidecar on the controller's socket, the default VolumeSnapshotClass
    /// and the SnapshotMetadataService object that advertises the sidecar.
    pub(super) async fn start(
        controller: &Path,
        driver_name: &str,
        clock: &SimClock,
        rng: &mut ChaCha20Rng,
        kube: &KubeSlot,
        sidecar_gate: Gate,
        block: Option<(Listener, Secret)>,
    ) -> anyhow::Result<Self> {
        let (block_l, block_secret) = block.unzip();
        let api = drivelab_fakes::csi::kube_of(kube);
        api.create(
            Kind::VolumeSnapshotClass,
            json!({"apiVersion": SNAPSHOT_API_VERSION, "kind": "VolumeSnapshotClass",
                "metadata": {"name": SNAPSHOT_CLASS, "annotations":
                    {drivelab_fakes::csi::snapshotter::DEFAULT_CLASS: "true"}},
                "driver": driver_name, "deletionPolicy": "Delete"}),
        )
        .map_err(|e| anyhow!("creating VolumeSnapshotClass {SNAPSHOT_CLASS}: {e}"))?;
        let service = SnapshotMetadataService {
            name: driver_name.into(),
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
        let forged = format!("forged.{}", crate::engine::random_token(rng, 24));
        Ok(Self {
            sidecar,
            reviews,
            kube: api,
            audience,
            _block_l: block_l,
            backups: BTreeMap::new(),
            replays: Vec::new(),
            paused: BTreeMap::new(),
            secrets: block_secret.into_iter().collect(),
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
            BackupToken::Valid => {
                self.reviews
                    .issue_token(BACKUP_NS, BACKUP_SA, &self.audience, hour)
            }
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
            BackupToken::NoRole => {
                self.reviews
                    .issue_token(BACKUP_NS, "intruder", &self.audience, hour)
            }
            BackupToken::Forged => self.forged.clone(),
        };
        self.secrets.push(Secret::new(t.clone()));
        t
    }

    /// One backup: the allocated or changed blocks beside the ground truth,
    /// drained, or read up to `pause_after` messages and kept open for a
    /// later [`Cbt::resume`]. The answer for `expect: {code}` (`OK` when paused).
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
        let mut tuples = Vec::new();
        let mut session = None;
        let mut paused = None;
        let code = match self
            .open(
                &token,
                &b.namespace,
                &b.snapshot,
                b.base.as_deref(),
                0,
                None,
            )
            .await
        {
            Err(code) => code,
            Ok(mut s) => {
                session = s.session();
                match read(&mut s, &mut tuples, b.pause_after).await {
                    Read::Ended(code) => code,
                    Read::Paused => {
                        paused = Some(s);
                        PAUSED.to_string()
                    }
                }
            }
        };
        let segment = StreamSegment {
            starting_offset: 0,
            blocks: blocks_of(&tuples).len(),
            code: code.clone(),
        };
        let record = BackupRecord {
            name: b.name.clone(),
            step,
            token: b.token,
            incremental: b.base.is_some(),
            expected,
            got: blocks_of(&tuples),
            code: code.clone(),
            driver_calls: driver_calls_since(history, from),
            session: session.map(Secret::new),
            client_token: Secret::new(token.clone()),
            segments: vec![segment],
        };
        let answer = match paused {
            Some(stream) => {
                history.record(EventKind::Note {
                    component: Component::BackupClient,
                    text: format!(
                        "backup {}: paused after {} messages ({} blocks so far), stream kept open",
                        b.name,
                        b.pause_after.unwrap_or(0),
                        record.got.len()
                    ),
                });
                self.paused.insert(
                    b.name.clone(),
                    Paused {
                        stream,
                        tuples,
                        token,
                        namespace: b.namespace.clone(),
                        snapshot: b.snapshot.clone(),
                        base: b.base.clone(),
                    },
                );
                // The stream is open and healthy so far.
                "OK".to_string()
            }
            None => {
                note_ended(history, &b.name, record.got.len(), &code);
                code
            }
        };
        // Recorded while paused too: its tokens must be redacted from then on.
        self.backups.insert(b.name.clone(), record);
        answer
    }

    /// The client of a paused backup reads the rest of its stream. When the
    /// stream broke (UNAVAILABLE: the sidecar restarted, say) it reopens it
    /// once from the next byte offset with the driver's session token, as
    /// the real backup client does; the record keeps both segments and the
    /// union of their blocks.
    pub(super) async fn resume(&mut self, r: &ResumeStep, history: &History) -> String {
        let Some(mut p) = self.paused.remove(&r.name) else {
            // It ended before its pause point: there is nothing left to read.
            let code = self
                .backups
                .get(&r.name)
                .map(|b| b.code.clone())
                .unwrap_or_else(|| "NOT_FOUND".into());
            history.record(EventKind::Note {
                component: Component::BackupClient,
                text: format!(
                    "backup {}: had already ended ({code}), nothing to resume",
                    r.name
                ),
            });
            return code;
        };
        let from = history.len();
        let mut segments = Vec::new();
        let before = blocks_of(&p.tuples).len();
        let mut code = drain(&mut p.stream, &mut p.tuples).await;
        segments.push(StreamSegment {
            starting_offset: -1,
            blocks: blocks_of(&p.tuples).len() - before,
            code: code.clone(),
        });
        if code == "UNAVAILABLE" {
            let offset = next_offset(&p.tuples);
            history.record(EventKind::Note {
                component: Component::BackupClient,
                text: format!(
                    "backup {}: the stream broke (UNAVAILABLE) after {} blocks; resuming from byte offset {offset} with the session token",
                    r.name,
                    blocks_of(&p.tuples).len()
                ),
            });
            let session = self
                .backups
                .get(&r.name)
                .and_then(|b| b.session.as_ref())
                .map(|s| s.expose().to_string());
            let before = blocks_of(&p.tuples).len();
            code = match self
                .open(
                    &p.token,
                    &p.namespace,
                    &p.snapshot,
                    p.base.as_deref(),
                    offset,
                    session.as_deref(),
                )
                .await
            {
                Err(c) => c,
                Ok(mut s) => drain(&mut s, &mut p.tuples).await,
            };
            segments.push(StreamSegment {
                starting_offset: offset,
                blocks: blocks_of(&p.tuples).len() - before,
                code: code.clone(),
            });
        }
        let got = blocks_of(&p.tuples);
        note_ended(history, &r.name, got.len(), &code);
        let calls = driver_calls_since(history, from);
        if let Some(rec) = self.backups.get_mut(&r.name) {
            rec.got = got;
            rec.code = code.clone();
            rec.driver_calls += calls;
            rec.segments.extend(segments);
        }
        code
    }

    /// Restart the snapshot-metadata sidecar: its open streams die.
    pub(super) async fn restart_sidecar(&self) -> anyhow::Result<()> {
        self.sidecar
            .restart()
            .await
            .context("the restarted snapshot-metadata sidecar could not reach the controller")
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
        let opened = self
            .open(
                orig.client_token.expose(),
                &r.namespace,
                &r.snapshot,
                r.base.as_deref(),
                // A resume: only a stream's first call may open a session.
                1,
                session.as_deref(),
            )
            .await;
        let code = match opened {
            Err(code) => code,
            Ok(mut s) => drain(&mut s, &mut Vec::new()).await,
        };
        history.record(EventKind::Note {
            component: Component::BackupClient,
            text: format!(
                "replayed the session of backup {} on {}: answer {}",
                r.backup, r.snapshot, code
            ),
        });
        self.replays.push(ReplayRecord {
            step,
            backup: r.backup.clone(),
            had_session: session.is_some(),
            code: code.clone(),
        });
        code
    }

    /// Open a stream through the sidecar: allocated blocks without `base`,
    /// changed blocks with it. A refusal comes back as its code.
    async fn open(
        &self,
        token: &str,
        ns: &str,
        snapshot: &str,
        base: Option<&str>,
        offset: i64,
        session: Option<&str>,
    ) -> Result<OpenStream, String> {
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
                self.sidecar
                    .get_metadata_allocated(req, session)
                    .await
                    .map(OpenStream::Allocated)
                    .map_err(fail)
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
                self.sidecar
                    .get_metadata_delta(req, session)
                    .await
                    .map(OpenStream::Delta)
                    .map_err(fail)
            }
        }
    }
}

/// How a backup's stream ended in the record while its client is paused.
const PAUSED: &str = "PAUSED";

/// A backup whose client stopped reading, and what it needs to go on.
struct Paused {
    stream: OpenStream,
    tuples: Vec<BlockMetadata>,
    token: String,
    namespace: String,
    snapshot: String,
    base: Option<String>,
}

/// A metadata stream of either kind, opened through the sidecar.
enum OpenStream {
    Allocated(MetadataStream<GetMetadataAllocatedResponse>),
    Delta(MetadataStream<GetMetadataDeltaResponse>),
}

impl OpenStream {
    /// The next message's tuples; `Ok(None)` at the end.
    async fn next(&mut self) -> Result<Option<Vec<BlockMetadata>>, tonic::Status> {
        match self {
            OpenStream::Allocated(s) => Ok(s.next().await?.map(|m| m.block_metadata)),
            OpenStream::Delta(s) => Ok(s.next().await?.map(|m| m.block_metadata)),
        }
    }

    /// The driver's session token for resuming.
    fn session(&self) -> Option<String> {
        match self {
            OpenStream::Allocated(s) => s.session.clone(),
            OpenStream::Delta(s) => s.session.clone(),
        }
    }
}

/// Where a read stopped.
enum Read {
    /// The stream ended: `OK` or the code it failed with.
    Ended(String),
    /// `limit` messages read, the stream still open.
    Paused,
}

/// Read up to `limit` messages (all without one) into `tuples`.
async fn read(s: &mut OpenStream, tuples: &mut Vec<BlockMetadata>, limit: Option<u32>) -> Read {
    let mut n = 0;
    loop {
        if limit.is_some_and(|k| n >= k) {
            return Read::Paused;
        }
        match s.next().await {
            Ok(Some(m)) => tuples.extend(m),
            Ok(None) => return Read::Ended("OK".into()),
            Err(e) => return Read::Ended(code_name(e.code())),
        }
        n += 1;
    }
}

/// Read a stream to its end into `tuples`; how it ended (`OK` or a code).
async fn drain(s: &mut OpenStream, tuples: &mut Vec<BlockMetadata>) -> String {
    match read(s, tuples, None).await {
        Read::Ended(code) => code,
        Read::Paused => unreachable!("a read without a limit never pauses"),
    }
}

/// The history line of a backup whose stream ended.
fn note_ended(history: &History, name: &str, blocks: usize, code: &str) {
    history.record(EventKind::Note {
        component: Component::BackupClient,
        text: format!("backup {name}: {blocks} blocks reported, answer {code}"),
    });
}

/// The byte offset just past the last block a client received: where a
/// real client resumes a broken stream.
fn next_offset(tuples: &[BlockMetadata]) -> i64 {
    tuples
        .iter()
        .map(|t| t.byte_offset.saturating_add(t.size_bytes))
        .max()
        .unwrap_or(0)
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

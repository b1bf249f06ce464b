//! Snapshots and changed-block tracking end to end, in-process on one virtual
//! clock: fake Director + CPI with block-level disks, the CPI's IaaS block API
//! on loopback, the bosh-csi controller (Controller + SnapshotMetadata) on a
//! Unix socket, the fake external-snapshot-metadata sidecar with the Kubernetes
//! fake's TokenReview/SubjectAccessReview. Every change list is compared with
//! the CPI's ground truth; the two snapshot-metadata mutants must be caught.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bosh_csi::{BoshCsiDriver, DriverConfig, Mode, Mutant, Secret};
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::cpi::{BlockRange, Cpi, CpiConfig, BLOCK_SIZE};
use drivelab_fakes::csi::snapshot_metadata::{
    AllocatedRequest, DeltaRequest, SnapshotMetadataService, SnapshotMetadataSidecar,
};
use drivelab_fakes::director::{
    ClientConfig, DeploymentConfig, Director, DirectorConfig, DiskPoolConfig, InstanceGroupConfig,
};
use drivelab_fakes::gate::{CallSpec, Delivery, Gate, GateHook, Verdict};
use drivelab_fakes::history::{calls, CallId, History, Outcome};
use drivelab_fakes::kube::review::{Grant, Reviews};
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::{MemStore, Store};
use drivelab_proto::csi::{
    controller_client::ControllerClient, volume_capability, BlockMetadata, BlockMetadataType,
    CapacityRange, CreateSnapshotRequest, CreateVolumeRequest, DeleteSnapshotRequest,
    ListSnapshotsRequest, VolumeCapability,
};
use tonic::transport::Channel;
use tonic::Code;

const CLIENT: &str = "bosh-csi";
const SECRET: &str = "bosh-csi-client-secret";
const IAAS_CRED: &str = "iaas-block-api-credential";
const AUDIENCE: &str = "bosh-csi-snapshot-metadata";
const NS: &str = "app";
const BACKUP_NS: &str = "backup";
const BACKUP_SA: &str = "backup-sa";
const GIB: i64 = 1 << 30;
const SESSION_TTL: Duration = Duration::from_secs(300);

type BoxFut<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Holds the n-th call with `op` until released (to delete a snapshot while
/// a stream is between two IaaS pages, deterministically).
#[derive(Default)]
struct Hold {
    op: Mutex<Option<(&'static str, usize)>>,
    seen: AtomicUsize,
    release: tokio::sync::Notify,
    held: tokio::sync::Notify,
}

impl GateHook for Hold {
    fn before<'a>(&'a self, _: CallId, call: &'a CallSpec) -> BoxFut<'a, Verdict> {
        Box::pin(async move {
            let want = *self.op.lock().unwrap();
            if let Some((op, n)) = want {
                if call.op == op && self.seen.fetch_add(1, Ordering::SeqCst) + 1 == n {
                    let r = self.release.notified();
                    self.held.notify_one();
                    r.await;
                }
            }
            Verdict::Proceed
        })
    }
    fn after<'a>(&'a self, _: CallId, _: &'a CallSpec, _: &'a Outcome) -> BoxFut<'a, Delivery> {
        Box::pin(async { Delivery::Deliver })
    }
}

#[derive(Clone)]
struct Setup {
    mutants: Vec<Mutant>,
    variable: bool,
    page: u64,
    credential: &'static str,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            mutants: vec![],
            variable: false,
            page: 10_000,
            credential: IAAS_CRED,
        }
    }
}

struct Lab {
    clock: SimClock,
    gate: Gate,
    hold: Arc<Hold>,
    cpi: Cpi,
    director: Director,
    ctl: ControllerClient<Channel>,
    sidecar: SnapshotMetadataSidecar,
    reviews: Reviews,
    kube: drivelab_fakes::kube::KubeFake,
    service: SnapshotMetadataService,
    _ls: Vec<Listener>,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Lab {
    async fn start(s: Setup) -> Lab {
        let clock = SimClock::new();
        let gate = Gate::new(History::new(clock.clone()));
        let hold = Arc::new(Hold::default());
        gate.set_hook(hold.clone());
        let cpi = Cpi::new(
            Arc::new(MemStore::default()) as Arc<dyn Store>,
            gate.clone(),
            CpiConfig::default(),
        );
        let config = DirectorConfig {
            deployments: vec![DeploymentConfig {
                name: "k8s".into(),
                instance_groups: vec![InstanceGroupConfig {
                    name: "worker".into(),
                    instances: 1,
                    azs: vec!["z1".into()],
                }],
            }],
            disk_pools: vec![DiskPoolConfig {
                name: "default".into(),
                cloud_properties: serde_json::json!({}),
            }],
            clients: vec![ClientConfig {
                id: CLIENT.into(),
                secret: drivelab_fakes::secret::Secret::new(SECRET),
                scopes: bosh_csi::config::NARROW_SCOPES
                    .iter()
                    .map(|x| x.to_string())
                    .collect(),
                deployments: vec![],
            }],
            dynamic_disks_workers: 2,
            ..Default::default()
        };
        let director = Director::new(
            Arc::new(MemStore::default()) as Arc<dyn Store>,
            gate.clone(),
            cpi.clone(),
            config,
        )
        .await
        .unwrap();
        let director_l = director.serve(loopback()).await.unwrap();
        let block_l = cpi
            .serve_block_api(loopback(), drivelab_fakes::secret::Secret::new(IAAS_CRED))
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let socket: PathBuf = dir.path().join("controller.sock");
        let driver = BoshCsiDriver::new(DriverConfig {
            mode: Mode::Controller,
            director_url: director_l.url(),
            client_id: CLIENT.into(),
            client_secret: Secret::new(SECRET),
            poll_interval: Duration::from_millis(5),
            task_timeout: Duration::from_secs(20),
            mutants: s.mutants.clone(),
            block_api_url: block_l.url(),
            block_api_credential: Secret::new(s.credential),
            block_api_page: s.page,
            variable_length_metadata: s.variable,
            session_ttl: SESSION_TTL,
            ..Default::default()
        })
        .unwrap();
        let c = clock.clone();
        driver.set_clock(Arc::new(move || c.now().0));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let sock = socket.clone();
        tokio::spawn(async move {
            bosh_csi::serve_driver(driver, &sock, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let mut channel = None;
        for _ in 0..500 {
            if let Ok(c) = drivelab_fakes::csi::connect_unix(&socket).await {
                channel = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let reviews = Reviews::new(clock.clone(), 7);
        reviews.grant(Grant {
            user: format!("system:serviceaccount:{BACKUP_NS}:{BACKUP_SA}"),
            verb: "get".into(),
            group: "snapshot.storage.k8s.io".into(),
            resource: "volumesnapshots".into(),
            namespace: NS.into(),
        });
        let kube = drivelab_fakes::kube::in_memory(gate.clone(), 7).unwrap();
        let sidecar = SnapshotMetadataSidecar::connect(
            &socket,
            reviews.clone(),
            Arc::new(std::sync::RwLock::new(kube.clone())),
            gate.clone(),
            AUDIENCE,
        )
        .await
        .unwrap();
        Lab {
            clock,
            gate,
            hold,
            cpi,
            director,
            ctl: ControllerClient::new(channel.expect("driver socket")),
            sidecar,
            reviews,
            kube,
            service: SnapshotMetadataService {
                name: bosh_csi::DRIVER_NAME.into(),
                address: "snapshot-metadata.csi.svc:6443".into(),
                ca_cert: "-----BEGIN CERTIFICATE-----\nlab\n-----END CERTIFICATE-----\n".into(),
                audience: AUDIENCE.into(),
            },
            _ls: vec![director_l, block_l],
            _dir: dir,
            _stop: stop,
        }
    }

    /// A token for the backup service account, as the client would get it
    /// (TokenRequest with the SnapshotMetadataService's audience).
    fn token(&self) -> String {
        let aud = self.service.audience.clone();
        self.reviews
            .issue_token(BACKUP_NS, BACKUP_SA, &aud, Duration::from_secs(3600))
    }

    /// A volume of `gib` GiB: (volume id, disk cid).
    async fn volume(&mut self, name: &str, gib: i64) -> (String, String) {
        let v = self
            .ctl
            .create_volume(CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: gib * GIB,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![VolumeCapability {
                    access_mode: Some(volume_capability::AccessMode {
                        mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                    }),
                    access_type: Some(volume_capability::AccessType::Mount(
                        volume_capability::MountVolume {
                            fs_type: "ext4".into(),
                            ..Default::default()
                        },
                    )),
                }],
                parameters: [
                    ("disk_pool_name".to_string(), "default".to_string()),
                    ("deployment_name".to_string(), "k8s".to_string()),
                ]
                .into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id;
        let cid = self
            .director
            .disks()
            .into_iter()
            .find(|d| d.name == v)
            .unwrap()
            .cid;
        (v, cid)
    }

    /// CreateSnapshot, then bind the VolumeSnapshot `name` in `ns` to it.
    async fn snap(&mut self, vol: &str, name: &str, ns: &str) -> String {
        let id = self
            .ctl
            .create_snapshot(CreateSnapshotRequest {
                source_volume_id: vol.into(),
                name: format!("snapshot-{ns}-{name}"),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap()
            .snapshot_id;
        drivelab_fakes::csi::snapshotter::pre_provisioned(
            &self.kube,
            bosh_csi::DRIVER_NAME,
            ns,
            name,
            &id,
        )
        .unwrap();
        id
    }

    fn write(&self, disk: &str, ranges: &[(u64, u64)]) {
        let r: Vec<BlockRange> = ranges
            .iter()
            .map(|(s, c)| BlockRange {
                start: *s,
                count: *c,
            })
            .collect();
        self.cpi.write_blocks(disk, &r).unwrap();
    }

    fn driver_calls(&self, op: &str) -> usize {
        calls(&self.gate.history().events())
            .iter()
            .filter(|c| c.op == op)
            .count()
    }
}

/// What a drained stream gave.
#[derive(Debug, Default)]
struct Got {
    tuples: Vec<BlockMetadata>,
    kind: Option<i32>,
    capacity: i64,
    error: Option<Code>,
    session: Option<String>,
}

impl Got {
    fn blocks(&self) -> Vec<u64> {
        let bs = BLOCK_SIZE as i64;
        let mut out = BTreeSet::new();
        for t in &self.tuples {
            let first = t.byte_offset / bs;
            let end = (t.byte_offset + t.size_bytes + bs - 1) / bs;
            out.extend((first..end).map(|b| b as u64));
        }
        out.into_iter().collect()
    }

    /// The spec's stream rules: strictly increasing, no overlap, one type.
    fn check_order(&self, starting_offset: i64) {
        let mut end = starting_offset;
        for (i, t) in self.tuples.iter().enumerate() {
            assert!(t.size_bytes > 0, "tuple {i} is empty");
            if i == 0 {
                assert!(starting_offset < t.byte_offset + t.size_bytes);
            } else {
                assert!(t.byte_offset >= end, "tuple {i} overlaps its predecessor");
            }
            end = t.byte_offset + t.size_bytes;
        }
    }
}

async fn delta(
    lab: &Lab,
    token: &str,
    ns: &str,
    base: &str,
    target: &str,
    offset: i64,
    max: i32,
    session: Option<&str>,
) -> Result<Got, tonic::Status> {
    let mut s = lab
        .sidecar
        .get_metadata_delta(
            DeltaRequest {
                security_token: token.into(),
                namespace: ns.into(),
                base_snapshot_name: base.into(),
                target_snapshot_name: target.into(),
                starting_offset: offset,
                max_results: max,
            },
            session,
        )
        .await?;
    let mut got = Got {
        session: s.session.clone(),
        ..Default::default()
    };
    loop {
        match s.next().await {
            Ok(Some(m)) => {
                assert!(max == 0 || m.block_metadata.len() <= max as usize);
                got.kind.get_or_insert(m.block_metadata_type);
                assert_eq!(got.kind, Some(m.block_metadata_type));
                got.capacity = m.volume_capacity_bytes;
                got.tuples.extend(m.block_metadata);
            }
            Ok(None) => break,
            Err(e) => {
                got.error = Some(e.code());
                break;
            }
        }
    }
    Ok(got)
}

async fn allocated(lab: &Lab, token: &str, snap: &str) -> Got {
    let mut s = lab
        .sidecar
        .get_metadata_allocated(
            AllocatedRequest {
                security_token: token.into(),
                namespace: NS.into(),
                snapshot_name: snap.into(),
                starting_offset: 0,
                max_results: 0,
            },
            None,
        )
        .await
        .unwrap();
    let mut got = Got::default();
    while let Some(m) = s.next().await.unwrap() {
        got.kind.get_or_insert(m.block_metadata_type);
        got.capacity = m.volume_capacity_bytes;
        got.tuples.extend(m.block_metadata);
    }
    got
}

/// Full backup, then two incrementals from the same base; true when every
/// change list equals the ground truth.
async fn backups_exact(s: Setup) -> bool {
    let mut lab = Lab::start(s.clone()).await;
    let tok = lab.token();
    let (vol, disk) = lab.volume("pvc-data", 1).await;
    lab.write(&disk, &[(0, 10), (100, 1), (2000, 48)]);
    let s1 = lab.snap(&vol, "s1", NS).await;
    let full = allocated(&lab, &tok, "s1").await;
    full.check_order(0);
    assert_eq!(full.capacity, GIB);
    let want_kind = if s.variable {
        BlockMetadataType::VariableLength
    } else {
        BlockMetadataType::FixedLength
    } as i32;
    assert_eq!(full.kind, Some(want_kind));
    let mut ok = full.blocks() == lab.cpi.allocated_blocks(&s1).unwrap();

    lab.write(&disk, &[(5, 10), (700, 3)]);
    let s2 = lab.snap(&vol, "s2", NS).await;
    let d12 = delta(&lab, &tok, NS, "s1", "s2", 0, 7, None).await.unwrap();
    d12.check_order(0);
    assert_eq!(d12.error, None);
    ok &= d12.blocks() == lab.cpi.changed_blocks(&s1, &s2).unwrap();

    // The last writes: only a delta computed against the right base sees them.
    lab.write(&disk, &[(1500, 2), (2047, 1)]);
    let s3 = lab.snap(&vol, "s3", NS).await;
    let d13 = delta(&lab, &tok, NS, "s1", "s3", 0, 0, None).await.unwrap();
    d13.check_order(0);
    ok &= d13.blocks() == lab.cpi.changed_blocks(&s1, &s3).unwrap();
    let d23 = delta(&lab, &tok, NS, "s2", "s3", 0, 0, None).await.unwrap();
    ok &= d23.blocks() == lab.cpi.changed_blocks(&s2, &s3).unwrap();
    ok
}

#[tokio::test]
async fn full_and_incremental_backups_equal_the_ground_truth() {
    assert!(backups_exact(Setup::default()).await);
    assert!(
        backups_exact(Setup {
            variable: true,
            ..Default::default()
        })
        .await
    );
    // Small IaaS pages: the driver must follow NextToken.
    assert!(
        backups_exact(Setup {
            page: 100,
            ..Default::default()
        })
        .await
    );
}

#[tokio::test]
async fn stale_delta_mutant_is_caught() {
    assert!(
        !backups_exact(Setup {
            mutants: vec![Mutant::StaleDelta],
            ..Default::default()
        })
        .await
    );
}

#[tokio::test]
async fn create_snapshot_is_idempotent_by_name() {
    let mut lab = Lab::start(Setup::default()).await;
    let (a, _) = lab.volume("pvc-a", 1).await;
    let (b, _) = lab.volume("pvc-b", 1).await;
    let req = |v: &str| CreateSnapshotRequest {
        source_volume_id: v.into(),
        name: "snap-1".into(),
        ..Default::default()
    };
    let one = lab.ctl.create_snapshot(req(&a)).await.unwrap().into_inner();
    let two = lab.ctl.create_snapshot(req(&a)).await.unwrap().into_inner();
    assert_eq!(one, two);
    let e = lab.ctl.create_snapshot(req(&b)).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    let e = lab.ctl.create_snapshot(req("csi-nope")).await.unwrap_err();
    assert_eq!(
        e.code(),
        Code::AlreadyExists,
        "the name is taken whatever the source"
    );
    let id = one.snapshot.unwrap().snapshot_id;
    let list = lab
        .ctl
        .list_snapshots(ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.entries.len(), 1);
    for _ in 0..2 {
        lab.ctl
            .delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    assert!(lab.cpi.snapshots().is_empty());
}

#[tokio::test]
async fn stream_restarts_from_starting_offset_with_its_session() {
    let mut lab = Lab::start(Setup::default()).await;
    let tok = lab.token();
    let (vol, disk) = lab.volume("pvc-data", 1).await;
    lab.write(&disk, &[(0, 1)]);
    let s1 = lab.snap(&vol, "s1", NS).await;
    lab.write(&disk, &[(10, 5), (300, 5), (900, 5)]);
    let s2 = lab.snap(&vol, "s2", NS).await;
    let truth = lab.cpi.changed_blocks(&s1, &s2).unwrap();

    // Read one message, then break off.
    let mut s = lab
        .sidecar
        .get_metadata_delta(
            DeltaRequest {
                security_token: tok.clone(),
                namespace: NS.into(),
                base_snapshot_name: "s1".into(),
                target_snapshot_name: "s2".into(),
                starting_offset: 0,
                max_results: 4,
            },
            None,
        )
        .await
        .unwrap();
    let session = s.session.clone().expect("the driver opens a session");
    let first = s.next().await.unwrap().unwrap().block_metadata;
    drop(s);
    let last = first.last().unwrap();
    let resume_at = last.byte_offset + last.size_bytes;

    // Without the session a resumption is refused.
    let e = delta(&lab, &tok, NS, "s1", "s2", resume_at, 4, None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);

    let rest = delta(&lab, &tok, NS, "s1", "s2", resume_at, 4, Some(&session))
        .await
        .unwrap();
    rest.check_order(resume_at);
    let mut all = Got {
        tuples: first,
        ..Default::default()
    };
    all.tuples.extend(rest.tuples);
    all.check_order(0);
    assert_eq!(all.blocks(), truth);

    // Hostile offsets: negative and far past the end.
    let e = delta(&lab, &tok, NS, "s1", "s2", -1, 0, None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = delta(&lab, &tok, NS, "s1", "s2", i64::MAX, 0, Some(&session))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange);
}

/// Replays a session token of volume A on volume B, and after its expiry;
/// returns (replay refused, expired refused).
async fn replay(mutants: Vec<Mutant>) -> (bool, bool) {
    let mut lab = Lab::start(Setup {
        mutants,
        ..Default::default()
    })
    .await;
    let tok = lab.token();
    let (va, da) = lab.volume("pvc-a", 1).await;
    let (vb, db) = lab.volume("pvc-b", 1).await;
    for (v, d, p) in [(&va, &da, "a"), (&vb, &db, "b")] {
        lab.write(d, &[(0, 2)]);
        lab.snap(v, &format!("{p}1"), NS).await;
        lab.write(d, &[(50, 2)]);
        lab.snap(v, &format!("{p}2"), NS).await;
    }
    let a = delta(&lab, &tok, NS, "a1", "a2", 0, 0, None).await.unwrap();
    let session = a.session.unwrap();
    let replay = delta(&lab, &tok, NS, "b1", "b2", 1, 0, Some(&session)).await;
    let replay_refused = matches!(&replay, Err(e) if e.code() == Code::PermissionDenied);

    lab.clock
        .advance_to(lab.clock.now().after(SESSION_TTL + Duration::from_secs(1)));
    let late = delta(&lab, &tok, NS, "a1", "a2", 1, 0, Some(&session)).await;
    let expired_refused = matches!(&late, Err(e) if e.code() == Code::Unauthenticated);
    (replay_refused, expired_refused)
}

#[tokio::test]
async fn session_tokens_are_bound_and_expire() {
    assert_eq!(replay(vec![]).await, (true, true));
}

#[tokio::test]
async fn replayable_token_mutant_is_caught() {
    assert_eq!(replay(vec![Mutant::ReplayableToken]).await, (false, false));
}

#[tokio::test]
async fn the_sidecar_refuses_before_any_driver_call() {
    let mut lab = Lab::start(Setup::default()).await;
    let (vol, disk) = lab.volume("pvc-data", 1).await;
    lab.write(&disk, &[(0, 2)]);
    lab.snap(&vol, "s1", NS).await;
    lab.snap(&vol, "o1", "other").await;
    lab.write(&disk, &[(9, 2)]);
    lab.snap(&vol, "s2", NS).await;
    lab.snap(&vol, "o2", "other").await;
    let good = lab.token();

    let forged = format!("{good}x");
    let e = delta(&lab, &forged, NS, "s1", "s2", 0, 0, None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(!e.message().contains(&good), "the token must not be echoed");

    let wrong_aud = lab.reviews.issue_token(
        BACKUP_NS,
        BACKUP_SA,
        "kube-apiserver",
        Duration::from_secs(60),
    );
    let e = delta(&lab, &wrong_aud, NS, "s1", "s2", 0, 0, None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);

    // Snapshots of a namespace the client has no role in.
    let e = delta(&lab, &good, "other", "o1", "o2", 0, 0, None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // Names of another namespace do not resolve in this one.
    let e = delta(&lab, &good, NS, "o1", "o2", 0, 0, None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    let short = lab
        .reviews
        .issue_token(BACKUP_NS, BACKUP_SA, AUDIENCE, Duration::from_secs(10));
    lab.clock
        .advance_to(lab.clock.now().after(Duration::from_secs(11)));
    let e = delta(&lab, &short, NS, "s1", "s2", 0, 0, None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);

    assert_eq!(lab.driver_calls("GetMetadataDelta"), 0);
    assert!(lab.driver_calls("tokenreviews.create") >= 4);
    // And the good token still works.
    let ok = delta(&lab, &good, NS, "s1", "s2", 0, 0, None)
        .await
        .unwrap();
    assert_eq!(ok.error, None);
    assert_eq!(lab.driver_calls("GetMetadataDelta"), 1);
}

#[tokio::test]
async fn snapshot_deleted_mid_stream_fails_the_stream() {
    let mut lab = Lab::start(Setup {
        page: 100,
        ..Default::default()
    })
    .await;
    let tok = lab.token();
    let (vol, disk) = lab.volume("pvc-data", 1).await;
    lab.write(&disk, &[(0, 300)]);
    let s1 = lab.snap(&vol, "s1", NS).await;
    let truth = lab.cpi.allocated_blocks(&s1).unwrap();
    // Hold the stream's second IaaS page (the first is read when it opens).
    *lab.hold.op.lock().unwrap() = Some(("ebs.ListSnapshotBlocks", 2));
    let mut s = lab
        .sidecar
        .get_metadata_allocated(
            AllocatedRequest {
                security_token: tok,
                namespace: NS.into(),
                snapshot_name: "s1".into(),
                starting_offset: 0,
                max_results: 10,
            },
            None,
        )
        .await
        .unwrap();
    lab.hold.held.notified().await;
    lab.ctl
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: s1.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    lab.hold.release.notify_one();
    let mut got = Got::default();
    let err = loop {
        match s.next().await {
            Ok(Some(m)) => got.tuples.extend(m.block_metadata),
            Ok(None) => break None,
            Err(e) => break Some(e.code()),
        }
    };
    assert_eq!(err, Some(Code::NotFound));
    // What came before the failure is a true prefix, never invented blocks.
    let b = got.blocks();
    assert_eq!(b, truth[..b.len()].to_vec());
    assert_eq!(b.len(), 100);
}

#[tokio::test]
async fn the_block_api_refuses_a_wrong_credential() {
    let mut lab = Lab::start(Setup {
        credential: "not-the-iaas-credential",
        ..Default::default()
    })
    .await;
    let tok = lab.token();
    let (vol, disk) = lab.volume("pvc-data", 1).await;
    lab.write(&disk, &[(0, 2)]);
    lab.snap(&vol, "s1", NS).await;
    let e = lab
        .sidecar
        .get_metadata_allocated(
            AllocatedRequest {
                security_token: tok,
                namespace: NS.into(),
                snapshot_name: "s1".into(),
                ..Default::default()
            },
            None,
        )
        .await
        .err()
        .expect("refused");
    assert_eq!(e.code(), Code::Internal);
    assert!(!e.message().contains(IAAS_CRED));
}

/// `cargo test -p bosh-csi --test cbt -- --ignored --nocapture delta_throughput`
#[tokio::test]
#[ignore]
async fn delta_throughput() {
    let mut lab = Lab::start(Setup::default()).await;
    let tok = lab.token();
    let (vol, disk) = lab.volume("pvc-big", 64).await;
    lab.write(&disk, &[(0, 1)]);
    lab.snap(&vol, "s1", NS).await;
    // Every other block of 64 GiB: 65536 changed blocks, none coalescible.
    let ranges: Vec<(u64, u64)> = (0..65_536u64).map(|i| (i * 2, 1)).collect();
    lab.write(&disk, &ranges);
    lab.snap(&vol, "s2", NS).await;
    let t = std::time::Instant::now();
    let got = delta(&lab, &tok, NS, "s1", "s2", 0, 1000, None)
        .await
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    let n = got.blocks().len();
    assert!(n >= 65_536);
    println!(
        "delta stream: {n} blocks in {secs:.3}s = {:.0} blocks/s",
        n as f64 / secs
    );
}

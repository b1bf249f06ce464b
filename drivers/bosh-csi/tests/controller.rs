//! The controller on a Unix socket, called through a tonic client, against
//! the lab's real fake Director (fakes::director, with its fake UAA and CPI)
//! on loopback. Checks the CSI idempotency rules and that each controller
//! mutant visibly breaks the rule it seeds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bosh_csi::{DriverConfig, Mode, Mutant, Secret};
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::cpi::{Cpi, CpiConfig};
use drivelab_fakes::director::{
    ClientConfig, DeploymentConfig, Director, DirectorConfig, DiskPoolConfig, InstanceGroupConfig,
};
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::{calls, History};
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::{MemStore, Store};
use drivelab_proto::csi::{
    controller_client::ControllerClient, volume_capability, CapacityRange,
    ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest, CreateVolumeRequest,
    DeleteVolumeRequest, ValidateVolumeCapabilitiesRequest, VolumeCapability,
};
use tonic::transport::Channel;
use tonic::Code;

use volume_capability::access_mode::Mode as M;

const CLIENT: &str = "bosh-csi";
const SECRET: &str = "bosh-csi-client-secret";
const GIB: i64 = 1 << 30;

struct Lab {
    director: Director,
    gate: Gate,
    ctl: ControllerClient<Channel>,
    nodes: Vec<String>,
    _director_l: Listener,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

struct Setup {
    mutants: Vec<Mutant>,
    workers: usize,
    scopes: Vec<&'static str>,
    client_deployments: Vec<&'static str>,
    per_deployment_scoping: bool,
    secret: &'static str,
    task_timeout: Duration,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            mutants: vec![],
            workers: 2,
            scopes: vec![
                "bosh.dynamic-disks.create",
                "bosh.dynamic-disks.attach",
                "bosh.dynamic-disks.detach",
                "bosh.dynamic-disks.delete",
                "bosh.dynamic-disks.list",
            ],
            client_deployments: vec![],
            per_deployment_scoping: false,
            secret: SECRET,
            task_timeout: Duration::from_secs(20),
        }
    }
}

impl Lab {
    async fn start(mutants: &[Mutant]) -> Lab {
        Lab::with(Setup {
            mutants: mutants.to_vec(),
            ..Default::default()
        })
        .await
    }

    async fn with(s: Setup) -> Lab {
        let gate = Gate::new(History::new(SimClock::new()));
        let cpi = Cpi::new(
            Arc::new(MemStore::default()) as Arc<dyn Store>,
            gate.clone(),
            CpiConfig::default(),
        );
        let config = DirectorConfig {
            deployments: ["k8s", "other"]
                .iter()
                .map(|d| DeploymentConfig {
                    name: d.to_string(),
                    instance_groups: vec![InstanceGroupConfig {
                        name: "worker".into(),
                        instances: 2,
                        azs: vec!["z1".into()],
                    }],
                })
                .collect(),
            disk_pools: ["default", "fast"]
                .iter()
                .map(|p| DiskPoolConfig {
                    name: p.to_string(),
                    cloud_properties: serde_json::json!({}),
                })
                .collect(),
            clients: vec![ClientConfig {
                id: CLIENT.into(),
                secret: drivelab_fakes::secret::Secret::new(SECRET),
                scopes: s.scopes.iter().map(|x| x.to_string()).collect(),
                deployments: s.client_deployments.iter().map(|x| x.to_string()).collect(),
            }],
            per_deployment_scoping: s.per_deployment_scoping,
            dynamic_disks_workers: s.workers,
            ..Default::default()
        };
        let director = Director::new(
            Arc::new(MemStore::default()) as Arc<dyn Store>,
            gate.clone(),
            cpi,
            config,
        )
        .await
        .unwrap();
        let director_l = director.serve(loopback()).await.unwrap();
        let nodes = director
            .instances()
            .into_iter()
            .filter(|i| i.deployment == "k8s")
            .map(|i| i.id)
            .collect::<Vec<_>>();
        assert_eq!(nodes.len(), 2);

        let dir = tempfile::tempdir().unwrap();
        let socket: PathBuf = dir.path().join("csi.sock");
        let config = DriverConfig {
            mode: Mode::Controller,
            director_url: director_l.url(),
            client_id: CLIENT.into(),
            client_secret: Secret::new(s.secret),
            poll_interval: Duration::from_millis(5),
            task_timeout: s.task_timeout,
            mutants: s.mutants,
            ..Default::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let sock = socket.clone();
        tokio::spawn(async move {
            bosh_csi::serve_unix(config, &sock, async {
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
        Lab {
            director,
            gate,
            ctl: ControllerClient::new(channel.expect("driver socket")),
            nodes,
            _director_l: director_l,
            _dir: dir,
            _stop: stop,
        }
    }

    async fn create(&mut self, req: CreateVolumeRequest) -> Result<String, tonic::Status> {
        self.ctl
            .create_volume(req)
            .await
            .map(|r| r.into_inner().volume.unwrap().volume_id)
    }

    async fn publish(&mut self, id: &str, node: &str) -> Result<String, tonic::Status> {
        self.ctl
            .controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: id.into(),
                node_id: node.into(),
                volume_capability: Some(cap(M::SingleNodeWriter)),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().publish_context["disk_cid"].clone())
    }

    async fn unpublish(&mut self, id: &str, node: &str) -> Result<(), tonic::Status> {
        self.ctl
            .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                volume_id: id.into(),
                node_id: node.into(),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    async fn delete(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.ctl
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.into(),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    fn attached_to(&self, id: &str) -> Option<String> {
        self.director
            .disks()
            .into_iter()
            .find(|d| d.name == id)
            .and_then(|d| d.instance_id)
    }

    fn token_requests(&self) -> usize {
        calls(&self.gate.history().events())
            .iter()
            .filter(|c| c.op == "oauth.token")
            .count()
    }
}

fn cap(mode: M) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(Default::default())),
        access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
    }
}

fn create(name: &str, bytes: i64, pool: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap(M::SingleNodeWriter)],
        parameters: [
            ("disk_pool_name".to_string(), pool.to_string()),
            ("deployment_name".to_string(), "k8s".to_string()),
        ]
        .into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn create_is_idempotent_and_checks_compatibility() {
    let mut lab = Lab::start(&[]).await;
    let a = lab.create(create("pvc-1", GIB, "default")).await.unwrap();
    let b = lab.create(create("pvc-1", GIB, "default")).await.unwrap();
    assert_eq!(a, b);
    assert_eq!(a, bosh_csi::config::disk_name_for("pvc-1"));
    let disks = lab.director.disks();
    assert_eq!(disks.len(), 1);
    assert_eq!(disks[0].size_mib, 1024);
    assert_eq!(disks[0].deployment, "k8s");
    assert_eq!(disks[0].metadata["csi_volume_name"], "pvc-1");
    // A smaller request fits the existing disk; a bigger one or another pool does not.
    assert_eq!(
        lab.create(create("pvc-1", GIB / 2, "default"))
            .await
            .unwrap(),
        a
    );
    for req in [
        create("pvc-1", 2 * GIB, "default"),
        create("pvc-1", GIB, "fast"),
    ] {
        let e = lab.create(req).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists, "{e}");
    }
    assert_eq!(lab.director.disks().len(), 1);
    // An unknown pool is the caller's mistake.
    let e = lab.create(create("pvc-2", GIB, "nope")).await.unwrap_err();
    assert_ne!(e.code(), Code::Ok);
    // The driver asked UAA once and reused the token.
    assert_eq!(lab.token_requests(), 1);
}

#[tokio::test]
async fn mutant_ignore_incompatible_size_is_visible() {
    let mut lab = Lab::start(&[Mutant::IgnoreIncompatibleSize]).await;
    let a = lab.create(create("pvc-1", GIB, "default")).await.unwrap();
    assert_eq!(
        lab.create(create("pvc-1", 2 * GIB, "default"))
            .await
            .unwrap(),
        a
    );
}

#[tokio::test]
async fn mutant_create_not_idempotent_is_visible() {
    let mut lab = Lab::start(&[Mutant::CreateNotIdempotent]).await;
    let a = lab.create(create("pvc-1", GIB, "default")).await.unwrap();
    let b = lab.create(create("pvc-1", GIB, "default")).await.unwrap();
    assert_ne!(a, b);
    assert_eq!(
        lab.director.disks().len(),
        2,
        "a retried create made a second disk"
    );
}

#[tokio::test]
async fn publish_unpublish_and_delete() {
    let mut lab = Lab::start(&[]).await;
    let (n1, n2) = (lab.nodes[0].clone(), lab.nodes[1].clone());
    let id = lab.create(create("pvc-1", GIB, "default")).await.unwrap();
    let cid = lab.publish(&id, &n1).await.unwrap();
    assert_eq!(cid, lab.director.disks()[0].cid);
    assert_eq!(lab.attached_to(&id).as_deref(), Some(n1.as_str()));
    // Same node again: OK. Another node: FAILED_PRECONDITION, attachment untouched.
    assert_eq!(lab.publish(&id, &n1).await.unwrap(), cid);
    assert_eq!(
        lab.publish(&id, &n2).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    assert_eq!(lab.attached_to(&id).as_deref(), Some(n1.as_str()));
    // Unknown volume: NOT_FOUND.
    let ghost = bosh_csi::config::disk_name_for("never-created");
    assert_eq!(
        lab.publish(&ghost, &n1).await.unwrap_err().code(),
        Code::NotFound
    );
    // Deleting an attached volume is refused.
    assert_eq!(
        lab.delete(&id).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    // Unpublish from the node it is not on: OK, and nothing detached.
    lab.unpublish(&id, &n2).await.unwrap();
    assert_eq!(lab.attached_to(&id).as_deref(), Some(n1.as_str()));
    lab.unpublish(&id, &n1).await.unwrap();
    assert_eq!(lab.attached_to(&id), None);
    lab.unpublish(&id, &n1).await.unwrap();
    lab.unpublish(&ghost, &n1).await.unwrap();
    // Unknown node (the Director's AttachDiskErrorUnknownInstance): NOT_FOUND.
    let e = lab.publish(&id, "no-such-instance").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    assert_eq!(lab.attached_to(&id), None);
    // Unknown node (the Director's AttachDiskErrorUnknownInstance): NOT_FOUND.
    let e = lab.publish(&id, "no-such-instance").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    assert_eq!(lab.attached_to(&id), None);
    // Now it can move.
    lab.publish(&id, &n2).await.unwrap();
    lab.unpublish(&id, "").await.unwrap();
    lab.delete(&id).await.unwrap();
    lab.delete(&id).await.unwrap();
    assert!(lab.director.disks().is_empty());
    // Validate on a gone volume: NOT_FOUND.
    let e = lab
        .ctl
        .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: id.clone(),
            volume_capabilities: vec![cap(M::SingleNodeWriter)],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

#[tokio::test]
async fn validate_capabilities() {
    let mut lab = Lab::start(&[]).await;
    let id = lab.create(create("pvc-1", GIB, "default")).await.unwrap();
    let v = |caps: Vec<VolumeCapability>| {
        let id = id.clone();
        let mut ctl = lab.ctl.clone();
        async move {
            ctl.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                volume_id: id,
                volume_capabilities: caps,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
        }
    };
    assert!(v(vec![cap(M::SingleNodeWriter)]).await.confirmed.is_some());
    let no = v(vec![cap(M::SingleNodeWriter), cap(M::MultiNodeMultiWriter)]).await;
    assert!(no.confirmed.is_none() && !no.message.is_empty());
}

#[tokio::test]
async fn mutant_publish_steals_attachment_is_visible() {
    let mut lab = Lab::start(&[Mutant::PublishStealsAttachment]).await;
    let (n1, n2) = (lab.nodes[0].clone(), lab.nodes[1].clone());
    let id = lab.create(create("pvc-1", GIB, "default")).await.unwrap();
    lab.publish(&id, &n1).await.unwrap();
    lab.publish(&id, &n2).await.unwrap();
    assert_eq!(
        lab.attached_to(&id).as_deref(),
        Some(n2.as_str()),
        "moved away from a live node"
    );
}

#[tokio::test]
async fn mutant_unpublish_missing_is_error_is_visible() {
    let mut lab = Lab::start(&[Mutant::UnpublishMissingIsError]).await;
    let n1 = lab.nodes[0].clone();
    let id = lab.create(create("pvc-1", GIB, "default")).await.unwrap();
    assert_eq!(
        lab.unpublish(&id, &n1).await.unwrap_err().code(),
        Code::NotFound
    );
}

#[tokio::test]
async fn feature_off_times_out_then_converges_without_a_duplicate() {
    let mut lab = Lab::with(Setup {
        workers: 0,
        task_timeout: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    // 0 disk workers: the task stays queued; the CO is told to retry.
    let e = lab
        .create(create("pvc-1", GIB, "default"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    assert!(lab.director.disks().is_empty());
    lab.director.set_dynamic_disks_workers(1);
    // Retries until the queued task (or the retry's own) has made the disk.
    let mut got = None;
    for _ in 0..50 {
        match lab.create(create("pvc-1", GIB, "default")).await {
            Ok(id) => {
                got = Some(id);
                break;
            }
            Err(e) => assert!(
                matches!(
                    e.code(),
                    Code::Aborted | Code::DeadlineExceeded | Code::Unavailable
                ),
                "{e}"
            ),
        }
    }
    assert!(got.is_some());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(lab.director.disks().len(), 1, "no duplicate disk");
}

#[tokio::test]
async fn bad_credentials_are_unauthenticated() {
    let mut lab = Lab::with(Setup {
        secret: "wrong-secret",
        ..Default::default()
    })
    .await;
    let e = lab
        .create(create("pvc-1", GIB, "default"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    assert!(!e.message().contains("wrong-secret"));
}

#[tokio::test]
async fn token_for_another_deployment_is_permission_denied() {
    let mut lab = Lab::with(Setup {
        per_deployment_scoping: true,
        client_deployments: vec!["other"],
        ..Default::default()
    })
    .await;
    let e = lab
        .create(create("pvc-1", GIB, "default"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    assert!(lab.director.disks().is_empty());
}

#[tokio::test]
async fn expired_token_is_refreshed() {
    let mut lab = Lab::start(&[]).await;
    lab.create(create("pvc-1", GIB, "default")).await.unwrap();
    assert_eq!(lab.token_requests(), 1);
    // Past the Director's token lifetime (virtual time): the next call's 401
    // makes the driver fetch a fresh token and retry once.
    let clock = lab.gate.history().clock().clone();
    clock.advance_to(clock.now().after(Duration::from_secs(7200)));
    lab.create(create("pvc-2", GIB, "default")).await.unwrap();
    assert_eq!(lab.token_requests(), 2);
    assert_eq!(lab.director.disks().len(), 2);
}

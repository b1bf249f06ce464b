//! End to end over the whole BOSH/CSI slice, in-process on one virtual clock:
//! fake Director (in-process CPI and agents) on loopback HTTP, the reference
//! bosh-csi controller and node plugins on Unix sockets, one fake mount table
//! per node fed from the Director's agent disks, and the fake CSI sidecars
//! reconciling StorageClass/PVC/Pod objects in the Kubernetes fake.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bosh_csi::{DriverConfig, Mode, Mutant, Secret};
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::cpi::{Cpi, CpiConfig};
use drivelab_fakes::csi::attacher::Attacher;
use drivelab_fakes::csi::cluster::CsiSidecars;
use drivelab_fakes::csi::kubelet::NodeAgent;
use drivelab_fakes::csi::mounts::{Device, DeviceSource, Filesystems, MountTable, MountView};
use drivelab_fakes::csi::provisioner::{ProvisionTarget, Provisioner};
use drivelab_fakes::csi::{connect_unix, KubeSlot, Reconcile};
use drivelab_fakes::director::{
    ClientConfig, DeploymentConfig, Director, DirectorConfig, DiskPoolConfig, InstanceGroupConfig,
};
use drivelab_fakes::gate::{CallSpec, Delivery, Gate, GateHook, Verdict};
use drivelab_fakes::history::{CallId, History, Outcome};
use drivelab_fakes::kube::{Kind, KubeFake};
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::{MemStore, Store};
use serde_json::{json, Value};

const CLIENT: &str = "bosh-csi";
const SECRET: &str = "bosh-csi-client-secret";
const NS: &str = "app";
const NODES: [&str; 2] = ["node-a", "node-b"];

type BoxFut<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// The test's interception point: loses the reply of the next call with a given op.
#[derive(Default)]
struct Faults {
    lose_reply_of: std::sync::Mutex<Vec<&'static str>>,
}

impl GateHook for Faults {
    fn before<'a>(&'a self, _: CallId, _: &'a CallSpec) -> BoxFut<'a, Verdict> {
        Box::pin(async { Verdict::Proceed })
    }
    fn after<'a>(&'a self, _: CallId, call: &'a CallSpec, _: &'a Outcome) -> BoxFut<'a, Delivery> {
        Box::pin(async move {
            let mut ops = self.lose_reply_of.lock().unwrap();
            match ops.iter().position(|o| *o == call.op) {
                Some(i) => {
                    ops.remove(i);
                    Delivery::Cut
                }
                None => Delivery::Deliver,
            }
        })
    }
}

/// How a slice is started.
struct Setup {
    mutants: Vec<Mutant>,
    workers: usize,
    task_timeout: Duration,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            mutants: vec![],
            workers: 2,
            task_timeout: Duration::from_secs(20),
        }
    }
}

/// The wired slice: Director + CPI, the driver's controller and two node
/// plugins, two mount tables, and the sidecars over one Kubernetes fake.
struct Slice {
    clock: SimClock,
    gate: Gate,
    faults: Arc<Faults>,
    director: Director,
    director_l: Option<Listener>,
    director_addr: SocketAddr,
    kube: KubeFake,
    sidecars: CsiSidecars,
    /// Mount table by Kubernetes node name.
    tables: BTreeMap<String, MountTable>,
    /// BOSH instance id by Kubernetes node name.
    instance: BTreeMap<String, String>,
    _table_ls: Vec<Listener>,
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

/// Serve a bosh-csi process on `socket` and wait until it accepts.
async fn start_driver(config: DriverConfig, socket: &Path) -> tokio::sync::oneshot::Sender<()> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let s = socket.to_path_buf();
    tokio::spawn(async move {
        bosh_csi::serve_unix(config, &s, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    for _ in 0..500 {
        if connect_unix(socket).await.is_ok() {
            return stop;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("driver socket {} never came up", socket.display());
}

impl Slice {
    async fn start(s: Setup) -> Slice {
        let clock = SimClock::new();
        let history = History::new(clock.clone());
        let gate = Gate::new(history);
        let faults = Arc::new(Faults::default());
        gate.set_hook(faults.clone());
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
                    instances: 2,
                    azs: vec!["z1".into()],
                }],
            }],
            disk_pools: vec![DiskPoolConfig {
                name: "default".into(),
                cloud_properties: json!({}),
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
        let director_addr = director_l.addr;
        let mut ids: Vec<_> = director
            .instances()
            .into_iter()
            .filter(|i| i.deployment == "k8s")
            .map(|i| (i.name, i.id))
            .collect();
        ids.sort();
        assert_eq!(ids.len(), 2);

        let dir = tempfile::tempdir().unwrap();
        let mut stops = Vec::new();
        let ctl_sock: PathBuf = dir.path().join("controller.sock");
        stops.push(
            start_driver(
                DriverConfig {
                    mode: Mode::Controller,
                    director_url: director_l.url(),
                    client_id: CLIENT.into(),
                    client_secret: Secret::new(SECRET),
                    poll_interval: Duration::from_millis(5),
                    task_timeout: s.task_timeout,
                    http_timeout: Duration::from_secs(2),
                    mutants: s.mutants.clone(),
                    ..Default::default()
                },
                &ctl_sock,
            )
            .await,
        );

        let kube = KubeFake::new(Arc::new(MemStore::default()), gate.clone(), 7).unwrap();
        let slot: KubeSlot = Arc::new(RwLock::new(kube.clone()));
        let filesystems = Filesystems::default();
        let mut tables = BTreeMap::new();
        let mut instance = BTreeMap::new();
        let mut table_ls = Vec::new();
        let mut agents = BTreeMap::new();
        for (node, (_, id)) in NODES.iter().zip(ids) {
            let d = director.clone();
            let iid = id.clone();
            // What the BOSH agent made visible on this instance, as udev would show it.
            let source: DeviceSource = Arc::new(move || {
                d.agent_disks(&iid)
                    .iter()
                    .map(|a| Device::for_disk(&a.disk_cid))
                    .collect()
            });
            let table = MountTable::new(node, source, filesystems.clone(), gate.clone());
            let table_l = table.serve(loopback()).await.unwrap();
            let sock = dir.path().join(format!("{node}.sock"));
            stops.push(
                start_driver(
                    DriverConfig {
                        mode: Mode::Node,
                        node_id: id.clone(),
                        mounter_url: table_l.url(),
                        http_timeout: Duration::from_secs(2),
                        mutants: s.mutants.clone(),
                        ..Default::default()
                    },
                    &sock,
                )
                .await,
            );
            let agent = NodeAgent::connect(node, &sock, slot.clone(), gate.clone())
                .await
                .unwrap();
            agents.insert(node.to_string(), Arc::new(agent));
            tables.insert(node.to_string(), table);
            instance.insert(node.to_string(), id);
            table_ls.push(table_l);
        }
        let sidecars = CsiSidecars {
            kube: slot.clone(),
            provisioner: Arc::new(
                Provisioner::connect(&ctl_sock, slot.clone(), gate.clone())
                    .await
                    .unwrap(),
            ),
            attacher: Arc::new(
                Attacher::connect(&ctl_sock, slot.clone(), gate.clone())
                    .await
                    .unwrap(),
            ),
            nodes: agents,
            snapshotter: None,
        };
        kube.create(
            Kind::StorageClass,
            json!({"metadata":{"name":"bosh"},"provisioner":bosh_csi::DRIVER_NAME,
                "reclaimPolicy":"Delete",
                "parameters":{"disk_pool_name":"default","deployment_name":"k8s",
                    "csi.storage.k8s.io/fstype":"ext4"}}),
        )
        .unwrap();
        Slice {
            clock,
            gate: gate.clone(),
            faults,
            director,
            director_l: Some(director_l),
            director_addr,
            kube,
            sidecars,
            tables,
            instance,
            _table_ls: table_ls,
            _stops: stops,
            _dir: dir,
        }
    }

    /// Resync every sidecar target until all are Done (at most `rounds`);
    /// between rounds the virtual clock moves on by the shortest back-off
    /// asked for. The last round's requeue reasons if it did not converge.
    async fn settle(&self, rounds: usize) -> Vec<String> {
        let mut pending = Vec::new();
        for _ in 0..rounds {
            pending.clear();
            let before = self.fingerprint();
            let mut wait: Option<Duration> = None;
            for t in self.sidecars.targets().unwrap() {
                if let Reconcile::Requeue { after, reason } =
                    self.sidecars.reconcile(&t).await.unwrap()
                {
                    pending.push(format!("{t}: {reason}"));
                    wait = Some(wait.map_or(after, |w| w.min(after)));
                }
            }
            match wait {
                // A round where every target was Done may still have made new
                // work for targets visited earlier in it (the kubelet deleting
                // a VolumeAttachment after the attacher's turn); a watch would
                // deliver that, so go round again until nothing changes.
                None if self.fingerprint() == before => break,
                None => {}
                Some(w) => self.clock.advance_to(self.clock.now().after(w)),
            }
        }
        pending
    }

    /// Everything the sidecars read, to tell a quiet round from a busy one.
    fn fingerprint(&self) -> String {
        let mut out = String::new();
        for k in [
            Kind::PersistentVolumeClaim,
            Kind::PersistentVolume,
            Kind::VolumeAttachment,
            Kind::Pod,
            Kind::CsiNode,
        ] {
            out.push_str(&format!("{:?}", self.kube.list(k, None).unwrap()));
        }
        for t in self.tables.values() {
            out.push_str(&format!("{:?}", t.mounts()));
        }
        out
    }

    fn pvc(&self, name: &str, modes: &[&str]) {
        self.kube
            .create(
                Kind::PersistentVolumeClaim,
                json!({"metadata":{"name":name,"namespace":NS},"spec":{
                    "storageClassName":"bosh","accessModes":modes,
                    "resources":{"requests":{"storage":"1Gi"}}}}),
            )
            .unwrap();
    }

    /// A pod on `node` using claim `claim`; its uid.
    fn pod(&self, name: &str, node: &str, claim: &str, read_only: bool) -> String {
        let p = self
            .kube
            .create(
                Kind::Pod,
                json!({"metadata":{"name":name,"namespace":NS},"spec":{
                    "nodeName":node,
                    "containers":[{"name":"c","image":"busybox"}],
                    "volumes":[{"name":"data","persistentVolumeClaim":{"claimName":claim,"readOnly":read_only}}]}}),
            )
            .unwrap();
        p["metadata"]["uid"].as_str().unwrap().to_string()
    }

    fn get(&self, kind: Kind, ns: Option<&str>, name: &str) -> Option<Value> {
        self.kube.get(kind, ns, name).unwrap()
    }

    fn phase(&self, pod: &str) -> String {
        self.get(Kind::Pod, Some(NS), pod)
            .map(|p| p["status"]["phase"].as_str().unwrap_or("").to_string())
            .unwrap_or_default()
    }

    /// The CSI volume handle (= Director disk name) of a bound claim.
    fn handle(&self, claim: &str) -> String {
        let c = self
            .get(Kind::PersistentVolumeClaim, Some(NS), claim)
            .expect("claim");
        let pv = c["spec"]["volumeName"].as_str().expect("bound").to_string();
        self.get(Kind::PersistentVolume, None, &pv).expect("pv")["spec"]["csi"]["volumeHandle"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn mounts(&self, node: &str) -> Vec<MountView> {
        self.tables[node].mounts()
    }

    fn vm_of(&self, node: &str) -> String {
        let id = &self.instance[node];
        self.director
            .instances()
            .into_iter()
            .find(|i| &i.id == id)
            .and_then(|i| i.vm_cid)
            .expect("vm")
    }

    /// The Director's record of which instance the disk is attached to.
    fn director_attached(&self, disk: &str) -> Option<String> {
        self.director
            .disks()
            .into_iter()
            .find(|d| d.name == disk)
            .expect("disk known to the Director")
            .instance_id
    }

    fn disk_cid(&self, disk: &str) -> String {
        self.director
            .disks()
            .into_iter()
            .find(|d| d.name == disk)
            .expect("disk")
            .cid
    }

    /// VM cids the IaaS has this disk attached to.
    fn cpi_attached(&self, cid: &str) -> Vec<String> {
        self.director
            .cpi()
            .attachments()
            .into_iter()
            .filter(|a| a.disk_cid == cid)
            .map(|a| a.vm_cid)
            .collect()
    }

    fn agent_has(&self, node: &str, cid: &str) -> bool {
        self.director
            .agent_disks(&self.instance[node])
            .iter()
            .any(|d| d.disk_cid == cid)
    }

    /// Take the Director's listener down (connections refused, as a crashed process).
    async fn director_down(&mut self) {
        if let Some(l) = self.director_l.take() {
            l.stop().await;
        }
    }

    /// Serve the Director again on the same address.
    async fn director_up(&mut self) {
        let mut last = None;
        for _ in 0..100 {
            match self.director.serve(self.director_addr).await {
                Ok(l) => {
                    self.director_l = Some(l);
                    return;
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "could not rebind the Director on {}: {last:?}",
            self.director_addr
        );
    }
}

fn claim_t(name: &str) -> ProvisionTarget {
    ProvisionTarget::Claim {
        namespace: NS.into(),
        name: name.into(),
    }
}

// ---------------------------------------------------------------- 1 lifecycle

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_provision_attach_mount_teardown_delete() {
    let s = Slice::start(Setup::default()).await;
    s.pvc("data", &["ReadWriteOnce"]);
    assert!(s.settle(10).await.is_empty());
    let disk = s.handle("data");
    let disks = s.director.disks();
    assert_eq!(disks.len(), 1, "{disks:?}");
    assert_eq!(disks[0].name, disk);
    assert_eq!(disks[0].deployment, "k8s");
    assert_eq!(disks[0].size_mib, 1024);
    assert_eq!(s.director_attached(&disk), None);
    let cid = s.disk_cid(&disk);

    let uid = s.pod("web", "node-a", "data", false);
    let pending = s.settle(20).await;
    assert!(pending.is_empty(), "{pending:?}");
    assert_eq!(s.phase("web"), "Running");
    let vas = s.kube.list(Kind::VolumeAttachment, None).unwrap();
    assert_eq!(vas.len(), 1);
    assert_eq!(vas[0]["spec"]["nodeName"], "node-a");
    assert_eq!(vas[0]["status"]["attached"], true);
    assert_eq!(
        vas[0]["status"]["attachmentMetadata"]["disk_cid"],
        cid.as_str()
    );
    assert_eq!(
        s.director_attached(&disk).as_deref(),
        Some(s.instance["node-a"].as_str())
    );
    assert_eq!(s.cpi_attached(&cid), vec![s.vm_of("node-a")]);
    assert!(s.agent_has("node-a", &cid) && !s.agent_has("node-b", &cid));
    let m = s.mounts("node-a");
    assert_eq!(m.len(), 2, "{m:?}");
    let stage = m.iter().find(|m| !m.bind).expect("staging mount");
    assert_eq!(stage.disk_cid, cid);
    assert_eq!(stage.fstype, "ext4");
    assert!(stage.target.ends_with("/globalmount"), "{stage:?}");
    let bind = m.iter().find(|m| m.bind).expect("bind mount");
    assert_eq!(bind.source, stage.target);
    assert!(bind.target.contains(&uid) && !bind.read_only, "{bind:?}");
    assert!(s.mounts("node-b").is_empty());

    s.kube.delete(Kind::Pod, Some(NS), "web").unwrap();
    let pending = s.settle(20).await;
    assert!(pending.is_empty(), "{pending:?}");
    assert!(s.get(Kind::Pod, Some(NS), "web").is_none());
    assert!(s.mounts("node-a").is_empty(), "{:?}", s.mounts("node-a"));
    assert!(s
        .kube
        .list(Kind::VolumeAttachment, None)
        .unwrap()
        .is_empty());
    assert_eq!(s.director_attached(&disk), None);
    assert!(s.cpi_attached(&cid).is_empty());
    assert!(!s.agent_has("node-a", &cid));

    s.kube
        .delete(Kind::PersistentVolumeClaim, Some(NS), "data")
        .unwrap();
    let pending = s.settle(20).await;
    assert!(pending.is_empty(), "{pending:?}");
    assert!(s.director.disks().is_empty(), "{:?}", s.director.disks());
    assert!(s.director.cpi().disks().is_empty());
    for k in [
        Kind::PersistentVolumeClaim,
        Kind::PersistentVolume,
        Kind::VolumeAttachment,
    ] {
        assert!(s.kube.list(k, None).unwrap().is_empty(), "{k} left over");
    }
}

/// `CsiSidecars::settle` (the engine-facing helper, no clock) must not stop at
/// an all-Done round that made new work: after a pod deletion the kubelet
/// deletes the VolumeAttachment after the attacher's turn in the same round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_settle_waits_for_a_quiet_round() {
    let s = Slice::start(Setup::default()).await;
    s.pvc("data", &["ReadWriteOnce"]);
    s.pod("web", "node-a", "data", false);
    assert!(s.sidecars.settle(20).await.unwrap().is_empty());
    assert_eq!(s.phase("web"), "Running");
    let disk = s.handle("data");
    s.kube.delete(Kind::Pod, Some(NS), "web").unwrap();
    let pending = s.sidecars.settle(20).await.unwrap();
    assert!(pending.is_empty(), "{pending:?}");
    let vas = s.kube.list(Kind::VolumeAttachment, None).unwrap();
    assert!(vas.is_empty(), "settle stopped before the detach: {vas:?}");
    assert_eq!(s.director_attached(&disk), None);
}

// ---------------------------------------------------------------- 2 read-only

/// Run a pod with a read-only claim to Running; the bind mount it got.
async fn readonly_bind(mutants: &[Mutant]) -> MountView {
    let s = Slice::start(Setup {
        mutants: mutants.to_vec(),
        ..Default::default()
    })
    .await;
    s.pvc("data", &["ReadWriteOnce"]);
    s.pod("web", "node-a", "data", true);
    let pending = s.settle(20).await;
    assert!(pending.is_empty(), "{pending:?}");
    assert_eq!(s.phase("web"), "Running");
    let m = s.mounts("node-a");
    m.into_iter().find(|m| m.bind).expect("bind mount")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_pod_gets_a_readonly_bind_and_the_mutant_is_seen() {
    let ok = readonly_bind(&[]).await;
    assert!(ok.read_only, "correct driver: {ok:?}");
    let bad = readonly_bind(&[Mutant::WritableReadonlyPublish]).await;
    assert!(
        !bad.read_only,
        "writable-readonly-publish must show as a writable bind: {bad:?}"
    );
}

// ---------------------------------------------------------------- 3 Director down

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn director_outage_during_attach_requeues_then_converges() {
    let mut s = Slice::start(Setup::default()).await;
    s.pvc("data", &["ReadWriteOnce"]);
    assert!(s.settle(10).await.is_empty());
    let disk = s.handle("data");
    let cid = s.disk_cid(&disk);

    s.director_down().await;
    s.pod("web", "node-a", "data", false);
    let pending = s.settle(4).await;
    assert!(!pending.is_empty());
    let attach = pending
        .iter()
        .find(|p| p.contains("ControllerPublishVolume"))
        .unwrap_or_else(|| panic!("no failed attach in {pending:?}"));
    eprintln!("while the Director is down: {attach}");
    assert!(
        attach.contains("UNAVAILABLE") || attach.contains("DEADLINE_EXCEEDED"),
        "{attach}"
    );
    let va = &s.kube.list(Kind::VolumeAttachment, None).unwrap()[0];
    assert_ne!(va["status"]["attached"], true);
    assert!(va["status"]["attachError"]["message"].is_string(), "{va}");
    assert_ne!(s.phase("web"), "Running");
    assert_eq!(s.director_attached(&disk), None);
    assert!(s.mounts("node-a").is_empty());

    s.director_up().await;
    let pending = s.settle(20).await;
    assert!(pending.is_empty(), "{pending:?}");
    assert_eq!(s.phase("web"), "Running");
    assert_eq!(
        s.director_attached(&disk).as_deref(),
        Some(s.instance["node-a"].as_str())
    );
    assert_eq!(
        s.cpi_attached(&cid),
        vec![s.vm_of("node-a")],
        "one attachment"
    );
    assert_eq!(s.director.cpi().attachments().len(), 1);
    assert_eq!(s.mounts("node-a").len(), 2);
    assert_eq!(s.director.disks().len(), 1, "no duplicate disk");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_attach_reply_is_retried_without_a_double_attachment() {
    let s = Slice::start(Setup::default()).await;
    s.pvc("data", &["ReadWriteOnce"]);
    assert!(s.settle(10).await.is_empty());
    let disk = s.handle("data");
    let cid = s.disk_cid(&disk);
    // The Director accepts the attach but the driver never sees the 302.
    s.faults
        .lose_reply_of
        .lock()
        .unwrap()
        .push("dynamic_disks.attach");
    s.pod("web", "node-a", "data", false);
    let pending = s.settle(20).await;
    assert!(pending.is_empty(), "{pending:?}");
    assert!(
        s.faults.lose_reply_of.lock().unwrap().is_empty(),
        "fault fired"
    );
    assert_eq!(s.phase("web"), "Running");
    assert_eq!(
        s.director_attached(&disk).as_deref(),
        Some(s.instance["node-a"].as_str())
    );
    assert_eq!(s.director.cpi().attachments().len(), 1);
    assert_eq!(s.cpi_attached(&cid), vec![s.vm_of("node-a")]);
    let tasks: Vec<_> = s
        .director
        .tasks()
        .into_iter()
        .filter(|t| t.disk_job)
        .map(|t| (t.description, format!("{:?}", t.state)))
        .collect();
    let cpi_attaches = drivelab_fakes::history::calls(&s.gate.history().events())
        .iter()
        .filter(|c| c.op == "attach_disk")
        .count();
    eprintln!(
        "disk tasks after a lost attach reply: {tasks:?}; CPI attach_disk calls: {cpi_attaches}"
    );
    assert_eq!(cpi_attaches, 1, "the IaaS attach ran once: {tasks:?}");
}

// ---------------------------------------------------------------- 4 second node

/// Pod `a` on node-a is Running; pod `b` on node-b uses the same RWO claim.
/// Returns (the VM cids the disk is attached to, the second attach's reasons).
async fn second_node(mutants: &[Mutant]) -> (Slice, String, Vec<String>) {
    let s = Slice::start(Setup {
        mutants: mutants.to_vec(),
        ..Default::default()
    })
    .await;
    s.pvc("data", &["ReadWriteOnce"]);
    s.pod("a", "node-a", "data", false);
    let pending = s.settle(20).await;
    assert!(pending.is_empty(), "{pending:?}");
    assert_eq!(s.phase("a"), "Running");
    let disk = s.handle("data");
    s.pod("b", "node-b", "data", false);
    let pending = s.settle(4).await;
    (s, disk, pending)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_node_gets_failed_precondition_not_the_disk() {
    let (s, disk, pending) = second_node(&[]).await;
    let cid = s.disk_cid(&disk);
    assert!(
        pending
            .iter()
            .any(|p| p.contains("ControllerPublishVolume") && p.contains("FAILED_PRECONDITION")),
        "{pending:?}"
    );
    assert_ne!(s.phase("b"), "Running");
    assert_eq!(s.phase("a"), "Running");
    assert_eq!(
        s.director_attached(&disk).as_deref(),
        Some(s.instance["node-a"].as_str())
    );
    assert_eq!(s.cpi_attached(&cid), vec![s.vm_of("node-a")]);
    assert!(s.agent_has("node-a", &cid) && !s.agent_has("node-b", &cid));
    assert!(s.mounts("node-a").iter().all(|m| m.device_present));
    assert!(s.mounts("node-b").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_steals_attachment_mutant_is_seen() {
    let (s, disk, _) = second_node(&[Mutant::PublishStealsAttachment]).await;
    let cid = s.disk_cid(&disk);
    // The mutant detaches from A under A's mounts and attaches to B.
    assert_eq!(
        s.director_attached(&disk).as_deref(),
        Some(s.instance["node-b"].as_str()),
        "the mutant should have moved the disk"
    );
    assert_eq!(s.cpi_attached(&cid), vec![s.vm_of("node-b")]);
    assert!(!s.agent_has("node-a", &cid));
    let a = s.mounts("node-a");
    assert!(
        !a.is_empty() && a.iter().any(|m| !m.device_present),
        "node-a's mounts lost their device: {a:?}"
    );
}

// ---------------------------------------------------------------- 5 workers = 0

/// With 0 disk workers the provision times out (retryably); with workers on
/// it converges. The Director and IaaS disk counts afterwards.
async fn feature_off_then_on(mutants: &[Mutant]) -> (usize, usize) {
    let s = Slice::start(Setup {
        mutants: mutants.to_vec(),
        workers: 0,
        task_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    s.pvc("data", &["ReadWriteOnce"]);
    let r = s
        .sidecars
        .provisioner
        .reconcile(&claim_t("data"))
        .await
        .unwrap();
    let Reconcile::Requeue { reason, .. } = &r else {
        panic!("a provision with 0 disk workers cannot be done: {r:?}")
    };
    assert!(
        reason.contains("DEADLINE_EXCEEDED")
            || reason.contains("UNAVAILABLE")
            || reason.contains("ABORTED"),
        "{reason}"
    );
    assert!(s.director.disks().is_empty());
    assert!(s
        .director
        .tasks()
        .iter()
        .any(|t| t.disk_job && format!("{:?}", t.state).to_lowercase() == "queued"));
    let c = s
        .get(Kind::PersistentVolumeClaim, Some(NS), "data")
        .unwrap();
    assert_eq!(c["status"]["phase"], "Pending");

    s.director.set_dynamic_disks_workers(1);
    s.pod("web", "node-a", "data", false);
    let pending = s.settle(30).await;
    assert!(pending.is_empty(), "{pending:?}");
    assert_eq!(s.phase("web"), "Running");
    // Let any task queued by an earlier, timed-out try finish too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    (s.director.disks().len(), s.director.cpi().disks().len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feature_off_provision_stays_pending_then_converges() {
    assert_eq!(
        feature_off_then_on(&[]).await,
        (1, 1),
        "one disk, no orphan"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_not_idempotent_mutant_leaves_an_orphan_after_the_timeout() {
    let (director, iaas) = feature_off_then_on(&[Mutant::CreateNotIdempotent]).await;
    assert!(
        director > 1 && iaas > 1,
        "the retried create must make a second disk: {director} / {iaas}"
    );
}

// ---------------------------------------------------------------- scopes

/// The driver's UAA client holds only the dynamic-disks scopes: the correct
/// driver provisions with them; `admin-token` asks for bosh.admin and is refused.
async fn provision_reason(mutants: &[Mutant]) -> Reconcile {
    let s = Slice::start(Setup {
        mutants: mutants.to_vec(),
        ..Default::default()
    })
    .await;
    s.pvc("data", &["ReadWriteOnce"]);
    s.sidecars
        .provisioner
        .reconcile(&claim_t("data"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrow_scopes_suffice_and_the_admin_token_mutant_is_refused() {
    assert_eq!(provision_reason(&[]).await, Reconcile::Done);
    let r = provision_reason(&[Mutant::AdminToken]).await;
    eprintln!("admin-token: {r:?}");
    assert!(
        matches!(&r, Reconcile::Requeue { reason, .. }
            if reason.contains("PERMISSION_DENIED") || reason.contains("UNAUTHENTICATED")),
        "{r:?}"
    );
}

// ---------------------------------------------------------------- lost detach reply

/// The Director detaches but the driver never sees the reply; the attacher's
/// retry unpublishes a volume that is no longer attached. The pending reasons
/// after teardown, and whether the disk is still attached anywhere.
async fn lost_detach_reply(mutants: &[Mutant]) -> (Vec<String>, bool) {
    let s = Slice::start(Setup {
        mutants: mutants.to_vec(),
        ..Default::default()
    })
    .await;
    s.pvc("data", &["ReadWriteOnce"]);
    s.pod("web", "node-a", "data", false);
    assert!(s.settle(20).await.is_empty());
    let disk = s.handle("data");
    s.faults
        .lose_reply_of
        .lock()
        .unwrap()
        .push("dynamic_disks.detach");
    s.kube.delete(Kind::Pod, Some(NS), "web").unwrap();
    let pending = s.settle(12).await;
    assert!(
        s.faults.lose_reply_of.lock().unwrap().is_empty(),
        "fault fired"
    );
    assert!(s.mounts("node-a").is_empty());
    (pending, s.director_attached(&disk).is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_detach_reply_converges_and_unpublish_missing_mutant_is_seen() {
    let (pending, attached) = lost_detach_reply(&[]).await;
    assert!(pending.is_empty() && !attached, "{pending:?}");
    let (pending, attached) = lost_detach_reply(&[Mutant::UnpublishMissingIsError]).await;
    assert!(!attached);
    assert!(
        pending
            .iter()
            .any(|p| p.contains("ControllerUnpublishVolume") && p.contains("NOT_FOUND")),
        "the attacher must be stuck on NOT_FOUND: {pending:?}"
    );
}

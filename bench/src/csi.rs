//! CSI figures: ControllerPublishVolume through the lab's path (fake
//! external-attacher → gate + history → bosh-csi controller → fake Director →
//! fake CPI, in memory as the engine wires them) against a bare tonic client calling the same driver
//! whose Director is `DirectorStub` (answers every task at once); and a volume
//! growth series (N volumes created, attached, detached on a few VMs).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;
use bosh_csi::{DriverConfig, Mode, Secret};
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::cpi::{Cpi, CpiConfig};
use drivelab_fakes::csi::attacher::Attacher;
use drivelab_fakes::csi::{connect_unix, DriverReply, DriverRequest, KubeSlot};
use drivelab_fakes::director::{
    ClientConfig, DeploymentConfig, Director, DirectorConfig, DiskPoolConfig, InstanceGroupConfig,
};
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::kube::KubeFake;
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::{MemStore, SledStore, Store};
use drivelab_proto::csi;
use drivelab_proto::csi::controller_client::ControllerClient;
use serde_json::{json, Value};
use tonic::transport::Channel;

use crate::measure::{cpu_seconds, peak_rss_mib};
use crate::percall::{Backing, FsyncEachWrite, IdleHook, Series};

const CLIENT: &str = "bosh-csi";
const CLIENT_SECRET: &str = "bench-bosh-csi-client-secret";
const DEPLOYMENT: &str = "k8s";
const POOL: &str = "default";
/// How often the driver polls a Director task. The fake Director runs jobs on
/// its own workers, so a task may still be queued at the first poll; the stub
/// answers `done` at once. Small, so the figure is the lab's work, not a sleep.
pub const POLL: Duration = Duration::from_millis(1);

/// A bosh-csi controller on a runtime of its own (1 worker), as a driver process would be.
struct DriverRt {
    rt: Option<tokio::runtime::Runtime>,
    socket: PathBuf,
}

impl DriverRt {
    async fn start(director_url: String, socket: &Path) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bosh-csi")
            .enable_all()
            .build()?;
        let config = DriverConfig {
            mode: Mode::Controller,
            director_url,
            client_id: CLIENT.into(),
            client_secret: Secret::new(CLIENT_SECRET),
            poll_interval: POLL,
            task_timeout: Duration::from_secs(30),
            http_timeout: Duration::from_secs(10),
            ..Default::default()
        };
        let path = socket.to_path_buf();
        rt.spawn(async move { bosh_csi::serve_unix(config, &path, std::future::pending()).await });
        for _ in 0..500 {
            if tokio::net::UnixStream::connect(socket).await.is_ok() {
                return Ok(Self {
                    rt: Some(rt),
                    socket: socket.to_path_buf(),
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        rt.shutdown_background();
        bail!("bosh-csi did not open {}", socket.display())
    }
}

impl Drop for DriverRt {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// The fake Director (with its in-process CPI) over sled or memory, `vms` worker VMs.
struct LabDirector {
    _dir: tempfile::TempDir,
    director: Director,
    gate: Gate,
    history: History,
    listener: Listener,
    /// Instance ids = CSI node ids.
    nodes: Vec<String>,
}

impl LabDirector {
    async fn start(vms: u32, hook: Arc<IdleHook>, backing: Backing) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("drivelab-bench-bosh-")
            .tempdir()?;
        let history = History::new(SimClock::new());
        let gate = Gate::new(history.clone());
        gate.set_hook(hook);
        let (cpi_store, dir_store): (Arc<dyn Store>, Arc<dyn Store>) = match backing {
            Backing::Sled | Backing::SledFsyncEachWrite => {
                let db = sled::Config::new().path(dir.path().join("state")).open()?;
                let (c, d) = (
                    SledStore::open(&db, "cpi")?,
                    SledStore::open(&db, "director")?,
                );
                if backing == Backing::Sled {
                    (Arc::new(c), Arc::new(d))
                } else {
                    (Arc::new(FsyncEachWrite(c)), Arc::new(FsyncEachWrite(d)))
                }
            }
            Backing::Mem => (Arc::new(MemStore::default()), Arc::new(MemStore::default())),
        };
        let cpi = Cpi::new(cpi_store, gate.clone(), CpiConfig::default());
        let config = DirectorConfig {
            deployments: vec![DeploymentConfig {
                name: DEPLOYMENT.into(),
                instance_groups: vec![InstanceGroupConfig {
                    name: "worker".into(),
                    instances: vms,
                    azs: vec!["z1".into()],
                }],
            }],
            disk_pools: vec![DiskPoolConfig {
                name: POOL.into(),
                cloud_properties: json!({}),
            }],
            clients: vec![ClientConfig {
                id: CLIENT.into(),
                secret: drivelab_fakes::secret::Secret::new(CLIENT_SECRET),
                scopes: bosh_csi::config::NARROW_SCOPES
                    .iter()
                    .map(|x| x.to_string())
                    .collect(),
                deployments: vec![],
            }],
            dynamic_disks_workers: 2,
            ..Default::default()
        };
        let director = Director::new(dir_store, gate.clone(), cpi, config)
            .await
            .map_err(|e| anyhow!("starting the fake Director: {e}"))?;
        let listener = director.serve(loopback()).await?;
        let mut nodes: Vec<(String, String)> = director
            .instances()
            .into_iter()
            .filter(|i| i.deployment == DEPLOYMENT)
            .map(|i| (i.name, i.id))
            .collect();
        nodes.sort();
        Ok(Self {
            _dir: dir,
            director,
            gate,
            history,
            listener,
            nodes: nodes.into_iter().map(|(_, id)| id).collect(),
        })
    }
}

fn capability() -> csi::VolumeCapability {
    use csi::volume_capability::{access_mode::Mode as M, AccessMode, AccessType, MountVolume};
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: M::SingleNodeWriter as i32,
        }),
    }
}

fn create_req(name: &str) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability()],
        parameters: HashMap::from([
            ("disk_pool_name".to_string(), POOL.to_string()),
            ("deployment_name".to_string(), DEPLOYMENT.to_string()),
        ]),
        ..Default::default()
    }
}

fn publish_req(volume: &str, node: &str) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        volume_capability: Some(capability()),
        ..Default::default()
    }
}

fn unpublish_req(volume: &str, node: &str) -> csi::ControllerUnpublishVolumeRequest {
    csi::ControllerUnpublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        ..Default::default()
    }
}

/// A plain controller client; CreateVolume returns the volume id.
#[derive(Clone)]
struct Bare(ControllerClient<Channel>);

impl Bare {
    async fn connect(socket: &Path) -> anyhow::Result<Self> {
        Ok(Self(ControllerClient::new(connect_unix(socket).await?)))
    }
    async fn create(&self, name: &str) -> anyhow::Result<String> {
        let r = self
            .0
            .clone()
            .create_volume(create_req(name))
            .await
            .with_context(|| format!("CreateVolume {name}"))?;
        r.into_inner()
            .volume
            .map(|v| v.volume_id)
            .context("CreateVolume answered no volume")
    }
    async fn publish(&self, v: &str, node: &str) -> anyhow::Result<()> {
        self.0
            .clone()
            .controller_publish_volume(publish_req(v, node))
            .await
            .with_context(|| format!("ControllerPublishVolume {v}@{node}"))?;
        Ok(())
    }
    async fn unpublish(&self, v: &str, node: &str) -> anyhow::Result<()> {
        self.0
            .clone()
            .controller_unpublish_volume(unpublish_req(v, node))
            .await
            .with_context(|| format!("ControllerUnpublishVolume {v}@{node}"))?;
        Ok(())
    }
}

/// One way of sending publish/unpublish.
enum Path_ {
    /// Fake attacher (gate + history) → driver.
    Attacher(Attacher),
    /// Plain tonic client → driver.
    Bare(Bare),
}

impl Path_ {
    async fn publish(&self, v: &str, node: &str) -> anyhow::Result<Duration> {
        let t = Instant::now();
        match self {
            Path_::Attacher(a) => {
                let ex = a
                    .replay(DriverRequest::ControllerPublish(publish_req(v, node)))
                    .await;
                let d = t.elapsed();
                match ex.reply {
                    DriverReply::Published { .. } => Ok(d),
                    other => bail!("publish through the attacher: {other:?}"),
                }
            }
            Path_::Bare(b) => {
                b.publish(v, node).await?;
                Ok(t.elapsed())
            }
        }
    }
    async fn unpublish(&self, v: &str, node: &str) -> anyhow::Result<Duration> {
        let t = Instant::now();
        match self {
            Path_::Attacher(a) => {
                let ex = a
                    .replay(DriverRequest::ControllerUnpublish(unpublish_req(v, node)))
                    .await;
                let d = t.elapsed();
                match ex.reply {
                    DriverReply::Empty => Ok(d),
                    other => bail!("unpublish through the attacher: {other:?}"),
                }
            }
            Path_::Bare(b) => {
                b.unpublish(v, node).await?;
                Ok(t.elapsed())
            }
        }
    }
}

/// Everything the CSI per-call run measured.
pub struct CsiPerCall {
    /// Publish then unpublish series per path (lab, lab_driver_direct, sled_director_direct, bare).
    pub series: Vec<Series>,
    /// Gate calls one lab publish+unpublish made (history entries / 2 / pairs).
    pub gated_calls_per_pair: f64,
    /// `GET /tasks/<id>` calls the driver made per lab publish+unpublish.
    pub task_polls_per_pair: f64,
}

/// `rounds` rounds of `batch` publish+unpublish pairs per path, paths
/// interleaved; each pair uses one of a few volumes on one of two nodes.
/// `only`: the ids of the paths to time (empty: all), so a profiler sees one path alone.
pub async fn per_call(
    rounds: usize,
    batch: usize,
    warmup: usize,
    only: &[String],
) -> anyhow::Result<CsiPerCall> {
    let dir = tempfile::Builder::new()
        .prefix("drivelab-bench-csi-sock-")
        .tempdir()?;
    let hook = Arc::new(IdleHook::default());

    let lab = LabDirector::start(2, hook.clone(), Backing::Mem).await?;
    let lab_driver = DriverRt::start(lab.listener.url(), &dir.path().join("lab.sock")).await?;
    let kube = KubeFake::new(Arc::new(MemStore::default()), lab.gate.clone(), 7)
        .map_err(|e| anyhow!("{e}"))?;
    let slot: KubeSlot = Arc::new(RwLock::new(kube));
    let attacher = Attacher::connect(&lab_driver.socket, slot, lab.gate.clone())
        .await
        .map_err(|e| anyhow!("attacher: {e}"))?;
    let lab_bare = Bare::connect(&lab_driver.socket).await?;

    let sled = LabDirector::start(2, hook.clone(), Backing::Sled).await?;
    let sled_driver = DriverRt::start(sled.listener.url(), &dir.path().join("sled.sock")).await?;
    let sled_bare = Bare::connect(&sled_driver.socket).await?;

    let stub = DirectorStub::default();
    let stub_url = stub.serve().await?;
    let stub_driver = DriverRt::start(stub_url, &dir.path().join("bare.sock")).await?;
    let bare = Bare::connect(&stub_driver.socket).await?;
    let stub_nodes = vec!["stub-node-0".to_string(), "stub-node-1".to_string()];

    // A few volumes per backend, made once (not measured).
    const VOLS: usize = 3;
    let mut lab_vols = Vec::new();
    let mut sled_vols = Vec::new();
    let mut bare_vols = Vec::new();
    for i in 0..VOLS {
        lab_vols.push(lab_bare.create(&format!("pvc-bench-lab-{i}")).await?);
        sled_vols.push(sled_bare.create(&format!("pvc-bench-sled-{i}")).await?);
        bare_vols.push(bare.create(&format!("pvc-bench-bare-{i}")).await?);
    }

    let via_attacher = Path_::Attacher(attacher);
    let lab_direct = Path_::Bare(lab_bare.clone());
    let sled_direct = Path_::Bare(sled_bare.clone());
    let bare_path = Path_::Bare(bare.clone());
    let paths: [(&'static str, &'static str, &Path_, &[String], &[String]); 4] = [
        (
            "lab",
            "fake attacher -> gate+history -> bosh-csi -> fake Director -> fake CPI (MemStore, as the engine)",
            &via_attacher,
            &lab_vols,
            &lab.nodes,
        ),
        (
            "lab_driver_direct",
            "bare client -> bosh-csi -> fake Director -> fake CPI (MemStore): no attacher",
            &lab_direct,
            &lab_vols,
            &lab.nodes,
        ),
        (
            "sled_director_direct",
            "bare client -> bosh-csi -> fake Director -> fake CPI (sled, the engine before session 12): no attacher",
            &sled_direct,
            &sled_vols,
            &sled.nodes,
        ),
        (
            "bare",
            "bare client -> bosh-csi -> Director stub (tasks done at once)",
            &bare_path,
            &bare_vols,
            &stub_nodes,
        ),
    ];
    let mut publish: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    let mut unpublish: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    // CPU of the whole process around each call (see percall::Series::cpu_s).
    let mut publish_cpu = vec![0.0; paths.len()];
    let mut unpublish_cpu = vec![0.0; paths.len()];
    let mut k = 0usize;
    for round in 0..(rounds + 1) {
        for (i, (id, _, p, vols, nodes)) in paths.iter().enumerate() {
            if !crate::percall::timed(only, id) {
                continue;
            }
            let count = if round == 0 { warmup } else { batch };
            for _ in 0..count {
                k += 1;
                let v = &vols[k % vols.len()];
                let node = &nodes[k % nodes.len()];
                let c0 = cpu_seconds();
                let dp = p.publish(v, node).await?;
                let c1 = cpu_seconds();
                let du = p.unpublish(v, node).await?;
                let c2 = cpu_seconds();
                if round > 0 {
                    publish[i].push(dp.as_secs_f64() * 1e6);
                    unpublish[i].push(du.as_secs_f64() * 1e6);
                    publish_cpu[i] += c1 - c0;
                    unpublish_cpu[i] += c2 - c1;
                }
            }
        }
    }
    // Gated calls per lab pair: each is a Call and a Reply event.
    let before = lab.history.len();
    for j in 0..5 {
        via_attacher
            .publish(&lab_vols[0], &lab.nodes[j % 2])
            .await?;
        via_attacher
            .unpublish(&lab_vols[0], &lab.nodes[j % 2])
            .await?;
    }
    let events = lab.history.events_from(before);
    let gated_calls_per_pair = events.len() as f64 / 2.0 / 5.0;
    // Task polls per pair: 2 when every task was done at the first poll; more
    // means the driver slept its poll interval (the fake Director's jobs run
    // on its workers, as a real Director's do; the stub's are done at once).
    let task_polls_per_pair = drivelab_fakes::history::calls(&events)
        .iter()
        .filter(|c| c.op == "tasks.get")
        .count() as f64
        / 5.0;
    let mut series = Vec::new();
    for (i, (id, what, ..)) in paths.iter().enumerate() {
        series.push(Series {
            id: leak(format!("publish_{id}")),
            what,
            us: std::mem::take(&mut publish[i]),
            cpu_s: publish_cpu[i],
        });
        series.push(Series {
            id: leak(format!("unpublish_{id}")),
            what,
            us: std::mem::take(&mut unpublish[i]),
            cpu_s: unpublish_cpu[i],
        });
    }
    drop((lab_driver, sled_driver, stub_driver));
    drop(lab.director);
    drop(sled.director);
    Ok(CsiPerCall {
        series,
        gated_calls_per_pair,
        task_polls_per_pair,
    })
}

/// Series ids are `&'static str`; the handful made here live for the process.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Volume growth at fakes level: `n` volumes created, each attached to one of
/// `vms` VMs and detached again, through bosh-csi (bare client) → fake
/// Director → fake CPI over MemStore (as the engine). Wall, CPU and peak RSS of this process.
pub async fn growth(n: usize, vms: u32) -> anyhow::Result<Value> {
    let dir = tempfile::Builder::new()
        .prefix("drivelab-bench-csi-growth-")
        .tempdir()?;
    let rss_before = peak_rss_mib();
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    let lab = LabDirector::start(vms, Arc::new(IdleHook::default()), Backing::Mem).await?;
    let driver = DriverRt::start(lab.listener.url(), &dir.path().join("ctl.sock")).await?;
    let client = Bare::connect(&driver.socket).await?;
    let setup_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    // Wall per tenth, to see where within a run the time goes.
    let mut tenths = Vec::new();
    let mut mark = Instant::now();
    for i in 0..n {
        let v = client.create(&format!("pvc-growth-{i:06}")).await?;
        let node = &lab.nodes[i % lab.nodes.len()];
        client.publish(&v, node).await?;
        client.unpublish(&v, node).await?;
        if (i + 1) % (n / 10).max(1) == 0 {
            tenths.push(mark.elapsed().as_secs_f64());
            mark = Instant::now();
        }
    }
    let wall = t.elapsed().as_secs_f64();
    let disks = lab.director.disks().len();
    let attached = lab
        .director
        .disks()
        .iter()
        .filter(|d| d.instance_id.is_some())
        .count();
    if disks < n || attached != 0 {
        bail!("after the run the Director has {disks} disks ({attached} attached), expected {n} (0 attached)");
    }
    drop(driver);
    Ok(json!({
        "n": n,
        "vms": vms,
        "wall_s": wall,
        "setup_s": setup_s,
        "cpu_s": cpu_seconds() - cpu0,
        "peak_rss_mib": peak_rss_mib(),
        "rss_before_mib": rss_before,
        "wall_per_tenth_s": tenths,
        "history_events": lab.history.len(),
    }))
}

/// The bare baseline's Director: UAA token, dynamic-disk list/create/attach/
/// detach/delete and tasks, from an in-memory map, every task done at once.
#[derive(Clone, Default)]
pub struct DirectorStub(Arc<Mutex<StubInner>>);

#[derive(Default)]
struct StubInner {
    base: String,
    /// disk name → (cid, attached instance)
    disks: BTreeMap<String, (String, Option<String>)>,
    /// task id → result JSON
    results: BTreeMap<u64, Value>,
    next_task: u64,
}

impl DirectorStub {
    /// Serve on 127.0.0.1 (random port) until the runtime ends; returns `http://addr`.
    pub async fn serve(&self) -> anyhow::Result<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        self.0.lock().unwrap_or_else(|p| p.into_inner()).base = url.clone();
        let app = axum::Router::new()
            .fallback(stub_handle)
            .with_state(self.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(url)
    }
}

fn stub_reply(status: StatusCode, body: Value) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_default()
}

fn task(s: &mut StubInner, result: Value) -> Response {
    s.next_task += 1;
    let id = s.next_task;
    s.results.insert(id, result);
    Response::builder()
        .status(StatusCode::FOUND)
        .header("location", format!("/tasks/{id}"))
        .body(Body::empty())
        .unwrap_or_default()
}

async fn stub_handle(
    State(stub): State<DirectorStub>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    let mut s = stub.0.lock().unwrap_or_else(|p| p.into_inner());
    let path = uri.path().to_string();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match (method.as_str(), segs.as_slice()) {
        ("GET", ["info"]) => stub_reply(
            StatusCode::OK,
            json!({"name": "stub", "user_authentication": {"type": "uaa", "options": {"url": s.base}}}),
        ),
        ("POST", ["oauth", "token"]) => stub_reply(
            StatusCode::OK,
            json!({"access_token": "stub-token", "token_type": "bearer", "expires_in": 3600}),
        ),
        ("GET", ["dynamic_disks"]) => {
            let list: Vec<Value> = s
                .disks
                .iter()
                .map(|(name, (cid, inst))| {
                    json!({"name": name, "disk_cid": cid, "deployment": DEPLOYMENT,
                        "instance": inst, "size": 1024, "disk_pool_name": POOL})
                })
                .collect();
            stub_reply(StatusCode::OK, Value::Array(list))
        }
        ("POST", ["dynamic_disks"]) => {
            let name = body["disk_name"].as_str().unwrap_or("").to_string();
            let cid = format!("stub-disk-{}", s.disks.len());
            s.disks.insert(name, (cid.clone(), None));
            task(&mut s, json!({"disk_cid": cid}))
        }
        ("POST", ["dynamic_disks", name, "attach"]) => {
            let inst = body["instance_id"].as_str().map(str::to_string);
            if let Some(d) = s.disks.get_mut(*name) {
                d.1 = inst;
            }
            task(&mut s, Value::Null)
        }
        ("POST", ["dynamic_disks", name, "detach"]) => {
            if let Some(d) = s.disks.get_mut(*name) {
                d.1 = None;
            }
            task(&mut s, Value::Null)
        }
        ("DELETE", ["dynamic_disks", name]) => {
            s.disks.remove(*name);
            task(&mut s, Value::Null)
        }
        ("GET", ["tasks", id, "output"]) => {
            let r = id
                .parse::<u64>()
                .ok()
                .and_then(|id| s.results.get(&id).cloned())
                .unwrap_or(Value::Null);
            stub_reply(StatusCode::OK, r)
        }
        ("GET", ["tasks", id]) => stub_reply(
            StatusCode::OK,
            json!({"id": id.parse::<u64>().unwrap_or(0), "state": "done"}),
        ),
        _ => stub_reply(
            StatusCode::NOT_FOUND,
            json!({"code": 0, "description": "stub: no such route"}),
        ),
    }
}

//! Per-call overhead: the same DriverGrantBucketAccess (a new account each
//! time, one bucket made first) through the lab's full path, against a bare
//! tonic client whose driver talks to the trivial stub in `stub.rs`, plus two
//! intermediate paths that split the difference into its parts.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use base64::Engine as _;
use cosi_s3::DriverConfig;
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::cosi_sidecar::{connect_unix, CosiSidecar, DriverReply, DriverRequest};
use drivelab_fakes::gate::{CallSpec, Delivery, Gate, GateHook, Verdict};
use drivelab_fakes::history::{CallId, Component, History, Outcome};
use drivelab_fakes::kube::{Grant, Kind, KubeFake};
use drivelab_fakes::s3::{S3Config, S3Fake};
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::{MemStore, SledStore, Store, StoreError};
use drivelab_proto::cosi::provisioner_client::ProvisionerClient;
use drivelab_proto::cosi::{
    AuthenticationType, DriverCreateBucketRequest, DriverGrantBucketAccessRequest,
};
use serde_json::{json, Value};
use tonic::transport::Channel;

use crate::measure::{cpu_seconds, median, quantile};
use crate::stub::Stub;

const ADMIN_NS: &str = "drivelab-system";
const ADMIN_SECRET: &str = "s3-admin";
const ADMIN_KEY: &str = "drivelab-admin";
const ADMIN_SECRET_KEY: &str = "bench-admin-secret-0123456789abcdefghij";
const STATE_NS: &str = "cosi-s3-system";
const BUCKET: &str = "bench-bucket";

/// The driver under test on a runtime of its own (1 worker), as the engine runs it.
struct DriverRt {
    rt: Option<tokio::runtime::Runtime>,
    socket: PathBuf,
}

impl DriverRt {
    async fn start(
        kube_url: String,
        kube_token_file: String,
        socket: &Path,
    ) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("driver")
            .enable_all()
            .build()?;
        let config = DriverConfig {
            kube_url,
            kube_token_file,
            // The bench's fakes serve plain http: the same for every path it compares.
            kube_ca_file: String::new(),
            state_namespace: STATE_NS.into(),
            mutants: vec![],
            policy_layout: Default::default(),
            secret_length: 0,
        };
        let path = socket.to_path_buf();
        rt.spawn(async move { cosi_s3::serve_unix(config, &path, std::future::pending()).await });
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
        bail!("driver did not open {}", socket.display())
    }
}

impl Drop for DriverRt {
    fn drop(&mut self) {
        // Never drop a runtime inside async context; shut it down instead.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// What the engine's LabHook does on a call when no fault is armed: lock and
/// count per component.operation. (LabHook itself is private to the engine.)
#[derive(Default)]
pub struct IdleHook {
    counts: Mutex<BTreeMap<(Component, String), u32>>,
}

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl GateHook for IdleHook {
    fn before<'a>(&'a self, _id: CallId, call: &'a CallSpec) -> Boxed<'a, Verdict> {
        Box::pin(async move {
            *self
                .counts
                .lock()
                .unwrap()
                .entry((call.to, call.op.to_string()))
                .or_insert(0) += 1;
            Verdict::Proceed
        })
    }
    fn after<'a>(
        &'a self,
        _id: CallId,
        _call: &'a CallSpec,
        _o: &'a Outcome,
    ) -> Boxed<'a, Delivery> {
        Box::pin(async move {
            let _guard = self.counts.lock().unwrap();
            Delivery::Deliver
        })
    }
}

/// What the fakes' stores sit on.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// sled, as the engine opened it before session 12.
    Sled,
    /// sled with an fsync on every `flush` (what `SledStore` did before issue 9's fix).
    SledFsyncEachWrite,
    /// `MemStore`, as the engine wires a run's fakes.
    Mem,
}

/// `SledStore` as it was before the fix: every `flush` (one per mutating
/// request) is a real fsync. Kept here so before/after is measured in one run.
pub struct FsyncEachWrite(pub SledStore);

impl Store for FsyncEachWrite {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.get(key)
    }
    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.0.put(key, value)
    }
    fn remove(&self, key: &str) -> Result<bool, StoreError> {
        self.0.remove(key)
    }
    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.0.scan(prefix)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.0.sync()
    }
}

/// The lab's fakes, wired as `systems::cosi::fakes::FakeSet` wires them, over sled or memory.
struct LabFakes {
    _dir: tempfile::TempDir,
    kube: KubeFake,
    history: History,
    hook: Arc<IdleHook>,
    s3_url: String,
    kube_url: String,
    /// A file holding the driver's bearer token for `kube_url`.
    token_file: String,
    _listeners: Vec<Listener>,
}

impl LabFakes {
    async fn start(backing: Backing) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("drivelab-bench-")
            .tempdir()?;
        let history = History::new(SimClock::new());
        let hook = Arc::new(IdleHook::default());
        let (s3_store, kube_store): (Arc<dyn Store>, Arc<dyn Store>) = match backing {
            Backing::Sled | Backing::SledFsyncEachWrite => {
                let db = sled::Config::new().path(dir.path().join("state")).open()?;
                let (s3, kube) = (SledStore::open(&db, "s3")?, SledStore::open(&db, "kube")?);
                if backing == Backing::Sled {
                    (Arc::new(s3), Arc::new(kube))
                } else {
                    (Arc::new(FsyncEachWrite(s3)), Arc::new(FsyncEachWrite(kube)))
                }
            }
            Backing::Mem => (Arc::new(MemStore::default()), Arc::new(MemStore::default())),
        };
        let s3 = S3Fake::new(
            s3_store,
            gate(&history, &hook),
            S3Config {
                admin_access_key: ADMIN_KEY.into(),
                admin_secret_key: ADMIN_SECRET_KEY.into(),
                region: "us-east-1".into(),
                backend: Default::default(),
            },
        )
        .map_err(|e| anyhow!("{e}"))?;
        let kube =
            KubeFake::new(kube_store, gate(&history, &hook), 7).map_err(|e| anyhow!("{e}"))?;
        let s3_l = s3.serve(loopback()).await?;
        let kube_l = kube.serve(loopback()).await?;
        kube.create(Kind::Secret, admin_secret())
            .map_err(|e| anyhow!("admin secret: {e}"))?;
        // The driver is deployed in its state namespace, as the lab's is.
        kube.declare_namespace(STATE_NS)
            .map_err(|e| anyhow!("driver namespace: {e}"))?;
        let token_file = dir.path().join("token");
        std::fs::write(
            &token_file,
            kube.access()
                .issue(Grant::cosi_driver(STATE_NS, "cosi-driver")),
        )?;
        Ok(Self {
            _dir: dir,
            kube,
            history,
            hook,
            s3_url: s3_l.url(),
            kube_url: kube_l.url(),
            token_file: token_file.display().to_string(),
            _listeners: vec![s3_l, kube_l],
        })
    }
}

fn gate(history: &History, hook: &Arc<IdleHook>) -> Gate {
    let g = Gate::new(history.clone());
    g.set_hook(hook.clone());
    g
}

fn admin_secret() -> Value {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": ADMIN_SECRET, "namespace": ADMIN_NS},
        "type": "Opaque",
        "data": {"accessKey": b64(ADMIN_KEY), "secretKey": b64(ADMIN_SECRET_KEY)},
    })
}

fn params(endpoint: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("endpoint".to_string(), endpoint.to_string()),
        (
            "objectStoreUserSecretName".to_string(),
            ADMIN_SECRET.to_string(),
        ),
        (
            "objectStoreUserSecretNamespace".to_string(),
            ADMIN_NS.to_string(),
        ),
    ])
}

/// One way of sending the grant.
enum Path_ {
    /// Fake sidecar → gate → history → driver → gated S3/admin + kube fakes.
    Sidecar {
        sidecar: CosiSidecar,
        endpoint: String,
    },
    /// A plain tonic client → driver (whose backend is whatever it was started against).
    Bare {
        client: ProvisionerClient<Channel>,
        endpoint: String,
    },
}

impl Path_ {
    async fn create_bucket(&self) -> anyhow::Result<()> {
        match self {
            Path_::Sidecar { sidecar, endpoint } => {
                let ex = sidecar
                    .replay(
                        DriverRequest::Create {
                            name: BUCKET.into(),
                            parameters: params(endpoint).into(),
                        },
                        None,
                        None,
                    )
                    .await;
                match ex.reply {
                    DriverReply::Created { .. } => Ok(()),
                    other => bail!("create through the sidecar: {other:?}"),
                }
            }
            Path_::Bare { client, endpoint } => {
                client
                    .clone()
                    .driver_create_bucket(DriverCreateBucketRequest {
                        name: BUCKET.into(),
                        parameters: params(endpoint).into_iter().collect(),
                    })
                    .await
                    .context("bare create")?;
                Ok(())
            }
        }
    }

    /// One grant for a fresh account; its wall time.
    async fn grant(&self, account: &str) -> anyhow::Result<Duration> {
        let t = Instant::now();
        match self {
            Path_::Sidecar { sidecar, endpoint } => {
                let req = DriverRequest::Grant {
                    bucket_id: BUCKET.into(),
                    name: account.into(),
                    auth: AuthenticationType::Key as i32,
                    parameters: params(endpoint).into(),
                };
                let ex = sidecar.replay(req, None, None).await;
                let d = t.elapsed();
                match ex.reply {
                    DriverReply::Granted { .. } => Ok(d),
                    other => bail!("grant through the sidecar: {other:?}"),
                }
            }
            Path_::Bare { client, endpoint } => {
                let r = client
                    .clone()
                    .driver_grant_bucket_access(DriverGrantBucketAccessRequest {
                        bucket_id: BUCKET.into(),
                        name: account.into(),
                        authentication_type: AuthenticationType::Key as i32,
                        parameters: params(endpoint).into_iter().collect(),
                    })
                    .await;
                let d = t.elapsed();
                r.context("bare grant")?;
                Ok(d)
            }
        }
    }
}

/// Latencies of one path, in microseconds.
pub struct Series {
    /// Short id used in the JSON.
    pub id: &'static str,
    /// What the path is.
    pub what: &'static str,
    /// Each call's wall time.
    pub us: Vec<f64>,
    /// The process's CPU (user + sys, every thread: client, sidecar, driver,
    /// fakes or stub all live in it) over this path's measured batches.
    pub cpu_s: f64,
}

impl Series {
    /// `{median_us, p10_us, p90_us, n, cpu_us_per_call}`.
    pub fn summary(&self) -> Value {
        json!({
            "what": self.what,
            "median_us": median(&self.us),
            "p10_us": quantile(&self.us, 0.1),
            "p90_us": quantile(&self.us, 0.9),
            "n": self.us.len(),
            "cpu_us_per_call": self.cpu_s * 1e6 / self.us.len().max(1) as f64,
        })
    }
}

/// Everything `run` measured.
pub struct PerCall {
    /// lab, lab-driver-direct, sled-fakes-direct, bare, lab-fsync-each-write (in that order).
    pub series: Vec<Series>,
    /// Gate calls the lab path made per grant (history entries / grants).
    pub gated_calls_per_grant: f64,
}

/// Whether path `id` is timed under `--only` (`only` empty: every path).
pub fn timed(only: &[String], id: &str) -> bool {
    only.is_empty() || only.iter().any(|o| o == id)
}

/// Measure: `rounds` rounds, each `batch` grants per path, paths interleaved
/// so that drift (page cache, CPU frequency, other tenants) hits all alike.
/// `only`: the ids of the paths to time (empty: all), so a profiler sees one path alone.
pub async fn run(
    rounds: usize,
    batch: usize,
    warmup: usize,
    only: &[String],
) -> anyhow::Result<PerCall> {
    let dir = tempfile::Builder::new()
        .prefix("drivelab-bench-sock-")
        .tempdir()?;

    // The lab's full path, and the same driver reached without the sidecar.
    let lab = LabFakes::start(Backing::Mem).await?;
    let lab_driver = DriverRt::start(
        lab.kube_url.clone(),
        lab.token_file.clone(),
        &dir.path().join("lab.sock"),
    )
    .await?;
    let slot = Arc::new(RwLock::new(lab.kube.clone()));
    let sidecar =
        CosiSidecar::connect(&lab_driver.socket, slot, gate(&lab.history, &lab.hook)).await?;
    let via_sidecar = Path_::Sidecar {
        sidecar,
        endpoint: lab.s3_url.clone(),
    };
    let lab_direct = Path_::Bare {
        client: ProvisionerClient::new(connect_unix(&lab_driver.socket).await?),
        endpoint: lab.s3_url.clone(),
    };

    // The lab's full path with the old store (fsync per request): the "before".
    let old = LabFakes::start(Backing::SledFsyncEachWrite).await?;
    let old_driver = DriverRt::start(
        old.kube_url.clone(),
        old.token_file.clone(),
        &dir.path().join("old.sock"),
    )
    .await?;
    let old_slot = Arc::new(RwLock::new(old.kube.clone()));
    let old_sidecar =
        CosiSidecar::connect(&old_driver.socket, old_slot, gate(&old.history, &old.hook)).await?;
    let via_old_sidecar = Path_::Sidecar {
        sidecar: old_sidecar,
        endpoint: old.s3_url.clone(),
    };

    // The same fakes over sled (the engine before session 12), reached directly.
    let sled = LabFakes::start(Backing::Sled).await?;
    let sled_driver = DriverRt::start(
        sled.kube_url.clone(),
        sled.token_file.clone(),
        &dir.path().join("sled.sock"),
    )
    .await?;
    let sled_direct = Path_::Bare {
        client: ProvisionerClient::new(connect_unix(&sled_driver.socket).await?),
        endpoint: sled.s3_url.clone(),
    };

    // The bare baseline: the stub answers admin, S3 and kube.
    let stub = Stub::default();
    let stub_url = stub.serve().await?;
    stub.put_object("secrets", ADMIN_NS, ADMIN_SECRET, admin_secret());
    // The stub does not authenticate; the driver still sends a token, as on the lab's paths.
    let stub_token = dir.path().join("stub-token");
    std::fs::write(&stub_token, "stub")?;
    let bare_driver = DriverRt::start(
        stub_url.clone(),
        stub_token.display().to_string(),
        &dir.path().join("bare.sock"),
    )
    .await?;
    let bare = Path_::Bare {
        client: ProvisionerClient::new(connect_unix(&bare_driver.socket).await?),
        endpoint: stub_url,
    };

    let paths: [(&'static str, &'static str, &Path_); 5] = [
        (
            "lab",
            "sidecar -> gate+history -> driver -> gated S3/admin + kube fakes (MemStore, as the engine)",
            &via_sidecar,
        ),
        (
            "lab_driver_direct",
            "bare client -> driver -> gated fakes (MemStore): no sidecar",
            &lab_direct,
        ),
        (
            "sled_fakes_direct",
            "bare client -> driver -> gated fakes (sled, the engine before session 12): no sidecar",
            &sled_direct,
        ),
        ("bare", "bare client -> driver -> trivial axum stub", &bare),
        (
            "lab_fsync_each_write",
            "as lab, stores fsync on every flush (SledStore before the issue-9 fix)",
            &via_old_sidecar,
        ),
    ];
    // lab and lab_driver_direct share a driver and fakes, so one bucket does for both.
    via_sidecar.create_bucket().await?;
    via_old_sidecar.create_bucket().await?;
    sled_direct.create_bucket().await?;
    bare.create_bucket().await?;

    let mut series: Vec<Series> = paths
        .iter()
        .map(|(id, what, _)| Series {
            id,
            what,
            us: Vec::new(),
            cpu_s: 0.0,
        })
        .collect();
    let mut n = 0usize;
    for round in 0..(rounds + 1) {
        for (i, (id, _, p)) in paths.iter().enumerate() {
            if !timed(only, id) {
                continue;
            }
            let count = if round == 0 { warmup } else { batch };
            // CPU, unlike wall time, does not count waiting to be scheduled:
            // the steadier figure on a shared machine.
            let cpu0 = cpu_seconds();
            for _ in 0..count {
                n += 1;
                let d = p.grant(&format!("ba-bench-{id}-{n}")).await?;
                if round > 0 {
                    series[i].us.push(d.as_secs_f64() * 1e6);
                }
            }
            if round > 0 {
                series[i].cpu_s += cpu_seconds() - cpu0;
            }
        }
    }
    // How many gated calls one lab grant is: each is a Call and a Reply event,
    // and a replay adds one Note.
    let before = lab.history.len();
    for k in 0..5 {
        via_sidecar.grant(&format!("ba-bench-count-{k}")).await?;
    }
    let gated_calls_per_grant = ((lab.history.len() - before) as f64 - 5.0) / 2.0 / 5.0;
    drop((lab_driver, old_driver, sled_driver, bare_driver));
    Ok(PerCall {
        series,
        gated_calls_per_grant,
    })
}

//! The CSI lab: the CSI sidecars over the Kubernetes fake, one kubelet and
//! mount table per node, and the driver under test (a controller process and
//! one node process per node) — with the BOSH backend (the fake Director with
//! its CPI, agents, UAA and block API) when the scenario has `bosh:`. It runs
//! on the same virtual clock, gates, fault hook, history and run loop as the
//! COSI lab.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::cpi::Attachment;
use drivelab_fakes::csi::attacher::Attacher;
use drivelab_fakes::csi::cluster::{CsiSidecars, CsiTarget};
use drivelab_fakes::csi::kubelet::{self, NodeAgent};
use drivelab_fakes::csi::mounts::{DeviceSource, Filesystems, MountTable};
use drivelab_fakes::csi::provisioner::Provisioner;
use drivelab_fakes::csi::snapshotter::Snapshotter;
use drivelab_fakes::csi::{DriverReply, DriverRequest, Exchange, KubeSlot, Reconcile};
use drivelab_fakes::director::{Director, Job};
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::{Component, EventKind, History};
use drivelab_fakes::json::str_at;
use drivelab_fakes::kube::{Kind, KubeFake};
use drivelab_fakes::secret::Secret;
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::{MemStores, Store};
use futures_util::future::BoxFuture;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::{json, Value};

use super::cbt::{Cbt, SESSION_TTL};
use super::checks::{CsiObservations, Sample};
use super::snapshot;
use crate::engine::driver::{self, Driver, InProcessDriver};
use crate::engine::hook::{LabControl, LabHook};
use crate::engine::schedule::Scheduler;
use crate::engine::system::{self, StepsRecord, SystemLab};
use crate::engine::{external, line_of, replay_command, ExpectFailure, RunOutcome, StepSnapshots};
use crate::scenario::{Bosh, Csi, Expectation, Mutant, NodeCallStep, Restartable, Scenario, Step};
use crate::scenario::{BoshStep, CsiStep};
use crate::snapshot::Normalizer;
use crate::systems::bosh::backend::{operator_job, BoshBackend, DirectorServer, CLIENT_ID};
use crate::systems::{Observed, Record};
use drivelab_proto::csi;

/// Resync rounds one convergence may take before the lab gives up on it.
const MAX_ROUNDS: usize = 400;

/// Run one BOSH/CSI scenario to completion.
pub(crate) async fn run(
    scn: &Scenario,
    seed: u64,
    mutants: &[Mutant],
    snapshots: StepSnapshots,
    recorder: Option<&crate::runs::Recorder>,
) -> anyhow::Result<RunOutcome> {
    let log_start = crate::logcap::position();
    let csi = scn
        .csi
        .clone()
        .ok_or_else(|| anyhow!("not a CSI scenario"))?;
    let mut lab = CsiLab::start(scn, &csi, seed, mutants).await?;
    lab.recorder = recorder.cloned();
    let result = system::run_steps(&mut lab, scn, snapshots).await;
    let outcome = match result {
        Ok(()) => lab.finish(scn, seed, mutants, log_start).await,
        Err(e) => Err(e),
    };
    lab.stop().await;
    outcome
}

/// One node: its mount table, its node plugin and the kubelet that drives it.
struct Node {
    name: String,
    /// Its CSI node id: the BOSH instance id with the BOSH backend, else its name.
    node_id: String,
    table: MountTable,
    _table_l: Listener,
    plugin: Arc<Driver>,
    /// The node plugin's socket.
    socket: PathBuf,
}

/// What the fault hook may ask of this lab: crash the controller, restart the Director.
struct Control {
    crash: driver::DriverCrash,
    /// The Director, when the scenario has the BOSH backend.
    director: Option<std::sync::Weak<DirectorServer>>,
    history: History,
    hook: std::sync::Weak<LabHook>,
}

impl LabControl for Control {
    fn crash_driver(&self, during: drivelab_fakes::history::CallId) -> BoxFuture<'_, ()> {
        Box::pin(self.crash.crash(during))
    }

    fn restart(&self, component: Component) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.history.record(EventKind::Fault {
                call: None,
                fault: "restart".into(),
                detail: format!("{component} restarting (state kept, connections broken)"),
            });
            let Some(d) = self.director.as_ref().and_then(|d| d.upgrade()) else {
                self.history.record(EventKind::Note {
                    component: Component::Lab,
                    text: format!("restart of {component}: this scenario has no BOSH backend"),
                });
                return;
            };
            if component != Component::Director {
                self.history.record(EventKind::Note {
                    component: Component::Lab,
                    text: format!("restart of {component} is not supported in the BOSH lab"),
                });
                return;
            }
            let busy = self.hook.upgrade().map(|h| h.maintenance());
            let history = self.history.clone();
            let done = tokio::spawn(async move {
                if let Err(e) = d.restart().await {
                    history.record(EventKind::Note {
                        component: Component::Lab,
                        text: format!("Director restart failed: {e:#}"),
                    });
                }
                drop(busy);
            });
            let _ = done.await;
        })
    }
}

/// What a step boundary reads of the state: the lists its sample and its
/// snapshot both show.
struct Boundary {
    iaas_disks: Vec<drivelab_fakes::cpi::CpiDiskView>,
    attachments: Vec<Attachment>,
    disks: Vec<drivelab_fakes::director::DiskView>,
    mounts: Vec<drivelab_fakes::csi::mounts::MountView>,
    pvs: Vec<Arc<Value>>,
    volume_attachments: Vec<Arc<Value>>,
}

struct CsiLab {
    _dir: tempfile::TempDir,
    clock: SimClock,
    history: History,
    hook: Arc<LabHook>,
    sched: Scheduler,
    /// The BOSH backend, when the scenario stands it up (`bosh:`).
    backend: Option<BoshBackend>,
    kube: KubeFake,
    sidecars: Arc<CsiSidecars>,
    controller: Arc<Driver>,
    nodes: Vec<Node>,
    converge_within: Duration,
    /// PVCs and pods the scenario made, and what it asked of each pod.
    read_only_pods: BTreeMap<String, bool>,
    /// (node, path) of mounts the scenario's own node_stage/node_publish made.
    lab_mounts: std::collections::BTreeSet<(String, String)>,
    samples: super::samples::Samples,
    /// What the last sample read, for the snapshot taken at the same step
    /// boundary (cleared when a step begins).
    boundary: Option<Boundary>,
    disk_names: BTreeMap<String, String>,
    /// Failed expectations and per-step snapshots (the run loop's).
    record: StepsRecord,
    /// Which sidecar targets the converge loop may pass over.
    resync: super::resync::Resync,
    not_converged: Vec<String>,
    pending: Vec<String>,
    step_exchanges_from: usize,
    norm: Normalizer,
    cbt: Cbt,
    /// Where the run's events go as they happen (`drivelab runs`).
    recorder: Option<crate::runs::Recorder>,
    /// The code of the previous step's own call, for steps the lab makes itself
    /// (snapshots, backups): what `expect: { code }` after them reads.
    last_step_code: Option<String>,
    /// The driver's name as it reports it (GetPluginInfo).
    driver_name: String,
    /// The controller's socket (the lab's own end-of-run listing dials it).
    ctl_sock: PathBuf,
    /// The spec sweep's cases, once a `spec_sweep:` step ran.
    sweep: Option<Vec<super::sweep::SweepCase>>,
    /// What the sweep's calls made and removed.
    sweep_ledger: super::sweep::SweepLedger,
}

impl SystemLab for CsiLab {
    fn history(&self) -> &History {
        &self.history
    }

    fn hook(&self) -> &LabHook {
        &self.hook
    }

    fn checkpoint(&self, steps_done: usize) {
        CsiLab::checkpoint(self, steps_done);
    }

    fn begin_step(&mut self) {
        self.boundary = None;
        self.step_exchanges_from = self.exchange_count();
        self.last_step_code = None;
    }

    fn apply<'a>(
        &'a mut self,
        _scn: &'a Scenario,
        i: usize,
        step: &'a crate::scenario::Located<Step>,
        at: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            match &step.value {
                Step::Restart(r) => {
                    self.history.record(EventKind::Fault {
                        call: None,
                        fault: "restart".into(),
                        detail: format!("{} restarting (step)", r.component.component()),
                    });
                    match r.component {
                        Restartable::CsiSnapshotMetadata => self.cbt.restart_sidecar().await?,
                        Restartable::Director => self.bosh()?.director.restart().await?,
                        other => {
                            return Err(anyhow!("a CSI lab cannot restart {}", other.component()))
                        }
                    }
                    self.converge().await?;
                }
                Step::Bosh(BoshStep::DirectorDown) => {
                    self.history.record(EventKind::Fault {
                        call: None,
                        fault: "director_down".into(),
                        detail: "the Director stops answering (connections refused)".into(),
                    });
                    self.bosh()?.director.down().await;
                }
                Step::Bosh(BoshStep::DirectorUp) => {
                    self.history.record(EventKind::Note {
                        component: Component::Lab,
                        text: "the Director answers again".into(),
                    });
                    self.bosh()?.director.up().await?;
                    self.converge().await?;
                }
                Step::Concurrent(steps) => self.concurrent(steps).await?,
                Step::Csi(CsiStep::ResendCreateVolume(r)) => self.resend_create(r).await?,
                Step::Bosh(BoshStep::WriteBlocks(w)) => self.write_blocks(w)?,
                Step::Csi(CsiStep::Snapshot(sn)) => {
                    let uid = self.cbt.snapshot(sn)?;
                    self.norm.id("csi-snapshot", &format!("snapshot-{uid}"));
                    self.norm.id("snapcontent", &format!("snapcontent-{uid}"));
                    self.converge().await?;
                }
                Step::Csi(CsiStep::DeleteSnapshot(sn)) => {
                    self.cbt.delete_snapshot(sn)?;
                    self.converge().await?;
                }
                Step::Bosh(BoshStep::Backup(b)) => {
                    let code = self
                        .cbt
                        .backup(
                            i,
                            b,
                            &self.history,
                            &self.clock,
                            &self.bosh()?.director().cpi().clone(),
                        )
                        .await;
                    self.last_step_code = Some(code);
                }
                Step::Bosh(BoshStep::ReplaySession(r)) => {
                    // A token's expiry is judged on the driver's wall clock:
                    // if time cannot pass for it, expiry cannot be tested,
                    // and answering for the driver would be a false alarm.
                    if r.after.is_some() && !self.controller.wall_clock_follows() {
                        anyhow::bail!(
                            "step {}: replay_session with `after:` lets virtual time pass, but the driver's wall clock cannot follow the lab's (a spawned driver needs libfaketime: install Debian's faketime or set DRIVELAB_LIBFAKETIME; a container's clock is the host's), so token expiry cannot be tested",
                            i + 1
                        );
                    }
                    let code = self.cbt.replay(i, r, &self.history, &self.clock).await;
                    self.last_step_code = Some(code);
                }
                Step::Bosh(BoshStep::ResumeBackup(r)) => {
                    let code = self.cbt.resume(r, &self.history).await;
                    self.last_step_code = Some(code);
                }
                Step::Csi(CsiStep::SpecSweep(sw)) => self.spec_sweep(_scn, sw).await?,
                Step::Csi(CsiStep::NodeStage(n)) => self.node_call(true, n, i, &at).await?,
                Step::Csi(CsiStep::NodePublish(n)) => self.node_call(false, n, i, &at).await?,
                Step::Bosh(BoshStep::Batch(steps)) => self.batch(steps).await?,
                Step::Bosh(BoshStep::Wait(d)) => {
                    self.clock.advance_to(self.clock.now().after(*d));
                }
                other => {
                    let job = self.begin(other)?;
                    if let Some(job) = job {
                        self.run_job(job).await;
                    }
                    self.converge().await?;
                }
            }
            Ok(())
        })
    }

    fn expect(&self, e: &Expectation) -> Vec<String> {
        CsiLab::expect(self, e)
    }

    fn observe(&mut self, i: usize) {
        self.sample(i);
    }

    fn render_snapshot(&mut self) -> anyhow::Result<String> {
        Ok(CsiLab::render_snapshot(self))
    }

    fn steps_record(&mut self) -> &mut StepsRecord {
        &mut self.record
    }
}

impl CsiLab {
    async fn start(
        scn: &Scenario,
        csi: &Csi,
        seed: u64,
        mutants: &[Mutant],
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("drivelab-csi-")
            .tempdir()
            .context("creating the run directory")?;
        // In memory: every restart the lab does is in-process.
        let stores = MemStores::default();
        let store = |name: &str| -> anyhow::Result<Arc<dyn Store>> { Ok(stores.open(name)) };
        let clock = SimClock::new();
        let history = History::new(clock.clone());
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let sched = Scheduler::new(seed, history.clone());
        let hook = Arc::new(LabHook::new(history.clone(), sched.clone()));
        let gate = || {
            let g = Gate::new(history.clone());
            g.set_hook(hook.clone());
            g
        };
        let mut backend = match &csi.bosh {
            Some(spec) => Some(BoshBackend::start(spec, &store, &gate, &mut rng).await?),
            None => None,
        };
        let sockets = dir.path().join("csi");
        std::fs::create_dir_all(&sockets).context("creating the socket directory")?;
        let refs = BackendRefs {
            bosh: backend.as_ref(),
            sockets: sockets.clone(),
            run_dir: dir.path().to_path_buf(),
            max_volumes_per_node: csi.max_volumes_per_node,
        };
        let (controller, ctl_sock) =
            csi_process(scn, mutants, &CsiRole::Controller, &refs, &clock, &history)?;
        let controller = Arc::new(controller);
        controller
            .start()
            .await
            .with_context(|| format!("starting the CSI controller ({})", scn.driver.describe()))?;

        let kube = KubeFake::new(store("kube")?, gate(), rng.random())
            .map_err(|e| anyhow!("starting the Kubernetes fake: {e}"))?;
        let slot: KubeSlot = Arc::new(std::sync::RwLock::new(kube.clone()));
        let filesystems = Filesystems::default();
        let mut nodes = Vec::new();
        let mut agents = BTreeMap::new();
        for name in &csi.nodes {
            let ctx = NodeCtx {
                scn,
                mutants,
                backend: backend.as_ref(),
                refs: &refs,
                clock: &clock,
                history: &history,
                filesystems: &filesystems,
                slot: &slot,
            };
            let (node, agent) = start_node(name, &ctx, &gate).await?;
            agents.insert(name.clone(), Arc::new(agent));
            nodes.push(node);
        }
        let sidecars = Arc::new(
            connect_sidecars(&ctl_sock, &slot, agents, &gate, scn.driver.call_timeout).await?,
        );
        // The driver's own name (GetPluginInfo, as the provisioner asked it at
        // start) goes wherever Kubernetes names the driver.
        let driver_name = sidecars.provisioner.driver_name().to_string();
        for c in &csi.storage_classes {
            kube.create(
                Kind::StorageClass,
                json!({"metadata":{"name":c.name},"provisioner":driver_name,
                    "reclaimPolicy":c.reclaim_policy, "parameters":c.parameters}),
            )
            .map_err(|e| anyhow!("creating StorageClass {}: {e}", c.name))?;
        }
        let block = backend
            .as_mut()
            .and_then(|b| Some((b.block_l.take()?, b.block_secret.clone())));
        let cbt = Cbt::start(
            &ctl_sock,
            &driver_name,
            &clock,
            &mut rng,
            &slot,
            gate(),
            block,
        )
        .await?;
        hook.set_control(Arc::new(Control {
            crash: driver::DriverCrash {
                driver: Arc::downgrade(&controller),
                crashing: Default::default(),
                history: history.clone(),
                hook: Arc::downgrade(&hook),
                what: "CSI controller",
            },
            director: backend.as_ref().map(|b| Arc::downgrade(&b.director)),
            history: history.clone(),
            hook: Arc::downgrade(&hook),
        }));
        for f in &scn.faults {
            hook.arm(f.value.clone(), &line_of(&scn.path, f));
        }
        let mut norm = Normalizer::default();
        // Paths under the run directory (a driver's own backend on the host)
        // read the same in every run.
        norm.fixed(&dir.path().display().to_string(), "run-dir");
        if let Some(b) = &backend {
            norm.fixed(&b.director_url, "director-url");
            for n in &nodes {
                norm.id("instance", &n.node_id);
            }
        }
        Ok(Self {
            _dir: dir,
            clock,
            history,
            hook,
            sched,
            backend,
            kube,
            sidecars,
            controller,
            nodes,
            converge_within: scn.converge_within,
            read_only_pods: BTreeMap::new(),
            lab_mounts: Default::default(),
            samples: Default::default(),
            boundary: None,
            disk_names: BTreeMap::new(),
            record: Default::default(),
            resync: Default::default(),
            not_converged: Vec::new(),
            pending: Vec::new(),
            step_exchanges_from: 0,
            norm,
            cbt,
            recorder: None,
            last_step_code: None,
            driver_name,
            ctl_sock,
            sweep: None,
            sweep_ledger: Default::default(),
        })
    }

    /// The Director, when the scenario has the BOSH backend.
    fn director(&self) -> Option<Director> {
        self.backend.as_ref().map(BoshBackend::director)
    }

    /// The BOSH backend, for what only it can do (validation keeps such steps
    /// out of `csi:` scenarios; this is the lab's own guard).
    fn bosh(&self) -> anyhow::Result<&BoshBackend> {
        self.backend
            .as_ref()
            .ok_or_else(|| anyhow!("this step needs the BOSH backend (`bosh:`)"))
    }

    async fn stop(&mut self) {
        self.controller.stop().await;
        for n in &self.nodes {
            n.plugin.stop().await;
        }
        if let Some(b) = &self.backend {
            b.director.down().await;
        }
    }

    /// Make the Kubernetes change a step asks for; a VM operation is returned
    /// as a Director job for the caller to run.
    fn begin(&mut self, step: &Step) -> anyhow::Result<Option<Job>> {
        match step {
            Step::Csi(CsiStep::CreateVolume(v)) => {
                let bytes = crate::scenario::bosh::parse_quantity(&v.size).unwrap_or(1 << 30);
                let obj = self
                    .kube
                    .create(
                        Kind::PersistentVolumeClaim,
                        json!({"metadata":{"name":v.name,"namespace":v.namespace},"spec":{
                            "storageClassName":v.class,"accessModes":[v.access.as_str()],
                            "resources":{"requests":{"storage":bytes.to_string()}}}}),
                    )
                    .map_err(|e| anyhow!("creating PVC {}/{}: {e}", v.namespace, v.name))?;
                self.norm
                    .id("pv", &format!("pvc-{}", str_at(&obj, &["metadata", "uid"])));
                Ok(None)
            }
            Step::Csi(CsiStep::DeleteVolume(v)) => {
                self.kube
                    .delete(Kind::PersistentVolumeClaim, Some(&v.namespace), &v.name)
                    .map_err(|e| anyhow!("deleting PVC {}/{}: {e}", v.namespace, v.name))?;
                Ok(None)
            }
            Step::Csi(CsiStep::Publish(p)) => {
                let obj = self
                    .kube
                    .create(
                        Kind::Pod,
                        json!({"metadata":{"name":p.pod,"namespace":p.namespace},"spec":{
                            "nodeName":p.node,
                            "containers":[{"name":"c","image":"busybox"}],
                            "volumes":[{"name":"data","persistentVolumeClaim":{
                                "claimName":p.volume,"readOnly":p.read_only}}]}}),
                    )
                    .map_err(|e| anyhow!("creating pod {}/{}: {e}", p.namespace, p.pod))?;
                let uid = str_at(&obj, &["metadata", "uid"]);
                self.norm.id("pod-uid", &uid);
                self.read_only_pods.insert(uid, p.read_only);
                Ok(None)
            }
            Step::Csi(CsiStep::Unpublish(p)) => {
                self.kube
                    .delete(Kind::Pod, Some(&p.namespace), &p.pod)
                    .map_err(|e| anyhow!("deleting pod {}/{}: {e}", p.namespace, p.pod))?;
                Ok(None)
            }
            Step::Bosh(BoshStep::Deploy(d)) => Ok(Some(Job::Deploy {
                deployment: d.deployment.clone(),
            })),
            Step::Bosh(BoshStep::RollingUpdate(d)) => Ok(Some(Job::RollingUpdate {
                deployment: d.deployment.clone(),
            })),
            Step::Bosh(BoshStep::RecreateVm(n)) => {
                let id = self
                    .nodes
                    .iter()
                    .find(|x| x.name == n.node)
                    .map(|x| x.node_id.clone())
                    .ok_or_else(|| anyhow!("no node {}", n.node))?;
                Ok(Some(Job::Recreate { instance_id: id }))
            }
            _ => Ok(None),
        }
    }

    /// Run a VM operation as the operator would (user `admin`), wait for its task.
    async fn run_job(&self, job: Job) {
        match self.director() {
            Some(d) => operator_job(d, &self.history, job).await,
            None => {
                self.history.record(EventKind::Note {
                    component: Component::Lab,
                    text: format!("operator job {job:?}: this scenario has no BOSH backend"),
                });
            }
        }
    }

    /// Every secret value the run knows of so far.
    fn secrets(&self) -> Vec<Secret> {
        let mut secrets: Vec<Secret> = self
            .backend
            .iter()
            .map(|b| b.client_secret.clone())
            .collect();
        secrets.extend(self.cbt.secrets.iter().cloned());
        for b in self.cbt.backups.values() {
            secrets.extend(b.session.iter().cloned());
            secrets.push(b.client_token.clone());
        }
        secrets
    }

    /// A step boundary: append what happened since the last one to the run's
    /// durable record, every secret known so far redacted.
    fn checkpoint(&self, steps_done: usize) {
        let Some(rec) = &self.recorder else {
            return;
        };
        if let Err(e) = rec.flush(&self.history, steps_done, self.secrets()) {
            tracing::warn!(error = %e, "run record: flush failed");
        }
    }

    /// The CSI volume handle of a bound PVC.
    fn handle_of(&self, ns: &str, claim: &str) -> anyhow::Result<String> {
        let pv = self
            .kube
            .get(Kind::PersistentVolumeClaim, Some(ns), claim)?
            .map(|c| str_at(&c, &["spec", "volumeName"]))
            .unwrap_or_default();
        let handle = self
            .kube
            .get(Kind::PersistentVolume, None, &pv)?
            .map(|p| str_at(&p, &["spec", "csi", "volumeHandle"]))
            .unwrap_or_default();
        if handle.is_empty() {
            return Err(anyhow!("volume {ns}/{claim} is not bound"));
        }
        Ok(handle)
    }

    /// A workload's writes, straight to the IaaS disk (the ground truth the deltas are checked against).
    fn write_blocks(&mut self, w: &crate::scenario::WriteBlocksStep) -> anyhow::Result<()> {
        let director = self.bosh()?.director();
        // A volume the driver never provisioned (a fault, a bug) takes no
        // writes: the workload's failure is the driver's doing, not the lab's.
        let cid = self.handle_of(&w.namespace, &w.volume).ok().and_then(|h| {
            director
                .disks()
                .into_iter()
                .find(|d| d.name == h)
                .map(|d| d.cid)
        });
        let Some(cid) = cid else {
            self.history.record(EventKind::Note {
                component: Component::Lab,
                text: format!(
                    "workload could not write to {}/{}: the volume is not bound to a disk; nothing written",
                    w.namespace, w.volume
                ),
            });
            return Ok(());
        };
        let ranges: Vec<drivelab_fakes::cpi::BlockRange> = w
            .ranges
            .iter()
            .map(|[start, count]| drivelab_fakes::cpi::BlockRange {
                start: *start,
                count: *count,
            })
            .collect();
        match director.cpi().write_blocks(&cid, &ranges) {
            Ok(seq) => self.history.record(EventKind::Note {
                component: Component::Lab,
                text: format!(
                    "workload wrote {} blocks of {cid} (write #{seq})",
                    w.ranges.iter().map(|[_, n]| n).sum::<u64>()
                ),
            }),
            Err(e) => {
                return Err(anyhow!(
                    "write_blocks {}/{}: the IaaS refused: {e:?}",
                    w.namespace,
                    w.volume
                ))
            }
        };
        Ok(())
    }

    /// The provisioner's last CreateVolume for a PVC, sent again asking `size`.
    async fn resend_create(&mut self, r: &crate::scenario::ResendStep) -> anyhow::Result<()> {
        let uid = self
            .kube
            .get(Kind::PersistentVolumeClaim, Some(&r.namespace), &r.name)?
            .map(|o| str_at(&o, &["metadata", "uid"]))
            .unwrap_or_default();
        let name = format!("pvc-{uid}");
        let original = self
            .sidecars
            .provisioner
            .exchanges()
            .into_iter()
            .rev()
            .find_map(|e| match e.request {
                DriverRequest::CreateVolume(req) if req.name == name => Some(req),
                _ => None,
            });
        let Some(mut req) = original else {
            return Err(anyhow!(
                "resend_create_volume {}/{}: the provisioner never sent its CreateVolume",
                r.namespace,
                r.name
            ));
        };
        let bytes = crate::scenario::bosh::parse_quantity(&r.size).unwrap_or(1 << 30);
        req.capacity_range = Some(drivelab_proto::csi::CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: bytes as i64,
        });
        self.sidecars
            .provisioner
            .replay(DriverRequest::CreateVolume(req))
            .await;
        Ok(())
    }

    /// One NodeStageVolume or NodePublishVolume, built as the kubelet builds it
    /// from the PV and the node's VolumeAttachment, outside any pod. What it
    /// mounts belongs to the scenario (no-leaked-mounts leaves it alone).
    async fn node_call(
        &mut self,
        stage: bool,
        n: &NodeCallStep,
        step: usize,
        at: &str,
    ) -> anyhow::Result<()> {
        let pv_name = self
            .kube
            .get(Kind::PersistentVolumeClaim, Some(&n.namespace), &n.volume)?
            .map(|c| str_at(&c, &["spec", "volumeName"]))
            .unwrap_or_default();
        let pv = match self.kube.get(Kind::PersistentVolume, None, &pv_name)? {
            Some(pv) if !pv_name.is_empty() => pv,
            _ => {
                self.record.expect_failures.push(ExpectFailure {
                    step: step + 1,
                    at: at.to_string(),
                    message: format!(
                        "{} {}/{}: the volume is not bound, there is nothing to call the node plugin for",
                        if stage { "node_stage" } else { "node_publish" },
                        n.namespace,
                        n.volume
                    ),
                });
                return Ok(());
            }
        };
        let handle = str_at(&pv, &["spec", "csi", "volumeHandle"]);
        let publish_context: std::collections::HashMap<String, String> = self
            .kube
            .list(Kind::VolumeAttachment, None)?
            .into_iter()
            .find(|va| {
                str_at(va, &["spec", "source", "persistentVolumeName"]) == pv_name
                    && str_at(va, &["spec", "nodeName"]) == n.node
            })
            .and_then(|va| va["status"]["attachmentMetadata"].as_object().cloned())
            .map(|m| {
                m.into_iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let volume_context: std::collections::HashMap<String, String> = pv["spec"]["csi"]
            ["volumeAttributes"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let staging = kubelet::staging_path(&self.driver_name, &handle);
        let cap = drivelab_fakes::csi::pv_capability(&pv, true);
        let agent = self
            .sidecars
            .nodes
            .get(&n.node)
            .cloned()
            .ok_or_else(|| anyhow!("no kubelet on {}", n.node))?;
        let request = if stage {
            self.lab_mounts.insert((n.node.clone(), staging.clone()));
            DriverRequest::NodeStage(csi::NodeStageVolumeRequest {
                volume_id: handle,
                publish_context,
                staging_target_path: staging,
                volume_capability: Some(cap),
                secrets: Default::default(),
                volume_context,
            })
        } else {
            // As if for a pod `lab-<node>`, so read-only-enforced reads it like a pod's.
            let owner = format!("lab-{}", n.node);
            let target = kubelet::target_path(&owner, &pv_name);
            self.lab_mounts.insert((n.node.clone(), target.clone()));
            if n.read_only {
                self.read_only_pods.insert(owner, true);
            }
            DriverRequest::NodePublish(csi::NodePublishVolumeRequest {
                volume_id: handle,
                publish_context,
                staging_target_path: staging,
                target_path: target,
                volume_capability: Some(cap),
                readonly: n.read_only,
                secrets: Default::default(),
                volume_context,
            })
        };
        agent.replay(request).await;
        Ok(())
    }

    /// The CSI spec sweep against the controller and one node plugin, over
    /// their sockets through a gate of the lab's (so the calls are in the
    /// history, and armed faults apply); its cases are kept for csi-spec.
    async fn spec_sweep(
        &mut self,
        scn: &Scenario,
        sw: &crate::systems::csi::steps::SpecSweepStep,
    ) -> anyhow::Result<()> {
        let node = match &sw.node {
            Some(n) => self.nodes.iter().find(|x| &x.name == n),
            None => self.nodes.first(),
        }
        .ok_or_else(|| anyhow!("spec_sweep: no such node"))?;
        let class = scn.csi.as_ref().and_then(|c| c.storage_classes.first());
        const PREFIX: &str = "csi.storage.k8s.io/";
        // As the external-provisioner passes them: its own keys stripped.
        let parameters = class
            .map(|c| {
                c.parameters
                    .iter()
                    .filter(|(k, _)| !k.starts_with(PREFIX))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let fs_type = class
            .and_then(|c| c.parameters.get("csi.storage.k8s.io/fstype").cloned())
            .unwrap_or_default();
        let table = node.table.clone();
        let target = super::sweep::SweepTarget {
            controller: self.ctl_sock.clone(),
            node: super::sweep::SweepNode {
                socket: node.socket.clone(),
                path_exists: Box::new(move |p| table.path_exists(p)),
            },
            driver_name: self.driver_name.clone(),
            parameters,
            fs_type,
            call_timeout: scn.driver.call_timeout,
            hook: self.hook.clone(),
        };
        let gate = Gate::new(self.history.clone());
        gate.set_hook(self.hook.clone());
        let (cases, ledger) = super::sweep::run(&target, gate).await;
        self.sweep_ledger.extend(ledger);
        self.hook.until_idle().await;
        self.sweep.get_or_insert_with(Vec::new).extend(cases);
        self.converge().await
    }

    /// Start the steps at once. Their first-hop requests (sidecar → driver) and
    /// the driver's own calls meet at the gates and are released in seeded
    /// order; VM operations run as Director tasks beside them.
    async fn concurrent(&mut self, steps: &[Step]) -> anyhow::Result<()> {
        // What each step's actor works on, read before the steps change it.
        let mut works = Vec::new();
        for s in steps {
            if let Some(w) = self.work_of(s)? {
                works.push(w);
            }
        }
        let mut jobs = Vec::new();
        for s in steps {
            if let Some(j) = self.begin(s)? {
                jobs.push(j);
            }
        }
        self.sched.begin(works.len() + jobs.len());
        let mut handles = Vec::new();
        for j in jobs {
            self.sched.actor_started();
            let director = self.bosh()?.director();
            let sched = self.sched.clone();
            let history = self.history.clone();
            handles.push(tokio::spawn(async move {
                operator_job(director, &history, j).await;
                sched.actor_done();
                Ok(())
            }));
            self.sched.quiescent().await;
        }
        for w in works {
            self.sched.actor_started();
            let sidecars = self.sidecars.clone();
            let kube = self.kube.clone();
            let sched = self.sched.clone();
            handles.push(tokio::spawn(async move {
                let r = act(&sidecars, &kube, &w).await;
                sched.actor_done();
                r
            }));
            // Start the next only when this one is parked at a gate or done, so
            // arrival order (and so the seeded choice) does not depend on timing.
            self.sched.quiescent().await;
        }
        let mut first_err = None;
        for h in handles {
            let r = h
                .await
                .map_err(|e| anyhow!("a concurrent step panicked: {e}"))?;
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        self.sched.end();
        if let Some(e) = first_err {
            return Err(e);
        }
        self.converge().await
    }

    /// A `batch`: its VM operations run first, one after another, to their
    /// end (so their calls never race the reconciles in real time); then every
    /// Kubernetes change is made and one convergence reconciles them all.
    /// The Director's modelled timeline still has the operations and the disk
    /// tasks side by side: all were queued at this virtual instant.
    async fn batch(&mut self, steps: &[Step]) -> anyhow::Result<()> {
        let mut jobs = Vec::new();
        for s in steps {
            if let Some(j) = self.begin(s)? {
                jobs.push(j);
            }
        }
        for j in jobs {
            self.run_job(j).await;
        }
        self.converge().await
    }

    /// The objects a concurrent step's actor reconciles, as their controllers would.
    fn work_of(&self, step: &Step) -> anyhow::Result<Option<Work>> {
        Ok(match step {
            Step::Csi(CsiStep::CreateVolume(v)) => Some(Work::Claim {
                namespace: v.namespace.clone(),
                name: v.name.clone(),
            }),
            Step::Csi(CsiStep::DeleteVolume(v)) => Some(Work::Claim {
                namespace: v.namespace.clone(),
                name: v.name.clone(),
            }),
            Step::Csi(CsiStep::Publish(p)) => Some(Work::Pod {
                namespace: p.namespace.clone(),
                pod: p.pod.clone(),
                node: p.node.clone(),
                claim: p.volume.clone(),
            }),
            Step::Csi(CsiStep::Unpublish(p)) => self
                .kube
                .get(Kind::Pod, Some(&p.namespace), &p.pod)?
                .map(|o| Work::Pod {
                    namespace: p.namespace.clone(),
                    pod: p.pod.clone(),
                    node: str_at(&o, &["spec", "nodeName"]),
                    claim: o["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                }),
            _ => None,
        })
    }

    /// Resync every sidecar target until a round where all are done and nothing
    /// changed, or the step's virtual-time window closes. Between rounds the
    /// clock moves on by the shortest back-off asked for.
    async fn converge(&mut self) -> anyhow::Result<()> {
        let deadline = self.clock.now().after(self.converge_within);
        self.pending.clear();
        for _ in 0..MAX_ROUNDS {
            let before = self.fingerprint()?;
            let mut wait: Option<Duration> = None;
            let mut pending = Vec::new();
            let targets = self.sidecars.targets()?;
            self.resync.keep_only(&targets);
            for t in targets {
                let hook = &self.hook;
                // A crash fired inside this reconcile restarts the controller,
                // whose start-up calls (UAA token) otherwise race this note.
                let r = self
                    .resync
                    .pass(&self.sidecars, &self.kube, &t, || hook.until_idle())
                    .await?;
                if let Reconcile::Requeue { after, reason } = r {
                    self.history.record(EventKind::Note {
                        component: sidecar_of(&t),
                        text: format!("requeue {t} in {}ms: {reason}", after.as_millis()),
                    });
                    pending.push(format!("{t}: {reason}"));
                    wait = Some(wait.map_or(after, |w| w.min(after)));
                }
            }
            self.pending = pending;
            match wait {
                None if self.fingerprint()? == before => return Ok(()),
                None => {}
                Some(w) => {
                    let at = self.clock.now().after(w);
                    if at > deadline {
                        break;
                    }
                    self.clock.advance_to(at);
                }
            }
        }
        for p in &self.pending {
            let msg = format!("{p} (still pending at {})", self.clock.now());
            self.history.record(EventKind::Note {
                component: Component::Lab,
                text: format!("not converged: {msg}"),
            });
            let key = p.split(':').next().unwrap_or_default().to_string();
            self.not_converged.retain(|m| !m.starts_with(&key));
            self.not_converged.push(msg);
        }
        Ok(())
    }

    /// What the sidecars read, to tell a quiet round from a busy one: the
    /// API's resourceVersion (every write moves it, a no-op write does not)
    /// and the nodes' mount tables.
    fn fingerprint(&self) -> anyhow::Result<(u64, Vec<u64>)> {
        let mounts = self.nodes.iter().map(|n| n.table.changes()).collect();
        Ok((self.kube.resource_version(), mounts))
    }

    /// Every exchange of every CSI sidecar, in call order.
    fn exchanges(&self) -> Vec<Exchange> {
        let mut all = self.sidecars.provisioner.exchanges();
        all.extend(self.sidecars.attacher.exchanges());
        if let Some(s) = &self.sidecars.snapshotter {
            all.extend(s.exchanges());
        }
        for a in self.sidecars.nodes.values() {
            all.extend(a.exchanges());
        }
        all.sort_by_key(|e| e.call);
        all
    }

    /// How many exchanges [`CsiLab::exchanges`] would return (without copying them).
    fn exchange_count(&self) -> usize {
        self.sidecars.exchange_count()
    }

    /// What a step boundary reads of the state, once for both its sample
    /// and its snapshot.
    fn read_boundary(&self) -> Boundary {
        let list = |kind| self.kube.list_shared(kind, None).unwrap_or_default();
        let iaas_disks = self.director().map(|d| d.cpi().disks()).unwrap_or_default();
        Boundary {
            // Without decoding every disk again, as `Cpi::attachments` would.
            attachments: Attachment::of_disks(&iaas_disks),
            iaas_disks,
            disks: self.director().map(|d| d.disks()).unwrap_or_default(),
            mounts: self.nodes.iter().flat_map(|n| n.table.mounts()).collect(),
            pvs: list(Kind::PersistentVolume),
            volume_attachments: list(Kind::VolumeAttachment),
        }
    }

    /// What the step boundary shows: attachments, mounts, VolumeAttachments, pods.
    fn sample(&mut self, step: usize) {
        let b = self.read_boundary();
        for d in &b.disks {
            self.disk_names.insert(d.cid.clone(), d.name.clone());
        }
        let vas = (b.volume_attachments.iter())
            .map(|va| {
                (
                    str_at(va, &["spec", "source", "persistentVolumeName"]),
                    str_at(va, &["spec", "nodeName"]),
                    va["status"]["attached"].as_bool().unwrap_or(false),
                )
            })
            .collect();
        let pvs = (b.pvs.iter())
            .map(|pv| {
                let modes = pv["spec"]["accessModes"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                (
                    str_at(pv, &["metadata", "name"]),
                    (str_at(pv, &["spec", "csi", "volumeHandle"]), modes),
                )
            })
            .collect();
        self.samples.push(Sample {
            step,
            attachments: (b.attachments.iter())
                .map(|a| (a.disk_cid.clone(), a.vm_cid.clone()))
                .collect(),
            mounts: b.mounts.clone(),
            volume_attachments: vas,
            pvs,
            disks: b.disks.clone(),
        });
        self.boundary = Some(b);
    }

    fn expect(&self, e: &Expectation) -> Vec<String> {
        let mut fails = Vec::new();
        let all = self.exchanges();
        if let (Some(code), Some(got)) = (e.code, &self.last_step_code) {
            if *got != code.name() {
                fails.push(format!(
                    "the previous step's call answered {got}, expected {}",
                    code.name()
                ));
            }
        } else if let Some(code) = e.code {
            let mine = &all[self.step_exchanges_from.min(all.len())..];
            match mine.last() {
                None => fails.push(format!(
                    "expected the last CSI reply to be {}, but the previous step made no CSI call",
                    code.name()
                )),
                Some(x) => {
                    let got = x.reply.code_name();
                    if got != code.name() {
                        let msg = match &x.reply {
                            DriverReply::Failed { message, .. } => format!(" ({message})"),
                            _ => String::new(),
                        };
                        fails.push(format!(
                            "{} answered {got}{msg}, expected {}",
                            x.request.rpc(),
                            code.name()
                        ));
                    }
                }
            }
        }
        if let (Some(v), Some(want)) = (&e.volume, e.bound) {
            let got = self
                .kube
                .get(Kind::PersistentVolumeClaim, Some(&e.namespace), v)
                .ok()
                .flatten()
                .map(|o| str_at(&o, &["status", "phase"]) == "Bound")
                .unwrap_or(false);
            if got != want {
                let why = self.why(&format!(": pvc {}/{v} ", e.namespace));
                fails.push(format!(
                    "volume {}/{v}: bound is {got}, expected {want}{why}",
                    e.namespace
                ));
            }
        }
        if let (Some(p), Some(want)) = (&e.pod, e.running) {
            let got = self
                .kube
                .get(Kind::Pod, Some(&e.namespace), p)
                .ok()
                .flatten()
                .map(|o| str_at(&o, &["status", "phase"]) == "Running")
                .unwrap_or(false);
            if got != want {
                let why = self.why(&format!(": pod {}/{p} ", e.namespace));
                fails.push(format!(
                    "pod {}/{p}: running is {got}, expected {want}{why}",
                    e.namespace
                ));
            }
        }
        if let Some(want) = e.iaas_disks {
            let got = self
                .director()
                .map(|d| d.cpi().disks())
                .unwrap_or_default()
                .len();
            if got != want {
                fails.push(format!("the IaaS has {got} disks, expected {want}"));
            }
        }
        if let Some(want) = e.iaas_snapshots {
            let got = self
                .director()
                .map(|d| d.cpi().snapshots())
                .unwrap_or_default()
                .len();
            if got != want {
                fails.push(format!("the IaaS has {got} snapshots, expected {want}"));
            }
        }
        if let (Some(name), Some(want)) = (&e.snapshot, e.ready_to_use) {
            let vs = self
                .kube
                .get(Kind::VolumeSnapshot, Some(&e.namespace), name)
                .ok()
                .flatten();
            let got = vs
                .as_ref()
                .is_some_and(|v| v.pointer("/status/readyToUse") == Some(&json!(true)));
            if got != want {
                let error = vs
                    .as_ref()
                    .map(|v| str_at(v, &["status", "error", "message"]))
                    .filter(|m| !m.is_empty())
                    .map(|m| format!(" (status.error: {m})"))
                    .unwrap_or_default();
                fails.push(format!(
                    "VolumeSnapshot {}/{name}: readyToUse is {got}, expected {want}{error}",
                    e.namespace
                ));
            }
        }
        if let Some(calls) = &e.driver_calls {
            for (rpc, want) in calls {
                let got = all.iter().filter(|x| x.request.rpc() == rpc).count();
                if got != *want {
                    fails.push(format!(
                        "the CSI sidecars made {got} {rpc} calls, expected {want}"
                    ));
                }
            }
        }
        if e.claim.is_some() || e.access.is_some() || e.backend.is_some() {
            fails
                .push("claim/access/backend are COSI expectations; this is a BOSH scenario".into());
        }
        fails
    }

    /// Reference-driver specific: directories in the linked-in hostpath-csi's
    /// state directory that no record names (empty for any other driver).
    fn reference_orphans(&self, scn: &Scenario) -> Vec<String> {
        if scn.driver.builtin() != Some(crate::scenario::BuiltinDriver::HostpathCsi) {
            return Vec::new();
        }
        let dir = self._dir.path().join("hostpath");
        match hostpath_csi::inspect(&dir) {
            Ok(view) => {
                let mut out = Vec::new();
                let vols: BTreeMap<&str, ()> =
                    view.volumes.iter().map(|v| (v.id.as_str(), ())).collect();
                let snaps: BTreeMap<&str, ()> =
                    view.snapshots.iter().map(|s| (s.id.as_str(), ())).collect();
                for d in &view.volume_dirs {
                    if !vols.contains_key(d.as_str()) {
                        out.push(format!("volumes/{d}"));
                    }
                }
                for d in &view.snapshot_dirs {
                    if !snaps.contains_key(d.as_str()) {
                        out.push(format!("snapshots/{d}"));
                    }
                }
                out
            }
            Err(e) => {
                self.history.record(EventKind::Note {
                    component: Component::Lab,
                    text: format!("the reference driver's state directory could not be read: {e}"),
                });
                Vec::new()
            }
        }
    }

    /// The last requeue note a sidecar wrote about an object (`needle` names
    /// it, e.g. `: pod default/web `): the driver's answer is in it.
    fn why(&self, needle: &str) -> String {
        self.history
            .events()
            .iter()
            .rev()
            .find_map(|e| match &e.kind {
                EventKind::Note { text, .. }
                    if text.starts_with("requeue ") && text.contains(needle) =>
                {
                    Some(format!("; the sidecar's last word: {text}"))
                }
                _ => None,
            })
            .unwrap_or_default()
    }

    fn render_snapshot(&mut self) -> String {
        // The sample just taken read these, unless a step began since.
        let b = self.boundary.take().unwrap_or_else(|| self.read_boundary());
        let input = snapshot::CsiSnapshotInput {
            instances: self.director().map(|d| d.instances()).unwrap_or_default(),
            disks: b.disks,
            iaas_disks: b.iaas_disks,
            attachments: b.attachments,
            pvcs: self
                .kube
                .list_shared(Kind::PersistentVolumeClaim, None)
                .unwrap_or_default(),
            pvs: b.pvs,
            volume_attachments: b.volume_attachments,
            pods: self.kube.list_shared(Kind::Pod, None).unwrap_or_default(),
            mounts: b.mounts,
            tasks: self.director().map(|d| d.tasks()).unwrap_or_default(),
            locks: self.director().map(|d| d.locks()).unwrap_or_default(),
            snapshots: self
                .director()
                .map(|d| d.cpi().snapshots())
                .unwrap_or_default(),
            bosh: self.backend.is_some(),
        };
        snapshot::render(&input, &mut self.norm)
    }

    async fn finish(
        &mut self,
        scn: &Scenario,
        seed: u64,
        mutants: &[Mutant],
        log_start: usize,
    ) -> anyhow::Result<RunOutcome> {
        // Faults off, partitions healed, the Director up: does everything converge now?
        self.hook.disarm_all();
        self.history.record(EventKind::Step {
            index: scn.steps.len(),
            name: "final convergence (faults healed)".into(),
        });
        self.checkpoint(scn.steps.len());
        if let Some(b) = &self.backend {
            b.director.up().await?;
        }
        self.converge().await?;
        let (rounds, passes, passed_over) = self.resync.counts();
        tracing::debug!(
            rounds,
            passes,
            passed_over,
            "csi resync: rounds, target passes made, and quiet ones passed over"
        );
        self.sample(scn.steps.len());
        // The last snapshot: what it kept would only add to the run's peak.
        self.norm.forget_lines();
        let snapshot = crate::packed::Packed::new(&self.render_snapshot());
        // External driver processes' own output is searched for leaks too. Read
        // before the history: reading notes what was held back of a flood.
        let plugins = self.nodes.iter().map(|n| &n.plugin);
        let driver_outputs: Vec<String> = std::iter::once(&self.controller)
            .chain(plugins)
            .map(|d| d.output())
            .collect();
        let history = self.history.take_events();
        // Without the BOSH backend the lab cannot see what the driver made:
        // it asks the driver (ListVolumes/ListSnapshots, when advertised).
        let (listed_volumes, listed_snapshots) = if self.backend.is_none() {
            list_driver_objects(&self.ctl_sock, &self.history).await
        } else {
            (None, None)
        };
        let logs = crate::logcap::since(log_start);
        let secrets = self.secrets();
        let driver_outputs: Vec<&str> = driver_outputs.iter().map(String::as_str).collect();
        // Taken: its labels and automaton are of no use once the history is
        // labelled, and would be held through the seal, the run's peak.
        let mut norm = std::mem::take(&mut self.norm);
        let (leak_scan, history_text) = crate::checks::LeakScan::of_run(
            &secrets,
            &crate::checks::RunTexts {
                snapshot: &snapshot,
                log: &logs,
                driver_outputs: &driver_outputs,
            },
            &history,
            &mut norm,
        );
        drop(norm);
        let obs = CsiObservations {
            samples: std::mem::take(&mut self.samples),
            calls: Vec::new(),
            exchanges: self.exchanges(),
            disk_names: self.disk_names.clone(),
            iaas_disks: self
                .director()
                .map(|d| d.cpi().disks())
                .unwrap_or_default()
                .into_iter()
                .map(|d| d.cid)
                .collect(),
            director_disks: self.director().map(|d| d.disks()).unwrap_or_default(),
            iaas_snapshots: self
                .director()
                .map(|d| d.cpi().snapshots())
                .unwrap_or_default()
                .into_iter()
                .map(|s| s.cid)
                .collect(),
            snapshot_handles: self
                .kube
                .list(Kind::VolumeSnapshotContent, None)?
                .iter()
                .map(|c| str_at(c, &["status", "snapshotHandle"]))
                .filter(|h| !h.is_empty())
                .collect(),
            tasks: self.director().map(|d| d.tasks()).unwrap_or_default(),
            client_id: CLIENT_ID.to_string(),
            client_deployments: self
                .backend
                .as_ref()
                .map(|b| b.spec.client_deployments.clone())
                .unwrap_or_default(),
            read_only_pods: self.read_only_pods.clone(),
            lab_mounts: self.lab_mounts.clone(),
            pods: self.kube.list(Kind::Pod, None)?,
            pvcs: self.kube.list(Kind::PersistentVolumeClaim, None)?,
            pending: self.pending.clone(),
            backups: self.cbt.backups.clone(),
            replays: self.cbt.replays.clone(),
            leak_scan,
            reference_orphans: self.reference_orphans(scn),
            bosh_backend: self.backend.is_some(),
            driver_name: self.driver_name.clone(),
            listed_volumes,
            listed_snapshots,
            sweep: self.sweep.clone(),
            sweep_ledger: self.sweep_ledger.clone(),
        };
        let (record, verdicts) =
            Record::new(scn, Observed::Csi(Box::new(obs))).seal_and_judge(&history)?;
        let driver_name = self.driver_name.clone();
        let scale = self
            .backend
            .as_ref()
            .filter(|b| b.spec.virtual_lanes)
            .map(|b| {
                let nodes = b.spec.deployments.iter().map(|d| d.instances).sum();
                pool_figures(nodes, b.spec.workers, &b.director().lane_times())
            });
        let figures = match &scale {
            Some(s) => pool_figure_lines(s),
            None => attach_figures(&history),
        };
        Ok(RunOutcome {
            scenario: scn.name.clone(),
            path: scn.path.clone(),
            seed,
            mutants: mutants.to_vec(),
            driver_name,
            verdicts,
            record,
            expect_failures: self.record.expect_failures.clone(),
            expect_not_exercised: self.record.expect_not_exercised.clone(),
            unfired_faults: self.hook.unfired(),
            faults_armed: self.hook.armed_count(),
            not_converged: self.not_converged.clone(),
            figures,
            scale,
            snapshot,
            history,
            history_text,
            step_snapshots: std::mem::take(&mut self.record.step_snapshots),
            claims: scn.claims.clone(),
            replay: replay_command(scn, seed, mutants),
            secrets,
        })
    }
}

/// Attach throughput and latency, from the history: every attacher
/// ControllerPublishVolume of a volume on a node, from its first try to its OK.
fn attach_figures(events: &drivelab_fakes::history::EventLog) -> Vec<String> {
    use drivelab_fakes::clock::VTime;
    use drivelab_fakes::history::EventKind as K;
    let mut replies: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
    for e in events {
        if let K::Reply { id, outcome } = &e.kind {
            replies.insert(id.0, (e.at.0, outcome.is_success()));
        }
    }
    // volume@node → (first try, first OK)
    let mut per: BTreeMap<String, (u64, Option<u64>)> = BTreeMap::new();
    for e in events {
        if let K::Call {
            id,
            from: Component::CsiAttacher,
            op,
            subject,
            ..
        } = &e.kind
        {
            if op != "ControllerPublishVolume" {
                continue;
            }
            let entry = per.entry(subject.clone()).or_insert((e.at.0, None));
            if entry.1.is_none() {
                if let Some((at, true)) = replies.get(&id.0) {
                    entry.1 = Some(*at);
                }
            }
        }
    }
    let mut lat: Vec<u64> = per
        .values()
        .filter_map(|(t0, ok)| ok.map(|t| t.saturating_sub(*t0)))
        .collect();
    if lat.is_empty() {
        return Vec::new();
    }
    lat.sort_unstable();
    let first = per.values().map(|(t0, _)| *t0).min().unwrap_or(0);
    let last = per
        .values()
        .filter_map(|(_, ok)| *ok)
        .max()
        .unwrap_or(first);
    let span_ms = last.saturating_sub(first);
    let pct = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1];
    let rate = if span_ms == 0 {
        "all at one virtual instant".to_string()
    } else {
        format!(
            "{:.1} attaches per virtual minute",
            lat.len() as f64 * 60_000.0 / span_ms as f64
        )
    };
    vec![
        format!(
            "attach throughput: {} attachments over {} of virtual time, {rate}",
            lat.len(),
            VTime(span_ms)
        ),
        format!(
            "attach latency (first ControllerPublishVolume to its OK, virtual): p50 {}, p99 {}, max {}",
            VTime(pct(0.50)),
            VTime(pct(0.99)),
            VTime(*lat.last().unwrap_or(&0))
        ),
    ]
}

/// The worker pool's figures from the Director's modelled timeline: each
/// volume-to-node attachment from its first attach task queued to the end of
/// its successful one.
fn pool_figures(
    nodes: u32,
    workers: usize,
    lanes: &[drivelab_fakes::director::lanes::LaneTimes],
) -> crate::outcome::ScaleFigures {
    let disk: Vec<_> = lanes.iter().filter(|t| t.worker.is_some()).collect();
    let mut per: BTreeMap<(String, String), (u64, Option<u64>)> = BTreeMap::new();
    for t in disk
        .iter()
        .filter(|t| matches!(t.kind, "attach" | "provide"))
    {
        let key = (
            t.disk.clone().unwrap_or_default(),
            t.instance.clone().unwrap_or_default(),
        );
        let e = per.entry(key).or_insert((t.queued_ms, None));
        e.0 = e.0.min(t.queued_ms);
        if t.ok && e.1.is_none() {
            e.1 = Some(t.finished_ms);
        }
    }
    let mut lat: Vec<u64> = per
        .values()
        .filter_map(|(q, done)| done.map(|d| d.saturating_sub(*q)))
        .collect();
    lat.sort_unstable();
    let first = per.values().map(|(q, _)| *q).min().unwrap_or(0);
    let last = per.values().filter_map(|(_, d)| *d).max().unwrap_or(first);
    let span_ms = last.saturating_sub(first);
    let pct = |p: f64| {
        if lat.is_empty() {
            0
        } else {
            lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1]
        }
    };
    crate::outcome::ScaleFigures {
        nodes,
        workers,
        disk_tasks: disk.len(),
        attaches: lat.len(),
        span_ms,
        per_minute: if span_ms == 0 {
            0.0
        } else {
            lat.len() as f64 * 60_000.0 / span_ms as f64
        },
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        max_ms: lat.last().copied().unwrap_or(0),
        final_queue_wait_ms: disk
            .iter()
            .max_by_key(|t| (t.queued_ms, t.task))
            .map(|t| t.taken_ms.saturating_sub(t.queued_ms))
            .unwrap_or(0),
    }
}

/// The pool's figures as the report's figure lines.
fn pool_figure_lines(s: &crate::outcome::ScaleFigures) -> Vec<String> {
    use drivelab_fakes::clock::VTime;
    vec![
        format!(
            "attach throughput (Director pool of {} workers modelled in virtual time, {} nodes): {} attachments over {} of virtual time, {:.1} attaches per virtual minute",
            s.workers, s.nodes, s.attaches, VTime(s.span_ms), s.per_minute
        ),
        format!(
            "attach latency (first attach task queued to its successful task done, virtual): p50 {}, p99 {}, max {}",
            VTime(s.p50_ms),
            VTime(s.p99_ms),
            VTime(s.max_ms)
        ),
        format!(
            "Director queue: {} disk tasks; the last one waited {} for a worker",
            s.disk_tasks,
            VTime(s.final_queue_wait_ms)
        ),
    ]
}

/// An operator's VM operation (user `admin`): run it, wait for its task, and
/// note in the history how it ended.
/// What starting a node needs of the lab being built.
struct NodeCtx<'a> {
    scn: &'a Scenario,
    mutants: &'a [Mutant],
    backend: Option<&'a BoshBackend>,
    refs: &'a BackendRefs<'a>,
    clock: &'a SimClock,
    history: &'a History,
    filesystems: &'a Filesystems,
    slot: &'a KubeSlot,
}

/// One node: its mount table, the driver's node process on it, its kubelet.
async fn start_node(
    name: &str,
    ctx: &NodeCtx<'_>,
    gate: &(dyn Fn() -> Gate + Sync),
) -> anyhow::Result<(Node, NodeAgent)> {
    // A node with the BOSH backend runs on an instance, whose id is its
    // CSI node id; without it the node's name is.
    let (node_id, source): (String, DeviceSource) = match ctx.backend {
        Some(b) => {
            let iid = b.instance_of(name)?;
            let source = b.devices(&iid);
            (iid, source)
        }
        None => (name.to_string(), Arc::new(Vec::new)),
    };
    let table = MountTable::new(name, source, ctx.filesystems.clone(), gate());
    let table_l = table
        .serve(loopback())
        .await
        .context("serving a mount table")?;
    let role = CsiRole::Node {
        name: name.to_string(),
        node_id: node_id.clone(),
        mounter_url: table_l.url(),
    };
    let (plugin, sock) = csi_process(
        ctx.scn,
        ctx.mutants,
        &role,
        ctx.refs,
        ctx.clock,
        ctx.history,
    )?;
    let plugin = Arc::new(plugin);
    plugin.start().await.with_context(|| {
        format!(
            "starting the node plugin on {name} ({})",
            ctx.scn.driver.describe()
        )
    })?;
    let agent = NodeAgent::connect(name, &sock, ctx.slot.clone(), gate())
        .await
        .with_context(|| format!("the kubelet on {name} could not reach its plugin"))?;
    let node = Node {
        name: name.to_string(),
        node_id,
        table,
        _table_l: table_l,
        plugin,
        socket: sock,
    };
    Ok((node, agent))
}

/// The controller's sidecars (provisioner, attacher, snapshotter) on its
/// socket, beside the node agents, each with the driver's call deadline.
async fn connect_sidecars(
    ctl_sock: &std::path::Path,
    slot: &KubeSlot,
    agents: BTreeMap<String, Arc<NodeAgent>>,
    gate: &(dyn Fn() -> Gate + Sync),
    call_timeout: Duration,
) -> anyhow::Result<CsiSidecars> {
    let sidecars = CsiSidecars {
        kube: slot.clone(),
        provisioner: Arc::new(
            Provisioner::connect(ctl_sock, slot.clone(), gate())
                .await
                .context("the external-provisioner could not reach the controller")?,
        ),
        attacher: Arc::new(
            Attacher::connect(ctl_sock, slot.clone(), gate())
                .await
                .context("the external-attacher could not reach the controller")?,
        ),
        nodes: agents,
        snapshotter: Some(Arc::new(
            Snapshotter::connect(ctl_sock, slot.clone(), gate())
                .await
                .context("the external-snapshotter could not reach the controller")?,
        )),
    };
    sidecars.provisioner.set_call_timeout(call_timeout);
    sidecars.attacher.set_call_timeout(call_timeout);
    if let Some(s) = &sidecars.snapshotter {
        s.set_call_timeout(call_timeout);
    }
    for a in sidecars.nodes.values() {
        a.set_call_timeout(call_timeout);
    }
    Ok(sidecars)
}

/// The volumes and snapshots the driver lists at the end of a run, each
/// `None` when it does not advertise the listing (or the listing failed,
/// which the history notes). The lab's own calls, never faulted.
async fn list_driver_objects(
    ctl_sock: &std::path::Path,
    history: &History,
) -> (Option<Vec<String>>, Option<Vec<String>>) {
    use csi::controller_client::ControllerClient;
    use csi::controller_service_capability::rpc::Type;
    let note = |text: String| {
        history.record(EventKind::Note {
            component: Component::Lab,
            text,
        });
    };
    let Ok(ch) = drivelab_fakes::cosi_sidecar::connect_unix(ctl_sock).await else {
        note("end of run: the controller socket did not answer; nothing listed".into());
        return (None, None);
    };
    let mut client = ControllerClient::new(ch);
    let caps: Vec<i32> = match client
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
    {
        Ok(r) => r
            .into_inner()
            .capabilities
            .into_iter()
            .filter_map(|c| match c.r#type {
                Some(csi::controller_service_capability::Type::Rpc(rpc)) => Some(rpc.r#type),
                None => None,
            })
            .collect(),
        Err(e) => {
            note(format!(
                "end of run: ControllerGetCapabilities answered {:?}",
                e.code()
            ));
            return (None, None);
        }
    };
    let mut volumes = None;
    if caps.contains(&(Type::ListVolumes as i32)) {
        volumes = paginate("volumes", &note, |token| {
            let mut c = client.clone();
            async move {
                let req = csi::ListVolumesRequest {
                    max_entries: 0,
                    starting_token: token,
                };
                let r = c.list_volumes(req).await?.into_inner();
                let ids = r.entries.into_iter().filter_map(|e| e.volume);
                Ok((ids.map(|v| v.volume_id).collect(), r.next_token))
            }
        })
        .await;
    }
    let mut snapshots = None;
    if caps.contains(&(Type::ListSnapshots as i32)) {
        snapshots = paginate("snapshots", &note, |token| {
            let mut c = client.clone();
            async move {
                let req = csi::ListSnapshotsRequest {
                    starting_token: token,
                    ..Default::default()
                };
                let r = c.list_snapshots(req).await?.into_inner();
                let ids = r.entries.into_iter().filter_map(|e| e.snapshot);
                Ok((ids.map(|s| s.snapshot_id).collect(), r.next_token))
            }
        })
        .await;
    }
    (volumes, snapshots)
}

/// Every id of a paginated CSI listing (`page(token)` → ids, next token);
/// `None` if a page fails or the pages never end (bounded, so a driver whose
/// next_token never empties cannot hang the run).
async fn paginate<F, Fut>(
    what: &str,
    note: &(dyn Fn(String) + Sync),
    mut page: F,
) -> Option<Vec<String>>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<String>, String), tonic::Status>>,
{
    const MAX_PAGES: usize = 1000;
    let mut out = Vec::new();
    let mut token = String::new();
    for _ in 0..MAX_PAGES {
        match page(token).await {
            Ok((ids, next)) => {
                out.extend(ids);
                if next.is_empty() {
                    note(format!("end of run: the driver lists {} {what}", out.len()));
                    return Some(out);
                }
                token = next;
            }
            Err(e) => {
                note(format!(
                    "end of run: listing {what} answered {:?}: {}",
                    e.code(),
                    e.message()
                ));
                return None;
            }
        }
    }
    note(format!(
        "end of run: the driver's {what} listing did not end within {MAX_PAGES} pages"
    ));
    None
}

/// Which CSI process of the driver under test the lab starts.
enum CsiRole {
    /// Identity + Controller, beside the provisioner, attacher and snapshotter.
    Controller,
    /// Identity + Node on one node, beside its kubelet.
    Node {
        name: String,
        /// Its CSI node id: the BOSH instance id, or the node name.
        node_id: String,
        mounter_url: String,
    },
}

/// The backend and run directory as the CSI processes are told of them.
struct BackendRefs<'a> {
    bosh: Option<&'a BoshBackend>,
    sockets: PathBuf,
    run_dir: PathBuf,
    /// The scenario's attach limit for the node plugins (0: none).
    max_volumes_per_node: u32,
}

/// The driver under test in `role`, and its socket: the linked-in bosh-csi
/// only when the scenario names it; otherwise its `command:`/`image:`, one
/// process per role, told the backend through placeholders.
fn csi_process(
    scn: &Scenario,
    mutants: &[Mutant],
    role: &CsiRole,
    b: &BackendRefs,
    clock: &SimClock,
    history: &History,
) -> anyhow::Result<(Driver, PathBuf)> {
    let socket_name = match role {
        CsiRole::Controller => "controller.sock".to_string(),
        CsiRole::Node { name, .. } => format!("node-{name}.sock"),
    };
    let socket = b.sockets.join(&socket_name);
    let driver = match scn.driver.builtin() {
        None => {
            let params = csi_params(role, b, &socket_name, clock);
            Driver::external(&scn.driver, mutants, &params, history.clone())?
        }
        Some(crate::scenario::BuiltinDriver::BoshCsi) => {
            let bosh = b.bosh.ok_or_else(|| {
                anyhow!("bosh-csi drives the BOSH Director: its scenarios need `bosh:`, not `csi:`")
            })?;
            let limit = i64::from(b.max_volumes_per_node);
            Driver::InProcess(builtin_bosh_csi(role, bosh, &socket, clock, mutants, limit))
        }
        Some(crate::scenario::BuiltinDriver::HostpathCsi) => {
            Driver::InProcess(builtin_hostpath(role, b, &socket, mutants))
        }
        Some(other) => return Err(anyhow!("{} is not a CSI driver", other.name())),
    };
    Ok((driver, socket))
}

/// What an external CSI process is told: its role's placeholders, the BOSH
/// backend's when there is one, and the lab's clock.
fn csi_params(
    role: &CsiRole,
    b: &BackendRefs,
    socket_name: &str,
    clock: &SimClock,
) -> external::DriverParams {
    let mut params = external::DriverParams::new(
        crate::scenario::DriverProtocol::Csi,
        b.sockets.clone(),
        socket_name,
        b.run_dir.clone(),
    );
    params.set("max_volumes_per_node", b.max_volumes_per_node.to_string());
    // The driver's wall clock follows the lab's: a token lifetime the
    // scenario lets pass on the virtual clock passes for it too.
    params.clock = Some(clock.clone());
    if let Some(bosh) = b.bosh {
        // Scenario settings, not secrets: every role gets them.
        let t = bosh.spec.task_timeout;
        params
            .set("task_timeout", format!("{}ms", t.as_millis()))
            .set("poll_interval", format!("{}ms", (t / 2).as_millis().max(1)));
    }
    match role {
        CsiRole::Controller => {
            params.set("mode", "controller");
            if let Some(bosh) = b.bosh {
                params
                    .set_labelled("director_url", &bosh.director_url, "<director-url>")
                    .set("uaa_url", &bosh.director_url)
                    .set("client_id", CLIENT_ID)
                    .set_secret("client_secret", &bosh.client_secret, "<client-secret>")
                    .set_labelled("block_api_url", &bosh.block_url, "<block-api-url>")
                    .set_secret(
                        "block_api_credential",
                        &bosh.block_secret,
                        "<block-api-credential>",
                    );
            }
        }
        CsiRole::Node {
            name,
            node_id,
            mounter_url,
        } => {
            params
                .set("mode", "node")
                .set("node_id", node_id)
                .set("node_name", name)
                .set_labelled("mounter_url", mounter_url, &format!("<mounter-url-{name}>"));
        }
    }
    params
}

/// Where the linked-in hostpath-csi keeps its backend: the run's own directory.
fn hostpath_state(b: &BackendRefs) -> PathBuf {
    b.run_dir.join("hostpath")
}

/// The linked-in hostpath-csi in `role`: every process of the run shares
/// one state directory, as the driver's processes on one host do.
fn builtin_hostpath(
    role: &CsiRole,
    b: &BackendRefs,
    socket: &std::path::Path,
    mutants: &[Mutant],
) -> InProcessDriver {
    let (mode, node_id, mounter_url) = match role {
        CsiRole::Controller => (hostpath_csi::Mode::Controller, String::new(), String::new()),
        CsiRole::Node {
            node_id,
            mounter_url,
            ..
        } => (
            hostpath_csi::Mode::Node,
            node_id.clone(),
            mounter_url.clone(),
        ),
    };
    InProcessDriver::hostpath(
        hostpath_csi::DriverConfig {
            mode,
            node_id,
            mounter_url,
            state_dir: hostpath_state(b),
            mutants: Mutant::hostpath(mutants),
            max_volumes_per_node: i64::from(b.max_volumes_per_node),
            ..Default::default()
        },
        socket,
    )
}

/// The linked-in bosh-csi in `role`, configured as the lab runs it.
fn builtin_bosh_csi(
    role: &CsiRole,
    b: &BoshBackend,
    socket: &std::path::Path,
    clock: &SimClock,
    mutants: &[Mutant],
    max_volumes_per_node: i64,
) -> InProcessDriver {
    let mutants = Mutant::bosh(mutants);
    let task_timeout = b.spec.task_timeout;
    match role {
        CsiRole::Controller => {
            let vclock = clock.clone();
            InProcessDriver::bosh_csi_clocked(
                bosh_csi::DriverConfig {
                    mode: bosh_csi::Mode::Controller,
                    director_url: b.director_url.clone(),
                    client_id: CLIENT_ID.into(),
                    client_secret: bosh_csi::Secret::new(b.client_secret.expose()),
                    // The Director answers a disk request once its task has run as
                    // far as it can (Director::settle), so the first poll usually
                    // sees it done. Polls of a task that must wait are spaced so the
                    // wall-clock task timeout falls between the same two polls (the
                    // second and third): the poll count, and so the history, is the
                    // same every run while the first two polls take less than half
                    // the timeout. At two thirds, a loaded machine's 67 ms margin
                    // (bosh-feature-off's 200 ms) was sometimes not enough.
                    poll_interval: task_timeout / 2,
                    task_timeout,
                    http_timeout: Duration::from_secs(2),
                    mutants,
                    block_api_url: b.block_url.clone(),
                    block_api_credential: bosh_csi::Secret::new(b.block_secret.expose()),
                    session_ttl: SESSION_TTL,
                    max_volumes_per_node,
                    ..Default::default()
                },
                socket,
                Arc::new(move || vclock.now().0),
            )
        }
        CsiRole::Node {
            node_id,
            mounter_url,
            ..
        } => InProcessDriver::bosh_csi(
            bosh_csi::DriverConfig {
                mode: bosh_csi::Mode::Node,
                node_id: node_id.clone(),
                mounter_url: mounter_url.clone(),
                http_timeout: Duration::from_secs(2),
                mutants,
                max_volumes_per_node,
                ..Default::default()
            },
            socket,
        ),
    }
}

/// What one actor of a `concurrent:` block drives.
#[derive(Clone, Debug)]
enum Work {
    /// A PVC: the provisioner on the claim, then on its PV.
    Claim { namespace: String, name: String },
    /// A pod: its kubelet, and the attacher on the pod's VolumeAttachment.
    Pod {
        namespace: String,
        pod: String,
        node: String,
        claim: String,
    },
}

/// The sidecar targets of `w` right now (a VolumeAttachment appears once the
/// kubelet has asked for it).
fn work_targets(kube: &KubeFake, driver_name: &str, w: &Work) -> Vec<CsiTarget> {
    use drivelab_fakes::csi::attacher::AttachTarget;
    use drivelab_fakes::csi::kubelet::NodeTarget;
    use drivelab_fakes::csi::provisioner::ProvisionTarget;
    let pv_of = |ns: &str, claim: &str| {
        kube.get(Kind::PersistentVolumeClaim, Some(ns), claim)
            .ok()
            .flatten()
            .map(|c| str_at(&c, &["spec", "volumeName"]))
            .filter(|pv| !pv.is_empty())
    };
    match w {
        Work::Claim { namespace, name } => {
            let mut out = vec![CsiTarget::Provision(ProvisionTarget::Claim {
                namespace: namespace.clone(),
                name: name.clone(),
            })];
            if let Some(pv) = pv_of(namespace, name) {
                out.push(CsiTarget::Provision(ProvisionTarget::Volume { name: pv }));
            }
            out
        }
        Work::Pod {
            namespace,
            pod,
            node,
            claim,
        } => {
            let mut out = vec![CsiTarget::Node {
                node: node.clone(),
                target: NodeTarget::Pod {
                    namespace: namespace.clone(),
                    name: pod.clone(),
                },
            }];
            let handle = pv_of(namespace, claim).and_then(|pv| {
                kube.get(Kind::PersistentVolume, None, &pv)
                    .ok()
                    .flatten()
                    .map(|o| str_at(&o, &["spec", "csi", "volumeHandle"]))
            });
            if let Some(h) = handle {
                let name = kubelet::attachment_name(&h, driver_name, node);
                if kube
                    .get(Kind::VolumeAttachment, None, &name)
                    .ok()
                    .flatten()
                    .is_some()
                {
                    out.push(CsiTarget::Attach(AttachTarget::Attachment { name }));
                }
            }
            out
        }
    }
}

/// One actor: reconcile its targets pass after pass (as their controllers would,
/// concurrently with the other actors) until a pass is all done with nothing
/// new, or makes no progress; whatever is left, the convergence after the block
/// finishes on the virtual clock.
async fn act(sidecars: &CsiSidecars, kube: &KubeFake, w: &Work) -> anyhow::Result<()> {
    let mut last: Vec<CsiTarget> = Vec::new();
    for _ in 0..6 {
        let targets = work_targets(kube, sidecars.attacher.driver_name(), w);
        let mut done = 0;
        for t in &targets {
            match sidecars
                .reconcile(t)
                .await
                .map_err(|e| anyhow!("reconciling {t}: {e}"))?
            {
                Reconcile::Done => done += 1,
                Reconcile::Requeue { .. } => {}
            }
        }
        if done == 0 || (done == targets.len() && targets == last) {
            break;
        }
        last = targets;
    }
    Ok(())
}

/// The sidecar a target belongs to (for whose lane its notes go in).
fn sidecar_of(t: &CsiTarget) -> Component {
    match t {
        CsiTarget::Provision(_) => Component::CsiProvisioner,
        CsiTarget::Attach(_) => Component::CsiAttacher,
        CsiTarget::Node { .. } => Component::Kubelet,
        CsiTarget::Snapshot(_) => Component::CsiSnapshotter,
    }
}

/// The CSI system's BOSH backend on 127.0.0.1 for use by hand (`drivelab
/// serve --system csi`): the Director with UAA, CPI and agents, the IaaS block
/// API, and one mount table per node — what a CSI driver (or a conformance
/// tool acting as the CO) is pointed at. No sidecars: the user's CO drives.
pub struct ServedCsi {
    _dir: tempfile::TempDir,
    backend: BoshBackend,
    /// (node name, CSI node id, its mount table, the table's listener).
    nodes: Vec<(String, String, MountTable, Listener)>,
    /// Every call the fakes answered.
    pub history: History,
}

impl ServedCsi {
    /// Stand up the backend a `bosh:` section describes.
    pub async fn start(spec: &Bosh) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("drivelab-serve-csi-")
            .tempdir()
            .context("creating the state directory")?;
        // In memory: every restart the lab does is in-process.
        let stores = MemStores::default();
        let store = |name: &str| -> anyhow::Result<Arc<dyn Store>> { Ok(stores.open(name)) };
        let history = History::new(SimClock::new());
        let gate = || Gate::new(history.clone());
        // Secrets must not be guessable from a seed when a person uses them.
        let mut rng = ChaCha20Rng::from_os_rng();
        let backend = BoshBackend::start(spec, &store, &gate, &mut rng).await?;
        let filesystems = Filesystems::default();
        let mut nodes = Vec::new();
        for n in &spec.nodes {
            let iid = backend.instance_of(&n.name)?;
            let table =
                MountTable::new(&n.name, backend.devices(&iid), filesystems.clone(), gate());
            let l = table
                .serve(loopback())
                .await
                .context("serving a mount table")?;
            nodes.push((n.name.clone(), iid, table, l));
        }
        Ok(ServedCsi {
            _dir: dir,
            backend,
            nodes,
            history,
        })
    }

    /// `key: value` lines for the banner: every endpoint and credential.
    pub fn banner(&self) -> Vec<(String, String)> {
        let b = &self.backend;
        let mut out = vec![
            ("director_url".to_string(), b.director_url.clone()),
            ("uaa_url".to_string(), b.director_url.clone()),
            ("client_id".to_string(), CLIENT_ID.to_string()),
            (
                "client_secret".to_string(),
                b.client_secret.expose().to_string(),
            ),
            ("block_api_url".to_string(), b.block_url.clone()),
            (
                "block_api_credential".to_string(),
                b.block_secret.expose().to_string(),
            ),
        ];
        for d in &b.spec.deployments {
            out.push((
                format!("deployment {}", d.name),
                format!("{} instances of {}", d.instances, d.instance_group),
            ));
        }
        for c in &b.spec.storage_classes {
            out.push((
                format!("storage_class {}", c.name),
                format!(
                    "disk_pool_name={} deployment_name={} fstype={}",
                    c.disk_pool, c.deployment, c.fstype
                ),
            ));
        }
        for (name, iid, _, l) in &self.nodes {
            out.push((
                format!("node {name}"),
                format!("node_id={iid} mounter_url={}", l.url()),
            ));
        }
        out
    }

    /// Stop serving.
    pub async fn stop(self) {
        self.backend.director.down().await;
        drop(self.nodes);
    }
}

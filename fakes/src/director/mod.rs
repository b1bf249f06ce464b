//! Fake BOSH Director: `/info`, deployments and instances (VMs made through
//! the [`Cpi`]), tasks, deployment/VM locks, a fake UAA, and the dynamic-disks
//! API of the accepted RFC with its ordering and idempotency rules.
//!
//! Disk jobs run on their own pool of `dynamic_disks_workers` (0 by default:
//! their tasks stay `queued`); VM operations (deploy, recreate, stop, delete
//! VM) run at once, each holding `lock:deployment:<name>`. Disk jobs take
//! `lock:disk:<name>` then `lock:vm:<instance_id>` (not the deployment lock,
//! as in the merged implementation). Each VM has an in-process fake agent
//! whose disk table the lab reads ([`Director::agent_disks`]).

mod api;
pub mod auth;
mod jobs;
pub mod lanes;
mod locks;
pub mod state;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use crate::clock::SimClock;
use crate::cpi::Cpi;
use crate::gate::{CallSpec, Delivery, Gate, Verdict};
use crate::history::{Component, Outcome};
use crate::ops::Op;
use crate::secret::Secret;
use crate::store::{Store, StoreError};

crate::declare_ops!(
    /// What the Director asks a VM's agent (through the Director→Agent gate).
    pub AGENT_OPS {
        ADD_DYNAMIC_DISK = "add_dynamic_disk",
        REMOVE_DYNAMIC_DISK = "remove_dynamic_disk",
    }
);

pub use api::ops as api_ops;
pub use locks::LockView;
pub use state::{AgentDisk, Job, TaskState};

use locks::LockTable;
use state::{InstanceRec, State, TaskRec};

/// Errors constructing or driving the fake.
#[derive(Debug, thiserror::Error)]
pub enum DirectorError {
    /// The backing store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The configuration cannot work.
    #[error("invalid Director configuration: {0}")]
    Config(String),
    /// No such instance / task / deployment.
    #[error("{0} not found")]
    NotFound(String),
    /// Setup (creating the configured VMs) failed.
    #[error("Director setup failed: {0}")]
    Setup(String),
    /// The call needs a tokio runtime.
    #[error("the Director fake must be created inside a tokio runtime")]
    NoRuntime,
}

/// An instance group of a deployment.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct InstanceGroupConfig {
    /// Group name (`worker`).
    pub name: String,
    /// Number of instances.
    pub instances: u32,
    /// AZs, assigned round-robin by index (empty: no AZ).
    #[serde(default)]
    pub azs: Vec<String>,
}

/// A deployment created at setup.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct DeploymentConfig {
    /// Deployment name.
    pub name: String,
    /// Its instance groups.
    pub instance_groups: Vec<InstanceGroupConfig>,
}

/// A disk pool (`disk_pool_name`) and the cloud properties it passes to create_disk.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct DiskPoolConfig {
    /// Pool name.
    pub name: String,
    /// Cloud properties for create_disk.
    #[serde(default)]
    pub cloud_properties: Value,
}

/// A UAA client: its secret and the scopes (and deployments) it is granted.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// client_id.
    pub id: String,
    /// client_secret (never logged).
    pub secret: Secret,
    /// Granted scopes (`bosh.dynamic-disks.attach`, `bosh.admin`, ...).
    pub scopes: Vec<String>,
    /// Deployments it may touch when per-deployment scoping is on (empty: all).
    pub deployments: Vec<String>,
}

/// The Director's configuration.
#[derive(Clone, Debug)]
pub struct DirectorConfig {
    /// Director name (`/info`).
    pub name: String,
    /// Director uuid (`/info`, CPI context).
    pub uuid: String,
    /// Deployments and instances created at first start.
    pub deployments: Vec<DeploymentConfig>,
    /// Disk pools the API accepts.
    pub disk_pools: Vec<DiskPoolConfig>,
    /// UAA clients.
    pub clients: Vec<ClientConfig>,
    /// Refuse a token scoped to other deployments (the RFC's future work; switchable).
    pub per_deployment_scoping: bool,
    /// Size of the disk-job worker pool (0: feature off, tasks stay queued).
    pub dynamic_disks_workers: usize,
    /// Lifetime of issued tokens (virtual time).
    pub token_ttl: Duration,
    /// How long a task waits for a lock (virtual time; the Director's default is 10 s).
    pub lock_timeout: Duration,
    /// Key tokens are signed with.
    pub token_signing_key: Secret,
    /// Disk jobs take the VM lock (false = the "lock not taken for disk jobs" bug).
    pub disk_jobs_take_vm_lock: bool,
    /// Disk jobs also take the deployment lock (the design the upgrade-deadlock concern is about).
    pub disk_jobs_take_deployment_lock: bool,
    /// The CPI name reported per disk.
    pub cpi_name: String,
    /// Model the worker pool in virtual time ([`lanes`]): CPI latencies are
    /// charged to the job's lane instead of advancing the lab's clock, and
    /// [`Director::lane_times`] says when each task was queued, ran and ended.
    pub virtual_lanes: bool,
}

impl Default for DirectorConfig {
    fn default() -> Self {
        Self {
            name: "drivelab-director".into(),
            uuid: "9e1f0a52-0000-4000-8000-000000000001".into(),
            deployments: vec![],
            disk_pools: vec![DiskPoolConfig {
                name: "default".into(),
                cloud_properties: Value::Object(Default::default()),
            }],
            clients: vec![],
            per_deployment_scoping: false,
            dynamic_disks_workers: 0,
            token_ttl: Duration::from_secs(3600),
            lock_timeout: Duration::from_secs(10),
            token_signing_key: Secret::new("drivelab-director-token-key"),
            disk_jobs_take_vm_lock: true,
            disk_jobs_take_deployment_lock: false,
            cpi_name: "default".into(),
            virtual_lanes: false,
        }
    }
}

/// An instance, for snapshots and checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InstanceView {
    /// Instance uuid (the CSI node id).
    pub id: String,
    /// Deployment.
    pub deployment: String,
    /// `group/index`.
    pub name: String,
    /// Its VM, if it has one.
    pub vm_cid: Option<String>,
    /// AZ.
    pub az: Option<String>,
    /// started | stopped | detached
    pub state: String,
}

/// A dynamic disk, for snapshots and checks.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct DiskView {
    /// Disk name (unique across the Director).
    pub name: String,
    /// IaaS cid.
    pub cid: String,
    /// Owning deployment.
    pub deployment: String,
    /// Instance it is attached to (per the Director's database).
    pub instance_id: Option<String>,
    /// AZ.
    pub az: Option<String>,
    /// Size in MiB.
    pub size_mib: u64,
    /// Disk pool.
    pub pool: String,
    /// Metadata as last set.
    pub metadata: serde_json::Map<String, Value>,
}

/// A task, for snapshots and checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct TaskView {
    /// Task id.
    pub id: u64,
    /// State.
    pub state: TaskState,
    /// Description.
    pub description: String,
    /// The client/user that queued it.
    pub user: String,
    /// Deployment, when it concerns one.
    pub deployment: Option<String>,
    /// Result line or error message.
    pub result: Option<String>,
    /// Whether it ran (runs) on the dynamic-disks pool.
    pub disk_job: bool,
}

impl From<&TaskRec> for TaskView {
    fn from(t: &TaskRec) -> Self {
        TaskView {
            id: t.id,
            state: t.state,
            description: t.description.clone(),
            user: t.user.clone(),
            deployment: t.deployment.clone(),
            result: t.result.clone(),
            disk_job: t.job.is_disk_job(),
        }
    }
}

#[derive(Default)]
struct Sched {
    queue: std::collections::VecDeque<u64>,
    workers: usize,
    running: usize,
}

pub(crate) struct Inner {
    pub state: State,
    pub gate: Gate,
    pub cpi: Cpi,
    pub config: DirectorConfig,
    /// Bearer tokens already verified under `config.token_signing_key`.
    pub verified: auth::Verified,
    pub locks: Arc<LockTable>,
    pub clock: SimClock,
    sched: Mutex<Sched>,
    wake: Notify,
    /// Signalled whenever a task finishes.
    pub finished: Notify,
    /// Tasks waiting for a lock right now (they cannot get further on their own).
    pub blocked: Mutex<std::collections::BTreeSet<u64>>,
    /// Signalled when a task starts or stops waiting for a lock.
    pub progress: Notify,
    stemcell: Mutex<Option<String>>,
    tasks_lock: Mutex<()>,
    jti: std::sync::atomic::AtomicU64,
    /// Every task this "process" spawned, so its end stops them all.
    spawned: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    /// The worker pool's virtual timeline (used when `config.virtual_lanes`).
    pub lanes: Mutex<lanes::Lanes>,
}

/// Stops the dispatcher and running jobs when the last handle goes (a
/// Director "process" ends; jobs stop where they are, as in a crash).
struct Workers(Arc<Mutex<Vec<tokio::task::AbortHandle>>>);

impl Drop for Workers {
    fn drop(&mut self) {
        for h in self.0.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            h.abort();
        }
    }
}

/// The fake Director. Cheap to clone; dropping every clone stops its workers
/// (in-flight jobs stop where they are, as in a crash).
#[derive(Clone)]
pub struct Director {
    inner: Arc<Inner>,
    _workers: Arc<Workers>,
}

/// A deterministic uuid-shaped id from `parts`.
fn uuid_from(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    let x = hex::encode(h.finalize());
    format!(
        "{}-{}-4{}-8{}-{}",
        &x[0..8],
        &x[8..12],
        &x[13..16],
        &x[17..20],
        &x[20..32]
    )
}

impl Director {
    /// A Director over `store` calling `cpi`. On a fresh store it creates the
    /// configured deployments and their VMs (through the CPI); on a reopened
    /// one it keeps its records, re-queues queued tasks and fails tasks that
    /// were processing (their worker died with the old process). Must run
    /// inside a tokio runtime. Its virtual clock is the gate's history's.
    pub async fn new(
        store: Arc<dyn Store>,
        gate: Gate,
        cpi: Cpi,
        config: DirectorConfig,
    ) -> Result<Self, DirectorError> {
        validate(&config)?;
        let handle = tokio::runtime::Handle::try_current().map_err(|_| DirectorError::NoRuntime)?;
        let clock = gate.history().clock().clone();
        let state = State::new(store);
        let config_workers = config.dynamic_disks_workers;
        let inner = Arc::new(Inner {
            sched: Mutex::new(Sched {
                workers: config.dynamic_disks_workers,
                ..Sched::default()
            }),
            state,
            gate,
            cpi,
            config,
            verified: auth::Verified::default(),
            locks: Arc::default(),
            clock,
            wake: Notify::new(),
            finished: Notify::new(),
            blocked: Mutex::default(),
            progress: Notify::new(),
            stemcell: Mutex::new(None),
            tasks_lock: Mutex::new(()),
            jti: std::sync::atomic::AtomicU64::new(0),
            spawned: Arc::default(),
            lanes: Mutex::new(lanes::Lanes::new(config_workers)),
        });
        let dispatcher = handle.spawn(jobs::dispatch(inner.clone()));
        inner.track(dispatcher.abort_handle());
        let director = Director {
            inner: inner.clone(),
            _workers: Arc::new(Workers(inner.spawned.clone())),
        };
        if inner.state.initialized()? {
            director.recover()?;
        } else {
            director.setup().await?;
        }
        Ok(director)
    }

    fn recover(&self) -> Result<(), DirectorError> {
        let st = &self.inner.state;
        *self
            .inner
            .stemcell
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = st.get_meta("stemcell")?;
        for mut t in st.tasks()? {
            match t.state {
                TaskState::Processing => {
                    t.state = TaskState::Error;
                    t.result = Some("Director restarted while the task was processing".into());
                    st.put_task(&t)?;
                }
                TaskState::Queued | TaskState::Cancelling => {
                    if t.job.is_disk_job() {
                        self.inner.enqueue_disk(t.id);
                    } else {
                        self.spawn_task(t.id);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    async fn setup(&self) -> Result<(), DirectorError> {
        let st = &self.inner.state;
        let stemcell = self
            .inner
            .cpi
            .create_stemcell("/var/vcap/store/stemcells/bosh-stemcell-fake.tgz")
            .await
            .map_err(|e| DirectorError::Setup(e.to_string()))?;
        st.put_meta("stemcell", &stemcell)?;
        *self
            .inner
            .stemcell
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(stemcell);
        for d in &self.inner.config.deployments {
            st.put_deployment(&d.name)?;
            for g in &d.instance_groups {
                for index in 0..g.instances {
                    let az = if g.azs.is_empty() {
                        None
                    } else {
                        Some(g.azs[index as usize % g.azs.len()].clone())
                    };
                    st.put_instance(&InstanceRec {
                        id: uuid_from(&[
                            &self.inner.config.uuid,
                            &d.name,
                            &g.name,
                            &index.to_string(),
                        ]),
                        deployment: d.name.clone(),
                        group: g.name.clone(),
                        index,
                        az,
                        vm_cid: None,
                        agent_id: None,
                        state: "detached".into(),
                        vm_generation: 0,
                    })?;
                }
            }
        }
        for d in &self.inner.config.deployments {
            let t = self
                .run_job(
                    Job::Deploy {
                        deployment: d.name.clone(),
                    },
                    "admin",
                )
                .await?;
            if t.state != TaskState::Done {
                return Err(DirectorError::Setup(format!(
                    "deploying {}: {}",
                    d.name,
                    t.result.unwrap_or_default()
                )));
            }
        }
        st.mark_initialized()?;
        Ok(())
    }

    /// The HTTP router (Director API + fake UAA), gated.
    pub fn router(&self) -> axum::Router {
        api::router(self.inner.clone())
    }

    /// Serve on `addr` (use [`crate::serve::loopback`]).
    pub async fn serve(
        &self,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<crate::serve::Listener> {
        crate::serve::serve_http(self.router(), addr).await
    }

    /// The CPI it calls.
    pub fn cpi(&self) -> &Cpi {
        &self.inner.cpi
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &DirectorConfig {
        &self.inner.config
    }

    /// Every instance, by deployment/group/index.
    pub fn instances(&self) -> Vec<InstanceView> {
        self.inner
            .state
            .instances()
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "director fake: reading instances failed");
                vec![]
            })
            .into_iter()
            .map(|i| InstanceView {
                name: format!("{}/{}", i.group, i.index),
                id: i.id,
                deployment: i.deployment,
                vm_cid: i.vm_cid,
                az: i.az,
                state: i.state,
            })
            .collect()
    }

    /// Every dynamic disk, by name.
    pub fn disks(&self) -> Vec<DiskView> {
        self.inner
            .state
            .disks()
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "director fake: reading disks failed");
                vec![]
            })
            .into_iter()
            .map(|d| DiskView {
                name: d.name,
                cid: d.cid,
                deployment: d.deployment,
                instance_id: d.instance_id,
                az: d.az,
                size_mib: d.size_mib,
                pool: d.pool,
                metadata: d.metadata,
            })
            .collect()
    }

    /// Every task, by id.
    pub fn tasks(&self) -> Vec<TaskView> {
        self.inner
            .state
            .tasks()
            .unwrap_or_default()
            .iter()
            .map(TaskView::from)
            .collect()
    }

    /// One task.
    pub fn task(&self, id: u64) -> Option<TaskView> {
        self.inner
            .state
            .task(id)
            .ok()
            .flatten()
            .as_ref()
            .map(TaskView::from)
    }

    /// Locks held now.
    pub fn locks(&self) -> Vec<LockView> {
        self.inner.locks.views()
    }

    /// The disks the agent of an instance (by instance id or VM cid) has been
    /// told about (add_dynamic_disk minus remove_dynamic_disk).
    pub fn agent_disks(&self, instance_or_vm: &str) -> Vec<AgentDisk> {
        let st = &self.inner.state;
        let vm = match st.instance(instance_or_vm) {
            Ok(Some(i)) => match i.vm_cid {
                Some(v) => v,
                None => return vec![],
            },
            _ => instance_or_vm.to_string(),
        };
        st.agent_disks(&vm).unwrap_or_default()
    }

    /// The disk-job worker pool's size.
    pub fn dynamic_disks_workers(&self) -> usize {
        self.inner.sched().workers
    }

    /// The process dies: its dispatcher and running jobs stop where they are
    /// (their tasks stay as the store has them; a Director built on the same
    /// store afterwards recovers them as a restarted one does).
    pub fn kill(&self) {
        for h in self
            .inner
            .spawned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            h.abort();
        }
    }

    /// Resize the disk-job worker pool now (0 stops new disk jobs starting;
    /// running ones finish).
    pub fn set_dynamic_disks_workers(&self, n: usize) {
        self.inner.sched().workers = n;
        self.inner
            .lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .resize(n);
        self.inner.wake.notify_one();
    }

    /// When each finished task was queued, taken by a worker, started and
    /// ended on the modelled timeline (empty unless `virtual_lanes`).
    pub fn lane_times(&self) -> Vec<lanes::LaneTimes> {
        self.inner
            .lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .times()
    }

    /// Queue a VM operation as the lab (user `admin`) and return its task id at
    /// once; it runs now, not on the disk pool.
    pub fn start_job(&self, job: Job) -> Result<u64, DirectorError> {
        let id = self.inner.create_task(job, "admin", "")?;
        Ok(id)
    }

    /// Run a job as user `user` and wait for its task to finish.
    pub async fn run_job(&self, job: Job, user: &str) -> Result<TaskView, DirectorError> {
        let id = self.inner.create_task(job, user, "")?;
        self.wait_task(id).await
    }

    /// Recreate an instance's VM (deployment lock, VM lock, dynamic disks detached and not reattached).
    pub async fn recreate_vm(&self, instance_id: &str) -> Result<TaskView, DirectorError> {
        self.need_instance(instance_id)?;
        self.run_job(
            Job::Recreate {
                instance_id: instance_id.into(),
            },
            "admin",
        )
        .await
    }

    /// Delete an instance's VM (its dynamic disks are detached first).
    pub async fn delete_vm(&self, instance_id: &str) -> Result<TaskView, DirectorError> {
        self.need_instance(instance_id)?;
        self.run_job(
            Job::DeleteVm {
                instance_id: instance_id.into(),
            },
            "admin",
        )
        .await
    }

    /// Recreate every instance of `deployment` in order, holding its lock throughout.
    pub async fn rolling_update(&self, deployment: &str) -> Result<TaskView, DirectorError> {
        self.run_job(
            Job::RollingUpdate {
                deployment: deployment.into(),
            },
            "admin",
        )
        .await
    }

    fn need_instance(&self, id: &str) -> Result<(), DirectorError> {
        match self.inner.state.instance(id)? {
            Some(_) => Ok(()),
            None => Err(DirectorError::NotFound(format!("instance {id}"))),
        }
    }

    /// Wait until task `id` is finished.
    pub async fn wait_task(&self, id: u64) -> Result<TaskView, DirectorError> {
        loop {
            let n = self.inner.finished.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            let t = self
                .inner
                .state
                .task(id)?
                .ok_or_else(|| DirectorError::NotFound(format!("task {id}")))?;
            if t.state.is_finished() {
                return Ok(TaskView::from(&t));
            }
            n.await;
        }
    }

    /// Cancel a task (as `DELETE /task/:id`): queued/processing → cancelling.
    pub fn cancel_task(&self, id: u64) -> Result<TaskState, DirectorError> {
        self.inner.cancel(id)
    }

    fn spawn_task(&self, id: u64) {
        self.inner.spawn_task(id);
    }
}

fn validate(c: &DirectorConfig) -> Result<(), DirectorError> {
    let mut seen = std::collections::BTreeSet::new();
    for d in &c.deployments {
        if d.name.is_empty() || d.name.contains('/') {
            return Err(DirectorError::Config(format!(
                "deployment name {:?} must be non-empty without '/'",
                d.name
            )));
        }
        if !seen.insert(d.name.clone()) {
            return Err(DirectorError::Config(format!(
                "deployment {} listed twice",
                d.name
            )));
        }
    }
    for cl in &c.clients {
        if cl.id.is_empty() {
            return Err(DirectorError::Config("a UAA client has an empty id".into()));
        }
    }
    Ok(())
}

impl Inner {
    fn sched(&self) -> std::sync::MutexGuard<'_, Sched> {
        self.sched.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn now_secs(&self) -> u64 {
        self.clock.now().0 / 1000
    }

    pub fn stemcell(&self) -> Option<String> {
        self.stemcell
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn next_jti(&self) -> u64 {
        self.jti.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
    }

    fn enqueue_disk(&self, id: u64) {
        self.sched().queue.push_back(id);
        self.wake.notify_one();
    }

    /// Record a new task and hand it to its pool.
    pub fn create_task(
        self: &Arc<Self>,
        job: Job,
        user: &str,
        context_id: &str,
    ) -> Result<u64, DirectorError> {
        let (description, deployment) = jobs::describe(self, &job);
        let id = {
            let _g = self.tasks_lock.lock().unwrap_or_else(|p| p.into_inner());
            let id = self.state.next_task_id()?;
            self.state.put_task(&TaskRec {
                id,
                state: TaskState::Queued,
                description,
                timestamp: self.now_secs(),
                started_at: None,
                result: None,
                output: None,
                user: user.to_string(),
                context_id: context_id.to_string(),
                deployment,
                job: job.clone(),
            })?;
            id
        };
        if self.config.virtual_lanes {
            self.lanes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .queue(id, self.clock.now().0);
        }
        if job.is_disk_job() {
            self.enqueue_disk(id);
        } else {
            self.spawn_task(id);
        }
        Ok(id)
    }

    /// Wait until task `id` has run as far as it can without waiting: finished,
    /// queued with no disk workers at all, or waiting for a lock. The API answers
    /// a disk request only then, so a task's CPI and agent calls come before
    /// the reply in the history instead of racing the client's polls in real
    /// time (a job that must wait still runs later, on its own). Bounded in
    /// real time so a stuck job cannot hold a request for ever.
    pub async fn settle(&self, id: u64) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let finished = self.finished.notified();
            let progress = self.progress.notified();
            tokio::pin!(finished, progress);
            finished.as_mut().enable();
            progress.as_mut().enable();
            let state = match self.state.task(id) {
                Ok(Some(t)) => t.state,
                _ => return,
            };
            if state.is_finished() {
                return;
            }
            if self
                .blocked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&id)
            {
                return;
            }
            // Queued behind busy workers it will run soon; with no workers at
            // all (the feature off) it never will.
            if state == TaskState::Queued && self.sched().workers == 0 {
                return;
            }
            let tick = tokio::time::sleep(std::time::Duration::from_millis(2));
            tokio::select! {
                _ = finished => {}
                _ = progress => {}
                _ = tick => {}
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    }

    /// Run task `id` now, off the disk pool.
    pub fn spawn_task(self: &Arc<Self>, id: u64) {
        let h = tokio::spawn(jobs::run_task(self.clone(), id));
        self.track(h.abort_handle());
    }

    pub fn track(&self, h: tokio::task::AbortHandle) {
        let mut v = self.spawned.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|h| !h.is_finished());
        v.push(h);
    }

    pub fn cancel(&self, id: u64) -> Result<TaskState, DirectorError> {
        let _g = self.tasks_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut t = self
            .state
            .task(id)?
            .ok_or_else(|| DirectorError::NotFound(format!("task {id}")))?;
        if matches!(t.state, TaskState::Queued | TaskState::Processing) {
            t.state = TaskState::Cancelling;
            self.state.put_task(&t)?;
        }
        Ok(t.state)
    }

    /// Update a task record under the task lock.
    pub fn update_task(
        &self,
        id: u64,
        f: impl FnOnce(&mut TaskRec),
    ) -> Result<TaskRec, DirectorError> {
        let _g = self.tasks_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut t = self
            .state
            .task(id)?
            .ok_or_else(|| DirectorError::NotFound(format!("task {id}")))?;
        f(&mut t);
        self.state.put_task(&t)?;
        Ok(t)
    }

    /// The agent on `vm_cid` (through the Director→Agent gate).
    pub async fn agent_call(
        &self,
        op: Op,
        vm_cid: &str,
        disk_cid: &str,
        hint: Option<&Value>,
    ) -> Result<(), String> {
        let spec = CallSpec::new(
            Component::Director,
            Component::Agent,
            op,
            format!("{vm_cid}/{disk_cid}"),
        );
        let (id, verdict) = self.gate.enter(&spec).await;
        match verdict {
            Verdict::Proceed => {}
            Verdict::Reject(r) => {
                self.gate
                    .leave(
                        id,
                        &spec,
                        Outcome::Grpc {
                            code: r.code.clone(),
                            message: r.message.clone(),
                        },
                    )
                    .await;
                return Err(format!("agent on {vm_cid}: {op}: {}", r.message));
            }
            Verdict::Cut => {
                self.gate.cut_before(id);
                return Err(format!("Timed out sending '{op}' to agent on {vm_cid}"));
            }
        }
        let result = self.agent_apply(op, vm_cid, disk_cid, hint);
        let outcome = match &result {
            Ok(()) => Outcome::Grpc {
                code: "OK".into(),
                message: String::new(),
            },
            Err(e) => Outcome::Grpc {
                code: "AgentError".into(),
                message: e.clone(),
            },
        };
        match self.gate.leave(id, &spec, outcome).await {
            Delivery::Deliver => result,
            Delivery::Cut => Err(format!(
                "Timed out waiting for '{op}' reply from agent on {vm_cid}"
            )),
        }
    }

    fn agent_apply(
        &self,
        op: Op,
        vm_cid: &str,
        disk_cid: &str,
        hint: Option<&Value>,
    ) -> Result<(), String> {
        // One read, not a scan of every VM: at 1000 VMs the scan per agent
        // call was 14% of a scale run (perf, 300 nodes).
        if !self.cpi.has_vm_record(vm_cid) {
            return Err(format!("agent on {vm_cid} is unreachable (no such VM)"));
        }
        let mut disks = self.state.agent_disks(vm_cid).map_err(|e| e.to_string())?;
        match op {
            ADD_DYNAMIC_DISK => {
                disks.retain(|d| d.disk_cid != disk_cid);
                disks.push(AgentDisk {
                    disk_cid: disk_cid.to_string(),
                    hint: hint.cloned().unwrap_or(Value::Null),
                });
            }
            REMOVE_DYNAMIC_DISK => disks.retain(|d| d.disk_cid != disk_cid),
            other => return Err(format!("agent does not know '{other}'")),
        }
        self.state
            .put_agent_disks(vm_cid, &disks)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests;

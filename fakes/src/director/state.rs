//! The Director's database: deployments, instances, dynamic disks, tasks and
//! the agents' disk tables, as JSON records in a [`Store`] so a Director
//! restart keeps them (locks and the worker pool are process state and do not).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::{Store, StoreError, StoreExt};

/// A task's state, as `/tasks/:id` spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting for a worker.
    Queued,
    /// A worker runs it.
    Processing,
    /// Cancel asked; takes effect at the job's next checkpoint.
    Cancelling,
    /// Cancelled at a checkpoint.
    Cancelled,
    /// Finished successfully.
    Done,
    /// Failed; `result` says why.
    Error,
    /// Ran out of time.
    Timeout,
}

impl TaskState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Processing => "processing",
            TaskState::Cancelling => "cancelling",
            TaskState::Cancelled => "cancelled",
            TaskState::Done => "done",
            TaskState::Error => "error",
            TaskState::Timeout => "timeout",
        }
    }

    /// Done, error, cancelled or timeout.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            TaskState::Done | TaskState::Error | TaskState::Cancelled | TaskState::Timeout
        )
    }
}

/// What a task does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "snake_case")]
pub enum Job {
    /// `POST /dynamic_disks/provide`: create if missing, then attach.
    Provide {
        instance_id: String,
        disk_name: String,
        disk_pool_name: String,
        disk_size: u64,
        metadata: Option<serde_json::Map<String, Value>>,
    },
    /// `POST /dynamic_disks`.
    Create {
        deployment_name: String,
        az: Option<String>,
        disk_name: String,
        disk_pool_name: String,
        disk_size: u64,
        metadata: Option<serde_json::Map<String, Value>>,
    },
    /// `POST /dynamic_disks/:name/attach`.
    Attach {
        disk_name: String,
        instance_id: String,
        metadata: Option<serde_json::Map<String, Value>>,
    },
    /// `POST /dynamic_disks/:name/detach`.
    Detach { disk_name: String },
    /// `DELETE /dynamic_disks/:name`.
    Delete { disk_name: String },
    /// `POST /dynamic_disks/:name/resize` (new size in MiB; the disk must be detached).
    Resize { disk_name: String, disk_size: u64 },
    /// `POST /dynamic_disks/:name/snapshots` (per-disk form of BOSH's
    /// `POST /deployments/:d/jobs/:j/:i/snapshots`).
    Snapshot {
        disk_name: String,
        metadata: Option<serde_json::Map<String, Value>>,
    },
    /// `DELETE /dynamic_disks/snapshots/:cid` (BOSH: `DELETE /deployments/:d/snapshots/:cid`).
    DeleteSnapshot { snapshot_cid: String },
    /// Create the VMs a deployment's instances lack.
    Deploy { deployment: String },
    /// Recreate one instance's VM.
    Recreate { instance_id: String },
    /// Recreate every instance of a deployment, one after another, under one deployment lock.
    RollingUpdate { deployment: String },
    /// Delete one instance's VM (`bosh stop --hard` / delete-vm).
    DeleteVm { instance_id: String },
    /// Soft stop (jobs stopped, VM kept).
    Stop { instance_id: String },
    /// Start: create the VM if it has none.
    Start { instance_id: String },
}

impl Job {
    /// Whether it runs on the dynamic-disks worker pool.
    pub fn is_disk_job(&self) -> bool {
        matches!(
            self,
            Job::Provide { .. }
                | Job::Create { .. }
                | Job::Attach { .. }
                | Job::Detach { .. }
                | Job::Delete { .. }
                | Job::Resize { .. }
                | Job::Snapshot { .. }
                | Job::DeleteSnapshot { .. }
        )
    }
}

/// A disk snapshot the Director recorded (BOSH keeps them in its `snapshots` table).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRec {
    pub snapshot_cid: String,
    pub disk_name: String,
    pub disk_cid: String,
    pub deployment: String,
    pub size_mib: u64,
    /// Virtual seconds when taken.
    pub created_at: u64,
    pub metadata: serde_json::Map<String, Value>,
}

/// A task record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskRec {
    pub id: u64,
    pub state: TaskState,
    pub description: String,
    /// Virtual seconds when it was queued.
    pub timestamp: u64,
    pub started_at: Option<u64>,
    /// The short result line (`/tasks/:id`'s `result`), or the error message.
    pub result: Option<String>,
    /// The result file (`/tasks/:id/output?type=result`).
    pub output: Option<String>,
    pub user: String,
    pub context_id: String,
    pub deployment: Option<String>,
    pub job: Job,
}

/// An instance of a deployment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceRec {
    pub id: String,
    pub deployment: String,
    pub group: String,
    pub index: u32,
    pub az: Option<String>,
    pub vm_cid: Option<String>,
    pub agent_id: Option<String>,
    /// `started`, `stopped`, or `detached` (no VM).
    pub state: String,
    /// How many VMs this instance had (agent ids derive from it).
    pub vm_generation: u64,
}

/// A dynamic disk record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DiskRec {
    pub name: String,
    pub cid: String,
    pub deployment: String,
    pub az: Option<String>,
    pub size_mib: u64,
    pub pool: String,
    pub cpi: String,
    pub metadata: serde_json::Map<String, Value>,
    pub instance_id: Option<String>,
    /// The hint attach_disk returned (what the agent got).
    pub hint: Option<Value>,
}

/// A disk as an agent knows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentDisk {
    /// The disk's cid.
    pub disk_cid: String,
    /// The CPI's disk hint, as the Director passed it.
    pub hint: Value,
}

/// Typed access to the Director's records.
#[derive(Clone)]
pub struct State {
    store: Arc<dyn Store>,
    /// The dynamic-disk records, decoded: a write-through index over the
    /// store's `disk/` keys (loaded on first use, so a restarted Director
    /// reads them from the store once). `GET /dynamic_disks` lists every disk
    /// on each call; without it each list re-read and re-decoded N records.
    disks: Arc<Mutex<Option<DiskIndex>>>,
    /// Task records read or written since this Director started, decoded
    /// (write-through, like `disks`): a task is read at every poll, settle
    /// round and job checkpoint, and decoding its JSON each time was most of
    /// the store decoding that took a tenth of the fake's CPU per attach.
    /// Only this Director writes its tasks; a restarted one starts with an
    /// empty cache over the same store. Kept for the run (~0.5 KB a task).
    tasks: Arc<Mutex<TaskCache>>,
    /// Each VM agent's disk table, decoded (write-through, like `tasks`):
    /// the lab asks every node for its devices at each step boundary.
    agents: Arc<Mutex<BTreeMap<String, Vec<AgentDisk>>>>,
}

/// The decoded tasks, and whether they are all of them: after one scan of
/// the store they are (every later write goes through), so listing every
/// task (a snapshot per step does) decodes nothing again.
#[derive(Default)]
struct TaskCache {
    by_id: BTreeMap<u64, TaskRec>,
    complete: bool,
}

/// The decoded disks, each with its `GET /dynamic_disks` entry once
/// rendered, and the unscoped list's body until any disk changes. A driver
/// that finds a disk by listing (bosh-csi does, as the API offers no lookup
/// by name) asks several times per volume, and under churn some disk changed
/// since the last list nearly every time: a 1000-node churn spent 7% of its
/// CPU rendering the whole list for each call. An entry lives with its record,
/// so a change drops exactly it and a list renders only what changed.
#[derive(Default)]
struct DiskIndex {
    by_name: BTreeMap<String, Indexed>,
    body: Option<bytes::Bytes>,
}

/// One disk and its list entry, rendered on the first list after it changed.
struct Indexed {
    rec: DiskRec,
    entry: Option<bytes::Bytes>,
}

fn task_key(id: u64) -> String {
    format!("task/{id:010}")
}

impl State {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            disks: Arc::default(),
            tasks: Arc::default(),
            agents: Arc::default(),
        }
    }

    /// Run `f` on the disk index (locked meanwhile), read from the store if
    /// this is its first use. `f` must not call back into `State`.
    fn with_index<T>(
        &self,
        f: impl FnOnce(&mut DiskIndex) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut g = self.disks.lock().unwrap_or_else(|p| p.into_inner());
        let index = match &mut *g {
            Some(index) => index,
            empty => {
                let recs = self.store.scan_json::<DiskRec>("disk/")?;
                let by_name = recs
                    .into_iter()
                    .map(|(_, rec)| (rec.name.clone(), Indexed { rec, entry: None }))
                    .collect();
                empty.insert(DiskIndex {
                    by_name,
                    body: None,
                })
            }
        };
        f(index)
    }

    pub fn initialized(&self) -> Result<bool, StoreError> {
        Ok(self.store.get("meta/initialized")?.is_some())
    }

    pub fn mark_initialized(&self) -> Result<(), StoreError> {
        self.store.put("meta/initialized", b"1")?;
        self.store.flush()
    }

    pub fn get_meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.store.get_json(&format!("meta/{key}"))
    }

    pub fn put_meta(&self, key: &str, v: &str) -> Result<(), StoreError> {
        self.store.put_json(&format!("meta/{key}"), &v)
    }

    pub fn next_task_id(&self) -> Result<u64, StoreError> {
        let n: u64 = self.store.get_json("counter/task")?.unwrap_or(0) + 1;
        self.store.put_json("counter/task", &n)?;
        Ok(n)
    }

    pub fn deployments(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .store
            .scan_json::<String>("deployment/")?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }

    pub fn put_deployment(&self, name: &str) -> Result<(), StoreError> {
        self.store.put_json(&format!("deployment/{name}"), &name)
    }

    pub fn instance(&self, id: &str) -> Result<Option<InstanceRec>, StoreError> {
        self.store.get_json(&format!("instance/{id}"))
    }

    pub fn put_instance(&self, i: &InstanceRec) -> Result<(), StoreError> {
        self.store.put_json(&format!("instance/{}", i.id), i)?;
        self.store.flush()
    }

    pub fn instances(&self) -> Result<Vec<InstanceRec>, StoreError> {
        let mut v: Vec<InstanceRec> = self
            .store
            .scan_json::<InstanceRec>("instance/")?
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        v.sort_by(|a, b| {
            (&a.deployment, &a.group, a.index).cmp(&(&b.deployment, &b.group, b.index))
        });
        Ok(v)
    }

    pub fn disk(&self, name: &str) -> Result<Option<DiskRec>, StoreError> {
        self.with_index(|index| Ok(index.by_name.get(name).map(|i| i.rec.clone())))
    }

    /// Store first, then the index: a failed write leaves the index as the store is.
    pub fn put_disk(&self, d: &DiskRec) -> Result<(), StoreError> {
        self.with_index(|index| {
            self.store.put_json(&format!("disk/{}", d.name), d)?;
            let rec = d.clone();
            index
                .by_name
                .insert(d.name.clone(), Indexed { rec, entry: None });
            index.body = None;
            Ok(())
        })?;
        self.store.flush()
    }

    pub fn remove_disk(&self, name: &str) -> Result<(), StoreError> {
        self.with_index(|index| {
            self.store.remove(&format!("disk/{name}"))?;
            index.by_name.remove(name);
            index.body = None;
            Ok(())
        })?;
        self.store.flush()
    }

    /// The disks `include` keeps, in name order, as a JSON array of what
    /// `render` writes for each (compact, as `serde_json::to_vec` of the list
    /// writes it). An entry is rendered again only after its disk changed;
    /// the whole body is kept too when every disk is listed (`all`: the
    /// unscoped list, the same for every caller). `include` and `render`
    /// must not call back into `State`.
    pub fn listed_disks(
        &self,
        all: bool,
        include: impl Fn(&DiskRec) -> bool,
        render: impl Fn(&DiskRec) -> Vec<u8>,
    ) -> Result<bytes::Bytes, StoreError> {
        self.with_index(|index| {
            if let Some(body) = index.body.as_ref().filter(|_| all) {
                return Ok(body.clone());
            }
            // Choose and render what changed, then fill the body in one
            // allocation (it is ~0.3 MB at 1000 nodes, on every list).
            let mut chosen: Vec<&bytes::Bytes> = Vec::new();
            for i in index.by_name.values_mut() {
                if all || include(&i.rec) {
                    let rec = &i.rec;
                    chosen.push(i.entry.get_or_insert_with(|| render(rec).into()));
                }
            }
            let len = 2 + chosen.iter().map(|e| e.len() + 1).sum::<usize>();
            let mut body = Vec::with_capacity(len);
            body.push(b'[');
            for (n, e) in chosen.into_iter().enumerate() {
                if n > 0 {
                    body.push(b',');
                }
                body.extend_from_slice(e);
            }
            body.push(b']');
            let body = bytes::Bytes::from(body);
            if all {
                index.body = Some(body.clone());
            }
            Ok(body)
        })
    }

    pub fn snapshot(&self, cid: &str) -> Result<Option<SnapshotRec>, StoreError> {
        self.store.get_json(&format!("snapshot/{cid}"))
    }

    pub fn put_snapshot(&self, s: &SnapshotRec) -> Result<(), StoreError> {
        self.store
            .put_json(&format!("snapshot/{}", s.snapshot_cid), s)?;
        self.store.flush()
    }

    pub fn remove_snapshot(&self, cid: &str) -> Result<(), StoreError> {
        self.store.remove(&format!("snapshot/{cid}"))?;
        self.store.flush()
    }

    pub fn snapshots(&self) -> Result<Vec<SnapshotRec>, StoreError> {
        Ok(self
            .store
            .scan_json::<SnapshotRec>("snapshot/")?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }

    pub fn disks(&self) -> Result<Vec<DiskRec>, StoreError> {
        self.with_index(|index| Ok(index.by_name.values().map(|i| i.rec.clone()).collect()))
    }

    pub fn task(&self, id: u64) -> Result<Option<TaskRec>, StoreError> {
        let mut cache = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = cache.by_id.get(&id) {
            return Ok(Some(t.clone()));
        }
        if cache.complete {
            return Ok(None);
        }
        let t: Option<TaskRec> = self.store.get_json(&task_key(id))?;
        if let Some(t) = &t {
            cache.by_id.insert(id, t.clone());
        }
        Ok(t)
    }

    /// Store first, then the cache: a failed write leaves the cache as the store is.
    pub fn put_task(&self, t: &TaskRec) -> Result<(), StoreError> {
        {
            let mut cache = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
            self.store.put_json(&task_key(t.id), t)?;
            cache.by_id.insert(t.id, t.clone());
        }
        self.store.flush()
    }

    pub fn tasks(&self) -> Result<Vec<TaskRec>, StoreError> {
        let mut cache = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        if !cache.complete {
            // Write-through: what the cache holds is what the store holds.
            cache.by_id = (self.store.scan_json::<TaskRec>("task/")?.into_iter())
                .map(|(_, t)| (t.id, t))
                .collect();
            cache.complete = true;
        }
        Ok(cache.by_id.values().cloned().collect())
    }

    pub fn agent_disks(&self, vm_cid: &str) -> Result<Vec<AgentDisk>, StoreError> {
        let mut cache = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = cache.get(vm_cid) {
            return Ok(d.clone());
        }
        let disks: Vec<AgentDisk> =
            (self.store.get_json(&format!("agent/{vm_cid}"))?).unwrap_or_default();
        cache.insert(vm_cid.to_string(), disks.clone());
        Ok(disks)
    }

    /// Store first, then the cache: a failed write leaves the cache as the store is.
    pub fn put_agent_disks(&self, vm_cid: &str, disks: &[AgentDisk]) -> Result<(), StoreError> {
        {
            let mut cache = self.agents.lock().unwrap_or_else(|p| p.into_inner());
            self.store.put_json(&format!("agent/{vm_cid}"), &disks)?;
            cache.insert(vm_cid.to_string(), disks.to_vec());
        }
        self.store.flush()
    }

    pub fn remove_agent(&self, vm_cid: &str) -> Result<(), StoreError> {
        let mut cache = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        self.store.remove(&format!("agent/{vm_cid}"))?;
        cache.remove(vm_cid);
        Ok(())
    }

    /// Deterministic agents' map (for views): vm cid → disks.
    pub fn agents(&self) -> Result<BTreeMap<String, Vec<AgentDisk>>, StoreError> {
        Ok(self
            .store
            .scan_json::<Vec<AgentDisk>>("agent/")?
            .into_iter()
            .map(|(k, v)| (k.trim_start_matches("agent/").to_string(), v))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    fn disk(name: &str, instance: Option<&str>) -> DiskRec {
        DiskRec {
            name: name.into(),
            cid: format!("cid-{name}"),
            deployment: "dep".into(),
            az: None,
            size_mib: 1024,
            pool: "pool".into(),
            cpi: String::new(),
            metadata: Default::default(),
            instance_id: instance.map(str::to_string),
            hint: None,
        }
    }

    /// What rendering the whole list at once writes.
    fn whole(state: &State) -> Vec<u8> {
        let all = state.disks().unwrap();
        serde_json::to_vec(&all).unwrap()
    }

    #[test]
    fn the_kept_list_is_the_list_after_each_change() {
        let state = State::new(Arc::new(MemStore::default()));
        let list = || {
            state
                .listed_disks(true, |_| true, |d| serde_json::to_vec(d).unwrap())
                .unwrap()
        };
        assert_eq!(&list()[..], b"[]");
        for name in ["b", "a", "c"] {
            state.put_disk(&disk(name, None)).unwrap();
            assert_eq!(list(), whole(&state));
        }
        // Changing, then removing, one entry renders that one again.
        state.put_disk(&disk("b", Some("vm-1"))).unwrap();
        assert_eq!(list(), whole(&state));
        assert!(list().windows(4).any(|w| w == b"vm-1"));
        state.remove_disk("a").unwrap();
        assert_eq!(list(), whole(&state));
        // A scoped list (no whole body kept) from the same entries.
        state.put_disk(&disk("d", None)).unwrap();
        let all_but_c = state
            .listed_disks(false, |d| d.name != "c", |d| serde_json::to_vec(d).unwrap())
            .unwrap();
        let want: Vec<DiskRec> = state
            .disks()
            .unwrap()
            .into_iter()
            .filter(|d| d.name != "c")
            .collect();
        assert_eq!(all_but_c, serde_json::to_vec(&want).unwrap());
        assert_eq!(
            list(),
            whole(&state),
            "a scoped list leaves the whole one as it was"
        );
        state.remove_disk("b").unwrap();
        state.remove_disk("c").unwrap();
        state.remove_disk("d").unwrap();
        assert_eq!(&list()[..], b"[]");
    }
}

//! What the Director's tasks do: the dynamic-disk jobs (in the RFC's order:
//! create_disk → attach_disk under the VM lock → set_disk_metadata if changed →
//! agent add_dynamic_disk; detach = agent remove → CPI detach) and the VM
//! operations, with cancel checkpoints between steps.

use std::sync::Arc;

use serde_json::{json, Value};

use super::lanes;
use super::locks::LockGuard;
use super::state::{DiskRec, InstanceRec, Job, SnapshotRec, TaskState};
use super::Inner;
use crate::cpi::ErrorType;

/// How a job ended badly.
pub(crate) enum JobError {
    Cancelled,
    Failed(String),
}

impl<E: std::fmt::Display> From<E> for JobError {
    fn from(e: E) -> Self {
        JobError::Failed(e.to_string())
    }
}

type JobResult<T> = Result<T, JobError>;

fn fail<T>(msg: impl Into<String>) -> JobResult<T> {
    Err(JobError::Failed(msg.into()))
}

/// Description and deployment of a job (for the task record).
pub(crate) fn describe(inner: &Inner, job: &Job) -> (String, Option<String>) {
    let inst_dep = |id: &str| {
        inner
            .state
            .instance(id)
            .ok()
            .flatten()
            .map(|i| i.deployment)
    };
    let disk_dep = |n: &str| inner.state.disk(n).ok().flatten().map(|d| d.deployment);
    match job {
        Job::Provide {
            instance_id,
            disk_name,
            ..
        } => (
            format!("provide dynamic disk '{disk_name}' to instance '{instance_id}'"),
            inst_dep(instance_id),
        ),
        Job::Create {
            deployment_name,
            disk_name,
            ..
        } => (
            format!("create dynamic disk '{disk_name}'"),
            Some(deployment_name.clone()),
        ),
        Job::Attach {
            disk_name,
            instance_id,
            ..
        } => (
            format!("attach dynamic disk '{disk_name}' to instance '{instance_id}'"),
            inst_dep(instance_id),
        ),
        Job::Detach { disk_name } => (
            format!("detach dynamic disk '{disk_name}'"),
            disk_dep(disk_name),
        ),
        Job::Delete { disk_name } => (
            format!("delete dynamic disk '{disk_name}'"),
            disk_dep(disk_name),
        ),
        Job::Resize {
            disk_name,
            disk_size,
        } => (
            format!("resize dynamic disk '{disk_name}' to {disk_size} MiB"),
            disk_dep(disk_name),
        ),
        Job::Snapshot { disk_name, .. } => (
            format!("snapshot dynamic disk '{disk_name}'"),
            disk_dep(disk_name),
        ),
        Job::DeleteSnapshot { snapshot_cid } => (
            format!("delete snapshot '{snapshot_cid}'"),
            inner
                .state
                .snapshot(snapshot_cid)
                .ok()
                .flatten()
                .map(|s| s.deployment),
        ),
        Job::Deploy { deployment } => ("create deployment".into(), Some(deployment.clone())),
        Job::RollingUpdate { deployment } => {
            ("recreate deployment".into(), Some(deployment.clone()))
        }
        Job::Recreate { instance_id } => (
            format!("recreate instance '{instance_id}'"),
            inst_dep(instance_id),
        ),
        Job::DeleteVm { instance_id } => (
            format!("delete vm of instance '{instance_id}'"),
            inst_dep(instance_id),
        ),
        Job::Stop { instance_id } => (
            format!("stop instance '{instance_id}'"),
            inst_dep(instance_id),
        ),
        Job::Start { instance_id } => (
            format!("start instance '{instance_id}'"),
            inst_dep(instance_id),
        ),
    }
}

/// The disk pool's dispatcher: starts queued disk tasks while fewer than
/// `dynamic_disks_workers` run.
pub(crate) async fn dispatch(inner: Arc<Inner>) {
    loop {
        let next = {
            let mut s = inner.sched();
            if s.running < s.workers {
                let id = s.queue.pop_front();
                if id.is_some() {
                    s.running += 1;
                }
                id
            } else {
                None
            }
        };
        match next {
            Some(id) => {
                let inner2 = inner.clone();
                let h = tokio::spawn(async move {
                    run_task(inner2.clone(), id).await;
                    inner2.sched().running -= 1;
                    inner2.wake.notify_one();
                });
                inner.track(h.abort_handle());
            }
            None => inner.wake.notified().await,
        }
    }
}

/// Run task `id` to its end and record how it ended.
pub(crate) async fn run_task(inner: Arc<Inner>, id: u64) {
    let started = inner.update_task(id, |t| {
        if t.state == TaskState::Cancelling {
            t.state = TaskState::Cancelled;
        } else if t.state == TaskState::Queued {
            t.state = TaskState::Processing;
            t.started_at = Some(0);
        }
    });
    let job = match started {
        Ok(t) if t.state == TaskState::Processing => t.job,
        Ok(_) => {
            inner.finished.notify_waiters();
            return;
        }
        Err(e) => {
            tracing::warn!(task = id, error = %e, "director fake: cannot start task");
            return;
        }
    };
    let now = inner.now_secs();
    let _ = inner.update_task(id, |t| t.started_at = Some(now));
    let r = if inner.config.virtual_lanes {
        let lj = lane_job(&inner, &job);
        let (r, charged, spans) = lanes::on_lane(exec(&inner, id, &job)).await;
        let ok = r.is_ok();
        let mut l = inner.lanes.lock().unwrap_or_else(|p| p.into_inner());
        if job.is_disk_job() {
            l.place_disk(id, lj, ok, charged);
        } else {
            l.place_operator(id, lj, ok, charged, &spans);
        }
        r
    } else {
        exec(&inner, id, &job).await
    };
    let res = inner.update_task(id, |t| match r {
        Ok((result, output)) => {
            t.state = TaskState::Done;
            t.result = Some(result);
            t.output = output;
        }
        Err(JobError::Cancelled) => {
            t.state = TaskState::Cancelled;
            t.result = Some(format!("Task {id} cancelled"));
        }
        Err(JobError::Failed(msg)) => {
            t.state = TaskState::Error;
            t.result = Some(msg);
        }
    });
    if let Err(e) = res {
        tracing::warn!(task = id, error = %e, "director fake: cannot record task end");
    }
    inner.finished.notify_waiters();
}

/// What the worker-pool model needs of a job before it runs: its kind, disk,
/// instance and the locks it holds for all of its run.
fn lane_job(inner: &Inner, job: &Job) -> lanes::LaneJob {
    let disk_instance = |n: &str| {
        inner
            .state
            .disk(n)
            .ok()
            .flatten()
            .and_then(|d| d.instance_id)
    };
    let (kind, disk, instance) = match job {
        Job::Provide {
            instance_id,
            disk_name,
            ..
        } => ("provide", Some(disk_name), Some(instance_id.clone())),
        Job::Attach {
            instance_id,
            disk_name,
            ..
        } => ("attach", Some(disk_name), Some(instance_id.clone())),
        Job::Create { disk_name, .. } => ("create", Some(disk_name), None),
        Job::Detach { disk_name } => ("detach", Some(disk_name), disk_instance(disk_name)),
        Job::Delete { disk_name } => ("delete", Some(disk_name), disk_instance(disk_name)),
        Job::Resize { disk_name, .. } => ("resize", Some(disk_name), None),
        Job::Snapshot { disk_name, .. } => ("snapshot", Some(disk_name), None),
        Job::DeleteSnapshot { .. } => ("delete_snapshot", None, None),
        Job::Deploy { .. } => ("deploy", None, None),
        Job::RollingUpdate { .. } => ("rolling_update", None, None),
        Job::Recreate { instance_id } => ("recreate", None, Some(instance_id.clone())),
        Job::DeleteVm { instance_id } => ("delete_vm", None, Some(instance_id.clone())),
        Job::Stop { instance_id } => ("stop", None, Some(instance_id.clone())),
        Job::Start { instance_id } => ("start", None, Some(instance_id.clone())),
    };
    let inst = instance
        .as_deref()
        .and_then(|i| inner.state.instance(i).ok().flatten());
    let mut resources = Vec::new();
    if job.is_disk_job() {
        if let Some(i) = &inst {
            if inner.config.disk_jobs_take_deployment_lock {
                resources.push(format!("deployment:{}", i.deployment));
            }
            if inner.config.disk_jobs_take_vm_lock {
                resources.push(format!("vm:{}", i.id));
            }
        }
    } else {
        // VM operations hold their deployment's lock for all of their run,
        // and a single VM's for a one-VM operation (a rolling update books
        // each VM as it recreates it).
        let dep = match job {
            Job::Deploy { deployment } | Job::RollingUpdate { deployment } => {
                Some(deployment.clone())
            }
            _ => inst.as_ref().map(|i| i.deployment.clone()),
        };
        resources.extend(dep.map(|d| format!("deployment:{d}")));
        if let Some(i) = &inst {
            resources.push(format!("vm:{}", i.id));
        }
    }
    lanes::LaneJob {
        kind,
        disk: disk.cloned(),
        instance: if matches!(kind, "provide" | "attach") {
            instance
        } else {
            None
        },
        resources,
    }
}

/// A cancel takes effect here.
fn checkpoint(inner: &Inner, id: u64) -> JobResult<()> {
    match inner.state.task(id)? {
        Some(t) if t.state == TaskState::Cancelling => Err(JobError::Cancelled),
        _ => Ok(()),
    }
}

async fn lock(inner: &Inner, task: u64, name: String) -> JobResult<LockGuard> {
    let mark = |on: bool| {
        let mut b = inner.blocked.lock().unwrap_or_else(|p| p.into_inner());
        if on {
            b.insert(task);
        } else {
            b.remove(&task);
        }
        drop(b);
        inner.progress.notify_waiters();
    };
    // Only a lock someone else holds makes the task wait.
    let contended = inner.locks.holder(&name).is_some_and(|t| t != task);
    if contended {
        mark(true);
    }
    let r = inner
        .locks
        .acquire(name, task, inner.config.lock_timeout, &inner.clock)
        .await
        .map_err(JobError::Failed);
    if contended {
        mark(false);
    }
    r
}

fn instance(inner: &Inner, id: &str) -> JobResult<InstanceRec> {
    match inner.state.instance(id)? {
        Some(i) => Ok(i),
        None => fail(format!("Instance '{id}' not found")),
    }
}

fn disk(inner: &Inner, name: &str) -> JobResult<DiskRec> {
    match inner.state.disk(name)? {
        Some(d) => Ok(d),
        None => fail(format!("Dynamic disk '{name}' not found")),
    }
}

/// The locks a disk job on `instance` takes after its disk lock.
async fn vm_locks(inner: &Inner, task: u64, inst: &InstanceRec) -> JobResult<Vec<LockGuard>> {
    let mut g = Vec::new();
    if inner.config.disk_jobs_take_deployment_lock {
        g.push(lock(inner, task, format!("lock:deployment:{}", inst.deployment)).await?);
    }
    if inner.config.disk_jobs_take_vm_lock {
        g.push(lock(inner, task, format!("lock:vm:{}", inst.id)).await?);
    }
    Ok(g)
}

fn pool_properties(inner: &Inner, pool: &str, az: Option<&str>) -> JobResult<Value> {
    let Some(p) = inner.config.disk_pools.iter().find(|p| p.name == pool) else {
        return fail(format!(
            "Disk pool '{pool}' is not defined in the cloud config"
        ));
    };
    let mut cp = match &p.cloud_properties {
        Value::Object(m) => m.clone(),
        _ => Default::default(),
    };
    if let Some(az) = az {
        cp.insert("availability_zone".into(), json!(az));
    }
    Ok(Value::Object(cp))
}

/// Run one job; Ok((result line, result output)).
async fn exec(inner: &Arc<Inner>, task: u64, job: &Job) -> JobResult<(String, Option<String>)> {
    match job {
        Job::Provide {
            instance_id,
            disk_name,
            disk_pool_name,
            disk_size,
            metadata,
        } => {
            let _d = lock(inner, task, format!("lock:disk:{disk_name}")).await?;
            let inst = instance(inner, instance_id)?;
            let _v = vm_locks(inner, task, &inst).await?;
            // Re-read: a VM operation may have run while we waited.
            let inst = instance(inner, instance_id)?;
            let Some(vm_cid) = inst.vm_cid.clone() else {
                return fail(format!("Instance '{instance_id}' has no VM"));
            };
            let d = match inner.state.disk(disk_name)? {
                Some(d) => d,
                None => {
                    checkpoint(inner, task)?;
                    let cp = pool_properties(inner, disk_pool_name, inst.az.as_deref())?;
                    let cid = inner.cpi.create_disk(*disk_size, cp, Some(&vm_cid)).await?;
                    let d = DiskRec {
                        name: disk_name.clone(),
                        cid,
                        deployment: inst.deployment.clone(),
                        az: inst.az.clone(),
                        size_mib: *disk_size,
                        pool: disk_pool_name.clone(),
                        cpi: inner.config.cpi_name.clone(),
                        metadata: Default::default(),
                        instance_id: None,
                        hint: None,
                    };
                    inner.state.put_disk(&d)?;
                    d
                }
            };
            let cid = attach(inner, task, d, &inst, &vm_cid, metadata.as_ref()).await?;
            Ok((
                format!("provided dynamic disk '{disk_name}'"),
                Some(json!({ "disk_cid": cid }).to_string()),
            ))
        }
        Job::Create {
            deployment_name,
            az,
            disk_name,
            disk_pool_name,
            disk_size,
            metadata,
        } => {
            let _d = lock(inner, task, format!("lock:disk:{disk_name}")).await?;
            if !inner.state.deployments()?.contains(deployment_name) {
                return fail(format!("Deployment '{deployment_name}' doesn't exist"));
            }
            if let Some(d) = inner.state.disk(disk_name)? {
                // Same request again (a retry): the same disk.
                if d.deployment == *deployment_name
                    && d.size_mib == *disk_size
                    && d.pool == *disk_pool_name
                    && d.az == *az
                {
                    return Ok((
                        format!("created dynamic disk '{disk_name}'"),
                        Some(json!({ "disk_cid": d.cid }).to_string()),
                    ));
                }
                return fail(format!(
                    "Dynamic disk '{disk_name}' already exists in deployment '{}' with different properties",
                    d.deployment
                ));
            }
            checkpoint(inner, task)?;
            let cp = pool_properties(inner, disk_pool_name, az.as_deref())?;
            let cid = inner.cpi.create_disk(*disk_size, cp, None).await?;
            let mut d = DiskRec {
                name: disk_name.clone(),
                cid: cid.clone(),
                deployment: deployment_name.clone(),
                az: az.clone(),
                size_mib: *disk_size,
                pool: disk_pool_name.clone(),
                cpi: inner.config.cpi_name.clone(),
                metadata: Default::default(),
                instance_id: None,
                hint: None,
            };
            inner.state.put_disk(&d)?;
            if let Some(m) = metadata.as_ref().filter(|m| !m.is_empty()) {
                checkpoint(inner, task)?;
                inner
                    .cpi
                    .set_disk_metadata(&cid, Value::Object(m.clone()))
                    .await?;
                d.metadata = m.clone();
                inner.state.put_disk(&d)?;
            }
            Ok((
                format!("created dynamic disk '{disk_name}'"),
                Some(json!({ "disk_cid": cid }).to_string()),
            ))
        }
        Job::Attach {
            disk_name,
            instance_id,
            metadata,
        } => {
            let _d = lock(inner, task, format!("lock:disk:{disk_name}")).await?;
            disk(inner, disk_name)?;
            let inst = instance(inner, instance_id)?;
            let _v = vm_locks(inner, task, &inst).await?;
            let inst = instance(inner, instance_id)?;
            let d = disk(inner, disk_name)?;
            let Some(vm_cid) = inst.vm_cid.clone() else {
                return fail(format!("Instance '{instance_id}' has no VM"));
            };
            attach(inner, task, d, &inst, &vm_cid, metadata.as_ref()).await?;
            Ok((format!("attached dynamic disk '{disk_name}'"), None))
        }
        Job::Detach { disk_name } => {
            let _d = lock(inner, task, format!("lock:disk:{disk_name}")).await?;
            let d = disk(inner, disk_name)?;
            let Some(inst_id) = d.instance_id.clone() else {
                return Ok((format!("dynamic disk '{disk_name}' is not attached"), None));
            };
            let inst = instance(inner, &inst_id)?;
            let _v = vm_locks(inner, task, &inst).await?;
            let d = disk(inner, disk_name)?;
            detach(inner, task, d, true).await?;
            Ok((format!("detached dynamic disk '{disk_name}'"), None))
        }
        Job::Resize {
            disk_name,
            disk_size,
        } => {
            let _d = lock(inner, task, format!("lock:disk:{disk_name}")).await?;
            let mut d = disk(inner, disk_name)?;
            if let Some(i) = &d.instance_id {
                // IaaS resize needs the disk detached (the CPI refuses otherwise);
                // the Director does not detach behind its consumer's back.
                return fail(format!(
                    "Dynamic disk '{disk_name}' is attached to instance '{i}'; detach it before resizing"
                ));
            }
            if *disk_size == d.size_mib {
                return Ok((
                    format!("dynamic disk '{disk_name}' is already {disk_size} MiB"),
                    None,
                ));
            }
            checkpoint(inner, task)?;
            inner.cpi.resize_disk(&d.cid, *disk_size).await?;
            d.size_mib = *disk_size;
            inner.state.put_disk(&d)?;
            Ok((
                format!("resized dynamic disk '{disk_name}' to {disk_size} MiB"),
                None,
            ))
        }
        Job::Snapshot {
            disk_name,
            metadata,
        } => {
            let _d = lock(inner, task, format!("lock:disk:{disk_name}")).await?;
            let d = disk(inner, disk_name)?;
            checkpoint(inner, task)?;
            let meta = metadata.clone().unwrap_or_default();
            let cid = inner
                .cpi
                .snapshot_disk(&d.cid, Value::Object(meta.clone()))
                .await?;
            inner.state.put_snapshot(&SnapshotRec {
                snapshot_cid: cid.clone(),
                disk_name: d.name.clone(),
                disk_cid: d.cid.clone(),
                deployment: d.deployment.clone(),
                size_mib: d.size_mib,
                created_at: inner.now_secs(),
                metadata: meta,
            })?;
            Ok((
                format!("snapshot of dynamic disk '{disk_name}' taken"),
                Some(json!({ "snapshot_cid": cid }).to_string()),
            ))
        }
        Job::DeleteSnapshot { snapshot_cid } => {
            let _d = lock(inner, task, format!("lock:snapshot:{snapshot_cid}")).await?;
            if inner.state.snapshot(snapshot_cid)?.is_none() {
                return Ok((format!("snapshot '{snapshot_cid}' does not exist"), None));
            }
            inner.cpi.delete_snapshot(snapshot_cid).await?;
            inner.state.remove_snapshot(snapshot_cid)?;
            Ok((format!("deleted snapshot '{snapshot_cid}'"), None))
        }
        Job::Delete { disk_name } => {
            let _d = lock(inner, task, format!("lock:disk:{disk_name}")).await?;
            let Some(d) = inner.state.disk(disk_name)? else {
                return Ok((format!("dynamic disk '{disk_name}' does not exist"), None));
            };
            let _v = match d.instance_id.as_deref() {
                Some(i) => match inner.state.instance(i)? {
                    Some(inst) => vm_locks(inner, task, &inst).await?,
                    None => vec![],
                },
                None => vec![],
            };
            let d = disk(inner, disk_name)?;
            let d = detach(inner, task, d, true).await?;
            checkpoint(inner, task)?;
            match inner.cpi.delete_disk(&d.cid).await {
                Ok(()) => {}
                Err(e) if e.is(ErrorType::DiskNotFound) => {}
                Err(e) => return fail(e.to_string()),
            }
            inner.state.remove_disk(disk_name)?;
            Ok((format!("deleted dynamic disk '{disk_name}'"), None))
        }
        Job::Deploy { deployment } => {
            let _l = lock(inner, task, format!("lock:deployment:{deployment}")).await?;
            for inst in deployment_instances(inner, deployment)? {
                if inst.vm_cid.is_none() {
                    checkpoint(inner, task)?;
                    let _v = lock(inner, task, format!("lock:vm:{}", inst.id)).await?;
                    create_vm(inner, &inst.id).await?;
                }
            }
            Ok((format!("/deployments/{deployment}"), None))
        }
        Job::RollingUpdate { deployment } => {
            let _l = lock(inner, task, format!("lock:deployment:{deployment}")).await?;
            for inst in deployment_instances(inner, deployment)? {
                checkpoint(inner, task)?;
                let _v = lock(inner, task, format!("lock:vm:{}", inst.id)).await?;
                let from = lanes::charged();
                recreate(inner, task, &inst.id).await?;
                lanes::span(format!("vm:{}", inst.id), from);
            }
            Ok((format!("/deployments/{deployment}"), None))
        }
        Job::Recreate { instance_id }
        | Job::DeleteVm { instance_id }
        | Job::Start { instance_id }
        | Job::Stop { instance_id } => {
            let inst = instance(inner, instance_id)?;
            let _l = lock(inner, task, format!("lock:deployment:{}", inst.deployment)).await?;
            let _v = lock(inner, task, format!("lock:vm:{instance_id}")).await?;
            match job {
                Job::Recreate { .. } => recreate(inner, task, instance_id).await?,
                Job::DeleteVm { .. } => delete_vm(inner, task, instance_id, "detached").await?,
                Job::Start { .. } => {
                    let inst = instance(inner, instance_id)?;
                    if inst.vm_cid.is_none() {
                        create_vm(inner, instance_id).await?;
                    } else {
                        set_state(inner, instance_id, "started")?;
                    }
                }
                _ => set_state(inner, instance_id, "stopped")?,
            }
            Ok((format!("/deployments/{}", inst.deployment), None))
        }
    }
}

fn set_state(inner: &Inner, instance_id: &str, s: &str) -> JobResult<()> {
    let mut i = instance(inner, instance_id)?;
    i.state = s.into();
    inner.state.put_instance(&i)?;
    Ok(())
}

fn deployment_instances(inner: &Inner, deployment: &str) -> JobResult<Vec<InstanceRec>> {
    if !inner.state.deployments()?.iter().any(|d| d == deployment) {
        return fail(format!("Deployment '{deployment}' doesn't exist"));
    }
    Ok(inner
        .state
        .instances()?
        .into_iter()
        .filter(|i| i.deployment == deployment)
        .collect())
}

/// Attach `d` to `inst` (VM lock held): CPI attach unless the Director already
/// recorded this attachment, metadata if changed, then tell the agent.
async fn attach(
    inner: &Inner,
    task: u64,
    mut d: DiskRec,
    inst: &InstanceRec,
    vm_cid: &str,
    metadata: Option<&serde_json::Map<String, Value>>,
) -> JobResult<String> {
    if d.deployment != inst.deployment {
        return fail(format!(
            "Dynamic disk '{}' belongs to deployment '{}', instance '{}' to deployment '{}'",
            d.name, d.deployment, inst.id, inst.deployment
        ));
    }
    if let (Some(daz), Some(iaz)) = (&d.az, &inst.az) {
        if daz != iaz {
            return fail(format!(
                "Dynamic disk '{}' is in availability zone '{daz}', instance '{}' in '{iaz}'",
                d.name, inst.id
            ));
        }
    }
    if d.cpi != inner.config.cpi_name {
        return fail(format!(
            "Dynamic disk '{}' is managed by CPI '{}'",
            d.name, d.cpi
        ));
    }
    match d.instance_id.as_deref() {
        Some(other) if other != inst.id => {
            return fail(format!(
                "Dynamic disk '{}' is already attached to instance '{other}'",
                d.name
            ))
        }
        Some(_) => {}
        None => {
            checkpoint(inner, task)?;
            let hint = inner.cpi.attach_disk(vm_cid, &d.cid).await?;
            d.instance_id = Some(inst.id.clone());
            d.hint = Some(hint);
            inner.state.put_disk(&d)?;
        }
    }
    if let Some(m) = metadata {
        if *m != d.metadata {
            checkpoint(inner, task)?;
            inner
                .cpi
                .set_disk_metadata(&d.cid, Value::Object(m.clone()))
                .await?;
            d.metadata = m.clone();
            inner.state.put_disk(&d)?;
        }
    }
    checkpoint(inner, task)?;
    inner
        .agent_call(super::ADD_DYNAMIC_DISK, vm_cid, &d.cid, d.hint.as_ref())
        .await
        .map_err(JobError::Failed)?;
    Ok(d.cid)
}

/// Detach `d` from the instance the Director has it on (VM lock held): agent
/// remove, then CPI detach (DiskNotAttached counts as done). `strict_agent`:
/// an agent failure fails the job (a VM operation tolerates it: the VM goes).
async fn detach(
    inner: &Inner,
    task: u64,
    mut d: DiskRec,
    strict_agent: bool,
) -> JobResult<DiskRec> {
    let Some(inst_id) = d.instance_id.clone() else {
        return Ok(d);
    };
    let vm_cid = inner.state.instance(&inst_id)?.and_then(|i| i.vm_cid);
    if let Some(vm) = vm_cid {
        checkpoint(inner, task)?;
        if let Err(e) = inner
            .agent_call(super::REMOVE_DYNAMIC_DISK, &vm, &d.cid, None)
            .await
        {
            if strict_agent {
                return fail(e);
            }
            tracing::info!(disk = %d.cid, error = %e, "director fake: agent did not confirm removal");
        }
        checkpoint(inner, task)?;
        match inner.cpi.detach_disk(&vm, &d.cid).await {
            Ok(()) => {}
            Err(e) if e.is(ErrorType::DiskNotAttached) => {}
            Err(e) if e.is(ErrorType::VmNotFound) => {}
            Err(e) => return fail(e.to_string()),
        }
    }
    d.instance_id = None;
    d.hint = None;
    inner.state.put_disk(&d)?;
    Ok(d)
}

/// Detach every dynamic disk of the instance (they are not reattached), delete its VM.
async fn delete_vm(inner: &Inner, task: u64, instance_id: &str, new_state: &str) -> JobResult<()> {
    for d in inner.state.disks()? {
        if d.instance_id.as_deref() == Some(instance_id) {
            detach(inner, task, d, false).await?;
        }
    }
    let mut inst = instance(inner, instance_id)?;
    if let Some(vm) = inst.vm_cid.clone() {
        checkpoint(inner, task)?;
        match inner.cpi.delete_vm(&vm).await {
            Ok(()) => {}
            Err(e) if e.is(ErrorType::VmNotFound) => {}
            Err(e) => return fail(e.to_string()),
        }
        inner.state.remove_agent(&vm)?;
        inst.vm_cid = None;
        inst.agent_id = None;
    }
    inst.state = new_state.into();
    inner.state.put_instance(&inst)?;
    Ok(())
}

async fn recreate(inner: &Inner, task: u64, instance_id: &str) -> JobResult<()> {
    delete_vm(inner, task, instance_id, "detached").await?;
    checkpoint(inner, task)?;
    create_vm(inner, instance_id).await
}

async fn create_vm(inner: &Inner, instance_id: &str) -> JobResult<()> {
    let mut inst = instance(inner, instance_id)?;
    let Some(stemcell) = inner.stemcell() else {
        return fail("No stemcell uploaded");
    };
    inst.vm_generation += 1;
    let agent_id = format!(
        "agent-{}-{}",
        &inst.id[..8.min(inst.id.len())],
        inst.vm_generation
    );
    let cp = match &inst.az {
        Some(az) => json!({ "availability_zone": az }),
        None => json!({}),
    };
    let env = json!({"bosh": {"group": format!("{}-{}", inst.deployment, inst.group)}});
    let (vm_cid, _nets) = inner
        .cpi
        .create_vm(
            &agent_id,
            &stemcell,
            cp,
            json!({"default": {"type": "dynamic"}}),
            vec![],
            env,
        )
        .await?;
    inner.state.put_agent_disks(&vm_cid, &[])?;
    inst.vm_cid = Some(vm_cid.clone());
    inst.agent_id = Some(agent_id);
    inst.state = "started".into();
    inner.state.put_instance(&inst)?;
    let meta = json!({
        "director": inner.config.name,
        "deployment": inst.deployment,
        "instance_group": inst.group,
        "index": inst.index.to_string(),
        "id": inst.id,
    });
    inner.cpi.set_vm_metadata(&vm_cid, meta).await?;
    Ok(())
}

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::{Notify, Semaphore};

use super::*;
use crate::cpi::CpiConfig;
use crate::gate::{Delivery, GateHook, Verdict};
use crate::history::{calls, CallId, History};
use crate::store::MemStore;

/// Holds the Director inside `delete_vm` of one VM until released.
struct PauseDeleteVm {
    vm: std::sync::Mutex<String>,
    reached: Notify,
    is_reached: AtomicBool,
    release: Semaphore,
}

impl GateHook for PauseDeleteVm {
    fn before<'a>(&'a self, _id: CallId, call: &'a CallSpec) -> BoxFuture<'a, Verdict> {
        Box::pin(async move {
            let target = self.vm.lock().unwrap().clone();
            if call.op == "delete_vm" && call.subject == target {
                self.is_reached.store(true, Ordering::SeqCst);
                self.reached.notify_waiters();
                let _ = self.release.acquire().await;
            }
            Verdict::Proceed
        })
    }
    fn after<'a>(
        &'a self,
        _id: CallId,
        _call: &'a CallSpec,
        _o: &'a Outcome,
    ) -> BoxFuture<'a, Delivery> {
        Box::pin(async { Delivery::Deliver })
    }
}

impl PauseDeleteVm {
    async fn wait_reached(&self) {
        for _ in 0..5000 {
            if self.is_reached.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("delete_vm was never called");
    }
}

fn config(disk_lock_deployment: bool) -> DirectorConfig {
    DirectorConfig {
        deployments: vec![DeploymentConfig {
            name: "a".into(),
            instance_groups: vec![InstanceGroupConfig {
                name: "w".into(),
                instances: 2,
                azs: vec![],
            }],
        }],
        dynamic_disks_workers: 2,
        disk_jobs_take_deployment_lock: disk_lock_deployment,
        ..DirectorConfig::default()
    }
}

async fn director(cfg: DirectorConfig) -> (Director, Arc<PauseDeleteVm>, History) {
    let history = History::new(SimClock::new());
    let gate = Gate::new(history.clone());
    let cpi = Cpi::new(
        Arc::new(MemStore::default()),
        gate.clone(),
        CpiConfig::default(),
    );
    let d = Director::new(Arc::new(MemStore::default()), gate.clone(), cpi, cfg)
        .await
        .unwrap();
    let hook = Arc::new(PauseDeleteVm {
        vm: Default::default(),
        reached: Notify::new(),
        is_reached: AtomicBool::new(false),
        release: Semaphore::new(0),
    });
    gate.set_hook(hook.clone());
    (d, hook, history)
}

fn provide(instance: &str, name: &str) -> Job {
    Job::Provide {
        instance_id: instance.into(),
        disk_name: name.into(),
        disk_pool_name: "default".into(),
        disk_size: 10,
        metadata: None,
    }
}

async fn settle() {
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn a_disk_job_waits_for_the_vm_lock_of_a_recreate() {
    let (d, hook, history) = director(config(false)).await;
    let inst = d.instances()[0].clone();
    *hook.vm.lock().unwrap() = inst.vm_cid.clone().unwrap();
    let recreate = d
        .start_job(Job::Recreate {
            instance_id: inst.id.clone(),
        })
        .unwrap();
    hook.wait_reached().await;
    let held: Vec<String> = d.locks().into_iter().map(|l| l.name).collect();
    assert!(held.contains(&"lock:deployment:a".to_string()), "{held:?}");
    assert!(held.contains(&format!("lock:vm:{}", inst.id)), "{held:?}");
    let p = d.start_job(provide(&inst.id, "x")).unwrap();
    settle().await;
    assert_eq!(d.task(p).unwrap().state, TaskState::Processing);
    assert!(
        d.cpi().disks().is_empty(),
        "the attach must wait for the recreate"
    );
    hook.release.add_permits(1);
    assert_eq!(d.wait_task(recreate).await.unwrap().state, TaskState::Done);
    assert_eq!(d.wait_task(p).await.unwrap().state, TaskState::Done);
    let new_vm = d.instances()[0].vm_cid.clone().unwrap();
    assert_ne!(Some(new_vm.clone()), inst.vm_cid);
    assert_eq!(d.cpi().attachments()[0].vm_cid, new_vm);
    let ops: Vec<String> = calls(&history.events())
        .into_iter()
        .filter(|c| c.op == "create_vm" || c.op == "create_disk")
        .map(|c| c.op)
        .collect();
    assert_eq!(ops.last().map(String::as_str), Some("create_disk"));
    assert!(d.locks().is_empty());
}

#[tokio::test]
async fn rolling_update_does_not_block_attaches_to_other_vms() {
    let (d, hook, _) = director(config(false)).await;
    let insts = d.instances();
    *hook.vm.lock().unwrap() = insts[0].vm_cid.clone().unwrap();
    let update = d
        .start_job(Job::RollingUpdate {
            deployment: "a".into(),
        })
        .unwrap();
    hook.wait_reached().await;
    // the second instance is not being updated yet: its attach goes through
    let p = d.start_job(provide(&insts[1].id, "y")).unwrap();
    assert_eq!(d.wait_task(p).await.unwrap().state, TaskState::Done);
    hook.release.add_permits(1);
    assert_eq!(d.wait_task(update).await.unwrap().state, TaskState::Done);
    // ... and the update then recreated that VM, detaching the disk
    assert!(d.cpi().attachments().is_empty());
}

#[tokio::test]
async fn with_the_deployment_lock_disk_jobs_wait_for_the_update_and_time_out() {
    let (d, hook, history) = director(config(true)).await;
    let insts = d.instances();
    *hook.vm.lock().unwrap() = insts[0].vm_cid.clone().unwrap();
    let update = d
        .start_job(Job::RollingUpdate {
            deployment: "a".into(),
        })
        .unwrap();
    hook.wait_reached().await;
    let p = d.start_job(provide(&insts[1].id, "y")).unwrap();
    settle().await;
    assert_eq!(d.task(p).unwrap().state, TaskState::Processing);
    // 10 virtual seconds later the attach gives up on the lock
    let clock = history.clock().clone();
    clock.advance_to(clock.now().after(Duration::from_secs(11)));
    let t = d.wait_task(p).await.unwrap();
    assert_eq!(t.state, TaskState::Error);
    assert!(t.result.unwrap().contains("lock:deployment:a"));
    hook.release.add_permits(1);
    assert_eq!(d.wait_task(update).await.unwrap().state, TaskState::Done);
}

#[tokio::test]
async fn worker_pool_resizes_at_runtime() {
    let mut cfg = config(false);
    cfg.dynamic_disks_workers = 0;
    let (d, _, _) = director(cfg).await;
    let inst = d.instances()[0].id.clone();
    let p = d.start_job(provide(&inst, "z")).unwrap();
    settle().await;
    assert_eq!(d.task(p).unwrap().state, TaskState::Queued);
    d.set_dynamic_disks_workers(3);
    assert_eq!(d.dynamic_disks_workers(), 3);
    assert_eq!(d.wait_task(p).await.unwrap().state, TaskState::Done);
    assert!(d.tasks().iter().any(|t| t.id == p && t.disk_job));
}

#[tokio::test]
async fn without_the_vm_lock_an_attach_interleaves_with_a_recreate() {
    // The "lock not taken for disk jobs" bug the lab must be able to catch.
    let mut cfg = config(false);
    cfg.disk_jobs_take_vm_lock = false;
    let (d, hook, _) = director(cfg).await;
    let inst = d.instances()[0].clone();
    *hook.vm.lock().unwrap() = inst.vm_cid.clone().unwrap();
    let recreate = d
        .start_job(Job::Recreate {
            instance_id: inst.id.clone(),
        })
        .unwrap();
    hook.wait_reached().await;
    let p = d.start_job(provide(&inst.id, "x")).unwrap();
    // finishes inside the recreate, on the VM about to be deleted
    assert_eq!(d.wait_task(p).await.unwrap().state, TaskState::Done);
    assert_eq!(
        d.cpi().attachments()[0].vm_cid,
        inst.vm_cid.clone().unwrap()
    );
    hook.release.add_permits(1);
    assert_eq!(d.wait_task(recreate).await.unwrap().state, TaskState::Done);
}

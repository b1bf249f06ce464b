//! The Director's named locks (`lock:deployment:<name>`, `lock:vm:<instance>`,
//! `lock:disk:<name>`): held by a task, waited for up to a timeout measured on
//! the virtual clock, released when the guard drops.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::{SimClock, VTime};

/// Who holds a lock.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LockView {
    /// The lock's name, e.g. `lock:deployment:cf`.
    pub name: String,
    /// The task holding it.
    pub task_id: u64,
    /// Virtual time it was taken.
    pub since: VTime,
}

#[derive(Default)]
pub(crate) struct LockTable {
    held: Mutex<BTreeMap<String, (u64, VTime)>>,
    released: Notify,
}

/// Releases its lock when dropped.
pub(crate) struct LockGuard {
    table: Arc<LockTable>,
    name: String,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.table
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.name);
        self.table.released.notify_waiters();
    }
}

impl LockTable {
    /// Take `name` for `task`, waiting until `timeout` of virtual time has passed.
    pub async fn acquire(
        self: &Arc<Self>,
        name: String,
        task: u64,
        timeout: Duration,
        clock: &SimClock,
    ) -> Result<LockGuard, String> {
        let deadline = clock.now().after(timeout);
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
                match held.get(&name) {
                    None => {
                        held.insert(name.clone(), (task, clock.now()));
                        return Ok(LockGuard {
                            table: self.clone(),
                            name,
                        });
                    }
                    // Waiting on itself would never end: a job bug, say so.
                    Some((t, _)) if *t == task => {
                        return Err(format!("task {task} already holds {name}"));
                    }
                    Some(_) => {}
                }
            }
            if clock.now() >= deadline {
                let holder = self.holder(&name).unwrap_or(0);
                return Err(format!(
                    "Failed to acquire lock for {name} uid: task-{task}. Locking task id is {holder}"
                ));
            }
            // The virtual clock moves without notifying us: look again soon.
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep(Duration::from_millis(2)) => {}
            }
        }
    }

    pub fn holder(&self, name: &str) -> Option<u64> {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .map(|(t, _)| *t)
    }

    pub fn views(&self) -> Vec<LockView> {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(name, (task_id, since))| LockView {
                name: name.clone(),
                task_id: *task_id,
                since: *since,
            })
            .collect()
    }
}

//! What one in-process reader read from the Kubernetes fake, and whether it
//! wrote: a resync can then pass over a target whose last pass only read
//! objects that are all still the same. Tracked per task (a tokio
//! task-local), so the API's own handlers and other tasks are never counted.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;

use serde_json::Value;

use super::Kind;

tokio::task_local! {
    static TRACKED: RefCell<Reads>;
}

/// The reads and writes of one tracked future.
#[derive(Default)]
pub struct Reads {
    /// Each object read by key, with the stored version it saw (the fake
    /// hands out one shared tree per stored version; holding it keeps the
    /// address from being reused, so the same address is the same version).
    gets: Vec<Get>,
    /// It read something whose sameness is not checked by key: a list, an
    /// index, a namespace (virtual ones are made afresh on every read).
    opaque: bool,
    /// How many writes it committed.
    writes: u64,
}

struct Get {
    /// Where the fake keeps it.
    key: String,
    seen: Option<Arc<Value>>,
}

impl Reads {
    /// Run `f`, tracking what it (this task) reads and writes from the fake.
    pub async fn track<F: Future>(f: F) -> (F::Output, Reads) {
        TRACKED
            .scope(RefCell::new(Reads::default()), async move {
                let out = f.await;
                (out, TRACKED.with(|r| r.take()))
            })
            .await
    }

    /// Whether every read can be checked again by key.
    pub fn is_checkable(&self) -> bool {
        !self.opaque
    }

    /// Whether it committed a write.
    pub fn wrote(&self) -> bool {
        self.writes > 0
    }

    /// How many writes it committed (each moves the resourceVersion by one).
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// How many objects it read by key.
    pub fn len(&self) -> usize {
        self.gets.len()
    }

    /// Whether it read no object by key.
    pub fn is_empty(&self) -> bool {
        self.gets.is_empty()
    }

    /// Each object read: where the fake keeps it, and the version seen.
    pub(crate) fn gets(&self) -> impl Iterator<Item = (&str, Option<&Arc<Value>>)> {
        self.gets.iter().map(|g| (g.key.as_str(), g.seen.as_ref()))
    }
}

/// A tracked task read the object of `kind` the fake keeps at `key()` and
/// saw `seen`.
pub(crate) fn note_get(kind: Kind, key: impl FnOnce() -> String, seen: Option<&Arc<Value>>) {
    let _ = TRACKED.try_with(|r| {
        let mut r = r.borrow_mut();
        if kind == Kind::Namespace {
            r.opaque = true;
            return;
        }
        r.gets.push(Get {
            key: key(),
            seen: seen.cloned(),
        });
    });
}

/// A tracked task read something not checkable by key.
pub(crate) fn note_opaque() {
    let _ = TRACKED.try_with(|r| r.borrow_mut().opaque = true);
}

/// A tracked task committed a write.
pub(crate) fn note_write() {
    let _ = TRACKED.try_with(|r| r.borrow_mut().writes += 1);
}

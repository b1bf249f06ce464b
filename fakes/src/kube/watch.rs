//! Watches, as the real API server serves them to informers, reflectors and
//! `kubectl get -w`: every committed change becomes an ADDED, MODIFIED or
//! DELETED event. A bounded window of recent changes (etcd's history, short of
//! compaction) lets a watch resume from a recent resourceVersion; an older one
//! gets `410 Gone` as an ERROR event, and the client lists again.
//!
//! Followed: k8s.io/apiserver's watch handler and the cacher — `resourceVersion`
//! unset or "0" starts with a synthetic ADDED per existing object, a selector
//! turns a change that leaves (enters) the selection into DELETED (ADDED),
//! `timeoutSeconds` ends the stream, `allowWatchBookmarks` adds BOOKMARK
//! events, and `sendInitialEvents=true` ends the initial events with a bookmark
//! annotated `k8s.io/initial-events-end`. Deviations: bookmarks are sent every
//! [`BOOKMARK_EVERY`] of wall time (the real cacher: about a minute); the
//! window holds [`WINDOW`] changes, not a time span.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::selector::{FieldSelector, LabelSelector};
use super::Kind;

/// Changes kept for watches that resume from a resourceVersion.
pub const WINDOW: usize = 4096;
/// How often a watch that allows bookmarks gets one.
pub const BOOKMARK_EVERY: Duration = Duration::from_secs(5);
/// A watch's longest life when the client gives no `timeoutSeconds` (the
/// real server picks 30–60 minutes at random; we take the low end).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// One committed change.
#[derive(Clone, Debug)]
pub(crate) struct Change {
    /// The resourceVersion it was committed at.
    pub rv: u64,
    pub kind: Kind,
    /// The object before (None: created), shared with the fake's copy.
    pub old: Option<Arc<Value>>,
    /// The object after (None: deleted; `last` then holds its final state).
    pub new: Option<Arc<Value>>,
    /// A deleted object's final state, at the deletion's resourceVersion.
    pub last: Option<Arc<Value>>,
}

/// Every change, to every watcher; and the recent ones, for resuming. Idle
/// until the HTTP API is served or the first watch starts (whichever is
/// first), so in-process runs nobody watches pay nothing for it.
pub(crate) struct WatchHub {
    window: Mutex<Window>,
    tx: broadcast::Sender<Arc<Change>>,
}

#[derive(Default)]
struct Window {
    /// None until the first watch: no change is kept before.
    complete_after: Option<u64>,
    changes: VecDeque<Arc<Change>>,
}

impl Default for WatchHub {
    fn default() -> Self {
        Self {
            window: Mutex::new(Window::default()),
            // A watcher further behind than this is told 410 and re-lists.
            tx: broadcast::channel(WINDOW).0,
        }
    }
}

impl WatchHub {
    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any watch ever started (else changes need not be built).
    pub(crate) fn active(&self) -> bool {
        self.lock().complete_after.is_some()
    }

    /// Publish a change (called with the state's write lock held, so
    /// changes arrive in resourceVersion order).
    pub(crate) fn publish(&self, change: Change) {
        let change = Arc::new(change);
        let mut w = self.lock();
        if w.complete_after.is_none() {
            return;
        }
        if w.changes.len() == WINDOW {
            if let Some(gone) = w.changes.pop_front() {
                w.complete_after = Some(gone.rv);
            }
        }
        w.changes.push_back(change.clone());
        drop(w);
        let _ = self.tx.send(change);
    }

    /// Keep changes from `current` (the state's resourceVersion) on, if not
    /// already. Call with the state's write lock held.
    pub(crate) fn keep_from(&self, current: u64) {
        self.lock().complete_after.get_or_insert(current);
    }

    /// Subscribe from now; `current` is the state's resourceVersion. Call
    /// with the state's write lock held.
    pub(crate) fn subscribe(&self, current: u64) -> broadcast::Receiver<Arc<Change>> {
        self.keep_from(current);
        self.tx.subscribe()
    }

    /// Subscribe, with the changes after `rv` (`current` is the state's
    /// resourceVersion); Err when some of them are no longer kept (the
    /// client must list again). Call with the state's write lock held.
    pub(crate) fn resume(
        &self,
        rv: u64,
        current: u64,
    ) -> Result<(Vec<Arc<Change>>, broadcast::Receiver<Arc<Change>>), Gone> {
        let rx = self.subscribe(current);
        let w = self.lock();
        let kept_from = w.complete_after.unwrap_or(current);
        if rv < kept_from {
            return Err(Gone {
                rv,
                oldest: kept_from + 1,
            });
        }
        let missed = w.changes.iter().filter(|c| c.rv > rv).cloned().collect();
        Ok((missed, rx))
    }
}

/// A resourceVersion older than the window.
#[derive(Debug)]
pub(crate) struct Gone {
    pub rv: u64,
    pub oldest: u64,
}

impl Gone {
    /// The Status the real server sends in its ERROR event.
    pub(crate) fn status(&self) -> Value {
        expired(format!(
            "too old resource version: {} ({})",
            self.rv,
            self.oldest.saturating_sub(1)
        ))
    }
}

/// A 410 Expired Status.
pub(crate) fn expired(message: String) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Expired",
        "code": 410,
    })
}

/// What one watch request selects.
pub(crate) struct Filter {
    pub kind: Kind,
    pub ns: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    fn selects(&self, o: &Value) -> bool {
        let ns_ok = match &self.ns {
            Some(ns) if self.kind.namespaced() => {
                o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns.as_str())
            }
            _ => true,
        };
        ns_ok && self.labels.matches_object(o) && self.fields.matches_object(o)
    }

    /// The event this watch sees for a change, if any: a change that moves
    /// an object into (out of) the selection is an ADDED (DELETED).
    pub(crate) fn event(&self, c: &Change) -> Option<Value> {
        if c.kind != self.kind {
            return None;
        }
        let was = c.old.as_ref().is_some_and(|o| self.selects(o));
        match (&c.new, &c.last) {
            (Some(new), _) => match (was, self.selects(new)) {
                (false, true) => Some(event("ADDED", new)),
                (true, true) => Some(event("MODIFIED", new)),
                (true, false) => Some(event("DELETED", new)),
                (false, false) => None,
            },
            (None, Some(last)) if was || self.selects(last) => Some(event("DELETED", last)),
            _ => None,
        }
    }
}

/// A watch event line's value.
pub(crate) fn event(kind: &str, object: &Value) -> Value {
    json!({"type": kind, "object": object})
}

/// A BOOKMARK at `rv` (`initial_end`: the end of `sendInitialEvents`).
pub(crate) fn bookmark(kind: Kind, rv: u64, initial_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event(
        "BOOKMARK",
        &json!({"kind": kind.kind_name(), "apiVersion": kind.api_version(), "metadata": metadata}),
    )
}

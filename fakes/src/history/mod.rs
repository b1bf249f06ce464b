//! The append-only record of a run: every call between components, its reply,
//! every step and note, stamped with virtual time. Checks, snapshots and
//! reports read it; nothing re-runs to explain itself.

use std::borrow::Borrow;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::clock::{SimClock, VTime};

mod log;
pub use log::{EventLog, Iter};

/// Events to read in order: a slice or vector of them, or an [`EventLog`]
/// (decoded as read). `Copy`, so a reader may pass over them twice.
pub trait Events: IntoIterator<Item = Self::Each> + Copy {
    /// One event, borrowed from a slice or decoded from a log.
    type Each: Borrow<Event>;
}

impl<'a> Events for &'a [Event] {
    type Each = &'a Event;
}

impl<'a> Events for &'a Vec<Event> {
    type Each = &'a Event;
}

impl<'a> Events for &'a EventLog {
    type Each = Event;
}

/// A participant in the lab, as named in histories, faults and partitions.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    /// The lab itself (scenario steps, probes the checks make).
    Lab,
    /// The fake COSI provisioner sidecar.
    Sidecar,
    /// The driver under test.
    Driver,
    /// The fake S3 data plane.
    S3,
    /// The fake S3 admin API (MinIO/RustFS style).
    S3Admin,
    /// The fake Kubernetes API.
    Kube,
    /// A workload using credentials handed out by a driver.
    Workload,
    /// The fake BOSH Director (dynamic-disks API, tasks, locks).
    Director,
    /// The fake IaaS CPI (BOSH CPI API v2).
    Cpi,
    /// The fake BOSH agent on a VM (add/remove dynamic disk).
    Agent,
    /// The fake CSI external-provisioner sidecar.
    CsiProvisioner,
    /// The fake CSI external-attacher sidecar.
    CsiAttacher,
    /// The fake kubelet-like node agent (NodeStage/NodePublish).
    Kubelet,
    /// The fake node mount table the CSI node plugin mounts into.
    Mounts,
    /// The fake CSI external-snapshotter sidecar.
    CsiSnapshotter,
    /// The fake CSI external-snapshot-metadata sidecar.
    CsiSnapshotMetadata,
    /// A backup application reading changed blocks.
    BackupClient,
}

impl Component {
    /// Every component, each at its own discriminant (how an event log holds one).
    pub const ALL: [Component; 17] = [
        Component::Lab,
        Component::Sidecar,
        Component::Driver,
        Component::S3,
        Component::S3Admin,
        Component::Kube,
        Component::Workload,
        Component::Director,
        Component::Cpi,
        Component::Agent,
        Component::CsiProvisioner,
        Component::CsiAttacher,
        Component::Kubelet,
        Component::Mounts,
        Component::CsiSnapshotter,
        Component::CsiSnapshotMetadata,
        Component::BackupClient,
    ];

    /// The name used in scenario files and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Component::Lab => "lab",
            Component::Sidecar => "sidecar",
            Component::Driver => "driver",
            Component::S3 => "s3",
            Component::S3Admin => "s3admin",
            Component::Kube => "kube",
            Component::Workload => "workload",
            Component::Director => "director",
            Component::Cpi => "cpi",
            Component::Agent => "agent",
            Component::CsiProvisioner => "csi-provisioner",
            Component::CsiAttacher => "csi-attacher",
            Component::Kubelet => "kubelet",
            Component::Mounts => "mounts",
            Component::CsiSnapshotter => "csi-snapshotter",
            Component::CsiSnapshotMetadata => "csi-snapshot-metadata",
            Component::BackupClient => "backup-client",
        }
    }
}

impl std::fmt::Display for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identifies one call so its reply can be paired with it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CallId(pub u64);

/// How a call ended, in the terms of its protocol.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "protocol", rename_all = "snake_case")]
pub enum Outcome {
    /// An HTTP reply; `code` is the S3/admin error code when there is one.
    Http { status: u16, code: Option<String> },
    /// A gRPC reply; `code` is the status code name (`OK`, `ALREADY_EXISTS`, ...).
    Grpc { code: String, message: String },
    /// The caller never got a reply (connection failed or was cut).
    NoReply { reason: String },
}

impl Outcome {
    /// True for HTTP 2xx/3xx and gRPC OK.
    pub fn is_success(&self) -> bool {
        match self {
            Outcome::Http { status, .. } => *status < 400,
            Outcome::Grpc { code, .. } => code == "OK",
            Outcome::NoReply { .. } => false,
        }
    }

    /// A short label for reports: `200`, `404 NoSuchBucket`, `ALREADY_EXISTS`.
    pub fn label(&self) -> String {
        match self {
            Outcome::Http {
                status,
                code: Some(c),
            } => format!("{status} {c}"),
            Outcome::Http { status, code: None } => status.to_string(),
            Outcome::Grpc { code, .. } => code.clone(),
            Outcome::NoReply { reason } => format!("no reply ({reason})"),
        }
    }
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// A scenario step began.
    Step { index: usize, name: String },
    /// A request left `from` for `to`. `subject` names the resource it is about
    /// (bucket, access key, object name); never a secret.
    Call {
        id: CallId,
        from: Component,
        to: Component,
        op: String,
        subject: String,
    },
    /// The reply to call `id`.
    Reply { id: CallId, outcome: Outcome },
    /// Free-form observation by a component (never carries secrets).
    Note { component: Component, text: String },
    /// The lab injected a fault (`call` is the call it hit, if any).
    Fault {
        call: Option<CallId>,
        fault: String,
        detail: String,
    },
}

/// One entry in the history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the history, from 0.
    pub seq: u64,
    /// Virtual time it was recorded at.
    pub at: VTime,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

#[derive(Default, Debug)]
struct Inner {
    events: EventLog,
    /// Events moved out by [`History::take_events`]: `events[0]` is event `taken`.
    taken: usize,
    next_call: u64,
    /// Calls without a reply yet, and whom each went to.
    open: std::collections::BTreeMap<CallId, Component>,
}

/// Shared, append-only history of one run.
#[derive(Clone, Debug)]
pub struct History {
    inner: Arc<Mutex<Inner>>,
    clock: SimClock,
}

impl History {
    /// An empty history stamped by `clock`.
    pub fn new(clock: SimClock) -> Self {
        Self {
            inner: Arc::default(),
            clock,
        }
    }

    /// The clock this history stamps events with.
    pub fn clock(&self) -> &SimClock {
        &self.clock
    }

    /// Append an event; returns its sequence number.
    pub fn record(&self, kind: EventKind) -> u64 {
        self.push(&mut self.lock(), kind)
    }

    fn push(&self, inner: &mut Inner, kind: EventKind) -> u64 {
        let seq = (inner.taken + inner.events.len()) as u64;
        inner.events.push(&Event {
            seq,
            at: self.clock.now(),
            kind,
        });
        seq
    }

    /// Record the start of a call and return its id.
    pub fn call(&self, from: Component, to: Component, op: &str, subject: &str) -> CallId {
        let id = {
            let mut inner = self.lock();
            inner.next_call += 1;
            let id = CallId(inner.next_call);
            inner.open.insert(id, to);
            id
        };
        self.record(EventKind::Call {
            id,
            from,
            to,
            op: op.to_string(),
            subject: subject.to_string(),
        });
        id
    }

    /// Record the reply to a call.
    pub fn reply(&self, id: CallId, outcome: Outcome) {
        // One lock: a call is never seen closed before its reply is in the log.
        let mut inner = self.lock();
        inner.open.remove(&id);
        self.push(&mut inner, EventKind::Reply { id, outcome });
    }

    /// The calls to `to` without a reply yet (a crash waits for the driver's
    /// callers to see their calls fail before it brings the driver back).
    pub fn open_calls_to(&self, to: Component) -> Vec<CallId> {
        let inner = self.lock();
        inner
            .open
            .iter()
            .filter(|(_, c)| **c == to)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether a reply to `id` was recorded: a call this history numbered
    /// that is no longer open (only [`History::reply`] records a reply, and
    /// it closes the call). A lookup, not a scan: a cut on a fault path asked
    /// it of the whole history.
    pub fn has_reply(&self, id: CallId) -> bool {
        let inner = self.lock();
        (1..=inner.next_call).contains(&id.0) && !inner.open.contains_key(&id)
    }

    /// A copy of every event so far, in order (after [`History::take_events`]:
    /// those recorded since).
    pub fn events(&self) -> Vec<Event> {
        self.lock().events.to_vec()
    }

    /// Every event so far, moved out rather than copied: a run's end hands its
    /// history to the outcome, and the largest runs held it twice. Later events
    /// keep their sequence numbers; `len` and `events_from` still count from
    /// the first event ever recorded; `events` and `events_from` see only the
    /// events recorded after this (`has_reply` still knows every call).
    pub fn take_events(&self) -> EventLog {
        let mut g = self.lock();
        let events = std::mem::take(&mut g.events);
        g.taken += events.len();
        events
    }

    /// A copy of the events from index `from` on (a probe reads its own calls
    /// without copying the whole history each time); taken events are not
    /// returned.
    pub fn events_from(&self, from: usize) -> Vec<Event> {
        let g = self.lock();
        g.events.iter_from(from.saturating_sub(g.taken)).collect()
    }

    /// Number of events so far.
    pub fn len(&self) -> usize {
        let g = self.lock();
        g.taken + g.events.len()
    }

    /// True before anything was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere must not cost us the record of what led to it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A call paired with its reply, as read back from a history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    /// The call's id.
    pub id: CallId,
    /// Sequence number of the call event.
    pub seq: u64,
    /// When it was made.
    pub at: VTime,
    /// Caller.
    pub from: Component,
    /// Callee.
    pub to: Component,
    /// Operation name (`add_user`, `DriverGrantBucketAccess`, `put_object`, ...).
    pub op: String,
    /// The resource it concerns.
    pub subject: String,
    /// The reply, if one was recorded.
    pub outcome: Option<Outcome>,
}

/// Pair every call in `events` (a slice of events or an [`EventLog`]) with its reply.
pub fn calls(events: impl Events) -> Vec<CallRecord> {
    calls_where(events, |_| true)
}

/// [`calls`], of only the calls `keep` accepts by id: a question about a few
/// calls (the faulted ones) at the end of a run copies those, not all of a
/// history's millions.
pub fn calls_where(events: impl Events, keep: impl Fn(CallId) -> bool) -> Vec<CallRecord> {
    let mut out: Vec<CallRecord> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for e in events {
        let e = e.borrow();
        match &e.kind {
            EventKind::Call {
                id,
                from,
                to,
                op,
                subject,
            } if keep(*id) => {
                index.insert(*id, out.len());
                out.push(CallRecord {
                    id: *id,
                    seq: e.seq,
                    at: e.at,
                    from: *from,
                    to: *to,
                    op: op.clone(),
                    subject: subject.clone(),
                    outcome: None,
                });
            }
            EventKind::Reply { id, outcome } => {
                if let Some(&i) = index.get(id) {
                    out[i].outcome = Some(outcome.clone());
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(h: &History, text: &str) -> u64 {
        h.record(EventKind::Note {
            component: Component::Lab,
            text: text.into(),
        })
    }

    #[test]
    fn taken_events_keep_their_place() {
        let h = History::new(SimClock::new());
        note(&h, "a");
        note(&h, "b");
        let taken = h.take_events();
        assert_eq!(taken.iter().map(|e| e.seq).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(h.len(), 2);
        assert!(h.events().is_empty());
        // What comes after is numbered on, and found by the index it has.
        assert_eq!(note(&h, "c"), 2);
        assert_eq!(h.len(), 3);
        let after = h.events_from(2);
        assert_eq!(after.len(), 1);
        assert_eq!(after[0].seq, 2);
        assert_eq!(h.events_from(0).len(), 1, "taken events are not returned");
        assert!(h.events_from(3).is_empty());
    }

    #[test]
    fn a_reply_is_known_once_recorded_and_only_for_calls_made() {
        let h = History::new(SimClock::new());
        let a = h.call(Component::Driver, Component::S3, "create_bucket", "b1");
        let b = h.call(Component::Driver, Component::S3, "create_bucket", "b2");
        h.reply(
            a,
            Outcome::NoReply {
                reason: "cut".into(),
            },
        );
        assert!(h.has_reply(a));
        assert!(!h.has_reply(b), "still open");
        assert!(!h.has_reply(CallId(b.0 + 1)), "never made");
        assert!(!h.has_reply(CallId(0)), "never made");
        h.take_events();
        assert!(h.has_reply(a), "known after the events were taken");
    }

    #[test]
    fn calls_where_pairs_only_the_kept_calls_with_their_replies() {
        let h = History::new(SimClock::new());
        let a = h.call(Component::Driver, Component::S3, "create_bucket", "b1");
        let b = h.call(Component::Driver, Component::S3Admin, "add_user", "u1");
        h.reply(
            b,
            Outcome::Http {
                status: 200,
                code: None,
            },
        );
        h.reply(
            a,
            Outcome::Http {
                status: 409,
                code: Some("BucketAlreadyOwnedByYou".into()),
            },
        );
        let events = h.events();
        let kept = calls_where(&events, |id| id == a);
        assert_eq!(kept.len(), 1);
        assert_eq!((kept[0].id, kept[0].op.as_str()), (a, "create_bucket"));
        assert_eq!(
            kept[0].outcome,
            Some(Outcome::Http {
                status: 409,
                code: Some("BucketAlreadyOwnedByYou".into())
            })
        );
        assert_eq!(calls(&events).len(), 2);
    }
}

//! The fake's object store and write rules: one lock serialises every
//! read-modify-write, so compare-and-swap on resourceVersion, uid assignment and
//! the global resourceVersion counter behave like etcd behind the API server.
//! Both the HTTP handlers and the in-process API go through here.

mod namespace;
mod objects;

use std::sync::{Arc, Mutex, MutexGuard};

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};

use super::patch::{json_patch, merge_patch, PatchError};
use super::selector::{FieldSelector, LabelSelector};
use super::validate::{self, Violation};
use super::{Kind, KubeError, Result};
use crate::gate::Gate;
use crate::store::{Store, StoreExt};
pub use objects::Stored;
use objects::{Form, Held};

const RV_KEY: &str = "kube/meta/rv";
const OBJ_PREFIX: &str = "kube/o/";
/// How many generateName suffixes are tried before giving up, as the real
/// server retries on collision.
const GENERATE_NAME_ATTEMPTS: u64 = 8;

/// How a watch starts: its first events, the resourceVersion they are
/// consistent at, and every change after.
pub(crate) struct WatchStart {
    pub events: Vec<Value>,
    pub rv: u64,
    pub rx: tokio::sync::broadcast::Receiver<std::sync::Arc<super::watch::Change>>,
}

/// The fake Kubernetes API: state, counters and the HTTP front end. Cheap to clone.
#[derive(Clone)]
pub struct KubeFake {
    pub(crate) inner: Arc<Inner>,
    /// This handle's in-process writes are held as text (see [`KubeFake::holding_text`]).
    holds_text: bool,
}

pub(crate) struct Inner {
    store: Arc<dyn Store>,
    pub(crate) gate: Gate,
    seed: u64,
    /// The last resourceVersion handed out. Holding this lock is what makes a
    /// read-check-write atomic.
    rv: Mutex<u64>,
    /// The decoded copy reads use (taken only while `rv` is held).
    objects: Mutex<objects::Objects>,
    /// Every committed change, to watches.
    watch: super::watch::WatchHub,
    /// The tokens HTTP callers authenticate with (shared across restarts).
    access: super::auth::Access,
}

/// How a write reaches the state (which rules apply).
#[derive(Clone, Debug, Default)]
pub(crate) struct WriteOpts {
    /// Came over HTTP to the main resource: the status subresource rule applies
    /// (status changes are dropped for kinds that have one).
    pub http: bool,
    /// A write to the `/status` subresource: only `status` changes.
    pub status_only: bool,
    /// `dryRun=All`: validate and answer, commit nothing.
    pub dry_run: bool,
    /// Over HTTP: how fields the kind does not declare are treated in the
    /// patched object (`fieldValidation`); `None` in process (nothing pruned).
    pub field_validation: Option<super::schema::FieldValidation>,
    /// Over HTTP: the field manager the write is recorded for in
    /// managedFields (`fieldManager`, or the user agent's product); `None`
    /// in process (nothing recorded).
    pub manager: Option<Arc<str>>,
    /// Server-side apply with `force=true`: take over conflicting fields.
    pub force: bool,
    /// Written in process through a handle that holds what it writes as
    /// text (see [`KubeFake::holding_text`]).
    pub text: bool,
}

impl WriteOpts {
    /// How the object a write commits is held: as text when written over
    /// HTTP or through a handle that asks for it.
    fn form(&self) -> Form {
        match self.http || self.text {
            true => Form::Text,
            false => Form::Tree,
        }
    }

    const IN_PROCESS: WriteOpts = WriteOpts {
        http: false,
        status_only: false,
        dry_run: false,
        field_validation: None,
        manager: None,
        force: false,
        text: false,
    };
}

/// The patch formats the state understands.
#[derive(Debug, Clone)]
pub(crate) enum PatchBody {
    /// RFC 7386.
    Merge(Value),
    /// Strategic merge (built-in kinds only).
    Strategic(Value),
    /// RFC 6902.
    Json(Value),
    /// Server-side apply (`managed`): merge-or-create with field ownership.
    Apply(Value),
}

/// `DeleteOptions.preconditions`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    /// `DeleteOptions.gracePeriodSeconds` (pods only; `None` = the pod's own).
    pub grace_period_seconds: Option<i64>,
}

/// What a delete did.
#[derive(Debug, Clone)]
pub(crate) struct Deleted {
    /// The object as deleted, or as marked for deletion.
    pub object: Value,
    /// False when finalizers keep the object (deletionTimestamp was set).
    pub gone: bool,
}

fn obj_key(kind: Kind, ns: &str, name: &str) -> String {
    format!("{OBJ_PREFIX}{}/{ns}/{name}", kind.plural())
}

/// An object's place in a list: (namespace, name), as the real server lists them.
fn list_order(obj: &Value) -> (&str, &str) {
    (meta_str(obj, "namespace"), meta_str(obj, "name"))
}

/// Objects in list order. Each key is read once: comparing objects looked
/// both names up in two maps per comparison (a CSI resync lists every claim
/// and pod each round).
fn sorted<V: std::borrow::Borrow<Value>>(items: Vec<V>) -> Vec<V> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    {
        let keys: Vec<(&str, &str)> = items.iter().map(|o| list_order(o.borrow())).collect();
        order.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
    }
    let mut slots: Vec<Option<V>> = items.into_iter().map(Some).collect();
    (order.into_iter())
        .filter_map(|i| slots[i].take())
        .collect()
}

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    meta(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// `v` as a JSON object, replacing a non-object with `{}`.
fn ensure_object(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    match v {
        Value::Object(m) => m,
        _ => unreachable!("replaced by an object just above"),
    }
}

/// `obj.metadata`, created if absent; callers have normalised `obj` already.
fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    ensure_object(
        ensure_object(obj)
            .entry("metadata")
            .or_insert_with(|| json!({})),
    )
}

fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn invalid(kind: Kind, name: &str, (field, message): Violation) -> KubeError {
    KubeError::Invalid {
        kind,
        name: name.to_string(),
        field,
        message,
    }
}

fn bad(message: impl Into<String>) -> KubeError {
    KubeError::BadRequest {
        message: message.into(),
    }
}

fn conflict_modified(kind: Kind, name: &str) -> KubeError {
    KubeError::Conflict {
        kind,
        name: name.to_string(),
        message: "the object has been modified; please apply your changes to the latest version and try again".into(),
    }
}

/// `DeleteOptions.preconditions` against the stored object (409 on a mismatch).
fn check_preconditions(kind: Kind, name: &str, old: &Value, pre: &Preconditions) -> Result<()> {
    let uid = meta_str(old, "uid");
    if let Some(want) = pre.uid.as_deref().filter(|u| *u != uid) {
        return Err(KubeError::Conflict {
            kind,
            name: name.to_string(),
            message: format!(
                "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
            ),
        });
    }
    let rv = meta_str(old, "resourceVersion");
    if let Some(want) = pre.resource_version.as_deref().filter(|r| *r != rv) {
        return Err(KubeError::Conflict {
            kind,
            name: name.to_string(),
            message: format!("Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rv}"),
        });
    }
    Ok(())
}

/// The part of an object whose change bumps `metadata.generation`.
fn generation_scope(kind: Kind, obj: &Value) -> Value {
    match kind {
        Kind::Lease => obj.get("spec").cloned().unwrap_or(Value::Null),
        _ => {
            let mut v = obj.clone();
            if let Some(m) = v.as_object_mut() {
                m.remove("metadata");
                if kind.has_status_subresource() {
                    m.remove("status");
                }
            }
            v
        }
    }
}

fn tracks_generation(kind: Kind) -> bool {
    kind == Kind::Lease || kind.is_custom()
}

/// A v4-shaped UUID drawn from the seeded stream at position `n` (the
/// resourceVersion the object was created at), so uids are unique, stable
/// across restarts and reproducible from the seed.
pub(crate) fn uid_for(seed: u64, n: u64) -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(1);
    rng.set_word_pos(u128::from(n) * 4);
    let mut b = [0u8; 16];
    rng.fill_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The 5-character suffix the real server appends for `generateName`, from the
/// same alphabet (no vowels, no look-alikes).
fn name_suffix(seed: u64, n: u64, attempt: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(2);
    rng.set_word_pos(
        (u128::from(n) * u128::from(GENERATE_NAME_ATTEMPTS) + u128::from(attempt)) * 2,
    );
    let mut b = [0u8; 5];
    rng.fill_bytes(&mut b);
    b.iter()
        .map(|x| ALPHABET[usize::from(*x) % ALPHABET.len()] as char)
        .collect()
}

impl KubeFake {
    /// A fake over `store` (state survives a restart over the same sled tree),
    /// recording HTTP calls through `gate`; `seed` drives uids and generated names.
    /// HTTP callers need a token from [`KubeFake::access`].
    pub fn new(store: Arc<dyn Store>, gate: Gate, seed: u64) -> Result<Self> {
        Self::with_access(store, gate, seed, Default::default())
    }

    /// As [`KubeFake::new`], authenticating HTTP callers against `access` (a lab
    /// keeps one across restarts of the fake, as a cluster keeps its signing key).
    pub fn with_access(
        store: Arc<dyn Store>,
        gate: Gate,
        seed: u64,
        access: super::auth::Access,
    ) -> Result<Self> {
        let rv: u64 = store.get_json(RV_KEY)?.unwrap_or(0);
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                gate,
                seed,
                rv: Mutex::new(rv),
                objects: Default::default(),
                watch: Default::default(),
                access,
            }),
            holds_text: false,
        })
    }

    /// This fake, through a handle whose in-process writes are held as their
    /// JSON text, as an HTTP write is. For a writer that reads each object
    /// back a few times and then leaves it: the COSI sidecar's accesses and
    /// credentials Secrets, one each per grant, were held as trees several
    /// times their text for the rest of the run.
    pub fn holding_text(&self) -> KubeFake {
        KubeFake {
            inner: self.inner.clone(),
            holds_text: true,
        }
    }

    /// How this handle's in-process writes reach the state.
    fn in_process(&self) -> WriteOpts {
        WriteOpts {
            text: self.holds_text,
            ..WriteOpts::IN_PROCESS
        }
    }

    /// The tokens HTTP callers authenticate with.
    pub fn access(&self) -> &super::auth::Access {
        &self.inner.access
    }

    /// Issue a `cluster-admin` token (tests and tools driving the fake directly).
    pub fn admin_token(&self) -> String {
        self.access()
            .issue(super::auth::Grant::cluster_admin("kubernetes-admin"))
    }

    /// The gate HTTP requests pass through.
    pub fn gate(&self) -> &Gate {
        &self.inner.gate
    }

    /// The last resourceVersion handed out (the one a list would report).
    pub fn resource_version(&self) -> u64 {
        *self.lock()
    }

    /// Make every write so far durable.
    pub fn flush(&self) -> Result<()> {
        Ok(self.inner.store.sync()?)
    }

    fn lock(&self) -> MutexGuard<'_, u64> {
        // A panicking writer never leaves a half-written object (the store write
        // is last), so the state behind a poisoned lock is still consistent.
        let mut guard = self.inner.rv.lock().unwrap_or_else(|p| p.into_inner());
        // Another handle over the same store (a restarted fake's old one, still
        // held by a task) may have written: its counter is then in the store.
        let stored = self.inner.store.get_json::<u64>(RV_KEY).ok().flatten();
        if let Some(stored) = stored.filter(|s| *s != *guard) {
            self.objects().invalidate();
            *guard = stored.max(*guard);
        }
        guard
    }

    /// The decoded copy; call with the `rv` lock held.
    fn objects(&self) -> MutexGuard<'_, objects::Objects> {
        self.inner.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> String {
        self.now_plus(0)
    }

    /// The virtual time `offset` seconds from now, as an RFC 3339 timestamp
    /// (on the clock's epoch: fixed in a run, the wall clock in serve).
    fn now_plus(&self, offset: i64) -> String {
        self.inner.gate.history().clock().rfc3339(offset)
    }

    /// Virtual time 0 as an RFC 3339 timestamp (when the lab's cluster began).
    fn epoch(&self) -> String {
        let clock = self.inner.gate.history().clock();
        clock.rfc3339_at(crate::clock::VTime(0), 0)
    }

    /// The stored object, or for a namespace its virtual stand-in.
    fn load(&self, kind: Kind, ns: &str, name: &str) -> Result<Option<Value>> {
        Ok(self.load_shared(kind, ns, name)?.map(Arc::unwrap_or_clone))
    }

    /// [`Self::load`] without copying a stored object out of the decoded copy.
    fn load_shared(&self, kind: Kind, ns: &str, name: &str) -> Result<Option<Arc<Value>>> {
        match self.stored_shared(kind, ns, name)? {
            None if kind == Kind::Namespace => Ok(self.virtual_namespace(name)?.map(Arc::new)),
            stored => Ok(stored),
        }
    }

    /// Whether [`Self::load`] finds the object.
    fn exists(&self, kind: Kind, ns: &str, name: &str) -> Result<bool> {
        Ok(self.load_shared(kind, ns, name)?.is_some())
    }

    /// The stored object only (no virtual namespace).
    fn stored(&self, kind: Kind, ns: &str, name: &str) -> Result<Option<Value>> {
        Ok(self
            .stored_shared(kind, ns, name)?
            .map(Arc::unwrap_or_clone))
    }

    /// The stored object, shared with the decoded copy.
    fn stored_shared(&self, kind: Kind, ns: &str, name: &str) -> Result<Option<Arc<Value>>> {
        Ok(self
            .objects()
            .get(&*self.inner.store, &obj_key(kind, ns, name))?)
    }

    /// Persist `obj` at `rv` (counter first, so a crash in between never
    /// reuses a version), held in its form, and tell every watch. A deletion
    /// (`obj` None) is watched with the object's final state at `rv`.
    fn commit(
        &self,
        guard: &mut MutexGuard<'_, u64>,
        rv: u64,
        kind: Kind,
        obj: Option<(Arc<Value>, Form)>,
        ns: &str,
        name: &str,
    ) -> Result<()> {
        super::reads::note_write();
        let key = obj_key(kind, ns, name);
        let watched = self.inner.watch.active();
        if watched {
            // The replaced object comes from the copy: load it before the write.
            self.objects().load_all(&*self.inner.store)?;
        }
        self.inner.store.put_json(RV_KEY, &rv)?;
        **guard = rv;
        let held = (obj.as_ref()).map(|(o, form)| (o, self.objects().hold(kind, o, *form)));
        match &held {
            Some((_, h)) => h.put(&*self.inner.store, &key)?,
            None => {
                self.inner.store.remove(&key)?;
            }
        }
        // One copy, shared by the fake's reads, the watch window and the
        // writer's answer.
        let old = self.objects().commit(&key, held);
        let obj = obj.map(|(o, _)| o);
        let gone = obj.is_none();
        if !watched {
            return self.after_commit(guard, kind, gone, ns);
        }
        let old = old.map(|mut h| h.tree(&key)).transpose()?;
        let last = match (&obj, &old) {
            (None, Some(o)) => {
                let mut o = Value::clone(o);
                meta_mut(&mut o).insert("resourceVersion".into(), json!(rv.to_string()));
                Some(Arc::new(o))
            }
            _ => None,
        };
        self.inner.watch.publish(super::watch::Change {
            rv,
            kind,
            old,
            new: obj,
            last,
        });
        self.after_commit(guard, kind, gone, ns)
    }

    /// A removal may have emptied a terminating namespace, which then goes too.
    fn after_commit(
        &self,
        guard: &mut MutexGuard<'_, u64>,
        kind: Kind,
        gone: bool,
        ns: &str,
    ) -> Result<()> {
        if gone && kind.namespaced() {
            self.finish_namespace(guard, ns)
        } else {
            Ok(())
        }
    }

    /// Keep changes for watches from now on. Called when the HTTP API is
    /// served: a client can then list, write and watch from the list's
    /// resourceVersion, which a real server (etcd's history) serves, not 410s.
    pub(crate) fn keep_watch_history(&self) {
        let guard = self.lock();
        self.inner.watch.keep_from(*guard);
    }

    /// Start a watch: the events it begins with and the receiver of every
    /// later change, taken under the write lock so nothing falls between.
    /// `after` None starts with an ADDED event per selected object.
    pub(crate) fn watch_start(
        &self,
        filter: &super::watch::Filter,
        after: Option<u64>,
    ) -> std::result::Result<WatchStart, super::watch::Gone> {
        let guard = self.lock();
        let rv = *guard;
        match after {
            Some(from) => {
                let (missed, rx) = self.inner.watch.resume(from, rv)?;
                let events = missed.iter().filter_map(|c| filter.event(c)).collect();
                Ok(WatchStart { events, rv, rx })
            }
            None => {
                let rx = self.inner.watch.subscribe(rv);
                let ns = filter.ns.as_deref();
                let events = self
                    .scan(filter.kind, ns)
                    .unwrap_or_default()
                    .iter()
                    .filter(|o| filter.labels.matches_object(o) && filter.fields.matches_object(o))
                    .map(|o| super::watch::event("ADDED", o))
                    .collect();
                drop(guard);
                Ok(WatchStart { events, rv, rx })
            }
        }
    }

    /// Namespace of a request: required for namespaced kinds, ignored otherwise.
    fn scope(kind: Kind, ns: Option<&str>) -> Result<&str> {
        if kind.namespaced() {
            match ns {
                Some(n) if !n.is_empty() => Ok(n),
                _ => Err(bad(format!(
                    "a namespace is required for {}",
                    kind.plural()
                ))),
            }
        } else {
            Ok("")
        }
    }

    /// Type/shape checks every incoming object gets, and reconciling its
    /// namespace and name with the request's (400 on a mismatch, as the server).
    fn normalize(
        &self,
        kind: Kind,
        path_ns: Option<&str>,
        path_name: Option<&str>,
        mut obj: Value,
    ) -> Result<Value> {
        let Some(m) = obj.as_object_mut() else {
            return Err(bad(format!(
                "the body of the request must be a {} object",
                kind.kind_name()
            )));
        };
        match m.get("apiVersion") {
            None | Some(Value::Null) => {}
            Some(Value::String(v)) if v.is_empty() || v == kind.api_version() => {}
            Some(v) => {
                return Err(bad(format!(
                    "the API version in the data ({}) does not match the expected API version ({})",
                    v.as_str().unwrap_or("?"),
                    kind.api_version()
                )))
            }
        }
        match m.get("kind") {
            None | Some(Value::Null) => {}
            Some(Value::String(v)) if v.is_empty() || v == kind.kind_name() => {}
            Some(v) => {
                return Err(bad(format!(
                    "the kind in the data ({}) does not match the expected kind ({})",
                    v.as_str().unwrap_or("?"),
                    kind.kind_name()
                )))
            }
        }
        m.insert("apiVersion".into(), json!(kind.api_version()));
        m.insert("kind".into(), json!(kind.kind_name()));
        match m.get("metadata") {
            None | Some(Value::Null) => {
                m.insert("metadata".into(), json!({}));
            }
            Some(Value::Object(_)) => {}
            Some(_) => return Err(bad("metadata must be an object")),
        }
        let md = meta_mut(&mut obj);
        for f in [
            "name",
            "generateName",
            "namespace",
            "resourceVersion",
            "uid",
        ] {
            match md.get(f) {
                None | Some(Value::String(_)) => {}
                Some(Value::Null) => {
                    md.remove(f);
                }
                Some(_) => return Err(bad(format!("metadata.{f} must be a string"))),
            }
        }
        let body_ns = md
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if kind.namespaced() {
            let ns = match path_ns {
                Some(p) => {
                    if !body_ns.is_empty() && body_ns != p {
                        return Err(bad("the namespace of the provided object does not match the namespace sent on the request"));
                    }
                    p.to_string()
                }
                None => body_ns,
            };
            if ns.is_empty() {
                let name = md
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                return Err(invalid(
                    kind,
                    &name,
                    ("metadata.namespace".into(), "Required value".into()),
                ));
            }
            if let Err(msg) = validate::dns1123_label(&ns) {
                return Err(invalid(kind, "", ("metadata.namespace".into(), msg)));
            }
            md.insert("namespace".into(), json!(ns));
        } else {
            md.remove("namespace");
        }
        if let Some(p) = path_name {
            let body_name = md.get("name").and_then(Value::as_str).unwrap_or("");
            if body_name.is_empty() {
                md.insert("name".into(), json!(p));
            } else if body_name != p {
                return Err(bad(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({p})"
                )));
            }
        }
        Ok(obj)
    }

    /// Field validation plus the server's own rewrites (Secret `stringData`).
    fn validate_and_default(&self, kind: Kind, obj: &mut Value) -> Result<()> {
        let name = meta_str(obj, "name").to_string();
        if let Err(msg) = validate::dns1123_subdomain(&name) {
            return Err(invalid(kind, &name, ("metadata.name".into(), msg)));
        }
        let md = meta_mut(obj);
        if let Some(l) = md.get("labels").filter(|v| !v.is_null()) {
            validate::labels(l).map_err(|v| invalid(kind, &name, v))?;
        }
        if let Some(a) = md.get("annotations").filter(|v| !v.is_null()) {
            validate::annotations(a).map_err(|v| invalid(kind, &name, v))?;
        }
        if let Some(f) = md.get("finalizers").filter(|v| !v.is_null()) {
            let ok = f
                .as_array()
                .is_some_and(|a| a.iter().all(|x| x.as_str().is_some_and(|s| !s.is_empty())));
            if !ok {
                return Err(invalid(
                    kind,
                    &name,
                    (
                        "metadata.finalizers".into(),
                        "must be a list of non-empty strings".into(),
                    ),
                ));
            }
        }
        if md
            .get("ownerReferences")
            .is_some_and(|v| !v.is_null() && !v.is_array())
        {
            return Err(bad("metadata.ownerReferences must be a list"));
        }
        match kind {
            Kind::Secret => self.secret_rules(obj, &name),
            Kind::ConfigMap => Self::configmap_rules(obj, &name),
            Kind::Lease => Self::lease_rules(obj, &name),
            Kind::VolumeSnapshotClass
            | Kind::VolumeSnapshot
            | Kind::VolumeSnapshotContent
            | Kind::SnapshotMetadataService => {
                super::snapshot::rules(kind, obj).map_err(|v| invalid(kind, &name, v))
            }
            Kind::Namespace => namespace::rules(obj).map_err(|v| invalid(kind, &name, v)),
            _ => super::storage::rules(kind, obj).map_err(|v| invalid(kind, &name, v)),
        }
    }

    fn secret_rules(&self, obj: &mut Value, name: &str) -> Result<()> {
        let kind = Kind::Secret;
        let Some(m) = obj.as_object_mut() else {
            return Ok(());
        };
        let mut data = match m.remove("data") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(d)) => d,
            Some(_) => return Err(bad("Secret.data must be a map of base64 strings")),
        };
        let mut total = 0usize;
        for (k, v) in &data {
            validate::config_key(k, &format!("data[{k}]")).map_err(|v| invalid(kind, name, v))?;
            let bytes = v
                .as_str()
                .and_then(validate::base64_value)
                .ok_or_else(|| bad(format!("Secret.data[{k}]: illegal base64 data")))?;
            total += bytes.len();
        }
        match m.remove("stringData") {
            None | Some(Value::Null) => {}
            Some(Value::Object(sd)) => {
                for (k, v) in sd {
                    validate::config_key(&k, &format!("stringData[{k}]"))
                        .map_err(|v| invalid(kind, name, v))?;
                    let s = v
                        .as_str()
                        .ok_or_else(|| bad(format!("Secret.stringData[{k}] must be a string")))?;
                    // stringData wins over data, as documented for the real server.
                    if let Some(old) = data
                        .get(&k)
                        .and_then(Value::as_str)
                        .and_then(validate::base64_value)
                    {
                        total -= old.len().min(total);
                    }
                    total += s.len();
                    data.insert(k, json!(validate::base64_encode(s.as_bytes())));
                }
            }
            Some(_) => return Err(bad("Secret.stringData must be a map of strings")),
        }
        if total > validate::MAX_DATA_BYTES {
            return Err(invalid(
                kind,
                name,
                (
                    "data".into(),
                    format!(
                        "Too long: must have at most {} bytes",
                        validate::MAX_DATA_BYTES
                    ),
                ),
            ));
        }
        if !data.is_empty() {
            m.insert("data".into(), Value::Object(data));
        }
        match m.get("type") {
            None | Some(Value::Null) => {
                m.insert("type".into(), json!("Opaque"));
            }
            Some(Value::String(t)) if t.is_empty() => {
                m.insert("type".into(), json!("Opaque"));
            }
            Some(Value::String(_)) => {}
            Some(_) => return Err(bad("Secret.type must be a string")),
        }
        Ok(())
    }

    fn configmap_rules(obj: &mut Value, name: &str) -> Result<()> {
        let kind = Kind::ConfigMap;
        let mut total = 0usize;
        if let Some(d) = obj.get("data").filter(|v| !v.is_null()) {
            let d = validate::string_map(d, "data")
                .map_err(|_| bad("ConfigMap.data must be a map of strings"))?;
            for (k, v) in d {
                validate::config_key(k, &format!("data[{k}]"))
                    .map_err(|v| invalid(kind, name, v))?;
                total += k.len() + v.as_str().map_or(0, str::len);
            }
        }
        if let Some(b) = obj.get("binaryData").filter(|v| !v.is_null()) {
            let b = b
                .as_object()
                .ok_or_else(|| bad("ConfigMap.binaryData must be a map of base64 strings"))?;
            for (k, v) in b {
                validate::config_key(k, &format!("binaryData[{k}]"))
                    .map_err(|v| invalid(kind, name, v))?;
                let bytes = v.as_str().and_then(validate::base64_value).ok_or_else(|| {
                    bad(format!("ConfigMap.binaryData[{k}]: illegal base64 data"))
                })?;
                if obj.get("data").and_then(|d| d.get(k)).is_some() {
                    return Err(invalid(
                        kind,
                        name,
                        (
                            format!("data[{k}]"),
                            "Invalid value: duplicate of key present in binaryData".into(),
                        ),
                    ));
                }
                total += k.len() + bytes.len();
            }
        }
        if total > validate::MAX_DATA_BYTES {
            return Err(invalid(
                kind,
                name,
                (
                    "data".into(),
                    format!(
                        "Too long: must have at most {} bytes",
                        validate::MAX_DATA_BYTES
                    ),
                ),
            ));
        }
        Ok(())
    }

    fn lease_rules(obj: &mut Value, name: &str) -> Result<()> {
        let kind = Kind::Lease;
        let Some(spec) = obj.get("spec").filter(|v| !v.is_null()) else {
            return Ok(());
        };
        let spec = spec
            .as_object()
            .ok_or_else(|| bad("Lease.spec must be an object"))?;
        for f in [
            "holderIdentity",
            "acquireTime",
            "renewTime",
            "strategy",
            "preferredHolder",
        ] {
            if spec.get(f).is_some_and(|v| !v.is_null() && !v.is_string()) {
                return Err(bad(format!("Lease.spec.{f} must be a string")));
            }
        }
        for f in ["leaseDurationSeconds", "leaseTransitions"] {
            match spec.get(f) {
                None | Some(Value::Null) => {}
                Some(v) => {
                    let n = v
                        .as_i64()
                        .ok_or_else(|| bad(format!("Lease.spec.{f} must be an integer")))?;
                    if f == "leaseDurationSeconds" && n <= 0 {
                        return Err(invalid(
                            kind,
                            name,
                            (
                                format!("spec.{f}"),
                                format!("Invalid value: {n}: must be greater than 0"),
                            ),
                        ));
                    }
                    if n < 0 {
                        return Err(invalid(
                            kind,
                            name,
                            (
                                format!("spec.{f}"),
                                format!("Invalid value: {n}: must be greater than or equal to 0"),
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Rules that compare the new object to the stored one.
    fn update_rules(kind: Kind, old: &Value, new: &Value, name: &str) -> Result<()> {
        let immutable = |v: &Value| v.get("immutable").and_then(Value::as_bool).unwrap_or(false);
        if matches!(kind, Kind::Secret | Kind::ConfigMap) && immutable(old) {
            let fields: &[&str] = if kind == Kind::Secret {
                &["data"]
            } else {
                &["data", "binaryData"]
            };
            for f in fields {
                if old.get(*f) != new.get(*f) {
                    return Err(invalid(
                        kind,
                        name,
                        (
                            (*f).into(),
                            "Forbidden: field is immutable when `immutable` is set".into(),
                        ),
                    ));
                }
            }
            if !immutable(new) {
                return Err(invalid(
                    kind,
                    name,
                    (
                        "immutable".into(),
                        "Forbidden: field is immutable when `immutable` is set".into(),
                    ),
                ));
            }
        }
        super::storage::update_rules(kind, old, new).map_err(|v| invalid(kind, name, v))?;
        super::snapshot::update_rules(kind, old, new).map_err(|v| invalid(kind, name, v))?;
        if kind == Kind::Secret && old.get("type") != new.get("type") {
            return Err(invalid(
                kind,
                name,
                ("type".into(), "Invalid value: field is immutable".into()),
            ));
        }
        if !meta_str(old, "deletionTimestamp").is_empty() {
            let before = finalizers(old);
            if finalizers(new).iter().any(|f| !before.contains(f)) {
                return Err(invalid(
                    kind,
                    name,
                    (
                        "metadata.finalizers".into(),
                        "Forbidden: no new finalizers can be added if the object is being deleted"
                            .into(),
                    ),
                ));
            }
        }
        Ok(())
    }

    // ---- create ---------------------------------------------------------

    pub(crate) fn create_in(
        &self,
        kind: Kind,
        path_ns: Option<&str>,
        obj: Value,
        opts: WriteOpts,
    ) -> Result<Arc<Value>> {
        let obj = self.normalize(kind, path_ns, None, obj)?;
        let mut guard = self.lock();
        self.create_locked(&mut guard, kind, obj, opts)
    }

    fn create_locked(
        &self,
        guard: &mut MutexGuard<'_, u64>,
        kind: Kind,
        mut obj: Value,
        opts: WriteOpts,
    ) -> Result<Arc<Value>> {
        let ns = meta_str(&obj, "namespace").to_string();
        if !meta_str(&obj, "resourceVersion").is_empty() {
            return Err(bad(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let record_ns = match kind.namespaced() {
            true => self.admit_create_in(kind, &ns, meta_str(&obj, "name"), opts.clone())?,
            false => false,
        };
        let rv = **guard + 1;
        let mut name = meta_str(&obj, "name").to_string();
        if name.is_empty() {
            let prefix = meta_str(&obj, "generateName").to_string();
            if prefix.is_empty() {
                return Err(invalid(
                    kind,
                    "",
                    (
                        "metadata.name".into(),
                        "Required value: name or generateName is required".into(),
                    ),
                ));
            }
            // Validate the prefix as if it were a name first, so a bad prefix
            // is reported as such rather than as a bad generated name.
            let probe = format!("{prefix}x");
            if let Err(msg) = validate::dns1123_subdomain(&probe) {
                return Err(invalid(kind, "", ("metadata.generateName".into(), msg)));
            }
            let mut chosen = None;
            for attempt in 0..GENERATE_NAME_ATTEMPTS {
                let candidate = format!("{prefix}{}", name_suffix(self.inner.seed, rv, attempt));
                if !self.exists(kind, &ns, &candidate)? {
                    chosen = Some(candidate);
                    break;
                }
            }
            name = chosen.ok_or_else(|| KubeError::AlreadyExists {
                kind,
                name: format!("{prefix}*"),
            })?;
            meta_mut(&mut obj).insert("name".into(), json!(name));
        }
        if opts.http && kind.has_status_subresource() {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
        self.validate_and_default(kind, &mut obj)?;
        super::storage::admit_create(kind, &mut obj);
        if self.exists(kind, &ns, &name)? {
            return Err(KubeError::AlreadyExists { kind, name });
        }
        let now = self.now();
        let md = meta_mut(&mut obj);
        for f in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            md.remove(f);
        }
        md.insert("uid".into(), json!(uid_for(self.inner.seed, rv)));
        md.insert("resourceVersion".into(), json!(rv.to_string()));
        md.insert("creationTimestamp".into(), json!(now));
        if tracks_generation(kind) {
            md.insert("generation".into(), json!(1));
        } else {
            md.remove("generation");
        }
        if let Some(manager) = &opts.manager {
            let w = super::managed::Writer {
                manager,
                status: false,
                now: &now,
            };
            super::managed::record_update(kind, None, &mut obj, &w);
        }
        let obj = Arc::new(obj);
        if !opts.dry_run {
            if record_ns {
                self.record_namespace(**guard, &ns)?;
            }
            self.commit(
                guard,
                rv,
                kind,
                Some((obj.clone(), opts.form())),
                &ns,
                &name,
            )?;
        }
        Ok(obj)
    }

    // ---- update ---------------------------------------------------------

    pub(crate) fn replace_in(
        &self,
        kind: Kind,
        path_ns: Option<&str>,
        path_name: Option<&str>,
        obj: Value,
        opts: WriteOpts,
    ) -> Result<Arc<Value>> {
        let new = self.normalize(kind, path_ns, path_name, obj)?;
        let ns = meta_str(&new, "namespace").to_string();
        let name = meta_str(&new, "name").to_string();
        if name.is_empty() {
            return Err(invalid(
                kind,
                "",
                (
                    "metadata.name".into(),
                    "Required value: name is required".into(),
                ),
            ));
        }
        let mut guard = self.lock();
        let old = self
            .load_shared(kind, &ns, &name)?
            .ok_or_else(|| KubeError::NotFound {
                kind,
                name: name.clone(),
            })?;
        self.update_locked(&mut guard, kind, &old, new, opts)
    }

    /// Applies `patch`; answers the object and the warnings of field
    /// validation (unknown fields dropped under `Warn`).
    pub(crate) fn patch_in(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
        patch: PatchBody,
        opts: WriteOpts,
    ) -> Result<(Arc<Value>, Vec<String>)> {
        let scope = Self::scope(kind, ns)?;
        if let PatchBody::Apply(body) = &patch {
            super::managed::check_config(kind, body)?;
            if opts.field_validation.is_some() {
                // Server-side apply types its configuration first, whatever fieldValidation says.
                super::schema::check_apply(kind, ns, name, body)?;
            }
        }
        let now = self.now();
        let mut guard = self.lock();
        let Some(old) = self.load_shared(kind, scope, name)? else {
            if let (PatchBody::Apply(body), false) = (&patch, opts.status_only) {
                // Server-side apply creates what does not exist yet.
                let config = super::managed::scope_config(kind, body, false);
                let mut obj = self.normalize(kind, ns, Some(name), config)?;
                let mut opts = opts;
                if let Some(manager) = opts.manager.take() {
                    let w = super::managed::Writer {
                        manager: &manager,
                        status: false,
                        now: &now,
                    };
                    obj = super::managed::apply(kind, &json!({}), &obj, &w, true)?;
                }
                return Ok((self.create_locked(&mut guard, kind, obj, opts)?, Vec::new()));
            }
            return Err(KubeError::NotFound {
                kind,
                name: name.to_string(),
            });
        };
        let mut opts = opts;
        let patched = match &patch {
            PatchBody::Merge(p) => {
                if !p.is_object() {
                    return Err(bad("a merge patch must be a JSON object"));
                }
                merge_patch(&old, p)
            }
            PatchBody::Apply(p) => match opts.manager.take() {
                Some(manager) => {
                    let config = super::managed::scope_config(kind, p, opts.status_only);
                    let config =
                        self.normalize(kind, ns.filter(|_| kind.namespaced()), Some(name), config)?;
                    let w = super::managed::Writer {
                        manager: &manager,
                        status: opts.status_only,
                        now: &now,
                    };
                    super::managed::apply(kind, &old, &config, &w, opts.force)?
                }
                // In process (no manager): apply as a merge.
                None => merge_patch(&old, p),
            },
            PatchBody::Strategic(p) => {
                use super::strategic::StrategicError;
                super::strategic::strategic_merge_patch(kind, &old, p).map_err(|e| match e {
                    StrategicError::Malformed(m) => bad(m),
                    e @ StrategicError::NotImplemented(_) => KubeError::NotImplemented {
                        message: e.to_string(),
                    },
                })?
            }
            PatchBody::Json(p) => json_patch(&old, p).map_err(|e| match e {
                PatchError::Malformed(m) => bad(m),
                PatchError::NotApplicable(m) => KubeError::Invalid {
                    kind,
                    name: name.to_string(),
                    field: "".into(),
                    message: m,
                },
            })?,
        };
        let mut new =
            self.normalize(kind, ns.filter(|_| kind.namespaced()), Some(name), patched)?;
        let warnings = match (&patch, opts.field_validation) {
            (PatchBody::Apply(_), _) | (_, None) => Vec::new(),
            (_, Some(mode)) => super::schema::validate_fields(&mut new, kind, mode, false)?,
        };
        Ok((
            self.update_locked(&mut guard, kind, &old, new, opts)?,
            warnings,
        ))
    }

    fn update_locked(
        &self,
        guard: &mut MutexGuard<'_, u64>,
        kind: Kind,
        old: &Value,
        mut new: Value,
        opts: WriteOpts,
    ) -> Result<Arc<Value>> {
        let name = meta_str(old, "name").to_string();
        let ns = meta_str(old, "namespace").to_string();
        let old_rv = meta_str(old, "resourceVersion");
        let body_rv = meta_str(&new, "resourceVersion");
        if !body_rv.is_empty() && body_rv != old_rv {
            return Err(conflict_modified(kind, &name));
        }
        let old_uid = meta_str(old, "uid");
        let body_uid = meta_str(&new, "uid");
        if !body_uid.is_empty() && body_uid != old_uid {
            return Err(KubeError::Conflict {
                kind,
                name,
                message: format!("Precondition failed: UID in precondition: {body_uid}, UID in object meta: {old_uid}"),
            });
        }
        if opts.status_only {
            let status = new.get("status").cloned();
            new = old.clone();
            if let Some(m) = new.as_object_mut() {
                match status {
                    Some(s) if !s.is_null() => m.insert("status".into(), s),
                    _ => m.remove("status"),
                };
            }
        } else if opts.http && kind.has_status_subresource() {
            if let Some(m) = new.as_object_mut() {
                match old.get("status") {
                    Some(s) => m.insert("status".into(), s.clone()),
                    None => m.remove("status"),
                };
            }
        }
        // Server-owned metadata always comes from the stored object.
        {
            let old_md = meta(old);
            let md = meta_mut(&mut new);
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "resourceVersion",
                "generateName",
            ] {
                match old_md.and_then(|m| m.get(f)) {
                    Some(v) => md.insert(f.to_string(), v.clone()),
                    None => md.remove(f),
                };
            }
            md.remove("selfLink");
        }
        self.validate_and_default(kind, &mut new)?;
        Self::update_rules(kind, old, &new, &name)?;
        if tracks_generation(kind) && generation_scope(kind, old) != generation_scope(kind, &new) {
            let g = meta(old)
                .and_then(|m| m.get("generation"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
        if let Some(manager) = &opts.manager {
            let now = self.now();
            let w = super::managed::Writer {
                manager,
                status: opts.status_only,
                now: &now,
            };
            super::managed::record_update(kind, Some(old), &mut new, &w);
        }
        // A no-op write keeps its resourceVersion, as the real server does.
        if &new == old {
            return Ok(Arc::new(new));
        }
        let rv = **guard + 1;
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
        let deleting = !meta_str(&new, "deletionTimestamp").is_empty();
        let keep = !(deleting && finalizers(&new).is_empty());
        let new = Arc::new(new);
        if !opts.dry_run {
            let kept = keep.then(|| (new.clone(), opts.form()));
            self.commit(guard, rv, kind, kept, &ns, &name)?;
        }
        Ok(new)
    }

    // ---- delete ---------------------------------------------------------

    pub(crate) fn delete_in(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
        pre: &Preconditions,
        opts: WriteOpts,
    ) -> Result<Option<Deleted>> {
        let scope = Self::scope(kind, ns)?;
        let mut guard = self.lock();
        if kind == Kind::Namespace {
            return self.delete_namespace_locked(&mut guard, name, pre, opts);
        }
        self.delete_locked(&mut guard, kind, scope, name, pre, opts)
    }

    fn delete_locked(
        &self,
        guard: &mut MutexGuard<'_, u64>,
        kind: Kind,
        scope: &str,
        name: &str,
        pre: &Preconditions,
        opts: WriteOpts,
    ) -> Result<Option<Deleted>> {
        let Some(old) = self.load(kind, scope, name)? else {
            return Ok(None);
        };
        check_preconditions(kind, name, &old, pre)?;
        let next = **guard + 1;
        // Graceful: a pod stays, marked, until its kubelet has torn it down
        // and deletes it again with a zero grace period.
        let grace = (kind == Kind::Pod && super::storage::pod_deletes_gracefully(&old))
            .then(|| {
                pre.grace_period_seconds
                    .unwrap_or_else(|| super::storage::pod_default_grace(&old))
            })
            .filter(|g| *g > 0);
        let mark = match grace {
            Some(g) => Some((self.now_plus(g), g)),
            // Finalizers keep the object, marked, until they are all removed.
            None if !finalizers(&old).is_empty() => Some((self.now(), 0)),
            None => None,
        };
        if let Some((when, grace)) = mark {
            if !meta_str(&old, "deletionTimestamp").is_empty() {
                return Ok(Some(Deleted {
                    object: old,
                    gone: false,
                }));
            }
            let mut marked = old;
            let md = meta_mut(&mut marked);
            md.insert("deletionTimestamp".into(), json!(when));
            md.insert("deletionGracePeriodSeconds".into(), json!(grace));
            md.insert("resourceVersion".into(), json!(next.to_string()));
            let marked = Arc::new(marked);
            if !opts.dry_run {
                let marked = Some((marked.clone(), opts.form()));
                self.commit(guard, next, kind, marked, scope, name)?;
            }
            return Ok(Some(Deleted {
                object: Arc::unwrap_or_clone(marked),
                gone: false,
            }));
        }
        if !opts.dry_run {
            self.commit(guard, next, kind, None, scope, name)?;
        }
        Ok(Some(Deleted {
            object: old,
            gone: true,
        }))
    }

    // ---- read -----------------------------------------------------------

    pub(crate) fn get_in(&self, kind: Kind, ns: Option<&str>, name: &str) -> Result<Option<Value>> {
        Ok(self.get_shared(kind, ns, name)?.map(Arc::unwrap_or_clone))
    }

    /// The object, or `None`, shared with the fake's copy rather than cloned
    /// (for readers that only look: the API's GET, the lab's snapshots).
    pub fn get_shared(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<Value>>> {
        let scope = Self::scope(kind, ns)?;
        let _guard = self.lock();
        let got = self.load_shared(kind, scope, name)?;
        super::reads::note_get(kind, || obj_key(kind, scope, name), got.as_ref());
        Ok(got)
    }

    /// The object shared as the fake holds it: its JSON text where it was
    /// written over HTTP (what a GET answers as it is), else its tree.
    pub fn get_stored(&self, kind: Kind, ns: Option<&str>, name: &str) -> Result<Option<Stored>> {
        let scope = Self::scope(kind, ns)?;
        let _guard = self.lock();
        // Not checkable by key: no tree is handed out to compare later.
        super::reads::note_opaque();
        if kind == Kind::Namespace {
            // A namespace may be virtual: only `load_shared` knows those.
            return Ok(self.load_shared(kind, scope, name)?.map(Stored::Tree));
        }
        Ok(self
            .objects()
            .stored(&*self.inner.store, &obj_key(kind, scope, name))?)
    }

    /// Every stored object of `kind` (in `ns`, or everywhere), sorted by
    /// (namespace, name), each shared as the fake holds it: for readers
    /// that need each briefly (see [`Stored`]). Namespaces: stored ones only.
    pub fn list_stored(&self, kind: Kind, ns: Option<&str>) -> Result<Vec<Stored>> {
        super::reads::note_opaque();
        let _guard = self.lock();
        self.scan_with(kind, ns, |_, held| Ok(held.stored()))
    }

    /// Whether every object `reads` read by key is still the version it saw
    /// (and `reads` read nothing else): read again, it would see the same.
    pub fn unchanged(&self, reads: &super::reads::Reads) -> Result<bool> {
        if !reads.is_checkable() {
            return Ok(false);
        }
        let _guard = self.lock();
        Ok(self.objects().all_same(&*self.inner.store, reads.gets())?)
    }

    /// Objects of `kind` (in `ns`, or everywhere), sorted by (namespace, name),
    /// with the resourceVersion the list is consistent at.
    pub(crate) fn list_in(
        &self,
        kind: Kind,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> Result<(Vec<Value>, u64)> {
        super::reads::note_opaque();
        let guard = self.lock();
        let rv = *guard;
        let selected = |o: &Value| labels.matches_object(o) && fields.matches_object(o);
        let items: Vec<Value> = match kind {
            Kind::Namespace => (self.scan(kind, ns)?.into_iter())
                .filter(|o| selected(o))
                .map(Arc::unwrap_or_clone)
                .collect(),
            _ => (self
                .scan_with(kind, ns, |key, held| {
                    if !held.may_match(labels) {
                        return Ok(None);
                    }
                    let o = held.tree(key)?;
                    Ok(selected(&o).then_some(o))
                })?
                .into_iter())
            .flatten()
            .map(Arc::unwrap_or_clone)
            .collect(),
        };
        drop(guard);
        Ok((items, rv))
    }

    /// Every object of `kind` (in `ns`, or everywhere), sorted by (namespace,
    /// name), shared with the fake's copy rather than cloned: what the
    /// sidecars' resyncs read (an informer's cache, not a server round trip).
    pub fn list_shared(&self, kind: Kind, ns: Option<&str>) -> Result<Vec<Arc<Value>>> {
        super::reads::note_opaque();
        let guard = self.lock();
        let items = self.scan(kind, ns)?;
        drop(guard);
        Ok(items)
    }

    /// The PersistentVolumes whose `spec.claimRef` names claim `ns`/`name`,
    /// by name (what a scan of every PV for that claimRef finds, from an
    /// index the fake keeps as it writes).
    pub fn volumes_claiming(&self, ns: &str, name: &str) -> Result<Vec<Arc<Value>>> {
        super::reads::note_opaque();
        let _guard = self.lock();
        let claim = (ns.to_string(), name.to_string());
        Ok(self.objects().pvs_claiming(&*self.inner.store, &claim)?)
    }

    /// Every object of `kind` (in `ns`, or everywhere) in list order, by
    /// (namespace, name): the stored ones, and for namespaces the virtual
    /// ones too.
    fn scan(&self, kind: Kind, ns: Option<&str>) -> Result<Vec<Arc<Value>>> {
        let mut out = self.scan_with(kind, ns, |key, held| held.tree(key))?;
        if kind == Kind::Namespace {
            let virtual_ones = self.virtual_namespaces(&out)?;
            out.extend(virtual_ones.into_iter().map(Arc::new));
            return Ok(sorted(out));
        }
        debug_assert!(
            out.windows(2)
                .all(|w| list_order(&w[0]) <= list_order(&w[1])),
            "{kind:?} under one prefix not in (namespace, name) order"
        );
        Ok(out)
    }

    /// `read` of every stored object of `kind` (in `ns`, or everywhere), in
    /// list order by (namespace, name), which the store key spells.
    fn scan_with<T>(
        &self,
        kind: Kind,
        ns: Option<&str>,
        mut read: impl FnMut(&str, &mut Held) -> std::result::Result<T, crate::store::StoreError>,
    ) -> Result<Vec<T>> {
        let one_namespace = ns.filter(|_| kind.namespaced());
        let of_kind = format!("{OBJ_PREFIX}{}/", kind.plural());
        let prefix = match one_namespace {
            Some(n) => format!("{of_kind}{n}/"),
            None => of_kind.clone(),
        };
        let across_namespaces = one_namespace.is_none() && kind.namespaced();
        let mut out: Vec<T> = Vec::new();
        // Under one key prefix (one namespace, or a cluster-scoped kind) the
        // store's key order is name order already. Across namespaces it is
        // too while the namespaces came in order, which they do unless one
        // sorts before another only by the '/' ("a-b/" before "a/"). Sorting
        // every list was 4% of a 1000-node run, and again of a CSI resync.
        let mut in_namespace_order = true;
        let mut last_ns: Option<String> = None;
        let mut objects = self.objects();
        objects.each_under(&*self.inner.store, &prefix, |key, held| {
            if across_namespaces {
                let ns = key[prefix.len()..].split('/').next().unwrap_or_default();
                in_namespace_order &= last_ns.as_deref().is_none_or(|l| l <= ns);
                if last_ns.as_deref() != Some(ns) {
                    last_ns = Some(ns.to_string());
                }
            }
            out.push(read(key, held)?);
            Ok(())
        })?;
        if in_namespace_order {
            return Ok(out);
        }
        // (namespace, name) from each key, `<kind>/<namespace>/<name>`, in
        // the order `out` has them.
        let mut order: Vec<(String, String)> = Vec::with_capacity(out.len());
        objects.each_under(&*self.inner.store, &prefix, |key, _| {
            let (ns, name) = key[of_kind.len()..].split_once('/').unwrap_or_default();
            order.push((ns.to_string(), name.to_string()));
            Ok(())
        })?;
        let mut keyed: Vec<((String, String), T)> = order.into_iter().zip(out).collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(keyed.into_iter().map(|(_, t)| t).collect())
    }

    // ---- in-process API -------------------------------------------------

    /// Create `obj` (namespace from its metadata for namespaced kinds); 409 AlreadyExists if taken.
    /// The answer is the stored object itself, shared, not a copy of it.
    pub fn create(&self, kind: Kind, obj: Value) -> Result<Arc<Value>> {
        self.create_in(kind, None, obj, self.in_process())
    }

    /// The object, or `None`.
    pub fn get(&self, kind: Kind, namespace: Option<&str>, name: &str) -> Result<Option<Value>> {
        self.get_in(kind, namespace, name)
    }

    /// Every object of `kind` in `namespace` (or all namespaces), sorted by (namespace, name).
    pub fn list(&self, kind: Kind, namespace: Option<&str>) -> Result<Vec<Value>> {
        Ok(self
            .list_in(
                kind,
                namespace,
                &LabelSelector::default(),
                &FieldSelector::default(),
            )?
            .0)
    }

    /// Replace the stored object named by `obj`'s metadata; a compare-and-swap
    /// when `metadata.resourceVersion` is set. May write `status` directly.
    /// The answer is the stored object, shared.
    pub fn replace(&self, kind: Kind, obj: Value) -> Result<Arc<Value>> {
        self.replace_in(kind, None, None, obj, self.in_process())
    }

    /// RFC 7386 merge patch; a compare-and-swap when the patch carries
    /// `metadata.resourceVersion`. The answer is the stored object, shared.
    pub fn merge_patch(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        name: &str,
        patch: Value,
    ) -> Result<Arc<Value>> {
        self.patch_in(
            kind,
            namespace,
            name,
            PatchBody::Merge(patch),
            self.in_process(),
        )
        .map(|(object, _)| object)
    }

    /// Delete with `DeleteOptions.gracePeriodSeconds` (0 = now, as the kubelet
    /// finishes a pod's graceful deletion); otherwise as [`KubeFake::delete`].
    pub fn delete_with_grace(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        name: &str,
        grace_period_seconds: i64,
    ) -> Result<Option<Value>> {
        let pre = Preconditions {
            grace_period_seconds: Some(grace_period_seconds),
            ..Preconditions::default()
        };
        Ok(self
            .delete_in(kind, namespace, name, &pre, self.in_process())?
            .map(|d| d.object))
    }

    /// Delete; `None` if it did not exist. With finalizers the object stays,
    /// marked with `deletionTimestamp`, and is returned as marked; so does a pod
    /// bound to a node (graceful deletion, finished by its kubelet).
    pub fn delete(&self, kind: Kind, namespace: Option<&str>, name: &str) -> Result<Option<Value>> {
        Ok(self
            .delete_in(
                kind,
                namespace,
                name,
                &Preconditions::default(),
                self.in_process(),
            )?
            .map(|d| d.object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SimClock;
    use crate::history::History;
    use crate::store::{MemStore, SledStore};

    fn gate() -> Gate {
        Gate::new(History::new(SimClock::new()))
    }

    fn fake(seed: u64) -> KubeFake {
        KubeFake::new(Arc::new(MemStore::default()), gate(), seed).unwrap()
    }

    fn cm(name: &str) -> Value {
        json!({"metadata":{"name":name,"namespace":"default","labels":{"app":"x"}},"data":{"k":"v"}})
    }

    /// What a client wrote over HTTP is held as its JSON text: a GET answers
    /// those very bytes; in-process readers get one tree while any holds it;
    /// tracked reads still compare versions; a copy rebuilt from the store
    /// holds it as text again; an in-process write holds it as a tree.
    #[tokio::test]
    async fn an_object_written_over_http_is_held_as_its_text() {
        use super::super::reads::Reads;
        let store: Arc<dyn Store> = Arc::new(MemStore::default());
        let f = KubeFake::new(store.clone(), gate(), 1).unwrap();
        let http = WriteOpts {
            http: true,
            ..WriteOpts::default()
        };
        let made = (f.create_in(Kind::ConfigMap, None, cm("a"), http.clone())).unwrap();
        let answer = |f: &KubeFake| f.get_stored(Kind::ConfigMap, Some("default"), "a").unwrap();
        let text = |f: &KubeFake| match answer(f) {
            Some(Stored::Text(t)) => t.text(),
            _ => panic!("not held as text"),
        };
        assert_eq!(text(&f), serde_json::to_string(&*made).unwrap());
        let get = || {
            (f.get_shared(Kind::ConfigMap, Some("default"), "a"))
                .unwrap()
                .unwrap()
        };
        assert!(
            Arc::ptr_eq(&get(), &made),
            "the writer's tree, while it holds it"
        );
        drop(made);
        let (b, c) = (get(), get());
        assert!(Arc::ptr_eq(&b, &c));
        assert_eq!(*b, serde_json::from_str::<Value>(&text(&f)).unwrap());
        let ((), reads) = Reads::track(async {
            get();
        })
        .await;
        drop((b, c));
        assert!(
            f.unchanged(&reads).unwrap(),
            "the tracked read holds its version"
        );
        // A read as held hands out no tree to compare, namespaces included.
        for (kind, ns, name) in [
            (Kind::ConfigMap, Some("default"), "a"),
            (Kind::Namespace, None, "default"),
        ] {
            let (_, reads) = Reads::track(async { f.get_stored(kind, ns, name) }).await;
            assert!(!reads.is_checkable(), "{kind:?}");
        }
        let patch = PatchBody::Merge(json!({"data": {"k": "w"}}));
        (f.patch_in(Kind::ConfigMap, Some("default"), "a", patch, http.clone())).unwrap();
        assert!(!f.unchanged(&reads).unwrap());
        let written = text(&f);
        assert!(written.contains(r#""k":"w""#), "{written}");
        // Listed as held: one address per version, the same tree.
        let listed = || f.list_stored(Kind::ConfigMap, Some("default")).unwrap();
        let (l1, l2) = (listed(), listed());
        assert!(matches!(&l1[..], [Stored::Text(_)]));
        assert_eq!(l1[0].address(), l2[0].address());
        assert_eq!(*l1[0].tree().unwrap(), *get());
        // A list by label selector reads the labels held beside the text,
        // as they were last written.
        let by_label = |f: &KubeFake, sel: &str| {
            let sel = LabelSelector::parse(sel).unwrap();
            let (items, _) =
                (f.list_in(Kind::ConfigMap, None, &sel, &FieldSelector::default())).unwrap();
            items.len()
        };
        assert_eq!((by_label(&f, "app=x"), by_label(&f, "app=y")), (1, 0));
        let relabel = PatchBody::Merge(json!({"metadata": {"labels": {"app": "y"}}}));
        (f.patch_in(Kind::ConfigMap, Some("default"), "a", relabel, http)).unwrap();
        assert_eq!((by_label(&f, "app=x"), by_label(&f, "app in (y)")), (0, 1));
        let written = text(&f);
        let again = KubeFake::new(store, gate(), 1).unwrap();
        assert_eq!(
            (by_label(&again, "app=x"), by_label(&again, "app=y")),
            (0, 1)
        );
        assert_eq!(text(&again), written);
        let patch = json!({"data": {"k": "x"}});
        (again.merge_patch(Kind::ConfigMap, Some("default"), "a", patch)).unwrap();
        assert!(matches!(answer(&again), Some(Stored::Tree(_))));
        // Through a handle that holds text, in-process writes are held as
        // text too, and read back (as a tree, or over the other handle) alike.
        let texts = again.holding_text();
        let patch = json!({"data": {"k": "y"}});
        let made = (texts.merge_patch(Kind::ConfigMap, Some("default"), "a", patch)).unwrap();
        assert!(matches!(answer(&again), Some(Stored::Text(_))));
        let read = (again.get_shared(Kind::ConfigMap, Some("default"), "a")).unwrap();
        assert!(Arc::ptr_eq(&read.unwrap(), &made));
        assert_eq!(text(&again), serde_json::to_string(&*made).unwrap());
        texts.create(Kind::ConfigMap, cm("b")).unwrap();
        let b = (again.get_stored(Kind::ConfigMap, Some("default"), "b")).unwrap();
        let Some(Stored::Text(b)) = b else {
            panic!("not held as text")
        };
        // Packed against what its kind learned from its first texts, which
        // it is like: a fraction of its length is held.
        assert!(
            b.packed_len() * 2 < b.len(),
            "{} of {}",
            b.packed_len(),
            b.len()
        );
        let b_read = again.get(Kind::ConfigMap, Some("default"), "b").unwrap();
        assert_eq!(b.text(), serde_json::to_string(&b_read.unwrap()).unwrap());
    }

    #[tokio::test]
    async fn tracked_reads_say_whether_a_second_read_would_see_the_same() {
        use super::super::reads::Reads;
        let f = fake(1);
        f.create(Kind::ConfigMap, cm("a")).unwrap();
        let read_a_and_b = || async {
            f.get_shared(Kind::ConfigMap, Some("default"), "a").unwrap();
            f.get_shared(Kind::ConfigMap, Some("default"), "b").unwrap();
        };
        let ((), reads) = Reads::track(read_a_and_b()).await;
        assert_eq!(
            (reads.len(), reads.wrote(), reads.is_checkable()),
            (2, false, true)
        );
        assert!(f.unchanged(&reads).unwrap());
        // Another object changing is not a change to what it read.
        f.create(Kind::ConfigMap, cm("c")).unwrap();
        assert!(f.unchanged(&reads).unwrap());
        // An object it saw missing now exists.
        f.create(Kind::ConfigMap, cm("b")).unwrap();
        assert!(!f.unchanged(&reads).unwrap());
        // An object it saw is written.
        let ((), reads) = Reads::track(read_a_and_b()).await;
        assert!(f.unchanged(&reads).unwrap());
        let patch = json!({"data": {"k": "w"}});
        f.merge_patch(Kind::ConfigMap, Some("default"), "a", patch)
            .unwrap();
        assert!(!f.unchanged(&reads).unwrap());
        // A write, a list and a namespace are tracked as such.
        let rv = f.resource_version();
        let (_, reads) = Reads::track(async { f.create(Kind::ConfigMap, cm("d")) }).await;
        assert!(reads.wrote());
        assert_eq!(f.resource_version(), rv + reads.writes());
        let (_, reads) = Reads::track(async { f.list_shared(Kind::ConfigMap, None) }).await;
        assert!(!reads.is_checkable() && !f.unchanged(&reads).unwrap());
        let (_, reads) =
            Reads::track(async { f.get_shared(Kind::Namespace, None, "default") }).await;
        assert!(!reads.is_checkable());
        // Only the tracked task's reads count.
        let g = f.clone();
        let ((), reads) = Reads::track(async move {
            tokio::spawn(async move { g.get_shared(Kind::ConfigMap, Some("default"), "a") })
                .await
                .unwrap()
                .unwrap();
        })
        .await;
        assert!(reads.is_empty() && f.unchanged(&reads).unwrap());
    }

    #[test]
    fn create_fills_server_fields() {
        let f = fake(1);
        let o = f.create(Kind::ConfigMap, cm("a")).unwrap();
        assert_eq!(o["apiVersion"], "v1");
        assert_eq!(o["kind"], "ConfigMap");
        assert_eq!(o["metadata"]["resourceVersion"], "1");
        assert_eq!(o["metadata"]["creationTimestamp"], "2025-01-01T00:00:00Z");
        assert_eq!(o["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert!(o["metadata"].get("generation").is_none());
        assert!(matches!(
            f.create(Kind::ConfigMap, cm("a")),
            Err(KubeError::AlreadyExists { .. })
        ));
    }

    #[test]
    fn uid_is_deterministic_by_seed() {
        let uids = |seed| {
            let f = fake(seed);
            (0..3)
                .map(|i| {
                    f.create(Kind::ConfigMap, cm(&format!("c{i}"))).unwrap()["metadata"]["uid"]
                        .clone()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(uids(7), uids(7));
        assert_ne!(uids(7), uids(8));
        let u = uid_for(7, 1);
        assert_eq!(&u[14..15], "4", "version nibble: {u}");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"), "variant: {u}");
    }

    #[test]
    fn generate_name() {
        let f = fake(3);
        let mut obj = json!({"metadata":{"generateName":"ckpt-","namespace":"ns"}});
        let a = f.create(Kind::ConfigMap, obj.clone()).unwrap();
        let b = f.create(Kind::ConfigMap, obj.clone()).unwrap();
        let (an, bn) = (
            a["metadata"]["name"].as_str().unwrap(),
            b["metadata"]["name"].as_str().unwrap(),
        );
        assert!(an.starts_with("ckpt-") && an.len() == 10, "{an}");
        assert_ne!(an, bn);
        assert_eq!(
            fake(3).create(Kind::ConfigMap, obj.clone()).unwrap()["metadata"]["name"],
            an
        );
        obj["metadata"]["generateName"] = json!("Bad_");
        assert!(matches!(
            f.create(Kind::ConfigMap, obj),
            Err(KubeError::Invalid { .. })
        ));
    }

    #[test]
    fn replace_is_cas() {
        let f = fake(1);
        let v1 = f.create(Kind::ConfigMap, cm("a")).unwrap();
        let mut v2 = Value::clone(&v1);
        v2["data"]["k"] = json!("w");
        let v2 = f.replace(Kind::ConfigMap, v2).unwrap();
        assert_eq!(v2["metadata"]["resourceVersion"], "2");
        let mut stale = Value::clone(&v1);
        stale["data"]["k"] = json!("z");
        assert!(matches!(
            f.replace(Kind::ConfigMap, stale.clone()),
            Err(KubeError::Conflict { .. })
        ));
        // Without a resourceVersion the write is unconditional.
        meta_mut(&mut stale).remove("resourceVersion");
        let v3 = f.replace(Kind::ConfigMap, stale).unwrap();
        assert_eq!(v3["data"]["k"], "z");
        assert_eq!(v3["metadata"]["uid"], v1["metadata"]["uid"]);
        // A no-op keeps the version.
        assert_eq!(
            f.replace(Kind::ConfigMap, Value::clone(&v3)).unwrap()["metadata"]["resourceVersion"],
            v3["metadata"]["resourceVersion"]
        );
    }

    #[test]
    fn patch_cas_and_generation() {
        let f = fake(1);
        let b = f
            .create(Kind::BucketClaim, json!({"apiVersion":"objectstorage.k8s.io/v1alpha1","kind":"BucketClaim","metadata":{"name":"c","namespace":"n"},"spec":{"bucketClassName":"x"}}))
            .unwrap();
        assert_eq!(b["metadata"]["generation"], 1);
        let p = f
            .merge_patch(
                Kind::BucketClaim,
                Some("n"),
                "c",
                json!({"spec":{"protocols":["S3"]}}),
            )
            .unwrap();
        assert_eq!(p["metadata"]["generation"], 2);
        let p = f
            .merge_patch(
                Kind::BucketClaim,
                Some("n"),
                "c",
                json!({"metadata":{"labels":{"a":"b"}}}),
            )
            .unwrap();
        assert_eq!(p["metadata"]["generation"], 2);
        let stale = json!({"metadata":{"resourceVersion":"1"},"spec":{"bucketClassName":"y"}});
        assert!(matches!(
            f.merge_patch(Kind::BucketClaim, Some("n"), "c", stale),
            Err(KubeError::Conflict { .. })
        ));
        assert!(matches!(
            f.merge_patch(Kind::BucketClaim, Some("n"), "missing", json!({})),
            Err(KubeError::NotFound { .. })
        ));
    }

    #[test]
    fn secret_string_data_and_base64() {
        let f = fake(1);
        let s = f
            .create(Kind::Secret, json!({"metadata":{"name":"s","namespace":"n"},"data":{"a":"eA=="},"stringData":{"b":"hello","a":"y"}}))
            .unwrap();
        assert_eq!(s["data"], json!({"a":"eQ==","b":"aGVsbG8="}));
        assert!(s.get("stringData").is_none());
        assert_eq!(s["type"], "Opaque");
        let bad = f.create(
            Kind::Secret,
            json!({"metadata":{"name":"t","namespace":"n"},"data":{"a":"not base64!"}}),
        );
        assert!(matches!(bad, Err(KubeError::BadRequest { .. })));
    }

    #[test]
    fn finalizers_defer_deletion() {
        let f = fake(1);
        f.create(Kind::Bucket, json!({"metadata":{"name":"b","finalizers":["cosi.objectstorage.k8s.io/bucket-protection"]},"spec":{}})).unwrap();
        let marked = f.delete(Kind::Bucket, None, "b").unwrap().unwrap();
        assert!(marked["metadata"]["deletionTimestamp"].is_string());
        assert!(f.get(Kind::Bucket, None, "b").unwrap().is_some());
        let add = f.merge_patch(
            Kind::Bucket,
            None,
            "b",
            json!({"metadata":{"finalizers":["a","cosi.objectstorage.k8s.io/bucket-protection"]}}),
        );
        assert!(matches!(add, Err(KubeError::Invalid { .. })));
        f.merge_patch(
            Kind::Bucket,
            None,
            "b",
            json!({"metadata":{"finalizers":null}}),
        )
        .unwrap();
        assert!(f.get(Kind::Bucket, None, "b").unwrap().is_none());
        assert!(f.delete(Kind::Bucket, None, "b").unwrap().is_none());
    }

    #[test]
    fn list_is_sorted_and_scoped() {
        let f = fake(1);
        for (ns, name) in [("b", "x"), ("a-b", "y"), ("a", "z"), ("a", "c")] {
            f.create(
                Kind::ConfigMap,
                json!({"metadata":{"name":name,"namespace":ns}}),
            )
            .unwrap();
        }
        let all: Vec<_> = f
            .list(Kind::ConfigMap, None)
            .unwrap()
            .iter()
            .map(|o| format!("{}/{}", meta_str(o, "namespace"), meta_str(o, "name")))
            .collect();
        assert_eq!(all, ["a/c", "a/z", "a-b/y", "b/x"]);
        assert_eq!(f.list(Kind::ConfigMap, Some("a")).unwrap().len(), 2);
    }

    #[test]
    fn invalid_inputs_are_errors() {
        let f = fake(1);
        assert!(matches!(
            f.create(
                Kind::ConfigMap,
                json!({"metadata":{"name":"Bad_Name","namespace":"n"}})
            ),
            Err(KubeError::Invalid { .. })
        ));
        assert!(matches!(
            f.create(Kind::ConfigMap, json!({"metadata":{"name":"a"}})),
            Err(KubeError::Invalid { .. })
        ));
        assert!(matches!(
            f.create(Kind::ConfigMap, json!([1])),
            Err(KubeError::BadRequest { .. })
        ));
        assert!(matches!(
            f.create(
                Kind::ConfigMap,
                json!({"kind":"Secret","metadata":{"name":"a","namespace":"n"}})
            ),
            Err(KubeError::BadRequest { .. })
        ));
        assert!(matches!(
            f.create(
                Kind::ConfigMap,
                json!({"metadata":{"name":"a","namespace":"n"},"data":{"k":1}})
            ),
            Err(KubeError::BadRequest { .. })
        ));
        assert!(matches!(
            f.get(Kind::ConfigMap, None, "a"),
            Err(KubeError::BadRequest { .. })
        ));
    }

    /// A restarted fake's old handle, still held by a task, writes after the
    /// new one read: the new one's decoded copy and counter follow the store.
    #[test]
    fn a_write_through_an_old_handle_is_seen_and_its_version_never_reused() {
        let store: Arc<dyn Store> = Arc::new(MemStore::default());
        let old = KubeFake::new(store.clone(), gate(), 5).unwrap();
        old.create(Kind::ConfigMap, cm("first")).unwrap();
        let new = KubeFake::new(store, gate(), 5).unwrap();
        assert_eq!(new.list(Kind::ConfigMap, Some("default")).unwrap().len(), 1);
        let late = old.create(Kind::ConfigMap, cm("late")).unwrap();
        let names: Vec<String> = new
            .list(Kind::ConfigMap, Some("default"))
            .unwrap()
            .iter()
            .map(|o| meta_str(o, "name").to_string())
            .collect();
        assert_eq!(names, ["first", "late"]);
        let after = new.create(Kind::ConfigMap, cm("after")).unwrap();
        let rv = |o: &Value| meta_str(o, "resourceVersion").parse::<u64>().unwrap();
        assert!(rv(&after) > rv(&late));
    }

    fn pv(name: &str, claim: Option<(&str, &str)>) -> Value {
        let mut pv = json!({"metadata":{"name":name},"spec":{
            "capacity":{"storage":"1Gi"},"accessModes":["ReadWriteOnce"],
            "csi":{"driver":"d","volumeHandle":name}}});
        if let Some((ns, n)) = claim {
            pv["spec"]["claimRef"] = json!({"namespace":ns,"name":n});
        }
        pv
    }

    /// What `volumes_claiming` stands in for: a scan of every PV.
    fn scanned(f: &KubeFake, ns: &str, name: &str) -> Vec<String> {
        f.list(Kind::PersistentVolume, None)
            .unwrap()
            .iter()
            .filter(|p| {
                p["spec"]["claimRef"]["name"] == name && p["spec"]["claimRef"]["namespace"] == ns
            })
            .map(|p| meta_str(p, "name").to_string())
            .collect()
    }

    fn claiming(f: &KubeFake, ns: &str, name: &str) -> Vec<String> {
        let got: Vec<String> = f
            .volumes_claiming(ns, name)
            .unwrap()
            .iter()
            .map(|p| meta_str(p, "name").to_string())
            .collect();
        assert_eq!(
            got,
            scanned(f, ns, name),
            "index differs from a scan for {ns}/{name}"
        );
        got
    }

    #[test]
    fn volumes_claiming_follows_every_write_as_a_scan_would() {
        let store: Arc<dyn Store> = Arc::new(MemStore::default());
        let f = KubeFake::new(store.clone(), gate(), 3).unwrap();
        f.create(Kind::PersistentVolume, pv("b", Some(("app", "data"))))
            .unwrap();
        f.create(Kind::PersistentVolume, pv("a", Some(("app", "data"))))
            .unwrap();
        f.create(Kind::PersistentVolume, pv("c", Some(("other", "data"))))
            .unwrap();
        f.create(Kind::PersistentVolume, pv("free", None)).unwrap();
        assert_eq!(claiming(&f, "app", "data"), ["a", "b"]);
        assert_eq!(claiming(&f, "other", "data"), ["c"]);
        assert!(claiming(&f, "app", "nothing").is_empty());
        // Rebinding moves the volume from one claim to the other.
        f.merge_patch(
            Kind::PersistentVolume,
            None,
            "b",
            json!({"spec":{"claimRef":{"namespace":"other","name":"data"}}}),
        )
        .unwrap();
        assert_eq!(claiming(&f, "app", "data"), ["a"]);
        assert_eq!(claiming(&f, "other", "data"), ["b", "c"]);
        f.delete(Kind::PersistentVolume, None, "a").unwrap();
        assert!(claiming(&f, "app", "data").is_empty());
        // A second handle over the same store builds its index from the store,
        // and sees what the first one writes after it.
        let g = KubeFake::new(store, gate(), 3).unwrap();
        assert_eq!(claiming(&g, "other", "data"), ["b", "c"]);
        f.create(Kind::PersistentVolume, pv("d", Some(("app", "data"))))
            .unwrap();
        assert_eq!(claiming(&g, "app", "data"), ["d"]);
    }

    #[test]
    fn restart_keeps_objects_and_counter() {
        let dir = tempfile::tempdir().unwrap();
        let (uid, rv) = {
            let db = sled::open(dir.path()).unwrap();
            let f =
                KubeFake::new(Arc::new(SledStore::open(&db, "kube").unwrap()), gate(), 5).unwrap();
            let o = f
                .create(
                    Kind::Secret,
                    json!({"metadata":{"name":"ckpt","namespace":"drv"},"stringData":{"k":"v"}}),
                )
                .unwrap();
            f.create(Kind::Bucket, json!({"metadata":{"name":"b"}}))
                .unwrap();
            f.flush().unwrap();
            (o["metadata"]["uid"].clone(), f.resource_version())
        };
        let db = crate::store::reopen(dir.path());
        let f = KubeFake::new(Arc::new(SledStore::open(&db, "kube").unwrap()), gate(), 5).unwrap();
        assert_eq!(f.resource_version(), rv);
        let o = f.get(Kind::Secret, Some("drv"), "ckpt").unwrap().unwrap();
        assert_eq!(o["metadata"]["uid"], uid);
        let next = f.create(Kind::ConfigMap, cm("after")).unwrap();
        assert_eq!(next["metadata"]["resourceVersion"], (rv + 1).to_string());
        assert_ne!(next["metadata"]["uid"], uid);
    }
}

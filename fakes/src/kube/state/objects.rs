//! The in-memory copy of every stored object: as a tree, or as its JSON text
//! where it came over HTTP (see [`Form`]). Reads (gets, lists, the sidecars'
//! resyncs) come from here; the store stays the durable copy a restarted fake
//! is rebuilt from. Decoding from the store per read made each reconcile of a
//! 1000-node run O(objects) JSON parses. Beside it, the PersistentVolumes by
//! the claim they name, as the PV controller's cache has them: a gone claim's
//! volumes were a scan of every PV.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};

use serde_json::Value;

use super::{obj_key, OBJ_PREFIX};
use crate::json::str_ref;
use crate::json_text::{JsonText, Learner};
use crate::kube::{Kind, LabelSelector};
use crate::store::{Json, Store, StoreError};

/// A claim a PersistentVolume's `spec.claimRef` names: (namespace, name).
pub(super) type ClaimRef = (String, String);

/// How a committed object is held: the form follows who reads it most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Form {
    /// As a tree: written in process (the sidecars, controllers, the lab),
    /// whose reconciles read their objects back as trees many times.
    Tree,
    /// As its JSON text: written over HTTP, by a client that reads it back
    /// over HTTP, where a GET answers the text as it is. A tree is several
    /// times its text (a map node per object), and a driver's own objects
    /// (its checkpoints, with their managedFields) were a quarter of a
    /// COSI run's memory.
    Text,
}

/// One stored object.
#[derive(Clone)]
pub(super) enum Held {
    /// The tree its writer made, shared with every reader.
    Tree(Arc<Value>),
    /// Its JSON text (packed), and the tree last decoded from it while any
    /// reader still holds that tree: readers holding one version see one
    /// address, as they do for a tree (see `reads::Reads`).
    Text {
        json: JsonText,
        tree: Weak<Value>,
        /// Its labels, so a list by label selector decodes only what it selects.
        labels: Labels,
    },
}

/// An object's `metadata.labels` (string values only), sorted by key.
#[derive(Clone, Default)]
pub(super) struct Labels(Box<[(Box<str>, Box<str>)]>);

impl Labels {
    fn of(obj: &Value) -> Labels {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        // A map's keys come sorted.
        Labels(
            (labels.into_iter().flatten())
                .filter_map(|(k, v)| Some((k.as_str().into(), v.as_str()?.into())))
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        let i = self.0.binary_search_by(|(k, _)| (**k).cmp(key)).ok()?;
        Some(&self.0[i].1)
    }
}

impl Held {
    /// `obj` held in `form`; as text, packed by `kind`, its kind's learner.
    pub(super) fn new(obj: &Arc<Value>, form: Form, kind: &mut Learner) -> Held {
        match form {
            Form::Tree => Held::Tree(obj.clone()),
            Form::Text => {
                // A tree writes without error: its keys are strings, its numbers finite.
                let text = serde_json::to_string(&**obj).unwrap_or_default();
                Held::Text {
                    json: kind.pack(&text),
                    tree: Arc::downgrade(obj),
                    labels: Labels::of(obj),
                }
            }
        }
    }

    /// Write it to `store` under `key`.
    pub(super) fn put(&self, store: &dyn Store, key: &str) -> Result<(), StoreError> {
        match self {
            Held::Tree(t) => store.put_value(key, t),
            Held::Text { json, .. } => store.put_text(key, json),
        }
    }

    /// The object as a tree: the one readers share, decoded if none does.
    pub(super) fn tree(&mut self, key: &str) -> Result<Arc<Value>, StoreError> {
        match self {
            Held::Tree(t) => Ok(t.clone()),
            Held::Text { json, tree, .. } => {
                if let Some(t) = tree.upgrade() {
                    return Ok(t);
                }
                let t: Arc<Value> =
                    Arc::new(serde_json::from_str(&json.text()).map_err(|source| {
                        StoreError::Corrupt {
                            key: key.to_string(),
                            source,
                        }
                    })?);
                *tree = Arc::downgrade(&t);
                Ok(t)
            }
        }
    }

    /// Whether the object may match `selector`: false only if its labels,
    /// held beside its text, do not.
    pub(super) fn may_match(&self, selector: &LabelSelector) -> bool {
        match self {
            Held::Tree(_) => true,
            Held::Text { labels, .. } => selector.matches_by(|k| labels.get(k)),
        }
    }

    /// The object shared as it is held: its text, or its tree.
    pub(super) fn stored(&self) -> Stored {
        match self {
            Held::Tree(t) => Stored::Tree(t.clone()),
            Held::Text { json, .. } => Stored::Text(json.clone()),
        }
    }

    /// Whether `seen`, a tree a reader still holds, is this very version.
    fn is(&self, seen: &Arc<Value>) -> bool {
        match self {
            Held::Tree(t) => Arc::ptr_eq(t, seen),
            // The reader holds it, so its address is not reused.
            Held::Text { tree, .. } => std::ptr::eq(tree.as_ptr(), Arc::as_ptr(seen)),
        }
    }
}

/// One stored version of an object, shared with the fake as it holds it:
/// the tree an in-process writer made, or the JSON text of one written over
/// HTTP. For readers that go through many objects and need each briefly
/// (decoding them all at once held every tree together).
#[derive(Clone, Debug)]
pub enum Stored {
    /// The tree, shared.
    Tree(Arc<Value>),
    /// The JSON text, shared (packed as the fake holds it).
    Text(JsonText),
}

impl Stored {
    /// The object as a tree: the shared one, or one decoded from the text now.
    pub fn tree(&self) -> serde_json::Result<Arc<Value>> {
        match self {
            Stored::Tree(t) => Ok(t.clone()),
            Stored::Text(json) => serde_json::from_str(&json.text()).map(Arc::new),
        }
    }

    /// Where this version lives: the same for every read of one version
    /// while any of them is held.
    pub fn address(&self) -> usize {
        match self {
            Stored::Tree(t) => Arc::as_ptr(t) as *const u8 as usize,
            Stored::Text(json) => json.address(),
        }
    }
}

/// Objects by store key; loaded on first use, dropped when another handle
/// over the same store wrote (see `KubeFake::lock`).
#[derive(Default)]
pub(super) struct Objects {
    loaded: Option<Loaded>,
    /// What each kind's texts are packed against (see [`Held::new`]).
    learners: BTreeMap<Kind, Learner>,
}

struct Loaded {
    by_key: BTreeMap<String, Held>,
    /// The store keys of the PVs (under `pv_prefix`) whose claimRef names each claim.
    pvs_by_claim: BTreeMap<ClaimRef, BTreeSet<String>>,
    /// Each such PV's claim, so a write unindexes without reading the old object.
    claim_of_pv: BTreeMap<String, ClaimRef>,
    pv_prefix: String,
}

impl Loaded {
    fn claim_of(&self, key: &str, obj: &Value) -> Option<ClaimRef> {
        let name = str_ref(obj, &["spec", "claimRef", "name"]);
        (key.starts_with(&self.pv_prefix) && !name.is_empty()).then(|| {
            let ns = str_ref(obj, &["spec", "claimRef", "namespace"]);
            (ns.to_string(), name.to_string())
        })
    }

    fn index(&mut self, key: &str, obj: &Value) {
        if let Some(c) = self.claim_of(key, obj) {
            (self.pvs_by_claim.entry(c.clone()).or_default()).insert(key.to_string());
            self.claim_of_pv.insert(key.to_string(), c);
        }
    }

    fn unindex(&mut self, key: &str) {
        if let Some(c) = self.claim_of_pv.remove(key) {
            if let Some(keys) = self.pvs_by_claim.get_mut(&c) {
                keys.remove(key);
                if keys.is_empty() {
                    self.pvs_by_claim.remove(&c);
                }
            }
        }
    }
}

impl Objects {
    /// `obj`, of `kind`, as it will be held: see [`Held::new`].
    pub(super) fn hold(&mut self, kind: Kind, obj: &Arc<Value>, form: Form) -> Held {
        Held::new(obj, form, self.learners.entry(kind).or_default())
    }

    /// The loaded copy; read from every object key of `store` if not held.
    fn load(&mut self, store: &dyn Store) -> Result<&mut Loaded, StoreError> {
        Ok(match &mut self.loaded {
            Some(l) => l,
            empty => {
                let mut l = Loaded {
                    by_key: BTreeMap::new(),
                    pvs_by_claim: BTreeMap::new(),
                    claim_of_pv: BTreeMap::new(),
                    pv_prefix: obj_key(Kind::PersistentVolume, "", ""),
                };
                // From a store in memory, the trees and texts it shares with
                // the copy it was dropped from.
                for (k, v) in store.scan_shared(OBJ_PREFIX)? {
                    let mut held = match v {
                        Json::Tree(t) => Held::Tree(t),
                        Json::Text(json) => Held::Text {
                            json,
                            tree: Weak::new(),
                            labels: Labels::default(),
                        },
                    };
                    let tree = held.tree(&k)?;
                    if let Held::Text { labels, .. } = &mut held {
                        *labels = Labels::of(&tree);
                    }
                    l.index(&k, &tree);
                    l.by_key.insert(k, held);
                }
                empty.insert(l)
            }
        })
    }

    /// Load the copy from `store` if it is not held.
    pub(super) fn load_all(&mut self, store: &dyn Store) -> Result<(), StoreError> {
        self.load(store).map(|_| ())
    }

    /// The object under `key`, as a tree.
    pub(super) fn get(
        &mut self,
        store: &dyn Store,
        key: &str,
    ) -> Result<Option<Arc<Value>>, StoreError> {
        match self.load(store)?.by_key.get_mut(key) {
            Some(h) => h.tree(key).map(Some),
            None => Ok(None),
        }
    }

    /// The object under `key`, shared as it is held.
    pub(super) fn stored(
        &mut self,
        store: &dyn Store,
        key: &str,
    ) -> Result<Option<Stored>, StoreError> {
        Ok(self.load(store)?.by_key.get(key).map(Held::stored))
    }

    /// Whether each key is still at the version seen (a tree the caller
    /// holds), or still absent.
    pub(super) fn all_same<'a>(
        &mut self,
        store: &dyn Store,
        mut seen: impl Iterator<Item = (&'a str, Option<&'a Arc<Value>>)>,
    ) -> Result<bool, StoreError> {
        let stored = &self.load(store)?.by_key;
        Ok(seen.all(|(key, seen)| match (seen, stored.get(key)) {
            (None, None) => true,
            (Some(a), Some(b)) => b.is(a),
            _ => false,
        }))
    }

    /// Visit every object whose key starts with `prefix`, in key order.
    pub(super) fn each_under(
        &mut self,
        store: &dyn Store,
        prefix: &str,
        mut visit: impl FnMut(&str, &mut Held) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let l = self.load(store)?;
        let range = l.by_key.range_mut::<str, _>((
            std::ops::Bound::Included(prefix),
            std::ops::Bound::Unbounded,
        ));
        for (k, h) in range.take_while(|(k, _)| k.starts_with(prefix)) {
            visit(k, h)?;
        }
        Ok(())
    }

    /// The PersistentVolumes whose claimRef names `claim`, in key order.
    pub(super) fn pvs_claiming(
        &mut self,
        store: &dyn Store,
        claim: &ClaimRef,
    ) -> Result<Vec<Arc<Value>>, StoreError> {
        let l = self.load(store)?;
        let Some(keys) = l.pvs_by_claim.get(claim) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            if let Some(h) = l.by_key.get_mut(k) {
                out.push(h.tree(k)?);
            }
        }
        Ok(out)
    }

    /// Forget the copy: the store changed behind it.
    pub(super) fn invalidate(&mut self) {
        self.loaded = None;
    }

    /// A committed write of `obj` (`None` removes the object); the object it
    /// replaced, if the copy is loaded. A copy not loaded stays unloaded: it
    /// will be read from the store, write included.
    pub(super) fn commit(&mut self, key: &str, obj: Option<(&Arc<Value>, Held)>) -> Option<Held> {
        let l = self.loaded.as_mut()?;
        l.unindex(key);
        match obj {
            Some((tree, held)) => {
                l.index(key, tree);
                l.by_key.insert(key.to_string(), held)
            }
            None => l.by_key.remove(key),
        }
    }
}

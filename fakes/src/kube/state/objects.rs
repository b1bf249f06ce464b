//! The decoded copy of every stored object. Reads (gets, lists, the sidecars'
//! resyncs) come from here; the store stays the durable copy a restarted fake
//! is rebuilt from. Decoding from the store per read made each reconcile of a
//! 1000-node run O(objects) JSON parses. Beside it, the PersistentVolumes by
//! the claim they name, as the PV controller's cache has them: a gone claim's
//! volumes were a scan of every PV.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use super::{obj_key, OBJ_PREFIX};
use crate::json::str_ref;
use crate::kube::Kind;
use crate::store::{Store, StoreError};

/// A claim a PersistentVolume's `spec.claimRef` names: (namespace, name).
pub(super) type ClaimRef = (String, String);

/// Objects by store key; loaded on first use, dropped when another handle
/// over the same store wrote (see `KubeFake::lock`).
#[derive(Default)]
pub(super) struct Objects {
    loaded: Option<Loaded>,
}

struct Loaded {
    by_key: BTreeMap<String, Arc<Value>>,
    /// The store keys of the PVs (under `pv_prefix`) whose claimRef names each claim.
    pvs_by_claim: BTreeMap<ClaimRef, BTreeSet<String>>,
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
            self.pvs_by_claim
                .entry(c)
                .or_default()
                .insert(key.to_string());
        }
    }

    fn unindex(&mut self, key: &str, obj: &Value) {
        if let Some(c) = self.claim_of(key, obj) {
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
    /// The loaded copy; read from every object key of `store` if not held.
    fn load(&mut self, store: &dyn Store) -> Result<&mut Loaded, StoreError> {
        Ok(match &mut self.loaded {
            Some(l) => l,
            empty => {
                let mut l = Loaded {
                    by_key: BTreeMap::new(),
                    pvs_by_claim: BTreeMap::new(),
                    pv_prefix: obj_key(Kind::PersistentVolume, "", ""),
                };
                // From a store in memory, the trees it shares with the copy it was dropped from.
                for (k, v) in store.scan_values(OBJ_PREFIX)? {
                    l.index(&k, &v);
                    l.by_key.insert(k, v);
                }
                empty.insert(l)
            }
        })
    }

    /// The copy, loaded from `store` if not held.
    pub(super) fn loaded(
        &mut self,
        store: &dyn Store,
    ) -> Result<&BTreeMap<String, Arc<Value>>, StoreError> {
        Ok(&self.load(store)?.by_key)
    }

    /// The PersistentVolumes whose claimRef names `claim`, in key order.
    pub(super) fn pvs_claiming(
        &mut self,
        store: &dyn Store,
        claim: &ClaimRef,
    ) -> Result<Vec<Arc<Value>>, StoreError> {
        let l = self.load(store)?;
        Ok(l.pvs_by_claim
            .get(claim)
            .into_iter()
            .flatten()
            .filter_map(|k| l.by_key.get(k).cloned())
            .collect())
    }

    /// Forget the copy: the store changed behind it.
    pub(super) fn invalidate(&mut self) {
        self.loaded = None;
    }

    /// A committed write (`None` removes the object); the object it replaced,
    /// if the copy is loaded. A copy not loaded stays unloaded: it will be
    /// read from the store, write included.
    pub(super) fn commit(&mut self, key: &str, obj: Option<Arc<Value>>) -> Option<Arc<Value>> {
        let l = self.loaded.as_mut()?;
        let old = match &obj {
            Some(o) => l.by_key.insert(key.to_string(), o.clone()),
            None => l.by_key.remove(key),
        };
        if let Some(o) = &old {
            l.unindex(key, o);
        }
        if let Some(o) = &obj {
            l.index(key, o);
        }
        old
    }
}

/// Every entry whose key starts with `prefix`, in key order.
pub(super) fn under<'a>(
    map: &'a BTreeMap<String, Arc<Value>>,
    prefix: &'a str,
) -> impl Iterator<Item = (&'a str, &'a Arc<Value>)> + 'a {
    map.range::<str, _>((
        std::ops::Bound::Included(prefix),
        std::ops::Bound::Unbounded,
    ))
    .take_while(move |(k, _)| k.starts_with(prefix))
    .map(|(k, v)| (k.as_str(), v))
}

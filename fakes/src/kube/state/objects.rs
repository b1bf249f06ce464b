//! The decoded copy of every stored object. Reads (gets, lists, the sidecars'
//! resyncs) come from here; the store stays the durable copy a restarted fake
//! is rebuilt from. Decoding from the store per read made each reconcile of a
//! 1000-node run O(objects) JSON parses.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::store::{Store, StoreError, StoreExt};

/// Objects by store key; loaded on first use, dropped when another handle
/// over the same store wrote (see `KubeFake::lock`).
#[derive(Default)]
pub(super) struct Objects {
    by_key: Option<BTreeMap<String, Arc<Value>>>,
}

impl Objects {
    /// The copy, loaded from every key under `prefix` of `store` if not held.
    pub(super) fn loaded(
        &mut self,
        store: &dyn Store,
        prefix: &str,
    ) -> Result<&BTreeMap<String, Arc<Value>>, StoreError> {
        Ok(match &mut self.by_key {
            Some(map) => map,
            empty => empty.insert(
                store
                    .scan_json::<Value>(prefix)?
                    .into_iter()
                    .map(|(k, v)| (k, Arc::new(v)))
                    .collect(),
            ),
        })
    }

    /// Forget the copy: the store changed behind it.
    pub(super) fn invalidate(&mut self) {
        self.by_key = None;
    }

    /// A committed write (`None` removes the object); the object it replaced,
    /// if the copy is loaded. A copy not loaded stays unloaded: it will be
    /// read from the store, write included.
    pub(super) fn commit(&mut self, key: &str, obj: Option<Arc<Value>>) -> Option<Arc<Value>> {
        let map = self.by_key.as_mut()?;
        match obj {
            Some(o) => map.insert(key.to_string(), o),
            None => map.remove(key),
        }
    }
}

/// Every value whose key starts with `prefix`, in key order.
pub(super) fn under<'a>(
    map: &'a BTreeMap<String, Arc<Value>>,
    prefix: &'a str,
) -> impl Iterator<Item = &'a Arc<Value>> + 'a {
    map.range::<str, _>((
        std::ops::Bound::Included(prefix),
        std::ops::Bound::Unbounded,
    ))
    .take_while(move |(k, _)| k.starts_with(prefix))
    .map(|(_, v)| v)
}

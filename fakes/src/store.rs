//! Durable state behind every fake: a small key/value trait with a sled
//! implementation (state that must outlive the process: an external CPI's) and
//! an in-memory one (a run's fakes, which only ever restart in-process).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Errors from a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backing database failed.
    #[error("store backend: {0}")]
    Backend(String),
    /// A stored value did not decode.
    #[error("stored value under {key:?} is corrupt: {source}")]
    Corrupt {
        key: String,
        source: serde_json::Error,
    },
}

/// Ordered key/value storage; keys are UTF-8, values opaque bytes.
pub trait Store: Send + Sync {
    /// The value under `key`.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Set `key` to `value`.
    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;
    /// Remove `key`; true if it existed.
    fn remove(&self, key: &str) -> Result<bool, StoreError>;
    /// Every entry whose key starts with `prefix`, in key order.
    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
    /// A write batch ended (the fakes call this after each mutating request):
    /// durable at the store's own pace. Cheap; see [`Store::sync`].
    fn flush(&self) -> Result<(), StoreError>;
    /// Make everything written so far durable now (before a reopen from disk).
    fn sync(&self) -> Result<(), StoreError> {
        self.flush()
    }
}

/// JSON helpers over any [`Store`].
pub trait StoreExt: Store {
    /// Decode the JSON value under `key`.
    fn get_json<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StoreError> {
        match self.get(key)? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|source| StoreError::Corrupt {
                    key: key.to_string(),
                    source,
                }),
        }
    }
    /// Store `value` as JSON under `key`.
    fn put_json<T: Serialize>(&self, key: &str, value: &T) -> Result<(), StoreError> {
        let b = serde_json::to_vec(value).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.put(key, &b)
    }
    /// Decode every JSON value under `prefix`.
    fn scan_json<T: DeserializeOwned>(&self, prefix: &str) -> Result<Vec<(String, T)>, StoreError> {
        self.scan(prefix)?
            .into_iter()
            .map(|(k, v)| match serde_json::from_slice(&v) {
                Ok(t) => Ok((k, t)),
                Err(source) => Err(StoreError::Corrupt { key: k, source }),
            })
            .collect()
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// Open the sled database `config` names, waiting up to `wait` while its lock
/// is held. Another process may hold it, and so may this one for a moment
/// after dropping its last handle: sled's background threads release the
/// lock only when they finish. Other errors return at once.
pub fn open_sled(config: &sled::Config, wait: Duration) -> Result<sled::Db, sled::Error> {
    let give_up = Instant::now() + wait;
    loop {
        match config.open() {
            Err(e) if lock_held(&e) && Instant::now() < give_up => {
                tracing::debug!(error = %e, "sled database busy, retrying");
                std::thread::sleep(Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

/// True if `e` says another handle holds the database's lock (sled's only
/// word for it is this message).
pub fn lock_held(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

/// A sled tree as a store, for state a process restart must find (the
/// external CPI's). `flush` does not fsync: an fsync per request was most of
/// the lab's per-call cost (issue 9). sled's own flusher writes dirty data out
/// every 500 ms and when the last handle of a tree drops; `sync` forces it.
pub struct SledStore {
    tree: sled::Tree,
}

impl SledStore {
    /// The tree `name` of `db`.
    pub fn open(db: &sled::Db, name: &str) -> Result<Self, StoreError> {
        let tree = db
            .open_tree(name)
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(Self { tree })
    }
}

fn backend(e: sled::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

impl Store for SledStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.tree.get(key).map_err(backend)?.map(|v| v.to_vec()))
    }
    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.tree.insert(key, value).map_err(backend)?;
        Ok(())
    }
    fn remove(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.tree.remove(key).map_err(backend)?.is_some())
    }
    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut out = Vec::new();
        for kv in self.tree.scan_prefix(prefix) {
            let (k, v) = kv.map_err(backend)?;
            out.push((String::from_utf8_lossy(&k).into_owned(), v.to_vec()));
        }
        Ok(out)
    }
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn sync(&self) -> Result<(), StoreError> {
        self.tree.flush().map_err(backend)?;
        Ok(())
    }
}

/// Named in-memory stores, as a sled database has named trees: opening a name
/// again gives the same store, so a fake restarted in-process finds its state.
#[derive(Default)]
pub struct MemStores(Mutex<BTreeMap<String, Arc<MemStore>>>);

impl MemStores {
    /// The store called `name`, created empty on first use.
    pub fn open(&self, name: &str) -> Arc<dyn Store> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(name.to_string()).or_default().clone()
    }
}

/// An in-memory store (not durable across a restart of the process).
#[derive(Default)]
pub struct MemStore {
    map: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl MemStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<u8>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for MemStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock().get(key).cloned())
    }
    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.lock().insert(key.to_string(), value.to_vec());
        Ok(())
    }
    fn remove(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.lock().remove(key).is_some())
    }
    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(self
            .lock()
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Reopen a test's sled database, waiting out the lock a dropped handle's
/// background threads may still hold.
#[cfg(test)]
pub(crate) fn reopen(dir: &std::path::Path) -> sled::Db {
    open_sled(&sled::Config::new().path(dir), Duration::from_secs(30)).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(s: &dyn Store) {
        s.put("a/1", b"x").unwrap();
        s.put("a/2", b"y").unwrap();
        s.put("b/1", b"z").unwrap();
        assert_eq!(s.get("a/1").unwrap().as_deref(), Some(&b"x"[..]));
        let keys: Vec<_> = s.scan("a/").unwrap().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, vec!["a/1", "a/2"]);
        assert!(s.remove("a/1").unwrap());
        assert!(!s.remove("a/1").unwrap());
        assert_eq!(s.get("a/1").unwrap(), None);
    }

    #[test]
    fn a_named_mem_store_reopens_with_its_state() {
        let stores = MemStores::default();
        stores.open("kube").put("k", b"v").unwrap();
        assert_eq!(
            stores.open("kube").get("k").unwrap().as_deref(),
            Some(&b"v"[..])
        );
        assert_eq!(stores.open("s3").get("k").unwrap(), None);
    }

    #[test]
    fn mem_store_behaves() {
        exercise(&MemStore::default());
    }

    #[test]
    fn sled_store_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::open(dir.path()).unwrap();
            let s = SledStore::open(&db, "t").unwrap();
            exercise(&s);
            s.sync().unwrap();
        }
        let db = reopen(dir.path());
        let s = SledStore::open(&db, "t").unwrap();
        assert_eq!(s.get("a/2").unwrap().as_deref(), Some(&b"y"[..]));
    }
}

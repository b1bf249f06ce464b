//! Durable state behind every fake: a small key/value trait with a sled
//! implementation (state that must outlive the process: an external CPI's) and
//! an in-memory one (a run's fakes, which only ever restart in-process).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::json_text::JsonText;

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

/// Ordered key/value storage; keys are UTF-8, values opaque bytes (a store in
/// memory may hold a JSON tree instead, and write its bytes when read: see
/// [`Store::put_value`]).
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
    /// Set `key` to the JSON of `value`. A store in memory keeps the tree
    /// itself, shared with its writer, and writes its bytes only if they are
    /// read; the default writes them now.
    fn put_value(&self, key: &str, value: &Arc<Value>) -> Result<(), StoreError> {
        let b = serde_json::to_vec(&**value).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.put(key, &b)
    }
    /// Every JSON value under `prefix`, in key order, as shared trees.
    fn scan_values(&self, prefix: &str) -> Result<Vec<(String, Arc<Value>)>, StoreError> {
        self.scan(prefix)?
            .into_iter()
            .map(|(k, v)| decode(k, &v).map(|(k, t)| (k, Arc::new(t))))
            .collect()
    }
    /// Set `key` to `json`, the text of a JSON value. A store in memory keeps
    /// the text itself, shared with its writer; the default writes its bytes.
    fn put_text(&self, key: &str, json: &JsonText) -> Result<(), StoreError> {
        self.put(key, json.text().as_bytes())
    }
    /// Every JSON value under `prefix`, in key order: what was put as text
    /// as that text where the store kept it, the rest as shared trees.
    fn scan_shared(&self, prefix: &str) -> Result<Vec<(String, Json)>, StoreError> {
        Ok(self
            .scan_values(prefix)?
            .into_iter()
            .map(|(k, v)| (k, Json::Tree(v)))
            .collect())
    }
}

/// A stored JSON value as [`Store::scan_shared`] hands it back.
pub enum Json {
    /// A tree, shared with whoever else holds it.
    Tree(Arc<Value>),
    /// The value's JSON text, shared.
    Text(JsonText),
}

/// The JSON value of `bytes`, stored under `key`.
fn decode<T: DeserializeOwned>(key: String, bytes: &[u8]) -> Result<(String, T), StoreError> {
    match serde_json::from_slice(bytes) {
        Ok(t) => Ok((key, t)),
        Err(source) => Err(StoreError::Corrupt { key, source }),
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
            .map(|(k, v)| decode(k, &v))
            .collect()
    }
    /// [`StoreExt::scan_json`], each value handed to `f` as it is decoded, so
    /// only one is held at a time (a decoded tree is several times its bytes).
    fn each_json<T: DeserializeOwned>(
        &self,
        prefix: &str,
        mut f: impl FnMut(String, T),
    ) -> Result<(), StoreError> {
        for (k, v) in self.scan(prefix)? {
            let (k, t) = decode(k, &v)?;
            f(k, t);
        }
        Ok(())
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
    map: Mutex<BTreeMap<String, Entry>>,
}

/// What a [`MemStore`] held, taken out of it by [`MemStore::take`].
pub struct MemEntries(#[allow(dead_code)] BTreeMap<String, Entry>);

/// A value as a [`MemStore`] holds it: bytes as written, or a JSON tree or
/// text shared with the fake that wrote it. The kube fake keeps a decoded copy of
/// every object; as bytes beside it, a 10⁵-grant run held each object twice
/// (~4.5 KB a grant), and serialised every write nobody read back.
enum Entry {
    Bytes(Vec<u8>),
    Value(Arc<Value>),
    Text(JsonText),
}

impl Entry {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Entry::Bytes(b) => b.clone(),
            Entry::Text(t) => t.text().into_bytes(),
            // A tree writes without error: its keys are strings, its numbers finite.
            Entry::Value(v) => serde_json::to_vec(&**v).unwrap_or_default(),
        }
    }
}

impl MemStore {
    /// Every entry, taken out: the store is as new, and the caller drops
    /// them where it likes (see the lab's `FakeSet::release`).
    pub fn take(&self) -> MemEntries {
        MemEntries(std::mem::take(&mut *self.lock()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for MemStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock().get(key).map(Entry::bytes))
    }
    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.lock()
            .insert(key.to_string(), Entry::Bytes(value.to_vec()));
        Ok(())
    }
    fn put_value(&self, key: &str, value: &Arc<Value>) -> Result<(), StoreError> {
        self.lock()
            .insert(key.to_string(), Entry::Value(value.clone()));
        Ok(())
    }
    fn scan_values(&self, prefix: &str) -> Result<Vec<(String, Arc<Value>)>, StoreError> {
        (self.scan_shared(prefix)?.into_iter())
            .map(|(k, v)| match v {
                Json::Tree(t) => Ok((k, t)),
                Json::Text(t) => decode(k, t.text().as_bytes()).map(|(k, t)| (k, Arc::new(t))),
            })
            .collect()
    }
    fn put_text(&self, key: &str, json: &JsonText) -> Result<(), StoreError> {
        self.lock()
            .insert(key.to_string(), Entry::Text(json.clone()));
        Ok(())
    }
    fn scan_shared(&self, prefix: &str) -> Result<Vec<(String, Json)>, StoreError> {
        self.lock()
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, e)| match e {
                Entry::Value(v) => Ok((k.clone(), Json::Tree(v.clone()))),
                Entry::Text(t) => Ok((k.clone(), Json::Text(t.clone()))),
                Entry::Bytes(b) => decode(k.clone(), b).map(|(k, t)| (k, Json::Tree(Arc::new(t)))),
            })
            .collect()
    }
    fn remove(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.lock().remove(key).is_some())
    }
    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(self
            .lock()
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, e)| (k.clone(), e.bytes()))
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
        values(&MemStore::default(), true);
    }

    /// A value put as a tree reads back as the bytes `put_json` would have
    /// written, and as the same tree (shared, where the store keeps trees).
    fn values(s: &dyn Store, shares: bool) {
        let v = Arc::new(serde_json::json!({"b": [1, "x"], "a": {"c": null}}));
        s.put_value("o/1", &v).unwrap();
        s.put("o/2", br#"{"z":true}"#).unwrap();
        let bytes = serde_json::to_vec(&*v).unwrap();
        assert_eq!(s.get("o/1").unwrap(), Some(bytes.clone()));
        assert_eq!(s.scan("o/").unwrap()[0], ("o/1".to_string(), bytes));
        let trees = s.scan_values("o/").unwrap();
        assert_eq!(trees.len(), 2);
        assert_eq!(*trees[0].1, *v);
        assert_eq!(Arc::ptr_eq(&trees[0].1, &v), shares);
        assert_eq!(*trees[1].1, serde_json::json!({"z": true}));
        // Text reads back as its bytes and as its tree; shared, where kept.
        let text = JsonText::from(r#"{"t":[2]}"#);
        s.put_text("o/21", &text).unwrap();
        assert_eq!(s.get("o/21").unwrap(), Some(text.text().into_bytes()));
        let shared = s.scan_shared("o/").unwrap();
        assert_eq!(shared.len(), 3);
        match &shared[2].1 {
            Json::Text(t) => assert!(shares && t.address() == text.address()),
            Json::Tree(t) => assert!(!shares && **t == serde_json::json!({"t": [2]})),
        }
        assert!(matches!(&shared[0].1, Json::Tree(t) if **t == *v));
        assert_eq!(
            *s.scan_values("o/").unwrap()[2].1,
            serde_json::json!({"t": [2]})
        );
        s.put("o/3", b"not json").unwrap();
        assert!(matches!(
            s.scan_values("o/"),
            Err(StoreError::Corrupt { key, .. }) if key == "o/3"
        ));
    }

    #[test]
    fn sled_store_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::open(dir.path()).unwrap();
            let s = SledStore::open(&db, "t").unwrap();
            exercise(&s);
            values(&s, false);
            s.sync().unwrap();
        }
        let db = reopen(dir.path());
        let s = SledStore::open(&db, "t").unwrap();
        assert_eq!(s.get("a/2").unwrap().as_deref(), Some(&b"y"[..]));
    }
}

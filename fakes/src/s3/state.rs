//! The fake's durable state (users, canned policies, buckets, objects) as
//! JSON records in a `Store`, so a restart over the same sled tree keeps it.
//! One mutex serialises read-modify-write mutations.

use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::{Store, StoreError, StoreExt};

const USER: &str = "s3/user/";
const POLICY: &str = "s3/policy/";
const BUCKET: &str = "s3/bucket/";
const OBJECT: &str = "s3/object/";
const DATA: &str = "s3/data/";
const SEEDED: &str = "s3/meta/seeded";
const UPLOAD: &str = "s3/mpu/";
const PART: &str = "s3/mpart/";
const PART_DATA: &str = "s3/mpartdata/";

#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct UserRec {
    pub secret_key: String,
    pub status: String,
    pub policies: Vec<String>,
    pub updated_at: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct PolicyRec {
    pub document: Value,
    pub builtin: bool,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct BucketRec {
    pub created_at: String,
    /// Access key of the creator; empty for the root key.
    #[serde(default)]
    pub owner: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ObjectMeta {
    pub size: u64,
    pub etag: String,
    pub last_modified: String,
    pub content_type: Option<String>,
    /// Entity headers and `x-amz-meta-*` as stored (lowercase names).
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// Verified checksums by algorithm (base64), echoed on request.
    #[serde(default)]
    pub checksums: std::collections::BTreeMap<String, String>,
}

/// A multipart upload in progress.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct UploadRec {
    pub bucket: String,
    pub key: String,
    pub initiated: String,
    /// The headers given to CreateMultipartUpload (kept on the object).
    pub headers: std::collections::BTreeMap<String, String>,
}

/// One uploaded part (its bytes are stored beside it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct PartRec {
    pub size: u64,
    pub etag: String,
    pub last_modified: String,
}

pub(crate) fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

pub(crate) struct State {
    store: Arc<dyn Store>,
    lock: Mutex<()>,
    journal: Mutex<Journal>,
}

/// Every user and bucket written since this state was opened (those present
/// at open first), in write order, so that a reader that wants "what is new"
/// reads only that instead of scanning everything (issue 9).
pub(crate) struct Journal {
    /// Distinguishes this state from one reopened over the same store.
    pub instance: u64,
    pub entries: Vec<Written>,
}

/// One journal entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Written {
    /// A user was put or removed.
    User(String),
    /// A bucket was put or removed, or an object in it.
    Bucket(String),
    /// A canned policy was put or removed.
    Policy(String),
}

static INSTANCES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn strip<T>(prefix: &str, v: Vec<(String, T)>) -> Vec<(String, T)> {
    v.into_iter()
        .map(|(k, t)| (k[prefix.len()..].to_string(), t))
        .collect()
}

impl State {
    /// Open the state, adding MinIO's built-in policies on first use.
    pub fn open(store: Arc<dyn Store>) -> Result<Self, StoreError> {
        let s = Self {
            store,
            lock: Mutex::new(()),
            journal: Mutex::new(Journal {
                instance: INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                entries: Vec::new(),
            }),
        };
        if s.store.get(SEEDED)?.is_none() {
            let now = now_rfc3339();
            for (name, document) in super::policy::builtin() {
                let rec = PolicyRec {
                    document,
                    builtin: true,
                    created_at: now.clone(),
                    updated_at: now.clone(),
                };
                s.store.put_json(&format!("{POLICY}{name}"), &rec)?;
            }
            s.store.put(SEEDED, b"1")?;
            s.store.flush()?;
        }
        let mut seeded: Vec<Written> = s
            .users()?
            .into_iter()
            .map(|(k, _)| Written::User(k))
            .collect();
        seeded.extend(s.buckets()?.into_iter().map(|(k, _)| Written::Bucket(k)));
        seeded.extend(s.policies()?.into_iter().map(|(k, _)| Written::Policy(k)));
        s.journal().entries = seeded;
        Ok(s)
    }

    /// Note a write in the journal (after it is in the store).
    fn wrote(&self, w: Written) {
        self.journal().entries.push(w);
    }

    pub fn journal(&self) -> MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Held across every read-modify-write so concurrent requests serialise.
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn flush(&self) -> Result<(), StoreError> {
        self.store.flush()
    }

    pub fn user(&self, ak: &str) -> Result<Option<UserRec>, StoreError> {
        self.store.get_json(&format!("{USER}{ak}"))
    }
    pub fn put_user(&self, ak: &str, u: &UserRec) -> Result<(), StoreError> {
        self.store.put_json(&format!("{USER}{ak}"), u)?;
        self.wrote(Written::User(ak.to_string()));
        Ok(())
    }
    pub fn remove_user(&self, ak: &str) -> Result<bool, StoreError> {
        let removed = self.store.remove(&format!("{USER}{ak}"))?;
        self.wrote(Written::User(ak.to_string()));
        Ok(removed)
    }
    pub fn users(&self) -> Result<Vec<(String, UserRec)>, StoreError> {
        Ok(strip(USER, self.store.scan_json(USER)?))
    }

    pub fn policy(&self, name: &str) -> Result<Option<PolicyRec>, StoreError> {
        self.store.get_json(&format!("{POLICY}{name}"))
    }
    pub fn put_policy(&self, name: &str, p: &PolicyRec) -> Result<(), StoreError> {
        self.store.put_json(&format!("{POLICY}{name}"), p)?;
        self.wrote(Written::Policy(name.to_string()));
        Ok(())
    }
    pub fn remove_policy(&self, name: &str) -> Result<bool, StoreError> {
        let removed = self.store.remove(&format!("{POLICY}{name}"))?;
        self.wrote(Written::Policy(name.to_string()));
        Ok(removed)
    }
    pub fn policies(&self) -> Result<Vec<(String, PolicyRec)>, StoreError> {
        Ok(strip(POLICY, self.store.scan_json(POLICY)?))
    }
    /// Every policy, by name, each decoded only as `f` takes it: a document's
    /// tree is several times its text, and all of them at once were the
    /// largest thing at the end of a 10⁵-grant run.
    pub fn each_policy(&self, mut f: impl FnMut(String, PolicyRec)) -> Result<(), StoreError> {
        self.store
            .each_json(POLICY, |key, rec| f(key[POLICY.len()..].to_string(), rec))
    }

    pub fn bucket(&self, name: &str) -> Result<Option<BucketRec>, StoreError> {
        self.store.get_json(&format!("{BUCKET}{name}"))
    }
    pub fn put_bucket(&self, name: &str, b: &BucketRec) -> Result<(), StoreError> {
        self.store.put_json(&format!("{BUCKET}{name}"), b)?;
        self.wrote(Written::Bucket(name.to_string()));
        Ok(())
    }
    pub fn remove_bucket(&self, name: &str) -> Result<bool, StoreError> {
        let removed = self.store.remove(&format!("{BUCKET}{name}"))?;
        self.wrote(Written::Bucket(name.to_string()));
        Ok(removed)
    }
    pub fn buckets(&self) -> Result<Vec<(String, BucketRec)>, StoreError> {
        Ok(strip(BUCKET, self.store.scan_json(BUCKET)?))
    }

    pub fn object(&self, bucket: &str, key: &str) -> Result<Option<ObjectMeta>, StoreError> {
        self.store.get_json(&format!("{OBJECT}{bucket}/{key}"))
    }
    pub fn object_data(&self, bucket: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.store.get(&format!("{DATA}{bucket}/{key}"))
    }
    pub fn put_object(
        &self,
        bucket: &str,
        key: &str,
        meta: &ObjectMeta,
        data: &[u8],
    ) -> Result<(), StoreError> {
        self.store.put(&format!("{DATA}{bucket}/{key}"), data)?;
        self.store
            .put_json(&format!("{OBJECT}{bucket}/{key}"), meta)?;
        self.wrote(Written::Bucket(bucket.to_string()));
        Ok(())
    }
    pub fn remove_object(&self, bucket: &str, key: &str) -> Result<bool, StoreError> {
        self.store.remove(&format!("{DATA}{bucket}/{key}"))?;
        let removed = self.store.remove(&format!("{OBJECT}{bucket}/{key}"))?;
        self.wrote(Written::Bucket(bucket.to_string()));
        Ok(removed)
    }
    /// Objects of `bucket` in key order.
    pub fn objects(&self, bucket: &str) -> Result<Vec<(String, ObjectMeta)>, StoreError> {
        let prefix = format!("{OBJECT}{bucket}/");
        Ok(strip(&prefix, self.store.scan_json(&prefix)?))
    }
    pub fn upload(&self, id: &str) -> Result<Option<UploadRec>, StoreError> {
        self.store.get_json(&format!("{UPLOAD}{id}"))
    }
    pub fn put_upload(&self, id: &str, u: &UploadRec) -> Result<(), StoreError> {
        self.store.put_json(&format!("{UPLOAD}{id}"), u)
    }
    /// Parts of upload `id` in part-number order (the key is zero-padded).
    pub fn parts(&self, id: &str) -> Result<Vec<(u32, PartRec)>, StoreError> {
        let prefix = format!("{PART}{id}/");
        Ok(strip(&prefix, self.store.scan_json(&prefix)?)
            .into_iter()
            .filter_map(|(n, p)| Some((n.parse().ok()?, p)))
            .collect())
    }
    pub fn put_part(&self, id: &str, n: u32, p: &PartRec, data: &[u8]) -> Result<(), StoreError> {
        self.store.put(&format!("{PART_DATA}{id}/{n:05}"), data)?;
        self.store.put_json(&format!("{PART}{id}/{n:05}"), p)
    }
    pub fn part_data(&self, id: &str, n: u32) -> Result<Option<Vec<u8>>, StoreError> {
        self.store.get(&format!("{PART_DATA}{id}/{n:05}"))
    }
    /// Forget upload `id` and all its parts.
    pub fn remove_upload(&self, id: &str) -> Result<(), StoreError> {
        for (n, _) in self.parts(id)? {
            self.store.remove(&format!("{PART_DATA}{id}/{n:05}"))?;
            self.store.remove(&format!("{PART}{id}/{n:05}"))?;
        }
        self.store.remove(&format!("{UPLOAD}{id}"))?;
        Ok(())
    }
    pub fn has_objects(&self, bucket: &str) -> Result<bool, StoreError> {
        Ok(!self.store.scan(&format!("{OBJECT}{bucket}/"))?.is_empty())
    }
}

//! What the snapshot and the end of a run read of each claim, bucket and
//! access: a few fields and the snapshot line, made once per stored version.
//! The kube fake may hold an object as its JSON text; a view lets the run
//! decode each version once, one at a time, and keep only what it reads.

use std::sync::Arc;

use drivelab_fakes::json::{bool_at as b, str_at as s, str_ref as sr};
use drivelab_fakes::kube::Stored;
use serde_json::Value;

use super::{or_dash, ByObject, Section};

/// What is read of one kind of object.
pub trait View: Sized + Default {
    /// Made from the decoded object.
    fn of(obj: &Value) -> Self;
    /// How the snapshot shows it.
    fn shown(&self) -> &Shown;
    fn shown_mut(&mut self) -> &mut Shown;

    /// Made for a version whose text does not decode: shown as such, no
    /// field read.
    fn undecodable(err: &serde_json::Error) -> Self {
        let mut v = Self::default();
        v.shown_mut().line = format!("  an object that does not decode as JSON: {err}\n").into();
        v
    }
    /// What the snapshot sorts by (before relabelling): `namespace/name`.
    fn key(&self) -> &str {
        &self.shown().key
    }
    /// The snapshot's line for it (before relabelling), with its newline.
    fn line(&self) -> &str {
        &self.shown().line
    }
}

/// How the snapshot shows an object: its sort key and its line.
#[derive(Default)]
pub struct Shown {
    key: Box<str>,
    line: Box<str>,
}

/// One object's view, and whether the previous read had this very version.
pub struct Viewed<V> {
    /// What is read of it.
    pub view: Arc<V>,
    /// Not read last time (the previous snapshot did not show it): its ids
    /// are labelled afresh.
    pub new: bool,
}

/// The view of each stored version a read returned, kept for the next read
/// (a snapshot after every step reads every object each step; most have not
/// changed).
pub struct Views<V> {
    pub(super) kept: ByObject<Arc<V>>,
}

impl<V> Default for Views<V> {
    fn default() -> Self {
        Self {
            kept: ByObject::default(),
        }
    }
}

impl<V: View> Views<V> {
    /// Each object's view: kept from the last read, or decoded now (one at a
    /// time, the tree dropped at once). Versions not among these are forgotten.
    pub fn read(&mut self, objs: Vec<Stored>) -> Vec<Viewed<V>> {
        let viewed = objs
            .into_iter()
            .map(|o| {
                let new = !self.kept.shown(Section::Viewed, &o);
                let view = self.kept.get(Section::Viewed, &o, || {
                    Arc::new(match o.tree() {
                        Ok(t) => V::of(&t),
                        Err(e) => V::undecodable(&e),
                    })
                });
                Viewed {
                    view: view.clone(),
                    new,
                }
            })
            .collect();
        self.kept.forget_unused();
        viewed
    }
}

fn key_of(obj: &Value) -> String {
    format!(
        "{}/{}",
        sr(obj, &["metadata", "namespace"]),
        sr(obj, &["metadata", "name"])
    )
}

/// A BucketClaim.
#[derive(Default)]
pub struct ClaimView {
    shown: Shown,
    /// `metadata.uid`.
    pub uid: Box<str>,
    /// `status.bucketReady`.
    pub ready: bool,
    /// `status.bucketName`.
    pub bucket_name: Box<str>,
}

impl View for ClaimView {
    fn of(c: &Value) -> Self {
        let key = key_of(c);
        let bucket_name = s(c, &["status", "bucketName"]);
        let ready = b(c, &["status", "bucketReady"]);
        let line = format!(
            "  {key}: class {}, bucket {}, ready {ready}\n",
            sr(c, &["spec", "bucketClassName"]),
            or_dash(&bucket_name),
        );
        Self {
            shown: Shown {
                key: key.into(),
                line: line.into(),
            },
            uid: s(c, &["metadata", "uid"]).into(),
            ready,
            bucket_name: bucket_name.into(),
        }
    }

    fn shown(&self) -> &Shown {
        &self.shown
    }

    fn shown_mut(&mut self) -> &mut Shown {
        &mut self.shown
    }
}

impl ClaimView {
    /// `namespace/name`.
    pub fn name(&self) -> &str {
        self.key()
    }
}

/// A Bucket (cluster-scoped: its key is `/name`).
#[derive(Default)]
pub struct BucketView {
    shown: Shown,
    /// `status.bucketID`.
    pub bucket_id: Box<str>,
}

impl View for BucketView {
    fn of(bk: &Value) -> Self {
        let claim = match drivelab_fakes::json::at(bk, &["spec", "bucketClaim"]) {
            Some(cl) if !cl.is_null() => {
                format!("{}/{}", sr(cl, &["namespace"]), sr(cl, &["name"]))
            }
            _ => "released".to_string(),
        };
        let bucket_id = s(bk, &["status", "bucketID"]);
        let line = format!(
            "  {}: claim {claim}, policy {}, bucketID {}, ready {}\n",
            sr(bk, &["metadata", "name"]),
            sr(bk, &["spec", "deletionPolicy"]),
            or_dash(&bucket_id),
            b(bk, &["status", "bucketReady"]),
        );
        Self {
            shown: Shown {
                key: key_of(bk).into(),
                line: line.into(),
            },
            bucket_id: bucket_id.into(),
        }
    }

    fn shown(&self) -> &Shown {
        &self.shown
    }

    fn shown_mut(&mut self) -> &mut Shown {
        &mut self.shown
    }
}

impl BucketView {
    /// `metadata.name`.
    pub fn name(&self) -> &str {
        let key = self.key();
        key.strip_prefix('/').unwrap_or(key)
    }
}

/// A BucketAccess.
#[derive(Default)]
pub struct AccessView {
    shown: Shown,
    /// `metadata.namespace`.
    pub namespace: Box<str>,
    /// `metadata.uid`.
    pub uid: Box<str>,
    /// `status.accountID`.
    pub account_id: Box<str>,
    /// `status.bucketID`.
    pub bucket_id: Box<str>,
    /// `spec.credentialsSecretName`.
    pub secret_name: Box<str>,
    /// `spec.bucketAccessClassName`.
    pub class: Box<str>,
    /// `status.accessGranted`.
    pub granted: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
}

impl View for AccessView {
    fn of(a: &Value) -> Self {
        let key = key_of(a);
        let account_id = s(a, &["status", "accountID"]);
        let secret_name = s(a, &["spec", "credentialsSecretName"]);
        let class = s(a, &["spec", "bucketAccessClassName"]);
        let granted = b(a, &["status", "accessGranted"]);
        let line = format!(
            "  {key}: claim {}, class {class}, account {}, granted {granted}, secret {secret_name}\n",
            sr(a, &["spec", "bucketClaimName"]),
            or_dash(&account_id),
        );
        Self {
            shown: Shown {
                key: key.into(),
                line: line.into(),
            },
            namespace: s(a, &["metadata", "namespace"]).into(),
            uid: s(a, &["metadata", "uid"]).into(),
            account_id: account_id.into(),
            bucket_id: s(a, &["status", "bucketID"]).into(),
            secret_name: secret_name.into(),
            class: class.into(),
            granted,
            deleting: !sr(a, &["metadata", "deletionTimestamp"]).is_empty(),
        }
    }

    fn shown(&self) -> &Shown {
        &self.shown
    }

    fn shown_mut(&mut self) -> &mut Shown {
        &mut self.shown
    }
}

impl AccessView {
    /// `namespace/name`.
    pub fn name(&self) -> &str {
        self.key()
    }
}

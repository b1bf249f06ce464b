//! Durable checkpoints in Kubernetes: one ConfigMap per bucket, one Secret per
//! grant (it holds the secret key), written BEFORE any backend mutation and
//! promoted only by compare-and-swap on resourceVersion. They are the proof of
//! ownership that delete and revoke require, and what a retry resumes from.
//!
//! A third kind, the key reservation (ConfigMap `key-<short hash of the access
//! key>`), makes a `preferredAccessKey` belong to at most one grant: it is
//! created with a plain create (409 = someone holds it), so two grants can
//! never both believe the key is theirs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use serde::{Deserialize, Serialize};

use crate::config::{AccessMode, Connection};
use crate::error::DriverError;
use crate::policy::{bucket_checkpoint_name, grant_checkpoint_name, key_reservation_name};

/// Label on every checkpoint: which driver wrote it.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Label: `bucket`, `grant` or `key`.
pub const LABEL_KIND: &str = "cosi-s3.drivelab.dev/kind";
/// Label on grant checkpoints: the access key (= account id), for revoke's lookup.
pub const LABEL_ACCESS_KEY: &str = "cosi-s3.drivelab.dev/access-key";
/// Annotation: the full COSI name the object is derived from.
pub const ANNOTATION_NAME: &str = "cosi-s3.drivelab.dev/name";

/// Where a checkpointed operation got to.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    /// Written, backend work not known to be complete: a retry must finish it.
    PendingCreate,
    /// Backend work complete.
    Ready,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::PendingCreate => "PendingCreate",
            State::Ready => "Ready",
        }
    }
    fn parse(s: &str) -> Option<State> {
        match s {
            "PendingCreate" => Some(State::PendingCreate),
            "Ready" => Some(State::Ready),
            _ => None,
        }
    }
}

/// Checkpoint of one bucket this driver created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketRecord {
    /// Progress.
    pub state: State,
    /// The bucket (= COSI name = bucket_id).
    pub bucket: String,
    /// Digest of the class parameters, to tell a retry from an incompatible request.
    pub params_hash: String,
    /// How to reach the backend later (delete gets no class parameters it can trust).
    pub conn: Connection,
}

/// Where a grant's policy comes from; decides whether revoke may remove it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// Generated for this grant alone: revoke removes it.
    Generated,
    /// Managed outside the driver: attached, never written or removed.
    External,
    /// The `shared-policy` mutant's class-wide policy: written by every grant, never removed.
    Shared,
}

impl PolicyKind {
    fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Generated => "generated",
            PolicyKind::External => "external",
            PolicyKind::Shared => "shared",
        }
    }
    fn parse(s: &str) -> Option<PolicyKind> {
        match s {
            "generated" => Some(PolicyKind::Generated),
            "external" => Some(PolicyKind::External),
            "shared" => Some(PolicyKind::Shared),
            _ => None,
        }
    }
}

/// What became of a grant's `preferredAccessKey`, recorded in its checkpoint so
/// that every retry answers with the key the first success answered with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreferredKey {
    /// None was asked for (or the checkpoint predates the parameter).
    NotRequested,
    /// The grant holds the reservation of this key and uses it as its access key.
    Reserved(String),
    /// This key was held by another access (or by a backend user outside COSI):
    /// the grant uses a random access key instead.
    Taken(String),
}

impl PreferredKey {
    /// The key that was asked for, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            PreferredKey::NotRequested => None,
            PreferredKey::Reserved(k) | PreferredKey::Taken(k) => Some(k),
        }
    }
}

/// Checkpoint of one grant. Debug never prints the secret key.
#[derive(Clone, PartialEq, Eq)]
pub struct GrantRecord {
    /// Progress.
    pub state: State,
    /// The COSI account name (`ba-<uid>`), the idempotency key.
    pub account_name: String,
    /// The granted bucket.
    pub bucket_id: String,
    /// Digest of bucket, auth type and class parameters.
    pub params_hash: String,
    /// Backend user's access key; also the account id returned to COSI.
    pub access_key: String,
    /// Backend user's secret key, random, persisted before add-user.
    pub secret_key: String,
    /// Canned policy attached to the user.
    pub policy_name: String,
    /// Who owns that policy.
    pub policy_kind: PolicyKind,
    /// Access mode of a generated policy.
    pub access_mode: AccessMode,
    /// How to reach the backend for revoke.
    pub conn: Connection,
    /// The preferred access key asked for and whether this grant got it.
    pub preferred: PreferredKey,
}

impl std::fmt::Debug for GrantRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantRecord")
            .field("state", &self.state)
            .field("account_name", &self.account_name)
            .field("bucket_id", &self.bucket_id)
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .field("policy_name", &self.policy_name)
            .field("policy_kind", &self.policy_kind)
            .field("preferred", &self.preferred)
            .finish_non_exhaustive()
    }
}

/// A record and the resourceVersion it was read at (the CAS token).
#[derive(Clone, Debug)]
pub struct Versioned<T> {
    /// Kubernetes object name.
    pub name: String,
    /// resourceVersion at read time.
    pub resource_version: String,
    /// The decoded record.
    pub record: T,
}

/// What a create-or-read found.
#[derive(Debug)]
pub enum Created<T> {
    /// We wrote it: nobody had started this operation before.
    New(Versioned<T>),
    /// It was there already (an earlier attempt, or a concurrent one).
    Existing(Versioned<T>),
}

/// Outcome of a compare-and-swap.
#[derive(Debug)]
pub enum Swap<T> {
    /// Written; the new version.
    Done(Versioned<T>),
    /// Someone changed or deleted it since we read it: re-read and re-decide.
    Conflict,
}

/// The checkpoint store: one namespace in one Kubernetes API.
#[derive(Clone)]
pub struct Checkpoints {
    client: kube::Client,
    namespace: String,
}

fn kube_err(what: &str, e: kube::Error) -> DriverError {
    match e {
        kube::Error::Api(s) if s.code == 403 || s.code == 401 => DriverError::FailedPrecondition(format!(
            "{what}: Kubernetes refused ({}): the driver's service account needs get/list/create/update/delete on configmaps and secrets",
            s.message
        )),
        kube::Error::Api(s) if s.code == 429 || s.code >= 500 => {
            DriverError::Unavailable(format!("{what}: Kubernetes answered {} {}; will retry", s.code, s.message))
        }
        kube::Error::Api(s) => DriverError::Internal(format!("{what}: Kubernetes answered {} {} {}", s.code, s.reason, s.message)),
        other => DriverError::Unavailable(format!("{what}: Kubernetes unreachable: {other}; will retry")),
    }
}

fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

fn meta(
    name: &str,
    namespace: &str,
    kind: &str,
    full_name: &str,
    extra_labels: &[(&str, &str)],
) -> ObjectMeta {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_MANAGED_BY.to_string(), crate::DRIVER_NAME.to_string());
    labels.insert(LABEL_KIND.to_string(), kind.to_string());
    for (k, v) in extra_labels {
        labels.insert(k.to_string(), v.to_string());
    }
    let mut annotations = BTreeMap::new();
    annotations.insert(ANNOTATION_NAME.to_string(), full_name.to_string());
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(namespace.to_string()),
        labels: Some(labels),
        annotations: Some(annotations),
        ..Default::default()
    }
}

fn field<'a>(
    data: &'a BTreeMap<String, String>,
    key: &str,
    obj: &str,
) -> Result<&'a str, DriverError> {
    data.get(key).map(String::as_str).ok_or_else(|| {
        DriverError::Internal(format!(
            "checkpoint {obj} has no `{key}`: it was edited by hand or written by another tool; inspect and delete it if it is stale"
        ))
    })
}

fn corrupt(obj: &str, key: &str) -> DriverError {
    DriverError::Internal(format!(
        "checkpoint {obj} has an invalid `{key}`; inspect and delete it if it is stale"
    ))
}

impl BucketRecord {
    fn to_data(&self) -> Result<BTreeMap<String, String>, DriverError> {
        let mut d = BTreeMap::new();
        d.insert("state".into(), self.state.as_str().into());
        d.insert("bucketName".into(), self.bucket.clone());
        d.insert("parametersHash".into(), self.params_hash.clone());
        d.insert(
            "connection".into(),
            serde_json::to_string(&self.conn).map_err(|e| DriverError::Internal(e.to_string()))?,
        );
        Ok(d)
    }

    fn from_data(obj: &str, d: &BTreeMap<String, String>) -> Result<Self, DriverError> {
        Ok(BucketRecord {
            state: State::parse(field(d, "state", obj)?).ok_or_else(|| corrupt(obj, "state"))?,
            bucket: field(d, "bucketName", obj)?.to_string(),
            params_hash: field(d, "parametersHash", obj)?.to_string(),
            conn: serde_json::from_str(field(d, "connection", obj)?)
                .map_err(|_| corrupt(obj, "connection"))?,
        })
    }
}

impl GrantRecord {
    fn to_data(&self) -> Result<BTreeMap<String, String>, DriverError> {
        let mut d = BTreeMap::new();
        d.insert("state".into(), self.state.as_str().into());
        d.insert("accountName".into(), self.account_name.clone());
        d.insert("bucketId".into(), self.bucket_id.clone());
        d.insert("parametersHash".into(), self.params_hash.clone());
        d.insert("accessKeyID".into(), self.access_key.clone());
        d.insert("accessSecretKey".into(), self.secret_key.clone());
        d.insert("policyName".into(), self.policy_name.clone());
        d.insert("policyKind".into(), self.policy_kind.as_str().into());
        d.insert(
            "accessMode".into(),
            match self.access_mode {
                AccessMode::ReadWrite => "readwrite",
                AccessMode::ReadOnly => "readonly",
            }
            .into(),
        );
        d.insert(
            "connection".into(),
            serde_json::to_string(&self.conn).map_err(|e| DriverError::Internal(e.to_string()))?,
        );
        // Only written when asked for, so checkpoints of grants without the
        // parameter look exactly as they did before it existed.
        match &self.preferred {
            PreferredKey::NotRequested => {}
            PreferredKey::Reserved(k) => {
                d.insert("preferredAccessKey".into(), k.clone());
                d.insert("preferredAccessKeyOutcome".into(), "reserved".into());
            }
            PreferredKey::Taken(k) => {
                d.insert("preferredAccessKey".into(), k.clone());
                d.insert("preferredAccessKeyOutcome".into(), "taken".into());
            }
        }
        Ok(d)
    }

    fn from_data(obj: &str, d: &BTreeMap<String, String>) -> Result<Self, DriverError> {
        let preferred = match (
            d.get("preferredAccessKey"),
            d.get("preferredAccessKeyOutcome").map(String::as_str),
        ) {
            (None, None) => PreferredKey::NotRequested,
            (Some(k), Some("reserved")) => PreferredKey::Reserved(k.clone()),
            (Some(k), Some("taken")) => PreferredKey::Taken(k.clone()),
            _ => return Err(corrupt(obj, "preferredAccessKeyOutcome")),
        };
        Ok(GrantRecord {
            state: State::parse(field(d, "state", obj)?).ok_or_else(|| corrupt(obj, "state"))?,
            account_name: field(d, "accountName", obj)?.to_string(),
            bucket_id: field(d, "bucketId", obj)?.to_string(),
            params_hash: field(d, "parametersHash", obj)?.to_string(),
            access_key: field(d, "accessKeyID", obj)?.to_string(),
            secret_key: field(d, "accessSecretKey", obj)?.to_string(),
            policy_name: field(d, "policyName", obj)?.to_string(),
            policy_kind: PolicyKind::parse(field(d, "policyKind", obj)?)
                .ok_or_else(|| corrupt(obj, "policyKind"))?,
            access_mode: match field(d, "accessMode", obj)? {
                "readwrite" => AccessMode::ReadWrite,
                "readonly" => AccessMode::ReadOnly,
                _ => return Err(corrupt(obj, "accessMode")),
            },
            conn: serde_json::from_str(field(d, "connection", obj)?)
                .map_err(|_| corrupt(obj, "connection"))?,
            preferred,
        })
    }
}

/// Whether a key reservation is in force or on its way out.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ReservationState {
    /// The named account holds the key (or is about to write the grant that uses it).
    Held,
    /// The named account's revoke has removed its backend user and is deleting
    /// its grant checkpoint; whoever finds it after that checkpoint is gone
    /// (a retried revoke) may delete it. Nobody else may take the key before.
    Releasing,
}

/// Reservation of one access key for one COSI account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyReservation {
    /// The reserved access key.
    pub access_key: String,
    /// The COSI account name (`ba-<uid>`) holding it.
    pub account_name: String,
    /// In force, or being released.
    pub state: ReservationState,
}

impl KeyReservation {
    fn to_data(&self) -> BTreeMap<String, String> {
        let mut d = BTreeMap::new();
        d.insert("accessKey".into(), self.access_key.clone());
        d.insert("accountName".into(), self.account_name.clone());
        d.insert(
            "state".into(),
            match self.state {
                ReservationState::Held => "Held",
                ReservationState::Releasing => "Releasing",
            }
            .into(),
        );
        d
    }

    fn from_data(obj: &str, d: &BTreeMap<String, String>) -> Result<Self, DriverError> {
        Ok(KeyReservation {
            access_key: field(d, "accessKey", obj)?.to_string(),
            account_name: field(d, "accountName", obj)?.to_string(),
            // Absent means Held: the safe reading (nobody may take the key).
            state: match d.get("state").map(String::as_str) {
                None | Some("Held") => ReservationState::Held,
                Some("Releasing") => ReservationState::Releasing,
                Some(_) => return Err(corrupt(obj, "state")),
            },
        })
    }
}

fn configmap_to_reservation(cm: &ConfigMap) -> Result<Versioned<KeyReservation>, DriverError> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let data = cm.data.clone().unwrap_or_default();
    Ok(Versioned {
        resource_version: cm.metadata.resource_version.clone().unwrap_or_default(),
        record: KeyReservation::from_data(&name, &data)?,
        name,
    })
}

fn configmap_to_bucket(cm: &ConfigMap) -> Result<Versioned<BucketRecord>, DriverError> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let data = cm.data.clone().unwrap_or_default();
    Ok(Versioned {
        resource_version: cm.metadata.resource_version.clone().unwrap_or_default(),
        record: BucketRecord::from_data(&name, &data)?,
        name,
    })
}

fn secret_to_grant(s: &Secret) -> Result<Versioned<GrantRecord>, DriverError> {
    let name = s.metadata.name.clone().unwrap_or_default();
    let mut data: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in s.data.clone().unwrap_or_default() {
        let v = String::from_utf8(v.0).map_err(|_| corrupt(&name, &k))?;
        data.insert(k, v);
    }
    // A Secret written with stringData by hand comes back merged into data on
    // a real API server; accept it from fakes that echo it verbatim.
    for (k, v) in s.string_data.clone().unwrap_or_default() {
        data.entry(k).or_insert(v);
    }
    Ok(Versioned {
        resource_version: s.metadata.resource_version.clone().unwrap_or_default(),
        record: GrantRecord::from_data(&name, &data)?,
        name,
    })
}

impl Checkpoints {
    /// A store in `namespace` of the API behind `client`.
    pub fn new(client: kube::Client, namespace: impl Into<String>) -> Self {
        Checkpoints {
            client,
            namespace: namespace.into(),
        }
    }

    /// The namespace checkpoints live in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn missing_namespace(&self, what: &str, e: &kube::Error) -> Option<DriverError> {
        // A 404 on create means the namespace is missing, not the object.
        (code(e) == Some(404)).then(|| {
            DriverError::FailedPrecondition(format!(
                "{what}: namespace {} does not exist; create it (it is the driver's --state-namespace)",
                self.namespace
            ))
        })
    }

    /// Read the checkpoint of `bucket`, if any.
    pub async fn get_bucket(
        &self,
        bucket: &str,
    ) -> Result<Option<Versioned<BucketRecord>>, DriverError> {
        let name = bucket_checkpoint_name(bucket);
        match self.configmaps().get_opt(&name).await {
            Ok(Some(cm)) => configmap_to_bucket(&cm).map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(kube_err(
                &format!("reading checkpoint {}/{name}", self.namespace),
                e,
            )),
        }
    }

    /// Create the checkpoint, or read the one already there (409 AlreadyExists).
    pub async fn create_bucket(
        &self,
        rec: &BucketRecord,
    ) -> Result<Created<BucketRecord>, DriverError> {
        let name = bucket_checkpoint_name(&rec.bucket);
        let cm = ConfigMap {
            metadata: meta(&name, &self.namespace, "bucket", &rec.bucket, &[]),
            data: Some(rec.to_data()?),
            ..Default::default()
        };
        let what = format!("writing checkpoint {}/{name}", self.namespace);
        match self.configmaps().create(&PostParams::default(), &cm).await {
            Ok(cm) => configmap_to_bucket(&cm).map(Created::New),
            Err(e) if code(&e) == Some(409) => match self.get_bucket(&rec.bucket).await? {
                Some(v) => Ok(Created::Existing(v)),
                // Deleted between our create and get: the caller retries.
                None => Err(DriverError::Aborted(format!(
                    "{what}: checkpoint vanished during creation; retry"
                ))),
            },
            Err(e) => Err(self
                .missing_namespace(&what, &e)
                .unwrap_or_else(|| kube_err(&what, e))),
        }
    }

    /// Replace the checkpoint if it is still at `rv`.
    pub async fn swap_bucket(
        &self,
        rv: &str,
        rec: &BucketRecord,
    ) -> Result<Swap<BucketRecord>, DriverError> {
        let name = bucket_checkpoint_name(&rec.bucket);
        let mut m = meta(&name, &self.namespace, "bucket", &rec.bucket, &[]);
        m.resource_version = Some(rv.to_string());
        let cm = ConfigMap {
            metadata: m,
            data: Some(rec.to_data()?),
            ..Default::default()
        };
        match self
            .configmaps()
            .replace(&name, &PostParams::default(), &cm)
            .await
        {
            Ok(cm) => configmap_to_bucket(&cm).map(Swap::Done),
            Err(e) if matches!(code(&e), Some(409) | Some(404)) => Ok(Swap::Conflict),
            Err(e) => Err(kube_err(
                &format!("updating checkpoint {}/{name}", self.namespace),
                e,
            )),
        }
    }

    /// Delete the checkpoint if it is still at `rv`; already gone is success.
    pub async fn delete_bucket(
        &self,
        v: &Versioned<BucketRecord>,
    ) -> Result<Swap<()>, DriverError> {
        let dp = precondition(&v.resource_version);
        match self.configmaps().delete(&v.name, &dp).await {
            Ok(_) => Ok(Swap::Done(Versioned {
                name: v.name.clone(),
                resource_version: String::new(),
                record: (),
            })),
            Err(e) if code(&e) == Some(404) => Ok(Swap::Done(Versioned {
                name: v.name.clone(),
                resource_version: String::new(),
                record: (),
            })),
            Err(e) if code(&e) == Some(409) => Ok(Swap::Conflict),
            Err(e) => Err(kube_err(
                &format!("deleting checkpoint {}/{}", self.namespace, v.name),
                e,
            )),
        }
    }

    /// Every bucket checkpoint (only the `delete-unowned` mutant needs this).
    pub async fn list_buckets(&self) -> Result<Vec<Versioned<BucketRecord>>, DriverError> {
        let lp = ListParams::default().labels(&format!("{LABEL_KIND}=bucket"));
        let list = self.configmaps().list(&lp).await.map_err(|e| {
            kube_err(
                &format!("listing bucket checkpoints in {}", self.namespace),
                e,
            )
        })?;
        list.items
            .iter()
            .filter(|cm| {
                cm.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_KIND))
                    .map(String::as_str)
                    == Some("bucket")
            })
            .map(configmap_to_bucket)
            .collect()
    }

    /// Read the checkpoint of the grant for `account_name`, if any.
    pub async fn get_grant(
        &self,
        account_name: &str,
    ) -> Result<Option<Versioned<GrantRecord>>, DriverError> {
        let name = grant_checkpoint_name(account_name);
        match self.secrets().get_opt(&name).await {
            Ok(Some(s)) => secret_to_grant(&s).map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(kube_err(
                &format!("reading checkpoint {}/{name}", self.namespace),
                e,
            )),
        }
    }

    /// Find the grant whose access key is `access_key` (revoke only gets the account id).
    pub async fn find_grant_by_access_key(
        &self,
        access_key: &str,
    ) -> Result<Option<Versioned<GrantRecord>>, DriverError> {
        let lp = ListParams::default().labels(&format!(
            "{LABEL_KIND}=grant,{LABEL_ACCESS_KEY}={access_key}"
        ));
        let list = self.secrets().list(&lp).await.map_err(|e| {
            kube_err(
                &format!("listing grant checkpoints in {}", self.namespace),
                e,
            )
        })?;
        // Filter again here: correctness must not hang on the server honouring the selector.
        for s in list.items {
            let labels = s.metadata.labels.clone().unwrap_or_default();
            if labels.get(LABEL_KIND).map(String::as_str) != Some("grant") {
                continue;
            }
            let v = secret_to_grant(&s)?;
            if v.record.access_key == access_key {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    fn grant_secret(&self, rv: Option<&str>, rec: &GrantRecord) -> Result<Secret, DriverError> {
        let name = grant_checkpoint_name(&rec.account_name);
        let mut m = meta(
            &name,
            &self.namespace,
            "grant",
            &rec.account_name,
            &[(LABEL_ACCESS_KEY, rec.access_key.as_str())],
        );
        m.resource_version = rv.map(String::from);
        let data = rec
            .to_data()?
            .into_iter()
            .map(|(k, v)| (k, ByteString(v.into_bytes())))
            .collect();
        Ok(Secret {
            metadata: m,
            type_: Some("Opaque".into()),
            data: Some(data),
            ..Default::default()
        })
    }

    /// Create the grant checkpoint, or read the one already there.
    pub async fn create_grant(
        &self,
        rec: &GrantRecord,
    ) -> Result<Created<GrantRecord>, DriverError> {
        let s = self.grant_secret(None, rec)?;
        let name = grant_checkpoint_name(&rec.account_name);
        let what = format!("writing checkpoint {}/{name}", self.namespace);
        match self.secrets().create(&PostParams::default(), &s).await {
            Ok(s) => secret_to_grant(&s).map(Created::New),
            Err(e) if code(&e) == Some(409) => match self.get_grant(&rec.account_name).await? {
                Some(v) => Ok(Created::Existing(v)),
                None => Err(DriverError::Aborted(format!(
                    "{what}: checkpoint vanished during creation; retry"
                ))),
            },
            Err(e) => Err(self
                .missing_namespace(&what, &e)
                .unwrap_or_else(|| kube_err(&what, e))),
        }
    }

    /// Replace the grant checkpoint if it is still at `rv`.
    pub async fn swap_grant(
        &self,
        rv: &str,
        rec: &GrantRecord,
    ) -> Result<Swap<GrantRecord>, DriverError> {
        let s = self.grant_secret(Some(rv), rec)?;
        let name = grant_checkpoint_name(&rec.account_name);
        match self
            .secrets()
            .replace(&name, &PostParams::default(), &s)
            .await
        {
            Ok(s) => secret_to_grant(&s).map(Swap::Done),
            Err(e) if matches!(code(&e), Some(409) | Some(404)) => Ok(Swap::Conflict),
            Err(e) => Err(kube_err(
                &format!("updating checkpoint {}/{name}", self.namespace),
                e,
            )),
        }
    }

    /// Delete the grant checkpoint if it is still at `rv`; already gone is success.
    pub async fn delete_grant(&self, v: &Versioned<GrantRecord>) -> Result<Swap<()>, DriverError> {
        let dp = precondition(&v.resource_version);
        let done = || {
            Swap::Done(Versioned {
                name: v.name.clone(),
                resource_version: String::new(),
                record: (),
            })
        };
        match self.secrets().delete(&v.name, &dp).await {
            Ok(_) => Ok(done()),
            Err(e) if code(&e) == Some(404) => Ok(done()),
            Err(e) if code(&e) == Some(409) => Ok(Swap::Conflict),
            Err(e) => Err(kube_err(
                &format!("deleting checkpoint {}/{}", self.namespace, v.name),
                e,
            )),
        }
    }

    fn reservation_configmap(&self, rv: Option<&str>, rec: &KeyReservation) -> ConfigMap {
        let name = key_reservation_name(&rec.access_key);
        let mut m = meta(&name, &self.namespace, "key", &rec.access_key, &[]);
        m.resource_version = rv.map(String::from);
        ConfigMap {
            metadata: m,
            data: Some(rec.to_data()),
            ..Default::default()
        }
    }

    /// Read the reservation of `access_key`, if any.
    pub async fn get_key_reservation(
        &self,
        access_key: &str,
    ) -> Result<Option<Versioned<KeyReservation>>, DriverError> {
        let name = key_reservation_name(access_key);
        match self.configmaps().get_opt(&name).await {
            Ok(Some(cm)) => {
                let v = configmap_to_reservation(&cm)?;
                // Names are a truncated hash: a different key behind the same name
                // is a collision, and treating it as "held" is the safe reading.
                if v.record.access_key != access_key {
                    return Err(DriverError::Internal(format!(
                        "key reservation {}/{name} is for another access key (a hash collision or a hand edit); inspect it",
                        self.namespace
                    )));
                }
                Ok(Some(v))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(kube_err(
                &format!("reading key reservation {}/{name}", self.namespace),
                e,
            )),
        }
    }

    /// Reserve a key: create the reservation (201: `New`, it is ours), or read
    /// the one already there (409: `Existing`, whoever it names holds it).
    pub async fn create_key_reservation(
        &self,
        rec: &KeyReservation,
    ) -> Result<Created<KeyReservation>, DriverError> {
        let cm = self.reservation_configmap(None, rec);
        let name = key_reservation_name(&rec.access_key);
        let what = format!("writing key reservation {}/{name}", self.namespace);
        match self.configmaps().create(&PostParams::default(), &cm).await {
            Ok(cm) => configmap_to_reservation(&cm).map(Created::New),
            Err(e) if code(&e) == Some(409) => {
                match self.get_key_reservation(&rec.access_key).await? {
                    Some(v) => Ok(Created::Existing(v)),
                    // Released between our create and get: the caller retries.
                    None => Err(DriverError::Aborted(format!(
                        "{what}: reservation vanished during creation; retry"
                    ))),
                }
            }
            Err(e) => Err(self
                .missing_namespace(&what, &e)
                .unwrap_or_else(|| kube_err(&what, e))),
        }
    }

    /// Replace the reservation if it is still at `rv`.
    pub async fn swap_key_reservation(
        &self,
        rv: &str,
        rec: &KeyReservation,
    ) -> Result<Swap<KeyReservation>, DriverError> {
        let cm = self.reservation_configmap(Some(rv), rec);
        let name = key_reservation_name(&rec.access_key);
        match self
            .configmaps()
            .replace(&name, &PostParams::default(), &cm)
            .await
        {
            Ok(cm) => configmap_to_reservation(&cm).map(Swap::Done),
            Err(e) if matches!(code(&e), Some(409) | Some(404)) => Ok(Swap::Conflict),
            Err(e) => Err(kube_err(
                &format!("updating key reservation {}/{name}", self.namespace),
                e,
            )),
        }
    }

    /// Delete the reservation if it is still at the version read; already gone is success.
    pub async fn delete_key_reservation(
        &self,
        v: &Versioned<KeyReservation>,
    ) -> Result<Swap<()>, DriverError> {
        // Never unconditional: the key may have been released and taken by
        // another account since we read it, and that reservation is not ours.
        let dp = precondition(&v.resource_version);
        let done = || {
            Swap::Done(Versioned {
                name: v.name.clone(),
                resource_version: String::new(),
                record: (),
            })
        };
        match self.configmaps().delete(&v.name, &dp).await {
            Ok(_) => Ok(done()),
            Err(e) if code(&e) == Some(404) => Ok(done()),
            Err(e) if code(&e) == Some(409) => Ok(Swap::Conflict),
            Err(e) => Err(kube_err(
                &format!("deleting key reservation {}/{}", self.namespace, v.name),
                e,
            )),
        }
    }

    /// Read the admin credentials Secret named by the class parameters.
    pub async fn admin_credentials(
        &self,
        conn: &Connection,
    ) -> Result<crate::admin::AdminCreds, DriverError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &conn.secret_namespace);
        let what = format!(
            "admin Secret {}/{}",
            conn.secret_namespace, conn.secret_name
        );
        let s = match api.get_opt(&conn.secret_name).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Err(DriverError::FailedPrecondition(format!(
                    "{what} (class parameters objectStoreUserSecretNamespace/objectStoreUserSecretName) does not exist; create it with keys accessKey and secretKey"
                )))
            }
            Err(e) => return Err(kube_err(&format!("reading {what}"), e)),
        };
        let get = |key: &str| -> Result<String, DriverError> {
            let raw = s
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|b| b.0.clone())
                .or_else(|| {
                    s.string_data
                        .as_ref()
                        .and_then(|d| d.get(key))
                        .map(|v| v.clone().into_bytes())
                });
            match raw.map(String::from_utf8) {
                Some(Ok(v)) if !v.trim().is_empty() => Ok(v.trim().to_string()),
                Some(Ok(_)) | None => Err(DriverError::FailedPrecondition(format!(
                    "{what} has no key `{key}`; it needs keys accessKey and secretKey"
                ))),
                Some(Err(_)) => Err(DriverError::FailedPrecondition(format!(
                    "{what}: key `{key}` is not UTF-8"
                ))),
            }
        };
        Ok(crate::admin::AdminCreds {
            access_key: get("accessKey")?,
            secret_key: get("secretKey")?,
        })
    }
}

fn precondition(rv: &str) -> DeleteParams {
    let mut dp = DeleteParams::default();
    if !rv.is_empty() {
        dp.preconditions = Some(Preconditions {
            resource_version: Some(rv.to_string()),
            uid: None,
        });
    }
    dp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AdminApi;

    fn conn() -> Connection {
        Connection {
            endpoint: "http://127.0.0.1:9000".into(),
            secret_name: "admin".into(),
            secret_namespace: "default".into(),
            region: "us-east-1".into(),
            admin_api: AdminApi::Rustfs,
        }
    }

    #[test]
    fn grant_record_round_trips_and_hides_the_secret() {
        let rec = GrantRecord {
            state: State::PendingCreate,
            account_name: "ba-1".into(),
            bucket_id: "bucket-1".into(),
            params_hash: "h".into(),
            access_key: "AK".into(),
            secret_key: "super-secret-value".into(),
            policy_name: "cosi-x".into(),
            policy_kind: PolicyKind::Generated,
            access_mode: AccessMode::ReadOnly,
            conn: conn(),
            preferred: PreferredKey::NotRequested,
        };
        let d = rec.to_data().unwrap();
        assert_eq!(GrantRecord::from_data("o", &d).unwrap(), rec);
        assert!(
            !d.contains_key("preferredAccessKey"),
            "no new keys for grants without the parameter"
        );
        for p in [
            PreferredKey::Reserved("TEAMKEY".into()),
            PreferredKey::Taken("TEAMKEY".into()),
        ] {
            let r = GrantRecord {
                preferred: p,
                ..rec.clone()
            };
            assert_eq!(
                GrantRecord::from_data("o", &r.to_data().unwrap()).unwrap(),
                r
            );
        }
        let mut half = d.clone();
        half.insert("preferredAccessKey".into(), "TEAMKEY".into());
        assert!(
            GrantRecord::from_data("o", &half).is_err(),
            "a key without an outcome is corrupt"
        );
        assert!(!format!("{rec:?}").contains("super-secret-value"));
        let mut broken = d.clone();
        broken.remove("accessSecretKey");
        assert!(
            matches!(GrantRecord::from_data("o", &broken), Err(DriverError::Internal(s)) if s.contains("accessSecretKey"))
        );
    }

    #[test]
    fn key_reservation_round_trips() {
        for state in [ReservationState::Held, ReservationState::Releasing] {
            let r = KeyReservation {
                access_key: "TEAMKEY".into(),
                account_name: "ba-1".into(),
                state,
            };
            assert_eq!(KeyReservation::from_data("o", &r.to_data()).unwrap(), r);
        }
        let mut d = BTreeMap::new();
        d.insert("accessKey".to_string(), "K".to_string());
        d.insert("accountName".to_string(), "ba-1".to_string());
        assert_eq!(
            KeyReservation::from_data("o", &d).unwrap().state,
            ReservationState::Held
        );
        d.insert("state".to_string(), "Gone".to_string());
        assert!(KeyReservation::from_data("o", &d).is_err());
    }

    #[test]
    fn bucket_record_round_trips() {
        let rec = BucketRecord {
            state: State::Ready,
            bucket: "bucket-1".into(),
            params_hash: "h".into(),
            conn: conn(),
        };
        assert_eq!(
            BucketRecord::from_data("o", &rec.to_data().unwrap()).unwrap(),
            rec
        );
    }
}

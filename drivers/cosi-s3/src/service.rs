//! The COSI v1alpha1 Identity and Provisioner services. Every mutating call
//! follows one shape: validate, checkpoint (PendingCreate) in Kubernetes,
//! backend work that is safe to repeat, promote by compare-and-swap. The
//! seeded bugs (`Mutant`) are small, marked detours from that shape.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use drivelab_proto::cosi::{
    identity_server::Identity, protocol, provisioner_server::Provisioner, AuthenticationType,
    CredentialDetails, DriverCreateBucketRequest, DriverCreateBucketResponse,
    DriverDeleteBucketRequest, DriverDeleteBucketResponse, DriverGetInfoRequest,
    DriverGetInfoResponse, DriverGrantBucketAccessRequest, DriverGrantBucketAccessResponse,
    DriverRevokeBucketAccessRequest, DriverRevokeBucketAccessResponse, Protocol,
    S3SignatureVersion, S3,
};
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use rand::rngs::OsRng;
use rand::TryRngCore;
use sha2::{Digest, Sha256};
use tonic::{Request, Response, Status};

use crate::admin::{
    self, Backend, BackendError, BUCKET_ALREADY_EXISTS, BUCKET_ALREADY_OWNED_BY_YOU,
    BUCKET_NOT_EMPTY, CALL_TIMEOUT,
};
use crate::checkpoint::{
    BucketRecord, Checkpoints, Created, GrantRecord, KeyReservation, PolicyKind, PreferredKey,
    ReservationState, State, Swap,
};
use crate::config::{
    check_map, check_string, params_hash, parse_access, parse_connection, validate_bucket_name,
    Connection, DriverConfig, Mutant, PolicyLayout,
};
use crate::error::DriverError;
use crate::policy::{
    generated_policy_name, owner_marker_document, owner_marker_policy_name, policy_document,
    same_document, SHARED_POLICY_FALLBACK,
};

/// Compare-and-swap rounds before giving up with Aborted (the sidecar retries).
const MAX_CAS_ROUNDS: usize = 8;
/// Length of generated access keys (uppercase letters and digits: ~103 bits).
pub const ACCESS_KEY_LEN: usize = 20;
/// Length of generated secret keys (letters and digits: ~238 bits).
pub const SECRET_KEY_LEN: usize = 40;

/// How a new grant's access key was chosen.
enum KeyChoice {
    /// Use this key; `preferred` is what goes into the checkpoint.
    Use {
        access_key: String,
        preferred: PreferredKey,
    },
    /// A concurrent call for the same account wrote the checkpoint meanwhile: re-read it.
    Reread,
}

/// The reference COSI driver. Cheap to clone; clones share one state.
#[derive(Clone)]
pub struct CosiS3Driver {
    inner: Arc<Inner>,
}

struct Inner {
    config: DriverConfig,
    store: Checkpoints,
    http: Client<HttpConnector, Full<Bytes>>,
    /// The wall clock, when not the system's (a lab's virtual one).
    wall_clock: std::sync::OnceLock<WallClock>,
    /// The `same-secret-every-access` mutant's one secret, drawn on first use.
    process_secret: std::sync::OnceLock<String>,
}

/// The certificates (DER) of a PEM file: the CA a pod's `ca.crt` holds.
fn read_ca(path: &str) -> anyhow::Result<Vec<Vec<u8>>> {
    use rustls_pki_types::{pem::PemObject as _, CertificateDer};
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading the Kubernetes API's CA file {path:?}"))?
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{path:?}: a certificate is not valid PEM"))?;
    if certs.is_empty() {
        anyhow::bail!("{path:?} holds no PEM certificate");
    }
    Ok(certs)
}

/// A source of wall-clock time (the system's unless [`CosiS3Driver::set_wall_clock`]).
pub type WallClock = Arc<dyn Fn() -> std::time::SystemTime + Send + Sync>;

impl CosiS3Driver {
    /// Build a driver. Does not contact Kubernetes or the backend yet (both are
    /// per call), so it starts even while the lab's fakes are still coming up.
    pub async fn new(config: DriverConfig) -> anyhow::Result<Self> {
        let mut kc = if config.kube_url.is_empty() {
            // No URL: the normal kube-rs path (KUBECONFIG, ~/.kube/config, in-cluster).
            kube::Config::infer().await.context(
                "no --kube-url/KUBE_URL given, and no Kubernetes config found (KUBECONFIG, ~/.kube/config)",
            )?
        } else {
            let uri: http::Uri = config.kube_url.parse().with_context(|| {
                format!(
                    "--kube-url {:?} is not a URL; use https://host:port",
                    config.kube_url
                )
            })?;
            if !matches!(uri.scheme_str(), Some("http" | "https")) {
                anyhow::bail!(
                    "--kube-url {:?}: use https://host:port (or http:// for a test server)",
                    config.kube_url
                );
            }
            let mut kc = kube::Config::new(uri);
            if !config.kube_token_file.is_empty() {
                // Read (and re-read when it changes) by kube-rs, as in a pod.
                kc.auth_info.token_file = Some(config.kube_token_file.clone());
            }
            if !config.kube_ca_file.is_empty() {
                kc.root_cert = Some(read_ca(&config.kube_ca_file)?);
            }
            kc
        };
        kc.default_namespace = config.state_namespace().to_string();
        kc.connect_timeout = Some(CALL_TIMEOUT);
        kc.read_timeout = Some(CALL_TIMEOUT);
        kc.write_timeout = Some(CALL_TIMEOUT);
        let client = kube::Client::try_from(kc).context("building the Kubernetes client")?;
        let store = Checkpoints::new(client, config.state_namespace());
        Ok(CosiS3Driver {
            inner: Arc::new(Inner {
                config,
                store,
                http: admin::http_client(),
                wall_clock: std::sync::OnceLock::new(),
                process_secret: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Read wall-clock time from `clock` instead of the system (a lab's
    /// virtual clock). Only the first call counts.
    pub fn set_wall_clock(&self, clock: WallClock) {
        let _ = self.inner.wall_clock.set(clock);
    }

    fn wall_now(&self) -> std::time::SystemTime {
        match self.inner.wall_clock.get() {
            Some(c) => c(),
            None => std::time::SystemTime::now(),
        }
    }

    /// The configuration the driver runs with.
    /// A random secret key of the configured length.
    fn fresh_secret(&self) -> Result<String, DriverError> {
        random_secret_of(self.config().secret_length())
    }

    pub fn config(&self) -> &DriverConfig {
        &self.inner.config
    }

    fn mutant(&self, m: Mutant) -> bool {
        let on = self.inner.config.has(m);
        if on {
            tracing::warn!(mutant = m.name(), "seeded bug active");
        }
        on
    }

    async fn backend(&self, conn: &Connection) -> Result<Backend, DriverError> {
        let creds = self.inner.store.admin_credentials(conn).await?;
        Ok(Backend::new(self.inner.http.clone(), conn.clone(), creds))
    }

    async fn create_bucket(
        &self,
        req: DriverCreateBucketRequest,
    ) -> Result<DriverCreateBucketResponse, DriverError> {
        check_string("name", &req.name, true)?;
        check_map("parameters", &req.parameters)?;
        validate_bucket_name("name", &req.name)?;
        let name = req.name.as_str();
        let conn = parse_connection(&req.parameters)?;
        let hash = params_hash(&[], &req.parameters);
        let backend = self.backend(&conn).await?;
        let be = |e: BackendError| e.into_driver(&conn);
        let store = &self.inner.store;
        let want = BucketRecord {
            state: State::PendingCreate,
            bucket: name.to_string(),
            params_hash: hash.clone(),
            conn: conn.clone(),
        };

        // MUTANT bucket-before-checkpoint: set once the bucket was made ahead of its checkpoint.
        let mut created_first = false;
        for _ in 0..MAX_CAS_ROUNDS {
            // `fresh`: this call wrote the checkpoint, so no earlier attempt of
            // ours can have created the bucket.
            let (v, fresh) = match store.get_bucket(name).await? {
                Some(v) => (v, false),
                None => {
                    // MUTANT already-exists-is-success: skips the ownership check.
                    if !self.mutant(Mutant::AlreadyExistsIsSuccess)
                        && backend.bucket_exists(name).await.map_err(be)?
                    {
                        return Err(not_ours(name, &conn));
                    }
                    // MUTANT bucket-before-checkpoint: the PUT before the
                    // checkpoint that proves the bucket ours.
                    if self.mutant(Mutant::BucketBeforeCheckpoint) && !created_first {
                        backend.create_bucket(name).await.map_err(be)?;
                        created_first = true;
                    }
                    match store.create_bucket(&want).await? {
                        Created::New(v) => (v, true),
                        Created::Existing(v) => (v, false),
                    }
                }
            };
            // MUTANT ignore-incompatible-params: answers OK for a different request.
            if v.record.params_hash != hash && !self.mutant(Mutant::IgnoreIncompatibleParams) {
                return Err(DriverError::AlreadyExists(format!(
                    "bucket {name} was already created with different parameters (checkpoint {}/{}); a new BucketClaim gets a new name, or restore the original class parameters",
                    store.namespace(),
                    v.name
                )));
            }
            let response = bucket_response(name, &v.record.conn);
            if v.record.state == State::Ready {
                return Ok(response);
            }

            let put = if created_first {
                Ok(())
            } else {
                backend.create_bucket(name).await
            };
            match put {
                Ok(()) => {}
                Err(e) if e.is(&[BUCKET_ALREADY_OWNED_BY_YOU, BUCKET_ALREADY_EXISTS]) => {
                    if self.mutant(Mutant::AlreadyExistsIsSuccess) {
                        // MUTANT already-exists-is-success: adopt whatever is there.
                    } else if fresh || e.is(&[BUCKET_ALREADY_EXISTS]) {
                        // Appeared after our HEAD, or owned by another account:
                        // not ours. Withdraw the checkpoint so that delete can
                        // never treat it as proof of ownership.
                        if let Err(err) = store.delete_bucket(&v).await {
                            tracing::warn!(bucket = name, error = %err, "could not withdraw checkpoint of a foreign bucket");
                        }
                        return Err(not_ours(name, &conn));
                    }
                    // else: an earlier attempt of ours got as far as the PUT.
                }
                Err(e) => return Err(be(e)),
            }

            let mut ready = v.record.clone();
            ready.state = State::Ready;
            match store.swap_bucket(&v.resource_version, &ready).await? {
                Swap::Done(_) => {
                    tracing::info!(bucket = name, "bucket created");
                    return Ok(response);
                }
                Swap::Conflict => continue,
            }
        }
        Err(cas_exhausted(name))
    }

    async fn delete_bucket(
        &self,
        req: DriverDeleteBucketRequest,
    ) -> Result<DriverDeleteBucketResponse, DriverError> {
        check_string("bucket_id", &req.bucket_id, true)?;
        check_map("delete_context", &req.delete_context)?;
        let id = req.bucket_id.as_str();
        let store = &self.inner.store;

        let mut current = store.get_bucket(id).await?;
        for _ in 0..MAX_CAS_ROUNDS {
            let Some(v) = current else {
                return self
                    .delete_without_checkpoint(id, &req.delete_context)
                    .await;
            };
            let conn = v.record.conn.clone();
            let backend = self.backend(&conn).await?;
            match backend.delete_bucket(id).await {
                Ok(()) => {}
                Err(e) if e.is(&[BUCKET_NOT_EMPTY]) => {
                    return Err(DriverError::FailedPrecondition(format!(
                        "bucket {id} is not empty ({}); empty it, the delete will be retried",
                        e.message()
                    )))
                }
                Err(e) => return Err(e.into_driver(&conn)),
            }
            if self.mutant(Mutant::DeletePrefixBuckets) {
                // MUTANT delete-prefix-buckets: "companions" by name prefix, whoever owns them.
                for other in backend.list_buckets().await.unwrap_or_default() {
                    if other != id && other.starts_with(id) {
                        let _ = backend.delete_bucket(&other).await;
                    }
                }
            }
            match store.delete_bucket(&v).await? {
                Swap::Done(_) => {
                    tracing::info!(bucket = id, "bucket deleted");
                    return Ok(DriverDeleteBucketResponse {});
                }
                Swap::Conflict => current = store.get_bucket(id).await?,
            }
        }
        Err(cas_exhausted(id))
    }

    /// No checkpoint: this driver never created the bucket, or already deleted it.
    async fn delete_without_checkpoint(
        &self,
        id: &str,
        context: &HashMap<String, String>,
    ) -> Result<DriverDeleteBucketResponse, DriverError> {
        if self.mutant(Mutant::DeleteUnowned) {
            // MUTANT delete-unowned: deletes without proof of ownership, on the
            // backend named by the context or, like the field driver's shared
            // class parameters, by any bucket it did create.
            let conn = match parse_connection(context) {
                Ok(c) => Some(c),
                Err(_) => self
                    .inner
                    .store
                    .list_buckets()
                    .await?
                    .into_iter()
                    .next()
                    .map(|v| v.record.conn),
            };
            if let Some(conn) = conn {
                let backend = self.backend(&conn).await?;
                backend
                    .delete_bucket(id)
                    .await
                    .map_err(|e| e.into_driver(&conn))?;
            }
            return Ok(DriverDeleteBucketResponse {});
        }
        // Without connection parameters there is nothing we could have created
        // there: answer OK, as for any bucket that is gone.
        let Ok(conn) = parse_connection(context) else {
            tracing::info!(bucket = id, "delete: no checkpoint and no connection in delete_context; nothing of ours to delete");
            return Ok(DriverDeleteBucketResponse {});
        };
        let backend = self.backend(&conn).await?;
        if backend
            .bucket_exists(id)
            .await
            .map_err(|e| e.into_driver(&conn))?
        {
            return Err(DriverError::FailedPrecondition(format!(
                "bucket {id} exists on {} but this driver holds no checkpoint for it, so it did not create it (a static or foreign bucket): refusing to delete it; delete it by hand if it really should go",
                conn.endpoint
            )));
        }
        Ok(DriverDeleteBucketResponse {})
    }

    async fn grant(
        &self,
        req: DriverGrantBucketAccessRequest,
    ) -> Result<DriverGrantBucketAccessResponse, DriverError> {
        check_string("bucket_id", &req.bucket_id, true)?;
        check_string("name", &req.name, true)?;
        check_map("parameters", &req.parameters)?;
        match AuthenticationType::try_from(req.authentication_type) {
            Ok(AuthenticationType::Key) => {}
            Ok(AuthenticationType::Iam) => {
                return Err(DriverError::Unimplemented(
                    "authenticationType IAM is not supported by this driver (the backend has no workload identity federation); use Key in the BucketAccessClass".into(),
                ))
            }
            // MUTANT unknown-auth-as-key: treats an unset auth type as Key.
            _ if self.mutant(Mutant::UnknownAuthAsKey) => {}
            _ => {
                return Err(DriverError::InvalidArgument(format!(
                    "authentication_type {} is not Key or IAM; set authenticationType: Key in the BucketAccessClass",
                    req.authentication_type
                )))
            }
        }
        let name = req.name.as_str();
        let bucket = req.bucket_id.as_str();
        let ap = parse_access(&req.parameters)?;
        let conn = ap.conn.clone();
        let hash = params_hash(
            &[("bucketId", bucket), ("authenticationType", "Key")],
            &req.parameters,
        );
        let backend = self.backend(&conn).await?;
        let be = |e: BackendError| e.into_driver(&conn);
        let store = &self.inner.store;

        // Read-only checks first: nothing below may mutate before the checkpoint.
        if !backend.bucket_exists(bucket).await.map_err(be)? {
            return Err(DriverError::NotFound(format!(
                "bucket {bucket} does not exist on {}; create the bucket first",
                conn.endpoint
            )));
        }
        let (policy_name, policy_kind) = if self.mutant(Mutant::SharedPolicy) {
            // MUTANT shared-policy: one class-wide policy, replaced by every grant.
            (
                ap.policy
                    .clone()
                    .unwrap_or_else(|| SHARED_POLICY_FALLBACK.to_string()),
                PolicyKind::Shared,
            )
        } else if let Some(p) = &ap.policy {
            if backend.info_canned_policy(p).await.map_err(be)?.is_none() {
                return Err(DriverError::InvalidArgument(format!(
                    "BucketAccessClass parameter `policy` names canned policy {p}, which does not exist on {}; it is managed outside this driver, so create it first",
                    conn.endpoint
                )));
            }
            (p.clone(), PolicyKind::External)
        } else {
            (generated_policy_name(name), PolicyKind::Generated)
        };

        for _ in 0..MAX_CAS_ROUNDS {
            let mut created_now = false;
            let v = match store.get_grant(name).await? {
                Some(v) => v,
                None => {
                    let (access_key, preferred) = if self.mutant(Mutant::UserBeforeCheckpoint) {
                        (derived_access_key(name), PreferredKey::NotRequested)
                    } else {
                        match self
                            .choose_access_key(&backend, name, ap.preferred_access_key.as_deref())
                            .await?
                        {
                            KeyChoice::Use {
                                access_key,
                                preferred,
                            } => (access_key, preferred),
                            KeyChoice::Reread => continue,
                        }
                    };
                    let secret_key = self.new_secret(name)?;
                    let rec = GrantRecord {
                        state: State::PendingCreate,
                        account_name: name.to_string(),
                        bucket_id: bucket.to_string(),
                        params_hash: hash.clone(),
                        access_key,
                        secret_key,
                        policy_name: policy_name.clone(),
                        policy_kind,
                        access_mode: ap.access_mode,
                        conn: conn.clone(),
                        preferred,
                    };
                    if self.mutant(Mutant::UserBeforeCheckpoint) {
                        // MUTANT user-before-checkpoint: the backend mutation
                        // comes first, and a user without a checkpoint is
                        // mistaken for someone else's — stuck after a crash.
                        if backend
                            .user_info(&rec.access_key)
                            .await
                            .map_err(be)?
                            .is_some()
                        {
                            return Err(DriverError::AlreadyExists(format!(
                                "user {} already exists on the backend",
                                rec.access_key
                            )));
                        }
                        backend
                            .add_user(&rec.access_key, &rec.secret_key)
                            .await
                            .map_err(be)?;
                    }
                    match store.create_grant(&rec).await? {
                        Created::New(v) => {
                            created_now = true;
                            v
                        }
                        Created::Existing(v) => {
                            // A concurrent call for this account won the checkpoint. If
                            // we reserved the key and its record does not use it, our
                            // reservation would hold the key for nobody: give it back.
                            if let PreferredKey::Reserved(k) = &rec.preferred {
                                if v.record.preferred != rec.preferred {
                                    self.release_key(k, name).await?;
                                }
                            }
                            v
                        }
                    }
                }
            };
            // MUTANT ignore-incompatible-params: answers OK for a different request.
            if (v.record.bucket_id != bucket || v.record.params_hash != hash)
                && !self.mutant(Mutant::IgnoreIncompatibleParams)
            {
                return Err(DriverError::AlreadyExists(format!(
                    "access {name} was already granted for bucket {} with different parameters (checkpoint {}/{}); revoke it first or restore the original request",
                    v.record.bucket_id,
                    store.namespace(),
                    v.name
                )));
            }

            let mut rec = v.record.clone();
            let mut rv = v.resource_version.clone();
            let mut rotated = false;
            if !created_now && self.mutant(Mutant::RotateOnRetry) {
                // MUTANT rotate-on-retry: a retry mints a new secret, killing
                // the credentials already handed out.
                rec.secret_key = self.fresh_secret()?;
                match store.swap_grant(&rv, &rec).await? {
                    Swap::Done(nv) => rv = nv.resource_version,
                    Swap::Conflict => continue,
                }
                rotated = true;
            }

            self.reconcile_grant(&backend, &rec, rec.state == State::PendingCreate || rotated)
                .await
                .map_err(be)?;

            if rec.state != State::Ready {
                rec.state = State::Ready;
                match store.swap_grant(&rv, &rec).await? {
                    Swap::Done(_) => {}
                    // Someone else moved it (a concurrent retry promoting it, or a
                    // revoke): re-read and re-decide.
                    Swap::Conflict => continue,
                }
            }
            tracing::info!(account = name, bucket, access_key = %rec.access_key, "access granted");
            return Ok(grant_response(&rec));
        }
        Err(cas_exhausted(name))
    }

    /// Bring the backend to what the checkpoint says, touching only what is
    /// missing. `force_user` re-runs add-user with the persisted secret, which
    /// is harmless for a user that already has it.
    async fn reconcile_grant(
        &self,
        backend: &Backend,
        rec: &GrantRecord,
        force_user: bool,
    ) -> Result<(), BackendError> {
        let info = backend.user_info(&rec.access_key).await?;
        if info.is_none() || force_user {
            backend.add_user(&rec.access_key, &rec.secret_key).await?;
        }
        // MUTANT read-only-gets-write: the read-write document whatever the mode.
        let mode = if self.mutant(Mutant::ReadOnlyGetsWrite) {
            crate::config::AccessMode::ReadWrite
        } else {
            rec.access_mode
        };
        let want = policy_document(&rec.bucket_id, mode);
        match rec.policy_kind {
            PolicyKind::Generated => match backend.info_canned_policy(&rec.policy_name).await? {
                Some(doc) if same_document(&doc, &want) => {}
                _ => backend.add_canned_policy(&rec.policy_name, &want).await?,
            },
            // MUTANT shared-policy: replaces a document other grants rely on.
            PolicyKind::Shared => backend.add_canned_policy(&rec.policy_name, &want).await?,
            // MUTANT rewrite-external-policy: writes over a policy someone else manages.
            PolicyKind::External if self.mutant(Mutant::RewriteExternalPolicy) => {
                backend.add_canned_policy(&rec.policy_name, &want).await?
            }
            PolicyKind::External => {}
        }
        let mut wanted = vec![rec.policy_name.clone()];
        if let Some(marker) = self.owner_marker(&rec.account_name) {
            let doc = owner_marker_document(&rec.bucket_id);
            match backend.info_canned_policy(&marker).await? {
                Some(found) if same_document(&found, &doc) => {}
                _ => backend.add_canned_policy(&marker, &doc).await?,
            }
            wanted.push(marker);
        }
        let attached = info
            .as_ref()
            .is_some_and(|i| wanted.iter().all(|w| i.policies.contains(w)));
        if !attached {
            // set-user-or-group-policy replaces the user's set, so name them all.
            backend
                .set_user_policy(&wanted.join(","), &rec.access_key)
                .await?;
        }
        Ok(())
    }

    /// The owner-marker policy of `account_name`, when the configured layout keeps one.
    fn owner_marker(&self, account_name: &str) -> Option<String> {
        match self.config().policy_layout {
            PolicyLayout::PerGrant => None,
            PolicyLayout::PerGrantWithOwnerMarker => Some(owner_marker_policy_name(account_name)),
        }
    }

    async fn revoke(
        &self,
        req: DriverRevokeBucketAccessRequest,
    ) -> Result<DriverRevokeBucketAccessResponse, DriverError> {
        check_string("bucket_id", &req.bucket_id, true)?;
        check_string("account_id", &req.account_id, true)?;
        check_map("revoke_access_context", &req.revoke_access_context)?;
        if self.mutant(Mutant::RevokeNeedsParameter) {
            // MUTANT revoke-needs-parameter: demands a key the v0.2 sidecar
            // never sends, so a well-formed revoke is refused for ever.
            return Err(DriverError::InvalidArgument(
                "revoke_access_context: missing required key \"grantPolicy\"".into(),
            ));
        }
        let account = req.account_id.as_str();
        let store = &self.inner.store;
        for _ in 0..MAX_CAS_ROUNDS {
            let Some(v) = store.find_grant_by_access_key(account).await? else {
                // Gone already (the sidecar retries revoke on any error, so an
                // earlier attempt may have finished, or got as far as the
                // checkpoint and not the key reservation).
                self.release_orphaned_key(account).await?;
                return Ok(DriverRevokeBucketAccessResponse {});
            };
            if v.record.bucket_id != req.bucket_id {
                return Err(DriverError::FailedPrecondition(format!(
                    "account {account} was granted on bucket {}, not {}; refusing to revoke (checkpoint {}/{})",
                    v.record.bucket_id,
                    req.bucket_id,
                    store.namespace(),
                    v.name
                )));
            }
            let conn = v.record.conn.clone();
            let backend = self.backend(&conn).await?;
            let be = |e: BackendError| e.into_driver(&conn);
            let account_name = v.record.account_name.as_str();
            // The user first: with it gone the policy grants nothing, and
            // servers that refuse to remove an attached policy are satisfied.
            backend
                .remove_user(&v.record.access_key)
                .await
                .map_err(be)?;
            // MUTANT policy-after-forget: the policies go after the checkpoint.
            let forget_first = self.mutant(Mutant::PolicyAfterForget);
            if !forget_first {
                self.remove_policies(&backend, &v.record)
                    .await
                    .map_err(be)?;
            }
            match &v.record.preferred {
                // The key must stay reserved until this checkpoint is gone: while
                // it exists a retried revoke looks the grant up by this key, and
                // if another grant had the key by then it would find (and revoke)
                // that one. Marking it Releasing lets the retry after a crash
                // between the two deletes finish the release (see below).
                PreferredKey::Reserved(k) => self.mark_key_releasing(k, account_name).await?,
                // A stray reservation of ours (a lost race of our own retries) for a
                // key this grant does not use: nothing depends on it, drop it now.
                PreferredKey::Taken(k) => self.release_key(k, account_name).await?,
                PreferredKey::NotRequested => {}
            }
            match store.delete_grant(&v).await? {
                Swap::Done(_) => {
                    if forget_first {
                        self.remove_policies(&backend, &v.record)
                            .await
                            .map_err(be)?;
                    }
                    if let PreferredKey::Reserved(k) = &v.record.preferred {
                        self.release_key(k, account_name).await?;
                    }
                    tracing::info!(account = %account_name, access_key = account, "access revoked");
                    return Ok(DriverRevokeBucketAccessResponse {});
                }
                Swap::Conflict => continue,
            }
        }
        Err(cas_exhausted(account))
    }

    /// Remove the policies a revoked grant made: its generated access policy
    /// (an external one is not ours) and the owner marker of that layout.
    async fn remove_policies(
        &self,
        backend: &Backend,
        rec: &GrantRecord,
    ) -> Result<(), BackendError> {
        if rec.policy_kind == PolicyKind::Generated {
            backend.remove_canned_policy(&rec.policy_name).await?;
        }
        if let Some(marker) = self.owner_marker(&rec.account_name) {
            backend.remove_canned_policy(&marker).await?;
        }
        Ok(())
    }

    /// Choose the access key of a new grant, before its checkpoint is written.
    /// With a preferred key, reserve it first (a create: exactly one account
    /// can win), so that no two grants ever run add-user on one access key:
    /// on MinIO that silently replaces the first grant's secret.
    async fn choose_access_key(
        &self,
        backend: &Backend,
        account: &str,
        preferred: Option<&str>,
    ) -> Result<KeyChoice, DriverError> {
        let Some(key) = preferred else {
            return Ok(KeyChoice::Use {
                access_key: random_access_key()?,
                preferred: PreferredKey::NotRequested,
            });
        };
        if self.mutant(Mutant::SharedPreferredKey) {
            // MUTANT shared-preferred-key: takes the key without reserving it or
            // looking at the backend, so every grant asking for it shares it.
            return Ok(KeyChoice::Use {
                access_key: key.to_string(),
                preferred: PreferredKey::NotRequested,
            });
        }
        let store = &self.inner.store;
        let want = KeyReservation {
            access_key: key.to_string(),
            account_name: account.to_string(),
            state: ReservationState::Held,
        };
        // An existing reservation naming us is our own crashed or concurrent
        // attempt (reservation written, checkpoint not yet): it is ours to use.
        let v = match store.create_key_reservation(&want).await? {
            Created::New(v) | Created::Existing(v) => v,
        };
        let taken = || -> Result<KeyChoice, DriverError> {
            Ok(KeyChoice::Use {
                access_key: random_access_key()?,
                preferred: PreferredKey::Taken(key.to_string()),
            })
        };
        if v.record.account_name != account || v.record.state != ReservationState::Held {
            tracing::info!(
                account,
                preferred_access_key = key,
                holder = %v.record.account_name,
                "preferred access key is held by another access; using a random access key"
            );
            return taken();
        }
        // We hold the reservation, and add-user only ever runs after the grant
        // checkpoint is written, so a backend user with this key is either our
        // concurrent twin's (its checkpoint exists by now) or not COSI's at all.
        if backend
            .user_info(key)
            .await
            .map_err(|e| e.into_driver(backend.conn()))?
            .is_some()
        {
            if store.get_grant(account).await?.is_some() {
                return Ok(KeyChoice::Reread);
            }
            tracing::warn!(
                account,
                preferred_access_key = key,
                "a backend user with the preferred access key exists that this driver did not create; leaving it alone and using a random access key"
            );
            // The key is someone else's: do not keep it reserved for us. A
            // conflict means the reservation changed, so it is no longer ours to drop.
            store.delete_key_reservation(&v).await?;
            return taken();
        }
        Ok(KeyChoice::Use {
            access_key: key.to_string(),
            preferred: PreferredKey::Reserved(key.to_string()),
        })
    }

    /// Mark `account`'s reservation of `key` as Releasing (idempotent; a
    /// reservation that is gone or names another account is left as it is).
    async fn mark_key_releasing(&self, key: &str, account: &str) -> Result<(), DriverError> {
        let store = &self.inner.store;
        for _ in 0..MAX_CAS_ROUNDS {
            let Some(v) = store.get_key_reservation(key).await? else {
                return Ok(());
            };
            if v.record.account_name != account || v.record.state == ReservationState::Releasing {
                return Ok(());
            }
            let mut rec = v.record.clone();
            rec.state = ReservationState::Releasing;
            match store
                .swap_key_reservation(&v.resource_version, &rec)
                .await?
            {
                Swap::Done(_) => return Ok(()),
                Swap::Conflict => continue,
            }
        }
        Err(cas_exhausted(key))
    }

    /// Delete `account`'s reservation of `key`; one that is gone or names
    /// another account is not ours and is left alone.
    async fn release_key(&self, key: &str, account: &str) -> Result<(), DriverError> {
        let store = &self.inner.store;
        for _ in 0..MAX_CAS_ROUNDS {
            let Some(v) = store.get_key_reservation(key).await? else {
                return Ok(());
            };
            if v.record.account_name != account {
                return Ok(());
            }
            match store.delete_key_reservation(&v).await? {
                Swap::Done(_) => {
                    tracing::info!(account, access_key = key, "key reservation released");
                    return Ok(());
                }
                Swap::Conflict => continue,
            }
        }
        Err(cas_exhausted(key))
    }

    /// Revoke found no grant for `access_key`. If a revoke of the grant that
    /// used it crashed between deleting its checkpoint and its reservation, the
    /// reservation is still there, Releasing: finish the release. Only a revoke
    /// marks a reservation Releasing, and only once its user is gone; with its
    /// checkpoint gone as well nothing uses the key any more.
    async fn release_orphaned_key(&self, access_key: &str) -> Result<(), DriverError> {
        let store = &self.inner.store;
        for _ in 0..MAX_CAS_ROUNDS {
            let Some(v) = store.get_key_reservation(access_key).await? else {
                return Ok(());
            };
            if v.record.state != ReservationState::Releasing {
                return Ok(());
            }
            match store.delete_key_reservation(&v).await? {
                Swap::Done(_) => {
                    tracing::info!(account = %v.record.account_name, access_key, "released a key reservation left by an interrupted revoke");
                    return Ok(());
                }
                Swap::Conflict => continue,
            }
        }
        Err(cas_exhausted(access_key))
    }

    fn new_secret(&self, account_name: &str) -> Result<String, DriverError> {
        if self.mutant(Mutant::PredictableSecret) {
            // MUTANT predictable-secret: derivable from the account name.
            return Ok(predictable_secret(account_name));
        }
        if self.mutant(Mutant::TimeSeededSecret) {
            // MUTANT time-seeded-secret: seeded with the wall-clock time (ns).
            let nanos = self
                .wall_now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            return Ok(time_seeded_secret(nanos, account_name));
        }
        if self.mutant(Mutant::SameSecretEveryAccess) {
            // MUTANT same-secret-every-access: one secret per process.
            let first = self.fresh_secret()?;
            return Ok(self.inner.process_secret.get_or_init(|| first).clone());
        }
        self.fresh_secret()
    }
}

fn not_ours(name: &str, conn: &Connection) -> DriverError {
    DriverError::AlreadyExists(format!(
        "bucket {name} already exists on {} and this driver holds no checkpoint for it, so it is not ours; to use an existing bucket, create the Bucket with existingBucketID instead",
        conn.endpoint
    ))
}

fn cas_exhausted(name: &str) -> DriverError {
    DriverError::Aborted(format!(
        "{name}: the checkpoint kept changing under us ({MAX_CAS_ROUNDS} compare-and-swap rounds); retry"
    ))
}

fn bucket_response(name: &str, conn: &Connection) -> DriverCreateBucketResponse {
    DriverCreateBucketResponse {
        bucket_id: name.to_string(),
        bucket_info: Some(Protocol {
            r#type: Some(protocol::Type::S3(S3 {
                region: conn.region.clone(),
                signature_version: S3SignatureVersion::S3v4 as i32,
            })),
        }),
    }
}

fn grant_response(rec: &GrantRecord) -> DriverGrantBucketAccessResponse {
    let mut secrets = HashMap::new();
    secrets.insert("accessKeyID".to_string(), rec.access_key.clone());
    secrets.insert("accessSecretKey".to_string(), rec.secret_key.clone());
    secrets.insert("endpoint".to_string(), rec.conn.endpoint.clone());
    secrets.insert("region".to_string(), rec.conn.region.clone());
    let mut credentials = HashMap::new();
    credentials.insert("s3".to_string(), CredentialDetails { secrets });
    DriverGrantBucketAccessResponse {
        account_id: rec.access_key.clone(),
        credentials,
    }
}

/// `len` characters drawn uniformly from `alphabet` with the OS RNG.
fn random_string(alphabet: &[u8], len: usize) -> Result<String, DriverError> {
    // Rejection sampling keeps the draw uniform (no modulo bias).
    let limit = 256 - (256 % alphabet.len());
    let mut out = String::with_capacity(len);
    let mut buf = [0u8; 64];
    while out.len() < len {
        OsRng.try_fill_bytes(&mut buf).map_err(|e| {
            DriverError::Unavailable(format!("the OS random number generator failed: {e}; retry"))
        })?;
        for b in buf {
            if (b as usize) < limit && out.len() < len {
                out.push(alphabet[b as usize % alphabet.len()] as char);
            }
        }
    }
    Ok(out)
}

const UPPER_ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// A fresh access key: 20 uppercase letters/digits from the OS RNG.
pub fn random_access_key() -> Result<String, DriverError> {
    random_string(UPPER_ALNUM, ACCESS_KEY_LEN)
}

/// A fresh secret key: 40 letters/digits from the OS RNG (~238 bits).
pub fn random_secret() -> Result<String, DriverError> {
    random_secret_of(SECRET_KEY_LEN)
}

/// A random secret key of `len` alphanumeric characters.
pub fn random_secret_of(len: usize) -> Result<String, DriverError> {
    random_string(ALNUM, len)
}

/// The `predictable-secret` mutant's secret: hex(sha256("cosi-s3:" + name)),
/// cut to [`SECRET_KEY_LEN`] like every secret this driver makes (neither
/// RustFS nor MinIO caps an add-user secret at 40; 40 is MinIO's length for
/// the credentials it generates itself). Still computable by anyone who knows
/// the name.
pub fn predictable_secret(account_name: &str) -> String {
    let mut h = hex::encode(Sha256::digest(format!("cosi-s3:{account_name}").as_bytes()));
    h.truncate(SECRET_KEY_LEN);
    h
}

/// The `time-seeded-secret` mutant's secret: a generator seeded with the
/// wall-clock time in nanoseconds (and the name): whoever knows roughly when
/// a grant ran can enumerate it, and two processes under one frozen clock
/// draw the same.
pub fn time_seeded_secret(nanos: u128, account_name: &str) -> String {
    let mut h = hex::encode(Sha256::digest(format!("{nanos}/{account_name}").as_bytes()));
    h.truncate(SECRET_KEY_LEN);
    h
}

/// The `user-before-checkpoint` mutant's access key: derived from the name, as
/// the field driver's was, so a retry finds the user its crashed attempt made.
pub fn derived_access_key(account_name: &str) -> String {
    let h = hex::encode(Sha256::digest(
        format!("cosi-s3-ak:{account_name}").as_bytes(),
    ));
    h[..ACCESS_KEY_LEN].to_ascii_uppercase()
}

#[tonic::async_trait]
impl Identity for CosiS3Driver {
    async fn driver_get_info(
        &self,
        _req: Request<DriverGetInfoRequest>,
    ) -> Result<Response<DriverGetInfoResponse>, Status> {
        Ok(Response::new(DriverGetInfoResponse {
            name: crate::DRIVER_NAME.to_string(),
        }))
    }
}

fn answer<T>(op: &str, r: Result<T, DriverError>) -> Result<Response<T>, Status> {
    match r {
        Ok(v) => Ok(Response::new(v)),
        Err(e) => {
            tracing::info!(op, error = %e, "call failed");
            Err(e.into())
        }
    }
}

#[tonic::async_trait]
impl Provisioner for CosiS3Driver {
    async fn driver_create_bucket(
        &self,
        req: Request<DriverCreateBucketRequest>,
    ) -> Result<Response<DriverCreateBucketResponse>, Status> {
        answer(
            "DriverCreateBucket",
            self.create_bucket(req.into_inner()).await,
        )
    }

    async fn driver_delete_bucket(
        &self,
        req: Request<DriverDeleteBucketRequest>,
    ) -> Result<Response<DriverDeleteBucketResponse>, Status> {
        answer(
            "DriverDeleteBucket",
            self.delete_bucket(req.into_inner()).await,
        )
    }

    async fn driver_grant_bucket_access(
        &self,
        req: Request<DriverGrantBucketAccessRequest>,
    ) -> Result<Response<DriverGrantBucketAccessResponse>, Status> {
        answer(
            "DriverGrantBucketAccess",
            self.grant(req.into_inner()).await,
        )
    }

    async fn driver_revoke_bucket_access(
        &self,
        req: Request<DriverRevokeBucketAccessRequest>,
    ) -> Result<Response<DriverRevokeBucketAccessResponse>, Status> {
        answer(
            "DriverRevokeBucketAccess",
            self.revoke(req.into_inner()).await,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn secrets_are_random_and_long() {
        let mut seen = HashSet::new();
        for _ in 0..200 {
            let s = random_secret().unwrap();
            assert_eq!(s.len(), SECRET_KEY_LEN);
            assert!(s.bytes().all(|b| b.is_ascii_alphanumeric()));
            assert!(seen.insert(s));
        }
        // 40 symbols of 62: log2(62) * 40 ≈ 238 bits ≥ 128.
        assert!((SECRET_KEY_LEN as f64) * 62f64.log2() >= 128.0);
        let ak = random_access_key().unwrap();
        assert_eq!(ak.len(), ACCESS_KEY_LEN);
        assert!(ak
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()));
    }

    #[test]
    fn secret_is_not_derivable_from_the_name() {
        let name = "ba-0f6e7c1a-2b3c-4d5e-8f90-123456789abc";
        let s = random_secret().unwrap();
        assert_ne!(s, predictable_secret(name));
        assert_ne!(s, random_secret().unwrap());
        // The mutant's secret is what the field bug computed.
        assert_eq!(predictable_secret(name), predictable_secret(name));
        assert_eq!(predictable_secret(name).len(), SECRET_KEY_LEN);
    }

    #[test]
    fn character_distribution_is_roughly_uniform() {
        let mut counts = [0usize; 36];
        let n = 36 * 400;
        let s = random_string(UPPER_ALNUM, n).unwrap();
        for b in s.bytes() {
            let i = UPPER_ALNUM.iter().position(|c| *c == b).unwrap();
            counts[i] += 1;
        }
        assert!(counts.iter().all(|c| (200..=600).contains(c)), "{counts:?}");
    }

    #[test]
    fn derived_access_key_is_stable() {
        assert_eq!(derived_access_key("ba-1"), derived_access_key("ba-1"));
        assert_ne!(derived_access_key("ba-1"), derived_access_key("ba-2"));
        assert_eq!(derived_access_key("ba-1").len(), ACCESS_KEY_LEN);
    }

    #[test]
    fn grant_response_shape() {
        let rec = GrantRecord {
            state: State::Ready,
            account_name: "ba-1".into(),
            bucket_id: "b".into(),
            params_hash: "h".into(),
            access_key: "AK".into(),
            secret_key: "SK".into(),
            policy_name: "cosi-x".into(),
            policy_kind: PolicyKind::Generated,
            access_mode: crate::config::AccessMode::ReadWrite,
            conn: Connection {
                endpoint: "http://e:1".into(),
                secret_name: "s".into(),
                secret_namespace: "n".into(),
                region: "r".into(),
                admin_api: crate::config::AdminApi::Rustfs,
            },
            preferred: PreferredKey::NotRequested,
        };
        let r = grant_response(&rec);
        assert_eq!(r.account_id, "AK");
        assert_eq!(r.credentials.len(), 1);
        let s = &r.credentials["s3"].secrets;
        let mut keys: Vec<_> = s.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            ["accessKeyID", "accessSecretKey", "endpoint", "region"]
        );
    }
}

//! The engine: stands up the fakes and the driver for one scenario, runs its
//! steps on the virtual clock, converges the sidecar after each, and gathers
//! the observations, snapshot and history the checks and reports read.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use base64::Engine as _;
use cosi_s3::{DriverConfig, Mutant};
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::cosi_sidecar::{CosiSidecar, DriverOp, DriverReply, DriverRequest, Exchange, Reconcile, Target};
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::{Component, Event, EventKind, History};
use drivelab_fakes::kube::{Kind, KubeFake};
use drivelab_fakes::s3::{S3Config, S3Fake, S3Probe};
use drivelab_fakes::secret::Secret;
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::{SledStore, Store};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::checks::{self, BackendState, LiveAccess, Observations, Probe, ProbePurpose, RetryObservation, UserState, Verdict};
use crate::scenario::{AccessStep, ClaimStep, Expectation, RetryOp, RetryStep, Scenario, Step};
use crate::snapshot::{self, Normalizer, SnapshotInput};

mod queue;
use queue::WorkQueue;

/// Namespace and name of the admin credentials Secret the lab creates.
pub const ADMIN_SECRET_NAMESPACE: &str = "drivelab-system";
/// Name of the admin credentials Secret.
pub const ADMIN_SECRET_NAME: &str = "s3-admin";
/// Namespace the reference driver keeps its checkpoints in.
pub const DRIVER_STATE_NAMESPACE: &str = "cosi-s3-system";
/// A bucket the lab owns, which no grant may reach (least-privilege probe target).
pub const CANARY_BUCKET: &str = "drivelab-canary";

/// How to run.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Overrides the scenario's seed.
    pub seed: Option<u64>,
    /// Mutants to switch on in addition to the scenario's.
    pub mutants: Vec<Mutant>,
}

/// A failed `expect:` step.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ExpectFailure {
    /// 1-based step number.
    pub step: usize,
    /// `file:line:col` of the step.
    pub at: String,
    /// What did not hold.
    pub message: String,
}

/// Everything one run produced.
#[derive(Debug)]
pub struct RunOutcome {
    /// Scenario name.
    pub scenario: String,
    /// Scenario file.
    pub path: PathBuf,
    /// The seed used.
    pub seed: u64,
    /// Mutants that were on.
    pub mutants: Vec<Mutant>,
    /// DriverGetInfo name.
    pub driver_name: String,
    /// Invariant verdicts.
    pub verdicts: Vec<Verdict>,
    /// Failed expectations.
    pub expect_failures: Vec<ExpectFailure>,
    /// Objects that had not converged when their step's window closed.
    pub not_converged: Vec<String>,
    /// The canonical ownership snapshot.
    pub snapshot: String,
    /// The full history.
    pub history: Vec<Event>,
    /// The command that replays this run.
    pub replay: String,
}

impl RunOutcome {
    /// All checks and expectations held.
    pub fn passed(&self) -> bool {
        self.verdicts.iter().all(|v| v.passed) && self.expect_failures.is_empty()
    }
}

/// The command line that replays a run.
pub fn replay_command(path: &std::path::Path, seed: u64, mutants: &[Mutant]) -> String {
    let mut cmd = format!("drivelab run {} --seed {seed}", path.display());
    for m in mutants {
        cmd.push_str(" --mutant ");
        cmd.push_str(m.name());
    }
    cmd
}

/// The seed used when neither the file nor the command line gives one.
pub const DEFAULT_SEED: u64 = 1;

/// Run one scenario to completion.
pub async fn run(scn: &Scenario, opts: &RunOptions) -> anyhow::Result<RunOutcome> {
    let seed = opts.seed.or(scn.seed).unwrap_or(DEFAULT_SEED);
    let mut mutants = scn.driver.mutants.clone();
    for m in &opts.mutants {
        if !mutants.contains(m) {
            mutants.push(*m);
        }
    }
    mutants.sort();
    let log_start = crate::logcap::position();
    let mut lab = Lab::start(scn, seed, &mutants).await?;
    let result = lab.run_steps(scn).await;
    let outcome = match result {
        Ok(()) => lab.finish(scn, seed, &mutants, log_start).await,
        Err(e) => Err(e),
    };
    lab.stop().await;
    outcome
}

/// One running lab: fakes, driver, sidecar, and what the engine recorded.
struct Lab {
    _dir: tempfile::TempDir,
    clock: SimClock,
    history: History,
    s3: S3Fake,
    kube: KubeFake,
    listeners: Vec<Listener>,
    driver_task: Option<(oneshot::Sender<()>, JoinHandle<anyhow::Result<()>>)>,
    sidecar: CosiSidecar,
    queue: WorkQueue,
    probe: S3Probe,
    s3_url: String,
    kube_url: String,
    admin_secret: Secret,
    converge_within: Duration,
    uids: Vec<String>,
    retries: Vec<RetryObservation>,
    policies_at_grant: BTreeMap<String, BTreeMap<String, Value>>,
    account_of: BTreeMap<String, (String, String)>,
    bucket_of: BTreeMap<String, String>,
    expect_failures: Vec<ExpectFailure>,
    not_converged: Vec<String>,
    step_exchanges_from: usize,
}

impl Lab {
    async fn start(scn: &Scenario, seed: u64, mutants: &[Mutant]) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("drivelab-").tempdir().context("creating the run directory")?;
        let db = sled::Config::new().path(dir.path().join("state")).open().context("opening the lab's sled store")?;
        let clock = SimClock::new();
        let history = History::new(clock.clone());
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let admin_secret = Secret::new(random_token(&mut rng, 40));
        let s3_store: Arc<dyn Store> = Arc::new(SledStore::open(&db, "s3")?);
        let kube_store: Arc<dyn Store> = Arc::new(SledStore::open(&db, "kube")?);
        let s3 = S3Fake::new(
            s3_store,
            Gate::new(history.clone()),
            S3Config {
                admin_access_key: "drivelab-admin".into(),
                admin_secret_key: admin_secret.expose().to_string(),
                region: "us-east-1".into(),
            },
        )
        .map_err(|e| anyhow!("starting the S3 fake: {e}"))?;
        let kube = KubeFake::new(kube_store, Gate::new(history.clone()), rng.random())
            .map_err(|e| anyhow!("starting the Kubernetes fake: {e}"))?;
        let s3_listener = s3.serve(loopback()).await.context("binding the S3 fake")?;
        let kube_listener = kube.serve(loopback()).await.context("binding the Kubernetes fake")?;
        let s3_url = s3_listener.url();
        let kube_url = kube_listener.url();

        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        kube.create(
            Kind::Secret,
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": ADMIN_SECRET_NAME, "namespace": ADMIN_SECRET_NAMESPACE},
                "type": "Opaque",
                "data": {"accessKey": b64("drivelab-admin"), "secretKey": b64(admin_secret.expose())},
            }),
        )
        .map_err(|e| anyhow!("creating the admin Secret: {e}"))?;

        let probe = S3Probe::new(&s3_url, "us-east-1");
        let canary = probe
            .create_bucket("drivelab-admin", admin_secret.expose(), CANARY_BUCKET)
            .await
            .map_err(|e| anyhow!("creating the canary bucket: {e}"))?;
        if !(200..300).contains(&canary.status) {
            return Err(anyhow!("creating the canary bucket answered {}", canary.status));
        }

        let driver_name = match scn.driver.builtin {
            crate::scenario::BuiltinDriver::CosiS3 => cosi_s3::DRIVER_NAME,
        };
        let placeholders = [
            ("{s3_endpoint}", s3_url.clone()),
            ("{admin_secret_name}", ADMIN_SECRET_NAME.to_string()),
            ("{admin_secret_namespace}", ADMIN_SECRET_NAMESPACE.to_string()),
        ];
        let params = |given: &BTreeMap<String, String>| -> Value {
            let mut p: BTreeMap<String, String> = BTreeMap::new();
            p.insert("endpoint".into(), s3_url.clone());
            p.insert("objectStoreUserSecretName".into(), ADMIN_SECRET_NAME.into());
            p.insert("objectStoreUserSecretNamespace".into(), ADMIN_SECRET_NAMESPACE.into());
            for (k, v) in given {
                let mut v = v.clone();
                for (ph, val) in &placeholders {
                    v = v.replace(ph, val);
                }
                p.insert(k.clone(), v);
            }
            json!(p)
        };
        for c in &scn.bucket_classes {
            kube.create(
                Kind::BucketClass,
                json!({
                    "apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "BucketClass",
                    "metadata": {"name": c.name},
                    "driverName": driver_name,
                    "deletionPolicy": c.deletion_policy,
                    "parameters": params(&c.parameters),
                }),
            )
            .map_err(|e| anyhow!("creating BucketClass {}: {e}", c.name))?;
        }
        for c in &scn.access_classes {
            kube.create(
                Kind::BucketAccessClass,
                json!({
                    "apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "BucketAccessClass",
                    "metadata": {"name": c.name},
                    "driverName": driver_name,
                    "authenticationType": c.authentication_type,
                    "parameters": params(&c.parameters),
                }),
            )
            .map_err(|e| anyhow!("creating BucketAccessClass {}: {e}", c.name))?;
        }

        let socket = dir.path().join("cosi.sock");
        let config = DriverConfig {
            kube_url: kube_url.clone(),
            state_namespace: DRIVER_STATE_NAMESPACE.into(),
            mutants: mutants.to_vec(),
        };
        let (tx, rx) = oneshot::channel::<()>();
        let sock = socket.clone();
        let task = tokio::spawn(async move {
            cosi_s3::serve_unix(config, &sock, async move {
                let _ = rx.await;
            })
            .await
        });
        wait_for_socket(&socket, &task).await?;
        let sidecar = CosiSidecar::connect(&socket, kube.clone(), Gate::new(history.clone()))
            .await
            .context("the sidecar could not reach the driver")?;
        Ok(Self {
            _dir: dir,
            clock,
            history,
            s3,
            kube,
            listeners: vec![s3_listener, kube_listener],
            driver_task: Some((tx, task)),
            sidecar,
            queue: WorkQueue::default(),
            probe,
            s3_url,
            kube_url,
            admin_secret,
            converge_within: scn.converge_within,
            uids: Vec::new(),
            retries: Vec::new(),
            policies_at_grant: BTreeMap::new(),
            account_of: BTreeMap::new(),
            bucket_of: BTreeMap::new(),
            expect_failures: Vec::new(),
            not_converged: Vec::new(),
            step_exchanges_from: 0,
        })
    }

    async fn stop(&mut self) {
        if let Some((tx, task)) = self.driver_task.take() {
            let _ = tx.send(());
            task.abort();
            let _ = task.await;
        }
        for l in self.listeners.drain(..) {
            l.stop().await;
        }
    }

    async fn run_steps(&mut self, scn: &Scenario) -> anyhow::Result<()> {
        for (i, step) in scn.steps.iter().enumerate() {
            let at = format!("{}:{}:{}", scn.path.display(), step.line, step.col);
            self.history.record(EventKind::Step { index: i, name: step.value.describe() });
            let before = self.step_exchanges_from;
            if !matches!(step.value, Step::Expect(_)) {
                self.step_exchanges_from = self.sidecar.exchanges().len();
            }
            match &step.value {
                Step::CreateBucketClaim(c) => self.create_claim(c).await?,
                Step::GrantAccess(a) => self.grant(a).await?,
                Step::RevokeAccess(o) => {
                    self.mark_deleted(Kind::BucketAccess, &o.namespace, &o.name)?;
                    self.converge(Target::Access { namespace: o.namespace.clone(), name: o.name.clone() }).await?;
                }
                Step::DeleteBucketClaim(o) => {
                    self.mark_deleted(Kind::BucketClaim, &o.namespace, &o.name)?;
                    self.converge(Target::Claim { namespace: o.namespace.clone(), name: o.name.clone() }).await?;
                }
                Step::Retry(r) => self.retry(i, r).await?,
                Step::Expect(e) => {
                    self.step_exchanges_from = before;
                    for message in self.expect(e) {
                        self.expect_failures.push(ExpectFailure { step: i + 1, at: at.clone(), message });
                    }
                }
            }
        }
        Ok(())
    }

    async fn create_claim(&mut self, c: &ClaimStep) -> anyhow::Result<()> {
        let obj = self
            .kube
            .create(
                Kind::BucketClaim,
                json!({
                    "apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "BucketClaim",
                    "metadata": {"name": c.name, "namespace": c.namespace},
                    "spec": {"bucketClassName": c.class, "protocols": ["S3"]},
                }),
            )
            .map_err(|e| anyhow!("creating BucketClaim {}/{}: {e}", c.namespace, c.name))?;
        self.uids.push(str_at(&obj, &["metadata", "uid"]));
        self.converge(Target::Claim { namespace: c.namespace.clone(), name: c.name.clone() }).await?;
        if let Some(claim) = self.kube.get(Kind::BucketClaim, Some(&c.namespace), &c.name)? {
            let b = str_at(&claim, &["status", "bucketName"]);
            if !b.is_empty() {
                self.bucket_of.insert(format!("{}/{}", c.namespace, c.name), b);
            }
        }
        Ok(())
    }

    async fn grant(&mut self, a: &AccessStep) -> anyhow::Result<()> {
        let secret_name = a.credentials_secret.clone().unwrap_or_else(|| format!("{}-creds", a.name));
        let obj = self
            .kube
            .create(
                Kind::BucketAccess,
                json!({
                    "apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "BucketAccess",
                    "metadata": {"name": a.name, "namespace": a.namespace},
                    "spec": {
                        "bucketClaimName": a.claim,
                        "bucketAccessClassName": a.class,
                        "credentialsSecretName": secret_name,
                        "protocol": "S3",
                    },
                }),
            )
            .map_err(|e| anyhow!("creating BucketAccess {}/{}: {e}", a.namespace, a.name))?;
        let uid = str_at(&obj, &["metadata", "uid"]);
        self.uids.push(uid.clone());
        let key = format!("{}/{}", a.namespace, a.name);
        self.converge(Target::Access { namespace: a.namespace.clone(), name: a.name.clone() }).await?;
        let account_id = self
            .kube
            .get(Kind::BucketAccess, Some(&a.namespace), &a.name)?
            .map(|o| str_at(&o, &["status", "accountID"]))
            .unwrap_or_default();
        self.account_of.insert(key.clone(), (format!("ba-{uid}"), account_id));
        // What this grant's user may do right after it converged; a later grant must not change it.
        let backend = self.backend();
        if let Some(creds) = self.current_credentials(&a.namespace, &secret_name)? {
            let docs = backend
                .users
                .get(&creds.0)
                .map(|u| u.policies.iter().filter_map(|p| backend.policies.get(p).map(|d| (p.clone(), d.clone()))).collect())
                .unwrap_or_default();
            self.policies_at_grant.insert(key, docs);
        }
        Ok(())
    }

    fn mark_deleted(&mut self, kind: Kind, ns: &str, name: &str) -> anyhow::Result<()> {
        // As `kubectl delete`: the API server marks it; the sidecar's finalizer keeps it until cleanup.
        self.kube.delete(kind, Some(ns), name).map_err(|e| anyhow!("deleting {ns}/{name}: {e}"))?;
        Ok(())
    }

    /// Reconcile `target` (and anything else queued) until the queue is empty or
    /// the step's virtual-time window closes.
    async fn converge(&mut self, target: Target) -> anyhow::Result<()> {
        self.queue.push(self.clock.now(), target);
        let deadline = queue::deadline(&self.clock, self.converge_within);
        while let Some((at, t)) = self.queue.pop_due(deadline) {
            self.clock.advance_to(at);
            match self.sidecar.reconcile(&t).await.with_context(|| format!("reconciling {t}"))? {
                Reconcile::Done => {}
                Reconcile::Requeue { after, reason } => {
                    self.history.record(EventKind::Note { component: Component::Sidecar, text: format!("requeue {t} in {}ms: {reason}", after.as_millis()) });
                    self.queue.push(self.clock.now().after(after), t);
                }
            }
        }
        self.clock.advance_to(deadline.min(self.clock.now()));
        for (at, t) in self.queue.pending() {
            let msg = format!("{t} still pending at {} (next attempt at {at})", self.clock.now());
            self.history.record(EventKind::Note { component: Component::Lab, text: format!("not converged: {msg}") });
            // One line per object: the latest window it missed.
            let prefix = format!("{t} ");
            self.not_converged.retain(|m| !m.starts_with(&prefix));
            self.not_converged.push(msg);
        }
        Ok(())
    }

    async fn retry(&mut self, step: usize, r: &RetryStep) -> anyhow::Result<()> {
        let obj = format!("{}/{}", r.namespace, r.name);
        let (op, key) = match r.op {
            RetryOp::CreateBucketClaim => (DriverOp::CreateBucket, self.bucket_of.get(&obj).cloned()),
            RetryOp::DeleteBucketClaim => (DriverOp::DeleteBucket, self.bucket_of.get(&obj).cloned()),
            RetryOp::GrantAccess => (DriverOp::GrantBucketAccess, self.account_of.get(&obj).map(|a| a.0.clone())),
            RetryOp::RevokeAccess => (DriverOp::RevokeBucketAccess, self.account_of.get(&obj).map(|a| a.1.clone())),
        };
        let original = key.and_then(|key| {
            self.sidecar
                .exchanges()
                .iter()
                .rev()
                .find(|e| !e.replay && e.request.op() == op && e.request.key() == key)
                .cloned()
        });
        let Some(original) = original else {
            self.expect_failures.push(ExpectFailure {
                step: step + 1,
                at: String::new(),
                message: format!("retry {} {obj}: the sidecar never sent that request, nothing to retry", r.op.keyword()),
            });
            return Ok(());
        };
        let auth = r.authentication_type.as_deref().map(auth_code);
        let before = self.backend();
        let retried = self.sidecar.replay(original.request.clone(), r.parameters.as_ref(), auth).await;
        let after = self.backend();
        let changed_request = retried.request != original.request;
        self.retries.push(RetryObservation { step, original, retried, before, after, changed_request });
        Ok(())
    }

    fn expect(&self, e: &Expectation) -> Vec<String> {
        let mut fails = Vec::new();
        let step_exchanges = &self.sidecar.exchanges()[self.step_exchanges_from.min(self.sidecar.exchanges().len())..];
        if let Some(code) = e.code {
            match step_exchanges.last() {
                None => fails.push(format!("expected the last driver reply to be {}, but the previous step made no driver call", code.name())),
                Some(ex) => {
                    let got = ex.reply.code_name();
                    if got != code.name() {
                        let msg = match &ex.reply {
                            DriverReply::Failed { message, .. } => format!(" ({message})"),
                            _ => String::new(),
                        };
                        fails.push(format!("{} answered {got}{msg}, expected {}", ex.request.op().rpc(), code.name()));
                    }
                }
            }
        }
        if let (Some(claim), Some(want)) = (&e.claim, e.ready) {
            let got = self
                .kube
                .get(Kind::BucketClaim, Some(&e.namespace), claim)
                .ok()
                .flatten()
                .map(|o| bool_at(&o, &["status", "bucketReady"]))
                .unwrap_or(false);
            if got != want {
                fails.push(format!("claim {}/{claim}: bucketReady is {got}, expected {want}", e.namespace));
            }
        }
        if let (Some(access), Some(want)) = (&e.access, e.granted) {
            let got = self
                .kube
                .get(Kind::BucketAccess, Some(&e.namespace), access)
                .ok()
                .flatten()
                .map(|o| bool_at(&o, &["status", "accessGranted"]))
                .unwrap_or(false);
            if got != want {
                fails.push(format!("access {}/{access}: accessGranted is {got}, expected {want}", e.namespace));
            }
        }
        if let Some(counts) = &e.backend {
            let b = self.backend();
            let check = |fails: &mut Vec<String>, what: &str, want: Option<usize>, got: usize| {
                if let Some(w) = want {
                    if w != got {
                        fails.push(format!("backend has {got} {what}, expected {w}"));
                    }
                }
            };
            check(&mut fails, "buckets", counts.buckets, b.buckets.keys().filter(|k| *k != CANARY_BUCKET).count());
            check(&mut fails, "users", counts.users, b.users.len());
            check(&mut fails, "policies", counts.policies, b.driver_policies().count());
        }
        if let Some(calls) = &e.driver_calls {
            for (rpc, want) in calls {
                let got = self.sidecar.exchanges().iter().filter(|x| x.request.op().rpc() == rpc).count();
                if got != *want {
                    fails.push(format!("the sidecar made {got} {rpc} calls, expected {want}"));
                }
            }
        }
        fails
    }

    fn backend(&self) -> BackendState {
        BackendState {
            users: self
                .s3
                .users()
                .into_iter()
                .map(|u| (u.access_key.clone(), UserState { secret: Secret::new(u.secret_key.clone()), status: u.status.clone(), policies: u.policies.clone() }))
                .collect(),
            builtin_policies: self.s3.policies().into_iter().filter(|p| p.builtin).map(|p| p.name).collect(),
            policies: self.s3.policies().into_iter().map(|p| (p.name, p.document)).collect(),
            buckets: self.s3.buckets().into_iter().map(|b| (b.name, b.objects)).collect(),
        }
    }

    fn current_credentials(&self, ns: &str, secret_name: &str) -> anyhow::Result<Option<(String, Secret)>> {
        let Some(sec) = self.kube.get(Kind::Secret, Some(ns), secret_name)? else { return Ok(None) };
        Ok(snapshot::bucket_info(&sec).map(|info| {
            (
                str_at(&info, &["spec", "secretS3", "accessKeyID"]),
                Secret::new(str_at(&info, &["spec", "secretS3", "accessSecretKey"])),
            )
        }))
    }

    async fn finish(&mut self, scn: &Scenario, seed: u64, mutants: &[Mutant], log_start: usize) -> anyhow::Result<RunOutcome> {
        let backend = self.backend();
        let accesses = self.kube.list(Kind::BucketAccess, None)?;
        let claims = self.kube.list(Kind::BucketClaim, None)?;
        let buckets = self.kube.list(Kind::Bucket, None)?;
        let mut credential_secrets = Vec::new();
        let mut live = Vec::new();
        for a in &accesses {
            let ns = str_at(a, &["metadata", "namespace"]);
            let name = str_at(a, &["metadata", "name"]);
            let secret_name = str_at(a, &["spec", "credentialsSecretName"]);
            if let Some(s) = self.kube.get(Kind::Secret, Some(&ns), &secret_name)? {
                credential_secrets.push(s);
            }
            if !bool_at(a, &["status", "accessGranted"]) || !str_at(a, &["metadata", "deletionTimestamp"]).is_empty() {
                continue;
            }
            let key = format!("{ns}/{name}");
            live.push(LiveAccess {
                name: key.clone(),
                account_name: format!("ba-{}", str_at(a, &["metadata", "uid"])),
                account_id: str_at(a, &["status", "accountID"]),
                bucket_id: str_at(a, &["status", "bucketID"]),
                credentials: self.current_credentials(&ns, &secret_name)?,
                policies_at_grant: self.policies_at_grant.get(&key).cloned().unwrap_or_default(),
            });
        }
        let mut checkpoints = Vec::new();
        for o in self.kube.list(Kind::Secret, Some(DRIVER_STATE_NAMESPACE))? {
            checkpoints.push(("secret", o));
        }
        for o in self.kube.list(Kind::ConfigMap, Some(DRIVER_STATE_NAMESPACE))? {
            checkpoints.push(("configmap", o));
        }

        // The snapshot first: probes below write objects, which are not the driver's doing.
        let mut norm = Normalizer::default();
        for u in &self.uids {
            norm.id("uid", u);
        }
        norm.fixed(&self.s3_url, "s3-endpoint");
        norm.fixed(&self.kube_url, "kube-url");
        let lab_buckets = vec![CANARY_BUCKET.to_string()];
        let snapshot = snapshot::render(
            &SnapshotInput { claims, buckets, accesses, credential_secrets, checkpoints, backend: &backend, lab_buckets: &lab_buckets },
            &mut norm,
        );

        let probes = self.probe_all(&live).await;
        let exchanges: Vec<Exchange> = self.sidecar.exchanges().to_vec();
        let mut secrets: Vec<Secret> = vec![self.admin_secret.clone()];
        secrets.extend(backend.users.values().map(|u| u.secret.clone()));
        for r in &self.retries {
            secrets.extend(r.before.users.values().chain(r.after.users.values()).map(|u| u.secret.clone()));
        }
        for ex in &exchanges {
            if let DriverReply::Granted { credentials: Some(c), .. } = &ex.reply {
                secrets.push(c.secret.clone());
            }
        }
        secrets.extend(live.iter().filter_map(|a| a.credentials.as_ref().map(|c| c.1.clone())));
        secrets.sort();
        secrets.dedup();
        let history = self.history.events();
        let history_json = serde_json::to_string_pretty(&history).unwrap_or_default();
        let logs = crate::logcap::since(log_start);
        let obs = Observations {
            exchanges,
            retries: self.retries.clone(),
            live,
            backend: self.backend(),
            probes,
            secrets,
            artifacts: vec![("snapshot".into(), snapshot.clone()), ("history".into(), history_json), ("log".into(), logs)],
        };
        let verdicts = scn.invariants.iter().map(|i| checks::check(*i, &obs)).collect();
        Ok(RunOutcome {
            scenario: scn.name.clone(),
            path: scn.path.clone(),
            seed,
            mutants: mutants.to_vec(),
            driver_name: self.sidecar.driver_name().to_string(),
            verdicts,
            expect_failures: self.expect_failures.clone(),
            not_converged: self.not_converged.clone(),
            snapshot,
            history: self.history.events(),
            replay: replay_command(&scn.path, seed, mutants),
        })
    }

    /// Signed PutObjects with handed-out credentials: own bucket, the canary and
    /// every other live access's bucket with the current credentials; own bucket
    /// with every credential an earlier reply handed out.
    async fn probe_all(&mut self, live: &[LiveAccess]) -> Vec<Probe> {
        let mut out = Vec::new();
        let mut targets: Vec<String> = live.iter().map(|a| a.bucket_id.clone()).collect();
        targets.push(CANARY_BUCKET.to_string());
        targets.sort();
        targets.dedup();
        for a in live {
            if let Some((key, secret)) = &a.credentials {
                for bucket in &targets {
                    let granted = *bucket == a.bucket_id;
                    out.push(self.one_probe(a, key, secret, bucket, granted, ProbePurpose::Current).await);
                }
            }
            let handed: Vec<(String, Secret)> = self
                .sidecar
                .exchanges()
                .iter()
                .filter(|e| matches!(&e.request, DriverRequest::Grant { name, .. } if *name == a.account_name))
                .filter_map(|e| match &e.reply {
                    DriverReply::Granted { credentials: Some(c), .. } => Some((c.access_key_id.clone(), c.secret.clone())),
                    _ => None,
                })
                .collect();
            let mut seen = Vec::new();
            for (key, secret) in handed {
                if seen.contains(&secret) || a.credentials.as_ref().is_some_and(|c| c.1 == secret) {
                    continue;
                }
                seen.push(secret.clone());
                out.push(self.one_probe(a, &key, &secret, &a.bucket_id.clone(), true, ProbePurpose::HandedOut).await);
            }
        }
        out
    }

    async fn one_probe(&mut self, a: &LiveAccess, key: &str, secret: &Secret, bucket: &str, granted: bool, purpose: ProbePurpose) -> Probe {
        let object = format!("drivelab-probe/{}", a.name.replace('/', "-"));
        let calls_before = self.history.len();
        let reply = self.probe.put_object(key, secret.expose(), bucket, &object, b"drivelab probe".to_vec()).await;
        let call = drivelab_fakes::history::calls(&self.history.events()[calls_before..]).last().map(|c| c.id);
        let (status, code) = match reply {
            Ok(r) => (r.status, r.code),
            Err(e) => (0, Some(format!("probe failed: {e}"))),
        };
        Probe { access: a.name.clone(), access_key: key.to_string(), bucket: bucket.to_string(), granted_bucket: granted, purpose, status, code, call }
    }
}

async fn wait_for_socket(socket: &std::path::Path, task: &JoinHandle<anyhow::Result<()>>) -> anyhow::Result<()> {
    // Real time, not virtual: the driver binds its socket on its own schedule.
    for _ in 0..500 {
        if socket.exists() {
            return Ok(());
        }
        if task.is_finished() {
            return Err(anyhow!("the driver exited before opening its socket {}", socket.display()));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(anyhow!("the driver did not open its socket {} within 5s", socket.display()))
}

fn auth_code(name: &str) -> i32 {
    use drivelab_proto::cosi::AuthenticationType;
    match name {
        "Key" => AuthenticationType::Key as i32,
        "IAM" => AuthenticationType::Iam as i32,
        _ => AuthenticationType::UnknownAuthenticationType as i32,
    }
}

fn random_token(rng: &mut ChaCha20Rng, len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..len).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect()
}

fn str_at(v: &Value, path: &[&str]) -> String {
    path.iter().try_fold(v, |v, k| v.get(*k)).and_then(Value::as_str).unwrap_or("").to_string()
}

fn bool_at(v: &Value, path: &[&str]) -> bool {
    path.iter().try_fold(v, |v, k| v.get(*k)).and_then(Value::as_bool).unwrap_or(false)
}

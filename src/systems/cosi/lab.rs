//! The COSI lab: stands up the S3/admin and Kubernetes fakes, the COSI
//! sidecar and the driver for one scenario, applies its COSI steps on the
//! virtual clock, converges the sidecar after each, and gathers the
//! observations, snapshot and history the checks and reports read.

use std::borrow::Borrow as _;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::scenario::CosiStep;
use crate::scenario::Mutant;
use anyhow::{anyhow, Context};
use base64::Engine as _;
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::cosi_sidecar::{
    CosiSidecar, DriverOp, DriverReply, DriverRequest, Exchange, Reconcile, S3Credentials, Target,
};
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::{Component, EventKind, Events, History};
use drivelab_fakes::json::{bool_at, str_at};
use drivelab_fakes::kube::{Grant, Kind, KubeFake, Stored};
use drivelab_fakes::s3::{S3Config, S3Probe};
use drivelab_fakes::secret::Secret;
use futures_util::future::BoxFuture;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::{json, Value};

use super::checks::{
    self, BackendState, GrantedMode, LiveAccess, Observations, Planted, PolicyDoc, PolicyDocs,
    Probe, ProbeOp, ProbePurpose, RetryObservation, Stuck, UserState,
};
use crate::scenario::{
    AccessStep, BackendBucketStep, BackendName, BackendPolicyStep, BackendUserStep, ClaimStep,
    Expectation, Invariant, Restartable, RetryOp, RetryStep, Scenario, Step,
};

use super::fakes::FakeSet;
use super::snapshot::{self, KubeObjects, SnapshotInput};
use super::ADMIN_SECRET_NAME;
use super::{ADMIN_SECRET_NAMESPACE, CANARY_BUCKET, DRIVER_ACCOUNT, DRIVER_STATE_NAMESPACE};
use crate::engine::driver::{self, Driver};
use crate::engine::external;
use crate::engine::hook::{self, LabControl, LabHook};
use crate::engine::queue::{self, WorkQueue};
use crate::engine::schedule::Scheduler;
use crate::engine::{
    line_of, random_token, replay_command, system, ExpectFailure, RunOptions, RunOutcome,
    StepSnapshots,
};
use crate::packed::PackedWriter;
use crate::snapshot::Normalizer;
use crate::systems::{Observed, Record};

/// Stand up a COSI scenario's lab (twice, when a twin is needed), run it and judge it.
pub(crate) async fn run(
    scn: &Scenario,
    opts: &RunOptions,
    seed: u64,
    mutants: &[Mutant],
) -> anyhow::Result<RunOutcome> {
    // The twin: the same scenario, seed and names in a second lab. A driver whose
    // secrets are a function of names hands out the same secrets in both.
    // Both labs' drivers see one frozen wall clock, so secrets seeded from
    // the time repeat too.
    let twinned = scn.invariants.contains(&Invariant::UnpredictableSecrets);
    let wall = twinned.then(external::FrozenWall::now_whole_second);
    let twin = if twinned {
        Some(
            // Only its secrets are read: no per-step snapshots.
            run_once(
                scn,
                seed,
                mutants,
                StepSnapshots::FinalOnly,
                (None, wall),
                None,
            )
            .await?
            .1,
        )
    } else {
        None
    };
    let recorder = opts.recorder.as_ref();
    Ok(run_once(
        scn,
        seed,
        mutants,
        opts.step_snapshots,
        (twin, wall),
        recorder,
    )
    .await?
    .0)
}

async fn run_once(
    scn: &Scenario,
    seed: u64,
    mutants: &[Mutant],
    step_snapshots: StepSnapshots,
    (twin, wall): (
        Option<BTreeMap<String, Secret>>,
        Option<std::time::SystemTime>,
    ),
    recorder: Option<&crate::runs::Recorder>,
) -> anyhow::Result<(RunOutcome, BTreeMap<String, Secret>)> {
    let log_start = crate::logcap::position();
    let mut lab = Lab::start(scn, seed, mutants, wall).await?;
    lab.recorder = recorder.cloned();
    let result = system::run_steps(&mut lab, scn, step_snapshots).await;
    lab.checkpoint(scn.steps.len());
    let outcome = match result {
        Ok(()) => lab.finish(scn, seed, mutants, log_start, twin).await,
        Err(e) => Err(e),
    };
    lab.stop().await;
    outcome
}

/// What the gate hook may ask of the engine.
/// Holds the lab weakly: the gates own the hook, the hook owns this, and the
/// fakes own the gates — strong references here would keep every run alive.
struct Control {
    crash: driver::DriverCrash,
    fakes: std::sync::Weak<FakeSet>,
    history: History,
    hook: std::sync::Weak<LabHook>,
}

impl Control {
    fn maintenance(&self) -> Option<hook::Maintenance> {
        self.hook.upgrade().map(|h| h.maintenance())
    }
}

impl LabControl for Control {
    fn crash_driver(&self, during: drivelab_fakes::history::CallId) -> BoxFuture<'_, ()> {
        Box::pin(self.crash.crash(during))
    }

    fn restart(&self, component: Component) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.history.record(EventKind::Fault {
                call: None,
                fault: "restart".into(),
                detail: format!("{component} restarting (state kept, connections broken)"),
            });
            // Spawned: the restart breaks the very connection this hook may be running on.
            let Some(fakes) = self.fakes.upgrade() else {
                return;
            };
            let busy = self.maintenance();
            let done = tokio::spawn(async move {
                let r = fakes.restart(component).await;
                drop(busy);
                r
            });
            match done.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.history.record(EventKind::Note {
                        component: Component::Lab,
                        text: format!("restart failed: {e:#}"),
                    });
                }
                Err(e) => {
                    self.history.record(EventKind::Note {
                        component: Component::Lab,
                        text: format!("restart task failed: {e}"),
                    });
                }
            }
        })
    }
}

/// One running lab: fakes, driver, sidecar, and what the engine recorded.
struct Lab {
    _dir: tempfile::TempDir,
    clock: SimClock,
    history: History,
    fakes: Arc<FakeSet>,
    driver: Arc<Driver>,
    hook: Arc<LabHook>,
    sched: Scheduler,
    sidecar: Arc<CosiSidecar>,
    queue: WorkQueue,
    probe: S3Probe,
    admin_secret: Secret,
    /// The driver's bearer token for the Kubernetes API.
    kube_token: Secret,
    converge_within: Duration,
    /// Every object the scenario created, in creation order (labelled first, in this order).
    uids: Vec<String>,
    /// How many of `uids` the normaliser has been given (they only grow).
    uids_labelled: usize,
    /// What the last per-step snapshot read of the kube objects.
    seen: snapshot::Seen,
    /// What the last per-step snapshot showed, kept for the next one.
    kept_lines: snapshot::Kept,
    /// The backend as the last per-step snapshot read it, and the S3 fake's
    /// journal position it is current at.
    backend_seen: Option<(drivelab_fakes::s3::WriteCursor, BackendState)>,
    retries: Vec<RetryObservation>,
    policies_at_grant: BTreeMap<String, BTreeMap<String, PolicyDoc>>,
    /// Every policy document this lab read, each text held once.
    policy_docs: PolicyDocs,
    /// The S3 error codes the probes got, each held once.
    probe_codes: drivelab_fakes::shared::Shared<Arc<str>>,
    account_of: BTreeMap<String, (String, String)>,
    bucket_of: BTreeMap<String, String>,
    lab_buckets: Vec<String>,
    /// Backend objects the lab planted (someone else's), as planted.
    planted: Planted,
    /// Draws the secrets of planted users (by seed).
    planting_rng: ChaCha20Rng,
    class_params: BTreeMap<String, Value>,
    /// The access mode each BucketAccessClass asks for.
    access_modes: BTreeMap<String, GrantedMode>,
    seen_buckets: std::collections::BTreeSet<String>,
    seen_users: std::collections::BTreeSet<String>,
    /// Where `observe_backend` stopped reading the S3 fake's write log.
    seen_cursor: drivelab_fakes::s3::WriteCursor,
    /// Failed expectations and per-step snapshots (the run loop's).
    record: system::StepsRecord,
    not_converged: Vec<String>,
    step_exchanges_from: usize,
    norm: Normalizer,
    recorder: Option<crate::runs::Recorder>,
}

impl system::SystemLab for Lab {
    fn history(&self) -> &History {
        &self.history
    }

    fn hook(&self) -> &LabHook {
        &self.hook
    }

    fn checkpoint(&self, steps_done: usize) {
        Lab::checkpoint(self, steps_done);
    }

    fn begin_step(&mut self) {
        self.step_exchanges_from = self.sidecar.exchange_count();
    }

    fn apply<'a>(
        &'a mut self,
        scn: &'a Scenario,
        i: usize,
        step: &'a crate::scenario::Located<Step>,
        _at: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            match &step.value {
                Step::Cosi(CosiStep::Retry(r)) => self.retry(i, r).await?,
                Step::Concurrent(steps) => self.concurrent(steps).await?,
                Step::Restart(r) => {
                    let c = match r.component {
                        Restartable::S3 | Restartable::Kube => r.component.component(),
                        other => {
                            return Err(anyhow!(
                                "a COSI lab has no {} to restart",
                                other.component()
                            ))
                        }
                    };
                    self.history.record(EventKind::Fault {
                        call: None,
                        fault: "restart".into(),
                        detail: format!("{c} restarting (step)"),
                    });
                    self.fakes.restart(c).await?;
                }
                Step::Cosi(CosiStep::CreateBackendBucket(b)) => {
                    self.create_backend_bucket(i, b).await?
                }
                Step::Cosi(CosiStep::CreateBackendPolicy(p)) => self.plant_policy(i, p).await?,
                Step::Cosi(CosiStep::CreateBackendUser(u)) => self.plant_user(u).await?,
                Step::Cosi(CosiStep::CreateBucket(b)) => self.create_static_bucket(scn, b)?,
                other => {
                    if let Some(target) = self.begin(other)? {
                        self.converge(target).await?;
                        self.after(other)?;
                    }
                }
            }
            Ok(())
        })
    }

    fn expect(&self, e: &Expectation) -> Vec<String> {
        Lab::expect(self, e)
    }

    fn observe(&mut self, _i: usize) {
        self.observe_backend();
    }

    fn render_snapshot(&mut self) -> anyhow::Result<String> {
        Lab::render_snapshot(self)
    }

    fn steps_record(&mut self) -> &mut system::StepsRecord {
        &mut self.record
    }
}

impl Lab {
    async fn start(
        scn: &Scenario,
        seed: u64,
        mutants: &[Mutant],
        wall: Option<std::time::SystemTime>,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("drivelab-")
            .tempdir()
            .context("creating the run directory")?;
        let clock = SimClock::new();
        let history = History::new(clock.clone());
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let admin_secret = Secret::new(random_token(&mut rng, 40));
        let sched = Scheduler::new(seed, history.clone());
        let hook = Arc::new(LabHook::new(history.clone(), sched.clone()));
        let gate = || {
            let g = Gate::new(history.clone());
            g.set_hook(hook.clone());
            g
        };
        let s3_config = S3Config {
            admin_access_key: "drivelab-admin".into(),
            admin_secret_key: admin_secret.expose().to_string(),
            // None configured: any signing region is accepted, as the servers do.
            region: String::new(),
            backend: scn.s3_backend,
        };
        let fakes = FakeSet::start(s3_config, rng.random(), gate(), gate()).await?;
        let planting_rng = ChaCha20Rng::seed_from_u64(rng.random());
        let s3_url = fakes.s3_url();
        let kube = fakes.kube();
        // The lab deploys the driver into its namespace, so it exists before the
        // driver starts (recorded, not written: resourceVersions stay as they were).
        kube.declare_namespace(DRIVER_STATE_NAMESPACE)
            .map_err(|e| anyhow!("creating namespace {DRIVER_STATE_NAMESPACE}: {e}"))?;

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

        // Marked as the lab's: its root-key requests (the canary, planted
        // foreign buckets) are not the driver's calls, in the history or to faults.
        let probe = S3Probe::new(&s3_url, "us-east-1").as_lab(fakes.s3().lab_marker());
        create_lab_bucket(&probe, &admin_secret, CANARY_BUCKET).await?;

        // The driver first: classes carry the name it reports (DriverGetInfo).
        let frozen = wall.map(|at| external::FrozenWall {
            at,
            clock: clock.clone(),
        });
        // The driver's service account, bound to what a COSI driver's RBAC grants.
        let kube_token =
            fakes.kube_token(Grant::cosi_driver(DRIVER_STATE_NAMESPACE, DRIVER_ACCOUNT));
        let (driver, sidecar) = start_driver(
            scn,
            mutants,
            &dir,
            &fakes,
            (&admin_secret, &kube_token, frozen),
            &history,
        )
        .await?;
        hook.set_control(Arc::new(Control {
            crash: driver::DriverCrash {
                driver: Arc::downgrade(&driver),
                crashing: Default::default(),
                history: history.clone(),
                hook: Arc::downgrade(&hook),
                what: "driver",
            },
            fakes: Arc::downgrade(&fakes),
            history: history.clone(),
            hook: Arc::downgrade(&hook),
        }));
        let sidecar = CosiSidecar::connect(&sidecar, fakes.kube_slot(), gate())
            .await
            .context("the sidecar could not reach the driver")?;
        sidecar.set_call_timeout(scn.driver.call_timeout);
        let driver_name = sidecar.driver_name().to_string();
        let placeholders = [
            ("{s3_endpoint}", s3_url.clone()),
            ("{admin_secret_name}", ADMIN_SECRET_NAME.to_string()),
            (
                "{admin_secret_namespace}",
                ADMIN_SECRET_NAMESPACE.to_string(),
            ),
        ];
        let params = |given: &BTreeMap<String, String>| -> Value {
            let mut p: BTreeMap<String, String> = BTreeMap::new();
            p.insert("endpoint".into(), s3_url.clone());
            p.insert("objectStoreUserSecretName".into(), ADMIN_SECRET_NAME.into());
            p.insert(
                "objectStoreUserSecretNamespace".into(),
                ADMIN_SECRET_NAMESPACE.into(),
            );
            for (k, v) in given {
                let mut v = v.clone();
                for (ph, val) in &placeholders {
                    v = v.replace(ph, val);
                }
                p.insert(k.clone(), v);
            }
            json!(p)
        };
        let class_params: BTreeMap<String, serde_json::Value> = scn
            .bucket_classes
            .iter()
            .map(|c| (c.name.clone(), params(&c.parameters)))
            .collect();
        create_classes(
            &kube,
            &driver_name,
            &scn.bucket_classes,
            &scn.access_classes,
            &params,
        )?;

        for f in &scn.faults {
            hook.arm(f.value.clone(), &line_of(&scn.path, f));
        }
        let kube_url_label = fakes.kube_url();
        Ok(Self {
            _dir: dir,
            clock,
            history,
            fakes,
            driver,
            hook,
            sched,
            sidecar: Arc::new(sidecar),
            queue: WorkQueue::default(),
            probe,
            admin_secret,
            kube_token,
            converge_within: scn.converge_within,
            uids: Vec::new(),
            uids_labelled: 0,
            seen: snapshot::Seen::default(),
            kept_lines: snapshot::Kept::default(),
            backend_seen: None,
            retries: Vec::new(),
            policies_at_grant: BTreeMap::new(),
            policy_docs: PolicyDocs::default(),
            probe_codes: Default::default(),
            account_of: BTreeMap::new(),
            bucket_of: BTreeMap::new(),
            lab_buckets: vec![CANARY_BUCKET.to_string()],
            planted: Planted::default(),
            planting_rng,
            class_params,
            access_modes: scn
                .access_classes
                .iter()
                .map(|c| {
                    // Validated with the scenario: a bad value never gets here.
                    let mode = super::requested_mode(&c.parameters).unwrap_or_default();
                    (c.name.clone(), mode)
                })
                .collect(),
            seen_buckets: Default::default(),
            seen_users: Default::default(),
            seen_cursor: Default::default(),
            record: Default::default(),
            not_converged: Vec::new(),
            step_exchanges_from: 0,
            norm: {
                let mut n = Normalizer::default();
                n.fixed(&s3_url, "s3-endpoint");
                n.fixed(&kube_url_label, "kube-url");
                n
            },

            recorder: None,
        })
    }

    /// A step boundary: append what happened since the last one to the run's
    /// durable record, with every secret value known so far redacted.
    fn checkpoint(&self, steps_done: usize) {
        let Some(rec) = &self.recorder else {
            return;
        };
        let mut secrets = vec![self.admin_secret.clone(), self.kube_token.clone()];
        secrets.extend(
            self.fakes
                .s3()
                .users()
                .into_iter()
                .map(|u| Secret::new(u.secret_key)),
        );
        self.sidecar.with_exchanges(|all| {
            for ex in all {
                if let DriverReply::Granted {
                    credentials: Some(c),
                    ..
                } = &ex.reply
                {
                    secrets.push(c.secret.clone());
                }
            }
        });
        // The record is the lab's, not the driver's: failing to write it is
        // logged, never turned into a verdict.
        if let Err(e) = rec.flush(&self.history, steps_done, secrets) {
            tracing::warn!(error = %e, "run record: flush failed");
        }
    }

    /// The ownership snapshot of the state right now.
    fn render_snapshot(&mut self) -> anyhow::Result<String> {
        let (cursor, backend, changed) = self.backend_updated();
        let objects = kube_objects(&self.kube(), &mut self.seen)?;
        let checkpoints = self.checkpoints()?;
        for u in &self.uids[self.uids_labelled..] {
            self.norm.id("uid", u);
        }
        self.uids_labelled = self.uids.len();
        let input = SnapshotInput {
            objects,
            checkpoints,
            backend: &backend,
            backend_changed: changed.as_ref(),
            lab_buckets: &self.lab_buckets,
        };
        let text: String = snapshot::render(&input, &mut self.norm, &mut self.kept_lines);
        self.backend_seen = Some((cursor, backend));
        Ok(text)
    }

    async fn stop(&mut self) {
        self.driver.stop().await;
        self.fakes.stop().await;
    }

    fn kube(&self) -> KubeFake {
        self.fakes.kube()
    }

    /// Remember every backend bucket and user that ever existed (owner-only-delete reads this).
    /// Reads only what was written since the last step (that still exists, as
    /// a full listing would show it): a scan of every user and bucket per step
    /// made a run O(N²) (issue 9).
    fn observe_backend(&mut self) {
        let (written, cursor) = self.fakes.s3().written_since(self.seen_cursor);
        self.seen_cursor = cursor;
        self.seen_buckets.extend(written.buckets);
        self.seen_users.extend(written.users);
    }

    fn create_static_bucket(
        &mut self,
        scn: &Scenario,
        b: &crate::scenario::StaticBucketStep,
    ) -> anyhow::Result<()> {
        let class = scn
            .bucket_classes
            .iter()
            .find(|c| c.name == b.class)
            .ok_or_else(|| anyhow!("no bucket class {}", b.class))?;
        self.kube()
            .create(
                Kind::Bucket,
                json!({
                    "apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "Bucket",
                    "metadata": {"name": b.name},
                    "spec": {
                        "driverName": self.sidecar.driver_name(),
                        "bucketClassName": b.class,
                        "protocols": ["S3"],
                        // An admin copies the class's parameters, connection included.
                        "parameters": self.class_params.get(&b.class).cloned().unwrap_or_else(|| json!({})),
                        "deletionPolicy": class.deletion_policy,
                        "existingBucketID": b.existing_bucket_id,
                    },
                }),
            )
            .map_err(|e| anyhow!("creating Bucket {}: {e}", b.name))?;
        Ok(())
    }

    /// Make the Kubernetes change a step asks for; returns what the sidecar must reconcile.
    fn begin(&mut self, step: &Step) -> anyhow::Result<Option<Target>> {
        Ok(Some(match step {
            Step::Cosi(CosiStep::CreateBucketClaim(c)) => self.create_claim(c)?,
            Step::Cosi(CosiStep::GrantAccess(a)) => self.create_access(a)?,
            Step::Cosi(CosiStep::RevokeAccess(o)) => {
                self.mark_deleted(Kind::BucketAccess, &o.namespace, &o.name)?;
                Target::Access {
                    namespace: o.namespace.clone(),
                    name: o.name.clone(),
                }
            }
            Step::Cosi(CosiStep::DeleteBucketClaim(o)) => {
                self.mark_deleted(Kind::BucketClaim, &o.namespace, &o.name)?;
                Target::Claim {
                    namespace: o.namespace.clone(),
                    name: o.name.clone(),
                }
            }
            _ => return Ok(None),
        }))
    }

    /// Record what a converged step produced.
    fn after(&mut self, step: &Step) -> anyhow::Result<()> {
        match step {
            Step::Cosi(CosiStep::CreateBucketClaim(c)) => self.record_claim(&c.namespace, &c.name),
            Step::Cosi(CosiStep::GrantAccess(a)) => self.record_access(a),
            _ => Ok(()),
        }
    }

    /// Start the steps at once; the scheduler interleaves their requests by seed.
    async fn concurrent(&mut self, steps: &[Step]) -> anyhow::Result<()> {
        let mut targets = Vec::new();
        for s in steps {
            if let Some(t) = self.begin(s)? {
                targets.push(t);
            }
        }
        self.sched.begin(targets.len());
        let mut handles = Vec::new();
        for t in &targets {
            self.sched.actor_started();
            let sidecar = self.sidecar.clone();
            let sched = self.sched.clone();
            let t = t.clone();
            handles.push(tokio::spawn(async move {
                let r = sidecar.reconcile(&t).await;
                sched.actor_done();
                (t, r)
            }));
            // Start the next only when this one is parked at a gate or done, so
            // arrival order (and so the seeded choice) does not depend on timing.
            self.sched.quiescent().await;
        }
        let mut results = Vec::new();
        for h in handles {
            results.push(
                h.await
                    .map_err(|e| anyhow!("a concurrent step panicked: {e}"))?,
            );
        }
        self.sched.end();
        for (t, r) in results {
            let r = r.with_context(|| format!("reconciling {t}"))?;
            self.settle(t, r);
        }
        if let Some(t) = targets.first().cloned() {
            self.converge(t).await?;
        }
        for s in steps {
            self.after(s)?;
        }
        Ok(())
    }

    fn create_claim(&mut self, c: &ClaimStep) -> anyhow::Result<Target> {
        let mut spec = json!({"bucketClassName": c.class, "protocols": ["S3"]});
        if let Some(b) = &c.existing_bucket {
            spec["existingBucketName"] = json!(b);
        }
        let obj = self
            .kube()
            .create(
                Kind::BucketClaim,
                json!({
                    "apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "BucketClaim",
                    "metadata": {"name": c.name, "namespace": c.namespace},
                    "spec": spec,
                }),
            )
            .map_err(|e| anyhow!("creating BucketClaim {}/{}: {e}", c.namespace, c.name))?;
        self.uids.push(str_at(&obj, &["metadata", "uid"]));
        Ok(Target::Claim {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
        })
    }

    /// A bucket someone else owns appears on the backend. Under a claim's
    /// name, only if that claim got a bucket: an earlier fault may have kept
    /// it from ever having one, and then the step says so and does nothing.
    async fn create_backend_bucket(
        &mut self,
        step: usize,
        b: &BackendBucketStep,
    ) -> anyhow::Result<()> {
        let c = match b {
            BackendBucketStep::Named(n) => {
                create_lab_bucket(&self.probe, &self.admin_secret, n).await?;
                self.lab_buckets.push(n.clone());
                return Ok(());
            }
            BackendBucketStep::Planted(p) => return self.plant_bucket(step, p).await,
            BackendBucketStep::NameOfClaim(c) => c,
        };
        // The driver's bucket id is the backend bucket's name (cosi-s3's is).
        let name = match self
            .bucket_of
            .get(&format!("{}/{}#id", c.namespace, c.name))
        {
            None => Err("that claim never got a bucket".to_string()),
            Some(n) if self.backend().buckets.contains_key(n) => Err(format!(
                "its bucket {n} still exists, so the name is not free"
            )),
            Some(n) => Ok(n.clone()),
        };
        let name = match name {
            Ok(n) => n,
            Err(why) => {
                self.record.expect_failures.push(ExpectFailure {
                    step: step + 1,
                    at: String::new(),
                    message: format!(
                        "create_backend_bucket name_of_claim {}/{}: {why}; nothing created",
                        c.namespace, c.name
                    ),
                });
                return Ok(());
            }
        };
        create_lab_bucket(&self.probe, &self.admin_secret, &name).await?;
        self.lab_buckets.push(name);
        Ok(())
    }

    /// A planted object's name; `None` (and a failed expectation saying why,
    /// nothing planted) when it builds on a claim that never got a bucket.
    fn resolve(&mut self, step: usize, n: &BackendName, what: &str) -> Option<String> {
        let (claim, prefix, suffix) = match n {
            BackendName::Absolute(a) => return Some(a.clone()),
            BackendName::OfClaim {
                claim,
                prefix,
                suffix,
            } => (claim, prefix, suffix),
        };
        match self
            .bucket_of
            .get(&format!("{}/{}#id", claim.namespace, claim.name))
        {
            Some(id) => Some(format!("{prefix}{id}{suffix}")),
            None => {
                self.record.expect_failures.push(ExpectFailure {
                    step: step + 1,
                    at: String::new(),
                    message: format!(
                        "{what} {}: claim {}/{} never got a bucket; nothing created",
                        n.describe(),
                        claim.namespace,
                        claim.name
                    ),
                });
                None
            }
        }
    }

    /// One admin API call with the root key, as the lab's own request.
    async fn admin_call(&self, path: &str, body: Value) -> anyhow::Result<()> {
        let r = self
            .probe
            .send(
                "PUT",
                path,
                "drivelab-admin",
                self.admin_secret.expose(),
                body.to_string().into_bytes(),
            )
            .await
            .map_err(|e| anyhow!("PUT {path}: {e}"))?;
        if !(200..300).contains(&r.status) {
            return Err(anyhow!(
                "PUT {path} answered {} {}",
                r.status,
                r.code.unwrap_or_default()
            ));
        }
        Ok(())
    }

    /// A bucket someone else owns, with objects in it.
    async fn plant_bucket(
        &mut self,
        step: usize,
        p: &crate::scenario::PlantedBucket,
    ) -> anyhow::Result<()> {
        let Some(name) = self.resolve(step, &p.name, "create_backend_bucket") else {
            return Ok(());
        };
        create_lab_bucket(&self.probe, &self.admin_secret, &name).await?;
        for key in &p.objects {
            let r = self
                .probe
                .put_object(
                    "drivelab-admin",
                    self.admin_secret.expose(),
                    &name,
                    key,
                    b"planted by the lab".to_vec(),
                )
                .await
                .map_err(|e| anyhow!("planting {name}/{key}: {e}"))?;
            if !(200..300).contains(&r.status) {
                return Err(anyhow!("planting {name}/{key} answered {}", r.status));
            }
        }
        self.lab_buckets.push(name.clone());
        self.planted.buckets.insert(name, p.objects.clone());
        Ok(())
    }

    /// A canned policy someone else manages: read and write on one bucket,
    /// with a statement id the driver's own documents never carry.
    async fn plant_policy(&mut self, step: usize, p: &BackendPolicyStep) -> anyhow::Result<()> {
        let Some(bucket) = self.resolve(step, &p.bucket, "create_backend_policy") else {
            return Ok(());
        };
        let doc = json!({
            "Version": "2012-10-17",
            "Statement": [{
                "Sid": "ManagedOutsideTheDriver",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket", "s3:GetBucketLocation"],
                "Resource": [format!("arn:aws:s3:::{bucket}"), format!("arn:aws:s3:::{bucket}/*")],
            }]
        });
        self.admin_call(
            &format!("/rustfs/admin/v3/add-canned-policy?name={}", p.name),
            doc,
        )
        .await
        .with_context(|| format!("planting policy {}", p.name))?;
        let stored = self
            .fakes
            .s3()
            .policy(&p.name)
            .ok_or_else(|| anyhow!("planted policy {} is not on the backend", p.name))?;
        self.planted
            .policies
            .insert(p.name.clone(), self.policy_docs.doc(&stored.document));
        Ok(())
    }

    /// A user someone else manages, with a random secret and its policies.
    async fn plant_user(&mut self, u: &BackendUserStep) -> anyhow::Result<()> {
        let secret = Secret::new(random_token(&mut self.planting_rng, 40));
        self.admin_call(
            &format!("/rustfs/admin/v3/add-user?accessKey={}", u.access_key),
            json!({"secretKey": secret.expose(), "status": "enabled"}),
        )
        .await
        .with_context(|| format!("planting user {}", u.access_key))?;
        if !u.policies.is_empty() {
            self.admin_call(
                &format!(
                    "/rustfs/admin/v3/set-user-or-group-policy?policyName={}&userOrGroup={}&isGroup=false",
                    u.policies.join(","),
                    u.access_key
                ),
                json!({}),
            )
            .await
            .with_context(|| format!("attaching policies to planted user {}", u.access_key))?;
        }
        let v = self
            .fakes
            .s3()
            .user(&u.access_key)
            .ok_or_else(|| anyhow!("planted user {} is not on the backend", u.access_key))?;
        self.planted.users.insert(
            u.access_key.clone(),
            UserState {
                secret: Secret::new(v.secret_key),
                status: v.status,
                policies: v.policies,
            },
        );
        Ok(())
    }

    fn record_claim(&mut self, ns: &str, name: &str) -> anyhow::Result<()> {
        if let Some(claim) = self.kube().get(Kind::BucketClaim, Some(ns), name)? {
            let b = str_at(&claim, &["status", "bucketName"]);
            if !b.is_empty() {
                let id = self
                    .kube()
                    .get(Kind::Bucket, None, &b)?
                    .map(|o| str_at(&o, &["status", "bucketID"]))
                    .unwrap_or_default();
                // Retries address the bucket by the name the sidecar sent (create) or its id (delete).
                self.bucket_of.insert(format!("{ns}/{name}"), b);
                if !id.is_empty() {
                    self.bucket_of.insert(format!("{ns}/{name}#id"), id);
                }
            }
        }
        Ok(())
    }

    fn create_access(&mut self, a: &AccessStep) -> anyhow::Result<Target> {
        let secret_name = a
            .credentials_secret
            .clone()
            .unwrap_or_else(|| format!("{}-creds", a.name));
        let obj = self
            .kube()
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
        self.account_of.insert(
            format!("{}/{}", a.namespace, a.name),
            (format!("ba-{uid}"), String::new()),
        );
        Ok(Target::Access {
            namespace: a.namespace.clone(),
            name: a.name.clone(),
        })
    }

    fn record_access(&mut self, a: &AccessStep) -> anyhow::Result<()> {
        let key = format!("{}/{}", a.namespace, a.name);
        let secret_name = a
            .credentials_secret
            .clone()
            .unwrap_or_else(|| format!("{}-creds", a.name));
        let account_id = self
            .kube()
            .get(Kind::BucketAccess, Some(&a.namespace), &a.name)?
            .map(|o| str_at(&o, &["status", "accountID"]))
            .unwrap_or_default();
        if let Some(entry) = self.account_of.get_mut(&key) {
            entry.1 = account_id;
        }
        // What this grant's user may do right after it converged; a later grant must not change it.
        // Only this user and its policies: a whole backend() snapshot per grant is O(N).
        if let Some(creds) = self.current_credentials(&a.namespace, &secret_name)? {
            let s3 = self.fakes.s3();
            let docs = s3
                .user(&creds.0)
                .map(|u| {
                    u.policies
                        .iter()
                        .filter_map(|p| {
                            let doc = s3.policy(p)?.document;
                            Some((p.clone(), self.policy_docs.doc(&doc)))
                        })
                        .collect()
                })
                .unwrap_or_default();
            self.policies_at_grant.insert(key, docs);
        }
        Ok(())
    }

    fn mark_deleted(&mut self, kind: Kind, ns: &str, name: &str) -> anyhow::Result<()> {
        // As `kubectl delete`: the API server marks it; the sidecar's finalizer keeps it until cleanup.
        self.kube()
            .delete(kind, Some(ns), name)
            .map_err(|e| anyhow!("deleting {ns}/{name}: {e}"))?;
        Ok(())
    }

    /// Reconcile `target` (and anything else queued) until the queue is empty or
    /// the step's virtual-time window closes.
    async fn converge(&mut self, target: Target) -> anyhow::Result<()> {
        self.queue.push(self.clock.now(), target);
        self.drain(self.converge_within).await
    }

    /// Why an object is not where an expectation wanted it, from the history:
    /// the sidecar's last requeue note for it and the driver's reply just
    /// before (code and message). Empty when the sidecar never requeued it.
    fn why(&self, t: &Target) -> String {
        let events = self.history.events();
        let prefix = format!("requeue {t} in ");
        let Some(at) = events.iter().rposition(
            |e| matches!(&e.kind, EventKind::Note { text, .. } if text.starts_with(&prefix)),
        ) else {
            return String::new();
        };
        let EventKind::Note { text: note, .. } = &events[at].kind else {
            return String::new();
        };
        let driver_calls: std::collections::BTreeMap<_, _> = events[..at]
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Call { id, to, op, .. } if *to == Component::Driver => {
                    Some((*id, op.clone()))
                }
                _ => None,
            })
            .collect();
        let reply = events[..at].iter().rev().find_map(|e| match &e.kind {
            EventKind::Reply { id, outcome } => driver_calls.get(id).map(|op| (op, outcome)),
            _ => None,
        });
        let answered = match reply {
            Some((op, drivelab_fakes::history::Outcome::Grpc { code, message }))
                if !message.is_empty() =>
            {
                format!("; the driver last answered {op} with {code}: {message}")
            }
            Some((op, o)) => format!("; the driver last answered {op} with {}", o.label()),
            None => String::new(),
        };
        format!("{answered}; the sidecar's last word: {note}")
    }

    /// Act on one reconcile's result: done, or back on the queue after its back-off.
    fn settle(&mut self, t: Target, r: Reconcile) {
        // What the sidecar's own writes changed reaches it again, as a watch event would.
        for woken in self.sidecar.take_woken() {
            self.queue.push(self.clock.now(), woken);
        }
        if let Reconcile::Requeue { after, reason } = r {
            self.history.record(EventKind::Note {
                component: Component::Sidecar,
                text: format!("requeue {t} in {}ms: {reason}", after.as_millis()),
            });
            self.queue.push(self.clock.now().after(after), t);
        }
    }

    async fn drain(&mut self, within: Duration) -> anyhow::Result<()> {
        let deadline = queue::deadline(&self.clock, within);
        while let Some((at, t)) = self.queue.pop_due(deadline) {
            self.clock.advance_to(at);
            let r = self
                .sidecar
                .reconcile(&t)
                .await
                .with_context(|| format!("reconciling {t}"))?;
            // A crash fired inside this reconcile restarts the driver, whose
            // start-up calls otherwise race this requeue note in the history.
            self.hook.until_idle().await;
            self.settle(t, r);
        }
        for (at, t) in self.queue.pending() {
            let msg = format!(
                "{t} still pending at {} (next attempt at {at})",
                self.clock.now()
            );
            self.history.record(EventKind::Note {
                component: Component::Lab,
                text: format!("not converged: {msg}"),
            });
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
            RetryOp::CreateBucketClaim => {
                (DriverOp::CreateBucket, self.bucket_of.get(&obj).cloned())
            }
            RetryOp::DeleteBucketClaim => (
                DriverOp::DeleteBucket,
                self.bucket_of.get(&format!("{obj}#id")).cloned(),
            ),
            RetryOp::GrantAccess => (
                DriverOp::GrantBucketAccess,
                self.account_of.get(&obj).map(|a| a.0.clone()),
            ),
            RetryOp::RevokeAccess => (
                DriverOp::RevokeBucketAccess,
                self.account_of.get(&obj).map(|a| a.1.clone()),
            ),
        };
        let original = key.and_then(|key| {
            self.sidecar
                .exchanges()
                .into_iter()
                .rev()
                .find(|e| !e.replay && e.request.op() == op && e.request.key() == key)
        });
        let Some(original) = original else {
            self.record.expect_failures.push(ExpectFailure {
                step: step + 1,
                at: String::new(),
                message: format!(
                    "retry {} {obj}: the sidecar never sent that request, nothing to retry",
                    r.op.keyword()
                ),
            });
            return Ok(());
        };
        let auth = r.authentication_type.as_deref().map(auth_code);
        let before = self.backend();
        let from = self.history.len();
        let retried = self
            .sidecar
            .replay(original.request.clone(), r.parameters.as_ref(), auth)
            .await;
        let after = self.backend();
        let changed_request = retried.request != original.request;
        // A retry runs alone (never in `concurrent`), so the faults fired
        // meanwhile on the driver's own calls are this retry's.
        let backend_faulted = driver_call_faulted(&self.history.events_from(from));
        self.retries.push(RetryObservation {
            step,
            original,
            retried,
            before,
            after,
            changed_request,
            backend_faulted,
        });
        Ok(())
    }

    fn expect(&self, e: &Expectation) -> Vec<String> {
        let mut fails = Vec::new();
        let all = self.sidecar.exchanges();
        let step_exchanges = &all[self.step_exchanges_from.min(all.len())..];
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
                .kube()
                .get(Kind::BucketClaim, Some(&e.namespace), claim)
                .ok()
                .flatten()
                .map(|o| bool_at(&o, &["status", "bucketReady"]))
                .unwrap_or(false);
            if got != want {
                let why = self.why(&Target::Claim {
                    namespace: e.namespace.clone(),
                    name: claim.clone(),
                });
                fails.push(format!(
                    "claim {}/{claim}: bucketReady is {got}, expected {want}{why}",
                    e.namespace
                ));
            }
        }
        if let (Some(access), Some(want)) = (&e.access, e.granted) {
            let got = self
                .kube()
                .get(Kind::BucketAccess, Some(&e.namespace), access)
                .ok()
                .flatten()
                .map(|o| bool_at(&o, &["status", "accessGranted"]))
                .unwrap_or(false);
            if got != want {
                let why = self.why(&Target::Access {
                    namespace: e.namespace.clone(),
                    name: access.clone(),
                });
                fails.push(format!(
                    "access {}/{access}: accessGranted is {got}, expected {want}{why}",
                    e.namespace
                ));
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
            check(
                &mut fails,
                "buckets",
                counts.buckets,
                b.buckets
                    .keys()
                    .filter(|k| !self.lab_buckets.contains(k))
                    .count(),
            );
            // Planted users and policies are someone else's: not counted.
            let users = b
                .users
                .keys()
                .filter(|k| !self.planted.users.contains_key(*k))
                .count();
            check(&mut fails, "users", counts.users, users);
            let policies = b
                .driver_policies()
                .filter(|(n, _)| !self.planted.policies.contains_key(*n))
                .count();
            check(&mut fails, "policies", counts.policies, policies);
        }
        if let Some(calls) = &e.driver_calls {
            for (rpc, want) in calls {
                let got = self
                    .sidecar
                    .exchanges()
                    .iter()
                    .filter(|x| x.request.op().rpc() == rpc)
                    .count();
                if got != *want {
                    fails.push(format!(
                        "the sidecar made {got} {rpc} calls, expected {want}"
                    ));
                }
            }
        }
        fails
    }

    fn backend(&self) -> BackendState {
        // Decoded once (each read decodes every policy document from the
        // store), and each document kept as its text as soon as it is read.
        let policies = self
            .fakes
            .s3()
            .policies_as(|p| (p.name, p.builtin, self.policy_docs.doc(&p.document)));
        BackendState {
            users: self
                .fakes
                .s3()
                .users()
                .into_iter()
                .map(|u| (u.access_key.clone(), user_state(u)))
                .collect(),
            builtin_policies: policies
                .iter()
                .filter(|(_, builtin, _)| *builtin)
                .map(|(name, _, _)| name.clone())
                .collect(),
            policies: policies
                .into_iter()
                .map(|(name, _, doc)| (name, doc))
                .collect(),
            buckets: self
                .fakes
                .s3()
                .buckets()
                .into_iter()
                .map(|b| (b.name, b.objects))
                .collect(),
        }
    }

    /// The backend after the probes, read before them as `before` at
    /// `cursor`. The probes write objects only: when the fake's log says
    /// only buckets changed since, the record's backend is `before` with
    /// those buckets read again, not a second copy of every user and policy
    /// (~1 KB a grant, held beside the first through the end's render).
    fn backend_probed(
        &self,
        before: &BackendState,
        cursor: drivelab_fakes::s3::WriteCursor,
    ) -> Probed {
        let s3 = self.fakes.s3();
        let probed = match s3.changed_since(cursor).0 {
            Some(c) if c.users.is_empty() && c.policies.is_empty() => {
                let mut buckets = BTreeMap::new();
                refresh(&mut buckets, &c.buckets, |name| s3.bucket_objects(name));
                Probed::Buckets(c.buckets, buckets)
            }
            // Something else was written (or the fake restarted): all of it again.
            _ => Probed::Read(Box::new(self.backend())),
        };
        // Every test and `make e2e` scenario checks it is the backend read again.
        #[cfg(debug_assertions)]
        if let Probed::Buckets(..) = &probed {
            let state = probed.clone().into_state(before.clone());
            assert!(
                state == self.backend(),
                "the backend after the probes is not the backend read again"
            );
        }
        #[cfg(not(debug_assertions))]
        let _ = before;
        probed
    }

    /// The backend as [`Lab::backend`] reads it, kept between per-step
    /// snapshots and re-read only where the S3 fake's journal says it was
    /// written since (every user and policy record was decoded each step).
    /// Taken out of `backend_seen`: the caller puts it back. With it, what
    /// was written since the snapshot that last put it back (`None`: the
    /// first snapshot, or after a restart: take everything as new).
    fn backend_updated(
        &mut self,
    ) -> (
        drivelab_fakes::s3::WriteCursor,
        BackendState,
        Option<drivelab_fakes::s3::ChangedNames>,
    ) {
        let s3 = self.fakes.s3();
        let seen = self.backend_seen.take();
        let first = seen.is_none();
        let (cursor, mut state) = seen.unwrap_or_default();
        let (changed, next) = s3.changed_since(cursor);
        match &changed {
            // Another instance (a restart) or the first read: read it all.
            None => state = self.backend(),
            Some(changed) => {
                refresh(&mut state.users, &changed.users, |ak| {
                    s3.user(ak).map(user_state)
                });
                let builtin = &mut state.builtin_policies;
                refresh(&mut state.policies, &changed.policies, |name| {
                    let p = s3.policy(name);
                    match &p {
                        Some(p) if p.builtin => builtin.insert(name.to_string()),
                        _ => builtin.remove(name),
                    };
                    p.map(|p| self.policy_docs.doc(&p.document))
                });
                refresh(&mut state.buckets, &changed.buckets, |name| {
                    s3.bucket_objects(name)
                });
            }
        }
        // Every test and `make e2e` scenario checks the kept view against a
        // full read, unless something was written meanwhile (a driver may
        // write in the background).
        #[cfg(debug_assertions)]
        {
            let full = self.backend();
            if s3.changed_since(next).0 == Some(Default::default()) {
                assert_eq!(state, full, "the kept backend view drifted");
            }
        }
        (next, state, changed.filter(|_| !first))
    }

    fn current_credentials(
        &self,
        ns: &str,
        secret_name: &str,
    ) -> anyhow::Result<Option<(String, Secret)>> {
        let sec = self
            .kube()
            .get_shared(Kind::Secret, Some(ns), secret_name)?;
        Ok(sec.as_deref().and_then(credentials_in))
    }

    /// The accesses granted and not being deleted, with the credentials
    /// workloads would use. Called once, at the end of a run: each access's
    /// policies at grant move into it.
    fn live_accesses(
        &mut self,
        accesses: &[snapshot::Viewed<snapshot::AccessView>],
        secrets: &[snapshot::CredentialSecret],
    ) -> Vec<LiveAccess> {
        let secrets: HashMap<&str, &snapshot::CredentialSecret> =
            secrets.iter().map(|s| (&*s.key, s)).collect();
        let mut live = Vec::new();
        for a in accesses.iter().map(|a| &a.view) {
            if !a.granted || a.deleting {
                continue;
            }
            let secret = secrets.get(format!("{}/{}", a.namespace, a.secret_name).as_str());
            let info = secret.and_then(|s| s.info.as_deref());
            live.push(LiveAccess {
                name: a.name().to_string(),
                account_name: format!("ba-{}", a.uid),
                account_id: a.account_id.to_string(),
                bucket_id: a.bucket_id.to_string(),
                credentials: info.map(|i| (i.access_key_id.clone(), i.access_secret_key.clone())),
                policies_at_grant: self.policies_at_grant.remove(a.name()).unwrap_or_default(),
                mode: self
                    .access_modes
                    .get(&*a.class)
                    .copied()
                    .unwrap_or_default(),
            });
        }
        live
    }

    /// The objects in the driver's state namespace (its checkpoints).
    fn checkpoints(&self) -> anyhow::Result<Vec<(&'static str, Stored)>> {
        let kube = self.kube();
        let ns = Some(DRIVER_STATE_NAMESPACE);
        let secrets = kube.list_stored(Kind::Secret, ns)?.into_iter();
        let maps = kube.list_stored(Kind::ConfigMap, ns)?.into_iter();
        Ok(secrets
            .map(|o| ("secret", o))
            .chain(maps.map(|o| ("configmap", o)))
            .collect())
    }

    /// Every secret value the run created or handed out (what no-secret-leak searches for).
    fn run_secrets(
        &self,
        backend: &BackendState,
        exchanges: &[Exchange],
        live: &[LiveAccess],
    ) -> Vec<Secret> {
        let mut secrets: Vec<Secret> = vec![self.admin_secret.clone(), self.kube_token.clone()];
        secrets.extend(backend.users.values().map(|u| u.secret.clone()));
        for r in &self.retries {
            secrets.extend(
                r.before
                    .users
                    .values()
                    .chain(r.after.users.values())
                    .map(|u| u.secret.clone()),
            );
        }
        for ex in exchanges {
            if let DriverReply::Granted {
                credentials: Some(c),
                ..
            } = &ex.reply
            {
                secrets.push(c.secret.clone());
            }
        }
        secrets.extend(
            live.iter()
                .filter_map(|a| a.credentials.as_ref().map(|c| c.1.clone())),
        );
        secrets.sort();
        secrets.dedup();
        secrets
    }

    /// Heal, converge, observe and judge: the run's outcome, and the secret
    /// each account was handed (what a twin run is compared with).
    async fn finish(
        &mut self,
        scn: &Scenario,
        seed: u64,
        mutants: &[Mutant],
        log_start: usize,
        twin: Option<BTreeMap<String, Secret>>,
    ) -> anyhow::Result<(RunOutcome, BTreeMap<String, Secret>)> {
        // Faults off, partitions healed: does everything converge now?
        self.hook.disarm_all();
        crate::phases::phase("steps done");
        self.history.record(EventKind::Step {
            index: scn.steps.len(),
            name: "final convergence (faults healed)".into(),
        });
        self.drain(self.converge_within).await?;
        crate::phases::phase("final convergence");
        let stuck = self.stuck();
        // What the per-step snapshots kept is of no use from here on.
        self.kept_lines = Default::default();
        self.seen = Default::default();
        self.backend_seen = None;

        // Each object viewed one at a time: the fake may hold it as text,
        // and decoding every one at once held all their trees together.
        let objects = kube_objects(&self.kube(), &mut snapshot::Seen::default())?;
        let live = self.live_accesses(&objects.accesses, &objects.credential_secrets);
        // Their views and BucketInfos are their own: holding no stored
        // version, they let the fake's copies go with it below.
        let objects = objects.unpinned();
        let checkpoints = self.checkpoints()?;
        crate::phases::phase("views, live accesses, checkpoints");
        // An external driver's own output is searched for leaks too (a
        // builtin has none). Read before the history: it notes what it held
        // back of a flood; and before the kube fake goes, which a driver's
        // own loop might then log failing to reach.
        let driver_output = self.driver.output();
        // Everything the end reads of the kube fake is read by now; the
        // probes below need only the S3 fake.
        self.fakes.release(Component::Kube).await?;
        crate::phases::phase("kube fake released");
        // The last snapshot and the record read only these parts of the
        // checkpoints. Made once the rest of the fake is let go of, each
        // text let go of as its part is made, and on the runtime's worker,
        // which allocated the texts: freed there, each is room for the next
        // part (made while the fake was held, the parts were the end's peak).
        let checkpoints = tokio::spawn(async move {
            let parts = (checkpoints.into_iter())
                .map(|(kind, o)| (kind, snapshot::checkpoint_part(&o)))
                .collect::<Vec<_>>();
            crate::alloc::collect();
            parts
        })
        .await
        .context("reducing the checkpoints to what the end reads")?;
        crate::phases::phase("checkpoints reduced");

        let lab_buckets = self.lab_buckets.clone();
        let bucket_objects: Vec<(String, String)> = (objects.buckets.iter())
            .map(|b| (b.view.name().to_string(), b.view.bucket_id.to_string()))
            .collect();
        let ready_claims = ready_claims(&objects.claims, &bucket_objects);
        self.observe_backend();
        let backend = self.backend();
        crate::phases::phase("backend read");

        // Moved out for the probes to read; any the sidecar records meanwhile
        // join them after.
        let mut exchanges: Vec<Exchange> = self.sidecar.take_exchanges();
        let before_probes = self.fakes.s3().cursor();
        let probes = self.probe_all(&live, &exchanges).await;
        exchanges.extend(self.sidecar.take_exchanges());
        crate::phases::phase("probes");
        // The record observes the backend again, after the probes' writes.
        let probed = self.backend_probed(&backend, before_probes);
        let history = self.history.take_events();
        // Everything the end reads of the fakes is read by now: the labelling
        // and judging below (most of the end's time) need nothing they hold.
        self.fakes.release(Component::S3).await?;
        crate::phases::phase("history taken, S3 fake released");

        // The snapshot shows what was read before the probes: what they
        // wrote is not the driver's doing.
        let mut norm = std::mem::take(&mut self.norm);
        // The last snapshot: nothing it relabels is asked for again.
        norm.forget_lines();
        let input = SnapshotInput {
            objects,
            checkpoints,
            backend: &backend,
            backend_changed: None,
            lab_buckets: &lab_buckets,
        };
        // Nothing kept: the objects were read afresh after the last step,
        // and no snapshot follows. Packed as it is written: held to the
        // run's end, the text was about a kilobyte a grant.
        let snapshot =
            snapshot::render::<PackedWriter>(&input, &mut norm, &mut snapshot::Kept::last())
                .finish();
        let SnapshotInput {
            objects,
            checkpoints,
            ..
        } = input;
        drop(objects);
        crate::phases::phase("final snapshot");
        // Made after the snapshot from the checkpoints as they go: held
        // beside them through the render, it was ~1 KB a grant.
        let checkpoint_text = checkpoint_text(checkpoints)?;
        crate::phases::phase("checkpoint text");
        let handed_out = handed_out(&exchanges);
        let secrets = self.run_secrets(&backend, &exchanges, &live);

        // What reports write: ids labelled like the snapshot, so two runs diff cleanly.
        // Keys of accesses gone by the end appear only in the history: label them
        // in exchange order (deterministic by seed).
        for ex in &exchanges {
            if let DriverReply::Granted {
                account_id,
                credentials,
                ..
            } = &ex.reply
            {
                norm.id("account", account_id);
                if let Some(c) = credentials {
                    norm.id("key", &c.access_key_id);
                }
            }
        }
        let logs = crate::logcap::since(log_start);
        let (leak_scan, history_text) = crate::checks::LeakScan::of_run(
            &secrets,
            &crate::checks::RunTexts {
                snapshot: &snapshot,
                log: &logs,
                driver_outputs: &[driver_output.as_str()],
            },
            &history,
            &mut norm,
        );
        // Its labels and automaton are of no use once the history is
        // labelled, and would be held through the seal, the run's peak.
        drop(norm);
        crate::phases::phase("history labelled, leak scan");
        let secret_shapes = checks::lifecycle::secret_shapes(&exchanges);
        let obs = Observations {
            exchanges,
            retries: self.retries.clone(),
            live,
            backend: probed.into_state(backend),
            probes,
            stuck,
            rejected_on_purpose: scn.rejected_on_purpose.clone(),
            lab_buckets: lab_buckets.clone(),
            said_taken: said_taken(&history),
            seen_buckets: self.seen_buckets.clone(),
            seen_users: self.seen_users.clone(),
            checkpoint_text,
            bucket_objects,
            ready_claims,
            twin_secrets: twin,
            secret_shapes,
            leak_scan,
            planted: self.planted.clone(),
        };
        let (record, verdicts) =
            Record::new(scn, Observed::Cosi(Box::new(obs))).seal_and_judge(&history)?;
        crate::phases::phase("sealed and judged");
        let outcome = RunOutcome {
            scenario: scn.name.clone(),
            path: scn.path.clone(),
            seed,
            mutants: mutants.to_vec(),
            driver_name: self.sidecar.driver_name().to_string(),
            verdicts,
            record,
            expect_failures: self.record.expect_failures.clone(),
            expect_not_exercised: self.record.expect_not_exercised.clone(),
            unfired_faults: self.hook.unfired(),
            faults_armed: self.hook.armed_count(),
            not_converged: self.not_converged.clone(),
            figures: Vec::new(),
            scale: None,
            snapshot,
            history,
            history_text,
            step_snapshots: std::mem::take(&mut self.record.step_snapshots),
            claims: scn.claims.clone(),
            replay: replay_command(scn, seed, mutants),
            secrets,
        };
        Ok((outcome, handed_out))
    }

    /// Objects still queued after the final convergence, with the last answer they got.
    fn stuck(&self) -> Vec<Stuck> {
        // Read in place: a copy of every exchange was a kilobyte a grant.
        self.sidecar
            .with_exchanges(|exchanges| self.stuck_in(exchanges))
    }

    fn stuck_in(&self, exchanges: &[Exchange]) -> Vec<Stuck> {
        self.queue
            .pending()
            .into_iter()
            .map(|(_, t)| {
                let keys: Vec<String> = match &t {
                    Target::Claim { namespace, name } => {
                        let o = format!("{namespace}/{name}");
                        [
                            self.bucket_of.get(&o),
                            self.bucket_of.get(&format!("{o}#id")),
                        ]
                        .into_iter()
                        .flatten()
                        .cloned()
                        .collect()
                    }
                    Target::Access { namespace, name } => self
                        .account_of
                        .get(&format!("{namespace}/{name}"))
                        .map(|(a, b)| vec![a.clone(), b.clone()])
                        .unwrap_or_default(),
                };
                let mine: Vec<&Exchange> = exchanges
                    .iter()
                    .filter(|e| {
                        !e.replay && keys.iter().any(|k| !k.is_empty() && k == e.request.key())
                    })
                    .collect();
                let claim = match &t {
                    Target::Access { namespace, name } => self
                        .kube()
                        .get(Kind::BucketAccess, Some(namespace), name)
                        .ok()
                        .flatten()
                        .map(|a| {
                            format!("{namespace}/{}", str_at(&a, &["spec", "bucketClaimName"]))
                        }),
                    Target::Claim { namespace, name } => Some(format!("{namespace}/{name}")),
                };
                Stuck {
                    target: t.to_string(),
                    last_op: mine.last().map(|e| e.request.op().rpc().to_string()),
                    last_code: mine.last().map(|e| e.reply.code_name()),
                    attempts: mine.len(),
                    calls: mine.iter().map(|e| e.call).collect(),
                    last_key: mine.last().map(|e| e.request.key().to_string()),
                    claim,
                }
            })
            .collect()
    }

    /// Signed reads (GetObject of an object the lab put there first) and
    /// writes (PutObject) with handed-out credentials: own bucket, the canary
    /// and every other live access's bucket with the current credentials; a
    /// read of its own bucket with every credential an earlier reply handed out.
    async fn probe_all(&mut self, live: &[LiveAccess], exchanges: &[Exchange]) -> Vec<Probe> {
        // Every credential handed out, by account, in reply order: looked up
        // per live access, a scan of every exchange each was quadratic (10⁵
        // grants: 10¹⁰ name comparisons, minutes of the run's end).
        let mut handed_to: HashMap<&str, Vec<&S3Credentials>> = HashMap::new();
        for (name, c) in credentials_granted(exchanges) {
            handed_to.entry(name).or_default().push(c);
        }
        let mut out = Vec::new();
        let mut targets: Vec<String> = live.iter().map(|a| a.bucket_id.clone()).collect();
        targets.push(CANARY_BUCKET.to_string());
        // No credentials may reach a bucket someone else owns, least of all
        // one whose name merely starts with a granted bucket's.
        targets.extend(self.planted.buckets.keys().cloned());
        targets.sort();
        targets.dedup();
        let backend = self.fakes.s3().buckets();
        for bucket in &targets {
            // A bucket gone by now gets NoSuchBucket from every probe: no seed to put.
            if backend.iter().any(|b| b.name == *bucket) {
                self.seed_object(bucket).await;
            }
        }
        // Each string a probe holds is shared with the other probes that
        // name the same access, key or bucket.
        let targets: Vec<Arc<str>> = targets.into_iter().map(Arc::from).collect();
        for a in live {
            let access: Arc<str> = a.name.as_str().into();
            let own_bucket = (targets.iter())
                .find(|t| ***t == *a.bucket_id)
                .cloned()
                .unwrap_or_else(|| a.bucket_id.as_str().into());
            if let Some((key, secret)) = &a.credentials {
                let who = ProbeAs {
                    access: access.clone(),
                    key: key.as_str().into(),
                    secret,
                };
                for bucket in &targets {
                    let granted = **bucket == *a.bucket_id;
                    for op in [ProbeOp::Read, ProbeOp::Write] {
                        let allowed = granted && a.mode.allows(op);
                        let what = (op, granted, allowed);
                        let probe = self.one_probe(&who, bucket, what, ProbePurpose::Current);
                        out.push(probe.await);
                    }
                }
            }
            // Borrowed, not taken: two live accesses may name one account.
            let handed = handed_to.get(a.account_name.as_str()).into_iter().flatten();
            let mut seen: Vec<&Secret> = Vec::new();
            for c in handed {
                let secret = &c.secret;
                if seen.contains(&secret) || a.credentials.as_ref().is_some_and(|c| c.1 == *secret)
                {
                    continue;
                }
                seen.push(secret);
                let who = ProbeAs {
                    access: access.clone(),
                    key: c.access_key_id.as_str().into(),
                    secret,
                };
                let what = (ProbeOp::Read, true, true);
                let probe = self.one_probe(&who, &own_bucket, what, ProbePurpose::HandedOut);
                out.push(probe.await);
            }
        }
        out
    }

    /// The object read probes fetch, put with the admin key as the lab's own request.
    async fn seed_object(&self, bucket: &str) {
        let r = self
            .probe
            .put_object(
                "drivelab-admin",
                self.admin_secret.expose(),
                bucket,
                PROBE_SEED_OBJECT,
                b"drivelab read probe".to_vec(),
            )
            .await;
        if let Err(e) = r {
            // The read probes then fail visibly (NoSuchKey), never pass silently.
            tracing::warn!(bucket, error = %e, "could not put the read-probe object");
        }
    }

    /// One signed request; `what` is (read or write, granted this bucket, must succeed).
    async fn one_probe(
        &mut self,
        who: &ProbeAs<'_>,
        bucket: &Arc<str>,
        what: (ProbeOp, bool, bool),
        purpose: ProbePurpose,
    ) -> Probe {
        let (op, granted, allowed) = what;
        let (key, secret) = (&*who.key, who.secret);
        let object = format!("drivelab-probe/{}", who.access.replace('/', "-"));
        let calls_before = self.history.len();
        let reply = match op {
            ProbeOp::Write => {
                self.probe
                    .put_object(
                        key,
                        secret.expose(),
                        bucket,
                        &object,
                        b"drivelab probe".to_vec(),
                    )
                    .await
            }
            ProbeOp::Read => {
                self.probe
                    .get_object(key, secret.expose(), bucket, PROBE_SEED_OBJECT)
                    .await
            }
        };
        let call = drivelab_fakes::history::calls(&self.history.events_from(calls_before))
            .last()
            .map(|c| c.id);
        let (status, code) = match reply {
            Ok(r) => (r.status, r.code),
            Err(e) => (0, Some(format!("probe failed: {e}"))),
        };
        Probe {
            access: who.access.clone(),
            access_key: who.key.clone(),
            bucket: bucket.clone(),
            granted_bucket: granted,
            op,
            allowed,
            purpose,
            status,
            code: code.map(|c| self.probe_codes.get(c.into())),
            call,
        }
    }
}

/// Whom a probe is made as: the access, and the key and secret it signs
/// with (each string shared by the probes made as it).
struct ProbeAs<'a> {
    access: Arc<str>,
    key: Arc<str>,
    secret: &'a Secret,
}

/// The object the lab puts in every probed bucket for read probes to fetch.
const PROBE_SEED_OBJECT: &str = "drivelab-probe/seed";

/// Decoded data of a driver checkpoint object, for "is this id recorded anywhere".
/// The COSI classes as a cluster admin would create them, connection
/// parameters filled in by `params` (scenarios and `drivelab serve` share this).
pub(crate) fn create_classes(
    kube: &drivelab_fakes::kube::KubeFake,
    driver_name: &str,
    bucket_classes: &[crate::scenario::BucketClassSpec],
    access_classes: &[crate::scenario::AccessClassSpec],
    params: &dyn Fn(&BTreeMap<String, String>) -> serde_json::Value,
) -> anyhow::Result<()> {
    for c in bucket_classes {
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
    for c in access_classes {
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
    Ok(())
}

/// Read each of `names` into `map` again, or drop it where `read` finds it gone.
fn refresh<T>(
    map: &mut BTreeMap<String, T>,
    names: &std::collections::BTreeSet<String>,
    mut read: impl FnMut(&str) -> Option<T>,
) {
    for name in names {
        match read(name) {
            Some(v) => {
                map.insert(name.clone(), v);
            }
            None => {
                map.remove(name);
            }
        }
    }
}

/// A user as the checks see it.
fn user_state(u: drivelab_fakes::s3::UserView) -> UserState {
    UserState {
        secret: Secret::new(u.secret_key),
        status: u.status,
        policies: u.policies,
    }
}

/// The record's text of the driver's checkpoints (see
/// [`append_checkpoint_text`]), each let go of once written.
fn checkpoint_text(checkpoints: Vec<(&'static str, Stored)>) -> anyhow::Result<String> {
    let mut text = String::new();
    for (i, (_, o)) in checkpoints.into_iter().enumerate() {
        let o = o
            .tree()
            .context("a checkpoint the kube fake holds does not decode")?;
        if i > 0 {
            text.push('\n');
        }
        append_checkpoint_text(&o, &mut text);
    }
    Ok(text)
}

/// Append a checkpoint's data to `out`, a `key=value` line per entry (a
/// Secret's values decoded): what no-orphans searches for ids.
fn append_checkpoint_text(o: &Value, out: &mut String) {
    let is_secret = str_at(o, &["kind"]) == "Secret";
    if let Some(data) = o.get("data").and_then(Value::as_object) {
        for (k, v) in data {
            let raw = v.as_str().unwrap_or("");
            let val = if is_secret {
                base64::engine::general_purpose::STANDARD
                    .decode(raw)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .unwrap_or_default()
            } else {
                raw.to_string()
            };
            let _ = writeln!(out, "{k}={val}");
        }
    }
}

/// Build and start the scenario's driver in `dir/driver/` (socket, kubeconfig);
/// returns it and the socket the sidecar dials.
async fn start_driver(
    scn: &Scenario,
    mutants: &[Mutant],
    dir: &tempfile::TempDir,
    fakes: &FakeSet,
    (admin_secret, kube_token, frozen): (&Secret, &Secret, Option<external::FrozenWall>),
    history: &History,
) -> anyhow::Result<(Arc<Driver>, PathBuf)> {
    let host_dir = dir.path().join("driver");
    std::fs::create_dir_all(&host_dir).context("creating the driver's socket directory")?;
    external::write_kube_credentials(
        &host_dir,
        (&fakes.kube_url(), fakes.kube_ca_pem()),
        DRIVER_STATE_NAMESPACE,
        kube_token,
    )
    .context("writing the driver's kubeconfig, token and CA")?;
    let mut params = external::DriverParams::new(
        crate::scenario::DriverProtocol::Cosi,
        host_dir,
        "cosi.sock",
        dir.path().to_path_buf(),
    );
    let admin_key = "drivelab-admin";
    params
        .set_labelled("s3_endpoint", fakes.s3_url(), "<s3-endpoint>")
        .set("admin_url", fakes.s3_url())
        .set("admin_access_key", admin_key)
        .set("admin_key", admin_key)
        .set_secret("admin_secret_key", admin_secret, "<admin-secret>")
        .set("admin_secret_name", ADMIN_SECRET_NAME)
        .set("admin_secret_namespace", ADMIN_SECRET_NAMESPACE)
        .set("region", "us-east-1")
        .set_labelled("kube_url", fakes.kube_url(), "<kube-url>")
        .set_secret("kube_token", kube_token, "<kube-token>")
        .set("namespace", DRIVER_STATE_NAMESPACE);
    params.frozen_wall = frozen;
    let driver = Arc::new(Driver::new(&scn.driver, mutants, &params, history.clone())?);
    driver.start().await?;
    Ok((driver, params.host_socket))
}

/// The calls in `events` the lab fired a fault on (of kind `only`, if given).
fn faulted_calls(
    events: impl Events,
    only: Option<&str>,
) -> std::collections::BTreeSet<drivelab_fakes::history::CallId> {
    events
        .into_iter()
        .filter_map(|e| match &e.borrow().kind {
            EventKind::Fault {
                call: Some(id),
                fault,
                ..
            } if only.is_none_or(|k| k == fault) => Some(*id),
            _ => None,
        })
        .collect()
}

/// The buckets whose creation by the driver the lab answered with an injected
/// 409 (see [`Observations::said_taken`]).
fn said_taken(events: impl Events) -> std::collections::BTreeSet<String> {
    use drivelab_fakes::history::Outcome;
    let faulted = faulted_calls(events, Some("error"));
    drivelab_fakes::history::calls_where(events, |id| faulted.contains(&id))
        .into_iter()
        .filter(|c| {
            c.from == Component::Driver
                && c.to == Component::S3
                && c.op == "create_bucket"
                && faulted.contains(&c.id)
                && matches!(c.outcome, Some(Outcome::Http { status: 409, .. }))
        })
        .map(|c| c.subject)
        .collect()
}

/// Whether the lab fired a fault on a call the driver made, among `events`.
fn driver_call_faulted(events: impl Events) -> bool {
    let faulted = faulted_calls(events, None);
    drivelab_fakes::history::calls_where(events, |id| faulted.contains(&id))
        .iter()
        .any(|c| c.from == Component::Driver && faulted.contains(&c.id))
}

pub(crate) async fn create_lab_bucket(
    probe: &S3Probe,
    admin: &Secret,
    name: &str,
) -> anyhow::Result<()> {
    let r = probe
        .create_bucket("drivelab-admin", admin.expose(), name)
        .await
        .map_err(|e| anyhow!("creating lab bucket {name}: {e}"))?;
    if !(200..300).contains(&r.status) {
        return Err(anyhow!(
            "creating lab bucket {name} answered {} {}",
            r.status,
            r.code.unwrap_or_default()
        ));
    }
    Ok(())
}

fn auth_code(name: &str) -> i32 {
    use drivelab_proto::cosi::AuthenticationType;
    match name {
        "Key" => AuthenticationType::Key as i32,
        "IAM" => AuthenticationType::Iam as i32,
        _ => AuthenticationType::UnknownAuthenticationType as i32,
    }
}

/// The access key and secret in a credentials Secret's BucketInfo.
fn credentials_in(sec: &Value) -> Option<(String, Secret)> {
    snapshot::bucket_info(sec).map(|info| (info.access_key_id, info.access_secret_key))
}

/// The claims, buckets and accesses, and the credentials Secret each
/// access names (those that exist), read through `seen`: each version
/// decoded once, one at a time, unless `seen` viewed it last time.
fn kube_objects(kube: &KubeFake, seen: &mut snapshot::Seen) -> anyhow::Result<KubeObjects> {
    let accesses = seen
        .accesses
        .read(kube.list_stored(Kind::BucketAccess, None)?);
    let mut secrets = Vec::new();
    for a in &accesses {
        let (ns, name) = (&a.view.namespace, &a.view.secret_name);
        if let Some(sec) = kube.get_stored(Kind::Secret, Some(ns), name)? {
            secrets.push((format!("{ns}/{name}").into(), sec));
        }
    }
    Ok(KubeObjects {
        claims: seen.claims.read(kube.list_stored(Kind::BucketClaim, None)?),
        buckets: seen.buckets.read(kube.list_stored(Kind::Bucket, None)?),
        accesses,
        credential_secrets: seen.infos.read(secrets),
    })
}

/// Ready claims: (namespace/name, the bucket id of the Bucket they bind).
fn ready_claims(
    claims: &[snapshot::Viewed<snapshot::ClaimView>],
    bucket_objects: &[(String, String)],
) -> Vec<(String, String)> {
    // The first Bucket of each name, as a search in list order finds it.
    let mut ids: HashMap<&str, &str> = HashMap::new();
    for (name, id) in bucket_objects {
        ids.entry(name).or_insert(id);
    }
    claims
        .iter()
        .map(|c| &c.view)
        .filter(|c| c.ready)
        .map(|c| {
            let id = ids.get(&*c.bucket_name).copied().unwrap_or_default();
            (c.name().to_string(), id.to_string())
        })
        .collect()
}

/// The secret each account name was first handed (what the twin lab compares).
fn handed_out(exchanges: &[Exchange]) -> BTreeMap<String, Secret> {
    let mut handed_out: BTreeMap<String, Secret> = BTreeMap::new();
    for (name, c) in credentials_granted(exchanges) {
        handed_out
            .entry(name.to_string())
            .or_insert_with(|| c.secret.clone());
    }
    handed_out
}

/// Every credential a grant's reply handed out, with the account name it
/// was asked for, in reply order.
fn credentials_granted(exchanges: &[Exchange]) -> impl Iterator<Item = (&str, &S3Credentials)> {
    exchanges
        .iter()
        .filter_map(|ex| match (&ex.request, &ex.reply) {
            (
                DriverRequest::Grant { name, .. },
                DriverReply::Granted {
                    credentials: Some(c),
                    ..
                },
            ) => Some((name.as_str(), c)),
            _ => None,
        })
}

/// The backend after the end's probes (see `Lab::backend_probed`).
#[derive(Clone)]
enum Probed {
    /// Only these buckets changed; their objects now (a bucket absent is gone).
    Buckets(
        std::collections::BTreeSet<String>,
        BTreeMap<String, Vec<String>>,
    ),
    /// Read again whole.
    Read(Box<BackendState>),
}

impl Probed {
    /// The backend after the probes, given it as it was before them.
    fn into_state(self, mut before: BackendState) -> BackendState {
        match self {
            Probed::Buckets(changed, mut now) => {
                for name in changed {
                    match now.remove_entry(&name) {
                        Some((name, objects)) => before.buckets.insert(name, objects),
                        None => before.buckets.remove(&name),
                    };
                }
                before
            }
            Probed::Read(state) => *state,
        }
    }
}

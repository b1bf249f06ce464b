//! The COSI invariants over what a run observed. Pure functions of
//! `Observations` (no I/O), so each one can be shown failing on a hand-made
//! broken input. A failed check names the calls that broke it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use drivelab_fakes::cosi_sidecar::{AnsweredBy, DriverOp, DriverReply, DriverRequest, Exchange};
use drivelab_fakes::history::CallId;
use drivelab_fakes::secret::Secret;
use serde::{Deserialize, Serialize};

use crate::checks::LeakScan;
pub use crate::checks::Verdict;
use crate::scenario::Invariant;

pub mod lifecycle;
#[cfg(test)]
mod tests;

/// A policy document as the backend stores it, kept as its JSON text
/// (compact, keys sorted: how a `Value` writes it), not as a tree: a run
/// holds two per grant to its end (the backend's, and the one seen at
/// grant), and a tree is several times its text. Equal when the texts are.
/// Cloned, it shares the text (see [`PolicyDocs`]).
#[derive(Clone, Debug)]
pub struct PolicyDoc(Arc<serde_json::value::RawValue>);

impl PolicyDoc {
    /// The document `doc`.
    pub fn new(doc: &serde_json::Value) -> Self {
        // A `Value` always writes; the fallback is never taken.
        let raw = serde_json::value::to_raw_value(doc)
            .unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned());
        Self(raw.into())
    }

    /// The document as a tree (read when a check or the snapshot looks inside).
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(self.0.get()).unwrap_or_default()
    }

    /// Its text.
    pub fn text(&self) -> &str {
        self.0.get()
    }
}

impl From<serde_json::Value> for PolicyDoc {
    fn from(doc: serde_json::Value) -> Self {
        Self::new(&doc)
    }
}

impl PartialEq for PolicyDoc {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

impl Eq for PolicyDoc {}

impl std::hash::Hash for PolicyDoc {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text().hash(state)
    }
}

/// Equal policy documents held once. A run's users mostly share a few
/// documents (a driver's generated policy is one per bucket and mode); held
/// per user, at grant and in each backend read, they were ~0.5 KB a grant
/// apiece.
#[derive(Debug, Default)]
pub struct PolicyDocs(drivelab_fakes::shared::Shared<PolicyDoc>);

impl PolicyDocs {
    /// The document `doc`, sharing the text of an equal one seen before.
    pub fn doc(&self, doc: &serde_json::Value) -> PolicyDoc {
        self.0.get(PolicyDoc::new(doc))
    }
}

impl Serialize for PolicyDoc {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// Read through a tree, then kept as text: a record read from text and one
/// read through a `Value` (keys sorted by a tool) give the same document.
/// Equal documents read in one record are held once, as the run held them
/// (see [`drivelab_fakes::shared::reading`]).
impl<'de> Deserialize<'de> for PolicyDoc {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde_json::Value::deserialize(d).map(|v| drivelab_fakes::shared::read(Self::new(&v)))
    }
}

/// The backend as the driver left it (in a record, secrets as fingerprints).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendState {
    /// access key → user.
    pub users: BTreeMap<String, UserState>,
    /// policy name → document.
    pub policies: BTreeMap<String, PolicyDoc>,
    /// bucket name → object keys.
    pub buckets: BTreeMap<String, Vec<String>>,
    /// Policies the server ships with and nobody has rewritten (not the driver's doing).
    pub builtin_policies: std::collections::BTreeSet<String>,
}

impl BackendState {
    /// Policies someone (the driver) created or rewrote.
    pub fn driver_policies(&self) -> impl Iterator<Item = (&String, &PolicyDoc)> {
        self.policies
            .iter()
            .filter(|(k, _)| self.is_driver_policy(k))
    }

    /// Whether `name` is a policy someone (the driver) created or rewrote.
    pub fn is_driver_policy(&self, name: &str) -> bool {
        self.policies.contains_key(name) && !self.builtin_policies.contains(name)
    }
}

/// One backend user.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserState {
    /// Its secret key.
    pub secret: Secret,
    /// `enabled` / `disabled`.
    pub status: String,
    /// Attached canned policies.
    pub policies: Vec<String>,
}

/// A `retry` step: the same request again, and the backend around it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RetryObservation {
    /// Scenario step index.
    pub step: usize,
    /// The first (original) exchange.
    pub original: Exchange,
    /// The retried one.
    pub retried: Exchange,
    /// Backend just before the retry.
    pub before: BackendState,
    /// Backend just after it.
    pub after: BackendState,
    /// True if the retry changed the request's parameters (then AlreadyExists is the right answer).
    pub changed_request: bool,
    /// True if the lab faulted one of the driver's own backend calls while it
    /// served the retry (then a transient error is the backend's, passed on).
    pub backend_faulted: bool,
}

impl RetryObservation {
    /// Why a retry of a request that succeeded may answer an error, if it may:
    /// the lab faulted the backend under it (a transient code passes that on),
    /// or, for a delete, the name now holds a bucket someone else owns (the
    /// driver must refuse to touch it, not answer "already gone").
    pub fn error_excused(&self, lab_buckets: &[String]) -> Option<&'static str> {
        let DriverReply::Failed { code, .. } = &self.retried.reply else {
            return None;
        };
        let transient = matches!(
            code,
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Aborted
        );
        if transient && self.backend_faulted {
            return Some("the lab faulted the backend under it");
        }
        if let DriverRequest::Delete { bucket_id, .. } = &self.retried.request {
            if self.before.buckets.contains_key(bucket_id) && lab_buckets.contains(bucket_id) {
                return Some("the name now holds a bucket someone else owns");
            }
        }
        None
    }
}

/// A BucketAccess that is granted and not deleted at the end of the run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LiveAccess {
    /// `namespace/name`.
    pub name: String,
    /// The COSI account name (`ba-<uid>`), the grant's idempotency key.
    pub account_name: String,
    /// `status.accountID`.
    pub account_id: String,
    /// The bucket it was granted on.
    pub bucket_id: String,
    /// The credentials in its Secret (what workloads use).
    pub credentials: Option<(String, Secret)>,
    /// Documents of the policies attached to its user right after its grant converged.
    pub policies_at_grant: BTreeMap<String, PolicyDoc>,
    /// What its BucketAccessClass asked for (`accessMode`).
    pub mode: GrantedMode,
}

/// The access a BucketAccessClass asks for. COSI v1alpha2 names it
/// `accessMode: ReadWrite | ReadOnly | WriteOnly` on a BucketAccess; v1alpha1
/// has no field, so drivers take it as a class parameter (see
/// [`crate::systems::cosi::ACCESS_MODE_PARAM`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum GrantedMode {
    /// Read and write objects (the default when the class says nothing).
    #[default]
    ReadWrite,
    /// Read objects only: every write is denied.
    ReadOnly,
}

impl GrantedMode {
    /// Whether a probe of `op` on the granted bucket must succeed.
    pub fn allows(self, op: ProbeOp) -> bool {
        match (self, op) {
            (_, ProbeOp::Read) | (GrantedMode::ReadWrite, ProbeOp::Write) => true,
            (GrantedMode::ReadOnly, ProbeOp::Write) => false,
        }
    }
}

/// What a probe tries with the credentials.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeOp {
    /// GetObject of an object the lab put there first.
    Read,
    /// PutObject of a new object.
    Write,
}

impl ProbeOp {
    fn verb(self) -> &'static str {
        match self {
            ProbeOp::Read => "read",
            ProbeOp::Write => "write",
        }
    }
}

/// A signed request the lab made with handed-out credentials. Its strings
/// are shared with the other probes of the same access, key, bucket or
/// error code (four probes a live access or more: held apart, they were
/// ~1 KB a grant through the end of a run).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// Whose credentials (`namespace/name`).
    #[serde(with = "shared_str")]
    pub access: Arc<str>,
    /// Access key used.
    #[serde(with = "shared_str")]
    pub access_key: Arc<str>,
    /// Bucket probed.
    #[serde(with = "shared_str")]
    pub bucket: Arc<str>,
    /// Whether the access was granted this bucket.
    pub granted_bucket: bool,
    /// Read or write.
    pub op: ProbeOp,
    /// Whether it must succeed: granted this bucket, in a mode that allows `op`.
    pub allowed: bool,
    /// What it probes: `current` (the Secret's credentials) or `handed-out` (an earlier reply's).
    pub purpose: ProbePurpose,
    /// HTTP status.
    pub status: u16,
    /// S3 error code, if any.
    #[serde(with = "shared_opt_str")]
    pub code: Option<Arc<str>>,
    /// History call id of the probe.
    pub call: Option<CallId>,
}

/// A shared string written and read as a plain one (serde's `rc` feature
/// would rebuild every crate that uses serde, for these few fields); read
/// back, equal ones are one again (see [`drivelab_fakes::shared::reading`]).
mod shared_str {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::sync::Arc;

    pub fn serialize<S: Serializer>(s: &Arc<str>, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<str>, D::Error> {
        String::deserialize(d).map(|s| drivelab_fakes::shared::read(Arc::from(s)))
    }
}

/// [`shared_str`] for an optional string.
mod shared_opt_str {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::sync::Arc;

    pub fn serialize<S: Serializer>(s: &Option<Arc<str>>, ser: S) -> Result<S::Ok, S::Error> {
        s.as_deref().serialize(ser)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Arc<str>>, D::Error> {
        Option::<String>::deserialize(d)
            .map(|s| s.map(|s| drivelab_fakes::shared::read(Arc::from(s))))
    }
}

/// Why a probe was made.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbePurpose {
    /// Least-privilege: the credentials in the Secret.
    Current,
    /// No-rotation: credentials from an earlier grant reply.
    HandedOut,
}

/// Everything the checks read: what a run records, and all a re-judgement
/// of it sees (secrets as fingerprints; see `crate::systems::Record`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Observations {
    /// Every sidecar→driver exchange.
    pub exchanges: Vec<Exchange>,
    /// Every `retry` step.
    pub retries: Vec<RetryObservation>,
    /// Accesses live at the end.
    pub live: Vec<LiveAccess>,
    /// Backend at the end.
    pub backend: BackendState,
    /// Probes made at the end.
    pub probes: Vec<Probe>,
    /// Objects that had not converged after faults were healed.
    pub stuck: Vec<Stuck>,
    /// Objects whose requests the scenario makes invalid on purpose, with the
    /// code each must end refused with (`rejected_on_purpose:`).
    pub rejected_on_purpose: Vec<crate::scenario::RejectedOnPurpose>,
    /// Backend buckets the lab made (the canary, "someone else's" buckets).
    pub lab_buckets: Vec<String>,
    /// Bucket names the lab answered a driver's CreateBucket for with an
    /// injected 409 (it told the driver another tenant owns the name). If the
    /// bucket was in fact the driver's (made by an earlier, crashed attempt),
    /// the lab lied, and leaving it alone was the only right thing to do.
    pub said_taken: std::collections::BTreeSet<String>,
    /// Every backend bucket that existed at some step boundary.
    pub seen_buckets: std::collections::BTreeSet<String>,
    /// Every backend user that existed at some step boundary.
    pub seen_users: std::collections::BTreeSet<String>,
    /// Decoded data of every object in the driver's state namespace.
    pub checkpoint_text: String,
    /// Bucket objects at the end: (name, status.bucketID).
    pub bucket_objects: Vec<(String, String)>,
    /// Ready claims at the end: (namespace/name, backend bucket id).
    pub ready_claims: Vec<(String, String)>,
    /// The secret each account name got in a twin lab (same seed, same names).
    pub twin_secrets: Option<BTreeMap<String, Secret>>,
    /// What each handed-out secret looked like (unpredictable-secrets judges these).
    pub secret_shapes: Vec<lifecycle::SecretShape>,
    /// What the secret scan found in the run's artifacts (no-secret-leak).
    pub leak_scan: LeakScan,
    /// Backend objects the lab planted, as planted: none is the driver's.
    pub planted: Planted,
}

/// What the lab planted in the backend (someone else's objects), as it was
/// right after planting. Nothing here may disappear or change.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Planted {
    /// Bucket name → the object keys put in it.
    pub buckets: BTreeMap<String, Vec<String>>,
    /// Canned policy name → its document as stored.
    pub policies: BTreeMap<String, PolicyDoc>,
    /// Access key → the user (secret, status, attached policies).
    pub users: BTreeMap<String, UserState>,
}

/// Evaluate one invariant.
pub fn check(inv: Invariant, obs: &Observations) -> Verdict {
    match inv {
        Invariant::IdempotentReplay => idempotent_replay(obs),
        Invariant::UniqueCredentials => unique_credentials(obs),
        Invariant::LeastPrivilege => least_privilege(obs),
        Invariant::NoRotation => no_rotation(obs),
        Invariant::NoSecretLeak => no_secret_leak(obs),
        Invariant::NoOrphans => lifecycle::no_orphans(obs),
        Invariant::OwnerOnlyDelete => lifecycle::owner_only_delete(obs),
        Invariant::Converges => lifecycle::converges(obs),
        Invariant::SpecCodes => lifecycle::spec_codes(obs),
        Invariant::UnpredictableSecrets => lifecycle::unpredictable_secrets(obs),
        // Refused for COSI scenarios when the file is validated; bosh::check has them.
        Invariant::SingleAttach
        | Invariant::ScopedAccess
        | Invariant::NoLeakedMounts
        | Invariant::ReadOnlyEnforced
        | Invariant::NoAttachDuringRecreate
        | Invariant::DeltaExact
        | Invariant::TokenBound
        | Invariant::CsiSpec => {
            let mut v = Verdict::new(inv);
            v.fail("a BOSH/CSI invariant asked of a COSI run".into(), []);
            v
        }
    }
}

/// An object still pending after the final convergence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stuck {
    /// `bucketaccess ns/name` or `bucketclaim ns/name`.
    pub target: String,
    /// The last RPC the sidecar made for it.
    pub last_op: Option<String>,
    /// What that RPC answered.
    pub last_code: Option<String>,
    /// How many RPCs it took.
    pub attempts: usize,
    /// Their history call ids.
    pub calls: Vec<CallId>,
    /// The idempotency key of the last RPC (for a claim: the bucket name asked for).
    pub last_key: Option<String>,
    /// The claim (`ns/name`) it is, or, for an access, the claim it waits on
    /// until the bucket exists.
    pub claim: Option<String>,
}

fn granted(ex: &Exchange) -> Option<(&str, Option<(&str, &Secret)>)> {
    match &ex.reply {
        DriverReply::Granted {
            account_id,
            credentials,
            ..
        } => Some((
            account_id.as_str(),
            credentials
                .as_ref()
                .map(|c| (c.access_key_id.as_str(), &c.secret)),
        )),
        _ => None,
    }
}

/// Same request again → same answer; a retry changes no backend state.
pub fn idempotent_replay(obs: &Observations) -> Verdict {
    let mut v = Verdict::new(Invariant::IdempotentReplay);
    // Every successful answer for one idempotency key must agree with the first,
    // whether the repeat came from a sidecar requeue or a scripted retry.
    let mut first: BTreeMap<(DriverOp, String), &Exchange> = BTreeMap::new();
    let mut compared = 0usize;
    for ex in &obs.exchanges {
        let key = (ex.request.op(), ex.request.key().to_string());
        let ok = matches!(
            ex.reply,
            DriverReply::Created { .. } | DriverReply::Granted { .. }
        );
        if !ok || !same_request_shape(ex, first.get(&key).copied()) {
            if ok {
                first.entry(key).or_insert(ex);
            }
            continue;
        }
        let Some(prev) = first.get(&key).copied() else {
            first.insert(key, ex);
            continue;
        };
        compared += 1;
        match (&prev.reply, &ex.reply) {
            (DriverReply::Created { bucket_id: a }, DriverReply::Created { bucket_id: b })
                if a != b =>
            {
                v.fail(
                    format!(
                        "DriverCreateBucket {} answered bucket_id {a:?} then {b:?}",
                        ex.request.key()
                    ),
                    [prev.call, ex.call],
                )
            }
            _ => {}
        }
        if let (Some((a_id, a_cred)), Some((b_id, b_cred))) = (granted(prev), granted(ex)) {
            if a_id != b_id {
                v.fail(
                    format!(
                        "DriverGrantBucketAccess {} answered account {a_id:?} then {b_id:?}",
                        ex.request.key()
                    ),
                    [prev.call, ex.call],
                );
            }
            match (a_cred, b_cred) {
                (Some((ak, asec)), Some((bk, bsec))) => {
                    if ak != bk {
                        v.fail(
                            format!(
                                "DriverGrantBucketAccess {} answered access key {ak:?} then {bk:?}",
                                ex.request.key()
                            ),
                            [prev.call, ex.call],
                        );
                    }
                    if asec != bsec {
                        v.fail(
                            format!("DriverGrantBucketAccess {} answered a different secret on a repeat (rotation)", ex.request.key()),
                            [prev.call, ex.call],
                        );
                    }
                }
                _ => v.fail(
                    format!(
                        "DriverGrantBucketAccess {} answered without s3 credentials",
                        ex.request.key()
                    ),
                    [ex.call],
                ),
            }
        }
    }
    for r in &obs.retries {
        // A retry the lab answered, cut or crashed the driver under is not an
        // answered retry: its UNAVAILABLE is the lab's, not the driver's.
        if r.changed_request || r.retried.answered_by != AnsweredBy::Driver {
            continue;
        }
        let ok = !matches!(r.retried.reply, DriverReply::Failed { .. });
        if !ok {
            if !matches!(r.original.reply, DriverReply::Failed { .. })
                && r.error_excused(&obs.lab_buckets).is_none()
            {
                v.fail(
                    format!(
                        "step {}: {} {} succeeded, the same request again answered {}",
                        r.step + 1,
                        r.retried.request.op().rpc(),
                        r.retried.request.key(),
                        r.retried.reply.code_name()
                    ),
                    [r.original.call, r.retried.call],
                );
            }
            continue;
        }
        compared += 1;
        for change in diff_backend(&r.before, &r.after) {
            v.fail(
                format!(
                    "step {}: retried {} {} changed the backend: {change}",
                    r.step + 1,
                    r.retried.request.op().rpc(),
                    r.retried.request.key()
                ),
                [r.retried.call],
            );
        }
    }
    v.finish(
        compared,
        format!(
            "{compared} repeated requests answered identically; retries left the backend unchanged"
        ),
    )
}

/// Two exchanges are comparable only if the request was the same (a retry with
/// changed parameters is a different request: AlreadyExists is right there).
fn same_request_shape(ex: &Exchange, prev: Option<&Exchange>) -> bool {
    match prev {
        None => true,
        Some(p) => match (&p.request, &ex.request) {
            (
                DriverRequest::Create { parameters: a, .. },
                DriverRequest::Create { parameters: b, .. },
            ) => a == b,
            (
                DriverRequest::Grant {
                    parameters: a,
                    auth: x,
                    bucket_id: ba,
                    ..
                },
                DriverRequest::Grant {
                    parameters: b,
                    auth: y,
                    bucket_id: bb,
                    ..
                },
            ) => a == b && x == y && ba == bb,
            _ => true,
        },
    }
}

/// Human-readable differences between two backend states (no secret values).
pub fn diff_backend(a: &BackendState, b: &BackendState) -> Vec<String> {
    let mut out = Vec::new();
    for (k, ua) in &a.users {
        match b.users.get(k) {
            None => out.push(format!("user {k} removed")),
            Some(ub) => {
                if ua.secret != ub.secret {
                    out.push(format!("user {k} secret changed"));
                }
                if ua.status != ub.status {
                    out.push(format!("user {k} status {} -> {}", ua.status, ub.status));
                }
                if ua.policies != ub.policies {
                    out.push(format!(
                        "user {k} policies {:?} -> {:?}",
                        ua.policies, ub.policies
                    ));
                }
            }
        }
    }
    for k in b.users.keys().filter(|k| !a.users.contains_key(*k)) {
        out.push(format!("user {k} added"));
    }
    for (k, pa) in &a.policies {
        match b.policies.get(k) {
            None => out.push(format!("policy {k} removed")),
            Some(pb) if pa != pb => out.push(format!("policy {k} document replaced")),
            _ => {}
        }
    }
    for k in b.policies.keys().filter(|k| !a.policies.contains_key(*k)) {
        out.push(format!("policy {k} added"));
    }
    for k in a.buckets.keys().filter(|k| !b.buckets.contains_key(*k)) {
        out.push(format!("bucket {k} removed"));
    }
    for k in b.buckets.keys().filter(|k| !a.buckets.contains_key(*k)) {
        out.push(format!("bucket {k} added"));
    }
    out
}

/// No two live accesses share an account id, access key or secret value
/// (compared for equality only: a shared secret means one access's secret
/// is another's, whatever the keys say).
pub fn unique_credentials(obs: &Observations) -> Verdict {
    let mut v = Verdict::new(Invariant::UniqueCredentials);
    let mut by_account: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut by_key: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut by_secret: BTreeMap<&Secret, Vec<&str>> = BTreeMap::new();
    for a in &obs.live {
        by_account
            .entry(a.account_id.as_str())
            .or_default()
            .push(&a.name);
        if let Some((k, secret)) = &a.credentials {
            by_key.entry(k.as_str()).or_default().push(&a.name);
            by_secret.entry(secret).or_default().push(&a.name);
        }
    }
    let grants = GrantCalls::new(obs);
    let grant_calls = |names: &[&str]| -> Vec<CallId> {
        let names: HashSet<&str> = names.iter().copied().collect();
        obs.live
            .iter()
            .filter(|a| names.contains(a.name.as_str()))
            .flat_map(|a| grants.of(&a.account_name))
            .collect()
    };
    for (acct, names) in by_account.iter().filter(|(_, n)| n.len() > 1) {
        v.fail(
            format!("accesses {} share account {acct:?}", names.join(", ")),
            grant_calls(names),
        );
    }
    for (key, names) in by_key.iter().filter(|(_, n)| n.len() > 1) {
        v.fail(
            format!("accesses {} share access key {key:?}", names.join(", ")),
            grant_calls(names),
        );
    }
    // Same key and same secret is one shared credential, already reported.
    // Groups in access-name order: a record's secrets are fingerprints under a
    // per-run key, so their own order differs from run to run.
    let mut shared: Vec<&Vec<&str>> = by_secret.values().filter(|n| n.len() > 1).collect();
    shared.sort();
    for names in shared {
        let keys: std::collections::BTreeSet<&str> = obs
            .live
            .iter()
            .filter(|a| names.contains(&a.name.as_str()))
            .filter_map(|a| a.credentials.as_ref().map(|c| c.0.as_str()))
            .collect();
        if keys.len() > 1 {
            v.fail(
                format!(
                    "accesses {} have different access keys but the same secret key",
                    names.join(", ")
                ),
                grant_calls(names),
            );
        }
    }
    v.finish(
        obs.live.len(),
        format!(
            "{} live accesses, all with distinct accounts, keys and secrets",
            obs.live.len()
        ),
    )
}

/// The GrantBucketAccess calls made for each account name, in call order,
/// indexed on first use: the checks ask per failing access, and a scan of
/// every exchange each time made a driver failing at scale cost N² to judge.
pub(crate) struct GrantCalls<'a> {
    obs: &'a Observations,
    by_account: std::cell::OnceCell<HashMap<&'a str, Vec<CallId>>>,
}

impl<'a> GrantCalls<'a> {
    pub(crate) fn new(obs: &'a Observations) -> Self {
        Self {
            obs,
            by_account: std::cell::OnceCell::new(),
        }
    }

    /// The grant calls for `account_name`.
    pub(crate) fn of(&self, account_name: &str) -> Vec<CallId> {
        let index = self.by_account.get_or_init(|| {
            let mut m: HashMap<&str, Vec<CallId>> = HashMap::new();
            for e in &self.obs.exchanges {
                if e.request.op() == DriverOp::GrantBucketAccess {
                    m.entry(e.request.key()).or_default().push(e.call);
                }
            }
            m
        });
        index.get(account_name).cloned().unwrap_or_default()
    }
}

/// Own bucket reachable in the granted mode (read-only: reads work, writes
/// are denied), every other bucket denied, no grant's policy rewritten by another.
pub fn least_privilege(obs: &Observations) -> Verdict {
    let mut v = Verdict::new(Invariant::LeastPrivilege);
    let grants = GrantCalls::new(obs);
    let mut n = 0;
    for p in obs
        .probes
        .iter()
        .filter(|p| p.purpose == ProbePurpose::Current)
    {
        n += 1;
        let ok = (200..300).contains(&p.status);
        let call = p.call.into_iter();
        let verb = p.op.verb();
        let code = p.code.as_deref().unwrap_or("");
        if p.allowed && !ok {
            v.fail(
                format!(
                    "{} could not {verb} its own bucket {}: {} {code}",
                    p.access, p.bucket, p.status
                ),
                call,
            );
        } else if !p.allowed && ok {
            let why = if p.granted_bucket {
                "its grant is read-only"
            } else {
                "it was never granted that bucket"
            };
            v.fail(
                format!("{} could {verb} bucket {}, but {why}", p.access, p.bucket),
                call,
            );
        } else if !p.allowed && p.code.as_deref() != Some("AccessDenied") {
            v.fail(
                format!(
                    "{} {verb} on bucket {} it may not {verb} got {} {code} instead of AccessDenied",
                    p.access, p.bucket, p.status
                ),
                call,
            );
        }
    }
    for a in &obs.live {
        let Some((key, _)) = &a.credentials else {
            continue;
        };
        let now: BTreeMap<&str, &PolicyDoc> = obs
            .backend
            .users
            .get(key)
            .map(|u| {
                u.policies
                    .iter()
                    .filter_map(|p| obs.backend.policies.get(p).map(|d| (p.as_str(), d)))
                    .collect()
            })
            .unwrap_or_default();
        for (name, doc) in &a.policies_at_grant {
            match now.get(name.as_str()) {
                None => v.fail(format!("{}: policy {name} it was granted is no longer attached", a.name), grants.of(&a.account_name)),
                Some(d) if *d != doc => v.fail(
                    format!("{}: policy {name} was replaced after its grant (a later grant overwrote a shared policy)", a.name),
                    grants.of(&a.account_name),
                ),
                _ => {}
            }
        }
    }
    v.finish(n, format!("{n} probes: each access reads its own bucket, writes it only if granted read-write, and is denied elsewhere; granted policies unchanged"))
}

/// Every credential ever handed out for a live access still authenticates.
pub fn no_rotation(obs: &Observations) -> Verdict {
    let mut v = Verdict::new(Invariant::NoRotation);
    let grants = GrantCalls::new(obs);
    let mut n = 0;
    for p in &obs.probes {
        n += 1;
        if matches!(
            p.code.as_deref(),
            Some("SignatureDoesNotMatch" | "InvalidAccessKeyId")
        ) {
            let what = match p.purpose {
                ProbePurpose::Current => "the credentials in its Secret",
                ProbePurpose::HandedOut => "credentials an earlier grant reply handed out",
            };
            v.fail(
                format!(
                    "{}: {what} (key {}) no longer authenticate: {} {}",
                    p.access,
                    p.access_key,
                    p.status,
                    p.code.as_deref().unwrap_or("")
                ),
                p.call.into_iter(),
            );
        }
    }
    for a in &obs.live {
        if a.credentials.is_none() {
            v.fail(
                format!(
                    "{}: granted but its credentials Secret is missing or unreadable",
                    a.name
                ),
                grants.of(&a.account_name),
            );
        }
    }
    v.finish(
        n,
        format!("{n} signed requests with handed-out credentials all authenticated"),
    )
}

/// No secret value in any artifact.
pub fn no_secret_leak(obs: &Observations) -> Verdict {
    crate::checks::no_secret_leak(&obs.leak_scan)
}

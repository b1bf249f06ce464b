//! The COSI ownership snapshot: who owns which claim, bucket, access, account,
//! key, policy, checkpoint and Secret, as canonical sorted text, every id and
//! secret through the run's [`Normalizer`].

use std::fmt::Write as _;
use std::sync::Arc;

use base64::Engine as _;
use drivelab_fakes::json::{at as c, str_at as s};
use drivelab_fakes::kube::Stored;
use drivelab_fakes::secret::Secret;
use serde_json::Value;

use super::checks::{BackendState, UserState};
use crate::snapshot::{Normalizer, RawText, TextSink};
use drivelab_fakes::s3::ChangedNames;

mod views;

pub use views::{AccessView, BucketView, ClaimView, Shown, View, Viewed, Views};

/// The kube objects a snapshot shows, each a view made once per stored
/// version (see [`Views`]).
pub struct KubeObjects {
    /// BucketClaims, in scenario order of creation (deleted ones are simply absent).
    pub claims: Vec<Viewed<ClaimView>>,
    /// Bucket objects.
    pub buckets: Vec<Viewed<BucketView>>,
    /// BucketAccesses.
    pub accesses: Vec<Viewed<AccessView>>,
    /// Credentials Secrets named by accesses, each with its `BucketInfo`.
    pub credential_secrets: Vec<CredentialSecret>,
}

impl KubeObjects {
    /// These objects holding no stored version of any kube object: for a
    /// run's last snapshot, which keeps nothing for a next one. The views
    /// and `BucketInfo`s are their own; only the credentials Secrets as the
    /// fake holds them, kept for their identity, pinned the fake's texts
    /// after it was let go of.
    pub fn unpinned(mut self) -> Self {
        for sec in &mut self.credential_secrets {
            sec.object = None;
        }
        self
    }
}

/// What a snapshot and the record read of a driver checkpoint (its kind,
/// `metadata.name` and `data`), as a text of its own, packed as its whole
/// was (against its kind's dictionary). The object as the fake holds it
/// carries its managedFields and the rest of its metadata, and held to the
/// run's end it kept the fake's copy alive after the fake was let go of.
/// One that does not decode is kept as it is, to be shown as such.
pub fn checkpoint_part(o: &Stored) -> Stored {
    let Ok(tree) = o.tree() else {
        return o.clone();
    };
    let mut part = serde_json::Map::new();
    for key in ["kind", "data"] {
        if let Some(v) = tree.get(key) {
            part.insert(key.into(), v.clone());
        }
    }
    if let Some(name) = tree.pointer("/metadata/name") {
        part.insert("metadata".into(), serde_json::json!({ "name": name }));
    }
    // A tree writes without error: its keys are strings, its numbers finite.
    let text = serde_json::to_string(&part).unwrap_or_default();
    Stored::Text(match o {
        // A part packs against what the whole did: they are alike.
        Stored::Text(whole) => whole.pack_like(&text),
        Stored::Tree(_) => text.into(),
    })
}

/// What the snapshot is built from.
pub struct SnapshotInput<'a> {
    /// The claims, buckets, accesses and credentials Secrets.
    pub objects: KubeObjects,
    /// Objects in the driver's state namespace (its checkpoints): (kind,
    /// object). Shared as the fake holds them: written over HTTP, they are
    /// text, decoded here one at a time (decoded all at once, they were a
    /// fifth of a 5,000-grant run's peak).
    pub checkpoints: Vec<(&'static str, Stored)>,
    /// The backend as the driver left it.
    pub backend: &'a BackendState,
    /// The users and policies written since the snapshot this one follows
    /// (rendered with the same `kept`), or `None`: take every one as new.
    pub backend_changed: Option<&'a ChangedNames>,
    /// Backend buckets the lab itself owns (canaries), shown apart.
    pub lab_buckets: &'a [String],
}

/// What the last snapshot read of the kube objects, kept for the next one.
#[derive(Default)]
pub struct Seen {
    /// Each BucketClaim version's view.
    pub claims: Views<ClaimView>,
    /// Each Bucket version's view.
    pub buckets: Views<BucketView>,
    /// Each BucketAccess version's view.
    pub accesses: Views<AccessView>,
    /// Each credentials Secret version's `BucketInfo`.
    pub infos: BucketInfos,
}

/// A credentials Secret an access names, and its decoded `BucketInfo`.
#[derive(Clone)]
pub struct CredentialSecret {
    /// `namespace/name`.
    pub key: Arc<str>,
    /// The Secret as the fake holds it, which keeps its line for the next
    /// snapshot; `None` once let go of (see [`KubeObjects::unpinned`]).
    pub object: Option<Stored>,
    /// Its `BucketInfo` (`None`: absent or unreadable).
    pub info: Option<Arc<BucketInfo>>,
}

/// The `BucketInfo`s the last snapshot decoded, by the Secret object they
/// came from: a snapshot after every step decoded every Secret twice, though
/// a step changes one or two.
#[derive(Default)]
pub struct BucketInfos(ByObject<Option<Arc<BucketInfo>>>);

/// What a snapshot shows of a credentials Secret's `BucketInfo` (each
/// field as [`s`] reads it: `""` when absent or not a string). Kept as
/// these fields, not as the decoded tree: a run's final snapshot holds one
/// per live access, and the tree was five times the size.
pub struct BucketInfo {
    /// `metadata.name`.
    pub name: String,
    /// `spec.bucketName`.
    pub bucket_name: String,
    /// `spec.authenticationType`.
    pub authentication_type: String,
    /// `spec.secretS3.accessKeyID`.
    pub access_key_id: String,
    /// `spec.secretS3.accessSecretKey`.
    pub access_secret_key: Secret,
    /// `spec.secretS3.endpoint`.
    pub endpoint: String,
    /// `spec.secretS3.region`.
    pub region: String,
}

impl BucketInfo {
    fn of(info: &Value) -> Self {
        let s3 = |k: &str| s(info, &["spec", "secretS3", k]);
        Self {
            name: s(info, &["metadata", "name"]),
            bucket_name: s(info, &["spec", "bucketName"]),
            authentication_type: s(info, &["spec", "authenticationType"]),
            access_key_id: s3("accessKeyID"),
            access_secret_key: Secret::new(s3("accessSecretKey")),
            endpoint: s3("endpoint"),
            region: s3("region"),
        }
    }
}

impl BucketInfos {
    /// Each Secret (`namespace/name`, as held) with its `BucketInfo`,
    /// decoded unless it was last time; Secrets not among these are forgotten.
    pub fn read(&mut self, secrets: Vec<(Arc<str>, Stored)>) -> Vec<CredentialSecret> {
        let read = secrets
            .into_iter()
            .map(|(key, object)| {
                let info = self.0.get(Section::CredentialSecret, &object, || {
                    // A Secret whose text does not decode has no readable BucketInfo.
                    let tree = object.tree().ok()?;
                    bucket_info(&tree).map(Arc::new)
                });
                let info = info.clone();
                CredentialSecret {
                    key,
                    object: Some(object),
                    info,
                }
            })
            .collect();
        self.0.forget_unused();
        read
    }
}

/// Render the canonical snapshot. `norm` should already know the run's uids in
/// creation order; the rest is labelled here in a fixed walk order.
pub fn render<S: TextSink>(input: &SnapshotInput<'_>, norm: &mut Normalizer, kept: &mut Kept) -> S {
    // Label ids in a fixed walk order so labels do not depend on random values.
    // An object the last snapshot showed as it is was walked then: labelling
    // its ids again would change nothing.
    fn new<V>(objs: &[Viewed<V>]) -> impl Iterator<Item = &V> {
        objs.iter().filter(|o| o.new).map(|o| &*o.view)
    }
    for c in new(&input.objects.claims) {
        norm.id("uid", &c.uid);
    }
    for a in new(&input.objects.accesses) {
        norm.id("uid", &a.uid);
    }
    for a in new(&input.objects.accesses) {
        norm.id("account", &a.account_id);
    }
    // What the last snapshot walked and nothing has changed since has its
    // labels already: walking it again would label nothing.
    let changed = input.backend_changed;
    let user_unchanged = |k: &str| changed.is_some_and(|c| !c.users.contains(k));
    for sec in &input.objects.credential_secrets {
        if let Some(info) = &sec.info {
            let key = &info.access_key_id;
            let shown = (sec.object.as_ref())
                .is_some_and(|o| kept.objects.shown(Section::CredentialSecret, o));
            if shown && user_unchanged(key) {
                continue;
            }
            norm.id("key", key);
            norm.secret(&info.access_secret_key);
            // Policies in the order of the accesses that use them, not of random key order.
            for p in input
                .backend
                .users
                .get(key)
                .map(|u| u.policies.clone())
                .unwrap_or_default()
            {
                norm.id("policy", &p);
            }
        }
    }
    let users: Vec<(&String, &UserState)> = match changed {
        Some(c) => (c.users.iter())
            .filter_map(|k| input.backend.users.get_key_value(k))
            .collect(),
        None => input.backend.users.iter().collect(),
    };
    for (k, u) in users {
        norm.id("key", k);
        norm.secret(&u.secret);
        for p in &u.policies {
            norm.id("policy", p);
        }
    }
    let policies: Vec<&String> = match changed {
        Some(c) => (c.policies.iter())
            .filter(|p| input.backend.is_driver_policy(p))
            .collect(),
        None => input.backend.driver_policies().map(|(p, _)| p).collect(),
    };
    for p in policies {
        norm.id("policy", p);
    }
    // Every test and `make e2e` scenario checks that the walk, skipping what
    // did not change, left nothing unlabelled.
    #[cfg(debug_assertions)]
    for (k, u) in &input.backend.users {
        let values = [k.as_str(), u.secret.expose()].into_iter();
        for v in values.chain(u.policies.iter().map(String::as_str)) {
            assert!(
                norm.knows(v),
                "the snapshot walk skipped a user it had not labelled"
            );
        }
    }
    for (_, o) in &input.checkpoints {
        if !kept.objects.shown(Section::Checkpoint, o) {
            // One that does not decode is shown as such below.
            if let Ok(o) = o.tree() {
                norm.id("checkpoint", &s(&o, &["metadata", "name"]));
            }
        }
    }

    // The last snapshot's raw text is read once, in order: held packed.
    let mut out = if kept.last {
        RawText::packing()
    } else {
        RawText::default()
    };
    let _ = writeln!(out, "claims:");
    lines(&mut out, &input.objects.claims, norm);
    let _ = writeln!(out, "buckets (objects):");
    lines(&mut out, &input.objects.buckets, norm);
    let _ = writeln!(out, "accesses:");
    lines(&mut out, &input.objects.accesses, norm);
    let _ = writeln!(out, "credential secrets:");
    for sec in sorted(&input.objects.credential_secrets, |sec| &sec.key, norm) {
        // The secret's label is the same each time (the walk above gave it one).
        out.push_str(
            &kept.line(Section::CredentialSecret, sec.object.as_ref(), || {
                credential_secret_line(&sec.key, sec.info.as_deref(), norm)
            }),
        );
    }
    let _ = writeln!(out, "backend users:");
    let mut users: Vec<String> = input
        .backend
        .users
        .iter()
        .map(|(k, u)| {
            let mut pols: Vec<String> = u.policies.iter().map(|p| norm.text_kept(p)).collect();
            pols.sort();
            format!(
                "  {}: secret {}, {}, policies [{}]",
                norm.text_kept(k),
                norm.secret(&u.secret),
                u.status,
                pols.join(", ")
            )
        })
        .collect();
    users.sort();
    push_lines(&mut out, users);
    let _ = writeln!(out, "backend policies:");
    // A policy's summary is made again only when it was written since.
    let written = |name: &String| changed.is_none_or(|c| c.policies.contains(name));
    let mut summaries = std::mem::take(&mut kept.policies);
    let mut pols = Vec::new();
    for (name, doc) in input.backend.driver_policies() {
        let summary = match summaries.remove(name) {
            Some(kept) if !written(name) => kept,
            _ => policy_summary(&doc.value()),
        };
        pols.push(format!(
            "  {}: {}",
            norm.text_kept(name),
            norm.text_kept(&summary)
        ));
        if !kept.last {
            kept.policies.insert(name.clone(), summary);
        }
    }
    pols.sort();
    push_lines(&mut out, pols);
    let _ = writeln!(out, "backend buckets:");
    let mut bks: Vec<String> = input
        .backend
        .buckets
        .iter()
        // The lab's canary is in every run and says nothing; a bucket the
        // scenario planted as someone else's is shown, marked, so a reviewer
        // sees that it survived.
        .filter(|(n, _)| n.as_str() != super::CANARY_BUCKET)
        .map(|(n, objs)| {
            let whose = if input.lab_buckets.contains(n) {
                " (someone else's)"
            } else {
                ""
            };
            format!("  {}: {} objects{whose}", norm.text(n), objs.len())
        })
        .collect();
    bks.sort();
    push_lines(&mut out, bks);
    let _ = writeln!(out, "driver checkpoints:");
    // A checkpoint's digests and secrets were labelled when it was first
    // shown: shown again unchanged, its line is the same.
    let mut cps: Vec<String> = input
        .checkpoints
        .iter()
        .map(|(kind, o)| {
            kept.line(Section::Checkpoint, Some(o), || match o.tree() {
                Ok(o) => format!("  {kind} {}", checkpoint_line(&o, norm)),
                Err(e) => format!("  {kind} that does not decode as JSON: {e}"),
            })
            .into_owned()
        })
        .collect();
    cps.sort();
    push_lines(&mut out, cps);
    kept.objects.forget_unused();
    norm.relabel(out)
}

/// Append each line, with a newline, dropping each once written.
fn push_lines(out: &mut RawText, lines: Vec<String>) {
    for l in lines {
        out.push_str(&l);
        out.push_str("\n");
    }
}

/// The line of one credentials Secret (with its newline).
fn credential_secret_line(name: &str, info: Option<&BucketInfo>, norm: &mut Normalizer) -> String {
    let Some(info) = info else {
        return format!("  {name}: no readable BucketInfo\n");
    };
    let secret = norm.secret(&info.access_secret_key);
    format!(
        "  {name}: BucketInfo {} bucket {}, auth {}, key {}, secret {}, endpoint {}, region {}\n",
        info.name,
        info.bucket_name,
        info.authentication_type,
        info.access_key_id,
        secret,
        info.endpoint,
        info.region,
    )
}

/// Which part of the snapshot a kept object was read for.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Section {
    /// A claim, bucket or access, by its [`Views`].
    Viewed,
    CredentialSecret,
    Checkpoint,
}

/// What a snapshot keeps for the next one: the line each credentials Secret
/// and checkpoint was last shown as, while the snapshot shows the same
/// object (see [`ByObject`]; claims, buckets and accesses have theirs in
/// their [`Views`]), and each driver policy's summary, until the policy is
/// written. A snapshot after every step formatted everything again each step.
#[derive(Default)]
pub struct Kept {
    objects: ByObject<String>,
    /// Policy name → its summary (before relabelling).
    policies: std::collections::HashMap<String, String>,
    /// For a run's last snapshot: nothing is kept (no snapshot follows,
    /// and its lines kept beside the text were a copy of most of it).
    last: bool,
}

impl Kept {
    /// For a run's last snapshot, which keeps nothing.
    pub fn last() -> Self {
        Self {
            last: true,
            ..Self::default()
        }
    }

    /// The line made of `obj` in `section`: kept from the last snapshot, or
    /// made by `make` (and kept, unless this is the last snapshot or the
    /// object was let go of).
    fn line(
        &mut self,
        section: Section,
        obj: Option<&Stored>,
        make: impl FnOnce() -> String,
    ) -> std::borrow::Cow<'_, str> {
        match obj {
            Some(obj) if !self.last => self.objects.get(section, obj, make).as_str().into(),
            _ => make().into(),
        }
    }
}

/// Something made from each kube object a snapshot reads, kept while the
/// next snapshot reads the same object: the kube fake shares one tree or
/// text per stored version, so the same address is the same version.
struct ByObject<T> {
    /// (section, address) → the object (which pins the address while kept,
    /// so no other object can have it), what was made of it, and whether
    /// this snapshot read it.
    kept: std::collections::HashMap<(Section, usize), (Stored, T, bool)>,
}

impl<T> Default for ByObject<T> {
    fn default() -> Self {
        Self {
            kept: Default::default(),
        }
    }
}

impl<T> ByObject<T> {
    /// What was made of `obj` in `section`, made by `make` unless it was kept.
    fn get(&mut self, section: Section, obj: &Stored, make: impl FnOnce() -> T) -> &T {
        let entry = self
            .kept
            .entry((section, obj.address()))
            .or_insert_with(|| (obj.clone(), make(), true));
        entry.2 = true;
        &entry.1
    }

    /// Whether the last snapshot read `obj` (this very version) in `section`.
    fn shown(&self, section: Section, obj: &Stored) -> bool {
        self.kept.contains_key(&(section, obj.address()))
    }

    /// Drop what was made of objects this snapshot did not read.
    fn forget_unused(&mut self) {
        self.kept.retain(|_, (_, _, read)| std::mem::take(read));
    }
}

/// `objs` by the relabelled namespace/name of each one's object.
fn sorted<'o, T>(objs: &'o [T], key: impl Fn(&T) -> &str, norm: &mut Normalizer) -> Vec<&'o T> {
    let mut v: Vec<&T> = objs.iter().collect();
    // Each key is a relabelling: worth computing once per object, and kept
    // from one snapshot to the next.
    v.sort_by_cached_key(|t| norm.text_kept(key(t)));
    v
}

/// Each object's line, in the order of their relabelled keys.
fn lines<V: View>(out: &mut RawText, objs: &[Viewed<V>], norm: &mut Normalizer) {
    for o in sorted(objs, |o| o.view.key(), norm) {
        out.push_str(o.view.line());
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

/// Decode the `BucketInfo` key of a credentials Secret.
pub fn bucket_info(secret: &Value) -> Option<BucketInfo> {
    let enc = c(secret, &["data", "BucketInfo"])?.as_str()?;
    let raw = base64::engine::general_purpose::STANDARD.decode(enc).ok()?;
    serde_json::from_slice(&raw)
        .ok()
        .map(|v| BucketInfo::of(&v))
}

fn policy_summary(doc: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(stmts) = doc.get("Statement").and_then(Value::as_array) {
        for st in stmts {
            let list = |k: &str| -> String {
                match st.get(k) {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(a)) => {
                        let mut v: Vec<String> = a
                            .iter()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect();
                        v.sort();
                        v.join(",")
                    }
                    _ => String::new(),
                }
            };
            parts.push(format!(
                "{} [{}] on [{}]",
                list("Effect"),
                list("Action"),
                list("Resource")
            ));
        }
    }
    if parts.is_empty() {
        "(no statements)".to_string()
    } else {
        parts.join("; ")
    }
}

fn checkpoint_line(o: &Value, norm: &mut Normalizer) -> String {
    let name = s(o, &["metadata", "name"]);
    let mut fields: Vec<String> = Vec::new();
    let decode_secret = c(o, &["data"]).is_some() && s(o, &["kind"]) != "ConfigMap";
    let data = c(o, &["data"])
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (k, v) in data {
        let raw = v.as_str().unwrap_or("").to_string();
        let value = if decode_secret {
            base64::engine::general_purpose::STANDARD
                .decode(&raw)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_else(|| format!("<{} bytes>", raw.len()))
        } else {
            raw
        };
        // Anything named like a secret is labelled as one even if no other part
        // of the run saw it (a checkpoint can hold a secret never sent anywhere).
        let shown = if k.to_ascii_lowercase().contains("secret") {
            norm.secret(&Secret::new(value))
        } else if is_digest(&value) {
            // Digests of inputs that include per-run ports differ run to run; label them.
            norm.id("digest", &value)
        } else {
            value
        };
        fields.push(format!("{k}={shown}"));
    }
    fields.sort();
    format!("{name}: {}", fields.join(", "))
}

fn is_digest(v: &str) -> bool {
    v.len() >= 32 && v.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(ns: &str, name: &str, rest: Value) -> Arc<Value> {
        let mut o =
            json!({"metadata": {"namespace": ns, "name": name, "uid": format!("uid-of-{name}")}});
        if let (Some(o), Some(rest)) = (o.as_object_mut(), rest.as_object()) {
            o.extend(rest.clone());
        }
        Arc::new(o)
    }

    /// Held as text, as the sidecar's objects are.
    fn text(o: Arc<Value>) -> Stored {
        Stored::Text(o.to_string().into())
    }

    fn access(name: &str, granted: bool) -> Stored {
        text(object(
            "default",
            name,
            json!({"spec": {"bucketClaimName": "photos", "bucketAccessClassName": "rw",
                     "credentialsSecretName": format!("{name}-creds")},
                   "status": {"accountID": format!("acct-{name}"), "accessGranted": granted}}),
        ))
    }

    fn credentials(name: &str, secret: &str) -> Stored {
        let info = json!({"metadata": {"name": format!("ba-{name}")},
            "spec": {"bucketName": "b1", "authenticationType": "Key",
                     "secretS3": {"accessKeyID": format!("KEY-{name}"), "accessSecretKey": secret,
                                  "endpoint": "http://127.0.0.1:1", "region": "us-east-1"}}});
        let enc = base64::engine::general_purpose::STANDARD.encode(info.to_string());
        text(object(
            "default",
            &format!("{name}-creds"),
            json!({"data": {"BucketInfo": enc}}),
        ))
    }

    /// One step's objects: a claim, and (access, its Secret) pairs; the
    /// driver's checkpoints, a ConfigMap and a Secret, as the fake holds
    /// what the driver wrote over HTTP (text, with managedFields).
    /// `last`: as a run's last snapshot reads them (let go of, in part).
    fn render_step(
        claim: &Arc<Value>,
        accesses: &[(Stored, Stored)],
        norm: &mut Normalizer,
        (kept, seen): (&mut Kept, &mut Seen),
        last: bool,
    ) -> String {
        let backend = BackendState::default();
        let secrets = accesses.iter().map(|(_, sec)| {
            let o = sec.tree().unwrap();
            let key = format!(
                "{}/{}",
                s(&o, &["metadata", "namespace"]),
                s(&o, &["metadata", "name"])
            );
            (key.into(), sec.clone())
        });
        let managed = json!([{"manager": "driver", "operation": "Update", "apiVersion": "v1",
                              "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {".": {}}}}]);
        let b64 = |v: &str| base64::engine::general_purpose::STANDARD.encode(v);
        let meta = |extra: Value| {
            let mut m = json!({"namespace": "driver", "name": "state", "uid": "uid-of-state"});
            if let (Some(m), Some(extra)) = (m.as_object_mut(), extra.as_object()) {
                m.extend(extra.clone());
            }
            m
        };
        let checkpoints = [
            (
                "configmap",
                json!({"kind": "ConfigMap", "metadata": meta(json!({})),
                                 "data": {"n": accesses.len().to_string()}}),
            ),
            (
                "secret",
                json!({"kind": "Secret", "type": "Opaque",
                "metadata": meta(json!({"managedFields": managed, "resourceVersion": "7"})),
                "data": {"accessSecretKey": b64("checkpointed-secret-dddd"),
                         "inputs": b64(&"ab12".repeat(8 + accesses.len())),
                         "account": b64(&format!("acct-{}", accesses.len()))}}),
            ),
        ];
        let checkpoints = checkpoints.into_iter().map(|(kind, o)| {
            let o = Stored::Text(o.to_string().into());
            (kind, if last { checkpoint_part(&o) } else { o })
        });
        let objects = KubeObjects {
            claims: seen.claims.read(vec![Stored::Tree(claim.clone())]),
            buckets: vec![],
            accesses: (seen.accesses).read(accesses.iter().map(|(a, _)| a.clone()).collect()),
            credential_secrets: seen.infos.read(secrets.collect()),
        };
        let input = SnapshotInput {
            objects: if last { objects.unpinned() } else { objects },
            checkpoints: checkpoints.collect(),
            backend: &backend,
            backend_changed: None,
            lab_buckets: &[],
        };
        render(&input, norm, kept)
    }

    #[test]
    fn a_kept_policy_summary_is_made_again_once_the_policy_is_written() {
        let policy = |action: &str| {
            crate::systems::cosi::checks::PolicyDoc::from(
                json!({"Statement": [{"Effect": "Allow", "Action": [action],
                                  "Resource": ["arn:aws:s3:::b1/*"]}]}),
            )
        };
        let step = |backend: &BackendState,
                    changed: Option<&ChangedNames>,
                    norm: &mut Normalizer,
                    kept: &mut Kept| {
            let input = SnapshotInput {
                objects: KubeObjects {
                    claims: vec![],
                    buckets: vec![],
                    accesses: vec![],
                    credential_secrets: vec![],
                },
                checkpoints: vec![],
                backend,
                backend_changed: changed,
                lab_buckets: &[],
            };
            render::<String>(&input, norm, kept)
        };
        let fresh =
            |b: &BackendState| step(b, None, &mut Normalizer::default(), &mut Kept::default());
        let (mut norm, mut kept) = (Normalizer::default(), Kept::default());
        let mut backend = BackendState::default();
        backend.policies.insert("p1".into(), policy("s3:GetObject"));
        let first = step(&backend, None, &mut norm, &mut kept);
        assert_eq!(first, fresh(&backend));
        assert!(first.contains("s3:GetObject"), "{first}");

        backend.policies.insert("p1".into(), policy("s3:PutObject"));
        let written = ChangedNames {
            policies: ["p1".to_string()].into(),
            ..Default::default()
        };
        let second = step(&backend, Some(&written), &mut norm, &mut kept);
        assert_eq!(second, fresh(&backend));
        assert!(second.contains("s3:PutObject"), "{second}");

        // Not written since, as the journal tells it: the kept summary stands
        // (the journal is the one source of what changed).
        backend
            .policies
            .insert("p1".into(), policy("s3:DeleteObject"));
        let third = step(
            &backend,
            Some(&ChangedNames::default()),
            &mut norm,
            &mut kept,
        );
        assert_eq!(third, second);
    }

    /// A version whose text does not decode is shown as such, never
    /// dropped; one that does is read once and kept while it is the same.
    #[test]
    fn a_view_is_read_once_per_version_and_an_undecodable_one_is_shown() {
        let mut views = Views::<AccessView>::default();
        let good = access("a1", true);
        let bad = Stored::Text("{not json".into());
        let read = views.read(vec![good.clone(), bad.clone()]);
        assert!(read.iter().all(|v| v.new));
        let (a, b) = (&read[0].view, &read[1].view);
        assert_eq!(
            (a.name(), &*a.account_id, a.granted),
            ("default/a1", "acct-a1", true)
        );
        assert!(
            a.line().contains("account acct-a1, granted true"),
            "{}",
            a.line()
        );
        assert!(b.line().contains("does not decode as JSON"), "{}", b.line());
        assert!(!b.granted && b.key().is_empty());
        let again = views.read(vec![good]);
        assert!(!again[0].new && Arc::ptr_eq(&again[0].view, &read[0].view));
        assert_eq!(
            views.kept.kept.len(),
            1,
            "the version not read again is forgotten"
        );
    }

    #[test]
    fn kept_lines_render_as_fresh_ones_and_follow_changed_objects() {
        let claim = |ready: bool| {
            object(
                "default",
                "photos",
                json!({"spec": {"bucketClassName": "standard"}, "status": {"bucketName": "b1", "bucketReady": ready}}),
            )
        };
        let (unready, ready) = (claim(false), claim(true));
        let a1 = (
            access("a1", false),
            credentials("a1", "secret-one-aaaaaaaaaa"),
        );
        let a1_granted = (
            access("a1", true),
            credentials("a1", "secret-two-bbbbbbbbbb"),
        );
        let a2 = (
            access("a2", true),
            credentials("a2", "secret-three-cccccccc"),
        );
        let steps: Vec<(&Arc<Value>, Vec<(Stored, Stored)>)> = vec![
            (&unready, vec![]),
            (&ready, vec![a1.clone()]),
            // a1 changed (new objects, a rotated secret), a2 is new, the claim is the same object.
            (&ready, vec![a1_granted.clone(), a2.clone()]),
            (&ready, vec![a2.clone()]),
        ];
        let (mut norm_kept, mut kept, mut seen) = Default::default();
        let mut norm_fresh = Normalizer::default();
        for (i, (claim, accesses)) in steps.iter().enumerate() {
            let got = render_step(
                claim,
                accesses,
                &mut norm_kept,
                (&mut kept, &mut seen),
                false,
            );
            let want = render_step(
                claim,
                accesses,
                &mut norm_fresh,
                (&mut Kept::default(), &mut Seen::default()),
                false,
            );
            assert_eq!(got, want, "step {i}");
            // The run's last snapshot keeps nothing and shows the same.
            let mut last = Normalizer::default();
            last.forget_lines();
            let (mut kept_none, mut seen_none) = (Kept::last(), Seen::default());
            let shown = render_step(
                claim,
                accesses,
                &mut last,
                (&mut kept_none, &mut seen_none),
                true,
            );
            let fresh = render_step(
                claim,
                accesses,
                &mut Normalizer::default(),
                (&mut Kept::default(), &mut Seen::default()),
                false,
            );
            assert_eq!(shown, fresh, "step {i}, as the last snapshot");
            assert!(kept_none.objects.kept.is_empty() && kept_none.policies.is_empty());
        }
        // Only the last snapshot's objects are kept: the claim, a2 and its
        // Secret (its line and its BucketInfo), the two checkpoints.
        assert_eq!(seen.claims.kept.kept.len(), 1);
        assert_eq!(seen.accesses.kept.kept.len(), 1);
        assert_eq!(seen.infos.0.kept.len(), 1);
        assert_eq!(kept.objects.kept.len(), 3);
    }
}

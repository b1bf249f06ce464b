//! The COSI ownership snapshot: who owns which claim, bucket, access, account,
//! key, policy, checkpoint and Secret, as canonical sorted text, every id and
//! secret through the run's [`Normalizer`].

use std::fmt::Write as _;
use std::sync::Arc;

use base64::Engine as _;
use drivelab_fakes::json::{at as c, bool_at as b, str_at as s};
use drivelab_fakes::secret::Secret;
use serde_json::Value;

use super::checks::BackendState;
use crate::snapshot::Normalizer;

/// What the snapshot is built from: the kube fake's objects, shared with it
/// rather than copied (a snapshot after every step reads all of them).
pub struct SnapshotInput<'a> {
    /// BucketClaims, in scenario order of creation (deleted ones are simply absent).
    pub claims: Vec<Arc<Value>>,
    /// Bucket objects.
    pub buckets: Vec<Arc<Value>>,
    /// BucketAccesses.
    pub accesses: Vec<Arc<Value>>,
    /// Credentials Secrets named by accesses, each with its `BucketInfo`.
    pub credential_secrets: Vec<CredentialSecret>,
    /// Objects in the driver's state namespace (its checkpoints): (kind, object).
    pub checkpoints: Vec<(&'static str, Arc<Value>)>,
    /// The backend as the driver left it.
    pub backend: &'a BackendState,
    /// Backend buckets the lab itself owns (canaries), shown apart.
    pub lab_buckets: &'a [String],
}

/// A credentials Secret and its decoded `BucketInfo` (`None`: unreadable).
pub type CredentialSecret = (Arc<Value>, Option<Arc<Value>>);

/// The `BucketInfo`s the last snapshot decoded, by the Secret object they
/// came from: a snapshot after every step decoded every Secret twice, though
/// a step changes one or two.
#[derive(Default)]
pub struct BucketInfos(std::collections::HashMap<usize, CredentialSecret>);

impl BucketInfos {
    /// Each Secret with its `BucketInfo`, decoded unless it was last time;
    /// Secrets not among these are forgotten.
    pub fn read(&mut self, secrets: Vec<Arc<Value>>) -> Vec<CredentialSecret> {
        // Keyed by address: a kept entry holds its Secret, so while it is
        // kept no other object can have that address.
        let mut last = std::mem::take(&mut self.0);
        let read: Vec<CredentialSecret> = secrets
            .into_iter()
            .map(|sec| match last.remove(&(Arc::as_ptr(&sec) as usize)) {
                Some(kept) => kept,
                None => {
                    let info = bucket_info(&sec).map(Arc::new);
                    (sec, info)
                }
            })
            .collect();
        self.0 = read
            .iter()
            .map(|(sec, info)| (Arc::as_ptr(sec) as usize, (sec.clone(), info.clone())))
            .collect();
        read
    }
}

/// Render the canonical snapshot. `norm` should already know the run's uids in
/// creation order; the rest is labelled here in a fixed walk order.
pub fn render(input: &SnapshotInput<'_>, norm: &mut Normalizer) -> String {
    // Label ids in a fixed walk order so labels do not depend on random values.
    for c in &input.claims {
        norm.id("uid", &s(c, &["metadata", "uid"]));
    }
    for a in &input.accesses {
        norm.id("uid", &s(a, &["metadata", "uid"]));
    }
    for a in &input.accesses {
        norm.id("account", &s(a, &["status", "accountID"]));
    }
    for (_, info) in &input.credential_secrets {
        if let Some(info) = info {
            let key = s(info, &["spec", "secretS3", "accessKeyID"]);
            norm.id("key", &key);
            norm.secret(&Secret::new(s(
                info,
                &["spec", "secretS3", "accessSecretKey"],
            )));
            // Policies in the order of the accesses that use them, not of random key order.
            for p in input
                .backend
                .users
                .get(&key)
                .map(|u| u.policies.clone())
                .unwrap_or_default()
            {
                norm.id("policy", &p);
            }
        }
    }
    for (k, u) in &input.backend.users {
        norm.id("key", k);
        norm.secret(&u.secret);
        for p in &u.policies {
            norm.id("policy", p);
        }
    }
    for (p, _) in input.backend.driver_policies() {
        norm.id("policy", p);
    }
    for (_, o) in &input.checkpoints {
        norm.id("checkpoint", &s(o, &["metadata", "name"]));
    }

    let mut out = String::new();
    let _ = writeln!(out, "claims:");
    for c in sorted(&input.claims, |o| o, norm) {
        let _ = writeln!(
            out,
            "  {}/{}: class {}, bucket {}, ready {}",
            s(&c, &["metadata", "namespace"]),
            s(&c, &["metadata", "name"]),
            s(&c, &["spec", "bucketClassName"]),
            or_dash(&s(&c, &["status", "bucketName"])),
            b(&c, &["status", "bucketReady"]),
        );
    }
    let _ = writeln!(out, "buckets (objects):");
    for bk in sorted(&input.buckets, |o| o, norm) {
        let claim = match c(&bk, &["spec", "bucketClaim"]) {
            Some(cl) if !cl.is_null() => format!("{}/{}", s(cl, &["namespace"]), s(cl, &["name"])),
            _ => "released".to_string(),
        };
        let _ = writeln!(
            out,
            "  {}: claim {}, policy {}, bucketID {}, ready {}",
            s(&bk, &["metadata", "name"]),
            claim,
            s(&bk, &["spec", "deletionPolicy"]),
            or_dash(&s(&bk, &["status", "bucketID"])),
            b(&bk, &["status", "bucketReady"]),
        );
    }
    let _ = writeln!(out, "accesses:");
    for a in sorted(&input.accesses, |o| o, norm) {
        let _ = writeln!(
            out,
            "  {}/{}: claim {}, class {}, account {}, granted {}, secret {}",
            s(&a, &["metadata", "namespace"]),
            s(&a, &["metadata", "name"]),
            s(&a, &["spec", "bucketClaimName"]),
            s(&a, &["spec", "bucketAccessClassName"]),
            or_dash(&s(&a, &["status", "accountID"])),
            b(&a, &["status", "accessGranted"]),
            s(&a, &["spec", "credentialsSecretName"]),
        );
    }
    let _ = writeln!(out, "credential secrets:");
    for (sec, info) in sorted(&input.credential_secrets, |(sec, _)| sec, norm) {
        let name = format!(
            "{}/{}",
            s(&sec, &["metadata", "namespace"]),
            s(&sec, &["metadata", "name"])
        );
        match info {
            Some(info) => {
                let key = s(&info, &["spec", "secretS3", "accessKeyID"]);
                let secret = norm.secret(&Secret::new(s(
                    &info,
                    &["spec", "secretS3", "accessSecretKey"],
                )));
                let _ = writeln!(
                    out,
                    "  {name}: BucketInfo {} bucket {}, auth {}, key {}, secret {}, endpoint {}, region {}",
                    s(&info, &["metadata", "name"]),
                    s(&info, &["spec", "bucketName"]),
                    s(&info, &["spec", "authenticationType"]),
                    key,
                    secret,
                    s(&info, &["spec", "secretS3", "endpoint"]),
                    s(&info, &["spec", "secretS3", "region"]),
                );
            }
            None => {
                let _ = writeln!(out, "  {name}: no readable BucketInfo");
            }
        }
    }
    let _ = writeln!(out, "backend users:");
    let mut users: Vec<String> = input
        .backend
        .users
        .iter()
        .map(|(k, u)| {
            let mut pols: Vec<String> = u.policies.iter().map(|p| norm.text(p)).collect();
            pols.sort();
            format!(
                "  {}: secret {}, {}, policies [{}]",
                norm.text(k),
                norm.secret(&u.secret),
                u.status,
                pols.join(", ")
            )
        })
        .collect();
    users.sort();
    out.extend(users.into_iter().map(|l| l + "\n"));
    let _ = writeln!(out, "backend policies:");
    let mut pols: Vec<String> = input
        .backend
        .driver_policies()
        .map(|(name, doc)| format!("  {}: {}", norm.text(name), norm.text(&policy_summary(doc))))
        .collect();
    pols.sort();
    out.extend(pols.into_iter().map(|l| l + "\n"));
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
    out.extend(bks.into_iter().map(|l| l + "\n"));
    let _ = writeln!(out, "driver checkpoints:");
    let mut cps: Vec<String> = input
        .checkpoints
        .iter()
        .map(|(kind, o)| format!("  {kind} {}", checkpoint_line(o, norm)))
        .collect();
    cps.sort();
    out.extend(cps.into_iter().map(|l| l + "\n"));
    norm.text_all_lines(&out)
}

/// `objs` by the relabelled namespace/name of each one's object.
fn sorted<T: Clone>(objs: &[T], object: impl Fn(&T) -> &Value, norm: &Normalizer) -> Vec<T> {
    let mut v: Vec<T> = objs.to_vec();
    // Each key is a relabelling: worth computing once per object.
    v.sort_by_cached_key(|t| {
        let o = object(t);
        norm.text(&format!(
            "{}/{}",
            s(o, &["metadata", "namespace"]),
            s(o, &["metadata", "name"])
        ))
    });
    v
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

/// Decode the `BucketInfo` key of a credentials Secret.
pub fn bucket_info(secret: &Value) -> Option<Value> {
    let enc = c(secret, &["data", "BucketInfo"])?.as_str()?;
    let raw = base64::engine::general_purpose::STANDARD.decode(enc).ok()?;
    serde_json::from_slice(&raw).ok()
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

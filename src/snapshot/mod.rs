//! The ownership snapshot: who owns which claim, bucket, access, account, key,
//! policy, checkpoint and Secret, as canonical sorted text. Ids are labelled
//! in first-seen order (`<uid-1>`), secrets only as labels that change when the
//! secret changes (`<secret-A>`), so a diff shows a rotation and no secret is
//! ever written out.

pub mod csi;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use base64::Engine as _;
use drivelab_fakes::json::{at as c, bool_at as b, str_at as s};
use drivelab_fakes::secret::Secret;
use serde_json::Value;

use crate::checks::BackendState;

/// Assigns stable labels to ids and secrets and rewrites text with them.
#[derive(Default)]
pub struct Normalizer {
    labels: BTreeMap<String, String>,
    counters: BTreeMap<&'static str, usize>,
    secrets: BTreeMap<String, String>,
    /// The automaton over every known value, built on first use after a change:
    /// a snapshot calls `text` once per line, and rebuilding per call made a
    /// step cost O(ids²) (issue 9's profile: 65% of a growth run's CPU).
    matcher: std::sync::OnceLock<Matcher>,
}

// Holds raw secrets: Debug shows only counts.
impl std::fmt::Debug for Normalizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Normalizer")
            .field("ids", &self.labels.len())
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

/// Every known secret and id with its label, compiled once.
enum Matcher {
    /// Nothing is known yet: text passes unchanged.
    Empty,
    /// The automaton and, per pattern, its label.
    Ready(aho_corasick::AhoCorasick, Vec<String>),
    /// The pattern set could not be compiled (only on absurd sets).
    Failed,
}

impl Normalizer {
    /// Label `raw` as `<category-N>` (first time seen) and return the label.
    pub fn id(&mut self, category: &'static str, raw: &str) -> String {
        if raw.is_empty() {
            return String::new();
        }
        if let Some(l) = self.labels.get(raw) {
            return l.clone();
        }
        let n = self.counters.entry(category).or_insert(0);
        *n += 1;
        let label = format!("<{category}-{n}>");
        self.labels.insert(raw.to_string(), label.clone());
        self.matcher = Default::default();
        label
    }

    /// Label a fixed value with a fixed name (e.g. the endpoint URL).
    pub fn fixed(&mut self, raw: &str, label: &str) {
        if !raw.is_empty() {
            self.labels.insert(raw.to_string(), format!("<{label}>"));
            self.matcher = Default::default();
        }
    }

    /// Label a secret `<secret-A>`, `<secret-B>`, ... in first-seen order.
    pub fn secret(&mut self, s: &Secret) -> String {
        let raw = s.expose();
        if raw.is_empty() {
            return "<empty-secret>".to_string();
        }
        if let Some(l) = self.secrets.get(raw) {
            return l.clone();
        }
        let label = format!("<secret-{}>", letters(self.secrets.len()));
        self.secrets.insert(raw.to_string(), label.clone());
        self.matcher = Default::default();
        label
    }

    /// Like [`Normalizer::text`], then labels any remaining run of 16+ lowercase
    /// hex digits (names a driver derived from random ids, e.g. `key-<sha256>`)
    /// as `<hex-N>` in order of appearance, so two runs of one seed compare equal.
    pub fn text_all(&mut self, text: &str) -> String {
        let known = self.text(text);
        let bytes = known.as_bytes();
        let mut out = String::with_capacity(known.len());
        let mut i = 0;
        while i < bytes.len() {
            let is_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
            if is_hex(bytes[i]) && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric()) {
                let mut j = i;
                while j < bytes.len() && is_hex(bytes[j]) {
                    j += 1;
                }
                let boundary = j == bytes.len() || !bytes[j].is_ascii_alphanumeric();
                if j - i >= 16 && boundary {
                    out.push_str(&self.id("hex", &known[i..j]));
                    i = j;
                    continue;
                }
                out.push_str(&known[i..j]);
                i = j;
                continue;
            }
            let ch = known[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
        out
    }

    /// `text` with every known secret and id replaced by its label.
    pub fn text(&self, text: &str) -> String {
        match self.matcher.get_or_init(|| self.compile()) {
            Matcher::Ready(ac, labels) => ac.replace_all(text, labels),
            Matcher::Empty => text.to_string(),
            // Never write unlabelled text.
            Matcher::Failed => "<snapshot could not be labelled>".to_string(),
        }
    }

    fn compile(&self) -> Matcher {
        // One pass over the text (leftmost-longest, so no fragment of a longer
        // id or secret survives a shorter match); secrets win over ids.
        let mut patterns: Vec<&str> = Vec::new();
        let mut labels: Vec<String> = Vec::new();
        for (raw, label) in &self.secrets {
            patterns.push(raw);
            labels.push(label.clone());
        }
        for (raw, label) in &self.labels {
            if !self.secrets.contains_key(raw) {
                patterns.push(raw);
                labels.push(label.clone());
            }
        }
        if patterns.is_empty() {
            return Matcher::Empty;
        }
        match aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(&patterns)
        {
            Ok(ac) => Matcher::Ready(ac, labels),
            Err(_) => Matcher::Failed,
        }
    }
}

fn letters(mut n: usize) -> String {
    let mut s = Vec::new();
    loop {
        s.push(b'A' + (n % 26) as u8);
        n /= 26;
        if n == 0 {
            break;
        }
        n -= 1;
    }
    s.reverse();
    String::from_utf8(s).unwrap_or_default()
}

/// What the snapshot is built from.
pub struct SnapshotInput<'a> {
    /// BucketClaims, in scenario order of creation (deleted ones are simply absent).
    pub claims: Vec<Value>,
    /// Bucket objects.
    pub buckets: Vec<Value>,
    /// BucketAccesses.
    pub accesses: Vec<Value>,
    /// Credentials Secrets named by accesses (namespace/name → object).
    pub credential_secrets: Vec<Value>,
    /// Objects in the driver's state namespace (its checkpoints): (kind, object).
    pub checkpoints: Vec<(&'static str, Value)>,
    /// The backend as the driver left it.
    pub backend: &'a BackendState,
    /// Backend buckets the lab itself owns (canaries), shown apart.
    pub lab_buckets: &'a [String],
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
    for sec in &input.credential_secrets {
        if let Some(info) = bucket_info(sec) {
            let key = s(&info, &["spec", "secretS3", "accessKeyID"]);
            norm.id("key", &key);
            norm.secret(&Secret::new(s(
                &info,
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
    for c in sorted(&input.claims, norm) {
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
    for bk in sorted(&input.buckets, norm) {
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
    for a in sorted(&input.accesses, norm) {
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
    for sec in sorted(&input.credential_secrets, norm) {
        let name = format!(
            "{}/{}",
            s(&sec, &["metadata", "namespace"]),
            s(&sec, &["metadata", "name"])
        );
        match bucket_info(&sec) {
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
        .filter(|(n, _)| n.as_str() != crate::engine::CANARY_BUCKET)
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
    norm.text_all(&out)
}

fn sorted(objs: &[Value], norm: &Normalizer) -> Vec<Value> {
    let mut v: Vec<Value> = objs.to_vec();
    v.sort_by_key(|o| {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_get_letters_in_first_seen_order_and_never_appear() {
        let mut n = Normalizer::default();
        let a = Secret::new("supersecretvalue-aaaaaaaa");
        let bb = Secret::new("anothersecretvalue-bbbbbb");
        assert_eq!(n.secret(&a), "<secret-A>");
        assert_eq!(n.secret(&bb), "<secret-B>");
        assert_eq!(n.secret(&a), "<secret-A>");
        let t = n.text("x supersecretvalue-aaaaaaaa y anothersecretvalue-bbbbbb");
        assert_eq!(t, "x <secret-A> y <secret-B>");
    }

    #[test]
    fn ids_are_labelled_by_category_and_rewritten_inside_other_ids() {
        let mut n = Normalizer::default();
        assert_eq!(n.id("uid", "1234-abcd"), "<uid-1>");
        assert_eq!(n.id("uid", "9999-ffff"), "<uid-2>");
        assert_eq!(n.id("key", "AKIA1"), "<key-1>");
        assert_eq!(
            n.text("bucket-1234-abcd and ba-9999-ffff"),
            "bucket-<uid-1> and ba-<uid-2>"
        );
    }

    #[test]
    fn leftover_hex_runs_are_labelled_in_order() {
        let mut n = Normalizer::default();
        let t = n.text_all("key-0123456789abcdef0123 then key-fedcba9876543210 then key-0123456789abcdef0123 and cafe");
        assert_eq!(t, "key-<hex-1> then key-<hex-2> then key-<hex-1> and cafe");
    }

    #[test]
    fn letters_go_past_z() {
        assert_eq!(letters(0), "A");
        assert_eq!(letters(25), "Z");
        assert_eq!(letters(26), "AA");
    }
}

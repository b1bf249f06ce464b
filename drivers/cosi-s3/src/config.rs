//! Driver configuration, the seeded bugs ("mutants"), and the parsing and
//! validation of COSI request fields and class parameters. Everything here is
//! pure, so the rules the lab relies on are unit-tested without a backend.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::DriverError;

/// Where the driver keeps its checkpoints when the config leaves it empty.
pub const DEFAULT_STATE_NAMESPACE: &str = "cosi-s3-system";
/// Region used for signing and reported to workloads when the class names none.
pub const DEFAULT_REGION: &str = "us-east-1";
/// COSI v1alpha1: string fields are at most 128 bytes.
pub const MAX_STRING_BYTES: usize = 128;
/// COSI v1alpha1: map fields are at most 4 KiB (keys and values together).
pub const MAX_MAP_BYTES: usize = 4096;

/// How the driver is started: where Kubernetes is, where checkpoints go, which bugs are on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverConfig {
    /// Base URL of the Kubernetes API, e.g. `http://127.0.0.1:PORT`.
    pub kube_url: String,
    /// With `kube_url`: a file holding the bearer token to send (a pod's
    /// service-account token); empty sends none.
    #[serde(default)]
    pub kube_token_file: String,
    /// With an https `kube_url`: a PEM file of the CA to trust (a pod's
    /// service-account `ca.crt`); empty trusts the system's roots.
    #[serde(default)]
    pub kube_ca_file: String,
    /// Namespace holding the checkpoints; empty means [`DEFAULT_STATE_NAMESPACE`].
    pub state_namespace: String,
    /// Seeded bugs switched on; empty is the correct driver.
    pub mutants: Vec<Mutant>,
    /// Which of the driver's correct policy designs it runs (not a bug: every
    /// layout is idempotent, least-privilege and cleans up after itself).
    #[serde(default)]
    pub policy_layout: PolicyLayout,
    /// Characters of each secret key it generates; 0 is [`crate::service::SECRET_KEY_LEN`].
    /// Neither RustFS nor MinIO caps an add-user secret at 40 (a driver with
    /// longer secrets must pass too).
    #[serde(default)]
    pub secret_length: usize,
}

/// Secret lengths `--secret-length` accepts.
pub const SECRET_LENGTHS: std::ops::RangeInclusive<usize> = 16..=128;

impl DriverConfig {
    /// The namespace checkpoints live in, with the default applied.
    pub fn state_namespace(&self) -> &str {
        if self.state_namespace.is_empty() {
            DEFAULT_STATE_NAMESPACE
        } else {
            &self.state_namespace
        }
    }

    /// Characters of each secret key it generates, with the default applied.
    pub fn secret_length(&self) -> usize {
        if self.secret_length == 0 {
            crate::service::SECRET_KEY_LEN
        } else {
            self.secret_length
        }
    }

    /// Whether `m` is switched on.
    pub fn has(&self, m: Mutant) -> bool {
        self.mutants.contains(&m)
    }
}

/// How a grant's permissions are laid out as canned policies. Both layouts
/// are correct; the second exists so the lab's stock scenarios can be shown
/// to assert the COSI spec and the invariants rather than one driver's shape.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyLayout {
    /// The reference design: one generated access policy per grant.
    #[default]
    PerGrant,
    /// The access policy plus a second per-grant "owner marker" policy named
    /// after the account (read-only bucket location on the same bucket: it
    /// grants nothing the access policy does not), created and attached with
    /// the grant and removed on revoke.
    PerGrantWithOwnerMarker,
}

impl PolicyLayout {
    /// Every layout, the reference design first.
    pub fn all() -> &'static [PolicyLayout] {
        &[
            PolicyLayout::PerGrant,
            PolicyLayout::PerGrantWithOwnerMarker,
        ]
    }

    /// The kebab-case name used by `--policy-layout` and scenario files.
    pub fn name(self) -> &'static str {
        match self {
            PolicyLayout::PerGrant => "per-grant",
            PolicyLayout::PerGrantWithOwnerMarker => "per-grant-with-owner-marker",
        }
    }

    /// Parse a kebab-case name (as printed by [`PolicyLayout::name`]).
    pub fn parse(s: &str) -> Option<PolicyLayout> {
        let s = s.trim();
        PolicyLayout::all().iter().copied().find(|l| l.name() == s)
    }
}

/// A seeded bug the lab must be able to catch. Each one re-creates a defect
/// found in a real driver (DOMAIN.md §1); the default path is the fixed one.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mutant {
    /// Secret derived from the account name instead of the OS RNG.
    PredictableSecret,
    /// add-user before the checkpoint; a retry that finds the user answers AlreadyExists.
    UserBeforeCheckpoint,
    /// Policy named by the class and replaced on every grant.
    SharedPolicy,
    /// Every grant call mints a new secret and re-runs add-user.
    RotateOnRetry,
    /// Backend BucketAlreadyExists/OwnedByYou on create is taken as success.
    AlreadyExistsIsSuccess,
    /// Delete removes the bucket without proof of ownership.
    DeleteUnowned,
    /// UnknownAuthenticationType is treated as Key.
    UnknownAuthAsKey,
    /// Same name with different parameters answers OK.
    IgnoreIncompatibleParams,
    /// `preferredAccessKey` is used as the access key with no reservation and no check.
    SharedPreferredKey,
    /// Every revoke is refused INVALID_ARGUMENT for a parameter the sidecar never sends.
    RevokeNeedsParameter,
    // Order-of-commit bugs the single-fault sweep finds (issue 18 item 7).
    /// The backend bucket is created before its ownership checkpoint is written.
    BucketBeforeCheckpoint,
    /// Revoke deletes the grant's checkpoint before it removes the grant's policy.
    PolicyAfterForget,
    // -- issue 18: access modes, objects the driver does not own, secret sources --
    /// A read-only grant gets the read-write policy document.
    ReadOnlyGetsWrite,
    /// A grant naming an external canned policy (`policy:`) rewrites its document.
    RewriteExternalPolicy,
    /// Delete also removes every bucket whose name starts with the bucket's.
    DeletePrefixBuckets,
    /// The secret comes from a PRNG seeded with the wall-clock time.
    TimeSeededSecret,
    /// One secret, drawn once per process, for every grant.
    SameSecretEveryAccess,
    // -- end issue 18 --
}

impl Mutant {
    /// Every mutant, in declaration order.
    pub fn all() -> &'static [Mutant] {
        &[
            Mutant::PredictableSecret,
            Mutant::UserBeforeCheckpoint,
            Mutant::SharedPolicy,
            Mutant::RotateOnRetry,
            Mutant::AlreadyExistsIsSuccess,
            Mutant::DeleteUnowned,
            Mutant::UnknownAuthAsKey,
            Mutant::IgnoreIncompatibleParams,
            Mutant::SharedPreferredKey,
            Mutant::RevokeNeedsParameter,
            Mutant::BucketBeforeCheckpoint,
            Mutant::PolicyAfterForget,
            // issue 18
            Mutant::ReadOnlyGetsWrite,
            Mutant::RewriteExternalPolicy,
            Mutant::DeletePrefixBuckets,
            Mutant::TimeSeededSecret,
            Mutant::SameSecretEveryAccess,
        ]
    }

    /// The kebab-case name used on the command line and in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Mutant::PredictableSecret => "predictable-secret",
            Mutant::UserBeforeCheckpoint => "user-before-checkpoint",
            Mutant::SharedPolicy => "shared-policy",
            Mutant::RotateOnRetry => "rotate-on-retry",
            Mutant::AlreadyExistsIsSuccess => "already-exists-is-success",
            Mutant::DeleteUnowned => "delete-unowned",
            Mutant::UnknownAuthAsKey => "unknown-auth-as-key",
            Mutant::IgnoreIncompatibleParams => "ignore-incompatible-params",
            Mutant::SharedPreferredKey => "shared-preferred-key",
            Mutant::RevokeNeedsParameter => "revoke-needs-parameter",
            Mutant::BucketBeforeCheckpoint => "bucket-before-checkpoint",
            Mutant::PolicyAfterForget => "policy-after-forget",
            // issue 18
            Mutant::ReadOnlyGetsWrite => "read-only-gets-write",
            Mutant::RewriteExternalPolicy => "rewrite-external-policy",
            Mutant::DeletePrefixBuckets => "delete-prefix-buckets",
            Mutant::TimeSeededSecret => "time-seeded-secret",
            Mutant::SameSecretEveryAccess => "same-secret-every-access",
        }
    }

    /// One line on what the bug does and which invariant should catch it.
    pub fn describe(self) -> &'static str {
        match self {
            Mutant::PredictableSecret => {
                "secret = first 40 hex of sha256(\"cosi-s3:\" + account name): anyone who knows the name can compute it (unpredictable-secrets)"
            }
            Mutant::UserBeforeCheckpoint => {
                "add-user runs before the checkpoint is written; after a crash between the two every retry answers AlreadyExists (converges)"
            }
            Mutant::SharedPolicy => {
                "the policy is named by the BucketAccessClass and replaced by each grant, so earlier grants lose access (least-privilege)"
            }
            Mutant::RotateOnRetry => {
                "every grant call generates a new secret and re-runs add-user, killing credentials already handed out (no-rotation)"
            }
            Mutant::AlreadyExistsIsSuccess => {
                "backend BucketAlreadyExists/OwnedByYou on create is success: claims share buckets, foreign buckets are adopted (owner-only-delete)"
            }
            Mutant::DeleteUnowned => {
                "delete removes the bucket without checking the ownership checkpoint (owner-only-delete)"
            }
            Mutant::UnknownAuthAsKey => {
                "UnknownAuthenticationType is treated as Key instead of InvalidArgument (spec-codes)"
            }
            Mutant::IgnoreIncompatibleParams => {
                "same name with different parameters answers OK instead of AlreadyExists (spec-codes)"
            }
            Mutant::SharedPreferredKey => {
                "preferredAccessKey becomes the access key with no reservation and no check: a second grant re-runs add-user on it and replaces the first grant's secret (no-rotation, no shared keys)"
            }
            Mutant::RevokeNeedsParameter => {
                "every revoke answers INVALID_ARGUMENT for a revoke_access_context key the sidecar never sends; the sidecar retries it for ever and the credentials stay (converges)"
            }
            Mutant::BucketBeforeCheckpoint => {
                "the backend bucket is created before the ownership checkpoint is written; after a crash between the two every retry finds a bucket it holds no checkpoint for and refuses it, and the bucket is leaked (converges, no-orphans)"
            }
            Mutant::PolicyAfterForget => {
                "revoke removes the user, deletes the grant's checkpoint, then removes the policy; after a crash or a lost reply between the two the retry finds no grant and answers OK, and the policy is leaked (no-orphans)"
            }
            // issue 18
            Mutant::ReadOnlyGetsWrite => {
                "an `accessMode: ReadOnly` grant gets the read-write policy document, so its credentials can write and delete objects (least-privilege)"
            }
            Mutant::RewriteExternalPolicy => {
                "a grant whose class names an externally managed canned policy (`policy:`) \"ensures\" it by writing its own per-bucket document over it, changing it for every other user of that policy (owner-only-delete)"
            }
            Mutant::DeletePrefixBuckets => {
                "deleting bucket B also deletes every bucket whose name starts with B (meant for its own `B-*` companions), whoever owns them (owner-only-delete)"
            }
            Mutant::TimeSeededSecret => {
                "the secret comes from a PRNG seeded with the wall-clock time in nanoseconds: two labs under the same frozen clock hand out the same secrets (unpredictable-secrets, twin lab)"
            }
            Mutant::SameSecretEveryAccess => {
                "one random secret is drawn when the driver starts and handed to every grant: accesses with different keys share a secret (unique-credentials)"
            }
        }
    }

    /// Parse a kebab-case name (as printed by [`Mutant::name`]).
    pub fn parse(s: &str) -> Option<Mutant> {
        let s = s.trim();
        Mutant::all().iter().copied().find(|m| m.name() == s)
    }
}

impl std::fmt::Display for Mutant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which admin API dialect the backend speaks.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdminApi {
    /// `/rustfs/admin/v3/`, plain JSON bodies.
    Rustfs,
}

impl AdminApi {
    /// Path prefix of the admin routes, with a trailing slash.
    pub fn prefix(self) -> &'static str {
        match self {
            AdminApi::Rustfs => "/rustfs/admin/v3/",
        }
    }
}

/// How to reach the backend: the connection part of both class kinds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    /// S3 and admin base URL, `http://host:port` with no path.
    pub endpoint: String,
    /// Secret holding the admin `accessKey` / `secretKey`.
    pub secret_name: String,
    /// Namespace of that Secret.
    pub secret_namespace: String,
    /// Signing region, also reported to workloads.
    pub region: String,
    /// Admin API dialect.
    pub admin_api: AdminApi,
}

/// What a grant may do with its bucket, for the generated policy.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessMode {
    /// Get, Put, Delete objects; list and locate the bucket.
    ReadWrite,
    /// Get objects; list and locate the bucket.
    ReadOnly,
}

/// Parsed BucketAccessClass parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessParams {
    /// How to reach the backend.
    pub conn: Connection,
    /// An externally managed canned policy to attach instead of generating one.
    pub policy: Option<String>,
    /// Access mode of the generated policy (ignored when `policy` is set).
    pub access_mode: AccessMode,
    /// The access key the grant should get if no other access holds it
    /// (`preferredAccessKey`); a random one otherwise.
    pub preferred_access_key: Option<String>,
}

const P_ENDPOINT: &str = "endpoint";
const P_SECRET_NAME: &str = "objectStoreUserSecretName";
const P_SECRET_NAMESPACE: &str = "objectStoreUserSecretNamespace";
const P_REGION: &str = "region";
const P_ADMIN_API: &str = "adminApi";
const P_POLICY: &str = "policy";
const P_ACCESS_MODE: &str = "accessMode";
const P_PREFERRED_ACCESS_KEY: &str = "preferredAccessKey";

/// Shortest access key MinIO accepts (its `auth.accessKeyMinLen`).
pub const MIN_ACCESS_KEY_LEN: usize = 3;
/// Longest preferred access key accepted: the length of our generated keys,
/// well inside every backend's limit and short enough to stay a label value.
pub const MAX_PREFERRED_ACCESS_KEY_LEN: usize = 20;

fn invalid(msg: impl Into<String>) -> DriverError {
    DriverError::InvalidArgument(msg.into())
}

fn required<'a>(
    params: &'a HashMap<String, String>,
    key: &str,
    what: &str,
) -> Result<&'a str, DriverError> {
    match params.get(key).map(|v| v.trim()) {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(invalid(format!(
            "class parameter `{key}` is required: {what}"
        ))),
    }
}

/// Parse the connection parameters shared by BucketClass and BucketAccessClass.
pub fn parse_connection(params: &HashMap<String, String>) -> Result<Connection, DriverError> {
    let endpoint = required(
        params,
        P_ENDPOINT,
        "the S3 + admin base URL, e.g. http://127.0.0.1:9000",
    )?;
    let endpoint = validate_endpoint(endpoint)?;
    let secret_name = required(
        params,
        P_SECRET_NAME,
        "the name of a Secret with keys `accessKey` and `secretKey` (the admin credentials)",
    )?;
    validate_dns_subdomain(P_SECRET_NAME, secret_name)?;
    let secret_namespace = required(params, P_SECRET_NAMESPACE, "the namespace of that Secret")?;
    validate_dns_label(P_SECRET_NAMESPACE, secret_namespace)?;
    let region = match params.get(P_REGION).map(|v| v.trim()) {
        None | Some("") => DEFAULT_REGION.to_string(),
        Some(r) => {
            if !r.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                return Err(invalid(format!(
                    "class parameter `{P_REGION}` = {r:?} is not a region name (letters, digits, '-')"
                )));
            }
            r.to_string()
        }
    };
    let admin_api = match params.get(P_ADMIN_API).map(|v| v.trim().to_ascii_lowercase()) {
        None => AdminApi::Rustfs,
        Some(v) if v.is_empty() || v == "rustfs" => AdminApi::Rustfs,
        Some(v) if v == "minio" => {
            return Err(invalid(format!(
                "class parameter `{P_ADMIN_API}` = minio is not supported: /minio/admin bodies are madmin-encrypted, which this driver does not implement; use `{P_ADMIN_API}: rustfs` (the /rustfs/admin/v3 plain-JSON API)"
            )))
        }
        Some(v) => {
            return Err(invalid(format!(
                "class parameter `{P_ADMIN_API}` = {v:?} is unknown; the only supported value is `rustfs`"
            )))
        }
    };
    Ok(Connection {
        endpoint,
        secret_name: secret_name.to_string(),
        secret_namespace: secret_namespace.to_string(),
        region,
        admin_api,
    })
}

/// Parse BucketAccessClass parameters.
pub fn parse_access(params: &HashMap<String, String>) -> Result<AccessParams, DriverError> {
    let conn = parse_connection(params)?;
    let policy = match params.get(P_POLICY).map(|v| v.trim()) {
        None | Some("") => None,
        Some(p) => {
            if p.len() > MAX_STRING_BYTES
                || !p
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.=,@+".contains(c))
            {
                return Err(invalid(format!(
                    "BucketAccessClass parameter `{P_POLICY}` = {p:?} is not a canned policy name (letters, digits, -_.=,@+; at most 128 bytes)"
                )));
            }
            Some(p.to_string())
        }
    };
    let access_mode = match params.get(P_ACCESS_MODE).map(|v| v.trim().to_ascii_lowercase()) {
        None => AccessMode::ReadWrite,
        Some(v) if v.is_empty() || v == "readwrite" => AccessMode::ReadWrite,
        Some(v) if v == "readonly" => AccessMode::ReadOnly,
        Some(v) => {
            return Err(invalid(format!(
                "BucketAccessClass parameter `{P_ACCESS_MODE}` = {v:?} is unknown; use `readwrite` or `readonly`"
            )))
        }
    };
    let preferred_access_key = match params.get(P_PREFERRED_ACCESS_KEY).map(|v| v.trim()) {
        None | Some("") => None,
        Some(k) => {
            validate_access_key(P_PREFERRED_ACCESS_KEY, k)?;
            Some(k.to_string())
        }
    };
    Ok(AccessParams {
        conn,
        policy,
        access_mode,
        preferred_access_key,
    })
}

/// Access key rules as MinIO applies them (at least 3 characters), narrowed to
/// a character set that is also a valid Kubernetes label value, because the
/// grant checkpoint carries the access key as a label for revoke's lookup.
pub fn validate_access_key(param: &str, key: &str) -> Result<(), DriverError> {
    let ok = (MIN_ACCESS_KEY_LEN..=MAX_PREFERRED_ACCESS_KEY_LEN).contains(&key.len())
        && key
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c));
    if ok {
        Ok(())
    } else {
        // The value is an identifier, not a secret, so naming it in the error is fine.
        Err(invalid(format!(
            "BucketAccessClass parameter `{param}` = {key:?} is not a usable access key ({MIN_ACCESS_KEY_LEN}-{MAX_PREFERRED_ACCESS_KEY_LEN} characters from A-Z a-z 0-9 - _ .)"
        )))
    }
}

fn validate_endpoint(endpoint: &str) -> Result<String, DriverError> {
    let e = endpoint.trim_end_matches('/');
    let uri: http::Uri = e.parse().map_err(|err| {
        invalid(format!(
            "class parameter `{P_ENDPOINT}` = {endpoint:?} is not a URL ({err}); use http://host:port"
        ))
    })?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(invalid(format!(
                "class parameter `{P_ENDPOINT}` = {endpoint:?}: https is not supported by this build (no TLS stack); use http://"
            )))
        }
        _ => {
            return Err(invalid(format!(
                "class parameter `{P_ENDPOINT}` = {endpoint:?} needs a scheme; use http://host:port"
            )))
        }
    }
    if uri.authority().is_none() {
        return Err(invalid(format!(
            "class parameter `{P_ENDPOINT}` = {endpoint:?} has no host; use http://host:port"
        )));
    }
    if uri.path() != "/" && !uri.path().is_empty() || uri.query().is_some() {
        return Err(invalid(format!(
            "class parameter `{P_ENDPOINT}` = {endpoint:?} must not carry a path or query; use http://host:port"
        )));
    }
    Ok(e.to_string())
}

fn validate_dns_label(param: &str, v: &str) -> Result<(), DriverError> {
    if is_dns_label(v) {
        Ok(())
    } else {
        Err(invalid(format!(
            "class parameter `{param}` = {v:?} is not a DNS-1123 label (lowercase letters, digits, '-', at most 63)"
        )))
    }
}

fn validate_dns_subdomain(param: &str, v: &str) -> Result<(), DriverError> {
    if v.len() <= 253 && !v.is_empty() && v.split('.').all(is_dns_label) {
        Ok(())
    } else {
        Err(invalid(format!(
            "class parameter `{param}` = {v:?} is not a DNS-1123 subdomain (lowercase letters, digits, '-', '.')"
        )))
    }
}

/// A DNS-1123 label: what Kubernetes accepts as a namespace or name segment.
pub fn is_dns_label(v: &str) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// S3 bucket naming rules (3-63 chars, lowercase, digits, '.', '-', no IP form).
pub fn validate_bucket_name(field: &str, name: &str) -> Result<(), DriverError> {
    let b = name.as_bytes();
    let ok = (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !name.contains("..")
        && name.parse::<std::net::Ipv4Addr>().is_err();
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "`{field}` = {name:?} is not a valid S3 bucket name (3-63 lowercase letters, digits, '.', '-')"
        )))
    }
}

/// Check a request string against the spec limit; `required` rejects empty too.
pub fn check_string(field: &str, v: &str, required: bool) -> Result<(), DriverError> {
    if required && v.is_empty() {
        return Err(invalid(format!("`{field}` is required")));
    }
    if v.len() > MAX_STRING_BYTES {
        return Err(invalid(format!(
            "`{field}` is {} bytes; COSI allows at most {MAX_STRING_BYTES}",
            v.len()
        )));
    }
    Ok(())
}

/// Check a request map against the spec limit (keys and values together).
pub fn check_map(field: &str, m: &HashMap<String, String>) -> Result<(), DriverError> {
    let size: usize = m.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_MAP_BYTES {
        return Err(invalid(format!(
            "`{field}` is {size} bytes; COSI allows at most {MAX_MAP_BYTES}"
        )));
    }
    Ok(())
}

/// Stable digest of a parameter map: same parameters, same hash, whatever the order.
pub fn params_hash(extra: &[(&str, &str)], params: &HashMap<String, String>) -> String {
    let sorted: BTreeMap<&str, &str> = params
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut h = Sha256::new();
    for (k, v) in extra {
        h.update(k.as_bytes());
        h.update([0u8]);
        h.update(v.as_bytes());
        h.update([0u8]);
    }
    h.update([1u8]);
    for (k, v) in sorted {
        // Length-prefixed so ("a","bc") and ("ab","c") cannot collide.
        h.update((k.len() as u64).to_be_bytes());
        h.update(k.as_bytes());
        h.update((v.len() as u64).to_be_bytes());
        h.update(v.as_bytes());
    }
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn base() -> HashMap<String, String> {
        p(&[
            ("endpoint", "http://127.0.0.1:9000"),
            ("objectStoreUserSecretName", "admin"),
            ("objectStoreUserSecretNamespace", "default"),
        ])
    }

    #[test]
    fn mutant_names_round_trip() {
        for m in Mutant::all() {
            assert_eq!(Mutant::parse(m.name()), Some(*m));
            assert!(!m.describe().is_empty());
            let json = serde_json::to_string(m).unwrap();
            assert_eq!(json, format!("\"{}\"", m.name()));
            assert_eq!(serde_json::from_str::<Mutant>(&json).unwrap(), *m);
        }
        assert_eq!(Mutant::all().len(), 17);
        assert_eq!(Mutant::parse("no-such-bug"), None);
        assert_eq!(Mutant::parse(""), None);
    }

    #[test]
    fn connection_defaults() {
        let c = parse_connection(&base()).unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:9000");
        assert_eq!(c.region, "us-east-1");
        assert_eq!(c.admin_api, AdminApi::Rustfs);
        let a = parse_access(&base()).unwrap();
        assert_eq!(a.access_mode, AccessMode::ReadWrite);
        assert_eq!(a.policy, None);
        assert_eq!(a.preferred_access_key, None);
    }

    #[test]
    fn preferred_access_key_is_validated() {
        for good in [
            "TEAMKEY",
            "abc",
            "a-b_c.d",
            "A1234567890123456789",
            " padded ",
        ] {
            let mut m = base();
            m.insert("preferredAccessKey".into(), good.into());
            let a = parse_access(&m).unwrap_or_else(|e| panic!("{good:?}: {e}"));
            assert_eq!(a.preferred_access_key.as_deref(), Some(good.trim()));
        }
        let mut m = base();
        m.insert("preferredAccessKey".into(), "  ".into());
        assert_eq!(
            parse_access(&m).unwrap().preferred_access_key,
            None,
            "blank means unset"
        );
        let long = "A".repeat(21);
        for bad in [
            "ab",
            long.as_str(),
            "has space",
            "slash/key",
            "équipe",
            "key:1",
            "a\u{0}b",
            "=TEAM",
        ] {
            let mut m = base();
            m.insert("preferredAccessKey".into(), bad.into());
            let err = parse_access(&m).unwrap_err();
            assert!(
                matches!(err, DriverError::InvalidArgument(ref s) if s.contains("preferredAccessKey")),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn missing_parameters_are_named() {
        for key in [
            "endpoint",
            "objectStoreUserSecretName",
            "objectStoreUserSecretNamespace",
        ] {
            let mut m = base();
            m.remove(key);
            let err = parse_connection(&m).unwrap_err();
            assert!(
                matches!(err, DriverError::InvalidArgument(ref s) if s.contains(key)),
                "{err}"
            );
        }
    }

    #[test]
    fn bad_parameters_are_rejected() {
        let cases: &[(&str, &str, &str)] = &[
            ("endpoint", "127.0.0.1:9000", "endpoint"),
            ("endpoint", "https://x:1", "https"),
            ("endpoint", "http://x:1/path", "path"),
            ("adminApi", "minio", "madmin"),
            ("adminApi", "ceph", "adminApi"),
            (
                "objectStoreUserSecretNamespace",
                "Bad_NS",
                "objectStoreUserSecretNamespace",
            ),
            ("region", "us east", "region"),
        ];
        for (k, v, needle) in cases {
            let mut m = base();
            m.insert(k.to_string(), v.to_string());
            let err = parse_connection(&m).unwrap_err();
            assert!(
                matches!(err, DriverError::InvalidArgument(ref s) if s.contains(needle)),
                "{k}={v}: {err}"
            );
        }
        let mut m = base();
        m.insert("accessMode".into(), "admin".into());
        assert!(
            matches!(parse_access(&m), Err(DriverError::InvalidArgument(s)) if s.contains("accessMode"))
        );
        let mut m = base();
        m.insert("policy".into(), "has space".into());
        assert!(
            matches!(parse_access(&m), Err(DriverError::InvalidArgument(s)) if s.contains("policy"))
        );
        let mut m = base();
        m.insert("accessMode".into(), "readonly".into());
        m.insert("policy".into(), "team-a".into());
        m.insert("adminApi".into(), "rustfs".into());
        let a = parse_access(&m).unwrap();
        assert_eq!(a.access_mode, AccessMode::ReadOnly);
        assert_eq!(a.policy.as_deref(), Some("team-a"));
    }

    #[test]
    fn sizes_follow_the_spec() {
        assert!(check_string("name", &"a".repeat(128), true).is_ok());
        assert!(check_string("name", &"a".repeat(129), true).is_err());
        assert!(check_string("name", "", true).is_err());
        assert!(check_string("name", "", false).is_ok());
        let mut m = HashMap::new();
        m.insert("k".to_string(), "v".repeat(4095));
        assert!(check_map("parameters", &m).is_ok());
        m.insert("k2".to_string(), "v".repeat(10));
        assert!(check_map("parameters", &m).is_err());
    }

    #[test]
    fn bucket_names() {
        assert!(
            validate_bucket_name("name", "bucket-0f6e7c1a-2b3c-4d5e-8f90-123456789abc").is_ok()
        );
        for bad in [
            "ab",
            "Upper",
            "-lead",
            "trail-",
            "a..b",
            "192.168.1.1",
            "under_score",
        ] {
            assert!(validate_bucket_name("name", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn params_hash_is_order_independent_and_sensitive() {
        let a = p(&[("x", "1"), ("y", "2")]);
        let b = p(&[("y", "2"), ("x", "1")]);
        assert_eq!(params_hash(&[], &a), params_hash(&[], &b));
        assert_ne!(
            params_hash(&[], &a),
            params_hash(&[], &p(&[("x", "1"), ("y", "3")]))
        );
        assert_ne!(
            params_hash(&[("bucket", "b1")], &a),
            params_hash(&[("bucket", "b2")], &a)
        );
        assert_ne!(
            params_hash(&[], &p(&[("a", "bc")])),
            params_hash(&[], &p(&[("ab", "c")]))
        );
    }

    #[test]
    fn state_namespace_default() {
        assert_eq!(DriverConfig::default().state_namespace(), "cosi-s3-system");
        let c = DriverConfig {
            state_namespace: "x".into(),
            ..Default::default()
        };
        assert_eq!(c.state_namespace(), "x");
    }
}

//! The COSI steps of the scenario language: what a scenario asks of the COSI
//! system (claims, accesses, static and foreign buckets, retries), and how
//! each is checked against what earlier steps made.

use crate::scenario::{
    check_dns, default_namespace, AccessStep, BackendBucketStep, BackendName, BackendPolicyStep,
    BackendUserStep, ClaimStep, Ctx, ObjectRef, PlantedBucket, RawBackendBucket, RawBackendPolicy,
    RetryOp, RetryStep, ScenarioError, StaticBucketStep, Validator,
};
use serde_saphyr::Spanned;

/// A COSI step, which the COSI lab applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CosiStep {
    /// Create a BucketClaim and let the sidecar converge.
    CreateBucketClaim(ClaimStep),
    /// Create a BucketAccess and let the sidecar converge.
    GrantAccess(AccessStep),
    /// Delete a BucketAccess (revoke).
    RevokeAccess(ObjectRef),
    /// Delete a BucketClaim (honouring deletion policy).
    DeleteBucketClaim(ObjectRef),
    /// Send the driver request an earlier step made again.
    Retry(RetryStep),
    /// Create a static Bucket object (as an admin would) for an existing backend bucket.
    CreateBucket(StaticBucketStep),
    /// Create a bucket directly in the backend, owned by someone other than the driver.
    CreateBackendBucket(BackendBucketStep),
    /// Create a canned policy directly in the backend, managed by someone else.
    CreateBackendPolicy(BackendPolicyStep),
    /// Create a user directly in the backend, managed by someone else.
    CreateBackendUser(BackendUserStep),
}

impl CosiStep {
    /// The step's keyword, as in the file.
    pub fn keyword(&self) -> &'static str {
        match self {
            CosiStep::CreateBucketClaim(_) => "create_bucket_claim",
            CosiStep::GrantAccess(_) => "grant_access",
            CosiStep::RevokeAccess(_) => "revoke_access",
            CosiStep::DeleteBucketClaim(_) => "delete_bucket_claim",
            CosiStep::Retry(_) => "retry",
            CosiStep::CreateBucket(_) => "create_bucket",
            CosiStep::CreateBackendBucket(_) => "create_backend_bucket",
            CosiStep::CreateBackendPolicy(_) => "create_backend_policy",
            CosiStep::CreateBackendUser(_) => "create_backend_user",
        }
    }

    /// A one-line description for histories and reports.
    pub fn describe(&self) -> String {
        match self {
            CosiStep::CreateBucketClaim(c) => format!(
                "create_bucket_claim {}/{} (class {})",
                c.namespace, c.name, c.class
            ),
            CosiStep::GrantAccess(a) => format!(
                "grant_access {}/{} to claim {} (class {})",
                a.namespace, a.name, a.claim, a.class
            ),
            CosiStep::RevokeAccess(o) => format!("revoke_access {}/{}", o.namespace, o.name),
            CosiStep::DeleteBucketClaim(o) => {
                format!("delete_bucket_claim {}/{}", o.namespace, o.name)
            }
            CosiStep::Retry(r) => format!("retry {} {}", r.op.keyword(), r.name),
            CosiStep::CreateBucket(b) => format!(
                "create_bucket {} for existing {}",
                b.name, b.existing_bucket_id
            ),
            CosiStep::CreateBackendBucket(b) => format!("create_backend_bucket {}", b.describe()),
            CosiStep::CreateBackendPolicy(p) => format!(
                "create_backend_policy {} (read-write on {})",
                p.name,
                p.bucket.describe()
            ),
            CosiStep::CreateBackendUser(u) => format!(
                "create_backend_user {} (policies {})",
                u.access_key,
                u.policies.join(",")
            ),
        }
    }

    /// Whether the step may be one actor of a `concurrent:` block.
    pub fn concurrent_ok(&self) -> bool {
        matches!(
            self,
            CosiStep::CreateBucketClaim(_)
                | CosiStep::GrantAccess(_)
                | CosiStep::RevokeAccess(_)
                | CosiStep::DeleteBucketClaim(_)
        )
    }
}

/// Each COSI step checked against the scenario so far (classes, claims, accesses).
impl Validator<'_> {
    /// `create_bucket_claim`: its class is defined, a bound Bucket was made earlier, the name is new and DNS-safe.
    pub(crate) fn create_bucket_claim(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        c: ClaimStep,
    ) -> Result<CosiStep, ScenarioError> {
        if !ctx.bucket_classes.contains(&c.class) {
            return Err(self.err(
                here,
                format!(
                    "claim `{}` uses bucket class `{}`, which is not defined",
                    c.name, c.class
                ),
                Some("add it under `bucket_classes:`"),
            ));
        }
        if let Some(b) = &c.existing_bucket {
            if !ctx.static_buckets.contains(b) {
                return Err(self.err(here, format!("claim `{}` binds Bucket `{b}`, which no earlier `create_bucket` step makes", c.name), None));
            }
        }
        if !ctx.claims.insert((c.namespace.clone(), c.name.clone())) {
            return Err(self.err(
                here,
                format!("claim `{}/{}` is created twice", c.namespace, c.name),
                None,
            ));
        }
        check_dns(self, here, &c.name)?;
        Ok(CosiStep::CreateBucketClaim(c))
    }

    /// `grant_access`: its class is defined, its claim exists, the name is new and DNS-safe.
    pub(crate) fn grant_access(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        a: AccessStep,
    ) -> Result<CosiStep, ScenarioError> {
        if !ctx.access_classes.contains(&a.class) {
            return Err(self.err(
                here,
                format!(
                    "access `{}` uses bucket access class `{}`, which is not defined",
                    a.name, a.class
                ),
                Some("add it under `bucket_access_classes:`"),
            ));
        }
        if !ctx.claims.contains(&(a.namespace.clone(), a.claim.clone())) {
            return Err(self.err(
                here,
                format!(
                    "access `{}` is for claim `{}/{}`, which no earlier step creates",
                    a.name, a.namespace, a.claim
                ),
                Some("create the claim first with `create_bucket_claim`"),
            ));
        }
        if !ctx.accesses.insert((a.namespace.clone(), a.name.clone())) {
            return Err(self.err(
                here,
                format!("access `{}/{}` is granted twice", a.namespace, a.name),
                None,
            ));
        }
        check_dns(self, here, &a.name)?;
        Ok(CosiStep::GrantAccess(a))
    }

    /// `revoke_access`: an earlier step granted it.
    pub(crate) fn revoke_access(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        o: ObjectRef,
    ) -> Result<CosiStep, ScenarioError> {
        if !ctx
            .accesses
            .contains(&(o.namespace.clone(), o.name.clone()))
        {
            return Err(self.err(
                here,
                format!(
                    "access `{}/{}` is not granted by an earlier step",
                    o.namespace, o.name
                ),
                None,
            ));
        }
        Ok(CosiStep::RevokeAccess(o))
    }

    /// `delete_bucket_claim`: an earlier step created it.
    pub(crate) fn delete_bucket_claim(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        o: ObjectRef,
    ) -> Result<CosiStep, ScenarioError> {
        if !ctx.claims.contains(&(o.namespace.clone(), o.name.clone())) {
            return Err(self.err(
                here,
                format!(
                    "claim `{}/{}` is not created by an earlier step",
                    o.namespace, o.name
                ),
                None,
            ));
        }
        Ok(CosiStep::DeleteBucketClaim(o))
    }

    /// `retry`: the request it repeats was made by an earlier step, with parameters that fit its operation.
    pub(crate) fn retry(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        r: RetryStep,
    ) -> Result<CosiStep, ScenarioError> {
        let known = match r.op {
            RetryOp::CreateBucketClaim | RetryOp::DeleteBucketClaim => {
                ctx.claims.contains(&(r.namespace.clone(), r.name.clone()))
            }
            RetryOp::GrantAccess | RetryOp::RevokeAccess => ctx
                .accesses
                .contains(&(r.namespace.clone(), r.name.clone())),
        };
        if !known {
            return Err(self.err(
                here,
                format!(
                    "retry of {} `{}/{}`: no earlier step made that request",
                    r.op.keyword(),
                    r.namespace,
                    r.name
                ),
                Some("a retry re-sends a request an earlier step made; put it after that step"),
            ));
        }
        if r.parameters.is_some()
            && !matches!(r.op, RetryOp::CreateBucketClaim | RetryOp::GrantAccess)
        {
            return Err(self.err(
                here,
                "`parameters` only applies to create_bucket_claim and grant_access retries",
                None,
            ));
        }
        if r.authentication_type.is_some() && r.op != RetryOp::GrantAccess {
            return Err(self.err(
                here,
                "`authentication_type` only applies to grant_access retries",
                None,
            ));
        }
        Ok(CosiStep::Retry(r))
    }

    /// `create_bucket`: a static Bucket with a new name for an existing backend bucket.
    pub(crate) fn create_bucket(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        b: StaticBucketStep,
    ) -> Result<CosiStep, ScenarioError> {
        if !ctx.bucket_classes.contains(&b.class) {
            return Err(self.err(
                here,
                format!(
                    "bucket `{}` uses bucket class `{}`, which is not defined",
                    b.name, b.class
                ),
                None,
            ));
        }
        if !ctx.static_buckets.insert(b.name.clone()) {
            return Err(self.err(here, format!("bucket `{}` is created twice", b.name), None));
        }
        Ok(CosiStep::CreateBucket(b))
    }

    /// The name of a planted object: absolute, or built on an earlier claim's bucket name.
    fn backend_name(
        &self,
        ctx: &Ctx,
        here: &Spanned<()>,
        (name, of_claim, namespace): (Option<String>, Option<String>, Option<String>),
        (prefix, suffix): (String, String),
        keys: (&str, &str),
    ) -> Result<BackendName, ScenarioError> {
        let (name_key, claim_key) = keys;
        match (name, of_claim) {
            (Some(n), None) if prefix.is_empty() && suffix.is_empty() && namespace.is_none() => {
                Ok(BackendName::Absolute(n))
            }
            (Some(_), None) => Err(self.err(
                here,
                format!("`namespace`, `prefix` and `suffix` go with `{claim_key}`, not with `{name_key}`"),
                None,
            )),
            (None, Some(claim)) => {
                let namespace = namespace.unwrap_or_else(default_namespace);
                if !ctx.claims.contains(&(namespace.clone(), claim.clone())) {
                    return Err(self.err(
                        here,
                        format!("`{claim_key}: {claim}`: no earlier step creates claim `{namespace}/{claim}`"),
                        Some("the name builds on a claim's bucket name; put it after the claim's steps"),
                    ));
                }
                let ok = |s: &str| s.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.');
                if !ok(&prefix) || !ok(&suffix) {
                    return Err(self.err(here, "`prefix` and `suffix` may hold only lowercase letters, digits, '-' and '.'", None));
                }
                Ok(BackendName::OfClaim {
                    claim: ObjectRef { name: claim, namespace },
                    prefix,
                    suffix,
                })
            }
            _ => Err(self.err(
                here,
                format!("give exactly one of `{name_key}` and `{claim_key}`"),
                None,
            )),
        }
    }

    /// `create_backend_policy`: a policy name and the one bucket it allows (absolute or a claim's).
    pub(crate) fn create_backend_policy(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        p: RawBackendPolicy,
    ) -> Result<CosiStep, ScenarioError> {
        let policy_ok = !p.name.is_empty()
            && p.name.len() <= 128
            && p.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.=,@+".contains(c));
        if !policy_ok {
            return Err(self.err(
                here,
                format!("`{}` is not a canned policy name", p.name),
                Some("letters, digits and -_.=,@+; at most 128 bytes"),
            ));
        }
        let bucket = self.backend_name(
            ctx,
            here,
            (p.bucket, p.bucket_of_claim, p.namespace),
            (p.prefix, p.suffix),
            ("bucket", "bucket_of_claim"),
        )?;
        Ok(CosiStep::CreateBackendPolicy(BackendPolicyStep {
            name: p.name,
            bucket,
        }))
    }

    /// `create_backend_user`: an access key the backend accepts.
    pub(crate) fn create_backend_user(
        &self,
        _ctx: &mut Ctx,
        here: &Spanned<()>,
        u: BackendUserStep,
    ) -> Result<CosiStep, ScenarioError> {
        if cosi_s3::config::validate_access_key("access_key", &u.access_key).is_err() {
            return Err(self.err(
                here,
                format!("`{}` is not a usable access key", u.access_key),
                Some("3-20 characters from A-Z a-z 0-9 - _ ."),
            ));
        }
        Ok(CosiStep::CreateBackendUser(u))
    }

    /// `create_backend_bucket`: exactly one of a valid bucket name or an earlier claim whose bucket name it takes.
    pub(crate) fn create_backend_bucket(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        b: RawBackendBucket,
    ) -> Result<CosiStep, ScenarioError> {
        if !b.objects.is_empty() || !b.prefix.is_empty() || !b.suffix.is_empty() {
            if let Some(n) = &b.name {
                if cosi_s3::config::validate_bucket_name("name", n).is_err() {
                    return Err(self.err(
                        here,
                        format!("`{n}` is not a valid S3 bucket name"),
                        None,
                    ));
                }
            }
            if b.objects.iter().any(|k| k.is_empty() || k.len() > 1024) {
                return Err(self.err(here, "object keys are 1-1024 bytes", None));
            }
            let name = self.backend_name(
                ctx,
                here,
                (b.name, b.name_of_claim, b.namespace),
                (b.prefix, b.suffix),
                ("name", "name_of_claim"),
            )?;
            return Ok(CosiStep::CreateBackendBucket(BackendBucketStep::Planted(
                PlantedBucket {
                    name,
                    objects: b.objects,
                },
            )));
        }
        Ok(match (b.name, b.name_of_claim) {
            (Some(name), None) => {
                if b.namespace.is_some() {
                    return Err(self.err(
                        here,
                        "`namespace` goes with `name_of_claim`, not with `name`",
                        None,
                    ));
                }
                if cosi_s3::config::validate_bucket_name("name", &name).is_err() {
                    return Err(self.err(
                        here,
                        format!("`{name}` is not a valid S3 bucket name"),
                        Some("3-63 lowercase letters, digits, '-' and '.'"),
                    ));
                }
                CosiStep::CreateBackendBucket(BackendBucketStep::Named(name))
            }
            (None, Some(claim)) => {
                let namespace = b.namespace.unwrap_or_else(default_namespace);
                if !ctx.claims.contains(&(namespace.clone(), claim.clone())) {
                    return Err(self.err(
                    here,
                    format!("`name_of_claim: {claim}`: no earlier step creates claim `{namespace}/{claim}`"),
                    Some("the bucket takes the name of a claim's bucket; put it after the claim's steps"),
                ));
                }
                CosiStep::CreateBackendBucket(BackendBucketStep::NameOfClaim(ObjectRef {
                    name: claim,
                    namespace,
                }))
            }
            _ => {
                return Err(self.err(
                    here,
                    "`create_backend_bucket` takes exactly one of `name` and `name_of_claim`",
                    Some("{ name: finance-archive } or { name_of_claim: scratch }"),
                ))
            }
        })
    }
}

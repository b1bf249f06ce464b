//! The lifecycle invariants: what is left behind (no-orphans), what is taken
//! away (owner-only-delete), whether it settles (converges), whether the spec's
//! codes are kept (spec-codes), and whether secrets are really secret
//! (unpredictable-secrets).

use std::collections::HashSet;

use sha2::{Digest, Sha256};

use drivelab_fakes::cosi_sidecar::{
    requeues, AnsweredBy, DriverOp, DriverReply, DriverRequest, Exchange, Target,
};
use drivelab_proto::cosi::AuthenticationType;

use drivelab_fakes::history::CallId;
use serde::{Deserialize, Serialize};

use super::{Observations, Verdict};
use crate::scenario::Invariant;

fn recorded(obs: &Observations, id: &str) -> bool {
    !id.is_empty() && obs.checkpoint_text.contains(id)
}

/// Every backend user, driver policy and bucket is owned by a live object or a checkpoint;
/// every ready claim's bucket exists.
pub fn no_orphans(obs: &Observations) -> Verdict {
    let mut v = Verdict::new(Invariant::NoOrphans);
    let b = &obs.backend;
    // Sets, not a scan per entry: with 10⁵ grants, users × live accesses and
    // policies × users were 10¹⁰ comparisons each.
    let live_keys: HashSet<&str> = obs
        .live
        .iter()
        .flat_map(|a| {
            std::iter::once(a.account_id.as_str())
                .chain(a.credentials.as_ref().map(|c| c.0.as_str()))
        })
        .collect();
    let attached: HashSet<&str> = b
        .users
        .values()
        .flat_map(|u| u.policies.iter().map(String::as_str))
        .collect();
    let bound: HashSet<&str> = obs
        .bucket_objects
        .iter()
        .map(|(_, id)| id.as_str())
        .collect();
    for key in b
        .users
        .keys()
        .filter(|k| !obs.planted.users.contains_key(*k))
    {
        let live = live_keys.contains(key.as_str());
        if !live && !recorded(obs, key) {
            let calls = obs
                .exchanges
                .iter()
                .filter(|e| matches!(&e.reply, DriverReply::Granted { account_id, credentials, .. } if account_id == key || credentials.as_ref().is_some_and(|c| c.access_key_id == *key)))
                .map(|e| e.call);
            v.fail(
                format!("backend user {key} belongs to no live BucketAccess and no checkpoint"),
                calls,
            );
        }
    }
    for (name, _) in b
        .driver_policies()
        .filter(|(n, _)| !obs.planted.policies.contains_key(*n))
    {
        if !attached.contains(name.as_str()) && !recorded(obs, name) {
            v.fail(
                format!("policy {name} is attached to no user and recorded in no checkpoint"),
                [],
            );
        }
    }
    for name in b
        .buckets
        .keys()
        .filter(|n| !obs.lab_buckets.contains(n) && !obs.said_taken.contains(*n))
    {
        if !bound.contains(name.as_str()) && !recorded(obs, name) {
            let calls = obs
                .exchanges
                .iter()
                .filter(|e| e.request.op() == DriverOp::CreateBucket && e.request.key() == name)
                .map(|e| e.call);
            v.fail(
                format!("backend bucket {name} belongs to no Bucket object and no checkpoint"),
                calls,
            );
        }
    }
    for (claim, id) in &obs.ready_claims {
        if !id.is_empty() && !b.buckets.contains_key(id) {
            let calls = obs
                .exchanges
                .iter()
                .filter(|e| e.request.op() == DriverOp::CreateBucket)
                .map(|e| e.call);
            v.fail(
                format!("claim {claim} is ready but its bucket {id} does not exist in the backend"),
                calls,
            );
        }
    }
    let judged = b.users.len() + b.driver_policies().count() + b.buckets.len();
    v.finish(
        judged,
        format!(
            "{} users, {} policies, {} buckets: each owned by a live object or a checkpoint",
            b.users.len(),
            b.driver_policies().count(),
            b.buckets.len()
        ),
    )
}

/// Nothing the driver did not make (or was not asked to remove) disappears.
pub fn owner_only_delete(obs: &Observations) -> Verdict {
    let mut v = Verdict::new(Invariant::OwnerOnlyDelete);
    let created: Vec<&str> = obs
        .exchanges
        .iter()
        .filter_map(|e| match &e.reply {
            DriverReply::Created { bucket_id } => Some(bucket_id.as_str()),
            _ => None,
        })
        .collect();
    let delete_calls = |id: &str| -> Vec<_> {
        obs.exchanges
            .iter()
            .filter(|e| e.request.op() == DriverOp::DeleteBucket && e.request.key() == id)
            .map(|e| e.call)
            .collect()
    };
    for lab in &obs.lab_buckets {
        if !obs.backend.buckets.contains_key(lab) {
            v.fail(
                format!("bucket {lab}, which the driver never created, was deleted"),
                delete_calls(lab),
            );
        }
    }
    for gone in obs
        .seen_buckets
        .iter()
        .filter(|b| !obs.backend.buckets.contains_key(*b) && !obs.lab_buckets.contains(b))
    {
        let asked = !delete_calls(gone).is_empty();
        let ours = created.contains(&gone.as_str());
        if !(asked && ours) {
            v.fail(
                format!("bucket {gone} disappeared without a DriverDeleteBucket for a bucket the driver created (asked: {asked}, created by the driver: {ours})"),
                delete_calls(gone),
            );
        }
    }
    planted_intact(obs, &mut v);
    // A user may only go when its own account was revoked.
    let revoked: Vec<&str> = obs
        .exchanges
        .iter()
        .filter(|e| e.request.op() == DriverOp::RevokeBucketAccess)
        .map(|e| e.request.key())
        .collect();
    for gone in obs
        .seen_users
        .iter()
        .filter(|u| !obs.backend.users.contains_key(*u))
    {
        let accounts: Vec<&str> = obs
            .exchanges
            .iter()
            .filter_map(|e| match &e.reply {
                DriverReply::Granted {
                    account_id,
                    credentials: Some(c),
                    ..
                } if c.access_key_id == *gone => Some(account_id.as_str()),
                _ => None,
            })
            .collect();
        let asked =
            revoked.contains(&gone.as_str()) || accounts.iter().any(|a| revoked.contains(a));
        if !asked {
            v.fail(
                format!("user {gone} disappeared, but no revoke named its account"),
                [],
            );
        }
    }
    // Judged: the lab's own buckets that must survive, and every removal.
    let removals = obs
        .exchanges
        .iter()
        .filter(|e| {
            matches!(
                e.request.op(),
                drivelab_fakes::cosi_sidecar::DriverOp::DeleteBucket
                    | drivelab_fakes::cosi_sidecar::DriverOp::RevokeBucketAccess
            )
        })
        .count();
    let p = &obs.planted;
    let judged = obs.lab_buckets.len() + p.policies.len() + p.users.len() + removals;
    v.finish(
        judged,
        format!(
            "{} lab-owned buckets, {} planted policies and {} planted users intact; every removal was of the driver's own, on request",
            obs.lab_buckets.len(),
            p.policies.len(),
            p.users.len()
        ),
    )
}

/// Everything the lab planted is still there, unchanged: each bucket with
/// every object put in it, each policy with the very document it had, each
/// user with its secret, status and policies.
fn planted_intact(obs: &Observations, v: &mut Verdict) {
    let b = &obs.backend;
    for (bucket, keys) in &obs.planted.buckets {
        let Some(now) = b.buckets.get(bucket) else {
            continue; // reported as a lab bucket that disappeared
        };
        let lost: Vec<&str> = keys
            .iter()
            .filter(|k| !now.contains(k))
            .map(String::as_str)
            .collect();
        if !lost.is_empty() {
            v.fail(
                format!(
                    "bucket {bucket}, which the driver never created, lost objects {}",
                    lost.join(", ")
                ),
                [],
            );
        }
    }
    for (name, doc) in &obs.planted.policies {
        match b.policies.get(name) {
            None => v.fail(
                format!("policy {name}, managed outside the driver, was deleted"),
                [],
            ),
            Some(d) if d != doc => v.fail(
                format!("policy {name}, managed outside the driver, had its document rewritten"),
                [],
            ),
            _ => {}
        }
    }
    for (key, user) in &obs.planted.users {
        match b.users.get(key) {
            None => v.fail(
                format!("user {key}, managed outside the driver, was deleted"),
                [],
            ),
            Some(u) => {
                let mut changed = Vec::new();
                if u.secret != user.secret {
                    changed.push("secret".to_string());
                }
                if u.status != user.status {
                    changed.push(format!("status {} -> {}", user.status, u.status));
                }
                if u.policies != user.policies {
                    changed.push(format!("policies {:?} -> {:?}", user.policies, u.policies));
                }
                if !changed.is_empty() {
                    v.fail(
                        format!(
                            "user {key}, managed outside the driver, changed: {}",
                            changed.join(", ")
                        ),
                        [],
                    );
                }
            }
        }
    }
}

/// After faults heal, the sidecar is retrying nothing. Its rule is
/// [`requeues`] (the v0.2.x sidecar retries every driver error for ever), so an
/// object still queued is not converged whatever the code — unless the
/// scenario made its request invalid on purpose and the driver refuses it
/// with the code it must (see [`intended_refusal`]), or the lab itself said
/// its bucket name was taken.
pub fn converges(obs: &Observations) -> Verdict {
    let mut v = Verdict::new(Invariant::Converges);
    // A claim refused because the lab said its name was taken (see
    // `Observations::said_taken`), and the accesses waiting on it, are stuck
    // by the lab's word, not the driver's fault. (Only a claim's key can be
    // in `said_taken`: an access's is its account name, never a bucket's.)
    let lab_refused: Vec<String> = obs
        .stuck
        .iter()
        .filter(|s| {
            s.last_code.as_deref() == Some("ALREADY_EXISTS")
                && s.last_key
                    .as_ref()
                    .is_some_and(|k| obs.said_taken.contains(k))
        })
        .filter_map(|s| s.claim.clone())
        .collect();
    // Claims refused on purpose hold up the accesses waiting on them too.
    let claims_on_purpose: Vec<String> = obs
        .rejected_on_purpose
        .iter()
        .filter_map(|r| match &r.target {
            Target::Claim { namespace, name } => Some(format!("{namespace}/{name}")),
            Target::Access { .. } => None,
        })
        .collect();
    let (mut on_purpose, mut refused) = (0, 0);
    for s in &obs.stuck {
        let last = s
            .calls
            .last()
            .and_then(|c| obs.exchanges.iter().find(|e| e.call == *c));
        let code = s.last_code.as_deref().unwrap_or("no driver call");
        let rpc = s.last_op.as_deref().unwrap_or("-");
        let evidence = s.calls.iter().rev().take(3).copied();
        if let Some((why, want)) = intended_refusal(obs, &s.target, last) {
            if code == want {
                on_purpose += 1;
            } else {
                v.fail(
                    format!(
                        "{} is refused on purpose ({why}) and must end {want}, but its last {rpc} answered {code} and the sidecar still retries it",
                        s.target
                    ),
                    evidence,
                );
            }
            continue;
        }
        let waits_on = |claims: &[String]| s.claim.as_ref().is_some_and(|c| claims.contains(c));
        if waits_on(&lab_refused) {
            refused += 1;
            continue;
        }
        if last.is_none() && waits_on(&claims_on_purpose) {
            on_purpose += 1;
            continue;
        }
        let rule = match last {
            Some(e) if requeues(e.request.op(), e.reply.code()) => format!(
                "the v0.2.x sidecar requeues {rpc} on {code} for ever, and the scenario did not make this request invalid on purpose (`rejected_on_purpose:`)"
            ),
            Some(_) => "the sidecar still has it queued after that answer".to_string(),
            None => "the sidecar never got as far as a driver call".to_string(),
        };
        v.fail(
            format!(
                "{} never converged after faults healed: {} attempts, last {rpc} answered {code}; {rule}",
                s.target, s.attempts,
            ),
            evidence,
        );
    }
    let refused = if refused > 0 {
        format!("; {refused} held up by a bucket name the lab said was taken")
    } else {
        String::new()
    };
    let on_purpose = match on_purpose {
        0 => String::new(),
        n => format!(" but {n} made invalid on purpose by the scenario, refused as intended"),
    };
    v.finish(
        obs.exchanges.len(),
        format!("nothing left for the sidecar to retry{on_purpose}{refused}"),
    )
}

/// Why `target`'s request is invalid on purpose, and the code the driver must
/// keep refusing it with: the scenario lists it in `rejected_on_purpose:`, or
/// it is a grant whose class has an unknown authentication type (the spec's
/// INVALID_ARGUMENT). None for a well-formed request.
fn intended_refusal(
    obs: &Observations,
    target: &str,
    last: Option<&Exchange>,
) -> Option<(String, String)> {
    if let Some(r) = obs
        .rejected_on_purpose
        .iter()
        .find(|r| r.target.to_string() == target)
    {
        return Some(("listed in rejected_on_purpose".into(), r.code.name()));
    }
    match last.map(|e| &e.request) {
        Some(DriverRequest::Grant { auth, .. })
            if *auth == AuthenticationType::UnknownAuthenticationType as i32 =>
        {
            Some((
                "its BucketAccessClass has an unknown authentication type".into(),
                "INVALID_ARGUMENT".into(),
            ))
        }
        _ => None,
    }
}

/// The spec's codes where the spec names one. Only the driver's own answers
/// count: an error the lab injected in its place, or a call the lab cut or
/// crashed the driver under, has no code of the driver's to judge.
pub fn spec_codes(obs: &Observations) -> Verdict {
    let mut v = Verdict::new(Invariant::SpecCodes);
    let mut n = 0;
    for e in obs
        .exchanges
        .iter()
        .filter(|e| e.answered_by == AnsweredBy::Driver)
    {
        if let DriverRequest::Grant { auth, name, .. } = &e.request {
            if *auth == AuthenticationType::UnknownAuthenticationType as i32 {
                n += 1;
                let code = e.reply.code_name();
                if code != "INVALID_ARGUMENT" {
                    v.fail(format!("grant {name} with UnknownAuthenticationType answered {code}, spec wants INVALID_ARGUMENT"), [e.call]);
                }
            }
        }
    }
    for r in obs
        .retries
        .iter()
        .filter(|r| r.retried.answered_by == AnsweredBy::Driver)
    {
        n += 1;
        if r.error_excused(&obs.lab_buckets).is_some() {
            continue;
        }
        let code = r.retried.reply.code_name();
        let op = r.retried.request.op();
        // An unknown auth type makes the request invalid before it can conflict.
        let invalid = matches!(&r.retried.request, DriverRequest::Grant { auth, .. } if *auth == AuthenticationType::UnknownAuthenticationType as i32);
        if r.changed_request
            && !invalid
            && matches!(op, DriverOp::CreateBucket | DriverOp::GrantBucketAccess)
            && code != "ALREADY_EXISTS"
        {
            v.fail(
                format!(
                    "{} {} with incompatible parameters answered {code}, spec wants ALREADY_EXISTS",
                    op.rpc(),
                    r.retried.request.key()
                ),
                [r.original.call, r.retried.call],
            );
        }
        if !r.changed_request
            && matches!(op, DriverOp::DeleteBucket | DriverOp::RevokeBucketAccess)
            && r.original.reply.code_name() == "OK"
            && code != "OK"
        {
            v.fail(
                format!(
                    "{} {} again (already gone) answered {code}, spec wants OK",
                    op.rpc(),
                    r.retried.request.key()
                ),
                [r.retried.call],
            );
        }
    }
    v.finish(
        n,
        format!("{n} requests with a code the spec prescribes all answered it"),
    )
}

/// What the lab saw of one handed-out secret while it still had the value:
/// the facts unpredictable-secrets judges (a record keeps no secret values).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretShape {
    /// The grant reply that handed it out.
    pub call: CallId,
    /// The grant's account name.
    pub grant: String,
    /// Its length in characters.
    pub chars: usize,
    /// Hex digits only.
    pub hex: bool,
    /// The name, account id or access key it is a SHA-256 of, if any.
    pub derived_from: Option<String>,
}

/// The shape of every secret a grant reply handed out.
pub fn secret_shapes(exchanges: &[Exchange]) -> Vec<SecretShape> {
    exchanges
        .iter()
        .filter_map(|e| match (&e.request, &e.reply) {
            (
                DriverRequest::Grant { name, .. },
                DriverReply::Granted {
                    account_id,
                    credentials: Some(c),
                    ..
                },
            ) => {
                let secret = c.secret.expose();
                let derived_from = [name.as_str(), account_id.as_str(), c.access_key_id.as_str()]
                    .into_iter()
                    .find(|input| derived_from(secret, input))
                    .map(str::to_string);
                Some(SecretShape {
                    call: e.call,
                    grant: name.clone(),
                    chars: secret.chars().count(),
                    hex: secret.bytes().all(|b| b.is_ascii_hexdigit()),
                    derived_from,
                })
            }
            _ => None,
        })
        .collect()
}

/// Secrets are not derivable: long enough, not a hash of the names, different in a twin lab.
pub fn unpredictable_secrets(obs: &Observations) -> Verdict {
    let mut v = Verdict::new(Invariant::UnpredictableSecrets);
    for s in &obs.secret_shapes {
        let name = &s.grant;
        // 128 bits: at least 22 base62 characters or 32 hex digits.
        if (s.hex && s.chars < 32) || s.chars < 22 {
            v.fail(
                format!(
                    "grant {name}: the secret is {} characters, under 128 bits",
                    s.chars
                ),
                [s.call],
            );
        }
        if let Some(input) = &s.derived_from {
            v.fail(format!("grant {name}: the secret is a SHA-256 of {input:?} (computable by anyone who knows it)"), [s.call]);
        }
    }
    if let Some(twin) = &obs.twin_secrets {
        for e in &obs.exchanges {
            let (
                DriverRequest::Grant { name, .. },
                DriverReply::Granted {
                    credentials: Some(c),
                    ..
                },
            ) = (&e.request, &e.reply)
            else {
                continue;
            };
            if twin.get(name).is_some_and(|t| t == &c.secret) {
                v.fail(format!("grant {name}: a twin lab with the same names (and the same frozen wall clock) got the same secret — it is a function of the names or the time"), [e.call]);
            }
        }
    }
    let n = obs.secret_shapes.len();
    let twin = if obs.twin_secrets.is_some() {
        ", compared with a twin lab"
    } else {
        ""
    };
    v.finish(
        n,
        format!("{n} secrets handed out, none short, derived or repeated{twin}"),
    )
}

/// Is `secret` (a prefix of) the hex SHA-256 of `input`, alone or behind a common prefix?
fn derived_from(secret: &str, input: &str) -> bool {
    if input.is_empty() || secret.len() < 8 {
        return false;
    }
    let lower = secret.to_ascii_lowercase();
    ["", "cosi:", "cosi-s3:", "cosi-s3.drivelab.dev:"]
        .iter()
        .any(|p| {
            let digest = hex::encode(Sha256::digest(format!("{p}{input}").as_bytes()));
            digest.starts_with(&lower)
        })
}

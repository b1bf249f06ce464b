//! Each check on a good observation passes and on a deliberately broken one fails.

use super::*;
use drivelab_fakes::cosi_sidecar::{AnsweredBy, S3Credentials};
use drivelab_proto::cosi::AuthenticationType;

fn creds(key: &str, secret: &str) -> S3Credentials {
    S3Credentials {
        access_key_id: key.into(),
        secret: Secret::new(secret),
        endpoint: "http://e".into(),
        region: "us-east-1".into(),
    }
}

fn grant(call: u64, name: &str, account: &str, key: &str, secret: &str) -> Exchange {
    Exchange {
        call: CallId(call),
        request: DriverRequest::Grant {
            bucket_id: "b1".into(),
            name: name.into(),
            auth: 1,
            parameters: Default::default(),
        },
        reply: DriverReply::Granted {
            account_id: account.into(),
            credentials: Some(creds(key, secret)),
            credential_entries: 1,
        },
        replay: call > 1,
        answered_by: AnsweredBy::Driver,
    }
}

fn user(secret: &str, policies: &[&str]) -> UserState {
    UserState {
        secret: Secret::new(secret),
        status: "enabled".into(),
        policies: policies.iter().map(|s| s.to_string()).collect(),
    }
}

fn backend() -> BackendState {
    let mut b = BackendState::default();
    b.users
        .insert("KEY1".into(), user("secret-one-aaaaaaaa", &["p1"]));
    b.policies.insert(
        "p1".into(),
        serde_json::json!({"Statement": [{"Effect": "Allow", "Resource": "arn:aws:s3:::b1/*"}]})
            .into(),
    );
    b.buckets.insert("b1".into(), vec![]);
    b
}

fn live(name: &str, account: &str, key: &str, secret: &str) -> LiveAccess {
    let b = backend();
    LiveAccess {
        name: name.into(),
        account_name: format!("ba-{name}"),
        account_id: account.into(),
        bucket_id: "b1".into(),
        credentials: Some((key.into(), Secret::new(secret))),
        policies_at_grant: b.policies.clone(),
        mode: GrantedMode::ReadWrite,
    }
}

fn probe(access: &str, bucket: &str, granted: bool, status: u16, code: Option<&str>) -> Probe {
    Probe {
        access: access.into(),
        access_key: "KEY1".into(),
        bucket: bucket.into(),
        granted_bucket: granted,
        op: ProbeOp::Write,
        allowed: granted,
        purpose: ProbePurpose::Current,
        status,
        code: code.map(Into::into),
        call: Some(CallId(9)),
    }
}

fn good() -> Observations {
    Observations {
        exchanges: vec![
            grant(1, "ba-a", "KEY1", "KEY1", "secret-one-aaaaaaaa"),
            grant(2, "ba-a", "KEY1", "KEY1", "secret-one-aaaaaaaa"),
        ],
        retries: vec![RetryObservation {
            step: 2,
            original: grant(1, "ba-a", "KEY1", "KEY1", "secret-one-aaaaaaaa"),
            retried: grant(2, "ba-a", "KEY1", "KEY1", "secret-one-aaaaaaaa"),
            before: backend(),
            after: backend(),
            changed_request: false,
            backend_faulted: false,
        }],
        live: vec![live("default/a", "KEY1", "KEY1", "secret-one-aaaaaaaa")],
        backend: backend(),
        probes: vec![
            probe("default/a", "b1", true, 200, None),
            probe("default/a", "canary", false, 403, Some("AccessDenied")),
        ],
        leak_scan: LeakScan::run(&[Secret::new("secret-one-aaaaaaaa")], &artifacts()),
        lab_buckets: vec!["canary".into()],
        said_taken: Default::default(),
        bucket_objects: vec![("bucket-x".into(), "b1".into())],
        ready_claims: vec![("default/photos".into(), "b1".into())],
        ..Default::default()
    }
}

fn with_canary(mut obs: Observations) -> Observations {
    obs.backend.buckets.insert("canary".into(), vec![]);
    obs.seen_buckets = obs.backend.buckets.keys().cloned().collect();
    obs.seen_users = obs.backend.users.keys().cloned().collect();
    obs
}

#[test]
fn all_checks_pass_on_a_good_run() {
    let mut obs = with_canary(good());
    // 40 random-looking characters, as a real driver's secret.
    let strong = "Zq3v9TnKp0W7xYb2Lm5Rc8Hd1Fg4Js6Ua0Vk3Ne";
    for ex in &mut obs.exchanges {
        if let DriverReply::Granted {
            credentials: Some(c),
            ..
        } = &mut ex.reply
        {
            c.secret = Secret::new(strong);
        }
    }
    for r in &mut obs.retries {
        for ex in [&mut r.original, &mut r.retried] {
            if let DriverReply::Granted {
                credentials: Some(c),
                ..
            } = &mut ex.reply
            {
                c.secret = Secret::new(strong);
            }
        }
    }
    for inv in Invariant::cosi_defaults() {
        let v = check(*inv, &obs);
        assert!(v.passed, "{inv:?}: {:?}", v.details);
    }
}

#[test]
fn idempotent_replay_fails_on_rotation_and_on_backend_change() {
    let mut obs = good();
    obs.exchanges[1] = grant(2, "ba-a", "KEY1", "KEY1", "a-new-secret-bbbbbbb");
    let v = idempotent_replay(&obs);
    assert!(!v.passed);
    assert_eq!(v.evidence, vec![1, 2]);

    let mut obs = good();
    obs.retries[0]
        .after
        .users
        .insert("KEY1".into(), user("a-new-secret-bbbbbbb", &["p1"]));
    let v = idempotent_replay(&obs);
    assert!(!v.passed);
    assert!(v.details[0].contains("secret changed"), "{:?}", v.details);

    let mut obs = good();
    obs.retries[0].retried.reply = DriverReply::Failed {
        code: tonic::Code::AlreadyExists,
        message: "exists".into(),
    };
    assert!(
        !idempotent_replay(&obs).passed,
        "a retry answered AlreadyExists must fail"
    );
}

#[test]
fn idempotent_replay_accepts_already_exists_for_a_changed_request() {
    let mut obs = good();
    obs.retries[0].changed_request = true;
    obs.retries[0].retried.reply = DriverReply::Failed {
        code: tonic::Code::AlreadyExists,
        message: "exists".into(),
    };
    assert!(idempotent_replay(&obs).passed);
}

/// The retry failed UNAVAILABLE: from the driver itself that breaks idempotent
/// replay; when the lab crashed the driver under it, cut it, or answered in its
/// place, it is not an answered retry (explore's false positives of issue 6).
#[test]
fn idempotent_replay_judges_only_retries_the_driver_answered() {
    let unavailable = |by| {
        let mut obs = good();
        obs.retries[0].retried.reply = DriverReply::Failed {
            code: tonic::Code::Unavailable,
            message: "transport: connection to the driver lost".into(),
        };
        obs.retries[0].retried.answered_by = by;
        obs
    };
    assert!(!idempotent_replay(&unavailable(AnsweredBy::Driver)).passed);
    assert!(idempotent_replay(&unavailable(AnsweredBy::Lost)).passed);
    assert!(idempotent_replay(&unavailable(AnsweredBy::Injected)).passed);
    // A lost retry is skipped, not counted as compared.
    let v = idempotent_replay(&unavailable(AnsweredBy::Lost));
    assert!(v.details[0].starts_with("1 repeated"), "{:?}", v.details);
}

#[test]
fn unique_credentials_fails_on_a_shared_key() {
    let mut obs = good();
    obs.live
        .push(live("default/b", "KEY2", "KEY1", "secret-one-aaaaaaaa"));
    obs.exchanges.push(grant(
        3,
        "ba-default/b",
        "KEY2",
        "KEY1",
        "secret-one-aaaaaaaa",
    ));
    let v = unique_credentials(&obs);
    assert!(!v.passed);
    assert!(v.details[0].contains("KEY1"));
    // The evidence is the sharing accesses' grant calls, found by account name.
    assert_eq!(v.evidence, vec![3], "{:?}", v.details);
}

#[test]
fn least_privilege_fails_on_foreign_write_and_on_overwritten_policy() {
    let mut obs = good();
    obs.probes[1] = probe("default/a", "canary", false, 200, None);
    assert!(!least_privilege(&obs).passed);

    let mut obs = good();
    obs.probes[0] = probe("default/a", "b1", true, 403, Some("AccessDenied"));
    assert!(!least_privilege(&obs).passed);

    let mut obs = good();
    obs.backend.policies.insert(
        "p1".into(),
        serde_json::json!({"Statement": [{"Effect": "Allow", "Resource": "arn:aws:s3:::other/*"}]})
            .into(),
    );
    let v = least_privilege(&obs);
    assert!(!v.passed);
    assert!(v.details[0].contains("replaced"), "{:?}", v.details);
}

#[test]
fn no_rotation_fails_when_handed_out_credentials_stop_working() {
    let mut obs = good();
    obs.probes.push(Probe {
        purpose: ProbePurpose::HandedOut,
        ..probe("default/a", "b1", true, 403, Some("SignatureDoesNotMatch"))
    });
    let v = no_rotation(&obs);
    assert!(!v.passed);
    assert_eq!(v.evidence, vec![9]);

    let mut obs = good();
    obs.live[0].credentials = None;
    assert!(!no_rotation(&obs).passed);
}

fn artifacts() -> Vec<(String, String)> {
    vec![("snapshot".into(), "key <key-1> secret <secret-A>".into())]
}

#[test]
fn no_secret_leak_fails_when_a_secret_is_written() {
    let mut obs = good();
    let mut written = artifacts();
    written.push((
        "log".into(),
        "line one\nuser secret-one-aaaaaaaa created\n".into(),
    ));
    obs.leak_scan = LeakScan::run(&[Secret::new("secret-one-aaaaaaaa")], &written);
    let v = no_secret_leak(&obs);
    assert!(!v.passed);
    assert!(v.details[0].starts_with("log:2:"), "{:?}", v.details);
}

#[test]
fn no_orphans_fails_on_an_unowned_user_and_a_dangling_claim() {
    let mut obs = with_canary(good());
    obs.backend
        .users
        .insert("STRAY".into(), user("stray-secret-cccccccc", &[]));
    let v = lifecycle::no_orphans(&obs);
    assert!(!v.passed);
    assert!(
        v.details.iter().any(|d| d.contains("STRAY")),
        "{:?}",
        v.details
    );

    let mut obs = with_canary(good());
    obs.ready_claims = vec![("default/photos".into(), "gone-bucket".into())];
    assert!(!lifecycle::no_orphans(&obs).passed);

    let mut obs = with_canary(good());
    obs.backend
        .users
        .insert("STRAY".into(), user("stray-secret-cccccccc", &[]));
    obs.checkpoint_text = "accessKeyID=STRAY\nstate=PendingCreate".into();
    assert!(
        lifecycle::no_orphans(&obs).passed,
        "a user recorded in a checkpoint is owned"
    );
}

#[test]
fn owner_only_delete_fails_when_a_foreign_bucket_goes() {
    let mut obs = with_canary(good());
    obs.backend.buckets.remove("canary");
    let v = lifecycle::owner_only_delete(&obs);
    assert!(!v.passed);

    let mut obs = with_canary(good());
    obs.seen_buckets.insert("someone-elses".into());
    assert!(
        !lifecycle::owner_only_delete(&obs).passed,
        "a bucket nobody asked to delete vanished"
    );
}

fn revoke(call: u64, account: &str, code: tonic::Code) -> Exchange {
    Exchange {
        call: CallId(call),
        request: DriverRequest::Revoke {
            bucket_id: "b1".into(),
            account_id: account.into(),
        },
        reply: DriverReply::Failed {
            code,
            message: "missing parameter bucketPolicy".into(),
        },
        replay: false,
        answered_by: AnsweredBy::Driver,
    }
}

/// An access whose every (well-formed) revoke failed with `code`.
fn stuck_revoke(obs: &mut Observations, code: tonic::Code) {
    let calls = [4, 5, 6];
    for c in calls {
        obs.exchanges.push(revoke(c, "KEY1", code));
    }
    obs.stuck = vec![Stuck {
        target: "bucketaccess default/a".into(),
        last_op: Some("DriverRevokeBucketAccess".into()),
        last_code: Some(drivelab_fakes::cosi_sidecar::code_name(code)),
        attempts: calls.len(),
        calls: calls.iter().map(|c| CallId(*c)).collect(),
        last_key: Some("KEY1".into()),
        claim: Some("default/photos".into()),
    }];
}

#[test]
fn converges_fails_when_every_revoke_of_a_well_formed_request_is_invalid_argument() {
    // The v0.2 sidecar retries such a revoke for ever: nothing settled.
    for code in [
        tonic::Code::InvalidArgument,
        tonic::Code::FailedPrecondition,
        tonic::Code::Unimplemented,
        tonic::Code::AlreadyExists,
    ] {
        let mut obs = with_canary(good());
        stuck_revoke(&mut obs, code);
        let v = lifecycle::converges(&obs);
        assert!(!v.passed, "{code:?} passed: {:?}", v.details);
        let name = drivelab_fakes::cosi_sidecar::code_name(code);
        assert!(
            v.details[0].contains("bucketaccess default/a")
                && v.details[0].contains(&format!("DriverRevokeBucketAccess answered {name}"))
                && v.details[0].contains("requeues"),
            "{:?}",
            v.details
        );
        assert_eq!(v.evidence, vec![4, 5, 6]);
    }
}

#[test]
fn converges_lets_a_request_rejected_on_purpose_end_refused_with_its_code_only() {
    use crate::scenario::{GrpcCode, RejectedOnPurpose};
    use drivelab_fakes::cosi_sidecar::Target;
    let mut obs = with_canary(good());
    stuck_revoke(&mut obs, tonic::Code::InvalidArgument);
    obs.rejected_on_purpose = vec![RejectedOnPurpose {
        target: Target::Access {
            namespace: "default".into(),
            name: "a".into(),
        },
        code: GrpcCode::InvalidArgument,
    }];
    let v = lifecycle::converges(&obs);
    assert!(v.passed, "{:?}", v.details);
    assert!(
        v.details[0].contains("but 1 made invalid on purpose by the scenario"),
        "{:?}",
        v.details
    );
    // Marked, but ending on another code: the sidecar still retries it.
    obs.rejected_on_purpose[0].code = GrpcCode::FailedPrecondition;
    let v = lifecycle::converges(&obs);
    assert!(!v.passed);
    assert!(
        v.details[0].contains("must end FAILED_PRECONDITION"),
        "{:?}",
        v.details
    );
    // Another object's mark excuses nothing.
    obs.rejected_on_purpose[0].code = GrpcCode::InvalidArgument;
    obs.rejected_on_purpose[0].target = Target::Access {
        namespace: "default".into(),
        name: "b".into(),
    };
    assert!(!lifecycle::converges(&obs).passed);
}

#[test]
fn converges_lets_a_grant_with_an_unknown_auth_type_end_invalid_argument() {
    let mut obs = with_canary(good());
    let mut g = grant(7, "ba-a", "", "", "");
    g.replay = false;
    g.request = DriverRequest::Grant {
        bucket_id: "b1".into(),
        name: "ba-a".into(),
        auth: AuthenticationType::UnknownAuthenticationType as i32,
        parameters: Default::default(),
    };
    g.reply = DriverReply::Failed {
        code: tonic::Code::InvalidArgument,
        message: "unknown authentication type".into(),
    };
    obs.exchanges.push(g.clone());
    let stuck = |code: &str| Stuck {
        target: "bucketaccess default/a".into(),
        last_op: Some("DriverGrantBucketAccess".into()),
        last_code: Some(code.into()),
        attempts: 9,
        calls: vec![CallId(7)],
        last_key: Some("ba-a".into()),
        claim: Some("default/photos".into()),
    };
    obs.stuck = vec![stuck("INVALID_ARGUMENT")];
    let v = lifecycle::converges(&obs);
    assert!(v.passed, "{:?}", v.details);
    // The same stuck grant with a well-formed (Key) request is the driver's fault.
    if let DriverRequest::Grant { auth, .. } = &mut obs.exchanges.last_mut().unwrap().request {
        *auth = AuthenticationType::Key as i32;
    }
    assert!(!lifecycle::converges(&obs).passed);
    // An ALREADY_EXISTS that sticks is never an answer to an invalid request.
    obs.exchanges.pop();
    obs.exchanges.push(g);
    obs.stuck = vec![stuck("ALREADY_EXISTS")];
    let v = lifecycle::converges(&obs);
    assert!(!v.passed);
    assert_eq!(v.evidence, vec![7]);
}

#[test]
fn spec_codes_fails_when_unknown_auth_is_granted() {
    let mut obs = with_canary(good());
    if let DriverRequest::Grant { auth, .. } = &mut obs.exchanges[0].request {
        *auth = 0;
    }
    assert!(!lifecycle::spec_codes(&obs).passed);

    let mut obs = with_canary(good());
    obs.retries[0].changed_request = true;
    assert!(
        !lifecycle::spec_codes(&obs).passed,
        "incompatible parameters answered OK"
    );
}

/// spec-codes judges the driver's codes, not the lab's: an UNAVAILABLE the lab
/// injected for an UnknownAuthenticationType grant, or a delete retried while
/// the lab crashed the driver, is no answer; the same code from the driver fails.
#[test]
fn spec_codes_judges_only_what_the_driver_answered() {
    let unknown_auth_unavailable = |by| {
        let mut obs = with_canary(good());
        obs.retries.clear();
        if let DriverRequest::Grant { auth, .. } = &mut obs.exchanges[0].request {
            *auth = AuthenticationType::UnknownAuthenticationType as i32;
        }
        obs.exchanges[0].reply = DriverReply::Failed {
            code: tonic::Code::Unavailable,
            message: "injected by explore".into(),
        };
        obs.exchanges[0].answered_by = by;
        obs
    };
    assert!(!lifecycle::spec_codes(&unknown_auth_unavailable(AnsweredBy::Driver)).passed);
    assert!(lifecycle::spec_codes(&unknown_auth_unavailable(AnsweredBy::Injected)).passed);

    let delete_again = |by| {
        let mut obs = with_canary(good());
        let delete = |call| Exchange {
            call: CallId(call),
            request: DriverRequest::Delete {
                bucket_id: "b1".into(),
                context: Default::default(),
            },
            reply: DriverReply::Empty,
            replay: call > 10,
            answered_by: AnsweredBy::Driver,
        };
        let mut retried = delete(11);
        retried.reply = DriverReply::Failed {
            code: tonic::Code::Unavailable,
            message: "transport: connection to the driver lost".into(),
        };
        retried.answered_by = by;
        obs.retries[0].original = delete(10);
        obs.retries[0].retried = retried;
        obs
    };
    assert!(!lifecycle::spec_codes(&delete_again(AnsweredBy::Driver)).passed);
    assert!(lifecycle::spec_codes(&delete_again(AnsweredBy::Lost)).passed);
}

#[test]
fn unpredictable_secrets_fails_on_derived_short_or_twin_secrets() {
    use sha2::Digest;
    let derived = hex::encode(sha2::Sha256::digest(b"cosi-s3:ba-a"))[..40].to_string();
    let mut obs = with_canary(good());
    obs.exchanges.truncate(1);
    obs.exchanges[0] = grant(1, "ba-a", "KEY1", "KEY1", &derived);
    obs.secret_shapes = lifecycle::secret_shapes(&obs.exchanges);
    let v = lifecycle::unpredictable_secrets(&obs);
    assert!(!v.passed);
    assert!(
        v.details.iter().any(|d| d.contains("SHA-256")),
        "{:?}",
        v.details
    );

    let random = "Zq3v9TnKp0W7xYb2Lm5Rc8Hd1Fg4Js6Ua0Vk3Ne";
    obs.exchanges[0] = grant(1, "ba-a", "KEY1", "KEY1", random);
    obs.secret_shapes = lifecycle::secret_shapes(&obs.exchanges);
    assert!(lifecycle::unpredictable_secrets(&obs).passed);
    obs.twin_secrets = Some(
        [("ba-a".to_string(), Secret::new(random))]
            .into_iter()
            .collect(),
    );
    assert!(
        !lifecycle::unpredictable_secrets(&obs).passed,
        "same secret in the twin lab"
    );

    obs.twin_secrets = None;
    obs.exchanges[0] = grant(1, "ba-a", "KEY1", "KEY1", "short");
    obs.secret_shapes = lifecycle::secret_shapes(&obs.exchanges);
    assert!(!lifecycle::unpredictable_secrets(&obs).passed);
}

/// A run is judged from its record as written: secrets fingerprinted, read
/// back. Every check must judge that exactly as it judges the observations
/// themselves — on a passing run and on each way of breaking one.
#[test]
fn a_sealed_record_is_judged_as_the_observations_are() {
    use crate::scenario::Invariant;
    use crate::systems::{Observed, Record};
    let all: Vec<Invariant> = Invariant::all()
        .iter()
        .copied()
        .filter(|i| !matches!(check(*i, &Observations::default()).details.first(), Some(d) if d.contains("BOSH/CSI")))
        .collect();
    let mut broken = with_canary(good());
    broken
        .live
        .push(live("default/b", "KEY1", "KEY1", "secret-one-aaaaaaaa"));
    broken.twin_secrets = Some(
        [("ba-a".to_string(), Secret::new("secret-one-aaaaaaaa"))]
            .into_iter()
            .collect(),
    );
    broken.secret_shapes = lifecycle::secret_shapes(&broken.exchanges);
    for obs in [good(), with_canary(good()), broken] {
        let direct: Vec<Verdict> = all.iter().map(|i| check(*i, &obs)).collect();
        let record = Record {
            format: crate::systems::RECORD_FORMAT,
            invariants: all.clone(),
            require_exercised: vec![],
            observed: Observed::Cosi(Box::new(obs)),
        };
        let (text, sealed) = record.seal_and_judge(&Default::default()).unwrap();
        let text = text.text();
        assert_eq!(direct, sealed);
        assert!(!text.contains("secret-one-aaaaaaaa"), "{text}");
        assert!(text.contains("\"fp:"), "secrets are kept as fingerprints");
    }
}

fn delete(call: u64, reply: DriverReply) -> Exchange {
    Exchange {
        call: CallId(call),
        request: DriverRequest::Delete {
            bucket_id: "b1".into(),
            context: Default::default(),
        },
        reply,
        replay: call > 1,
        answered_by: AnsweredBy::Driver,
    }
}

/// A delete that succeeded, then the same delete again answered `code`.
fn redelete(code: tonic::Code) -> Observations {
    let mut obs = good();
    let failed = DriverReply::Failed {
        code,
        message: "no".into(),
    };
    obs.exchanges = vec![delete(1, DriverReply::Empty), delete(2, failed.clone())];
    let mut gone = backend();
    gone.buckets.clear();
    obs.retries = vec![RetryObservation {
        step: 2,
        original: delete(1, DriverReply::Empty),
        retried: delete(2, failed),
        before: gone.clone(),
        after: gone,
        changed_request: false,
        backend_faulted: false,
    }];
    obs
}

#[test]
fn a_repeated_delete_must_answer_ok_unless_the_lab_faulted_the_backend_under_it() {
    let obs = redelete(tonic::Code::Unavailable);
    assert!(!idempotent_replay(&obs).passed);
    assert!(!lifecycle::spec_codes(&obs).passed);

    let mut obs = redelete(tonic::Code::Unavailable);
    obs.retries[0].backend_faulted = true;
    assert!(idempotent_replay(&obs).passed);
    assert!(lifecycle::spec_codes(&obs).passed);

    // A backend fault excuses a transient code only, never a refusal.
    let mut obs = redelete(tonic::Code::FailedPrecondition);
    obs.retries[0].backend_faulted = true;
    assert!(!idempotent_replay(&obs).passed);
    assert!(!lifecycle::spec_codes(&obs).passed);
}

#[test]
fn a_repeated_delete_may_refuse_a_name_someone_else_took_meanwhile() {
    // Someone else's bucket now has the name: refusing is right.
    let mut obs = redelete(tonic::Code::FailedPrecondition);
    obs.retries[0].before.buckets.insert("b1".into(), vec![]);
    obs.lab_buckets = vec!["b1".into()];
    assert!(idempotent_replay(&obs).passed);
    assert!(lifecycle::spec_codes(&obs).passed);

    // The driver's own bucket is back (not someone else's): no excuse.
    let mut obs = redelete(tonic::Code::FailedPrecondition);
    obs.retries[0].before.buckets.insert("b1".into(), vec![]);
    assert!(!idempotent_replay(&obs).passed);
    assert!(!lifecycle::spec_codes(&obs).passed);
}

#[test]
fn no_orphans_excuses_only_a_bucket_the_lab_said_was_taken() {
    let mut obs = with_canary(good());
    obs.backend.buckets.insert("stray".into(), vec![]);
    let v = lifecycle::no_orphans(&obs);
    assert!(!v.passed);
    assert!(
        v.details.iter().any(|d| d.contains("stray")),
        "{:?}",
        v.details
    );

    obs.said_taken.insert("stray".into());
    assert!(lifecycle::no_orphans(&obs).passed);

    obs.said_taken = ["other".to_string()].into_iter().collect();
    assert!(!lifecycle::no_orphans(&obs).passed);
}

#[test]
fn converges_excuses_a_claim_the_lab_said_was_taken_and_the_accesses_waiting_on_it() {
    let mut obs = with_canary(good());
    let claim = Stuck {
        target: "bucketclaim default/photos".into(),
        last_op: Some("DriverCreateBucket".into()),
        last_code: Some("ALREADY_EXISTS".into()),
        attempts: 30,
        calls: vec![CallId(7)],
        last_key: Some("bucket-1".into()),
        claim: Some("default/photos".into()),
    };
    let access = Stuck {
        target: "bucketaccess default/web".into(),
        last_op: None,
        last_code: None,
        attempts: 0,
        calls: vec![],
        last_key: None,
        claim: Some("default/photos".into()),
    };
    obs.stuck = vec![claim, access];
    assert!(!lifecycle::converges(&obs).passed, "no lab word, no excuse");
    obs.said_taken.insert("bucket-1".into());
    let v = lifecycle::converges(&obs);
    assert!(v.passed, "{:?}", v.details);
    // An access on another claim is still the driver's problem.
    obs.stuck[1].claim = Some("default/scratch".into());
    assert!(!lifecycle::converges(&obs).passed);
}

#[test]
fn a_changed_grant_may_answer_unavailable_only_when_the_lab_faulted_its_state_read() {
    let mut obs = good();
    obs.retries[0].changed_request = true;
    obs.retries[0].retried.reply = DriverReply::Failed {
        code: tonic::Code::Unavailable,
        message: "kube unreachable".into(),
    };
    assert!(!lifecycle::spec_codes(&obs).passed);
    obs.retries[0].backend_faulted = true;
    assert!(lifecycle::spec_codes(&obs).passed);
}

#[test]
fn least_privilege_judges_reads_and_writes_by_the_granted_mode() {
    let ro = |op, status: u16, code: Option<&str>| Probe {
        op,
        allowed: op == ProbeOp::Read,
        ..probe("default/ro", "b1", true, status, code)
    };
    // A read-only grant that reads and is denied writes passes.
    let mut obs = good();
    obs.probes.push(ro(ProbeOp::Read, 200, None));
    obs.probes
        .push(ro(ProbeOp::Write, 403, Some("AccessDenied")));
    assert!(least_privilege(&obs).passed);
    // One that can write fails, naming the read-only grant.
    let mut obs = good();
    obs.probes.push(ro(ProbeOp::Write, 200, None));
    let v = least_privilege(&obs);
    assert!(!v.passed);
    assert!(v.details[0].contains("read-only"), "{:?}", v.details);
    // One that cannot read its own bucket fails.
    let mut obs = good();
    obs.probes
        .push(ro(ProbeOp::Read, 403, Some("AccessDenied")));
    assert!(!least_privilege(&obs).passed);
    // A read of a foreign bucket that works fails.
    let mut obs = good();
    obs.probes.push(Probe {
        op: ProbeOp::Read,
        ..probe("default/a", "canary", false, 200, None)
    });
    assert!(!least_privilege(&obs).passed);
    assert!(
        GrantedMode::ReadOnly.allows(ProbeOp::Read)
            && !GrantedMode::ReadOnly.allows(ProbeOp::Write)
    );
}

#[test]
fn unique_credentials_fails_when_two_keys_share_a_secret() {
    let mut obs = good();
    obs.live
        .push(live("default/b", "KEY2", "KEY2", "secret-one-aaaaaaaa"));
    let v = unique_credentials(&obs);
    assert!(!v.passed);
    assert!(v.details[0].contains("same secret"), "{:?}", v.details);
    assert!(
        !v.details[0].contains("secret-one"),
        "no secret value in a verdict"
    );
    let mut obs = good();
    obs.live
        .push(live("default/b", "KEY2", "KEY2", "secret-two-bbbbbbbb"));
    assert!(unique_credentials(&obs).passed);
}

#[test]
fn owner_only_delete_fails_when_a_planted_object_changes() {
    let planted = |obs: &mut Observations| {
        obs.lab_buckets.push("b1-archive".into());
        obs.backend
            .buckets
            .insert("b1-archive".into(), vec!["ledger.csv".into()]);
        obs.planted
            .buckets
            .insert("b1-archive".into(), vec!["ledger.csv".into()]);
        let doc: PolicyDoc =
            serde_json::json!({"Statement": [{"Sid": "x", "Effect": "Allow"}]}).into();
        obs.backend.policies.insert("team".into(), doc.clone());
        obs.planted.policies.insert("team".into(), doc);
        obs.backend
            .users
            .insert("TEAM".into(), user("team-secret-cccccccc", &["team"]));
        obs.planted
            .users
            .insert("TEAM".into(), user("team-secret-cccccccc", &["team"]));
    };
    let mut obs = with_canary(good());
    planted(&mut obs);
    assert!(lifecycle::owner_only_delete(&obs).passed);
    assert!(
        lifecycle::no_orphans(&obs).passed,
        "planted objects are nobody's orphans"
    );

    let mut obs = with_canary(good());
    planted(&mut obs);
    obs.backend.buckets.insert("b1-archive".into(), vec![]);
    let v = lifecycle::owner_only_delete(&obs);
    assert!(
        !v.passed && v.details[0].contains("lost objects"),
        "{:?}",
        v.details
    );

    let mut obs = with_canary(good());
    planted(&mut obs);
    obs.backend.policies.insert(
        "team".into(),
        serde_json::json!({"Statement": [{"Effect": "Allow"}]}).into(),
    );
    let v = lifecycle::owner_only_delete(&obs);
    assert!(
        !v.passed && v.details[0].contains("rewritten"),
        "{:?}",
        v.details
    );

    let mut obs = with_canary(good());
    planted(&mut obs);
    obs.backend
        .users
        .insert("TEAM".into(), user("team-secret-cccccccc", &[]));
    let v = lifecycle::owner_only_delete(&obs);
    assert!(
        !v.passed && v.details[0].contains("policies"),
        "{:?}",
        v.details
    );
}

#[test]
fn a_policy_doc_is_written_as_its_tree_was_and_reads_back_either_way() {
    let tree = serde_json::json!({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::b1/*"]}]});
    let doc = PolicyDoc::new(&tree);
    // A record holding it is byte-identical to one that held the tree.
    let as_tree = serde_json::to_string(&serde_json::json!({"p": tree})).unwrap();
    let as_doc = serde_json::to_string(&BTreeMap::from([("p", &doc)])).unwrap();
    assert_eq!(as_doc, as_tree);
    assert_eq!(doc.value(), tree);
    // Read from text, or through a tree (a record whose keys were sorted).
    let from_text: PolicyDoc = serde_json::from_str(doc.text()).unwrap();
    let from_tree: PolicyDoc = serde_json::from_value(tree.clone()).unwrap();
    assert_eq!(from_text, doc);
    assert_eq!(from_tree, doc);
    let other = PolicyDoc::new(&serde_json::json!({"Version": "2012-10-17"}));
    assert_ne!(other, doc);
}

#[test]
fn equal_policy_documents_share_one_text() {
    let docs = super::PolicyDocs::default();
    let doc = |bucket: &str| {
        serde_json::json!({"Statement": [{"Effect": "Allow", "Action": ["s3:GetObject"],
            "Resource": [format!("arn:aws:s3:::{bucket}/*")]}], "Version": "2012-10-17"})
    };
    let (a, b, other) = (
        docs.doc(&doc("b1")),
        docs.doc(&doc("b1")),
        docs.doc(&doc("b2")),
    );
    assert_eq!(a, b);
    assert!(
        std::ptr::eq(a.text(), b.text()),
        "equal documents held twice"
    );
    assert_ne!(a, other);
    assert!(!std::ptr::eq(a.text(), other.text()));
    // Shared or not, a document writes as its text.
    assert_eq!(serde_json::to_string(&b).unwrap(), a.text());
}

#[test]
fn a_probe_writes_its_shared_strings_as_plain_ones() {
    let denied = probe("default/a", "b1", false, 403, Some("AccessDenied"));
    let v = serde_json::to_value(&denied).unwrap();
    assert_eq!(v["access"], "default/a");
    assert_eq!(v["access_key"], "KEY1");
    assert_eq!(v["bucket"], "b1");
    assert_eq!(v["code"], "AccessDenied");
    let ok = probe("default/a", "b1", true, 200, None);
    assert_eq!(
        serde_json::to_value(&ok).unwrap()["code"],
        serde_json::Value::Null
    );
    for p in [denied, ok] {
        let back: Probe = serde_json::from_value(serde_json::to_value(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }
}

/// What the run held once (a policy document, a class's parameters, a
/// probe's strings) a record read back holds once too, and only while
/// reading it as a record: read outside the scope, each is its own copy.
#[test]
fn a_record_read_back_holds_equal_values_once() {
    let parameters: drivelab_fakes::cosi_sidecar::Parameters =
        BTreeMap::from([("tier".to_string(), "gold".to_string())]).into();
    let mut obs = good();
    for e in &mut obs.exchanges {
        if let DriverRequest::Grant { parameters: p, .. } = &mut e.request {
            *p = parameters.clone();
        }
    }
    obs.live = vec![
        live("default/a", "KEY1", "KEY1", "secret-one-aaaaaaaa"),
        live("default/b", "KEY2", "KEY2", "secret-two-bbbbbbbb"),
    ];
    obs.probes = vec![
        probe("default/a", "b1", false, 403, Some("AccessDenied")),
        probe("default/a", "b1", false, 403, Some("AccessDenied")),
    ];
    let write = |obs: &Observations| {
        drivelab_fakes::secret::fingerprinting([7; 32], || serde_json::to_string(obs)).unwrap()
    };
    let text = write(&obs);
    let shares = |read: &Observations| {
        let params: Vec<&BTreeMap<String, String>> = read
            .exchanges
            .iter()
            .filter_map(|e| match &e.request {
                DriverRequest::Grant { parameters, .. } => Some(&**parameters),
                _ => None,
            })
            .collect();
        let (a, b) = (&read.live[0], &read.live[1]);
        let (p, q) = (&read.probes[0], &read.probes[1]);
        [
            std::ptr::eq(params[0], params[1]),
            std::ptr::eq(
                a.policies_at_grant["p1"].text(),
                b.policies_at_grant["p1"].text(),
            ),
            std::ptr::eq(
                a.policies_at_grant["p1"].text(),
                read.backend.policies["p1"].text(),
            ),
            Arc::ptr_eq(&p.access, &q.access),
            Arc::ptr_eq(&p.bucket, &q.bucket),
            Arc::ptr_eq(p.code.as_ref().unwrap(), q.code.as_ref().unwrap()),
        ]
    };
    let read: Observations =
        drivelab_fakes::shared::reading(|| serde_json::from_str(&text)).unwrap();
    assert_eq!(shares(&read), [true; 6]);
    assert_eq!(write(&read), text);
    let apart: Observations = serde_json::from_str(&text).unwrap();
    assert_eq!(shares(&apart), [false; 6]);
}

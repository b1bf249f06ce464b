//! Each check on a good observation passes and on a deliberately broken one fails.

use super::*;
use drivelab_fakes::cosi_sidecar::S3Credentials;

fn creds(key: &str, secret: &str) -> S3Credentials {
    S3Credentials { access_key_id: key.into(), secret: Secret::new(secret), endpoint: "http://e".into(), region: "us-east-1".into() }
}

fn grant(call: u64, name: &str, account: &str, key: &str, secret: &str) -> Exchange {
    Exchange {
        call: CallId(call),
        request: DriverRequest::Grant { bucket_id: "b1".into(), name: name.into(), auth: 1, parameters: Default::default() },
        reply: DriverReply::Granted { account_id: account.into(), credentials: Some(creds(key, secret)), credential_entries: 1 },
        replay: call > 1,
    }
}

fn user(secret: &str, policies: &[&str]) -> UserState {
    UserState { secret: Secret::new(secret), status: "enabled".into(), policies: policies.iter().map(|s| s.to_string()).collect() }
}

fn backend() -> BackendState {
    let mut b = BackendState::default();
    b.users.insert("KEY1".into(), user("secret-one-aaaaaaaa", &["p1"]));
    b.policies.insert("p1".into(), serde_json::json!({"Statement": [{"Effect": "Allow", "Resource": "arn:aws:s3:::b1/*"}]}));
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
    }
}

fn probe(access: &str, bucket: &str, granted: bool, status: u16, code: Option<&str>) -> Probe {
    Probe {
        access: access.into(),
        access_key: "KEY1".into(),
        bucket: bucket.into(),
        granted_bucket: granted,
        purpose: ProbePurpose::Current,
        status,
        code: code.map(str::to_string),
        call: Some(CallId(9)),
    }
}

fn good() -> Observations {
    Observations {
        exchanges: vec![grant(1, "ba-a", "KEY1", "KEY1", "secret-one-aaaaaaaa"), grant(2, "ba-a", "KEY1", "KEY1", "secret-one-aaaaaaaa")],
        retries: vec![RetryObservation {
            step: 2,
            original: grant(1, "ba-a", "KEY1", "KEY1", "secret-one-aaaaaaaa"),
            retried: grant(2, "ba-a", "KEY1", "KEY1", "secret-one-aaaaaaaa"),
            before: backend(),
            after: backend(),
            changed_request: false,
        }],
        live: vec![live("default/a", "KEY1", "KEY1", "secret-one-aaaaaaaa")],
        backend: backend(),
        probes: vec![probe("default/a", "b1", true, 200, None), probe("default/a", "canary", false, 403, Some("AccessDenied"))],
        secrets: vec![Secret::new("secret-one-aaaaaaaa")],
        artifacts: vec![("snapshot".into(), "key <key-1> secret <secret-A>".into())],
    }
}

#[test]
fn all_checks_pass_on_a_good_run() {
    let obs = good();
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
    obs.retries[0].after.users.insert("KEY1".into(), user("a-new-secret-bbbbbbb", &["p1"]));
    let v = idempotent_replay(&obs);
    assert!(!v.passed);
    assert!(v.details[0].contains("secret changed"), "{:?}", v.details);

    let mut obs = good();
    obs.retries[0].retried.reply = DriverReply::Failed { code: tonic::Code::AlreadyExists, message: "exists".into() };
    assert!(!idempotent_replay(&obs).passed, "a retry answered AlreadyExists must fail");
}

#[test]
fn idempotent_replay_accepts_already_exists_for_a_changed_request() {
    let mut obs = good();
    obs.retries[0].changed_request = true;
    obs.retries[0].retried.reply = DriverReply::Failed { code: tonic::Code::AlreadyExists, message: "exists".into() };
    assert!(idempotent_replay(&obs).passed);
}

#[test]
fn unique_credentials_fails_on_a_shared_key() {
    let mut obs = good();
    obs.live.push(live("default/b", "KEY2", "KEY1", "secret-one-aaaaaaaa"));
    let v = unique_credentials(&obs);
    assert!(!v.passed);
    assert!(v.details[0].contains("KEY1"));
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
    obs.backend.policies.insert("p1".into(), serde_json::json!({"Statement": [{"Effect": "Allow", "Resource": "arn:aws:s3:::other/*"}]}));
    let v = least_privilege(&obs);
    assert!(!v.passed);
    assert!(v.details[0].contains("replaced"), "{:?}", v.details);
}

#[test]
fn no_rotation_fails_when_handed_out_credentials_stop_working() {
    let mut obs = good();
    obs.probes.push(Probe { purpose: ProbePurpose::HandedOut, ..probe("default/a", "b1", true, 403, Some("SignatureDoesNotMatch")) });
    let v = no_rotation(&obs);
    assert!(!v.passed);
    assert_eq!(v.evidence, vec![9]);

    let mut obs = good();
    obs.live[0].credentials = None;
    assert!(!no_rotation(&obs).passed);
}

#[test]
fn no_secret_leak_fails_when_a_secret_is_written() {
    let mut obs = good();
    obs.artifacts.push(("log".into(), "line one\nuser secret-one-aaaaaaaa created\n".into()));
    let v = no_secret_leak(&obs);
    assert!(!v.passed);
    assert!(v.details[0].starts_with("log:2:"), "{:?}", v.details);
}

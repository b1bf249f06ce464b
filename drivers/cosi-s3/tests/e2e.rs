//! End to end: the real driver on a Unix socket, called through a tonic client,
//! against the lab's S3 + admin fake and Kubernetes fake on loopback. Checks
//! the idempotency rules of DOMAIN.md §1, and that every mutant visibly breaks
//! the rule it seeds.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use cosi_s3::{DriverConfig, Mutant};
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::kube::{Kind, KubeFake};
use drivelab_fakes::s3::{S3Config, S3Fake, S3Probe};
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::{MemStore, Store};
use drivelab_proto::cosi::{
    identity_client::IdentityClient, provisioner_client::ProvisionerClient, AuthenticationType,
    DriverCreateBucketRequest, DriverDeleteBucketRequest, DriverGetInfoRequest,
    DriverGrantBucketAccessRequest, DriverGrantBucketAccessResponse,
    DriverRevokeBucketAccessRequest,
};
use serde_json::json;
use sha2::{Digest, Sha256};
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

const ADMIN_AK: &str = "labadmin";
const ADMIN_SK: &str = "labadmin-secret-key";
const REGION: &str = "us-east-1";
const STATE_NS: &str = "cosi-s3-system";

struct Lab {
    kube: KubeFake,
    s3: S3Fake,
    s3_url: String,
    kube_url: String,
    client: ProvisionerClient<Channel>,
    channel: Channel,
    _kube_l: Listener,
    _s3_l: Listener,
    /// The driver's service-account token, for a spawned binary.
    token_file: PathBuf,
    /// The CA of the Kubernetes API's certificate, for a spawned binary.
    ca_file: PathBuf,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Lab {
    async fn start(mutants: &[Mutant]) -> Lab {
        let gate = Gate::new(History::new(SimClock::new()));
        let kube = KubeFake::new(
            Arc::new(MemStore::default()) as Arc<dyn Store>,
            gate.clone(),
            1,
        )
        .unwrap();
        let s3 = S3Fake::new(
            Arc::new(MemStore::default()) as Arc<dyn Store>,
            gate,
            S3Config {
                admin_access_key: ADMIN_AK.into(),
                admin_secret_key: ADMIN_SK.into(),
                region: REGION.into(),
                backend: Default::default(),
            },
        )
        .unwrap();
        // Over TLS, as a cluster serves it: the driver trusts the lab's CA file.
        let tls = drivelab_fakes::tls::TlsIdentity::generate().unwrap();
        let kube_l = kube.serve_tls(loopback(), &tls).await.unwrap();
        let s3_l = s3.serve(loopback()).await.unwrap();
        // The driver is deployed into its state namespace, so it exists.
        kube.declare_namespace(STATE_NS).unwrap();
        kube.create(
            Kind::Secret,
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "s3-admin", "namespace": "default"},
                "type": "Opaque",
                "data": {"accessKey": b64(ADMIN_AK), "secretKey": b64(ADMIN_SK)},
            }),
        )
        .unwrap();

        let dir = tempfile::tempdir().unwrap();
        let socket: PathBuf = dir.path().join("cosi.sock");
        let token_file = dir.path().join("token");
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, tls.ca_pem()).unwrap();
        let grant = drivelab_fakes::kube::Grant::cosi_driver(STATE_NS, "cosi-driver");
        std::fs::write(&token_file, kube.access().issue(grant)).unwrap();
        let config = DriverConfig {
            kube_url: kube_l.url(),
            kube_token_file: token_file.display().to_string(),
            kube_ca_file: ca_file.display().to_string(),
            state_namespace: STATE_NS.into(),
            mutants: mutants.to_vec(),
            policy_layout: Default::default(),
            secret_length: 0,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let sock = socket.clone();
        tokio::spawn(async move {
            cosi_s3::serve_unix(config, &sock, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let channel = connect(&socket).await;
        Lab {
            kube,
            s3,
            s3_url: s3_l.url(),
            kube_url: kube_l.url(),
            client: ProvisionerClient::new(channel.clone()),
            channel,
            _kube_l: kube_l,
            _s3_l: s3_l,
            token_file,
            ca_file,
            _dir: dir,
            _stop: stop,
        }
    }

    fn kube_url(&self) -> String {
        self.kube_url.clone()
    }

    fn params(&self) -> HashMap<String, String> {
        let mut p = HashMap::new();
        p.insert("endpoint".into(), self.s3_url.clone());
        p.insert("objectStoreUserSecretName".into(), "s3-admin".into());
        p.insert("objectStoreUserSecretNamespace".into(), "default".into());
        p
    }

    async fn create(
        &self,
        name: &str,
        params: HashMap<String, String>,
    ) -> Result<String, tonic::Status> {
        let mut c = self.client.clone();
        c.driver_create_bucket(DriverCreateBucketRequest {
            name: name.into(),
            parameters: params,
        })
        .await
        .map(|r| r.into_inner().bucket_id)
    }

    async fn delete(&self, id: &str, ctx: HashMap<String, String>) -> Result<(), tonic::Status> {
        let mut c = self.client.clone();
        c.driver_delete_bucket(DriverDeleteBucketRequest {
            bucket_id: id.into(),
            delete_context: ctx,
        })
        .await
        .map(drop)
    }

    async fn grant_with(
        &self,
        bucket: &str,
        name: &str,
        auth: AuthenticationType,
        params: HashMap<String, String>,
    ) -> Result<Creds, tonic::Status> {
        let mut c = self.client.clone();
        c.driver_grant_bucket_access(DriverGrantBucketAccessRequest {
            bucket_id: bucket.into(),
            name: name.into(),
            authentication_type: auth as i32,
            parameters: params,
        })
        .await
        .map(|r| Creds::from(r.into_inner()))
    }

    async fn grant(&self, bucket: &str, name: &str) -> Result<Creds, tonic::Status> {
        self.grant_with(bucket, name, AuthenticationType::Key, self.params())
            .await
    }

    async fn revoke(&self, bucket: &str, account: &str) -> Result<(), tonic::Status> {
        let mut c = self.client.clone();
        c.driver_revoke_bucket_access(DriverRevokeBucketAccessRequest {
            bucket_id: bucket.into(),
            account_id: account.into(),
            revoke_access_context: HashMap::new(),
        })
        .await
        .map(drop)
    }

    fn probe(&self) -> S3Probe {
        S3Probe::new(self.s3_url.clone(), REGION)
    }

    async fn can_put(&self, c: &Creds, bucket: &str) -> bool {
        self.probe()
            .put_object(
                &c.access_key,
                &c.secret_key,
                bucket,
                "probe.txt",
                b"hello".to_vec(),
            )
            .await
            .unwrap()
            .is_success()
    }

    async fn remove_object(&self, bucket: &str, key: &str) {
        let r = self
            .probe()
            .send(
                "DELETE",
                &format!("/{bucket}/{key}"),
                ADMIN_AK,
                ADMIN_SK,
                Vec::new(),
            )
            .await
            .unwrap();
        assert!(r.is_success(), "delete object: {r:?}");
    }

    fn bucket_exists(&self, b: &str) -> bool {
        self.s3.buckets().iter().any(|x| x.name == b)
    }

    fn user_exists(&self, ak: &str) -> bool {
        self.s3.users().iter().any(|u| u.access_key == ak)
    }

    fn policy_exists(&self, name: &str) -> bool {
        self.s3.policies().iter().any(|p| p.name == name)
    }

    fn checkpoints(&self, kind: Kind) -> Vec<serde_json::Value> {
        self.kube.list(kind, Some(STATE_NS)).unwrap()
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Creds {
    account_id: String,
    access_key: String,
    secret_key: String,
    endpoint: String,
    region: String,
}

impl From<DriverGrantBucketAccessResponse> for Creds {
    fn from(r: DriverGrantBucketAccessResponse) -> Self {
        assert_eq!(r.credentials.len(), 1, "exactly one credentials entry");
        let s = &r.credentials["s3"].secrets;
        Creds {
            account_id: r.account_id.clone(),
            access_key: s["accessKeyID"].clone(),
            secret_key: s["accessSecretKey"].clone(),
            endpoint: s["endpoint"].clone(),
            region: s["region"].clone(),
        }
    }
}

fn b64(s: &str) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = (chunk[0] as u32) << 16
            | (*chunk.get(1).unwrap_or(&0) as u32) << 8
            | *chunk.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

async fn connect(socket: &std::path::Path) -> Channel {
    for _ in 0..200 {
        if socket.exists() {
            let path = socket.to_path_buf();
            let ch = Endpoint::try_from("http://[::]:50051")
                .unwrap()
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await;
            if let Ok(ch) = ch {
                return ch;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("driver socket {} never came up", socket.display());
}

fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(s) => s.code(),
    }
}

#[tokio::test]
async fn happy_path_is_idempotent() {
    let lab = Lab::start(&[]).await;
    let info = IdentityClient::new(lab.channel.clone())
        .driver_get_info(DriverGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, cosi_s3::DRIVER_NAME);

    let b = "bucket-11111111-2222-3333-4444-555555555555";
    assert_eq!(lab.create(b, lab.params()).await.unwrap(), b);
    assert_eq!(
        lab.create(b, lab.params()).await.unwrap(),
        b,
        "retry answers the same id"
    );
    assert!(lab.bucket_exists(b));
    let cps = lab.checkpoints(Kind::ConfigMap);
    assert_eq!(cps.len(), 1);
    assert_eq!(cps[0]["data"]["state"], "Ready");

    let mut other = lab.params();
    other.insert("region".into(), "eu-west-1".into());
    assert_eq!(
        code(lab.create(b, other).await),
        Code::AlreadyExists,
        "same name, different params"
    );

    let name = "ba-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
    let c1 = lab.grant(b, name).await.unwrap();
    assert_eq!(c1.account_id, c1.access_key);
    assert_eq!(c1.endpoint, lab.s3_url);
    assert_eq!(c1.region, REGION);
    assert!(c1.secret_key.len() >= 32);
    let predictable = hex::encode(Sha256::digest(format!("cosi-s3:{name}").as_bytes()));
    assert_ne!(c1.secret_key, predictable[..40]);
    assert!(lab.can_put(&c1, b).await, "granted credentials work");
    let c2 = lab.grant(b, name).await.unwrap();
    assert_eq!(c1, c2, "retry returns the same account and secret");
    assert!(
        lab.can_put(&c1, b).await,
        "and the first secret still works"
    );

    let mut ro = lab.params();
    ro.insert("accessMode".into(), "readonly".into());
    assert_eq!(
        code(lab.grant_with(b, name, AuthenticationType::Key, ro).await),
        Code::AlreadyExists,
        "same account name, different parameters"
    );
    assert_eq!(
        code(lab.grant("bucket-other-bucket", name).await),
        Code::NotFound
    );

    let grants = lab.checkpoints(Kind::Secret);
    assert_eq!(grants.len(), 1);
    let user = lab
        .s3
        .users()
        .into_iter()
        .find(|u| u.access_key == c1.access_key)
        .unwrap();
    assert_eq!(user.policies.len(), 1);
    assert!(user.policies[0].starts_with("cosi-"));
    let policy = user.policies[0].clone();

    lab.revoke(b, &c1.account_id).await.unwrap();
    assert!(!lab.user_exists(&c1.access_key));
    assert!(!lab.policy_exists(&policy));
    assert!(lab.checkpoints(Kind::Secret).is_empty());
    lab.revoke(b, &c1.account_id).await.unwrap();

    assert_eq!(
        code(lab.delete(b, HashMap::new()).await),
        Code::FailedPrecondition,
        "not empty"
    );
    assert!(lab.bucket_exists(b));
    lab.remove_object(b, "probe.txt").await;
    lab.delete(b, HashMap::new()).await.unwrap();
    assert!(!lab.bucket_exists(b));
    assert!(lab.checkpoints(Kind::ConfigMap).is_empty());
    lab.delete(b, HashMap::new()).await.unwrap();
}

#[tokio::test]
async fn grants_are_isolated_and_pending_checkpoints_resume() {
    let lab = Lab::start(&[]).await;
    let (b1, b2) = ("bucket-one", "bucket-two");
    lab.create(b1, lab.params()).await.unwrap();
    lab.create(b2, lab.params()).await.unwrap();
    let c1 = lab.grant(b1, "ba-1").await.unwrap();
    let c2 = lab.grant(b2, "ba-2").await.unwrap();
    assert_ne!(c1.access_key, c2.access_key);
    assert!(
        lab.can_put(&c1, b1).await && lab.can_put(&c2, b2).await,
        "a later grant leaves the earlier intact"
    );
    assert!(
        !lab.can_put(&c1, b2).await && !lab.can_put(&c2, b1).await,
        "each reaches only its bucket"
    );

    // A crash after add-user and before the promotion leaves PendingCreate: the
    // retry resumes with the persisted secret.
    let mut cp = lab
        .checkpoints(Kind::Secret)
        .into_iter()
        .find(|s| s["metadata"]["annotations"]["cosi-s3.drivelab.dev/name"] == "ba-1")
        .unwrap();
    cp["data"]["state"] = json!(b64("PendingCreate"));
    lab.kube.replace(Kind::Secret, cp).unwrap();
    assert_eq!(lab.grant(b1, "ba-1").await.unwrap(), c1);
    assert!(lab.can_put(&c1, b1).await);

    assert_eq!(
        code(
            lab.grant_with(
                b1,
                "ba-3",
                AuthenticationType::UnknownAuthenticationType,
                lab.params()
            )
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            lab.grant_with(b1, "ba-3", AuthenticationType::Iam, lab.params())
                .await
        ),
        Code::Unimplemented
    );
    let mut bad = lab.params();
    bad.insert("adminApi".into(), "minio".into());
    assert_eq!(
        code(
            lab.grant_with(b1, "ba-3", AuthenticationType::Key, bad)
                .await
        ),
        Code::InvalidArgument
    );
    let mut ext = lab.params();
    ext.insert("policy".into(), "no-such-policy".into());
    assert_eq!(
        code(
            lab.grant_with(b1, "ba-3", AuthenticationType::Key, ext)
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(lab.create(&"x".repeat(129), lab.params()).await),
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn foreign_buckets_are_never_adopted_or_deleted() {
    let lab = Lab::start(&[]).await;
    let r = lab
        .probe()
        .create_bucket(ADMIN_AK, ADMIN_SK, "foreign-bucket")
        .await
        .unwrap();
    assert!(r.is_success());
    assert_eq!(
        code(lab.create("foreign-bucket", lab.params()).await),
        Code::AlreadyExists
    );
    assert!(
        lab.checkpoints(Kind::ConfigMap).is_empty(),
        "no checkpoint claims it"
    );
    assert_eq!(
        code(lab.delete("foreign-bucket", lab.params()).await),
        Code::FailedPrecondition
    );
    lab.delete("foreign-bucket", HashMap::new()).await.unwrap();
    assert!(lab.bucket_exists("foreign-bucket"));
}

// ---- mutants: each visibly breaks its rule --------------------------------

#[tokio::test]
async fn mutant_predictable_secret() {
    let lab = Lab::start(&[Mutant::PredictableSecret]).await;
    lab.create("bucket-m1", lab.params()).await.unwrap();
    let c = lab.grant("bucket-m1", "ba-m1").await.unwrap();
    assert_eq!(
        c.secret_key,
        hex::encode(Sha256::digest(b"cosi-s3:ba-m1"))[..40]
    );
    assert!(
        lab.can_put(&c, "bucket-m1").await,
        "it works, it is just computable"
    );
}

#[tokio::test]
async fn mutant_user_before_checkpoint() {
    let lab = Lab::start(&[Mutant::UserBeforeCheckpoint]).await;
    lab.create("bucket-m2", lab.params()).await.unwrap();
    lab.grant("bucket-m2", "ba-m2").await.unwrap();
    // The crash between add-user and the checkpoint: the checkpoint never landed.
    for s in lab.checkpoints(Kind::Secret) {
        lab.kube
            .delete(
                Kind::Secret,
                Some(STATE_NS),
                s["metadata"]["name"].as_str().unwrap(),
            )
            .unwrap();
    }
    assert_eq!(
        code(lab.grant("bucket-m2", "ba-m2").await),
        Code::AlreadyExists,
        "stuck for ever"
    );
}

#[tokio::test]
async fn mutant_shared_policy() {
    let lab = Lab::start(&[Mutant::SharedPolicy]).await;
    lab.create("bucket-s1", lab.params()).await.unwrap();
    lab.create("bucket-s2", lab.params()).await.unwrap();
    let c1 = lab.grant("bucket-s1", "ba-s1").await.unwrap();
    assert!(lab.can_put(&c1, "bucket-s1").await);
    let _c2 = lab.grant("bucket-s2", "ba-s2").await.unwrap();
    assert!(
        !lab.can_put(&c1, "bucket-s1").await,
        "the second grant replaced the first's policy"
    );
}

#[tokio::test]
async fn mutant_rotate_on_retry() {
    let lab = Lab::start(&[Mutant::RotateOnRetry]).await;
    lab.create("bucket-r1", lab.params()).await.unwrap();
    let c1 = lab.grant("bucket-r1", "ba-r1").await.unwrap();
    let c2 = lab.grant("bucket-r1", "ba-r1").await.unwrap();
    assert_eq!(c1.access_key, c2.access_key);
    assert_ne!(c1.secret_key, c2.secret_key);
    assert!(
        !lab.can_put(&c1, "bucket-r1").await,
        "credentials already handed out are dead"
    );
}

#[tokio::test]
async fn mutant_already_exists_is_success() {
    let lab = Lab::start(&[Mutant::AlreadyExistsIsSuccess]).await;
    lab.probe()
        .create_bucket(ADMIN_AK, ADMIN_SK, "foreign-bucket")
        .await
        .unwrap();
    assert_eq!(
        lab.create("foreign-bucket", lab.params()).await.unwrap(),
        "foreign-bucket",
        "adopted"
    );
}

#[tokio::test]
async fn mutant_delete_unowned() {
    let lab = Lab::start(&[Mutant::DeleteUnowned]).await;
    lab.probe()
        .create_bucket(ADMIN_AK, ADMIN_SK, "foreign-bucket")
        .await
        .unwrap();
    lab.delete("foreign-bucket", lab.params()).await.unwrap();
    assert!(
        !lab.bucket_exists("foreign-bucket"),
        "deleted without proof of ownership"
    );
}

#[tokio::test]
async fn mutant_unknown_auth_as_key() {
    let lab = Lab::start(&[Mutant::UnknownAuthAsKey]).await;
    lab.create("bucket-u1", lab.params()).await.unwrap();
    lab.grant_with(
        "bucket-u1",
        "ba-u1",
        AuthenticationType::UnknownAuthenticationType,
        lab.params(),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn mutant_ignore_incompatible_params() {
    let lab = Lab::start(&[Mutant::IgnoreIncompatibleParams]).await;
    lab.create("bucket-i1", lab.params()).await.unwrap();
    let mut other = lab.params();
    other.insert("region".into(), "eu-west-1".into());
    lab.create("bucket-i1", other).await.unwrap();
}

#[tokio::test]
async fn binary_serves_and_survives_sigkill() {
    let lab = Lab::start(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("proc.sock");
    let spawn = || {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_cosi-s3"))
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .arg("--kube-url")
            .arg(lab.kube_url())
            .arg("--kube-token-file")
            .arg(&lab.token_file)
            .arg("--kube-ca-file")
            .arg(&lab.ca_file)
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    let mut child = spawn();
    let ch = connect(&socket).await;
    let mut p = ProvisionerClient::new(ch);
    let req = DriverCreateBucketRequest {
        name: "bucket-proc".into(),
        parameters: lab.params(),
    };
    p.driver_create_bucket(req.clone()).await.unwrap();
    child.kill().await.unwrap();
    // The respawn finds the stale socket, replaces it, and answers the retry from the checkpoint.
    let _child = spawn();
    let mut p = ProvisionerClient::new(connect(&socket).await);
    assert_eq!(
        p.driver_create_bucket(req)
            .await
            .unwrap()
            .into_inner()
            .bucket_id,
        "bucket-proc"
    );
}

#[tokio::test]
async fn concurrent_retries_agree() {
    let lab = Lab::start(&[]).await;
    let (a, b) = tokio::join!(
        lab.create("bucket-race", lab.params()),
        lab.create("bucket-race", lab.params())
    );
    assert_eq!(a.unwrap(), "bucket-race");
    assert_eq!(b.unwrap(), "bucket-race");
    let (g1, g2, g3) = tokio::join!(
        lab.grant("bucket-race", "ba-race"),
        lab.grant("bucket-race", "ba-race"),
        lab.grant("bucket-race", "ba-race")
    );
    let (g1, g2, g3) = (g1.unwrap(), g2.unwrap(), g3.unwrap());
    assert!(g1 == g2 && g2 == g3, "one account, one secret");
    assert_eq!(
        lab.s3.users().len(),
        1,
        "no user left behind by the losers of the race"
    );
    assert_eq!(lab.checkpoints(Kind::Secret).len(), 1);
    assert!(lab.can_put(&g1, "bucket-race").await);
}

// ---- preferredAccessKey ---------------------------------------------------

impl Lab {
    fn preferred(&self, key: &str) -> HashMap<String, String> {
        let mut p = self.params();
        p.insert("preferredAccessKey".into(), key.into());
        p
    }

    async fn grant_preferred(
        &self,
        bucket: &str,
        name: &str,
        key: &str,
    ) -> Result<Creds, tonic::Status> {
        self.grant_with(bucket, name, AuthenticationType::Key, self.preferred(key))
            .await
    }

    /// Key reservations in the state namespace: (accessKey, accountName, state).
    fn reservations(&self) -> Vec<(String, String, String)> {
        self.checkpoints(Kind::ConfigMap)
            .into_iter()
            .filter(|c| c["metadata"]["labels"]["cosi-s3.drivelab.dev/kind"] == "key")
            .map(|c| {
                let d = &c["data"];
                let s = |k: &str| d[k].as_str().unwrap_or_default().to_string();
                (s("accessKey"), s("accountName"), s("state"))
            })
            .collect()
    }

    async fn put_code(&self, c: &Creds, bucket: &str) -> Option<String> {
        self.probe()
            .put_object(
                &c.access_key,
                &c.secret_key,
                bucket,
                "probe.txt",
                b"hello".to_vec(),
            )
            .await
            .unwrap()
            .code
    }

    /// A reservation as the driver writes it, for modelling crashes.
    fn reserve_by_hand(&self, key: &str, account: &str) {
        self.kube
            .create(
                Kind::ConfigMap,
                json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {
                        "name": cosi_s3::policy::key_reservation_name(key),
                        "namespace": STATE_NS,
                        "labels": {"app.kubernetes.io/managed-by": cosi_s3::DRIVER_NAME, "cosi-s3.drivelab.dev/kind": "key"},
                    },
                    "data": {"accessKey": key, "accountName": account, "state": "Held"},
                }),
            )
            .unwrap();
    }
}

#[tokio::test]
async fn preferred_key_is_held_by_one_grant_at_a_time() {
    let lab = Lab::start(&[]).await;
    let b = "bucket-pref";
    lab.create(b, lab.params()).await.unwrap();

    let c1 = lab.grant_preferred(b, "ba-p1", "TEAMKEY").await.unwrap();
    assert_eq!(
        c1.access_key, "TEAMKEY",
        "the first grant gets the preferred key"
    );
    assert_eq!(c1.account_id, "TEAMKEY");
    assert_eq!(
        lab.reservations(),
        vec![("TEAMKEY".into(), "ba-p1".into(), "Held".into())]
    );
    assert_eq!(
        lab.grant_preferred(b, "ba-p1", "TEAMKEY").await.unwrap(),
        c1,
        "retry of the winner"
    );

    let c2 = lab.grant_preferred(b, "ba-p2", "TEAMKEY").await.unwrap();
    assert_ne!(
        c2.access_key, "TEAMKEY",
        "the key is taken: a random one instead"
    );
    assert_eq!(c2.access_key.len(), 20);
    assert!(
        lab.can_put(&c1, b).await,
        "the first grant's credentials still work"
    );
    assert!(lab.can_put(&c2, b).await);
    assert_eq!(
        lab.grant_preferred(b, "ba-p2", "TEAMKEY").await.unwrap(),
        c2,
        "retry of the loser: same fallback key"
    );

    // Same name, different preferred key: a different request.
    assert_eq!(
        code(lab.grant_preferred(b, "ba-p2", "OTHERKEY").await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(lab.grant_preferred(b, "ba-p9", "no").await),
        Code::InvalidArgument
    );

    // Revoke of the winner frees the key; the loser's retry still answers its fallback key.
    lab.revoke(b, &c1.account_id).await.unwrap();
    assert!(!lab.user_exists("TEAMKEY"));
    assert!(
        lab.reservations().is_empty(),
        "revoke released the reservation"
    );
    assert_eq!(
        lab.grant_preferred(b, "ba-p2", "TEAMKEY").await.unwrap(),
        c2,
        "whatever happens to the reservation"
    );
    let c3 = lab.grant_preferred(b, "ba-p3", "TEAMKEY").await.unwrap();
    assert_eq!(c3.access_key, "TEAMKEY", "a third grant can have it now");
    assert!(lab.can_put(&c3, b).await && lab.can_put(&c2, b).await);
    assert!(
        !lab.can_put(&c1, b).await,
        "the revoked secret does not come back with the key"
    );

    // Revoke of the loser leaves the winner's reservation alone.
    lab.revoke(b, &c2.account_id).await.unwrap();
    assert_eq!(
        lab.reservations(),
        vec![("TEAMKEY".into(), "ba-p3".into(), "Held".into())]
    );
    assert!(lab.can_put(&c3, b).await);
}

#[tokio::test]
async fn preferred_key_reservation_is_crash_safe() {
    let lab = Lab::start(&[]).await;
    let b = "bucket-pref-crash";
    lab.create(b, lab.params()).await.unwrap();

    // A crash between the reservation and the checkpoint leaves a reservation
    // naming us and nothing else (add-user only follows the checkpoint): the
    // retry finds it and takes the key.
    lab.reserve_by_hand("CRASHKEY", "ba-c1");
    let c1 = lab.grant_preferred(b, "ba-c1", "CRASHKEY").await.unwrap();
    assert_eq!(c1.access_key, "CRASHKEY");
    assert!(lab.can_put(&c1, b).await);
    // One naming another account (its grant crashed at the same point) is theirs.
    lab.reserve_by_hand("OTHERSKEY", "ba-someone-else");
    let c0 = lab.grant_preferred(b, "ba-c0", "OTHERSKEY").await.unwrap();
    assert_ne!(c0.access_key, "OTHERSKEY");
    assert!(!lab.user_exists("OTHERSKEY"));

    // A revoke interrupted between the checkpoint delete and the reservation
    // delete leaves a Releasing reservation; the retried revoke finishes it.
    let w = lab.grant_preferred(b, "ba-c2", "HALFKEY").await.unwrap();
    assert_eq!(w.access_key, "HALFKEY");
    let mut cm = lab
        .checkpoints(Kind::ConfigMap)
        .into_iter()
        .find(|c| {
            c["metadata"]["labels"]["cosi-s3.drivelab.dev/kind"] == "key"
                && c["data"]["accessKey"] == "HALFKEY"
        })
        .unwrap();
    let grant = lab
        .checkpoints(Kind::Secret)
        .into_iter()
        .find(|s| s["metadata"]["annotations"]["cosi-s3.drivelab.dev/name"] == "ba-c2")
        .unwrap();
    // The revoke's steps up to the crash: remove-user, mark Releasing, delete the checkpoint.
    let r = lab
        .probe()
        .send(
            "DELETE",
            "/rustfs/admin/v3/remove-user?accessKey=HALFKEY",
            ADMIN_AK,
            ADMIN_SK,
            Vec::new(),
        )
        .await
        .unwrap();
    assert!(r.is_success(), "remove-user: {r:?}");
    assert!(!lab.user_exists("HALFKEY"));
    lab.kube
        .delete(
            Kind::Secret,
            Some(STATE_NS),
            grant["metadata"]["name"].as_str().unwrap(),
        )
        .unwrap();
    cm["data"]["state"] = json!("Releasing");
    lab.kube.replace(Kind::ConfigMap, cm).unwrap();
    // A new grant may not take a key whose revoke is still in flight.
    let x = lab.grant_preferred(b, "ba-c3", "HALFKEY").await.unwrap();
    assert_ne!(x.access_key, "HALFKEY");
    lab.revoke(b, "HALFKEY").await.unwrap();
    assert!(
        lab.reservations().iter().all(|(k, _, _)| k != "HALFKEY"),
        "the retried revoke released it"
    );
    let y = lab.grant_preferred(b, "ba-c4", "HALFKEY").await.unwrap();
    assert_eq!(y.access_key, "HALFKEY");
}

#[tokio::test]
async fn preferred_key_owned_outside_cosi_is_left_alone() {
    let lab = Lab::start(&[]).await;
    let b = "bucket-pref-foreign";
    lab.create(b, lab.params()).await.unwrap();
    let c = lab.grant_preferred(b, "ba-f1", "WORKLOAD").await.unwrap();
    // Recreate the situation of a user made by hand: drop our checkpoint and reservation.
    for s in lab.checkpoints(Kind::Secret) {
        lab.kube
            .delete(
                Kind::Secret,
                Some(STATE_NS),
                s["metadata"]["name"].as_str().unwrap(),
            )
            .unwrap();
    }
    for m in lab.checkpoints(Kind::ConfigMap) {
        if m["metadata"]["labels"]["cosi-s3.drivelab.dev/kind"] == "key" {
            lab.kube
                .delete(
                    Kind::ConfigMap,
                    Some(STATE_NS),
                    m["metadata"]["name"].as_str().unwrap(),
                )
                .unwrap();
        }
    }
    let other = lab.grant_preferred(b, "ba-f2", "WORKLOAD").await.unwrap();
    assert_ne!(other.access_key, "WORKLOAD");
    assert!(
        lab.can_put(&c, b).await,
        "the existing user's secret was not replaced"
    );
    assert!(lab.reservations().is_empty());
}

#[tokio::test]
async fn concurrent_grants_share_no_preferred_key() {
    let lab = Lab::start(&[]).await;
    let b = "bucket-pref-race";
    lab.create(b, lab.params()).await.unwrap();
    let (r1, r2, r3, r4, r5) = tokio::join!(
        lab.grant_preferred(b, "ba-r1", "TEAMKEY"),
        lab.grant_preferred(b, "ba-r2", "TEAMKEY"),
        lab.grant_preferred(b, "ba-r3", "TEAMKEY"),
        lab.grant_preferred(b, "ba-r4", "TEAMKEY"),
        lab.grant_preferred(b, "ba-r5", "TEAMKEY"),
    );
    let all = [
        r1.unwrap(),
        r2.unwrap(),
        r3.unwrap(),
        r4.unwrap(),
        r5.unwrap(),
    ];
    let keys: std::collections::HashSet<_> = all.iter().map(|c| c.access_key.clone()).collect();
    assert_eq!(keys.len(), 5, "no two accesses share a key: {keys:?}");
    assert_eq!(
        all.iter().filter(|c| c.access_key == "TEAMKEY").count(),
        1,
        "exactly one got it"
    );
    for c in &all {
        assert!(lab.can_put(c, b).await, "{} works", c.access_key);
    }
    assert_eq!(lab.reservations().len(), 1);
}

#[tokio::test]
async fn mutant_shared_preferred_key() {
    let lab = Lab::start(&[Mutant::SharedPreferredKey]).await;
    let b = "bucket-pref-m";
    lab.create(b, lab.params()).await.unwrap();
    let c1 = lab.grant_preferred(b, "ba-m1", "TEAMKEY").await.unwrap();
    assert!(lab.can_put(&c1, b).await);
    let c2 = lab.grant_preferred(b, "ba-m2", "TEAMKEY").await.unwrap();
    assert_eq!(c1.access_key, c2.access_key, "both got the key");
    assert!(lab.reservations().is_empty(), "no reservation taken");
    let r = lab.put_code(&c1, b).await;
    assert_eq!(
        r.as_deref(),
        Some("SignatureDoesNotMatch"),
        "the first grant's secret was replaced"
    );
    assert!(lab.can_put(&c2, b).await);
}

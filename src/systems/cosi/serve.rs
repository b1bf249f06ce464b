//! `drivelab serve`: the fakes on 127.0.0.1 for manual use — a real driver or a
//! real client (mc, aws CLI, kubectl) pointed at them by hand — with users,
//! buckets and classes from a config file, and faults armed through the engine's hook.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, Context};
use base64::Engine as _;
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::{Component, EventKind, History};
use drivelab_fakes::kube::{Grant, Kind};
use drivelab_fakes::s3::{Backend, S3Config, S3Probe};
use drivelab_fakes::secret::Secret;
use futures_util::future::BoxFuture;
use rand::Rng;
use serde::Deserialize;
use serde_json::json;
use serde_saphyr::Spanned;

use super::fakes::FakeSet;
use crate::engine::external;
use crate::engine::hook::{LabControl, LabHook};
use crate::engine::schedule::Scheduler;
use crate::scenario::fault::RawFault;
use crate::scenario::{
    error_at, yaml_error, AccessClassSpec, BucketClassSpec, FaultSpec, ScenarioError, System,
};

/// The admin access key id `serve` (and every run) uses.
pub const ADMIN_ACCESS_KEY: &str = "drivelab-admin";

/// A user the config file asks for (created through the admin API, as a client would).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct UserSpec {
    /// Access key id (3+ characters, no `/ , = space`).
    pub access_key: String,
    /// Secret key (8 or more characters; neither server has an upper bound).
    pub secret_key: String,
    /// A canned policy to create for the user: `readwrite` on these buckets.
    #[serde(default)]
    pub buckets: Vec<String>,
}

/// `drivelab serve --config FILE`.
#[derive(Clone, Debug, Default)]
pub struct ServeConfig {
    /// S3 users besides the admin.
    pub users: Vec<UserSpec>,
    /// Buckets created (owned by the admin) before anything else.
    pub buckets: Vec<String>,
    /// BucketClasses created in the fake Kubernetes API.
    pub bucket_classes: Vec<BucketClassSpec>,
    /// BucketAccessClasses created in the fake Kubernetes API.
    pub access_classes: Vec<AccessClassSpec>,
    /// `driverName` of those classes.
    pub driver_name: String,
    /// The real server the S3/admin fake follows (`backend:`; default rustfs).
    pub backend: Backend,
    /// The signing region (`region:`); empty: any region is accepted.
    pub region: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    users: Vec<Spanned<UserSpec>>,
    #[serde(default)]
    buckets: Vec<Spanned<String>>,
    #[serde(default)]
    bucket_classes: Vec<BucketClassSpec>,
    #[serde(default)]
    bucket_access_classes: Vec<AccessClassSpec>,
    #[serde(default)]
    driver_name: Option<String>,
    #[serde(default)]
    backend: Option<Spanned<String>>,
    #[serde(default)]
    region: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFaults {
    faults: Vec<Spanned<RawFault>>,
}

fn read(path: &Path) -> Result<String, ScenarioError> {
    std::fs::read_to_string(path).map_err(|e| ScenarioError {
        path: path.to_path_buf(),
        line: 0,
        col: 0,
        message: format!("cannot read the file: {e}"),
        hint: None,
    })
}

/// Read and check a `serve` config file (errors as `file:line:col`).
pub fn load_config(path: &Path) -> Result<ServeConfig, ScenarioError> {
    parse_config(path, &read(path)?)
}

/// Parse `serve` config text; `path` is used in messages.
pub fn parse_config(path: &Path, text: &str) -> Result<ServeConfig, ScenarioError> {
    let raw: RawConfig = crate::scenario::from_yaml(text).map_err(|e| yaml_error(path, &e))?;
    let mut users = Vec::new();
    for u in raw.users {
        let v = &u.value;
        if v.access_key.len() < 3 || v.access_key.contains(['/', ',', '=', ' ']) {
            return Err(error_at(
                path,
                &u,
                format!("access key `{}` is invalid", v.access_key),
                Some("3 or more characters, none of / , = or space"),
            ));
        }
        if v.access_key == ADMIN_ACCESS_KEY {
            return Err(error_at(path, &u, "that is the admin's access key", None));
        }
        if v.secret_key.len() < 8 {
            return Err(error_at(
                path,
                &u,
                format!(
                    "the secret key of `{}` must be at least 8 characters",
                    v.access_key
                ),
                None,
            ));
        }
        users.push(u.value);
    }
    let mut buckets = Vec::new();
    for b in raw.buckets {
        if cosi_s3::config::validate_bucket_name("name", &b.value).is_err() {
            return Err(error_at(
                path,
                &b,
                format!("`{}` is not a valid S3 bucket name", b.value),
                Some("3-63 lowercase letters, digits, '-' and '.'"),
            ));
        }
        buckets.push(b.value);
    }
    let backend = match &raw.backend {
        None => Backend::default(),
        Some(b) => Backend::parse(b.value.trim()).ok_or_else(|| {
            error_at(
                path,
                b,
                format!("`{}` is not an S3 backend", b.value),
                Some("write `rustfs` or `minio`"),
            )
        })?,
    };
    let region = match &raw.region {
        None => String::new(),
        Some(r)
            if r.value.is_empty() || r.value.contains(|c: char| c.is_whitespace() || c == '/') =>
        {
            return Err(error_at(
                path,
                r,
                format!("`{}` is not a region name", r.value),
                Some("e.g. us-east-1; leave `region:` out to accept any region"),
            ))
        }
        Some(r) => r.value.clone(),
    };
    Ok(ServeConfig {
        backend,
        region,
        users,
        buckets,
        bucket_classes: raw.bucket_classes,
        access_classes: raw.bucket_access_classes,
        driver_name: raw
            .driver_name
            .unwrap_or_else(|| cosi_s3::DRIVER_NAME.to_string()),
    })
}

/// Read a faults file: `faults: [...]` in the scenario fault language (the
/// COSI lab's names: `serve` stands that lab up). Each fault comes with its `file:line`.
pub fn load_faults(path: &Path) -> Result<Vec<(FaultSpec, String)>, ScenarioError> {
    let text = read(path)?;
    let raw: RawFaults = crate::scenario::from_yaml(&text).map_err(|e| yaml_error(path, &e))?;
    raw.faults
        .iter()
        .map(|f| {
            let spec = f.value.resolve(System::Cosi).map_err(|e| {
                let hint = e
                    .hint
                    .unwrap_or_else(|| "see scenarios/README.md, Faults".into());
                match &e.at {
                    Some(at) => error_at(path, at, e.message, Some(&hint)),
                    None => error_at(path, f, e.message, Some(&hint)),
                }
            })?;
            Ok((spec, format!("{}:{}", path.display(), f.referenced.line())))
        })
        .collect()
}

/// Fixed ports for `serve --ports S3,KUBE` (0 = any).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ports {
    /// S3 + admin API.
    pub s3: u16,
    /// Kubernetes API.
    pub kube: u16,
}

impl std::str::FromStr for Ports {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, b) = s
            .split_once(',')
            .ok_or_else(|| format!("--ports `{s}`: write S3,KUBE, e.g. 9000,6443"))?;
        let port = |p: &str| {
            p.trim()
                .parse::<u16>()
                .map_err(|_| format!("--ports: `{p}` is not a port number"))
        };
        Ok(Ports {
            s3: port(a)?,
            kube: port(b)?,
        })
    }
}

/// What a running `serve` session exposes.
pub struct Served {
    /// `http://127.0.0.1:PORT` of S3 and the admin API.
    pub s3_url: String,
    /// `https://127.0.0.1:PORT` of the Kubernetes API.
    pub kube_url: String,
    /// The admin access key id.
    pub admin_access_key: String,
    /// The admin secret key.
    pub admin_secret: Secret,
    /// A kubeconfig for the driver: its service account
    /// (`cosi-s3-system/cosi-driver`) with what a COSI driver's RBAC grants.
    pub kubeconfig: PathBuf,
    /// The driver's bearer token (the one in `kubeconfig`).
    pub kube_token: Secret,
    /// A kubeconfig for the operator (kubectl, a conformance tool): cluster-admin.
    pub admin_kubeconfig: PathBuf,
    /// The CA the Kubernetes API's certificate is signed by (PEM file).
    pub kube_ca_file: PathBuf,
    /// The session's history (every call the fakes saw).
    pub history: History,
    fakes: Arc<FakeSet>,
    _hook: Arc<LabHook>,
    _dir: tempfile::TempDir,
}

impl Served {
    /// The CA the Kubernetes API's certificate is signed by, PEM.
    pub fn kube_ca_pem(&self) -> &str {
        self.fakes.kube_ca_pem()
    }

    /// Stop both listeners and flush the state.
    pub async fn stop(self) {
        self.fakes.stop().await;
    }
}

/// No driver in a `serve` session: crash_driver is noted; restarts are real.
struct ServeControl {
    fakes: std::sync::Weak<FakeSet>,
    history: History,
}

impl LabControl for ServeControl {
    fn crash_driver(&self, _during: drivelab_fakes::history::CallId) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.history.record(EventKind::Note {
                component: Component::Lab,
                text: "crash_driver fired, but serve runs no driver: the request is cut".into(),
            });
        })
    }

    fn restart(&self, component: Component) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let Some(fakes) = self.fakes.upgrade() else {
                return;
            };
            let history = self.history.clone();
            // Spawned: the restart breaks the very connection this hook may run on.
            let _ = tokio::spawn(async move {
                if let Err(e) = fakes.restart(component).await {
                    history.record(EventKind::Note {
                        component: Component::Lab,
                        text: format!("restart failed: {e:#}"),
                    });
                }
            })
            .await;
        })
    }
}

/// Start the fakes, create the admin Secret, users, buckets and classes, arm `faults`.
pub async fn start(
    config: &ServeConfig,
    ports: Ports,
    faults: Vec<(FaultSpec, String)>,
) -> anyhow::Result<Served> {
    let dir = tempfile::Builder::new()
        .prefix("drivelab-serve-")
        .tempdir()
        .context("creating the session directory")?;
    // A live lab driven by hand: its clock starts at the wall-clock instant and
    // moves with real time, so objects written a minute apart are a minute apart
    // (a run's clock moves only with its schedule and stays reproducible).
    let history = History::new(SimClock::following_wall_clock());
    // A credential for a long-lived server: from the OS, unlike a run's seeded one.
    let mut rng = rand::rng();
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let admin_secret = Secret::new(
        (0..40)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
            .collect::<String>(),
    );
    let hook = Arc::new(LabHook::new(
        history.clone(),
        Scheduler::new(1, history.clone()),
    ));
    hook.fault_every_caller();
    let gate = || {
        let g = Gate::new(history.clone());
        g.set_hook(hook.clone());
        g
    };
    let s3_config = S3Config {
        admin_access_key: ADMIN_ACCESS_KEY.into(),
        admin_secret_key: admin_secret.expose().to_string(),
        region: config.region.clone(),
        backend: config.backend,
    };
    let addr = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let fakes = FakeSet::start_on(
        s3_config,
        rng.random(),
        gate(),
        gate(),
        (addr(ports.s3), addr(ports.kube)),
    )
    .await?;
    hook.set_control(Arc::new(ServeControl {
        fakes: Arc::downgrade(&fakes),
        history: history.clone(),
    }));
    let s3_url = fakes.s3_url();
    let kube_url = fakes.kube_url();
    let kube = fakes.kube();
    // A driver run by hand keeps its state in DRIVER_STATE_NAMESPACE by default
    // (`drivelab driver cosi-s3 --state-namespace`), so that namespace exists as a
    // deployed driver's would, and its kubeconfig's context names it.
    kube.declare_namespace(super::DRIVER_STATE_NAMESPACE)
        .map_err(|e| anyhow!("creating namespace {}: {e}", super::DRIVER_STATE_NAMESPACE))?;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    kube.create(
        Kind::Secret,
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": super::ADMIN_SECRET_NAME, "namespace": super::ADMIN_SECRET_NAMESPACE},
            "type": "Opaque",
            "data": {"accessKey": b64(ADMIN_ACCESS_KEY), "secretKey": b64(admin_secret.expose())},
        }),
    )
    .map_err(|e| anyhow!("creating the admin Secret: {e}"))?;
    let region = if config.region.is_empty() {
        "us-east-1"
    } else {
        &config.region
    };
    let probe = S3Probe::new(&s3_url, region).as_lab(fakes.s3().lab_marker());
    for b in &config.buckets {
        super::lab::create_lab_bucket(&probe, &admin_secret, b).await?;
    }
    // RustFS's own prefix takes plain JSON; MinIO has only /minio/admin,
    // where add-user's body is madmin-encrypted.
    let prefix = match config.backend {
        Backend::Rustfs => "/rustfs/admin/v3",
        Backend::Minio => "/minio/admin/v3",
    };
    let admin = |method: &'static str, path: String, body: serde_json::Value, encrypt: bool| {
        let probe = &probe;
        let secret = admin_secret.expose().to_string();
        let path = format!("{prefix}{path}");
        async move {
            let mut bytes = body.to_string().into_bytes();
            if encrypt && config.backend == Backend::Minio {
                let s = secret.clone();
                bytes = tokio::task::spawn_blocking(move || {
                    drivelab_fakes::s3::madmin::encrypt(&s, &bytes)
                })
                .await?
                .map_err(|e| anyhow!("encrypting the add-user body: {e}"))?;
            }
            let r = probe
                .send(method, &path, ADMIN_ACCESS_KEY, &secret, bytes)
                .await
                .map_err(|e| anyhow!("{method} {path}: {e}"))?;
            if !(200..300).contains(&r.status) {
                return Err(anyhow!(
                    "{method} {path} answered {} {}",
                    r.status,
                    r.code.unwrap_or_default()
                ));
            }
            Ok(())
        }
    };
    for u in &config.users {
        admin(
            "PUT",
            format!("/add-user?accessKey={}", u.access_key),
            json!({"secretKey": u.secret_key, "status": "enabled"}),
            true,
        )
        .await
        .with_context(|| format!("creating user {}", u.access_key))?;
        if !u.buckets.is_empty() {
            let name = format!("serve-{}", u.access_key);
            let resources: Vec<String> = u
                .buckets
                .iter()
                .flat_map(|b| [format!("arn:aws:s3:::{b}"), format!("arn:aws:s3:::{b}/*")])
                .collect();
            admin(
                "PUT",
                format!("/add-canned-policy?name={name}"),
                json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": resources}]}),
                false,
            )
            .await
            .with_context(|| format!("creating the policy of {}", u.access_key))?;
            admin(
                "PUT",
                format!(
                    "/set-user-or-group-policy?policyName={name}&userOrGroup={}&isGroup=false",
                    u.access_key
                ),
                json!({}),
                false,
            )
            .await
            .with_context(|| format!("attaching the policy of {}", u.access_key))?;
        }
    }
    let params = |given: &std::collections::BTreeMap<String, String>| {
        let mut p = std::collections::BTreeMap::new();
        p.insert("endpoint".to_string(), s3_url.clone());
        p.insert(
            "objectStoreUserSecretName".into(),
            super::ADMIN_SECRET_NAME.into(),
        );
        p.insert(
            "objectStoreUserSecretNamespace".into(),
            super::ADMIN_SECRET_NAMESPACE.into(),
        );
        for (k, v) in given {
            p.insert(k.clone(), v.replace("{s3_endpoint}", &s3_url));
        }
        json!(p)
    };
    super::lab::create_classes(
        &kube,
        &config.driver_name,
        &config.bucket_classes,
        &config.access_classes,
        &params,
    )?;
    // The driver's account lives where it keeps its state, as in a run; its
    // files are laid out as a run lays them out in the driver's directory.
    let ns = super::DRIVER_STATE_NAMESPACE;
    let kube_token = fakes.kube_token(Grant::cosi_driver(ns, super::DRIVER_ACCOUNT));
    let server = (kube_url.as_str(), fakes.kube_ca_pem());
    external::write_kube_credentials(dir.path(), server, ns, &kube_token)
        .context("writing the driver's kubeconfig, token and CA")?;
    let admin_kubeconfig = dir.path().join("admin.kubeconfig");
    let admin_token = fakes.kube_token(Grant::cluster_admin("kubernetes-admin"));
    external::write_kubeconfig(&admin_kubeconfig, server, "default", &admin_token)
        .context("writing the admin kubeconfig")?;
    for (f, at) in faults {
        hook.arm(f, &at);
    }
    Ok(Served {
        s3_url,
        kube_url,
        admin_access_key: ADMIN_ACCESS_KEY.into(),
        admin_secret,
        kubeconfig: dir.path().join(external::KUBECONFIG_FILE),
        kube_token,
        admin_kubeconfig,
        kube_ca_file: dir.path().join(external::KUBE_CA_FILE),
        history,
        fakes,
        _hook: hook,
        _dir: dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_errors_name_the_place() {
        let p = Path::new("lab.yaml");
        let c = parse_config(
            p,
            "users:\n  - { access_key: app, secret_key: app-secret-1, buckets: [photos] }\nbuckets: [photos]\n",
        )
        .unwrap();
        assert_eq!(c.users[0].buckets, ["photos"]);
        assert_eq!(c.driver_name, cosi_s3::DRIVER_NAME);
        for (text, needle, line) in [
            (
                "users:\n  - { access_key: a, secret_key: app-secret-1 }\n",
                "is invalid",
                2,
            ),
            (
                "users:\n  - { access_key: app, secret_key: short }\n",
                "at least 8 characters",
                2,
            ),
            (
                "buckets:\n  - Not_A_Bucket\n",
                "not a valid S3 bucket name",
                2,
            ),
            ("colour: red\n", "unknown field", 1),
        ] {
            let e = parse_config(p, text).unwrap_err();
            assert!(e.message.contains(needle), "{text}: {e}");
            assert_eq!(e.line, line, "{text}: {e}");
        }
    }

    #[test]
    fn ports_parse() {
        assert_eq!(
            "9000,6443".parse::<Ports>(),
            Ok(Ports {
                s3: 9000,
                kube: 6443
            })
        );
        assert!("9000".parse::<Ports>().is_err());
        assert!("x,1".parse::<Ports>().is_err());
    }
}

//! The lab in a container, for a driver author's own Rust integration tests:
//! [`LabContainer::start`] runs `drivelab serve` from a locally built image
//! (docker/Dockerfile; nothing is pulled) and hands back its endpoints and credentials.
//!
//! ```no_run
//! # async fn t() -> Result<(), drivelab::testcontainers::LabError> {
//! let lab = drivelab::testcontainers::LabContainer::start("drivelab:dev", None).await?;
//! // point the driver under test at lab.s3_url / lab.kube_url (or lab.write_kubeconfig(..))
//! lab.stop().await?;
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use drivelab_fakes::secret::Secret;
use testcontainers::core::WaitFor;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

/// Why the lab container could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// Docker refused or the container never printed `ready`.
    #[error("starting the lab container {image}: {source}")]
    Start {
        /// The image.
        image: String,
        /// What testcontainers reported.
        #[source]
        source: testcontainers::TestcontainersError,
    },
    /// `serve` printed something this helper cannot read.
    #[error("the lab container's banner lacks `{0}`")]
    Banner(&'static str),
    /// Reading logs or stopping failed.
    #[error("lab container: {0}")]
    Docker(#[from] testcontainers::TestcontainersError),
    /// Writing the kubeconfig failed.
    #[error("writing the kubeconfig: {0}")]
    Io(#[from] std::io::Error),
}

/// A running `drivelab serve` in a container (host networking: its fakes listen
/// on the host's 127.0.0.1, like a lab started by hand).
pub struct LabContainer {
    /// S3 + admin API base URL.
    pub s3_url: String,
    /// Kubernetes API base URL.
    pub kube_url: String,
    /// Admin access key id.
    pub admin_access_key: String,
    /// Admin secret key.
    pub admin_secret: Secret,
    /// The driver's bearer token for the Kubernetes API (`serve`'s `kube_token`).
    pub kube_token: Secret,
    /// The CA the Kubernetes API's certificate is signed by, PEM.
    pub kube_ca_pem: String,
    container: ContainerAsync<GenericImage>,
}

impl LabContainer {
    /// Start `image` (`NAME[:TAG]`, built locally) running `drivelab serve`,
    /// with `config` (the YAML of `serve --config`) if given.
    pub async fn start(image: &str, config: Option<&str>) -> Result<Self, LabError> {
        let (name, tag) = match image.rsplit_once(':') {
            Some((n, t)) if !t.contains('/') => (n, t),
            _ => (image, "latest"),
        };
        let mut cmd = vec!["serve".to_string()];
        let mut req = GenericImage::new(name, tag)
            .with_wait_for(WaitFor::message_on_stdout("ready"))
            .with_network("host")
            .with_startup_timeout(Duration::from_secs(60));
        if let Some(c) = config {
            req = req.with_copy_to("/tmp/lab.yaml", c.as_bytes().to_vec());
            cmd.extend(["--config".into(), "/tmp/lab.yaml".into()]);
        }
        let container = req
            .with_cmd(cmd)
            .start()
            .await
            .map_err(|source| LabError::Start {
                image: image.to_string(),
                source,
            })?;
        let banner = String::from_utf8_lossy(&container.stdout_to_vec().await?).into_owned();
        let fields: BTreeMap<&str, &str> =
            banner.lines().filter_map(|l| l.split_once(": ")).collect();
        let get = |k: &'static str| {
            fields
                .get(k)
                .map(|v| v.to_string())
                .ok_or(LabError::Banner(k))
        };
        Ok(LabContainer {
            s3_url: get("s3_endpoint")?,
            kube_url: get("kube_url")?,
            admin_access_key: get("admin_access_key")?,
            admin_secret: Secret::new(get("admin_secret_key")?),
            kube_token: Secret::new(get("kube_token")?),
            kube_ca_pem: {
                use base64::Engine as _;
                let data = get("kube_ca_data")?;
                let pem = base64::engine::general_purpose::STANDARD
                    .decode(data.trim())
                    .map_err(|_| LabError::Banner("kube_ca_data"))?;
                String::from_utf8(pem).map_err(|_| LabError::Banner("kube_ca_data"))?
            },
            container,
        })
    }

    /// Write a kubeconfig for the lab's Kubernetes API (for KUBECONFIG), as
    /// the driver's service account (`kube_token`), in its namespace as `serve`
    /// gives it.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), LabError> {
        let server = (self.kube_url.as_str(), self.kube_ca_pem.as_str());
        let ns = crate::systems::cosi::DRIVER_STATE_NAMESPACE;
        crate::engine::write_kubeconfig(path, server, ns, &self.kube_token)?;
        Ok(())
    }

    /// Stop the lab (SIGTERM: `serve` shuts down cleanly) and remove the container.
    pub async fn stop(self) -> Result<(), LabError> {
        self.container.stop().await?;
        self.container.rm().await?;
        Ok(())
    }
}

//! The BOSH backend a CSI scenario may stand up (`bosh:`): the Director (with
//! its in-process CPI, agents and UAA) as a restartable "process", the IaaS
//! block API, and what the driver under test is told of them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use drivelab_fakes::cpi::{Cpi, CpiConfig};
use drivelab_fakes::csi::mounts::{Device, DeviceSource};
use drivelab_fakes::director::{
    ClientConfig, DeploymentConfig, Director, DirectorConfig, DiskPoolConfig, InstanceGroupConfig,
    Job,
};
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::{Component, EventKind, History};
use drivelab_fakes::secret::Secret;
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::Store;
use rand_chacha::ChaCha20Rng;
use serde_json::json;

use super::scenario::Bosh;

/// The UAA client the driver under test logs in as.
pub(crate) const CLIENT_ID: &str = "bosh-csi";

/// The Director "process": its listener, which `director_down`/`director_up`
/// take away and give back, and what a restart rebuilds it from (its store).
pub(crate) struct DirectorServer {
    current: std::sync::RwLock<Director>,
    rebuild: (Arc<dyn Store>, Gate, Cpi, DirectorConfig),
    addr: SocketAddr,
    listener: tokio::sync::Mutex<Option<Listener>>,
}

impl DirectorServer {
    pub(crate) fn director(&self) -> Director {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The process restarts: connections break, its running jobs die (their
    /// tasks end in error, as the real Director marks them), queued tasks run
    /// again, state comes back from the store.
    pub(crate) async fn restart(&self) -> anyhow::Result<()> {
        self.down().await;
        let (store, gate, cpi, config) = self.rebuild.clone();
        // The old process dies first: two dispatchers must never share the store.
        self.director().kill();
        let fresh = Director::new(store, gate, cpi, config)
            .await
            .map_err(|e| anyhow!("the Director did not come back: {e}"))?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        self.up().await
    }

    pub(crate) async fn down(&self) {
        if let Some(l) = self.listener.lock().await.take() {
            l.stop().await;
        }
    }

    pub(crate) async fn up(&self) -> anyhow::Result<()> {
        let mut slot = self.listener.lock().await;
        if slot.is_some() {
            return Ok(());
        }
        // The old socket may linger for a moment after stop (real time).
        let mut last = None;
        for _ in 0..100 {
            match self.director().serve(self.addr).await {
                Ok(l) => {
                    *slot = Some(l);
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(anyhow!(
            "could not serve the Director on {} again: {last:?}",
            self.addr
        ))
    }
}

/// The BOSH backend of a CSI scenario: the Director (with its in-process CPI,
/// agents and UAA) and the IaaS block API, and what the driver is told of them.
pub(crate) struct BoshBackend {
    pub(crate) spec: Bosh,
    pub(crate) director: Arc<DirectorServer>,
    pub(crate) director_url: String,
    pub(crate) client_secret: Secret,
    pub(crate) block_url: String,
    pub(crate) block_secret: Secret,
    /// The block API's listener until the CBT side takes it.
    pub(crate) block_l: Option<Listener>,
}

impl BoshBackend {
    /// Stand up the Director and the block API. Draws its secrets from `rng`
    /// in a fixed order, so a seed gives the same run.
    pub(crate) async fn start(
        spec: &Bosh,
        store: &(dyn Fn(&str) -> anyhow::Result<Arc<dyn Store>> + Sync),
        gate: &(dyn Fn() -> Gate + Sync),
        rng: &mut ChaCha20Rng,
    ) -> anyhow::Result<Self> {
        let client_secret = Secret::new(crate::engine::random_token(rng, 40));
        let signing_key = Secret::new(crate::engine::random_token(rng, 48));
        let cpi = Cpi::new(store("cpi")?, gate(), {
            let mut c = CpiConfig {
                latency: spec.iaas_latency.clone(),
                ..CpiConfig::default()
            };
            // The node plugins' attach limit is the IaaS's slot count.
            if spec.max_volumes_per_node > 0 {
                c.max_disks_per_vm = spec.max_volumes_per_node as usize;
            }
            c
        });
        let config = director_config(spec, &client_secret, signing_key);
        let director_store = store("director")?;
        let rebuild = (director_store.clone(), gate(), cpi.clone(), config.clone());
        let director = Director::new(director_store, gate(), cpi, config)
            .await
            .map_err(|e| anyhow!("starting the fake Director: {e}"))?;
        let listener = director
            .serve(loopback())
            .await
            .context("serving the fake Director")?;
        let director_url = listener.url();
        let server = Arc::new(DirectorServer {
            current: std::sync::RwLock::new(director),
            rebuild,
            addr: listener.addr,
            listener: tokio::sync::Mutex::new(Some(listener)),
        });
        // The IaaS's block API the driver reads changed blocks from, with its own credential.
        let block_secret = Secret::new(crate::engine::random_token(rng, 40));
        let block_l = server
            .rebuild
            .2
            .serve_block_api(
                loopback(),
                drivelab_fakes::secret::Secret::new(block_secret.expose()),
            )
            .await
            .context("serving the IaaS block API")?;
        Ok(BoshBackend {
            spec: spec.clone(),
            director: server,
            director_url,
            client_secret,
            block_url: block_l.url(),
            block_secret,
            block_l: Some(block_l),
        })
    }

    pub(crate) fn director(&self) -> Director {
        self.director.director()
    }

    /// The instance id of the BOSH instance node `name` runs on.
    pub(crate) fn instance_of(&self, name: &str) -> anyhow::Result<String> {
        let n = self
            .spec
            .nodes
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| anyhow!("node {name} has no BOSH instance"))?;
        let (dep, index) = n
            .instance_ref()
            .ok_or_else(|| anyhow!("node {}: bad instance {}", n.name, n.instance))?;
        let group = self
            .spec
            .deployments
            .iter()
            .find(|d| d.name == dep)
            .map(|d| d.instance_group.clone())
            .unwrap_or_default();
        let want = format!("{group}/{index}");
        self.director()
            .instances()
            .iter()
            .find(|i| i.deployment == dep && i.name == want)
            .map(|i| i.id.clone())
            .ok_or_else(|| anyhow!("the Director has no instance {}", n.instance))
    }

    /// What the BOSH agent made visible on `instance_id`, as udev would show it.
    pub(crate) fn devices(&self, instance_id: &str) -> DeviceSource {
        // Through the server, not a Director handle: a handle kept here would
        // keep a restarted Director's old workers alive.
        let d = Arc::downgrade(&self.director);
        let iid = instance_id.to_string();
        Arc::new(move || {
            let Some(d) = d.upgrade() else {
                return Vec::new();
            };
            d.director()
                .agent_disks(&iid)
                .iter()
                .map(|a| Device::for_disk(&a.disk_cid))
                .collect()
        })
    }
}

/// The Director's configuration for a `bosh:` section.
pub(crate) fn director_config(
    spec: &Bosh,
    client_secret: &Secret,
    signing_key: Secret,
) -> DirectorConfig {
    let mut pools: Vec<String> = spec
        .storage_classes
        .iter()
        .map(|c| c.disk_pool.clone())
        .collect();
    pools.sort();
    pools.dedup();
    DirectorConfig {
        deployments: spec
            .deployments
            .iter()
            .map(|d| DeploymentConfig {
                name: d.name.clone(),
                instance_groups: vec![InstanceGroupConfig {
                    name: d.instance_group.clone(),
                    instances: d.instances,
                    azs: vec!["z1".into()],
                }],
            })
            .collect(),
        disk_pools: pools
            .into_iter()
            .map(|name| DiskPoolConfig {
                name,
                cloud_properties: json!({}),
            })
            .collect(),
        clients: vec![ClientConfig {
            id: CLIENT_ID.into(),
            secret: drivelab_fakes::secret::Secret::new(client_secret.expose()),
            scopes: bosh_csi::config::NARROW_SCOPES
                .iter()
                .map(|x| x.to_string())
                .collect(),
            deployments: spec.client_deployments.clone(),
        }],
        dynamic_disks_workers: spec.workers,
        per_deployment_scoping: spec.per_deployment_scoping,
        disk_jobs_take_vm_lock: spec.disk_jobs_take_vm_lock,
        disk_jobs_take_deployment_lock: spec.disk_jobs_take_deployment_lock,
        token_signing_key: signing_key,
        virtual_lanes: spec.virtual_lanes,
        ..Default::default()
    }
}

/// Run an operator's Director job (deploy, recreate, rolling update) and note how it ended.
pub(crate) async fn operator_job(director: Director, history: &History, job: Job) {
    let what = format!("{job:?}");
    let text = match director.run_job(job, "admin").await {
        Ok(t) => format!(
            "operator task {} ({}) ended {:?}{}",
            t.id,
            t.description,
            t.state,
            t.result.map(|r| format!(": {r}")).unwrap_or_default()
        ),
        Err(e) => format!("operator job {what} could not run: {e}"),
    };
    history.record(EventKind::Note {
        component: Component::Lab,
        text,
    });
}

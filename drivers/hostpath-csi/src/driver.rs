//! The driver value every service is implemented on, the Identity service,
//! how backend work is run (on a blocking thread, under the state lock), and
//! the per-path in-flight guard of the node plugin.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use bosh_csi::mounter::{HttpMounter, Mounter};
use drivelab_proto::csi::{
    identity_server::Identity, plugin_capability, GetPluginCapabilitiesRequest,
    GetPluginCapabilitiesResponse, GetPluginInfoRequest, GetPluginInfoResponse, PluginCapability,
    ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

use crate::config::{DriverConfig, Mutant};
use crate::error::DriverError;
use crate::state::{Backend, NodeRecord};
use crate::DRIVER_NAME;

/// The reference hostpath CSI driver. Cheap to clone; clones share one state.
#[derive(Clone)]
pub struct HostPathDriver {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: DriverConfig,
    pub(crate) backend: Arc<Backend>,
    pub(crate) mounter: Option<Arc<dyn Mounter>>,
    inflight: Mutex<HashSet<String>>,
}

impl HostPathDriver {
    /// Build a driver from a config: validates it, opens (creating) the state
    /// directory, clears what a crash left half done and, for a node plugin,
    /// registers the node there. Contacts no mount table yet.
    pub fn new(config: DriverConfig) -> Result<Self, DriverError> {
        let mounter: Option<Arc<dyn Mounter>> = config.mode.node().then(|| {
            Arc::new(HttpMounter::new(&config.mounter_url, config.http_timeout)) as Arc<dyn Mounter>
        });
        Self::with_parts(config, mounter)
    }

    /// Build a driver whose node side uses `mounter` (tests, other node back-ends).
    pub fn with_mounter(
        config: DriverConfig,
        mounter: Arc<dyn Mounter>,
    ) -> Result<Self, DriverError> {
        Self::with_parts(config, Some(mounter))
    }

    fn with_parts(
        config: DriverConfig,
        mounter: Option<Arc<dyn Mounter>>,
    ) -> Result<Self, DriverError> {
        config.validate().map_err(DriverError::InvalidArgument)?;
        let backend = Backend::open(&config.state_dir)?;
        if config.mode.node() {
            backend.register_node(&NodeRecord {
                node_id: config.node_id.clone(),
                max_volumes_per_node: config.max_volumes_per_node,
            })?;
        }
        for m in &config.mutants {
            tracing::warn!(
                mutant = m.name(),
                "seeded bug switched on: this is NOT the correct driver"
            );
        }
        Ok(HostPathDriver {
            inner: Arc::new(Inner {
                config,
                backend: Arc::new(backend),
                mounter,
                inflight: Mutex::new(HashSet::new()),
            }),
        })
    }

    /// The configuration the driver runs with.
    pub fn config(&self) -> &DriverConfig {
        &self.inner.config
    }

    /// The opened state directory.
    pub fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    pub(crate) fn mutant(&self, m: Mutant) -> bool {
        let on = self.inner.config.has(m);
        if on {
            tracing::warn!(mutant = m.name(), "seeded bug taken");
        }
        on
    }

    pub(crate) fn mounter(&self) -> Result<&dyn Mounter, DriverError> {
        self.inner
            .mounter
            .as_deref()
            .ok_or_else(|| DriverError::Unimplemented("this process serves no Node".into()))
    }

    /// Run backend work on a blocking thread. It runs to the end even if the
    /// call is cancelled, so a transaction is never cut between its saves.
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&HostPathDriver) -> Result<T, DriverError> + Send + 'static,
    ) -> Result<T, DriverError> {
        let d = self.clone();
        tokio::task::spawn_blocking(move || f(&d))
            .await
            .map_err(|e| DriverError::Internal(format!("backend task failed: {e}")))?
    }

    /// Claim `key` for one operation; a second claim while the first runs is ABORTED.
    pub(crate) fn claim(&self, key: &str) -> Result<InFlight, DriverError> {
        let mut set = self
            .inner
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if !set.insert(key.to_string()) {
            return Err(DriverError::Aborted(format!(
                "an operation on {key} is already in progress; retry"
            )));
        }
        Ok(InFlight {
            driver: self.clone(),
            key: key.to_string(),
        })
    }
}

/// Held while a node operation on one path runs; released on drop (also when
/// the gRPC handler is cancelled).
pub(crate) struct InFlight {
    driver: HostPathDriver,
    key: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.driver
            .inner
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

/// Log the outcome of one RPC (names and codes only; never request bodies,
/// which carry `secrets` maps) and turn it into a gRPC answer.
pub(crate) fn answer<T>(
    rpc: &str,
    subject: &str,
    r: Result<T, DriverError>,
) -> Result<Response<T>, Status> {
    match r {
        Ok(v) => {
            tracing::info!(rpc, subject, "ok");
            Ok(Response::new(v))
        }
        Err(e) => {
            tracing::info!(rpc, subject, code = ?e.code(), error = %e, "failed");
            Err(e.into())
        }
    }
}

#[tonic::async_trait]
impl Identity for HostPathDriver {
    async fn get_plugin_info(
        &self,
        _req: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _req: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::{service::Type, Service, Type as Cap};
        let capabilities = self
            .inner
            .config
            .mode
            .controller()
            .then(|| PluginCapability {
                r#type: Some(Cap::Service(Service {
                    r#type: Type::ControllerService as i32,
                })),
            })
            .into_iter()
            .collect();
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _req: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        // The state directory was opened at start; the mount table's outage
        // shows on the calls that need it (UNAVAILABLE), not here.
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

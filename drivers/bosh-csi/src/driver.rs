//! The driver value every service is implemented on, the Identity service,
//! and the per-volume in-flight guard (the CSI spec's answer to a second call
//! for a volume while one is running: ABORTED, and the CO retries).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use drivelab_proto::csi::{
    identity_server::Identity, plugin_capability, GetPluginCapabilitiesRequest,
    GetPluginCapabilitiesResponse, GetPluginInfoRequest, GetPluginInfoResponse, PluginCapability,
    ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

use crate::config::{DriverConfig, Mutant};
use crate::director::Director;
use crate::error::DriverError;
use crate::mounter::{HttpMounter, Mounter, SystemMounter};
use crate::DRIVER_NAME;

/// The reference BOSH CSI driver. Cheap to clone; clones share one state.
#[derive(Clone)]
pub struct BoshCsiDriver {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: DriverConfig,
    pub(crate) director: Option<Director>,
    pub(crate) mounter: Option<Arc<dyn Mounter>>,
    pub(crate) metadata: crate::snapshot_metadata::MetadataState,
    inflight: Mutex<HashSet<String>>,
}

impl BoshCsiDriver {
    /// Build a driver from a validated config. Contacts nothing yet, so it
    /// starts while the Director or mount table are still coming up.
    pub fn new(config: DriverConfig) -> Result<Self, String> {
        config.validate()?;
        let director = config.mode.controller().then(|| Director::new(&config));
        let mounter: Option<Arc<dyn Mounter>> = config.mode.node().then(|| {
            if config.mounter_url.is_empty() {
                Arc::new(SystemMounter) as Arc<dyn Mounter>
            } else {
                Arc::new(HttpMounter::new(&config.mounter_url, config.http_timeout))
            }
        });
        Ok(Self::with_parts(config, director, mounter))
    }

    /// Build a driver around a given mounter (tests, other node back-ends).
    pub fn with_mounter(config: DriverConfig, mounter: Arc<dyn Mounter>) -> Result<Self, String> {
        config.validate()?;
        let director = config.mode.controller().then(|| Director::new(&config));
        Ok(Self::with_parts(config, director, Some(mounter)))
    }

    fn with_parts(
        config: DriverConfig,
        director: Option<Director>,
        mounter: Option<Arc<dyn Mounter>>,
    ) -> Self {
        for m in &config.mutants {
            tracing::warn!(
                mutant = m.name(),
                "seeded bug switched on: this is NOT the correct driver"
            );
        }
        BoshCsiDriver {
            inner: Arc::new(Inner {
                metadata: crate::snapshot_metadata::MetadataState::new(config.http_timeout),
                config,
                director,
                mounter,
                inflight: Mutex::new(HashSet::new()),
            }),
        }
    }

    /// The configuration the driver runs with.
    pub fn config(&self) -> &DriverConfig {
        &self.inner.config
    }

    pub(crate) fn mutant(&self, m: Mutant) -> bool {
        let on = self.inner.config.has(m);
        if on {
            tracing::warn!(mutant = m.name(), "seeded bug taken");
        }
        on
    }

    pub(crate) fn director(&self) -> Result<&Director, DriverError> {
        self.inner
            .director
            .as_ref()
            .ok_or_else(|| DriverError::Unimplemented("this process serves no Controller".into()))
    }

    pub(crate) fn mounter(&self) -> Result<&dyn Mounter, DriverError> {
        self.inner
            .mounter
            .as_deref()
            .ok_or_else(|| DriverError::Unimplemented("this process serves no Node".into()))
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

/// Held while an operation on one volume runs; released on drop (also when
/// the gRPC handler is cancelled).
pub(crate) struct InFlight {
    driver: BoshCsiDriver,
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
impl Identity for BoshCsiDriver {
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
        let mut capabilities = Vec::new();
        if self.inner.config.mode.controller() {
            capabilities.push(PluginCapability {
                r#type: Some(plugin_capability::Type::Service(
                    plugin_capability::Service {
                        r#type: plugin_capability::service::Type::ControllerService as i32,
                    },
                )),
            });
        }
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _req: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        // Ready without asking the Director: its outage must not get the plugin
        // restarted; the calls that need it answer UNAVAILABLE instead.
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;

    #[test]
    fn claims_are_exclusive_and_released() {
        let d = BoshCsiDriver::with_mounter(
            DriverConfig {
                mode: Mode::Node,
                node_id: "i-1".into(),
                ..Default::default()
            },
            Arc::new(SystemMounter),
        )
        .unwrap();
        let a = d.claim("csi-x").unwrap();
        assert!(matches!(d.claim("csi-x"), Err(e) if e.code() == tonic::Code::Aborted));
        let _b = d.claim("csi-y").unwrap();
        drop(a);
        assert!(d.claim("csi-x").is_ok());
        assert!(d.director().is_err());
    }
}

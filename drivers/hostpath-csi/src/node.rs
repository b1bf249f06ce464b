//! The CSI Node service: stage = bind the volume's directory in the state
//! directory to the staging path; publish = bind staging → target, read-only
//! when asked. All through the lab's mount table (never the host's). Both are
//! idempotent, and a call that fails after it may have mounted undoes it.

use bosh_csi::mounter::{MountRequest, Mounter, BUSY, NOT_MOUNTED};
use drivelab_proto::csi::{
    node_server::Node, node_service_capability, NodeExpandVolumeRequest, NodeExpandVolumeResponse,
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest,
    NodeGetInfoResponse, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeServiceCapability,
    NodeStageVolumeRequest, NodeStageVolumeResponse, NodeUnpublishVolumeRequest,
    NodeUnpublishVolumeResponse, NodeUnstageVolumeRequest, NodeUnstageVolumeResponse,
};
use tonic::{Request, Response, Status};

use crate::config::{
    access_mode, check_capability, check_name, is_reader_only, is_volume_id, Mutant,
};
use crate::driver::{answer, HostPathDriver};
use crate::error::DriverError;

/// A path as mount tables print it: no trailing slash (except `/`).
fn norm(p: &str) -> &str {
    if p.len() > 1 {
        p.trim_end_matches('/')
    } else {
        p
    }
}

fn check_path(field: &str, p: &str) -> Result<(), DriverError> {
    if p.is_empty() {
        return Err(DriverError::InvalidArgument(format!(
            "`{field}` is required"
        )));
    }
    if !p.starts_with('/') || p.contains('\0') {
        return Err(DriverError::InvalidArgument(format!(
            "`{field}` = {p:?} must be an absolute path"
        )));
    }
    Ok(())
}

/// Make `want` and check the table shows it; on a failure that may have left
/// the mount in place, take it down again.
async fn mount_verified(m: &dyn Mounter, want: &MountRequest) -> Result<(), DriverError> {
    let made = match m.mount(want).await {
        Ok(()) => verify(m, want).await,
        // A definite refusal mounted nothing: nothing to undo (and the target
        // may hold someone else's mount, which must not be touched).
        Err(e) if !e.ambiguous() => return Err(e.into()),
        Err(e) => Err(e.into()),
    };
    let Err(e) = made else {
        return Ok(());
    };
    match m.unmount(&want.target).await {
        Ok(()) => Err(e),
        Err(u) if u.code() == Some(NOT_MOUNTED) => Err(e),
        Err(u) => {
            tracing::error!(target = %want.target, error = %u, "could not undo a failed mount");
            Err(DriverError::Unavailable(format!(
                "{e}; undoing the mount at {} failed too ({u}); retry",
                want.target
            )))
        }
    }
}

async fn verify(m: &dyn Mounter, want: &MountRequest) -> Result<(), DriverError> {
    if m.mounts().await?.iter().any(|e| want.matches(e)) {
        return Ok(());
    }
    Err(DriverError::Internal(format!(
        "bound {} at {} but the mount table does not show it with read_only={}",
        want.source, want.target, want.read_only
    )))
}

/// Make `want` unless the target already has it; another mount there is ALREADY_EXISTS.
async fn bind_once(
    m: &dyn Mounter,
    want: &MountRequest,
    volume_id: &str,
) -> Result<(), DriverError> {
    let there = m
        .mounts()
        .await?
        .into_iter()
        .find(|e| e.target == want.target);
    match there {
        Some(e) if want.matches(&e) => Ok(()),
        Some(e) => Err(DriverError::AlreadyExists(format!(
            "{} already has {} mounted (read_only={}); volume {volume_id} needs {} (read_only={})",
            want.target, e.source, e.read_only, want.source, want.read_only
        ))),
        None => mount_verified(m, want).await,
    }
}

/// Unmount `target` if anything is there; NotMounted counts as done.
async fn unmount_if_mounted(m: &dyn Mounter, target: &str) -> Result<(), DriverError> {
    if !m.mounts().await?.iter().any(|e| e.target == target) {
        return Ok(());
    }
    match m.unmount(target).await {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some(NOT_MOUNTED) => Ok(()),
        Err(e) if e.code() == Some(BUSY) => Err(DriverError::FailedPrecondition(format!(
            "{target} is still in use as a bind source ({e}); NodeUnpublishVolume its targets first"
        ))),
        Err(e) => Err(e.into()),
    }
}

impl HostPathDriver {
    /// The directory of volume `id` as a bind source, if the volume exists.
    async fn volume_source(&self, id: &str) -> Result<String, DriverError> {
        let dir = self.backend().volume_dir(id);
        let exists = is_volume_id(id) && tokio::fs::metadata(&dir).await.is_ok_and(|m| m.is_dir());
        if !exists {
            return Err(DriverError::NotFound(format!(
                "volume {id} does not exist (no {})",
                dir.display()
            )));
        }
        dir.to_str()
            .map(str::to_string)
            .ok_or_else(|| DriverError::Internal(format!("{} is not UTF-8", dir.display())))
    }

    async fn stage_inner(&self, req: NodeStageVolumeRequest) -> Result<(), DriverError> {
        check_name("volume_id", &req.volume_id)?;
        check_path("staging_target_path", &req.staging_target_path)?;
        let cap = check_capability(req.volume_capability.as_ref())?;
        let staging = norm(&req.staging_target_path);
        let _claim = self.claim(&format!("stage:{staging}"))?;
        let want = MountRequest {
            source: self.volume_source(&req.volume_id).await?,
            target: staging.to_string(),
            fstype: None,
            read_only: is_reader_only(access_mode(cap)),
            bind: true,
        };
        bind_once(self.mounter()?, &want, &req.volume_id).await
    }

    async fn unstage_inner(&self, req: NodeUnstageVolumeRequest) -> Result<(), DriverError> {
        check_name("volume_id", &req.volume_id)?;
        check_path("staging_target_path", &req.staging_target_path)?;
        let staging = norm(&req.staging_target_path);
        let _claim = self.claim(&format!("stage:{staging}"))?;
        unmount_if_mounted(self.mounter()?, staging).await
    }

    async fn publish_inner(&self, req: NodePublishVolumeRequest) -> Result<(), DriverError> {
        check_name("volume_id", &req.volume_id)?;
        check_path("target_path", &req.target_path)?;
        // STAGE_UNSTAGE_VOLUME is advertised, so the CO must pass the staging path.
        check_path("staging_target_path", &req.staging_target_path)?;
        let cap = check_capability(req.volume_capability.as_ref())?;
        let read_only = (req.readonly || is_reader_only(access_mode(cap)))
            && !self.mutant(Mutant::PublishIgnoresReadonly);
        let (target, staging) = (norm(&req.target_path), norm(&req.staging_target_path));
        let _claim = self.claim(&format!("publish:{target}"))?;
        let dir = self.volume_source(&req.volume_id).await?;
        let m = self.mounter()?;
        let staged = m.mounts().await?.into_iter().find(|e| e.target == staging);
        match staged {
            None => {
                return Err(DriverError::FailedPrecondition(format!(
                    "volume {} is not staged at {staging}; NodeStageVolume first",
                    req.volume_id
                )))
            }
            Some(e) if e.source != dir => {
                return Err(DriverError::FailedPrecondition(format!(
                    "{staging} holds {}, not volume {}'s directory {dir}",
                    e.source, req.volume_id
                )))
            }
            Some(_) => {}
        }
        let want = MountRequest {
            source: staging.to_string(),
            target: target.to_string(),
            fstype: None,
            read_only,
            bind: true,
        };
        bind_once(m, &want, &req.volume_id).await
    }

    async fn unpublish_inner(&self, req: NodeUnpublishVolumeRequest) -> Result<(), DriverError> {
        check_name("volume_id", &req.volume_id)?;
        check_path("target_path", &req.target_path)?;
        let target = norm(&req.target_path);
        let _claim = self.claim(&format!("publish:{target}"))?;
        let m = self.mounter()?;
        unmount_if_mounted(m, target).await?;
        bosh_csi::mounter::remove_target(m, target).await?;
        Ok(())
    }
}

#[tonic::async_trait]
impl Node for HostPathDriver {
    async fn node_stage_volume(
        &self,
        req: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = req.into_inner();
        let subject = format!("{}@{}", req.volume_id, req.staging_target_path);
        answer(
            "NodeStageVolume",
            &subject,
            self.stage_inner(req)
                .await
                .map(|()| NodeStageVolumeResponse {}),
        )
    }

    async fn node_unstage_volume(
        &self,
        req: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = req.into_inner();
        let subject = format!("{}@{}", req.volume_id, req.staging_target_path);
        answer(
            "NodeUnstageVolume",
            &subject,
            self.unstage_inner(req)
                .await
                .map(|()| NodeUnstageVolumeResponse {}),
        )
    }

    async fn node_publish_volume(
        &self,
        req: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let subject = format!("{}@{}", req.volume_id, req.target_path);
        answer(
            "NodePublishVolume",
            &subject,
            self.publish_inner(req)
                .await
                .map(|()| NodePublishVolumeResponse {}),
        )
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let subject = format!("{}@{}", req.volume_id, req.target_path);
        answer(
            "NodeUnpublishVolume",
            &subject,
            self.unpublish_inner(req)
                .await
                .map(|()| NodeUnpublishVolumeResponse {}),
        )
    }

    async fn node_get_volume_stats(
        &self,
        _req: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        Err(Status::unimplemented(
            "NodeGetVolumeStats is not served by hostpath-csi",
        ))
    }

    async fn node_expand_volume(
        &self,
        _req: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "NodeExpandVolume is not served by hostpath-csi",
        ))
    }

    async fn node_get_capabilities(
        &self,
        _req: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::{rpc::Type, Rpc, Type as Cap};
        let capabilities = [Type::StageUnstageVolume, Type::SingleNodeMultiWriter]
            .into_iter()
            .map(|t| NodeServiceCapability {
                r#type: Some(Cap::Rpc(Rpc { r#type: t as i32 })),
            })
            .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _req: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.inner.config.node_id.clone(),
            max_volumes_per_node: self.inner.config.max_volumes_per_node,
            accessible_topology: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_be_absolute() {
        assert!(check_path("p", "/var/lib/kubelet/x").is_ok());
        assert!(check_path("p", "").is_err());
        assert!(check_path("p", "relative/x").is_err());
        assert!(check_path("p", "/a\0b").is_err());
        assert_eq!(norm("/a/b/"), "/a/b");
        assert_eq!(norm("/"), "/");
    }
}

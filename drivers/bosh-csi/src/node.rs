//! The CSI Node service: stage = find the disk's device, format it if blank,
//! mount it at the staging path; publish = bind-mount staging → target,
//! read-only when asked. Both are idempotent, and a call that fails after it
//! may have mounted something unmounts it again, so a failure leaks no mount.

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
    access_mode, check_capability, check_name, fs_type, is_our_volume_id, is_reader_only, Mutant,
};
use crate::controller::CTX_DISK_CID;
use crate::driver::{answer, BoshCsiDriver};
use crate::error::DriverError;
use crate::mounter::{MountRequest, Mounter, BUSY, NOT_MOUNTED};

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

/// Make `want` and check it is there; on a failure that may have left the
/// mount in place, take it down again (unless the leak mutant is on).
async fn mount_verified(
    driver: &BoshCsiDriver,
    m: &dyn Mounter,
    want: &MountRequest,
) -> Result<(), DriverError> {
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
    if driver.mutant(Mutant::LeakMountOnFailedStage) {
        return Err(e);
    }
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
    let mounts = m.mounts().await?;
    if mounts.iter().any(|e| want.matches(e)) {
        Ok(())
    } else {
        Err(DriverError::Internal(format!(
            "mounted {} at {} but the mount table does not show it with read_only={} bind={}",
            want.source, want.target, want.read_only, want.bind
        )))
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

impl BoshCsiDriver {
    async fn stage_inner(&self, req: NodeStageVolumeRequest) -> Result<(), DriverError> {
        check_name("volume_id", &req.volume_id)?;
        check_path("staging_target_path", &req.staging_target_path)?;
        let cap = check_capability(req.volume_capability.as_ref())?;
        let cid = req
            .publish_context
            .get(CTX_DISK_CID)
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                DriverError::InvalidArgument(format!(
                    "publish_context has no `{CTX_DISK_CID}`: ControllerPublishVolume's answer must be passed on"
                ))
            })?;
        let staging = norm(&req.staging_target_path);
        let read_only =
            is_reader_only(access_mode(cap)) && !self.mutant(Mutant::WritableReadonlyPublish);
        let fstype = fs_type(cap);
        let _claim = self.claim(&format!("stage:{staging}"))?;
        let m = self.mounter()?;

        let device = m.device_for(cid).await?.ok_or_else(|| {
            DriverError::NotFound(format!(
                "no device for disk {cid} on this node (is volume {} attached here?)",
                req.volume_id
            ))
        })?;
        let want = MountRequest {
            source: device.path.clone(),
            target: staging.to_string(),
            fstype: Some(fstype.to_string()),
            read_only,
            bind: false,
        };
        if let Some(there) = m.mounts().await?.into_iter().find(|e| e.target == staging) {
            return if want.matches(&there) {
                Ok(())
            } else {
                Err(DriverError::AlreadyExists(format!(
                    "{staging} already has {} mounted (read_only={}); volume {} needs {} (read_only={read_only})",
                    there.source, there.read_only, req.volume_id, want.source
                )))
            };
        }
        match m.fs_type(&device.path).await? {
            None => m.format(&device.path, fstype).await?,
            Some(f) if f == fstype => {}
            Some(f) => {
                return Err(DriverError::FailedPrecondition(format!(
                    "device {} of volume {} holds {f}, not the {fstype} the capability asks for",
                    device.path, req.volume_id
                )))
            }
        }
        mount_verified(self, m, &want).await
    }

    async fn unstage_inner(&self, req: NodeUnstageVolumeRequest) -> Result<(), DriverError> {
        check_name("volume_id", &req.volume_id)?;
        check_path("staging_target_path", &req.staging_target_path)?;
        let _claim = self.claim(&format!("stage:{}", req.staging_target_path))?;
        unmount_if_mounted(self.mounter()?, norm(&req.staging_target_path)).await
    }

    async fn publish_inner(&self, req: NodePublishVolumeRequest) -> Result<(), DriverError> {
        check_name("volume_id", &req.volume_id)?;
        check_path("target_path", &req.target_path)?;
        // STAGE_UNSTAGE_VOLUME is advertised, so the CO must pass the staging path.
        check_path("staging_target_path", &req.staging_target_path)?;
        let cap = check_capability(req.volume_capability.as_ref())?;
        let read_only = (req.readonly || is_reader_only(access_mode(cap)))
            && !self.mutant(Mutant::WritableReadonlyPublish);
        let target = norm(&req.target_path);
        let staging = norm(&req.staging_target_path);
        let _claim = self.claim(&format!("publish:{target}"))?;
        let m = self.mounter()?;

        if !is_our_volume_id(&req.volume_id) {
            // No disk of ours has this name: the volume does not exist.
            return Err(DriverError::NotFound(format!(
                "volume {} does not exist",
                req.volume_id
            )));
        }
        let mounts = m.mounts().await?;
        if !mounts.iter().any(|e| e.target == staging) {
            return Err(DriverError::FailedPrecondition(format!(
                "volume {} is not staged at {staging}; NodeStageVolume first",
                req.volume_id
            )));
        }
        let want = MountRequest {
            source: staging.to_string(),
            target: target.to_string(),
            fstype: None,
            read_only,
            bind: true,
        };
        if let Some(there) = mounts.iter().find(|e| e.target == target) {
            return if want.matches(there) {
                Ok(())
            } else {
                Err(DriverError::AlreadyExists(format!(
                    "{target} already has {} mounted (read_only={}, bind={}); asked {staging} read_only={read_only}",
                    there.source, there.read_only, there.bind
                )))
            };
        }
        mount_verified(self, m, &want).await
    }

    async fn unpublish_inner(&self, req: NodeUnpublishVolumeRequest) -> Result<(), DriverError> {
        check_name("volume_id", &req.volume_id)?;
        check_path("target_path", &req.target_path)?;
        let _claim = self.claim(&format!("publish:{}", req.target_path))?;
        let m = self.mounter()?;
        let target = norm(&req.target_path);
        unmount_if_mounted(m, target).await?;
        if self.mutant(Mutant::UnpublishLeavesTarget) {
            // Seeded bug: unmounted, but the directory the publish made stays.
            return Ok(());
        }
        crate::mounter::remove_target(m, target).await?;
        Ok(())
    }
}

#[tonic::async_trait]
impl Node for BoshCsiDriver {
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
            "NodeGetVolumeStats is not served by bosh-csi",
        ))
    }

    async fn node_expand_volume(
        &self,
        _req: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "NodeExpandVolume is not served by bosh-csi",
        ))
    }

    async fn node_get_capabilities(
        &self,
        _req: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::{rpc::Type, Rpc, Type as Cap};
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![NodeServiceCapability {
                r#type: Some(Cap::Rpc(Rpc {
                    r#type: Type::StageUnstageVolume as i32,
                })),
            }],
        }))
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
    }
}

//! The CSI Controller service on the Director's dynamic-disks API. Every call
//! reads the Director's disk list first and acts only on the difference, which
//! is what makes a retried call (after a crash, a lost reply, a timeout) safe:
//! the CSI name fixes the disk name, so a retry finds what the first try made.

use drivelab_proto::csi::{
    controller_server::Controller, controller_service_capability,
    validate_volume_capabilities_response::Confirmed, ControllerExpandVolumeRequest,
    ControllerExpandVolumeResponse, ControllerGetCapabilitiesRequest,
    ControllerGetCapabilitiesResponse, ControllerGetVolumeRequest, ControllerGetVolumeResponse,
    ControllerPublishVolumeRequest, ControllerPublishVolumeResponse, ControllerServiceCapability,
    ControllerUnpublishVolumeRequest, ControllerUnpublishVolumeResponse, CreateSnapshotRequest,
    CreateSnapshotResponse, CreateVolumeRequest, CreateVolumeResponse, DeleteSnapshotRequest,
    DeleteSnapshotResponse, DeleteVolumeRequest, DeleteVolumeResponse, GetCapacityRequest,
    GetCapacityResponse, ListSnapshotsRequest, ListSnapshotsResponse, ListVolumesRequest,
    ListVolumesResponse, ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse,
    Volume,
};
use tonic::{Request, Response, Status};

use crate::config::{
    access_mode, check_capabilities, check_capability, check_name, disk_name_for, is_our_volume_id,
    parse_class_params, size_fits, size_mib_for, unsupported_capability, ClassParams, Mutant, MIB,
};
use crate::director::{CreateDisk, DynamicDisk};
use crate::driver::{answer, BoshCsiDriver};
use crate::error::DriverError;

/// publish_context key carrying the IaaS disk id to the node plugin.
pub const CTX_DISK_CID: &str = "disk_cid";

fn volume_of(d: &DynamicDisk) -> Volume {
    Volume {
        capacity_bytes: d.size.saturating_mul(MIB),
        volume_id: d.name.clone(),
        ..Default::default()
    }
}

/// Why an existing disk does not match what this CreateVolume asks, if it does not.
fn mismatch(d: &DynamicDisk, want: &ClassParams) -> Option<String> {
    // The Director may omit a field; only a value it states can disagree.
    let differs = |have: &Option<String>, want: &str| have.as_deref().is_some_and(|h| h != want);
    if differs(&d.disk_pool_name, &want.disk_pool_name) {
        return Some(format!(
            "disk pool {:?}, asked {:?}",
            d.disk_pool_name.as_deref().unwrap_or(""),
            want.disk_pool_name
        ));
    }
    if differs(&d.deployment, &want.deployment_name) {
        return Some(format!(
            "deployment {:?}, asked {:?}",
            d.deployment.as_deref().unwrap_or(""),
            want.deployment_name
        ));
    }
    if let Some(az) = &want.az {
        if differs(&d.availability_zone, az) {
            return Some(format!(
                "az {:?}, asked {az:?}",
                d.availability_zone.as_deref().unwrap_or("")
            ));
        }
    }
    None
}

impl BoshCsiDriver {
    async fn create_volume_inner(
        &self,
        req: CreateVolumeRequest,
    ) -> Result<CreateVolumeResponse, DriverError> {
        check_name("name", &req.name)?;
        check_capabilities(&req.volume_capabilities)?;
        let params = parse_class_params(&req.parameters)?;
        if req.volume_content_source.is_some() {
            return Err(DriverError::InvalidArgument(
                "volume_content_source is not supported: this driver neither clones nor restores snapshots".into(),
            ));
        }
        let range = req.capacity_range.as_ref();
        let size_mib = size_mib_for(range)?;
        let base = disk_name_for(&req.name);
        let _claim = self.claim(&base)?;
        let director = self.director()?;

        let mut disk_name = base.clone();
        if self.mutant(Mutant::CreateNotIdempotent) {
            // Seeded bug: no lookup; a "fresh" name per call.
            let n = director
                .list()
                .await?
                .iter()
                .filter(|d| d.name.starts_with(&base))
                .count();
            if n > 0 {
                disk_name = format!("{base}-{n}");
            }
        } else if let Some(d) = director.find(&base).await? {
            return self.existing_volume(&d, &req, &params);
        }

        let create = CreateDisk {
            disk_name: disk_name.clone(),
            disk_pool_name: params.disk_pool_name.clone(),
            deployment_name: params.deployment_name.clone(),
            az: params.az.clone(),
            disk_size: size_mib,
            csi_name: req.name.clone(),
        };
        match director.create(&create).await {
            Ok(cid) => {
                tracing::info!(name = %req.name, disk = %disk_name, disk_cid = %cid, size_mib, "created BOSH disk");
                Ok(CreateVolumeResponse {
                    volume: Some(Volume {
                        capacity_bytes: size_mib * MIB,
                        volume_id: disk_name,
                        ..Default::default()
                    }),
                })
            }
            Err(e) => {
                // Someone (an earlier try whose task ran late) may have made it meanwhile.
                if !self.inner.config.has(Mutant::CreateNotIdempotent) {
                    if let Ok(Some(d)) = director.find(&disk_name).await {
                        return self.existing_volume(&d, &req, &params);
                    }
                }
                Err(e)
            }
        }
    }

    /// The answer for a name whose disk exists: the same volume if compatible.
    fn existing_volume(
        &self,
        d: &DynamicDisk,
        req: &CreateVolumeRequest,
        params: &ClassParams,
    ) -> Result<CreateVolumeResponse, DriverError> {
        if let Some(why) = mismatch(d, params) {
            return Err(DriverError::AlreadyExists(format!(
                "volume {:?} exists as disk {} with {why}",
                req.name, d.name
            )));
        }
        if !size_fits(d.size, req.capacity_range.as_ref())
            && !self.mutant(Mutant::IgnoreIncompatibleSize)
        {
            let (r, l) = req
                .capacity_range
                .as_ref()
                .map_or((0, 0), |c| (c.required_bytes, c.limit_bytes));
            return Err(DriverError::AlreadyExists(format!(
                "volume {:?} exists as disk {} of {} MiB, which does not fit capacity_range [{r}, {l}] bytes",
                req.name, d.name, d.size
            )));
        }
        Ok(CreateVolumeResponse {
            volume: Some(volume_of(d)),
        })
    }

    async fn delete_volume_inner(&self, req: DeleteVolumeRequest) -> Result<(), DriverError> {
        let id = req.volume_id.as_str();
        check_name("volume_id", id)?;
        if !is_our_volume_id(id) {
            // Not a name this driver makes: none of our volumes can be behind it,
            // and a foreign disk must never be deleted through us.
            tracing::warn!(
                volume_id = id,
                "DeleteVolume of an id this driver never issued; nothing to do"
            );
            return Ok(());
        }
        let _claim = self.claim(id)?;
        let director = self.director()?;
        let Some(d) = director.find(id).await? else {
            return Ok(());
        };
        if let Some(i) = d.attached_instance() {
            return Err(DriverError::FailedPrecondition(format!(
                "volume {id} is still attached to instance {i}; ControllerUnpublishVolume first"
            )));
        }
        director.delete(id).await
    }

    async fn controller_publish_inner(
        &self,
        req: ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse, DriverError> {
        let id = req.volume_id.as_str();
        check_name("volume_id", id)?;
        if req.node_id.is_empty() {
            return Err(DriverError::InvalidArgument("`node_id` is required".into()));
        }
        let cap = check_capability(req.volume_capability.as_ref())?;
        if !is_our_volume_id(id) {
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        }
        let node = req.node_id.as_str();
        let _claim = self.claim(id)?;
        let director = self.director()?;
        let d = director
            .find(id)
            .await?
            .ok_or_else(|| DriverError::NotFound(format!("volume {id} does not exist")))?;
        let ctx = |d: &DynamicDisk| ControllerPublishVolumeResponse {
            publish_context: [(CTX_DISK_CID.to_string(), d.disk_cid.clone())].into(),
        };
        if d.attached_to(node) {
            return Ok(ctx(&d));
        }
        let limit = self.inner.config.max_volumes_per_node;
        if limit > 0 && !self.mutant(Mutant::WrongCodeAtAttachLimit) {
            let attached = director
                .list()
                .await?
                .iter()
                .filter(|x| x.attached_to(node))
                .count();
            if attached as i64 >= limit {
                return Err(DriverError::ResourceExhausted(format!(
                    "node {node} already has {attached} volumes attached, its limit (max_volumes_per_node {limit})"
                )));
            }
        }
        if let Some(other) = d.attached_instance() {
            if !self.mutant(Mutant::PublishStealsAttachment) {
                return Err(DriverError::FailedPrecondition(format!(
                    "volume {id} is published to node {other}; a {} volume is published on one node at a time",
                    access_mode(cap).as_str_name()
                )));
            }
            director.detach(id).await?;
        }
        match director.attach(id, node).await {
            Ok(()) => Ok(ctx(&d)),
            Err(e @ DriverError::NotFound(_)) => Err(e),
            Err(e) => {
                // The task may have failed because of a race we can name exactly.
                match director.find(id).await {
                    Ok(Some(now)) if now.attached_to(node) => Ok(ctx(&now)),
                    Ok(Some(now)) if now.attached_instance().is_some() => {
                        Err(DriverError::FailedPrecondition(format!(
                            "volume {id} was published to node {} meanwhile",
                            now.attached_instance().unwrap_or("")
                        )))
                    }
                    _ => Err(e),
                }
            }
        }
    }

    async fn controller_unpublish_inner(
        &self,
        req: ControllerUnpublishVolumeRequest,
    ) -> Result<(), DriverError> {
        let id = req.volume_id.as_str();
        check_name("volume_id", id)?;
        let missing = |why: String| {
            if self.mutant(Mutant::UnpublishMissingIsError) {
                Err(DriverError::NotFound(why))
            } else {
                Ok(())
            }
        };
        if !is_our_volume_id(id) {
            return missing(format!("volume {id} does not exist"));
        }
        let _claim = self.claim(id)?;
        let director = self.director()?;
        let Some(d) = director.find(id).await? else {
            return missing(format!("volume {id} does not exist"));
        };
        match d.attached_instance() {
            None => missing(format!("volume {id} is not attached")),
            // Attached to another node: unpublished from this one already; the
            // other node's attachment is not ours to undo.
            Some(other) if !req.node_id.is_empty() && !d.attached_to(&req.node_id) => missing(
                format!("volume {id} is attached to {other}, not {}", req.node_id),
            ),
            Some(_) => director.detach(id).await,
        }
    }

    async fn validate_inner(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, DriverError> {
        let id = req.volume_id.as_str();
        check_name("volume_id", id)?;
        let unconfirmed = |message: String| ValidateVolumeCapabilitiesResponse {
            confirmed: None,
            message,
        };
        if req.volume_capabilities.is_empty() && !self.mutant(Mutant::MissingFieldAccepted) {
            return Err(DriverError::InvalidArgument(
                "`volume_capabilities` is required".into(),
            ));
        }
        let found = if is_our_volume_id(id) {
            self.director()?.find(id).await?
        } else {
            None
        };
        let Some(d) = found else {
            if self.mutant(Mutant::NotFoundAsOk) {
                return Ok(unconfirmed(format!("volume {id} does not exist")));
            }
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        };
        if let Some(why) = req
            .volume_capabilities
            .iter()
            .find_map(unsupported_capability)
        {
            return Ok(unconfirmed(why));
        }
        if !req.parameters.is_empty() {
            match parse_class_params(&req.parameters) {
                Err(e) => return Ok(unconfirmed(e.to_string())),
                Ok(p) => {
                    if let Some(why) = mismatch(&d, &p) {
                        return Ok(unconfirmed(format!("volume {id} has {why}")));
                    }
                }
            }
        }
        Ok(ValidateVolumeCapabilitiesResponse {
            confirmed: Some(Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
            }),
            message: String::new(),
        })
    }
}

fn unimplemented(rpc: &str) -> Status {
    Status::unimplemented(format!("{rpc} is not served by bosh-csi"))
}

#[tonic::async_trait]
impl Controller for BoshCsiDriver {
    async fn create_volume(
        &self,
        req: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = req.into_inner();
        let name = req.name.clone();
        answer("CreateVolume", &name, self.create_volume_inner(req).await)
    }

    async fn delete_volume(
        &self,
        req: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        answer(
            "DeleteVolume",
            &id,
            self.delete_volume_inner(req)
                .await
                .map(|()| DeleteVolumeResponse {}),
        )
    }

    async fn controller_publish_volume(
        &self,
        req: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let subject = format!("{}@{}", req.volume_id, req.node_id);
        answer(
            "ControllerPublishVolume",
            &subject,
            self.controller_publish_inner(req).await,
        )
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let subject = format!("{}@{}", req.volume_id, req.node_id);
        answer(
            "ControllerUnpublishVolume",
            &subject,
            self.controller_unpublish_inner(req)
                .await
                .map(|()| ControllerUnpublishVolumeResponse {}),
        )
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        answer(
            "ValidateVolumeCapabilities",
            &id,
            self.validate_inner(req).await,
        )
    }

    async fn list_volumes(
        &self,
        _req: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        Err(unimplemented("ListVolumes"))
    }

    async fn get_capacity(
        &self,
        _req: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        Err(unimplemented("GetCapacity"))
    }

    async fn controller_get_capabilities(
        &self,
        _req: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::{rpc::Type, Rpc, Type as Cap};
        let caps = [
            Type::CreateDeleteVolume,
            Type::PublishUnpublishVolume,
            Type::CreateDeleteSnapshot,
            Type::ListSnapshots,
        ]
        .into_iter()
        .map(|t| ControllerServiceCapability {
            r#type: Some(Cap::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: caps,
        }))
    }

    async fn create_snapshot(
        &self,
        req: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let req = req.into_inner();
        let subject = req.name.clone();
        answer(
            "CreateSnapshot",
            &subject,
            self.create_snapshot_inner(req).await,
        )
    }

    async fn delete_snapshot(
        &self,
        req: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let req = req.into_inner();
        let subject = req.snapshot_id.clone();
        answer(
            "DeleteSnapshot",
            &subject,
            self.delete_snapshot_inner(req)
                .await
                .map(|()| DeleteSnapshotResponse {}),
        )
    }

    async fn list_snapshots(
        &self,
        req: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        answer(
            "ListSnapshots",
            "",
            self.list_snapshots_inner(req.into_inner()).await,
        )
    }

    async fn controller_expand_volume(
        &self,
        _req: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        Err(unimplemented("ControllerExpandVolume"))
    }

    async fn controller_get_volume(
        &self,
        _req: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        Err(unimplemented("ControllerGetVolume"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatch_names_the_difference() {
        let d = DynamicDisk {
            name: "csi-x".into(),
            deployment: Some("k8s".into()),
            disk_pool_name: Some("fast".into()),
            availability_zone: Some("z1".into()),
            ..Default::default()
        };
        let want = |pool: &str, dep: &str, az: Option<&str>| ClassParams {
            disk_pool_name: pool.into(),
            deployment_name: dep.into(),
            az: az.map(str::to_string),
        };
        assert_eq!(mismatch(&d, &want("fast", "k8s", None)), None);
        assert_eq!(mismatch(&d, &want("fast", "k8s", Some("z1"))), None);
        assert!(mismatch(&d, &want("slow", "k8s", None))
            .unwrap()
            .contains("disk pool"));
        assert!(mismatch(&d, &want("fast", "other", None))
            .unwrap()
            .contains("deployment"));
        assert!(mismatch(&d, &want("fast", "k8s", Some("z2")))
            .unwrap()
            .contains("az"));
        // A Director that does not list a field cannot contradict it.
        let sparse = DynamicDisk {
            name: "csi-x".into(),
            ..Default::default()
        };
        assert_eq!(mismatch(&sparse, &want("slow", "other", Some("z9"))), None);
    }
}

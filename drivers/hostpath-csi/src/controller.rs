//! The CSI Controller service on the state directory. Every call is one
//! transaction under the directory's lock: it reads the records, acts on the
//! difference and saves the intent before it touches data, so a retry after
//! a crash, a lost reply or a timeout finds what the first try did.

use std::time::{SystemTime, UNIX_EPOCH};

use drivelab_proto::csi::volume_capability::access_mode::Mode as AccessMode;
use drivelab_proto::csi::{
    controller_server::Controller, controller_service_capability, list_volumes_response,
    validate_volume_capabilities_response::Confirmed, volume_content_source,
    ControllerExpandVolumeRequest, ControllerExpandVolumeResponse,
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerGetVolumeRequest, ControllerGetVolumeResponse, ControllerPublishVolumeRequest,
    ControllerPublishVolumeResponse, ControllerServiceCapability, ControllerUnpublishVolumeRequest,
    ControllerUnpublishVolumeResponse, CreateSnapshotRequest, CreateSnapshotResponse,
    CreateVolumeRequest, CreateVolumeResponse, DeleteSnapshotRequest, DeleteSnapshotResponse,
    DeleteVolumeRequest, DeleteVolumeResponse, GetCapacityRequest, GetCapacityResponse,
    ListSnapshotsRequest, ListSnapshotsResponse, ListVolumesRequest, ListVolumesResponse, Snapshot,
    ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse, Volume,
    VolumeContentSource,
};
use tonic::{Request, Response, Status};

use crate::config::{
    access_mode, capacity_fits, capacity_for, check_capabilities, check_capability, check_name,
    check_params, is_single_node, is_snapshot_id, is_volume_id, snapshot_id_for,
    unsupported_capability, volume_id_for, Mutant,
};
use crate::driver::{answer, HostPathDriver};
use crate::error::DriverError;
use crate::state::{remove_tree, Attachment, ContentSource, SnapshotRecord, Txn, VolumeRecord};

/// The content source a CreateVolume asks for.
fn wanted_source(req: &CreateVolumeRequest) -> Result<Option<ContentSource>, DriverError> {
    use volume_content_source::Type;
    let Some(src) = &req.volume_content_source else {
        return Ok(None);
    };
    let (kind, id, source) = match &src.r#type {
        Some(Type::Snapshot(s)) => (
            "snapshot_id",
            &s.snapshot_id,
            ContentSource::Snapshot {
                id: s.snapshot_id.clone(),
            },
        ),
        Some(Type::Volume(v)) => (
            "volume_id",
            &v.volume_id,
            ContentSource::Volume {
                id: v.volume_id.clone(),
            },
        ),
        None => {
            return Err(DriverError::InvalidArgument(
                "volume_content_source names neither a snapshot nor a volume".into(),
            ))
        }
    };
    check_name(&format!("volume_content_source.{kind}"), id)?;
    Ok(Some(source))
}

fn source_message(s: &Option<ContentSource>) -> VolumeContentSource {
    use volume_content_source::{SnapshotSource, Type, VolumeSource};
    VolumeContentSource {
        r#type: s.as_ref().map(|s| match s {
            ContentSource::Snapshot { id } => Type::Snapshot(SnapshotSource {
                snapshot_id: id.clone(),
            }),
            ContentSource::Volume { id } => Type::Volume(VolumeSource {
                volume_id: id.clone(),
            }),
        }),
    }
}

fn volume_of(v: &VolumeRecord) -> Volume {
    Volume {
        capacity_bytes: v.capacity_bytes,
        volume_id: v.id.clone(),
        content_source: v.source.is_some().then(|| source_message(&v.source)),
        ..Default::default()
    }
}

fn snapshot_of(s: &SnapshotRecord) -> Snapshot {
    Snapshot {
        size_bytes: s.size_bytes,
        snapshot_id: s.id.clone(),
        source_volume_id: s.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: s.created_secs,
            nanos: s.created_nanos,
        }),
        ready_to_use: s.ready,
        group_snapshot_id: String::new(),
    }
}

/// Why an existing volume does not match what this CreateVolume asks, if it does not.
fn mismatch(
    v: &VolumeRecord,
    req: &CreateVolumeRequest,
    source: &Option<ContentSource>,
) -> Option<String> {
    if !capacity_fits(v.capacity_bytes, req.capacity_range.as_ref()) {
        let (r, l) = req
            .capacity_range
            .as_ref()
            .map_or((0, 0), |c| (c.required_bytes, c.limit_bytes));
        return Some(format!(
            "{} bytes, which does not fit capacity_range [{r}, {l}]",
            v.capacity_bytes
        ));
    }
    if v.source != *source {
        return Some(format!("content source {:?}, asked {source:?}", v.source));
    }
    None
}

/// The ready data directory a content source copies, and its size.
fn source_data(
    txn: &Txn<'_>,
    source: &ContentSource,
) -> Result<(std::path::PathBuf, i64), DriverError> {
    match source {
        ContentSource::Snapshot { id } => txn
            .state
            .snapshot(id)
            .filter(|s| s.ready)
            .map(|s| (txn.backend.snapshot_dir(&s.id), s.size_bytes))
            .ok_or_else(|| DriverError::NotFound(format!("source snapshot {id} does not exist"))),
        ContentSource::Volume { id } => txn
            .state
            .volume(id)
            .filter(|v| v.ready)
            .map(|v| (txn.backend.volume_dir(&v.id), v.capacity_bytes))
            .ok_or_else(|| DriverError::NotFound(format!("source volume {id} does not exist"))),
    }
}

/// The id the retry-makes-second-dir mutant uses: the name's id, or with the
/// next free generation number once a directory of that name exists.
fn fresh_id(txn: &Txn<'_>, base: &str) -> String {
    if !txn.backend.volume_dir(base).exists() {
        return base.to_string();
    }
    let n = (1..)
        .find(|n| !txn.backend.volume_dir(&format!("{base}-{n}")).exists())
        .unwrap_or(1);
    format!("{base}-{n}")
}

fn now() -> (i64, i32) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (
        i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        i32::try_from(d.subsec_nanos()).unwrap_or(0),
    )
}

/// `starting_token` → index into a listing of `len` entries (ABORTED when stale, per spec).
fn page_start(token: &str, max_entries: i32, len: usize) -> Result<usize, DriverError> {
    if max_entries < 0 {
        return Err(DriverError::InvalidArgument(
            "max_entries must not be negative".into(),
        ));
    }
    if token.is_empty() {
        return Ok(0);
    }
    token
        .parse::<usize>()
        .ok()
        .filter(|i| *i <= len)
        .ok_or_else(|| {
            DriverError::Aborted(format!(
                "starting_token {token:?} is not a position in this listing"
            ))
        })
}

fn page_end(start: usize, max_entries: i32, len: usize) -> (usize, String) {
    let end = match usize::try_from(max_entries) {
        Ok(0) | Err(_) => len,
        Ok(m) => len.min(start + m),
    };
    (
        end,
        if end < len {
            end.to_string()
        } else {
            String::new()
        },
    )
}

impl HostPathDriver {
    fn create_volume_sync(
        &self,
        req: &CreateVolumeRequest,
    ) -> Result<CreateVolumeResponse, DriverError> {
        check_name("name", &req.name)?;
        check_capabilities(&req.volume_capabilities)?;
        check_params(&req.parameters)?;
        let source = wanted_source(req)?;
        capacity_for(req.capacity_range.as_ref(), 0)?;
        self.backend().transaction(|txn| {
            let base = volume_id_for(&req.name);
            let existing = if self.mutant(Mutant::RetryMakesSecondDir) {
                // Seeded bug: no lookup by name; the record is replaced and
                // the directory of the first try is left behind.
                None
            } else {
                txn.state.volumes.get(&req.name).cloned()
            };
            if let Some(v) = &existing {
                if let Some(why) = mismatch(v, req, &source) {
                    return Err(DriverError::AlreadyExists(format!("volume {:?} exists as {} with {why}", req.name, v.id)));
                }
                if v.ready {
                    return Ok(CreateVolumeResponse { volume: Some(volume_of(v)) });
                }
            }
            let from = match source.as_ref().map(|s| (s, source_data(txn, s))) {
                // Seeded bug: a missing clone source makes an empty volume.
                Some((ContentSource::Volume { .. }, Err(DriverError::NotFound(_))))
                    if self.mutant(Mutant::CloneMissingSourceEmpty) => None,
                other => other.map(|(_, r)| r).transpose()?,
            };
            let mut rec = match existing {
                // A create a crash interrupted: finish it as first recorded.
                Some(v) => v,
                None => {
                    let floor = from.as_ref().map_or(0, |(_, size)| *size);
                    let rec = VolumeRecord {
                        id: if self.inner.config.has(Mutant::RetryMakesSecondDir) { fresh_id(txn, &base) } else { base },
                        name: req.name.clone(),
                        capacity_bytes: capacity_for(req.capacity_range.as_ref(), floor)?,
                        source: source.clone(),
                        ready: false,
                        attachments: Default::default(),
                    };
                    // The intent first: a crash from here on is finished by the retry.
                    txn.state.volumes.insert(req.name.clone(), rec.clone());
                    txn.save()?;
                    rec
                }
            };
            let dir = txn.backend.volume_dir(&rec.id);
            txn.backend.populate(&dir, from.as_ref().map(|(p, _)| p.as_path()))?;
            rec.ready = true;
            txn.state.volumes.insert(req.name.clone(), rec.clone());
            txn.save()?;
            tracing::info!(name = %req.name, volume = %rec.id, dir = %dir.display(), bytes = rec.capacity_bytes, "created volume directory");
            let mut volume = volume_of(&rec);
            if self.mutant(Mutant::RestoreIgnoresSource) {
                // Seeded bug: the answer forgets where the data came from.
                volume.content_source = None;
            }
            Ok(CreateVolumeResponse { volume: Some(volume) })
        })
    }

    fn delete_volume_sync(&self, id: &str) -> Result<(), DriverError> {
        check_name("volume_id", id)?;
        if !is_volume_id(id) {
            // Not an id this driver issues: nothing of ours is behind it.
            return Ok(());
        }
        self.backend().transaction(|txn| {
            let Some(v) = txn.state.volume(id).cloned() else {
                return Ok(());
            };
            if !v.attachments.is_empty() {
                let nodes: Vec<&str> = v.attachments.keys().map(String::as_str).collect();
                return Err(DriverError::FailedPrecondition(format!(
                    "volume {id} is still published to node(s) {}; ControllerUnpublishVolume first",
                    nodes.join(", ")
                )));
            }
            let dir = txn.backend.volume_dir(id);
            // Data first, record last: a crash in between is finished by the retry.
            if !self.mutant(Mutant::DeleteLeavesData) {
                remove_tree(&dir)
                    .map_err(|e| DriverError::io(format!("removing {}", dir.display()), e))?;
            }
            txn.state.volumes.remove(&v.name);
            txn.save()
        })
    }

    fn publish_sync(
        &self,
        req: &ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse, DriverError> {
        let id = req.volume_id.as_str();
        check_name("volume_id", id)?;
        if req.node_id.is_empty() {
            return Err(DriverError::InvalidArgument("`node_id` is required".into()));
        }
        let mode = access_mode(check_capability(req.volume_capability.as_ref())?);
        if !is_volume_id(id) {
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        }
        let node = req.node_id.as_str();
        let ok = ControllerPublishVolumeResponse::default;
        self.backend().transaction(|txn| {
            let v = txn.state.volume(id).filter(|v| v.ready).cloned()
                .ok_or_else(|| DriverError::NotFound(format!("volume {id} does not exist")))?;
            let limit = txn.backend.node(node)?.ok_or_else(|| {
                DriverError::NotFound(format!("node {node} does not exist: no hostpath-csi node plugin registered it in {}", txn.backend.root().display()))
            })?.max_volumes_per_node;
            if let Some(a) = v.attachments.get(node) {
                return if a.readonly == req.readonly {
                    Ok(ok())
                } else {
                    Err(DriverError::AlreadyExists(format!(
                        "volume {id} is published to node {node} with readonly={}, asked readonly={}",
                        a.readonly, req.readonly
                    )))
                };
            }
            // Single-node: this request's mode, or the mode any other node has it with.
            let single = |a: &Attachment| {
                AccessMode::from_str_name(&a.access_mode).is_some_and(is_single_node)
            };
            if let Some((other, _)) = v.attachments.iter().find(|(_, a)| is_single_node(mode) || single(a)) {
                if !self.mutant(Mutant::AttachSteals) {
                    return Err(DriverError::FailedPrecondition(format!(
                        "volume {id} is published to node {other}; a single-node volume is published on one node at a time"
                    )));
                }
                // Seeded bug: take it from the other node(s).
                if let Some(v) = txn.state.volume_mut(id) {
                    v.attachments.clear();
                }
            } else if mode == AccessMode::MultiNodeSingleWriter && !req.readonly {
                if let Some((w, _)) = v.attachments.iter().find(|(_, a)| !a.readonly) {
                    return Err(DriverError::FailedPrecondition(format!(
                        "volume {id} already has its one writer on node {w} (MULTI_NODE_SINGLE_WRITER)"
                    )));
                }
            }
            if limit > 0 && txn.state.attached_to(node) as i64 >= limit {
                return Err(DriverError::ResourceExhausted(format!(
                    "node {node} already has its maximum of {limit} volumes"
                )));
            }
            let a = Attachment { readonly: req.readonly, access_mode: mode.as_str_name().to_string() };
            if let Some(v) = txn.state.volume_mut(id) {
                v.attachments.insert(node.to_string(), a);
            }
            txn.save()?;
            Ok(ok())
        })
    }

    fn unpublish_sync(&self, req: &ControllerUnpublishVolumeRequest) -> Result<(), DriverError> {
        let id = req.volume_id.as_str();
        check_name("volume_id", id)?;
        if !is_volume_id(id) {
            return Ok(());
        }
        self.backend().transaction(|txn| {
            // Unknown volume, node or attachment: unpublished already (spec: OK).
            let Some(v) = txn.state.volume_mut(id) else {
                return Ok(());
            };
            let before = v.attachments.len();
            if req.node_id.is_empty() {
                v.attachments.clear();
            } else {
                v.attachments.remove(&req.node_id);
            }
            if v.attachments.len() != before {
                txn.save()?;
            }
            Ok(())
        })
    }

    fn validate_sync(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, DriverError> {
        let id = req.volume_id.as_str();
        check_name("volume_id", id)?;
        if req.volume_capabilities.is_empty() {
            return Err(DriverError::InvalidArgument(
                "`volume_capabilities` is required".into(),
            ));
        }
        let exists = is_volume_id(id) && self.backend().read()?.volume(id).is_some_and(|v| v.ready);
        if !exists {
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        }
        let why = req
            .volume_capabilities
            .iter()
            .find_map(unsupported_capability)
            .or_else(|| check_params(&req.parameters).err().map(|e| e.to_string()));
        if let Some(message) = why {
            return Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            });
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

    fn list_volumes_sync(
        &self,
        req: &ListVolumesRequest,
    ) -> Result<ListVolumesResponse, DriverError> {
        let st = self.backend().read()?;
        let mut vols: Vec<&VolumeRecord> = st.volumes.values().filter(|v| v.ready).collect();
        vols.sort_by(|a, b| a.id.cmp(&b.id));
        let start = page_start(&req.starting_token, req.max_entries, vols.len())?;
        let (end, next_token) = page_end(start, req.max_entries, vols.len());
        let entries = vols[start..end]
            .iter()
            .map(|v| list_volumes_response::Entry {
                volume: Some(volume_of(v)),
                status: Some(list_volumes_response::VolumeStatus {
                    published_node_ids: v.attachments.keys().cloned().collect(),
                    volume_condition: None,
                }),
            })
            .collect();
        Ok(ListVolumesResponse {
            entries,
            next_token,
        })
    }

    fn create_snapshot_sync(
        &self,
        req: &CreateSnapshotRequest,
    ) -> Result<CreateSnapshotResponse, DriverError> {
        check_name("name", &req.name)?;
        check_name("source_volume_id", &req.source_volume_id)?;
        check_params(&req.parameters)?;
        let src = req.source_volume_id.as_str();
        self.backend().transaction(|txn| {
            let existing = txn.state.snapshots.get(&req.name).cloned();
            if let Some(s) = &existing {
                if s.source_volume_id != src {
                    return Err(DriverError::AlreadyExists(format!(
                        "snapshot {:?} exists as {} of volume {}, asked of volume {src}",
                        req.name, s.id, s.source_volume_id
                    )));
                }
                if s.ready {
                    return Ok(CreateSnapshotResponse { snapshot: Some(snapshot_of(s)) });
                }
            }
            let v = txn.state.volume(src).filter(|v| v.ready).cloned()
                .ok_or_else(|| DriverError::NotFound(format!("source volume {src} does not exist")))?;
            let mut rec = match existing {
                Some(s) => s,
                None => {
                    let (created_secs, created_nanos) = now();
                    let rec = SnapshotRecord {
                        id: snapshot_id_for(&req.name),
                        name: req.name.clone(),
                        source_volume_id: src.to_string(),
                        size_bytes: v.capacity_bytes,
                        created_secs,
                        created_nanos,
                        ready: false,
                    };
                    txn.state.snapshots.insert(req.name.clone(), rec.clone());
                    txn.save()?;
                    rec
                }
            };
            let dir = txn.backend.snapshot_dir(&rec.id);
            txn.backend.populate(&dir, Some(&txn.backend.volume_dir(src)))?;
            rec.ready = true;
            txn.state.snapshots.insert(req.name.clone(), rec.clone());
            txn.save()?;
            tracing::info!(name = %req.name, snapshot = %rec.id, volume = src, "copied volume into snapshot");
            Ok(CreateSnapshotResponse { snapshot: Some(snapshot_of(&rec)) })
        })
    }

    fn delete_snapshot_sync(&self, id: &str) -> Result<(), DriverError> {
        check_name("snapshot_id", id)?;
        if !is_snapshot_id(id) {
            return Ok(());
        }
        self.backend().transaction(|txn| {
            let Some(s) = txn.state.snapshot(id).cloned() else {
                return Ok(());
            };
            let dir = txn.backend.snapshot_dir(id);
            remove_tree(&dir)
                .map_err(|e| DriverError::io(format!("removing {}", dir.display()), e))?;
            txn.state.snapshots.remove(&s.name);
            txn.save()
        })
    }

    fn list_snapshots_sync(
        &self,
        req: &ListSnapshotsRequest,
    ) -> Result<ListSnapshotsResponse, DriverError> {
        let st = self.backend().read()?;
        let mut snaps: Vec<&SnapshotRecord> = st
            .snapshots
            .values()
            .filter(|s| s.ready)
            .filter(|s| req.snapshot_id.is_empty() || s.id == req.snapshot_id)
            .filter(|s| {
                req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id
            })
            .collect();
        snaps.sort_by(|a, b| a.id.cmp(&b.id));
        let start = page_start(&req.starting_token, req.max_entries, snaps.len())?;
        let (end, next_token) = page_end(start, req.max_entries, snaps.len());
        let entries = snaps[start..end]
            .iter()
            .map(|s| drivelab_proto::csi::list_snapshots_response::Entry {
                snapshot: Some(snapshot_of(s)),
            })
            .collect();
        Ok(ListSnapshotsResponse {
            entries,
            next_token,
        })
    }
}

fn unimplemented(rpc: &str) -> Status {
    Status::unimplemented(format!("{rpc} is not served by hostpath-csi"))
}

#[tonic::async_trait]
impl Controller for HostPathDriver {
    async fn create_volume(
        &self,
        req: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = req.into_inner();
        let name = req.name.clone();
        answer(
            "CreateVolume",
            &name,
            self.blocking(move |d| d.create_volume_sync(&req)).await,
        )
    }

    async fn delete_volume(
        &self,
        req: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let id = req.into_inner().volume_id;
        let subject = id.clone();
        let r = self.blocking(move |d| d.delete_volume_sync(&id)).await;
        answer(
            "DeleteVolume",
            &subject,
            r.map(|()| DeleteVolumeResponse {}),
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
            self.blocking(move |d| d.publish_sync(&req)).await,
        )
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let subject = format!("{}@{}", req.volume_id, req.node_id);
        let r = self.blocking(move |d| d.unpublish_sync(&req)).await;
        answer(
            "ControllerUnpublishVolume",
            &subject,
            r.map(|()| ControllerUnpublishVolumeResponse {}),
        )
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = req.into_inner();
        let subject = req.volume_id.clone();
        answer(
            "ValidateVolumeCapabilities",
            &subject,
            self.blocking(move |d| d.validate_sync(req)).await,
        )
    }

    async fn list_volumes(
        &self,
        req: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = req.into_inner();
        answer(
            "ListVolumes",
            "",
            self.blocking(move |d| d.list_volumes_sync(&req)).await,
        )
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
        let capabilities = [
            Type::CreateDeleteVolume,
            Type::PublishUnpublishVolume,
            Type::ListVolumes,
            Type::ListVolumesPublishedNodes,
            Type::CreateDeleteSnapshot,
            Type::ListSnapshots,
            Type::CloneVolume,
            Type::SingleNodeMultiWriter,
        ]
        .into_iter()
        .chain(
            self.mutant(Mutant::AdvertisedUnimplemented)
                .then_some(Type::GetCapacity),
        )
        .map(|t| ControllerServiceCapability {
            r#type: Some(Cap::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
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
            self.blocking(move |d| d.create_snapshot_sync(&req)).await,
        )
    }

    async fn delete_snapshot(
        &self,
        req: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let id = req.into_inner().snapshot_id;
        let subject = id.clone();
        let r = self.blocking(move |d| d.delete_snapshot_sync(&id)).await;
        answer(
            "DeleteSnapshot",
            &subject,
            r.map(|()| DeleteSnapshotResponse {}),
        )
    }

    async fn list_snapshots(
        &self,
        req: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let req = req.into_inner();
        answer(
            "ListSnapshots",
            "",
            self.blocking(move |d| d.list_snapshots_sync(&req)).await,
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
    fn pages() {
        assert_eq!(page_start("", 0, 3).unwrap(), 0);
        assert_eq!(page_start("2", 0, 3).unwrap(), 2);
        assert_eq!(
            page_start("4", 0, 3).unwrap_err().code(),
            tonic::Code::Aborted
        );
        assert_eq!(
            page_start("x", 0, 3).unwrap_err().code(),
            tonic::Code::Aborted
        );
        assert_eq!(
            page_start("", -1, 3).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(page_end(0, 2, 3), (2, "2".to_string()));
        assert_eq!(page_end(2, 2, 3), (3, String::new()));
        assert_eq!(page_end(0, 0, 3), (3, String::new()));
    }
}

//! CSI snapshots over the Director's per-disk snapshot endpoints (BOSH's own
//! snapshot API, adapted from per-instance to per-dynamic-disk): the snapshot
//! id is the IaaS snapshot cid; the CSI name is kept in the snapshot's
//! metadata (`csi_snapshot_name`), which is how a retried CreateSnapshot finds
//! the snapshot its first try made.

use drivelab_proto::csi::{
    list_snapshots_response, CreateSnapshotRequest, CreateSnapshotResponse, DeleteSnapshotRequest,
    ListSnapshotsRequest, ListSnapshotsResponse, Snapshot,
};
use serde_json::json;

use crate::director::DiskSnapshot;
use crate::driver::BoshCsiDriver;
use crate::error::DriverError;

/// The metadata key holding the CSI snapshot name.
pub const NAME_KEY: &str = "csi_snapshot_name";

fn to_csi(s: &DiskSnapshot) -> Snapshot {
    Snapshot {
        size_bytes: i64::try_from(s.size.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX),
        snapshot_id: s.snapshot_cid.clone(),
        source_volume_id: s.disk_name.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: i64::try_from(s.created_at).unwrap_or(0),
            nanos: 0,
        }),
        // The IaaS snapshot is point-in-time and usable once the task is done.
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}

fn name_of(s: &DiskSnapshot) -> Option<&str> {
    s.metadata.get(NAME_KEY).and_then(|v| v.as_str())
}

impl BoshCsiDriver {
    pub(crate) async fn create_snapshot_inner(
        &self,
        req: CreateSnapshotRequest,
    ) -> Result<CreateSnapshotResponse, DriverError> {
        if req.name.is_empty() {
            return Err(DriverError::InvalidArgument("name is required".into()));
        }
        if req.source_volume_id.is_empty() {
            return Err(DriverError::InvalidArgument(
                "source_volume_id is required".into(),
            ));
        }
        let _guard = self.claim(&format!("snapshot/{}", req.name))?;
        let dir = self.director()?;
        if let Some(s) = dir
            .snapshots()
            .await?
            .into_iter()
            .find(|s| name_of(s) == Some(req.name.as_str()))
        {
            if s.disk_name != req.source_volume_id {
                return Err(DriverError::AlreadyExists(format!(
                    "snapshot name {:?} is taken by a snapshot of volume {}",
                    req.name, s.disk_name
                )));
            }
            return Ok(CreateSnapshotResponse {
                snapshot: Some(to_csi(&s)),
            });
        }
        if dir.find(&req.source_volume_id).await?.is_none() {
            return Err(DriverError::NotFound(format!(
                "source volume {} does not exist",
                req.source_volume_id
            )));
        }
        let cid = dir
            .snapshot(&req.source_volume_id, json!({ NAME_KEY: req.name }))
            .await?;
        let s = dir
            .snapshots()
            .await?
            .into_iter()
            .find(|s| s.snapshot_cid == cid)
            .ok_or_else(|| {
                DriverError::Internal(format!("snapshot {cid} was taken but is not listed"))
            })?;
        Ok(CreateSnapshotResponse {
            snapshot: Some(to_csi(&s)),
        })
    }

    pub(crate) async fn delete_snapshot_inner(
        &self,
        req: DeleteSnapshotRequest,
    ) -> Result<(), DriverError> {
        if req.snapshot_id.is_empty() {
            return Err(DriverError::InvalidArgument(
                "snapshot_id is required".into(),
            ));
        }
        let _guard = self.claim(&format!("snapshot-id/{}", req.snapshot_id))?;
        // The Director answers OK for an unknown cid: deleting twice is fine.
        self.director()?.delete_snapshot(&req.snapshot_id).await
    }

    pub(crate) async fn list_snapshots_inner(
        &self,
        req: ListSnapshotsRequest,
    ) -> Result<ListSnapshotsResponse, DriverError> {
        if req.max_entries < 0 {
            return Err(DriverError::InvalidArgument(
                "max_entries must not be negative".into(),
            ));
        }
        let mut all: Vec<DiskSnapshot> = self
            .director()?
            .snapshots()
            .await?
            .into_iter()
            .filter(|s| req.snapshot_id.is_empty() || s.snapshot_id_is(&req.snapshot_id))
            .filter(|s| req.source_volume_id.is_empty() || s.disk_name == req.source_volume_id)
            .collect();
        all.sort_by(|a, b| a.snapshot_cid.cmp(&b.snapshot_cid));
        let start: usize = if req.starting_token.is_empty() {
            0
        } else {
            req.starting_token
                .parse()
                .ok()
                .filter(|n| *n <= all.len())
                .ok_or_else(|| {
                    DriverError::Aborted(format!(
                        "starting_token {:?} is not valid",
                        req.starting_token
                    ))
                })?
        };
        let take = if req.max_entries == 0 || self.mutant(crate::config::Mutant::PagingIgnored) {
            all.len()
        } else {
            req.max_entries as usize
        };
        let end = start.saturating_add(take).min(all.len());
        let entries = all[start..end]
            .iter()
            .map(|s| list_snapshots_response::Entry {
                snapshot: Some(to_csi(s)),
            })
            .collect();
        Ok(ListSnapshotsResponse {
            entries,
            next_token: if end < all.len() {
                end.to_string()
            } else {
                String::new()
            },
        })
    }
}

impl DiskSnapshot {
    fn snapshot_id_is(&self, id: &str) -> bool {
        self.snapshot_cid == id
    }
}

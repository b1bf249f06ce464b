//! The CSI sidecars' retry rules, per RPC, in one table: which driver answers
//! leave an object requeued, and which errors the sidecar takes as "final" (the
//! driver surely did nothing) rather than "maybe still in progress". The fake
//! sidecars and the lab's `converges` check both read it.
//!
//! What the real sidecars do (kubernetes-csi, current releases):
//! - external-provisioner, CreateVolume / DeleteVolume: `checkError` in
//!   pkg/controller/controller.go sorts CreateVolume errors into
//!   ProvisioningInBackground (CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE,
//!   ABORTED), ProvisioningReschedule (RESOURCE_EXHAUSTED with topology and a
//!   selected node) and ProvisioningFinished (every other code). "Finished"
//!   only drops the claim from claimsInProgress: sig-storage-lib-external-provisioner's
//!   `syncClaim` still returns the error and `processNextClaimWorkItem`
//!   requeues it with `AddRateLimited`, for ever, because
//!   cmd/csi-provisioner/csi-provisioner.go sets `FailedProvisionThreshold(0)`
//!   and `FailedDeleteThreshold(0)`. `csiProvisioner.Delete` returns every
//!   DeleteVolume error unchanged (no NOT_FOUND special case).
//! - external-attacher, ControllerPublish / ControllerUnpublish:
//!   `SyncNewOrUpdatedVolumeAttachment` in pkg/controller/csi_handler.go calls
//!   `AddRateLimited` on any `syncAttach` / `syncDetach` error; `isFinalError`
//!   in pkg/attacher/attacher.go (not final: CANCELLED, DEADLINE_EXCEEDED,
//!   UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED) only says whether the volume is
//!   surely detached.
//! - external-snapshotter (v8), CreateSnapshot / DeleteSnapshot: `syncContent`,
//!   `createSnapshot` and `deleteCSISnapshot` in
//!   pkg/sidecar-controller/snapshot_controller.go requeue the content on any
//!   error ("On error, the content is always requeued"); `isCSIFinalError`
//!   (same not-final set as the attacher) only decides whether the
//!   `volumesnapshot-being-created` annotation may go.
//! - kubelet, node calls: `isFinalError` in pkg/volume/csi/csi_client.go (same
//!   set) marks a mount uncertain; the operation is retried with back-off.
//!
//! So no driver error ends an operation: an object whose call keeps failing,
//! with INVALID_ARGUMENT as with anything else, is retried for ever.

use tonic::Code;

use super::{
    Exchange, CONTROLLER_PUBLISH_VOLUME, CONTROLLER_UNPUBLISH_VOLUME, CREATE_SNAPSHOT,
    CREATE_VOLUME, DELETE_SNAPSHOT, DELETE_VOLUME,
};
use crate::ops::Op;

/// Which component's rule applies to an RPC.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Sidecar {
    /// external-provisioner (CreateVolume, DeleteVolume).
    Provisioner,
    /// external-attacher (ControllerPublishVolume, ControllerUnpublishVolume).
    Attacher,
    /// external-snapshotter (CreateSnapshot, DeleteSnapshot).
    Snapshotter,
    /// kubelet (the node calls).
    Kubelet,
}

impl Sidecar {
    /// The component that sends `rpc`.
    pub fn of(rpc: Op) -> Sidecar {
        match rpc {
            r if r == CREATE_VOLUME || r == DELETE_VOLUME => Sidecar::Provisioner,
            r if r == CONTROLLER_PUBLISH_VOLUME || r == CONTROLLER_UNPUBLISH_VOLUME => {
                Sidecar::Attacher
            }
            r if r == CREATE_SNAPSHOT || r == DELETE_SNAPSHOT => Sidecar::Snapshotter,
            _ => Sidecar::Kubelet,
        }
    }

    /// Where the rule is read from, for messages.
    pub fn source(self) -> &'static str {
        match self {
            Sidecar::Provisioner => {
                "external-provisioner (FailedProvisionThreshold(0), FailedDeleteThreshold(0))"
            }
            Sidecar::Attacher => {
                "external-attacher (csi_handler.go SyncNewOrUpdatedVolumeAttachment)"
            }
            Sidecar::Snapshotter => "external-snapshotter (snapshot_controller.go syncContent)",
            Sidecar::Kubelet => "kubelet (volume operations retried with back-off)",
        }
    }
}

/// Whether a driver answer `code` to `rpc` leaves the object requeued: every
/// error does, for every sidecar (module doc); only OK settles it.
pub fn requeues(rpc: Op, code: Code) -> bool {
    // The same for all four components today (module doc); a sidecar whose
    // rule differed would get its arm here, keyed by `Sidecar::of(rpc)`.
    let _rpc = rpc;
    code != Code::Ok
}

/// Whether an error `code` to `rpc` may leave the operation still running in
/// the driver (the sidecar's "not final"): CANCELLED, DEADLINE_EXCEEDED,
/// UNAVAILABLE, ABORTED always; RESOURCE_EXHAUSTED everywhere but
/// CreateVolume, which external-provisioner's `checkError` takes as final
/// (out of space, or reschedule).
pub fn may_be_in_progress(rpc: Op, code: Code) -> bool {
    match code {
        Code::Cancelled | Code::DeadlineExceeded | Code::Unavailable | Code::Aborted => true,
        Code::ResourceExhausted => rpc != CREATE_VOLUME,
        _ => false,
    }
}

impl Exchange {
    /// [`requeues`] for this exchange.
    pub fn requeues(&self) -> bool {
        requeues(self.request.op(), self.reply.code())
    }

    /// [`may_be_in_progress`] for this exchange (false when it succeeded).
    pub fn may_be_in_progress(&self) -> bool {
        may_be_in_progress(self.request.op(), self.reply.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::{NODE_PUBLISH_VOLUME, NODE_STAGE_VOLUME};

    const SIDECAR_RPCS: [Op; 8] = [
        CREATE_VOLUME,
        DELETE_VOLUME,
        CONTROLLER_PUBLISH_VOLUME,
        CONTROLLER_UNPUBLISH_VOLUME,
        CREATE_SNAPSHOT,
        DELETE_SNAPSHOT,
        NODE_STAGE_VOLUME,
        NODE_PUBLISH_VOLUME,
    ];

    #[test]
    fn every_error_of_every_sidecar_rpc_is_retried() {
        for rpc in SIDECAR_RPCS {
            assert!(!requeues(rpc, Code::Ok), "{rpc}");
            for code in [
                Code::InvalidArgument,
                Code::NotFound,
                Code::AlreadyExists,
                Code::FailedPrecondition,
                Code::ResourceExhausted,
                Code::Unavailable,
                Code::Internal,
            ] {
                assert!(requeues(rpc, code), "{rpc} {code:?} must be retried");
            }
        }
    }

    #[test]
    fn resource_exhausted_is_final_only_for_create_volume() {
        assert!(!may_be_in_progress(CREATE_VOLUME, Code::ResourceExhausted));
        assert!(may_be_in_progress(CREATE_VOLUME, Code::Aborted));
        assert!(may_be_in_progress(CREATE_SNAPSHOT, Code::ResourceExhausted));
        assert!(may_be_in_progress(
            CONTROLLER_PUBLISH_VOLUME,
            Code::DeadlineExceeded
        ));
        for rpc in SIDECAR_RPCS {
            assert!(!may_be_in_progress(rpc, Code::InvalidArgument), "{rpc}");
        }
    }
}

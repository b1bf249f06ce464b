//! Generated gRPC types for the protocols drivelab speaks on its Unix sockets.
//!
//! `cosi` is COSI v1alpha1 as the v0.2.x provisioner sidecar uses it
//! (package `cosi.v1alpha1`); see `proto/cosi.proto` for what was checked.
//! `csi` is CSI spec v1.10 (package `csi.v1`): Identity, Controller, Node and
//! SnapshotMetadata; see `proto/csi.proto` for what it omits.

/// COSI v1alpha1: Identity and Provisioner services and their messages.
pub mod cosi {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("cosi.v1alpha1");
}

/// CSI v1 (spec v1.10): Identity, Controller, Node and SnapshotMetadata services.
pub mod csi {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("csi.v1");
}

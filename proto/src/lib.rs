//! Generated gRPC types for the protocols drivelab speaks on its Unix sockets.
//!
//! `cosi` is COSI v1alpha1 as the v0.2.x provisioner sidecar uses it
//! (package `cosi.v1alpha1`); see `proto/cosi.proto` for what was checked.

/// COSI v1alpha1: Identity and Provisioner services and their messages.
pub mod cosi {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("cosi.v1alpha1");
}

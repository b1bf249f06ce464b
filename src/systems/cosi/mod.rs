//! COSI: the object-storage system — the S3 server with its admin API, the
//! Kubernetes API with the COSI resources, the COSI sidecar and the driver
//! under test; its checks and its ownership snapshot.

pub mod checks;
mod fakes;
mod lab;
pub mod serve;
pub mod snapshot;
pub mod steps;

pub(crate) use lab::run;

/// Namespace and name of the admin credentials Secret the lab creates.
pub const ADMIN_SECRET_NAMESPACE: &str = "drivelab-system";
/// Name of the admin credentials Secret.
pub const ADMIN_SECRET_NAME: &str = "s3-admin";
/// Namespace the reference driver keeps its checkpoints in.
pub const DRIVER_STATE_NAMESPACE: &str = "cosi-s3-system";
/// A bucket the lab owns, which no grant may reach (least-privilege probe target).
pub const CANARY_BUCKET: &str = "drivelab-canary";

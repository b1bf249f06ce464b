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
/// The driver pod's service account (in [`DRIVER_STATE_NAMESPACE`]), which its token names.
pub const DRIVER_ACCOUNT: &str = "cosi-driver";
/// A bucket the lab owns, which no grant may reach (least-privilege probe target).
pub const CANARY_BUCKET: &str = "drivelab-canary";

/// The BucketAccessClass parameter that asks for an access mode. COSI
/// v1alpha1 has no access-mode field (v1alpha2 adds `accessMode: ReadWrite |
/// ReadOnly | WriteOnly` per bucket of a BucketAccess), so drivers read it from
/// the class's opaque parameters; we take v1alpha2's spelling as the key and
/// values (`accessMode: ReadOnly`), which the reference cosi-s3 reads. Other
/// drivers express it differently (Ceph's takes a whole `bucketPolicy`
/// document): a scenario for them passes their parameter too.
pub const ACCESS_MODE_PARAM: &str = "accessMode";

/// The mode a class's parameters ask for (`ReadWrite` when unset), or why
/// the value is not one the lab can judge.
pub fn requested_mode(
    params: &std::collections::BTreeMap<String, String>,
) -> Result<checks::GrantedMode, String> {
    match params.get(ACCESS_MODE_PARAM).map(|v| v.trim()) {
        None | Some("") => Ok(checks::GrantedMode::ReadWrite),
        Some(v) if v.eq_ignore_ascii_case("readwrite") => Ok(checks::GrantedMode::ReadWrite),
        Some(v) if v.eq_ignore_ascii_case("readonly") => Ok(checks::GrantedMode::ReadOnly),
        Some(v) => Err(format!(
            "`{ACCESS_MODE_PARAM}: {v}` is not an access mode the lab can judge; use ReadWrite or ReadOnly"
        )),
    }
}

//! The driver's error type and its mapping to gRPC status codes. The code is
//! what the COSI sidecar acts on (AlreadyExists is never retried into success),
//! so each variant is chosen for what the caller should do next.

use tonic::{Code, Status};

/// Everything a driver call can fail with, already classified for COSI.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The request or class parameters are wrong; fix them, retrying will not help.
    #[error("{0}")]
    InvalidArgument(String),
    /// Same name, different request; or a backend object that is not ours.
    #[error("{0}")]
    AlreadyExists(String),
    /// The backend is in a state that forbids the call (not ours, not empty, ...).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Something the request names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request asks for something this driver does not do.
    #[error("{0}")]
    Unimplemented(String),
    /// Backend or Kubernetes unreachable, timed out or overloaded; retry later.
    #[error("{0}")]
    Unavailable(String),
    /// Lost a compare-and-swap race too often; retry.
    #[error("{0}")]
    Aborted(String),
    /// A bug or an answer we cannot interpret.
    #[error("{0}")]
    Internal(String),
}

impl From<DriverError> for Status {
    fn from(e: DriverError) -> Status {
        let code = match &e {
            DriverError::InvalidArgument(_) => Code::InvalidArgument,
            DriverError::AlreadyExists(_) => Code::AlreadyExists,
            DriverError::FailedPrecondition(_) => Code::FailedPrecondition,
            DriverError::NotFound(_) => Code::NotFound,
            DriverError::Unimplemented(_) => Code::Unimplemented,
            DriverError::Unavailable(_) => Code::Unavailable,
            DriverError::Aborted(_) => Code::Aborted,
            DriverError::Internal(_) => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}

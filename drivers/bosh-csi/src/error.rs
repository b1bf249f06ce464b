//! The driver's error type and its mapping to gRPC codes. The code is what the
//! CSI sidecars act on: UNAVAILABLE, ABORTED and DEADLINE_EXCEEDED mean "try
//! again" (the operation may still be in flight), the rest are verdicts.

use tonic::{Code, Status};

/// Everything a CSI call can fail with, already classified.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The request is malformed or asks for something this driver cannot serve.
    #[error("{0}")]
    InvalidArgument(String),
    /// The volume, node or device named does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Same name, incompatible request; or a path already used differently.
    #[error("{0}")]
    AlreadyExists(String),
    /// The state forbids the call (published elsewhere, still in use, not staged).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The capacity range cannot be met.
    #[error("{0}")]
    OutOfRange(String),
    /// The node already has as many volumes attached as its limit allows.
    #[error("{0}")]
    ResourceExhausted(String),
    /// An operation on the same volume is already in flight, or a Director task
    /// failed or was cancelled; retry.
    #[error("{0}")]
    Aborted(String),
    /// The Director, UAA or mount table is unreachable or overloaded; retry.
    #[error("{0}")]
    Unavailable(String),
    /// A Director task did not finish in time; it may still finish, retry.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The Director refused our token for this operation (scope, deployment).
    #[error("{0}")]
    PermissionDenied(String),
    /// UAA refused our client credentials, or the Director kept refusing fresh tokens.
    #[error("{0}")]
    Unauthenticated(String),
    /// Not served by this driver.
    #[error("{0}")]
    Unimplemented(String),
    /// A bug, or an answer we cannot interpret.
    #[error("{0}")]
    Internal(String),
}

impl DriverError {
    /// The gRPC code this error is answered with.
    pub fn code(&self) -> Code {
        match self {
            DriverError::InvalidArgument(_) => Code::InvalidArgument,
            DriverError::NotFound(_) => Code::NotFound,
            DriverError::AlreadyExists(_) => Code::AlreadyExists,
            DriverError::FailedPrecondition(_) => Code::FailedPrecondition,
            DriverError::OutOfRange(_) => Code::OutOfRange,
            DriverError::ResourceExhausted(_) => Code::ResourceExhausted,
            DriverError::Aborted(_) => Code::Aborted,
            DriverError::Unavailable(_) => Code::Unavailable,
            DriverError::DeadlineExceeded(_) => Code::DeadlineExceeded,
            DriverError::PermissionDenied(_) => Code::PermissionDenied,
            DriverError::Unauthenticated(_) => Code::Unauthenticated,
            DriverError::Unimplemented(_) => Code::Unimplemented,
            DriverError::Internal(_) => Code::Internal,
        }
    }
}

impl From<DriverError> for Status {
    fn from(e: DriverError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

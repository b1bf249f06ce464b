//! The driver's error type and its mapping to gRPC codes. The code is what the
//! CSI sidecars act on: UNAVAILABLE and ABORTED mean "try again", the rest
//! are verdicts. Mount-table failures are classified here too.

use bosh_csi::mounter::{MountError, ALREADY_MOUNTED, BUSY, NO_SUCH_SOURCE, READ_ONLY_SOURCE};
use tonic::{Code, Status};

/// Everything a CSI call can fail with, already classified.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The request is malformed or asks for something this driver cannot serve.
    #[error("{0}")]
    InvalidArgument(String),
    /// The volume, snapshot or node named does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Same name, incompatible request; or a path already used differently.
    #[error("{0}")]
    AlreadyExists(String),
    /// The state forbids the call (published elsewhere, still attached, not staged).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The capacity range cannot be met.
    #[error("{0}")]
    OutOfRange(String),
    /// The node already has as many volumes as it reported it can take.
    #[error("{0}")]
    ResourceExhausted(String),
    /// An operation on the same path is already in flight; retry.
    #[error("{0}")]
    Aborted(String),
    /// The mount table is unreachable or overloaded; retry.
    #[error("{0}")]
    Unavailable(String),
    /// Not served by this driver or this process.
    #[error("{0}")]
    Unimplemented(String),
    /// A bug, a filesystem failure in the backend, or an answer we cannot interpret.
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
            DriverError::Unimplemented(_) => Code::Unimplemented,
            DriverError::Internal(_) => Code::Internal,
        }
    }

    /// An INTERNAL error for a failed filesystem operation in the backend.
    pub fn io(what: impl std::fmt::Display, e: std::io::Error) -> DriverError {
        DriverError::Internal(format!("{what}: {e}"))
    }
}

impl From<DriverError> for Status {
    fn from(e: DriverError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

impl From<MountError> for DriverError {
    fn from(e: MountError) -> DriverError {
        let msg = e.to_string();
        match &e {
            MountError::NoAnswer { .. } => DriverError::Unavailable(format!("{msg}; retry")),
            MountError::Refused { status, code, .. } => match code.as_str() {
                NO_SUCH_SOURCE => DriverError::NotFound(msg),
                ALREADY_MOUNTED => DriverError::AlreadyExists(msg),
                BUSY | READ_ONLY_SOURCE => DriverError::FailedPrecondition(msg),
                _ if (*status >= 500 && *status != 501) || *status == 429 => {
                    DriverError::Unavailable(format!("{msg}; retry"))
                }
                _ => DriverError::Internal(msg),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_errors_map_to_csi_codes() {
        let refused = |status, code: &str| MountError::Refused {
            op: "mount",
            status,
            code: code.into(),
            message: String::new(),
        };
        let code = |e: MountError| DriverError::from(e).code();
        assert_eq!(code(refused(409, ALREADY_MOUNTED)), Code::AlreadyExists);
        assert_eq!(code(refused(404, NO_SUCH_SOURCE)), Code::NotFound);
        assert_eq!(code(refused(409, BUSY)), Code::FailedPrecondition);
        assert_eq!(
            code(refused(400, READ_ONLY_SOURCE)),
            Code::FailedPrecondition
        );
        assert_eq!(code(refused(503, "")), Code::Unavailable);
        // The table does not model what was asked: retrying will not help.
        assert_eq!(code(refused(501, "NotImplemented")), Code::Internal);
        let lost = MountError::NoAnswer {
            op: "mount",
            detail: "reset".into(),
        };
        assert_eq!(code(lost), Code::Unavailable);
        assert_eq!(
            DriverError::ResourceExhausted(String::new()).code(),
            Code::ResourceExhausted
        );
    }
}

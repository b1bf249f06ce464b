//! The backend profile: which real server (RustFS or MinIO) the admin API
//! follows where the two differ — key rules, removing an attached policy,
//! which admin prefixes exist. Each rule cites the server's own source.

use super::errors::ApiError;

/// The real server whose admin API the fake follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// RustFS (rustfs/rustfs): serves `/rustfs/admin/v3` (plain JSON) and
    /// `/minio/admin/v3` (madmin-encrypted, for MinIO clients). The default:
    /// the reference driver calls `/rustfs/admin/v3`.
    #[default]
    Rustfs,
    /// MinIO (minio/minio): serves `/minio/admin/v3` only.
    Minio,
}

impl Backend {
    /// Every profile, by name.
    pub const ALL: [Backend; 2] = [Backend::Rustfs, Backend::Minio];

    /// Its name in scenario and config files.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Rustfs => "rustfs",
            Backend::Minio => "minio",
        }
    }

    /// The profile named `s` (`rustfs` or `minio`).
    pub fn parse(s: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == s)
    }

    /// Whether this server routes an admin prefix at all (MinIO has no
    /// `/rustfs/admin`: there the path is an ordinary S3 request).
    pub(crate) fn serves_prefix(self, prefix: &str) -> bool {
        match self {
            Backend::Rustfs => true,
            Backend::Minio => prefix == "/minio/admin/",
        }
    }

    /// add-user's access-key rule. Both: 3+ bytes, no reserved `=` or `,`
    /// (MinIO `cmd/iam.go` `IAMSys.CreateUser` with `auth.IsAccessKeyValid`,
    /// `auth.ContainsReservedChars`; RustFS `crates/iam/src/sys.rs`
    /// `IamSys::create_user` with `is_access_key_valid`, `contains_reserved_chars`).
    /// RustFS's handler (`rustfs/src/admin/handlers/user.rs` `AddUser::call`)
    /// refuses whitespace first (InvalidArgument), and its
    /// `map_add_user_create_error` answers every other create error as
    /// InternalError; MinIO's refuses nothing more, with its own 400 codes.
    pub(crate) fn check_user_access_key(self, ak: &str) -> Result<(), ApiError> {
        if self == Backend::Rustfs && ak.chars().any(char::is_whitespace) {
            return Err(ApiError::new(
                400,
                "InvalidArgument",
                "access key contains spaces",
            ));
        }
        if ak.len() < 3 {
            return Err(match self {
                Backend::Minio => ApiError::new(
                    400,
                    "XMinioAdminInvalidAccessKey",
                    "access key length should be at least 3",
                ),
                Backend::Rustfs => create_failed("invalid access key length"),
            });
        }
        if ak.contains(['=', ',']) {
            return Err(match self {
                Backend::Minio => ApiError::new(
                    400,
                    "XMinioAdminInvalidAccessKey",
                    "access key contains reserved characters '=' or ','",
                ),
                Backend::Rustfs => create_failed("access key contains reserved characters =,"),
            });
        }
        Ok(())
    }

    /// add-user's secret-key rule: 8 or more bytes, no upper bound, on both
    /// (MinIO `internal/auth/credentials.go` `IsSecretKeyValid`; RustFS
    /// `crates/policy/src/auth` `is_secret_key_valid`). MinIO's 40-byte
    /// `secretKeyMaxLen` only bounds generated and service-account
    /// credentials (`CreateNewCredentialsWithMetadata`), never add-user.
    /// RustFS refuses an empty one in its handler ("secret key is required").
    pub(crate) fn check_user_secret_key(self, sk: &str) -> Result<(), ApiError> {
        if sk.len() >= 8 {
            return Ok(());
        }
        Err(match self {
            Backend::Minio => ApiError::new(
                400,
                "XMinioAdminInvalidSecretKey",
                "secret key length should be at least 8",
            ),
            Backend::Rustfs if sk.is_empty() => {
                ApiError::new(400, "InvalidArgument", "secret key is required")
            }
            Backend::Rustfs => create_failed("invalid secret key length"),
        })
    }

    /// add-user with the root credential's access key.
    pub(crate) fn root_user_refused(self) -> ApiError {
        match self {
            Backend::Minio => ApiError::admin_invalid_argument(
                "Adding a user with the same access key as the root credential is not allowed",
            ),
            Backend::Rustfs => ApiError::new(
                400,
                "InvalidArgument",
                "cannot create a user with the system access key",
            ),
        }
    }

    /// A user that does not exist, as the handler at `site` answers it.
    /// MinIO: `XMinioAdminNoSuchUser` (404) everywhere. RustFS
    /// (`rustfs/src/admin/handlers/user.rs`): user-info maps `NoSuchUser`
    /// through `iam_error_to_s3_error` (NoSuchResource, 404); remove-user
    /// first asks `is_temp_user`, whose NoSuchUser it answers as
    /// InternalError; set-user-status answers InternalError; the policy
    /// mapping handlers (`policies.rs`) check the user first: InvalidArgument
    /// "user not exist".
    pub(crate) fn no_such_user(self, ak: &str, site: Site) -> ApiError {
        let gone = format!("user '{ak}' does not exist");
        match (self, site) {
            (Backend::Minio, _) => ApiError::admin_no_such_user(),
            (Backend::Rustfs, Site::Info) => ApiError::new(404, "NoSuchResource", gone),
            (Backend::Rustfs, Site::Remove) => ApiError::new(
                500,
                "InternalError",
                format!("failed to query temporary user state: {gone}"),
            ),
            (Backend::Rustfs, Site::SetStatus) => ApiError::new(
                500,
                "InternalError",
                format!("failed to set user status: {gone}"),
            ),
            (Backend::Rustfs, Site::Mapping) => {
                ApiError::new(400, "InvalidArgument", "user not exist")
            }
        }
    }

    /// A canned policy that does not exist, where a handler needs it
    /// (info-canned-policy, set-policy, attach). MinIO:
    /// `XMinioAdminNoSuchPolicy` (404). RustFS: `NoSuchPolicy` answered as
    /// InternalError "policy does not exist" (`policies.rs`).
    pub(crate) fn no_such_policy(self) -> ApiError {
        match self {
            Backend::Minio => ApiError::admin_no_such_policy(),
            Backend::Rustfs => ApiError::new(500, "InternalError", "policy does not exist"),
        }
    }

    /// remove-canned-policy of a policy that does not exist: MinIO refuses
    /// (`XMinioAdminNoSuchPolicy`); RustFS (`IamCache::delete_policy`) takes
    /// it as already removed (`None`: success).
    pub(crate) fn missing_policy_removal(self) -> Option<ApiError> {
        match self {
            Backend::Minio => Some(ApiError::admin_no_such_policy()),
            Backend::Rustfs => None,
        }
    }

    /// A request argument the handler refuses.
    pub(crate) fn invalid_argument(self, msg: impl Into<String>) -> ApiError {
        match self {
            Backend::Minio => ApiError::admin_invalid_argument(msg),
            Backend::Rustfs => ApiError::new(400, "InvalidArgument", msg),
        }
    }

    /// A body that is not the JSON the handler expects (or does not decrypt).
    /// RustFS: InvalidRequest ("invalid JSON: ...", `read_compatible_admin_body`).
    pub(crate) fn bad_body(self, detail: &str) -> ApiError {
        match self {
            Backend::Minio => ApiError::admin_bad_json(),
            Backend::Rustfs => {
                ApiError::new(400, "InvalidRequest", format!("invalid JSON: {detail}"))
            }
        }
    }

    /// A policy document that does not parse.
    pub(crate) fn malformed_policy(self, msg: String) -> ApiError {
        match self {
            Backend::Minio => ApiError::new(400, "XMinioMalformedIAMPolicy", msg),
            Backend::Rustfs => ApiError::new(400, "InvalidRequest", msg),
        }
    }

    /// Attaching a policy already attached (or detaching one that is not):
    /// MinIO refuses (`errNoPolicyToAttachOrDetach`); RustFS answers success
    /// with nothing in the changed list (`policies.rs`).
    pub(crate) fn change_already_applied(self) -> Option<ApiError> {
        match self {
            Backend::Minio => Some(ApiError::new(
                400,
                "XMinioAdminPolicyChangeAlreadyApplied",
                "The specified policy change is already in effect.",
            )),
            Backend::Rustfs => None,
        }
    }

    /// An admin route the server does not have: MinIO's version-mismatch
    /// answer; RustFS's router answers NotImplemented.
    pub(crate) fn unknown_route(self, minio: ApiError) -> ApiError {
        match self {
            Backend::Minio => minio,
            Backend::Rustfs => ApiError::new(501, "NotImplemented", ""),
        }
    }

    /// Removing a canned policy still attached to a user: both refuse.
    /// MinIO `cmd/iam-store.go` `DeletePolicy` returns `errPolicyInUse`
    /// (`XMinioAdminPolicyInUse`, 400); RustFS `crates/iam/src/manager.rs`
    /// `IamCache::delete_policy` returns `Error::PolicyInUse`, which
    /// `RemoveCannedPolicy::call` (`rustfs/src/admin/handlers/policies.rs`)
    /// answers as `InternalError` (500).
    pub(crate) fn policy_in_use(self) -> ApiError {
        match self {
            Backend::Minio => ApiError::new(
                400,
                "XMinioAdminPolicyInUse",
                "The policy cannot be removed, as it is in use",
            ),
            Backend::Rustfs => ApiError::new(500, "InternalError", "policy in use"),
        }
    }

    /// Removing a built-in policy: RustFS refuses (`IamSys::delete_policy`:
    /// "system policy can not be deleted", answered as `InternalError`);
    /// MinIO removes it like any other (its built-ins are re-created at start).
    pub(crate) fn builtin_removal(self) -> Option<ApiError> {
        match self {
            Backend::Rustfs => Some(ApiError::new(
                500,
                "InternalError",
                "system policy can not be deleted",
            )),
            Backend::Minio => None,
        }
    }
}

/// Which admin handler met a missing user: the servers answer each differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Site {
    /// user-info.
    Info,
    /// remove-user.
    Remove,
    /// set-user-status.
    SetStatus,
    /// set-user-or-group-policy, attach, detach.
    Mapping,
}

/// RustFS's add-user answer to a create error (`map_add_user_create_error`).
fn create_failed(why: &str) -> ApiError {
    ApiError::new(
        500,
        "InternalError",
        format!("failed to create user: {why}"),
    )
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_rules_follow_each_backend() {
        let long = "x".repeat(64);
        for b in Backend::ALL {
            assert!(
                b.check_user_secret_key(&long).is_ok(),
                "{b}: 64-char secret"
            );
            assert!(b.check_user_secret_key("short").is_err());
            assert!(b.check_user_access_key("ab").is_err());
            assert!(b.check_user_access_key("a=b").is_err());
            assert!(b.check_user_access_key(&"k".repeat(64)).is_ok());
        }
        assert!(Backend::Rustfs.check_user_access_key("a b c").is_err());
        assert!(Backend::Minio.check_user_access_key("a b c").is_ok());
        assert_eq!(Backend::parse("minio"), Some(Backend::Minio));
        assert_eq!(Backend::parse("ceph"), None);
    }
}

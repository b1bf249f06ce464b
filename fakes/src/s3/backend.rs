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
    /// also refuses whitespace; MinIO's refuses nothing more here.
    pub(crate) fn check_user_access_key(self, ak: &str) -> Result<(), ApiError> {
        if ak.len() < 3 {
            return Err(self.invalid_access_key("access key length should be at least 3"));
        }
        if ak.contains(['=', ',']) {
            return Err(
                self.invalid_access_key("access key contains reserved characters '=' or ','")
            );
        }
        if self == Backend::Rustfs && ak.chars().any(char::is_whitespace) {
            return Err(ApiError::new(
                400,
                "InvalidArgument",
                "access key contains spaces",
            ));
        }
        Ok(())
    }

    fn invalid_access_key(self, msg: &str) -> ApiError {
        match self {
            Backend::Minio => ApiError::new(400, "XMinioAdminInvalidAccessKey", msg),
            Backend::Rustfs => ApiError::new(400, "InvalidArgument", msg),
        }
    }

    /// add-user's secret-key rule: 8 or more bytes, no upper bound, on both
    /// (MinIO `internal/auth/credentials.go` `IsSecretKeyValid`; RustFS
    /// `crates/policy/src/auth` `is_secret_key_valid`). MinIO's 40-byte
    /// `secretKeyMaxLen` only bounds generated and service-account
    /// credentials (`CreateNewCredentialsWithMetadata`), never add-user.
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
            Backend::Rustfs => ApiError::new(
                400,
                "InvalidArgument",
                "secret key length should be at least 8",
            ),
        })
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

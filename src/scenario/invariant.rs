//! The invariant names a scenario may ask for (DESIGN.md's table). The
//! checks module implements them; this is just the vocabulary.

use serde::Deserialize;

/// An invariant the checks can evaluate.
#[derive(Copy, Clone, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum Invariant {
    /// The same request again returns the same ids and secret and changes no backend state.
    IdempotentReplay,
    /// No two live BucketAccesses share an account or access key.
    UniqueCredentials,
    /// Credentials reach exactly their bucket; no shared policy is overwritten.
    LeastPrivilege,
    /// Credentials once handed out keep authenticating.
    NoRotation,
    /// No secret value appears in a snapshot, history or log.
    NoSecretLeak,
}

impl Invariant {
    /// The id used in files and reports.
    pub fn id(self) -> &'static str {
        match self {
            Invariant::IdempotentReplay => "idempotent-replay",
            Invariant::UniqueCredentials => "unique-credentials",
            Invariant::LeastPrivilege => "least-privilege",
            Invariant::NoRotation => "no-rotation",
            Invariant::NoSecretLeak => "no-secret-leak",
        }
    }

    /// What it claims, in words, for reports.
    pub fn claim(self) -> &'static str {
        match self {
            Invariant::IdempotentReplay => "a repeated request returns the same bucket id / account / secret and changes no backend state",
            Invariant::UniqueCredentials => "no two live BucketAccesses share an account or access key",
            Invariant::LeastPrivilege => "credentials reach exactly the buckets they were granted, and no grant changes another's policy",
            Invariant::NoRotation => "credentials once handed out keep authenticating (a signed PutObject works)",
            Invariant::NoSecretLeak => "no secret value appears in a snapshot, history or log",
        }
    }

    /// Checked when a scenario lists none.
    pub fn cosi_defaults() -> &'static [Invariant] {
        &[
            Invariant::IdempotentReplay,
            Invariant::UniqueCredentials,
            Invariant::LeastPrivilege,
            Invariant::NoRotation,
            Invariant::NoSecretLeak,
        ]
    }
}

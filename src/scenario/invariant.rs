//! The invariant names a scenario may ask for (DESIGN.md's table). The
//! checks module implements them; this is just the vocabulary.

use serde::Deserialize;

/// An invariant the checks can evaluate.
#[derive(
    Copy, Clone, Debug, Deserialize, serde::Serialize, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
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
    /// After convergence every backend user, policy and bucket is owned by a live object or a checkpoint.
    NoOrphans,
    /// Deleting X never deletes or detaches what Y owns.
    OwnerOnlyDelete,
    /// Once faults heal, every request reaches a terminal state (no AlreadyExists for ever).
    Converges,
    /// The spec's codes: incompatible → ALREADY_EXISTS, unknown auth → INVALID_ARGUMENT, gone → OK.
    SpecCodes,
    /// Secrets are random: not derivable from names or keys, different in a twin lab.
    UnpredictableSecrets,
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
            Invariant::NoOrphans => "no-orphans",
            Invariant::OwnerOnlyDelete => "owner-only-delete",
            Invariant::Converges => "converges",
            Invariant::SpecCodes => "spec-codes",
            Invariant::UnpredictableSecrets => "unpredictable-secrets",
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
            Invariant::NoOrphans => "after convergence every backend user, policy and bucket belongs to a live object or a recorded checkpoint",
            Invariant::OwnerOnlyDelete => "deleting or revoking X never deletes what Y (or someone outside COSI) owns",
            Invariant::Converges => "once faults heal, every request reaches a terminal state within the retry budget",
            Invariant::SpecCodes => "incompatible parameters → ALREADY_EXISTS, unknown auth type → INVALID_ARGUMENT, already gone → OK",
            Invariant::UnpredictableSecrets => "a secret is random: not derived from the account or key, different in a twin lab with the same names",
        }
    }

    /// Checked when a scenario lists none: the full COSI set.
    pub fn cosi_defaults() -> &'static [Invariant] {
        &[
            Invariant::IdempotentReplay,
            Invariant::UniqueCredentials,
            Invariant::LeastPrivilege,
            Invariant::NoRotation,
            Invariant::NoSecretLeak,
            Invariant::NoOrphans,
            Invariant::OwnerOnlyDelete,
            Invariant::Converges,
            Invariant::SpecCodes,
            Invariant::UnpredictableSecrets,
        ]
    }
}

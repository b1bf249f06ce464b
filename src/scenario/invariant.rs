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
    /// BOSH: a single-node volume is attached to at most one VM and mounted on at most one node.
    SingleAttach,
    /// BOSH: the driver's token acts on its own deployments' disks only, with the dynamic-disks scopes.
    ScopedAccess,
    /// BOSH: after convergence no mount is left that no running pod needs.
    NoLeakedMounts,
    /// BOSH: a read-only publish gives a read-only bind mount.
    ReadOnlyEnforced,
    /// BOSH: no disk attach or detach runs on a VM while the Director recreates it.
    NoAttachDuringRecreate,
    /// CBT: every reported change list equals the ground truth of the writes, no more, no less.
    DeltaExact,
    /// CBT: a session token works only for its client, volume and snapshot pair, and not after it expires; a client without the role is refused before any driver call.
    TokenBound,
    /// CSI: every case of the spec sweep (`spec_sweep:`) holds.
    CsiSpec,
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
            Invariant::SingleAttach => "single-attach",
            Invariant::ScopedAccess => "scoped-access",
            Invariant::NoLeakedMounts => "no-leaked-mounts",
            Invariant::ReadOnlyEnforced => "read-only-enforced",
            Invariant::NoAttachDuringRecreate => "no-attach-during-recreate",
            Invariant::DeltaExact => "delta-exact",
            Invariant::TokenBound => "token-bound",
            Invariant::CsiSpec => "csi-spec",
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
            Invariant::NoOrphans => "after convergence everything the driver made (backend users, policies, buckets; IaaS disks) belongs to a live object or a recorded checkpoint",
            Invariant::OwnerOnlyDelete => "deleting or revoking X never deletes what Y (or someone outside the driver) owns",
            Invariant::Converges => "once faults heal, every request reaches a terminal state within the retry budget",
            Invariant::SpecCodes => "the spec's codes: incompatible parameters or size → ALREADY_EXISTS, unknown auth type → INVALID_ARGUMENT, already gone → OK",
            Invariant::UnpredictableSecrets => "a secret is random: not derived from the account or key, different in a twin lab with the same names",
            Invariant::SingleAttach => "a single-node volume is attached to at most one VM and mounted on at most one node, at every step",
            Invariant::ScopedAccess => "the driver's token carries only the dynamic-disks scopes and acts only on its own deployments' disks",
            Invariant::NoLeakedMounts => "after convergence every mount belongs to a running pod's volume on that node; a failed stage leaves none",
            Invariant::ReadOnlyEnforced => "a read-only publish (or a reader-only access mode) gives a read-only bind mount",
            Invariant::NoAttachDuringRecreate => "no disk attach or detach runs on a VM while the Director recreates that VM",
            Invariant::DeltaExact => "the blocks a backup is told about are exactly the blocks written: allocated for a full backup, changed for an incremental",
            Invariant::TokenBound => "a session token serves only its client, volume and snapshot pair until it expires; tokens without the role are refused before any driver call",
            Invariant::CsiSpec => "every case of the CSI spec sweep holds: required fields, NOT_FOUND, idempotency, target paths, attach limit, listings and paging, snapshots and restore, advertised ⇒ implemented (cases that do not apply are reported, never passed)",
        }
    }

    /// Which system's state the invariant reads (some read both).
    pub fn applies_to(self, system: super::System) -> bool {
        use super::System;
        match self {
            Invariant::NoSecretLeak
            | Invariant::NoOrphans
            | Invariant::OwnerOnlyDelete
            | Invariant::Converges
            | Invariant::SpecCodes => true,
            Invariant::SingleAttach
            | Invariant::ScopedAccess
            | Invariant::NoLeakedMounts
            | Invariant::ReadOnlyEnforced
            | Invariant::NoAttachDuringRecreate
            | Invariant::DeltaExact
            | Invariant::TokenBound
            | Invariant::CsiSpec => system == System::Csi,
            _ => system == System::Cosi,
        }
    }

    /// Every invariant, COSI's first, in the documented order.
    pub fn all() -> Vec<Invariant> {
        let mut v = Invariant::cosi_defaults().to_vec();
        for i in Invariant::bosh_defaults() {
            if !v.contains(i) {
                v.push(*i);
            }
        }
        // Asked for by name only: it judges the `spec_sweep:` step.
        v.push(Invariant::CsiSpec);
        v
    }

    /// Whether it reads what only the BOSH backend shows (the Director's
    /// tokens and VM operations, the IaaS block API the changed-block checks
    /// compare against), so a CSI scenario without `bosh:` cannot judge it.
    pub fn needs_bosh(self) -> bool {
        matches!(
            self,
            Invariant::ScopedAccess
                | Invariant::NoAttachDuringRecreate
                | Invariant::DeltaExact
                | Invariant::TokenBound
        )
    }

    /// Checked when a CSI scenario lists none: the BOSH ones only with `bosh:`.
    pub fn csi_defaults(with_bosh: bool) -> Vec<Invariant> {
        Invariant::bosh_defaults()
            .iter()
            .copied()
            .filter(|i| with_bosh || !i.needs_bosh())
            .collect()
    }

    /// Checked when a BOSH scenario lists none.
    pub fn bosh_defaults() -> &'static [Invariant] {
        &[
            Invariant::SingleAttach,
            Invariant::NoOrphans,
            Invariant::OwnerOnlyDelete,
            Invariant::ScopedAccess,
            Invariant::NoLeakedMounts,
            Invariant::ReadOnlyEnforced,
            Invariant::NoAttachDuringRecreate,
            Invariant::DeltaExact,
            Invariant::TokenBound,
            Invariant::Converges,
            Invariant::SpecCodes,
            Invariant::NoSecretLeak,
        ]
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

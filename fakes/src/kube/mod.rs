//! Fake Kubernetes API subset: Namespaces, Secrets, ConfigMaps, Leases, the COSI v1alpha1
//! kinds, the storage kinds CSI needs (PVC, PV, Pod, StorageClass,
//! VolumeAttachment, CSINode), the snapshot.storage.k8s.io/v1 kinds and the
//! SnapshotMetadataService of cbt.storage.k8s.io, served over https (as a lab
//! serves it: `serve_tls`) or plain http, faithfully enough for kube-rs,
//! client-go (kubectl) and the Python client: watches (`watch`), every caller
//! authenticated and authorized (`auth`), strategic merge (`strategic`) — plus
//! an in-process API over the same state for the engine and the fake sidecars.
//!
//! Namespaces (`state::namespace`): `default`, `kube-system`, `kube-public` and
//! `kube-node-lease` exist from the start; an HTTP create (POST, or an apply
//! that creates) into a missing namespace is 404 `namespaces "X" not found`,
//! any create into a terminating one 403, as NamespaceLifecycle admission.
//! Deviations: built-in and lab-recorded namespaces are synthesized on read
//! (resourceVersion 1 or the version they were recorded at; never in a watch
//! until written); an in-process create into a missing namespace records it
//! (the lab is the cluster admin); deleting a namespace marks it Terminating
//! and deletes its objects at once (the namespace controller's work, here
//! synchronous), then removes it when nothing is left; a deleted
//! `kube-node-lease` is back at once (the real server recreates it within a
//! minute); the `finalize` subresource is not served (404).
//!
//! Timestamps (`creationTimestamp`, `deletionTimestamp`, managedFields times)
//! come from the lab's clock: in a run virtual time from 2025-01-01T00:00:00Z,
//! reproducible; in `drivelab serve` the wall clock (`SimClock::following_wall_clock`).
//!
//! OpenAPI and field validation (`schema`, `openapi`): `/openapi/v2` and
//! `/openapi/v3` (index + one document per group-version) are generated from
//! one schema table per kind; every write takes `fieldValidation`
//! (Strict → 400 `strict decoding error: unknown field "spec.foo"`, Warn — the
//! default — drops unknown fields with a `Warning` header, Ignore drops them),
//! as k8s.io/apiserver's create/update/patch handlers; server-side apply
//! refuses undeclared fields with the plain 500 of structured-merge-diff
//! (`.spec.foo: field not declared in schema`). Deviations: `/openapi/v2` is
//! JSON only (a request for its protobuf form, which client-go's
//! `OpenAPISchema` makes, is 406); schemas carry types and field names, no
//! descriptions, enums, formats beyond date-time/byte, or required lists;
//! not modelled field by field, and so kept whatever they hold, are the
//! `spec` and `status` of Pods and PersistentVolumes, PersistentVolumeClaim
//! `status`, StorageClass `allowedTopologies`, VolumeAttachment
//! `inlineVolumeSpec` and managedFields' `fieldsV1`
//! (`x-kubernetes-preserve-unknown-fields` in the documents); duplicate JSON
//! fields are not detected (the last wins, no `duplicate field` error).
//!
//! Request bodies (`protobuf`): JSON, and the Kubernetes protobuf wire format
//! (`application/vnd.kubernetes.protobuf`, what kubectl's `create secret`,
//! `create configmap` and `create namespace` POST) for Secret, ConfigMap and
//! Namespace; a protobuf body of any other kind is 415 naming the kinds that
//! are decoded. Answers are always JSON (client-go accepts JSON when it asked
//! for protobuf); protobuf's unknown fields are skipped, as the real decoder
//! skips them.
//!
//! Field ownership and server-side apply (`managed`, after
//! structured-merge-diff v4 `merge.Updater` and apimachinery
//! `managedfields/internal`): every HTTP write records its field manager
//! (`fieldManager`, else the user agent's product) in
//! `metadata.managedFields` — `Update` entries own what they changed, `Apply`
//! entries what they applied, per subresource; server-side apply merges by the
//! schema (keyed lists by their key, sets by value, atomic lists whole), is
//! 409 `Apply failed with N conflict(s): conflict with "m" using v1: .data.a`
//! (causes `FieldManagerConflict`) when another manager owns a changed field,
//! `force=true` takes the fields over, and fields a manager stops applying go
//! when no other manager owns them; an object with no managedFields gets a
//! `before-first-apply` owner on its first apply; stripped metadata
//! (name, uid, resourceVersion, ...) is never tracked. Deviations: an apply
//! that sets a part not modelled field by field (Pod and PersistentVolume
//! `spec`/`status`, PersistentVolumeClaim `status`, VolumeAttachment
//! `inlineVolumeSpec`) is 501 naming it; updates there are tracked as one
//! atomic field; in-process writes (the lab's own sidecars and kubelet) are
//! not recorded; unions, schema-change reconciliation and the managedFields
//! size limit are not modelled; lists keep the live order with new items
//! appended.

mod api;
pub mod auth;
mod managed;
mod openapi;
mod patch;
mod protobuf;
pub mod reads;
pub mod review;
mod schema;
mod selector;
mod snapshot;
mod state;
mod status;
mod storage;
mod strategic;
mod validate;
mod watch;

use std::sync::Arc;

use crate::gate::Gate;
use crate::store::{Store, StoreError};

pub use api::{all_ops, is_watch, op, Verb};
pub use auth::{Access, Grant, Rule};
pub use patch::{json_patch, merge_patch, PatchError};
pub use schema::FieldValidation;
pub use selector::{FieldSelector, LabelSelector, SelectorError};
pub use snapshot::{SNAPSHOT_API_VERSION, SNAPSHOT_GROUP};
pub use state::{KubeFake, Stored};
pub use status::render_rejection;
pub use storage::{format_quantity, parse_quantity, ACCESS_MODES, PVC_PROTECTION};
pub use watch::WINDOW as WATCH_WINDOW;

/// The kinds this fake serves.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Kind {
    /// core/v1 Secret.
    Secret,
    /// core/v1 ConfigMap.
    ConfigMap,
    /// coordination.k8s.io/v1 Lease.
    Lease,
    /// COSI BucketClass (cluster-scoped).
    BucketClass,
    /// COSI BucketAccessClass (cluster-scoped).
    BucketAccessClass,
    /// COSI BucketClaim (namespaced).
    BucketClaim,
    /// COSI BucketAccess (namespaced).
    BucketAccess,
    /// COSI Bucket (cluster-scoped).
    Bucket,
    /// core/v1 PersistentVolumeClaim (namespaced).
    PersistentVolumeClaim,
    /// core/v1 PersistentVolume (cluster-scoped).
    PersistentVolume,
    /// core/v1 Pod (namespaced; only what the kubelet-like node agent reads).
    Pod,
    /// storage.k8s.io/v1 StorageClass (cluster-scoped).
    StorageClass,
    /// storage.k8s.io/v1 VolumeAttachment (cluster-scoped).
    VolumeAttachment,
    /// storage.k8s.io/v1 CSINode (cluster-scoped, one per node).
    CsiNode,
    /// snapshot.storage.k8s.io/v1 VolumeSnapshotClass (cluster-scoped).
    VolumeSnapshotClass,
    /// snapshot.storage.k8s.io/v1 VolumeSnapshot (namespaced).
    VolumeSnapshot,
    /// snapshot.storage.k8s.io/v1 VolumeSnapshotContent (cluster-scoped).
    VolumeSnapshotContent,
    /// cbt.storage.k8s.io/v1alpha1 SnapshotMetadataService (cluster-scoped, one per driver).
    SnapshotMetadataService,
    /// core/v1 Namespace (cluster-scoped; see `state::namespace` for its lifecycle).
    Namespace,
}

impl Kind {
    /// Every kind, in a stable order (discovery lists them this way).
    pub const ALL: [Kind; 19] = [
        Kind::Secret,
        Kind::ConfigMap,
        Kind::Lease,
        Kind::BucketClass,
        Kind::BucketAccessClass,
        Kind::BucketClaim,
        Kind::BucketAccess,
        Kind::Bucket,
        Kind::PersistentVolumeClaim,
        Kind::PersistentVolume,
        Kind::Pod,
        Kind::StorageClass,
        Kind::VolumeAttachment,
        Kind::CsiNode,
        Kind::VolumeSnapshotClass,
        Kind::VolumeSnapshot,
        Kind::VolumeSnapshotContent,
        Kind::SnapshotMetadataService,
        Kind::Namespace,
    ];

    /// True for kinds that live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(
            self,
            Kind::BucketClass
                | Kind::BucketAccessClass
                | Kind::Bucket
                | Kind::PersistentVolume
                | Kind::StorageClass
                | Kind::VolumeAttachment
                | Kind::CsiNode
                | Kind::VolumeSnapshotClass
                | Kind::VolumeSnapshotContent
                | Kind::SnapshotMetadataService
                | Kind::Namespace
        )
    }

    /// The resource name in URLs (`secrets`, `bucketclaims`).
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Secret => "secrets",
            Kind::ConfigMap => "configmaps",
            Kind::Lease => "leases",
            Kind::BucketClass => "bucketclasses",
            Kind::BucketAccessClass => "bucketaccessclasses",
            Kind::BucketClaim => "bucketclaims",
            Kind::BucketAccess => "bucketaccesses",
            Kind::Bucket => "buckets",
            Kind::PersistentVolumeClaim => "persistentvolumeclaims",
            Kind::PersistentVolume => "persistentvolumes",
            Kind::Pod => "pods",
            Kind::StorageClass => "storageclasses",
            Kind::VolumeAttachment => "volumeattachments",
            Kind::CsiNode => "csinodes",
            Kind::VolumeSnapshotClass => "volumesnapshotclasses",
            Kind::VolumeSnapshot => "volumesnapshots",
            Kind::VolumeSnapshotContent => "volumesnapshotcontents",
            Kind::SnapshotMetadataService => "snapshotmetadataservices",
            Kind::Namespace => "namespaces",
        }
    }

    /// Lower-case singular name (`secret`, `bucketclaim`), as used in op names.
    pub fn singular(self) -> &'static str {
        match self {
            Kind::Secret => "secret",
            Kind::ConfigMap => "configmap",
            Kind::Lease => "lease",
            Kind::BucketClass => "bucketclass",
            Kind::BucketAccessClass => "bucketaccessclass",
            Kind::BucketClaim => "bucketclaim",
            Kind::BucketAccess => "bucketaccess",
            Kind::Bucket => "bucket",
            Kind::PersistentVolumeClaim => "persistentvolumeclaim",
            Kind::PersistentVolume => "persistentvolume",
            Kind::Pod => "pod",
            Kind::StorageClass => "storageclass",
            Kind::VolumeAttachment => "volumeattachment",
            Kind::CsiNode => "csinode",
            Kind::VolumeSnapshotClass => "volumesnapshotclass",
            Kind::VolumeSnapshot => "volumesnapshot",
            Kind::VolumeSnapshotContent => "volumesnapshotcontent",
            Kind::SnapshotMetadataService => "snapshotmetadataservice",
            Kind::Namespace => "namespace",
        }
    }

    /// API group; empty for the core group.
    pub fn group(self) -> &'static str {
        match self {
            Kind::Secret
            | Kind::ConfigMap
            | Kind::PersistentVolumeClaim
            | Kind::PersistentVolume
            | Kind::Pod
            | Kind::Namespace => "",
            Kind::Lease => "coordination.k8s.io",
            Kind::StorageClass | Kind::VolumeAttachment | Kind::CsiNode => "storage.k8s.io",
            Kind::BucketClass
            | Kind::BucketAccessClass
            | Kind::BucketClaim
            | Kind::BucketAccess
            | Kind::Bucket => "objectstorage.k8s.io",
            Kind::VolumeSnapshotClass | Kind::VolumeSnapshot | Kind::VolumeSnapshotContent => {
                SNAPSHOT_GROUP
            }
            Kind::SnapshotMetadataService => "cbt.storage.k8s.io",
        }
    }

    /// Version within the group.
    pub fn version(self) -> &'static str {
        match self {
            Kind::BucketClass
            | Kind::BucketAccessClass
            | Kind::BucketClaim
            | Kind::BucketAccess
            | Kind::Bucket
            | Kind::SnapshotMetadataService => "v1alpha1",
            _ => "v1",
        }
    }

    /// `apiVersion` as written in objects (`v1`, `objectstorage.k8s.io/v1alpha1`).
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Secret
            | Kind::ConfigMap
            | Kind::PersistentVolumeClaim
            | Kind::PersistentVolume
            | Kind::Pod
            | Kind::Namespace => "v1",
            Kind::Lease => "coordination.k8s.io/v1",
            Kind::StorageClass | Kind::VolumeAttachment | Kind::CsiNode => "storage.k8s.io/v1",
            Kind::VolumeSnapshotClass | Kind::VolumeSnapshot | Kind::VolumeSnapshotContent => {
                SNAPSHOT_API_VERSION
            }
            Kind::SnapshotMetadataService => "cbt.storage.k8s.io/v1alpha1",
            _ => "objectstorage.k8s.io/v1alpha1",
        }
    }

    /// `kind` as written in objects (`Secret`, `BucketClaim`).
    pub fn kind_name(self) -> &'static str {
        match self {
            Kind::Secret => "Secret",
            Kind::ConfigMap => "ConfigMap",
            Kind::Lease => "Lease",
            Kind::BucketClass => "BucketClass",
            Kind::BucketAccessClass => "BucketAccessClass",
            Kind::BucketClaim => "BucketClaim",
            Kind::BucketAccess => "BucketAccess",
            Kind::Bucket => "Bucket",
            Kind::PersistentVolumeClaim => "PersistentVolumeClaim",
            Kind::PersistentVolume => "PersistentVolume",
            Kind::Pod => "Pod",
            Kind::StorageClass => "StorageClass",
            Kind::VolumeAttachment => "VolumeAttachment",
            Kind::CsiNode => "CSINode",
            Kind::VolumeSnapshotClass => "VolumeSnapshotClass",
            Kind::VolumeSnapshot => "VolumeSnapshot",
            Kind::VolumeSnapshotContent => "VolumeSnapshotContent",
            Kind::SnapshotMetadataService => "SnapshotMetadataService",
            Kind::Namespace => "Namespace",
        }
    }

    /// True for kinds defined by a CRD (COSI, snapshots, CBT); they follow
    /// custom-resource rules (generation on every non-metadata change, deleted
    /// object returned on delete).
    pub fn is_custom(self) -> bool {
        matches!(
            self.group(),
            "objectstorage.k8s.io" | SNAPSHOT_GROUP | "cbt.storage.k8s.io"
        )
    }

    /// True when the kind has a `status` subresource (the COSI CRDs that declare
    /// one, and the built-in storage kinds that have one), so writes to the main
    /// resource over HTTP cannot change `status` (and `/status` only can).
    pub fn has_status_subresource(self) -> bool {
        matches!(
            self,
            Kind::Bucket
                | Kind::BucketClaim
                | Kind::BucketAccess
                | Kind::PersistentVolumeClaim
                | Kind::PersistentVolume
                | Kind::Pod
                | Kind::VolumeAttachment
                | Kind::VolumeSnapshot
                | Kind::VolumeSnapshotContent
                | Kind::Namespace
        )
    }

    /// True when a DELETE that removes the object answers with the object (the
    /// registry's `ReturnDeletedObject`), not a Success Status: custom resources
    /// and the core kinds whose registries set it (pods, PVCs, PVs).
    pub fn returns_deleted_object(self) -> bool {
        self.is_custom()
            || matches!(
                self,
                Kind::Pod | Kind::PersistentVolumeClaim | Kind::PersistentVolume
            )
    }

    /// Short names discovery advertises (`kubectl get pvc`).
    pub fn short_names(self) -> &'static [&'static str] {
        match self {
            Kind::ConfigMap => &["cm"],
            Kind::Namespace => &["ns"],
            Kind::PersistentVolumeClaim => &["pvc"],
            Kind::PersistentVolume => &["pv"],
            Kind::Pod => &["po"],
            Kind::StorageClass => &["sc"],
            Kind::VolumeSnapshotClass => &["vsclass", "vsclasses"],
            Kind::VolumeSnapshot => &["vs"],
            Kind::VolumeSnapshotContent => &["vsc", "vscs"],
            _ => &[],
        }
    }

    /// The kind served at `group/version/plural`, if any.
    pub fn from_path(group: &str, version: &str, plural: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.group() == group && k.version() == version && k.plural() == plural)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind_name())
    }
}

/// Why a request to the fake failed; each maps to a real API `Status`.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// 404 NotFound.
    #[error("{} \"{name}\" not found", kind.plural())]
    NotFound { kind: Kind, name: String },
    /// 409 AlreadyExists.
    #[error("{} \"{name}\" already exists", kind.plural())]
    AlreadyExists { kind: Kind, name: String },
    /// 409 Conflict (stale resourceVersion, failed precondition).
    #[error("Operation cannot be fulfilled on {} \"{name}\": {message}", kind.plural())]
    Conflict {
        kind: Kind,
        name: String,
        message: String,
    },
    /// 409 Conflict of server-side apply: fields another manager owns;
    /// `causes` are (field path, `conflict with "manager"`).
    #[error("{message}")]
    ApplyConflict {
        message: String,
        causes: Vec<(String, String)>,
    },
    /// 403 Forbidden by admission (a create in a terminating namespace,
    /// deleting an immortal namespace); RBAC denials are rendered in `api`.
    #[error("{} \"{name}\" is forbidden: {message}", kind.plural())]
    Forbidden {
        kind: Kind,
        name: String,
        message: String,
    },
    /// 422 Invalid (field validation); `field` names the offending field path.
    #[error("{kind} \"{name}\" is invalid: {field}: {message}")]
    Invalid {
        kind: Kind,
        name: String,
        field: String,
        message: String,
    },
    /// 400 BadRequest (malformed object, namespace/name mismatch with the request).
    #[error("{message}")]
    BadRequest { message: String },
    /// A request this fake does not implement (501), named in the message.
    #[error("{message}")]
    NotImplemented { message: String },
    /// A plain error of the real server (500 with no reason), e.g. server-side
    /// apply failing to type its configuration.
    #[error("{message}")]
    Internal { message: String },
    /// The backing store failed (500 InternalError).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl KubeError {
    /// The `Status.reason` this error is reported with.
    pub fn reason(&self) -> &'static str {
        match self {
            KubeError::NotFound { .. } => "NotFound",
            KubeError::AlreadyExists { .. } => "AlreadyExists",
            KubeError::Conflict { .. } | KubeError::ApplyConflict { .. } => "Conflict",
            KubeError::Forbidden { .. } => "Forbidden",
            KubeError::Invalid { .. } => "Invalid",
            KubeError::BadRequest { .. } => "BadRequest",
            KubeError::NotImplemented { .. } => "NotImplemented",
            KubeError::Internal { .. } => "",
            KubeError::Store(_) => "InternalError",
        }
    }

    /// The HTTP status this error is reported with.
    pub fn http_code(&self) -> u16 {
        match self {
            KubeError::NotFound { .. } => 404,
            KubeError::Forbidden { .. } => 403,
            KubeError::AlreadyExists { .. }
            | KubeError::Conflict { .. }
            | KubeError::ApplyConflict { .. } => 409,
            KubeError::Invalid { .. } => 422,
            KubeError::BadRequest { .. } => 400,
            KubeError::NotImplemented { .. } => 501,
            KubeError::Internal { .. } | KubeError::Store(_) => 500,
        }
    }
}

/// Shorthand used across the module.
pub(crate) type Result<T, E = KubeError> = std::result::Result<T, E>;

/// Convenience: a fake over an in-memory store with a fresh gate (tests, explorers).
pub fn in_memory(gate: Gate, seed: u64) -> Result<KubeFake> {
    KubeFake::new(
        Arc::new(crate::store::MemStore::default()) as Arc<dyn Store>,
        gate,
        seed,
    )
}

//! One schema table per served kind: the fields the real API declares, from
//! which both the OpenAPI documents (`openapi`) and server-side field
//! validation (`fieldValidation=Strict|Warn|Ignore`) are derived.
//!
//! Sources: the built-in types of k8s.io/api (core/v1 `types.go`,
//! coordination/v1, storage/v1), the COSI v1alpha1 CRDs
//! (kubernetes-sigs/container-object-storage-interface-api
//! `client/config/crd/*.yaml`) and the external-snapshotter v1 CRDs. Parts the
//! fake does not model field by field are [`S::Free`]
//! (`x-kubernetes-preserve-unknown-fields`): unknown fields there are kept and
//! never reported; the module doc of `kube` lists them.

use serde_json::{json, Map, Value};

use super::{Kind, KubeError};

/// A schema node.
#[derive(Debug)]
pub(crate) enum S {
    /// A string.
    Str,
    /// An integer (int64).
    Int,
    /// A boolean.
    Bool,
    /// Base64 bytes (`[]byte`).
    Bytes,
    /// An RFC 3339 timestamp (`metav1.Time` / `MicroTime`).
    Time,
    /// A `resource.Quantity` or `IntOrString`: a string or a number.
    IntOrStr,
    /// An atomic list of items.
    List(&'static S),
    /// A set-like list merged by value (`+listType=set`, `+patchStrategy=merge`).
    Set(&'static S),
    /// A list of objects merged by a key field (`+listType=map`, `+listMapKey`).
    Keyed(&'static S, &'static str),
    /// A map from string keys to values.
    Map(&'static S),
    /// An object with these fields and no others.
    Obj(&'static [(&'static str, S)]),
    /// A part not modelled field by field: anything is kept.
    Free,
    /// `metav1.ObjectMeta`, rendered as a reference.
    Meta,
}

use S::*;

/// `metav1.ManagedFieldsEntry`.
const MANAGED_FIELDS_ENTRY: S = Obj(&[
    ("apiVersion", Str),
    ("fieldsType", Str),
    ("fieldsV1", Free),
    ("manager", Str),
    ("operation", Str),
    ("subresource", Str),
    ("time", Time),
]);

/// `metav1.OwnerReference`.
const OWNER_REFERENCE: S = Obj(&[
    ("apiVersion", Str),
    ("blockOwnerDeletion", Bool),
    ("controller", Bool),
    ("kind", Str),
    ("name", Str),
    ("uid", Str),
]);

/// `metav1.ObjectMeta` (k8s.io/apimachinery/pkg/apis/meta/v1/types.go).
pub(crate) const OBJECT_META: S = Obj(&[
    ("annotations", Map(&Str)),
    ("creationTimestamp", Time),
    ("deletionGracePeriodSeconds", Int),
    ("deletionTimestamp", Time),
    ("finalizers", Set(&Str)),
    ("generateName", Str),
    ("generation", Int),
    ("labels", Map(&Str)),
    ("managedFields", List(&MANAGED_FIELDS_ENTRY)),
    ("name", Str),
    ("namespace", Str),
    ("ownerReferences", Keyed(&OWNER_REFERENCE, "uid")),
    ("resourceVersion", Str),
    ("selfLink", Str),
    ("uid", Str),
]);

/// `corev1.ObjectReference`.
const OBJECT_REFERENCE: S = Obj(&[
    ("apiVersion", Str),
    ("fieldPath", Str),
    ("kind", Str),
    ("name", Str),
    ("namespace", Str),
    ("resourceVersion", Str),
    ("uid", Str),
]);

/// `metav1.LabelSelector`.
const LABEL_SELECTOR: S = Obj(&[
    (
        "matchExpressions",
        List(&Obj(&[
            ("key", Str),
            ("operator", Str),
            ("values", List(&Str)),
        ])),
    ),
    ("matchLabels", Map(&Str)),
]);

const CONDITION: S = Obj(&[
    ("lastTransitionTime", Time),
    ("message", Str),
    ("reason", Str),
    ("status", Str),
    ("type", Str),
]);

const VOLUME_ERROR: S = Obj(&[("errorCode", Int), ("message", Str), ("time", Time)]);
const SNAPSHOT_ERROR: S = Obj(&[("message", Str), ("time", Time)]);

/// The fields of `kind` besides apiVersion, kind and metadata.
fn body(kind: Kind) -> &'static [(&'static str, S)] {
    match kind {
        Kind::Secret => &[
            ("data", Map(&Bytes)),
            ("immutable", Bool),
            ("stringData", Map(&Str)),
            ("type", Str),
        ],
        Kind::ConfigMap => &[
            ("binaryData", Map(&Bytes)),
            ("data", Map(&Str)),
            ("immutable", Bool),
        ],
        Kind::Lease => &[(
            "spec",
            Obj(&[
                ("acquireTime", Time),
                ("holderIdentity", Str),
                ("leaseDurationSeconds", Int),
                ("leaseTransitions", Int),
                ("preferredHolder", Str),
                ("renewTime", Time),
                ("strategy", Str),
            ]),
        )],
        Kind::Namespace => &[
            ("spec", Obj(&[("finalizers", List(&Str))])),
            (
                "status",
                Obj(&[("conditions", Keyed(&CONDITION, "type")), ("phase", Str)]),
            ),
        ],
        Kind::BucketClass => &[
            ("deletionPolicy", Str),
            ("driverName", Str),
            ("parameters", Map(&Str)),
        ],
        Kind::BucketAccessClass => &[
            ("authenticationType", Str),
            ("driverName", Str),
            ("parameters", Map(&Str)),
        ],
        Kind::BucketClaim => &[
            (
                "spec",
                Obj(&[
                    ("bucketClassName", Str),
                    ("existingBucketName", Str),
                    ("protocols", List(&Str)),
                ]),
            ),
            ("status", Obj(&[("bucketName", Str), ("bucketReady", Bool)])),
        ],
        Kind::BucketAccess => &[
            (
                "spec",
                Obj(&[
                    ("bucketAccessClassName", Str),
                    ("bucketClaimName", Str),
                    ("credentialsSecretName", Str),
                    ("protocol", Str),
                    ("serviceAccountName", Str),
                ]),
            ),
            (
                "status",
                Obj(&[("accessGranted", Bool), ("accountID", Str)]),
            ),
        ],
        Kind::Bucket => &[
            (
                "spec",
                Obj(&[
                    ("bucketClaim", OBJECT_REFERENCE),
                    ("bucketClassName", Str),
                    ("deletionPolicy", Str),
                    ("driverName", Str),
                    ("existingBucketID", Str),
                    ("parameters", Map(&Str)),
                    ("protocols", List(&Str)),
                ]),
            ),
            ("status", Obj(&[("bucketID", Str), ("bucketReady", Bool)])),
        ],
        Kind::PersistentVolumeClaim => &[
            (
                "spec",
                Obj(&[
                    ("accessModes", List(&Str)),
                    (
                        "dataSource",
                        Obj(&[("apiGroup", Str), ("kind", Str), ("name", Str)]),
                    ),
                    (
                        "dataSourceRef",
                        Obj(&[
                            ("apiGroup", Str),
                            ("kind", Str),
                            ("name", Str),
                            ("namespace", Str),
                        ]),
                    ),
                    (
                        "resources",
                        Obj(&[("limits", Map(&IntOrStr)), ("requests", Map(&IntOrStr))]),
                    ),
                    ("selector", LABEL_SELECTOR),
                    ("storageClassName", Str),
                    ("volumeAttributesClassName", Str),
                    ("volumeMode", Str),
                    ("volumeName", Str),
                ]),
            ),
            ("status", Free),
        ],
        Kind::PersistentVolume | Kind::Pod => &[("spec", Free), ("status", Free)],
        Kind::StorageClass => &[
            ("allowVolumeExpansion", Bool),
            ("allowedTopologies", List(&Free)),
            ("mountOptions", List(&Str)),
            ("parameters", Map(&Str)),
            ("provisioner", Str),
            ("reclaimPolicy", Str),
            ("volumeBindingMode", Str),
        ],
        Kind::VolumeAttachment => &[
            (
                "spec",
                Obj(&[
                    ("attacher", Str),
                    ("nodeName", Str),
                    (
                        "source",
                        Obj(&[("inlineVolumeSpec", Free), ("persistentVolumeName", Str)]),
                    ),
                ]),
            ),
            (
                "status",
                Obj(&[
                    ("attachError", VOLUME_ERROR),
                    ("attached", Bool),
                    ("attachmentMetadata", Map(&Str)),
                    ("detachError", VOLUME_ERROR),
                ]),
            ),
        ],
        Kind::CsiNode => &[(
            "spec",
            Obj(&[(
                "drivers",
                Keyed(
                    &Obj(&[
                        ("allocatable", Obj(&[("count", Int)])),
                        ("name", Str),
                        ("nodeID", Str),
                        ("topologyKeys", List(&Str)),
                    ]),
                    "name",
                ),
            )]),
        )],
        Kind::VolumeSnapshotClass => &[
            ("deletionPolicy", Str),
            ("driver", Str),
            ("parameters", Map(&Str)),
        ],
        Kind::VolumeSnapshot => &[
            (
                "spec",
                Obj(&[
                    (
                        "source",
                        Obj(&[
                            ("persistentVolumeClaimName", Str),
                            ("volumeSnapshotContentName", Str),
                        ]),
                    ),
                    ("volumeSnapshotClassName", Str),
                ]),
            ),
            (
                "status",
                Obj(&[
                    ("boundVolumeSnapshotContentName", Str),
                    ("creationTime", Time),
                    ("error", SNAPSHOT_ERROR),
                    ("readyToUse", Bool),
                    ("restoreSize", IntOrStr),
                    ("volumeGroupSnapshotName", Str),
                ]),
            ),
        ],
        Kind::VolumeSnapshotContent => &[
            (
                "spec",
                Obj(&[
                    ("deletionPolicy", Str),
                    ("driver", Str),
                    (
                        "source",
                        Obj(&[("snapshotHandle", Str), ("volumeHandle", Str)]),
                    ),
                    ("sourceVolumeMode", Str),
                    ("volumeSnapshotClassName", Str),
                    ("volumeSnapshotRef", OBJECT_REFERENCE),
                ]),
            ),
            (
                "status",
                Obj(&[
                    ("creationTime", Int),
                    ("error", SNAPSHOT_ERROR),
                    ("readyToUse", Bool),
                    ("restoreSize", Int),
                    ("snapshotHandle", Str),
                    ("volumeGroupSnapshotHandle", Str),
                ]),
            ),
        ],
        Kind::SnapshotMetadataService => &[(
            "spec",
            Obj(&[("address", Str), ("audience", Str), ("caCert", Bytes)]),
        )],
    }
}

/// The schema of a whole object of `kind` (apiVersion, kind, metadata and
/// its body), built once per kind.
pub(crate) fn root(kind: Kind) -> &'static S {
    static ROOTS: std::sync::OnceLock<std::collections::HashMap<Kind, &'static S>> =
        std::sync::OnceLock::new();
    ROOTS.get_or_init(|| {
        Kind::ALL
            .into_iter()
            .map(|k| {
                let mut fields: Vec<(&'static str, S)> =
                    vec![("apiVersion", Str), ("kind", Str), ("metadata", Meta)];
                fields.extend(body(k).iter().map(|(n, s)| (*n, s.shallow())));
                // Built once per process for a finite set of kinds: the leak is bounded.
                let fields: &'static [(&'static str, S)] = Box::leak(fields.into_boxed_slice());
                let root: &'static S = Box::leak(Box::new(Obj(fields)));
                (k, root)
            })
            .collect()
    })[&kind]
}

impl S {
    /// A copy of this node that shares its children (they are `'static`).
    fn shallow(&self) -> S {
        match self {
            Str => Str,
            Int => Int,
            Bool => Bool,
            Bytes => Bytes,
            Time => Time,
            IntOrStr => IntOrStr,
            List(i) => List(i),
            Set(i) => Set(i),
            Keyed(i, k) => Keyed(i, k),
            Map(v) => Map(v),
            Obj(f) => Obj(f),
            Free => Free,
            Meta => Meta,
        }
    }

    /// The node a `Meta` reference stands for.
    pub(crate) fn resolve(&self) -> &S {
        match self {
            Meta => &OBJECT_META,
            other => other,
        }
    }
}

/// True where the kind's schema keeps unknown fields somewhere (a [`S::Free`] part).
#[cfg(test)]
pub(crate) fn free_parts(kind: Kind) -> Vec<String> {
    fn walk(s: &S, path: &str, out: &mut Vec<String>) {
        match s {
            Free => out.push(path.to_string()),
            Obj(fields) => {
                for (n, f) in *fields {
                    walk(f, &format!("{path}.{n}"), out)
                }
            }
            List(i) | Set(i) | Keyed(i, _) => walk(i, &format!("{path}[]"), out),
            Map(v) => walk(v, &format!("{path}[*]"), out),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (n, f) in body(kind) {
        walk(f, n, &mut out);
    }
    out
}

/// The OpenAPI definition name of `kind` (`io.k8s.api.core.v1.Secret`; for a
/// CRD, its group reversed, as apiextensions' builder names it).
pub(crate) fn definition_name(kind: Kind) -> String {
    let group = kind.group();
    let prefix = match group {
        "" => "io.k8s.api.core".to_string(),
        "coordination.k8s.io" => "io.k8s.api.coordination".to_string(),
        "storage.k8s.io" => "io.k8s.api.storage".to_string(),
        g => g.split('.').rev().collect::<Vec<_>>().join("."),
    };
    format!("{prefix}.{}.{}", kind.version(), kind.kind_name())
}

/// The definition name of ObjectMeta.
pub(crate) const OBJECT_META_NAME: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// Renders a schema node as OpenAPI; `refs` is the definitions prefix
/// (`#/definitions/` in v2, `#/components/schemas/` in v3).
pub(crate) fn render(s: &S, refs: &str) -> Value {
    match s {
        Str => json!({"type": "string"}),
        Int => json!({"type": "integer", "format": "int64"}),
        Bool => json!({"type": "boolean"}),
        Bytes => json!({"type": "string", "format": "byte"}),
        Time => json!({"type": "string", "format": "date-time"}),
        IntOrStr => json!({"x-kubernetes-int-or-string": true}),
        List(i) => {
            json!({"type": "array", "items": render(i, refs), "x-kubernetes-list-type": "atomic"})
        }
        Set(i) => json!({
            "type": "array", "items": render(i, refs),
            "x-kubernetes-list-type": "set", "x-kubernetes-patch-strategy": "merge",
        }),
        Keyed(i, key) => json!({
            "type": "array", "items": render(i, refs),
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key],
            "x-kubernetes-patch-strategy": "merge", "x-kubernetes-patch-merge-key": key,
        }),
        Map(v) => json!({"type": "object", "additionalProperties": render(v, refs)}),
        Obj(fields) => {
            let props: Map<String, Value> = fields
                .iter()
                .map(|(n, f)| (n.to_string(), render(f, refs)))
                .collect();
            json!({"type": "object", "properties": props})
        }
        Free => json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        Meta => json!({"$ref": format!("{refs}{OBJECT_META_NAME}")}),
    }
}

/// The top-level schema of `kind`.
pub(crate) fn kind_schema(kind: Kind, refs: &str) -> Value {
    let mut props = Map::new();
    props.insert("apiVersion".into(), json!({"type": "string"}));
    props.insert("kind".into(), json!({"type": "string"}));
    props.insert("metadata".into(), render(&Meta, refs));
    for (n, f) in body(kind) {
        props.insert(n.to_string(), render(f, refs));
    }
    json!({
        "type": "object",
        "properties": props,
        "x-kubernetes-group-version-kind": [
            {"group": kind.group(), "version": kind.version(), "kind": kind.kind_name()}
        ],
    })
}

/// How a write treats fields its kind does not declare (`fieldValidation`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them and warn (the server's default).
    Warn,
    /// Refuse the write (400).
    Strict,
}

impl FieldValidation {
    /// Parses the query parameter; `None` for a value the server rejects.
    pub(crate) fn parse(v: Option<&str>) -> Option<Self> {
        match v {
            None | Some("") | Some("Warn") => Some(Self::Warn),
            Some("Ignore") => Some(Self::Ignore),
            Some("Strict") => Some(Self::Strict),
            Some(_) => None,
        }
    }
}

/// Paths of fields `obj` has that `kind` does not declare, in the decoder's
/// notation (`spec.foo`, `spec.list[0].bar`), removed from `obj` as the
/// real server drops them when it decodes into its types (or prunes a CRD).
pub(crate) fn prune_unknown(kind: Kind, obj: &mut Value) -> Vec<String> {
    let mut unknown = Vec::new();
    let Some(m) = obj.as_object_mut() else {
        return unknown;
    };
    let fields = body(kind);
    let keys: Vec<String> = m.keys().cloned().collect();
    for k in keys {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                if let Some(v) = m.get_mut("metadata") {
                    prune(&OBJECT_META, v, "metadata", &mut unknown)
                }
            }
            _ => match fields.iter().find(|(n, _)| *n == k) {
                Some((_, s)) => {
                    if let Some(v) = m.get_mut(&k) {
                        prune(s, v, &k, &mut unknown)
                    }
                }
                None => {
                    m.remove(&k);
                    unknown.push(k);
                }
            },
        }
    }
    unknown
}

fn prune(s: &S, v: &mut Value, path: &str, unknown: &mut Vec<String>) {
    match (s, v) {
        (Obj(fields), Value::Object(m)) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let sub = format!("{path}.{k}");
                match fields.iter().find(|(n, _)| *n == k) {
                    Some((_, f)) => {
                        if let Some(v) = m.get_mut(&k) {
                            prune(f, v, &sub, unknown)
                        }
                    }
                    None => {
                        m.remove(&k);
                        unknown.push(sub);
                    }
                }
            }
        }
        (List(i) | Set(i) | Keyed(i, _), Value::Array(a)) => {
            for (n, v) in a.iter_mut().enumerate() {
                prune(i, v, &format!("{path}[{n}]"), unknown)
            }
        }
        (Map(i), Value::Object(m)) => {
            for (k, v) in m.iter_mut() {
                prune(i, v, &format!("{path}[{k}]"), unknown)
            }
        }
        // Scalars, free parts and shape mismatches (reported by validation) stay.
        _ => {}
    }
}

/// The message of a strict decoding failure over `unknown` fields.
pub(crate) fn strict_error(unknown: &[String]) -> String {
    let list: Vec<String> = unknown
        .iter()
        .map(|p| format!("unknown field \"{p}\""))
        .collect();
    format!("strict decoding error: {}", list.join(", "))
}

/// Field validation of a decoded write body (`created`: a POST or PUT, whose
/// strict failure names the kind as the decoder does; else a patch result):
/// unknown fields are dropped; under `Strict` they are a 400, under `Warn`
/// each is a warning (`unknown field "spec.foo"`), as the handlers in
/// k8s.io/apiserver/pkg/endpoints/handlers (create.go, update.go, patch.go) do.
pub(crate) fn validate_fields(
    obj: &mut Value,
    kind: Kind,
    mode: FieldValidation,
    created: bool,
) -> Result<Vec<String>, KubeError> {
    let unknown = prune_unknown(kind, obj);
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    match mode {
        FieldValidation::Ignore => Ok(Vec::new()),
        FieldValidation::Warn => Ok(unknown
            .iter()
            .map(|p| format!("unknown field \"{p}\""))
            .collect()),
        FieldValidation::Strict if created => Err(KubeError::BadRequest {
            // transformDecodeError's wording.
            message: format!(
                "{k} in version \"{v}\" cannot be handled as a {k}: {e}",
                k = kind.kind_name(),
                v = kind.version(),
                e = strict_error(&unknown)
            ),
        }),
        FieldValidation::Strict => Err(KubeError::BadRequest {
            message: strict_error(&unknown),
        }),
    }
}

/// Server-side apply converts its configuration to the kind's type before
/// anything else; a field the schema does not declare fails that conversion
/// (structured-merge-diff `typed.ObjectToTyped`), reported by the real server
/// as a plain error: 500 with no reason, `failed to create typed patch object
/// (ns/name; group/version, Kind=K): .spec.foo: field not declared in schema`.
pub(crate) fn check_apply(
    kind: Kind,
    ns: Option<&str>,
    name: &str,
    body: &Value,
) -> Result<(), KubeError> {
    let mut copy = body.clone();
    let unknown = prune_unknown(kind, &mut copy);
    if unknown.is_empty() {
        return Ok(());
    }
    let gv = if kind.group().is_empty() {
        format!("/{}", kind.version())
    } else {
        format!("{}/{}", kind.group(), kind.version())
    };
    let errors: Vec<String> = unknown
        .iter()
        .map(|p| format!(".{p}: field not declared in schema"))
        .collect();
    let detail = match errors.as_slice() {
        [one] => one.clone(),
        many => format!("errors:\n  {}", many.join("\n  ")),
    };
    Err(KubeError::Internal {
        message: format!(
            "failed to create typed patch object ({}/{name}; {gv}, Kind={}): {detail}",
            ns.filter(|_| kind.namespaced()).unwrap_or(""),
            kind.kind_name()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prunes_and_names_unknown_fields() {
        let mut o = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a", "colour": 1},
            "data": {"k": "dg=="}, "foo": 1});
        let u = prune_unknown(Kind::Secret, &mut o);
        assert_eq!(u, vec!["foo".to_string(), "metadata.colour".to_string()]);
        assert!(o.get("foo").is_none());
        assert_eq!(o["data"]["k"], "dg==");
        let mut c =
            json!({"spec": {"protocols": ["S3"], "bucketClassName": "x", "extra": {"a": 1}}});
        assert_eq!(
            prune_unknown(Kind::BucketClaim, &mut c),
            vec!["spec.extra".to_string()]
        );
        let mut n = json!({"spec": {"drivers": [{"name": "d", "nope": true}]}});
        assert_eq!(
            prune_unknown(Kind::CsiNode, &mut n),
            vec!["spec.drivers[0].nope".to_string()]
        );
        // Free parts keep anything.
        let mut p = json!({"spec": {"containers": [{"image": "x", "whatever": 1}]}});
        assert!(prune_unknown(Kind::Pod, &mut p).is_empty());
        assert_eq!(
            strict_error(&["spec.foo".into(), "bar".into()]),
            "strict decoding error: unknown field \"spec.foo\", unknown field \"bar\""
        );
    }

    #[test]
    fn names_definitions_as_the_server_does() {
        assert_eq!(definition_name(Kind::Secret), "io.k8s.api.core.v1.Secret");
        assert_eq!(
            definition_name(Kind::StorageClass),
            "io.k8s.api.storage.v1.StorageClass"
        );
        assert_eq!(
            definition_name(Kind::BucketClaim),
            "io.k8s.objectstorage.v1alpha1.BucketClaim"
        );
        assert_eq!(
            definition_name(Kind::VolumeSnapshot),
            "io.k8s.storage.snapshot.v1.VolumeSnapshot"
        );
        assert!(free_parts(Kind::Pod).contains(&"spec".to_string()));
        assert!(free_parts(Kind::Secret).is_empty());
    }
}

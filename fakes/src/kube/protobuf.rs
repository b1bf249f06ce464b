//! Request bodies in the Kubernetes protobuf wire format
//! (`application/vnd.kubernetes.protobuf`), as client-go's typed clients send
//! them (kubectl's `create secret`, `create configmap`, `create namespace`):
//! the 4-byte magic `k8s\0`, then a `runtime.Unknown` envelope whose `raw`
//! holds the typed object (k8s.io/apimachinery/pkg/runtime/serializer/protobuf
//! `Serializer.Decode`). Decoded into the same JSON the API takes, for the
//! kinds below only; any other kind is refused with 415 by the caller.
//!
//! The messages are the fields of k8s.io/api core/v1 and apimachinery meta/v1
//! `generated.proto` (proto2; tags as there), written as prost derives: three
//! kinds do not justify a dependency carrying every Kubernetes type.

use std::collections::BTreeMap;

use prost::Message;
use serde_json::{json, Map, Value};

use super::validate::base64_encode;
use super::Kind;

/// The media type of the wire format.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The magic prefix of every protobuf-encoded Kubernetes object.
const MAGIC: &[u8; 4] = b"k8s\0";

/// Why a protobuf body could not be taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProtobufError {
    /// Not the wire format (no magic, bad envelope or object bytes).
    #[error("{0}")]
    Malformed(String),
    /// A kind whose protobuf form this fake does not decode.
    #[error("{0}")]
    Unsupported(String),
}

/// The kinds whose protobuf bodies are decoded.
pub(crate) const DECODED: [Kind; 3] = [Kind::Secret, Kind::ConfigMap, Kind::Namespace];

#[derive(Clone, PartialEq, Message)]
struct TypeMeta {
    #[prost(string, optional, tag = "1")]
    api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    kind: Option<String>,
}

/// `runtime.Unknown`.
#[derive(Clone, PartialEq, Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", optional, tag = "2")]
    raw: Option<Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    content_encoding: Option<String>,
    #[prost(string, optional, tag = "4")]
    content_type: Option<String>,
}

/// `metav1.Time`.
#[derive(Clone, PartialEq, Message)]
struct Time {
    #[prost(int64, optional, tag = "1")]
    seconds: Option<i64>,
    #[prost(int32, optional, tag = "2")]
    nanos: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct OwnerReference {
    #[prost(string, optional, tag = "1")]
    kind: Option<String>,
    #[prost(string, optional, tag = "3")]
    name: Option<String>,
    #[prost(string, optional, tag = "4")]
    uid: Option<String>,
    #[prost(string, optional, tag = "5")]
    api_version: Option<String>,
    #[prost(bool, optional, tag = "6")]
    controller: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    block_owner_deletion: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct FieldsV1 {
    #[prost(bytes = "vec", optional, tag = "1")]
    raw: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct ManagedFieldsEntry {
    #[prost(string, optional, tag = "1")]
    manager: Option<String>,
    #[prost(string, optional, tag = "2")]
    operation: Option<String>,
    #[prost(string, optional, tag = "3")]
    api_version: Option<String>,
    #[prost(message, optional, tag = "4")]
    time: Option<Time>,
    #[prost(string, optional, tag = "6")]
    fields_type: Option<String>,
    #[prost(message, optional, tag = "7")]
    fields_v1: Option<FieldsV1>,
    #[prost(string, optional, tag = "8")]
    subresource: Option<String>,
}

/// `metav1.ObjectMeta`.
#[derive(Clone, PartialEq, Message)]
struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    generate_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "4")]
    self_link: Option<String>,
    #[prost(string, optional, tag = "5")]
    uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
    #[prost(int64, optional, tag = "7")]
    generation: Option<i64>,
    #[prost(message, optional, tag = "8")]
    creation_timestamp: Option<Time>,
    #[prost(message, optional, tag = "9")]
    deletion_timestamp: Option<Time>,
    #[prost(int64, optional, tag = "10")]
    deletion_grace_period_seconds: Option<i64>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    annotations: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    owner_references: Vec<OwnerReference>,
    #[prost(string, repeated, tag = "14")]
    finalizers: Vec<String>,
    #[prost(message, repeated, tag = "17")]
    managed_fields: Vec<ManagedFieldsEntry>,
}

/// core/v1 `Secret`.
#[derive(Clone, PartialEq, Message)]
struct Secret {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(btree_map = "string, bytes", tag = "2")]
    data: BTreeMap<String, Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    r#type: Option<String>,
    #[prost(btree_map = "string, string", tag = "4")]
    string_data: BTreeMap<String, String>,
    #[prost(bool, optional, tag = "5")]
    immutable: Option<bool>,
}

/// core/v1 `ConfigMap`.
#[derive(Clone, PartialEq, Message)]
struct ConfigMap {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(btree_map = "string, string", tag = "2")]
    data: BTreeMap<String, String>,
    #[prost(btree_map = "string, bytes", tag = "3")]
    binary_data: BTreeMap<String, Vec<u8>>,
    #[prost(bool, optional, tag = "4")]
    immutable: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct NamespaceSpec {
    #[prost(string, repeated, tag = "1")]
    finalizers: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct NamespaceCondition {
    #[prost(string, optional, tag = "1")]
    r#type: Option<String>,
    #[prost(string, optional, tag = "2")]
    status: Option<String>,
    #[prost(message, optional, tag = "4")]
    last_transition_time: Option<Time>,
    #[prost(string, optional, tag = "5")]
    reason: Option<String>,
    #[prost(string, optional, tag = "6")]
    message: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct NamespaceStatus {
    #[prost(string, optional, tag = "1")]
    phase: Option<String>,
    #[prost(message, repeated, tag = "2")]
    conditions: Vec<NamespaceCondition>,
}

/// core/v1 `Namespace`.
#[derive(Clone, PartialEq, Message)]
struct Namespace {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<NamespaceSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<NamespaceStatus>,
}

/// Decodes a protobuf request body for `kind` into the JSON object the API takes.
pub(crate) fn decode(kind: Kind, body: &[u8]) -> Result<Value, ProtobufError> {
    let malformed = |m: String| ProtobufError::Malformed(m);
    if !DECODED.contains(&kind) {
        return Err(ProtobufError::Unsupported(unsupported_message(kind)));
    }
    let rest = body
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| malformed("provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]".into()))?;
    let env = Unknown::decode(rest).map_err(|e| {
        malformed(format!(
            "the protobuf envelope is not a runtime.Unknown: {e}"
        ))
    })?;
    if env
        .content_encoding
        .as_deref()
        .is_some_and(|e| !e.is_empty())
    {
        return Err(malformed(format!(
            "content encoding {:?} of the protobuf envelope is not supported",
            env.content_encoding.unwrap_or_default()
        )));
    }
    let tm = env.type_meta.unwrap_or_default();
    let (api_version, kind_name) = (
        tm.api_version.unwrap_or_default(),
        tm.kind.unwrap_or_default(),
    );
    if (!api_version.is_empty() && api_version != kind.api_version())
        || (!kind_name.is_empty() && kind_name != kind.kind_name())
    {
        return Err(malformed(format!(
            "the object in the body is {api_version}, Kind={kind_name}, not {}, Kind={}",
            kind.api_version(),
            kind.kind_name()
        )));
    }
    let raw = env.raw.unwrap_or_default();
    let bad = |e: prost::DecodeError| {
        malformed(format!(
            "the {} in the body does not decode: {e}",
            kind.kind_name()
        ))
    };
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), json!(kind.api_version()));
    obj.insert("kind".into(), json!(kind.kind_name()));
    let put = |o: &mut Map<String, Value>, k: &str, v: Value| {
        o.insert(k.to_string(), v);
    };
    match kind {
        Kind::Secret => {
            let s = Secret::decode(raw.as_slice()).map_err(bad)?;
            put(&mut obj, "metadata", meta(s.metadata.unwrap_or_default()));
            if !s.data.is_empty() {
                let d: Map<String, Value> = s
                    .data
                    .into_iter()
                    .map(|(k, v)| (k, json!(base64_encode(&v))))
                    .collect();
                put(&mut obj, "data", Value::Object(d));
            }
            if !s.string_data.is_empty() {
                put(&mut obj, "stringData", json!(s.string_data));
            }
            if let Some(t) = s.r#type.filter(|t| !t.is_empty()) {
                put(&mut obj, "type", json!(t));
            }
            if let Some(i) = s.immutable {
                put(&mut obj, "immutable", json!(i));
            }
        }
        Kind::ConfigMap => {
            let c = ConfigMap::decode(raw.as_slice()).map_err(bad)?;
            put(&mut obj, "metadata", meta(c.metadata.unwrap_or_default()));
            if !c.data.is_empty() {
                put(&mut obj, "data", json!(c.data));
            }
            if !c.binary_data.is_empty() {
                let d: Map<String, Value> = c
                    .binary_data
                    .into_iter()
                    .map(|(k, v)| (k, json!(base64_encode(&v))))
                    .collect();
                put(&mut obj, "binaryData", Value::Object(d));
            }
            if let Some(i) = c.immutable {
                put(&mut obj, "immutable", json!(i));
            }
        }
        _ => {
            let n = Namespace::decode(raw.as_slice()).map_err(bad)?;
            put(&mut obj, "metadata", meta(n.metadata.unwrap_or_default()));
            if let Some(spec) = n.spec.filter(|s| !s.finalizers.is_empty()) {
                put(&mut obj, "spec", json!({"finalizers": spec.finalizers}));
            }
            if let Some(st) = n.status {
                let mut status = Map::new();
                if let Some(p) = st.phase.filter(|p| !p.is_empty()) {
                    status.insert("phase".into(), json!(p));
                }
                if !st.conditions.is_empty() {
                    let conds: Vec<Value> = st
                        .conditions
                        .into_iter()
                        .map(|c| {
                            let mut m = Map::new();
                            opt(&mut m, "type", c.r#type);
                            opt(&mut m, "status", c.status);
                            if let Some(t) = c.last_transition_time.and_then(rfc3339) {
                                m.insert("lastTransitionTime".into(), json!(t));
                            }
                            opt(&mut m, "reason", c.reason);
                            opt(&mut m, "message", c.message);
                            Value::Object(m)
                        })
                        .collect();
                    status.insert("conditions".into(), json!(conds));
                }
                if !status.is_empty() {
                    put(&mut obj, "status", Value::Object(status));
                }
            }
        }
    }
    Ok(Value::Object(obj))
}

/// The 415 message for a protobuf body of `kind`.
pub(crate) fn unsupported_message(kind: Kind) -> String {
    let served: Vec<&str> = DECODED.iter().map(|k| k.kind_name()).collect();
    format!(
        "the body of the request was in an unknown format (\"application/vnd.kubernetes.protobuf\") for {}: this fake decodes protobuf bodies of {} only - accepted media types include: application/json",
        kind.kind_name(),
        served.join(", ")
    )
}

fn opt(m: &mut Map<String, Value>, k: &str, v: Option<String>) {
    if let Some(v) = v.filter(|v| !v.is_empty()) {
        m.insert(k.into(), json!(v));
    }
}

fn rfc3339(t: Time) -> Option<String> {
    let fmt = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    time::OffsetDateTime::from_unix_timestamp(t.seconds.unwrap_or(0))
        .ok()
        .and_then(|t| t.format(&fmt).ok())
}

fn meta(m: ObjectMeta) -> Value {
    let mut o = Map::new();
    opt(&mut o, "name", m.name);
    opt(&mut o, "generateName", m.generate_name);
    opt(&mut o, "namespace", m.namespace);
    opt(&mut o, "selfLink", m.self_link);
    opt(&mut o, "uid", m.uid);
    opt(&mut o, "resourceVersion", m.resource_version);
    if let Some(g) = m.generation.filter(|g| *g != 0) {
        o.insert("generation".into(), json!(g));
    }
    if let Some(t) = m.creation_timestamp.and_then(rfc3339) {
        o.insert("creationTimestamp".into(), json!(t));
    }
    if let Some(t) = m.deletion_timestamp.and_then(rfc3339) {
        o.insert("deletionTimestamp".into(), json!(t));
    }
    if let Some(g) = m.deletion_grace_period_seconds {
        o.insert("deletionGracePeriodSeconds".into(), json!(g));
    }
    if !m.labels.is_empty() {
        o.insert("labels".into(), json!(m.labels));
    }
    if !m.annotations.is_empty() {
        o.insert("annotations".into(), json!(m.annotations));
    }
    if !m.owner_references.is_empty() {
        let refs: Vec<Value> = m
            .owner_references
            .into_iter()
            .map(|r| {
                let mut x = Map::new();
                opt(&mut x, "apiVersion", r.api_version);
                opt(&mut x, "kind", r.kind);
                opt(&mut x, "name", r.name);
                opt(&mut x, "uid", r.uid);
                if let Some(c) = r.controller {
                    x.insert("controller".into(), json!(c));
                }
                if let Some(b) = r.block_owner_deletion {
                    x.insert("blockOwnerDeletion".into(), json!(b));
                }
                Value::Object(x)
            })
            .collect();
        o.insert("ownerReferences".into(), json!(refs));
    }
    if !m.finalizers.is_empty() {
        o.insert("finalizers".into(), json!(m.finalizers));
    }
    if !m.managed_fields.is_empty() {
        let entries: Vec<Value> = m
            .managed_fields
            .into_iter()
            .map(|e| {
                let mut x = Map::new();
                opt(&mut x, "manager", e.manager);
                opt(&mut x, "operation", e.operation);
                opt(&mut x, "apiVersion", e.api_version);
                if let Some(t) = e.time.and_then(rfc3339) {
                    x.insert("time".into(), json!(t));
                }
                opt(&mut x, "fieldsType", e.fields_type);
                if let Some(raw) = e.fields_v1.and_then(|f| f.raw) {
                    let v: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
                    x.insert("fieldsV1".into(), v);
                }
                opt(&mut x, "subresource", e.subresource);
                Value::Object(x)
            })
            .collect();
        o.insert("managedFields".into(), json!(entries));
    }
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let env = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some("v1".into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        let mut out = MAGIC.to_vec();
        out.extend(env.encode_to_vec());
        out
    }

    #[test]
    fn decodes_a_secret_as_kubectl_sends_it() {
        let s = Secret {
            metadata: Some(ObjectMeta {
                name: Some("x".into()),
                creation_timestamp: Some(Time::default()),
                ..Default::default()
            }),
            data: [("a".to_string(), b"b".to_vec())].into_iter().collect(),
            r#type: Some("Opaque".into()),
            ..Default::default()
        };
        let v = decode(Kind::Secret, &wire("Secret", s.encode_to_vec())).unwrap();
        assert_eq!(v["metadata"]["name"], "x");
        assert_eq!(v["data"]["a"], "Yg==");
        assert_eq!(v["type"], "Opaque");
        assert_eq!(v["kind"], "Secret");
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert!(matches!(
            decode(Kind::Secret, b"{}"),
            Err(ProtobufError::Malformed(_))
        ));
        assert!(matches!(
            decode(Kind::Secret, &wire("ConfigMap", vec![])),
            Err(ProtobufError::Malformed(_))
        ));
        assert!(matches!(
            decode(Kind::Pod, &wire("Pod", vec![])),
            Err(ProtobufError::Unsupported(_))
        ));
        let c = ConfigMap {
            data: [("k".to_string(), "v".to_string())].into_iter().collect(),
            ..Default::default()
        };
        let v = decode(Kind::ConfigMap, &wire("ConfigMap", c.encode_to_vec())).unwrap();
        assert_eq!(v["data"]["k"], "v");
    }
}

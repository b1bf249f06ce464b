//! Strategic merge patch (`application/strategic-merge-patch+json`) on the
//! built-in kinds, following k8s.io/apimachinery's `strategicpatch`: maps
//! merge as in a JSON merge patch; a list merges as its Go field's
//! `patchStrategy`/`patchMergeKey` declare — primitives as a set union, objects
//! by their merge key — or is replaced when atomic; the directives `$patch`
//! (replace, delete), `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>`
//! and `$retainKeys` are honoured. A list this fake has no strategy for is
//! refused as not implemented, never silently replaced.

use serde_json::{Map, Value};

use super::Kind;

/// How a list field is patched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListStrategy {
    /// Replaced by the patch's list (no `patchStrategy` tag).
    Atomic,
    /// Merged: primitives as a set (`key` None), objects by `key`.
    Merge { key: Option<&'static str> },
}

/// Why a strategic merge patch was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StrategicError {
    /// The patch is malformed (400 on the real server).
    #[error("{0}")]
    Malformed(String),
    /// It patches a list whose strategy this fake does not know (501).
    #[error("drivelab's Kubernetes fake does not implement strategic merge of the list {0}; send a JSON merge patch or a JSON patch")]
    NotImplemented(String),
}

/// The strategy of the list at `path` (field names from the object's root) in `kind`.
fn list_strategy(kind: Kind, path: &[String]) -> Option<ListStrategy> {
    use ListStrategy::{Atomic, Merge};
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    let by = |key| Merge { key: Some(key) };
    Some(match p.as_slice() {
        ["metadata", "finalizers"] => Merge { key: None },
        ["metadata", "ownerReferences"] => by("uid"),
        ["metadata", "managedFields"] => Atomic,
        [..] => match (kind, &p[..]) {
            (Kind::PersistentVolumeClaim | Kind::PersistentVolume, ["spec", "accessModes"])
            | (Kind::PersistentVolumeClaim, ["status", "accessModes"])
            | (Kind::PersistentVolume, ["spec", "mountOptions"])
            | (Kind::PersistentVolume, ["spec", "nodeAffinity", ..])
            | (Kind::StorageClass, ["mountOptions" | "allowedTopologies", ..])
            | (Kind::CsiNode, ["spec", "drivers", "topologyKeys"])
            | (Kind::Pod, ["spec", "containers" | "initContainers", "args" | "command"])
            | (Kind::Pod, ["status", "containerStatuses" | "initContainerStatuses"]) => Atomic,
            (Kind::Pod, ["spec", "tolerations"]) => Atomic,
            (Kind::PersistentVolumeClaim | Kind::Pod, ["status", "conditions"]) => by("type"),
            (Kind::CsiNode, ["spec", "drivers"]) => by("name"),
            (
                Kind::Pod,
                ["spec", "containers" | "initContainers" | "volumes" | "imagePullSecrets"],
            ) => by("name"),
            (Kind::Pod, ["spec", "containers" | "initContainers", "env"]) => by("name"),
            (Kind::Pod, ["spec", "containers" | "initContainers", "volumeMounts"]) => {
                by("mountPath")
            }
            (Kind::Pod, ["spec", "containers" | "initContainers", "ports"]) => by("containerPort"),
            _ => return None,
        },
    })
}

/// Apply `patch` to `target`, an object of `kind`.
pub fn strategic_merge_patch(
    kind: Kind,
    target: &Value,
    patch: &Value,
) -> Result<Value, StrategicError> {
    if !patch.is_object() {
        return Err(StrategicError::Malformed(
            "a strategic merge patch must be a JSON object".into(),
        ));
    }
    let mut path = Vec::new();
    Ok(merge_map(kind, target, patch, &mut path)?.unwrap_or(Value::Object(Map::new())))
}

/// Merge map `patch` into `target`; None when the patch deletes the map.
fn merge_map(
    kind: Kind,
    target: &Value,
    patch: &Value,
    path: &mut Vec<String>,
) -> Result<Option<Value>, StrategicError> {
    let Value::Object(p) = patch else {
        return Ok(Some(patch.clone()));
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("delete") => return Ok(None),
        Some("replace") => return Ok(Some(strip_directives(patch))),
        Some(other) => {
            return Err(StrategicError::Malformed(format!(
                "unknown patch type: {other} in map"
            )))
        }
        None => {}
    }
    let mut out = match target {
        Value::Object(t) => t.clone(),
        _ => Map::new(),
    };
    for (k, v) in p {
        if k.starts_with('$') {
            continue; // directives: applied below, once their field is merged
        }
        path.push(k.clone());
        let merged = match v {
            Value::Null => None,
            Value::Object(_) => merge_map(kind, out.get(k).unwrap_or(&Value::Null), v, path)?,
            Value::Array(items) => Some(merge_list(kind, out.get(k), items, path)?),
            scalar => Some(scalar.clone()),
        };
        path.pop();
        match merged {
            Some(m) => out.insert(k.clone(), m),
            None => out.remove(k),
        };
    }
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let gone = v.as_array().ok_or_else(|| {
                StrategicError::Malformed(format!("{k}: expected a list of values"))
            })?;
            if let Some(Value::Array(list)) = out.get_mut(field) {
                list.retain(|x| !gone.contains(x));
            }
        } else if let Some(field) = k.strip_prefix("$setElementOrder/") {
            if let (Some(Value::Array(list)), Some(order)) = (out.get_mut(field), v.as_array()) {
                reorder(list, order);
            }
        }
    }
    if let Some(keep) = p.get("$retainKeys").and_then(Value::as_array) {
        out.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k)));
    }
    Ok(Some(Value::Object(out)))
}

/// Merge the patch's list `items` into the target's list at `path`.
fn merge_list(
    kind: Kind,
    target: Option<&Value>,
    items: &[Value],
    path: &mut Vec<String>,
) -> Result<Value, StrategicError> {
    let strategy =
        list_strategy(kind, path).ok_or_else(|| StrategicError::NotImplemented(path.join(".")))?;
    let existing = match target {
        Some(Value::Array(a)) => a.clone(),
        _ => Vec::new(),
    };
    let replace = items
        .iter()
        .any(|x| x.get("$patch").and_then(Value::as_str) == Some("replace"));
    let plain: Vec<Value> = items
        .iter()
        .filter(|x| x.get("$patch").and_then(Value::as_str) != Some("replace"))
        .cloned()
        .collect();
    match strategy {
        ListStrategy::Atomic => Ok(Value::Array(plain.iter().map(strip_directives).collect())),
        _ if replace => Ok(Value::Array(plain.iter().map(strip_directives).collect())),
        ListStrategy::Merge { key: None } => {
            let mut out = existing;
            for x in plain {
                if !out.contains(&x) {
                    out.push(x);
                }
            }
            Ok(Value::Array(out))
        }
        ListStrategy::Merge { key: Some(key) } => {
            let mut out = existing;
            for x in &plain {
                let id = x.get(key).cloned().ok_or_else(|| {
                    StrategicError::Malformed(format!(
                        "{}: an element does not contain declared merge key: {key}",
                        path.join(".")
                    ))
                })?;
                let at = out.iter().position(|e| e.get(key) == Some(&id));
                match (
                    at,
                    merge_map(kind, at.map_or(&Value::Null, |i| &out[i]), x, path)?,
                ) {
                    (Some(i), Some(m)) => out[i] = m,
                    (Some(i), None) => {
                        out.remove(i);
                    }
                    (None, Some(m)) => out.push(m),
                    (None, None) => {}
                }
            }
            Ok(Value::Array(out))
        }
    }
}

/// Put `list`'s elements in `order`'s order (elements the order does not name keep theirs, after).
fn reorder(list: &mut [Value], order: &[Value]) {
    let rank = |x: &Value| {
        order.iter().position(|o| match o {
            Value::Object(m) => m.iter().all(|(k, v)| x.get(k) == Some(v)),
            other => other == x,
        })
    };
    list.sort_by_key(|x| rank(x).unwrap_or(usize::MAX));
}

/// `v` without `$`-directives at its top level.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smp(kind: Kind, t: Value, p: Value) -> Result<Value, StrategicError> {
        strategic_merge_patch(kind, &t, &p)
    }

    #[test]
    fn finalizers_merge_as_a_set_and_leave_by_directive() {
        let t = json!({"metadata": {"finalizers": ["a", "b"]}, "data": {"k": "v"}});
        let out = smp(
            Kind::Secret,
            t.clone(),
            json!({"metadata": {"finalizers": ["c", "a"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
        assert_eq!(out["data"], json!({"k": "v"}));
        let out = smp(
            Kind::Secret,
            t,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn keyed_lists_merge_by_their_key_and_delete_by_directive() {
        let t = json!({"metadata": {"ownerReferences": [
            {"uid": "1", "name": "a", "kind": "Pod"}, {"uid": "2", "name": "b", "kind": "Pod"}]}});
        let out = smp(
            Kind::ConfigMap,
            t,
            json!({"metadata": {"ownerReferences": [
                {"uid": "1", "name": "renamed"}, {"uid": "2", "$patch": "delete"}, {"uid": "3", "name": "c"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["metadata"]["ownerReferences"],
            json!([{"uid": "1", "name": "renamed", "kind": "Pod"}, {"uid": "3", "name": "c"}])
        );
        let csinode = json!({"spec": {"drivers": [{"name": "a", "nodeID": "1"}]}});
        let out = smp(
            Kind::CsiNode,
            csinode,
            json!({"spec": {"drivers": [{"name": "b", "nodeID": "2"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["drivers"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn atomic_lists_are_replaced_and_replace_directives_win() {
        let t =
            json!({"spec": {"accessModes": ["ReadWriteOnce"]}, "metadata": {"finalizers": ["a"]}});
        let out = smp(
            Kind::PersistentVolumeClaim,
            t.clone(),
            json!({"spec": {"accessModes": ["ReadOnlyMany"]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["accessModes"], json!(["ReadOnlyMany"]));
        let out = smp(
            Kind::PersistentVolumeClaim,
            t,
            json!({"metadata": {"finalizers": [{"$patch": "replace"}, "z"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["z"]));
    }

    #[test]
    fn an_unknown_list_is_refused_not_replaced() {
        let e = smp(
            Kind::Pod,
            json!({}),
            json!({"spec": {"readinessGates": [{"conditionType": "x"}]}}),
        )
        .unwrap_err();
        assert_eq!(
            e,
            StrategicError::NotImplemented("spec.readinessGates".into())
        );
        assert!(matches!(
            smp(
                Kind::Secret,
                json!({}),
                json!({"metadata": {"ownerReferences": [{"name": "no-uid"}]}})
            ),
            Err(StrategicError::Malformed(_))
        ));
    }
}

//! Validation of the snapshot.storage.k8s.io/v1 kinds (VolumeSnapshotClass,
//! VolumeSnapshot, VolumeSnapshotContent) and the cbt.storage.k8s.io
//! SnapshotMetadataService, as their CRDs' schemas and CEL rules enforce them.

use serde_json::Value;

use super::validate::{self, Violation};
use super::Kind;

/// API group of the snapshot kinds.
pub const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";
/// `apiVersion` of the snapshot kinds.
pub const SNAPSHOT_API_VERSION: &str = "snapshot.storage.k8s.io/v1";

const POLICIES: [&str; 2] = ["Delete", "Retain"];

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    crate::json::at(v, path)
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn set(v: &Value, path: &[&str]) -> bool {
    crate::json::at(v, path).is_some_and(|x| !x.is_null())
}

fn required(field: &str) -> Violation {
    (field.to_string(), "Required value".to_string())
}

fn policy(v: &Value, path: &[&str], field: &str) -> Result<(), Violation> {
    match s(v, path) {
        "" => Err(required(field)),
        p if POLICIES.contains(&p) => Ok(()),
        p => Err((
            field.to_string(),
            format!("Unsupported value: {p:?}: supported values: \"Delete\", \"Retain\""),
        )),
    }
}

/// Exactly one of two source fields (the CRDs' `oneOf` + CEL rule).
fn one_source(obj: &Value, a: &str, b: &str) -> Result<(), Violation> {
    if set(obj, &["spec", "source", a]) == set(obj, &["spec", "source", b]) {
        return Err((
            "spec.source".into(),
            format!("Invalid value: \"object\": Exactly one of {a} and {b} must be set"),
        ));
    }
    for f in [a, b] {
        if set(obj, &["spec", "source", f]) && s(obj, &["spec", "source", f]).is_empty() {
            return Err((
                format!("spec.source.{f}"),
                "Invalid value: must be a non-empty string".into(),
            ));
        }
    }
    Ok(())
}

/// Create/update checks for one snapshot kind.
pub(crate) fn rules(kind: Kind, obj: &mut Value) -> Result<(), Violation> {
    match kind {
        Kind::VolumeSnapshotClass => {
            if s(obj, &["driver"]).is_empty() {
                return Err(required("driver"));
            }
            policy(obj, &["deletionPolicy"], "deletionPolicy")?;
            if let Some(p) = obj.get("parameters").filter(|p| !p.is_null()) {
                validate::string_map(p, "parameters")?;
            }
        }
        Kind::VolumeSnapshot => {
            if !set(obj, &["spec", "source"]) {
                return Err(required("spec.source"));
            }
            one_source(
                obj,
                "persistentVolumeClaimName",
                "volumeSnapshotContentName",
            )?;
            if set(obj, &["spec", "volumeSnapshotClassName"])
                && s(obj, &["spec", "volumeSnapshotClassName"]).is_empty()
            {
                return Err((
                    "spec.volumeSnapshotClassName".into(),
                    "Invalid value: volumeSnapshotClassName must not be the empty string when set"
                        .into(),
                ));
            }
        }
        Kind::VolumeSnapshotContent => {
            if s(obj, &["spec", "driver"]).is_empty() {
                return Err(required("spec.driver"));
            }
            policy(obj, &["spec", "deletionPolicy"], "spec.deletionPolicy")?;
            if !set(obj, &["spec", "source"]) {
                return Err(required("spec.source"));
            }
            one_source(obj, "volumeHandle", "snapshotHandle")?;
            if s(obj, &["spec", "volumeSnapshotRef", "name"]).is_empty()
                || s(obj, &["spec", "volumeSnapshotRef", "namespace"]).is_empty()
            {
                return Err((
                    "spec.volumeSnapshotRef".into(),
                    "Invalid value: both spec.volumeSnapshotRef.name and spec.volumeSnapshotRef.namespace must be set".into(),
                ));
            }
        }
        Kind::SnapshotMetadataService => {
            for f in ["address", "audience", "caCert"] {
                if s(obj, &["spec", f]).is_empty() {
                    return Err(required(&format!("spec.{f}")));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Immutable fields of the snapshot kinds.
pub(crate) fn update_rules(kind: Kind, old: &Value, new: &Value) -> Result<(), Violation> {
    let fixed: &[(&[&str], &str)] = match kind {
        Kind::VolumeSnapshotClass => &[
            (&["driver"], "driver"),
            (&["parameters"], "parameters"),
            (&["deletionPolicy"], "deletionPolicy"),
        ],
        Kind::VolumeSnapshot => &[
            (
                &["spec", "source", "persistentVolumeClaimName"],
                "persistentVolumeClaimName",
            ),
            (
                &["spec", "source", "volumeSnapshotContentName"],
                "volumeSnapshotContentName",
            ),
        ],
        Kind::VolumeSnapshotContent => &[
            (&["spec", "source", "volumeHandle"], "volumeHandle"),
            (&["spec", "source", "snapshotHandle"], "snapshotHandle"),
        ],
        _ => &[],
    };
    for (path, name) in fixed {
        if crate::json::at(old, path) != crate::json::at(new, path) {
            return Err((
                path.join("."),
                format!("Invalid value: \"string\": {name} is immutable"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn volume_snapshot_needs_exactly_one_source() {
        let mut ok = json!({"spec":{"source":{"persistentVolumeClaimName":"data"}}});
        rules(Kind::VolumeSnapshot, &mut ok).unwrap();
        let mut both = json!({"spec":{"source":{"persistentVolumeClaimName":"d","volumeSnapshotContentName":"c"}}});
        assert_eq!(
            rules(Kind::VolumeSnapshot, &mut both).unwrap_err().0,
            "spec.source"
        );
        assert!(rules(Kind::VolumeSnapshot, &mut json!({"spec":{}})).is_err());
        let mut moved = ok.clone();
        moved["spec"]["source"]["persistentVolumeClaimName"] = json!("other");
        assert!(update_rules(Kind::VolumeSnapshot, &ok, &moved).is_err());
        let mut status = ok.clone();
        status["status"] = json!({"readyToUse": true});
        assert!(update_rules(Kind::VolumeSnapshot, &ok, &status).is_ok());
    }

    #[test]
    fn content_and_class_rules() {
        let content = json!({"spec":{"driver":"d","deletionPolicy":"Delete",
            "source":{"volumeHandle":"v"},"volumeSnapshotRef":{"name":"s","namespace":"n"}}});
        rules(Kind::VolumeSnapshotContent, &mut content.clone()).unwrap();
        let mut bad_policy = content.clone();
        bad_policy["spec"]["deletionPolicy"] = json!("Recycle");
        assert!(rules(Kind::VolumeSnapshotContent, &mut bad_policy).is_err());
        let mut no_ref = content.clone();
        no_ref["spec"]["volumeSnapshotRef"] = json!({"name":"s"});
        assert!(rules(Kind::VolumeSnapshotContent, &mut no_ref).is_err());
        assert!(rules(Kind::VolumeSnapshotClass, &mut json!({"driver":"d"})).is_err());
        rules(
            Kind::VolumeSnapshotClass,
            &mut json!({"driver":"d","deletionPolicy":"Retain"}),
        )
        .unwrap();
        assert!(rules(
            Kind::SnapshotMetadataService,
            &mut json!({"spec":{"address":"a","audience":"x"}})
        )
        .is_err());
    }
}

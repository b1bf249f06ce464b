//! Validation, defaults and update rules of the storage kinds (PVC, PV, Pod,
//! StorageClass, VolumeAttachment, CSINode) as the real API server applies
//! them, plus resource quantities (`1Gi`) the sidecars read and write.

use serde_json::{json, Value};

use super::validate::{self, Violation};
use super::Kind;

/// Access modes the API accepts on PVCs and PVs.
pub const ACCESS_MODES: [&str; 4] = [
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];

/// Parse a resource quantity (`1Gi`, `500M`, `1.5Gi`, `1e3`, `1073741824`) into
/// whole units, rounding a fraction up as the API does for byte values.
/// `None` for anything that is not a non-negative quantity.
pub fn parse_quantity(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() || num.starts_with('.') && num.len() == 1 {
        return None;
    }
    let (mul, div): (u128, u128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        e if e.starts_with(['e', 'E']) => {
            let exp: u32 = e[1..].parse().ok().filter(|x| *x <= 18)?;
            (10u128.pow(exp), 1)
        }
        _ => return None,
    };
    let num = num.strip_prefix('+').unwrap_or(num);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if !int.chars().all(|c| c.is_ascii_digit()) || !frac.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let frac = &frac[..frac.len().min(9)];
    let scale = 10u128.pow(frac.len() as u32);
    let whole: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let part: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let value = whole.checked_mul(scale)?.checked_add(part)?;
    let total = value.checked_mul(mul)?;
    let den = scale * div;
    u64::try_from(total.div_ceil(den)).ok()
}

/// Render bytes the way the API canonicalises a binary-SI quantity: the
/// largest power-of-1024 suffix that divides it exactly, else plain bytes.
pub fn format_quantity(bytes: u64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    if bytes == 0 {
        return "0".into();
    }
    for (s, shift) in SUFFIXES {
        if bytes.trailing_zeros() >= shift {
            return format!("{}{s}", bytes >> shift);
        }
    }
    bytes.to_string()
}

fn req(field: &str) -> Violation {
    (field.to_string(), "Required value".to_string())
}

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    crate::json::at(v, path)
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn access_modes(v: &Value, field: &str) -> Result<(), Violation> {
    let modes = v.as_array().filter(|a| !a.is_empty()).ok_or_else(|| {
        (
            field.to_string(),
            "Required value: at least 1 access mode is required".to_string(),
        )
    })?;
    for m in modes {
        let m = m.as_str().unwrap_or("");
        if !ACCESS_MODES.contains(&m) {
            return Err((
                field.to_string(),
                format!(
                    "Unsupported value: {m:?}: supported values: \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOnce\", \"ReadWriteOncePod\""
                ),
            ));
        }
    }
    if modes.iter().any(|m| m == "ReadWriteOncePod") && modes.len() > 1 {
        return Err((
            field.to_string(),
            "Forbidden: may not use ReadWriteOncePod with other access modes".into(),
        ));
    }
    Ok(())
}

fn one_of(v: &Value, field: &str, allowed: &[&str]) -> Result<(), Violation> {
    match v {
        Value::Null => Ok(()),
        Value::String(x) if allowed.contains(&x.as_str()) => Ok(()),
        other => Err((
            field.to_string(),
            format!(
                "Unsupported value: {}: supported values: {}",
                other,
                allowed
                    .iter()
                    .map(|a| format!("{a:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

fn storage_quantity(v: Option<&Value>, field: &str) -> Result<(), Violation> {
    let q = v.ok_or_else(|| req(field))?;
    let text = match q {
        Value::String(t) => t.clone(),
        Value::Number(n) => n.to_string(),
        _ => return Err((field.into(), "Invalid value: must be a quantity".into())),
    };
    match parse_quantity(&text) {
        Some(0) => Err((
            field.into(),
            format!("Invalid value: {text:?}: must be greater than zero"),
        )),
        Some(_) => Ok(()),
        None => Err((
            field.into(),
            format!("Invalid value: {text:?}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"),
        )),
    }
}

fn string_map_at(obj: &Value, key: &str, field: &str) -> Result<(), Violation> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(()),
        Some(m) => validate::string_map(m, field).map(|_| ()),
    }
}

fn set_default(obj: &mut Value, path: &[&str], value: Value) {
    let mut cur = obj;
    for (i, k) in path.iter().enumerate() {
        if !cur.is_object() {
            return;
        }
        let last = i + 1 == path.len();
        let entry = cur
            .as_object_mut()
            .map(|m| m.entry(k.to_string()).or_insert(Value::Null));
        let Some(entry) = entry else { return };
        if last {
            if entry.is_null() || entry.as_str() == Some("") {
                *entry = value;
            }
            return;
        }
        if entry.is_null() {
            *entry = json!({});
        }
        cur = entry;
    }
}

/// Create/update checks and server-side defaults for one storage kind.
pub(crate) fn rules(kind: Kind, obj: &mut Value) -> Result<(), Violation> {
    match kind {
        Kind::StorageClass => {
            if s(obj, &["provisioner"]).is_empty() {
                return Err(req("provisioner"));
            }
            string_map_at(obj, "parameters", "parameters")?;
            one_of(
                obj.get("reclaimPolicy").unwrap_or(&Value::Null),
                "reclaimPolicy",
                &["Delete", "Retain"],
            )?;
            one_of(
                obj.get("volumeBindingMode").unwrap_or(&Value::Null),
                "volumeBindingMode",
                &["Immediate", "WaitForFirstConsumer"],
            )?;
            set_default(obj, &["reclaimPolicy"], json!("Delete"));
            set_default(obj, &["volumeBindingMode"], json!("Immediate"));
        }
        Kind::PersistentVolumeClaim => {
            let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
            access_modes(
                spec.get("accessModes").unwrap_or(&Value::Null),
                "spec.accessModes",
            )?;
            storage_quantity(
                crate::json::at(&spec, &["resources", "requests", "storage"]),
                "spec.resources[storage]",
            )?;
            one_of(
                spec.get("volumeMode").unwrap_or(&Value::Null),
                "spec.volumeMode",
                &["Block", "Filesystem"],
            )?;
            set_default(obj, &["spec", "volumeMode"], json!("Filesystem"));
            set_default(obj, &["status", "phase"], json!("Pending"));
        }
        Kind::PersistentVolume => {
            let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
            storage_quantity(
                crate::json::at(&spec, &["capacity", "storage"]),
                "spec.capacity[storage]",
            )?;
            access_modes(
                spec.get("accessModes").unwrap_or(&Value::Null),
                "spec.accessModes",
            )?;
            one_of(
                spec.get("persistentVolumeReclaimPolicy")
                    .unwrap_or(&Value::Null),
                "spec.persistentVolumeReclaimPolicy",
                &["Delete", "Recycle", "Retain"],
            )?;
            match spec.get("csi") {
                None | Some(Value::Null) => {
                    const SOURCES: [&str; 4] = ["hostPath", "local", "nfs", "iscsi"];
                    if !SOURCES
                        .iter()
                        .any(|k| spec.get(*k).is_some_and(|v| !v.is_null()))
                    {
                        return Err((
                            "spec".into(),
                            "Required value: must specify a volume type".into(),
                        ));
                    }
                }
                Some(csi) => {
                    if s(csi, &["driver"]).is_empty() {
                        return Err(req("spec.csi.driver"));
                    }
                    if s(csi, &["volumeHandle"]).is_empty() {
                        return Err(req("spec.csi.volumeHandle"));
                    }
                    string_map_at(csi, "volumeAttributes", "spec.csi.volumeAttributes")?;
                }
            }
            set_default(
                obj,
                &["spec", "persistentVolumeReclaimPolicy"],
                json!("Retain"),
            );
            set_default(obj, &["spec", "volumeMode"], json!("Filesystem"));
            set_default(obj, &["status", "phase"], json!("Pending"));
        }
        Kind::VolumeAttachment => {
            if s(obj, &["spec", "attacher"]).is_empty() {
                return Err(req("spec.attacher"));
            }
            if s(obj, &["spec", "nodeName"]).is_empty() {
                return Err(req("spec.nodeName"));
            }
            let pv = !s(obj, &["spec", "source", "persistentVolumeName"]).is_empty();
            let inline = crate::json::at(obj, &["spec", "source", "inlineVolumeSpec"])
                .is_some_and(|v| !v.is_null());
            if pv == inline {
                return Err((
                    "spec.source".into(),
                    "Required value: must specify exactly one of inlineVolumeSpec and persistentVolumeName".into(),
                ));
            }
        }
        Kind::CsiNode => {
            let drivers = crate::json::at(obj, &["spec", "drivers"])
                .and_then(Value::as_array)
                .ok_or_else(|| req("spec.drivers"))?;
            let mut seen = Vec::new();
            for (i, d) in drivers.iter().enumerate() {
                let name = s(d, &["name"]);
                if name.is_empty() {
                    return Err(req(&format!("spec.drivers[{i}].name")));
                }
                if s(d, &["nodeID"]).is_empty() {
                    return Err(req(&format!("spec.drivers[{i}].nodeID")));
                }
                if seen.contains(&name) {
                    return Err((
                        format!("spec.drivers[{i}].name"),
                        format!("Duplicate value: {name:?}"),
                    ));
                }
                seen.push(name);
            }
        }
        Kind::Pod => {
            let containers = crate::json::at(obj, &["spec", "containers"])
                .and_then(Value::as_array)
                .filter(|c| !c.is_empty())
                .ok_or_else(|| req("spec.containers"))?;
            for (i, c) in containers.iter().enumerate() {
                if s(c, &["name"]).is_empty() {
                    return Err(req(&format!("spec.containers[{i}].name")));
                }
            }
            if let Some(vols) = crate::json::at(obj, &["spec", "volumes"]).filter(|v| !v.is_null())
            {
                let vols = vols
                    .as_array()
                    .ok_or_else(|| ("spec.volumes".to_string(), "must be a list".to_string()))?;
                for (i, v) in vols.iter().enumerate() {
                    if s(v, &["name"]).is_empty() {
                        return Err(req(&format!("spec.volumes[{i}].name")));
                    }
                    if v.get("persistentVolumeClaim").is_some_and(|p| !p.is_null())
                        && s(v, &["persistentVolumeClaim", "claimName"]).is_empty()
                    {
                        return Err(req(&format!(
                            "spec.volumes[{i}].persistentVolumeClaim.claimName"
                        )));
                    }
                }
            }
            set_default(obj, &["spec", "terminationGracePeriodSeconds"], json!(30));
            set_default(obj, &["status", "phase"], json!("Pending"));
        }
        _ => {}
    }
    Ok(())
}

fn without(v: Option<&Value>, drop: &[&str]) -> Value {
    let mut v = v.cloned().unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        for k in drop {
            m.remove(*k);
        }
    }
    v
}

/// Rules comparing an update with the stored object (immutable fields).
pub(crate) fn update_rules(kind: Kind, old: &Value, new: &Value) -> Result<(), Violation> {
    match kind {
        Kind::StorageClass => {
            for f in [
                "parameters",
                "provisioner",
                "reclaimPolicy",
                "volumeBindingMode",
            ] {
                if old.get(f) != new.get(f) {
                    return Err((
                        f.to_string(),
                        format!("Forbidden: updates to {f} are forbidden."),
                    ));
                }
            }
        }
        Kind::PersistentVolumeClaim => {
            // Binding may fill volumeName once; resources may grow (expansion).
            let old_spec = without(old.get("spec"), &["resources"]);
            let mut new_spec = without(new.get("spec"), &["resources"]);
            if s(old, &["spec", "volumeName"]).is_empty() {
                if let (Some(n), Some(o)) = (new_spec.as_object_mut(), old_spec.as_object()) {
                    match o.get("volumeName") {
                        Some(v) => n.insert("volumeName".into(), v.clone()),
                        None => n.remove("volumeName"),
                    };
                }
            }
            if old_spec != new_spec {
                return Err((
                    "spec".into(),
                    "Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims".into(),
                ));
            }
        }
        Kind::PersistentVolume
            if crate::json::at(old, &["spec", "csi"]) != crate::json::at(new, &["spec", "csi"]) =>
        {
            return Err((
                "spec.persistentvolumesource".into(),
                "Forbidden: spec.persistentvolumesource is immutable after creation".into(),
            ));
        }
        Kind::VolumeAttachment if old.get("spec") != new.get("spec") => {
            return Err(("spec".into(), "Invalid value: field is immutable".into()));
        }
        Kind::Pod => {
            let strip = |v: &Value| {
                let mut spec = v.get("spec").cloned().unwrap_or(Value::Null);
                if let Some(cs) = spec.get_mut("containers").and_then(Value::as_array_mut) {
                    for c in cs {
                        if let Some(m) = c.as_object_mut() {
                            m.remove("image");
                        }
                    }
                }
                spec
            };
            if strip(old) != strip(new) {
                return Err((
                    "spec".into(),
                    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations) or `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".into(),
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// Finalizer the StorageObjectInUseProtection admission plugin puts on every
/// new PVC; the pvc-protection controller drops it once no pod uses the claim.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";

/// Admission on create: the in-use protection finalizer on PVCs.
pub(crate) fn admit_create(kind: Kind, obj: &mut Value) {
    if kind != Kind::PersistentVolumeClaim {
        return;
    }
    let Some(md) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let list = md.entry("finalizers").or_insert_with(|| json!([]));
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(a) = list.as_array_mut() {
        if !a.iter().any(|f| f == PVC_PROTECTION) {
            a.push(json!(PVC_PROTECTION));
        }
    }
}

/// True when deleting this pod is graceful: it is on a node and not finished,
/// so the object stays (with a deletionTimestamp) until the kubelet confirms.
pub(crate) fn pod_deletes_gracefully(pod: &Value) -> bool {
    !s(pod, &["spec", "nodeName"]).is_empty()
        && !matches!(s(pod, &["status", "phase"]), "Succeeded" | "Failed")
}

/// The grace period a pod's deletion gets when the request names none.
pub(crate) fn pod_default_grace(pod: &Value) -> i64 {
    crate::json::at(pod, &["spec", "terminationGracePeriodSeconds"])
        .and_then(Value::as_i64)
        .unwrap_or(30)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("1Gi"), Some(1 << 30));
        assert_eq!(parse_quantity("10G"), Some(10_000_000_000));
        assert_eq!(parse_quantity("1.5Gi"), Some(3 << 29));
        assert_eq!(parse_quantity("1073741824"), Some(1 << 30));
        assert_eq!(parse_quantity("1e3"), Some(1000));
        assert_eq!(parse_quantity("1500m"), Some(2));
        for bad in ["", "Gi", "-1Gi", "1Gb", "1..2", "x"] {
            assert_eq!(parse_quantity(bad), None, "{bad}");
        }
        assert_eq!(format_quantity(1 << 30), "1Gi");
        assert_eq!(format_quantity(3 << 29), "1536Mi");
        assert_eq!(format_quantity(1000), "1000");
    }

    #[test]
    fn pvc_rules() {
        let mut ok = json!({"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}});
        rules(Kind::PersistentVolumeClaim, &mut ok).unwrap();
        assert_eq!(ok["spec"]["volumeMode"], "Filesystem");
        assert_eq!(ok["status"]["phase"], "Pending");
        let mut no_modes = json!({"spec":{"resources":{"requests":{"storage":"1Gi"}}}});
        assert_eq!(
            rules(Kind::PersistentVolumeClaim, &mut no_modes)
                .unwrap_err()
                .0,
            "spec.accessModes"
        );
        let mut zero = json!({"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"0"}}}});
        assert!(rules(Kind::PersistentVolumeClaim, &mut zero).is_err());
        let mut bad_mode =
            json!({"spec":{"accessModes":["RWO"],"resources":{"requests":{"storage":"1Gi"}}}});
        assert!(rules(Kind::PersistentVolumeClaim, &mut bad_mode).is_err());
        let mut bound = ok.clone();
        bound["spec"]["volumeName"] = json!("pv-1");
        assert!(update_rules(Kind::PersistentVolumeClaim, &ok, &bound).is_ok());
        let mut rebound = bound.clone();
        rebound["spec"]["volumeName"] = json!("pv-2");
        assert!(update_rules(Kind::PersistentVolumeClaim, &bound, &rebound).is_err());
    }

    #[test]
    fn other_kinds() {
        assert!(rules(Kind::StorageClass, &mut json!({})).is_err());
        let mut sc = json!({"provisioner":"csi.example"});
        rules(Kind::StorageClass, &mut sc).unwrap();
        assert_eq!(sc["reclaimPolicy"], "Delete");
        let mut sc2 = sc.clone();
        sc2["parameters"] = json!({"a":"b"});
        assert!(update_rules(Kind::StorageClass, &sc, &sc2).is_err());
        assert!(rules(
            Kind::VolumeAttachment,
            &mut json!({"spec":{"attacher":"d","nodeName":"n","source":{}}})
        )
        .is_err());
        assert!(rules(
            Kind::CsiNode,
            &mut json!({"spec":{"drivers":[{"name":"d","nodeID":"a"},{"name":"d","nodeID":"b"}]}})
        )
        .is_err());
        assert!(rules(
            Kind::PersistentVolume,
            &mut json!({"spec":{"capacity":{"storage":"1Gi"},"accessModes":["ReadWriteOnce"],"csi":{"driver":"d"}}})
        )
        .is_err());
        assert!(rules(Kind::Pod, &mut json!({"spec":{"containers":[]}})).is_err());
    }
}

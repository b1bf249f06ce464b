//! Reading fields out of Kubernetes-shaped JSON by path. One copy for the
//! sidecar, the engine and the snapshot: a missing or mistyped field reads as
//! empty / false, never a panic.

use serde_json::Value;

/// The value at `path` (object keys), if every step exists.
pub fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

/// The string at `path`, or `""`.
pub fn str_at(v: &Value, path: &[&str]) -> String {
    str_ref(v, path).to_string()
}

/// The string at `path`, or `""`, borrowed: for comparisons in scans, which
/// would otherwise copy each string they look at.
pub fn str_ref<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    at(v, path).and_then(Value::as_str).unwrap_or("")
}

/// The boolean at `path`, or `false`.
pub fn bool_at(v: &Value, path: &[&str]) -> bool {
    at(v, path).and_then(Value::as_bool).unwrap_or(false)
}

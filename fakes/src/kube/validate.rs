//! Field validation the real API server does before it stores anything:
//! DNS-1123 names, label syntax, and the shape of ConfigMap/Secret data.
//! Each check returns the field path and message that go into a 422 Invalid.

use base64::Engine as _;
use serde_json::{Map, Value};

/// A failed check: `(field path, message)`.
pub(crate) type Violation = (String, String);

fn is_alnum_lower(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// DNS-1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 chars.
pub(crate) fn dns1123_label(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| is_alnum_lower(c) || c == '-')
        && s.starts_with(is_alnum_lower)
        && s.ends_with(is_alnum_lower);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "Invalid value: {s:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (max 63 characters)"
        ))
    }
}

/// DNS-1123 subdomain: dot-separated labels, at most 253 chars (object names).
pub(crate) fn dns1123_subdomain(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.chars().all(|c| is_alnum_lower(c) || c == '-')
                && l.starts_with(is_alnum_lower)
                && l.ends_with(is_alnum_lower)
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "Invalid value: {s:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        ))
    }
}

/// Qualified name part of a label key / label value: `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn qualified_part(s: &str, max: usize, allow_empty: bool) -> bool {
    if s.is_empty() {
        return allow_empty;
    }
    s.len() <= max
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn label_key(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => {
            dns1123_subdomain(prefix).is_ok() && qualified_part(name, 63, false)
        }
        None => qualified_part(k, 63, false),
    }
}

/// A map of string → string at `path`, or the violation describing why not.
pub(crate) fn string_map<'a>(
    v: &'a Value,
    path: &str,
) -> Result<&'a Map<String, Value>, Violation> {
    let m = v
        .as_object()
        .ok_or_else(|| (path.to_string(), "must be a map of strings".to_string()))?;
    for (k, val) in m {
        if !val.is_string() {
            return Err((format!("{path}[{k}]"), "must be a string".to_string()));
        }
    }
    Ok(m)
}

/// `metadata.labels`: keys and values in label syntax.
pub(crate) fn labels(v: &Value) -> Result<(), Violation> {
    let m = string_map(v, "metadata.labels")?;
    for (k, val) in m {
        if !label_key(k) {
            return Err(("metadata.labels".into(), format!("Invalid value: {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")));
        }
        let s = val.as_str().unwrap_or_default();
        if !qualified_part(s, 63, true) {
            return Err(("metadata.labels".into(), format!("Invalid value: {s:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")));
        }
    }
    Ok(())
}

/// `metadata.annotations`: string values, keys like label keys (case kept), ≤ 256 KiB total.
pub(crate) fn annotations(v: &Value) -> Result<(), Violation> {
    let m = string_map(v, "metadata.annotations")?;
    let mut total = 0usize;
    for (k, val) in m {
        if !label_key(&k.to_ascii_lowercase()) && !label_key(k) {
            return Err((
                "metadata.annotations".into(),
                format!("Invalid value: {k:?}: invalid annotation key"),
            ));
        }
        total += k.len() + val.as_str().map_or(0, str::len);
    }
    if total > 256 * 1024 {
        return Err((
            "metadata.annotations".into(),
            "Too long: must have at most 262144 bytes".into(),
        ));
    }
    Ok(())
}

/// Keys of ConfigMap/Secret data: `[-._a-zA-Z0-9]+`, not `.` or `..`.
pub(crate) fn config_key(k: &str, path: &str) -> Result<(), Violation> {
    let ok = !k.is_empty()
        && k.len() <= 253
        && k != "."
        && k != ".."
        && !k.starts_with("..")
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err((path.to_string(), format!("Invalid value: {k:?}: a valid config key must consist of alphanumeric characters, '-', '_' or '.'")))
    }
}

/// Decode standard base64 as the server does for `[]byte` fields.
pub(crate) fn base64_value(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

/// Encode bytes the way the server renders `[]byte` fields.
pub(crate) fn base64_encode(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// The real limit on ConfigMap / Secret payload (1 MiB).
pub(crate) const MAX_DATA_BYTES: usize = 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "a-b", "a.b-c", "0abc", "x1"] {
            assert!(dns1123_subdomain(ok).is_ok(), "{ok}");
        }
        for bad in ["", "A", "-a", "a-", "a..b", "a_b", "a/b", &"x".repeat(254)] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad}");
        }
        assert!(dns1123_label("a.b").is_err());
        assert!(dns1123_label("default").is_ok());
    }

    #[test]
    fn label_syntax() {
        assert!(labels(&serde_json::json!({"app.kubernetes.io/name":"x","a":""})).is_ok());
        assert!(labels(&serde_json::json!({"a":"has space"})).is_err());
        assert!(labels(&serde_json::json!({"a":1})).is_err());
        assert!(labels(&serde_json::json!({"-a":"x"})).is_err());
    }
}

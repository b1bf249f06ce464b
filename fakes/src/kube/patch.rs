//! The patch formats the API server accepts: JSON merge patch (RFC 7386) and
//! JSON patch (RFC 6902). Both are pure functions over `serde_json::Value` so
//! the state layer can apply them under its lock and then run its CAS check.

use serde_json::{Map, Value};

/// Why a patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The patch document itself is malformed (400 on the real server).
    #[error("{0}")]
    Malformed(String),
    /// The patch is well-formed but does not apply to this document: a path is
    /// missing or a `test` failed (422 on the real server).
    #[error("{0}")]
    NotApplicable(String),
}

/// RFC 7386: `null` removes a member, objects merge recursively, anything else
/// (arrays included) replaces the target.
pub fn merge_patch(target: &Value, patch: &Value) -> Value {
    match patch {
        Value::Object(p) => {
            let mut out = match target {
                Value::Object(t) => t.clone(),
                _ => Map::new(),
            };
            for (k, v) in p {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = merge_patch(out.get(k).unwrap_or(&Value::Null), v);
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// The API server's cap on the operations of one JSON patch.
pub const MAX_JSON_PATCH_OPS: usize = 10_000;
/// The API server's cap on the bytes all `copy` operations of one patch may
/// add (its `JSONPatchMaxCopyBytes`): without it, copying the document into
/// itself doubles it per operation.
pub const MAX_COPY_BYTES: usize = 3 * 1024 * 1024;
/// Deepest nesting a patched object may reach: what the store can read back
/// (serde_json's recursion limit), so a patch cannot write an object that
/// can never be loaded again, nor one whose recursive drop overflows the stack.
pub const MAX_DEPTH: usize = 120;

/// Nesting depth of `v` (a scalar is 0), without recursion.
pub fn depth(v: &Value) -> usize {
    let mut max = 0;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, d)) = stack.pop() {
        max = max.max(d);
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            Value::Object(m) => stack.extend(m.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    max
}

/// RFC 6902 over a copy of `doc`; all-or-nothing like the real server.
pub fn json_patch(doc: &Value, patch: &Value) -> Result<Value, PatchError> {
    let ops = patch
        .as_array()
        .ok_or_else(|| PatchError::Malformed("json patch must be an array of operations".into()))?;
    if ops.len() > MAX_JSON_PATCH_OPS {
        return Err(PatchError::Malformed(format!(
            "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPS}, got {}",
            ops.len()
        )));
    }
    let mut doc = doc.clone();
    let mut copied = 0usize;
    for (i, op) in ops.iter().enumerate() {
        apply_op(&mut doc, op, &mut copied).map_err(|e| match e {
            PatchError::Malformed(m) => PatchError::Malformed(format!("operation {i}: {m}")),
            PatchError::NotApplicable(m) => {
                PatchError::NotApplicable(format!("operation {i}: {m}"))
            }
        })?;
    }
    Ok(doc)
}

fn field<'a>(op: &'a Value, name: &str) -> Result<&'a Value, PatchError> {
    op.get(name)
        .ok_or_else(|| PatchError::Malformed(format!("missing '{name}'")))
}

fn str_field<'a>(op: &'a Value, name: &str) -> Result<&'a str, PatchError> {
    field(op, name)?
        .as_str()
        .ok_or_else(|| PatchError::Malformed(format!("'{name}' must be a string")))
}

/// Refuse a value that would nest deeper than [`MAX_DEPTH`] at `path`.
fn depth_ok(path: &[String], v: &Value) -> Result<(), PatchError> {
    if path.len() + depth(v) > MAX_DEPTH {
        return Err(PatchError::NotApplicable(format!(
            "the patched object would nest deeper than {MAX_DEPTH} levels at {}",
            render_pointer(path)
        )));
    }
    Ok(())
}

fn apply_op(doc: &mut Value, op: &Value, copied: &mut usize) -> Result<(), PatchError> {
    let kind = str_field(op, "op")?;
    let path = parse_pointer(str_field(op, "path")?)?;
    match kind {
        "add" => {
            let v = field(op, "value")?;
            depth_ok(&path, v)?;
            add(doc, &path, v.clone())
        }
        "remove" => remove(doc, &path).map(drop),
        "replace" => {
            let v = field(op, "value")?;
            depth_ok(&path, v)?;
            let slot = lookup_mut(doc, &path)?;
            *slot = v.clone();
            Ok(())
        }
        "move" => {
            let from = parse_pointer(str_field(op, "from")?)?;
            if path.len() > from.len() && path[..from.len()] == from[..] {
                return Err(PatchError::NotApplicable(
                    "cannot move a value into one of its children".into(),
                ));
            }
            let v = remove(doc, &from)?;
            depth_ok(&path, &v)?;
            add(doc, &path, v)
        }
        "copy" => {
            let from = parse_pointer(str_field(op, "from")?)?;
            let src = lookup_mut(doc, &from)?;
            depth_ok(&path, src)?;
            *copied += serde_json::to_vec(src).map_or(usize::MAX, |b| b.len());
            if *copied > MAX_COPY_BYTES {
                return Err(PatchError::NotApplicable(format!(
                    "Unable to complete the copy, the accumulated size of copies exceeds the limit of {MAX_COPY_BYTES} bytes"
                )));
            }
            let v = src.clone();
            add(doc, &path, v)
        }
        "test" => {
            let want = field(op, "value")?;
            let have = lookup_mut(doc, &path)?;
            if have == want {
                Ok(())
            } else {
                Err(PatchError::NotApplicable(format!(
                    "testing value {} failed",
                    render_pointer(&path)
                )))
            }
        }
        other => Err(PatchError::Malformed(format!(
            "unexpected kind of operation: {other:?}"
        ))),
    }
}

fn parse_pointer(p: &str) -> Result<Vec<String>, PatchError> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let rest = p
        .strip_prefix('/')
        .ok_or_else(|| PatchError::Malformed(format!("path {p:?} must start with '/'")))?;
    Ok(rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn render_pointer(path: &[String]) -> String {
    path.iter()
        .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
        .collect()
}

fn missing(path: &[String]) -> PatchError {
    PatchError::NotApplicable(format!("doc is missing path: {:?}", render_pointer(path)))
}

fn array_index(token: &str, len: usize, allow_end: bool) -> Option<usize> {
    // RFC 6901: no leading zeros, no signs.
    if token.is_empty()
        || (token.len() > 1 && token.starts_with('0'))
        || !token.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let i: usize = token.parse().ok()?;
    if i < len || (allow_end && i == len) {
        Some(i)
    } else {
        None
    }
}

fn lookup_mut<'a>(doc: &'a mut Value, path: &[String]) -> Result<&'a mut Value, PatchError> {
    let mut cur = doc;
    for (depth, tok) in path.iter().enumerate() {
        cur = match cur {
            Value::Object(m) => m.get_mut(tok),
            Value::Array(a) => {
                let len = a.len();
                array_index(tok, len, false).and_then(move |i| a.get_mut(i))
            }
            _ => None,
        }
        .ok_or_else(|| missing(&path[..=depth]))?;
    }
    Ok(cur)
}

fn add(doc: &mut Value, path: &[String], value: Value) -> Result<(), PatchError> {
    let Some((last, parent)) = path.split_last() else {
        *doc = value;
        return Ok(());
    };
    match lookup_mut(doc, parent)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                array_index(last, a.len(), true).ok_or_else(|| missing(path))?
            };
            a.insert(i, value);
            Ok(())
        }
        _ => Err(missing(path)),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, PatchError> {
    let Some((last, parent)) = path.split_last() else {
        return Err(PatchError::NotApplicable(
            "cannot remove the whole document".into(),
        ));
    };
    match lookup_mut(doc, parent)? {
        Value::Object(m) => m.remove(last).ok_or_else(|| missing(path)),
        Value::Array(a) => {
            let i = array_index(last, a.len(), false).ok_or_else(|| missing(path))?;
            Ok(a.remove(i))
        }
        _ => Err(missing(path)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rfc7386_appendix_a_examples() {
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (target, patch, want) in cases {
            assert_eq!(
                merge_patch(&target, &patch),
                want,
                "target {target} patch {patch}"
            );
        }
    }

    #[test]
    fn json_patch_ops() {
        let doc = json!({"metadata":{"labels":{"a":"1"}},"list":[1,2,3]});
        let p = json!([
            {"op":"test","path":"/metadata/labels/a","value":"1"},
            {"op":"add","path":"/metadata/labels/b~1c","value":"2"},
            {"op":"replace","path":"/metadata/labels/a","value":"9"},
            {"op":"remove","path":"/list/0"},
            {"op":"add","path":"/list/-","value":4},
            {"op":"copy","from":"/list/0","path":"/first"},
            {"op":"move","from":"/first","path":"/moved"},
        ]);
        let out = json_patch(&doc, &p).unwrap();
        assert_eq!(
            out,
            json!({"metadata":{"labels":{"a":"9","b/c":"2"}},"list":[2,3,4],"moved":2})
        );
    }

    #[test]
    fn json_patch_failures_leave_doc_untouched() {
        let doc = json!({"a":1});
        let failed_test = json_patch(
            &doc,
            &json!([{"op":"replace","path":"/a","value":2},{"op":"test","path":"/a","value":1}]),
        );
        assert!(matches!(failed_test, Err(PatchError::NotApplicable(_))));
        assert!(matches!(
            json_patch(&doc, &json!([{"op":"remove","path":"/b"}])),
            Err(PatchError::NotApplicable(_))
        ));
        assert!(matches!(
            json_patch(&doc, &json!([{"op":"replace","path":"/b","value":1}])),
            Err(PatchError::NotApplicable(_))
        ));
        assert!(matches!(
            json_patch(&doc, &json!({"op":"add"})),
            Err(PatchError::Malformed(_))
        ));
        assert!(matches!(
            json_patch(&doc, &json!([{"op":"frob","path":"/a"}])),
            Err(PatchError::Malformed(_))
        ));
        assert!(matches!(
            json_patch(&doc, &json!([{"op":"add","path":"a","value":1}])),
            Err(PatchError::Malformed(_))
        ));
        assert!(matches!(
            json_patch(
                &json!({"l":[1]}),
                &json!([{"op":"add","path":"/l/01","value":1}])
            ),
            Err(PatchError::NotApplicable(_))
        ));
        assert_eq!(doc, json!({"a":1}));
    }
}

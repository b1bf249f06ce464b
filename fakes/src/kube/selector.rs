//! `labelSelector` and `fieldSelector` query parameters: parsed once per list
//! request, then matched against stored objects. Grammar as in apimachinery's
//! `labels.Parse` (equality and set-based) and `fields.ParseSelector`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::Kind;

/// A selector string the server cannot parse (400 BadRequest).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to parse requirement: {0}")]
pub struct SelectorError(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    reqs: Vec<(String, Op)>,
}

/// Split on commas that are not inside `( )`, so `a in (x,y),b=c` is two terms.
fn split_terms(s: &str) -> Result<Vec<&str>, SelectorError> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(SelectorError(format!("unbalanced ')' in {s:?}")));
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(SelectorError(format!("unbalanced '(' in {s:?}")));
    }
    out.push(&s[start..]);
    Ok(out)
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 316
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_set(rest: &str, term: &str) -> Result<Vec<String>, SelectorError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError(format!("{term:?}: expected '(' value list ')'")))?;
    let vals: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    if vals.iter().any(|v| !valid_value(v)) {
        return Err(SelectorError(format!("{term:?}: invalid value in set")));
    }
    Ok(vals)
}

impl LabelSelector {
    /// Parse a `labelSelector` query value.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { reqs });
        }
        for raw in split_terms(s)? {
            let term = raw.trim();
            if term.is_empty() {
                return Err(SelectorError(format!("empty requirement in {s:?}")));
            }
            let (key, op) = if let Some(k) = term.strip_prefix('!') {
                (k.trim(), Op::DoesNotExist)
            } else if let Some((k, v)) = term.split_once("!=") {
                (k.trim(), Op::NotEq(v.trim().to_string()))
            } else if let Some((k, v)) = term.split_once("==") {
                (k.trim(), Op::Eq(v.trim().to_string()))
            } else if let Some((k, v)) = term.split_once('=') {
                (k.trim(), Op::Eq(v.trim().to_string()))
            } else if let Some((k, rest)) = term.split_once(" notin ") {
                (k.trim(), Op::NotIn(parse_set(rest, term)?))
            } else if let Some((k, rest)) = term.split_once(" in ") {
                (k.trim(), Op::In(parse_set(rest, term)?))
            } else {
                (term, Op::Exists)
            };
            if !valid_key(key) {
                return Err(SelectorError(format!(
                    "{term:?}: invalid label key {key:?}"
                )));
            }
            if let Op::Eq(v) | Op::NotEq(v) = &op {
                if !valid_value(v) {
                    return Err(SelectorError(format!(
                        "{term:?}: invalid label value {v:?}"
                    )));
                }
            }
            reqs.push((key.to_string(), op));
        }
        Ok(Self { reqs })
    }

    /// True if `labels` satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_by(|k| labels.get(k).map(String::as_str))
    }

    /// True if the labels `label` looks up (by key) satisfy every requirement.
    pub fn matches_by<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.reqs.iter().all(|(k, op)| {
            let have = label(k);
            let one_of = |vs: &[String]| have.is_some_and(|h| vs.iter().any(|v| v == h));
            match op {
                Op::Eq(v) => have == Some(v.as_str()),
                Op::NotEq(v) => have != Some(v.as_str()),
                Op::In(vs) => one_of(vs),
                Op::NotIn(vs) => !one_of(vs),
                Op::Exists => have.is_some(),
                Op::DoesNotExist => have.is_none(),
            }
        })
    }

    /// Match against an object's `metadata.labels` (values that are not
    /// strings are not labels).
    pub fn matches_object(&self, obj: &Value) -> bool {
        if self.reqs.is_empty() {
            return true;
        }
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        self.matches_by(|k| labels.and_then(|m| m.get(k)).and_then(Value::as_str))
    }
}

/// A parsed field selector over the few fields the real server indexes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parse a `fieldSelector` value; only fields the real server supports for
    /// `kind` are accepted (`metadata.name`, `metadata.namespace`, Secret `type`).
    pub fn parse(s: &str, kind: Kind) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { reqs });
        }
        for term in s.split(',') {
            let term = term.trim();
            let (field, eq, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(SelectorError(format!(
                    "invalid field selector term {term:?}"
                )));
            };
            let field = field.trim();
            let supported = matches!(field, "metadata.name" | "metadata.namespace")
                || (kind == Kind::Secret && field == "type")
                || (kind == Kind::Pod && matches!(field, "spec.nodeName" | "status.phase"))
                || (kind == Kind::Namespace && field == "status.phase");
            if !supported {
                return Err(SelectorError(format!("field label not supported: {field}")));
            }
            reqs.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(Self { reqs })
    }

    /// True if `obj` satisfies every term.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(field, eq, want)| {
            // Only supported fields get this far; each is a plain dotted path.
            let ptr = format!("/{}", field.replace('.', "/"));
            let have = obj.pointer(&ptr).and_then(Value::as_str).unwrap_or("");
            (have == want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn equality_based() {
        let s = LabelSelector::parse("app=drv,tier!=cache").unwrap();
        assert!(s.matches(&labels(&[("app", "drv")])));
        assert!(s.matches(&labels(&[("app", "drv"), ("tier", "db")])));
        assert!(!s.matches(&labels(&[("app", "drv"), ("tier", "cache")])));
        assert!(!s.matches(&labels(&[("tier", "db")])));
        let s = LabelSelector::parse("app==drv").unwrap();
        assert!(s.matches(&labels(&[("app", "drv")])));
        assert!(LabelSelector::parse("").unwrap().matches(&labels(&[])));
    }

    #[test]
    fn set_based_and_existence() {
        let s = LabelSelector::parse("env in (a, b),!legacy,owner,zone notin (x)").unwrap();
        assert!(s.matches(&labels(&[("env", "a"), ("owner", "me")])));
        assert!(!s.matches(&labels(&[("env", "c"), ("owner", "me")])));
        assert!(!s.matches(&labels(&[("env", "a"), ("owner", "me"), ("legacy", "1")])));
        assert!(!s.matches(&labels(&[("env", "a")])));
        assert!(!s.matches(&labels(&[("env", "a"), ("owner", "me"), ("zone", "x")])));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["a=b,", "=x", "a in (b", "a=b c", "a in b", "a=(x)"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn matches_object_labels() {
        let s = LabelSelector::parse("a=1").unwrap();
        assert!(s.matches_object(&json!({"metadata":{"labels":{"a":"1"}}})));
        assert!(!s.matches_object(&json!({"metadata":{}})));
    }

    #[test]
    fn field_selector() {
        let f = FieldSelector::parse(
            "metadata.name=x,metadata.namespace!=kube-system",
            Kind::ConfigMap,
        )
        .unwrap();
        assert!(f.matches_object(&json!({"metadata":{"name":"x","namespace":"default"}})));
        assert!(!f.matches_object(&json!({"metadata":{"name":"y","namespace":"default"}})));
        assert!(FieldSelector::parse("spec.x=1", Kind::ConfigMap).is_err());
        assert!(FieldSelector::parse("type=Opaque", Kind::Secret).is_ok());
        let f = FieldSelector::parse("spec.nodeName=n1", Kind::Pod).unwrap();
        assert!(f.matches_object(&json!({"spec":{"nodeName":"n1"}})));
        assert!(!f.matches_object(&json!({"spec":{"nodeName":"n2"}})));
        assert!(FieldSelector::parse("spec.nodeName=n1", Kind::ConfigMap).is_err());
    }
}

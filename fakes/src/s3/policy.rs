//! IAM-style policy documents: parsing with MinIO's validation errors, and
//! evaluation of an action on a resource over a user's attached policies
//! (explicit Deny wins, otherwise any Allow, otherwise deny).

use serde_json::Value;

/// A parsed, validated policy document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Policy {
    pub statements: Vec<Statement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Statement {
    pub allow: bool,
    pub actions: Vec<String>,
    pub not_actions: Vec<String>,
    pub resources: Vec<String>,
    /// Conditions are not evaluated; see `Policy::decide`.
    pub has_condition: bool,
}

/// The outcome of evaluating a request against a set of policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Allow,
    ExplicitDeny,
    ImplicitDeny,
}

fn strings(v: Option<&Value>, what: &str) -> Result<Vec<String>, String> {
    match v {
        None => Ok(vec![]),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("{what} must be a string or an array of strings"))
            })
            .collect(),
        Some(_) => Err(format!("{what} must be a string or an array of strings")),
    }
}

impl Policy {
    /// Parse and validate; the error text is what the admin API answers.
    pub fn parse(doc: &[u8]) -> Result<(Policy, Value), String> {
        let value: Value =
            serde_json::from_slice(doc).map_err(|e| format!("policy is not valid JSON: {e}"))?;
        let obj = value.as_object().ok_or("policy must be a JSON object")?;
        match obj.get("Version").and_then(Value::as_str) {
            Some("2012-10-17") | Some("2008-10-17") => {}
            Some(v) => return Err(format!("invalid version '{v}'")),
            None => return Err("invalid version ''".into()),
        }
        let stmts: Vec<&Value> = match obj.get("Statement") {
            Some(Value::Array(a)) => a.iter().collect(),
            Some(o @ Value::Object(_)) => vec![o],
            _ => return Err("policy must have a Statement array".into()),
        };
        if stmts.is_empty() {
            return Err("policy must have at least one Statement".into());
        }
        let mut statements = Vec::with_capacity(stmts.len());
        for s in stmts {
            let s = s.as_object().ok_or("a Statement must be a JSON object")?;
            let allow = match s.get("Effect").and_then(Value::as_str) {
                Some("Allow") => true,
                Some("Deny") => false,
                Some(e) => return Err(format!("invalid Effect '{e}'")),
                None => return Err("a Statement needs an Effect".into()),
            };
            let actions = strings(s.get("Action"), "Action")?;
            let not_actions = strings(s.get("NotAction"), "NotAction")?;
            if actions.is_empty() && not_actions.is_empty() {
                return Err("a Statement needs a non-empty Action".into());
            }
            for a in actions.iter().chain(&not_actions) {
                if a != "*" && !a.contains(':') {
                    return Err(format!("invalid action '{a}'"));
                }
            }
            let resources = strings(s.get("Resource"), "Resource")?;
            let s3_actions = actions
                .iter()
                .chain(&not_actions)
                .any(|a| a == "*" || a.to_ascii_lowercase().starts_with("s3:"));
            if s3_actions && resources.is_empty() {
                return Err("a Statement with s3 actions needs a Resource".into());
            }
            for r in &resources {
                if r != "*" && !r.starts_with("arn:aws:s3:::") && !r.starts_with("arn:minio:") {
                    return Err(format!("invalid resource '{r}'"));
                }
            }
            statements.push(Statement {
                allow,
                actions,
                not_actions,
                resources,
                has_condition: s.contains_key("Condition"),
            });
        }
        Ok((Policy { statements }, value))
    }
}

/// `*` any run of characters (also `/`), `?` exactly one.
pub(crate) fn wildcard(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative matching with backtracking to the last star: linear memory,
    // no recursion on hostile patterns.
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

fn action_matches(pattern: &str, action: &str) -> bool {
    // IAM action names are case-insensitive.
    wildcard(&pattern.to_ascii_lowercase(), &action.to_ascii_lowercase())
}

impl Statement {
    fn applies(&self, action: &str, resource: &str) -> bool {
        let by_action = if self.actions.is_empty() {
            !self.not_actions.iter().any(|a| action_matches(a, action))
        } else {
            self.actions.iter().any(|a| action_matches(a, action))
        };
        by_action
            && self
                .resources
                .iter()
                .any(|r| r == "*" || wildcard(r, resource))
    }
}

/// Evaluate `action` on `resource` over every statement of `policies`.
/// Conditions are not evaluated: a conditional Allow never grants and a
/// conditional Deny always applies, so the fake errs on the side of refusing.
pub(crate) fn decide<'a>(
    policies: impl IntoIterator<Item = &'a Policy>,
    action: &str,
    resource: &str,
) -> Decision {
    let mut allowed = false;
    for p in policies {
        for s in &p.statements {
            if !s.applies(action, resource) {
                continue;
            }
            if !s.allow {
                return Decision::ExplicitDeny;
            }
            if !s.has_condition {
                allowed = true;
            }
        }
    }
    if allowed {
        Decision::Allow
    } else {
        Decision::ImplicitDeny
    }
}

/// The ARN of a bucket, or of an object in it.
pub(crate) fn arn(bucket: &str, key: Option<&str>) -> String {
    match key {
        Some(k) => format!("arn:aws:s3:::{bucket}/{k}"),
        None => format!("arn:aws:s3:::{bucket}"),
    }
}

/// MinIO's built-in canned policies (present on a fresh server).
pub(crate) fn builtin() -> Vec<(&'static str, Value)> {
    vec![
        (
            "readwrite",
            serde_json::json!({"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:*"],"Resource":["arn:aws:s3:::*"]}]}),
        ),
        (
            "readonly",
            serde_json::json!({"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:GetBucketLocation","s3:GetObject"],"Resource":["arn:aws:s3:::*"]}]}),
        ),
        (
            "writeonly",
            serde_json::json!({"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:PutObject"],"Resource":["arn:aws:s3:::*"]}]}),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(doc: &str) -> Policy {
        Policy::parse(doc.as_bytes()).unwrap().0
    }

    #[test]
    fn wildcards() {
        assert!(wildcard("arn:aws:s3:::b/*", "arn:aws:s3:::b/x/y"));
        assert!(!wildcard("arn:aws:s3:::b/*", "arn:aws:s3:::b"));
        assert!(wildcard("arn:aws:s3:::b?", "arn:aws:s3:::b1"));
        assert!(!wildcard("arn:aws:s3:::b?", "arn:aws:s3:::b"));
        assert!(wildcard("*", ""));
        assert!(wildcard("a*b*c", "aXXbYYc"));
        assert!(!wildcard("a*b*c", "aXXbYY"));
        assert!(!wildcard(&"*a".repeat(50), &"a".repeat(40)));
    }

    #[test]
    fn allow_deny_and_default() {
        let rw = p(
            r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*","Resource":["arn:aws:s3:::b","arn:aws:s3:::b/*"]}]}"#,
        );
        let deny_put = p(
            r#"{"Version":"2012-10-17","Statement":{"Effect":"Deny","Action":["s3:Put*"],"Resource":"arn:aws:s3:::b/secret/*"}}"#,
        );
        let get = p(
            r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:Get*"],"Resource":"arn:aws:s3:::other/*"}]}"#,
        );
        assert_eq!(
            decide([&rw], "s3:PutObject", &arn("b", Some("k"))),
            Decision::Allow
        );
        assert_eq!(
            decide([&rw], "s3:CreateBucket", &arn("b", None)),
            Decision::Allow
        );
        assert_eq!(
            decide([&rw], "s3:PutObject", &arn("c", Some("k"))),
            Decision::ImplicitDeny
        );
        assert_eq!(
            decide(
                [&rw, &deny_put],
                "s3:PutObject",
                &arn("b", Some("secret/x"))
            ),
            Decision::ExplicitDeny
        );
        assert_eq!(
            decide([&deny_put, &rw], "s3:PutObject", &arn("b", Some("public"))),
            Decision::Allow
        );
        assert_eq!(
            decide([&get], "s3:getobject", &arn("other", Some("k"))),
            Decision::Allow
        );
        assert_eq!(
            decide([&get], "s3:PutObject", &arn("other", Some("k"))),
            Decision::ImplicitDeny
        );
        assert_eq!(
            decide([], "s3:GetObject", &arn("b", Some("k"))),
            Decision::ImplicitDeny
        );
    }

    #[test]
    fn invalid_documents_are_refused() {
        for bad in [
            "",
            "not json",
            "[]",
            r#"{"Statement":[]}"#,
            r#"{"Version":"2012-10-17"}"#,
            r#"{"Version":"2012-10-17","Statement":[{"Effect":"Maybe","Action":"s3:*","Resource":"*"}]}"#,
            r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*"}]}"#,
            r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":7,"Resource":"*"}]}"#,
            r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"bucket"}]}"#,
        ] {
            assert!(Policy::parse(bad.as_bytes()).is_err(), "{bad}");
        }
        for (_, doc) in builtin() {
            Policy::parse(doc.to_string().as_bytes()).unwrap();
        }
    }
}

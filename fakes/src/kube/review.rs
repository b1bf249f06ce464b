//! The Kubernetes API's review endpoints the snapshot-metadata sidecar uses:
//! TokenReview (authentication.k8s.io/v1, audience-scoped service-account
//! tokens that expire on the virtual clock) and SubjectAccessReview
//! (authorization.k8s.io/v1, answered from RBAC-like grants the lab sets).
//! Both are create-only and persist nothing, as on a real API server; they
//! take and answer the real object shapes as JSON.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::clock::{SimClock, VTime};

#[derive(Clone, Debug)]
struct IssuedToken {
    username: String,
    audiences: Vec<String>,
    expires: VTime,
}

/// One granted permission: `verb` on `group/resource` in `namespace` for `user`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    /// The username (`system:serviceaccount:<ns>:<name>`).
    pub user: String,
    /// Verb (`get`, `list`).
    pub verb: String,
    /// API group (`snapshot.storage.k8s.io`).
    pub group: String,
    /// Resource plural (`volumesnapshots`).
    pub resource: String,
    /// Namespace; `*` for every namespace.
    pub namespace: String,
}

/// The token issuer (TokenRequest) and both reviews. Cheap to clone.
#[derive(Clone)]
pub struct Reviews {
    inner: Arc<Mutex<State>>,
    clock: SimClock,
}

struct State {
    tokens: BTreeMap<String, IssuedToken>,
    grants: Vec<Grant>,
    issued: u64,
    seed: u64,
}

impl Reviews {
    /// An issuer on `clock`; `seed` makes the token strings reproducible.
    pub fn new(clock: SimClock, seed: u64) -> Self {
        Reviews {
            inner: Arc::new(Mutex::new(State {
                tokens: BTreeMap::new(),
                grants: Vec::new(),
                issued: 0,
                seed,
            })),
            clock,
        }
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// TokenRequest for service account `namespace/name`: a token for
    /// `audience`, valid for `ttl` of virtual time.
    pub fn issue_token(
        &self,
        namespace: &str,
        name: &str,
        audience: &str,
        ttl: Duration,
    ) -> String {
        let mut st = self.st();
        st.issued += 1;
        let mut h = Sha256::new();
        h.update(st.seed.to_le_bytes());
        h.update(st.issued.to_le_bytes());
        h.update(namespace.as_bytes());
        h.update(name.as_bytes());
        let tok = format!("eyJ.{}", hex::encode(&h.finalize()[..24]));
        st.tokens.insert(
            tok.clone(),
            IssuedToken {
                username: format!("system:serviceaccount:{namespace}:{name}"),
                audiences: vec![audience.to_string()],
                expires: self.clock.now().after(ttl),
            },
        );
        tok
    }

    /// Grant `g` (a Role + RoleBinding, flattened).
    pub fn grant(&self, g: Grant) {
        self.st().grants.push(g);
    }

    /// `POST /apis/authentication.k8s.io/v1/tokenreviews`: the object with its status.
    pub fn token_review(&self, review: &Value) -> Value {
        let token = review
            .pointer("/spec/token")
            .and_then(Value::as_str)
            .unwrap_or("");
        let want: Vec<String> = review
            .pointer("/spec/audiences")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let st = self.st();
        let status = match st.tokens.get(token) {
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
            Some(t) if t.expires <= self.clock.now() => {
                json!({"authenticated": false, "error": "token has expired"})
            }
            Some(t) => {
                // Audiences: the intersection of asked and held; empty = refused.
                let both: Vec<&String> = if want.is_empty() {
                    t.audiences.iter().collect()
                } else {
                    want.iter().filter(|a| t.audiences.contains(a)).collect()
                };
                if both.is_empty() {
                    json!({"authenticated": false, "error": "token audiences do not match"})
                } else {
                    json!({
                        "authenticated": true,
                        "user": {
                            "username": t.username,
                            "groups": ["system:serviceaccounts", "system:authenticated"],
                        },
                        "audiences": both,
                    })
                }
            }
        };
        let mut out = review.clone();
        out["apiVersion"] = json!("authentication.k8s.io/v1");
        out["kind"] = json!("TokenReview");
        out["status"] = status;
        out
    }

    /// `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`.
    pub fn subject_access_review(&self, review: &Value) -> Value {
        let s = |p: &str| {
            review
                .pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let user = s("/spec/user");
        let ra = "/spec/resourceAttributes";
        let (verb, group, resource, ns) = (
            s(&format!("{ra}/verb")),
            s(&format!("{ra}/group")),
            s(&format!("{ra}/resource")),
            s(&format!("{ra}/namespace")),
        );
        let allowed = self.st().grants.iter().any(|g| {
            g.user == user
                && g.verb == verb
                && g.group == group
                && g.resource == resource
                && (g.namespace == "*" || g.namespace == ns)
        });
        let mut out = review.clone();
        out["apiVersion"] = json!("authorization.k8s.io/v1");
        out["kind"] = json!("SubjectAccessReview");
        out["status"] = if allowed {
            json!({"allowed": true, "reason": "granted by RBAC"})
        } else {
            json!({"allowed": false, "reason": format!("no grant for {verb} {group}/{resource} in namespace {ns:?}")})
        };
        out
    }
}

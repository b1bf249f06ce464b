//! Who may call the HTTP API: bearer tokens the lab issues, each bound to a
//! user and the RBAC rules a real deployment grants that component. As a real
//! API server run with `--anonymous-auth=false` and `--authorization-mode=RBAC`:
//! no token or an unknown one → 401 Unauthorized; a known user without a rule
//! for the request → 403 Forbidden, worded as the RBAC authorizer words it.
//!
//! A lab serves the API over TLS (`KubeFake::serve_tls`): client-go (kubectl,
//! every Go driver reading a kubeconfig) sends a kubeconfig's credentials
//! only over https. Deviations: a rule on a kind covers its `/status`
//! subresource (the roles below grant both anyway); no `resourceNames`, no
//! aggregation, no impersonation; tokens are opaque (not JWTs, no
//! TokenReview of them). The in-process API is the lab itself and is not checked.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use rand::RngCore;

use super::api::Verb;
use super::Kind;

/// What the COSI driver roles grant on the objects they manage: everything but
/// deletecollection (the upstream roles list get, list, watch, update, create,
/// delete; patch is added so a driver that patches instead of updating is not
/// refused for a choice its own RBAC would cover).
const MANAGE: &[Verb] = &[
    Verb::Watch,
    Verb::List,
    Verb::Create,
    Verb::Get,
    Verb::Replace,
    Verb::Patch,
    Verb::Delete,
];

/// One RBAC rule: these verbs on these kinds (and their `/status`), in one
/// namespace or, with `namespace: None`, cluster-wide.
#[derive(Clone, Debug)]
pub struct Rule {
    /// Verbs granted.
    pub verbs: Vec<Verb>,
    /// Kinds granted (every kind when empty is *not* implied: list them).
    pub kinds: Vec<Kind>,
    /// `Some(ns)`: a Role in `ns`; `None`: a ClusterRole binding.
    pub namespace: Option<String>,
}

impl Rule {
    fn allows(&self, verb: Verb, kind: Kind, ns: Option<&str>) -> bool {
        self.verbs.contains(&verb)
            && self.kinds.contains(&kind)
            && match &self.namespace {
                None => true,
                Some(granted) => ns == Some(granted.as_str()),
            }
    }
}

/// A user and what it may do.
#[derive(Clone, Debug)]
pub struct Grant {
    /// The authenticated user name (`system:serviceaccount:NS:NAME`, `kubernetes-admin`).
    pub user: String,
    /// Its rules; a request is allowed when any rule allows it.
    pub rules: Vec<Rule>,
}

impl Grant {
    /// `cluster-admin` (bound to `system:masters`): every verb on every kind.
    pub fn cluster_admin(user: &str) -> Grant {
        Grant {
            user: user.to_string(),
            rules: vec![Rule {
                verbs: Verb::ALL.to_vec(),
                kinds: Kind::ALL.to_vec(),
                namespace: None,
            }],
        }
    }

    /// A COSI driver pod's service account `name` in `namespace` (the driver
    /// shares it with the provisioner sidecar in the same pod). The ClusterRole
    /// is the union of the upstream sample and vendor drivers'
    /// `objectstorage-provisioner-role`: buckets, bucket accesses, bucket
    /// claims and bucket access classes, leases and Secrets cluster-wide — but
    /// not BucketClasses, which the COSI controller manages. A Role in its own
    /// namespace adds ConfigMaps, where drivers keep their own state.
    pub fn cosi_driver(namespace: &str, name: &str) -> Grant {
        Grant {
            user: format!("system:serviceaccount:{namespace}:{name}"),
            rules: vec![
                Rule {
                    verbs: MANAGE.to_vec(),
                    kinds: vec![
                        Kind::Bucket,
                        Kind::BucketAccess,
                        Kind::BucketClaim,
                        Kind::BucketAccessClass,
                        Kind::Lease,
                        Kind::Secret,
                    ],
                    namespace: None,
                },
                Rule {
                    verbs: MANAGE.to_vec(),
                    kinds: vec![Kind::ConfigMap],
                    namespace: Some(namespace.to_string()),
                },
            ],
        }
    }

    /// A service account bound to nothing: authenticated, allowed only discovery.
    pub fn nothing(namespace: &str, name: &str) -> Grant {
        Grant {
            user: format!("system:serviceaccount:{namespace}:{name}"),
            rules: Vec::new(),
        }
    }

    /// True when some rule allows `verb` on `kind` in `ns`.
    pub fn allows(&self, verb: Verb, kind: Kind, ns: Option<&str>) -> bool {
        self.rules.iter().any(|r| r.allows(verb, kind, ns))
    }
}

/// The tokens issued so far. Shared by every instance of the fake a lab starts
/// (a restarted API server still accepts the tokens it signed). Cheap to clone.
#[derive(Clone, Default)]
pub struct Access {
    tokens: Arc<RwLock<BTreeMap<String, Arc<Grant>>>>,
}

impl Access {
    /// Issue a bearer token for `grant`: 32 random bytes from the OS, so a token
    /// is never guessable from a run's seed.
    pub fn issue(&self, grant: Grant) -> String {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        self.register(&token, grant);
        token
    }

    /// Accept `token`, chosen by the caller, for `grant` — for inputs that must
    /// replay byte for byte (fuzz scripts, raw-socket tests). A lab issues its
    /// tokens with [`Access::issue`].
    pub fn register(&self, token: &str, grant: Grant) {
        self.tokens
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.to_string(), Arc::new(grant));
    }

    /// The grant behind an `Authorization` header value, if it names a token issued here.
    pub(crate) fn authenticate(&self, authorization: Option<&[u8]>) -> Option<Arc<Grant>> {
        let value = std::str::from_utf8(authorization?).ok()?;
        let (scheme, token) = value.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(token.trim())
            .cloned()
    }
}

/// The authorizer's refusal, as the real server words it:
/// `secrets "s" is forbidden: User "u" cannot get resource "secrets" in API group "" in the namespace "ns"`.
pub(crate) fn forbidden_message(
    user: &str,
    verb: Verb,
    kind: Kind,
    status: bool,
    ns: Option<&str>,
    name: Option<&str>,
) -> String {
    let resource = if status {
        format!("{}/status", kind.plural())
    } else {
        kind.plural().to_string()
    };
    let subject = match name {
        Some(n) => format!("{resource} \"{n}\""),
        None => resource.clone(),
    };
    let scope = match ns {
        Some(ns) => format!(" in the namespace \"{ns}\""),
        None if kind.namespaced() => " at the cluster scope".to_string(),
        None => String::new(),
    };
    format!(
        "{subject} is forbidden: User \"{user}\" cannot {} resource \"{resource}\" in API group \"{}\"{scope}",
        verb.rbac_name(),
        kind.group()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_authenticate_only_as_bearer_and_only_when_issued() {
        let a = Access::default();
        let t = a.issue(Grant::cluster_admin("admin"));
        assert_eq!(t.len(), 64);
        let h = format!("Bearer {t}");
        assert_eq!(a.authenticate(Some(h.as_bytes())).unwrap().user, "admin");
        assert!(a
            .authenticate(Some(format!("Basic {t}").as_bytes()))
            .is_none());
        assert!(a.authenticate(Some(b"Bearer nope")).is_none());
        assert!(a.authenticate(None).is_none());
        assert_ne!(t, a.issue(Grant::cluster_admin("admin")), "tokens repeat");
    }

    #[test]
    fn the_driver_role_reaches_what_the_upstream_role_grants_and_no_more() {
        let d = Grant::cosi_driver("drv", "cosi");
        assert!(d.allows(Verb::Get, Kind::Secret, Some("anywhere")));
        assert!(d.allows(Verb::Replace, Kind::Bucket, None));
        assert!(d.allows(Verb::Create, Kind::ConfigMap, Some("drv")));
        assert!(!d.allows(Verb::Create, Kind::ConfigMap, Some("other")));
        assert!(!d.allows(Verb::Get, Kind::BucketClass, None));
        assert!(!d.allows(Verb::Get, Kind::Pod, Some("drv")));
        assert!(!d.allows(Verb::DeleteCollection, Kind::Secret, Some("drv")));
        assert!(!Grant::nothing("default", "x").allows(Verb::Get, Kind::Secret, Some("default")));
    }

    #[test]
    fn refusals_are_worded_as_the_rbac_authorizer_words_them() {
        assert_eq!(
            forbidden_message("u", Verb::Get, Kind::Secret, false, Some("ns"), Some("s")),
            "secrets \"s\" is forbidden: User \"u\" cannot get resource \"secrets\" in API group \"\" in the namespace \"ns\""
        );
        assert_eq!(
            forbidden_message("u", Verb::List, Kind::Secret, false, None, None),
            "secrets is forbidden: User \"u\" cannot list resource \"secrets\" in API group \"\" at the cluster scope"
        );
        assert_eq!(
            forbidden_message("u", Verb::Replace, Kind::Bucket, true, None, Some("b")),
            "buckets/status \"b\" is forbidden: User \"u\" cannot update resource \"buckets/status\" in API group \"objectstorage.k8s.io\""
        );
    }
}

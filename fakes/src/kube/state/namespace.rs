//! Namespaces and NamespaceLifecycle admission. The four built-in namespaces and
//! those recorded as existing (by the lab, or implicitly by an in-process write)
//! are answered virtually — synthesized on read, never written, so no run's
//! resourceVersions move — until a client writes them. Deleting a namespace
//! marks it Terminating, deletes what is in it, and removes it once nothing is
//! left (objects kept by finalizers keep it Terminating).

use std::sync::Arc;

use serde_json::{json, Value};

use super::{meta_mut, meta_str, uid_for, validate, Deleted, KubeFake, Preconditions, WriteOpts};
use crate::kube::{Kind, KubeError, Result};
use crate::store::StoreExt;

/// The namespaces every cluster has from the start.
pub(crate) const BUILT_IN: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];
/// The ones NamespaceLifecycle admission refuses to delete (its `immortalNamespaces`).
const IMMORTAL: [&str; 3] = ["default", "kube-system", "kube-public"];
/// Where recorded (virtual) namespaces are kept: outside the object prefix, so
/// recording one is not a write a client sees or a resourceVersion.
const DECLARED_PREFIX: &str = "kube/meta/ns/";
/// The label the server sets on every namespace to its own name.
const NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn declared_key(name: &str) -> String {
    format!("{DECLARED_PREFIX}{name}")
}

/// Whether new objects may be created in a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Active,
    Terminating,
    Missing,
}

/// FNV-1a, to give each virtual namespace its own stable uid.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A namespace as the server would show it, never written: created at virtual
/// time 0 (`created`), at resourceVersion `rv`.
fn synthesize(seed: u64, name: &str, rv: u64, created: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": uid_for(seed ^ fnv1a(name), 0),
            "resourceVersion": rv.max(1).to_string(),
            "creationTimestamp": created,
            "labels": {NAME_LABEL: name},
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

/// Create/update rules and server defaults of a Namespace: a DNS-1123 label
/// name, the name label, the `kubernetes` finalizer and phase Active.
pub(super) fn rules(obj: &mut Value) -> std::result::Result<(), validate::Violation> {
    let name = meta_str(obj, "name").to_string();
    validate::dns1123_label(&name).map_err(|m| ("metadata.name".to_string(), m))?;
    let labels = meta_mut(obj).entry("labels").or_insert_with(|| json!({}));
    if let Some(l) = labels.as_object_mut() {
        l.insert(NAME_LABEL.into(), json!(name));
    }
    let Some(m) = obj.as_object_mut() else {
        return Ok(());
    };
    if m.get("spec").is_none_or(Value::is_null) {
        m.insert("spec".into(), json!({"finalizers": ["kubernetes"]}));
    }
    let phase = m
        .get("status")
        .and_then(|st| st.get("phase"))
        .and_then(Value::as_str);
    if phase.is_none_or(str::is_empty) {
        m.insert("status".into(), json!({"phase": "Active"}));
    }
    Ok(())
}

impl KubeFake {
    /// Record `name` as an existing namespace without a write (no
    /// resourceVersion is used): how the lab, standing for the cluster admin,
    /// creates the namespaces a driver is deployed into.
    pub fn declare_namespace(&self, name: &str) -> Result<()> {
        validate::dns1123_label(name).map_err(|message| KubeError::Invalid {
            kind: Kind::Namespace,
            name: name.to_string(),
            field: "metadata.name".into(),
            message,
        })?;
        let guard = self.lock();
        if self.load(Kind::Namespace, "", name)?.is_none() {
            self.inner.store.put_json(&declared_key(name), &*guard)?;
        }
        Ok(())
    }

    /// The built-in or recorded namespace `name`, synthesized; `None` otherwise.
    pub(super) fn virtual_namespace(&self, name: &str) -> Result<Option<Value>> {
        let rv = match BUILT_IN.contains(&name) {
            true => Some(1),
            false => self.inner.store.get_json::<u64>(&declared_key(name))?,
        };
        Ok(rv.map(|rv| synthesize(self.inner.seed, name, rv, &self.epoch())))
    }

    /// Every virtual namespace not shadowed by a stored one in `stored`.
    pub(super) fn virtual_namespaces(
        &self,
        stored: &[std::sync::Arc<Value>],
    ) -> Result<Vec<Value>> {
        let declared = self.inner.store.scan_json::<u64>(DECLARED_PREFIX)?;
        let all = BUILT_IN.iter().map(|n| (n.to_string(), 1)).chain(
            declared
                .into_iter()
                .map(|(k, rv)| (k[DECLARED_PREFIX.len()..].to_string(), rv)),
        );
        Ok(all
            .filter(|(n, _)| !stored.iter().any(|o| meta_str(o, "name") == n))
            .map(|(n, rv)| synthesize(self.inner.seed, &n, rv, &self.epoch()))
            .collect())
    }

    pub(super) fn namespace_phase(&self, ns: &str) -> Result<Phase> {
        Ok(match self.load(Kind::Namespace, "", ns)? {
            None => Phase::Missing,
            Some(o) if !meta_str(&o, "deletionTimestamp").is_empty() => Phase::Terminating,
            Some(_) => Phase::Active,
        })
    }

    /// NamespaceLifecycle admission for creating `kind` `name` in `ns`: 404 for
    /// a missing namespace over HTTP, 403 while it terminates. True when an
    /// in-process create must record the namespace (the lab created it).
    pub(super) fn admit_create_in(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        opts: WriteOpts,
    ) -> Result<bool> {
        match self.namespace_phase(ns)? {
            Phase::Active => Ok(false),
            Phase::Terminating => Err(KubeError::Forbidden {
                kind,
                name: name.to_string(),
                message: format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
            }),
            Phase::Missing if opts.http => Err(KubeError::NotFound {
                kind: Kind::Namespace,
                name: ns.to_string(),
            }),
            Phase::Missing => Ok(true),
        }
    }

    /// Record `ns` (after an in-process create into it) at the current version.
    pub(super) fn record_namespace(&self, rv: u64, ns: &str) -> Result<()> {
        Ok(self.inner.store.put_json(&declared_key(ns), &rv)?)
    }

    /// DELETE of a namespace: 403 for the immortal ones; otherwise mark it
    /// Terminating, delete every object in it, and remove it when none is left.
    pub(super) fn delete_namespace_locked(
        &self,
        guard: &mut std::sync::MutexGuard<'_, u64>,
        name: &str,
        pre: &Preconditions,
        opts: WriteOpts,
    ) -> Result<Option<Deleted>> {
        let kind = Kind::Namespace;
        let Some(old) = self.load(kind, "", name)? else {
            return Ok(None);
        };
        if IMMORTAL.contains(&name) {
            return Err(KubeError::Forbidden {
                kind,
                name: name.to_string(),
                message: "this namespace may not be deleted".into(),
            });
        }
        super::check_preconditions(kind, name, &old, pre)?;
        if !meta_str(&old, "deletionTimestamp").is_empty() {
            return Ok(Some(Deleted {
                object: old,
                gone: false,
            }));
        }
        let rv = **guard + 1;
        let mut marked = old;
        let now = self.now();
        let md = meta_mut(&mut marked);
        md.insert("deletionTimestamp".into(), json!(now));
        md.insert("resourceVersion".into(), json!(rv.to_string()));
        if let Some(m) = marked.as_object_mut() {
            m.insert("status".into(), json!({"phase": "Terminating"}));
        }
        if opts.dry_run {
            return Ok(Some(Deleted {
                object: marked,
                gone: false,
            }));
        }
        let held = Some((Arc::new(marked.clone()), opts.form()));
        self.commit(guard, rv, kind, held, "", name)?;
        self.inner.store.remove(&declared_key(name))?;
        // What the namespace controller does, here at once rather than later.
        for k in Kind::ALL.into_iter().filter(|k| k.namespaced()) {
            for obj in self.scan(k, Some(name))? {
                let n = meta_str(&obj, "name").to_string();
                self.delete_locked(guard, k, name, &n, &Preconditions::default(), opts.clone())?;
            }
        }
        self.finish_namespace(guard, name)?;
        Ok(Some(Deleted {
            object: marked,
            gone: false,
        }))
    }

    /// Remove namespace `ns` if it is Terminating and nothing is left in it
    /// (called after every removal of a namespaced object).
    pub(super) fn finish_namespace(
        &self,
        guard: &mut std::sync::MutexGuard<'_, u64>,
        ns: &str,
    ) -> Result<()> {
        let Some(o) = self.stored(Kind::Namespace, "", ns)? else {
            return Ok(());
        };
        if meta_str(&o, "deletionTimestamp").is_empty() {
            return Ok(());
        }
        for k in Kind::ALL.into_iter().filter(|k| k.namespaced()) {
            if !self.scan(k, Some(ns))?.is_empty() {
                return Ok(());
            }
        }
        let rv = **guard + 1;
        self.commit(guard, rv, Kind::Namespace, None, "", ns)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::kube::{in_memory, Kind, KubeError};

    fn fake() -> crate::kube::KubeFake {
        let gate =
            crate::gate::Gate::new(crate::history::History::new(crate::clock::SimClock::new()));
        in_memory(gate, 1).unwrap()
    }

    fn names(f: &crate::kube::KubeFake) -> Vec<String> {
        f.list(Kind::Namespace, None)
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn built_ins_are_virtual_and_cost_no_version() {
        let f = fake();
        assert_eq!(
            names(&f),
            ["default", "kube-node-lease", "kube-public", "kube-system"]
        );
        let d = f.get(Kind::Namespace, None, "default").unwrap().unwrap();
        assert_eq!(d["status"]["phase"], "Active");
        assert_eq!(
            d["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "default"
        );
        assert_eq!(f.resource_version(), 0);
        assert!(matches!(
            f.create(Kind::Namespace, json!({"metadata":{"name":"default"}})),
            Err(KubeError::AlreadyExists { .. })
        ));
        assert!(matches!(
            f.delete(Kind::Namespace, None, "kube-system"),
            Err(KubeError::Forbidden { .. })
        ));
    }

    #[test]
    fn in_process_create_records_its_namespace_without_a_version() {
        let f = fake();
        let cm = f
            .create(
                Kind::ConfigMap,
                json!({"metadata":{"name":"a","namespace":"app"}}),
            )
            .unwrap();
        assert_eq!(cm["metadata"]["resourceVersion"], "1");
        assert_eq!(f.resource_version(), 1);
        assert!(names(&f).contains(&"app".to_string()));
        f.declare_namespace("drv").unwrap();
        assert_eq!(f.resource_version(), 1);
        assert!(f.get(Kind::Namespace, None, "drv").unwrap().is_some());
    }

    #[test]
    fn deletion_waits_for_finalizers_and_refuses_new_content() {
        let f = fake();
        f.create(Kind::Namespace, json!({"metadata":{"name":"gone"}}))
            .unwrap();
        f.create(
            Kind::ConfigMap,
            json!({"metadata":{"name":"held","namespace":"gone","finalizers":["x.io/hold"]}}),
        )
        .unwrap();
        f.create(
            Kind::Secret,
            json!({"metadata":{"name":"s","namespace":"gone"}}),
        )
        .unwrap();
        let marked = f.delete(Kind::Namespace, None, "gone").unwrap().unwrap();
        assert_eq!(marked["status"]["phase"], "Terminating");
        assert!(f.get(Kind::Secret, Some("gone"), "s").unwrap().is_none());
        let ns = f.get(Kind::Namespace, None, "gone").unwrap().unwrap();
        assert!(ns["metadata"]["deletionTimestamp"].is_string());
        let refused = f.create(
            Kind::ConfigMap,
            json!({"metadata":{"name":"new","namespace":"gone"}}),
        );
        match refused {
            Err(e @ KubeError::Forbidden { .. }) => assert_eq!(
                e.to_string(),
                "configmaps \"new\" is forbidden: unable to create new content in namespace gone because it is being terminated"
            ),
            other => panic!("expected 403, got {other:?}"),
        }
        f.merge_patch(
            Kind::ConfigMap,
            Some("gone"),
            "held",
            json!({"metadata":{"finalizers":null}}),
        )
        .unwrap();
        assert!(f.get(Kind::Namespace, None, "gone").unwrap().is_none());
        assert!(!names(&f).contains(&"gone".to_string()));
    }
}

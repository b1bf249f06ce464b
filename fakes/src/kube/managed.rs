//! Field ownership (`metadata.managedFields`) and server-side apply, after
//! sigs.k8s.io/structured-merge-diff v4 (`merge.Updater.Apply`/`Update`,
//! `typed` ToFieldSet/Compare/Merge) and k8s.io/apimachinery's
//! `managedfields/internal` (stripped meta fields, `before-first-apply`,
//! conflict errors, entry order), over the field tables of `schema`.
//!
//! A field set is a set of paths whose elements are written as in `fieldsV1`:
//! `f:name` (a field or map key), `k:{"name":"x"}` (an item of a keyed list),
//! `v:"x"` (an item of a set). Atomic lists and free-form parts are leaves.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use super::schema::{root, S};
use super::{Kind, KubeError};

/// One path of a field set.
type Path = Vec<String>;
/// A set of paths.
pub(crate) type FieldSet = BTreeSet<Path>;

/// Metadata fields never tracked (apimachinery `stripMetaManager`).
const STRIPPED_META: [&str; 8] = [
    "name",
    "namespace",
    "creationTimestamp",
    "selfLink",
    "uid",
    "generation",
    "managedFields",
    "resourceVersion",
];

fn strip(set: FieldSet) -> FieldSet {
    set.into_iter()
        .filter(|p| match p.as_slice() {
            [] => false,
            [top, ..] if top == "f:apiVersion" || top == "f:kind" => false,
            [m] if m == "f:metadata" => false,
            [m, f, ..] if m == "f:metadata" => !STRIPPED_META
                .iter()
                .any(|s| f.strip_prefix("f:") == Some(s)),
            _ => true,
        })
        .collect()
}

/// Who wrote, and how: a manager's identity (`BuildManagerIdentifier`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ManagerKey {
    /// `Apply` or `Update`.
    pub operation: &'static str,
    /// The field manager's name.
    pub manager: String,
    /// `status` for writes to the status subresource, else empty.
    pub subresource: String,
}

#[derive(Clone, Debug, PartialEq)]
struct Entry {
    set: FieldSet,
    api_version: String,
    time: String,
}

/// Every manager's fields of one object.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Managed(BTreeMap<ManagerKey, Entry>);

impl Managed {
    /// The managers recorded in `obj`'s `metadata.managedFields`.
    pub(crate) fn of(obj: &Value) -> Managed {
        let mut out = BTreeMap::new();
        let entries = obj
            .pointer("/metadata/managedFields")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for e in entries {
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let operation = match s("operation").as_str() {
                "Apply" => "Apply",
                _ => "Update",
            };
            let mut set = FieldSet::new();
            if let Some(f) = e.get("fieldsV1") {
                read_fields(f, &mut Vec::new(), &mut set);
            }
            out.insert(
                ManagerKey {
                    operation,
                    manager: s("manager"),
                    subresource: s("subresource"),
                },
                Entry {
                    set,
                    api_version: s("apiVersion"),
                    time: s("time"),
                },
            );
        }
        Managed(out)
    }

    /// `metadata.managedFields`, in the server's order (operation, time, manager).
    pub(crate) fn to_json(&self) -> Value {
        let mut entries: Vec<(&ManagerKey, &Entry)> = self.0.iter().collect();
        entries.sort_by(|(ka, ea), (kb, eb)| {
            (
                ka.operation,
                &ea.time,
                &ka.manager,
                &ea.api_version,
                &ka.subresource,
            )
                .cmp(&(
                    kb.operation,
                    &eb.time,
                    &kb.manager,
                    &eb.api_version,
                    &kb.subresource,
                ))
        });
        let list: Vec<Value> = entries
            .into_iter()
            .map(|(k, e)| {
                let mut m = json!({
                    "manager": k.manager,
                    "operation": k.operation,
                    "apiVersion": e.api_version,
                    "time": e.time,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": write_fields(&e.set),
                });
                if !k.subresource.is_empty() {
                    m["subresource"] = json!(k.subresource);
                }
                m
            })
            .collect();
        Value::Array(list)
    }
}

fn read_fields(v: &Value, prefix: &mut Path, out: &mut FieldSet) {
    let Some(m) = v.as_object() else { return };
    for (k, child) in m {
        if k == "." {
            out.insert(prefix.clone());
            continue;
        }
        prefix.push(k.clone());
        if child.as_object().is_some_and(Map::is_empty) {
            out.insert(prefix.clone());
        } else {
            read_fields(child, prefix, out);
        }
        prefix.pop();
    }
}

fn write_fields(set: &FieldSet) -> Value {
    #[derive(Default)]
    struct Node {
        member: bool,
        children: BTreeMap<String, Node>,
    }
    let mut top = Node::default();
    for p in set {
        let mut n = &mut top;
        for e in p {
            n = n.children.entry(e.clone()).or_default();
        }
        n.member = true;
    }
    fn render(n: &Node) -> Value {
        let mut m = Map::new();
        if n.member && !n.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, c) in &n.children {
            m.insert(k.clone(), render(c));
        }
        Value::Object(m)
    }
    render(&top)
}

/// The `k:` element of a keyed-list item (`k:{"name":"x"}`).
fn key_element(item: &Value, key: &str) -> String {
    let v = item.get(key).cloned().unwrap_or(Value::Null);
    format!("k:{{{}:{}}}", json!(key), v)
}

/// A path as structured-merge-diff prints it (`.spec.list[name="x"]`).
pub(crate) fn display(p: &Path) -> String {
    let mut out = String::new();
    for e in p {
        if let Some(f) = e.strip_prefix("f:") {
            out.push('.');
            out.push_str(f);
        } else if let Some(v) = e.strip_prefix("v:") {
            out.push_str(&format!("[={v}]"));
        } else if let Some(k) = e.strip_prefix("k:") {
            let m: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!("[{}]", parts.join(",")));
        }
    }
    out
}

/// The set an apply configuration claims (`TypedValue.ToFieldSet`).
fn config_set(s: &S, v: &Value, path: &mut Path, out: &mut FieldSet) {
    match (s.resolve(), v) {
        (S::Obj(fields), Value::Object(m)) => {
            for (k, val) in m {
                path.push(format!("f:{k}"));
                match fields.iter().find(|(n, _)| n == k) {
                    Some((_, t)) => {
                        config_set(t, val, path, out);
                        if val.is_null() || val.as_object().is_some_and(Map::is_empty) {
                            out.insert(path.clone());
                        }
                    }
                    None => {
                        out.insert(path.clone());
                    }
                }
                path.pop();
            }
        }
        (S::Map(t), Value::Object(m)) => {
            for (k, val) in m {
                path.push(format!("f:{k}"));
                config_set(t, val, path, out);
                out.insert(path.clone());
                path.pop();
            }
        }
        (S::Keyed(t, key), Value::Array(a)) => {
            for item in a {
                path.push(key_element(item, key));
                config_set(t, item, path, out);
                out.insert(path.clone());
                path.pop();
            }
        }
        (S::Set(_), Value::Array(a)) => {
            for item in a {
                path.push(format!("v:{item}"));
                out.insert(path.clone());
                path.pop();
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

/// Free-form parts an apply configuration sets (`S::Free`, not inside an
/// atomic list): their structure is not modelled, so apply cannot merge them.
fn free_parts_set(s: &S, v: &Value, path: &mut Path, out: &mut Vec<String>) {
    match (s.resolve(), v) {
        (S::Free, v) if !v.is_null() => out.push(display(path)),
        (S::Obj(fields), Value::Object(m)) => {
            for (k, val) in m {
                if let Some((_, t)) = fields.iter().find(|(n, _)| n == k) {
                    path.push(format!("f:{k}"));
                    free_parts_set(t, val, path, out);
                    path.pop();
                }
            }
        }
        (S::Map(t), Value::Object(m)) => {
            for (k, val) in m {
                path.push(format!("f:{k}"));
                free_parts_set(t, val, path, out);
                path.pop();
            }
        }
        (S::Keyed(t, key), Value::Array(a)) => {
            for item in a {
                path.push(key_element(item, key));
                free_parts_set(t, item, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// What changed between two objects (`TypedValue.Compare`).
#[derive(Default, Debug)]
struct Comparison {
    added: FieldSet,
    modified: FieldSet,
    removed: FieldSet,
}

fn compare(s: &S, lhs: Option<&Value>, rhs: Option<&Value>, path: &mut Path, c: &mut Comparison) {
    let container = match (s.resolve(), lhs.or(rhs)) {
        (S::Obj(fields), Some(Value::Object(_))) => {
            let (l, r) = (
                lhs.and_then(Value::as_object),
                rhs.and_then(Value::as_object),
            );
            for k in member_keys(l, r) {
                let t = fields
                    .iter()
                    .find(|(n, _)| n == k)
                    .map_or(&S::Free, |(_, t)| t);
                path.push(format!("f:{k}"));
                compare(t, member(l, k), member(r, k), path, c);
                path.pop();
            }
            true
        }
        (S::Map(t), Some(Value::Object(_))) => {
            let (l, r) = (
                lhs.and_then(Value::as_object),
                rhs.and_then(Value::as_object),
            );
            for k in member_keys(l, r) {
                path.push(format!("f:{k}"));
                compare(t, member(l, k), member(r, k), path, c);
                path.pop();
            }
            true
        }
        (S::Keyed(t, key), Some(Value::Array(_))) => {
            let (l, r) = (keyed_items(lhs, key), keyed_items(rhs, key));
            let keys: BTreeSet<&String> = l.keys().chain(r.keys()).collect();
            for k in keys {
                path.push(k.clone());
                compare(t, l.get(k).copied(), r.get(k).copied(), path, c);
                path.pop();
            }
            true
        }
        (S::Set(_), Some(Value::Array(_))) => {
            let items = |v: Option<&Value>| -> BTreeSet<String> {
                v.and_then(Value::as_array)
                    .map(|a| a.iter().map(|i| format!("v:{i}")).collect())
                    .unwrap_or_default()
            };
            let (l, r) = (items(lhs), items(rhs));
            for k in l.union(&r) {
                path.push(k.clone());
                match (l.contains(k), r.contains(k)) {
                    (false, true) => c.added.insert(path.clone()),
                    (true, false) => c.removed.insert(path.clone()),
                    _ => false,
                };
                path.pop();
            }
            true
        }
        _ => false,
    };
    if path.is_empty() {
        return;
    }
    match (lhs, rhs) {
        (None, Some(_)) => {
            c.added.insert(path.clone());
        }
        (Some(_), None) => {
            c.removed.insert(path.clone());
        }
        (Some(l), Some(r)) if !container && l != r => {
            c.modified.insert(path.clone());
        }
        _ => {}
    }
}

/// The keys of either map, each once, in order.
fn member_keys<'a>(
    l: Option<&'a Map<String, Value>>,
    r: Option<&'a Map<String, Value>>,
) -> BTreeSet<&'a String> {
    l.into_iter().chain(r).flat_map(Map::keys).collect()
}

/// A keyed list's items by their `k:` element.
fn keyed_items<'a>(v: Option<&'a Value>, key: &str) -> BTreeMap<String, &'a Value> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().map(|i| (key_element(i, key), i)).collect())
        .unwrap_or_default()
}

fn member<'a>(m: Option<&'a Map<String, Value>>, k: &str) -> Option<&'a Value> {
    m.and_then(|m| m.get(k))
}

/// The object `lhs` with `rhs` applied over it (`TypedValue.Merge`).
fn merge(s: &S, lhs: &Value, rhs: &Value) -> Value {
    match (s.resolve(), lhs, rhs) {
        (S::Obj(_) | S::Map(_), Value::Object(l), Value::Object(r)) => {
            let mut out = l.clone();
            for (k, rv) in r {
                if rv.is_null() {
                    out.remove(k);
                    continue;
                }
                let t = match s.resolve() {
                    S::Obj(fields) => fields
                        .iter()
                        .find(|(n, _)| n == k)
                        .map_or(&S::Free, |(_, t)| t),
                    S::Map(t) => t,
                    _ => &S::Free,
                };
                let merged = match l.get(k) {
                    Some(lv) => merge(t, lv, rv),
                    None => rv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (S::Keyed(t, key), Value::Array(l), Value::Array(r)) => {
            let mut out: Vec<Value> = l
                .iter()
                .map(|li| {
                    let k = key_element(li, key);
                    match r.iter().find(|ri| key_element(ri, key) == k) {
                        Some(ri) => merge(t, li, ri),
                        None => li.clone(),
                    }
                })
                .collect();
            for ri in r {
                let k = key_element(ri, key);
                if !l.iter().any(|li| key_element(li, key) == k) {
                    out.push(ri.clone());
                }
            }
            Value::Array(out)
        }
        (S::Set(_), Value::Array(l), Value::Array(r)) => {
            let mut out = l.clone();
            for ri in r {
                if !out.contains(ri) {
                    out.push(ri.clone());
                }
            }
            Value::Array(out)
        }
        _ => rhs.clone(),
    }
}

/// Removes `path` from `v`; answers the removed value's parent path when it
/// was a map entry (so an emptied map can go too).
fn remove(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for e in parents {
        let next = match cur {
            Value::Object(m) => e.strip_prefix("f:").and_then(|f| m.get_mut(f)),
            Value::Array(a) => a.iter_mut().find(|i| element_matches(i, e)),
            _ => None,
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    match cur {
        Value::Object(m) => {
            if let Some(f) = last.strip_prefix("f:") {
                m.remove(f);
            }
        }
        Value::Array(a) => a.retain(|i| !element_matches(i, last)),
        _ => {}
    }
}

fn element_matches(item: &Value, e: &str) -> bool {
    if let Some(v) = e.strip_prefix("v:") {
        return serde_json::from_str::<Value>(v).is_ok_and(|v| &v == item);
    }
    if let Some(k) = e.strip_prefix("k:") {
        let m: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
        return m.iter().all(|(k, v)| item.get(k) == Some(v));
    }
    false
}

fn value_at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = v;
    for e in path {
        cur = match cur {
            Value::Object(m) => m.get(e.strip_prefix("f:")?)?,
            Value::Array(a) => a.iter().find(|i| element_matches(i, e))?,
            _ => return None,
        };
    }
    Some(cur)
}

/// The schema node at `path` under `s`.
fn type_at<'a>(s: &'a S, path: &[String]) -> Option<&'a S> {
    let mut cur = s;
    for e in path {
        cur = match cur.resolve() {
            S::Obj(fields) => {
                let f = e.strip_prefix("f:")?;
                &fields.iter().find(|(n, _)| *n == f)?.1
            }
            S::Map(t) => t,
            S::Keyed(t, _) => t,
            _ => return None,
        };
    }
    Some(cur)
}

/// The 409 of conflicting managers (apimachinery `NewConflictError`).
fn conflict_error(conflicts: &[(ManagerKey, String, Path)]) -> KubeError {
    // printManager: the name, its subresource, and for an updater its version.
    let who = |k: &ManagerKey, api_version: &str| {
        let mut m = format!("{:?}", k.manager);
        if !k.subresource.is_empty() {
            m = format!("{m} with subresource {:?}", k.subresource);
        }
        if k.operation == "Update" {
            m = format!("{m} using {api_version}");
        }
        m
    };
    let causes: Vec<(String, String)> = conflicts
        .iter()
        .map(|(k, v, p)| (display(p), format!("conflict with {}", who(k, v))))
        .collect();
    let message = match conflicts {
        [(k, v, p)] => format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            who(k, v),
            display(p)
        ),
        many => {
            let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (k, v, p) in many {
                by.entry(who(k, v)).or_default().push(display(p));
            }
            let lines: Vec<String> = by
                .into_iter()
                .flat_map(|(m, paths)| {
                    std::iter::once(format!("conflicts with {m}:"))
                        .chain(paths.into_iter().map(|p| format!("- {p}")))
                })
                .collect();
            format!(
                "Apply failed with {} conflicts: {}",
                many.len(),
                lines.join("\n")
            )
        }
    };
    KubeError::ApplyConflict { message, causes }
}

/// A write's manager and what it may touch.
pub(crate) struct Writer<'a> {
    /// The field manager's name.
    pub manager: &'a str,
    /// A write to the status subresource.
    pub status: bool,
    /// The virtual time of the write.
    pub now: &'a str,
}

impl Writer<'_> {
    fn key(&self, operation: &'static str) -> ManagerKey {
        ManagerKey {
            operation,
            manager: self.manager.to_string(),
            subresource: if self.status {
                "status".into()
            } else {
                String::new()
            },
        }
    }
}

/// Records an `Update` by `w` (a create when `old` is `None`) in `new`'s
/// managedFields: the writer owns what it changed, and others lose it
/// (`Updater.Update`). A write that changes nothing keeps `old`'s entries.
pub(crate) fn record_update(kind: Kind, old: Option<&Value>, new: &mut Value, w: &Writer) {
    let s = root(kind);
    let mut c = Comparison::default();
    compare(s, old, Some(new), &mut Vec::new(), &mut c);
    let changed: FieldSet = strip(c.added.union(&c.modified).cloned().collect());
    let removed = strip(std::mem::take(&mut c.removed));
    if let Some(entries) = old.and_then(|o| rewritten_by_owner(kind, o, new, &changed, &removed, w))
    {
        if cfg!(debug_assertions) {
            // Every debug run (the suite, the tests) checks the shortcut
            // against the general rule.
            let mut slow = new.clone();
            record_update_sets(kind, old, &mut slow, w, changed, removed);
            assert_eq!(
                slow.pointer("/metadata/managedFields"),
                Some(&entries),
                "managedFields shortcut differs from the general update"
            );
        }
        if let Some(md) = new.get_mut("metadata").and_then(Value::as_object_mut) {
            md.insert("managedFields".into(), entries);
        }
        return;
    }
    record_update_sets(kind, old, new, w, changed, removed);
}

/// The most common update — a manager rewriting fields it alone already
/// owns, nothing removed, managedFields sent back as read (or not at all) —
/// changes only that manager's `time` (and apiVersion): the live entries,
/// re-stamped and re-sorted, without decoding and re-rendering every set.
/// `None` when the update is anything else.
fn rewritten_by_owner(
    kind: Kind,
    old: &Value,
    new: &Value,
    changed: &FieldSet,
    removed: &FieldSet,
    w: &Writer,
) -> Option<Value> {
    if changed.is_empty() || !removed.is_empty() {
        return None;
    }
    let live = old.pointer("/metadata/managedFields")?.as_array()?;
    match new.pointer("/metadata/managedFields") {
        None => {}
        Some(sent) if sent.as_array() == Some(live) => {}
        Some(_) => return None,
    }
    let subresource = if w.status { "status" } else { "" };
    let field = |e: &Value, k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let is_mine = |e: &Value| {
        field(e, "operation") == "Update"
            && field(e, "manager") == w.manager
            && field(e, "subresource") == subresource
    };
    let owns = |e: &Value, p: &Path| {
        let mut node = e.get("fieldsV1");
        for el in p {
            node = node.and_then(|n| n.get(el.as_str()));
        }
        node.and_then(Value::as_object)
            .is_some_and(|m| m.is_empty() || m.contains_key("."))
    };
    let mine = live.iter().position(is_mine)?;
    for (i, e) in live.iter().enumerate() {
        let other = i != mine;
        if changed.iter().any(|p| owns(e, p) == other) {
            return None;
        }
    }
    let mut entries = live.clone();
    entries[mine]["time"] = json!(w.now);
    entries[mine]["apiVersion"] = json!(kind.api_version());
    // The server's order (`Managed::to_json`): operation, time, manager, apiVersion, subresource.
    entries.sort_by_cached_key(|e| {
        ["operation", "time", "manager", "apiVersion", "subresource"].map(|k| field(e, k))
    });
    Some(Value::Array(entries))
}

/// [`record_update`] by its sets: decode every manager's fields, move
/// `changed` to the writer, drop `removed`, render them again.
fn record_update_sets(
    kind: Kind,
    old: Option<&Value>,
    new: &mut Value,
    w: &Writer,
    changed: FieldSet,
    removed: FieldSet,
) {
    // A body that sets managedFields replaces them; one without keeps the live
    // object's, so clients that do not know the field never erase it
    // (apimachinery `decodeLiveOrNew`).
    let mut managed = Managed::of(new);
    if managed.0.is_empty() {
        managed = old.map(Managed::of).unwrap_or_default();
    }
    if changed.is_empty() && removed.is_empty() {
        set_managed(new, &managed);
        return;
    }
    let me = w.key("Update");
    for (k, e) in managed.0.iter_mut() {
        if *k != me {
            e.set = e.set.difference(&changed).cloned().collect();
            e.set = e.set.difference(&removed).cloned().collect();
        }
    }
    let mut mine = managed
        .0
        .remove(&me)
        .map(|e| e.set)
        .unwrap_or_default()
        .difference(&removed)
        .cloned()
        .collect::<FieldSet>();
    mine.extend(changed);
    managed.0.insert(
        me,
        Entry {
            set: mine,
            api_version: kind.api_version().to_string(),
            time: w.now.to_string(),
        },
    );
    managed.0.retain(|_, e| !e.set.is_empty());
    set_managed(new, &managed);
}

fn set_managed(obj: &mut Value, managed: &Managed) {
    if let Some(md) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if managed.0.is_empty() {
            md.remove("managedFields");
        } else {
            md.insert("managedFields".into(), managed.to_json());
        }
    }
}

/// Validates an apply configuration before anything is merged: no
/// managedFields, the kind's own apiVersion, nothing in a part whose
/// structure the fake does not model.
pub(crate) fn check_config(kind: Kind, config: &Value) -> Result<(), KubeError> {
    if config.pointer("/metadata/managedFields").is_some() {
        return Err(KubeError::BadRequest {
            message: "metadata.managedFields must be nil".into(),
        });
    }
    let v = config
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if v != kind.api_version() {
        return Err(KubeError::BadRequest {
            message: format!(
                "Incorrect version specified in apply patch. Specified patch version: {v}, expected: {}",
                kind.api_version()
            ),
        });
    }
    let mut free = Vec::new();
    free_parts_set(root(kind), config, &mut Vec::new(), &mut free);
    if !free.is_empty() {
        return Err(KubeError::NotImplemented {
            message: format!(
                "drivelab's Kubernetes fake does not model the fields of {} {} for server-side apply (it cannot merge or track them); write them with an update or a merge patch",
                kind.kind_name(),
                free.join(", ")
            ),
        });
    }
    Ok(())
}

/// The part of an apply configuration a write may set: on the main resource
/// of a kind with a status subresource, not `status`; on `/status`, only it.
pub(crate) fn scope_config(kind: Kind, config: &Value, status: bool) -> Value {
    let mut c = config.clone();
    if let Some(m) = c.as_object_mut() {
        if status {
            m.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status"));
            if let Some(md) = m.get_mut("metadata").and_then(Value::as_object_mut) {
                md.retain(|k, _| k == "name" || k == "namespace");
            }
        } else if kind.has_status_subresource() {
            m.remove("status");
        }
    }
    c
}

/// Server-side apply of `config` (already scoped) by `w` onto `live`
/// (`Updater.Apply`): merged, with the fields the manager applied before and
/// no longer applies removed when nobody else owns them; 409 naming the
/// managers and fields another manager owns with a different value, unless
/// `force` takes them over.
pub(crate) fn apply(
    kind: Kind,
    live: &Value,
    config: &Value,
    w: &Writer,
    force: bool,
) -> Result<Value, KubeError> {
    let s = root(kind);
    let mut managed = Managed::of(live);
    let me = w.key("Apply");
    if managed.0.is_empty() {
        // Objects written before any field manager: one entry owns all their fields.
        let mut c = Comparison::default();
        compare(s, None, Some(live), &mut Vec::new(), &mut c);
        let set = strip(c.added);
        if !set.is_empty() {
            managed.0.insert(
                ManagerKey {
                    operation: "Update",
                    manager: "before-first-apply".into(),
                    subresource: String::new(),
                },
                Entry {
                    set,
                    api_version: kind.api_version().to_string(),
                    time: w.now.to_string(),
                },
            );
        }
    }
    let mut merged = merge(s, live, config);
    let last = managed
        .0
        .get(&me)
        .map(|e| e.set.clone())
        .unwrap_or_default();
    let mut applied = FieldSet::new();
    config_set(s, config, &mut Vec::new(), &mut applied);
    let applied = strip(applied);
    let previous_time = managed.0.get(&me).map(|e| e.time.clone());
    managed.0.insert(
        me.clone(),
        Entry {
            set: applied,
            api_version: kind.api_version().to_string(),
            time: w.now.to_string(),
        },
    );
    // Prune what this manager stopped applying and nobody else owns.
    let owned: FieldSet = managed
        .0
        .values()
        .flat_map(|e| e.set.iter().cloned())
        .collect();
    for p in last.difference(&owned) {
        if owned.iter().any(|o| o.len() > p.len() && o.starts_with(p)) {
            continue;
        }
        remove(&mut merged, p);
        // Go's omitempty: a typed map emptied by the removal is gone too.
        if let Some((_, parent)) = p.split_last() {
            let typed = !kind.is_custom() || parent.first().is_some_and(|f| f == "f:metadata");
            let empty =
                value_at(&merged, parent).is_some_and(|v| v.as_object().is_some_and(Map::is_empty));
            if typed && empty && matches!(type_at(s, parent).map(S::resolve), Some(S::Map(_))) {
                remove(&mut merged, parent);
            }
        }
    }
    let mut c = Comparison::default();
    compare(s, Some(live), Some(&merged), &mut Vec::new(), &mut c);
    let changed: FieldSet = strip(c.added.union(&c.modified).cloned().collect());
    let removed = strip(c.removed.clone());
    let mut conflicts = Vec::new();
    for (k, e) in &managed.0 {
        if *k != me {
            for p in e.set.intersection(&changed) {
                conflicts.push((k.clone(), e.api_version.clone(), p.clone()));
            }
        }
    }
    if !force && !conflicts.is_empty() {
        return Err(conflict_error(&conflicts));
    }
    for (k, e) in managed.0.iter_mut() {
        if *k != me {
            e.set = e.set.difference(&changed).cloned().collect();
            e.set = e.set.difference(&removed).cloned().collect();
        }
    }
    managed.0.retain(|_, e| !e.set.is_empty());
    // An apply that changes nothing leaves the object as it was, times included.
    let before = Managed::of(live);
    let unchanged = c.added.is_empty() && c.modified.is_empty() && c.removed.is_empty();
    if unchanged {
        if let (Some(t), Some(e)) = (previous_time, managed.0.get_mut(&me)) {
            if before.0.get(&me).is_some_and(|b| b.set == e.set) {
                e.time = t;
            }
        }
        if managed == before {
            return Ok(live.clone());
        }
    }
    set_managed(&mut merged, &managed);
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w<'a>(m: &'a str) -> Writer<'a> {
        Writer {
            manager: m,
            status: false,
            now: "2025-01-01T00:00:00Z",
        }
    }

    #[test]
    fn fields_v1_round_trips_with_member_markers() {
        let f = json!({"f:data": {".": {}, "f:a": {}}, "f:metadata": {"f:labels": {"f:app": {}}}});
        let mut set = FieldSet::new();
        read_fields(&f, &mut Vec::new(), &mut set);
        assert!(set.contains(&vec!["f:data".to_string()]));
        assert_eq!(write_fields(&set), f);
        assert_eq!(
            display(&vec![
                "f:spec".into(),
                "f:drivers".into(),
                "k:{\"name\":\"d\"}".into()
            ]),
            ".spec.drivers[name=\"d\"]"
        );
        assert_eq!(
            display(&vec![
                "f:metadata".into(),
                "f:finalizers".into(),
                "v:\"x\"".into()
            ]),
            ".metadata.finalizers[=\"x\"]"
        );
    }

    #[test]
    fn update_then_apply_conflicts_and_force_takes_over() {
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "n"}, "data": {"a": "1", "b": "2"}});
        record_update(Kind::ConfigMap, None, &mut cm, &w("kubectl-create"));
        let mf = &cm["metadata"]["managedFields"][0];
        assert_eq!(mf["operation"], "Update");
        assert_eq!(
            mf["fieldsV1"],
            json!({"f:data": {".": {}, "f:a": {}, "f:b": {}}})
        );
        let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "n"}, "data": {"a": "9"}});
        let err = apply(Kind::ConfigMap, &cm, &config, &w("me"), false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"kubectl-create\" using v1: .data.a"
        );
        let two = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "9", "b": "8"}});
        assert_eq!(
            apply(Kind::ConfigMap, &cm, &two, &w("me"), false).unwrap_err().to_string(),
            "Apply failed with 2 conflicts: conflicts with \"kubectl-create\" using v1:\n- .data.a\n- .data.b"
        );
        // The same value is no conflict: shared ownership.
        let same = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
        let shared = apply(Kind::ConfigMap, &cm, &same, &w("me"), false).unwrap();
        assert_eq!(
            shared["metadata"]["managedFields"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        let forced = apply(Kind::ConfigMap, &cm, &config, &w("me"), true).unwrap();
        assert_eq!(forced["data"], json!({"a": "9", "b": "2"}));
        let m = Managed::of(&forced);
        let create = &m.0[&ManagerKey {
            operation: "Update",
            manager: "kubectl-create".into(),
            subresource: String::new(),
        }];
        assert!(!create
            .set
            .contains(&vec!["f:data".to_string(), "f:a".to_string()]));
        // Dropping a field it alone applied removes it; a field others own stays.
        let mut mine = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"},
            "data": {"k": "v", "l": "w"}});
        mine = apply(
            Kind::ConfigMap,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
            &mine,
            &w("me"),
            false,
        )
        .unwrap();
        let less = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"k": "v"}});
        let after = apply(Kind::ConfigMap, &mine, &less, &w("me"), false).unwrap();
        assert_eq!(after["data"], json!({"k": "v"}));
        let none = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
        let emptied = apply(Kind::ConfigMap, &after, &none, &w("me"), false).unwrap();
        assert!(emptied.get("data").is_none(), "{emptied}");
    }

    #[test]
    fn an_update_without_managed_fields_keeps_the_live_ones() {
        let mut old = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
        record_update(Kind::ConfigMap, None, &mut old, &w("first"));
        let mut same = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
        record_update(Kind::ConfigMap, Some(&old), &mut same, &w("second"));
        assert_eq!(same, old, "a write that changes nothing is a no-op");
        let mut changed = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}});
        record_update(Kind::ConfigMap, Some(&old), &mut changed, &w("second"));
        let m = Managed::of(&changed);
        let names: Vec<&str> = m.0.keys().map(|k| k.manager.as_str()).collect();
        assert_eq!(names, ["first", "second"]);
    }

    /// The owner-rewrite shortcut is taken where it applies, and gives what
    /// the general rule gives: the writer's entry re-stamped and moved to
    /// its place in the server's order.
    #[test]
    fn an_owner_rewriting_its_own_fields_takes_the_shortcut_to_the_same_entries() {
        let at = |now| Writer {
            manager: "driver",
            status: false,
            now,
        };
        let mut v1 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}});
        record_update(Kind::ConfigMap, None, &mut v1, &at("2025-01-01T00:00:01Z"));
        let mut v2 = v1.clone();
        v2["data"]["x"] = json!("3");
        record_update(Kind::ConfigMap, Some(&v1), &mut v2, &w("other"));
        // "driver" rewrites a and b (its own, kube-rs style: managedFields sent back).
        let mut v3 = v2.clone();
        v3["data"]["a"] = json!("10");
        v3["data"]["b"] = json!("20");
        let c = |old: &Value, new: &Value| {
            let mut c = Comparison::default();
            compare(
                root(Kind::ConfigMap),
                Some(old),
                Some(new),
                &mut Vec::new(),
                &mut c,
            );
            (
                strip(c.added.union(&c.modified).cloned().collect()),
                strip(c.removed),
            )
        };
        let (changed, removed) = c(&v2, &v3);
        let now = at("2025-01-01T00:00:09Z");
        let short = rewritten_by_owner(Kind::ConfigMap, &v2, &v3, &changed, &removed, &now)
            .expect("an owner rewriting its own fields takes the shortcut");
        let mut general = v3.clone();
        record_update_sets(
            Kind::ConfigMap,
            Some(&v2),
            &mut general,
            &now,
            changed,
            removed,
        );
        assert_eq!(general["metadata"]["managedFields"], short);
        let order: Vec<&str> = short
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(
            order,
            ["other", "driver"],
            "the re-stamped entry sorts by its new time"
        );
        // Not the shortcut: a field another manager owns, a removal, or new fields.
        let mut takes_x = v2.clone();
        takes_x["data"]["x"] = json!("4");
        let mut drops_b = v2.clone();
        drops_b["data"].as_object_mut().unwrap().remove("b");
        let mut adds_y = v2.clone();
        adds_y["data"]["y"] = json!("5");
        for new in [takes_x, drops_b, adds_y] {
            let (changed, removed) = c(&v2, &new);
            assert_eq!(
                rewritten_by_owner(Kind::ConfigMap, &v2, &new, &changed, &removed, &now),
                None,
                "{new}"
            );
        }
    }

    #[test]
    fn free_parts_are_refused_for_apply() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}});
        assert!(matches!(
            check_config(Kind::Pod, &pod),
            Err(KubeError::NotImplemented { .. })
        ));
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "managedFields": []}});
        assert!(matches!(
            check_config(Kind::ConfigMap, &cm),
            Err(KubeError::BadRequest { .. })
        ));
    }
}

//! `/openapi/v2` and `/openapi/v3` for the kinds this fake serves, generated
//! from `schema`: the paths and operations of every served verb, each PATCH
//! carrying `x-kubernetes-group-version-kind` and the `fieldValidation` query
//! parameter, which is what kubectl's `QueryParamVerifierV3.HasSupport`
//! (k8s.io/cli-runtime/pkg/resource/query_param_verifier_v3.go) looks for
//! before it leaves validation to the server (`--validate=strict`).

use serde_json::{json, Map, Value};

use super::schema::{definition_name, kind_schema, OBJECT_META, OBJECT_META_NAME};
use super::Kind;

/// Which OpenAPI flavour a document is rendered in.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Flavour {
    V2,
    V3,
}

impl Flavour {
    fn refs(self) -> &'static str {
        match self {
            Flavour::V2 => "#/definitions/",
            Flavour::V3 => "#/components/schemas/",
        }
    }
}

const STATUS_NAME: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
const PATCH_NAME: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";

/// Every group-version served, as its `/openapi/v3` path (`api/v1`, `apis/g/v`).
pub(crate) fn group_versions() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for k in Kind::ALL {
        let p = gv_path(k.group(), k.version());
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The `/openapi/v3` discovery index: each group-version's document URL,
/// with a content hash so clients can cache it (as the real index does).
pub(crate) fn v3_index() -> Value {
    let mut paths = Map::new();
    for gv in group_versions() {
        let hash = content_hash(&v3_document(&gv).unwrap_or(Value::Null));
        paths.insert(
            gv.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={hash}")}),
        );
    }
    json!({"paths": paths})
}

fn content_hash(v: &Value) -> String {
    use sha2::Digest as _;
    hex::encode_upper(sha2::Sha512::digest(v.to_string().as_bytes()))
}

/// The v3 document of one group-version (`api/v1`), or `None` if not served.
pub(crate) fn v3_document(gv: &str) -> Option<Value> {
    let kinds: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| gv_path(k.group(), k.version()) == gv)
        .collect();
    if kinds.is_empty() {
        return None;
    }
    let (paths, schemas) = build(&kinds, Flavour::V3);
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-drivelab"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// The v2 (swagger 2.0) document of every served kind.
pub(crate) fn v2_document() -> Value {
    let (paths, definitions) = build(&Kind::ALL, Flavour::V2);
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-drivelab"},
        "paths": paths,
        "definitions": definitions,
    })
}

fn build(kinds: &[Kind], f: Flavour) -> (Map<String, Value>, Map<String, Value>) {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    schemas.insert(
        OBJECT_META_NAME.into(),
        super::schema::render(&OBJECT_META, f.refs()),
    );
    schemas.insert(STATUS_NAME.into(), json!({"type": "object", "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Status"}]}));
    schemas.insert(PATCH_NAME.into(), json!({"type": "object"}));
    for &k in kinds {
        let def = definition_name(k);
        schemas.insert(def.clone(), kind_schema(k, f.refs()));
        schemas.insert(
            format!("{def}List"),
            json!({
                "type": "object",
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "items": {"type": "array", "items": {"$ref": format!("{}{def}", f.refs())}},
                },
                "x-kubernetes-group-version-kind": [
                    {"group": k.group(), "version": k.version(), "kind": format!("{}List", k.kind_name())}
                ],
            }),
        );
        for (path, ops) in kind_paths(k, f) {
            paths.insert(path, ops);
        }
    }
    (paths, schemas)
}

fn prefix(k: Kind) -> String {
    format!("/{}", gv_path(k.group(), k.version()))
}

fn kind_paths(k: Kind, f: Flavour) -> Vec<(String, Value)> {
    let p = prefix(k);
    let plural = k.plural();
    let (collection, item) = if k.namespaced() {
        (
            format!("{p}/namespaces/{{namespace}}/{plural}"),
            format!("{p}/namespaces/{{namespace}}/{plural}/{{name}}"),
        )
    } else {
        (format!("{p}/{plural}"), format!("{p}/{plural}/{{name}}"))
    };
    let ns = k.namespaced();
    let mut out = vec![
        (
            collection,
            json!({
                "get": op(k, f, "list", ns, false, false),
                "post": op(k, f, "post", ns, false, false),
                "delete": op(k, f, "deletecollection", ns, false, false),
            }),
        ),
        (
            item.clone(),
            json!({
                "get": op(k, f, "get", ns, true, false),
                "put": op(k, f, "put", ns, true, false),
                "patch": op(k, f, "patch", ns, true, false),
                "delete": op(k, f, "delete", ns, true, false),
            }),
        ),
    ];
    if k.has_status_subresource() {
        out.push((
            format!("{item}/status"),
            json!({
                "get": op(k, f, "get", ns, true, true),
                "put": op(k, f, "put", ns, true, true),
                "patch": op(k, f, "patch", ns, true, true),
            }),
        ));
    }
    if ns {
        out.push((
            format!("{p}/{plural}"),
            json!({"get": op(k, f, "list", false, false, false)}),
        ));
    }
    out
}

fn param(f: Flavour, name: &str, place: &str, required: bool) -> Value {
    match f {
        Flavour::V2 => {
            json!({"name": name, "in": place, "required": required, "type": "string", "uniqueItems": true})
        }
        Flavour::V3 => {
            json!({"name": name, "in": place, "required": required, "schema": {"type": "string", "uniqueItems": true}})
        }
    }
}

fn op(k: Kind, f: Flavour, action: &str, ns: bool, named: bool, status: bool) -> Value {
    let def = definition_name(k);
    let target = match action {
        "list" => format!("{def}List"),
        "delete" if !k.returns_deleted_object() => STATUS_NAME.to_string(),
        "deletecollection" => STATUS_NAME.to_string(),
        _ => def.clone(),
    };
    let mut params = Vec::new();
    if named {
        params.push(param(f, "name", "path", true));
    }
    if ns {
        params.push(param(f, "namespace", "path", true));
    }
    let writes = matches!(action, "post" | "put" | "patch");
    if writes || action.starts_with("delete") {
        params.push(param(f, "dryRun", "query", false));
    }
    if writes {
        params.push(param(f, "fieldManager", "query", false));
        params.push(param(f, "fieldValidation", "query", false));
    }
    if action == "patch" {
        params.push(param(f, "force", "query", false));
    }
    if matches!(action, "list" | "deletecollection") {
        for q in [
            "labelSelector",
            "fieldSelector",
            "limit",
            "continue",
            "resourceVersion",
            "timeoutSeconds",
            "watch",
        ] {
            params.push(param(f, q, "query", false));
        }
    }
    let reference = |name: &str| json!({"$ref": format!("{}{name}", f.refs())});
    let body_types: Vec<&str> = match action {
        "patch" => {
            let mut t = vec![
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
            ];
            if !k.is_custom() {
                t.insert(2, "application/strategic-merge-patch+json");
            }
            t
        }
        "post" | "put" => vec!["application/json"],
        _ => vec![],
    };
    let body_schema = if action == "patch" {
        reference(PATCH_NAME)
    } else {
        reference(&def)
    };
    let kind_word = if status {
        format!("{}Status", k.kind_name())
    } else {
        k.kind_name().to_string()
    };
    let mut o = json!({
        "operationId": format!("{action}{}{}", if ns { "Namespaced" } else { "" }, kind_word),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": k.group(), "version": k.version(), "kind": k.kind_name()},
        "parameters": params,
    });
    match f {
        Flavour::V2 => {
            o["consumes"] = json!(if body_types.is_empty() {
                vec!["*/*"]
            } else {
                body_types.clone()
            });
            o["produces"] = json!(["application/json"]);
            o["responses"] = json!({"200": {"description": "OK", "schema": reference(&target)}});
            if !body_types.is_empty() {
                if let Some(a) = o["parameters"].as_array_mut() {
                    a.push(json!({"name": "body", "in": "body", "required": true, "schema": body_schema}));
                }
            }
        }
        Flavour::V3 => {
            o["responses"] = json!({"200": {"description": "OK", "content": {"application/json": {"schema": reference(&target)}}}});
            if !body_types.is_empty() {
                let content: Map<String, Value> = body_types
                    .iter()
                    .map(|t| (t.to_string(), json!({"schema": body_schema.clone()})))
                    .collect();
                o["requestBody"] = json!({"content": content, "required": true});
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v3_index_names_every_group_version() {
        let idx = v3_index();
        let paths = idx["paths"].as_object().unwrap();
        for gv in [
            "api/v1",
            "apis/storage.k8s.io/v1",
            "apis/objectstorage.k8s.io/v1alpha1",
            "apis/coordination.k8s.io/v1",
        ] {
            let url = paths[gv]["serverRelativeURL"].as_str().unwrap();
            assert!(url.starts_with(&format!("/openapi/v3/{gv}?hash=")), "{url}");
        }
        assert!(v3_document("apis/apps/v1").is_none());
    }

    #[test]
    fn patch_ops_declare_field_validation_and_gvk() {
        let doc = v3_document("api/v1").unwrap();
        let patch = &doc["paths"]["/api/v1/namespaces/{namespace}/secrets/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"],
            json!({"group": "", "version": "v1", "kind": "Secret"})
        );
        assert!(patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "fieldValidation" && p["in"] == "query"));
        assert!(
            doc["components"]["schemas"]["io.k8s.api.core.v1.Secret"]["properties"]["data"]
                .is_object()
        );
        let v2 = v2_document();
        assert!(v2["definitions"]["io.k8s.objectstorage.v1alpha1.BucketClaim"].is_object());
        assert!(v2["paths"]["/apis/objectstorage.k8s.io/v1alpha1/namespaces/{namespace}/bucketclaims/{name}/status"].is_object());
    }
}

//! The bare baseline's backend: one axum server answering exactly the calls the
//! cosi-s3 driver makes (RustFS admin JSON, S3 HEAD/PUT/DELETE bucket, and the
//! Kubernetes ConfigMap/Secret get/create/replace/list/delete kube-rs sends),
//! from plain in-memory maps, with no signing checks, gates or history.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{json, Value};

#[derive(Default)]
struct Inner {
    /// access key → attached policy names (comma-joined, as MinIO reports them)
    users: HashMap<String, String>,
    policies: HashMap<String, Value>,
    buckets: std::collections::HashSet<String>,
    /// (plural, namespace, name) → object
    objects: BTreeMap<(String, String, String), Value>,
    rv: u64,
}

/// Shared stub state (cheap to clone).
#[derive(Clone, Default)]
pub struct Stub(Arc<Mutex<Inner>>);

impl Stub {
    /// Serve on 127.0.0.1 (random port) until the runtime ends; returns `http://addr`.
    pub async fn serve(&self) -> anyhow::Result<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(self.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(format!("http://{addr}"))
    }

    /// Put an object straight into the Kubernetes map (the admin Secret).
    pub fn put_object(&self, plural: &str, ns: &str, name: &str, obj: Value) {
        let mut s = self.0.lock().unwrap();
        s.rv += 1;
        let mut obj = obj;
        obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
        s.objects
            .insert((plural.into(), ns.into(), name.into()), obj);
    }
}

fn reply(status: StatusCode, body: Value) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn empty(status: StatusCode) -> Response {
    Response::builder()
        .status(status)
        .body(Body::empty())
        .unwrap()
}

fn admin_error(status: StatusCode, code: &str) -> Response {
    reply(status, json!({"Code": code, "Message": code}))
}

fn s3_error(status: StatusCode, code: &str) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/xml")
        .body(Body::from(format!(
            "<Error><Code>{code}</Code><Message>{code}</Message></Error>"
        )))
        .unwrap()
}

/// A Kubernetes `Status` failure, the body kube-rs parses into `Error::Api`.
fn kube_status(code: u16, reason: &str) -> Response {
    reply(
        StatusCode::from_u16(code).unwrap(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": reason, "reason": reason, "code": code}),
    )
}

fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (pct_decode(k), pct_decode(v))
        })
        .collect()
}

async fn handle(State(stub): State<Stub>, method: Method, uri: Uri, body: Bytes) -> Response {
    let path = uri.path().to_string();
    let q = query(&uri);
    let mut s = stub.0.lock().unwrap();
    if let Some(op) = path.strip_prefix("/rustfs/admin/v3/") {
        return admin(&mut s, &method, op, &q, &body);
    }
    if let Some(rest) = path.strip_prefix("/api/v1/namespaces/") {
        return kube(&mut s, &method, rest, &q, &body);
    }
    let bucket = path.trim_start_matches('/').to_string();
    match method {
        Method::HEAD if s.buckets.contains(&bucket) => empty(StatusCode::OK),
        Method::HEAD => empty(StatusCode::NOT_FOUND),
        Method::PUT if s.buckets.contains(&bucket) => {
            s3_error(StatusCode::CONFLICT, "BucketAlreadyOwnedByYou")
        }
        Method::PUT => {
            s.buckets.insert(bucket);
            empty(StatusCode::OK)
        }
        Method::DELETE => {
            s.buckets.remove(&bucket);
            empty(StatusCode::NO_CONTENT)
        }
        _ => s3_error(StatusCode::NOT_IMPLEMENTED, "NotImplemented"),
    }
}

fn admin(
    s: &mut Inner,
    method: &Method,
    op: &str,
    q: &HashMap<String, String>,
    body: &[u8],
) -> Response {
    let arg = |k: &str| q.get(k).cloned().unwrap_or_default();
    match (method.clone(), op) {
        (Method::PUT, "add-user") => {
            s.users.entry(arg("accessKey")).or_default();
            empty(StatusCode::OK)
        }
        (Method::GET, "user-info") => match s.users.get(&arg("accessKey")) {
            Some(p) => reply(
                StatusCode::OK,
                json!({"policyName": p, "status": "enabled"}),
            ),
            None => admin_error(StatusCode::NOT_FOUND, "XMinioAdminNoSuchUser"),
        },
        (Method::DELETE, "remove-user") => match s.users.remove(&arg("accessKey")) {
            Some(_) => empty(StatusCode::OK),
            None => admin_error(StatusCode::NOT_FOUND, "XMinioAdminNoSuchUser"),
        },
        (Method::PUT, "add-canned-policy") => match serde_json::from_slice(body) {
            Ok(doc) => {
                s.policies.insert(arg("name"), doc);
                empty(StatusCode::OK)
            }
            Err(_) => admin_error(StatusCode::BAD_REQUEST, "XMinioMalformedJSON"),
        },
        (Method::GET, "info-canned-policy") => match s.policies.get(&arg("name")) {
            Some(doc) => reply(StatusCode::OK, doc.clone()),
            None => admin_error(StatusCode::NOT_FOUND, "XMinioAdminNoSuchPolicy"),
        },
        (Method::DELETE, "remove-canned-policy") => match s.policies.remove(&arg("name")) {
            Some(_) => empty(StatusCode::OK),
            None => admin_error(StatusCode::NOT_FOUND, "XMinioAdminNoSuchPolicy"),
        },
        (Method::PUT, "set-user-or-group-policy") => {
            let (p, u) = (arg("policyName"), arg("userOrGroup"));
            if !s.policies.contains_key(&p) {
                return admin_error(StatusCode::NOT_FOUND, "XMinioAdminNoSuchPolicy");
            }
            match s.users.get_mut(&u) {
                Some(attached) => {
                    *attached = p;
                    empty(StatusCode::OK)
                }
                None => admin_error(StatusCode::NOT_FOUND, "XMinioAdminNoSuchUser"),
            }
        }
        _ => admin_error(StatusCode::NOT_IMPLEMENTED, "NotImplemented"),
    }
}

/// `{ns}/{plural}[/{name}]` for configmaps and secrets.
fn kube(
    s: &mut Inner,
    method: &Method,
    rest: &str,
    q: &HashMap<String, String>,
    body: &[u8],
) -> Response {
    let parts: Vec<&str> = rest.split('/').collect();
    let (ns, plural, name) = match parts.as_slice() {
        [ns, plural] => (*ns, *plural, None),
        [ns, plural, name] => (*ns, *plural, Some(*name)),
        _ => return kube_status(404, "NotFound"),
    };
    let kind = match plural {
        "configmaps" => "ConfigMap",
        "secrets" => "Secret",
        _ => return kube_status(404, "NotFound"),
    };
    let key = |n: &str| (plural.to_string(), ns.to_string(), n.to_string());
    match (method.clone(), name) {
        (Method::GET, Some(n)) => match s.objects.get(&key(n)) {
            Some(o) => reply(StatusCode::OK, o.clone()),
            None => kube_status(404, "NotFound"),
        },
        (Method::GET, None) => {
            // Equality label selectors only (`a=b,c=d`): all the driver sends.
            let want: Vec<(String, String)> = q
                .get("labelSelector")
                .map(|sel| {
                    sel.split(',')
                        .filter_map(|t| {
                            t.split_once('=')
                                .map(|(k, v)| (k.to_string(), v.to_string()))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let items: Vec<Value> = s
                .objects
                .iter()
                .filter(|((p, n, _), _)| p == plural && n == ns)
                .filter(|(_, o)| {
                    want.iter()
                        .all(|(k, v)| o["metadata"]["labels"][k].as_str() == Some(v))
                })
                .map(|(_, o)| o.clone())
                .collect();
            reply(
                StatusCode::OK,
                json!({"kind": format!("{kind}List"), "apiVersion": "v1",
                       "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
            )
        }
        (Method::POST, None) => {
            let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
                return kube_status(400, "BadRequest");
            };
            let n = obj["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if s.objects.contains_key(&key(&n)) {
                return kube_status(409, "AlreadyExists");
            }
            s.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            obj["metadata"]["uid"] = json!(format!("uid-{}", s.rv));
            obj["metadata"]["namespace"] = json!(ns);
            obj["kind"] = json!(kind);
            obj["apiVersion"] = json!("v1");
            s.objects.insert(key(&n), obj.clone());
            reply(StatusCode::CREATED, obj)
        }
        (Method::PUT, Some(n)) => {
            let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
                return kube_status(400, "BadRequest");
            };
            let Some(cur) = s.objects.get(&key(n)) else {
                return kube_status(404, "NotFound");
            };
            let cur_rv = cur["metadata"]["resourceVersion"].clone();
            if let Some(rv) = obj["metadata"]["resourceVersion"].as_str() {
                if Some(rv) != cur_rv.as_str() {
                    return kube_status(409, "Conflict");
                }
            }
            s.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            obj["metadata"]["namespace"] = json!(ns);
            obj["kind"] = json!(kind);
            obj["apiVersion"] = json!("v1");
            s.objects.insert(key(n), obj.clone());
            reply(StatusCode::OK, obj)
        }
        (Method::DELETE, Some(n)) => {
            let Some(cur) = s.objects.get(&key(n)) else {
                return kube_status(404, "NotFound");
            };
            let pre: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            if let Some(rv) = pre["preconditions"]["resourceVersion"].as_str() {
                if Some(rv) != cur["metadata"]["resourceVersion"].as_str() {
                    return kube_status(409, "Conflict");
                }
            }
            s.objects.remove(&key(n));
            reply(
                StatusCode::OK,
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200}),
            )
        }
        _ => kube_status(405, "MethodNotAllowed"),
    }
}

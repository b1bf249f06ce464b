//! What the kube fake reads and describes, over HTTP through an unmodified
//! kube-rs client: its OpenAPI documents (`/openapi/v3` names a document per
//! served group-version, whose PATCH operations declare `fieldValidation`,
//! what kubectl checks before it leaves validation to the server),
//! `fieldValidation=Strict|Warn|Ignore` on POST, PUT and PATCH, request
//! bodies in the Kubernetes protobuf wire format, and server-side apply with
//! field managers (typed `Api::patch(Patch::Apply)`).

use drivelab_fakes::clock::SimClock;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::kube::KubeFake;
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::MemStore;
use kube::{Client, Config};
use serde_json::{json, Value};

struct Lab {
    client: Client,
    _fake: KubeFake,
    _listener: Listener,
}

async fn lab() -> Lab {
    let fake = KubeFake::new(
        std::sync::Arc::new(MemStore::default()),
        Gate::new(History::new(SimClock::new())),
        7,
    )
    .expect("fake");
    fake.declare_namespace("drv").expect("namespace");
    let listener = fake.serve(loopback()).await.expect("listen");
    let mut config = Config::new(listener.url().parse().expect("url"));
    config.default_namespace = "drv".into();
    config.auth_info.token = Some(fake.admin_token().into());
    Lab {
        client: Client::try_from(config).expect("client"),
        _fake: fake,
        _listener: listener,
    }
}

/// (status, warning headers, body) of a request.
async fn call(
    lab: &Lab,
    method: &str,
    uri: &str,
    ctype: &str,
    body: Option<Value>,
) -> (u16, Vec<String>, Value) {
    call_raw(
        lab,
        method,
        uri,
        ctype,
        body.map_or_else(Vec::new, |b| b.to_string().into_bytes()),
    )
    .await
}

async fn call_raw(
    lab: &Lab,
    method: &str,
    uri: &str,
    ctype: &str,
    body: Vec<u8>,
) -> (u16, Vec<String>, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", ctype)
        .body(body)
        .unwrap();
    let res = lab
        .client
        .send(req.map(kube::client::Body::from))
        .await
        .unwrap();
    let code = res.status().as_u16();
    let warnings = res
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let bytes = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    (
        code,
        warnings,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn openapi_v3_index_and_documents() {
    let lab = lab().await;
    let (code, _, idx) = call(&lab, "GET", "/openapi/v3", "", None).await;
    assert_eq!(code, 200);
    let url = idx["paths"]["apis/storage.k8s.io/v1"]["serverRelativeURL"]
        .as_str()
        .expect("storage.k8s.io/v1 listed")
        .to_string();
    let (code, _, doc) = call(&lab, "GET", &url, "", None).await;
    assert_eq!(code, 200);
    let patch = &doc["paths"]["/apis/storage.k8s.io/v1/storageclasses/{name}"]["patch"];
    assert_eq!(
        patch["x-kubernetes-group-version-kind"]["kind"],
        "StorageClass"
    );
    assert!(patch["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "fieldValidation"));
    let (code, _, core) = call(&lab, "GET", "/openapi/v3/api/v1", "", None).await;
    assert_eq!(code, 200);
    assert_eq!(
        core["components"]["schemas"]["io.k8s.api.core.v1.ConfigMap"]
            ["x-kubernetes-group-version-kind"][0]["kind"],
        "ConfigMap"
    );
    let (code, _, _) = call(&lab, "GET", "/openapi/v3/apis/apps/v1", "", None).await;
    assert_eq!(code, 404);
    let (code, _, v2) = call(&lab, "GET", "/openapi/v2", "", None).await;
    assert_eq!(code, 200);
    assert_eq!(v2["swagger"], "2.0");
    assert!(v2["definitions"]["io.k8s.objectstorage.v1alpha1.Bucket"].is_object());
}

#[tokio::test]
async fn field_validation_strict_warn_ignore() {
    let lab = lab().await;
    let cms = "/api/v1/namespaces/drv/configmaps";
    let cm = |name: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
               "data": {"a": "b"}, "foo": 1, "metadata2": {"x": 1}})
    };
    // Strict: 400, named fields, nothing stored.
    let (code, _, st) = call(
        &lab,
        "POST",
        &format!("{cms}?fieldValidation=Strict"),
        "application/json",
        Some(cm("s")),
    )
    .await;
    assert_eq!(code, 400, "{st}");
    assert_eq!(st["reason"], "BadRequest");
    assert_eq!(
        st["message"],
        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"foo\", unknown field \"metadata2\""
    );
    let (code, _, _) = call(&lab, "GET", &format!("{cms}/s"), "", None).await;
    assert_eq!(code, 404);
    // Default (Warn): created without the fields, one Warning header each.
    let (code, warnings, obj) = call(&lab, "POST", cms, "application/json", Some(cm("w"))).await;
    assert_eq!(code, 201, "{obj}");
    assert_eq!(
        warnings,
        vec![
            "299 - \"unknown field \\\"foo\\\"\"".to_string(),
            "299 - \"unknown field \\\"metadata2\\\"\"".to_string()
        ]
    );
    assert!(obj.get("foo").is_none());
    // Ignore: dropped, no warning.
    let (code, warnings, _) = call(
        &lab,
        "POST",
        &format!("{cms}?fieldValidation=Ignore"),
        "application/json",
        Some(cm("i")),
    )
    .await;
    assert_eq!((code, warnings.len()), (201, 0));
    // A value the server does not know is 422 on the options.
    let (code, _, st) = call(
        &lab,
        "POST",
        &format!("{cms}?fieldValidation=Loose"),
        "application/json",
        Some(cm("x")),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(
        st["message"],
        "CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"Loose\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
    );
    // PATCH: the patched object is checked; the message has no kind prefix.
    let (code, _, st) = call(
        &lab,
        "PATCH",
        &format!("{cms}/w?fieldValidation=Strict"),
        "application/merge-patch+json",
        Some(json!({"metadata": {"colour": "red"}})),
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(
        st["message"],
        "strict decoding error: unknown field \"metadata.colour\""
    );
    // PUT with Strict, nested in a custom resource.
    let claims = "/apis/objectstorage.k8s.io/v1alpha1/namespaces/drv/bucketclaims";
    let claim = json!({"apiVersion": "objectstorage.k8s.io/v1alpha1", "kind": "BucketClaim",
        "metadata": {"name": "c"}, "spec": {"bucketClassName": "std", "protocols": ["S3"]}});
    let (code, _, created) = call(&lab, "POST", claims, "application/json", Some(claim)).await;
    assert_eq!(code, 201);
    let mut put = created.clone();
    put["spec"]["colour"] = json!("red");
    let (code, _, st) = call(
        &lab,
        "PUT",
        &format!("{claims}/c?fieldValidation=Strict"),
        "application/json",
        Some(put),
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(
        st["message"],
        "BucketClaim in version \"v1alpha1\" cannot be handled as a BucketClaim: strict decoding error: unknown field \"spec.colour\""
    );
    // Server-side apply types its configuration whatever fieldValidation says.
    let (code, _, st) = call(
        &lab,
        "PATCH",
        &format!("{cms}/w?fieldManager=me&fieldValidation=Ignore"),
        "application/apply-patch+yaml",
        Some(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w"}, "sops": {}}),
        ),
    )
    .await;
    assert_eq!(code, 500, "{st}");
    assert!(st.get("reason").is_none(), "{st}");
    assert_eq!(
        st["message"],
        "failed to create typed patch object (drv/w; /v1, Kind=ConfigMap): .sops: field not declared in schema"
    );
}

/// Protobuf-encodes a length-delimited field `tag` holding `bytes`.
fn field(tag: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![(tag << 3) | 2];
    let mut n = bytes.len();
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            break;
        }
        out.push(b | 0x80);
    }
    out.extend_from_slice(bytes);
    out
}

/// `k8s\0` + runtime.Unknown{typeMeta{apiVersion, kind}, raw}, as client-go writes it.
fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let type_meta = [field(1, api_version.as_bytes()), field(2, kind.as_bytes())].concat();
    let mut out = b"k8s\0".to_vec();
    out.extend(field(1, &type_meta));
    out.extend(field(2, raw));
    out
}

#[tokio::test]
async fn protobuf_bodies_of_the_core_kinds_kubectl_sends() {
    let lab = lab().await;
    const PB: &str = "application/vnd.kubernetes.protobuf";
    // Secret{metadata{name: "pb"}, data{"k": "v"}, type: "Opaque"}
    let secret = [
        field(1, &field(1, b"pb")),
        field(2, &[field(1, b"k"), field(2, b"v")].concat()),
        field(3, b"Opaque"),
    ]
    .concat();
    let (code, _, obj) = call_raw(
        &lab,
        "POST",
        "/api/v1/namespaces/drv/secrets",
        PB,
        envelope("v1", "Secret", &secret),
    )
    .await;
    assert_eq!(code, 201, "{obj}");
    assert_eq!(obj["metadata"]["name"], "pb");
    assert_eq!(obj["data"]["k"], "dg==");
    assert_eq!(obj["type"], "Opaque");
    // ConfigMap{metadata{name: "pbc"}, data{"a": "b"}}
    let cm = [
        field(1, &field(1, b"pbc")),
        field(2, &[field(1, b"a"), field(2, b"b")].concat()),
    ]
    .concat();
    let (code, _, obj) = call_raw(
        &lab,
        "POST",
        "/api/v1/namespaces/drv/configmaps",
        PB,
        envelope("v1", "ConfigMap", &cm),
    )
    .await;
    assert_eq!((code, obj["data"]["a"].as_str()), (201, Some("b")), "{obj}");
    // Garbage under the protobuf type: 400, not a wrong object.
    let (code, _, st) = call_raw(
        &lab,
        "POST",
        "/api/v1/namespaces/drv/secrets",
        PB,
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(code, 400, "{st}");
    // A kind whose protobuf form the fake does not decode: 415 naming what is.
    let (code, _, st) = call_raw(
        &lab,
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/drv/leases",
        PB,
        envelope("coordination.k8s.io/v1", "Lease", &[]),
    )
    .await;
    assert_eq!(code, 415, "{st}");
    assert_eq!(st["reason"], "UnsupportedMediaType");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("this fake decodes protobuf bodies of Secret, ConfigMap, Namespace only"),
        "{st}"
    );
}

#[tokio::test]
async fn server_side_apply_owns_fields_per_manager() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let lab = lab().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(lab.client.clone());
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}}))
            .unwrap();
    let pp = PostParams {
        field_manager: Some("creator".into()),
        ..Default::default()
    };
    let created = cms.create(&pp, &cm).await.unwrap();
    let mf = serde_json::to_value(created.metadata.managed_fields.unwrap()).unwrap();
    assert_eq!(mf[0]["manager"], "creator");
    assert_eq!(mf[0]["operation"], "Update");
    assert_eq!(
        mf[0]["fieldsV1"],
        json!({"f:data": {".": {}, "f:a": {}, "f:b": {}}})
    );

    let apply = |data: Value| {
        Patch::Apply(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data}),
        )
    };
    let ssa = PatchParams::apply("ssa");
    // Another manager owns .data.a with another value: 409 naming both.
    let err = cms
        .patch("c", &ssa, &apply(json!({"a": "9"})))
        .await
        .unwrap_err();
    let kube::Error::Api(st) = err else {
        panic!("{err:?}")
    };
    assert_eq!((st.code, st.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        st.message,
        "Apply failed with 1 conflict: conflict with \"creator\" using v1: .data.a"
    );
    // The same value is shared, not a conflict.
    cms.patch("c", &PatchParams::apply("other"), &apply(json!({"b": "2"})))
        .await
        .unwrap();
    // force takes the field over.
    let forced = cms
        .patch(
            "c",
            &ssa.clone().force(),
            &apply(json!({"a": "9", "c": "3"})),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.as_ref().unwrap()["a"], "9");
    let managers: Vec<(String, String)> = forced
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .map(|e| (e.manager.unwrap(), e.operation.unwrap()))
        .collect();
    assert_eq!(
        managers,
        vec![
            ("other".to_string(), "Apply".to_string()),
            ("ssa".to_string(), "Apply".to_string()),
            ("creator".to_string(), "Update".to_string())
        ]
    );
    // Fields ssa stops applying go when it was their only owner; b stays (others own it).
    let after = cms
        .patch("c", &ssa, &apply(json!({"b": "2"})))
        .await
        .unwrap();
    assert_eq!(
        after.data.unwrap(),
        [("b".to_string(), "2".to_string())].into_iter().collect()
    );
    // A plain update takes ownership from the appliers.
    let mut upd = cms.get("c").await.unwrap();
    upd.data = Some([("b".to_string(), "5".to_string())].into_iter().collect());
    let replaced = cms
        .replace(
            "c",
            &PostParams {
                field_manager: Some("editor".into()),
                ..Default::default()
            },
            &upd,
        )
        .await
        .unwrap();
    let mf = serde_json::to_value(replaced.metadata.managed_fields.unwrap()).unwrap();
    assert!(
        mf.as_array()
            .unwrap()
            .iter()
            .any(|e| e["manager"] == "editor" && e["fieldsV1"] == json!({"f:data": {"f:b": {}}})),
        "{mf}"
    );
    assert!(
        !mf.as_array().unwrap().iter().any(|e| e["manager"] == "ssa"),
        "ssa owned only b: {mf}"
    );
    // What is not modelled is refused, not merged wrongly.
    let (code, _, st) = call(
        &lab,
        "PATCH",
        "/api/v1/namespaces/drv/pods/p?fieldManager=ssa",
        "application/apply-patch+yaml",
        Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "x", "image": "i"}]}})),
    )
    .await;
    assert_eq!(code, 501, "{st}");
    let (code, _, st) = call(
        &lab,
        "PATCH",
        "/api/v1/namespaces/drv/configmaps/c?fieldManager=ssa",
        "application/apply-patch+yaml",
        Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "managedFields": [{}]}})),
    )
    .await;
    assert_eq!(
        (code, st["message"].as_str()),
        (400, Some("metadata.managedFields must be nil"))
    );
}

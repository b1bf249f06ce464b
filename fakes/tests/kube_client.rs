//! Acceptance test for the kube fake: an unmodified kube-rs client (typed
//! ConfigMap/Secret/Lease, DynamicObject for the COSI kinds) talks plain HTTP to
//! it, including the stale-resourceVersion Conflict a driver's checkpoint relies on.

use std::collections::BTreeMap;

use drivelab_fakes::clock::SimClock;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::{calls, History, Outcome};
use drivelab_fakes::kube::{Kind, KubeFake};
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::MemStore;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::ByteString;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch,
    PatchParams, PostParams,
};
use kube::{Client, Config};
use serde_json::json;

struct Lab {
    fake: KubeFake,
    history: History,
    client: Client,
    _listener: Listener,
}

async fn lab() -> Lab {
    let history = History::new(SimClock::new());
    let fake = KubeFake::new(
        std::sync::Arc::new(MemStore::default()),
        Gate::new(history.clone()),
        42,
    )
    .expect("fake");
    // The client's namespace exists, as on a real cluster (recorded, not written).
    fake.declare_namespace("drv").expect("namespace drv");
    let listener = fake.serve(loopback()).await.expect("listen");
    let mut config = Config::new(listener.url().parse().expect("url"));
    config.default_namespace = "drv".into();
    config.auth_info.token = Some(fake.admin_token().into());
    let client = Client::try_from(config).expect("client");
    Lab {
        fake,
        history,
        client,
        _listener: listener,
    }
}

fn api_error(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn checkpoint(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([("app".to_string(), "cosi-s3".to_string())])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("state".to_string(), value.to_string())])),
        ..Default::default()
    }
}

#[tokio::test]
async fn configmap_checkpoint_round_trip_with_cas() {
    let lab = lab().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(lab.client.clone());
    let pp = PostParams::default();

    let created = cms
        .create(&pp, &checkpoint("ckpt", "v1"))
        .await
        .expect("create");
    let rv1 = created.metadata.resource_version.clone().expect("rv");
    assert_eq!(created.metadata.namespace.as_deref(), Some("drv"));
    assert!(created.metadata.uid.is_some());
    assert_eq!(
        api_error(
            cms.create(&pp, &checkpoint("ckpt", "again"))
                .await
                .unwrap_err()
        ),
        (409, "AlreadyExists".into())
    );

    let got = cms.get("ckpt").await.expect("get");
    assert_eq!(
        got.data
            .as_ref()
            .and_then(|d| d.get("state"))
            .map(String::as_str),
        Some("v1")
    );
    assert_eq!(
        api_error(cms.get("nope").await.unwrap_err()),
        (404, "NotFound".into())
    );
    assert!(cms.get_opt("nope").await.expect("get_opt").is_none());

    cms.create(
        &pp,
        &ConfigMap {
            metadata: ObjectMeta {
                name: Some("other".into()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await
    .expect("create other");
    let listed = cms
        .list(&ListParams::default().labels("app=cosi-s3"))
        .await
        .expect("list");
    assert_eq!(listed.items.len(), 1);
    assert!(listed.metadata.resource_version.is_some());
    assert_eq!(
        cms.list(&ListParams::default())
            .await
            .expect("list all")
            .items
            .len(),
        2
    );
    assert_eq!(
        cms.list(&ListParams::default().labels("app!=cosi-s3"))
            .await
            .expect("list neg")
            .items
            .len(),
        1
    );

    // Replace with the current resourceVersion succeeds and bumps it.
    let mut next = got.clone();
    next.data = Some(BTreeMap::from([("state".to_string(), "v2".to_string())]));
    let replaced = cms.replace("ckpt", &pp, &next).await.expect("replace");
    assert_ne!(
        replaced.metadata.resource_version.as_deref(),
        Some(rv1.as_str())
    );

    // The same write again carries a stale resourceVersion: Conflict.
    let mut stale = got.clone();
    stale.data = Some(BTreeMap::from([(
        "state".to_string(),
        "lost-update".to_string(),
    )]));
    let err = cms.replace("ckpt", &pp, &stale).await.unwrap_err();
    assert_eq!(api_error(err), (409, "Conflict".into()));
    assert_eq!(
        cms.get("ckpt").await.expect("get").data.unwrap()["state"],
        "v2"
    );

    // Patches: merge, strategic, apply, and a merge patch used as CAS.
    let patched = cms
        .patch(
            "ckpt",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"extra": "1"}})),
        )
        .await
        .expect("merge patch");
    assert_eq!(patched.data.as_ref().unwrap()["extra"], "1");
    let patched = cms
        .patch(
            "ckpt",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"tier": "a"}}})),
        )
        .await
        .expect("strategic patch");
    assert_eq!(patched.metadata.labels.as_ref().unwrap()["tier"], "a");
    // Strategic merge adds to finalizers (patchStrategy=merge), where a JSON
    // merge patch would replace them; an unmodelled list is 501, not replaced.
    for f in ["one", "two"] {
        cms.patch(
            "ckpt",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"finalizers": [f]}})),
        )
        .await
        .expect("strategic patch of finalizers");
    }
    let patched = cms
        .patch(
            "ckpt",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["one"]}}),
            ),
        )
        .await
        .expect("strategic delete from finalizers");
    assert_eq!(patched.metadata.finalizers, Some(vec!["two".to_string()]));
    cms.patch(
        "ckpt",
        &PatchParams::default(),
        &Patch::Strategic(json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["two"]}})),
    )
    .await
    .expect("strategic delete of the last finalizer");
    let err = cms
        .patch(
            "ckpt",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"unmodelled": ["x"]}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (501, "NotImplemented".into()));
    let err = cms
        .patch(
            "ckpt",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": rv1}, "data": {"x": "y"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (409, "Conflict".into()));
    let applied = cms
        .patch(
            "applied",
            &PatchParams::apply("drivelab-test"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"a": "b"}})),
        )
        .await
        .expect("apply creates");
    assert_eq!(applied.data.unwrap()["a"], "b");
    let err = cms
        .patch("nope", &PatchParams::default(), &Patch::Merge(json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (404, "NotFound".into()));

    // Delete with a stale precondition is refused; a plain delete answers with a Status.
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version: Some(rv1.clone()),
            uid: None,
        }),
        ..Default::default()
    };
    assert_eq!(
        api_error(cms.delete("ckpt", &dp).await.unwrap_err()),
        (409, "Conflict".into())
    );
    let deleted = cms
        .delete("ckpt", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(deleted.is_right(), "core kinds answer delete with a Status");
    assert_eq!(
        api_error(
            cms.delete("ckpt", &DeleteParams::default())
                .await
                .unwrap_err()
        ),
        (404, "NotFound".into())
    );

    // The gate saw every call with op names and subjects, never a payload.
    let ops: Vec<(String, String, Option<Outcome>)> = calls(&lab.history.events())
        .into_iter()
        .map(|c| (c.op, c.subject, c.outcome))
        .collect();
    assert!(ops.contains(&(
        "replace_configmap".into(),
        "drv/ckpt".into(),
        Some(Outcome::Http {
            status: 409,
            code: Some("Conflict".into())
        })
    )));
    assert!(ops
        .iter()
        .any(|(op, subject, _)| op == "list_configmaps" && subject == "drv"));
    assert!(ops
        .iter()
        .any(|(op, subject, _)| op == "create_configmap" && subject == "drv"));
}

#[tokio::test]
async fn secrets_lease_and_all_namespace_list() {
    let lab = lab().await;
    let secrets: Api<Secret> = Api::namespaced(lab.client.clone(), "drv");
    let pp = PostParams::default();
    let s = Secret {
        metadata: ObjectMeta {
            name: Some("creds".into()),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([(
            "accessKey".to_string(),
            "AKIA".to_string(),
        )])),
        data: Some(BTreeMap::from([(
            "raw".to_string(),
            ByteString(vec![0, 159, 255]),
        )])),
        ..Default::default()
    };
    let created = secrets.create(&pp, &s).await.expect("create secret");
    let data = created.data.expect("data");
    assert_eq!(data["accessKey"].0, b"AKIA");
    assert_eq!(data["raw"].0, vec![0, 159, 255]);
    assert!(created.string_data.is_none());
    assert_eq!(created.type_.as_deref(), Some("Opaque"));

    lab.fake.declare_namespace("elsewhere").expect("namespace");
    let other: Api<Secret> = Api::namespaced(lab.client.clone(), "elsewhere");
    other
        .create(
            &pp,
            &Secret {
                metadata: ObjectMeta {
                    name: Some("creds".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("same name, other namespace");
    let all: Api<Secret> = Api::all(lab.client.clone());
    let names: Vec<_> = all
        .list(&ListParams::default())
        .await
        .expect("list all")
        .items
        .into_iter()
        .map(|s| {
            format!(
                "{}/{}",
                s.metadata.namespace.unwrap_or_default(),
                s.metadata.name.unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(names, ["drv/creds", "elsewhere/creds"]);

    let bad = Secret {
        metadata: ObjectMeta {
            name: Some("Not_A_Name".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        api_error(secrets.create(&pp, &bad).await.unwrap_err()),
        (422, "Invalid".into())
    );

    let leases: Api<Lease> = Api::namespaced(lab.client.clone(), "drv");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("leader".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("a".into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }),
    };
    let l = leases.create(&pp, &lease).await.expect("create lease");
    assert_eq!(l.metadata.generation, Some(1));
    let mut taken = l.clone();
    taken.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases
        .replace("leader", &pp, &taken)
        .await
        .expect("take over");
    // A second contender still holding the old version loses.
    assert_eq!(
        api_error(leases.replace("leader", &pp, &taken).await.unwrap_err()),
        (409, "Conflict".into())
    );
}

#[tokio::test]
async fn cosi_bucket_claim_via_dynamic_object() {
    let lab = lab().await;
    let gvk = GroupVersionKind::gvk("objectstorage.k8s.io", "v1alpha1", "BucketClaim");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "bucketclaims");
    let claims: Api<DynamicObject> = Api::namespaced_with(lab.client.clone(), "drv", &ar);

    let claim = DynamicObject::new("photos", &ar).data(json!({
        "spec": {"bucketClassName": "standard", "protocols": ["S3"]},
    }));
    let created = claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(
        created.types.as_ref().map(|t| t.kind.as_str()),
        Some("BucketClaim")
    );

    // Status goes through the status subresource; the main resource ignores it.
    let st = claims
        .patch_status(
            "photos",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"bucketReady": true, "bucketName": "bc-1"}})),
        )
        .await
        .expect("patch status");
    assert_eq!(st.data["status"]["bucketReady"], true);
    assert_eq!(
        st.metadata.generation,
        Some(1),
        "status changes do not bump generation"
    );
    let main = claims
        .patch("photos", &PatchParams::default(), &Patch::Merge(json!({"status": {"bucketReady": false}, "metadata": {"finalizers": ["cosi.objectstorage.k8s.io/bucketclaim-protection"]}})))
        .await
        .expect("patch main");
    assert_eq!(main.data["status"]["bucketReady"], true);

    let got = claims.get("photos").await.expect("get claim");
    assert_eq!(got.data["spec"]["bucketClassName"], "standard");
    assert_eq!(
        claims
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    let err = claims
        .patch(
            "photos",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {}})),
        )
        .await
        .unwrap_err();
    assert_eq!(
        api_error(err).0,
        415,
        "custom resources refuse strategic merge"
    );

    // Finalizers keep the claim until the sidecar removes them.
    let marked = claims
        .delete("photos", &DeleteParams::default())
        .await
        .expect("delete");
    let marked = marked
        .left()
        .expect("custom resources answer delete with the object");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert!(lab
        .fake
        .get(Kind::BucketClaim, Some("drv"), "photos")
        .expect("in-process get")
        .is_some());
    claims
        .patch(
            "photos",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("drop finalizer");
    assert!(claims.get_opt("photos").await.expect("get_opt").is_none());

    // Cluster-scoped kinds, and the in-process API seeing HTTP writes.
    let bucket_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("objectstorage.k8s.io", "v1alpha1", "Bucket"),
        "buckets",
    );
    let buckets: Api<DynamicObject> = Api::all_with(lab.client.clone(), &bucket_ar);
    buckets
        .create(
            &PostParams::default(),
            &DynamicObject::new("bc-1", &bucket_ar)
                .data(json!({"spec": {"driverName": "cosi-s3"}})),
        )
        .await
        .expect("create bucket");
    let listed = lab.fake.list(Kind::Bucket, None).expect("in-process list");
    assert_eq!(listed.len(), 1);
    assert!(listed[0]["metadata"].get("namespace").is_none());
}

#[tokio::test]
async fn discovery_and_watch() {
    let lab = lab().await;
    let discovery = kube::Discovery::new(lab.client.clone())
        .run()
        .await
        .expect("discovery");
    let groups: Vec<String> = discovery.groups().map(|g| g.name().to_string()).collect();
    assert!(
        groups.contains(&"objectstorage.k8s.io".to_string()),
        "{groups:?}"
    );
    assert!(
        groups.contains(&"coordination.k8s.io".to_string()),
        "{groups:?}"
    );
    let (ar, caps) = discovery
        .groups()
        .find(|g| g.name() == "objectstorage.k8s.io")
        .and_then(|g| {
            g.recommended_resources()
                .into_iter()
                .find(|(ar, _)| ar.kind == "BucketAccess")
        })
        .expect("BucketAccess discovered");
    assert_eq!(ar.plural, "bucketaccesses");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);

    let version = lab.client.apiserver_version().await.expect("version");
    assert_eq!(version.major, "1");

    let cms: Api<ConfigMap> = Api::default_namespaced(lab.client.clone());
    assert!(cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .is_empty());
}

/// The next event of a watch (bounded: a missing event fails, never hangs).
async fn next_event<S>(s: &mut S) -> kube::api::WatchEvent<ConfigMap>
where
    S: futures_util::Stream<Item = Result<kube::api::WatchEvent<ConfigMap>, kube::Error>> + Unpin,
{
    use futures_util::TryStreamExt;
    match tokio::time::timeout(std::time::Duration::from_secs(20), s.try_next()).await {
        Ok(Ok(Some(e))) => e,
        other => panic!("no watch event: {other:?}"),
    }
}

/// Issue 19 item 3: watches as kube-rs uses them — the raw event stream
/// (initial ADDED, MODIFIED, DELETED, a selector's view, resuming from a
/// resourceVersion, 410 for one no longer kept) and the runtime's watcher
/// keeping a reflector store in step with the server.
#[tokio::test]
async fn watch_streams_changes_and_a_reflector_follows() {
    use futures_util::{StreamExt, TryStreamExt};
    use kube::api::{WatchEvent, WatchParams};
    let lab = lab().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(lab.client.clone());
    let mut unlabelled = checkpoint("unlabelled", "0");
    unlabelled.metadata.labels = None;
    let old_rv = cms
        .create(&PostParams::default(), &unlabelled)
        .await
        .expect("create")
        .metadata
        .resource_version
        .unwrap();
    cms.create(&PostParams::default(), &checkpoint("before", "0"))
        .await
        .expect("create");
    let params = WatchParams::default().timeout(20).labels("app=cosi-s3");
    let mut events = cms.watch(&params, "0").await.expect("watch").boxed();
    let name = |o: &ConfigMap| o.metadata.name.clone().unwrap_or_default();
    match next_event(&mut events).await {
        WatchEvent::Added(o) => assert_eq!(name(&o), "before"),
        e => panic!("expected the existing object as ADDED, got {e:?}"),
    }
    cms.create(&PostParams::default(), &checkpoint("ckpt", "1"))
        .await
        .expect("create");
    let added_rv = match next_event(&mut events).await {
        WatchEvent::Added(o) => {
            assert_eq!(name(&o), "ckpt");
            o.metadata.resource_version.unwrap()
        }
        e => panic!("expected ADDED, got {e:?}"),
    };
    cms.patch(
        "ckpt",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"state": "2"}})),
    )
    .await
    .expect("patch");
    match next_event(&mut events).await {
        WatchEvent::Modified(o) => assert_eq!(o.data.unwrap()["state"], "2"),
        e => panic!("expected MODIFIED, got {e:?}"),
    }
    // Dropping the label leaves the selection: a DELETED for this watch.
    cms.patch(
        "ckpt",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": null}}})),
    )
    .await
    .expect("patch");
    assert!(matches!(next_event(&mut events).await, WatchEvent::Deleted(o) if name(&o) == "ckpt"));
    cms.delete("before", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        matches!(next_event(&mut events).await, WatchEvent::Deleted(o) if name(&o) == "before")
    );

    // Resuming from a resourceVersion replays what came after it.
    let mut resumed = cms
        .watch(&WatchParams::default().timeout(20), &added_rv)
        .await
        .expect("watch")
        .boxed();
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), resumed.try_next())
        .await
        .expect("an event")
        .expect("parses");
    assert!(matches!(first, Some(WatchEvent::Modified(o)) if name(&o) == "ckpt"));
    // A resourceVersion older than what the server keeps (the window has
    // moved past it): 410, list again.
    for i in 0..drivelab_fakes::kube::WATCH_WINDOW {
        lab.fake
            .create(
                Kind::ConfigMap,
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": format!("churn-{i}"), "namespace": "other"}}),
            )
            .expect("churn");
    }
    let mut stale = cms
        .watch(&WatchParams::default().timeout(20), &old_rv)
        .await
        .expect("watch")
        .boxed();
    match tokio::time::timeout(std::time::Duration::from_secs(20), stale.try_next()).await {
        Ok(Ok(Some(WatchEvent::Error(e)))) => assert_eq!(e.code, 410),
        other => panic!("expected an ERROR 410 event, got {other:?}"),
    }

    // The runtime's watcher feeding a reflector sees the server's state.
    let (reader, writer) = kube::runtime::reflector::store::<ConfigMap>();
    let stream = kube::runtime::reflector(
        writer,
        kube::runtime::watcher(cms.clone(), kube::runtime::watcher::Config::default()),
    );
    let follow = tokio::spawn(stream.for_each(|_| async {}));
    cms.create(&PostParams::default(), &checkpoint("third", "3"))
        .await
        .expect("create");
    let mut names = Vec::new();
    for _ in 0..2000 {
        names = reader.state().iter().map(|o| name(o)).collect::<Vec<_>>();
        names.sort();
        if names == ["ckpt", "third", "unlabelled"] {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    follow.abort();
    assert_eq!(names, ["ckpt", "third", "unlabelled"]);
}

#[tokio::test]
async fn json_patch_and_bad_bodies_over_http() {
    let lab = lab().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(lab.client.clone());
    cms.create(&PostParams::default(), &checkpoint("ckpt", "v1"))
        .await
        .expect("create");

    let send = |method: &str, uri: &str, ctype: &str, body: Vec<u8>| {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", ctype)
            .body(body)
            .expect("request")
    };
    let path = "/api/v1/namespaces/drv/configmaps/ckpt";
    let ok = lab
        .client
        .request_text(send(
            "PATCH",
            path,
            "application/json-patch+json",
            br#"[{"op":"test","path":"/data/state","value":"v1"},{"op":"replace","path":"/data/state","value":"v2"}]"#.to_vec(),
        ))
        .await
        .expect("json patch");
    assert!(ok.contains("\"v2\""));
    let failed_test = lab
        .client
        .request_text(send(
            "PATCH",
            path,
            "application/json-patch+json",
            br#"[{"op":"test","path":"/data/state","value":"v1"}]"#.to_vec(),
        ))
        .await
        .unwrap_err();
    assert_eq!(api_error(failed_test), (422, "Invalid".into()));

    let cases: Vec<(&str, &str, &str, Vec<u8>, u16)> = vec![
        (
            "POST",
            "/api/v1/namespaces/drv/configmaps",
            "application/json",
            vec![0xff, 0xfe],
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/drv/configmaps",
            "application/json",
            b"{not json".to_vec(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/drv/configmaps",
            "application/json",
            br#"{"metadata":{"name":"x","namespace":"other"}}"#.to_vec(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/drv/configmaps",
            "application/json",
            vec![b' '; 3 * 1024 * 1024 + 1],
            413,
        ),
        (
            "PUT",
            path,
            "application/json",
            br#"{"metadata":{"name":"different"}}"#.to_vec(),
            400,
        ),
        ("PATCH", path, "text/plain", b"{}".to_vec(), 415),
        ("POST", path, "application/json", b"{}".to_vec(), 405),
        (
            "GET",
            "/api/v1/namespaces/drv/services",
            "application/json",
            Vec::new(),
            404,
        ),
    ];
    for (method, uri, ctype, body, want) in cases {
        let err = lab
            .client
            .request_text(send(method, uri, ctype, body))
            .await
            .unwrap_err();
        assert_eq!(api_error(err).0, want, "{method} {uri} {ctype}");
    }
}

/// A fault injected at the gate reaches kube-rs as a real-shaped Status.
struct RejectCreates;

impl drivelab_fakes::gate::GateHook for RejectCreates {
    fn before<'a>(
        &'a self,
        _id: drivelab_fakes::history::CallId,
        call: &'a drivelab_fakes::gate::CallSpec,
    ) -> futures_util::future::BoxFuture<'a, drivelab_fakes::gate::Verdict> {
        use drivelab_fakes::gate::{Rejection, Verdict};
        let verdict = if call.op == "create_secret" {
            Verdict::Reject(Rejection {
                http_status: 500,
                code: "InternalError".into(),
                message: "injected".into(),
            })
        } else {
            Verdict::Proceed
        };
        Box::pin(async move { verdict })
    }

    fn after<'a>(
        &'a self,
        _id: drivelab_fakes::history::CallId,
        _call: &'a drivelab_fakes::gate::CallSpec,
        _outcome: &'a Outcome,
    ) -> futures_util::future::BoxFuture<'a, drivelab_fakes::gate::Delivery> {
        Box::pin(async { drivelab_fakes::gate::Delivery::Deliver })
    }
}

#[tokio::test]
async fn gate_rejection_is_a_status() {
    let lab = lab().await;
    lab.fake.gate().set_hook(std::sync::Arc::new(RejectCreates));
    let secrets: Api<Secret> = Api::default_namespaced(lab.client.clone());
    let s = Secret {
        metadata: ObjectMeta {
            name: Some("s".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let err = secrets
        .create(&PostParams::default(), &s)
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (500, "InternalError".into()));
    assert!(
        lab.fake
            .get(Kind::Secret, Some("drv"), "s")
            .expect("get")
            .is_none(),
        "rejected before the fake ran"
    );
    let last = calls(&lab.history.events()).pop().expect("a call");
    assert_eq!(
        last.outcome,
        Some(Outcome::Http {
            status: 500,
            code: Some("InternalError".into())
        })
    );
}

#[tokio::test]
async fn storage_kinds_through_typed_clients() {
    use k8s_openapi::api::core::v1::{
        PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod,
        VolumeResourceRequirements,
    };
    use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    let lab = lab().await;
    let pp = PostParams::default();

    let classes: Api<StorageClass> = Api::all(lab.client.clone());
    let sc: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "fast"}, "provisioner": "bosh.csi.drivelab",
        "parameters": {"tier": "gold"}
    }))
    .unwrap();
    let created = classes.create(&pp, &sc).await.expect("create storageclass");
    // Server-side defaults, as the real API server fills them.
    assert_eq!(created.reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(created.volume_binding_mode.as_deref(), Some("Immediate"));
    let err = classes
        .patch(
            "fast",
            &PatchParams::default(),
            &Patch::Merge(json!({"parameters": {"tier": "silver"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (422, "Invalid".into()));

    lab.fake.declare_namespace("app").expect("namespace");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(lab.client.clone(), "app");
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some("fast".into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity("1Gi".into()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = pvcs.create(&pp, &claim).await.expect("create pvc");
    assert_eq!(
        created.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    assert_eq!(
        created.spec.as_ref().and_then(|s| s.volume_mode.as_deref()),
        Some("Filesystem")
    );
    let mut bad = claim.clone();
    bad.metadata.name = Some("bad".into());
    bad.spec.as_mut().unwrap().access_modes = None;
    assert_eq!(
        api_error(pvcs.create(&pp, &bad).await.unwrap_err()),
        (422, "Invalid".into())
    );
    // The status subresource: a main-resource write cannot set status, /status can.
    let st = pvcs
        .patch_status(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Bound"}})),
        )
        .await
        .expect("patch pvc status");
    assert_eq!(st.status.unwrap().phase.as_deref(), Some("Bound"));
    let all: Api<PersistentVolumeClaim> = Api::all(lab.client.clone());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );

    let pvs: Api<PersistentVolume> = Api::all(lab.client.clone());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv-1"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "csi": {"driver": "bosh.csi.drivelab", "volumeHandle": "disk-1"}}
    }))
    .unwrap();
    let created = pvs.create(&pp, &pv).await.expect("create pv");
    assert_eq!(
        created
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref()),
        Some("Retain")
    );
    let err = pvs
        .patch(
            "pv-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"csi": {"volumeHandle": "disk-2"}}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (422, "Invalid".into()));
    assert!(
        pvs.delete("pv-1", &DeleteParams::default())
            .await
            .expect("delete pv")
            .is_left(),
        "PVs answer delete with the object, as the real registry does"
    );

    let nodes: Api<CSINode> = Api::all(lab.client.clone());
    let node: CSINode = serde_json::from_value(json!({
        "metadata": {"name": "node-a"},
        "spec": {"drivers": [{"name": "bosh.csi.drivelab", "nodeID": "instance-1"}]}
    }))
    .unwrap();
    nodes.create(&pp, &node).await.expect("create csinode");
    assert_eq!(
        nodes.get("node-a").await.unwrap().spec.drivers[0].node_id,
        "instance-1"
    );

    let vas: Api<VolumeAttachment> = Api::all(lab.client.clone());
    let va: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": "va-1"},
        "spec": {"attacher": "bosh.csi.drivelab", "nodeName": "node-a",
                 "source": {"persistentVolumeName": "pv-1"}}
    }))
    .unwrap();
    vas.create(&pp, &va).await.expect("create volumeattachment");
    let st = vas
        .patch_status(
            "va-1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"attached": true, "attachmentMetadata": {"disk_cid": "disk-1"}}}),
            ),
        )
        .await
        .expect("patch va status");
    assert!(st.status.unwrap().attached);
    let err = vas
        .patch(
            "va-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "node-b"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (422, "Invalid".into()));

    // A pod on a node is deleted gracefully; grace 0 removes it.
    let pods: Api<Pod> = Api::namespaced(lab.client.clone(), "app");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "busybox"}],
                 "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}
    }))
    .unwrap();
    pods.create(&pp, &pod).await.expect("create pod");
    let on_node = pods
        .list(&ListParams::default().fields("spec.nodeName=node-a"))
        .await
        .unwrap();
    assert_eq!(on_node.items.len(), 1);
    let marked = pods
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete pod")
        .left()
        .expect("a graceful delete answers with the pod");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));
    assert!(pods.get_opt("web").await.unwrap().is_some());
    pods.delete("web", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete now");
    assert!(pods.get_opt("web").await.unwrap().is_none());
}

/// NamespaceLifecycle over HTTP: a create into a missing namespace is 404
/// `namespaces "X" not found` (naming the namespace), works once the Namespace
/// exists, and is 403 while it terminates; the built-ins are listed from the start.
#[tokio::test]
async fn namespaces_gate_creates_as_the_real_server_does() {
    use k8s_openapi::api::core::v1::Namespace;

    let lab = lab().await;
    let pp = PostParams::default();
    let namespaces: Api<Namespace> = Api::all(lab.client.clone());
    let listed: Vec<_> = namespaces
        .list(&ListParams::default())
        .await
        .expect("list namespaces")
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    for builtin in [
        "default",
        "kube-node-lease",
        "kube-public",
        "kube-system",
        "drv",
    ] {
        assert!(
            listed.iter().any(|n| n == builtin),
            "{builtin} in {listed:?}"
        );
    }
    let default = namespaces.get("default").await.expect("get default");
    assert_eq!(
        default.status.and_then(|s| s.phase).as_deref(),
        Some("Active")
    );

    let cms: Api<ConfigMap> = Api::namespaced(lab.client.clone(), "team-a");
    let err = cms
        .create(&pp, &checkpoint("c", "1"))
        .await
        .expect_err("no namespace team-a yet");
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
    assert_eq!(status.message, "namespaces \"team-a\" not found");
    let raw = lab
        .client
        .request_text(
            http::Request::post("/api/v1/namespaces/team-a/configmaps")
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&json!({"metadata":{"name":"c"}})).unwrap())
                .unwrap(),
        )
        .await;
    let details = match raw {
        Err(kube::Error::Api(s)) => s.details,
        other => panic!("expected a 404 Status, got {other:?}"),
    };
    let details = details.expect("details");
    assert_eq!(
        (details.name.as_str(), details.kind.as_str()),
        ("team-a", "namespaces")
    );
    // Server-side apply that would create is a create: the same 404.
    let err = cms
        .patch(
            "c",
            &PatchParams::apply("test"),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
            ),
        )
        .await
        .expect_err("apply into a missing namespace");
    assert_eq!(api_error(err), (404, "NotFound".into()));

    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team-a"}})).unwrap();
    let created = namespaces.create(&pp, &ns).await.expect("create namespace");
    assert_eq!(
        created.status.and_then(|s| s.phase).as_deref(),
        Some("Active")
    );
    let mut held = checkpoint("held", "1");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&pp, &held).await.expect("create in team-a");

    // The finalizer keeps the namespace Terminating: new content is refused.
    namespaces
        .delete("team-a", &DeleteParams::default())
        .await
        .expect("delete namespace");
    let terminating = namespaces.get("team-a").await.expect("still there");
    assert_eq!(
        terminating.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );
    let err = cms
        .create(&pp, &checkpoint("late", "1"))
        .await
        .expect_err("namespace terminating");
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        "configmaps \"late\" is forbidden: unable to create new content in namespace team-a because it is being terminated"
    );

    // Releasing the last object finishes the deletion.
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("drop finalizer");
    let err = namespaces.get("team-a").await.expect_err("namespace gone");
    assert_eq!(api_error(err), (404, "NotFound".into()));
    let err = namespaces
        .delete("default", &DeleteParams::default())
        .await
        .expect_err("default is immortal");
    assert_eq!(api_error(err), (403, "Forbidden".into()));
}

//! The fake Director over real HTTP (hyper client): UAA tokens and scopes,
//! the dynamic-disks API with its 302/task flow, idempotency and ordering
//! rules, per-deployment scoping, zero workers, VM recreate, the CPI slot limit.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::director_client;
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::cpi::{Cpi, CpiConfig};
use drivelab_fakes::director::{DeploymentConfig, Director, DirectorConfig, InstanceGroupConfig};
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::{calls, Component, History};
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::{MemStore, Store};
use http::{HeaderMap, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

const ALL_DISK_SCOPES: [&str; 5] = [
    "bosh.dynamic-disks.create",
    "bosh.dynamic-disks.attach",
    "bosh.dynamic-disks.detach",
    "bosh.dynamic-disks.delete",
    "bosh.dynamic-disks.list",
];

fn config() -> DirectorConfig {
    DirectorConfig {
        deployments: vec![
            DeploymentConfig {
                name: "a".into(),
                instance_groups: vec![InstanceGroupConfig {
                    name: "worker".into(),
                    instances: 2,
                    azs: vec!["z1".into()],
                }],
            },
            DeploymentConfig {
                name: "b".into(),
                instance_groups: vec![InstanceGroupConfig {
                    name: "worker".into(),
                    instances: 1,
                    azs: vec!["z1".into()],
                }],
            },
        ],
        clients: vec![
            director_client("csi-a", &ALL_DISK_SCOPES, &["a"]),
            director_client("admin", &["bosh.admin"], &[]),
            director_client("reader", &["bosh.dynamic-disks.list"], &[]),
        ],
        dynamic_disks_workers: 2,
        ..DirectorConfig::default()
    }
}

struct Lab {
    director: Director,
    _listener: Listener,
    url: String,
    http: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    history: History,
}

async fn lab_with(cfg: DirectorConfig, cpi_cfg: CpiConfig) -> Lab {
    let history = History::new(SimClock::new());
    let gate = Gate::new(history.clone());
    let cpi = Cpi::new(Arc::new(MemStore::default()), gate.clone(), cpi_cfg);
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    let director = Director::new(store, gate, cpi, cfg).await.unwrap();
    let listener = director.serve(loopback()).await.unwrap();
    Lab {
        director,
        url: listener.url(),
        _listener: listener,
        http: Client::builder(TokioExecutor::new()).build_http(),
        history,
    }
}

async fn lab() -> Lab {
    lab_with(config(), CpiConfig::default()).await
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    fn location(&self) -> String {
        self.headers
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    }
}

impl Lab {
    async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
        content_type: &str,
    ) -> Reply {
        let mut b = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.url))
            .header("content-type", content_type);
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        let req = b
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .unwrap();
        let resp = self.http.request(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        Reply {
            status,
            headers,
            body,
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Reply {
        self.send(
            method,
            path,
            token,
            body.map(|b| b.to_string().into_bytes()),
            "application/json",
        )
        .await
    }

    async fn token(&self, id: &str) -> String {
        let form =
            format!("grant_type=client_credentials&client_id={id}&client_secret={id}-secret");
        let r = self
            .send(
                Method::POST,
                "/oauth/token",
                None,
                Some(form.into_bytes()),
                "application/x-www-form-urlencoded",
            )
            .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.json()["access_token"].as_str().unwrap().to_string()
    }

    /// Follow a 302 to its task and poll until it is finished.
    async fn finish(&self, token: &str, r: &Reply) -> Value {
        assert_eq!(
            r.status,
            StatusCode::FOUND,
            "{}",
            String::from_utf8_lossy(&r.body)
        );
        let loc = r.location();
        assert!(loc.starts_with("/tasks/"), "Location {loc:?}");
        for _ in 0..2000 {
            let t = self.call(Method::GET, &loc, Some(token), None).await.json();
            let s = t["state"].as_str().unwrap_or("").to_string();
            if ["done", "error", "cancelled", "timeout"].contains(&s.as_str()) {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("task {loc} did not finish");
    }

    fn instances(&self, deployment: &str) -> Vec<String> {
        self.director
            .instances()
            .into_iter()
            .filter(|i| i.deployment == deployment)
            .map(|i| i.id)
            .collect()
    }

    fn ops(&self, to: Component) -> Vec<String> {
        calls(&self.history.events())
            .into_iter()
            .filter(|c| c.to == to || (to == Component::Cpi && c.to == Component::Agent))
            .map(|c| c.op)
            .collect()
    }
}

fn provide_body(instance: &str, name: &str) -> Value {
    json!({"instance_id": instance, "disk_name": name, "disk_pool_name": "default", "disk_size": 1024})
}

#[tokio::test]
async fn info_is_public_and_points_at_uaa() {
    let lab = lab().await;
    let r = lab.call(Method::GET, "/info", None, None).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["user_authentication"]["type"], "uaa");
    assert_eq!(v["user_authentication"]["options"]["url"], lab.url.as_str());
}

#[tokio::test]
async fn uaa_client_credentials() {
    let lab = lab().await;
    let form = |s: &str| Some(s.as_bytes().to_vec());
    let ct = "application/x-www-form-urlencoded";
    let r = lab
        .send(
            Method::POST,
            "/oauth/token",
            None,
            form("grant_type=client_credentials&client_id=csi-a&client_secret=wrong"),
            ct,
        )
        .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"], "unauthorized");
    let r = lab
        .send(
            Method::POST,
            "/oauth/token",
            None,
            form("grant_type=password&client_id=csi-a&client_secret=csi-a-secret"),
            ct,
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"], "unsupported_grant_type");
    let r = lab
        .send(
            Method::POST,
            "/oauth/token",
            None,
            form("grant_type=client_credentials&client_id=csi-a&client_secret=csi-a-secret"),
            ct,
        )
        .await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["token_type"], "bearer");
    assert!(v["expires_in"].as_u64().unwrap() > 0);
    assert!(v["scope"]
        .as_str()
        .unwrap()
        .contains("bosh.dynamic-disks.attach"));
    // the secret never reaches the history
    let hist = serde_json::to_string(&lab.history.events()).unwrap();
    assert!(!hist.contains("csi-a-secret"));
    assert!(!hist.contains(v["access_token"].as_str().unwrap()));
}

#[tokio::test]
async fn refusals_use_the_directors_error_json() {
    let lab = lab().await;
    let inst = lab.instances("a")[0].clone();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            None,
            Some(provide_body(&inst, "d1")),
        )
        .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["code"], 600000);
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some("not.a.token"),
            Some(provide_body(&inst, "d1")),
        )
        .await;
    assert_eq!(r.status, 401);
    // list-only client cannot provide (needs create and attach)
    let reader = lab.token("reader").await;
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&reader),
            Some(provide_body(&inst, "d1")),
        )
        .await;
    assert_eq!(r.status, 401);
    let v = r.json();
    assert_eq!(v["code"], 600000);
    assert!(
        v["description"]
            .as_str()
            .unwrap()
            .starts_with("Require one of the scopes: bosh.admin"),
        "{v}"
    );
    // the reader may list
    let r = lab
        .call(Method::GET, "/dynamic_disks", Some(&reader), None)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!([]));
    // validation
    let tok = lab.token("csi-a").await;
    let mut b = provide_body(&inst, "d1");
    b.as_object_mut().unwrap().remove("disk_pool_name");
    let r = lab
        .call(Method::POST, "/dynamic_disks/provide", Some(&tok), Some(b))
        .await;
    assert_eq!(
        (r.status.as_u16(), r.json()["code"].clone()),
        (400, json!(40001))
    );
    let mut b = provide_body(&inst, "d1");
    b["disk_size"] = json!(0);
    let r = lab
        .call(Method::POST, "/dynamic_disks/provide", Some(&tok), Some(b))
        .await;
    assert_eq!(
        (r.status.as_u16(), r.json()["code"].clone()),
        (400, json!(40002))
    );
    let r = lab
        .send(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(b"{nope".to_vec()),
            "application/json",
        )
        .await;
    assert_eq!(r.status, 400);
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(provide_body("no-such", "d1")),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), r.json()["code"].clone()),
        (400, json!(520001))
    );
    let r = lab.call(Method::GET, "/tasks/999", Some(&tok), None).await;
    assert_eq!(
        (r.status.as_u16(), r.json()["code"].clone()),
        (404, json!(10000))
    );
}

#[tokio::test]
async fn provide_creates_attaches_and_tells_the_agent_in_order() {
    let lab = lab().await;
    let tok = lab.token("csi-a").await;
    let inst = lab.instances("a")[0].clone();
    let mut body = provide_body(&inst, "pvc-1");
    body["metadata"] = json!({"pvc": "ns/claim"});
    let before = lab.ops(Component::Cpi).len();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(body.clone()),
        )
        .await;
    let t = lab.finish(&tok, &r).await;
    assert_eq!(t["state"], "done", "{t}");
    assert_eq!(t["user"], "csi-a");
    let out = lab
        .call(
            Method::GET,
            &format!("{}/output?type=result", r.location()),
            Some(&tok),
            None,
        )
        .await;
    let cid = out.json()["disk_cid"].as_str().unwrap().to_string();
    let ops = lab.ops(Component::Cpi)[before..].to_vec();
    assert_eq!(
        ops,
        [
            "create_disk",
            "attach_disk",
            "set_disk_metadata",
            "add_dynamic_disk"
        ]
    );
    // the agent got the CPI's hint
    let ad = lab.director.agent_disks(&inst);
    assert_eq!(ad.len(), 1);
    assert_eq!(ad[0].disk_cid, cid);
    assert_eq!(ad[0].hint["id"], cid.as_str());
    let vm = lab
        .director
        .instances()
        .into_iter()
        .find(|i| i.id == inst)
        .unwrap()
        .vm_cid
        .unwrap();
    assert_eq!(lab.director.cpi().attachments()[0].vm_cid, vm);
    let list = lab
        .call(Method::GET, "/dynamic_disks", Some(&tok), None)
        .await
        .json();
    assert_eq!(list[0]["name"], "pvc-1");
    assert_eq!(list[0]["disk_cid"], cid.as_str());
    assert_eq!(list[0]["instance"], inst.as_str());
    assert_eq!(list[0]["deployment"], "a");
    assert_eq!(list[0]["metadata"]["pvc"], "ns/claim");

    // provide again to the same VM: done, same disk, no new create/attach
    let before = lab.ops(Component::Cpi).len();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(body),
        )
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "done");
    let ops = lab.ops(Component::Cpi)[before..].to_vec();
    assert_eq!(ops, ["add_dynamic_disk"]);
    assert_eq!(lab.director.cpi().disks().len(), 1);

    // attach elsewhere: the task fails, nothing moves
    let other = lab.instances("a")[1].clone();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/pvc-1/attach",
            Some(&tok),
            Some(json!({"instance_id": other})),
        )
        .await;
    let t = lab.finish(&tok, &r).await;
    assert_eq!(t["state"], "error");
    assert!(
        t["result"].as_str().unwrap().contains("already attached"),
        "{t}"
    );
    assert_eq!(lab.director.cpi().attachments().len(), 1);
    assert!(lab.director.agent_disks(&other).is_empty());
}

#[tokio::test]
async fn detach_is_idempotent_and_agent_goes_first() {
    let lab = lab().await;
    let tok = lab.token("csi-a").await;
    let inst = lab.instances("a")[0].clone();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(provide_body(&inst, "d")),
        )
        .await;
    lab.finish(&tok, &r).await;
    let before = lab.ops(Component::Cpi).len();
    let r = lab
        .call(Method::POST, "/dynamic_disks/d/detach", Some(&tok), None)
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "done");
    assert_eq!(
        lab.ops(Component::Cpi)[before..],
        ["remove_dynamic_disk", "detach_disk"]
    );
    assert!(lab.director.cpi().attachments().is_empty());
    assert!(lab.director.agent_disks(&inst).is_empty());
    assert_eq!(lab.director.disks()[0].instance_id, None);
    // again: done, no CPI call
    let before = lab.ops(Component::Cpi).len();
    let r = lab
        .call(Method::POST, "/dynamic_disks/d/detach", Some(&tok), None)
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "done");
    assert_eq!(lab.ops(Component::Cpi).len(), before);
    // unknown name: error
    let r = lab
        .call(Method::POST, "/dynamic_disks/nope/detach", Some(&tok), None)
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "error");
    // attach again, then delete while attached: detached then deleted
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/d/attach",
            Some(&tok),
            Some(json!({"instance_id": inst})),
        )
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "done");
    let r = lab
        .call(Method::DELETE, "/dynamic_disks/d", Some(&tok), None)
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "done");
    assert!(lab.director.disks().is_empty());
    assert!(lab.director.cpi().disks().is_empty());
    // delete of an unknown name: done
    let r = lab
        .call(Method::DELETE, "/dynamic_disks/d", Some(&tok), None)
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "done");
}

#[tokio::test]
async fn detach_tolerates_disk_not_attached_from_the_cpi() {
    let lab = lab().await;
    let tok = lab.token("csi-a").await;
    let inst = lab.instances("a")[0].clone();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(provide_body(&inst, "d")),
        )
        .await;
    lab.finish(&tok, &r).await;
    // the IaaS lost the attachment behind the Director's back
    let a = lab.director.cpi().attachments()[0].clone();
    lab.director
        .cpi()
        .detach_disk(&a.vm_cid, &a.disk_cid)
        .await
        .unwrap();
    let r = lab
        .call(Method::POST, "/dynamic_disks/d/detach", Some(&tok), None)
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "done");
    assert_eq!(lab.director.disks()[0].instance_id, None);
}

#[tokio::test]
async fn create_then_attach_and_cross_deployment_refusal() {
    let lab = lab().await;
    let admin = lab.token("admin").await;
    let body = json!({"deployment_name": "a", "az": "z1", "disk_name": "c1", "disk_pool_name": "default", "disk_size": 10});
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks",
            Some(&admin),
            Some(body.clone()),
        )
        .await;
    assert_eq!(lab.finish(&admin, &r).await["state"], "done");
    let cid = lab
        .call(
            Method::GET,
            &format!("{}/output?type=result", r.location()),
            Some(&admin),
            None,
        )
        .await
        .json()["disk_cid"]
        .clone();
    // same create again: same disk
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks",
            Some(&admin),
            Some(body.clone()),
        )
        .await;
    assert_eq!(lab.finish(&admin, &r).await["state"], "done");
    let again = lab
        .call(
            Method::GET,
            &format!("{}/output?type=result", r.location()),
            Some(&admin),
            None,
        )
        .await
        .json()["disk_cid"]
        .clone();
    assert_eq!(cid, again);
    assert_eq!(lab.director.cpi().disks().len(), 1);
    // same name, other size: error (names are unique across the Director)
    let mut other = body.clone();
    other["disk_size"] = json!(20);
    let r = lab
        .call(Method::POST, "/dynamic_disks", Some(&admin), Some(other))
        .await;
    assert_eq!(lab.finish(&admin, &r).await["state"], "error");
    // attach to deployment b's instance: error
    let b = lab.instances("b")[0].clone();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/c1/attach",
            Some(&admin),
            Some(json!({"instance_id": b})),
        )
        .await;
    let t = lab.finish(&admin, &r).await;
    assert_eq!(t["state"], "error");
    assert!(t["result"].as_str().unwrap().contains("deployment"), "{t}");
    let a = lab.instances("a")[0].clone();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/c1/attach",
            Some(&admin),
            Some(json!({"instance_id": a})),
        )
        .await;
    assert_eq!(lab.finish(&admin, &r).await["state"], "done");
}

#[tokio::test]
async fn zero_workers_leave_tasks_queued_until_workers_start() {
    let mut cfg = config();
    cfg.dynamic_disks_workers = 0;
    let lab = lab_with(cfg, CpiConfig::default()).await;
    assert_eq!(lab.director.dynamic_disks_workers(), 0);
    let tok = lab.token("csi-a").await;
    let inst = lab.instances("a")[0].clone();
    let r1 = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(provide_body(&inst, "q1")),
        )
        .await;
    let r2 = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(provide_body(&inst, "q2")),
        )
        .await;
    assert_eq!(r1.status, StatusCode::FOUND);
    assert_eq!(r2.status, StatusCode::FOUND);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t = lab
        .call(Method::GET, &r1.location(), Some(&tok), None)
        .await
        .json();
    assert_eq!(t["state"], "queued");
    assert!(lab.director.cpi().disks().is_empty());
    // cancel a queued task: cancelling (takes effect when a worker picks it up)
    let id = r2.location().trim_start_matches("/tasks/").to_string();
    let r = lab
        .call(Method::DELETE, &format!("/task/{id}"), Some(&tok), None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let t = lab
        .call(Method::GET, &r2.location(), Some(&tok), None)
        .await
        .json();
    assert_eq!(t["state"], "cancelling");
    lab.director.set_dynamic_disks_workers(1);
    assert_eq!(lab.finish(&tok, &r1).await["state"], "done");
    assert_eq!(lab.finish(&tok, &r2).await["state"], "cancelled");
    assert_eq!(lab.director.cpi().disks().len(), 1);
    // a finished task cannot be cancelled
    let r = lab
        .call(Method::DELETE, &format!("/task/{id}"), Some(&tok), None)
        .await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn per_deployment_scoping_refuses_other_deployments() {
    let mut cfg = config();
    cfg.per_deployment_scoping = true;
    let lab = lab_with(cfg, CpiConfig::default()).await;
    let tok = lab.token("csi-a").await;
    let admin = lab.token("admin").await;
    let a = lab.instances("a")[0].clone();
    let b = lab.instances("b")[0].clone();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(provide_body(&b, "x")),
        )
        .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["code"], 600000);
    // B's disk (made by admin) is invisible and untouchable for A's token
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&admin),
            Some(provide_body(&b, "bdisk")),
        )
        .await;
    assert_eq!(lab.finish(&admin, &r).await["state"], "done");
    for (m, p) in [
        (Method::POST, "/dynamic_disks/bdisk/detach"),
        (Method::DELETE, "/dynamic_disks/bdisk"),
    ] {
        let r = lab.call(m, p, Some(&tok), None).await;
        assert_eq!(r.status, 401, "{p}");
    }
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/bdisk/attach",
            Some(&tok),
            Some(json!({"instance_id": a})),
        )
        .await;
    assert_eq!(r.status, 401);
    let list = lab
        .call(Method::GET, "/dynamic_disks", Some(&tok), None)
        .await
        .json();
    assert_eq!(list, json!([]));
    // its own deployment works
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(provide_body(&a, "adisk")),
        )
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "done");
    // and A's task is not visible to another non-admin client
    let reader = lab.token("reader").await;
    let r2 = lab
        .call(Method::GET, &r.location(), Some(&reader), None)
        .await;
    assert_eq!(r2.status, 401);
}

#[tokio::test]
async fn without_scoping_the_same_token_reaches_other_deployments() {
    let lab = lab().await;
    let tok = lab.token("csi-a").await;
    let b = lab.instances("b")[0].clone();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(provide_body(&b, "x")),
        )
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "done");
}

#[tokio::test]
async fn recreate_detaches_dynamic_disks_and_does_not_reattach() {
    let lab = lab().await;
    let tok = lab.token("csi-a").await;
    let inst = lab.instances("a")[0].clone();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(provide_body(&inst, "r")),
        )
        .await;
    lab.finish(&tok, &r).await;
    let old_vm = lab.director.instances()[0].vm_cid.clone().unwrap();
    let t = lab.director.recreate_vm(&inst).await.unwrap();
    assert_eq!(t.state, drivelab_fakes::director::TaskState::Done, "{t:?}");
    let now = lab
        .director
        .instances()
        .into_iter()
        .find(|i| i.id == inst)
        .unwrap();
    assert_ne!(now.vm_cid.as_deref(), Some(old_vm.as_str()));
    assert!(lab.director.cpi().attachments().is_empty());
    assert!(lab.director.agent_disks(&inst).is_empty());
    assert_eq!(lab.director.disks()[0].instance_id, None);
    assert!(!lab.director.cpi().vms().iter().any(|v| v.cid == old_vm));
    // the consumer attaches again
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/r/attach",
            Some(&tok),
            Some(json!({"instance_id": inst})),
        )
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "done");
    assert_eq!(
        lab.director.cpi().attachments()[0].vm_cid,
        now.vm_cid.unwrap()
    );
    // delete the VM: detached again, instance has no VM; attach now fails
    lab.director.delete_vm(&inst).await.unwrap();
    assert!(lab.director.cpi().attachments().is_empty());
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/r/attach",
            Some(&tok),
            Some(json!({"instance_id": inst})),
        )
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "error");
}

#[tokio::test]
async fn cpi_slot_limit_fails_the_attach_task() {
    let lab = lab_with(
        config(),
        CpiConfig {
            max_disks_per_vm: 1,
            ..CpiConfig::default()
        },
    )
    .await;
    let tok = lab.token("csi-a").await;
    let inst = lab.instances("a")[0].clone();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(provide_body(&inst, "s1")),
        )
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "done");
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(provide_body(&inst, "s2")),
        )
        .await;
    let t = lab.finish(&tok, &r).await;
    assert_eq!(t["state"], "error");
    assert!(
        t["result"]
            .as_str()
            .unwrap()
            .contains("no free attachment slot"),
        "{t}"
    );
    // the disk exists, unattached (create succeeded before the attach failed)
    let s2 = lab
        .director
        .disks()
        .into_iter()
        .find(|d| d.name == "s2")
        .unwrap();
    assert_eq!(s2.instance_id, None);
}

#[tokio::test]
async fn a_restart_keeps_disks_tasks_and_tokens() {
    let history = History::new(SimClock::new());
    let gate = Gate::new(history.clone());
    let cpi = Cpi::new(
        Arc::new(MemStore::default()),
        gate.clone(),
        CpiConfig::default(),
    );
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    let d1 = Director::new(store.clone(), gate.clone(), cpi.clone(), config())
        .await
        .unwrap();
    let listener = d1.serve(loopback()).await.unwrap();
    let lab = Lab {
        director: d1,
        url: listener.url(),
        _listener: listener,
        http: Client::builder(TokioExecutor::new()).build_http(),
        history: history.clone(),
    };
    let tok = lab.token("csi-a").await;
    let inst = lab.instances("a")[0].clone();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(provide_body(&inst, "keep")),
        )
        .await;
    lab.finish(&tok, &r).await;
    let vms = cpi.vms().len();
    drop(lab);
    let d2 = Director::new(store, gate, cpi.clone(), config())
        .await
        .unwrap();
    let listener = d2.serve(loopback()).await.unwrap();
    let lab = Lab {
        director: d2,
        url: listener.url(),
        _listener: listener,
        http: Client::builder(TokioExecutor::new()).build_http(),
        history,
    };
    // no new VMs at reopen; the old token still works
    assert_eq!(cpi.vms().len(), vms);
    let t = lab
        .call(Method::GET, &r.location(), Some(&tok), None)
        .await
        .json();
    assert_eq!(t["state"], "done");
    assert_eq!(lab.director.disks()[0].name, "keep");
    assert_eq!(lab.director.agent_disks(&inst).len(), 1);
}

/// Faults by op name: reject before, or cut the reply after the commit.
struct Faults {
    reject: Option<(&'static str, drivelab_fakes::gate::Rejection)>,
    cut_after: Option<&'static str>,
}

impl drivelab_fakes::gate::GateHook for Faults {
    fn before<'a>(
        &'a self,
        _id: drivelab_fakes::history::CallId,
        call: &'a drivelab_fakes::gate::CallSpec,
    ) -> futures_util::future::BoxFuture<'a, drivelab_fakes::gate::Verdict> {
        let v = match &self.reject {
            Some((op, r)) if call.op == *op => drivelab_fakes::gate::Verdict::Reject(r.clone()),
            _ => drivelab_fakes::gate::Verdict::Proceed,
        };
        Box::pin(async move { v })
    }
    fn after<'a>(
        &'a self,
        _id: drivelab_fakes::history::CallId,
        call: &'a drivelab_fakes::gate::CallSpec,
        _o: &'a drivelab_fakes::history::Outcome,
    ) -> futures_util::future::BoxFuture<'a, drivelab_fakes::gate::Delivery> {
        let d = if self.cut_after == Some(call.op.as_str()) {
            drivelab_fakes::gate::Delivery::Cut
        } else {
            drivelab_fakes::gate::Delivery::Deliver
        };
        Box::pin(async move { d })
    }
}

#[tokio::test]
async fn a_lost_302_still_leaves_the_task_and_cpi_faults_fail_it() {
    let lab = lab().await;
    let tok = lab.token("csi-a").await;
    let inst = lab.instances("a")[0].clone();
    lab.history
        .clock()
        .advance_to(drivelab_fakes::clock::VTime(42_000));
    lab.director.cpi().gate().set_hook(Arc::new(Faults {
        reject: Some((
            "attach_disk",
            drivelab_fakes::gate::Rejection {
                http_status: 500,
                code: "Bosh::Clouds::CloudError".into(),
                message: "injected".into(),
            },
        )),
        cut_after: Some("dynamic_disks.provide"),
    }));
    // the Director queued the task but the client's connection drops
    let req = http::Request::builder()
        .method(Method::POST)
        .uri(format!("{}/dynamic_disks/provide", lab.url))
        .header("authorization", format!("Bearer {tok}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            provide_body(&inst, "lost").to_string(),
        )))
        .unwrap();
    assert!(
        lab.http.request(req).await.is_err(),
        "the reply must be lost"
    );
    let t = lab
        .director
        .wait_task(lab.director.tasks().last().unwrap().id)
        .await
        .unwrap();
    // the CPI fault (through the Director→Cpi gate) failed the attach
    assert_eq!(t.state, drivelab_fakes::director::TaskState::Error);
    assert!(t.result.unwrap().contains("injected"));
    let rec = lab
        .call(Method::GET, &format!("/tasks/{}", t.id), Some(&tok), None)
        .await
        .json();
    assert_eq!(rec["timestamp"], 42, "virtual-clock seconds");
    // the disk was created (before the attach failed): it is the consumer's to retry or delete
    assert_eq!(lab.director.disks()[0].name, "lost");
    assert!(lab.director.cpi().attachments().is_empty());
}

#[tokio::test]
async fn resize_grows_a_detached_disk_and_refuses_an_attached_one() {
    let lab = lab().await;
    let tok = lab.token("csi-a").await;
    let inst = lab.instances("a")[0].clone();
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/provide",
            Some(&tok),
            Some(provide_body(&inst, "d")),
        )
        .await;
    lab.finish(&tok, &r).await;
    let size = lab.director.disks()[0].size_mib;
    // Attached: the task fails and nothing reaches the CPI's resize.
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/d/resize",
            Some(&tok),
            Some(json!({"disk_size": size * 2})),
        )
        .await;
    let t = lab.finish(&tok, &r).await;
    assert_eq!(t["state"], "error", "{t}");
    assert!(
        t["result"].as_str().unwrap_or("").contains("detach it"),
        "{t}"
    );
    assert!(!lab.ops(Component::Cpi).contains(&"resize_disk".to_string()));
    // Detached: the IaaS disk and the Director's record both grow.
    let r = lab
        .call(Method::POST, "/dynamic_disks/d/detach", Some(&tok), None)
        .await;
    lab.finish(&tok, &r).await;
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/d/resize",
            Some(&tok),
            Some(json!({"disk_size": size * 2})),
        )
        .await;
    assert_eq!(lab.finish(&tok, &r).await["state"], "done");
    assert_eq!(lab.director.disks()[0].size_mib, size * 2);
    assert_eq!(lab.director.cpi().disks()[0].size_mib, size * 2);
    // Shrinking is the CPI's NotSupported: the task says so.
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/d/resize",
            Some(&tok),
            Some(json!({"disk_size": 1})),
        )
        .await;
    let t = lab.finish(&tok, &r).await;
    assert_eq!(t["state"], "error", "{t}");
    // A bad body is a 400 in the Director's error shape, no task.
    let r = lab
        .call(
            Method::POST,
            "/dynamic_disks/d/resize",
            Some(&tok),
            Some(json!({"disk_size": 0})),
        )
        .await;
    assert_eq!(r.status, 400);
}

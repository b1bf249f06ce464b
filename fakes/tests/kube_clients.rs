//! Runs Kubernetes clients nobody here wrote against the kube fake on a real
//! loopback TLS listener, each through a kubeconfig as a user would hold one
//! (server, CA, bearer token): the
//! official Python client (`tests/python/test_kube_client.py`; a missing
//! package fails this test) and kubectl (where the machine has it; a plain
//! SKIPPED line where not). Identities: cluster-admin, a COSI driver's
//! service account, a service account bound to nothing, a token the cluster
//! never issued, and no credentials at all.

mod pyclient;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use drivelab_fakes::clock::SimClock;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::kube::{Grant, Kind, KubeFake};
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::tls::TlsIdentity;
use serde_json::json;

/// The driver's namespace (its Role covers ConfigMaps here only).
const DRIVER_NS: &str = "cosi-system";

/// A kubeconfig as `drivelab serve` writes one: https, the lab's CA, a
/// bearer token (none when `token` is empty).
fn kubeconfig(dir: &Path, name: &str, url: &str, ca: &TlsIdentity, token: &str) -> PathBuf {
    use base64::Engine as _;
    let path = dir.join(format!("{name}.kubeconfig"));
    let ca = base64::engine::general_purpose::STANDARD.encode(ca.ca_pem());
    let user = if token.is_empty() {
        " {}".to_string()
    } else {
        format!("\n    token: {token}")
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: {name}\n  user:{user}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: {name}\n    namespace: {DRIVER_NS}\ncurrent-context: lab\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

struct Lab {
    _fake: KubeFake,
    listener: Listener,
    dir: tempfile::TempDir,
    admin: PathBuf,
    driver: PathBuf,
    nobody: PathBuf,
    forged: PathBuf,
    anonymous: PathBuf,
}

async fn lab() -> Lab {
    let fake =
        drivelab_fakes::kube::in_memory(Gate::new(History::new(SimClock::new())), 3).unwrap();
    fake.create(
        Kind::Secret,
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "s3-admin", "namespace": "drivelab-system"},
               "data": {"secretKey": "c2VjcmV0"}}),
    )
    .unwrap();
    // The driver is deployed into its namespace, so it exists (recorded, not written).
    fake.declare_namespace(DRIVER_NS).unwrap();
    let tls = TlsIdentity::generate().unwrap();
    let listener = fake.serve_tls(loopback(), &tls).await.unwrap();
    let url = listener.url();
    assert!(url.starts_with("https://"), "{url}");
    let dir = tempfile::tempdir().unwrap();
    let access = fake.access();
    let config = |name: &str, token: &str| kubeconfig(dir.path(), name, &url, &tls, token);
    let admin = config(
        "admin",
        &access.issue(Grant::cluster_admin("kubernetes-admin")),
    );
    let driver = config(
        "driver",
        &access.issue(Grant::cosi_driver(DRIVER_NS, "cosi-driver")),
    );
    let nobody = config("nobody", &access.issue(Grant::nothing("default", "nobody")));
    let forged = config("forged", "not-issued-by-this-cluster");
    let anonymous = config("anonymous", "");
    Lab {
        _fake: fake,
        listener,
        dir,
        admin,
        driver,
        nobody,
        forged,
        anonymous,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_authenticates_and_is_authorized_by_role() {
    pyclient::require("kubernetes, pytest").await;
    let lab = lab().await;
    let stdout = pyclient::pytest(
        &["tests/python/test_kube_client.py"],
        &[
            ("KUBECONFIG_ADMIN", lab.admin.display().to_string()),
            ("KUBECONFIG_DRIVER", lab.driver.display().to_string()),
            ("KUBECONFIG_NOBODY", lab.nobody.display().to_string()),
            ("KUBECONFIG_FORGED", lab.forged.display().to_string()),
            ("KUBECONFIG_ANONYMOUS", lab.anonymous.display().to_string()),
            ("KUBE_URL", lab.listener.url()),
            ("DRIVER_NAMESPACE", DRIVER_NS.to_string()),
        ],
        Duration::from_secs(300),
    )
    .await;
    assert!(
        stdout.contains("passed") && !stdout.contains("skipped"),
        "pytest ran no test or skipped some:\n{stdout}"
    );
}

/// kubectl with `kubeconfig`; (exit success, stdout, stderr).
fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=20s")
        .args(args)
        .output()
        .expect("running kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_authenticates_and_is_authorized_by_role() {
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .map_or(true, |o| !o.status.success())
    {
        println!("SKIPPED: kubectl_authenticates_and_is_authorized_by_role: kubectl is not installed; the kubectl probes were NOT run");
        return;
    }
    let lab = lab().await;
    let lab = tokio::task::spawn_blocking(move || {
        let secret = [
            "get",
            "secret",
            "s3-admin",
            "-n",
            "drivelab-system",
            "-o",
            "json",
        ];
        let (ok, out, err) = kubectl(&lab.admin, &secret);
        assert!(ok, "admin: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["metadata"]["name"], "s3-admin", "{out}");
        let (ok, out, err) = kubectl(&lab.driver, &secret);
        assert!(ok, "the driver reads its admin Secret: {err}");
        assert!(out.contains("secretKey"), "{out}");

        // (With no credentials at all kubectl asks for a username on stdin;
        // the Python client covers that case.)
        let (ok, _, err) = kubectl(&lab.forged, &secret);
        assert!(!ok && err.contains("Unauthorized"), "a forged token: {err}");
        let (ok, _, err) = kubectl(&lab.nobody, &secret);
        assert!(!ok, "a service account bound to nothing read a Secret");
        assert!(
            err.contains("Forbidden")
                && err.contains(
                    "User \"system:serviceaccount:default:nobody\" cannot get resource \"secrets\""
                ),
            "{err}"
        );
        let (ok, _, err) = kubectl(
            &lab.driver,
            &["get", "configmaps", "-n", "kube-system", "-o", "json"],
        );
        assert!(
            !ok && err.contains("cannot list resource \"configmaps\""),
            "{err}"
        );
        let (ok, out, err) = kubectl(&lab.driver, &["get", "configmaps", "-o", "json"]);
        assert!(
            ok,
            "the driver lists ConfigMaps in its own namespace: {err}"
        );
        assert!(out.contains("\"items\""), "{out}");
        lab
    })
    .await
    .unwrap();
    drop(lab.dir);
}

/// kubectl is installed (else the test prints a plain SKIPPED line).
fn have_kubectl(test: &str) -> bool {
    let ok = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("SKIPPED: {test}: kubectl is not installed; the kubectl probes were NOT run");
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_validates_against_the_served_openapi() {
    if !have_kubectl("kubectl_apply_validates_against_the_served_openapi") {
        return;
    }
    let lab = lab().await;
    let lab = tokio::task::spawn_blocking(move || {
        let file = |name: &str, text: &str| {
            let p = lab.dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let good = file(
            "cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  a: b\n",
        );
        // Plain `kubectl apply` (default --validate=strict): no --validate=false needed.
        let (ok, out, err) = kubectl(&lab.admin, &["apply", "-f", &good]);
        assert!(ok, "kubectl apply: {err}");
        assert!(out.contains("configmap/app created"), "{out}");
        let changed = file(
            "cm2.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  a: c\n",
        );
        let (ok, out, err) = kubectl(&lab.admin, &["apply", "-f", &changed]);
        assert!(ok && out.contains("configmap/app configured"), "{out} {err}");

        // An unknown field is refused by the server, worded as a real server words it.
        let unknown = file(
            "bad.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: other\ndata:\n  a: b\nfoo: 1\n",
        );
        let (ok, _, err) = kubectl(&lab.admin, &["apply", "-f", &unknown]);
        assert!(!ok, "an unknown field was accepted");
        assert!(
            err.contains("Error from server (BadRequest)")
                && err.contains(
                    "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"foo\""
                ),
            "{err}"
        );
        // Nested, in a custom resource.
        let claim = file(
            "claim.yaml",
            "apiVersion: objectstorage.k8s.io/v1alpha1\nkind: BucketClaim\nmetadata:\n  name: c\nspec:\n  bucketClassName: std\n  protocols: [S3]\n  colour: red\n",
        );
        let (ok, _, err) = kubectl(&lab.admin, &["apply", "-f", &claim]);
        assert!(
            !ok && err.contains("strict decoding error: unknown field \"spec.colour\""),
            "{err}"
        );
        // --validate=warn: stored without the field, with the server's warning.
        let (ok, out, err) = kubectl(&lab.admin, &["apply", "--validate=warn", "-f", &claim]);
        assert!(ok, "{err}");
        assert!(out.contains("bucketclaim.objectstorage.k8s.io/c created"), "{out}");
        assert!(err.contains("Warning: unknown field \"spec.colour\""), "{err}");
        let (ok, out, _) = kubectl(&lab.admin, &["get", "bucketclaim", "c", "-o", "json"]);
        assert!(ok, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(v["spec"].get("colour").is_none(), "{out}");
        // --validate=false: dropped silently.
        let (ok, _, err) = kubectl(&lab.admin, &["apply", "--validate=false", "-f", &unknown]);
        assert!(ok && !err.contains("Warning"), "{err}");
        lab
    })
    .await
    .unwrap();
    drop(lab.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_sends_protobuf_and_is_understood() {
    if !have_kubectl("kubectl_create_sends_protobuf_and_is_understood") {
        return;
    }
    let lab = lab().await;
    let lab = tokio::task::spawn_blocking(move || {
        // Plain `kubectl create secret/configmap/namespace` POST protobuf bodies.
        let (ok, out, err) = kubectl(
            &lab.admin,
            &["create", "secret", "generic", "x", "--from-literal=a=b"],
        );
        assert!(ok && out.contains("secret/x created"), "{out} {err}");
        let (ok, out, err) = kubectl(&lab.admin, &["get", "secret", "x", "-o", "json"]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["data"]["a"], "Yg==", "{out}");
        assert_eq!(v["type"], "Opaque", "{out}");
        let (ok, out, err) = kubectl(
            &lab.admin,
            &[
                "create",
                "configmap",
                "y",
                "--from-literal=k=v",
                "--from-literal=k2=v2",
            ],
        );
        assert!(ok && out.contains("configmap/y created"), "{out} {err}");
        let (ok, out, _) = kubectl(&lab.admin, &["get", "configmap", "y", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(ok && v["data"]["k2"] == "v2", "{out}");
        let (ok, out, err) = kubectl(&lab.admin, &["create", "namespace", "team"]);
        assert!(ok && out.contains("namespace/team created"), "{out} {err}");
        let (ok, out, err) = kubectl(
            &lab.admin,
            &[
                "create",
                "secret",
                "docker-registry",
                "reg",
                "--docker-server=s",
                "--docker-username=u",
                "--docker-password=p",
                "-n",
                "team",
            ],
        );
        assert!(ok && out.contains("secret/reg created"), "{out} {err}");
        lab
    })
    .await
    .unwrap();
    drop(lab.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_server_side_apply_conflicts_with_client_side_apply() {
    if !have_kubectl("kubectl_server_side_apply_conflicts_with_client_side_apply") {
        return;
    }
    let lab = lab().await;
    let lab = tokio::task::spawn_blocking(move || {
        let file = |name: &str, text: &str| {
            let p = lab.dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let cm = |v: &str| {
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  a: {v}\n  keep: k\n")
        };
        let (ok, _, err) = kubectl(&lab.admin, &["apply", "-f", &file("a.yaml", &cm("b"))]);
        assert!(ok, "{err}");
        let changed = file("b.yaml", &cm("z"));
        let (ok, _, err) = kubectl(&lab.admin, &["apply", "--server-side", "-f", &changed]);
        assert!(!ok, "a conflicting server-side apply succeeded");
        assert!(
            err.contains(
                "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using v1: .data.a"
            ),
            "{err}"
        );
        let (ok, out, err) = kubectl(
            &lab.admin,
            &["apply", "--server-side", "--force-conflicts", "-f", &changed],
        );
        assert!(ok && out.contains("configmap/app serverside-applied"), "{out} {err}");
        // Dropping a field from the applied manifest removes it (kubectl owns it alone now).
        let less = file(
            "c.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  a: z\n",
        );
        let (ok, _, err) = kubectl(&lab.admin, &["apply", "--server-side", "-f", &less]);
        assert!(ok, "{err}");
        let (ok, out, _) = kubectl(
            &lab.admin,
            &["get", "configmap", "app", "-o", "json", "--show-managed-fields"],
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(ok && v["data"] == json!({"a": "z"}), "{out}");
        assert!(
            v["metadata"]["managedFields"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["manager"] == "kubectl" && e["operation"] == "Apply"),
            "{out}"
        );
        lab
    })
    .await
    .unwrap();
    drop(lab.dir);
}

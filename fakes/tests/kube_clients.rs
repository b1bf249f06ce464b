//! Runs Kubernetes clients nobody here wrote against the kube fake on a real
//! loopback listener, each through a kubeconfig as a user would hold one: the
//! official Python client (`tests/python/test_kube_client.py`; a missing
//! package fails this test) and kubectl (where the machine has it; a plain
//! SKIPPED line where not). Three identities: cluster-admin, a COSI driver's
//! service account, and a service account bound to nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use drivelab_fakes::clock::SimClock;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::kube::{Grant, Kind, KubeFake};
use drivelab_fakes::serve::{loopback, Listener};
use serde_json::json;

/// The driver's namespace (its Role covers ConfigMaps here only).
const DRIVER_NS: &str = "cosi-system";

fn python() -> String {
    std::env::var("DRIVELAB_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// A kubeconfig as `drivelab serve` writes one: plain http, a bearer token.
fn kubeconfig(dir: &Path, name: &str, url: &str, token: &str) -> PathBuf {
    let path = dir.join(format!("{name}.kubeconfig"));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {url}\nusers:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: {name}\n    namespace: {DRIVER_NS}\ncurrent-context: lab\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

struct Lab {
    fake: KubeFake,
    listener: Listener,
    dir: tempfile::TempDir,
    admin: PathBuf,
    driver: PathBuf,
    nobody: PathBuf,
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
    let listener = fake.serve(loopback()).await.unwrap();
    let url = listener.url();
    let dir = tempfile::tempdir().unwrap();
    let access = fake.access();
    let admin = kubeconfig(
        dir.path(),
        "admin",
        &url,
        &access.issue(Grant::cluster_admin("kubernetes-admin")),
    );
    let driver = kubeconfig(
        dir.path(),
        "driver",
        &url,
        &access.issue(Grant::cosi_driver(DRIVER_NS, "cosi-driver")),
    );
    let nobody = kubeconfig(
        dir.path(),
        "nobody",
        &url,
        &access.issue(Grant::nothing("default", "nobody")),
    );
    let anonymous = kubeconfig(dir.path(), "anonymous", &url, "not-issued-by-this-cluster");
    Lab {
        fake,
        listener,
        dir,
        admin,
        driver,
        nobody,
        anonymous,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_authenticates_and_is_authorized_by_role() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let probe = tokio::process::Command::new(python())
        .args(["-c", "import kubernetes, pytest"])
        .output()
        .await;
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "the Python kubernetes client is missing ({}): run `pip install -r tests/python/requirements.txt`",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("cannot run {} ({e}): install Python 3", python()),
    }
    let lab = lab().await;
    let run = tokio::process::Command::new(python())
        .args([
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests/python/test_kube_client.py",
        ])
        .current_dir(&root)
        .env("KUBECONFIG_ADMIN", &lab.admin)
        .env("KUBECONFIG_DRIVER", &lab.driver)
        .env("KUBECONFIG_NOBODY", &lab.nobody)
        .env("KUBECONFIG_ANONYMOUS", &lab.anonymous)
        .env("KUBE_URL", lab.listener.url())
        .env("DRIVER_NAMESPACE", DRIVER_NS)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("pytest did not finish within 5 minutes")
        .expect("pytest could not be started");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(out.status.success(), "pytest failed:\n{stdout}\n{stderr}");
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
async fn kubectl_is_refused_without_credentials_and_authorized_as_the_lab_names_it() {
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .map_or(true, |o| !o.status.success())
    {
        println!("SKIPPED: kubectl_is_refused_without_credentials_and_authorized_as_the_lab_names_it: kubectl is not installed; the kubectl probes were NOT run");
        return;
    }
    let lab = lab().await;
    let lab = tokio::task::spawn_blocking(move || {
        let secret = ["get", "secret", "s3-admin", "-n", "drivelab-system", "-o", "json"];
        // client-go sends a kubeconfig's token only over TLS; over this plain
        // http API kubectl is anonymous, and anonymous is refused...
        let (ok, _, err) = kubectl(&lab.admin, &secret);
        assert!(!ok && err.contains("provide credentials"), "{err}");
        // ...until the lab names who a credential-less caller is (in a run:
        // the driver's service account), whose role then decides.
        lab.fake
            .access()
            .set_anonymous(Some(Grant::cosi_driver(DRIVER_NS, "cosi-driver")));
        let (ok, out, err) = kubectl(&lab.admin, &secret);
        assert!(ok, "the driver reads its admin Secret: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["metadata"]["name"], "s3-admin", "{out}");
        let (ok, _, err) = kubectl(&lab.admin, &["get", "configmaps", "-n", "kube-system", "-o", "json"]);
        assert!(!ok, "the driver listed ConfigMaps outside its namespace");
        assert!(
            err.contains("Forbidden")
                && err.contains("User \"system:serviceaccount:cosi-system:cosi-driver\" cannot list resource \"configmaps\""),
            "{err}"
        );
        let (ok, out, err) = kubectl(&lab.admin, &["get", "configmaps", "-o", "json"]);
        assert!(ok, "the driver lists ConfigMaps in its own namespace: {err}");
        assert!(out.contains("\"items\""), "{out}");
        lab
    })
    .await
    .unwrap();
    drop(lab.dir);
}

//! The fakes of one run and their lifecycle: started on loopback over in-memory
//! stores, restartable in place (same port, same state, connections broken).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use anyhow::{anyhow, Context};
use drivelab_fakes::cosi_sidecar::KubeSlot;
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::Component;
use drivelab_fakes::kube::{Access, Grant, KubeFake};
use drivelab_fakes::s3::{S3Config, S3Fake};
use drivelab_fakes::secret::Secret;
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_fakes::store::{MemStore, Store};
use drivelab_fakes::tls::TlsIdentity;

/// The S3 server (data plane + admin API) and the Kubernetes API of one run.
pub struct FakeSet {
    /// The S3 fake's state; a restarted fake is rebuilt from it.
    s3_store: Arc<MemStore>,
    /// The Kubernetes fake's state; likewise.
    kube_store: Arc<MemStore>,
    s3_config: S3Config,
    kube_seed: u64,
    s3_gate: Gate,
    kube_gate: Gate,
    /// The tokens the Kubernetes API accepts, kept across its restarts.
    kube_access: Access,
    /// The Kubernetes API's certificate and CA (it is served over https).
    kube_tls: TlsIdentity,
    s3: RwLock<S3Fake>,
    kube: KubeSlot,
    s3_listener: tokio::sync::Mutex<Option<Listener>>,
    kube_listener: tokio::sync::Mutex<Option<Listener>>,
    /// Where the S3 server listens (stable across restarts).
    pub s3_addr: SocketAddr,
    /// Where the Kubernetes API listens (stable across restarts).
    pub kube_addr: SocketAddr,
}

impl FakeSet {
    /// Create the stores and start both fakes on 127.0.0.1.
    pub async fn start(
        s3_config: S3Config,
        kube_seed: u64,
        s3_gate: Gate,
        kube_gate: Gate,
    ) -> anyhow::Result<Arc<Self>> {
        Self::start_on(
            s3_config,
            kube_seed,
            s3_gate,
            kube_gate,
            (loopback(), loopback()),
        )
        .await
    }

    /// Like [`FakeSet::start`] on given addresses (`serve --ports`; port 0 = any).
    pub async fn start_on(
        s3_config: S3Config,
        kube_seed: u64,
        s3_gate: Gate,
        kube_gate: Gate,
        (s3_addr, kube_addr): (SocketAddr, SocketAddr),
    ) -> anyhow::Result<Arc<Self>> {
        // In memory: every restart the lab does is in-process, so the state
        // only has to outlive the fake, not the process (and a store per run
        // on disk was a sled database opened and torn down per explored case).
        let s3_store = Arc::new(MemStore::default());
        let kube_store = Arc::new(MemStore::default());
        let s3 = Self::new_s3(&s3_store, &s3_config, &s3_gate)?;
        let kube_access = Access::default();
        let kube = Self::new_kube(&kube_store, kube_seed, &kube_gate, &kube_access)?;
        let s3_listener = s3
            .serve(s3_addr)
            .await
            .with_context(|| format!("binding the S3 fake on {s3_addr}"))?;
        let kube_tls = TlsIdentity::generate()?;
        let kube_listener = kube
            .serve_tls(kube_addr, &kube_tls)
            .await
            .with_context(|| format!("binding the Kubernetes fake on {kube_addr}"))?;
        Ok(Arc::new(Self {
            s3_addr: s3_listener.addr,
            kube_addr: kube_listener.addr,
            s3_store,
            kube_store,
            s3_config,
            kube_seed,
            s3_gate,
            kube_gate,
            kube_access,
            kube_tls,
            s3: RwLock::new(s3),
            kube: Arc::new(RwLock::new(kube)),
            s3_listener: tokio::sync::Mutex::new(Some(s3_listener)),
            kube_listener: tokio::sync::Mutex::new(Some(kube_listener)),
        }))
    }

    fn new_s3(store: &Arc<MemStore>, config: &S3Config, gate: &Gate) -> anyhow::Result<S3Fake> {
        let store: Arc<dyn Store> = store.clone();
        S3Fake::new(store, gate.clone(), config.clone())
            .map_err(|e| anyhow!("starting the S3 fake: {e}"))
    }

    fn new_kube(
        store: &Arc<MemStore>,
        seed: u64,
        gate: &Gate,
        access: &Access,
    ) -> anyhow::Result<KubeFake> {
        let store: Arc<dyn Store> = store.clone();
        KubeFake::with_access(store, gate.clone(), seed, access.clone())
            .map_err(|e| anyhow!("starting the Kubernetes fake: {e}"))
    }

    /// A new S3 fake over this set's store (what a restart starts).
    fn s3_from_store(&self) -> anyhow::Result<S3Fake> {
        Self::new_s3(&self.s3_store, &self.s3_config, &self.s3_gate)
    }

    /// A new Kubernetes fake over this set's store.
    fn kube_from_store(&self) -> anyhow::Result<KubeFake> {
        let (store, gate, access) = (&self.kube_store, &self.kube_gate, &self.kube_access);
        Self::new_kube(store, self.kube_seed, gate, access)
    }

    /// The S3 fake as it is now.
    pub fn s3(&self) -> S3Fake {
        self.s3.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The Kubernetes fake as it is now.
    pub fn kube(&self) -> KubeFake {
        self.kube.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The slot the sidecar reads the Kubernetes fake from.
    pub fn kube_slot(&self) -> KubeSlot {
        self.kube.clone()
    }

    /// `http://127.0.0.1:PORT` of the S3 server.
    pub fn s3_url(&self) -> String {
        format!("http://{}", self.s3_addr)
    }

    /// The CA that signed the Kubernetes API's certificate, PEM.
    pub fn kube_ca_pem(&self) -> &str {
        self.kube_tls.ca_pem()
    }

    /// A bearer token the Kubernetes API accepts as `grant`'s user.
    pub fn kube_token(&self, grant: Grant) -> Secret {
        Secret::new(self.kube_access.issue(grant))
    }

    /// `https://127.0.0.1:PORT` of the Kubernetes API.
    pub fn kube_url(&self) -> String {
        format!("https://{}", self.kube_addr)
    }

    /// Restart a fake as a process restart would: connections break, the
    /// in-memory instance is rebuilt from its store, the port stays.
    pub async fn restart(&self, c: Component) -> anyhow::Result<()> {
        match c {
            Component::S3 | Component::S3Admin => {
                let mut l = self.s3_listener.lock().await;
                if let Some(old) = l.take() {
                    old.stop().await;
                }
                let s3 = self.s3_from_store()?;
                *l = Some(bind_again(|a| s3.serve(a), self.s3_addr).await?);
                *self.s3.write().unwrap_or_else(|p| p.into_inner()) = s3;
            }
            Component::Kube => {
                let mut l = self.kube_listener.lock().await;
                if let Some(old) = l.take() {
                    old.stop().await;
                }
                let kube = self.kube_from_store()?;
                let tls = &self.kube_tls;
                *l = Some(bind_again(|a| kube.serve_tls(a, tls), self.kube_addr).await?);
                *self.kube.write().unwrap_or_else(|p| p.into_inner()) = kube;
            }
            other => return Err(anyhow!("{other} is not a fake that can restart")),
        }
        Ok(())
    }

    /// Stop both listeners.
    pub async fn stop(&self) {
        for l in [&self.s3_listener, &self.kube_listener] {
            stop(l).await;
        }
    }

    /// Stop a fake and let go of what it holds: for the end of a run, once
    /// everything it reads of that fake was read. Held until the lab
    /// stopped, the fakes' state was two fifths of a 10⁴-grant run's peak,
    /// which the end's probes (the S3 fake only), labelling and judging need
    /// none of. What is left is a fake over an empty store, not serving.
    pub async fn release(&self, c: Component) -> anyhow::Result<()> {
        let old: Box<dyn std::any::Any + Send> = match c {
            Component::S3 | Component::S3Admin => {
                stop(&self.s3_listener).await;
                let taken = self.s3_store.take();
                let s3 = self.s3_from_store()?;
                let mut slot = self.s3.write().unwrap_or_else(|p| p.into_inner());
                Box::new((taken, std::mem::replace(&mut *slot, s3)))
            }
            Component::Kube => {
                stop(&self.kube_listener).await;
                let taken = self.kube_store.take();
                let kube = self.kube_from_store()?;
                let mut slot = self.kube.write().unwrap_or_else(|p| p.into_inner());
                Box::new((taken, std::mem::replace(&mut *slot, kube)))
            }
            other => return Err(anyhow!("{other} is not a fake this lab holds")),
        };
        // The old instance is let go here, unless a reader still holds it.
        // Dropped on a runtime worker, where the requests that built it were
        // served: freed there, its pages can go back to the OS (see
        // crate::alloc::collect); freed from this thread, they stayed resident.
        let freed = tokio::spawn(async move {
            drop(old);
            crate::alloc::collect();
        });
        freed.await.context("letting go of a fake's state")
    }
}

/// Stop a listener, if it still serves.
async fn stop(listener: &tokio::sync::Mutex<Option<Listener>>) {
    if let Some(l) = listener.lock().await.take() {
        l.stop().await;
    }
}

/// Rebind the same port; the old socket may take a moment to go.
async fn bind_again<F, Fut>(serve: F, addr: SocketAddr) -> anyhow::Result<Listener>
where
    F: Fn(SocketAddr) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<Listener>>,
{
    let mut last = None;
    for _ in 0..100 {
        match serve(addr).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Err(anyhow!(
        "could not listen on {addr} again after a restart: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use drivelab_fakes::clock::SimClock;
    use drivelab_fakes::history::History;
    use drivelab_fakes::kube::Kind;
    use serde_json::json;

    use super::*;

    /// What the end of a run relies on: released, a fake serves nothing and
    /// holds nothing that was written (the old instance dropped, the store
    /// emptied), and the other fake goes on serving until it is released.
    #[tokio::test]
    async fn released_fakes_serve_nothing_and_hold_nothing() {
        let gate = || Gate::new(History::new(SimClock::new()));
        let config = S3Config {
            admin_access_key: "admin".into(),
            admin_secret_key: "admin-secret-0123456789".into(),
            region: String::new(),
            backend: Default::default(),
        };
        let fakes = FakeSet::start(config.clone(), 7, gate(), gate())
            .await
            .unwrap();
        let kube = fakes.kube();
        kube.declare_namespace("ns").unwrap();
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "namespace": "ns"}, "data": {}});
        kube.create(Kind::Secret, secret).unwrap();
        drop(kube);
        assert!(!fakes.kube_store.scan("").unwrap().is_empty());

        fakes.release(Component::Kube).await.unwrap();
        let s3_serves = tokio::net::TcpStream::connect(fakes.s3_addr).await.is_ok();
        assert!(s3_serves, "the S3 fake stopped with the kube fake");
        fakes.release(Component::S3).await.unwrap();
        for addr in [fakes.s3_addr, fakes.kube_addr] {
            let refused = tokio::net::TcpStream::connect(addr).await;
            assert!(refused.is_err(), "{addr} still accepts connections");
        }
        // As a fake set just started: what a fake writes when it starts, no more.
        let fresh = FakeSet::start(config, 7, gate(), gate()).await.unwrap();
        let keys = |s: &MemStore| -> Vec<String> {
            s.scan("").unwrap().into_iter().map(|(k, _)| k).collect()
        };
        assert_eq!(keys(&fakes.kube_store), keys(&fresh.kube_store));
        assert_eq!(keys(&fakes.s3_store), keys(&fresh.s3_store));
        let gone = fakes.kube().get(Kind::Secret, Some("ns"), "s").unwrap();
        assert!(gone.is_none());
        assert!(fakes.s3().users().is_empty() && fakes.s3().buckets().is_empty());
    }
}

//! The driver under test, run in-process on a runtime of its own so that a
//! crash is real: shutting that runtime down drops every task the driver has
//! (its gRPC server, in-flight handlers, client connections) at once.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, Context};
use futures_util::future::BoxFuture;

use crate::scenario::Mutant;

/// How a linked-in driver serves: given its socket, a future that runs its gRPC server.
pub type ServeFn = std::sync::Arc<
    dyn Fn(PathBuf) -> BoxFuture<'static, anyhow::Result<()>> + Send + Sync + 'static,
>;

/// A reference driver linked into the lab.
pub struct InProcessDriver {
    serve: ServeFn,
    socket: PathBuf,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

impl InProcessDriver {
    /// A driver that will serve on `socket` once started.
    pub fn new(serve: ServeFn, socket: &Path) -> Self {
        Self {
            serve,
            socket: socket.to_path_buf(),
            runtime: Mutex::new(None),
        }
    }

    /// The reference COSI driver.
    pub fn cosi(config: cosi_s3::DriverConfig, socket: &Path) -> Self {
        let serve: ServeFn = std::sync::Arc::new(move |socket: PathBuf| {
            let config = config.clone();
            Box::pin(
                async move { cosi_s3::serve_unix(config, &socket, std::future::pending()).await },
            )
        });
        Self::new(serve, socket)
    }

    /// The reference COSI driver reading its wall clock from `clock` (a lab's virtual one).
    pub fn cosi_clocked(
        config: cosi_s3::DriverConfig,
        socket: &Path,
        clock: cosi_s3::service::WallClock,
    ) -> Self {
        let serve: ServeFn = std::sync::Arc::new(move |socket: PathBuf| {
            let config = config.clone();
            let clock = clock.clone();
            Box::pin(async move {
                let driver = cosi_s3::CosiS3Driver::new(config).await?;
                driver.set_wall_clock(clock);
                cosi_s3::serve_driver(driver, &socket, std::future::pending()).await
            })
        });
        Self::new(serve, socket)
    }

    /// The reference BOSH CSI driver whose session tokens expire on `clock`
    /// (milliseconds of virtual time), as its snapshot-metadata service needs.
    pub fn bosh_csi_clocked(
        config: bosh_csi::DriverConfig,
        socket: &Path,
        clock: bosh_csi::snapshot_metadata::ClockFn,
    ) -> Self {
        let serve: ServeFn = std::sync::Arc::new(move |socket: PathBuf| {
            let config = config.clone();
            let clock = clock.clone();
            Box::pin(async move {
                let driver = bosh_csi::BoshCsiDriver::new(config).map_err(anyhow::Error::msg)?;
                driver.set_clock(clock);
                bosh_csi::serve_driver(driver, &socket, std::future::pending()).await
            })
        });
        Self::new(serve, socket)
    }

    /// The reference BOSH CSI driver (controller or node plugin, by `config.mode`).
    pub fn bosh_csi(config: bosh_csi::DriverConfig, socket: &Path) -> Self {
        let serve: ServeFn = std::sync::Arc::new(move |socket: PathBuf| {
            let config = config.clone();
            Box::pin(
                async move { bosh_csi::serve_unix(config, &socket, std::future::pending()).await },
            )
        });
        Self::new(serve, socket)
    }

    /// The reference CSI driver with its own backend (controller or node, by `config.mode`).
    pub fn hostpath(config: hostpath_csi::DriverConfig, socket: &Path) -> Self {
        let serve: ServeFn = std::sync::Arc::new(move |socket: PathBuf| {
            let config = config.clone();
            Box::pin(async move {
                hostpath_csi::serve_unix(config, &socket, std::future::pending()).await
            })
        });
        Self::new(serve, socket)
    }

    /// Start it (on a fresh runtime) and wait until its socket accepts connections.
    pub async fn start(&self) -> anyhow::Result<()> {
        // The driver's lines are its run's evidence (no-secret-leak reads them).
        let log = crate::logcap::current();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("driver")
            .on_thread_start(move || crate::logcap::adopt(log.clone()))
            .enable_all()
            .build()
            .context("starting the driver's runtime")?;
        let task = rt.spawn((self.serve)(self.socket.clone()));
        // Never drop a runtime in async context (it panics): a runtime still
        // here is shut down in the background instead.
        let old = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(rt);
        if let Some(old) = old {
            old.shutdown_background();
        }
        // Real time: the driver binds its socket on its own schedule.
        for _ in 0..2000 {
            if tokio::net::UnixStream::connect(&self.socket).await.is_ok() {
                return Ok(());
            }
            if task.is_finished() {
                let why = match task.await {
                    Ok(Err(e)) => format!("{e:#}"),
                    Ok(Ok(())) => "it returned".to_string(),
                    Err(e) => e.to_string(),
                };
                return Err(anyhow!(
                    "the driver exited before opening its socket {}: {why}",
                    self.socket.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(anyhow!(
            "the driver did not open its socket {} within 20s",
            self.socket.display()
        ))
    }

    /// Kill every task of the driver now.
    pub fn kill(&self) {
        if let Some(rt) = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            rt.shutdown_background();
        }
    }

    /// Kill every task of the driver and wait until they are all gone, so none
    /// of them can still act on what happens next.
    pub async fn kill_and_wait(&self) {
        let rt = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(rt) = rt {
            let _ =
                tokio::task::spawn_blocking(move || rt.shutdown_timeout(Duration::from_secs(5)))
                    .await;
        }
    }

    /// Kill it and start it again from its persisted state (its checkpoints).
    pub async fn crash_and_restart(&self) -> anyhow::Result<()> {
        self.kill();
        // The old runtime shuts down in the background and may still accept on
        // the old socket for a moment; unlink it so "connectable" below can only
        // mean the new driver is up.
        let _ = std::fs::remove_file(&self.socket);
        self.start().await
    }
}

impl Drop for InProcessDriver {
    fn drop(&mut self) {
        // Never drop a runtime from async context (it would block); shut it down instead.
        self.kill();
    }
}

/// A crash fault's work, written once for every lab: kill the driver and
/// start it again from its persisted state. Holds everything weakly: the
/// gates own the hook, the hook owns the lab's control, which owns this.
pub(crate) struct DriverCrash {
    /// The driver (a COSI driver, a CSI controller).
    pub driver: std::sync::Weak<Driver>,
    /// One crash-and-restart at a time: two crash faults hit in one concurrent
    /// block used to restart the driver twice at once, and the loser dropped
    /// the winner's runtime inside async code (a panic, then a 20 s wait for a
    /// socket the other restart had unlinked).
    pub crashing: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// The run's history.
    pub history: drivelab_fakes::history::History,
    /// The fault hook (maintenance, requests held at gates, callers settled).
    pub hook: std::sync::Weak<super::hook::LabHook>,
    /// What the history calls the driver ("driver", "CSI controller").
    pub what: &'static str,
}

impl DriverCrash {
    /// A crash fault fired during call `during`: record it, kill the driver,
    /// let the requests held for it die, wait for its callers to see it die,
    /// and bring it back. Spawned and awaited: the caller may run inside a
    /// request of the very driver being killed, whose future the server drops
    /// half way, and the restart must finish regardless.
    pub(crate) async fn crash(&self, during: drivelab_fakes::history::CallId) {
        use drivelab_fakes::history::{Component, EventKind};
        let busy = self.hook.upgrade().map(|h| h.maintenance());
        self.history.record(EventKind::Fault {
            call: None,
            fault: "crash_driver".into(),
            detail: format!("{} killed (all tasks), restarting", self.what),
        });
        let Some(driver) = self.driver.upgrade() else {
            return;
        };
        // After the record: a crash waiting for this call's caller may go on
        // once it is marked, and the history then already says why.
        if let Some(h) = self.hook.upgrade() {
            h.crash_begun(during);
        }
        let held = self.hook.upgrade().map(|h| h.driver_crashing());
        let settled = super::hook::LabHook::callers_settled(self.hook.clone(), during);
        let (crashing, history, what) = (self.crashing.clone(), self.history.clone(), self.what);
        let hook = self.hook.clone();
        let done = tokio::spawn(async move {
            let _one_at_a_time = crashing.lock().await;
            driver.kill_and_wait().await;
            drop(held);
            if !callers_saw_the_crash(&*settled).await {
                // Visible: a wait that ran out is real-time luck in the history.
                history.record(EventKind::Note {
                    component: Component::Lab,
                    text: format!(
                        "callers of the killed {what} had not all seen it die after {} s; restarting it anyway",
                        CALLERS_NOTICE.as_secs()
                    ),
                });
            }
            if let Err(e) = driver.crash_and_restart().await {
                history.record(EventKind::Note {
                    component: Component::Lab,
                    text: format!("{what} did not come back: {e:#}"),
                });
            }
            if let Some(h) = hook.upgrade() {
                h.crash_done(during);
            }
            drop(busy);
        });
        let _ = done.await;
    }
}

/// Real time a crash waits for the killed driver's callers to record their
/// failed calls. Only a caller that never notices a dead connection waits it out.
const CALLERS_NOTICE: Duration = Duration::from_secs(2);

/// Wait until the killed driver's callers have all seen it die (`settled`)
/// before it comes back: the restarted driver's start-up calls (the CSI
/// controller fetches a UAA token) otherwise raced those failed replies in
/// the history, which then differed run to run.
/// False if [`CALLERS_NOTICE`] ran out first.
async fn callers_saw_the_crash(settled: &(dyn Fn() -> bool + Send + Sync)) -> bool {
    let deadline = std::time::Instant::now() + CALLERS_NOTICE;
    while !settled() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    true
}

/// The driver under test, however it ships. The engine only talks to this.
pub enum Driver {
    /// Linked in (`builtin:`), on a runtime of its own.
    InProcess(InProcessDriver),
    /// A spawned program (`command:`).
    Process(super::external::ProcessDriver),
    /// A container image (`image:`).
    #[cfg(feature = "containers")]
    Container(super::external::ContainerDriver),
}

impl Driver {
    /// Whether virtual time the lab lets pass passes for the driver's wall
    /// clock too: linked in, it reads the lab's clock; spawned, only through
    /// libfaketime; a container's clock is the host's.
    pub fn wall_clock_follows(&self) -> bool {
        match self {
            Driver::InProcess(_) => true,
            Driver::Process(p) => p.clock_follows(),
            #[cfg(feature = "containers")]
            Driver::Container(_) => false,
        }
    }

    /// Build the driver `spec` declares; nothing runs until [`Driver::start`].
    pub fn new(
        spec: &crate::scenario::DriverSpec,
        mutants: &[Mutant],
        params: &super::external::DriverParams,
        history: drivelab_fakes::history::History,
    ) -> anyhow::Result<Self> {
        use crate::scenario::{BuiltinDriver, DriverLaunch};
        if spec.protocol() != params.protocol {
            return Err(anyhow!(
                "{} speaks {}, but this lab drives {} drivers",
                spec.describe(),
                spec.protocol().name(),
                params.protocol.name()
            ));
        }
        match &spec.launch {
            DriverLaunch::Builtin(BuiltinDriver::CosiS3) => {
                let file = |name: &str| params.host_dir.join(name).display().to_string();
                let config = cosi_s3::DriverConfig {
                    kube_url: params.get("kube_url").to_string(),
                    kube_token_file: file(super::external::KUBE_TOKEN_FILE),
                    kube_ca_file: file(super::external::KUBE_CA_FILE),
                    state_namespace: params.get("namespace").to_string(),
                    mutants: Mutant::cosi(mutants),
                    policy_layout: spec.policy_layout.unwrap_or_default(),
                    secret_length: 0,
                };
                Ok(Driver::InProcess(match &params.frozen_wall {
                    // The in-process driver's wall clock is the lab's virtual one.
                    Some(frozen) => {
                        let frozen = frozen.clone();
                        InProcessDriver::cosi_clocked(
                            config,
                            &params.host_socket,
                            std::sync::Arc::new(move || frozen.virtual_now()),
                        )
                    }
                    None => InProcessDriver::cosi(config, &params.host_socket),
                }))
            }
            DriverLaunch::Builtin(b @ (BuiltinDriver::BoshCsi | BuiltinDriver::HostpathCsi)) => {
                Err(anyhow!(
                    "the linked-in {} is built by the CSI lab with its role's config, not here",
                    b.name()
                ))
            }
            _ => Self::external(spec, mutants, params, history),
        }
    }

    /// The `command:` or `image:` driver `spec` declares, serving on
    /// `params.host_socket` once started. Never a linked-in one: a spec that
    /// names a builtin is an error here, so no caller can fall back to it.
    pub fn external(
        spec: &crate::scenario::DriverSpec,
        mutants: &[Mutant],
        params: &super::external::DriverParams,
        history: drivelab_fakes::history::History,
    ) -> anyhow::Result<Self> {
        use crate::scenario::DriverLaunch;
        if spec.protocol() != params.protocol {
            return Err(anyhow!(
                "{} speaks {}, but this scenario drives a {} driver (set `protocol: {}` if it speaks that)",
                spec.describe(),
                spec.protocol().name(),
                params.protocol.name(),
                params.protocol.name()
            ));
        }
        if !mutants.is_empty() {
            return Err(anyhow!(
                "--mutant/mutants are a builtin-only feature (the seeded bugs live in the linked-in reference driver), but the driver is {}",
                spec.describe()
            ));
        }
        match &spec.launch {
            DriverLaunch::Builtin(b) => Err(anyhow!(
                "{} is linked in, not an external driver",
                b.name()
            )),
            DriverLaunch::Command(ext) => Ok(Driver::Process(super::external::ProcessDriver::new(
                ext,
                params,
                spec.start_timeout,
                history,
            ))),
            #[cfg(feature = "containers")]
            DriverLaunch::Image(ext) => Ok(Driver::Container(
                super::external::ContainerDriver::new(ext, params, spec.start_timeout, history),
            )),
            #[cfg(not(feature = "containers"))]
            DriverLaunch::Image(_) => Err(anyhow!(
                "{}: this drivelab was built without the `containers` feature (build with default features)",
                spec.describe()
            )),
        }
    }

    /// Start it and wait until it serves on its socket.
    pub async fn start(&self) -> anyhow::Result<()> {
        match self {
            Driver::InProcess(d) => d.start().await,
            Driver::Process(d) => d.start().await,
            #[cfg(feature = "containers")]
            Driver::Container(d) => d.start().await,
        }
    }

    /// Kill it and wait until nothing of it can act any more.
    pub async fn kill_and_wait(&self) {
        match self {
            Driver::InProcess(d) => d.kill_and_wait().await,
            Driver::Process(d) => d.kill_and_wait().await,
            #[cfg(feature = "containers")]
            Driver::Container(d) => d.kill_and_wait().await,
        }
    }

    /// Kill it and start it again from its persisted state.
    pub async fn crash_and_restart(&self) -> anyhow::Result<()> {
        match self {
            Driver::InProcess(d) => d.crash_and_restart().await,
            Driver::Process(d) => d.crash_and_restart().await,
            #[cfg(feature = "containers")]
            Driver::Container(d) => d.crash_and_restart().await,
        }
    }

    /// Stop it for good at the end of a run.
    pub async fn stop(&self) {
        match self {
            Driver::InProcess(d) => d.kill(),
            Driver::Process(d) => d.kill_and_wait().await,
            #[cfg(feature = "containers")]
            Driver::Container(d) => d.remove().await,
        }
    }

    /// What an external driver printed, unredacted: only for the no-secret-leak check.
    pub fn output(&self) -> String {
        match self {
            Driver::InProcess(_) => String::new(),
            Driver::Process(d) => d.output(),
            #[cfg(feature = "containers")]
            Driver::Container(d) => d.output(),
        }
    }
}

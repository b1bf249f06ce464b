//! Drivers the lab does not link: a spawned program (own process group,
//! SIGKILLed for `crash_driver`) or a container image (killed and started
//! again). Their stdout/stderr become history notes, redacted; readiness is a
//! DriverGetInfo (COSI) or GetPluginInfo (CSI) that answers on their socket within the start timeout.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::anyhow;
use drivelab_fakes::clock::{SimClock, VTime};
use drivelab_fakes::history::{Component, EventKind, History};
use drivelab_fakes::secret::Secret;
use drivelab_proto::cosi::identity_client::IdentityClient;
use drivelab_proto::cosi::DriverGetInfoRequest;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use crate::scenario::{driver::expand, DriverProtocol, ExternalDriver};

/// What the lab tells a driver: every placeholder's value, for one side of a
/// container boundary (host paths for a spawned program, in-container paths
/// for an image). Each system fills in its own placeholders.
#[derive(Clone)]
pub struct DriverParams {
    /// What the driver speaks: decides the readiness probe, the lab's
    /// environment variables and the container's socket directory.
    pub protocol: DriverProtocol,
    /// Directory of the socket on the host (bind-mounted into containers).
    pub host_dir: PathBuf,
    /// The socket on the host (what the lab dials).
    pub host_socket: PathBuf,
    /// The run directory, redacted as `<run-dir>` in everything captured.
    pub run_dir: PathBuf,
    /// Placeholder values that do not depend on where the socket is seen from.
    values: BTreeMap<&'static str, String>,
    /// Raw values replaced by labels in everything captured (secrets, endpoints).
    redact: Vec<(String, String)>,
    /// The lab's virtual clock, when a spawned driver's wall clock should
    /// follow it (see [`LabClock`]).
    pub clock: Option<SimClock>,
    /// A wall clock frozen at one instant, shared by labs that must see the
    /// same time (a twin; see [`FrozenWall`]).
    pub frozen_wall: Option<FrozenWall>,
}

/// The wall clock two labs share so that a driver's time-seeded values repeat
/// in both: a spawned driver's realtime clock is frozen at `at` (libfaketime,
/// absolute form); the in-process driver reads `at` plus the lab's virtual time.
#[derive(Clone, Debug)]
pub struct FrozenWall {
    /// The instant (whole seconds) every driver process is frozen at.
    pub at: std::time::SystemTime,
    /// The lab's virtual clock (the in-process driver's time moves with it).
    pub clock: SimClock,
}

impl FrozenWall {
    /// The instant now, to the whole second (libfaketime's absolute form has no fraction).
    pub fn now_whole_second() -> std::time::SystemTime {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        std::time::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// What the in-process driver reads: `at` plus the virtual time so far.
    pub fn virtual_now(&self) -> std::time::SystemTime {
        self.at + Duration::from_millis(self.clock.now().0)
    }

    /// `FAKETIME` for `at`: "YYYY-MM-DD hh:mm:ss" (UTC, with `TZ=UTC`), which
    /// libfaketime holds still rather than letting it tick.
    pub fn faketime_value(&self) -> String {
        let secs = self
            .at
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let (days, rem) = (secs / 86_400, secs % 86_400);
        let (y, m, d) = civil_from_days(days as i64);
        format!(
            "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60
        )
    }

    /// Environment freezing a spawned driver's realtime clock at `at`;
    /// `None` (and a history note) without libfaketime.
    fn environment(&self, history: &History) -> Option<Vec<(String, String)>> {
        let Some(lib) = LabClock::library() else {
            history.record(EventKind::Note {
                component: Component::Lab,
                text: "the driver's wall clock is not frozen: libfaketime not found (install Debian's faketime, or set DRIVELAB_LIBFAKETIME), so a twin lab cannot catch secrets seeded from the time".into(),
            });
            return None;
        };
        Some(vec![
            ("LD_PRELOAD".into(), lib.display().to_string()),
            ("FAKETIME".into(), self.faketime_value()),
            ("TZ".into(), "UTC".into()),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ])
    }
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

impl DriverParams {
    /// Params for a driver serving on `host_dir/socket_name`.
    pub fn new(
        protocol: DriverProtocol,
        host_dir: PathBuf,
        socket_name: &str,
        run_dir: PathBuf,
    ) -> Self {
        DriverParams {
            protocol,
            host_socket: host_dir.join(socket_name),
            host_dir,
            run_dir,
            values: BTreeMap::new(),
            redact: Vec::new(),
            clock: None,
            frozen_wall: None,
        }
    }

    /// Set placeholder `name`.
    pub fn set(&mut self, name: &'static str, value: impl Into<String>) -> &mut Self {
        self.values.insert(name, value.into());
        self
    }

    /// Placeholder `name`'s value (empty when unset).
    pub fn get(&self, name: &str) -> &str {
        self.values.get(name).map_or("", String::as_str)
    }

    /// Set placeholder `name` to a value shown as `label` in captured output.
    pub fn set_labelled(
        &mut self,
        name: &'static str,
        value: impl Into<String>,
        label: &str,
    ) -> &mut Self {
        let value = value.into();
        self.redact.push((value.clone(), label.to_string()));
        self.set(name, value)
    }

    /// Set placeholder `name` to a secret, redacted as `label` everywhere.
    pub fn set_secret(&mut self, name: &'static str, secret: &Secret, label: &str) -> &mut Self {
        self.set_labelled(name, secret.expose(), label)
    }

    /// Where the socket directory is inside an `image:` driver's container.
    #[cfg(feature = "containers")]
    pub fn container_dir(&self) -> &'static str {
        match self.protocol {
            DriverProtocol::Cosi => CONTAINER_SOCKET_DIR,
            DriverProtocol::Csi => CSI_CONTAINER_SOCKET_DIR,
        }
    }

    /// Placeholder values, with paths as the driver sees them under `dir`.
    pub fn values(&self, dir: &Path) -> BTreeMap<&'static str, String> {
        let name = self.host_socket.file_name().unwrap_or_default();
        let socket = dir.join(name).display().to_string();
        let mut v = self.values.clone();
        // A placeholder this process has no value for (the other role's) is
        // empty, never left as `{name}` for the driver to choke on.
        for (name, _) in crate::scenario::driver::placeholders(self.protocol) {
            v.entry(name).or_default();
        }
        v.insert("endpoint", format!("unix://{socket}"));
        v.insert("csi_endpoint", format!("unix://{socket}"));
        v.insert("socket", socket);
        v.insert("socket_dir", dir.display().to_string());
        if self.protocol == DriverProtocol::Cosi {
            let file = |name: &str| dir.join(name).display().to_string();
            v.insert("kubeconfig", file(KUBECONFIG_FILE));
            v.insert("kube_token_file", file(KUBE_TOKEN_FILE));
            v.insert("kube_ca_file", file(KUBE_CA_FILE));
        }
        v
    }

    /// argv and environment of `ext` with placeholders filled in; the lab's own
    /// variables (COSI: KUBECONFIG and COSI_ENDPOINT; CSI: CSI_ENDPOINT; NO_COLOR) first,
    /// `env:` over them.
    pub fn expand(&self, ext: &ExternalDriver, dir: &Path) -> (Vec<String>, Vec<(String, String)>) {
        let values = self.values(dir);
        let argv = ext.program.iter().map(|a| expand(a, &values)).collect();
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        if let Some(k) = values.get("kubeconfig") {
            env.insert("KUBECONFIG".into(), k.clone());
        }
        let endpoint_var = match self.protocol {
            DriverProtocol::Cosi => "COSI_ENDPOINT",
            DriverProtocol::Csi => "CSI_ENDPOINT",
        };
        env.insert(endpoint_var.into(), values["endpoint"].clone());
        env.insert("NO_COLOR".into(), "1".into());
        for (k, v) in &ext.env {
            env.insert(k.clone(), expand(v, &values));
        }
        (argv, env.into_iter().collect())
    }

    fn redactor(&self) -> Redactor {
        let mut pairs = self.redact.clone();
        pairs.push((self.run_dir.display().to_string(), "<run-dir>".to_string()));
        pairs.retain(|(raw, _)| !raw.is_empty());
        // Longest first: a URL must not be half-replaced by a shorter value inside it.
        pairs.sort_by_key(|(raw, _)| std::cmp::Reverse(raw.len()));
        Redactor { pairs }
    }
}

/// Where an `image:` COSI driver finds its socket directory (the COSI convention).
#[cfg(feature = "containers")]
pub const CONTAINER_SOCKET_DIR: &str = "/var/lib/cosi";
/// Where an `image:` CSI driver finds its socket directory (a plugin's `/csi` mount).
#[cfg(feature = "containers")]
pub const CSI_CONTAINER_SOCKET_DIR: &str = "/csi";

/// A spawned driver's wall clock tied to the lab's virtual clock: libfaketime
/// (LD_PRELOAD) reads an offset file the lab rewrites on every advance, so
/// time the lab lets pass (a token's TTL, a sidecar's back-off) passes for the
/// driver too. Only the realtime clock moves; monotonic timers stay real.
/// Needs a dynamically linked driver and libfaketime on the host.
pub struct LabClock;

/// Where libfaketime may be (Debian's `faketime` package), unless
/// `DRIVELAB_LIBFAKETIME` names it. The MT build is for threaded programs.
const LIBFAKETIME: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
    "/usr/local/lib/faketime/libfaketimeMT.so.1",
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
];

impl LabClock {
    /// The libfaketime library to preload, if there is one.
    pub fn library() -> Option<PathBuf> {
        if let Ok(p) = std::env::var("DRIVELAB_LIBFAKETIME") {
            return Some(PathBuf::from(p)).filter(|p| p.exists());
        }
        LIBFAKETIME.iter().map(PathBuf::from).find(|p| p.exists())
    }

    /// Environment that makes a spawned process's wall clock follow `clock`
    /// through `file`, and the watcher that keeps `file` current; `None` (and
    /// a history note saying what the driver will not see) without libfaketime.
    fn environment(
        clock: &SimClock,
        file: &Path,
        history: &History,
    ) -> Option<Vec<(String, String)>> {
        let Some(lib) = Self::library() else {
            history.record(EventKind::Note {
                component: Component::Lab,
                text: "the driver's wall clock is the real one: libfaketime not found (install Debian's faketime, or set DRIVELAB_LIBFAKETIME), so virtual time the lab lets pass (token lifetimes, back-offs) does not pass for the driver".into(),
            });
            return None;
        };
        let path = file.to_path_buf();
        clock.watch(Box::new(move |t: VTime| {
            // Write then rename: a reader never sees a half-written offset.
            let tmp = path.with_extension("tmp");
            let text = format!("+{}.{:03}\n", t.0 / 1000, t.0 % 1000);
            if std::fs::write(&tmp, text).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }));
        let mut preload = lib.display().to_string();
        if let Ok(old) = std::env::var("LD_PRELOAD") {
            if !old.is_empty() {
                preload = format!("{preload}:{old}");
            }
        }
        Some(vec![
            ("LD_PRELOAD".into(), preload),
            ("FAKETIME_TIMESTAMP_FILE".into(), file.display().to_string()),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ])
    }
}

/// The files of a COSI driver's Kubernetes credentials in its socket
/// directory, as a pod's service-account mount holds them.
pub const KUBECONFIG_FILE: &str = "kubeconfig";
/// The bearer token (`{kube_token_file}`).
pub const KUBE_TOKEN_FILE: &str = "token";
/// The CA the API's certificate is signed by (`{kube_ca_file}`).
pub const KUBE_CA_FILE: &str = "ca.crt";

/// Write a driver's Kubernetes credentials into `dir`: a kubeconfig for
/// `server` (URL, CA) in `namespace`, its bearer `token`, and the CA.
pub fn write_kube_credentials(
    dir: &Path,
    server: (&str, &str),
    namespace: &str,
    token: &Secret,
) -> std::io::Result<()> {
    write_kubeconfig(&dir.join(KUBECONFIG_FILE), server, namespace, token)?;
    write_private(&dir.join(KUBE_TOKEN_FILE), token.expose())?;
    std::fs::write(dir.join(KUBE_CA_FILE), server.1)
}

/// Write a kubeconfig for the fake Kubernetes API at `kube_url` (https,
/// trusting `ca_pem`) with one context, `drivelab`, whose user authenticates
/// with bearer `token`. The file holds a secret, so only its owner may read it.
pub fn write_kubeconfig(
    path: &Path,
    (kube_url, ca_pem): (&str, &str),
    namespace: &str,
    token: &Secret,
) -> std::io::Result<()> {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let text = format!(
        "apiVersion: v1\nkind: Config\npreferences: {{}}\nclusters:\n- name: drivelab\n  cluster:\n    server: {kube_url}\n    certificate-authority-data: {ca}\nusers:\n- name: drivelab\n  user:\n    token: {}\ncontexts:\n- name: drivelab\n  context:\n    cluster: drivelab\n    user: drivelab\n    namespace: {namespace}\ncurrent-context: drivelab\n",
        token.expose()
    );
    write_private(path, &text)
}

/// Write `text` to a new file only its owner may read (a token, a kubeconfig).
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())
}

/// Replaces known secrets, paths and endpoints with labels.
#[derive(Clone, Default)]
struct Redactor {
    pairs: Vec<(String, String)>,
}

impl Redactor {
    fn apply(&self, s: &str) -> String {
        let mut out = s.to_string();
        for (raw, label) in &self.pairs {
            if out.contains(raw.as_str()) {
                out = out.replace(raw.as_str(), label);
            }
        }
        out
    }
}

/// Lines kept for error messages and the leak check (older ones are dropped).
const KEEP_LINES: usize = 2000;
/// Lines of output quoted in a start failure.
const QUOTE_LINES: usize = 20;
/// Lines per stream that become history notes as they come; a driver that
/// floods its logs must not grow the history (and the report) without bound.
pub const HEAD_LINES: usize = 200;
/// Lines per stream kept past the head, the newest, noted when the stream
/// ends or the run collects the driver's output.
pub const TAIL_LINES: usize = 50;
/// Bytes kept of one line (a line with no newline in sight is cut here, so a
/// reader never buffers more than this).
pub const MAX_LINE_BYTES: usize = 4096;

/// Per-stream counts past the head: what was dropped, and the newest lines.
#[derive(Default)]
struct StreamTail {
    /// Lines seen on the stream (this process's life).
    lines: usize,
    /// Lines neither noted nor in `tail`.
    dropped: usize,
    /// The newest lines past the head, redacted.
    tail: VecDeque<String>,
}

/// What a driver printed: raw lines (for the no-secret-leak check) and redacted
/// notes in the history — the first [`HEAD_LINES`] of each stream, then a
/// count of the dropped ones and the last [`TAIL_LINES`].
pub struct Output {
    raw: Mutex<VecDeque<String>>,
    history: History,
    redactor: Redactor,
    /// Lines already seen per stream (a restarted container's log repeats them).
    seen: Mutex<BTreeMap<&'static str, usize>>,
    tails: Mutex<BTreeMap<&'static str, StreamTail>>,
}

impl Output {
    fn new(history: History, redactor: Redactor) -> Arc<Self> {
        Arc::new(Output {
            raw: Mutex::default(),
            history,
            redactor,
            seen: Mutex::default(),
            tails: Mutex::default(),
        })
    }

    fn line(&self, stream: &'static str, line: &str) {
        let line = strip_ansi(line.trim_end_matches(['\r', '\n']));
        {
            let mut raw = self.raw.lock().unwrap_or_else(|p| p.into_inner());
            if raw.len() == KEEP_LINES {
                raw.pop_front();
            }
            raw.push_back(format!("{stream}: {line}"));
        }
        let text = format!("{stream}: {}", self.redactor.apply(&line));
        let mut tails = self.tails.lock().unwrap_or_else(|p| p.into_inner());
        let t = tails.entry(stream).or_default();
        t.lines += 1;
        if t.lines <= HEAD_LINES {
            drop(tails);
            self.history.record(EventKind::Note {
                component: Component::Driver,
                text,
            });
            return;
        }
        if t.tail.len() == TAIL_LINES {
            t.tail.pop_front();
            t.dropped += 1;
        }
        t.tail.push_back(text);
    }

    /// Note what was held back past the head of each stream: how many lines
    /// were dropped, then the newest ones. Idempotent: held lines are noted once.
    pub fn note_held_back(&self) {
        let mut tails = self.tails.lock().unwrap_or_else(|p| p.into_inner());
        for (stream, t) in tails.iter_mut() {
            if t.dropped > 0 {
                self.history.record(EventKind::Note {
                    component: Component::Driver,
                    text: format!(
                        "{stream}: [{} lines dropped: the driver printed {} lines, the first {HEAD_LINES} and the last {} are kept]",
                        t.dropped,
                        t.lines,
                        t.tail.len()
                    ),
                });
                t.dropped = 0;
            }
            for text in t.tail.drain(..) {
                self.history.record(EventKind::Note {
                    component: Component::Driver,
                    text,
                });
            }
        }
    }

    /// Everything kept, unredacted (only for checks, never written out).
    pub fn raw_text(&self) -> String {
        let raw = self.raw.lock().unwrap_or_else(|p| p.into_inner());
        raw.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// The last lines, redacted, indented for an error message.
    fn tail(&self) -> String {
        let raw = self.raw.lock().unwrap_or_else(|p| p.into_inner());
        if raw.is_empty() {
            return "\n  (the driver printed nothing)".to_string();
        }
        let skip = raw.len().saturating_sub(QUOTE_LINES);
        let mut out = String::from("\n  last output:");
        for l in raw.iter().skip(skip) {
            out.push_str("\n    ");
            out.push_str(&self.redactor.apply(l));
        }
        out
    }

    /// Read `reader` line by line into this output; `skip` lines already seen.
    /// Reads as fast as the driver writes (never blocks it on a full pipe) and
    /// holds at most [`MAX_LINE_BYTES`] of a line.
    fn follow(
        self: &Arc<Self>,
        stream: &'static str,
        mut reader: impl AsyncBufRead + Send + Unpin + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        let skip = *me
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(stream)
            .unwrap_or(&0);
        me.tails
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(stream);
        tokio::spawn(async move {
            let mut n = 0usize;
            let mut line: Vec<u8> = Vec::new();
            let mut cut = 0usize;
            let mut emit = |line: &mut Vec<u8>, cut: &mut usize| {
                n += 1;
                if n > skip {
                    let mut text = String::from_utf8_lossy(line).into_owned();
                    if *cut > 0 {
                        text.push_str(&format!(" [… {cut} more bytes of this line dropped]"));
                    }
                    me.line(stream, &text);
                    *me.seen
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(stream)
                        .or_insert(0) = n;
                }
                line.clear();
                *cut = 0;
            };
            loop {
                let buf = match reader.fill_buf().await {
                    Ok([]) | Err(_) => break,
                    Ok(b) => b,
                };
                let (chunk, used, done) = match buf.iter().position(|&b| b == b'\n') {
                    Some(i) => (&buf[..i], i + 1, true),
                    None => (buf, buf.len(), false),
                };
                let room = MAX_LINE_BYTES.saturating_sub(line.len());
                line.extend_from_slice(&chunk[..chunk.len().min(room)]);
                cut += chunk.len().saturating_sub(room);
                reader.consume(used);
                if done {
                    emit(&mut line, &mut cut);
                }
            }
            // The pipe closed (the driver exited or was killed): a last
            // unterminated line counts, and what was held back is noted.
            if !line.is_empty() || cut > 0 {
                emit(&mut line, &mut cut);
            }
            me.note_held_back();
        })
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Dial `socket` until its identity RPC answers, `exited` says the driver is gone,
/// or `timeout` (real time) passes. Returns the reported name.
async fn wait_ready<F, Fut>(
    protocol: DriverProtocol,
    socket: &Path,
    shown: &str,
    timeout: Duration,
    output: &Output,
    mut exited: F,
) -> anyhow::Result<String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut accepted = false;
    loop {
        if let Some(status) = exited().await {
            // Give the readers a moment to take the last lines of a dying driver.
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Err(anyhow!(
                "the driver {status} before answering on its socket {shown}{}",
                output.tail()
            ));
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            let what = if accepted {
                format!(
                    "accepted connections on its socket {shown} but {} did not answer",
                    info_rpc(protocol)
                )
            } else {
                format!("did not open its socket {shown}")
            };
            return Err(anyhow!(
                "the driver {what} within {} (start_timeout){}",
                humantime(timeout),
                output.tail()
            ));
        }
        if tokio::net::UnixStream::connect(socket).await.is_ok() {
            accepted = true;
            let left = deadline - now;
            let call = plugin_name(protocol, socket);
            match tokio::time::timeout(left, call).await {
                Ok(Some(Ok(name))) => return Ok(name),
                Ok(Some(Err(status))) => {
                    return Err(anyhow!(
                        "the driver answered {} on {shown} with {:?}: {}{}",
                        info_rpc(protocol),
                        status.code(),
                        status.message(),
                        output.tail()
                    ))
                }
                Ok(None) | Err(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The identity RPC that says a driver of `protocol` is ready.
fn info_rpc(protocol: DriverProtocol) -> &'static str {
    match protocol {
        DriverProtocol::Cosi => "DriverGetInfo",
        DriverProtocol::Csi => "GetPluginInfo",
    }
}

/// Ask the driver on `socket` its name: `None` when it cannot be reached.
async fn plugin_name(
    protocol: DriverProtocol,
    socket: &Path,
) -> Option<Result<String, tonic::Status>> {
    let ch = drivelab_fakes::cosi_sidecar::connect_unix(socket)
        .await
        .ok()?;
    Some(match protocol {
        DriverProtocol::Cosi => IdentityClient::new(ch)
            .driver_get_info(DriverGetInfoRequest {})
            .await
            .map(|r| r.into_inner().name),
        DriverProtocol::Csi => drivelab_proto::csi::identity_client::IdentityClient::new(ch)
            .get_plugin_info(drivelab_proto::csi::GetPluginInfoRequest {})
            .await
            .map(|r| r.into_inner().name),
    })
}

fn humantime(d: Duration) -> String {
    if d.as_millis() % 1000 == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// A driver program the lab spawns in its own process group.
pub struct ProcessDriver {
    protocol: DriverProtocol,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    socket: PathBuf,
    shown_socket: String,
    start_timeout: Duration,
    child: Mutex<Option<tokio::process::Child>>,
    output: Arc<Output>,
    /// Whether its wall clock follows the lab's virtual clock (libfaketime).
    clock_follows: bool,
}

impl ProcessDriver {
    /// A driver for `ext`, serving on `params.host_socket` once started.
    pub fn new(
        ext: &ExternalDriver,
        params: &DriverParams,
        start_timeout: Duration,
        history: History,
    ) -> Self {
        let (argv, mut env) = params.expand(ext, &params.host_dir);
        let mut clock_follows = false;
        if let Some(clock) = &params.clock {
            let file = params.host_socket.with_extension("faketime");
            if let Some(vars) = LabClock::environment(clock, &file, &history) {
                // These win over `env:`: the clock is the lab's to set.
                env.retain(|(k, _)| !vars.iter().any(|(v, _)| v == k));
                env.extend(vars);
                clock_follows = true;
            }
        }
        if let Some(frozen) = &params.frozen_wall {
            if let Some(vars) = frozen.environment(&history) {
                env.retain(|(k, _)| !vars.iter().any(|(v, _)| v == k));
                env.extend(vars);
            }
        }
        let redactor = params.redactor();
        ProcessDriver {
            protocol: params.protocol,
            argv,
            env,
            socket: params.host_socket.clone(),
            shown_socket: redactor.apply(&params.host_socket.display().to_string()),
            start_timeout,
            child: Mutex::new(None),
            output: Output::new(history, redactor),
            clock_follows,
        }
    }

    /// Whether virtual time the lab lets pass passes for this process too.
    pub fn clock_follows(&self) -> bool {
        self.clock_follows
    }

    /// What it printed, unredacted (for the leak check only); notes what was
    /// held back of a flood first, so the history has it while it is still open.
    pub fn output(&self) -> String {
        self.output.note_held_back();
        self.output.raw_text()
    }

    /// Spawn it and wait until its identity RPC answers on its socket.
    pub async fn start(&self) -> anyhow::Result<()> {
        let Some((program, args)) = self.argv.split_first() else {
            return Err(anyhow!("the driver's command is empty"));
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            // Its own group: crash_driver kills a wrapper script's children too.
            .process_group(0)
            .kill_on_drop(true);
        let shown_program = self.output.redactor.apply(program);
        let mut child = cmd
            .spawn()
            .map_err(|e| anyhow!("cannot start the driver `{shown_program}`: {e}"))?;
        // A new process prints from its first line (unlike a restarted container's log).
        self.output
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        if let Some(out) = child.stdout.take() {
            self.output.follow("stdout", tokio::io::BufReader::new(out));
        }
        if let Some(err) = child.stderr.take() {
            self.output.follow("stderr", tokio::io::BufReader::new(err));
        }
        *self.lock() = Some(child);
        let exited = || async {
            let mut g = self.lock();
            match g.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(status))) => Some(describe_exit(status)),
                Some(Ok(None)) => None,
                Some(Err(e)) => Some(format!("could not be watched ({e})")),
                None => Some("was killed".into()),
            }
        };
        wait_ready(
            self.protocol,
            &self.socket,
            &self.shown_socket,
            self.start_timeout,
            &self.output,
            exited,
        )
        .await
        .map(|_| ())
        .map_err(|e| anyhow!("{e:#}\n  command: {}", self.shown_command()))
        .inspect_err(|_| self.kill())
    }

    fn shown_command(&self) -> String {
        self.output.redactor.apply(&self.argv.join(" "))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<tokio::process::Child>> {
        self.child.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take_and_kill(&self) -> Option<tokio::process::Child> {
        let mut child = self.lock().take()?;
        if let Some(pid) = child.id() {
            // SAFETY: killpg has no memory effects; the group is the child's own (process_group(0)).
            unsafe {
                libc::killpg(pid as libc::pid_t, libc::SIGKILL);
            }
        }
        let _ = child.start_kill();
        Some(child)
    }

    /// SIGKILL its process group now.
    pub fn kill(&self) {
        drop(self.take_and_kill());
    }

    /// SIGKILL it and wait until it is gone, so it cannot act on what happens next.
    pub async fn kill_and_wait(&self) {
        if let Some(mut child) = self.take_and_kill() {
            let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        }
    }

    /// Kill it and spawn it again; it recovers from its own persisted state.
    pub async fn crash_and_restart(&self) -> anyhow::Result<()> {
        self.kill_and_wait().await;
        let _ = std::fs::remove_file(&self.socket);
        self.start().await
    }
}

fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => "exited".to_string(),
    }
}

impl Drop for ProcessDriver {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(feature = "containers")]
pub use container::ContainerDriver;

#[cfg(feature = "containers")]
mod container {
    //! `image:` drivers through testcontainers: host networking (the fakes
    //! listen on 127.0.0.1), the socket directory bind-mounted at /var/lib/cosi
    //! (COSI) or /csi (CSI).

    use super::*;
    use testcontainers::core::{Mount, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{ContainerAsync, GenericImage, ImageExt};

    /// A driver image the lab runs as a container.
    pub struct ContainerDriver {
        protocol: DriverProtocol,
        container_dir: &'static str,
        name: String,
        tag: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
        host_dir: PathBuf,
        socket: PathBuf,
        shown_socket: String,
        start_timeout: Duration,
        container: tokio::sync::Mutex<Option<ContainerAsync<GenericImage>>>,
        output: Arc<Output>,
    }

    /// `NAME[:TAG]` → (name, tag); a `:` before the last `/` is a registry port.
    pub fn split_image(image: &str) -> (String, String) {
        match image.rfind(':') {
            Some(i) if !image[i..].contains('/') => {
                (image[..i].to_string(), image[i + 1..].to_string())
            }
            _ => (image.to_string(), "latest".to_string()),
        }
    }

    impl ContainerDriver {
        /// A container for `ext` (`program[0]` is the image, the rest its command).
        pub fn new(
            ext: &ExternalDriver,
            params: &DriverParams,
            start_timeout: Duration,
            history: History,
        ) -> Self {
            let container_dir = params.container_dir();
            let (argv, env) = params.expand(ext, Path::new(container_dir));
            let (name, tag) = split_image(argv.first().map(String::as_str).unwrap_or_default());
            let redactor = params.redactor();
            ContainerDriver {
                protocol: params.protocol,
                container_dir,
                name,
                tag,
                args: argv.into_iter().skip(1).collect(),
                env,
                host_dir: params.host_dir.clone(),
                socket: params.host_socket.clone(),
                shown_socket: redactor.apply(&params.host_socket.display().to_string()),
                start_timeout,
                container: tokio::sync::Mutex::new(None),
                output: Output::new(history, redactor),
            }
        }

        /// What it printed, unredacted (for the leak check only).
        pub fn output(&self) -> String {
            self.output.note_held_back();
            self.output.raw_text()
        }

        /// Create (first time) or start (after a crash) the container, then wait for its socket.
        pub async fn start(&self) -> anyhow::Result<()> {
            let mut slot = self.container.lock().await;
            if let Some(c) = slot.as_ref() {
                c.start()
                    .await
                    .map_err(|e| anyhow!("starting the driver container again: {e}"))?;
            } else {
                let mut req = GenericImage::new(&self.name, &self.tag)
                    .with_wait_for(WaitFor::Nothing)
                    .with_network("host")
                    .with_mount(Mount::bind_mount(
                        self.host_dir.display().to_string(),
                        self.container_dir,
                    ))
                    .with_startup_timeout(self.start_timeout);
                if !self.args.is_empty() {
                    req = req.with_cmd(self.args.clone());
                }
                for (k, v) in &self.env {
                    req = req.with_env_var(k, v);
                }
                let c = req.start().await.map_err(|e| {
                    anyhow!(
                        "cannot start the driver image {}:{} (it must exist locally; nothing is pulled): {e}",
                        self.name,
                        self.tag
                    )
                })?;
                *slot = Some(c);
            }
            let Some(c) = slot.as_ref() else {
                return Err(anyhow!("the driver container is gone"));
            };
            self.output.follow("stdout", c.stdout(true));
            self.output.follow("stderr", c.stderr(true));
            let exited = || async {
                match c.is_running().await {
                    Ok(true) => None,
                    Ok(false) => Some(match c.exit_code().await {
                        Ok(Some(code)) => format!("container exited with status {code}"),
                        _ => "container exited".to_string(),
                    }),
                    Err(e) => Some(format!("container could not be inspected ({e})")),
                }
            };
            let r = wait_ready(
                self.protocol,
                &self.socket,
                &self.shown_socket,
                self.start_timeout,
                &self.output,
                exited,
            )
            .await;
            r.map(|_| ()).map_err(|e| {
                anyhow!(
                    "{e:#}\n  image: {}:{} {}",
                    self.name,
                    self.tag,
                    self.output.redactor.apply(&self.args.join(" "))
                )
            })
        }

        /// Kill the container (docker stop with no grace period) and wait until it stopped.
        pub async fn kill_and_wait(&self) {
            if let Some(c) = self.container.lock().await.as_ref() {
                let _ = c.stop_with_timeout(Some(0)).await;
            }
        }

        /// Kill it and start the same container again (its filesystem is kept).
        pub async fn crash_and_restart(&self) -> anyhow::Result<()> {
            self.kill_and_wait().await;
            let _ = std::fs::remove_file(&self.socket);
            self.start().await
        }

        /// Kill and remove the container.
        pub async fn remove(&self) {
            if let Some(c) = self.container.lock().await.take() {
                let _ = c.stop_with_timeout(Some(0)).await;
                let _ = c.rm().await;
            }
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn image_names() {
            use super::split_image;
            let s = |a: &str, b: &str| (a.to_string(), b.to_string());
            assert_eq!(split_image("cosi-s3:dev"), s("cosi-s3", "dev"));
            assert_eq!(split_image("cosi-s3"), s("cosi-s3", "latest"));
            assert_eq!(
                split_image("reg:5000/team/drv"),
                s("reg:5000/team/drv", "latest")
            );
            assert_eq!(split_image("reg:5000/drv:1.2"), s("reg:5000/drv", "1.2"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ansi_is_stripped_and_values_redacted() {
        assert_eq!(strip_ansi("\u{1b}[2mINFO\u{1b}[0m hi"), "INFO hi");
        let r = Redactor {
            pairs: vec![("s3cr3t".into(), "<admin-secret>".into())],
        };
        assert_eq!(r.apply("key=s3cr3t!"), "key=<admin-secret>!");
        assert_eq!(r.apply("nothing"), "nothing");
    }
}

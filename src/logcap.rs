//! Captures everything the lab and in-process drivers log, so the
//! no-secret-leak check can search the logs a run produced, and so reports can
//! include them. Logs also go to stderr when `-v` asks for them.
//!
//! Runs side by side each log into their own buffer: a thread that adopted a
//! [`RunLog`] (the run's threads and its drivers' runtimes) writes there, any
//! other thread into the process-wide one. One run's evidence never holds
//! another's lines — with the same seed two runs draw the same secrets, so a
//! leak in one would otherwise fail its neighbour too.

use std::cell::RefCell;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use tracing_subscriber::fmt::MakeWriter;

static BUFFER: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();

thread_local! {
    static CURRENT: RefCell<Option<RunLog>> = const { RefCell::new(None) };
}

/// One run's log buffer, shared by the threads that adopted it.
#[derive(Clone, Default)]
pub struct RunLog(Arc<Mutex<Vec<u8>>>);

impl RunLog {
    /// A fresh, empty buffer.
    pub fn new() -> Self {
        Self::default()
    }
}

/// The run log this thread writes to, if it adopted one.
pub fn current() -> Option<RunLog> {
    CURRENT.with(|c| c.borrow().clone())
}

/// From now on this thread logs into `log` (`None`: the process-wide buffer).
/// A runtime started for a run adopts its log on each of its threads.
pub fn adopt(log: Option<RunLog>) {
    CURRENT.with(|c| *c.borrow_mut() = log);
}

/// Run `f` with this thread's buffer: its run's, else the process-wide one.
fn with_buffer<T>(f: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    let run = current();
    let m = match &run {
        Some(r) => &r.0,
        None => BUFFER.get_or_init(|| Mutex::new(Vec::new())),
    };
    let mut b = m.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut b)
}

/// Current end of the captured log, to slice one run's part later.
pub fn position() -> usize {
    with_buffer(|b| b.len())
}

/// Everything logged since `pos`.
pub fn since(pos: usize) -> String {
    with_buffer(|b| String::from_utf8_lossy(b.get(pos..).unwrap_or(&[])).into_owned())
}

/// A writer that appends to the capture buffer and optionally echoes to stderr.
#[derive(Clone, Copy)]
pub struct Capture {
    /// Echo to stderr too.
    pub echo: bool,
}

impl Write for Capture {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        with_buffer(|b| b.extend_from_slice(data));
        if self.echo {
            let _ = std::io::stderr().write_all(data);
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

/// Install the global subscriber: capture at `info` (or `RUST_LOG`), echo when `echo`.
pub fn init(echo: bool) {
    init_with(echo, false);
}

/// As `init`, with one JSON object per line when `json` (`--log-format json`),
/// for CI log collectors; the capture (and so no-secret-leak) sees the same text.
pub fn init_with(echo: bool, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if json {
        let _ = tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(Capture { echo })
            .try_init();
    } else {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(Capture { echo })
            .try_init();
    }
}

//! Captures everything the lab and in-process drivers log, so the
//! no-secret-leak check can search the logs a run produced, and so reports can
//! include them. Logs also go to stderr when `-v` asks for them.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

use tracing_subscriber::fmt::MakeWriter;

static BUFFER: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();

fn buffer() -> &'static Mutex<Vec<u8>> {
    BUFFER.get_or_init(|| Mutex::new(Vec::new()))
}

/// Current end of the captured log, to slice one run's part later.
pub fn position() -> usize {
    buffer().lock().map(|b| b.len()).unwrap_or(0)
}

/// Everything logged since `pos`.
pub fn since(pos: usize) -> String {
    let b = buffer().lock().unwrap_or_else(|p| p.into_inner());
    String::from_utf8_lossy(b.get(pos..).unwrap_or(&[])).into_owned()
}

/// A writer that appends to the capture buffer and optionally echoes to stderr.
#[derive(Clone, Copy)]
pub struct Capture {
    /// Echo to stderr too.
    pub echo: bool,
}

impl Write for Capture {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = buffer().lock() {
            b.extend_from_slice(data);
        }
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

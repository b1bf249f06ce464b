//! Where the end of a run spends its memory and time: with `DRIVELAB_PHASES`
//! set, each named phase prints the process's resident set and the time since
//! the last phase to stderr. A profiling aid (docs/bench.md's phase tables);
//! unset, a phase costs one atomic load. With `DRIVELAB_PHASES_EXIT=NAME` as
//! well, the process exits at the end of phase NAME, so that a heap
//! profiler's "leaked at exit" is what the run holds at that point.

use std::sync::OnceLock;
use std::time::Instant;

/// When phases are printed: the first phase's time, kept across phases.
static START: OnceLock<Option<std::sync::Mutex<Instant>>> = OnceLock::new();

/// Mark the end of phase `name` (printed only with `DRIVELAB_PHASES` set).
pub fn phase(name: &str) {
    let Some(last) =
        START.get_or_init(|| std::env::var_os("DRIVELAB_PHASES").map(|_| Instant::now().into()))
    else {
        return;
    };
    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    eprintln!(
        "[phase] {name}: rss {} MiB, +{:.2} s",
        rss_mib().map_or("?".to_string(), |m| format!("{m:.1}")),
        (now - *last).as_secs_f64()
    );
    *last = now;
    if std::env::var_os("DRIVELAB_PHASES_EXIT").is_some_and(|exit| exit == name) {
        eprintln!("[phase] exiting at {name} (DRIVELAB_PHASES_EXIT)");
        std::process::exit(0);
    }
}

/// The resident set now (VmRSS), in MiB; `None` where /proc is absent.
fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kb: f64 = kb.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb / 1024.0)
}

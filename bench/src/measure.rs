//! Measuring primitives: medians, process CPU time and peak RSS (getrusage,
//! /proc/self/status), and running one measurement in a fresh child process so
//! that each peak-RSS figure belongs to that measurement alone.

use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;

/// Median of a sample (the mean of the middle two for an even count).
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The `p`-quantile (0..=1) by nearest rank; used for spread columns only.
pub fn quantile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn tv(t: libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}

/// User + system CPU seconds of this process so far (all threads).
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct we hand it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return f64::NAN;
    }
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Peak resident set of this process in MiB: VmHWM, or ru_maxrss if /proc is absent.
pub fn peak_rss_mib() -> f64 {
    if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
        if let Some(kb) = s
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        {
            return kb / 1024.0;
        }
    }
    // SAFETY: as above.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_maxrss as f64 / 1024.0 // Linux reports KiB
}

/// Run this binary again as `drivelab-bench child <args>` and parse the JSON
/// object it prints as its last stdout line. A fresh process per measurement:
/// peak RSS is monotonic within a process, so sharing one would blur sizes.
pub fn child(args: &[&str], timeout: Duration) -> anyhow::Result<Value> {
    child_capped(args, timeout, None)
}

/// A child the watchdog killed (past its time or memory cap): a measured
/// miss for the caller to report, unlike a child that failed.
#[derive(Debug)]
pub struct Killed(pub String);

impl std::fmt::Display for Killed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Killed {}

/// How often a capped child's resident set is read.
const RSS_POLL: Duration = Duration::from_millis(200);

/// As [`child`], and killed once its resident set passes `max_rss_mib`, so
/// a size that outgrows the machine is a measured miss, not an OOM kill of
/// whatever else runs there.
pub fn child_capped(
    args: &[&str],
    timeout: Duration,
    max_rss_mib: Option<f64>,
) -> anyhow::Result<Value> {
    let exe = std::env::current_exe().context("locating the bench binary")?;
    let mut cmd = Command::new(exe);
    cmd.arg("child").args(args);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    let proc = cmd.spawn().context("spawning a bench child")?;
    // A plain watchdog thread: the child's own work must not be slowed by ours.
    let pid = proc.id();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        let poll = if max_rss_mib.is_some() {
            RSS_POLL
        } else {
            timeout
        };
        loop {
            let left = timeout.saturating_sub(started.elapsed());
            match rx.recv_timeout(poll.min(left)) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                _ => return None,
            }
            let over = match (max_rss_mib, rss_mib_of(pid)) {
                (Some(cap), Some(rss)) if rss > cap => Some(format!(
                    "passed {cap:.0} MiB of resident memory after {:.0}s",
                    started.elapsed().as_secs_f64()
                )),
                _ if started.elapsed() >= timeout => {
                    Some(format!("exceeded {}s", timeout.as_secs()))
                }
                _ => None,
            };
            if over.is_some() {
                // SAFETY: kill(2) on the pid of a child we spawned and still own.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                return over;
            }
        }
    });
    let out = proc
        .wait_with_output()
        .context("waiting for a bench child")?;
    let _ = tx.send(());
    if let Some(why) = watchdog.join().unwrap_or(None) {
        return Err(Killed(format!("child {args:?} {why} and was killed")).into());
    }
    if !out.status.success() {
        bail!("child {args:?} failed: {}", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("child printed no JSON")?;
    serde_json::from_str(last).with_context(|| format!("child printed bad JSON: {last}"))
}

/// The resident set of process `pid` now, from /proc (None once it is gone).
pub fn rss_mib_of(pid: u32) -> Option<f64> {
    kib_field(&format!("/proc/{pid}/status"), "VmRSS:").map(|kb| kb / 1024.0)
}

/// Half the machine's memory: the most a capped child may hold.
pub fn half_of_memory_mib() -> f64 {
    kib_field("/proc/meminfo", "MemTotal:").map_or(4096.0, |kb| kb / 1024.0 / 2.0)
}

/// A `Name:   123 kB` line of a /proc file, in KiB.
fn kib_field(path: &str, name: &str) -> Option<f64> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(name))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Least-squares slope of ln(y) on ln(x): the growth exponent (1 = linear).
pub fn loglog_slope(points: &[(f64, f64)]) -> f64 {
    let pts: Vec<(f64, f64)> = points
        .iter()
        .filter(|(x, y)| *x > 0.0 && *y > 0.0)
        .map(|(x, y)| (x.ln(), y.ln()))
        .collect();
    let n = pts.len() as f64;
    if pts.len() < 2 {
        return f64::NAN;
    }
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    sxy / sxx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_process_has_a_resident_set_and_a_gone_one_none() {
        let mine = rss_mib_of(std::process::id()).expect("our own /proc entry");
        assert!(mine > 0.0 && mine < half_of_memory_mib() * 2.0, "{mine}");
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert_eq!(rss_mib_of(pid), None, "a reaped child has no /proc entry");
    }

    #[test]
    fn median_and_slope() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let lin: Vec<(f64, f64)> = [10.0, 100.0, 1000.0]
            .iter()
            .map(|&x| (x, 3.0 * x))
            .collect();
        assert!((loglog_slope(&lin) - 1.0).abs() < 1e-9);
        let quad: Vec<(f64, f64)> = [10.0, 100.0, 1000.0].iter().map(|&x| (x, x * x)).collect();
        assert!((loglog_slope(&quad) - 2.0).abs() < 1e-9);
    }
}

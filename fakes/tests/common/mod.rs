//! Shared by the hostile-request tests: raw HTTP/1.1 over loopback (so bytes no
//! client library would send — non-UTF-8, oversized, lying headers — reach the
//! fake exactly), and a panic hook that counts panics anywhere in the process.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Count every panic from now on (server tasks included; tokio catches them,
/// the hook still sees them).
pub fn watch_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            prev(info);
        }));
    });
}

/// Panics counted so far.
pub fn panics() -> usize {
    PANICS.load(Ordering::SeqCst)
}

/// A reply off the wire.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// The S3 XML error code (`<Error><Code>X</Code>`), if the body is one.
    pub fn s3_code(&self) -> Option<String> {
        let t = self.text();
        let start = t.find("<Error><Code>")? + "<Error><Code>".len();
        let end = t[start..].find("</Code>")? + start;
        Some(t[start..end].to_string())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.head, self.text()))
    }
}

/// Send `request` as is and read the whole answer (the request should ask for
/// `Connection: close`; the server may also close on its own, e.g. after 431).
pub async fn raw(addr: SocketAddr, request: &[u8]) -> Reply {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // A server may answer and close before it has read everything we send.
    let _ = s.write_all(request).await;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf))
        .await
        .expect("the fake answered within 20 s")
        .ok();
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {:?}", String::from_utf8_lossy(&buf)));
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let mut body = buf[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Reply { status, head, body }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(std::str::from_utf8(&b[..i]).unwrap_or("0").trim(), 16)
            .unwrap_or(0);
        if n == 0 || b.len() < i + 2 + n {
            break;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[(i + 4 + n).min(b.len())..];
    }
    out
}

/// Resident memory of this process in KiB (Linux), to show a refused huge
/// request did not get buffered.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A header far past any sane size: the HTTP layer refuses it (431) before
/// any handler runs, and closes.
pub async fn assert_huge_header_refused(addr: SocketAddr, path: &str) {
    let huge = "v".repeat(1 << 20);
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nx-a: {huge}\r\nconnection: close\r\n\r\n");
    let r = raw(addr, req.as_bytes()).await;
    assert_eq!(r.status, 431, "{}", r.head);
}

/// A UAA client of the Director fake; its secret is `<id>-secret`.
pub fn director_client(
    id: &str,
    scopes: &[&str],
    deployments: &[&str],
) -> drivelab_fakes::director::ClientConfig {
    drivelab_fakes::director::ClientConfig {
        id: id.into(),
        secret: drivelab_fakes::secret::Secret::new(format!("{id}-secret")),
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
        deployments: deployments.iter().map(|s| s.to_string()).collect(),
    }
}

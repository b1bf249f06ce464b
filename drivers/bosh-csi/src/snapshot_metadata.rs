//! The CSI SnapshotMetadata service (spec v1.10): GetMetadataAllocated and
//! GetMetadataDelta stream block ranges of snapshots, restartable from
//! `starting_offset`, in FIXED_LENGTH (one 512 KiB block per tuple) or
//! VARIABLE_LENGTH (coalesced extents) form, at most `max_results` per message.
//!
//! Where the blocks come from: BOSH has no changed-block API, so the driver
//! reads the IaaS's own block API (EBS-direct-shaped `ListSnapshotBlocks` /
//! `ListChangedBlocks`, see the fake CPI's `block_api`) with its IaaS
//! credential, as cloud CSI drivers do; the Director is asked only which disk
//! a snapshot belongs to (both snapshots of a delta must be of one volume).
//!
//! Who is trusted: the external-snapshot-metadata sidecar authenticates the
//! client's audience-scoped Kubernetes token (TokenReview) and authorizes it
//! (SubjectAccessReview) on every call, then relays here over the Unix socket
//! with the reviewed username in the `x-snapshot-client` header. On top of
//! that, this driver keeps the session token of the design discussion (the SP
//! hands out an opaque token for a session; the bulk calls carry it): the
//! first call of a stream (`starting_offset` 0, no token) opens a session and
//! answers its token in the `x-snapshot-session` response header; a restart
//! (`starting_offset` > 0) must present it, and it is honoured only for the
//! same client, volume and snapshot pair and until it expires.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use drivelab_proto::csi::{
    snapshot_metadata_server::SnapshotMetadata, BlockMetadata, BlockMetadataType,
    GetMetadataAllocatedRequest, GetMetadataAllocatedResponse, GetMetadataDeltaRequest,
    GetMetadataDeltaResponse,
};
use http::{Method, StatusCode};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::config::Mutant;
use crate::driver::BoshCsiDriver;
use crate::error::DriverError;
use crate::http::HttpClient;

/// Request header: the client identity the sidecar reviewed.
pub const CLIENT_HEADER: &str = "x-snapshot-client";
/// Request and response header: the session token.
pub const SESSION_HEADER: &str = "x-snapshot-session";
/// Tuples per message when the request leaves `max_results` at 0.
pub const DEFAULT_MAX_RESULTS: usize = 256;

/// Milliseconds of some clock; the lab passes its virtual clock.
pub type ClockFn = Arc<dyn Fn() -> u64 + Send + Sync>;

fn system_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Binding {
    client: String,
    volume: String,
    base: String,
    target: String,
}

struct Session {
    binding: Binding,
    expires_ms: u64,
}

/// The driver's snapshot-metadata state: sessions, clock, block-API client.
pub(crate) struct MetadataState {
    sessions: Mutex<BTreeMap<String, Session>>,
    issued: AtomicU64,
    clock: Mutex<ClockFn>,
    // Only the stale-delta mutant reads this.
    delta_cache: Mutex<BTreeMap<String, Vec<u64>>>,
    http: HttpClient,
}

impl MetadataState {
    pub(crate) fn new(http_timeout: std::time::Duration) -> Self {
        MetadataState {
            sessions: Mutex::new(BTreeMap::new()),
            issued: AtomicU64::new(0),
            clock: Mutex::new(Arc::new(system_ms)),
            delta_cache: Mutex::new(BTreeMap::new()),
            http: HttpClient::new(http_timeout),
        }
    }

    fn now(&self) -> u64 {
        let f = self.clock.lock().unwrap_or_else(|p| p.into_inner()).clone();
        f()
    }
}

/// One page of the IaaS block API.
struct BlockPage {
    block_size: u64,
    volume_bytes: u64,
    indexes: Vec<u64>,
    next: Option<String>,
}

impl BoshCsiDriver {
    /// Run session expiry on `clock` (milliseconds) instead of the system clock.
    pub fn set_clock(&self, clock: ClockFn) {
        *self
            .inner
            .metadata
            .clock
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = clock;
    }

    fn md(&self) -> &MetadataState {
        &self.inner.metadata
    }

    /// Check a presented token, or open a session when none is presented on
    /// a fresh stream. Returns the token to answer with.
    fn session(
        &self,
        presented: Option<String>,
        want: Binding,
        starting_offset: i64,
    ) -> Result<String, DriverError> {
        let now = self.md().now();
        let mut sessions = self.md().sessions.lock().unwrap_or_else(|p| p.into_inner());
        // Forget what has expired, so the map does not grow for ever.
        sessions
            .retain(|_, s| s.expires_ms > now || self.inner.config.has(Mutant::ReplayableToken));
        match presented {
            Some(tok) => {
                let Some(s) = sessions.get(&tok) else {
                    return Err(DriverError::Unauthenticated(
                        "the session token is unknown or has expired; start a new session (starting_offset 0)".into(),
                    ));
                };
                if self.mutant(Mutant::ReplayableToken) {
                    return Ok(tok);
                }
                if s.expires_ms <= now {
                    return Err(DriverError::Unauthenticated(
                        "the session token has expired; start a new session".into(),
                    ));
                }
                if s.binding != want {
                    return Err(DriverError::PermissionDenied(
                        "the session token was issued for another client, volume or snapshot pair"
                            .into(),
                    ));
                }
                Ok(tok)
            }
            None if starting_offset > 0 => Err(DriverError::Unauthenticated(
                "resuming a stream (starting_offset > 0) needs the session token of the stream it resumes".into(),
            )),
            None => {
                let n = self.md().issued.fetch_add(1, Ordering::SeqCst) + 1;
                let mut h = Sha256::new();
                h.update(n.to_le_bytes());
                h.update(self.inner.config.client_secret.expose().as_bytes());
                h.update(self.inner.config.block_api_credential.expose().as_bytes());
                h.update(want.client.as_bytes());
                h.update(want.volume.as_bytes());
                let tok = hex::encode(&h.finalize()[..20]);
                sessions.insert(
                    tok.clone(),
                    Session {
                        binding: want,
                        expires_ms: now.saturating_add(
                            u64::try_from(self.inner.config.session_ttl.as_millis())
                                .unwrap_or(u64::MAX),
                        ),
                    },
                );
                Ok(tok)
            }
        }
    }

    async fn block_page(
        &self,
        base: Option<&str>,
        target: &str,
        start: u64,
        token: Option<&str>,
    ) -> Result<BlockPage, DriverError> {
        let cfg = &self.inner.config;
        if cfg.block_api_url.is_empty() {
            return Err(DriverError::Unimplemented(
                "no IaaS block API configured (--block-api-url)".into(),
            ));
        }
        let enc = crate::http::encode;
        let mut url = match base {
            Some(b) => format!(
                "{}/snapshots/{}/changedblocks?firstSnapshotId={}",
                cfg.block_api_url.trim_end_matches('/'),
                enc(target),
                enc(b)
            ),
            None => format!(
                "{}/snapshots/{}/blocks?",
                cfg.block_api_url.trim_end_matches('/'),
                enc(target)
            ),
        };
        url.push_str(&format!("&maxResults={}", cfg.block_api_page));
        match token {
            Some(t) => url.push_str(&format!("&pageToken={}", enc(t))),
            None => url.push_str(&format!("&startingBlockIndex={start}")),
        }
        let auth = format!("Bearer {}", cfg.block_api_credential.expose());
        let op = if base.is_some() {
            "ListChangedBlocks"
        } else {
            "ListSnapshotBlocks"
        };
        let a = self
            .md()
            .http
            .send(Method::GET, &url, &[("authorization", auth.as_str())], None)
            .await
            .map_err(|e| DriverError::Unavailable(format!("IaaS {op}: {e}")))?;
        let body: Value = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
        let msg = body
            .get("Message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        match a.status {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => {
                return Err(DriverError::NotFound(format!("IaaS {op}: {msg}")))
            }
            StatusCode::BAD_REQUEST => {
                return Err(DriverError::InvalidArgument(format!("IaaS {op}: {msg}")))
            }
            StatusCode::FORBIDDEN => {
                return Err(DriverError::Internal(format!(
                    "IaaS {op} refused the driver's credential: {msg}"
                )))
            }
            s if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS => {
                return Err(DriverError::Unavailable(format!("IaaS {op}: {s} {msg}")))
            }
            s => return Err(DriverError::Internal(format!("IaaS {op}: {s} {msg}"))),
        }
        let list = body
            .get(if base.is_some() {
                "ChangedBlocks"
            } else {
                "Blocks"
            })
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let indexes = list
            .iter()
            .filter_map(|b| b.get("BlockIndex").and_then(Value::as_u64))
            .collect();
        let block_size = body.get("BlockSize").and_then(Value::as_u64).unwrap_or(0);
        if block_size == 0 {
            return Err(DriverError::Internal(format!(
                "IaaS {op} answered no BlockSize"
            )));
        }
        let volume_bytes = body
            .get("VolumeSizeBytes")
            .and_then(Value::as_u64)
            .or_else(|| {
                body.get("VolumeSize")
                    .and_then(Value::as_u64)
                    .map(|g| g << 30)
            })
            .unwrap_or(0);
        Ok(BlockPage {
            block_size,
            volume_bytes,
            indexes,
            next: body
                .get("NextToken")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        })
    }

    /// Which volume each snapshot is of, via the Director.
    async fn volume_of(&self, snapshot_id: &str) -> Result<String, DriverError> {
        self.director()?
            .snapshots()
            .await?
            .into_iter()
            .find(|s| s.snapshot_cid == snapshot_id)
            .map(|s| s.disk_name)
            .ok_or_else(|| DriverError::NotFound(format!("snapshot {snapshot_id} does not exist")))
    }

    /// Open a stream: validate, bind the session, read the first page (so
    /// NOT_FOUND / OUT_OF_RANGE are answered before any message), then page on
    /// in a task.
    async fn open_stream(
        &self,
        base: Option<String>,
        target: String,
        starting_offset: i64,
        max_results: i32,
        client: String,
        presented: Option<String>,
    ) -> Result<(String, mpsc::Receiver<Result<Tuples, Status>>), DriverError> {
        if target.is_empty() || base.as_deref() == Some("") {
            return Err(DriverError::InvalidArgument(
                "snapshot ids are required".into(),
            ));
        }
        if starting_offset < 0 {
            return Err(DriverError::InvalidArgument(
                "starting_offset must not be negative".into(),
            ));
        }
        if max_results < 0 {
            return Err(DriverError::InvalidArgument(
                "max_results must not be negative".into(),
            ));
        }
        let volume = self.volume_of(&target).await?;
        if let Some(b) = &base {
            let bv = self.volume_of(b).await?;
            if bv != volume {
                return Err(DriverError::InvalidArgument(format!(
                    "base snapshot {b} is of volume {bv}, target {target} of {volume}"
                )));
            }
        }
        let token = self.session(
            presented,
            Binding {
                client,
                volume,
                base: base.clone().unwrap_or_default(),
                target: target.clone(),
            },
            starting_offset,
        )?;
        let start_offset = starting_offset as u64;
        // The block size is the IaaS's; ask for block 0's page to learn it
        // only when the offset needs converting.
        let probe = self.block_page(base.as_deref(), &target, 0, None).await?;
        if start_offset >= probe.volume_bytes {
            return Err(DriverError::OutOfRange(format!(
                "starting_offset {start_offset} is at or past the volume's {} bytes",
                probe.volume_bytes
            )));
        }
        let bs = probe.block_size;
        let start_index = start_offset / bs;
        let first = if start_index == 0 {
            probe
        } else {
            self.block_page(base.as_deref(), &target, start_index, None)
                .await?
        };
        let max = if max_results == 0 {
            DEFAULT_MAX_RESULTS
        } else {
            max_results as usize
        };
        let (tx, rx) = mpsc::channel(2);
        let me = self.clone();
        tokio::spawn(async move {
            me.pump(base, target, start_index, first, max, tx).await;
        });
        Ok((token, rx))
    }

    async fn pump(
        &self,
        base: Option<String>,
        target: String,
        start_index: u64,
        first: BlockPage,
        max: usize,
        tx: mpsc::Sender<Result<Tuples, Status>>,
    ) {
        let variable = self.inner.config.variable_length_metadata;
        let bs = first.block_size;
        let capacity = first.volume_bytes;
        let mut out = Emitter {
            bs,
            capacity,
            variable,
            max,
            pending: None,
            batch: Vec::new(),
            tx: tx.clone(),
        };
        // The seeded stale-delta bug: one change list per base snapshot.
        if let (Some(b), true) = (&base, self.inner.config.has(Mutant::StaleDelta)) {
            let cached = self
                .md()
                .delta_cache
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(b)
                .cloned();
            let list = match cached {
                Some(l) => {
                    self.mutant(Mutant::StaleDelta);
                    l
                }
                None => {
                    let mut all = first.indexes.clone();
                    let mut next = first.next.clone();
                    while let Some(t) = next {
                        match self.block_page(Some(b), &target, 0, Some(&t)).await {
                            Ok(p) => {
                                all.extend(p.indexes);
                                next = p.next;
                            }
                            Err(e) => {
                                let _ = tx.send(Err(e.into())).await;
                                return;
                            }
                        }
                    }
                    self.md()
                        .delta_cache
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(b.clone(), all.clone());
                    all
                }
            };
            for i in list.into_iter().filter(|i| *i >= start_index) {
                if !out.push(i).await {
                    return;
                }
            }
            out.finish().await;
            return;
        }
        let mut page = first;
        loop {
            for i in std::mem::take(&mut page.indexes) {
                if !out.push(i).await {
                    return;
                }
            }
            let Some(t) = page.next.take() else { break };
            match self.block_page(base.as_deref(), &target, 0, Some(&t)).await {
                Ok(p) => page = p,
                Err(e) => {
                    // Flush what is known good first, then fail the stream.
                    out.flush().await;
                    let _ = tx.send(Err(e.into())).await;
                    return;
                }
            }
        }
        out.finish().await;
    }
}

/// One message's worth of tuples plus the stream's constants.
pub(crate) struct Tuples {
    kind: BlockMetadataType,
    capacity: i64,
    tuples: Vec<BlockMetadata>,
}

struct Emitter {
    bs: u64,
    capacity: u64,
    variable: bool,
    max: usize,
    // VARIABLE_LENGTH: the extent being grown (first block, block count).
    pending: Option<(u64, u64)>,
    batch: Vec<BlockMetadata>,
    tx: mpsc::Sender<Result<Tuples, Status>>,
}

impl Emitter {
    fn tuple(&self, first: u64, count: u64) -> BlockMetadata {
        let off = first.saturating_mul(self.bs);
        // The last block may be partial when the volume is not a block multiple.
        let end = (first + count).saturating_mul(self.bs).min(self.capacity);
        BlockMetadata {
            byte_offset: i64::try_from(off).unwrap_or(i64::MAX),
            size_bytes: i64::try_from(end.saturating_sub(off)).unwrap_or(i64::MAX),
        }
    }

    /// Add one block; false when the receiver went away.
    async fn push(&mut self, i: u64) -> bool {
        if self.variable {
            match self.pending {
                Some((f, c)) if f + c == i => {
                    self.pending = Some((f, c + 1));
                    return true;
                }
                Some((f, c)) => {
                    let t = self.tuple(f, c);
                    self.batch.push(t);
                    self.pending = Some((i, 1));
                }
                None => self.pending = Some((i, 1)),
            }
        } else {
            let t = self.tuple(i, 1);
            self.batch.push(t);
        }
        if self.batch.len() >= self.max {
            return self.send().await;
        }
        true
    }

    async fn send(&mut self) -> bool {
        let tuples = std::mem::take(&mut self.batch);
        self.tx
            .send(Ok(Tuples {
                kind: if self.variable {
                    BlockMetadataType::VariableLength
                } else {
                    BlockMetadataType::FixedLength
                },
                capacity: i64::try_from(self.capacity).unwrap_or(i64::MAX),
                tuples,
            }))
            .await
            .is_ok()
    }

    async fn flush(&mut self) {
        if !self.batch.is_empty() {
            self.send().await;
        }
    }

    async fn finish(&mut self) {
        if let Some((f, c)) = self.pending.take() {
            let t = self.tuple(f, c);
            self.batch.push(t);
        }
        self.flush().await;
    }
}

fn header(req_md: &tonic::metadata::MetadataMap, name: &str) -> Option<String> {
    req_md
        .get(name)
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn with_session<T>(stream: T, token: &str) -> Response<T> {
    let mut r = Response::new(stream);
    if let Ok(v) = token.parse() {
        r.metadata_mut().insert(SESSION_HEADER, v);
    }
    r
}

type AllocStream = ReceiverStream<Result<GetMetadataAllocatedResponse, Status>>;
type DeltaStream = ReceiverStream<Result<GetMetadataDeltaResponse, Status>>;

fn relay<R: Send + 'static>(
    mut rx: mpsc::Receiver<Result<Tuples, Status>>,
    f: fn(Tuples) -> R,
) -> ReceiverStream<Result<R, Status>> {
    let (tx, out) = mpsc::channel(1);
    tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if tx.send(m.map(f)).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(out)
}

#[tonic::async_trait]
impl SnapshotMetadata for BoshCsiDriver {
    type GetMetadataAllocatedStream = AllocStream;
    type GetMetadataDeltaStream = DeltaStream;

    async fn get_metadata_allocated(
        &self,
        req: Request<GetMetadataAllocatedRequest>,
    ) -> Result<Response<AllocStream>, Status> {
        let client = header(req.metadata(), CLIENT_HEADER).unwrap_or_default();
        let presented = header(req.metadata(), SESSION_HEADER);
        let r = req.into_inner();
        let subject = r.snapshot_id.clone();
        match self
            .open_stream(
                None,
                r.snapshot_id,
                r.starting_offset,
                r.max_results,
                client,
                presented,
            )
            .await
        {
            Ok((tok, rx)) => {
                tracing::info!(rpc = "GetMetadataAllocated", subject, "streaming");
                Ok(with_session(
                    relay(rx, |t| GetMetadataAllocatedResponse {
                        block_metadata_type: t.kind as i32,
                        volume_capacity_bytes: t.capacity,
                        block_metadata: t.tuples,
                    }),
                    &tok,
                ))
            }
            Err(e) => {
                tracing::info!(rpc = "GetMetadataAllocated", subject, code = ?e.code(), error = %e, "failed");
                Err(e.into())
            }
        }
    }

    async fn get_metadata_delta(
        &self,
        req: Request<GetMetadataDeltaRequest>,
    ) -> Result<Response<DeltaStream>, Status> {
        let client = header(req.metadata(), CLIENT_HEADER).unwrap_or_default();
        let presented = header(req.metadata(), SESSION_HEADER);
        let r = req.into_inner();
        let subject = format!("{}..{}", r.base_snapshot_id, r.target_snapshot_id);
        match self
            .open_stream(
                Some(r.base_snapshot_id),
                r.target_snapshot_id,
                r.starting_offset,
                r.max_results,
                client,
                presented,
            )
            .await
        {
            Ok((tok, rx)) => {
                tracing::info!(rpc = "GetMetadataDelta", subject, "streaming");
                Ok(with_session(
                    relay(rx, |t| GetMetadataDeltaResponse {
                        block_metadata_type: t.kind as i32,
                        volume_capacity_bytes: t.capacity,
                        block_metadata: t.tuples,
                    }),
                    &tok,
                ))
            }
            Err(e) => {
                tracing::info!(rpc = "GetMetadataDelta", subject, code = ?e.code(), error = %e, "failed");
                Err(e.into())
            }
        }
    }
}

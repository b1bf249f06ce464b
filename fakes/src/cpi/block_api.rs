//! The fake IaaS's block API: which blocks a snapshot holds and which changed
//! between two snapshots, shaped like the AWS EBS direct APIs
//! (`ListSnapshotBlocks`, `ListChangedBlocks`: JSON pages of block indexes
//! with opaque block tokens, a 512 KiB `BlockSize`, `NextToken` pagination,
//! `StartingBlockIndex`, `MaxResults` 100..=10000).
//!
//! Why this and not the Director: BOSH has no changed-block API, neither in
//! the Director nor in the CPI contract. Cloud CSI drivers that implement the
//! CSI SnapshotMetadata service read the IaaS's own block API directly with
//! the driver's cloud credential (the AWS EBS CSI driver calls the EBS direct
//! APIs); a BOSH-hosted driver on that IaaS would do the same. So the driver
//! is configured with this endpoint and a credential, next to its Director
//! client. Authentication is a bearer credential (standing in for SigV4), and
//! every request passes the gate as `driver → cpi` so faults can cut it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::json;

use super::core::{BlockMap, SnapshotRec, BLOCK_SIZE};
use super::Cpi;
use crate::gate::{http_gate, CallSpec, HttpTap, Rejection};
use crate::history::Component;
use crate::secret::Secret;

/// Smallest and largest page the API serves (EBS: 100..=10000).
pub const MIN_RESULTS: u64 = 100;
/// See [`MIN_RESULTS`].
pub const MAX_RESULTS: u64 = 10_000;

/// The blocks whose version differs between `base` and `target`, ascending.
pub fn diff(base: &BlockMap, target: &BlockMap) -> Vec<u64> {
    let mut out: Vec<u64> = target
        .iter()
        .filter(|(i, v)| base.get(i) != Some(v))
        .map(|(i, _)| *i)
        .collect();
    // Written in the base but absent from the target cannot happen on one disk
    // (blocks are never unwritten), but a base from a bigger disk could: count it.
    out.extend(base.keys().filter(|i| !target.contains_key(i)));
    out.sort_unstable();
    out.dedup();
    out
}

#[derive(Clone)]
struct ApiState {
    cpi: Cpi,
    credential: Secret,
    // Snapshots are immutable once taken, so a parsed block map can be
    // reused for every page of a listing (existence is re-checked per page).
    cache: Arc<Mutex<BTreeMap<String, Arc<BlockMap>>>>,
}

impl Cpi {
    /// Serve the block API on `addr` (loopback), accepting `credential`.
    pub async fn serve_block_api(
        &self,
        addr: std::net::SocketAddr,
        credential: Secret,
    ) -> std::io::Result<crate::serve::Listener> {
        let st = ApiState {
            cpi: self.clone(),
            credential,
            cache: Arc::default(),
        };
        let tap = HttpTap {
            gate: self.gate().clone(),
            classify,
            render: render_rejection,
        };
        let router = Router::new()
            .route("/snapshots/{id}/blocks", get(list_snapshot_blocks))
            .route("/snapshots/{id}/changedblocks", get(list_changed_blocks))
            .fallback(|| async {
                api_error(404, "ResourceNotFoundException", "no such route", None)
            })
            .layer(from_fn_with_state(tap, http_gate))
            .with_state(st);
        crate::serve::serve_http(router, addr).await
    }
}

crate::declare_ops!(
    /// The block API's operations (what its gate records and faults aim at).
    pub OPS {
        LIST_SNAPSHOT_BLOCKS = "ebs.ListSnapshotBlocks",
        LIST_CHANGED_BLOCKS = "ebs.ListChangedBlocks",
        UNKNOWN = "ebs.unknown",
    }
);

fn classify(parts: &Parts) -> CallSpec {
    let segs: Vec<&str> = parts.uri.path().trim_matches('/').split('/').collect();
    let (op, subject) = match segs.as_slice() {
        ["snapshots", id, "blocks"] => (LIST_SNAPSHOT_BLOCKS, id.to_string()),
        ["snapshots", id, "changedblocks"] => (LIST_CHANGED_BLOCKS, id.to_string()),
        _ => (UNKNOWN, parts.uri.path().to_string()),
    };
    CallSpec::new(Component::Driver, Component::Cpi, op, subject)
}

fn render_rejection(r: &Rejection) -> Response {
    api_error(r.http_status, &r.code, &r.message, None)
}

fn api_error(status: u16, kind: &str, message: &str, reason: Option<&str>) -> Response {
    let mut body = json!({ "__type": kind, "Message": message });
    if let Some(r) = reason {
        body["Reason"] = json!(r);
    }
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (code, axum::Json(body)).into_response();
    if let Ok(v) = kind.parse() {
        resp.headers_mut().insert("x-amzn-errortype", v);
    }
    resp
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PageQuery {
    first_snapshot_id: Option<String>,
    max_results: Option<u64>,
    page_token: Option<String>,
    starting_block_index: Option<u64>,
}

fn authorize(st: &ApiState, headers: &HeaderMap) -> Result<(), Response> {
    let got = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "));
    match got {
        Some(t) if t == st.credential.expose() => Ok(()),
        Some(_) => Err(api_error(
            403,
            "AccessDeniedException",
            "The credential is not valid for this account",
            Some("UNAUTHORIZED_ACCOUNT"),
        )),
        None => Err(api_error(
            403,
            "AccessDeniedException",
            "Missing credential",
            Some("UNAUTHORIZED_ACCOUNT"),
        )),
    }
}

fn load(st: &ApiState, cid: &str) -> Result<(SnapshotRec, Arc<BlockMap>), Response> {
    let rec = st.cpi.with_core(|c| c.snapshot(cid));
    let rec = match rec {
        Ok(Some(r)) => r,
        Ok(None) => {
            return Err(api_error(
                404,
                "ResourceNotFoundException",
                &format!("The snapshot '{cid}' does not exist"),
                Some("SNAPSHOT_NOT_FOUND"),
            ))
        }
        Err(e) => return Err(api_error(500, "InternalServerException", &e.message, None)),
    };
    if let Some(m) = st.cache.lock().unwrap_or_else(|p| p.into_inner()).get(cid) {
        return Ok((rec, m.clone()));
    }
    let map = match st.cpi.with_core(|c| c.snapshot_blocks(cid)) {
        Ok((_, m)) => Arc::new(m),
        Err(e) => return Err(api_error(500, "InternalServerException", &e.message, None)),
    };
    st.cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(cid.to_string(), map.clone());
    Ok((rec, map))
}

/// The page token: `<first>/<second>/<next block index>`, hex-encoded. It
/// names the listing it belongs to, so a token of another listing is refused.
fn encode_token(first: &str, second: &str, next: u64) -> String {
    hex::encode(format!("{first}/{second}/{next}"))
}

fn decode_token(tok: &str, first: &str, second: &str) -> Option<u64> {
    let raw = String::from_utf8(hex::decode(tok).ok()?).ok()?;
    let mut parts = raw.rsplitn(2, '/');
    let next: u64 = parts.next()?.parse().ok()?;
    (parts.next()? == format!("{first}/{second}")).then_some(next)
}

struct Page {
    start: u64,
    max: usize,
}

fn page(q: &PageQuery, first: &str, second: &str) -> Result<Page, Response> {
    let max = q.max_results.unwrap_or(MAX_RESULTS);
    if !(MIN_RESULTS..=MAX_RESULTS).contains(&max) {
        return Err(api_error(
            400,
            "ValidationException",
            &format!("MaxResults must be between {MIN_RESULTS} and {MAX_RESULTS}"),
            Some("INVALID_PARAMETER_VALUE"),
        ));
    }
    let start = match &q.page_token {
        Some(t) if !t.is_empty() => decode_token(t, first, second).ok_or_else(|| {
            api_error(
                400,
                "ValidationException",
                "The pagination token is not valid for this request",
                Some("INVALID_PAGE_TOKEN"),
            )
        })?,
        _ => q.starting_block_index.unwrap_or(0),
    };
    Ok(Page {
        start,
        max: max as usize,
    })
}

fn volume_size(rec: &SnapshotRec) -> serde_json::Value {
    // EBS reports GiB; the lab's disks are MiB-sized, so also give the exact bytes.
    json!({
        "VolumeSize": rec.size_mib.div_ceil(1024),
        "VolumeSizeBytes": rec.size_mib * 1024 * 1024,
    })
}

fn block_token(cid: &str, index: u64, hash: u64) -> String {
    format!("{cid}.{index}.{hash:016x}")
}

async fn list_snapshot_blocks(
    State(st): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<PageQuery>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = authorize(&st, &headers) {
        return r;
    }
    let p = match page(&q, "", &id) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let (rec, map) = match load(&st, &id) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut blocks = Vec::new();
    let mut next = None;
    for (i, v) in map.range(p.start..) {
        if blocks.len() == p.max {
            next = Some(*i);
            break;
        }
        blocks.push(json!({"BlockIndex": i, "BlockToken": block_token(&id, *i, v.hash)}));
    }
    let mut body = json!({ "BlockSize": BLOCK_SIZE, "Blocks": blocks });
    merge(&mut body, volume_size(&rec));
    if let Some(n) = next {
        body["NextToken"] = json!(encode_token("", &id, n));
    }
    axum::Json(body).into_response()
}

async fn list_changed_blocks(
    State(st): State<ApiState>,
    Path(second): Path<String>,
    Query(q): Query<PageQuery>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = authorize(&st, &headers) {
        return r;
    }
    let Some(first) = q.first_snapshot_id.clone().filter(|f| !f.is_empty()) else {
        return api_error(
            400,
            "ValidationException",
            "FirstSnapshotId is required",
            Some("INVALID_PARAMETER_VALUE"),
        );
    };
    let p = match page(&q, &first, &second) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let (a, am) = match load(&st, &first) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (b, bm) = match load(&st, &second) {
        Ok(x) => x,
        Err(r) => return r,
    };
    if a.disk_cid != b.disk_cid {
        return api_error(
            400,
            "ValidationException",
            "The snapshots must be of the same volume",
            Some("INVALID_VOLUME_LINEAGE"),
        );
    }
    let mut changed = Vec::new();
    let mut next = None;
    // Walk both maps from the start index; the union of their keys in order.
    let mut ai = am.range(p.start..).peekable();
    let mut bi = bm.range(p.start..).peekable();
    loop {
        let i = match (ai.peek(), bi.peek()) {
            (None, None) => break,
            (Some((x, _)), None) => **x,
            (None, Some((y, _))) => **y,
            (Some((x, _)), Some((y, _))) => (**x).min(**y),
        };
        let fa = ai.next_if(|(x, _)| **x == i).map(|(_, v)| *v);
        let fb = bi.next_if(|(y, _)| **y == i).map(|(_, v)| *v);
        if fa == fb {
            continue;
        }
        if changed.len() == p.max {
            next = Some(i);
            break;
        }
        let mut e = json!({ "BlockIndex": i });
        if let Some(v) = fa {
            e["FirstBlockToken"] = json!(block_token(&first, i, v.hash));
        }
        if let Some(v) = fb {
            e["SecondBlockToken"] = json!(block_token(&second, i, v.hash));
        }
        changed.push(e);
    }
    let mut body = json!({ "BlockSize": BLOCK_SIZE, "ChangedBlocks": changed });
    merge(&mut body, volume_size(&b));
    if let Some(n) = next {
        body["NextToken"] = json!(encode_token(&first, &second, n));
    }
    axum::Json(body).into_response()
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    if let (Some(a), serde_json::Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

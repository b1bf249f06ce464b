//! Fake external-snapshot-metadata sidecar: takes the backup client's
//! audience-scoped `security_token` on every call, authenticates it with a
//! TokenReview (audience = the SnapshotMetadataService's), authorizes it with
//! a SubjectAccessReview for `get` on `volumesnapshots` in the request's
//! namespace, resolves the VolumeSnapshot names to CSI snapshot handles
//! (VolumeSnapshot → bound VolumeSnapshotContent → `status.snapshotHandle`,
//! read from the Kubernetes fake), and relays GetMetadataAllocated/GetMetadataDelta to the driver's
//! SnapshotMetadata service on its Unix socket. Nothing reaches the driver
//! before both reviews pass.
//!
//! The request shapes are the sidecar's own API (package `snapshotmetadata`
//! of kubernetes-csi/external-snapshot-metadata: security_token, namespace,
//! snapshot names, starting_offset, max_results); the response messages are
//! the CSI ones, which that API mirrors field for field. The driver's session
//! token travels in the `x-snapshot-session` gRPC header both ways.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use drivelab_proto::csi::{
    snapshot_metadata_client::SnapshotMetadataClient, GetMetadataAllocatedRequest,
    GetMetadataAllocatedResponse, GetMetadataDeltaRequest, GetMetadataDeltaResponse,
};
use serde_json::json;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::cosi_sidecar::{connect_unix_with, KubeSlot};
use crate::gate::{CallSpec, Gate, Verdict};
use crate::history::{Component, Outcome};
use crate::kube::review::Reviews;
use crate::kube::Kind;
use crate::ops::Op;

crate::declare_ops!(
    /// The SnapshotMetadata RPCs this sidecar relays to the driver.
    pub DRIVER_RPCS {
        GET_METADATA_ALLOCATED = "GetMetadataAllocated",
        GET_METADATA_DELTA = "GetMetadataDelta",
    }
);

crate::declare_ops!(
    /// What this sidecar asks the Kubernetes API (in process, through the
    /// sidecar→Kube gate).
    pub KUBE_OPS {
        TOKENREVIEWS_CREATE = "tokenreviews.create",
        SUBJECTACCESSREVIEWS_CREATE = "subjectaccessreviews.create",
        VOLUMESNAPSHOTS_GET = "volumesnapshots.get",
        VOLUMESNAPSHOTCONTENTS_GET = "volumesnapshotcontents.get",
    }
);

/// The HTTP/2 stream window the sidecar grants the driver (bytes). Small on
/// purpose: a driver that pages its IaaS ahead of a slow client blocks on
/// send after a few messages instead of megabytes, so whether it has read its
/// next page when the lab acts mid-stream does not depend on thread timing.
pub const DRIVER_STREAM_WINDOW: u32 = 8 * 1024;

/// Dial the driver's socket with the sidecar's small stream window.
async fn dial(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    connect_unix_with(socket, |e| {
        e.initial_stream_window_size(DRIVER_STREAM_WINDOW)
    })
    .await
}

/// Request header carrying the reviewed client identity to the driver.
pub const CLIENT_HEADER: &str = "x-snapshot-client";
/// Header carrying the driver's session token (both directions).
pub const SESSION_HEADER: &str = "x-snapshot-session";

/// The SnapshotMetadataService object (cbt.storage.k8s.io/v1alpha1, one per
/// driver, cluster-scoped): where clients find the sidecar and which audience
/// their tokens must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotMetadataService {
    /// Object name = the CSI driver name.
    pub name: String,
    /// `spec.address`: host:port of the sidecar's TLS gRPC endpoint.
    pub address: String,
    /// `spec.caCert`: PEM of the CA that signed the sidecar's certificate.
    pub ca_cert: String,
    /// `spec.audience`: the audience client tokens must be scoped to.
    pub audience: String,
}

impl SnapshotMetadataService {
    /// The object as the API server would serve it.
    pub fn to_object(&self) -> serde_json::Value {
        json!({
            "apiVersion": "cbt.storage.k8s.io/v1alpha1",
            "kind": "SnapshotMetadataService",
            "metadata": {"name": self.name},
            "spec": {"address": self.address, "caCert": self.ca_cert, "audience": self.audience},
        })
    }
}

/// The sidecar's GetMetadataAllocatedRequest.
#[derive(Clone, Debug, Default)]
pub struct AllocatedRequest {
    /// Audience-scoped Kubernetes token of the client.
    pub security_token: String,
    /// Namespace of the VolumeSnapshot.
    pub namespace: String,
    /// VolumeSnapshot name.
    pub snapshot_name: String,
    /// Byte offset to resume from.
    pub starting_offset: i64,
    /// Tuples per message (0 = driver's choice).
    pub max_results: i32,
}

/// The sidecar's GetMetadataDeltaRequest.
#[derive(Clone, Debug, Default)]
pub struct DeltaRequest {
    /// Audience-scoped Kubernetes token of the client.
    pub security_token: String,
    /// Namespace of both VolumeSnapshots.
    pub namespace: String,
    /// The older VolumeSnapshot.
    pub base_snapshot_name: String,
    /// The newer VolumeSnapshot.
    pub target_snapshot_name: String,
    /// Byte offset to resume from.
    pub starting_offset: i64,
    /// Tuples per message (0 = driver's choice).
    pub max_results: i32,
}

/// An open stream relayed from the driver. It dies with the sidecar process
/// that relays it: after a [`SnapshotMetadataSidecar::restart`] the next read
/// fails UNAVAILABLE and the relay to the driver is dropped.
pub struct MetadataStream<T> {
    inner: Option<tonic::Streaming<T>>,
    /// The driver's session token for resuming this stream.
    pub session: Option<String>,
    life: tokio::sync::watch::Receiver<u64>,
    born: u64,
}

impl<T> MetadataStream<T> {
    /// The next message; `Ok(None)` at the end.
    pub async fn next(&mut self) -> Result<Option<T>, Status> {
        if *self.life.borrow() != self.born {
            // Dropping the relay cancels the driver's stream, as a dead
            // sidecar's closed connection would.
            self.inner = None;
        }
        match self.inner.as_mut() {
            Some(s) => s.message().await,
            None => Err(Status::unavailable(
                "the snapshot-metadata sidecar restarted; this stream is gone (resume from starting_offset)",
            )),
        }
    }
}

/// The sidecar. Cheap to clone.
#[derive(Clone)]
pub struct SnapshotMetadataSidecar {
    client: Arc<Mutex<SnapshotMetadataClient<Channel>>>,
    socket: PathBuf,
    reviews: Reviews,
    kube: KubeSlot,
    gate: Gate,
    audience: String,
    /// Bumped on every restart; streams opened before it die.
    life: Arc<tokio::sync::watch::Sender<u64>>,
}

fn outcome(r: &Result<(), Status>) -> Outcome {
    match r {
        Ok(()) => Outcome::Grpc {
            code: "OK".into(),
            message: String::new(),
        },
        Err(s) => Outcome::Grpc {
            code: format!("{:?}", s.code()),
            message: s.message().to_string(),
        },
    }
}

impl SnapshotMetadataSidecar {
    /// Connect to the driver's socket; tokens must carry `audience`;
    /// VolumeSnapshots are read from `kube`.
    pub async fn connect(
        socket: &Path,
        reviews: Reviews,
        kube: KubeSlot,
        gate: Gate,
        audience: &str,
    ) -> Result<Self, tonic::transport::Error> {
        let ch = dial(socket).await?;
        Ok(SnapshotMetadataSidecar {
            client: Arc::new(Mutex::new(SnapshotMetadataClient::new(ch))),
            socket: socket.to_path_buf(),
            reviews,
            kube,
            gate,
            audience: audience.to_string(),
            life: Arc::new(tokio::sync::watch::channel(0).0),
        })
    }

    /// The sidecar process restarts: every open stream dies (its next read
    /// fails UNAVAILABLE and the relay to the driver is dropped) and the
    /// connection to the driver is dialled afresh.
    pub async fn restart(&self) -> Result<(), tonic::transport::Error> {
        self.life.send_modify(|n| *n += 1);
        let ch = dial(&self.socket).await?;
        *self.client.lock().unwrap_or_else(|p| p.into_inner()) = SnapshotMetadataClient::new(ch);
        Ok(())
    }

    /// One call to the Kubernetes API through the gate.
    async fn kube_call<T>(&self, op: Op, f: impl FnOnce() -> T) -> Result<T, Status> {
        let spec = CallSpec::new(Component::CsiSnapshotMetadata, Component::Kube, op, "");
        let (id, v) = self.gate.enter(&spec).await;
        match v {
            Verdict::Proceed => {}
            Verdict::Reject(r) => {
                let s = Status::unavailable(format!("{op}: {}", r.message));
                self.gate.leave(id, &spec, outcome(&Err(s.clone()))).await;
                return Err(s);
            }
            Verdict::Cut => {
                self.gate.cut_before(id);
                return Err(Status::unavailable(format!(
                    "{op}: the Kubernetes API did not answer"
                )));
            }
        }
        let out = f();
        self.gate.leave(id, &spec, outcome(&Ok(()))).await;
        Ok(out)
    }

    /// TokenReview then SubjectAccessReview; the reviewed username.
    async fn authorize(&self, token: &str, namespace: &str) -> Result<String, Status> {
        if token.is_empty() {
            return Err(Status::unauthenticated("security_token is required"));
        }
        let tr = json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        });
        let tr = self
            .kube_call(TOKENREVIEWS_CREATE, || self.reviews.token_review(&tr))
            .await?;
        if tr.pointer("/status/authenticated") != Some(&json!(true)) {
            // The token itself never goes into a message.
            return Err(Status::unauthenticated(format!(
                "token review refused: {}",
                tr.pointer("/status/error")
                    .and_then(|v| v.as_str())
                    .unwrap_or("not authenticated")
            )));
        }
        let user = tr
            .pointer("/status/user/username")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let groups = tr
            .pointer("/status/user/groups")
            .cloned()
            .unwrap_or(json!([]));
        let sar = json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": {
                "namespace": namespace, "verb": "get",
                "group": "snapshot.storage.k8s.io", "resource": "volumesnapshots"}},
        });
        let sar = self
            .kube_call(SUBJECTACCESSREVIEWS_CREATE, || {
                self.reviews.subject_access_review(&sar)
            })
            .await?;
        if sar.pointer("/status/allowed") != Some(&json!(true)) {
            return Err(Status::permission_denied(format!(
                "{user} may not get volumesnapshots in namespace {namespace:?}"
            )));
        }
        Ok(user)
    }

    /// VolumeSnapshot → its bound VolumeSnapshotContent → `status.snapshotHandle`,
    /// each a GET on the Kubernetes API, as the real sidecar resolves names.
    async fn resolve(&self, namespace: &str, name: &str) -> Result<String, Status> {
        if name.is_empty() {
            return Err(Status::invalid_argument("snapshot name is required"));
        }
        let kube = self.kube.read().unwrap_or_else(|p| p.into_inner()).clone();
        let gone = || {
            Status::not_found(format!(
                "VolumeSnapshot {namespace}/{name} does not exist or is not ready"
            ))
        };
        let vs = self
            .kube_call(VOLUMESNAPSHOTS_GET, || {
                kube.get(Kind::VolumeSnapshot, Some(namespace), name)
            })
            .await?
            .map_err(|e| Status::unavailable(format!("reading VolumeSnapshot: {e}")))?
            .ok_or_else(gone)?;
        let str_at = |v: &serde_json::Value, p: &[&str]| crate::json::str_at(v, p);
        let content = str_at(&vs, &["status", "boundVolumeSnapshotContentName"]);
        if vs.pointer("/status/readyToUse") != Some(&json!(true)) || content.is_empty() {
            return Err(gone());
        }
        let vsc = self
            .kube_call(VOLUMESNAPSHOTCONTENTS_GET, || {
                kube.get(Kind::VolumeSnapshotContent, None, &content)
            })
            .await?
            .map_err(|e| Status::unavailable(format!("reading VolumeSnapshotContent: {e}")))?
            .ok_or_else(gone)?;
        Some(str_at(&vsc, &["status", "snapshotHandle"]))
            .filter(|h| !h.is_empty())
            .ok_or_else(gone)
    }

    fn headers<T>(msg: T, user: &str, session: Option<&str>) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Ok(v) = user.parse() {
            r.metadata_mut().insert(CLIENT_HEADER, v);
        }
        if let Some(v) = session.and_then(|s| s.parse().ok()) {
            r.metadata_mut().insert(SESSION_HEADER, v);
        }
        r
    }

    fn session_of(md: &tonic::metadata::MetadataMap) -> Option<String> {
        md.get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    /// Relay one driver call through the gate (sidecar → driver).
    async fn driver_call<F, Fut, T>(
        &self,
        op: Op,
        subject: &str,
        f: F,
    ) -> Result<MetadataStream<T>, Status>
    where
        F: FnOnce(SnapshotMetadataClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<tonic::Streaming<T>>, Status>>,
    {
        let spec = CallSpec::new(
            Component::CsiSnapshotMetadata,
            Component::Driver,
            op,
            subject,
        );
        let (id, v) = self.gate.enter(&spec).await;
        match v {
            Verdict::Proceed => {}
            Verdict::Reject(r) => {
                let s = Status::new(Code::Unavailable, r.message);
                self.gate.leave(id, &spec, outcome(&Err(s.clone()))).await;
                return Err(s);
            }
            Verdict::Cut => {
                self.gate.cut_before(id);
                return Err(Status::unavailable(format!(
                    "{op}: the driver did not answer"
                )));
            }
        }
        let client = self
            .client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let r = f(client).await;
        let rec = r.as_ref().map(drop).map_err(Clone::clone);
        self.gate.leave(id, &spec, outcome(&rec)).await;
        let resp = r?;
        let session = Self::session_of(resp.metadata());
        Ok(MetadataStream {
            inner: Some(resp.into_inner()),
            session,
            born: *self.life.borrow(),
            life: self.life.subscribe(),
        })
    }

    /// GetMetadataAllocated; `session` resumes a stream the driver opened.
    pub async fn get_metadata_allocated(
        &self,
        req: AllocatedRequest,
        session: Option<&str>,
    ) -> Result<MetadataStream<GetMetadataAllocatedResponse>, Status> {
        let user = self.authorize(&req.security_token, &req.namespace).await?;
        let snap = self.resolve(&req.namespace, &req.snapshot_name).await?;
        let msg = GetMetadataAllocatedRequest {
            snapshot_id: snap.clone(),
            starting_offset: req.starting_offset,
            max_results: req.max_results,
            secrets: Default::default(),
        };
        let r = Self::headers(msg, &user, session);
        self.driver_call(GET_METADATA_ALLOCATED, &snap, |mut c| async move {
            c.get_metadata_allocated(r).await
        })
        .await
    }

    /// GetMetadataDelta; `session` resumes a stream the driver opened.
    pub async fn get_metadata_delta(
        &self,
        req: DeltaRequest,
        session: Option<&str>,
    ) -> Result<MetadataStream<GetMetadataDeltaResponse>, Status> {
        let user = self.authorize(&req.security_token, &req.namespace).await?;
        let base = self
            .resolve(&req.namespace, &req.base_snapshot_name)
            .await?;
        let target = self
            .resolve(&req.namespace, &req.target_snapshot_name)
            .await?;
        let msg = GetMetadataDeltaRequest {
            base_snapshot_id: base.clone(),
            target_snapshot_id: target.clone(),
            starting_offset: req.starting_offset,
            max_results: req.max_results,
            secrets: Default::default(),
        };
        let r = Self::headers(msg, &user, session);
        self.driver_call(
            GET_METADATA_DELTA,
            &format!("{base}..{target}"),
            |mut c| async move { c.get_metadata_delta(r).await },
        )
        .await
    }
}

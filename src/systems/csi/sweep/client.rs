//! The sweep's side of the wire: one gated call to the controller or node
//! plugin (recorded in the history from `lab`, faults apply), and the case
//! log each call's id goes into. A call the lab's faults spoiled is retried as
//! a CO would, so a sweep under faults judges the driver, not the faults.

use std::future::Future;
use std::time::Duration;

use drivelab_fakes::cosi_sidecar::{code_name, through_gate, AnsweredBy};
use drivelab_fakes::gate::{CallSpec, Gate};
use drivelab_fakes::history::{Component, EventKind};
use drivelab_fakes::ops::Op;
use drivelab_proto::csi;
use drivelab_proto::csi::controller_client::ControllerClient;
use drivelab_proto::csi::identity_client::IdentityClient;
use drivelab_proto::csi::node_client::NodeClient;
use tonic::transport::Channel;

use super::{CaseOutcome, SweepCase};

/// What a reply hands out, by id.
pub(crate) enum Made<'a> {
    /// A volume (CreateVolume).
    Volume(&'a str),
    /// A snapshot (CreateSnapshot).
    Snapshot(&'a str),
}

/// What a reply says the driver made.
pub(crate) trait Yields {
    /// The volume or snapshot the reply hands out, if any.
    fn made(&self) -> Option<Made<'_>> {
        None
    }
}

impl Yields for csi::CreateVolumeResponse {
    fn made(&self) -> Option<Made<'_>> {
        self.volume.as_ref().map(|v| Made::Volume(&v.volume_id))
    }
}

impl Yields for csi::CreateSnapshotResponse {
    fn made(&self) -> Option<Made<'_>> {
        self.snapshot
            .as_ref()
            .map(|s| Made::Snapshot(&s.snapshot_id))
    }
}

macro_rules! yields_nothing {
    ($($t:ident),*) => { $(impl Yields for csi::$t {})* };
}
yields_nothing!(
    ControllerExpandVolumeResponse,
    ControllerGetCapabilitiesResponse,
    ControllerGetVolumeResponse,
    ControllerPublishVolumeResponse,
    ControllerUnpublishVolumeResponse,
    DeleteSnapshotResponse,
    DeleteVolumeResponse,
    GetCapacityResponse,
    GetPluginCapabilitiesResponse,
    GetPluginInfoResponse,
    ListSnapshotsResponse,
    ListVolumesResponse,
    NodeExpandVolumeResponse,
    NodeGetCapabilitiesResponse,
    NodeGetInfoResponse,
    NodeGetVolumeStatsResponse,
    NodePublishVolumeResponse,
    NodeStageVolumeResponse,
    NodeUnpublishVolumeResponse,
    NodeUnstageVolumeResponse,
    ProbeResponse,
    ValidateVolumeCapabilitiesResponse
);

/// A reply: the message, or the gRPC code and message.
pub(crate) type Reply<T> = Result<T, (tonic::Code, String)>;

/// The code name of a reply (`OK`, `NOT_FOUND`, ...).
pub(crate) fn code_of<T>(r: &Reply<T>) -> String {
    match r {
        Ok(_) => "OK".into(),
        Err((c, _)) => code_name(*c),
    }
}

/// `CODE (message)` of a reply, for details.
pub(crate) fn said<T>(r: &Reply<T>) -> String {
    match r {
        Ok(_) => "OK".into(),
        Err((c, m)) => format!("{} ({m})", code_name(*c)),
    }
}

/// Attempts of one sweep call at most: the first and the retries the lab's
/// faults called for. A fault armed for more occurrences than this spoils
/// the case, visibly (its answer is judged as the driver's).
const MAX_ATTEMPTS: usize = 5;

/// Codes a CO retries because the call may not have done its work yet.
fn transient(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        Unavailable | DeadlineExceeded | Aborted | Internal | Unknown | Cancelled
    )
}

/// The sweep's connection to the driver and its running record.
pub(crate) struct Sweeper {
    gate: Gate,
    ctl: Channel,
    node: Channel,
    timeout: Duration,
    /// The lab's fault hook: a retry waits until a crash or restart it began has finished.
    hook: std::sync::Arc<crate::engine::hook::LabHook>,
    /// Calls of the case being run.
    calls: Vec<u64>,
    /// Calls of the case being run that were retried after a fault.
    retried: usize,
    /// Cases so far.
    pub cases: Vec<SweepCase>,
    /// What the sweep's calls made and removed.
    pub ledger: super::SweepLedger,
}

impl Sweeper {
    pub(crate) fn new(
        gate: Gate,
        ctl: Channel,
        node: Channel,
        timeout: Duration,
        hook: std::sync::Arc<crate::engine::hook::LabHook>,
    ) -> Self {
        Self {
            gate,
            ctl,
            node,
            timeout,
            hook,
            calls: Vec::new(),
            retried: 0,
            cases: Vec::new(),
            ledger: Default::default(),
        }
    }

    /// One call through the gate, retried while the lab's faults spoiled it:
    /// the lab answered or cut it, or injected a fault while the driver
    /// worked on it (a backend error, a crash) and the driver's answer is
    /// transient — what a CO retries. A driver's own transient answer with
    /// no fault behind it is judged as given.
    async fn gated<T: Yields, F, Fut>(&mut self, op: Op, subject: &str, make: F) -> Reply<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let call = CallSpec::new(Component::Lab, Component::Driver, op, subject);
        let timeout = self.timeout;
        let history = self.gate.history().clone();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let from = history.len();
            let fut = make();
            let rpc = async move {
                match tokio::time::timeout(timeout, fut).await {
                    Ok(Ok(r)) => Ok(r.into_inner()),
                    Ok(Err(s)) => Err((s.code(), s.message().to_string())),
                    Err(_) => Err((
                        tonic::Code::DeadlineExceeded,
                        format!("{} timed out after {timeout:?}", op.as_str()),
                    )),
                }
            };
            let (id, result, by) = through_gate(&self.gate, &call, rpc).await;
            self.calls.push(id.0);
            let spoiled = match (&result, by) {
                (Ok(_), _) => false,
                (Err(_), AnsweredBy::Injected | AnsweredBy::Lost) => true,
                (Err((code, _)), AnsweredBy::Driver) => {
                    transient(*code)
                        && history
                            .events_from(from)
                            .iter()
                            .any(|e| matches!(e.kind, EventKind::Fault { .. }))
                }
            };
            if !spoiled || attempt >= MAX_ATTEMPTS {
                self.ledger.note(op, subject, id.0, &result);
                return result;
            }
            self.retried += 1;
            self.hook.until_idle().await;
        }
    }

    /// One Controller RPC. `f` is called once per attempt (its captures are
    /// cloned for each).
    pub(crate) async fn ctl<T: Yields, F, Fut>(&mut self, op: Op, subject: &str, f: F) -> Reply<T>
    where
        F: FnOnce(ControllerClient<Channel>) -> Fut + Clone,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let ch = self.ctl.clone();
        self.gated(op, subject, || f.clone()(ControllerClient::new(ch.clone())))
            .await
    }

    /// One Node RPC.
    pub(crate) async fn node<T: Yields, F, Fut>(&mut self, op: Op, subject: &str, f: F) -> Reply<T>
    where
        F: FnOnce(NodeClient<Channel>) -> Fut + Clone,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let ch = self.node.clone();
        self.gated(op, subject, || f.clone()(NodeClient::new(ch.clone())))
            .await
    }

    /// One Identity RPC (to the controller; `node_side` for the node plugin's).
    pub(crate) async fn identity<T: Yields, F, Fut>(
        &mut self,
        op: Op,
        node_side: bool,
        f: F,
    ) -> Reply<T>
    where
        F: FnOnce(IdentityClient<Channel>) -> Fut + Clone,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let ch = if node_side { &self.node } else { &self.ctl }.clone();
        self.gated(op, "", || f.clone()(IdentityClient::new(ch.clone())))
            .await
    }

    /// Close the current case: failures (if any) make it fail, else it passes
    /// with `ok` as its detail. Retries the lab's faults called for are named.
    pub(crate) fn judge(&mut self, id: &str, rule: &str, fails: Vec<String>, ok: String) {
        let (outcome, mut detail) = if fails.is_empty() {
            (CaseOutcome::Pass, ok)
        } else {
            (CaseOutcome::Fail, fails.join("; "))
        };
        if self.retried > 0 {
            detail.push_str(&format!(
                " ({} call(s) retried after the lab's faults)",
                self.retried
            ));
        }
        self.record(id, rule, outcome, detail);
    }

    /// A case that does not apply, and why.
    pub(crate) fn not_applicable(&mut self, id: &str, rule: &str, why: impl Into<String>) {
        self.record(id, rule, CaseOutcome::NotApplicable, why.into());
    }

    fn record(&mut self, id: &str, rule: &str, outcome: CaseOutcome, detail: String) {
        self.retried = 0;
        self.cases.push(SweepCase {
            id: id.to_string(),
            rule: rule.to_string(),
            outcome,
            detail,
            calls: std::mem::take(&mut self.calls),
        });
    }
}

/// `want` code, or a failure line naming what came instead.
pub(crate) fn expect_code<T>(fails: &mut Vec<String>, what: &str, r: &Reply<T>, want: &str) {
    let got = code_of(r);
    if got != want {
        fails.push(format!("{what}: answered {}, expected {want}", said(r)));
    }
}

//! The sweep's side of the wire: one gated call to the controller or node
//! plugin (recorded in the history from `lab`, faults apply), and the case
//! log each call's id goes into.

use std::future::Future;
use std::time::Duration;

use drivelab_fakes::cosi_sidecar::{code_name, through_gate};
use drivelab_fakes::gate::{CallSpec, Gate};
use drivelab_fakes::history::Component;
use drivelab_fakes::ops::Op;
use drivelab_proto::csi::controller_client::ControllerClient;
use drivelab_proto::csi::identity_client::IdentityClient;
use drivelab_proto::csi::node_client::NodeClient;
use tonic::transport::Channel;

use super::{CaseOutcome, SweepCase};

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

/// The sweep's connection to the driver and its running record.
pub(crate) struct Sweeper {
    gate: Gate,
    ctl: Channel,
    node: Channel,
    timeout: Duration,
    /// Calls of the case being run.
    calls: Vec<u64>,
    /// Cases so far.
    pub cases: Vec<SweepCase>,
}

impl Sweeper {
    pub(crate) fn new(gate: Gate, ctl: Channel, node: Channel, timeout: Duration) -> Self {
        Self {
            gate,
            ctl,
            node,
            timeout,
            calls: Vec::new(),
            cases: Vec::new(),
        }
    }

    async fn gated<T, Fut>(&mut self, op: Op, subject: &str, fut: Fut) -> Reply<T>
    where
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let call = CallSpec::new(Component::Lab, Component::Driver, op, subject);
        let timeout = self.timeout;
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
        let (id, result, _) = through_gate(&self.gate, &call, rpc).await;
        self.calls.push(id.0);
        result
    }

    /// One Controller RPC.
    pub(crate) async fn ctl<T, F, Fut>(&mut self, op: Op, subject: &str, f: F) -> Reply<T>
    where
        F: FnOnce(ControllerClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let fut = f(ControllerClient::new(self.ctl.clone()));
        self.gated(op, subject, fut).await
    }

    /// One Node RPC.
    pub(crate) async fn node<T, F, Fut>(&mut self, op: Op, subject: &str, f: F) -> Reply<T>
    where
        F: FnOnce(NodeClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let fut = f(NodeClient::new(self.node.clone()));
        self.gated(op, subject, fut).await
    }

    /// One Identity RPC (to the controller; `node_side` for the node plugin's).
    pub(crate) async fn identity<T, F, Fut>(&mut self, op: Op, node_side: bool, f: F) -> Reply<T>
    where
        F: FnOnce(IdentityClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let ch = if node_side { &self.node } else { &self.ctl };
        let fut = f(IdentityClient::new(ch.clone()));
        self.gated(op, "", fut).await
    }

    /// Close the current case: failures (if any) make it fail, else it passes
    /// with `ok` as its detail.
    pub(crate) fn judge(&mut self, id: &str, rule: &str, fails: Vec<String>, ok: String) {
        let (outcome, detail) = if fails.is_empty() {
            (CaseOutcome::Pass, ok)
        } else {
            (CaseOutcome::Fail, fails.join("; "))
        };
        self.record(id, rule, outcome, detail);
    }

    /// A case that does not apply, and why.
    pub(crate) fn not_applicable(&mut self, id: &str, rule: &str, why: impl Into<String>) {
        self.record(id, rule, CaseOutcome::NotApplicable, why.into());
    }

    fn record(&mut self, id: &str, rule: &str, outcome: CaseOutcome, detail: String) {
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

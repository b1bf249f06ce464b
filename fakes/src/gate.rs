//! The interception point. Every request from a driver into a fake, and every
//! sidecar→driver call, passes one `Gate`: it is recorded in the history here,
//! and this is where faults and scheduling hang (nothing else in a fake knows
//! about them).

use std::sync::{Arc, RwLock};

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;

use crate::history::{CallId, Component, History, Outcome};
use crate::ops::Op;
use crate::serve::CutSwitch;

/// What a call is: who calls whom, for what, on which resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallSpec {
    /// Caller.
    pub from: Component,
    /// Callee (the fake or driver behind this gate).
    pub to: Component,
    /// Operation, e.g. `add_user`, `put_object`, `DriverGrantBucketAccess`:
    /// always one the callee declared (see [`crate::ops`]).
    pub op: Op,
    /// Resource the call concerns (never a secret).
    pub subject: String,
}

impl CallSpec {
    /// Convenience constructor.
    pub fn new(from: Component, to: Component, op: Op, subject: impl Into<String>) -> Self {
        Self {
            from,
            to,
            op,
            subject: subject.into(),
        }
    }
}

/// A hook's decision before the callee runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Let the call through.
    Proceed,
    /// Answer it with an error without reaching the callee's logic.
    Reject(Rejection),
    /// Break the connection: the request never reaches the callee and the
    /// caller sees the connection drop (a partition, a crash before commit).
    Cut,
}

/// A hook's decision after the callee answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The reply reaches the caller.
    Deliver,
    /// The callee committed but the caller never sees the reply (the ambiguous failure).
    Cut,
}

/// An error answer produced at the gate (HTTP status and error code, or a gRPC code).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// HTTP status for HTTP fakes.
    pub http_status: u16,
    /// Protocol error code (`InternalError`, `UNAVAILABLE`, ...).
    pub code: String,
    /// Human-readable message.
    pub message: String,
}

/// Behaviour attached to a gate by the engine (faults, scheduling).
pub trait GateHook: Send + Sync {
    /// Called before the call is recorded: a caller may be held back here (the
    /// lab holds sidecars while a crashed driver restarts, so the restarted
    /// driver's own start-up calls always come first in the history).
    fn admit<'a>(&'a self, _call: &'a CallSpec) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
    /// Called before the callee runs (before it can commit anything).
    fn before<'a>(&'a self, id: CallId, call: &'a CallSpec) -> BoxFuture<'a, Verdict>;
    /// Called after the callee answered (it has committed), before the reply leaves.
    fn after<'a>(
        &'a self,
        id: CallId,
        call: &'a CallSpec,
        outcome: &'a Outcome,
    ) -> BoxFuture<'a, Delivery>;
}

/// One interception point, shared by every request path of a component.
#[derive(Clone)]
pub struct Gate {
    history: History,
    hook: Arc<RwLock<Option<Arc<dyn GateHook>>>>,
}

impl Gate {
    /// A gate that records into `history` and has no hook yet.
    pub fn new(history: History) -> Self {
        Self {
            history,
            hook: Arc::default(),
        }
    }

    /// The history this gate records into.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Attach (or replace) the hook that faults and scheduling use.
    pub fn set_hook(&self, hook: Arc<dyn GateHook>) {
        *self.hook.write().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    fn current_hook(&self) -> Option<Arc<dyn GateHook>> {
        self.hook.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Record the call and ask the hook whether it proceeds.
    pub async fn enter(&self, call: &CallSpec) -> (CallId, Verdict) {
        if let Some(h) = self.current_hook() {
            h.admit(call).await;
        }
        let id = self
            .history
            .call(call.from, call.to, call.op.as_str(), &call.subject);
        let verdict = match self.current_hook() {
            Some(h) => h.before(id, call).await,
            None => Verdict::Proceed,
        };
        (id, verdict)
    }

    /// Let the hook act after the commit, then record what the caller got.
    pub async fn leave(&self, id: CallId, call: &CallSpec, outcome: Outcome) -> Delivery {
        let delivery = match self.current_hook() {
            Some(h) => h.after(id, call, &outcome).await,
            None => Delivery::Deliver,
        };
        let seen = match delivery {
            Delivery::Deliver => outcome,
            Delivery::Cut => Outcome::NoReply {
                reason: format!("reply lost after {}", outcome.label()),
            },
        };
        self.history.reply(id, seen);
        delivery
    }

    /// Record that the call was cut before the callee saw it.
    pub fn cut_before(&self, id: CallId) {
        // The scheduler may already have recorded why (its caller crashed).
        if !self.history.has_reply(id) {
            self.history.reply(
                id,
                Outcome::NoReply {
                    reason: "connection cut before the callee saw the request".into(),
                },
            );
        }
    }
}

/// Names an HTTP request for the history: a fake's own routing knowledge.
pub type Classifier = fn(&http::request::Parts) -> CallSpec;

/// State for [`http_gate`]: the gate plus the fake's classifier.
#[derive(Clone)]
pub struct HttpTap {
    /// The fake's gate.
    pub gate: Gate,
    /// How this fake names its requests.
    pub classify: Classifier,
    /// How a rejection is rendered in this fake's error format.
    pub render: fn(&Rejection) -> Response,
}

/// axum middleware: passes every request of a fake through its gate.
/// Use with `axum::middleware::from_fn_with_state(tap, http_gate)`.
pub async fn http_gate(
    axum::extract::State(tap): axum::extract::State<HttpTap>,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let call = (tap.classify)(&parts);
    let cut = parts.extensions.get::<CutSwitch>().cloned();
    let (id, verdict) = tap.gate.enter(&call).await;
    let resp = match verdict {
        Verdict::Reject(r) => (tap.render)(&r),
        Verdict::Cut => {
            tap.gate.cut_before(id);
            return sever(cut).await;
        }
        Verdict::Proceed => next.run(Request::from_parts(parts, body)).await,
    };
    let outcome = Outcome::Http {
        status: resp.status().as_u16(),
        code: resp
            .headers()
            .get(ERROR_CODE_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    };
    if tap.gate.leave(id, &call, outcome).await == Delivery::Cut {
        return sever(cut).await;
    }
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(ERROR_CODE_HEADER);
    Response::from_parts(parts, body).into_response()
}

/// Drop the request's connection; never returns while the connection lives.
async fn sever(cut: Option<CutSwitch>) -> Response {
    match cut {
        Some(c) => {
            c.fire();
            // The connection task is dropped with this future; wait for that.
            std::future::pending::<()>().await;
            empty(503)
        }
        // Served without our accept loop (in-process router tests): the closest
        // a response can get to "no reply".
        None => empty(503),
    }
}

/// Handlers put their protocol error code (e.g. `NoSuchBucket`) in this response
/// header so the gate can record it; the gate strips it before the reply leaves.
pub const ERROR_CODE_HEADER: &str = "x-drivelab-error-code";

/// Build an empty body response (helper for renderers).
pub fn empty(status: u16) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    r
}

//! `metav1.Status` responses: every failure the fake reports over HTTP, shaped
//! like the real server's so kube-rs turns it into `Error::Api` with the right
//! code and reason, and tagged with `ERROR_CODE_HEADER` for the gate.

use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::{Kind, KubeError};
use crate::gate::{Rejection, ERROR_CODE_HEADER};

/// An HTTP-level failure: a Status body plus its HTTP code.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub(crate) fn not_found_path(path: &str) -> Self {
        // The real server answers unknown paths with a bare 404 page; a Status is
        // friendlier to clients and still reads as NotFound.
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    pub(crate) fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub(crate) fn status_body(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(d), Some(m)) = (&self.details, v.as_object_mut()) {
            m.insert("details".into(), d.clone());
        }
        // A plain server error has no reason (metav1.StatusReasonUnknown is "", omitted).
        if let (true, Some(m)) = (self.reason.is_empty(), v.as_object_mut()) {
            m.remove("reason");
        }
        v
    }
}

fn group_resource(kind: Kind, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": kind.plural()});
    if !kind.group().is_empty() {
        d["group"] = json!(kind.group());
    }
    d
}

impl From<KubeError> for ApiError {
    fn from(e: KubeError) -> Self {
        let (code, reason, message) = (e.http_code(), e.reason(), e.to_string());
        let details = match &e {
            KubeError::NotFound { kind, name }
            | KubeError::AlreadyExists { kind, name }
            | KubeError::Conflict { kind, name, .. }
            | KubeError::Forbidden { kind, name, .. } => Some(group_resource(*kind, name)),
            KubeError::Invalid {
                kind,
                name,
                field,
                message,
            } => {
                let mut d = json!({
                    "name": name,
                    "kind": kind.kind_name(),
                    "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field}],
                });
                if !kind.group().is_empty() {
                    d["group"] = json!(kind.group());
                }
                Some(d)
            }
            KubeError::ApplyConflict { causes, .. } => {
                let causes: Vec<Value> = causes
                    .iter()
                    .map(|(field, message)| json!({"reason": "FieldManagerConflict", "message": message, "field": field}))
                    .collect();
                Some(json!({"causes": causes}))
            }
            KubeError::BadRequest { .. }
            | KubeError::NotImplemented { .. }
            | KubeError::Internal { .. }
            | KubeError::Store(_) => None,
        };
        if let KubeError::Store(err) = &e {
            tracing::warn!(error = %err, "kube fake store failure");
        }
        Self {
            code,
            reason: reason.to_string(),
            message,
            details,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = http::StatusCode::from_u16(self.code)
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, axum::Json(self.status_body())).into_response();
        if let Ok(v) = http::HeaderValue::from_str(&self.reason) {
            resp.headers_mut().insert(ERROR_CODE_HEADER, v);
        }
        resp
    }
}

/// Render a gate rejection (an injected fault) as a Status with its HTTP code.
pub fn render_rejection(r: &Rejection) -> Response {
    let reason = if r.code.is_empty() {
        default_reason(r.http_status)
    } else {
        r.code.as_str()
    };
    ApiError::new(r.http_status, reason, r.message.clone()).into_response()
}

/// The reason the real server uses for a bare HTTP code.
fn default_reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

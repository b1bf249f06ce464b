//! The error answers of the fake: one `ApiError` type for every failure a
//! request can meet, rendered as S3's XML `<Error>` document, as the MinIO
//! admin API's JSON error or as RustFS's admin error, always tagged for the gate.

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode};

use crate::gate::{Rejection, ERROR_CODE_HEADER};

/// An error answer in protocol terms: HTTP status, error code, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
    /// A header the error answer carries (416's `Content-Range`).
    pub extra_header: Option<(&'static str, String)>,
}

impl ApiError {
    pub fn new(status: u16, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.to_string(),
            message: message.into(),
            extra_header: None,
        }
    }

    /// 501 naming what is not implemented.
    pub fn not_implemented(what: impl std::fmt::Display) -> Self {
        Self::new(
            501,
            "NotImplemented",
            format!("{what} is not implemented by the drivelab S3 fake."),
        )
    }
    pub fn malformed_xml() -> Self {
        Self::new(
            400,
            "MalformedXML",
            "The XML you provided was not well-formed or did not validate against our published schema.",
        )
    }

    pub fn access_denied() -> Self {
        Self::new(403, "AccessDenied", "Access Denied.")
    }
    pub fn no_such_bucket() -> Self {
        Self::new(404, "NoSuchBucket", "The specified bucket does not exist")
    }
    pub fn no_such_key() -> Self {
        Self::new(404, "NoSuchKey", "The specified key does not exist.")
    }
    pub fn signature_mismatch() -> Self {
        Self::new(
            403,
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. Check your key and signing method.",
        )
    }
    pub fn invalid_access_key() -> Self {
        Self::new(
            403,
            "InvalidAccessKeyId",
            "The AWS Access Key Id you provided does not exist in our records.",
        )
    }
    pub fn malformed_auth(msg: impl Into<String>) -> Self {
        Self::new(400, "AuthorizationHeaderMalformed", msg)
    }
    pub fn invalid_request(msg: impl Into<String>) -> Self {
        Self::new(400, "InvalidRequest", msg)
    }
    pub fn internal(msg: impl std::fmt::Display) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("We encountered an internal error, please try again. ({msg})"),
        )
    }

    // Admin API, MinIO's codes (RustFS's are in `Backend`).
    pub fn admin_no_such_user() -> Self {
        Self::new(
            404,
            "XMinioAdminNoSuchUser",
            "The specified user does not exist.",
        )
    }
    pub fn admin_no_such_policy() -> Self {
        Self::new(
            404,
            "XMinioAdminNoSuchPolicy",
            "The canned policy does not exist.",
        )
    }
    pub fn admin_invalid_argument(msg: impl Into<String>) -> Self {
        let msg = msg.into();
        let message = if msg.is_empty() {
            "Invalid arguments specified.".to_string()
        } else {
            msg
        };
        Self::new(400, "XMinioAdminInvalidArgument", message)
    }
    pub fn admin_bad_json() -> Self {
        Self::new(
            400,
            "XMinioAdminConfigBadJSON",
            "JSON configuration provided is of incorrect format",
        )
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        ApiError::internal(e)
    }
}

fn request_id() -> String {
    use rand::Rng;
    let n: u64 = rand::rng().random();
    format!("{n:016X}")
}

fn tagged(status: u16, code: &str, content_type: &str, body: Body) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(code) {
        h.insert(ERROR_CODE_HEADER, v);
    }
    if !content_type.is_empty() {
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(if content_type == "xml" {
                "application/xml"
            } else {
                "application/json"
            }),
        );
    }
    r
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// S3's XML error. HEAD answers carry no body (as S3 does), only the status.
pub(crate) fn s3_error_response(e: &ApiError, resource: &str, head: bool) -> Response {
    let mut r = s3_error_body(e, resource, head);
    if let Some((n, v)) = &e.extra_header {
        if let Ok(v) = HeaderValue::from_str(v) {
            r.headers_mut().insert(*n, v);
        }
    }
    r
}

fn s3_error_body(e: &ApiError, resource: &str, head: bool) -> Response {
    if head {
        return tagged(e.status, &e.code, "", Body::empty());
    }
    let id = request_id();
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message><Resource>{}</Resource><RequestId>{}</RequestId></Error>",
        xml_escape(&e.code),
        xml_escape(&e.message),
        xml_escape(resource),
        id
    );
    let mut r = tagged(e.status, &e.code, "xml", Body::from(body));
    if let Ok(v) = HeaderValue::from_str(&id) {
        r.headers_mut().insert("x-amz-request-id", v);
    }
    r
}

/// The admin API's JSON error (`madmin.ErrorResponse`).
pub(crate) fn admin_error_response(e: &ApiError, resource: &str) -> Response {
    let body = serde_json::json!({
        "Code": e.code,
        "Message": e.message,
        "Resource": resource,
        "RequestId": request_id(),
        "HostId": "drivelab",
    });
    tagged(e.status, &e.code, "json", Body::from(body.to_string()))
}

/// An admin API error as RustFS answers it on either prefix: an s3s
/// `S3Error`, rendered as `<Error><Code/><Message/></Error>` XML with the
/// code's own status (`rustfs/src/admin/handlers/iam_error.rs`; s3s
/// `serialize_error`). No `Resource`, no JSON, no `XMinioAdmin*` codes.
pub(crate) fn rustfs_admin_error_response(e: &ApiError) -> Response {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message></Error>",
        xml_escape(&e.code),
        xml_escape(&e.message),
    );
    tagged(e.status, &e.code, "xml", Body::from(body))
}

/// A gate rejection in RustFS's admin error shape (its admin routes' renderer).
pub(crate) fn render_rustfs_admin_rejection(r: &Rejection) -> Response {
    rustfs_admin_error_response(&ApiError::new(r.http_status, &r.code, r.message.clone()))
}

/// A gate rejection in S3's XML shape (the S3 routes' renderer).
pub(crate) fn render_s3_rejection(r: &Rejection) -> Response {
    let e = ApiError {
        status: r.http_status,
        code: r.code.clone(),
        message: r.message.clone(),
        extra_header: None,
    };
    s3_error_response(&e, "", false)
}

/// A gate rejection in the admin API's JSON shape (the admin routes' renderer).
pub(crate) fn render_admin_rejection(r: &Rejection) -> Response {
    let e = ApiError {
        status: r.http_status,
        code: r.code.clone(),
        message: r.message.clone(),
        extra_header: None,
    };
    admin_error_response(&e, "")
}

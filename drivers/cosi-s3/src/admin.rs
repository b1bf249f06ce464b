//! HTTP client for the backend: the RustFS admin API (plain JSON under
//! `/rustfs/admin/v3/`) and the few S3 bucket calls, all SigV4-signed with the
//! admin credentials by `aws-sigv4`, each bounded by a timeout, with backend
//! error bodies (S3 XML, admin JSON) parsed into typed codes.

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;

use crate::config::Connection;
use crate::error::DriverError;

/// Every backend call gives up after this long.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// S3 error code: the bucket does not exist.
pub const NO_SUCH_BUCKET: &str = "NoSuchBucket";
/// S3 error code: the bucket exists and the caller owns it.
pub const BUCKET_ALREADY_OWNED_BY_YOU: &str = "BucketAlreadyOwnedByYou";
/// S3 error code: the bucket exists and someone else owns it.
pub const BUCKET_ALREADY_EXISTS: &str = "BucketAlreadyExists";
/// S3 error code: delete of a bucket that still has objects.
pub const BUCKET_NOT_EMPTY: &str = "BucketNotEmpty";
/// MinIO/RustFS admin error code for a missing user.
pub const ADMIN_NO_SUCH_USER: &str = "XMinioAdminNoSuchUser";
/// MinIO/RustFS admin error code for a missing canned policy.
pub const ADMIN_NO_SUCH_POLICY: &str = "XMinioAdminNoSuchPolicy";
/// MinIO admin answer to attaching a policy that is already attached.
pub const ADMIN_POLICY_ALREADY_APPLIED: &str = "XMinioAdminPolicyChangeAlreadyApplied";

/// Query values: RFC 3986 unreserved stay, the rest is escaped, as SigV4 canonicalises.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Admin credentials read from the class's Secret. Debug never prints the secret.
#[derive(Clone)]
pub struct AdminCreds {
    /// Admin access key.
    pub access_key: String,
    /// Admin secret key.
    pub secret_key: String,
}

impl std::fmt::Debug for AdminCreds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminCreds")
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .finish()
    }
}

/// A failed backend call, classified.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend answered with an error status.
    #[error("{op}: backend answered HTTP {status} {code}: {message}")]
    Api {
        /// What we were doing, e.g. `add-user`.
        op: &'static str,
        /// HTTP status.
        status: u16,
        /// Error code from the body (or derived from the status when the body has none).
        code: String,
        /// Human message from the body.
        message: String,
    },
    /// Could not connect or the connection broke.
    #[error("{op}: {endpoint} unreachable: {detail}")]
    Transport {
        /// What we were doing.
        op: &'static str,
        /// Where we tried.
        endpoint: String,
        /// The transport error.
        detail: String,
    },
    /// No complete answer within [`CALL_TIMEOUT`].
    #[error("{op}: no answer from {endpoint} within {CALL_TIMEOUT:?}")]
    Timeout {
        /// What we were doing.
        op: &'static str,
        /// Where we tried.
        endpoint: String,
    },
    /// The request could not be built or signed, or the answer not read.
    #[error("{op}: {detail}")]
    Local {
        /// What we were doing.
        op: &'static str,
        /// What went wrong.
        detail: String,
    },
}

impl BackendError {
    /// The backend's error code, if it answered at all.
    pub fn code(&self) -> Option<&str> {
        match self {
            BackendError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether the backend answered with one of `codes`.
    pub fn is(&self, codes: &[&str]) -> bool {
        self.code().is_some_and(|c| codes.contains(&c))
    }

    /// Backend message (or the whole error) for passing on to the caller.
    pub fn message(&self) -> String {
        match self {
            BackendError::Api { message, code, .. } if !message.is_empty() => {
                format!("{code}: {message}")
            }
            other => other.to_string(),
        }
    }

    /// Turn into a driver error when the caller has no specific handling.
    pub fn into_driver(self, conn: &Connection) -> DriverError {
        match &self {
            BackendError::Transport { .. } | BackendError::Timeout { .. } => {
                DriverError::Unavailable(format!("{self}; the call will be retried"))
            }
            BackendError::Api { status, code, .. }
                if *status == 403
                    || matches!(
                        code.as_str(),
                        "AccessDenied" | "SignatureDoesNotMatch" | "InvalidAccessKeyId" | "XMinioAdminAccessDenied"
                    ) =>
            {
                DriverError::FailedPrecondition(format!(
                    "{self}; check the admin credentials in Secret {}/{} (keys accessKey, secretKey) and the `region` parameter",
                    conn.secret_namespace, conn.secret_name
                ))
            }
            BackendError::Api { status, code, .. } if *status >= 500 || code == "SlowDown" => {
                DriverError::Unavailable(format!("{self}; the call will be retried"))
            }
            _ => DriverError::Internal(self.to_string()),
        }
    }
}

/// One user as user-info reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// Names of the canned policies attached to the user.
    pub policies: Vec<String>,
}

/// A signed client for one backend with one set of admin credentials.
#[derive(Clone)]
pub struct Backend {
    http: Client<HttpConnector, Full<Bytes>>,
    conn: Connection,
    creds: AdminCreds,
}

/// The pooled HTTP client shared by every [`Backend`].
pub fn http_client() -> Client<HttpConnector, Full<Bytes>> {
    let mut conn = HttpConnector::new();
    conn.set_connect_timeout(Some(CALL_TIMEOUT));
    conn.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(conn)
}

impl Backend {
    /// A client for `conn` signing with `creds`.
    pub fn new(
        http: Client<HttpConnector, Full<Bytes>>,
        conn: Connection,
        creds: AdminCreds,
    ) -> Self {
        Backend { http, conn, creds }
    }

    /// The connection this client talks to.
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Create or update a user; with the same secret this is a harmless repeat.
    pub async fn add_user(&self, access_key: &str, secret_key: &str) -> Result<(), BackendError> {
        let body = serde_json::json!({ "secretKey": secret_key, "status": "enabled" }).to_string();
        self.admin(
            Method::PUT,
            "add-user",
            "add-user",
            &[("accessKey", access_key)],
            body.into_bytes(),
        )
        .await
        .map(drop)
    }

    /// Remove a user; a user already gone is success.
    pub async fn remove_user(&self, access_key: &str) -> Result<(), BackendError> {
        match self
            .admin(
                Method::DELETE,
                "remove-user",
                "remove-user",
                &[("accessKey", access_key)],
                Vec::new(),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_no_such_user(&e) => Ok(()),
            // RustFS answers remove-user of a user already gone with
            // InternalError (it asks `is_temp_user` first): user-info's answer
            // tells that apart from a real failure.
            Err(e @ BackendError::Api { .. }) => match self.user_info(access_key).await {
                Ok(None) => Ok(()),
                _ => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// The user and its attached policies, or None if there is no such user.
    pub async fn user_info(&self, access_key: &str) -> Result<Option<UserInfo>, BackendError> {
        match self
            .admin(
                Method::GET,
                "user-info",
                "user-info",
                &[("accessKey", access_key)],
                Vec::new(),
            )
            .await
        {
            Ok(body) => {
                let v: Value = serde_json::from_slice(&body).map_err(|e| BackendError::Local {
                    op: "user-info",
                    detail: format!("answer is not JSON: {e}"),
                })?;
                let policies = v
                    .get("policyName")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(String::from)
                    .collect();
                Ok(Some(UserInfo { policies }))
            }
            Err(e) if is_no_such_user(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Create or REPLACE a canned policy. Only ever called with a name this driver owns
    /// (except under the `shared-policy` mutant).
    pub async fn add_canned_policy(
        &self,
        name: &str,
        document: &Value,
    ) -> Result<(), BackendError> {
        self.admin(
            Method::PUT,
            "add-canned-policy",
            "add-canned-policy",
            &[("name", name)],
            document.to_string().into_bytes(),
        )
        .await
        .map(drop)
    }

    /// The policy document, or None if there is no such policy.
    pub async fn info_canned_policy(&self, name: &str) -> Result<Option<Value>, BackendError> {
        match self.read_policy(name).await {
            // Any other server error: the list of canned policies tells a
            // missing policy apart from a real failure (listing them all, so
            // only then). Listed after all: made meanwhile, read it again.
            Err(e @ BackendError::Api { status: 500.., .. }) => {
                match self.list_canned_policies().await {
                    Ok(names) if !names.iter().any(|n| n == name) => Ok(None),
                    Ok(_) => self.read_policy(name).await,
                    Err(_) => Err(e),
                }
            }
            other => other,
        }
    }

    /// One info-canned-policy call; a not-found code is `None`.
    async fn read_policy(&self, name: &str) -> Result<Option<Value>, BackendError> {
        match self
            .admin(
                Method::GET,
                "info-canned-policy",
                "info-canned-policy",
                &[("name", name)],
                Vec::new(),
            )
            .await
        {
            Ok(body) => {
                let v: Value = serde_json::from_slice(&body).map_err(|e| BackendError::Local {
                    op: "info-canned-policy",
                    detail: format!("answer is not JSON: {e}"),
                })?;
                Ok(Some(unwrap_policy(v)))
            }
            Err(e) if is_no_such_policy(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The names of every canned policy (list-canned-policies: name → document).
    pub async fn list_canned_policies(&self) -> Result<Vec<String>, BackendError> {
        let body = self
            .admin(
                Method::GET,
                "list-canned-policies",
                "list-canned-policies",
                &[],
                Vec::new(),
            )
            .await?;
        let v: Value = serde_json::from_slice(&body).map_err(|e| BackendError::Local {
            op: "list-canned-policies",
            detail: format!("answer is not JSON: {e}"),
        })?;
        Ok(v.as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default())
    }

    /// Remove a canned policy; one already gone is success.
    pub async fn remove_canned_policy(&self, name: &str) -> Result<(), BackendError> {
        match self
            .admin(
                Method::DELETE,
                "remove-canned-policy",
                "remove-canned-policy",
                &[("name", name)],
                Vec::new(),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_no_such_policy(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Attach `policy` to `user` (MinIO semantics: the user's policy set becomes `policy`).
    pub async fn set_user_policy(&self, policy: &str, user: &str) -> Result<(), BackendError> {
        match self
            .admin(
                Method::PUT,
                "set-user-or-group-policy",
                "set-user-or-group-policy",
                &[
                    ("policyName", policy),
                    ("userOrGroup", user),
                    ("isGroup", "false"),
                ],
                Vec::new(),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is(&[ADMIN_POLICY_ALREADY_APPLIED]) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// PUT /bucket. Errors carry BucketAlreadyOwnedByYou / BucketAlreadyExists for the caller to judge.
    pub async fn create_bucket(&self, bucket: &str) -> Result<(), BackendError> {
        let body = if self.conn.region == "us-east-1" {
            Vec::new()
        } else {
            format!(
                "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LocationConstraint>{}</LocationConstraint></CreateBucketConfiguration>",
                self.conn.region
            )
            .into_bytes()
        };
        self.call(
            Method::PUT,
            "CreateBucket",
            &format!("/{bucket}"),
            &[],
            body,
        )
        .await
        .map(drop)
    }

    /// GET /: the names of every bucket the admin account sees.
    pub async fn list_buckets(&self) -> Result<Vec<String>, BackendError> {
        let body = self
            .call(Method::GET, "ListBuckets", "/", &[], Vec::new())
            .await?;
        let text = String::from_utf8_lossy(&body);
        // <ListAllMyBucketsResult><Buckets><Bucket><Name>n</Name>…: names only.
        Ok(text
            .split("<Name>")
            .skip(1)
            .filter_map(|rest| rest.split("</Name>").next())
            .map(str::to_string)
            .collect())
    }

    /// HEAD /bucket: whether it exists.
    pub async fn bucket_exists(&self, bucket: &str) -> Result<bool, BackendError> {
        match self
            .call(
                Method::HEAD,
                "HeadBucket",
                &format!("/{bucket}"),
                &[],
                Vec::new(),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.is(&[NO_SUCH_BUCKET]) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// DELETE /bucket; a bucket already gone is success. BucketNotEmpty is returned as is.
    pub async fn delete_bucket(&self, bucket: &str) -> Result<(), BackendError> {
        match self
            .call(
                Method::DELETE,
                "DeleteBucket",
                &format!("/{bucket}"),
                &[],
                Vec::new(),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is(&[NO_SUCH_BUCKET]) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn admin(
        &self,
        method: Method,
        op: &'static str,
        route: &str,
        query: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<Bytes, BackendError> {
        let path = format!("{}{route}", self.conn.admin_api.prefix());
        self.call(method, op, &path, query, body).await
    }

    async fn call(
        &self,
        method: Method,
        op: &'static str,
        path: &str,
        query: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<Bytes, BackendError> {
        let req = self.signed_request(method.clone(), op, path, query, body)?;
        let endpoint = self.conn.endpoint.clone();
        let fut = async {
            let resp = self
                .http
                .request(req)
                .await
                .map_err(|e| BackendError::Transport {
                    op,
                    endpoint: endpoint.clone(),
                    detail: error_chain(&e),
                })?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| BackendError::Transport {
                    op,
                    endpoint: endpoint.clone(),
                    detail: format!("reading the answer: {}", error_chain(&e)),
                })?
                .to_bytes();
            Ok::<_, BackendError>((status, body))
        };
        let (status, body) = tokio::time::timeout(CALL_TIMEOUT, fut)
            .await
            .map_err(|_| BackendError::Timeout {
                op,
                endpoint: endpoint.clone(),
            })??;
        if status.is_success() {
            tracing::debug!(op, %status, "backend call ok");
            return Ok(body);
        }
        let (code, message) = parse_error_body(&body, status, method == Method::HEAD);
        tracing::debug!(op, %status, %code, "backend call failed");
        Err(BackendError::Api {
            op,
            status: status.as_u16(),
            code,
            message,
        })
    }

    fn signed_request(
        &self,
        method: Method,
        op: &'static str,
        path: &str,
        query: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<Request<Full<Bytes>>, BackendError> {
        let local = |detail: String| BackendError::Local { op, detail };
        let mut uri = format!("{}{}", self.conn.endpoint, path);
        if !query.is_empty() {
            let q: Vec<String> = query
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}={}",
                        utf8_percent_encode(k, QUERY),
                        utf8_percent_encode(v, QUERY)
                    )
                })
                .collect();
            uri.push('?');
            uri.push_str(&q.join("&"));
        }
        let parsed: http::Uri = uri
            .parse()
            .map_err(|e| local(format!("bad URL {uri}: {e}")))?;
        let host = parsed
            .authority()
            .map(|a| a.as_str().to_string())
            .ok_or_else(|| local(format!("URL {uri} has no host")))?;

        let mut req = Request::builder()
            .method(method.clone())
            .uri(parsed)
            .header(http::header::HOST, &host);
        if !body.is_empty() {
            req = req.header(http::header::CONTENT_LENGTH, body.len());
        }
        let mut req = req
            .body(Full::new(Bytes::from(body.clone())))
            .map_err(|e| local(format!("building the request: {e}")))?;

        let identity: Identity = Credentials::new(
            &self.creds.access_key,
            &self.creds.secret_key,
            None,
            None,
            "cosi-s3-admin-secret",
        )
        .into();
        let mut settings = SigningSettings::default();
        // S3 rules: no double encoding, no path normalisation, and the payload hash header.
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.conn.region)
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| local(format!("signing parameters: {e}")))?
            .into();
        let headers: Vec<(&str, &str)> = req
            .headers()
            .iter()
            .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str(), v)))
            .collect();
        let signable = SignableRequest::new(
            method.as_str(),
            &uri,
            headers.into_iter(),
            SignableBody::Bytes(&body),
        )
        .map_err(|e| local(format!("signing: {e}")))?;
        let (instructions, _sig) = sign(signable, &params)
            .map_err(|e| local(format!("signing: {e}")))?
            .into_parts();
        instructions.apply_to_request_http1x(&mut req);
        Ok(req)
    }
}

/// RustFS's code for a missing user or policy (`iam_error_to_s3_error`).
const NO_SUCH_RESOURCE: &str = "NoSuchResource";

fn is_no_such_user(e: &BackendError) -> bool {
    e.is(&[
        ADMIN_NO_SUCH_USER,
        NO_SUCH_RESOURCE,
        "NoSuchUser",
        "XRustfsAdminNoSuchUser",
    ]) || matches!(e, BackendError::Api { status: 404, code, .. } if code == "NotFound")
}

/// RustFS's message for a missing policy, answered as InternalError by
/// info-canned-policy and the policy mapping handlers.
const RUSTFS_NO_SUCH_POLICY: &str = "policy does not exist";

fn is_no_such_policy(e: &BackendError) -> bool {
    let rustfs = matches!(e, BackendError::Api { code, message, .. }
        if code == "InternalError" && message == RUSTFS_NO_SUCH_POLICY);
    rustfs
        || e.is(&[
            ADMIN_NO_SUCH_POLICY,
            NO_SUCH_RESOURCE,
            "NoSuchPolicy",
            "XRustfsAdminNoSuchPolicy",
        ])
        || matches!(e, BackendError::Api { status: 404, code, .. } if code == "NotFound")
}

/// info-canned-policy answers the bare document (v1) or `{"PolicyName","Policy":{..}}` (v2).
fn unwrap_policy(v: Value) -> Value {
    match v.get("Policy").or_else(|| v.get("policy")) {
        Some(Value::Object(_)) => v
            .get("Policy")
            .or_else(|| v.get("policy"))
            .cloned()
            .unwrap_or(v),
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(v),
        _ => v,
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// Pull `Code`/`Message` out of an S3 XML or admin JSON error body; fall back
/// to the status, as HEAD answers carry no body.
pub(crate) fn parse_error_body(body: &[u8], status: StatusCode, head: bool) -> (String, String) {
    let text = String::from_utf8_lossy(body);
    let trimmed = text.trim();
    let mut code = String::new();
    let mut message = String::new();
    if trimmed.starts_with('{') {
        if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
            let get = |keys: &[&str]| {
                keys.iter()
                    .find_map(|k| v.get(*k).and_then(Value::as_str))
                    .unwrap_or("")
                    .to_string()
            };
            code = get(&["Code", "code"]);
            message = get(&["Message", "message", "Description", "error"]);
        }
    } else if trimmed.starts_with('<') {
        code = xml_tag(trimmed, "Code").unwrap_or_default();
        message = xml_tag(trimmed, "Message").unwrap_or_default();
    } else if !trimmed.is_empty() {
        message = trimmed.chars().take(300).collect();
    }
    if code.is_empty() {
        code = match status.as_u16() {
            404 if head => NO_SUCH_BUCKET.to_string(),
            404 => "NotFound".to_string(),
            403 => "AccessDenied".to_string(),
            409 => "Conflict".to_string(),
            s if s >= 500 => "InternalError".to_string(),
            _ => format!("HTTP{}", status.as_u16()),
        };
    }
    (code, message)
}

fn xml_tag(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&close)? + start;
    Some(xml[start..end].trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_s3_xml_errors() {
        let xml = br#"<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>BucketAlreadyOwnedByYou</Code><Message>Your previous request to create the named bucket succeeded and you already own it.</Message><BucketName>b</BucketName></Error>"#;
        let (code, msg) = parse_error_body(xml, StatusCode::CONFLICT, false);
        assert_eq!(code, BUCKET_ALREADY_OWNED_BY_YOU);
        assert!(msg.starts_with("Your previous request"));
    }

    #[test]
    fn parses_admin_json_errors() {
        let j = br#"{"Code":"XMinioAdminNoSuchUser","Message":"The specified user does not exist.","Resource":"/rustfs/admin/v3/user-info"}"#;
        assert_eq!(
            parse_error_body(j, StatusCode::NOT_FOUND, false),
            (
                ADMIN_NO_SUCH_USER.to_string(),
                "The specified user does not exist.".to_string()
            )
        );
        let e = BackendError::Api {
            op: "user-info",
            status: 404,
            code: ADMIN_NO_SUCH_USER.into(),
            message: String::new(),
        };
        assert!(is_no_such_user(&e));
        assert!(!is_no_such_policy(&e));
    }

    #[test]
    fn reads_rustfs_admin_errors() {
        let x = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>InternalError</Code><Message>policy does not exist</Message></Error>";
        let (code, message) = parse_error_body(x, StatusCode::INTERNAL_SERVER_ERROR, false);
        let missing = BackendError::Api {
            op: "info-canned-policy",
            status: 500,
            code,
            message,
        };
        assert!(is_no_such_policy(&missing));
        let other = BackendError::Api {
            op: "info-canned-policy",
            status: 500,
            code: "InternalError".into(),
            message: "io error: disk".into(),
        };
        assert!(!is_no_such_policy(&other));
        let user = BackendError::Api {
            op: "user-info",
            status: 404,
            code: "NoSuchResource".into(),
            message: "user 'u' does not exist".into(),
        };
        assert!(is_no_such_user(&user));
    }

    #[test]
    fn bodiless_answers_fall_back_to_status() {
        assert_eq!(
            parse_error_body(b"", StatusCode::NOT_FOUND, true).0,
            NO_SUCH_BUCKET
        );
        assert_eq!(
            parse_error_body(b"", StatusCode::FORBIDDEN, true).0,
            "AccessDenied"
        );
        assert_eq!(
            parse_error_body(b"", StatusCode::SERVICE_UNAVAILABLE, false).0,
            "InternalError"
        );
    }

    #[test]
    fn policy_answers_are_unwrapped() {
        let doc = serde_json::json!({"Version":"2012-10-17","Statement":[]});
        assert_eq!(unwrap_policy(doc.clone()), doc);
        assert_eq!(
            unwrap_policy(serde_json::json!({"PolicyName":"p","Policy":doc.clone()})),
            doc
        );
        assert_eq!(
            unwrap_policy(serde_json::json!({"PolicyName":"p","Policy":doc.to_string()})),
            doc
        );
    }

    #[test]
    fn admin_creds_debug_is_redacted() {
        let c = AdminCreds {
            access_key: "ADMIN".into(),
            secret_key: "hunter2-very-secret".into(),
        };
        let s = format!("{c:?}");
        assert!(s.contains("ADMIN") && !s.contains("hunter2"));
    }

    #[test]
    fn requests_are_signed() {
        let conn = Connection {
            endpoint: "http://127.0.0.1:9".into(),
            secret_name: "s".into(),
            secret_namespace: "n".into(),
            region: "us-east-1".into(),
            admin_api: crate::config::AdminApi::Rustfs,
        };
        let b = Backend::new(
            http_client(),
            conn,
            AdminCreds {
                access_key: "AKIDEXAMPLE".into(),
                secret_key: "secret".into(),
            },
        );
        let req = b
            .signed_request(
                Method::PUT,
                "add-user",
                "/rustfs/admin/v3/add-user",
                &[("accessKey", "AK 1")],
                b"{}".to_vec(),
            )
            .unwrap();
        assert_eq!(req.uri().query(), Some("accessKey=AK%201"));
        let h = req.headers();
        let auth = h["authorization"].to_str().unwrap();
        assert!(
            auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"),
            "{auth}"
        );
        assert!(auth.contains("/us-east-1/s3/aws4_request"));
        assert!(auth.contains("x-amz-content-sha256"));
        assert_eq!(
            h["x-amz-content-sha256"],
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert!(h.contains_key("x-amz-date"));
    }
}

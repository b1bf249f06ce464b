//! A small S3 client for the lab's own probes (checks prove handed-out
//! credentials still work with a signed PutObject). It signs with AWS's
//! `aws-sigv4` crate, not with our verifier, so the two cross-check.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Why a probe got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The endpoint or path did not form a valid URL.
    #[error("invalid probe URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    /// aws-sigv4 refused to sign.
    #[error("signing failed: {0}")]
    Sign(String),
    /// The request never got a reply.
    #[error("request to {url} failed: {reason}")]
    Transport { url: String, reason: String },
}

/// What the fake answered.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProbeReply {
    /// HTTP status.
    pub status: u16,
    /// S3 / admin error code from the body, if the answer was an error.
    pub code: Option<String>,
    /// The response body (the object, for a successful GetObject).
    #[serde(skip)]
    pub body: Vec<u8>,
}

impl ProbeReply {
    /// True for 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// SigV4-signing S3 client for one endpoint.
#[derive(Clone)]
pub struct S3Probe {
    endpoint: String,
    region: String,
    client: Client<HttpConnector, Full<Bytes>>,
    /// Sent as [`super::LAB_HEADER`] when set (see [`S3Probe::as_lab`]).
    lab_marker: Option<String>,
}

impl std::fmt::Debug for S3Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Probe")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .finish()
    }
}

/// Build a request signed by `aws-sigv4` (path-style; `path_and_query` is
/// already percent-encoded). Exposed to the crate's tests so they can tamper
/// with a correctly signed request.
pub(crate) fn signed_request(
    method: &str,
    url: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
    body: Vec<u8>,
    at: SystemTime,
) -> Result<http::Request<Vec<u8>>, ProbeError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| ProbeError::Url {
            url: url.into(),
            reason: e.to_string(),
        })?;
    let host = uri
        .authority()
        .map(|a| a.as_str().to_string())
        .ok_or_else(|| ProbeError::Url {
            url: url.into(),
            reason: "no host".into(),
        })?;
    let mut req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("host", host)
        .body(body)
        .map_err(|e| ProbeError::Url {
            url: url.into(),
            reason: e.to_string(),
        })?;
    let identity = Credentials::new(access_key, secret_key, None, None, "drivelab-probe").into();
    let mut settings = SigningSettings::default();
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    // S3 signs the path as sent: no normalisation, no double encoding.
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("s3")
        .time(at)
        .settings(settings)
        .build()
        .map_err(|e| ProbeError::Sign(e.to_string()))?
        .into();
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .filter_map(|(k, v)| {
            v.to_str()
                .ok()
                .map(|v| (k.as_str().to_string(), v.to_string()))
        })
        .collect();
    let signable = SignableRequest::new(
        method,
        url,
        headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        SignableBody::Bytes(req.body()),
    )
    .map_err(|e| ProbeError::Sign(e.to_string()))?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|e| ProbeError::Sign(e.to_string()))?
        .into_parts();
    instructions.apply_to_request_http1x(&mut req);
    Ok(req)
}

/// The `<Code>` of an S3 XML error or the `Code` of an admin JSON error.
pub(crate) fn error_code(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    if let Some(start) = text.find("<Code>") {
        let rest = &text[start + 6..];
        return rest.find("</Code>").map(|end| rest[..end].to_string());
    }
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()?
        .get("Code")?
        .as_str()
        .map(str::to_string)
}

impl S3Probe {
    /// A probe for `endpoint_url` (`http://127.0.0.1:PORT`) signing for `region`.
    pub fn new(endpoint_url: impl Into<String>, region: impl Into<String>) -> Self {
        let client = Client::builder(TokioExecutor::new()).build_http();
        Self {
            endpoint: endpoint_url.into().trim_end_matches('/').to_string(),
            region: region.into(),
            client,
            lab_marker: None,
        }
    }

    /// This probe's requests are the lab's own: each carries `marker` (from
    /// [`super::S3Fake::lab_marker`]), unsigned, so the fake tells them apart.
    pub fn as_lab(mut self, marker: &str) -> Self {
        self.lab_marker = Some(marker.to_string());
        self
    }

    /// Send a signed request; `path_and_query` is percent-encoded (`/bucket/key?x=y`).
    pub async fn send(
        &self,
        method: &str,
        path_and_query: &str,
        access_key: &str,
        secret_key: &str,
        body: Vec<u8>,
    ) -> Result<ProbeReply, ProbeError> {
        let url = format!("{}{}", self.endpoint, path_and_query);
        let req = signed_request(
            method,
            &url,
            &self.region,
            access_key,
            secret_key,
            body,
            SystemTime::now(),
        )?;
        let (mut parts, body) = req.into_parts();
        if let Some(m) = &self.lab_marker {
            if let Ok(v) = http::HeaderValue::from_str(m) {
                parts.headers.insert(super::LAB_HEADER, v);
            }
        }
        let req = http::Request::from_parts(parts, Full::new(Bytes::from(body)));
        let transport = |reason: String| ProbeError::Transport {
            url: url.clone(),
            reason,
        };
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| transport(e.to_string()))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| transport(e.to_string()))?
            .to_bytes()
            .to_vec();
        let code = if status >= 300 {
            error_code(&body)
        } else {
            None
        };
        Ok(ProbeReply { status, code, body })
    }

    /// Signed PutObject.
    pub async fn put_object(
        &self,
        access_key: &str,
        secret_key: &str,
        bucket: &str,
        key: &str,
        body: impl Into<Vec<u8>>,
    ) -> Result<ProbeReply, ProbeError> {
        self.send(
            "PUT",
            &object_path(bucket, key),
            access_key,
            secret_key,
            body.into(),
        )
        .await
    }

    /// Signed GetObject; the object is in `ProbeReply::body`.
    pub async fn get_object(
        &self,
        access_key: &str,
        secret_key: &str,
        bucket: &str,
        key: &str,
    ) -> Result<ProbeReply, ProbeError> {
        self.send(
            "GET",
            &object_path(bucket, key),
            access_key,
            secret_key,
            Vec::new(),
        )
        .await
    }

    /// Signed CreateBucket.
    pub async fn create_bucket(
        &self,
        access_key: &str,
        secret_key: &str,
        bucket: &str,
    ) -> Result<ProbeReply, ProbeError> {
        self.send(
            "PUT",
            &object_path(bucket, ""),
            access_key,
            secret_key,
            Vec::new(),
        )
        .await
    }
}

fn object_path(bucket: &str, key: &str) -> String {
    let b = super::sigv4::uri_encode(bucket.as_bytes(), false);
    if key.is_empty() {
        format!("/{b}")
    } else {
        format!("/{b}/{}", super::sigv4::uri_encode(key.as_bytes(), true))
    }
}

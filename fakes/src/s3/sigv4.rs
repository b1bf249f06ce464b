//! AWS Signature Version 4 verification, written here rather than borrowed so
//! the lab's probe (signed by the `aws-sigv4` crate) cross-checks it. Header and
//! presigned-query auth, payload hashes, aws-chunked bodies, clock skew.

use hmac::{Hmac, Mac};
use http::request::Parts;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use super::errors::ApiError;

type HmacSha256 = Hmac<Sha256>;

const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// The hash of the empty string, used by chunk signatures.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
/// S3 refuses requests more than 15 minutes off its clock.
const MAX_SKEW_SECS: i64 = 15 * 60;
/// Presigned URLs live at most 7 days.
const MAX_EXPIRES_SECS: i64 = 7 * 24 * 3600;

/// What the request claims about its signature, parsed but not yet verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Auth {
    pub access_key: String,
    pub scope_date: String,
    pub region: String,
    pub service: String,
    pub signed_headers: Vec<String>,
    pub signature: String,
    pub amz_date: String,
    /// `Some(expires)` for presigned (query) auth.
    pub presigned: Option<i64>,
}

impl Auth {
    pub fn scope(&self) -> String {
        format!(
            "{}/{}/{}/aws4_request",
            self.scope_date, self.region, self.service
        )
    }
}

/// AWS URI encoding: everything but unreserved characters is %XX (upper hex);
/// `/` is kept only in paths.
pub(crate) fn uri_encode(input: &[u8], keep_slash: bool) -> String {
    let mut out = String::with_capacity(input.len() * 3);
    for &b in input {
        let unreserved = b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~');
        if unreserved || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-decoding; `None` on a broken escape. `plus_as_space` follows form
/// decoding, which is how S3 servers read query strings.
pub(crate) fn percent_decode(s: &str, plus_as_space: bool) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if plus_as_space => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

/// Decoded (key, value) byte pairs of a query string, in request order.
pub(crate) type QueryPairs = Vec<(Vec<u8>, Vec<u8>)>;

/// The query string as decoded pairs.
pub(crate) fn parse_query(raw: Option<&str>) -> Result<QueryPairs, ApiError> {
    let mut out = Vec::new();
    let Some(raw) = raw else { return Ok(out) };
    for part in raw.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        let bad = || ApiError::invalid_request("The query string is not validly percent-encoded.");
        out.push((
            percent_decode(k, true).ok_or_else(bad)?,
            percent_decode(v, true).ok_or_else(bad)?,
        ));
    }
    Ok(out)
}

/// Value of query parameter `name` (first occurrence), lossily decoded.
pub(crate) fn query_value(q: &[(Vec<u8>, Vec<u8>)], name: &str) -> Option<String> {
    q.iter()
        .find(|(k, _)| k == name.as_bytes())
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}

fn header_str<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

fn parse_credential(cred: &str) -> Result<(String, String, String, String), ApiError> {
    // The access key is everything before the last four `/`-separated parts.
    let mut it = cred.rsplitn(5, '/');
    let terminal = it.next().unwrap_or_default();
    let service = it.next().unwrap_or_default();
    let region = it.next().unwrap_or_default();
    let date = it.next().unwrap_or_default();
    let key = it.next().unwrap_or_default();
    if key.is_empty() || date.len() != 8 || service.is_empty() || terminal != "aws4_request" {
        return Err(ApiError::malformed_auth(
            "The authorization header is malformed; the Credential is mal-formed; expecting \"<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request\".",
        ));
    }
    Ok((
        key.to_string(),
        date.to_string(),
        region.to_string(),
        service.to_string(),
    ))
}

/// Parse the request's SigV4 claims. `Ok(None)`: an anonymous request.
pub(crate) fn parse_auth(
    parts: &Parts,
    query: &[(Vec<u8>, Vec<u8>)],
) -> Result<Option<Auth>, ApiError> {
    if let Some(h) = header_str(parts, "authorization") {
        let Some(rest) = h.strip_prefix(ALGORITHM) else {
            if h.starts_with("AWS ") {
                return Err(ApiError::new(
                    400,
                    "InvalidRequest",
                    "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256.",
                ));
            }
            return Err(ApiError::malformed_auth(
                "The authorization header is malformed; unsupported algorithm.",
            ));
        };
        let mut credential = None;
        let mut signed = None;
        let mut signature = None;
        for field in rest.split(',') {
            let field = field.trim();
            if let Some(v) = field.strip_prefix("Credential=") {
                credential = Some(v);
            } else if let Some(v) = field.strip_prefix("SignedHeaders=") {
                signed = Some(v);
            } else if let Some(v) = field.strip_prefix("Signature=") {
                signature = Some(v);
            }
        }
        let (Some(credential), Some(signed), Some(signature)) = (credential, signed, signature)
        else {
            return Err(ApiError::malformed_auth(
                "The authorization header is malformed; it must contain Credential, SignedHeaders and Signature.",
            ));
        };
        let (access_key, scope_date, region, service) = parse_credential(credential)?;
        let amz_date = header_str(parts, "x-amz-date")
            .map(str::to_string)
            .ok_or_else(|| {
                ApiError::new(
                    403,
                    "AccessDenied",
                    "AWS authentication requires a valid Date or x-amz-date header",
                )
            })?;
        return Ok(Some(Auth {
            access_key,
            scope_date,
            region,
            service,
            signed_headers: signed.split(';').map(|s| s.to_ascii_lowercase()).collect(),
            signature: signature.to_ascii_lowercase(),
            amz_date,
            presigned: None,
        }));
    }
    let Some(alg) = query_value(query, "X-Amz-Algorithm") else {
        return Ok(None);
    };
    if alg != ALGORITHM {
        return Err(ApiError::invalid_request(
            "X-Amz-Algorithm only supports \"AWS4-HMAC-SHA256\"",
        ));
    }
    let missing = |what: &str| {
        ApiError::new(
            400,
            "AuthorizationQueryParametersError",
            format!("Query-string authentication version 4 requires the X-Amz-Algorithm, X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and X-Amz-Expires parameters ({what} missing)."),
        )
    };
    let credential =
        query_value(query, "X-Amz-Credential").ok_or_else(|| missing("X-Amz-Credential"))?;
    let (access_key, scope_date, region, service) = parse_credential(&credential)?;
    let amz_date = query_value(query, "X-Amz-Date").ok_or_else(|| missing("X-Amz-Date"))?;
    let signed =
        query_value(query, "X-Amz-SignedHeaders").ok_or_else(|| missing("X-Amz-SignedHeaders"))?;
    let signature =
        query_value(query, "X-Amz-Signature").ok_or_else(|| missing("X-Amz-Signature"))?;
    let expires: i64 = query_value(query, "X-Amz-Expires")
        .ok_or_else(|| missing("X-Amz-Expires"))?
        .parse()
        .map_err(|_| {
            ApiError::new(
                400,
                "AuthorizationQueryParametersError",
                "X-Amz-Expires should be a number",
            )
        })?;
    if !(0..=MAX_EXPIRES_SECS).contains(&expires) {
        return Err(ApiError::new(
            400,
            "AuthorizationQueryParametersError",
            "X-Amz-Expires must be less than a week (in seconds) that is 604800",
        ));
    }
    Ok(Some(Auth {
        access_key,
        scope_date,
        region,
        service,
        signed_headers: signed.split(';').map(|s| s.to_ascii_lowercase()).collect(),
        signature: signature.to_ascii_lowercase(),
        amz_date,
        presigned: Some(expires),
    }))
}

/// The access key a request names, without verifying anything (for naming
/// the caller in the history).
pub(crate) fn access_key_hint(parts: &Parts) -> Option<String> {
    if let Some(h) = header_str(parts, "authorization") {
        let cred = h.split("Credential=").nth(1)?;
        let cred = cred.split([',', ' ']).next()?;
        return cred.split('/').next().map(str::to_string);
    }
    let q = parse_query(parts.uri.query()).ok()?;
    let cred = query_value(&q, "X-Amz-Credential")?;
    cred.split('/').next().map(str::to_string)
}

fn parse_amz_date(s: &str) -> Option<OffsetDateTime> {
    let fmt = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    time::PrimitiveDateTime::parse(s, &fmt)
        .ok()
        .map(|p| p.assume_utc())
}

fn canonical_header_value(parts: &Parts, name: &str) -> Option<String> {
    let values: Vec<String> = parts
        .headers
        .get_all(name)
        .iter()
        .map(|v| {
            let s = String::from_utf8_lossy(v.as_bytes());
            s.split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .collect();
    if values.is_empty() {
        // HTTP/2 carries the host in the URI authority, not a header.
        if name == "host" {
            return parts.uri.authority().map(|a| a.as_str().to_string());
        }
        return None;
    }
    Some(values.join(","))
}

/// The canonical request of the SigV4 spec (S3 flavour: the path is decoded
/// and encoded once, never normalised or double-encoded).
pub(crate) fn canonical_request(
    parts: &Parts,
    query: &[(Vec<u8>, Vec<u8>)],
    auth: &Auth,
    payload_hash: &str,
) -> Result<String, ApiError> {
    let path = parts.uri.path();
    let decoded = percent_decode(path, false).ok_or_else(|| {
        ApiError::invalid_request("The request path is not validly percent-encoded.")
    })?;
    let canonical_uri = if decoded.is_empty() {
        "/".to_string()
    } else {
        uri_encode(&decoded, true)
    };

    let mut pairs: Vec<(String, String)> = query
        .iter()
        .filter(|(k, _)| !(auth.presigned.is_some() && k == b"X-Amz-Signature"))
        .map(|(k, v)| (uri_encode(k, false), uri_encode(v, false)))
        .collect();
    pairs.sort();
    let canonical_query = pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");

    let mut headers = String::new();
    for name in &auth.signed_headers {
        let value = canonical_header_value(parts, name).ok_or_else(|| {
            ApiError::signature_mismatch_with(format!(
                "Signed header '{name}' is not present in the request."
            ))
        })?;
        headers.push_str(name);
        headers.push(':');
        headers.push_str(&value);
        headers.push('\n');
    }
    Ok(format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        parts.method.as_str(),
        canonical_uri,
        canonical_query,
        headers,
        auth.signed_headers.join(";"),
        payload_hash
    ))
}

impl ApiError {
    fn signature_mismatch_with(detail: String) -> Self {
        let mut e = ApiError::signature_mismatch();
        e.message = format!("{} ({detail})", e.message);
        e
    }
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut m = <HmacSha256 as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("hmac key length"));
    m.update(data);
    m.finalize().into_bytes().into()
}

/// The derived signing key for a date/region/service.
pub(crate) fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
    let k = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    hmac(&k, b"aws4_request")
}

pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn ct_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The payload hash the request was signed over.
pub(crate) fn claimed_payload_hash(parts: &Parts, auth: &Auth) -> Result<String, ApiError> {
    match header_str(parts, "x-amz-content-sha256") {
        Some(h) => Ok(h.to_string()),
        None if auth.presigned.is_some() => Ok("UNSIGNED-PAYLOAD".to_string()),
        None => Err(ApiError::invalid_request(
            "Missing required header for this request: x-amz-content-sha256",
        )),
    }
}

/// Verify the signature (and the request time) against `secret`; returns the
/// signing key so streaming bodies can be checked with it.
pub(crate) fn verify(
    parts: &Parts,
    query: &[(Vec<u8>, Vec<u8>)],
    auth: &Auth,
    secret: &str,
    expected_region: Option<&str>,
    now: OffsetDateTime,
) -> Result<[u8; 32], ApiError> {
    if auth.service != "s3" {
        return Err(ApiError::malformed_auth(format!(
            "The authorization header is malformed; incorrect service \"{}\". This endpoint belongs to \"s3\".",
            auth.service
        )));
    }
    // No region configured: any region is accepted (MinIO's isValidRegion).
    if let Some(expected_region) = expected_region.filter(|r| *r != auth.region) {
        return Err(ApiError::malformed_auth(format!(
            "The authorization header is malformed; the region '{}' is wrong; expecting '{expected_region}'",
            auth.region
        )));
    }
    let when = parse_amz_date(&auth.amz_date).ok_or_else(|| {
        ApiError::new(
            403,
            "AccessDenied",
            "AWS authentication requires a valid Date or x-amz-date header",
        )
    })?;
    if !auth.amz_date.starts_with(&auth.scope_date) {
        return Err(ApiError::malformed_auth(
            "The authorization header is malformed; Invalid credential date. Date is not the same as X-Amz-Date.",
        ));
    }
    let skew = (now - when).whole_seconds();
    match auth.presigned {
        None if skew.abs() > MAX_SKEW_SECS => {
            return Err(ApiError::new(
                403,
                "RequestTimeTooSkewed",
                "The difference between the request time and the server's time is too large.",
            ))
        }
        Some(_) if skew < -MAX_SKEW_SECS => {
            return Err(ApiError::new(
                403,
                "AccessDenied",
                "Request is not valid yet",
            ));
        }
        Some(expires) if skew > expires => {
            return Err(ApiError::new(403, "AccessDenied", "Request has expired"));
        }
        _ => {}
    }
    if !auth.signed_headers.iter().any(|h| h == "host") {
        return Err(ApiError::malformed_auth(
            "The authorization header is malformed; 'host' must be a signed header.",
        ));
    }
    let payload_hash = claimed_payload_hash(parts, auth)?;
    let creq = canonical_request(parts, query, auth, &payload_hash)?;
    let sts = format!(
        "{ALGORITHM}\n{}\n{}\n{}",
        auth.amz_date,
        auth.scope(),
        sha256_hex(creq.as_bytes())
    );
    let key = signing_key(secret, &auth.scope_date, &auth.region, &auth.service);
    let sig = hex::encode(hmac(&key, sts.as_bytes()));
    if !ct_eq(&sig, &auth.signature) {
        return Err(ApiError::signature_mismatch());
    }
    Ok(key)
}

/// A decoded body and the trailers of an aws-chunked one (`name`, `value`).
pub(crate) type Payload = (bytes::Bytes, Vec<(String, String)>);

/// Check the body against the signed payload hash and return the object
/// bytes (aws-chunked bodies are decoded, their chunk signatures checked,
/// their trailers returned for the handler to verify).
pub(crate) fn resolve_payload(
    parts: &Parts,
    auth: &Auth,
    key: &[u8; 32],
    body: bytes::Bytes,
) -> Result<Payload, ApiError> {
    let claimed = claimed_payload_hash(parts, auth)?;
    let chunked = |signing| {
        let (data, trailers) = decode_chunked(&body, signing)?;
        check_decoded_length(parts, data.len())?;
        Ok((bytes::Bytes::from(data), trailers))
    };
    match claimed.as_str() {
        "UNSIGNED-PAYLOAD" => Ok((body, vec![])),
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER" => chunked(None),
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" => {
            let seed = ChunkSigning { key, amz_date: &auth.amz_date, scope: auth.scope(), seed: auth.signature.clone() };
            chunked(Some(seed))
        }
        h if h.starts_with("STREAMING-") => Err(ApiError::new(
            501,
            "NotImplemented",
            format!("x-amz-content-sha256 {h} is not supported by this server; sign the payload or use UNSIGNED-PAYLOAD."),
        )),
        h if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
            if !ct_eq(&sha256_hex(&body), &h.to_ascii_lowercase()) {
                return Err(ApiError::new(
                    400,
                    "XAmzContentSHA256Mismatch",
                    "The provided 'x-amz-content-sha256' header does not match what was computed.",
                ));
            }
            Ok((body, vec![]))
        }
        _ => Err(ApiError::new(
            400,
            "InvalidArgument",
            "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-AWS4-HMAC-SHA256-PAYLOAD, or a valid sha256 value.",
        )),
    }
}

struct ChunkSigning<'a> {
    key: &'a [u8; 32],
    amz_date: &'a str,
    scope: String,
    seed: String,
}

/// `x-amz-decoded-content-length`, when given, must be what the chunks held.
fn check_decoded_length(parts: &Parts, got: usize) -> Result<(), ApiError> {
    match header_str(parts, "x-amz-decoded-content-length").map(|v| v.trim().parse::<usize>()) {
        Some(Ok(n)) if n != got => Err(ApiError::new(
            400,
            "IncompleteBody",
            format!("x-amz-decoded-content-length says {n} bytes; the chunks held {got}."),
        )),
        Some(Err(_)) => Err(ApiError::new(
            400,
            "InvalidArgument",
            "x-amz-decoded-content-length is not a number.",
        )),
        _ => Ok(()),
    }
}

/// Trailer lines after the final chunk: `name:value` CRLF ..., then CRLF.
fn parse_trailers(rest: &[u8]) -> Result<Vec<(String, String)>, ApiError> {
    let text = std::str::from_utf8(rest).map_err(|_| {
        ApiError::new(
            400,
            "IncompleteBody",
            "The aws-chunked trailers are not text.",
        )
    })?;
    let mut out = Vec::new();
    for line in text.split("\r\n").filter(|l| !l.trim().is_empty()) {
        let (n, v) = line.split_once(':').ok_or_else(|| {
            ApiError::new(
                400,
                "IncompleteBody",
                "An aws-chunked trailer is not `name:value`.",
            )
        })?;
        let n = n.trim().to_ascii_lowercase();
        // The signed-trailer variant's own signature line is not a checksum.
        if n != "x-amz-trailer-signature" {
            out.push((n, v.trim().to_string()));
        }
    }
    Ok(out)
}

fn decode_chunked(
    body: &[u8],
    mut signing: Option<ChunkSigning<'_>>,
) -> Result<(Vec<u8>, Vec<(String, String)>), ApiError> {
    let bad = |m: &str| {
        ApiError::new(
            400,
            "IncompleteBody",
            format!("The aws-chunked body is malformed: {m}."),
        )
    };
    let mut out = Vec::with_capacity(body.len());
    let mut rest = body;
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| bad("chunk header without CRLF"))?;
        let header =
            std::str::from_utf8(&rest[..eol]).map_err(|_| bad("chunk header is not text"))?;
        rest = &rest[eol + 2..];
        let (size_hex, ext) = header.split_once(';').unwrap_or((header, ""));
        let size =
            usize::from_str_radix(size_hex.trim(), 16).map_err(|_| bad("chunk size is not hex"))?;
        if size > rest.len() {
            return Err(bad("chunk is longer than the body"));
        }
        let data = &rest[..size];
        rest = &rest[size..];
        if let Some(s) = signing.as_mut() {
            let sig = ext
                .trim()
                .strip_prefix("chunk-signature=")
                .ok_or_else(|| bad("chunk signature missing"))?;
            let sts = format!(
                "AWS4-HMAC-SHA256-PAYLOAD\n{}\n{}\n{}\n{EMPTY_SHA256}\n{}",
                s.amz_date,
                s.scope,
                s.seed,
                sha256_hex(data)
            );
            let expect = hex::encode(hmac(s.key, sts.as_bytes()));
            if !ct_eq(&expect, &sig.to_ascii_lowercase()) {
                return Err(ApiError::signature_mismatch());
            }
            s.seed = expect;
        }
        out.extend_from_slice(data);
        if size == 0 {
            // Trailers (checksums) may follow the last chunk: the handler verifies them.
            return Ok((out, parse_trailers(rest)?));
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .ok_or_else(|| bad("chunk data not followed by CRLF"))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    // The GET Object example of the S3 SigV4 documentation ("Signature
    // Calculations for the Authorization Header"), with its published signature.
    const DOC_SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

    fn doc_get_object() -> Parts {
        parts(
            "GET",
            "/test.txt",
            &[
                ("host", "examplebucket.s3.amazonaws.com"),
                ("range", "bytes=0-9"),
                ("x-amz-content-sha256", EMPTY_SHA256),
                ("x-amz-date", "20130524T000000Z"),
                (
                    "authorization",
                    "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
                ),
            ],
        )
    }

    fn doc_time() -> OffsetDateTime {
        parse_amz_date("20130524T000500Z").unwrap()
    }

    #[test]
    fn aws_documentation_vector_verifies() {
        let p = doc_get_object();
        let q = parse_query(p.uri.query()).unwrap();
        let auth = parse_auth(&p, &q).unwrap().unwrap();
        assert_eq!(auth.access_key, "AKIAIOSFODNN7EXAMPLE");
        verify(&p, &q, &auth, DOC_SECRET, Some("us-east-1"), doc_time()).unwrap();
    }

    #[test]
    fn wrong_secret_and_skew_are_refused() {
        let p = doc_get_object();
        let q = parse_query(p.uri.query()).unwrap();
        let auth = parse_auth(&p, &q).unwrap().unwrap();
        let e = verify(
            &p,
            &q,
            &auth,
            "not-the-secret",
            Some("us-east-1"),
            doc_time(),
        )
        .unwrap_err();
        assert_eq!(e.code, "SignatureDoesNotMatch");
        let late = doc_time() + time::Duration::minutes(20);
        let e = verify(&p, &q, &auth, DOC_SECRET, Some("us-east-1"), late).unwrap_err();
        assert_eq!(e.code, "RequestTimeTooSkewed");
        let e = verify(&p, &q, &auth, DOC_SECRET, Some("eu-west-1"), doc_time()).unwrap_err();
        assert_eq!(e.code, "AuthorizationHeaderMalformed");
    }

    // The presigned-URL example of the S3 documentation ("Authenticating
    // Requests: Using Query Parameters").
    #[test]
    fn aws_documentation_presigned_vector_verifies() {
        let p = parts(
            "GET",
            "/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404",
            &[("host", "examplebucket.s3.amazonaws.com")],
        );
        let q = parse_query(p.uri.query()).unwrap();
        let auth = parse_auth(&p, &q).unwrap().unwrap();
        verify(&p, &q, &auth, DOC_SECRET, Some("us-east-1"), doc_time()).unwrap();
        let expired = doc_time() + time::Duration::days(2);
        assert_eq!(
            verify(&p, &q, &auth, DOC_SECRET, Some("us-east-1"), expired)
                .unwrap_err()
                .message,
            "Request has expired"
        );
    }

    #[test]
    fn hostile_auth_headers_are_errors_not_panics() {
        for h in [
            "AWS4-HMAC-SHA256",
            "AWS4-HMAC-SHA256 Credential=",
            "AWS4-HMAC-SHA256 Credential=/, SignedHeaders=, Signature=",
            "AWS4-HMAC-SHA256 Credential=a/b/c/d/e/f, SignedHeaders=host, Signature=zz",
            "AWS AKID:sig",
            "Bearer x",
            "AWS4-HMAC-SHA256 Credential=k/20130524/us-east-1/s3/aws4_request, SignedHeaders=, Signature=00",
        ] {
            let p = parts("GET", "/b%zz/k?%%=1", &[("authorization", h), ("x-amz-date", "garbage")]);
            let q = parse_query(p.uri.query());
            let q = q.unwrap_or_default();
            if let Ok(Some(a)) = parse_auth(&p, &q) {
                assert!(verify(&p, &q, &a, "s", Some("us-east-1"), doc_time()).is_err());
            }
            let _ = access_key_hint(&p);
        }
        assert!(decode_chunked(b"zz\r\n", None).is_err());
        assert!(decode_chunked(b"ffffffff\r\nab", None).is_err());
        assert_eq!(
            decode_chunked(b"3\r\nabc\r\n0\r\nx-amz-checksum-crc32:AAAA\r\n\r\n", None).unwrap(),
            (
                b"abc".to_vec(),
                vec![("x-amz-checksum-crc32".to_string(), "AAAA".to_string())]
            )
        );
    }

    #[test]
    fn path_is_encoded_once_not_normalised() {
        let p = parts("GET", "/b/a%20b/../c~d%2Be", &[]);
        let auth = Auth {
            access_key: "k".into(),
            scope_date: "20130524".into(),
            region: "us-east-1".into(),
            service: "s3".into(),
            signed_headers: vec![],
            signature: String::new(),
            amz_date: String::new(),
            presigned: None,
        };
        let c = canonical_request(&p, &[], &auth, "UNSIGNED-PAYLOAD").unwrap();
        assert_eq!(c.lines().nth(1), Some("/b/a%20b/../c~d%2Be"));
    }
}

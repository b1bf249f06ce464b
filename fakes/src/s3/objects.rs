//! Object reads and writes of the S3 data plane: PutObject (integrity
//! checked), GetObject/HeadObject (ranges, conditionals, metadata),
//! CopyObject and DeleteObjects.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::response::Response;
use http::request::Parts;

use super::errors::ApiError;
use super::integrity::{md5_etag, parse_range, stored_headers, verify_integrity, RangeAnswer};
use super::policy::arn;
use super::s3api::{
    authorize, http_date, iso_millis, response, set_header, xml_escape, xml_response,
};
use super::sigv4::{percent_decode, QueryPairs};
use super::state::{now_rfc3339, ObjectMeta};
use super::{Inner, Principal};

/// One authenticated data-plane request, already located.
pub(crate) struct Req<'a> {
    pub inner: &'a Inner,
    pub who: &'a Principal,
    pub parts: &'a Parts,
    pub query: &'a QueryPairs,
    pub bucket: &'a str,
    pub key: &'a str,
    pub body: bytes::Bytes,
    pub trailers: Vec<(String, String)>,
}

impl Req<'_> {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.parts.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Request headers S3 acts on that this fake does not implement: refused by
/// name rather than ignored (an ignored SSE or tagging header would be a
/// plausible wrong answer).
const REFUSED_HEADERS: [&str; 8] = [
    "x-amz-server-side-encryption",
    "x-amz-server-side-encryption-customer-algorithm",
    "x-amz-tagging",
    "x-amz-object-lock-mode",
    "x-amz-object-lock-retain-until-date",
    "x-amz-object-lock-legal-hold",
    "x-amz-website-redirect-location",
    "x-amz-grant-full-control",
];

pub(crate) fn refuse_unimplemented_headers(parts: &Parts, op: &str) -> Result<(), ApiError> {
    if let Some(h) = REFUSED_HEADERS
        .iter()
        .find(|h| parts.headers.contains_key(**h))
    {
        return Err(ApiError::not_implemented(format!(
            "{op} with the {h} header"
        )));
    }
    if let Some(acl) = parts.headers.get("x-amz-acl") {
        if acl.as_bytes() != b"private" {
            return Err(ApiError::not_implemented(format!(
                "{op} with a canned ACL other than private"
            )));
        }
    }
    Ok(())
}

fn key_ok(key: &str) -> Result<(), ApiError> {
    if key.len() > 1024 {
        return Err(ApiError::new(
            400,
            "KeyTooLongError",
            "Your key is too long",
        ));
    }
    Ok(())
}

/// Write `data` as `bucket/key` with `headers` and `checksums`; returns its meta.
pub(crate) fn store_object(
    inner: &Inner,
    bucket: &str,
    key: &str,
    etag: String,
    headers: BTreeMap<String, String>,
    checksums: BTreeMap<String, String>,
    data: &[u8],
) -> Result<ObjectMeta, ApiError> {
    let st = &inner.state;
    st.bucket(bucket)?.ok_or_else(ApiError::no_such_bucket)?;
    let meta = ObjectMeta {
        size: data.len() as u64,
        etag,
        last_modified: now_rfc3339(),
        content_type: headers.get("content-type").cloned(),
        headers,
        checksums,
    };
    st.put_object(bucket, key, &meta, data)?;
    st.flush()?;
    Ok(meta)
}

pub(crate) fn put_object(r: &Req<'_>) -> Result<Response, ApiError> {
    authorize(r.inner, r.who, "s3:PutObject", &arn(r.bucket, Some(r.key)))?;
    key_ok(r.key)?;
    refuse_unimplemented_headers(r.parts, "PutObject")?;
    let headers = stored_headers(&r.parts.headers)?;
    let checksums = verify_integrity(&r.parts.headers, &r.trailers, &r.body)?;
    let st = &r.inner.state;
    let _g = st.lock();
    // Conditional write (If-None-Match: *): refused when the key exists.
    if r.header("if-none-match").map(str::trim) == Some("*")
        && st.object(r.bucket, r.key)?.is_some()
    {
        return Err(precondition_failed());
    }
    if let Some(m) = r.header("if-match") {
        let cur = st
            .object(r.bucket, r.key)?
            .ok_or_else(ApiError::no_such_key)?;
        if !etag_matches(m, &cur.etag) {
            return Err(precondition_failed());
        }
    }
    let meta = store_object(
        r.inner,
        r.bucket,
        r.key,
        md5_etag(&r.body),
        headers,
        checksums,
        &r.body,
    )?;
    let mut resp = response(200, Body::empty());
    set_header(&mut resp, "etag", &format!("\"{}\"", meta.etag));
    echo_checksums(&mut resp, &meta);
    Ok(resp)
}

fn echo_checksums(resp: &mut Response, meta: &ObjectMeta) {
    for (algo, v) in &meta.checksums {
        if let Ok(name) = http::HeaderName::from_bytes(format!("x-amz-checksum-{algo}").as_bytes())
        {
            if let Ok(v) = http::HeaderValue::from_str(v) {
                resp.headers_mut().insert(name, v);
            }
        }
    }
}

fn precondition_failed() -> ApiError {
    ApiError::new(
        412,
        "PreconditionFailed",
        "At least one of the pre-conditions you specified did not hold",
    )
}

fn etag_matches(header: &str, etag: &str) -> bool {
    header
        .split(',')
        .map(|t| t.trim().trim_start_matches("W/").trim_matches('"'))
        .any(|t| t == "*" || t == etag)
}

/// GetObject / HeadObject.
pub(crate) fn get_object(r: &Req<'_>, head: bool) -> Result<Response, ApiError> {
    authorize(r.inner, r.who, "s3:GetObject", &arn(r.bucket, Some(r.key)))?;
    for q in ["partNumber", "versionId"] {
        if r.query.iter().any(|(k, _)| k == q.as_bytes()) {
            return Err(ApiError::not_implemented(format!("GetObject with ?{q}")));
        }
    }
    for h in ["if-modified-since", "if-unmodified-since"] {
        if r.parts.headers.contains_key(h) {
            return Err(ApiError::not_implemented(format!("GetObject with {h}")));
        }
    }
    let st = &r.inner.state;
    st.bucket(r.bucket)?.ok_or_else(ApiError::no_such_bucket)?;
    let meta = st
        .object(r.bucket, r.key)?
        .ok_or_else(ApiError::no_such_key)?;
    if let Some(m) = r.header("if-match") {
        if !etag_matches(m, &meta.etag) {
            return Err(precondition_failed());
        }
    }
    if let Some(m) = r.header("if-none-match") {
        if etag_matches(m, &meta.etag) {
            let mut resp = response(304, Body::empty());
            set_header(&mut resp, "etag", &format!("\"{}\"", meta.etag));
            return Ok(resp);
        }
    }
    let range = match parse_range(r.header("range"), meta.size) {
        Err(mut e) if e.status == 416 => {
            e.extra_header = Some(("content-range", format!("bytes */{}", meta.size)));
            return Err(e);
        }
        other => other?,
    };
    let (status, first, last) = match range {
        RangeAnswer::Whole => (200, 0, meta.size.saturating_sub(1)),
        RangeAnswer::Part(f, l) => (206, f, l),
    };
    let len = if meta.size == 0 { 0 } else { last - first + 1 };
    let body = if head {
        Body::empty()
    } else {
        let data = st.object_data(r.bucket, r.key)?.unwrap_or_default();
        let end = (first + len) as usize;
        Body::from(
            data.get(first as usize..end)
                .map(<[u8]>::to_vec)
                .unwrap_or_default(),
        )
    };
    let mut resp = response(status, body);
    set_header(&mut resp, "etag", &format!("\"{}\"", meta.etag));
    set_header(&mut resp, "last-modified", &http_date(&meta.last_modified));
    set_header(&mut resp, "content-length", &len.to_string());
    set_header(&mut resp, "accept-ranges", "bytes");
    if status == 206 {
        set_header(
            &mut resp,
            "content-range",
            &format!("bytes {first}-{last}/{}", meta.size),
        );
    }
    let content_type = meta
        .content_type
        .as_deref()
        .unwrap_or("binary/octet-stream");
    set_header(&mut resp, "content-type", content_type);
    for (n, v) in meta
        .headers
        .iter()
        .filter(|(n, _)| n.as_str() != "content-type")
    {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(n.as_bytes()),
            http::HeaderValue::from_str(v),
        ) {
            resp.headers_mut().insert(n, v);
        }
    }
    // Whole-object checksums only; S3 leaves them out of ranged answers.
    if r.header("x-amz-checksum-mode") == Some("ENABLED") && status == 200 {
        echo_checksums(&mut resp, &meta);
    }
    Ok(resp)
}

/// `x-amz-copy-source`: `[/]bucket/key` (URL-encoded).
fn copy_source(v: &str) -> Result<(String, String), ApiError> {
    let bad = || {
        ApiError::new(
            400,
            "InvalidArgument",
            "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
        )
    };
    if v.contains("?versionId=") {
        return Err(ApiError::not_implemented(
            "CopyObject from a ?versionId source",
        ));
    }
    let decoded = percent_decode(v, false).ok_or_else(bad)?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
    let s = decoded.strip_prefix('/').unwrap_or(&decoded);
    let (b, k) = s.split_once('/').ok_or_else(bad)?;
    if b.is_empty() || k.is_empty() {
        return Err(bad());
    }
    Ok((b.to_string(), k.to_string()))
}

/// CopyObject (PUT with `x-amz-copy-source`).
pub(crate) fn copy_object(r: &Req<'_>, source: &str) -> Result<Response, ApiError> {
    let (sb, sk) = copy_source(source)?;
    authorize(r.inner, r.who, "s3:GetObject", &arn(&sb, Some(&sk)))?;
    authorize(r.inner, r.who, "s3:PutObject", &arn(r.bucket, Some(r.key)))?;
    key_ok(r.key)?;
    refuse_unimplemented_headers(r.parts, "CopyObject")?;
    if let Some(h) = r
        .parts
        .headers
        .keys()
        .find(|h| h.as_str().starts_with("x-amz-copy-source-"))
    {
        return Err(ApiError::not_implemented(format!("CopyObject with {h}")));
    }
    let replace = match r.header("x-amz-metadata-directive").unwrap_or("COPY") {
        "COPY" => false,
        "REPLACE" => true,
        _ => {
            return Err(ApiError::new(
                400,
                "InvalidArgument",
                "Unknown metadata directive.",
            ))
        }
    };
    let st = &r.inner.state;
    let _g = st.lock();
    st.bucket(&sb)?.ok_or_else(ApiError::no_such_bucket)?;
    let src = st.object(&sb, &sk)?.ok_or_else(ApiError::no_such_key)?;
    if sb == r.bucket && sk == r.key && !replace {
        return Err(ApiError::new(400, "InvalidRequest", "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes."));
    }
    let data = st.object_data(&sb, &sk)?.unwrap_or_default();
    let headers = if replace {
        stored_headers(&r.parts.headers)?
    } else {
        src.headers.clone()
    };
    // The copy is a new single-part object: its ETag is the MD5 of the bytes.
    let meta = store_object(
        r.inner,
        r.bucket,
        r.key,
        md5_etag(&data),
        headers,
        src.checksums.clone(),
        &data,
    )?;
    Ok(xml_response(format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CopyObjectResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LastModified>{}</LastModified><ETag>&quot;{}&quot;</ETag></CopyObjectResult>",
        iso_millis(&meta.last_modified),
        meta.etag
    )))
}

/// The inner texts of every `<tag>…</tag>` in `doc` (flat documents only).
pub(crate) fn xml_texts<'d>(doc: &'d str, tag: &str) -> Vec<&'d str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = doc;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        out.push(&after[..j]);
        rest = &after[j + close.len()..];
    }
    out
}

pub(crate) fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#13;", "\r")
        .replace("&#10;", "\n")
        .replace("&amp;", "&")
}

/// DeleteObjects (POST `?delete`): each key authorised and deleted on its own.
pub(crate) fn delete_objects(r: &Req<'_>) -> Result<Response, ApiError> {
    let doc = std::str::from_utf8(&r.body).map_err(|_| ApiError::malformed_xml())?;
    if !doc.contains("<Delete") {
        return Err(ApiError::malformed_xml());
    }
    let quiet = xml_texts(doc, "Quiet")
        .first()
        .is_some_and(|q| q.trim() == "true");
    let objects = xml_texts(doc, "Object");
    if objects.is_empty() || objects.len() > 1000 {
        return Err(ApiError::malformed_xml());
    }
    let st = &r.inner.state;
    st.bucket(r.bucket)?.ok_or_else(ApiError::no_such_bucket)?;
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DeleteResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">");
    for o in objects {
        let key = xml_unescape(
            xml_texts(o, "Key")
                .first()
                .ok_or_else(ApiError::malformed_xml)?,
        );
        if !xml_texts(o, "VersionId").is_empty() {
            return Err(ApiError::not_implemented("DeleteObjects with a VersionId"));
        }
        let outcome = authorize(
            r.inner,
            r.who,
            "s3:DeleteObject",
            &arn(r.bucket, Some(&key)),
        )
        .and_then(|()| {
            let _g = st.lock();
            st.remove_object(r.bucket, &key)?;
            Ok(())
        });
        match outcome {
            Ok(()) if !quiet => xml.push_str(&format!(
                "<Deleted><Key>{}</Key></Deleted>",
                xml_escape(&key)
            )),
            Ok(()) => {}
            Err(e) => xml.push_str(&format!(
                "<Error><Key>{}</Key><Code>{}</Code><Message>{}</Message></Error>",
                xml_escape(&key),
                xml_escape(&e.code),
                xml_escape(&e.message)
            )),
        }
    }
    st.flush()?;
    xml.push_str("</DeleteResult>");
    Ok(xml_response(xml))
}

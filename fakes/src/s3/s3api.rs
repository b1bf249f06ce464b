//! The S3 data plane, path-style and `BUCKET.localhost` virtual-host style:
//! buckets (create/delete/head/list) and objects (put/get/head/delete/list
//! v1+v2, copy, delete-objects, multipart), each request authenticated, then
//! authorised by policy, then executed against the state.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use http::{HeaderValue, Method, StatusCode};

use super::errors::{s3_error_response, ApiError};
use super::objects::Req;
use super::policy::{arn, decide, Decision, Policy};
use super::sigv4::{parse_query, percent_decode, query_value};
use super::state::BucketRec;
use super::{authenticate, check_header_section, read_body, BodyLimit, Inner, Principal};
use crate::ops::Op;

type Query = [(Vec<u8>, Vec<u8>)];

fn has(q: &Query, name: &str) -> bool {
    q.iter().any(|(k, _)| k == name.as_bytes())
}

/// Bucket and key of a request: path-style, or virtual-host style when the
/// Host is `BUCKET.localhost` (RFC 6761 loopback names; any other Host is
/// path-style, as on a server with no domain configured).
pub(crate) fn locate(parts: &http::request::Parts) -> (String, String) {
    let path = parts.uri.path();
    match virtual_host_bucket(parts) {
        Some(b) => {
            let (first, rest) = split_path(path);
            let key = if rest.is_empty() {
                first
            } else {
                format!("{first}/{rest}")
            };
            (b, key)
        }
        None => split_path(path),
    }
}

fn virtual_host_bucket(parts: &http::request::Parts) -> Option<String> {
    let host = parts.headers.get(http::header::HOST)?.to_str().ok()?;
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let bucket = name.strip_suffix(".localhost")?;
    (!bucket.is_empty()).then(|| bucket.to_ascii_lowercase())
}

/// Bucket and key of a path-style request path.
pub(crate) fn split_path(path: &str) -> (String, String) {
    let decoded = percent_decode(path, false)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let trimmed = decoded.strip_prefix('/').unwrap_or(&decoded);
    match trimmed.split_once('/') {
        Some((b, k)) => (b.to_string(), k.to_string()),
        None => (trimmed.to_string(), String::new()),
    }
}

/// The S3 API's operations: what its gate records and faults aim at.
pub mod ops {
    crate::declare_ops!(
        /// Every S3 operation.
        pub ALL {
            LIST_BUCKETS = "list_buckets",
            CREATE_BUCKET = "create_bucket",
            DELETE_BUCKET = "delete_bucket",
            HEAD_BUCKET = "head_bucket",
            GET_BUCKET_LOCATION = "get_bucket_location",
            LIST_OBJECTS = "list_objects",
            PUT_OBJECT = "put_object",
            GET_OBJECT = "get_object",
            HEAD_OBJECT = "head_object",
            DELETE_OBJECT = "delete_object",
            COPY_OBJECT = "copy_object",
            DELETE_OBJECTS = "delete_objects",
            CREATE_MULTIPART_UPLOAD = "create_multipart_upload",
            UPLOAD_PART = "upload_part",
            COMPLETE_MULTIPART_UPLOAD = "complete_multipart_upload",
            ABORT_MULTIPART_UPLOAD = "abort_multipart_upload",
            LIST_PARTS = "list_parts",
            LIST_MULTIPART_UPLOADS = "list_multipart_uploads",
            UNSUPPORTED = "unsupported",
        }
    );
}

/// The operation name the gate records, with bucket and key.
pub(crate) fn classify(parts: &http::request::Parts, q: &Query) -> (Op, String, String) {
    use ops::*;
    let (bucket, key) = locate(parts);
    let method = &parts.method;
    let upload = has(q, "uploadId");
    let op = match (method.as_str(), bucket.is_empty(), key.is_empty()) {
        ("POST", false, false) if has(q, "uploads") => CREATE_MULTIPART_UPLOAD,
        ("POST", false, false) if upload => COMPLETE_MULTIPART_UPLOAD,
        ("PUT", false, false) if upload => UPLOAD_PART,
        ("DELETE", false, false) if upload => ABORT_MULTIPART_UPLOAD,
        ("GET", false, false) if upload => LIST_PARTS,
        ("GET", false, true) if has(q, "uploads") => LIST_MULTIPART_UPLOADS,
        ("POST", false, true) if has(q, "delete") => DELETE_OBJECTS,
        ("PUT", false, false) if parts.headers.contains_key("x-amz-copy-source") => COPY_OBJECT,
        ("GET", true, _) => LIST_BUCKETS,
        ("PUT", false, true) => CREATE_BUCKET,
        ("DELETE", false, true) => DELETE_BUCKET,
        ("HEAD", false, true) => HEAD_BUCKET,
        ("GET", false, true) if has(q, "location") => GET_BUCKET_LOCATION,
        ("GET", false, true) => LIST_OBJECTS,
        ("PUT", false, false) => PUT_OBJECT,
        ("GET", false, false) => GET_OBJECT,
        ("HEAD", false, false) => HEAD_OBJECT,
        ("DELETE", false, false) => DELETE_OBJECT,
        _ => UNSUPPORTED,
    };
    (op, bucket, key)
}

/// Sub-resources this fake does not implement; answering them as plain
/// bucket/object requests would lie to the client.
const UNSUPPORTED_SUBRESOURCES: &[&str] = &[
    "acl",
    "policy",
    "versioning",
    "versions",
    "tagging",
    "lifecycle",
    "cors",
    "encryption",
    "notification",
    "replication",
    "website",
    "logging",
    "object-lock",
    "retention",
    "legal-hold",
    "select",
    "restore",
    "attributes",
];

fn valid_bucket_name(b: &str) -> bool {
    let ok_chars = b
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-');
    let edges = b.bytes().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && b.bytes().last().is_some_and(|c| c.is_ascii_alphanumeric());
    (3..=63).contains(&b.len()) && ok_chars && edges && !b.contains("..")
}

pub(crate) fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

pub(crate) fn iso_millis(rfc3339: &str) -> String {
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .ok()
        .and_then(|t| t.to_offset(time::UtcOffset::UTC).format(&fmt).ok())
        .unwrap_or_else(|| rfc3339.to_string())
}

pub(crate) fn http_date(rfc3339: &str) -> String {
    let fmt = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .ok()
        .and_then(|t| t.to_offset(time::UtcOffset::UTC).format(&fmt).ok())
        .unwrap_or_default()
}

pub(crate) fn response(status: u16, body: Body) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    r
}

pub(crate) fn xml_response(xml: String) -> Response {
    let mut r = response(200, Body::from(xml));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    r
}

pub(crate) fn set_header(r: &mut Response, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        r.headers_mut().insert(name, v);
    }
}

/// Policy check for a verified caller; the root key may do anything.
pub(crate) fn authorize(
    inner: &Inner,
    who: &Principal,
    action: &str,
    resource: &str,
) -> Result<(), ApiError> {
    match who {
        Principal::Root => Ok(()),
        Principal::User { policies } => {
            let docs = load_policies(inner, policies)?;
            match decide(docs.iter(), action, resource) {
                Decision::Allow => Ok(()),
                _ => Err(ApiError::access_denied()),
            }
        }
    }
}

fn load_policies(inner: &Inner, names: &[String]) -> Result<Vec<Policy>, ApiError> {
    let mut out = Vec::new();
    for n in names {
        // A policy removed after it was attached grants nothing.
        if let Some(rec) = inner.state.policy(n)? {
            if let Ok((p, _)) = Policy::parse(rec.document.to_string().as_bytes()) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

fn owner_of(who: &Principal, access_key: &str) -> String {
    match who {
        Principal::Root => String::new(),
        Principal::User { .. } => access_key.to_string(),
    }
}

/// axum handler for every non-admin path.
pub(crate) async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let head = parts.method == Method::HEAD;
    let resource = parts.uri.path().to_string();
    match serve(&inner, parts, body).await {
        Ok(r) => r,
        Err(e) => s3_error_response(&e, &resource, head),
    }
}

async fn serve(
    inner: &Inner,
    parts: http::request::Parts,
    body: Body,
) -> Result<Response, ApiError> {
    check_header_section(&parts)?;
    let query = parse_query(parts.uri.query())?;
    let body = read_body(&parts, body, BodyLimit::Object).await?;
    let (who, (body, trailers)) = authenticate(inner, &parts, &query, body)?;
    let access_key = super::sigv4::access_key_hint(&parts).unwrap_or_default();
    let (op, bucket, key) = classify(&parts, &query);
    // Keys are UTF-8 in S3; a lossy decode would let two keys collide.
    let decoded = percent_decode(parts.uri.path(), false).unwrap_or_default();
    if std::str::from_utf8(&decoded).is_err() {
        return Err(ApiError::new(
            400,
            "InvalidURI",
            "Couldn't parse the specified URI.",
        ));
    }
    // As MinIO: a name no bucket can have (`..`, `%2e%2e`, capitals) is refused
    // for every operation, not looked up.
    if !bucket.is_empty() && !valid_bucket_name(&bucket) {
        return Err(ApiError::new(
            400,
            "InvalidBucketName",
            "The specified bucket is not valid.",
        ));
    }
    if let Some(sub) = UNSUPPORTED_SUBRESOURCES.iter().find(|s| has(&query, s)) {
        return Err(ApiError::new(
            501,
            "NotImplemented",
            format!("The '{sub}' sub-resource is not implemented by the drivelab S3 fake."),
        ));
    }
    let st = &inner.state;
    match op {
        ops::LIST_BUCKETS => {
            let all = matches!(
                authorize(inner, &who, "s3:ListAllMyBuckets", "arn:aws:s3:::*"),
                Ok(())
            );
            let mut shown = Vec::new();
            for (name, rec) in st.buckets()? {
                let visible = all
                    || [
                        "s3:ListBucket",
                        "s3:GetBucketLocation",
                        "s3:GetObject",
                        "s3:PutObject",
                    ]
                    .iter()
                    .any(|a| {
                        authorize(inner, &who, a, &arn(&name, None)).is_ok()
                            || authorize(inner, &who, a, &arn(&name, Some("x"))).is_ok()
                    });
                if visible {
                    shown.push((name, rec));
                }
            }
            if !all && shown.is_empty() {
                return Err(ApiError::access_denied());
            }
            let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListAllMyBucketsResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Owner><ID>drivelab</ID><DisplayName>drivelab</DisplayName></Owner><Buckets>");
            for (name, rec) in shown {
                xml.push_str(&format!(
                    "<Bucket><Name>{}</Name><CreationDate>{}</CreationDate></Bucket>",
                    xml_escape(&name),
                    iso_millis(&rec.created_at)
                ));
            }
            xml.push_str("</Buckets></ListAllMyBucketsResult>");
            Ok(xml_response(xml))
        }
        ops::CREATE_BUCKET => {
            authorize(inner, &who, "s3:CreateBucket", &arn(&bucket, None))?;
            if !valid_bucket_name(&bucket) {
                return Err(ApiError::new(
                    400,
                    "InvalidBucketName",
                    "The specified bucket is not valid.",
                ));
            }
            let _g = st.lock();
            if let Some(existing) = st.bucket(&bucket)? {
                if existing.owner == owner_of(&who, &access_key) {
                    return Err(ApiError::new(
                        409,
                        "BucketAlreadyOwnedByYou",
                        "Your previous request to create the named bucket succeeded and you already own it.",
                    ));
                }
                return Err(ApiError::new(
                    409,
                    "BucketAlreadyExists",
                    "The requested bucket name is not available. The bucket namespace is shared by all users of the system. Please select a different name and try again.",
                ));
            }
            st.put_bucket(
                &bucket,
                &BucketRec {
                    created_at: super::state::now_rfc3339(),
                    owner: owner_of(&who, &access_key),
                },
            )?;
            st.flush()?;
            let mut r = response(200, Body::empty());
            set_header(&mut r, "location", &format!("/{bucket}"));
            Ok(r)
        }
        ops::DELETE_BUCKET => {
            authorize(inner, &who, "s3:DeleteBucket", &arn(&bucket, None))?;
            let _g = st.lock();
            st.bucket(&bucket)?.ok_or_else(ApiError::no_such_bucket)?;
            if st.has_objects(&bucket)? {
                return Err(ApiError::new(
                    409,
                    "BucketNotEmpty",
                    "The bucket you tried to delete is not empty",
                ));
            }
            st.remove_bucket(&bucket)?;
            st.flush()?;
            Ok(response(204, Body::empty()))
        }
        ops::HEAD_BUCKET => {
            authorize(inner, &who, "s3:ListBucket", &arn(&bucket, None))?;
            st.bucket(&bucket)?.ok_or_else(ApiError::no_such_bucket)?;
            let mut r = response(200, Body::empty());
            set_header(
                &mut r,
                "x-amz-bucket-region",
                inner.config.reported_region(),
            );
            Ok(r)
        }
        ops::GET_BUCKET_LOCATION => {
            authorize(inner, &who, "s3:GetBucketLocation", &arn(&bucket, None))?;
            st.bucket(&bucket)?.ok_or_else(ApiError::no_such_bucket)?;
            // us-east-1 is reported as an empty constraint, as S3 does.
            let region = match inner.config.reported_region() {
                "us-east-1" => "",
                r => r,
            };
            Ok(xml_response(format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<LocationConstraint xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">{}</LocationConstraint>",
                xml_escape(region)
            )))
        }
        ops::LIST_OBJECTS => {
            authorize(inner, &who, "s3:ListBucket", &arn(&bucket, None))?;
            st.bucket(&bucket)?.ok_or_else(ApiError::no_such_bucket)?;
            list_objects(inner, &bucket, &query)
        }
        ops::PUT_OBJECT
        | ops::GET_OBJECT
        | ops::HEAD_OBJECT
        | ops::COPY_OBJECT
        | ops::DELETE_OBJECTS
        | ops::CREATE_MULTIPART_UPLOAD
        | ops::UPLOAD_PART
        | ops::COMPLETE_MULTIPART_UPLOAD
        | ops::ABORT_MULTIPART_UPLOAD
        | ops::LIST_PARTS => {
            let r = Req {
                inner,
                who: &who,
                parts: &parts,
                query: &query,
                bucket: &bucket,
                key: &key,
                body,
                trailers,
            };
            object_op(op, &r)
        }
        ops::LIST_MULTIPART_UPLOADS => Err(ApiError::not_implemented("ListMultipartUploads")),
        ops::DELETE_OBJECT => {
            authorize(inner, &who, "s3:DeleteObject", &arn(&bucket, Some(&key)))?;
            let _g = st.lock();
            st.bucket(&bucket)?.ok_or_else(ApiError::no_such_bucket)?;
            st.remove_object(&bucket, &key)?;
            st.flush()?;
            Ok(response(204, Body::empty()))
        }
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "The specified method is not allowed against this resource.",
        )),
    }
}

/// The object-level operations, served by `objects` and `multipart`.
fn object_op(op: Op, r: &Req<'_>) -> Result<Response, ApiError> {
    use super::{multipart, objects};
    match op {
        ops::PUT_OBJECT => objects::put_object(r),
        ops::GET_OBJECT => objects::get_object(r, false),
        ops::HEAD_OBJECT => objects::get_object(r, true),
        ops::COPY_OBJECT => {
            let source = r
                .header("x-amz-copy-source")
                .unwrap_or_default()
                .to_string();
            objects::copy_object(r, &source)
        }
        // Authorised per key inside, as S3 does.
        ops::DELETE_OBJECTS => objects::delete_objects(r),
        ops::CREATE_MULTIPART_UPLOAD => multipart::create(r),
        ops::UPLOAD_PART => multipart::upload_part(r),
        ops::COMPLETE_MULTIPART_UPLOAD => multipart::complete(r),
        ops::ABORT_MULTIPART_UPLOAD => multipart::abort(r),
        _ => multipart::list_parts(r),
    }
}

fn list_objects(inner: &Inner, bucket: &str, q: &Query) -> Result<Response, ApiError> {
    let v2 = query_value(q, "list-type").as_deref() == Some("2");
    let prefix = query_value(q, "prefix").unwrap_or_default();
    let delimiter = query_value(q, "delimiter").unwrap_or_default();
    let max_keys: usize = match query_value(q, "max-keys") {
        Some(m) => m.parse().map_err(|_| {
            ApiError::new(
                400,
                "InvalidArgument",
                "Provided max-keys not an integer or within integer range",
            )
        })?,
        None => 1000,
    };
    let max_keys = max_keys.min(1000);
    // The continuation token is the hex of the last key returned.
    let after = if v2 {
        match query_value(q, "continuation-token") {
            Some(t) => String::from_utf8(hex::decode(&t).map_err(|_| {
                ApiError::new(
                    400,
                    "InvalidArgument",
                    "The continuation token provided is incorrect",
                )
            })?)
            .unwrap_or_default(),
            None => query_value(q, "start-after").unwrap_or_default(),
        }
    } else {
        query_value(q, "marker").unwrap_or_default()
    };
    let mut contents = Vec::new();
    let mut prefixes: Vec<String> = Vec::new();
    let mut truncated = false;
    let mut last = String::new();
    for (k, meta) in inner.state.objects(bucket)? {
        if !k.starts_with(&prefix) || (!after.is_empty() && k.as_str() <= after.as_str()) {
            continue;
        }
        let common = if delimiter.is_empty() {
            None
        } else {
            k[prefix.len()..]
                .find(&delimiter)
                .map(|i| k[..prefix.len() + i + delimiter.len()].to_string())
        };
        if let Some(cp) = &common {
            if prefixes.last() == Some(cp) {
                last = k.clone();
                continue;
            }
        }
        if contents.len() + prefixes.len() >= max_keys {
            truncated = true;
            break;
        }
        last = k.clone();
        match common {
            Some(cp) => prefixes.push(cp),
            None => contents.push((k, meta)),
        }
    }
    let mut xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>{}</Name><Prefix>{}</Prefix>",
        xml_escape(bucket),
        xml_escape(&prefix)
    );
    if v2 {
        xml.push_str(&format!(
            "<KeyCount>{}</KeyCount>",
            contents.len() + prefixes.len()
        ));
        if let Some(t) = query_value(q, "continuation-token") {
            xml.push_str(&format!(
                "<ContinuationToken>{}</ContinuationToken>",
                xml_escape(&t)
            ));
        }
        if truncated {
            xml.push_str(&format!(
                "<NextContinuationToken>{}</NextContinuationToken>",
                hex::encode(&last)
            ));
        }
    } else {
        xml.push_str(&format!("<Marker>{}</Marker>", xml_escape(&after)));
        if truncated {
            xml.push_str(&format!("<NextMarker>{}</NextMarker>", xml_escape(&last)));
        }
    }
    if !delimiter.is_empty() {
        xml.push_str(&format!(
            "<Delimiter>{}</Delimiter>",
            xml_escape(&delimiter)
        ));
    }
    xml.push_str(&format!(
        "<MaxKeys>{max_keys}</MaxKeys><IsTruncated>{truncated}</IsTruncated>"
    ));
    for (k, m) in contents {
        xml.push_str(&format!(
            "<Contents><Key>{}</Key><LastModified>{}</LastModified><ETag>&quot;{}&quot;</ETag><Size>{}</Size><StorageClass>STANDARD</StorageClass></Contents>",
            xml_escape(&k),
            iso_millis(&m.last_modified),
            m.etag,
            m.size
        ));
    }
    for p in prefixes {
        xml.push_str(&format!(
            "<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>",
            xml_escape(&p)
        ));
    }
    xml.push_str("</ListBucketResult>");
    Ok(xml_response(xml))
}

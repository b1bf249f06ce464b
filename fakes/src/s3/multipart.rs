//! Multipart upload: create, upload part, complete (md5-of-md5s `-N` ETag,
//! S3's part-order, ETag and 5 MiB minimum-size rules), abort, list parts.
//! Parts live in the store until complete or abort.

use axum::body::Body;
use axum::response::Response;

use super::errors::ApiError;
use super::integrity::{md5_etag, multipart_etag, stored_headers, verify_integrity};
use super::objects::{refuse_unimplemented_headers, store_object, xml_texts, xml_unescape, Req};
use super::policy::arn;
use super::s3api::{authorize, iso_millis, response, set_header, xml_escape, xml_response};
use super::sigv4::query_value;
use super::state::{now_rfc3339, PartRec, UploadRec};
use super::MAX_OBJECT_BODY;

/// S3's minimum size of every part but the last.
const MIN_PART: u64 = 5 * 1024 * 1024;
const XMLNS: &str = "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"";

fn no_such_upload() -> ApiError {
    ApiError::new(
        404,
        "NoSuchUpload",
        "The specified multipart upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.",
    )
}

/// The upload named by `?uploadId`, checked against the request's bucket/key.
fn upload_of(r: &Req<'_>) -> Result<(String, UploadRec), ApiError> {
    let id = query_value(r.query, "uploadId").unwrap_or_default();
    let up = r.inner.state.upload(&id)?.ok_or_else(no_such_upload)?;
    if up.bucket != r.bucket || up.key != r.key {
        return Err(no_such_upload());
    }
    Ok((id, up))
}

/// CreateMultipartUpload (POST `?uploads`).
pub(crate) fn create(r: &Req<'_>) -> Result<Response, ApiError> {
    authorize(r.inner, r.who, "s3:PutObject", &arn(r.bucket, Some(r.key)))?;
    refuse_unimplemented_headers(r.parts, "CreateMultipartUpload")?;
    if r.key.len() > 1024 {
        return Err(ApiError::new(
            400,
            "KeyTooLongError",
            "Your key is too long",
        ));
    }
    let st = &r.inner.state;
    st.bucket(r.bucket)?.ok_or_else(ApiError::no_such_bucket)?;
    let id = {
        use rand::Rng;
        let n: u128 = rand::rng().random();
        format!("{n:032x}")
    };
    st.put_upload(
        &id,
        &UploadRec {
            bucket: r.bucket.to_string(),
            key: r.key.to_string(),
            initiated: now_rfc3339(),
            headers: stored_headers(&r.parts.headers)?,
        },
    )?;
    st.flush()?;
    Ok(xml_response(format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<InitiateMultipartUploadResult {XMLNS}><Bucket>{}</Bucket><Key>{}</Key><UploadId>{id}</UploadId></InitiateMultipartUploadResult>",
        xml_escape(r.bucket),
        xml_escape(r.key)
    )))
}

/// UploadPart (PUT `?partNumber=N&uploadId=X`).
pub(crate) fn upload_part(r: &Req<'_>) -> Result<Response, ApiError> {
    authorize(r.inner, r.who, "s3:PutObject", &arn(r.bucket, Some(r.key)))?;
    if r.parts.headers.contains_key("x-amz-copy-source") {
        return Err(ApiError::not_implemented("UploadPartCopy"));
    }
    let n: u32 = query_value(r.query, "partNumber")
        .and_then(|v| v.parse().ok())
        .filter(|n| (1..=10_000).contains(n))
        .ok_or_else(|| {
            ApiError::new(
                400,
                "InvalidArgument",
                "Part number must be an integer between 1 and 10000, inclusive",
            )
        })?;
    let checksums = verify_integrity(&r.parts.headers, &r.trailers, &r.body)?;
    let st = &r.inner.state;
    let _g = st.lock();
    let (id, _) = upload_of(r)?;
    let etag = md5_etag(&r.body);
    let rec = PartRec {
        size: r.body.len() as u64,
        etag: etag.clone(),
        last_modified: now_rfc3339(),
    };
    st.put_part(&id, n, &rec, &r.body)?;
    st.flush()?;
    let mut resp = response(200, Body::empty());
    set_header(&mut resp, "etag", &format!("\"{etag}\""));
    for (algo, v) in &checksums {
        set_header_owned(&mut resp, &format!("x-amz-checksum-{algo}"), v);
    }
    Ok(resp)
}

fn set_header_owned(resp: &mut Response, name: &str, value: &str) {
    if let (Ok(n), Ok(v)) = (
        http::HeaderName::from_bytes(name.as_bytes()),
        http::HeaderValue::from_str(value),
    ) {
        resp.headers_mut().insert(n, v);
    }
}

/// The (part number, ETag) list of a CompleteMultipartUpload body.
fn requested_parts(body: &[u8]) -> Result<Vec<(u32, String)>, ApiError> {
    let doc = std::str::from_utf8(body).map_err(|_| ApiError::malformed_xml())?;
    let parts = xml_texts(doc, "Part");
    if parts.is_empty() {
        return Err(ApiError::malformed_xml());
    }
    parts
        .into_iter()
        .map(|p| {
            let n = xml_texts(p, "PartNumber")
                .first()
                .and_then(|n| n.trim().parse().ok());
            let etag = xml_texts(p, "ETag")
                .first()
                .map(|e| xml_unescape(e).trim().trim_matches('"').to_string());
            n.zip(etag).ok_or_else(ApiError::malformed_xml)
        })
        .collect()
}

/// CompleteMultipartUpload (POST `?uploadId=X`).
pub(crate) fn complete(r: &Req<'_>) -> Result<Response, ApiError> {
    authorize(r.inner, r.who, "s3:PutObject", &arn(r.bucket, Some(r.key)))?;
    let wanted = requested_parts(&r.body)?;
    let st = &r.inner.state;
    let _g = st.lock();
    let (id, up) = upload_of(r)?;
    let have: std::collections::BTreeMap<u32, PartRec> = st.parts(&id)?.into_iter().collect();
    let invalid_part = || {
        ApiError::new(400, "InvalidPart", "One or more of the specified parts could not be found. The part might not have been uploaded, or the specified entity tag might not have matched the part's entity tag.")
    };
    let mut data = Vec::new();
    let mut etags = Vec::new();
    // The order is checked before any part is looked at, as MinIO does.
    if wanted.windows(2).any(|w| w[1].0 <= w[0].0) {
        return Err(ApiError::new(400, "InvalidPartOrder", "The list of parts was not in ascending order. The parts list must be specified in order by part number."));
    }
    for (i, (n, etag)) in wanted.iter().enumerate() {
        let part = have
            .get(n)
            .filter(|p| &p.etag == etag)
            .ok_or_else(invalid_part)?;
        if i + 1 < wanted.len() && part.size < MIN_PART {
            return Err(ApiError::new(
                400,
                "EntityTooSmall",
                "Your proposed upload is smaller than the minimum allowed object size.",
            ));
        }
        if data.len() as u64 + part.size > MAX_OBJECT_BODY as u64 {
            return Err(ApiError::new(400, "EntityTooLarge", format!("Your proposed upload exceeds the maximum allowed object size ({MAX_OBJECT_BODY} bytes in the drivelab S3 fake).")));
        }
        data.extend(st.part_data(&id, *n)?.ok_or_else(invalid_part)?);
        etags.push(part.etag.clone());
    }
    let etag = multipart_etag(&etags);
    store_object(
        r.inner,
        r.bucket,
        r.key,
        etag.clone(),
        up.headers,
        Default::default(),
        &data,
    )?;
    st.remove_upload(&id)?;
    st.flush()?;
    Ok(xml_response(format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CompleteMultipartUploadResult {XMLNS}><Location>/{b}/{k}</Location><Bucket>{b}</Bucket><Key>{k}</Key><ETag>&quot;{etag}&quot;</ETag></CompleteMultipartUploadResult>",
        b = xml_escape(r.bucket),
        k = xml_escape(r.key)
    )))
}

/// AbortMultipartUpload (DELETE `?uploadId=X`).
pub(crate) fn abort(r: &Req<'_>) -> Result<Response, ApiError> {
    authorize(
        r.inner,
        r.who,
        "s3:AbortMultipartUpload",
        &arn(r.bucket, Some(r.key)),
    )?;
    let st = &r.inner.state;
    let _g = st.lock();
    let (id, _) = upload_of(r)?;
    st.remove_upload(&id)?;
    st.flush()?;
    Ok(response(204, Body::empty()))
}

/// ListParts (GET `?uploadId=X`), all parts in one page.
pub(crate) fn list_parts(r: &Req<'_>) -> Result<Response, ApiError> {
    authorize(
        r.inner,
        r.who,
        "s3:ListMultipartUploadParts",
        &arn(r.bucket, Some(r.key)),
    )?;
    if query_value(r.query, "part-number-marker").is_some_and(|m| m != "0") {
        return Err(ApiError::not_implemented(
            "ListParts with part-number-marker",
        ));
    }
    let (id, up) = upload_of(r)?;
    let mut xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListPartsResult {XMLNS}><Bucket>{}</Bucket><Key>{}</Key><UploadId>{id}</UploadId><Initiated>{}</Initiated><StorageClass>STANDARD</StorageClass><PartNumberMarker>0</PartNumberMarker><MaxParts>10000</MaxParts><IsTruncated>false</IsTruncated>",
        xml_escape(r.bucket),
        xml_escape(r.key),
        iso_millis(&up.initiated)
    );
    for (n, p) in r.inner.state.parts(&id)? {
        xml.push_str(&format!(
            "<Part><PartNumber>{n}</PartNumber><LastModified>{}</LastModified><ETag>&quot;{}&quot;</ETag><Size>{}</Size></Part>",
            iso_millis(&p.last_modified),
            p.etag,
            p.size
        ));
    }
    xml.push_str("</ListPartsResult>");
    Ok(xml_response(xml))
}

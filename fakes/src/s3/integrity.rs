//! What S3 checks about an object's bytes and what it answers about them:
//! ETags (MD5, and the multipart md5-of-md5s form), Content-MD5 and the
//! `x-amz-checksum-*` family, user metadata, and byte ranges.

use std::collections::BTreeMap;

use base64::Engine as _;
use http::HeaderMap;
use md5::{Digest as _, Md5};

use super::errors::ApiError;

/// The single-part ETag: the hex MD5 of the bytes.
pub(crate) fn md5_etag(data: &[u8]) -> String {
    hex::encode(Md5::digest(data))
}

/// The multipart ETag: hex MD5 of the parts' binary MD5s, then `-N`.
pub(crate) fn multipart_etag(part_etags: &[String]) -> String {
    let mut all = Vec::with_capacity(part_etags.len() * 16);
    for e in part_etags {
        all.extend(hex::decode(e).unwrap_or_default());
    }
    format!("{}-{}", hex::encode(Md5::digest(&all)), part_etags.len())
}

/// CRC-32C (Castagnoli, reflected 0x82F63B78), bitwise: objects here are small.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The base64 checksum `algo` (crc32, crc32c, sha1 or sha256) of `data`.
pub(crate) fn checksum(algo: &str, data: &[u8]) -> Option<String> {
    let raw: Vec<u8> = match algo {
        "crc32" => crc32fast::hash(data).to_be_bytes().to_vec(),
        "crc32c" => crc32c(data).to_be_bytes().to_vec(),
        "sha1" => sha1::Sha1::digest(data).to_vec(),
        "sha256" => sha2::Sha256::digest(data).to_vec(),
        _ => return None,
    };
    Some(base64::engine::general_purpose::STANDARD.encode(raw))
}

fn b64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .ok()
}

/// Verify Content-MD5 and every `x-amz-checksum-*` the request carries (as
/// headers or aws-chunked trailers); returns the checksums to store and echo.
pub(crate) fn verify_integrity(
    headers: &HeaderMap,
    trailers: &[(String, String)],
    data: &[u8],
) -> Result<BTreeMap<String, String>, ApiError> {
    if let Some(md5) = headers.get("content-md5") {
        let given = md5
            .to_str()
            .ok()
            .and_then(b64)
            .filter(|d| d.len() == 16)
            .ok_or_else(|| {
                ApiError::new(
                    400,
                    "InvalidDigest",
                    "The Content-MD5 you specified is not valid.",
                )
            })?;
        if given != Md5::digest(data).as_slice() {
            return Err(ApiError::new(
                400,
                "BadDigest",
                "The Content-MD5 you specified did not match what we received.",
            ));
        }
    }
    let mut given: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(n, v)| {
            let algo = n.as_str().strip_prefix("x-amz-checksum-")?;
            (algo != "mode" && algo != "type" && algo != "algorithm")
                .then(|| (algo.to_string(), v.to_str().unwrap_or_default().to_string()))
        })
        .collect();
    given.extend(
        trailers
            .iter()
            .filter_map(|(n, v)| Some((n.strip_prefix("x-amz-checksum-")?.to_string(), v.clone()))),
    );
    let mut out = BTreeMap::new();
    for (algo, value) in given {
        let Some(ours) = checksum(&algo, data) else {
            return Err(ApiError::new(
                501,
                "NotImplemented",
                format!("Checksum algorithm x-amz-checksum-{algo} is not implemented by the drivelab S3 fake (crc32, crc32c, sha1, sha256 are)."),
            ));
        };
        if b64(&value).is_none() {
            return Err(ApiError::new(
                400,
                "InvalidRequest",
                format!("Value for x-amz-checksum-{algo} header is invalid."),
            ));
        }
        if value.trim() != ours {
            return Err(ApiError::new(
                400,
                "BadDigest",
                format!(
                    "The {} you specified did not match the calculated checksum.",
                    algo.to_ascii_uppercase()
                ),
            ));
        }
        out.insert(algo, ours);
    }
    Ok(out)
}

/// The stored headers of an object: Content-Type and the other entity
/// headers S3 keeps, and `x-amz-meta-*` (names lowercased, as S3 returns them).
pub(crate) fn stored_headers(headers: &HeaderMap) -> Result<BTreeMap<String, String>, ApiError> {
    const KEPT: [&str; 6] = [
        "content-type",
        "content-encoding",
        "content-disposition",
        "content-language",
        "cache-control",
        "expires",
    ];
    let mut out = BTreeMap::new();
    let mut meta_size = 0;
    for (n, v) in headers {
        let name = n.as_str();
        let user = name.starts_with("x-amz-meta-");
        if !user && !KEPT.contains(&name) {
            continue;
        }
        let value = v.to_str().map_err(|_| {
            ApiError::new(
                400,
                "InvalidArgument",
                format!("Header {name} is not ASCII."),
            )
        })?;
        if user {
            meta_size += name.len() - "x-amz-meta-".len() + value.len();
        }
        out.insert(name.to_string(), value.to_string());
    }
    // S3: user-defined metadata is limited to 2 KB (keys plus values).
    if meta_size > 2048 {
        return Err(ApiError::new(
            400,
            "MetadataTooLarge",
            "Your metadata headers exceed the maximum allowed metadata size.",
        ));
    }
    Ok(out)
}

/// A satisfiable `Range: bytes=...` as an inclusive `(first, last)`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RangeAnswer {
    /// No Range header, or one S3 ignores (not `bytes=`, malformed): the whole object.
    Whole,
    /// Bytes `first..=last`.
    Part(u64, u64),
}

/// Parse a Range header against an object of `size` bytes (RFC 9110 §14).
pub(crate) fn parse_range(value: Option<&str>, size: u64) -> Result<RangeAnswer, ApiError> {
    let Some(spec) = value.and_then(|v| v.trim().strip_prefix("bytes=")) else {
        return Ok(RangeAnswer::Whole);
    };
    if spec.contains(',') {
        return Err(ApiError::new(
            501,
            "NotImplemented",
            "Multiple byte ranges in one GetObject are not implemented (S3 serves one range).",
        ));
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Ok(RangeAnswer::Whole);
    };
    let unsatisfiable = || {
        ApiError::new(
            416,
            "InvalidRange",
            "The requested range is not satisfiable",
        )
    };
    let (a, b) = (a.trim(), b.trim());
    let (first, last) = match (a.parse::<u64>(), b.parse::<u64>()) {
        // bytes=-N: the last N bytes.
        (Err(_), Ok(n)) if a.is_empty() => {
            if n == 0 || size == 0 {
                return Err(unsatisfiable());
            }
            (size.saturating_sub(n), size - 1)
        }
        (Ok(f), Err(_)) if b.is_empty() => (f, size.saturating_sub(1)),
        (Ok(f), Ok(l)) if l >= f => (f, l.min(size.saturating_sub(1))),
        _ => return Ok(RangeAnswer::Whole),
    };
    if first >= size {
        return Err(unsatisfiable());
    }
    Ok(RangeAnswer::Part(first, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_match_published_values() {
        // "123456789" is the CRC catalogue's check input.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        assert_eq!(md5_etag(b""), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(
            checksum("sha1", b"abc").unwrap(),
            "qZk+NkcGgWq6PiVxeFDCbJzQ2J0="
        );
        assert_eq!(
            multipart_etag(&[md5_etag(b"a"), md5_etag(b"b")])
                .split_once('-')
                .unwrap()
                .1,
            "2"
        );
    }

    #[test]
    fn ranges() {
        use RangeAnswer::*;
        assert_eq!(parse_range(Some("bytes=0-9"), 100).unwrap(), Part(0, 9));
        assert_eq!(parse_range(Some("bytes=90-"), 100).unwrap(), Part(90, 99));
        assert_eq!(parse_range(Some("bytes=-10"), 100).unwrap(), Part(90, 99));
        assert_eq!(parse_range(Some("bytes=-1000"), 100).unwrap(), Part(0, 99));
        assert_eq!(
            parse_range(Some("bytes=50-5000"), 100).unwrap(),
            Part(50, 99)
        );
        assert_eq!(parse_range(Some("bytes=9-3"), 100).unwrap(), Whole);
        assert_eq!(parse_range(Some("items=1-2"), 100).unwrap(), Whole);
        assert_eq!(
            parse_range(Some("bytes=100-"), 100).unwrap_err().status,
            416
        );
        assert_eq!(parse_range(Some("bytes=0-0"), 0).unwrap_err().status, 416);
        assert_eq!(
            parse_range(Some("bytes=0-1,4-5"), 100).unwrap_err().status,
            501
        );
    }
}

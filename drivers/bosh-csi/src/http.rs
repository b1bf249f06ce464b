//! The one plain-HTTP client the driver uses for the Director, UAA and the
//! node's mount table: every call bounded by a timeout, transport failures and
//! timeouts kept apart from answers, and redirects never followed (the
//! Director's 302 is an answer whose Location the caller reads).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

/// An HTTP answer, whatever its status.
#[derive(Debug)]
pub struct Answer {
    /// Status code.
    pub status: StatusCode,
    /// Response headers.
    pub headers: HeaderMap,
    /// Whole body.
    pub body: Bytes,
}

/// A call that got no answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Could not connect, or the connection broke before the answer was complete.
    #[error("{url} unreachable: {detail}")]
    Transport {
        /// Where we tried.
        url: String,
        /// The transport error chain.
        detail: String,
    },
    /// No complete answer in time.
    #[error("no answer from {url} within {timeout:?}")]
    Timeout {
        /// Where we tried.
        url: String,
        /// The bound that passed.
        timeout: Duration,
    },
    /// The request could not be built (a bug or a bad base URL).
    #[error("bad request to {url}: {detail}")]
    Local {
        /// Where we meant to go.
        url: String,
        /// What was wrong.
        detail: String,
    },
}

/// How long an idle connection stays in the pool.
const POOL_IDLE: Duration = Duration::from_secs(20);

/// Pooled HTTP/1 client; cheap to clone.
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl HttpClient {
    /// A client whose every call gives up after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        let mut conn = HttpConnector::new();
        conn.set_connect_timeout(Some(timeout));
        conn.set_nodelay(true);
        HttpClient {
            // Idle connections leave the pool well before a server closes them
            // (nginx in front of the Director keeps them 75 s; the lab's fakes
            // 30 s): reusing one the server is closing fails by timing luck.
            inner: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(POOL_IDLE)
                .build(conn),
            timeout,
        }
    }

    /// Send one request. `headers` are added as given (the caller keeps
    /// secrets out of logs; this function logs nothing but method and URL).
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Answer, HttpError> {
        let mut b = Request::builder().method(method.clone()).uri(url);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let payload = match body {
            Some((content_type, bytes)) => {
                b = b.header(http::header::CONTENT_TYPE, content_type);
                Bytes::from(bytes)
            }
            None => Bytes::new(),
        };
        let req = b.body(Full::new(payload)).map_err(|e| HttpError::Local {
            url: url.to_string(),
            detail: e.to_string(),
        })?;
        let fut = async {
            let resp = self
                .inner
                .request(req)
                .await
                .map_err(|e| HttpError::Transport {
                    url: url.to_string(),
                    detail: error_chain(&e),
                })?;
            let (parts, body) = resp.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| HttpError::Transport {
                    url: url.to_string(),
                    detail: format!("reading the answer: {}", error_chain(&e)),
                })?
                .to_bytes();
            Ok::<_, HttpError>(Answer {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        let answer = tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| HttpError::Timeout {
                url: url.to_string(),
                timeout: self.timeout,
            })??;
        tracing::debug!(%method, url, status = answer.status.as_u16(), "http call");
        Ok(answer)
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

/// Characters a query value or form field keeps unescaped (RFC 3986 unreserved).
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encode one query value or form field.
pub fn encode(v: &str) -> String {
    percent_encoding::utf8_percent_encode(v, UNRESERVED).to_string()
}

/// An `application/x-www-form-urlencoded` body.
pub fn form(fields: &[(&str, &str)]) -> Vec<u8> {
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encoding() {
        let f = form(&[("grant_type", "client_credentials"), ("scope", "a.b c&d=e")]);
        assert_eq!(
            String::from_utf8(f).unwrap(),
            "grant_type=client_credentials&scope=a.b%20c%26d%3De"
        );
        assert_eq!(encode("/dev/disk/by-id/x"), "%2Fdev%2Fdisk%2Fby-id%2Fx");
    }

    #[tokio::test]
    async fn unreachable_is_transport() {
        // Port 1 on loopback: nothing listens.
        let c = HttpClient::new(Duration::from_secs(2));
        let e = c
            .send(Method::GET, "http://127.0.0.1:1/info", &[], None)
            .await
            .unwrap_err();
        assert!(matches!(e, HttpError::Transport { .. }), "{e}");
    }
}

//! TLS for a fake whose real clients only trust it over TLS: client-go sends a
//! kubeconfig's credentials only over https. Each lab makes a throwaway CA and
//! a server certificate for 127.0.0.1 and localhost when it starts; clients get
//! the CA the way a kubeconfig's `certificate-authority-data` hands it out.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// Why the lab's certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Generating a key or signing a certificate failed.
    #[error("making the lab's TLS certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    /// rustls refused the certificate or key.
    #[error("configuring TLS: {0}")]
    Config(#[from] tokio_rustls::rustls::Error),
}

/// A server identity on loopback and the CA that signed it. Cheap to clone.
#[derive(Clone)]
pub struct TlsIdentity {
    ca_pem: Arc<str>,
    acceptor: TlsAcceptor,
}

impl TlsIdentity {
    /// A new CA (ECDSA P-256, OS randomness) and a server certificate it signs
    /// for `127.0.0.1` and `localhost`. The CA's key is dropped here, so
    /// nothing can sign for it again.
    pub fn generate() -> Result<Self, TlsError> {
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "drivelab lab CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);

        let mut server = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])?;
        server
            .distinguished_name
            .push(DnType::CommonName, "drivelab kube-apiserver");
        let key = KeyPair::generate()?;
        let cert = server.signed_by(&key, &issuer)?;

        let chain = vec![cert.der().clone(), ca_cert.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        // HTTP/1.1 only: the fakes' connection handling is HTTP/1.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            ca_pem: ca_cert.pem().into(),
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// The CA certificate, PEM: what a client must trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }
}

/// GET `path` from `https://127.0.0.1:PORT` trusting only `ca_pem`, with
/// `bearer` as the token if given: (status, the whole answer). For tests and
/// probes that check what a stranger, or a given identity, is told.
pub async fn get(
    url: &str,
    path: &str,
    bearer: Option<&str>,
    ca_pem: &str,
) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::{pki_types::ServerName, ClientConfig, RootCertStore};
    let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
    let addr = url
        .strip_prefix("https://")
        .ok_or_else(|| invalid(format!("{url}: not an https URL")))?
        .trim_end_matches('/');
    use tokio_rustls::rustls::pki_types::pem::PemObject as _;
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let c = c.map_err(|e| invalid(format!("the CA is not PEM: {e}")))?;
        roots.add(c).map_err(|e| invalid(e.to_string()))?;
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).to_string();
    let name = ServerName::try_from(host).map_err(|e| invalid(e.to_string()))?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await?;
    let mut answer = Vec::new();
    // The server may close without a TLS close_notify; what was read stands.
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_lab_gets_its_own_ca() {
        let a = TlsIdentity::generate().unwrap();
        let b = TlsIdentity::generate().unwrap();
        assert!(a.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert_ne!(a.ca_pem(), b.ca_pem());
        use tokio_rustls::rustls::pki_types::pem::PemObject as _;
        let certs = CertificateDer::pem_slice_iter(a.ca_pem().as_bytes()).count();
        assert_eq!(certs, 1, "the CA PEM holds one certificate");
    }

    /// A client trusting the lab's CA gets through; one trusting another lab's does not.
    #[tokio::test]
    async fn clients_trust_the_lab_by_its_ca() {
        let id = TlsIdentity::generate().unwrap();
        let router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let l = crate::serve::serve_https(router, crate::serve::loopback(), &id)
            .await
            .unwrap();
        let (status, body) = get(&l.url(), "/", None, id.ca_pem()).await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.ends_with("ok"), "{body}");
        let other = TlsIdentity::generate().unwrap();
        assert!(get(&l.url(), "/", None, other.ca_pem()).await.is_err());
    }
}

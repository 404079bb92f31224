//! The TLS of `thunder-cli query` and `explain`: its files ([`TlsSettings`]), and why a
//! connection to the server failed, in words. tonic reports a refused handshake as `transport
//! error` or `operation was canceled`: the cause (rustls' error, or the server's alert) sits
//! deep in the error's sources, or, when the server refuses the client's certificate after the
//! client has finished its side of a TLS 1.3 handshake, nowhere. [`explain`] looks in the sources, and
//! [`diagnose`] runs the handshake again as the query did and reads the server's answer; both
//! say what the failure means for the flags, as the server's log says it for its side.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{AlertDescription, CertificateError};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, Uri};

/// How long [`diagnose`] waits for the server, to connect and to answer.
const DIAGNOSE_TIMEOUT: Duration = Duration::from_secs(3);

/// What a client sends first on an HTTP/2 connection: the preface and an empty SETTINGS frame.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// The TLS files of `--tls-ca`, `--tls-cert` and `--tls-key`, read, and `--tls-domain`.
pub struct TlsSettings {
    /// The CA the server's certificate must chain to (PEM).
    pub ca: Vec<u8>,
    /// The client certificate and key (PEM), for mTLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The server name to verify instead of the host of the address.
    pub domain: Option<String>,
}

impl TlsSettings {
    /// The tonic client configuration of these settings.
    pub fn tonic(&self) -> ClientTlsConfig {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca));
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            tls = tls.domain_name(domain.clone());
        }
        tls
    }

    /// The rustls client configuration tonic builds from these settings: the CA as the only
    /// root, the client certificate if any, ALPN `h2`.
    fn rustls(&self) -> anyhow::Result<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.ca) {
            roots.add(cert.context("--tls-ca")?).context("--tls-ca")?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let mut config = match &self.identity {
            Some((cert, key)) => builder.with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<_, _>>()
                    .context("--tls-cert")?,
                PrivateKeyDer::from_pem_slice(key).context("--tls-key")?,
            )?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

/// Why a TLS connection to `addr` with `settings` fails, in words, found by running its
/// handshake again and reading the server's first answer to an HTTP/2 preface (a TLS 1.3
/// server refuses a client certificate only after the client has finished its side); `None`
/// when the handshake holds or the server cannot be reached.
pub async fn diagnose(addr: &Uri, settings: &TlsSettings) -> Option<String> {
    let host = addr.host()?.trim_start_matches('[').trim_end_matches(']');
    let port = addr.port_u16().unwrap_or(443);
    let name = settings.domain.as_deref().unwrap_or(host);
    let name = ServerName::try_from(name.to_owned()).ok()?;
    let config = settings.rustls().ok()?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        let mut tls = match connector.connect(name, tcp).await {
            Ok(tls) => tls,
            Err(e) => return explain(&e),
        };
        if let Err(e) = tls.write_all(HTTP2_PREFACE).await {
            return explain(&e);
        }
        let mut answer = [0u8; 64];
        match tls.read(&mut answer).await {
            Ok(_) => None,
            Err(e) => explain(&e),
        }
    };
    tokio::time::timeout(DIAGNOSE_TIMEOUT, handshake)
        .await
        .ok()
        .flatten()
}

/// Why a connection or a call to `addr` failed with `error`, when it is a TLS handshake
/// (`settings` set): from `error`'s sources, else from the handshake run again.
pub async fn failure(
    error: &(dyn Error + 'static),
    addr: &Uri,
    settings: Option<&TlsSettings>,
) -> Option<String> {
    let settings = settings?;
    match explain(error) {
        Some(why) => Some(why),
        None => diagnose(addr, settings).await,
    }
}

/// What the TLS failure in `error`'s chain of sources means and what to change, or `None` when
/// the chain holds no TLS failure.
pub fn explain(error: &(dyn Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(current) = next {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return describe(tls);
        }
        // An I/O error's `source` skips the error it wraps: look at that one too.
        if let Some(io) = current.downcast_ref::<std::io::Error>()
            && let Some(tls) = io.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>())
        {
            return describe(tls);
        }
        next = current.source();
    }
    None
}

/// `tls` in words, with the flag that fixes it; `None` for errors that are not about the
/// handshake's certificates or protocol.
fn describe(tls: &rustls::Error) -> Option<String> {
    let text = match tls {
        rustls::Error::InvalidCertificate(certificate) => server_certificate(certificate),
        rustls::Error::AlertReceived(alert) => server_alert(*alert),
        rustls::Error::InvalidMessage(_) => {
            "the server did not answer in TLS: is its gRPC port plaintext? Use an http:// \
             address without the --tls-* flags"
                .to_owned()
        }
        rustls::Error::PeerIncompatible(why) => {
            format!("the server and this client share no TLS version or cipher ({why:?})")
        }
        _ => return None,
    };
    Some(format!("TLS handshake failed: {text}"))
}

/// The server's certificate was refused by this client.
fn server_certificate(error: &CertificateError) -> String {
    match error {
        CertificateError::UnknownIssuer => "the server's certificate is not signed by the CA of \
             --tls-ca (unknown CA): give the CA that issued it"
            .to_owned(),
        CertificateError::NotValidForName => "the server's certificate is not issued for the \
             host name of --addr (hostname mismatch): give the name it was issued for with \
             --tls-domain"
            .to_owned(),
        CertificateError::NotValidForNameContext {
            expected,
            presented,
        } => format!(
            "the server's certificate is not issued for `{}` (hostname mismatch; it names {}): \
             give one of its names with --tls-domain",
            server_name(expected),
            if presented.is_empty() {
                "no name".to_owned()
            } else {
                presented.join(", ")
            }
        ),
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "the server's certificate has expired".to_owned()
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "the server's certificate is not valid yet (check the clocks)".to_owned()
        }
        other => format!("the server's certificate is refused: {other}"),
    }
}

/// The server refused the handshake with `alert`: with mTLS, mostly about the client's
/// certificate.
fn server_alert(alert: AlertDescription) -> String {
    match alert {
        AlertDescription::CertificateRequired | AlertDescription::HandshakeFailure => {
            "the server requires a client certificate (mTLS) and none was sent: give \
             --tls-cert and --tls-key"
                .to_owned()
        }
        AlertDescription::UnknownCA => "the server does not trust the client certificate \
             (unknown CA): --tls-cert is not signed by the CA the server's --tls-client-ca \
             names"
            .to_owned(),
        AlertDescription::CertificateExpired => "the server refused the client certificate: \
             it has expired"
            .to_owned(),
        AlertDescription::BadCertificate
        | AlertDescription::UnsupportedCertificate
        | AlertDescription::CertificateUnknown
        | AlertDescription::CertificateRevoked => format!(
            "the server refused the client certificate ({alert:?}): is it a client \
             certificate of the CA the server trusts?"
        ),
        other => format!("the server ended the handshake with the alert {other:?}"),
    }
}

/// A server name as rustls reports it.
fn server_name(name: &rustls::pki_types::ServerName<'_>) -> String {
    match name {
        rustls::pki_types::ServerName::DnsName(dns) => dns.as_ref().to_owned(),
        rustls::pki_types::ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tls_error_is_found_inside_an_io_error_and_said_in_words() {
        let wrapped = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
        );
        let why = explain(&wrapped).expect("found");
        assert!(why.contains("requires a client certificate") && why.contains("--tls-cert"));
        let unknown = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert!(explain(&unknown).is_some_and(|w| w.contains("unknown CA")));
        let other = std::io::Error::other("connection refused");
        assert_eq!(explain(&other), None);
    }
}

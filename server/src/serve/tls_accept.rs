//! TLS on the gRPC port, handshaken here rather than inside tonic so that a failed handshake is
//! seen: each one is counted in `grpc_tls_handshake_failures_total{reason}` and logged (at most
//! [`LOG_LINES_PER_SEC`] lines a second, with the count of those left out) with the peer and
//! the reason. tonic's own TLS acceptor drops them at debug level, which left an operator no
//! trace of clients refused for a missing certificate or of a plaintext health check hitting a
//! TLS port.
//!
//! The server requires a client certificate that chains to `--tls-client-ca` (mTLS) and
//! offers HTTP/2 over ALPN, as tonic's acceptor did.

use std::io;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::error::StartupError;
use crate::serve::log_limit::LogLimit;
use crate::serve::metrics::{ConnectionMetrics, TLS_FAILURE_REASONS};
use crate::serve::tls::TlsFiles;

/// Log lines about failed handshakes per second at most.
pub const LOG_LINES_PER_SEC: u32 = 10;

/// How long the connection of a refused handshake stays open to deliver the alert that says
/// why ([`close_refused`]).
const REFUSAL_LINGER: Duration = Duration::from_millis(250);

/// Why a TLS handshake on the gRPC port failed: the `reason` label of
/// `grpc_tls_handshake_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFailure {
    /// The client sent no certificate (mTLS requires one).
    NoClientCertificate,
    /// The client's certificate does not chain to `--tls-client-ca`, has expired, or is not
    /// valid for client authentication.
    BadClientCertificate,
    /// The peer does not speak TLS (plaintext h2c, HTTP/1, a probe without TLS).
    NotTls,
    /// The client ended the handshake with an alert (for example, it does not trust the
    /// server's certificate).
    ClientAlert,
    /// Another TLS protocol error (no common version or cipher suite, a malformed message).
    Protocol,
    /// The handshake did not complete within `--grpc-handshake-timeout-ms`.
    Timeout,
    /// The peer closed the connection before the handshake completed (a TCP-only probe).
    Closed,
}

impl TlsFailure {
    /// Every reason, in the order the metric's help lists them.
    pub const ALL: [TlsFailure; 7] = [
        Self::NoClientCertificate,
        Self::BadClientCertificate,
        Self::NotTls,
        Self::ClientAlert,
        Self::Protocol,
        Self::Timeout,
        Self::Closed,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        TLS_FAILURE_REASONS[self as usize]
    }

    /// The reason of a failed `accept` (tokio-rustls wraps rustls' errors in `io::Error`).
    pub fn of(error: &io::Error) -> Self {
        if let Some(tls) = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return match tls {
                rustls::Error::NoCertificatesPresented => Self::NoClientCertificate,
                rustls::Error::InvalidCertificate(_) => Self::BadClientCertificate,
                rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType) => {
                    Self::NotTls
                }
                rustls::Error::AlertReceived(_) => Self::ClientAlert,
                _ => Self::Protocol,
            };
        }
        match error.kind() {
            io::ErrorKind::TimedOut => Self::Timeout,
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => Self::Closed,
            _ => Self::Protocol,
        }
    }
}

/// The acceptor of `files`: their certificate chain and key, client certificates required and
/// verified against their client CA, ALPN `h2`.
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, StartupError> {
    let tls_error = |what: &str, path: &std::path::Path, e: &dyn std::fmt::Display| {
        StartupError::Tls(format!("{what} {}: {e}", path.display()))
    };
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| tls_error("cannot read the certificate chain", &files.cert, &e))?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| tls_error("cannot read the private key", &files.key, &e))?;
    let cas = CertificateDer::pem_file_iter(&files.client_ca)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| tls_error("cannot read the client CA", &files.client_ca, &e))?;
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(cas);
    if added == 0 {
        return Err(StartupError::Tls(format!(
            "{} holds no usable CA certificate",
            files.client_ca.display()
        )));
    }
    // An explicit provider: the process never depends on which one is installed by default.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), Arc::clone(&provider))
        .build()
        .map_err(|e| tls_error("cannot use the client CA", &files.client_ca, &e))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StartupError::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| {
            StartupError::Tls(format!(
                "{} with {}: {}",
                files.cert.display(),
                files.key.display(),
                certified_key_error(&e)
            ))
        })?;
    config.alpn_protocols.push(b"h2".to_vec());
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Why rustls refuses a certificate chain and key as the server's, in words: the key is not
/// the certificate's, or the certificate is one rustls cannot use (an X.509 version 1 or 2
/// certificate, which webpki refuses whatever the key).
pub fn certified_key_error(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            "the key does not fit the certificate (it is not the key of its first certificate)"
                .to_owned()
        }
        // webpki's error reaches rustls as an opaque `Other`; its name is its text.
        other if format!("{other:?}").contains("UnsupportedCertVersion") => {
            "the certificate is not X.509 version 3, the only version rustls and TLS clients \
             accept: reissue it as version 3 with a subjectAltName naming the server"
                .to_owned()
        }
        other => format!("rustls refuses the certificate and key: {other}"),
    }
}

/// Runs the handshake of `io` from `peer` within `timeout`; a failure is counted, logged
/// (rate-limited) and returned as `None`.
pub async fn handshake<IO>(
    acceptor: &TlsAcceptor,
    io: IO,
    peer: SocketAddr,
    timeout: Duration,
) -> Option<TlsStream<IO>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let error = match tokio::time::timeout(timeout, acceptor.accept(io).into_fallible()).await {
        Ok(Ok(stream)) => return Some(stream),
        Ok(Err((error, io))) => {
            close_refused(io).await;
            error
        }
        Err(_) => io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"),
    };
    let failure = TlsFailure::of(&error);
    ConnectionMetrics::global()
        .tls_handshake_failures
        .with_label_values(&[failure.label()])
        .inc();
    static LOG_LIMIT: LazyLock<LogLimit> = LazyLock::new(|| {
        LogLimit::per_second(NonZeroU32::new(LOG_LINES_PER_SEC).unwrap_or(NonZeroU32::MIN))
    });
    if let Some(suppressed) = LOG_LIMIT.allow() {
        tracing::warn!(
            %peer,
            reason = failure.label(),
            error = %error,
            suppressed,
            "TLS handshake failed on the gRPC port"
        );
    }
    None
}

/// Closes the connection of a refused handshake so that the client learns why: rustls has
/// written its alert (no client certificate, an unknown CA, ...) into the connection, which
/// batches writes, so it is flushed, the write side shut, and what the client sent meanwhile
/// read and dropped, so that the close does not reset the connection before the client has
/// read the alert. At most [`REFUSAL_LINGER`].
async fn close_refused<IO: AsyncRead + AsyncWrite + Unpin>(mut io: IO) {
    let linger = async {
        if io.flush().await.is_err() || io.shutdown().await.is_err() {
            return;
        }
        let mut sink = [0u8; 4096];
        while matches!(io.read(&mut sink).await, Ok(n) if n > 0) {}
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, linger).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrapped(error: rustls::Error) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, error)
    }

    #[test]
    fn rustls_errors_map_to_reasons() {
        assert_eq!(
            TlsFailure::of(&wrapped(rustls::Error::NoCertificatesPresented)),
            TlsFailure::NoClientCertificate
        );
        assert_eq!(
            TlsFailure::of(&wrapped(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Expired
            ))),
            TlsFailure::BadClientCertificate
        );
        assert_eq!(
            TlsFailure::of(&wrapped(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType
            ))),
            TlsFailure::NotTls
        );
        assert_eq!(
            TlsFailure::of(&wrapped(rustls::Error::AlertReceived(
                rustls::AlertDescription::UnknownCA
            ))),
            TlsFailure::ClientAlert
        );
        assert_eq!(
            TlsFailure::of(&io::Error::from(io::ErrorKind::UnexpectedEof)),
            TlsFailure::Closed
        );
        assert_eq!(
            TlsFailure::of(&io::Error::from(io::ErrorKind::TimedOut)),
            TlsFailure::Timeout
        );
        assert_eq!(
            TlsFailure::NoClientCertificate.label(),
            "no_client_certificate"
        );
        assert_eq!(TlsFailure::Closed.label(), "closed");
        for (i, failure) in TlsFailure::ALL.into_iter().enumerate() {
            assert_eq!(failure as usize, i, "{failure:?}");
        }
        let labels: std::collections::BTreeSet<_> =
            TlsFailure::ALL.iter().map(|f| f.label()).collect();
        assert_eq!(labels.len(), TlsFailure::ALL.len());
    }
}

//! gRPC TLS: with a certificate, its key and a client CA the server speaks TLS and requires a
//! client certificate signed by that CA (mTLS); without them it serves plaintext h2c.

use std::path::PathBuf;

use crate::error::StartupError;

/// PEM files of the server's TLS identity and of the CA that client certificates must chain to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// Server certificate chain (PEM).
    pub cert: PathBuf,
    /// Server private key (PEM).
    pub key: PathBuf,
    /// CA bundle that signs client certificates (PEM).
    pub client_ca: PathBuf,
}

impl TlsFiles {
    /// All three paths, or none (plaintext); any other combination is a configuration error.
    pub fn from_parts(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        client_ca: Option<PathBuf>,
    ) -> Result<Option<Self>, StartupError> {
        match (cert, key, client_ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(client_ca)) => Ok(Some(Self {
                cert,
                key,
                client_ca,
            })),
            _ => Err(StartupError::Config(
                "TLS needs all of --tls-cert, --tls-key and --tls-client-ca (or none of them)"
                    .into(),
            )),
        }
    }
}

//! Throw-away PKIs for the TLS tests (rcgen): CAs and the certificates they sign, all PEM, and
//! a rustls server configuration from them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A CA, a server certificate for `localhost` and a client certificate, all PEM.
pub struct Pki {
    /// The CA's certificate.
    pub ca_pem: String,
    /// The server's certificate and key.
    pub server: (String, String),
    /// A client's certificate and key.
    pub client: (String, String),
}

/// A fresh PKI.
pub fn new_pki() -> Pki {
    let ca = Ca::new("thunder test CA");
    Pki {
        ca_pem: ca.pem(),
        server: ca.leaf(&["localhost"], false),
        client: ca.leaf(&["thunder-client"], false),
    }
}

/// A self-signed CA.
pub struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    /// A CA whose common name is `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Self(CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA"))
    }

    /// The CA's certificate.
    pub fn pem(&self) -> String {
        self.0.pem()
    }

    /// A certificate and its key for `names` (the first is also the common name), signed by
    /// this CA; valid now, or only during 2020 when `expired`.
    pub fn leaf(&self, names: &[&str], expired: bool) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .expect("params");
        if let Some(name) = names.first() {
            params.distinguished_name.push(DnType::CommonName, *name);
        }
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let cert = params.signed_by(&key, &self.0).expect("signed");
        (cert.pem(), key.serialize_pem())
    }
}

/// A rustls server configuration with the certificate `cert_pem` and its key, requiring a
/// client certificate signed by `client_ca_pem` when one is given.
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    client_ca_pem: Option<&str>,
) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate");
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key");
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = match client_ca_pem {
        Some(ca_pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
                roots.add(ca.expect("CA")).expect("root");
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .expect("verifier");
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(builder.with_single_cert(certs, key).expect("server config"))
}

/// Writes `contents` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("written");
    path
}

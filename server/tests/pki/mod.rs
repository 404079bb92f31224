//! A throw-away PKI for the TLS tests (rcgen): a CA, a server and a client certificate.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

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
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key")).expect("CA");
    let leaf = |name: &str| {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec![name.to_string()])
            .expect("params")
            .signed_by(&key, &ca)
            .expect("signed");
        (cert.pem(), key.serialize_pem())
    };
    Pki {
        ca_pem: ca.pem(),
        server: leaf("localhost"),
        client: leaf("thunder-client"),
    }
}

/// Writes `contents` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("written");
    path
}

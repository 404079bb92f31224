//! The Kafka connection's security settings: what `--kafka-security-protocol`, the SASL and the
//! TLS flags mean together (after `-X` overrides), the mistakes refused before any client is
//! created, and the checks of the TLS files that `--check-config` runs.
//!
//! The TLS files are read with OpenSSL, the library librdkafka itself loads them with, so a
//! file `--check-config` accepts is one librdkafka accepts.

use std::path::Path;

use openssl::asn1::Asn1Time;
use openssl::pkey::{PKey, Private};
use openssl::x509::X509;

use super::client::KafkaClientArgs;

/// A certificate that expires within this many days is warned about.
pub const EXPIRY_WARNING_DAYS: u32 = 30;

/// The SASL mechanisms librdkafka knows, with the `builtin.features` entry a build needs for each.
const MECHANISMS: [(&str, &str); 5] = [
    ("PLAIN", "sasl_plain"),
    ("SCRAM-SHA-256", "sasl_scram"),
    ("SCRAM-SHA-512", "sasl_scram"),
    ("GSSAPI", "sasl_gssapi"),
    ("OAUTHBEARER", "sasl_oauthbearer"),
];

/// `security.protocol` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecurityProtocol {
    /// No TLS, no SASL.
    Plaintext,
    /// TLS.
    Ssl,
    /// SASL over a plain connection.
    SaslPlaintext,
    /// SASL over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Parses a librdkafka `security.protocol` value (case-insensitive, like librdkafka).
    pub fn parse(value: &str) -> Option<Self> {
        match value.to_ascii_lowercase().as_str() {
            "plaintext" => Some(Self::Plaintext),
            "ssl" => Some(Self::Ssl),
            "sasl_plaintext" => Some(Self::SaslPlaintext),
            "sasl_ssl" => Some(Self::SaslSsl),
            _ => None,
        }
    }

    /// The connection is TLS.
    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    /// The connection authenticates with SASL.
    pub fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// What a check found: problems make the configuration invalid, warnings do not.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Mistakes that stop the server (or `--check-config`, exit 2).
    pub problems: Vec<String>,
    /// Things an operator should know that do not stop it.
    pub warnings: Vec<String>,
}

impl Findings {
    /// Appends `other`'s findings.
    pub fn extend(&mut self, other: Findings) {
        self.problems.extend(other.problems);
        self.warnings.extend(other.warnings);
    }
}

impl KafkaClientArgs {
    /// The value librdkafka gets for `key`: the last `-X` of that key, else `flag`.
    fn effective<'a>(&'a self, keys: &[&str], flag: Option<&'a str>) -> Option<&'a str> {
        self.kafka_properties
            .iter()
            .rev()
            .find(|(k, _)| keys.contains(&k.as_str()))
            .map(|(_, v)| v.as_str())
            .or(flag)
    }

    /// The `security.protocol` in effect (`-X security.protocol` wins over the flag).
    pub fn security_protocol(&self) -> &str {
        self.effective(&["security.protocol"], Some(&self.kafka_security_protocol))
            .unwrap_or("plaintext")
    }

    /// The SASL mechanism in effect (`-X sasl.mechanism(s)` wins over the flag).
    pub fn sasl_mechanism(&self) -> Option<&str> {
        self.effective(
            &["sasl.mechanism", "sasl.mechanisms"],
            self.kafka_sasl_mechanism.as_deref(),
        )
        .filter(|m| !m.trim().is_empty())
    }

    fn tls_file(&self, key: &str, flag: Option<&str>) -> Option<String> {
        self.effective(&[key], flag)
            .filter(|v| !v.trim().is_empty())
            .map(str::to_owned)
    }

    /// The CA bundle brokers are verified with, if set.
    pub fn ssl_ca_location(&self) -> Option<String> {
        self.tls_file("ssl.ca.location", self.kafka_ssl_ca_location.as_deref())
    }

    /// The client certificate, if set.
    pub fn ssl_certificate_location(&self) -> Option<String> {
        self.tls_file(
            "ssl.certificate.location",
            self.kafka_ssl_certificate_location.as_deref(),
        )
    }

    /// The client certificate's key, if set.
    pub fn ssl_key_location(&self) -> Option<String> {
        self.tls_file("ssl.key.location", self.kafka_ssl_key_location.as_deref())
    }

    /// The client key's passphrase, if set.
    fn ssl_key_password(&self) -> Option<&str> {
        self.effective(
            &["ssl.key.password"],
            self.kafka_ssl_key_password.as_deref(),
        )
    }

    /// Checks the security settings as a whole, without reading files: a known protocol, a
    /// mechanism for a `sasl_*` protocol (librdkafka would silently pick GSSAPI), credentials
    /// for PLAIN and SCRAM, a client certificate with its key. Problems here refuse start-up
    /// ([`KafkaClientArgs::client_config`] fails with them).
    pub fn security_settings(&self) -> Findings {
        let mut found = Findings::default();
        let raw_protocol = self.security_protocol();
        let Some(protocol) = SecurityProtocol::parse(raw_protocol) else {
            found.problems.push(format!(
                "--kafka-security-protocol `{raw_protocol}` is not one of plaintext, ssl, \
                 sasl_plaintext, sasl_ssl"
            ));
            return found;
        };
        let names = MECHANISMS.map(|(name, _)| name).join(", ");
        match (protocol.uses_sasl(), self.sasl_mechanism()) {
            (true, None) => found.problems.push(format!(
                "--kafka-security-protocol {raw_protocol} needs --kafka-sasl-mechanism \
                 ({names}); without it librdkafka would try GSSAPI (Kerberos)"
            )),
            (true, Some(mechanism)) => {
                let known = MECHANISMS
                    .iter()
                    .any(|(name, _)| name.eq_ignore_ascii_case(mechanism));
                if !known {
                    found.problems.push(format!(
                        "--kafka-sasl-mechanism `{mechanism}` is not one of {names}"
                    ));
                } else if is_password_mechanism(mechanism) {
                    let username =
                        self.effective(&["sasl.username"], self.kafka_sasl_username.as_deref());
                    let password =
                        self.effective(&["sasl.password"], self.kafka_sasl_password.as_deref());
                    if username.is_none_or(str::is_empty) {
                        found.problems.push(format!(
                            "--kafka-sasl-mechanism {mechanism} needs --kafka-sasl-username"
                        ));
                    }
                    if password.is_none() {
                        found.problems.push(format!(
                            "--kafka-sasl-mechanism {mechanism} needs a password \
                             (THUNDER_KAFKA_SASL_PASSWORD)"
                        ));
                    }
                }
            }
            (false, Some(mechanism)) => found.warnings.push(format!(
                "--kafka-sasl-mechanism {mechanism} is ignored: --kafka-security-protocol \
                 {raw_protocol} does not use SASL"
            )),
            (false, None) => {}
        }
        if !protocol.uses_sasl() {
            // The credentials of a SASL setup with its protocol forgotten: the connection
            // would go out unauthenticated, and the broker's refusal would name no flag.
            let credentials = [
                (
                    "--kafka-sasl-username",
                    self.effective(&["sasl.username"], self.kafka_sasl_username.as_deref()),
                ),
                (
                    "--kafka-sasl-password",
                    self.effective(&["sasl.password"], self.kafka_sasl_password.as_deref()),
                ),
            ];
            for (flag, value) in credentials {
                if value.is_some() {
                    found.warnings.push(format!(
                        "{flag} is ignored: --kafka-security-protocol {raw_protocol} does not \
                         use SASL (sasl_ssl or sasl_plaintext does)"
                    ));
                }
            }
        }
        let certificate = self.ssl_certificate_location();
        let key = self.ssl_key_location();
        match (&certificate, &key) {
            (Some(_), None) => found.problems.push(
                "--kafka-ssl-certificate-location needs --kafka-ssl-key-location (the \
                 certificate's private key)"
                    .to_owned(),
            ),
            (None, Some(_)) => found.problems.push(
                "--kafka-ssl-key-location needs --kafka-ssl-certificate-location (the \
                 certificate of that key)"
                    .to_owned(),
            ),
            _ => {}
        }
        let tls_settings = self.ssl_ca_location().is_some() || certificate.is_some();
        if !protocol.uses_tls() && tls_settings {
            found.warnings.push(format!(
                "the --kafka-ssl-* files are ignored: --kafka-security-protocol {raw_protocol} \
                 does not use TLS"
            ));
        }
        found
    }

    /// Checks that this build's librdkafka supports the protocol and mechanism (its
    /// `builtin.features`: `ssl`, `sasl_scram`, `sasl_gssapi`, ...).
    pub fn security_support(&self, builtin_features: &str) -> Findings {
        let mut found = Findings::default();
        let features: Vec<&str> = builtin_features.split(',').map(str::trim).collect();
        let Some(protocol) = SecurityProtocol::parse(self.security_protocol()) else {
            return found;
        };
        if protocol.uses_tls() && !features.contains(&"ssl") {
            found.problems.push(format!(
                "--kafka-security-protocol {} needs a librdkafka built with OpenSSL; this \
                 build has: {builtin_features}",
                self.security_protocol()
            ));
        }
        if protocol.uses_sasl()
            && let Some(mechanism) = self.sasl_mechanism()
            && let Some((name, feature)) = MECHANISMS
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(mechanism))
            && !features.contains(feature)
        {
            let how = match *name {
                "GSSAPI" => " (build with the `gssapi` cargo feature)",
                _ => "",
            };
            found.problems.push(format!(
                "--kafka-sasl-mechanism {name} is not built into this librdkafka{how}; it \
                 has: {builtin_features}"
            ));
        }
        let oidc = self
            .effective(&["sasl.oauthbearer.method"], None)
            .is_some_and(|m| m.eq_ignore_ascii_case("oidc"));
        if oidc && !features.contains(&"oidc") {
            found.problems.push(format!(
                "sasl.oauthbearer.method=oidc needs a librdkafka built with curl (the `curl` \
                 cargo feature); this build has: {builtin_features}"
            ));
        }
        found
    }

    /// Reads the TLS files the settings name (when the protocol uses TLS): the CA bundle
    /// holds certificates, the client certificate and key parse, the key (decrypted with its
    /// passphrase) belongs to the certificate, and no certificate is expired or not yet
    /// valid; one that expires within [`EXPIRY_WARNING_DAYS`] is a warning. `now` is unix
    /// seconds.
    pub fn security_files(&self, now_secs: i64) -> Findings {
        let mut found = Findings::default();
        let uses_tls = SecurityProtocol::parse(self.security_protocol())
            .is_some_and(SecurityProtocol::uses_tls);
        if !uses_tls {
            return found;
        }
        if let Some(ca) = self.ssl_ca_location()
            && ca != "probe"
        {
            let path = Path::new(&ca);
            if path.is_dir() {
                if let Err(e) = std::fs::read_dir(path) {
                    found.problems.push(format!(
                        "--kafka-ssl-ca-location {ca}: cannot read the directory: {e}"
                    ));
                }
            } else {
                match read_certificates(path) {
                    Ok(certs) => found.extend(certificate_dates(
                        "--kafka-ssl-ca-location",
                        &ca,
                        &certs,
                        now_secs,
                    )),
                    Err(e) => found
                        .problems
                        .push(format!("--kafka-ssl-ca-location {ca}: {e}")),
                }
            }
        }
        let certificate = self.ssl_certificate_location().map(|location| {
            let certs = read_certificates(Path::new(&location));
            (location, certs)
        });
        if let Some((location, certs)) = &certificate {
            match certs {
                Ok(certs) => found.extend(certificate_dates(
                    "--kafka-ssl-certificate-location",
                    location,
                    certs,
                    now_secs,
                )),
                Err(e) => found
                    .problems
                    .push(format!("--kafka-ssl-certificate-location {location}: {e}")),
            }
        }
        if let Some(location) = self.ssl_key_location() {
            let key_path = Path::new(&location);
            let password = self.ssl_key_password();
            let leaf = certificate.as_ref().and_then(|(cert_location, certs)| {
                Some((cert_location, certs.as_ref().ok()?.first()?))
            });
            // The certificate whose key it is not, if any.
            let mismatch = match leaf {
                Some((cert_location, leaf)) => {
                    key_fits(leaf, key_path, password).map(|fits| (!fits).then_some(cert_location))
                }
                None => read_private_key(key_path, password).map(|_| None),
            };
            match mismatch {
                Ok(None) => {}
                Ok(Some(cert_location)) => found.problems.push(format!(
                    "--kafka-ssl-key-location {location} is not the key of \
                     --kafka-ssl-certificate-location {cert_location}"
                )),
                Err(e) => found
                    .problems
                    .push(format!("--kafka-ssl-key-location {location}: {e}")),
            }
        }
        found
    }
}

/// PLAIN and SCRAM authenticate with a username and a password.
fn is_password_mechanism(mechanism: &str) -> bool {
    ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        .iter()
        .any(|m| m.eq_ignore_ascii_case(mechanism))
}

/// librdkafka's `builtin.features` of this build (`ssl`, `sasl_scram`, ...).
pub fn builtin_features() -> String {
    rdkafka::ClientConfig::new()
        .create_native_config()
        .and_then(|config| config.get("builtin.features"))
        .unwrap_or_default()
}

/// The certificates of a PEM file, or why there are none, in words.
pub fn read_certificates(path: &Path) -> Result<Vec<X509>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read the file: {e}"))?;
    if !contains(&pem, b"-----BEGIN CERTIFICATE-----")
        && !contains(&pem, b"-----BEGIN TRUSTED CERTIFICATE-----")
    {
        return Err("holds no PEM certificate (no -----BEGIN CERTIFICATE----- line)".to_owned());
    }
    let certs = X509::stack_from_pem(&pem)
        .map_err(|e| format!("is not a valid PEM certificate: {}", openssl_reason(&e)))?;
    if certs.is_empty() {
        return Err("holds no certificate".to_owned());
    }
    Ok(certs)
}

/// Whether the private key of the PEM file `key_path` (decrypted with `password` when it is
/// encrypted) is the key of `certificate`, judged with OpenSSL, which reads any X.509 version;
/// or why the key cannot be read, in words.
pub fn key_fits(
    certificate: &X509,
    key_path: &Path,
    password: Option<&str>,
) -> Result<bool, String> {
    let key = read_private_key(key_path, password)?;
    Ok(certificate
        .public_key()
        .is_ok_and(|public| public.public_eq(&key)))
}

/// The private key of a PEM file, decrypted with `password` when it is encrypted.
fn read_private_key(path: &Path, password: Option<&str>) -> Result<PKey<Private>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read the file: {e}"))?;
    if !contains(&pem, b"PRIVATE KEY-----") {
        return Err(
            "holds no PEM private key (no -----BEGIN ... PRIVATE KEY----- line)".to_owned(),
        );
    }
    let encrypted = contains(&pem, b"ENCRYPTED");
    let key = match password {
        Some(password) => PKey::private_key_from_pem_passphrase(&pem, password.as_bytes()),
        None if encrypted => {
            return Err(
                "the key is encrypted and no passphrase is set (THUNDER_KAFKA_SSL_KEY_PASSWORD)"
                    .to_owned(),
            );
        }
        None => PKey::private_key_from_pem(&pem),
    };
    key.map_err(|e| {
        let reason = openssl_reason(&e);
        if encrypted && password.is_some() {
            format!("cannot decrypt the key with the passphrase given ({reason})")
        } else {
            format!("is not a valid PEM private key: {reason}")
        }
    })
}

/// Problems for the certificates outside their validity period at `now_secs` (expired, not
/// yet valid), warnings for those that end within [`EXPIRY_WARNING_DAYS`]. `flag` and
/// `location` name the file in the messages.
pub fn certificate_dates(flag: &str, location: &str, certs: &[X509], now_secs: i64) -> Findings {
    let mut found = Findings::default();
    let now = match Asn1Time::from_unix(now_secs) {
        Ok(now) => now,
        Err(e) => {
            found.problems.push(format!("cannot read the clock: {e}"));
            return found;
        }
    };
    for cert in certs {
        let subject = subject(cert);
        let not_after = cert.not_after();
        let not_before = cert.not_before();
        if not_after < now {
            found.problems.push(format!(
                "{flag} {location}: certificate `{subject}` expired on {not_after}"
            ));
        } else if not_before > now {
            found.problems.push(format!(
                "{flag} {location}: certificate `{subject}` is not valid before {not_before}"
            ));
        } else if let Ok(left) = now.diff(not_after)
            && left.days < EXPIRY_WARNING_DAYS as i32
        {
            found.warnings.push(format!(
                "{flag} {location}: certificate `{subject}` expires on {not_after}, in {} days",
                left.days
            ));
        }
    }
    found
}

/// A certificate's subject as `CN=..., O=...`.
fn subject(cert: &X509) -> String {
    cert.subject_name()
        .entries()
        .map(|entry| {
            let key = entry.object().nid().short_name().unwrap_or("?");
            let value = entry.data().to_string().unwrap_or_else(|_| "?".to_owned());
            format!("{key}={value}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The reasons of an OpenSSL error stack in words (`bad base64 decode`, `bad decrypt`).
fn openssl_reason(stack: &openssl::error::ErrorStack) -> String {
    let reasons: Vec<String> = stack
        .errors()
        .iter()
        .map(|e| e.reason().map_or_else(|| e.to_string(), str::to_owned))
        .collect();
    if reasons.is_empty() {
        "unreadable".to_owned()
    } else {
        reasons.join("; ")
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use openssl::symm::Cipher;
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

    /// Unix seconds of midnight UTC on a 2030 day.
    fn day_2030(month: u8, day: u8) -> i64 {
        rcgen::date_time_ymd(2030, month, day).unix_timestamp()
    }

    /// A CA, and a client certificate valid from 2030-01-01 to 2030-06-01 with its key.
    struct Files {
        dir: tempfile::TempDir,
    }

    impl Files {
        fn new() -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
            ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key"))
                .expect("CA");
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::new(vec!["thunder".to_owned()]).expect("params");
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "thunder");
            params.not_before = rcgen::date_time_ymd(2030, 1, 1);
            params.not_after = rcgen::date_time_ymd(2030, 6, 1);
            let cert = params.signed_by(&key, &ca).expect("signed");
            let other_key = KeyPair::generate().expect("key");
            let encrypted = PKey::private_key_from_pem(key.serialize_pem().as_bytes())
                .and_then(|k| {
                    k.private_key_to_pem_pkcs8_passphrase(Cipher::aes_256_cbc(), b"s3cret")
                })
                .expect("encrypted key");
            let files = Self { dir };
            files.write("ca.pem", ca.pem().as_bytes());
            files.write("client.pem", cert.pem().as_bytes());
            files.write("client.key", key.serialize_pem().as_bytes());
            files.write("other.key", other_key.serialize_pem().as_bytes());
            files.write("encrypted.key", &encrypted);
            files.write("garbage.pem", b"-----BEGIN CERTIFICATE-----\nnot base64!\n");
            files.write("empty.pem", b"hello\n");
            files
        }

        fn write(&self, name: &str, contents: &[u8]) {
            std::fs::write(self.dir.path().join(name), contents).expect("write");
        }

        fn path(&self, name: &str) -> String {
            self.dir.path().join(name).display().to_string()
        }

        fn args(&self, protocol: &str, ca: &str, cert: &str, key: &str) -> KafkaClientArgs {
            KafkaClientArgs {
                kafka_brokers: Some("127.0.0.1:9093".to_owned()),
                kafka_security_protocol: protocol.to_owned(),
                kafka_ssl_ca_location: Some(self.path(ca)),
                kafka_ssl_certificate_location: Some(self.path(cert)),
                kafka_ssl_key_location: Some(self.path(key)),
                ..KafkaClientArgs::default()
            }
        }
    }

    #[test]
    fn valid_files_pass_and_expiry_is_judged_by_the_date() {
        let files = Files::new();
        let args = files.args("ssl", "ca.pem", "client.pem", "client.key");
        assert_eq!(args.security_files(day_2030(3, 1)), Findings::default());
        let soon = args.security_files(day_2030(5, 20));
        assert!(soon.problems.is_empty(), "{soon:?}");
        assert_eq!(soon.warnings.len(), 1, "{soon:?}");
        assert!(soon.warnings[0].contains("expires on"), "{soon:?}");
        assert!(soon.warnings[0].contains("in 12 days"), "{soon:?}");
        let expired = args.security_files(day_2030(7, 1));
        assert_eq!(expired.problems.len(), 1, "{expired:?}");
        assert!(
            expired.problems[0].contains("expired on Jun  1"),
            "{expired:?}"
        );
        assert!(expired.problems[0].contains("CN=thunder"), "{expired:?}");
        let early = args.security_files(day_2029_dec());
        assert_eq!(early.problems.len(), 1, "{early:?}");
        assert!(early.problems[0].contains("not valid before"), "{early:?}");
        // Not TLS: the files are not read at all.
        let plain = files.args("sasl_plaintext", "missing", "missing", "missing");
        assert_eq!(plain.security_files(day_2030(3, 1)), Findings::default());
    }

    fn day_2029_dec() -> i64 {
        rcgen::date_time_ymd(2029, 12, 1).unix_timestamp()
    }

    #[test]
    fn every_bad_file_is_reported_in_words_at_once() {
        let files = Files::new();
        let args = files.args("sasl_ssl", "garbage.pem", "empty.pem", "missing.key");
        let found = args.security_files(day_2030(3, 1));
        assert_eq!(found.problems.len(), 3, "{found:?}");
        assert!(
            found.problems[0].contains("--kafka-ssl-ca-location")
                && found.problems[0].contains("not a valid PEM certificate"),
            "{found:?}"
        );
        assert!(
            found.problems[1].contains("--kafka-ssl-certificate-location")
                && found.problems[1].contains("no -----BEGIN CERTIFICATE----- line"),
            "{found:?}"
        );
        assert!(
            found.problems[2].contains("--kafka-ssl-key-location")
                && found.problems[2].contains("cannot read the file"),
            "{found:?}"
        );
        assert!(
            found.problems.iter().all(|p| !p.contains("[")),
            "no byte arrays: {found:?}"
        );
    }

    #[test]
    fn the_key_must_belong_to_the_certificate_and_decrypt() {
        let files = Files::new();
        let now = day_2030(3, 1);
        let other = files.args("ssl", "ca.pem", "client.pem", "other.key");
        let found = other.security_files(now);
        assert_eq!(found.problems.len(), 1, "{found:?}");
        assert!(found.problems[0].contains("is not the key of"), "{found:?}");

        let mut encrypted = files.args("ssl", "ca.pem", "client.pem", "encrypted.key");
        let found = encrypted.security_files(now);
        assert!(found.problems[0].contains("no passphrase"), "{found:?}");
        encrypted.kafka_ssl_key_password = Some("wrong".to_owned());
        let found = encrypted.security_files(now);
        assert!(found.problems[0].contains("cannot decrypt"), "{found:?}");
        encrypted.kafka_ssl_key_password = Some("s3cret".to_owned());
        assert_eq!(encrypted.security_files(now), Findings::default());
        // `-X ssl.key.password` is the same setting.
        encrypted.kafka_ssl_key_password = None;
        encrypted.kafka_properties = vec![("ssl.key.password".to_owned(), "s3cret".to_owned())];
        assert_eq!(encrypted.security_files(now), Findings::default());
    }

    fn settings(argv: &[(&str, &str)], protocol: &str) -> Findings {
        KafkaClientArgs {
            kafka_security_protocol: protocol.to_owned(),
            kafka_properties: argv
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..KafkaClientArgs::default()
        }
        .security_settings()
    }

    #[test]
    fn sasl_needs_a_known_mechanism_and_credentials() {
        let found = settings(&[], "sasl_ssl");
        assert_eq!(found.problems.len(), 1, "{found:?}");
        assert!(
            found.problems[0].contains("needs --kafka-sasl-mechanism")
                && found.problems[0].contains("GSSAPI"),
            "{found:?}"
        );
        let found = settings(&[("sasl.mechanism", "SCRAM-SHA-1")], "SASL_PLAINTEXT");
        assert!(found.problems[0].contains("not one of"), "{found:?}");
        let found = settings(&[("sasl.mechanisms", "scram-sha-512")], "sasl_ssl");
        assert_eq!(found.problems.len(), 2, "username and password: {found:?}");
        let found = settings(
            &[
                ("sasl.mechanism", "PLAIN"),
                ("sasl.username", "u"),
                ("sasl.password", "p"),
            ],
            "sasl_plaintext",
        );
        assert_eq!(found, Findings::default());
        let found = settings(&[("sasl.mechanism", "OAUTHBEARER")], "sasl_ssl");
        assert_eq!(found, Findings::default());
        // `-X security.protocol` wins over the flag.
        let found = settings(&[("security.protocol", "sasl_ssl")], "plaintext");
        assert_eq!(found.problems.len(), 1, "{found:?}");
        let found = settings(&[], "tls");
        assert!(
            found.problems[0].contains("not one of plaintext"),
            "{found:?}"
        );
        let found = settings(&[("sasl.mechanism", "PLAIN")], "ssl");
        assert!(found.problems.is_empty(), "{found:?}");
        assert!(found.warnings[0].contains("ignored"), "{found:?}");
        let found = settings(&[("ssl.certificate.location", "c.pem")], "ssl");
        assert!(
            found.problems[0].contains("needs --kafka-ssl-key-location"),
            "{found:?}"
        );
    }

    #[test]
    fn sasl_credentials_without_a_sasl_protocol_are_flagged_as_ignored() {
        let args = KafkaClientArgs {
            kafka_sasl_username: Some("thunder".to_owned()),
            kafka_sasl_password: Some("pw".to_owned()),
            ..KafkaClientArgs::default()
        };
        let found = args.security_settings();
        assert!(found.problems.is_empty(), "{found:?}");
        assert_eq!(found.warnings.len(), 2, "{found:?}");
        assert!(
            found.warnings[0].starts_with("--kafka-sasl-username is ignored")
                && found.warnings[1].starts_with("--kafka-sasl-password is ignored")
                && found.warnings[0].contains("plaintext does not use SASL"),
            "{found:?}"
        );
        // `-X sasl.username` is the same setting, and the warning never quotes the password.
        let found = settings(
            &[("sasl.username", "u"), ("sasl.password", "hunter2")],
            "ssl",
        );
        assert_eq!(found.warnings.len(), 2, "{found:?}");
        assert!(!format!("{found:?}").contains("hunter2"), "{found:?}");
        // With a SASL protocol they are used.
        let found = settings(
            &[
                ("sasl.mechanism", "PLAIN"),
                ("sasl.username", "u"),
                ("sasl.password", "p"),
            ],
            "sasl_ssl",
        );
        assert!(found.warnings.is_empty(), "{found:?}");
    }

    #[test]
    fn a_refused_setting_fails_the_client_configuration() {
        let args = KafkaClientArgs {
            kafka_brokers: Some("127.0.0.1:9093".to_owned()),
            kafka_security_protocol: "sasl_ssl".to_owned(),
            ..KafkaClientArgs::default()
        };
        let error = args.client_config().expect_err("no mechanism").to_string();
        assert!(error.contains("needs --kafka-sasl-mechanism"), "{error}");
    }

    #[test]
    fn this_build_has_tls_and_scram_but_not_gssapi_unless_asked() {
        let features = builtin_features();
        assert!(features.split(',').any(|f| f == "ssl"), "{features}");
        let scram = KafkaClientArgs {
            kafka_security_protocol: "sasl_ssl".to_owned(),
            kafka_sasl_mechanism: Some("SCRAM-SHA-512".to_owned()),
            ..KafkaClientArgs::default()
        };
        assert_eq!(scram.security_support(&features), Findings::default());
        let gssapi = KafkaClientArgs {
            kafka_sasl_mechanism: Some("GSSAPI".to_owned()),
            ..scram.clone()
        };
        let found = gssapi.security_support("ssl,sasl_plain,sasl_scram");
        assert!(
            found.problems[0].contains("`gssapi` cargo feature"),
            "{found:?}"
        );
        let found = scram.security_support("sasl_plain");
        assert_eq!(found.problems.len(), 2, "no OpenSSL, no SCRAM: {found:?}");
        // The optional features reach librdkafka.
        let has = |feature: &str| features.split(',').any(|f| f == feature);
        assert_eq!(has("sasl_gssapi"), cfg!(feature = "gssapi"), "{features}");
        assert_eq!(has("oidc"), cfg!(feature = "curl"), "{features}");
    }
}

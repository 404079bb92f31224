//! `thunder-server --check-config`: everything about a configuration that can be checked
//! without serving, and the effective configuration with its secrets masked.

use std::io::Write as _;
use std::path::Path;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::Args;

/// Exit code of `--check-config` for an invalid configuration (clap's own for bad flags).
pub const EXIT_INVALID_CONFIG: i32 = 2;

/// Checks `args`: the server options, TLS files (readable PEM, the key matching the
/// certificate, a client CA with certificates), the snapshot directory (allowed in this mode,
/// writable or creatable), the Kafka consumer properties (accepted by librdkafka, without
/// creating a client). Returns every problem found.
pub fn problems(args: &Args) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(e) = args.server_options() {
        problems.push(e.to_string());
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key)
        && let Err(e) = check_key_matches_cert(cert, key)
    {
        problems.push(e);
    }
    if let Some(ca) = &args.tls_client_ca
        && let Err(e) = read_certificates(ca)
    {
        problems.push(format!("--tls-client-ca: {e}"));
    }
    if let Err(e) =
        crate::snapshot::check_mode(args.snapshot.snapshot_dir.as_deref(), args.demo_mode())
    {
        problems.push(e.to_string());
    } else if let Some(dir) = &args.snapshot.snapshot_dir
        && let Err(e) = check_writable(dir)
    {
        problems.push(format!("--snapshot-dir {}: {e}", dir.display()));
    }
    if !args.demo_mode() {
        match args.kafka.consumer_config("thunder-check-config") {
            Ok(config) => {
                if let Err(e) = config.create_native_config() {
                    problems.push(mask_secrets(
                        format!("Kafka configuration refused by librdkafka: {e}"),
                        args,
                    ));
                }
            }
            Err(e) => problems.push(format!("Kafka configuration: {e}")),
        }
    }
    problems
}

/// The effective configuration, every flag's value, secrets masked.
pub fn effective(args: &Args) -> String {
    let mut shown = args.clone();
    if shown.cursor_secret.is_some() {
        shown.cursor_secret = Some("<redacted>".to_owned());
    }
    format!("{shown:#?}")
}

/// Runs `--check-config`: prints the effective configuration to stdout and the verdict, and
/// returns the process exit code (0 valid, [`EXIT_INVALID_CONFIG`] not).
pub fn run(args: &Args) -> i32 {
    let problems = problems(args);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "effective configuration:\n{}", effective(args));
    let mode = if args.demo_mode() {
        "demo (synthetic workload, no Kafka)"
    } else {
        "Kafka ingestion"
    };
    let _ = writeln!(out, "mode: {mode}");
    if problems.is_empty() {
        let _ = writeln!(out, "configuration OK");
        0
    } else {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "configuration invalid:");
        for problem in &problems {
            let _ = writeln!(err, "  - {problem}");
        }
        EXIT_INVALID_CONFIG
    }
}

/// `message` with the values of secret Kafka settings (the SASL password, `-X` keys that look
/// secret) replaced: librdkafka's errors quote the value they refused.
fn mask_secrets(mut message: String, args: &Args) -> String {
    let secret_key = |key: &str| {
        let key = key.to_ascii_lowercase();
        key.contains("password") || key.contains("secret") || key.contains("key")
    };
    let secrets = args
        .kafka
        .client
        .kafka_properties
        .iter()
        .filter(|(key, _)| secret_key(key))
        .map(|(_, value)| value.as_str())
        .chain(args.kafka.client.kafka_sasl_password.as_deref());
    for secret in secrets.filter(|s| !s.is_empty()) {
        message = message.replace(secret, "<redacted>");
    }
    message
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{} is not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no certificate", path.display()));
    }
    Ok(certs)
}

fn check_key_matches_cert(cert: &Path, key: &Path) -> Result<(), String> {
    let certs = read_certificates(cert).map_err(|e| format!("--tls-cert: {e}"))?;
    let pem =
        std::fs::read(key).map_err(|e| format!("--tls-key: cannot read {}: {e}", key.display()))?;
    let key_der = PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| format!("--tls-key: {} is not a PEM private key: {e}", key.display()))?;
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(certs, key_der, &provider).map_err(|e| {
        format!(
            "--tls-key {} does not fit --tls-cert {}: {e}",
            key.display(),
            cert.display()
        )
    })?;
    Ok(())
}

/// `dir` is a writable directory, or does not exist and its nearest existing ancestor is one
/// (the server creates it). Probes with a file created and removed at once.
fn check_writable(dir: &Path) -> Result<(), String> {
    let mut existing = dir;
    while !existing.exists() {
        existing = existing
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
    }
    if !existing.is_dir() {
        return Err(format!("{} is not a directory", existing.display()));
    }
    let probe = existing.join(format!(".thunder-check-config-{}", std::process::id()));
    std::fs::File::create(&probe)
        .map_err(|e| format!("{} is not writable: {e}", existing.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn defaults_are_valid_and_secrets_are_masked() {
        let args =
            Args::try_parse_from(["thunder-server", "--cursor-secret", "hunter2"]).expect("parses");
        assert!(problems(&args).is_empty(), "{:?}", problems(&args));
        assert!(!effective(&args).contains("hunter2"));
    }

    #[test]
    fn a_refused_secret_property_is_not_quoted() {
        let args = Args::try_parse_from([
            "thunder-server",
            "--kafka-brokers",
            "127.0.0.1:9",
            "-X",
            "sasl.password=hunter2",
            "-X",
            "no.such.secret=s3cret",
        ])
        .expect("parses");
        let problems = problems(&args);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("no.such.secret"), "{problems:?}");
        assert!(!problems[0].contains("s3cret"), "{problems:?}");
        let shown = effective(&args);
        assert!(
            !shown.contains("hunter2") && !shown.contains("s3cret"),
            "{shown}"
        );
    }

    #[test]
    fn a_snapshot_dir_under_a_file_and_a_bad_kafka_property_are_reported() {
        let file = std::env::temp_dir().join(format!("thunder-check-{}", std::process::id()));
        std::fs::write(&file, b"x").expect("write");
        let dir = file.join("snapshots");
        let args = Args::try_parse_from([
            "thunder-server",
            "--kafka-brokers",
            "127.0.0.1:9",
            "-X",
            "no.such.property=1",
            "--snapshot-dir",
            dir.to_str().expect("utf-8"),
        ])
        .expect("parses");
        let problems = problems(&args);
        let _ = std::fs::remove_file(&file);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("not a directory"), "{problems:?}");
        assert!(problems[1].contains("no.such.property"), "{problems:?}");
    }
}

//! `thunder-server --check-config`: everything about a configuration that can be checked
//! without serving, and the effective configuration with its secrets masked.

use std::io::Write as _;
use std::path::Path;

use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::Args;
use crate::kafka::Findings;

/// Exit code of `--check-config` for an invalid configuration (clap's own for bad flags).
pub const EXIT_INVALID_CONFIG: i32 = 2;

/// The environment variables that carry secrets a flag could also give, by flag.
const SECRET_VARIABLES: [(&str, &str); 2] = [
    ("--kafka-sasl-password", "THUNDER_KAFKA_SASL_PASSWORD"),
    ("--kafka-ssl-key-password", "THUNDER_KAFKA_SSL_KEY_PASSWORD"),
];

/// Checks `args` and returns every problem and warning found, all at once: flag values out
/// of range, the gRPC TLS files (readable PEM, the key matching the certificate, certificates
/// valid now, a client CA with certificates), the snapshot directory (allowed in this mode,
/// writable or creatable), and with Kafka its flags, security settings, TLS files and the
/// consumer properties (accepted by librdkafka, without creating a client). `env` reads an
/// environment variable (it tells a secret given on the command line from one in the
/// environment); `now_secs` is the time certificates are checked at.
pub fn findings(args: &Args, env: &dyn Fn(&str) -> Option<String>, now_secs: i64) -> Findings {
    let mut found = Findings {
        problems: args.problems(),
        warnings: Vec::new(),
    };
    grpc_tls_files(args, now_secs, &mut found);
    if let Err(e) =
        crate::snapshot::check_mode(args.snapshot.snapshot_dir.as_deref(), args.demo_mode())
    {
        found.problems.push(e.to_string());
    } else if let Some(dir) = &args.snapshot.snapshot_dir
        && let Err(e) = check_writable(dir)
    {
        found
            .problems
            .push(format!("--snapshot-dir {}: {e}", dir.display()));
    }
    if !args.demo_mode() {
        kafka(args, now_secs, &mut found);
        secrets_on_the_command_line(args, env, &mut found);
    }
    found
}

/// The problems of [`findings`] at the current time, with the process's environment.
pub fn problems(args: &Args) -> Vec<String> {
    findings(args, &|name| std::env::var(name).ok(), unix_now()).problems
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The Kafka flags, the security settings against this build, the TLS files, and librdkafka's
/// own check of the consumer properties.
fn kafka(args: &Args, now_secs: i64, found: &mut Findings) {
    let flags = args.kafka.validate();
    let refused = !flags.problems.is_empty();
    found.extend(flags);
    found.extend(
        args.kafka
            .client
            .security_support(&crate::kafka::builtin_features()),
    );
    found.extend(args.kafka.client.security_files(now_secs));
    if refused {
        // The consumer configuration would fail with the same problems again.
        return;
    }
    match args.kafka.consumer_config("thunder-check-config") {
        Ok(config) => {
            if let Err(e) = config.create_native_config() {
                found.problems.push(mask_secrets(
                    format!("Kafka configuration refused by librdkafka: {e}"),
                    args,
                ));
            }
        }
        Err(e) => found.problems.push(format!("Kafka configuration: {e}")),
    }
}

/// Warns about passwords given on the command line, where any local user can read them (in
/// `ps`, `/proc/PID/cmdline`): a secret flag whose value is not its environment variable's,
/// and a secret `-X` property not in `THUNDER_KAFKA_PROPERTIES`.
fn secrets_on_the_command_line(
    args: &Args,
    env: &dyn Fn(&str) -> Option<String>,
    found: &mut Findings,
) {
    let client = &args.kafka.client;
    let values = [&client.kafka_sasl_password, &client.kafka_ssl_key_password];
    for ((flag, variable), value) in SECRET_VARIABLES.iter().zip(values) {
        if let Some(value) = value
            && env(variable).as_deref() != Some(value.as_str())
        {
            found.warnings.push(format!(
                "{flag} is given on the command line, where other local users can read it; \
                 set {variable} instead"
            ));
        }
    }
    let from_env = env("THUNDER_KAFKA_PROPERTIES").unwrap_or_default();
    for (key, value) in &client.kafka_properties {
        let pair = format!("{key}={value}");
        if secret_key(key) && !from_env.split(';').any(|p| p.trim() == pair) {
            found.warnings.push(format!(
                "-X {key}=... is given on the command line, where other local users can read \
                 it; set it in THUNDER_KAFKA_PROPERTIES instead"
            ));
        }
    }
}

/// The gRPC port's TLS files, each checked on its own so every problem is listed.
fn grpc_tls_files(args: &Args, now_secs: i64, found: &mut Findings) {
    let cert = args.tls_cert.as_deref().map(|path| {
        let certs = read_certificates(path);
        if let Err(e) = &certs {
            found.problems.push(format!("--tls-cert: {e}"));
        }
        certs
    });
    if let Some(path) = &args.tls_cert {
        certificate_dates("--tls-cert", path, now_secs, found);
    }
    let key = args.tls_key.as_deref().map(|path| {
        let key = read_private_key(path);
        if let Err(e) = &key {
            found.problems.push(format!("--tls-key: {e}"));
        }
        key
    });
    if let (Some(Ok(certs)), Some(Ok(key)), Some(cert_path), Some(key_path)) =
        (cert, key, &args.tls_cert, &args.tls_key)
    {
        let provider = rustls::crypto::ring::default_provider();
        if let Err(e) = rustls::sign::CertifiedKey::from_der(certs, key, &provider) {
            found.problems.push(format!(
                "--tls-key {} does not fit --tls-cert {}: {e}",
                key_path.display(),
                cert_path.display()
            ));
        }
    }
    if let Some(ca) = &args.tls_client_ca {
        match read_certificates(ca) {
            Ok(_) => certificate_dates("--tls-client-ca", ca, now_secs, found),
            Err(e) => found.problems.push(format!("--tls-client-ca: {e}")),
        }
    }
}

/// The validity dates of the certificates in `path` (read with OpenSSL; a file that does not
/// parse is reported by the caller).
fn certificate_dates(flag: &str, path: &Path, now_secs: i64, found: &mut Findings) {
    if let Ok(certs) = crate::kafka::read_certificates(path) {
        let location = path.display().to_string();
        found.extend(crate::kafka::certificate_dates(
            flag, &location, &certs, now_secs,
        ));
    }
}

/// Runs `--check-config`: prints the effective configuration to stdout, then the warnings and
/// the verdict, and returns the process exit code (0 valid, [`EXIT_INVALID_CONFIG`] not).
pub fn run(args: &Args) -> i32 {
    let found = findings(args, &|name| std::env::var(name).ok(), unix_now());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "effective configuration:\n{}", effective(args));
    let mode = if args.demo_mode() {
        "demo (synthetic workload, no Kafka)"
    } else {
        "Kafka ingestion"
    };
    let _ = writeln!(out, "mode: {mode}");
    let _ = out.flush();
    let mut err = std::io::stderr().lock();
    for warning in &found.warnings {
        let _ = writeln!(err, "warning: {warning}");
    }
    if found.problems.is_empty() {
        let _ = writeln!(out, "configuration OK");
        0
    } else {
        let _ = writeln!(err, "configuration invalid:");
        for problem in &found.problems {
            let _ = writeln!(err, "  - {problem}");
        }
        EXIT_INVALID_CONFIG
    }
}

/// The effective configuration, every flag's value, secrets masked.
pub fn effective(args: &Args) -> String {
    let mut shown = args.clone();
    if shown.cursor_secret.is_some() {
        shown.cursor_secret = Some("<redacted>".to_owned());
    }
    format!("{shown:#?}")
}

/// A librdkafka property key whose value is a secret.
fn secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password") || key.contains("secret") || key.contains("key")
}

/// `message` with the values of secret Kafka settings (the SASL password, the key
/// passphrase, `-X` keys that look secret) replaced: librdkafka's errors quote the value they
/// refused.
fn mask_secrets(mut message: String, args: &Args) -> String {
    let client = &args.kafka.client;
    let secrets = client
        .kafka_properties
        .iter()
        .filter(|(key, _)| secret_key(key))
        .map(|(_, value)| value.as_str())
        .chain(client.kafka_sasl_password.as_deref())
        .chain(client.kafka_ssl_key_password.as_deref());
    for secret in secrets.filter(|s| !s.is_empty()) {
        message = message.replace(secret, "<redacted>");
    }
    message
}

/// The certificates of a PEM file (as the gRPC server's TLS reads them), or why not, in words.
fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            format!(
                "{} is not PEM certificates: {}",
                path.display(),
                pem_error(&e)
            )
        })?;
    if certs.is_empty() {
        return Err(format!(
            "{} holds no certificate (no -----BEGIN CERTIFICATE----- line)",
            path.display()
        ));
    }
    Ok(certs)
}

/// The private key of a PEM file, or why not, in words.
fn read_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        let why = match e {
            pem::Error::NoItemsFound => {
                "holds no unencrypted private key (no -----BEGIN PRIVATE KEY-----, RSA PRIVATE                  KEY or EC PRIVATE KEY line)"
                    .to_owned()
            }
            other => format!("is not a PEM private key: {}", pem_error(&other)),
        };
        format!("{} {why}", path.display())
    })
}

/// A PEM parse error in words (the library's own text quotes markers as byte arrays).
fn pem_error(error: &pem::Error) -> String {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    match error {
        pem::Error::MissingSectionEnd { end_marker } => {
            format!(
                "a section has no end line (-----END {}-----)",
                text(end_marker)
            )
        }
        pem::Error::IllegalSectionStart { line } => {
            format!("malformed section start line `{}`", text(line))
        }
        pem::Error::Base64Decode(why) => format!("bad base64 inside a section ({why})"),
        pem::Error::Io(e) => format!("read error ({e})"),
        pem::Error::NoItemsFound => "no PEM section found".to_owned(),
        other => other.to_string(),
    }
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

    fn parse(argv: &[&str]) -> Args {
        let mut all = vec!["thunder-server"];
        all.extend_from_slice(argv);
        Args::try_parse_from(all).expect("parses")
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = |name: &str| dir.path().join(name).display().to_string();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nAAAA\n").expect("write");
        let args = parse(&[
            "--tls-cert",
            &missing("server.pem"),
            "--tls-key",
            &missing("server.key"),
            "--tls-client-ca",
            garbage.to_str().expect("utf-8"),
            "--max-degrade-level",
            "7",
            "--max-connections",
            "0",
            "--kafka-brokers",
            "127.0.0.1:9093",
            "--kafka-security-protocol",
            "sasl_ssl",
            "--kafka-ssl-ca-location",
            &missing("ca.pem"),
            "--kafka-num-threads",
            "0",
        ]);
        let found = findings(&args, &no_env, 0);
        let expected = [
            "--max-degrade-level 7 is out of range: at most 3",
            "--max-connections must be at least 1",
            "--tls-cert: cannot read",
            "--tls-key: cannot read",
            "--tls-client-ca: ",
            "needs --kafka-sasl-mechanism",
            "--kafka-num-threads must be at least 1",
            "--kafka-ssl-ca-location",
        ];
        assert_eq!(
            found.problems.len(),
            expected.len(),
            "{:#?}",
            found.problems
        );
        for (problem, want) in found.problems.iter().zip(expected) {
            assert!(problem.contains(want), "{problem} lacks {want}");
        }
        let client_ca = &found.problems[4];
        assert!(
            client_ca.contains("no end line (-----END CERTIFICATE-----)"),
            "in words: {client_ca}"
        );
        // Start-up refuses the same server flags, all at once too.
        let error = args.server_options().expect_err("refused").to_string();
        assert!(
            error.contains("--max-degrade-level") && error.contains("--max-connections"),
            "{error}"
        );
    }

    /// The shape of the example: SCRAM over TLS with a real CA file and the password in
    /// the environment is valid; without the mechanism it is not, and says why.
    #[test]
    fn scram_over_tls_is_valid_and_needs_its_mechanism() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params
            .self_signed(&rcgen::KeyPair::generate().expect("key"))
            .expect("CA");
        let ca_path = dir.path().join("CA.pem");
        std::fs::write(&ca_path, ca.pem()).expect("write");
        let ca_path = ca_path.to_str().expect("utf-8");
        let mut argv = vec![
            "--kafka-brokers",
            "127.0.0.1:9093",
            "--kafka-security-protocol",
            "sasl_ssl",
            "--kafka-sasl-username",
            "u",
            "--kafka-ssl-ca-location",
            ca_path,
            "--kafka-sasl-password",
            "pw",
        ];
        let env = |name: &str| (name == "THUNDER_KAFKA_SASL_PASSWORD").then(|| "pw".to_owned());
        let without = findings(&parse(&argv), &env, unix_now());
        assert_eq!(without.problems.len(), 1, "{without:?}");
        assert!(
            without.problems[0].contains("needs --kafka-sasl-mechanism"),
            "{without:?}"
        );
        argv.extend(["--kafka-sasl-mechanism", "SCRAM-SHA-512"]);
        let with = findings(&parse(&argv), &env, unix_now());
        assert_eq!(with, Findings::default());
        // The same password on the command line (not from the environment) is a warning.
        let on_the_command_line = findings(&parse(&argv), &no_env, unix_now());
        assert!(on_the_command_line.problems.is_empty());
        assert_eq!(
            on_the_command_line.warnings.len(),
            1,
            "{on_the_command_line:?}"
        );
        assert!(
            on_the_command_line.warnings[0].contains("THUNDER_KAFKA_SASL_PASSWORD"),
            "{on_the_command_line:?}"
        );
        argv.extend(["-X", "ssl.key.password=x"]);
        let x_secret = findings(&parse(&argv), &env, unix_now());
        assert!(
            x_secret
                .warnings
                .iter()
                .any(|w| w.contains("-X ssl.key.password")),
            "{x_secret:?}"
        );
        assert!(!format!("{x_secret:?}").contains("=x"), "{x_secret:?}");
        for line in x_secret.warnings.iter().chain(&without.problems) {
            assert!(!line.contains("  "), "one line of words: {line}");
        }
    }

    #[test]
    fn grpc_certificates_out_of_their_dates_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let cert = params.self_signed(&key).expect("cert");
        let write = |name: &str, contents: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, contents).expect("write");
            path.display().to_string()
        };
        let (cert, key) = (
            write("c.pem", &cert.pem()),
            write("c.key", &key.serialize_pem()),
        );
        let args = parse(&[
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-client-ca",
            &cert,
        ]);
        let found = findings(&args, &no_env, unix_now());
        assert_eq!(found.problems.len(), 2, "{found:?}");
        assert!(
            found
                .problems
                .iter()
                .all(|p| p.contains("expired on Jan  1")),
            "{found:?}"
        );
        let before = rcgen::date_time_ymd(2019, 6, 1).unix_timestamp();
        let found = findings(&args, &no_env, before);
        assert!(
            found
                .problems
                .iter()
                .all(|p| p.contains("not valid before")),
            "{found:?}"
        );
    }
}

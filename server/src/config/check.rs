//! `thunder-server --check-config`: everything about a configuration that can be checked
//! without serving, and the effective configuration with its secrets masked.
//!
//! A flag is a secret when its clap definition hides its environment value
//! (`hide_env_values`): its value is never printed, in the effective configuration or in a
//! problem, nor is the value of a `-X` property whose key looks secret.

use std::io::Write as _;
use std::path::Path;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, CommandFactory as _};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::admin::routes::{AdminAccess, AdminMode};
use crate::config::Args;
use thunder_events::kafka::Findings;

/// Exit code of `--check-config` for an invalid configuration (clap's own for bad flags).
pub const EXIT_INVALID_CONFIG: i32 = 2;

/// What a secret's value is shown as.
const REDACTED: &str = "<redacted>";

/// Shortest secret value the last pass over the report masks wherever it occurs.
const MIN_MASKED_LEN: usize = 6;

/// The environment variables that carry secrets a flag could also give, by flag.
const SECRET_VARIABLES: [(&str, &str); 4] = [
    ("--kafka-sasl-password", "THUNDER_KAFKA_SASL_PASSWORD"),
    ("--kafka-ssl-key-password", "THUNDER_KAFKA_SSL_KEY_PASSWORD"),
    ("--admin-token", "THUNDER_ADMIN_TOKEN"),
    ("--cursor-secret", "THUNDER_CURSOR_SECRET"),
];

/// Checks `args` and returns every problem and warning found, all at once: flag values out
/// of range, the gRPC TLS files (readable PEM, the key matching the certificate, certificates
/// valid now, a client CA with certificates), the snapshot directory (allowed in this mode,
/// writable or creatable; the newest snapshot's format, files a start set aside), and with Kafka its flags, security settings, TLS files and the
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
    } else if let Some(dir) = &args.snapshot.snapshot_dir {
        match check_writable(dir) {
            Err(e) => found
                .problems
                .push(format!("--snapshot-dir {}: {e}", dir.display())),
            Ok(()) => found.warnings.extend(crate::snapshot::check_dir(dir)),
        }
    }
    admin_port(args, &mut found);
    if !args.demo_mode() {
        kafka(args, now_secs, &mut found);
        secrets_on_the_command_line(args, env, &mut found);
        if args.cursor_secret.is_none() {
            found.warnings.push(
                "no --cursor-secret: page cursors are signed with the built-in secret, which \
                 anyone who reads thunder's source can forge; give every replica behind one \
                 address the same THUNDER_CURSOR_SECRET"
                    .to_owned(),
            );
        }
    }
    found
}

/// Warns when the admin port will run read-only (see [`AdminMode`]), as a start-up would: a
/// listener other hosts reach and no token, so CPU profiles and snapshots are refused.
fn admin_port(args: &Args, found: &mut Findings) {
    let access = AdminAccess {
        token: args.admin_token.clone(),
        allowed_hosts: Vec::new(),
    };
    if AdminMode::of(&access, args.admin_addr) == AdminMode::ReadOnly {
        found.warnings.push(format!(
            "--admin-addr {} is reachable from other hosts and no --admin-token is set: the \
             admin port will be read-only (CPU profiles and POST /admin/snapshot refused); set \
             THUNDER_ADMIN_TOKEN or bind it to loopback",
            args.admin_addr
        ));
    }
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
            .security_support(&thunder_events::kafka::builtin_features()),
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
    let values = [
        &client.kafka_sasl_password,
        &client.kafka_ssl_key_password,
        &args.admin_token,
        &args.cursor_secret,
    ];
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
        certified_key(certs, key, cert_path, key_path, found);
    }
    if let Some(ca) = &args.tls_client_ca {
        match read_certificates(ca) {
            Ok(_) => certificate_dates("--tls-client-ca", ca, now_secs, found),
            Err(e) => found.problems.push(format!("--tls-client-ca: {e}")),
        }
    }
}

/// Whether the server's TLS can use the certificate chain `certs` with `key`: the key is the
/// leaf certificate's (judged with OpenSSL, which reads every X.509 version, so a version 1
/// certificate is not reported as a key mismatch), the leaf is X.509 version 3 (rustls and
/// TLS clients refuse older ones), and rustls accepts the pair as the server would load it.
fn certified_key(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    cert_path: &Path,
    key_path: &Path,
    found: &mut Findings,
) {
    let (cert_shown, key_shown) = (cert_path.display(), key_path.display());
    let leaf = thunder_events::kafka::read_certificates(cert_path)
        .ok()
        .and_then(|certs| certs.into_iter().next());
    let mut usable = true;
    if let Some(leaf) = &leaf {
        if let Ok(false) = thunder_events::kafka::key_fits(leaf, key_path, None) {
            found.problems.push(format!(
                "--tls-key {key_shown} does not fit --tls-cert {cert_shown}: it is not the key \
                 of its first certificate"
            ));
            usable = false;
        }
        // `version()` counts from 0: 2 is X.509 version 3.
        if leaf.version() < 2 {
            found.problems.push(format!(
                "--tls-cert {cert_shown} is an X.509 version {} certificate: rustls (the \
                 server's TLS) and TLS clients accept only version 3; reissue it as version 3 \
                 with a subjectAltName naming the server",
                leaf.version() + 1
            ));
            usable = false;
        }
    }
    if usable {
        let provider = rustls::crypto::ring::default_provider();
        if let Err(e) = rustls::sign::CertifiedKey::from_der(certs, key, &provider) {
            found.problems.push(format!(
                "--tls-cert {cert_shown} with --tls-key {key_shown}: {}",
                crate::serve::tls_accept::certified_key_error(&e)
            ));
        }
    }
}

/// The validity dates of the certificates in `path` (read with OpenSSL; a file that does not
/// parse is reported by the caller).
fn certificate_dates(flag: &str, path: &Path, now_secs: i64, found: &mut Findings) {
    if let Ok(certs) = thunder_events::kafka::read_certificates(path) {
        let location = path.display().to_string();
        found.extend(thunder_events::kafka::certificate_dates(
            flag, &location, &certs, now_secs,
        ));
    }
}

/// What `--check-config` prints and returns.
#[derive(Debug)]
pub struct Report {
    /// Standard output: the effective configuration, the mode, and `configuration OK` when
    /// valid.
    pub stdout: String,
    /// Standard error: the warnings, and the problems when invalid.
    pub stderr: String,
    /// The exit code: 0 valid, [`EXIT_INVALID_CONFIG`] not.
    pub code: i32,
}

/// The report of `--check-config` for `args`, parsed into `matches` (which say where each
/// value came from). `env` and `now_secs` as for [`findings`]. No secret's value appears in
/// it, wherever a message would have quoted it.
pub fn report(
    args: &Args,
    matches: &ArgMatches,
    env: &dyn Fn(&str) -> Option<String>,
    now_secs: i64,
) -> Report {
    use std::fmt::Write as _;
    let found = findings(args, env, now_secs);
    let mode = if args.demo_mode() {
        "demo (synthetic workload, no Kafka)"
    } else {
        "Kafka ingestion"
    };
    let mut stdout = format!(
        "effective configuration (value, then where it came from):\n{}mode: {mode}\n",
        effective(matches)
    );
    let mut stderr = String::new();
    for warning in &found.warnings {
        let _ = writeln!(stderr, "warning: {warning}");
    }
    let code = if found.problems.is_empty() {
        match found.warnings.len() {
            0 => stdout.push_str("configuration OK\n"),
            1 => stdout.push_str("configuration OK, with 1 warning (on stderr)\n"),
            n => {
                let _ = writeln!(stdout, "configuration OK, with {n} warnings (on stderr)");
            }
        }
        0
    } else {
        stderr.push_str("configuration invalid:\n");
        for problem in &found.problems {
            let _ = writeln!(stderr, "  - {problem}");
        }
        EXIT_INVALID_CONFIG
    };
    for secret in secret_values(matches) {
        stdout = stdout.replace(&secret, REDACTED);
        stderr = stderr.replace(&secret, REDACTED);
    }
    Report {
        stdout,
        stderr,
        code,
    }
}

/// Runs `--check-config` with the process's environment: prints the [`report`] and returns
/// its exit code.
pub fn run(args: &Args, matches: &ArgMatches) -> i32 {
    let report = report(args, matches, &|name| std::env::var(name).ok(), unix_now());
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(report.stdout.as_bytes());
    let _ = out.flush();
    let _ = std::io::stderr().lock().write_all(report.stderr.as_bytes());
    report.code
}

/// The effective configuration: every flag of `thunder-server` in `--help` order, one a line,
/// with its value and where it came from (the command line, its `THUNDER_*` variable, the
/// default, or unset); secret values masked.
pub fn effective(matches: &ArgMatches) -> String {
    let command = Args::command();
    let rows: Vec<(String, String, String)> = command
        .get_arguments()
        .filter(|arg| {
            !matches!(
                arg.get_action(),
                ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
            )
        })
        .filter_map(|arg| {
            let id = arg.get_id().as_str();
            let flag = format!("--{}", arg.get_long()?);
            let values = raw_values(matches, id);
            let value = if values.is_empty() {
                "-".to_owned()
            } else if arg.is_hide_env_values_set() {
                REDACTED.to_owned()
            } else {
                let shown: Vec<String> = values.iter().map(|v| masked_property(v)).collect();
                let delimiter = arg.get_value_delimiter().unwrap_or(',');
                shown.join(&delimiter.to_string())
            };
            let source = match matches.value_source(id) {
                Some(ValueSource::CommandLine) => "command line".to_owned(),
                Some(ValueSource::EnvVariable) => {
                    arg.get_env().map_or("environment".to_owned(), |e| {
                        e.to_string_lossy().into_owned()
                    })
                }
                Some(ValueSource::DefaultValue) => "default".to_owned(),
                _ => "unset".to_owned(),
            };
            Some((flag, value, source))
        })
        .collect();
    let flag_width = rows.iter().map(|(f, _, _)| f.len()).max().unwrap_or(0);
    let value_width = rows
        .iter()
        .map(|(_, v, _)| v.len())
        .filter(|&len| len <= 40)
        .max()
        .unwrap_or(0);
    rows.iter()
        .map(|(flag, value, source)| {
            format!("  {flag:flag_width$}  {value:value_width$}  ({source})\n")
        })
        .collect()
}

/// The raw values of the argument `id` as given or defaulted (empty when unset).
fn raw_values(matches: &ArgMatches, id: &str) -> Vec<String> {
    matches
        .try_get_raw(id)
        .ok()
        .flatten()
        .map(|values| values.map(|v| v.to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// `value` with its value part masked when it is a `KEY=VALUE` property whose key looks
/// secret (the `-X` librdkafka properties).
fn masked_property(value: &str) -> String {
    match value.split_once('=') {
        Some((key, _)) if secret_key(key) => format!("{key}={REDACTED}"),
        _ => value.to_owned(),
    }
}

/// The values of every secret flag and of every secret `-X` property in `matches`: what no
/// output of `--check-config` may contain.
fn secret_values(matches: &ArgMatches) -> Vec<String> {
    let command = Args::command();
    let mut secrets: Vec<String> = command
        .get_arguments()
        .flat_map(|arg| {
            let values = raw_values(matches, arg.get_id().as_str());
            if arg.is_hide_env_values_set() {
                values
            } else {
                values
                    .iter()
                    .filter_map(|v| v.split_once('=').filter(|(k, _)| secret_key(k)))
                    .map(|(_, secret)| secret.to_owned())
                    .collect()
            }
        })
        // A very short value is left alone: masking every occurrence of it would garble the
        // report, and the report quotes no secret by construction anyway.
        .filter(|secret| secret.len() >= MIN_MASKED_LEN)
        .collect();
    // The longest first, so a secret that contains another is masked whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
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
        message = message.replace(secret, REDACTED);
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
    use clap::{FromArgMatches as _, Parser};

    /// The flags parsed as `thunder-server` parses them, with where each value came from.
    fn parsed(argv: &[&str]) -> (Args, ArgMatches) {
        let matches = Args::command()
            .try_get_matches_from(std::iter::once("thunder-server").chain(argv.iter().copied()))
            .expect("parses");
        let args = Args::from_arg_matches(&matches).expect("arguments");
        (args, matches)
    }

    /// Words that say a flag holds a secret.
    const SECRET_WORDS: [&str; 4] = ["password", "secret", "token", "passphrase"];

    #[test]
    fn defaults_are_valid_and_the_configuration_reads_as_flags() {
        let (args, matches) = parsed(&["--cursor-secret", "hunter2"]);
        assert!(problems(&args).is_empty(), "{:?}", problems(&args));
        let report = report(&args, &matches, &no_env, unix_now());
        assert_eq!(report.code, 0, "{report:?}");
        assert!(!report.stdout.contains("hunter2"), "{}", report.stdout);
        // One line a flag: the flag, its value and where it came from; no Rust debug dump.
        let line = |flag: &str| {
            report
                .stdout
                .lines()
                .find(|l| l.split_whitespace().next() == Some(flag))
                .unwrap_or_else(|| panic!("no line for {flag}:\n{}", report.stdout))
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            line("--grpc-addr"),
            ["--grpc-addr", "0.0.0.0:9090", "(default)"]
        );
        assert_eq!(
            line("--cursor-secret"),
            ["--cursor-secret", REDACTED, "(command", "line)"]
        );
        assert_eq!(line("--tls-cert"), ["--tls-cert", "-", "(unset)"]);
        for debug_dump in ["Args {", "Some(", "None", "KafkaArgs"] {
            assert!(!report.stdout.contains(debug_dump), "{}", report.stdout);
        }
        // Every flag has its line.
        for arg in Args::command().get_arguments() {
            if let Some(long) = arg.get_long().filter(|l| !["help", "version"].contains(l)) {
                line(&format!("--{long}"));
            }
        }
    }

    /// Every secret flag, given at once, shows nowhere in what `--check-config` prints: not in
    /// the effective configuration, not in a warning or a problem. A flag whose name says it is
    /// a secret must be marked as one (`hide_env_values`), so a new one cannot slip through.
    #[test]
    fn no_output_holds_the_value_of_any_secret_flag() {
        let command = Args::command();
        let mut secret_flags = Vec::new();
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if SECRET_WORDS.iter().any(|word| id.contains(word)) {
                assert!(
                    arg.is_hide_env_values_set(),
                    "--{id} looks secret but does not hide its value (hide_env_values)"
                );
            }
            if arg.is_hide_env_values_set() {
                secret_flags.push(arg.get_long().expect("a long flag").to_owned());
            }
        }
        secret_flags.sort();
        assert_eq!(
            secret_flags,
            [
                "admin-token",
                "cursor-secret",
                "kafka-sasl-password",
                "kafka-ssl-key-password"
            ]
        );
        let marker = |flag: &str| format!("value-of-{flag}-xyzzy");
        let mut argv: Vec<String> = secret_flags
            .iter()
            .map(|flag| format!("--{flag}={}", marker(flag)))
            .collect();
        let x_secret = "value-of-x-sasl-password-xyzzy";
        // Kafka mode, a SASL setup that is wrong in several ways (every message that could
        // quote a setting is produced), a non-loopback admin port, and a secret -X property
        // that librdkafka refuses (its error quotes the value).
        argv.extend(
            [
                "--kafka-brokers=127.0.0.1:9",
                "--kafka-security-protocol=sasl_plaintext",
                "--kafka-sasl-mechanism=SCRAM-SHA-1",
                "--admin-addr=0.0.0.0:8080",
                "-X",
                &format!("sasl.password={x_secret}"),
                "-X",
                &format!("no.such.secret={x_secret}"),
            ]
            .map(str::to_owned),
        );
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let (args, matches) = parsed(&argv);
        let report = report(&args, &matches, &no_env, unix_now());
        assert_eq!(report.code, EXIT_INVALID_CONFIG, "{report:?}");
        let everything = format!("{}{}", report.stdout, report.stderr);
        for flag in &secret_flags {
            assert!(
                !everything.contains(&marker(flag)),
                "--{flag} shown:\n{everything}"
            );
            assert!(
                report
                    .stdout
                    .lines()
                    .any(|l| l.trim_start().starts_with(&format!("--{flag} "))
                        && l.contains(REDACTED)),
                "--{flag} is not listed as redacted:\n{}",
                report.stdout
            );
        }
        assert!(!everything.contains(x_secret), "{everything}");
        assert!(
            everything.contains("no.such.secret"),
            "the refused property is named: {everything}"
        );
    }

    #[test]
    fn the_checks_warn_about_what_a_start_would_refuse_or_regret() {
        // The cursor secret comes from its variable, as the manifest gives it.
        let env = |name: &str| (name == "THUNDER_CURSOR_SECRET").then(|| "s".to_owned());
        let warnings = |argv: &[&str]| {
            let (args, _) = parsed(argv);
            findings(&args, &env, unix_now()).warnings
        };
        // A non-loopback admin port without a token runs read-only.
        let read_only = warnings(&["--admin-addr", "0.0.0.0:8080"]);
        assert_eq!(read_only.len(), 1, "{read_only:?}");
        assert!(
            read_only[0].contains("read-only") && read_only[0].contains("--admin-token"),
            "{read_only:?}"
        );
        assert!(warnings(&["--admin-addr", "0.0.0.0:8080", "--admin-token", "t0ken"]).is_empty());
        assert!(warnings(&["--admin-addr", "127.0.0.1:8080"]).is_empty());
        // Replicas fed by Kafka without a cursor secret: cursors are forgeable.
        let kafka = warnings(&["--kafka-brokers", "127.0.0.1:9"]);
        assert_eq!(kafka.len(), 1, "{kafka:?}");
        assert!(kafka[0].contains("--cursor-secret"), "{kafka:?}");
        assert!(warnings(&["--kafka-brokers", "127.0.0.1:9", "--cursor-secret", "s"]).is_empty());
        // A SASL username with a protocol that does not use SASL is ignored, and said so.
        let ignored = warnings(&[
            "--kafka-brokers",
            "127.0.0.1:9",
            "--cursor-secret",
            "s",
            "--kafka-sasl-username",
            "thunder",
        ]);
        assert_eq!(ignored.len(), 1, "{ignored:?}");
        assert!(
            ignored[0].contains("--kafka-sasl-username is ignored"),
            "{ignored:?}"
        );
        // The verdict says there is more to read.
        let (args, matches) = parsed(&["--admin-addr", "0.0.0.0:8080"]);
        let report = report(&args, &matches, &no_env, unix_now());
        assert_eq!(report.code, 0);
        assert!(
            report
                .stdout
                .ends_with("configuration OK, with 1 warning (on stderr)\n"),
            "{}",
            report.stdout
        );
    }

    /// The gRPC TLS flags of a self-signed `cert` with `key`, which is also the client CA.
    fn grpc_tls<'a>(cert: &'a str, key: &'a str) -> [&'a str; 6] {
        [
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--tls-client-ca",
            cert,
        ]
    }

    /// An X.509 version 1 certificate, self-signed, and its key (PEM).
    fn version_1_certificate() -> (String, String) {
        use openssl::asn1::Asn1Time;
        use openssl::bn::BigNum;
        use openssl::ec::{EcGroup, EcKey};
        use openssl::hash::MessageDigest;
        use openssl::nid::Nid;
        use openssl::pkey::PKey;
        use openssl::x509::{X509Builder, X509NameBuilder};
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).expect("curve");
        let key = PKey::from_ec_key(EcKey::generate(&group).expect("key")).expect("key");
        let mut name = X509NameBuilder::new().expect("name");
        name.append_entry_by_text("CN", "localhost").expect("CN");
        let name = name.build();
        let mut cert = X509Builder::new().expect("builder");
        cert.set_version(0).expect("version 1");
        let serial = BigNum::from_u32(1).and_then(|n| n.to_asn1_integer());
        cert.set_serial_number(&serial.expect("serial"))
            .expect("serial");
        cert.set_subject_name(&name).expect("subject");
        cert.set_issuer_name(&name).expect("issuer");
        cert.set_pubkey(&key).expect("public key");
        cert.set_not_before(&Asn1Time::days_from_now(0).expect("now"))
            .expect("not before");
        cert.set_not_after(&Asn1Time::days_from_now(365).expect("later"))
            .expect("not after");
        cert.sign(&key, MessageDigest::sha256()).expect("sign");
        let pem = |bytes: Vec<u8>| String::from_utf8(bytes).expect("PEM is text");
        (
            pem(cert.build().to_pem().expect("PEM")),
            pem(key.private_key_to_pem_pkcs8().expect("PEM")),
        )
    }

    #[test]
    fn a_version_1_certificate_is_named_as_such_not_as_a_key_mismatch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = version_1_certificate();
        let (_, other_key) = version_1_certificate();
        let write = |name: &str, contents: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, contents).expect("write");
            path.display().to_string()
        };
        let (cert, key, other_key) = (
            write("v1.pem", &cert),
            write("v1.key", &key),
            write("other.key", &other_key),
        );
        let check = |key: &str| {
            let (args, _) = parsed(&grpc_tls(&cert, key));
            findings(&args, &no_env, unix_now()).problems
        };
        let fitting = check(&key);
        assert_eq!(fitting.len(), 1, "{fitting:?}");
        assert!(
            fitting[0].contains("X.509 version 1") && !fitting[0].contains("does not fit"),
            "{fitting:?}"
        );
        // A key that is not the certificate's is still reported, beside the version.
        let foreign = check(&other_key);
        assert_eq!(foreign.len(), 2, "{foreign:?}");
        assert!(foreign[0].contains("does not fit"), "{foreign:?}");
        // The server refuses it at start-up with the same reason.
        let (args, _) = parsed(&grpc_tls(&cert, &key));
        let files = args.server_options().expect("options").tls.expect("TLS");
        let refused = crate::serve::tls_accept::acceptor(&files)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            refused.contains("not X.509 version 3") && !refused.contains("does not fit"),
            "{refused}"
        );
    }

    #[test]
    fn a_refused_secret_property_is_not_quoted() {
        let (args, matches) = parsed(&[
            "--kafka-brokers",
            "127.0.0.1:9",
            "-X",
            "sasl.password=hunter2",
            "-X",
            "no.such.secret=s3cret",
        ]);
        let problems = problems(&args);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("no.such.secret"), "{problems:?}");
        assert!(!problems[0].contains("s3cret"), "{problems:?}");
        let shown = effective(&matches);
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
            "--cursor-secret",
            "c",
        ];
        let env = |name: &str| match name {
            "THUNDER_KAFKA_SASL_PASSWORD" => Some("pw".to_owned()),
            "THUNDER_CURSOR_SECRET" => Some("c".to_owned()),
            _ => None,
        };
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
            2,
            "{on_the_command_line:?}"
        );
        assert!(
            on_the_command_line.warnings[0].contains("THUNDER_KAFKA_SASL_PASSWORD")
                && on_the_command_line.warnings[1].contains("THUNDER_CURSOR_SECRET"),
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
        let args = parse(&grpc_tls(&cert, &key));
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

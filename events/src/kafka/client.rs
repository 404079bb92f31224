//! The Kafka connection flags (brokers, topic, security, `-X` properties) and the librdkafka
//! client configuration built from them: what every Kafka client of thunder shares, the
//! server's consumers, the producer and the admin client of `thunder-cli produce`.

use rdkafka::ClientConfig;

use super::error::KafkaError;

/// Default topic of the in-network post events (the reference's `IN_NETWORK_EVENTS_TOPIC`).
pub const IN_NETWORK_EVENTS_TOPIC: &str = "innetwork_post";

/// The Kafka connection flags alone (brokers, topic, security, `-X`); every flag also reads a
/// `THUNDER_*` environment variable. The server's Kafka flags flatten them and add the
/// consumer's own settings; `thunder-cli produce` takes them alone, so its help lists no
/// consumer-only settings.
#[derive(clap::Args, Clone)]
pub struct KafkaClientArgs {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    #[arg(long, env = "THUNDER_KAFKA_BROKERS")]
    pub kafka_brokers: Option<String>,

    /// Topic of protobuf `InNetworkEvent` records.
    #[arg(long, env = "THUNDER_KAFKA_TOPIC", default_value = IN_NETWORK_EVENTS_TOPIC)]
    pub kafka_topic: String,

    /// librdkafka `security.protocol`: `plaintext`, `ssl` (TLS), `sasl_plaintext` or
    /// `sasl_ssl` (SASL over TLS). The `sasl_*` ones need --kafka-sasl-mechanism.
    #[arg(
        long,
        env = "THUNDER_KAFKA_SECURITY_PROTOCOL",
        default_value = "plaintext"
    )]
    pub kafka_security_protocol: String,

    /// librdkafka `sasl.mechanism`: `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`, `OAUTHBEARER`
    /// or `GSSAPI` (the last with the `gssapi` build feature). Required by the `sasl_*`
    /// protocols.
    #[arg(long, env = "THUNDER_KAFKA_SASL_MECHANISM")]
    pub kafka_sasl_mechanism: Option<String>,

    /// librdkafka `sasl.username` (PLAIN and SCRAM).
    #[arg(long, env = "THUNDER_KAFKA_SASL_USERNAME")]
    pub kafka_sasl_username: Option<String>,

    /// librdkafka `sasl.password` (PLAIN and SCRAM). Give it in the environment variable: on
    /// the command line any local user can read it.
    #[arg(long, env = "THUNDER_KAFKA_SASL_PASSWORD", hide_env_values = true)]
    pub kafka_sasl_password: Option<String>,

    /// librdkafka `ssl.ca.location`: CA bundle (PEM file or directory) to verify the brokers'
    /// certificates with; unset: the system's CAs. The broker's host name is verified against
    /// its certificate (`-X ssl.endpoint.identification.algorithm=none` turns that off).
    #[arg(long, env = "THUNDER_KAFKA_SSL_CA_LOCATION")]
    pub kafka_ssl_ca_location: Option<String>,

    /// librdkafka `ssl.certificate.location`: client certificate (PEM) for brokers that
    /// require one; with --kafka-ssl-key-location.
    #[arg(long, env = "THUNDER_KAFKA_SSL_CERTIFICATE_LOCATION")]
    pub kafka_ssl_certificate_location: Option<String>,

    /// librdkafka `ssl.key.location`: the client certificate's private key (PEM).
    #[arg(long, env = "THUNDER_KAFKA_SSL_KEY_LOCATION")]
    pub kafka_ssl_key_location: Option<String>,

    /// librdkafka `ssl.key.password`: passphrase of an encrypted private key. Give it in the
    /// environment variable, not on the command line.
    #[arg(long, env = "THUNDER_KAFKA_SSL_KEY_PASSWORD", hide_env_values = true)]
    pub kafka_ssl_key_password: Option<String>,

    /// Extra librdkafka property `KEY=VALUE`, repeatable; applied last, so it overrides
    /// everything above. In the environment variable, separate pairs with `;`.
    #[arg(
        short = 'X',
        long = "kafka-property",
        env = "THUNDER_KAFKA_PROPERTIES",
        value_name = "KEY=VALUE",
        value_delimiter = ';',
        value_parser = parse_property
    )]
    pub kafka_properties: Vec<(String, String)>,
}

impl KafkaClientArgs {
    /// Connection settings shared by consumers, producers and admin clients: brokers,
    /// security and the `-X` properties. Fails when no brokers are configured or the security
    /// settings are inconsistent ([`KafkaClientArgs::security_settings`]: e.g. a `sasl_*`
    /// protocol without a mechanism).
    pub fn client_config(&self) -> Result<ClientConfig, KafkaError> {
        let brokers = self
            .kafka_brokers
            .as_deref()
            .filter(|b| !b.trim().is_empty())
            .ok_or(KafkaError::NoBrokers)?;
        let problems = self.security_settings().problems;
        if !problems.is_empty() {
            return Err(KafkaError::InvalidConfig(problems.join("; ")));
        }
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("security.protocol", &self.kafka_security_protocol);
        // librdkafka's default too, said here so no build or version can turn it off unseen.
        config.set("ssl.endpoint.identification.algorithm", "https");
        let flags = [
            ("sasl.mechanism", &self.kafka_sasl_mechanism),
            ("sasl.username", &self.kafka_sasl_username),
            ("sasl.password", &self.kafka_sasl_password),
            ("ssl.ca.location", &self.kafka_ssl_ca_location),
            (
                "ssl.certificate.location",
                &self.kafka_ssl_certificate_location,
            ),
            ("ssl.key.location", &self.kafka_ssl_key_location),
            ("ssl.key.password", &self.kafka_ssl_key_password),
        ];
        for (key, value) in flags {
            if let Some(value) = value {
                config.set(key, value);
            }
        }
        for (key, value) in &self.kafka_properties {
            config.set(key, value);
        }
        Ok(config)
    }
}

impl Default for KafkaClientArgs {
    fn default() -> Self {
        Self {
            kafka_brokers: None,
            kafka_topic: IN_NETWORK_EVENTS_TOPIC.to_owned(),
            kafka_security_protocol: "plaintext".to_owned(),
            kafka_sasl_mechanism: None,
            kafka_sasl_username: None,
            kafka_sasl_password: None,
            kafka_ssl_ca_location: None,
            kafka_ssl_certificate_location: None,
            kafka_ssl_key_location: None,
            kafka_ssl_key_password: None,
            kafka_properties: Vec::new(),
        }
    }
}

/// Debug output hides the SASL password, the key passphrase and the `-X` values of keys that
/// look secret, so the arguments can be logged.
impl std::fmt::Debug for KafkaClientArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |key: &str| {
            let key = key.to_ascii_lowercase();
            key.contains("password") || key.contains("secret") || key.contains("key")
        };
        let properties: Vec<(&str, &str)> = self
            .kafka_properties
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    if redacted(k) {
                        "<redacted>"
                    } else {
                        v.as_str()
                    },
                )
            })
            .collect();
        let hidden = |secret: &Option<String>| secret.as_ref().map(|_| "<redacted>");
        f.debug_struct("KafkaClientArgs")
            .field("kafka_brokers", &self.kafka_brokers)
            .field("kafka_topic", &self.kafka_topic)
            .field("kafka_security_protocol", &self.kafka_security_protocol)
            .field("kafka_sasl_mechanism", &self.kafka_sasl_mechanism)
            .field("kafka_sasl_username", &self.kafka_sasl_username)
            .field("kafka_sasl_password", &hidden(&self.kafka_sasl_password))
            .field("kafka_ssl_ca_location", &self.kafka_ssl_ca_location)
            .field(
                "kafka_ssl_certificate_location",
                &self.kafka_ssl_certificate_location,
            )
            .field("kafka_ssl_key_location", &self.kafka_ssl_key_location)
            .field(
                "kafka_ssl_key_password",
                &hidden(&self.kafka_ssl_key_password),
            )
            .field("kafka_properties", &properties)
            .finish()
    }
}

/// Parses one `KEY=VALUE` librdkafka property.
fn parse_property(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.to_owned()))
        }
        _ => Err(format!("expected KEY=VALUE, got `{raw}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        kafka: KafkaClientArgs,
    }

    #[test]
    fn defaults_match_default_impl() {
        let cli = Cli::try_parse_from(["p"]).expect("parses");
        let d = KafkaClientArgs::default();
        assert_eq!(cli.kafka.kafka_brokers, d.kafka_brokers);
        assert_eq!(cli.kafka.kafka_topic, d.kafka_topic);
        assert_eq!(cli.kafka.kafka_security_protocol, d.kafka_security_protocol);
        assert!(cli.kafka.kafka_properties.is_empty());
    }

    #[test]
    fn properties_parse_and_override() {
        let cli = Cli::try_parse_from([
            "p",
            "--kafka-brokers",
            "127.0.0.1:9092",
            "--kafka-topic",
            "t",
            "-X",
            "linger.ms=1",
            "--kafka-property",
            "security.protocol=ssl",
        ])
        .expect("parses");
        assert_eq!(cli.kafka.kafka_topic, "t");
        let config = cli.kafka.client_config().expect("config");
        assert_eq!(config.get("bootstrap.servers"), Some("127.0.0.1:9092"));
        assert_eq!(config.get("linger.ms"), Some("1"));
        assert_eq!(config.get("security.protocol"), Some("ssl"));
        assert!(Cli::try_parse_from(["p", "-X", "novalue"]).is_err());
        assert!(Cli::try_parse_from(["p", "-X", "=value"]).is_err());
    }

    #[test]
    fn debug_hides_secrets() {
        let args = KafkaClientArgs {
            kafka_sasl_password: Some("hunter2".into()),
            kafka_ssl_key_password: Some("pass-phrase".into()),
            kafka_properties: vec![("ssl.key.password".into(), "s3cret".into())],
            ..KafkaClientArgs::default()
        };
        let shown = format!("{args:?}");
        assert!(
            !shown.contains("hunter2")
                && !shown.contains("s3cret")
                && !shown.contains("pass-phrase"),
            "{shown}"
        );
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn no_brokers_is_an_error() {
        assert!(matches!(
            KafkaClientArgs::default().client_config(),
            Err(KafkaError::NoBrokers)
        ));
    }
}

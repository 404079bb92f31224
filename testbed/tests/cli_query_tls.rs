//! `thunder-cli query` against an mTLS server says why the TLS handshake failed, not only
//! `transport error`: no client certificate, a server certificate of another CA (unknown CA),
//! a host name the certificate does not name, a client certificate the server does not trust;
//! and with the right files it gets its answer.

use std::path::{Path, PathBuf};
use std::process::Command;
use thunder_testbed::process::binary;

use thunder_server::ServerOptions;
use thunder_server::serve::tls::TlsFiles;
use thunder_testbed::pki::{Ca, new_pki, write};
use thunder_testbed::{TestServer, original, store};

/// Runs `thunder-cli query --user 1 --follow 7 ARGS` and returns (success, stderr).
async fn query(args: Vec<String>) -> (bool, String) {
    tokio::task::spawn_blocking(move || {
        let output = Command::new(binary("thunder-cli"))
            .args([
                "query",
                "--user",
                "1",
                "--follow",
                "7",
                "--timeout-ms",
                "10000",
            ])
            .args(&args)
            .output()
            .expect("run thunder-cli");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    })
    .await
    .expect("joined")
}

fn flag(name: &str, path: &Path) -> [String; 2] {
    [format!("--{name}"), path.display().to_string()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_tls_handshake_is_explained() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = new_pki();
    let files: Vec<PathBuf> = [
        ("server.pem", &pki.server.0),
        ("server.key", &pki.server.1),
        ("ca.pem", &pki.ca_pem),
        ("client.pem", &pki.client.0),
        ("client.key", &pki.client.1),
    ]
    .iter()
    .map(|(name, contents)| write(dir.path(), name, contents))
    .collect();
    let [server_cert, server_key, ca, client_cert, client_key] = &files[..] else {
        unreachable!("five files");
    };
    let stranger = Ca::new("another CA");
    let stranger_ca = write(dir.path(), "stranger-ca.pem", &stranger.pem());
    let (stranger_cert, stranger_key) = stranger.leaf(&["thunder-client"], false);
    let stranger_cert = write(dir.path(), "stranger.pem", &stranger_cert);
    let stranger_key = write(dir.path(), "stranger.key", &stranger_key);

    let store = store();
    store.insert_posts(&[original(100, 7, 60)]);
    let options = ServerOptions {
        tls: Some(TlsFiles {
            cert: server_cert.clone(),
            key: server_key.clone(),
            client_ca: ca.clone(),
        }),
        ..ServerOptions::default()
    };
    let server = TestServer::start(options, store, None).await;
    server.running().readiness().set_ready().await;
    let addr = format!("https://localhost:{}", server.running().grpc_addr().port());
    let with = |extra: &[[String; 2]]| {
        let mut args = vec!["--addr".to_owned(), addr.clone()];
        args.extend(extra.iter().flatten().cloned());
        args
    };

    // The right files: an answer.
    let (ok, stderr) = query(with(&[
        flag("tls-ca", ca),
        flag("tls-cert", client_cert),
        flag("tls-key", client_key),
    ]))
    .await;
    assert!(ok, "{stderr}");

    for (case, args, expected) in [
        (
            "no client certificate",
            with(&[flag("tls-ca", ca)]),
            "requires a client certificate",
        ),
        (
            "a server certificate of another CA",
            with(&[
                flag("tls-ca", &stranger_ca),
                flag("tls-cert", client_cert),
                flag("tls-key", client_key),
            ]),
            "unknown CA",
        ),
        (
            "another host name",
            with(&[
                flag("tls-ca", ca),
                flag("tls-cert", client_cert),
                flag("tls-key", client_key),
                ["--tls-domain".to_owned(), "elsewhere.example".to_owned()],
            ]),
            "hostname mismatch",
        ),
        (
            "a client certificate of another CA",
            with(&[
                flag("tls-ca", ca),
                flag("tls-cert", &stranger_cert),
                flag("tls-key", &stranger_key),
            ]),
            "does not trust the client certificate",
        ),
    ] {
        let (ok, stderr) = query(args).await;
        assert!(!ok, "{case}: served");
        assert!(
            stderr.contains("TLS handshake failed") && stderr.contains(expected),
            "{case}: {stderr}"
        );
    }
}

//! mTLS on: a client without a certificate is refused, one with a certificate signed by the
//! client CA is served, a plaintext client is refused. TLS off is covered by every other test.

use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_server::ServerOptions;
use thunder_server::serve::tls::TlsFiles;
use thunder_testbed::pki::{new_pki, write};
use thunder_testbed::{PATIENCE, TestServer, original, request, store};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

async fn call(url: &str, tls: Option<ClientTlsConfig>) -> Result<usize, String> {
    let mut endpoint = Channel::from_shared(url.to_string())
        .expect("url")
        .timeout(PATIENCE);
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).map_err(|e| e.to_string())?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut client = InNetworkPostsServiceClient::new(channel);
    let response = client
        .get_in_network_posts(request(&[5]))
        .await
        .map_err(|s| format!("{s:?}"))?;
    Ok(response.into_inner().posts.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_requires_a_client_certificate() {
    let pki = new_pki();
    let dir = tempfile::tempdir().expect("tempdir");
    let files = TlsFiles {
        cert: write(dir.path(), "server.pem", &pki.server.0),
        key: write(dir.path(), "server.key", &pki.server.1),
        client_ca: write(dir.path(), "ca.pem", &pki.ca_pem),
    };
    let store = store();
    store.insert_posts(&[original(1, 5, 10)]);
    let options = ServerOptions {
        tls: Some(files),
        ..ServerOptions::default()
    };
    let server = TestServer::start(options, store, None).await;
    let addr = server.running().grpc_addr();
    let https = format!("https://{addr}");
    let base = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
        .domain_name("localhost");

    let with_cert = base
        .clone()
        .identity(Identity::from_pem(&pki.client.0, &pki.client.1));
    assert_eq!(call(&https, Some(with_cert)).await, Ok(1));

    let without_cert = call(&https, Some(base)).await;
    assert!(without_cert.is_err(), "served without a client certificate");

    let plaintext = call(&format!("http://{addr}"), None).await;
    assert!(plaintext.is_err(), "served over plaintext");

    // A certificate from another CA is refused too.
    let other = new_pki();
    let foreign = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
        .domain_name("localhost")
        .identity(Identity::from_pem(&other.client.0, &other.client.1));
    assert!(
        call(&https, Some(foreign)).await.is_err(),
        "served a foreign certificate"
    );
}

#[test]
fn tls_needs_all_three_files_or_none() {
    assert_eq!(
        TlsFiles::from_parts(None, None, None).expect("none is plaintext"),
        None
    );
    assert!(TlsFiles::from_parts(Some("c".into()), Some("k".into()), None).is_err());
    assert!(
        TlsFiles::from_parts(Some("c".into()), Some("k".into()), Some("ca".into()))
            .expect("all three")
            .is_some()
    );
}

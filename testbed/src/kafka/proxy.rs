//! A TLS and SASL endpoint in front of the plaintext test broker, so the Kafka clients can be
//! tested against `ssl`, `sasl_plaintext` and `sasl_ssl` listeners the test broker does not
//! have.
//!
//! It listens on a free 127.0.0.1 port, terminates TLS (rustls; optionally requiring a client
//! certificate signed by a given CA), and forwards each Kafka request to the broker on a
//! connection of its own. The broker advertises its own address in Metadata (and
//! FindCoordinator) responses; the proxy rewrites those to its own, so a client that follows
//! them comes back through the proxy. With SASL users it is also the SASL server: it answers
//! SaslHandshake and SaslAuthenticate itself (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) and
//! forwards nothing but ApiVersions before the client has authenticated. (The test broker
//! lists the SASL requests but accepts any credentials.)
//!
//! It parses only what librdkafka negotiates with the test broker: request headers v1/v2,
//! Metadata v0-v12 (flexible from v9), FindCoordinator v0-v2, SaslHandshake v0-v1 and
//! SaslAuthenticate v0-v1. Responses are matched to requests in order, as Kafka answers them;
//! a request without a response (Produce with `acks=0`) is not supported.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::{digest, hmac, pbkdf2};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const API_METADATA: i16 = 3;
const API_FIND_COORDINATOR: i16 = 10;
const API_SASL_HANDSHAKE: i16 = 17;
const API_VERSIONS: i16 = 18;
const API_SASL_AUTHENTICATE: i16 = 36;

/// Kafka's error codes the SASL server answers with.
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
const ILLEGAL_SASL_STATE: i16 = 34;
const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// PBKDF2 iterations of the SCRAM credentials (Kafka's minimum).
const SCRAM_ITERATIONS: u32 = 4096;

/// What the endpoint asks of its clients.
#[derive(Clone, Default)]
pub struct Endpoint {
    /// TLS with this server configuration (a client certificate is required when it says
    /// so); `None`: plaintext.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// SASL users (name, password); `None`: no SASL.
    pub sasl_users: Option<Vec<(String, String)>>,
}

/// The proxy: listening until dropped.
pub struct KafkaProxy {
    addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl KafkaProxy {
    /// Starts a proxy on a free 127.0.0.1 port in front of the broker at `upstream`.
    pub fn start(upstream: &str, endpoint: Endpoint) -> Self {
        let upstream: SocketAddr = upstream.parse().expect("broker address");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("proxy runtime");
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let endpoint = Arc::new(endpoint);
        runtime.spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let endpoint = Arc::clone(&endpoint);
                tokio::spawn(async move {
                    // A client that fails the handshake or authentication just goes away.
                    let _ = accept(socket, upstream, addr, &endpoint).await;
                });
            }
        });
        Self {
            addr,
            runtime: Some(runtime),
        }
    }

    /// `host:port` to give clients as `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for KafkaProxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn accept(
    socket: TcpStream,
    upstream: SocketAddr,
    advertised: SocketAddr,
    endpoint: &Endpoint,
) -> std::io::Result<()> {
    socket.set_nodelay(true)?;
    match &endpoint.tls {
        Some(config) => {
            let tls = tokio_rustls::TlsAcceptor::from(Arc::clone(config))
                .accept(socket)
                .await?;
            serve(tls, upstream, advertised, endpoint).await
        }
        None => serve(socket, upstream, advertised, endpoint).await,
    }
}

async fn serve<S>(
    client: S,
    upstream: SocketAddr,
    advertised: SocketAddr,
    endpoint: &Endpoint,
) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let broker = TcpStream::connect(upstream).await?;
    broker.set_nodelay(true)?;
    let (mut from_client, mut to_client) = tokio::io::split(client);
    let (mut from_broker, mut to_broker) = broker.into_split();
    if let Some(users) = &endpoint.sasl_users {
        let users: HashMap<&str, &str> = users
            .iter()
            .map(|(u, p)| (u.as_str(), p.as_str()))
            .collect();
        let mut sasl = SaslServer::default();
        loop {
            let request = read_frame(&mut from_client).await?;
            let header = RequestHeader::parse(&request)?;
            let response = match header.api_key {
                API_VERSIONS => {
                    write_frame(&mut to_broker, &request).await?;
                    read_frame(&mut from_broker).await?
                }
                API_SASL_HANDSHAKE => sasl.handshake(&header, &request)?,
                API_SASL_AUTHENTICATE => {
                    let (response, outcome) = sasl.authenticate(&header, &request, &users)?;
                    write_frame(&mut to_client, &response).await?;
                    match outcome {
                        Step::Continue => continue,
                        Step::Done => break,
                        Step::Refused => return Ok(()),
                    }
                }
                // Anything else before authentication: the connection is closed, as a
                // broker does.
                _ => return Ok(()),
            };
            write_frame(&mut to_client, &response).await?;
        }
    }
    // Forwarding: requests go to the broker as they come; responses come back in the same
    // order, each rewritten by what its request was.
    let (pending_tx, mut pending) = mpsc::unbounded_channel::<(i16, i16)>();
    let requests = forward_requests(from_client, to_broker, pending_tx);
    let responses = async move {
        while let Some((api_key, api_version)) = pending.recv().await {
            let mut response = read_frame(&mut from_broker).await?;
            match api_key {
                API_METADATA => rewrite_metadata(&mut response, api_version, advertised)?,
                API_FIND_COORDINATOR => {
                    rewrite_find_coordinator(&mut response, api_version, advertised)?
                }
                _ => {}
            }
            write_frame(&mut to_client, &response).await?;
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::select! {
        result = requests => result,
        result = responses => result,
    }
}

/// Forwards the client's requests to the broker, noting each one's API for its response.
async fn forward_requests<R, W>(
    mut from_client: R,
    mut to_broker: W,
    pending: mpsc::UnboundedSender<(i16, i16)>,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let request = read_frame(&mut from_client).await?;
        let header = RequestHeader::parse(&request)?;
        let _ = pending.send((header.api_key, header.api_version));
        write_frame(&mut to_broker, &request).await?;
    }
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

/// One size-prefixed Kafka frame, without its size.
async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> std::io::Result<Vec<u8>> {
    let mut size = [0u8; 4];
    reader.read_exact(&mut size).await?;
    let size = usize::try_from(i32::from_be_bytes(size)).map_err(|_| invalid("frame size"))?;
    let mut frame = vec![0u8; size];
    reader.read_exact(&mut frame).await?;
    Ok(frame)
}

async fn write_frame<W: AsyncWrite + Unpin>(writer: &mut W, frame: &[u8]) -> std::io::Result<()> {
    let size = i32::try_from(frame.len()).map_err(|_| invalid("frame size"))?;
    writer.write_all(&size.to_be_bytes()).await?;
    writer.write_all(frame).await?;
    writer.flush().await
}

/// The fields of a request header the proxy needs, and where its body starts.
struct RequestHeader {
    api_key: i16,
    api_version: i16,
    correlation_id: i32,
    body: usize,
}

impl RequestHeader {
    /// Parses a request header v1 (`client_id` as a nullable int16 string); the SASL and
    /// ApiVersions requests librdkafka sends before authenticating all use it.
    fn parse(frame: &[u8]) -> std::io::Result<Self> {
        let mut reader = Reader::new(frame);
        let api_key = reader.i16()?;
        let api_version = reader.i16()?;
        let correlation_id = reader.i32()?;
        reader.nullable_string()?;
        Ok(Self {
            api_key,
            api_version,
            correlation_id,
            body: reader.pos,
        })
    }
}

/// A cursor over a Kafka message.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    fn at(bytes: &'a [u8], pos: usize) -> Self {
        Self { bytes, pos }
    }

    fn take(&mut self, n: usize) -> std::io::Result<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or_else(|| invalid("length"))?;
        let slice = self
            .bytes
            .get(self.pos..end)
            .ok_or_else(|| invalid("truncated message"))?;
        self.pos = end;
        Ok(slice)
    }

    fn i16(&mut self) -> std::io::Result<i16> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> std::io::Result<i32> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn uvarint(&mut self) -> std::io::Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(invalid("varint"))
    }

    /// An int16-length string (`-1`: null).
    fn nullable_string(&mut self) -> std::io::Result<Option<&'a [u8]>> {
        let len = self.i16()?;
        if len < 0 {
            return Ok(None);
        }
        self.take(len as usize).map(Some)
    }

    /// A compact (uvarint length + 1) string (`0`: null).
    fn compact_nullable_string(&mut self) -> std::io::Result<Option<&'a [u8]>> {
        let len = self.uvarint()?;
        if len == 0 {
            return Ok(None);
        }
        self.take(usize::try_from(len - 1).map_err(|_| invalid("length"))?)
            .map(Some)
    }

    /// An int32-length byte string.
    fn bytes(&mut self) -> std::io::Result<&'a [u8]> {
        let len = usize::try_from(self.i32()?).map_err(|_| invalid("length"))?;
        self.take(len)
    }

    fn skip_tagged_fields(&mut self) -> std::io::Result<()> {
        let count = self.uvarint()?;
        for _ in 0..count {
            self.uvarint()?;
            let size = usize::try_from(self.uvarint()?).map_err(|_| invalid("length"))?;
            self.take(size)?;
        }
        Ok(())
    }
}

fn put_uvarint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as i16).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Replaces the host and port of every broker in a Metadata response with `advertised`.
fn rewrite_metadata(
    response: &mut Vec<u8>,
    version: i16,
    advertised: SocketAddr,
) -> std::io::Result<()> {
    let flexible = version >= 9;
    let mut reader = Reader::new(response);
    reader.i32()?; // correlation id
    if flexible {
        reader.skip_tagged_fields()?;
    }
    if version >= 3 {
        reader.i32()?; // throttle time
    }
    let brokers = if flexible {
        reader.uvarint()?.saturating_sub(1)
    } else {
        u64::try_from(reader.i32()?.max(0)).unwrap_or(0)
    };
    let mut out = response[..reader.pos].to_vec();
    for _ in 0..brokers {
        let node = reader.pos;
        reader.i32()?; // node id
        out.extend_from_slice(&response[node..reader.pos]);
        if flexible {
            reader.compact_nullable_string()?;
        } else {
            reader.nullable_string()?;
        }
        reader.i32()?; // port
        let host = advertised.ip().to_string();
        if flexible {
            put_uvarint(&mut out, host.len() as u64 + 1);
            out.extend_from_slice(host.as_bytes());
        } else {
            put_string(&mut out, &host);
        }
        out.extend_from_slice(&i32::from(advertised.port()).to_be_bytes());
        let rest = reader.pos;
        if version >= 1 {
            if flexible {
                reader.compact_nullable_string()?; // rack
            } else {
                reader.nullable_string()?;
            }
        }
        if flexible {
            reader.skip_tagged_fields()?;
        }
        out.extend_from_slice(&response[rest..reader.pos]);
    }
    out.extend_from_slice(&response[reader.pos..]);
    *response = out;
    Ok(())
}

/// Replaces the coordinator's host and port in a FindCoordinator v0-v2 response.
fn rewrite_find_coordinator(
    response: &mut Vec<u8>,
    version: i16,
    advertised: SocketAddr,
) -> std::io::Result<()> {
    if version > 2 {
        return Err(invalid("FindCoordinator above v2 is not parsed"));
    }
    let mut reader = Reader::new(response);
    reader.i32()?; // correlation id
    if version >= 1 {
        reader.i32()?; // throttle time
    }
    reader.i16()?; // error code
    if version >= 1 {
        reader.nullable_string()?; // error message
    }
    reader.i32()?; // node id
    let mut out = response[..reader.pos].to_vec();
    reader.nullable_string()?;
    reader.i32()?;
    put_string(&mut out, &advertised.ip().to_string());
    out.extend_from_slice(&i32::from(advertised.port()).to_be_bytes());
    out.extend_from_slice(&response[reader.pos..]);
    *response = out;
    Ok(())
}

/// What an authentication step leads to.
enum Step {
    /// The exchange goes on (SCRAM's first message).
    Continue,
    /// Authenticated: forward everything from now on.
    Done,
    /// Refused: the connection is closed after the answer.
    Refused,
}

/// The SASL server side of one connection.
#[derive(Default)]
struct SaslServer {
    mechanism: Option<String>,
    /// SCRAM: the first exchange, kept for the proof (client-first-bare, server-first, the
    /// combined nonce, the salted password).
    scram: Option<ScramState>,
}

struct ScramState {
    client_first_bare: String,
    server_first: String,
    nonce: String,
    salted_password: Vec<u8>,
    algorithm: ScramAlgorithm,
}

#[derive(Clone, Copy)]
struct ScramAlgorithm {
    pbkdf2: pbkdf2::Algorithm,
    hmac: hmac::Algorithm,
    digest: &'static digest::Algorithm,
    len: usize,
}

impl ScramAlgorithm {
    fn of(mechanism: &str) -> Option<Self> {
        match mechanism {
            "SCRAM-SHA-256" => Some(Self {
                pbkdf2: pbkdf2::PBKDF2_HMAC_SHA256,
                hmac: hmac::HMAC_SHA256,
                digest: &digest::SHA256,
                len: 32,
            }),
            "SCRAM-SHA-512" => Some(Self {
                pbkdf2: pbkdf2::PBKDF2_HMAC_SHA512,
                hmac: hmac::HMAC_SHA512,
                digest: &digest::SHA512,
                len: 64,
            }),
            _ => None,
        }
    }

    fn hmac(&self, key: &[u8], data: &[u8]) -> Vec<u8> {
        hmac::sign(&hmac::Key::new(self.hmac, key), data)
            .as_ref()
            .to_vec()
    }
}

const MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

impl SaslServer {
    /// SaslHandshake v0/v1: the mechanism, if offered.
    fn handshake(&mut self, header: &RequestHeader, request: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut reader = Reader::at(request, header.body);
        let mechanism =
            String::from_utf8_lossy(reader.nullable_string()?.unwrap_or_default()).into_owned();
        let error = if MECHANISMS.contains(&mechanism.as_str()) {
            self.mechanism = Some(mechanism);
            0
        } else {
            UNSUPPORTED_SASL_MECHANISM
        };
        let mut out = header.correlation_id.to_be_bytes().to_vec();
        out.extend_from_slice(&error.to_be_bytes());
        out.extend_from_slice(&(MECHANISMS.len() as i32).to_be_bytes());
        for m in MECHANISMS {
            put_string(&mut out, m);
        }
        Ok(out)
    }

    /// SaslAuthenticate v0/v1: one step of the mechanism chosen by the handshake.
    fn authenticate(
        &mut self,
        header: &RequestHeader,
        request: &[u8],
        users: &HashMap<&str, &str>,
    ) -> std::io::Result<(Vec<u8>, Step)> {
        let mut reader = Reader::at(request, header.body);
        let message = reader.bytes()?;
        let answer = |error: i16, text: Option<&str>, auth: &[u8]| {
            let mut out = header.correlation_id.to_be_bytes().to_vec();
            out.extend_from_slice(&error.to_be_bytes());
            match text {
                Some(text) => put_string(&mut out, text),
                None => out.extend_from_slice(&(-1i16).to_be_bytes()),
            }
            out.extend_from_slice(&(auth.len() as i32).to_be_bytes());
            out.extend_from_slice(auth);
            if header.api_version >= 1 {
                out.extend_from_slice(&0i64.to_be_bytes()); // session lifetime: none
            }
            out
        };
        let Some(mechanism) = self.mechanism.clone() else {
            let response = answer(ILLEGAL_SASL_STATE, Some("no SaslHandshake first"), &[]);
            return Ok((response, Step::Refused));
        };
        let refused = |why: &str| {
            let text = format!(
                "Authentication failed during authentication due to invalid credentials with \
                 SASL mechanism {mechanism}: {why}"
            );
            (
                answer(SASL_AUTHENTICATION_FAILED, Some(&text), &[]),
                Step::Refused,
            )
        };
        if mechanism == "PLAIN" {
            let parts: Vec<&[u8]> = message.split(|b| *b == 0).collect();
            let ok = parts.len() == 3
                && std::str::from_utf8(parts[1])
                    .ok()
                    .and_then(|user| users.get(user))
                    .is_some_and(|password| password.as_bytes() == parts[2]);
            return Ok(if ok {
                (answer(0, None, &[]), Step::Done)
            } else {
                refused("invalid username or password")
            });
        }
        let algorithm = ScramAlgorithm::of(&mechanism).ok_or_else(|| invalid("mechanism"))?;
        let text = String::from_utf8_lossy(message).into_owned();
        match self.scram.take() {
            None => {
                // client-first: gs2 header ("n,," or "n,a=...,") then the bare message.
                let bare = text.splitn(3, ',').nth(2).unwrap_or_default().to_owned();
                let attribute = |name: &str| {
                    bare.split(',')
                        .find_map(|a| a.strip_prefix(name))
                        .map(str::to_owned)
                };
                let (Some(user), Some(client_nonce)) = (attribute("n="), attribute("r=")) else {
                    return Ok(refused("malformed client-first message"));
                };
                let Some(password) = users.get(user.as_str()) else {
                    return Ok(refused("unknown user"));
                };
                let salt = format!("salt-of-{user}").into_bytes();
                let mut salted_password = vec![0u8; algorithm.len];
                pbkdf2::derive(
                    algorithm.pbkdf2,
                    NonZeroU32::new(SCRAM_ITERATIONS).expect("non-zero"),
                    &salt,
                    password.as_bytes(),
                    &mut salted_password,
                );
                let nonce = format!("{client_nonce}{}", server_nonce());
                let server_first =
                    format!("r={nonce},s={},i={SCRAM_ITERATIONS}", BASE64.encode(&salt));
                let response = answer(0, None, server_first.as_bytes());
                self.scram = Some(ScramState {
                    client_first_bare: bare,
                    server_first,
                    nonce,
                    salted_password,
                    algorithm,
                });
                Ok((response, Step::Continue))
            }
            Some(state) => {
                // client-final: "c=...,r=...,p=proof".
                let Some((without_proof, proof)) = text.rsplit_once(",p=") else {
                    return Ok(refused("malformed client-final message"));
                };
                let nonce_ok = without_proof
                    .split(',')
                    .any(|a| a.strip_prefix("r=") == Some(state.nonce.as_str()));
                let Ok(proof) = BASE64.decode(proof) else {
                    return Ok(refused("malformed proof"));
                };
                let auth_message = format!(
                    "{},{},{without_proof}",
                    state.client_first_bare, state.server_first
                );
                let a = state.algorithm;
                let client_key = a.hmac(&state.salted_password, b"Client Key");
                let stored_key = digest::digest(a.digest, &client_key);
                let client_signature = a.hmac(stored_key.as_ref(), auth_message.as_bytes());
                let recovered: Vec<u8> = proof
                    .iter()
                    .zip(&client_signature)
                    .map(|(p, s)| p ^ s)
                    .collect();
                let proof_ok = proof.len() == a.len
                    && digest::digest(a.digest, &recovered).as_ref() == stored_key.as_ref();
                if !(nonce_ok && proof_ok) {
                    return Ok(refused("invalid username or password"));
                }
                let server_key = a.hmac(&state.salted_password, b"Server Key");
                let server_signature = a.hmac(&server_key, auth_message.as_bytes());
                let server_final = format!("v={}", BASE64.encode(server_signature));
                Ok((answer(0, None, server_final.as_bytes()), Step::Done))
            }
        }
    }
}

/// A server nonce: random printable characters (no comma).
fn server_nonce() -> String {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 18];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("random bytes");
    BASE64.encode(bytes)
}

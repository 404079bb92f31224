//! Admin HTTP endpoints (axum), on their own port, 127.0.0.1 by default:
//! `/metrics`, `/healthz`, `/readyz`, `/debug/pprof/profile`, `/debug/pprof/flamegraph`,
//! `POST /admin/snapshot`, `/` (the status page, HTML; `/?format=text` or `/endpoints` list
//! the endpoints as text).
//!
//! The endpoints are split by privilege. Reads (`/`, `/endpoints`, `/metrics`, `/healthz`,
//! `/readyz`) are open to whoever reaches the port: probes and scrapers. Privileged requests,
//! those that change or load the process (the CPU profiles, `POST /admin/snapshot`, any
//! method but GET and HEAD), are allowed by the [`AdminMode`] the listener runs in:
//! - **loopback**: the listener is on a loopback address and no token is set: only this host
//!   reaches it, so its requests are allowed after the browser checks below;
//! - **token**: `--admin-token` is set: every privileged request must carry
//!   `Authorization: Bearer <token>`, whatever the address (the Host header authenticates
//!   nothing);
//! - **read-only**: the listener is reachable from other hosts and no token is set: privileged
//!   requests are refused (403), and the log and the status page say so.
//!
//! The browser checks keep a web page from driving the port through the operator's browser:
//! no foreign `Origin` or cross-site `Sec-Fetch-Site`, no form content type, the
//! `X-Thunder-Admin: 1` header on state-changing requests (a page cannot send it cross-site
//! without a CORS preflight, which the port does not answer), and, in loopback mode, a `Host`
//! naming this server (against DNS rebinding).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use ring::hmac;

use crate::admin::profiling;
use crate::admin::status::{ENDPOINTS, StatusSampler};
use crate::telemetry::readiness::Readiness;
use crate::telemetry::registry;

/// The header every state-changing admin request must carry, with the value `1`.
pub const ADMIN_HEADER: &str = "x-thunder-admin";

/// Who may send privileged admin requests (see the module docs).
#[derive(Clone, Default)]
pub struct AdminAccess {
    /// Bearer token privileged requests must carry (`--admin-token`); `None`: no token.
    pub token: Option<String>,
    /// In loopback mode, host names accepted besides localhost, 127.0.0.1, `[::1]` and the
    /// listen address (`--admin-allowed-hosts`); an entry with a port matches only that port.
    pub allowed_hosts: Vec<String>,
}

/// Who may use the privileged admin endpoints (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminMode {
    /// Loopback listener, no token: privileged requests from this host.
    Loopback,
    /// `--admin-token` set: privileged requests with the bearer token.
    Token,
    /// Listener reachable from other hosts, no token: reads only.
    ReadOnly,
}

impl AdminMode {
    /// The mode of a listener bound to `bound` with `access`.
    pub fn of(access: &AdminAccess, bound: SocketAddr) -> Self {
        if access.token.is_some() {
            Self::Token
        } else if bound.ip().is_loopback() {
            Self::Loopback
        } else {
            Self::ReadOnly
        }
    }

    /// Says what the mode allows, for the log and the status page.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Loopback => {
                "privileged (loopback listener: profiles and snapshots from this host only)"
            }
            Self::Token => {
                "privileged with the bearer token (profiles and snapshots need Authorization: \
                 Bearer <--admin-token>)"
            }
            Self::ReadOnly => {
                "read-only (the listener is reachable from other hosts and no --admin-token is \
                 set: profiles and snapshots are refused)"
            }
        }
    }
}

impl std::fmt::Debug for AdminAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminAccess")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("allowed_hosts", &self.allowed_hosts)
            .finish()
    }
}

/// [`AdminAccess`] resolved against the bound address, the token kept only as an HMAC tag.
struct AccessPolicy {
    mode: AdminMode,
    hosts: Vec<String>,
    /// Key and tag of the token: a presented token is checked with [`hmac::verify`], a
    /// constant-time comparison.
    token: Option<(hmac::Key, hmac::Tag)>,
}

impl AccessPolicy {
    fn new(access: &AdminAccess, bound: SocketAddr) -> Self {
        let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "[::1]"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        if !bound.ip().is_unspecified() {
            hosts.push(host_of_ip(bound));
        }
        hosts.extend(
            access
                .allowed_hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty()),
        );
        let token = access.token.as_ref().map(|token| {
            let rng = ring::rand::SystemRandom::new();
            // A fresh random key per process; the fixed fallback only matters if the OS
            // random source fails, and still compares in constant time.
            let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng)
                .unwrap_or_else(|_| hmac::Key::new(hmac::HMAC_SHA256, b"thunder-admin-token"));
            let tag = hmac::sign(&key, token.as_bytes());
            (key, tag)
        });
        Self {
            mode: AdminMode::of(access, bound),
            hosts,
            token,
        }
    }

    /// True when `host` (a `Host` header or an origin's authority) names this server.
    fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        let name = host_name(&host);
        self.hosts.iter().any(|h| *h == host || *h == name)
    }

    /// `Err` with the 403 body when a privileged request with `headers` is not allowed;
    /// `changes_state`: any method but GET and HEAD.
    fn check(&self, changes_state: bool, headers: &HeaderMap) -> Result<(), String> {
        let text = |name: header::HeaderName| {
            headers
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        match (self.mode, &self.token) {
            (AdminMode::ReadOnly, _) => {
                return Err(
                    "forbidden: this admin listener is read-only: it is reachable from \
                     other hosts and no --admin-token is set (set one, or bind --admin-addr to \
                     a loopback address)"
                        .into(),
                );
            }
            (AdminMode::Token, Some((key, tag))) => {
                let presented = headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
                let valid =
                    presented.is_some_and(|token| hmac::verify(key, token, tag.as_ref()).is_ok());
                if !valid {
                    return Err("forbidden: missing or wrong admin token (Authorization: \
                         Bearer <--admin-token>)"
                        .into());
                }
            }
            (AdminMode::Token, None) => {
                return Err("forbidden: no admin token configured".into());
            }
            (AdminMode::Loopback, _) => {
                let Some(host) = text(header::HOST) else {
                    return Err("forbidden: no Host header".into());
                };
                if !self.host_allowed(&host) {
                    return Err(format!(
                        "forbidden: Host {host:?} is not an allowed admin host (localhost, \
                         127.0.0.1, [::1], the admin listen address, or --admin-allowed-hosts)"
                    ));
                }
            }
        }
        if let Some(origin) = text(header::ORIGIN) {
            let authority = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            let same = authority.is_some_and(|a| {
                self.host_allowed(a)
                    || text(header::HOST).is_some_and(|h| h.eq_ignore_ascii_case(a))
            });
            if !same {
                return Err(format!(
                    "forbidden: cross-origin request (Origin {origin:?}); admin requests are \
                     not accepted from web pages"
                ));
            }
        }
        if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site"))
            && site != "same-origin"
            && site != "none"
        {
            return Err(format!(
                "forbidden: cross-site request (Sec-Fetch-Site {site:?})"
            ));
        }
        if !changes_state {
            return Ok(());
        }
        if let Some(kind) = text(header::CONTENT_TYPE) {
            let kind = kind.to_ascii_lowercase();
            let essence = kind.split(';').next().unwrap_or_default().trim();
            if matches!(
                essence,
                "application/x-www-form-urlencoded" | "multipart/form-data" | "text/plain"
            ) {
                return Err(format!(
                    "forbidden: content type {essence:?} (a form post); send no body"
                ));
            }
        }
        if headers.get(ADMIN_HEADER).map(|v| v.as_bytes()) != Some(b"1") {
            return Err(
                "forbidden: state-changing admin requests need the header X-Thunder-Admin: 1"
                    .into(),
            );
        }
        Ok(())
    }
}

/// `host` without its port (`[::1]:80` gives `[::1]`, `a:80` gives `a`).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// The IP of `addr` as a `Host` header names it (IPv6 in brackets).
fn host_of_ip(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => format!("[{}]", a.ip()),
    }
}

/// True for the requests that change or load the process: CPU profiles and every method but
/// GET and HEAD.
fn is_privileged(method: &Method, path: &str) -> bool {
    let reads = *method == Method::GET || *method == Method::HEAD;
    !reads || path.starts_with("/debug/")
}

/// Rejects privileged requests that fail the [`AccessPolicy`] with 403 and the reason; reads
/// pass.
async fn guard(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    if !is_privileged(request.method(), request.uri().path()) {
        return next.run(request).await;
    }
    let changes_state = request.method() != Method::GET && request.method() != Method::HEAD;
    match state.access.check(changes_state, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(reason) => {
            tracing::warn!(
                method = %request.method(),
                path = %request.uri().path(),
                %reason,
                "admin request refused"
            );
            (StatusCode::FORBIDDEN, format!("{reason}\n")).into_response()
        }
    }
}

/// What the admin handlers share.
#[derive(Clone)]
struct AdminState {
    readiness: Readiness,
    status: Arc<StatusSampler>,
    access: Arc<AccessPolicy>,
}

/// The admin router; `bound` is the admin listen address (an allowed `Host`).
pub fn router(
    readiness: Readiness,
    status: Arc<StatusSampler>,
    access: &AdminAccess,
    bound: SocketAddr,
) -> Router {
    let state = AdminState {
        readiness,
        status,
        access: Arc::new(AccessPolicy::new(access, bound)),
    };
    let mode = state.access.mode;
    match mode {
        AdminMode::ReadOnly => tracing::warn!(
            admin_addr = %bound,
            "admin listener read-only: it is reachable from other hosts and no --admin-token is \
             set, so CPU profiles and POST /admin/snapshot are refused"
        ),
        _ => tracing::info!(admin_addr = %bound, mode = mode.describe(), "admin listener"),
    }
    Router::new()
        .route("/", get(index))
        .route("/endpoints", get(endpoints))
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/debug/pprof/profile", get(profiling::profile))
        .route("/debug/pprof/flamegraph", get(profiling::flamegraph))
        .route("/admin/snapshot", post(crate::snapshot::admin_snapshot))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Query of `/`.
#[derive(Debug, serde::Deserialize)]
struct IndexParams {
    format: Option<String>,
}

/// The status page, or the endpoint list with `?format=text`.
async fn index(State(state): State<AdminState>, Query(params): Query<IndexParams>) -> Response {
    if params.format.as_deref() == Some("text") {
        return ENDPOINTS.into_response();
    }
    let page = state
        .status
        .render(&state.readiness, state.access.mode.describe());
    ([(header::CACHE_CONTROL, "no-store")], Html(page)).into_response()
}

/// The list of endpoints.
async fn endpoints() -> &'static str {
    ENDPOINTS
}

/// Prometheus text format of the default registry.
async fn serve_metrics() -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        registry::render(),
    )
}

/// The process is up.
async fn healthz() -> &'static str {
    "ok\n"
}

/// 200 once the store has caught up, 503 before (and while shutting down).
async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn policy(token: Option<&str>, extra: &[&str], bound: &str) -> AccessPolicy {
        AccessPolicy::new(
            &AdminAccess {
                token: token.map(str::to_owned),
                allowed_hosts: extra.iter().map(|h| (*h).to_owned()).collect(),
            },
            bound.parse().expect("addr"),
        )
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).expect("value"));
        }
        map
    }

    #[test]
    fn host_names_drop_the_port() {
        assert_eq!(host_name("localhost:8080"), "localhost");
        assert_eq!(host_name("[::1]:8080"), "[::1]");
        assert_eq!(host_name("[::1]"), "[::1]");
        assert_eq!(host_name("example"), "example");
    }

    #[test]
    fn the_mode_follows_the_address_and_the_token() {
        let access = |token: Option<&str>| AdminAccess {
            token: token.map(str::to_owned),
            allowed_hosts: Vec::new(),
        };
        let at = |addr: &str| addr.parse::<SocketAddr>().expect("addr");
        assert_eq!(
            AdminMode::of(&access(None), at("127.0.0.1:8080")),
            AdminMode::Loopback
        );
        assert_eq!(
            AdminMode::of(&access(None), at("[::1]:8080")),
            AdminMode::Loopback
        );
        for open in ["0.0.0.0:8080", "[::]:8080", "10.0.0.7:8080"] {
            assert_eq!(
                AdminMode::of(&access(None), at(open)),
                AdminMode::ReadOnly,
                "{open}"
            );
            assert_eq!(
                AdminMode::of(&access(Some("t")), at(open)),
                AdminMode::Token
            );
        }
    }

    #[test]
    fn privileged_requests_are_profiles_and_everything_but_reads() {
        assert!(!is_privileged(&Method::GET, "/metrics"));
        assert!(!is_privileged(&Method::HEAD, "/readyz"));
        assert!(!is_privileged(&Method::GET, "/"));
        assert!(is_privileged(&Method::GET, "/debug/pprof/profile"));
        assert!(is_privileged(&Method::GET, "/debug/pprof/flamegraph"));
        assert!(is_privileged(&Method::POST, "/admin/snapshot"));
        assert!(is_privileged(&Method::DELETE, "/metrics"));
    }

    #[test]
    fn a_read_only_listener_refuses_whatever_the_headers_say() {
        let p = policy(None, &["evil.example"], "0.0.0.0:8080");
        for host in ["localhost", "127.0.0.1:8080", "evil.example"] {
            let refused = p.check(true, &headers(&[("host", host), (ADMIN_HEADER, "1")]));
            assert!(refused.is_err_and(|e| e.contains("read-only")), "{host}");
            assert!(p.check(false, &headers(&[("host", host)])).is_err());
        }
    }

    #[test]
    fn loopback_hosts_and_origins() {
        let p = policy(
            None,
            &["Thunder-0.Thunder", "ops.example:9000"],
            "127.0.0.1:8080",
        );
        let ok = |host: &str| p.check(true, &headers(&[("host", host), (ADMIN_HEADER, "1")]));
        for host in [
            "localhost",
            "LOCALHOST:1",
            "127.0.0.1:8080",
            "[::1]:8080",
            "thunder-0.thunder:8080",
            "ops.example:9000",
        ] {
            assert_eq!(ok(host), Ok(()), "{host}");
        }
        for host in ["evil.example", "ops.example:9001", "127.0.0.2", "10.0.0.8"] {
            assert!(ok(host).is_err(), "{host}");
        }
        let with_origin = |origin: &str| {
            p.check(
                true,
                &headers(&[
                    ("host", "localhost:8080"),
                    ("origin", origin),
                    (ADMIN_HEADER, "1"),
                ]),
            )
        };
        assert_eq!(with_origin("http://localhost:8080"), Ok(()));
        for origin in [
            "https://evil.example",
            "null",
            "file://",
            "http://127.0.0.9",
        ] {
            assert!(with_origin(origin).is_err(), "{origin}");
        }
        // A profile (a read that loads the process) needs no header, but no cross-site page.
        assert_eq!(p.check(false, &headers(&[("host", "localhost")])), Ok(()));
        let embedded = headers(&[("host", "localhost"), ("sec-fetch-site", "cross-site")]);
        assert!(p.check(false, &embedded).is_err());
    }

    #[test]
    fn with_a_token_the_token_decides_not_the_host() {
        let p = policy(Some("s3cret"), &[], "0.0.0.0:8080");
        let check = |more: &[(&'static str, &str)]| {
            let mut all = vec![("host", "10.1.2.3:8080"), (ADMIN_HEADER, "1")];
            all.extend_from_slice(more);
            p.check(true, &headers(&all))
        };
        assert_eq!(check(&[("authorization", "Bearer s3cret")]), Ok(()));
        assert!(check(&[]).is_err());
        assert!(check(&[("authorization", "Bearer s3cre")]).is_err());
        assert!(check(&[("authorization", "s3cret")]).is_err());
        let no_header = p.check(
            true,
            &headers(&[("host", "127.0.0.1"), ("authorization", "Bearer s3cret")]),
        );
        assert!(no_header.is_err_and(|e| e.contains("X-Thunder-Admin")));
        for kind in [
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            assert!(
                check(&[("authorization", "Bearer s3cret"), ("content-type", kind)]).is_err(),
                "{kind}"
            );
        }
        assert!(
            check(&[
                ("authorization", "Bearer s3cret"),
                ("sec-fetch-site", "cross-site")
            ])
            .is_err()
        );
        // A profile with the token, from any host; without it, refused.
        let profile = |more: &[(&'static str, &str)]| {
            let mut all = vec![("host", "thunder-2.thunder:8080")];
            all.extend_from_slice(more);
            p.check(false, &headers(&all))
        };
        assert_eq!(profile(&[("authorization", "Bearer s3cret")]), Ok(()));
        assert!(profile(&[]).is_err());
        let debug = format!(
            "{:?}",
            AdminAccess {
                token: Some("s3cret".into()),
                allowed_hosts: Vec::new()
            }
        );
        assert!(!debug.contains("s3cret"), "{debug}");
    }
}

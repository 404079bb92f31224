//! Admin HTTP endpoints (axum), on their own port, 127.0.0.1 by default:
//! `/metrics`, `/healthz`, `/readyz`, `/debug/pprof/profile`, `/debug/pprof/flamegraph`,
//! `POST /admin/snapshot`, `/` (the status page, HTML; `/?format=text` or `/endpoints` list
//! the endpoints as text).
//!
//! State-changing requests (any method but GET and HEAD) pass [`AdminAccess`]'s checks first:
//! an allowed `Host`, no foreign `Origin`, no form content type, the `X-Thunder-Admin: 1`
//! header (which a browser page cannot send cross-site without a CORS preflight, and the
//! port answers no preflight), and the bearer token when `--admin-token` is set.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use ring::hmac;

use crate::admin::metrics;
use crate::admin::profiling;
use crate::admin::readiness::Readiness;
use crate::admin::status::StatusSampler;

/// The header every state-changing admin request must carry, with the value `1`.
pub const ADMIN_HEADER: &str = "x-thunder-admin";

/// Who may send state-changing admin requests (see the module docs).
#[derive(Clone, Default)]
pub struct AdminAccess {
    /// Bearer token required besides the header (`--admin-token`); `None`: no token.
    pub token: Option<String>,
    /// Host names accepted besides localhost, 127.0.0.1, `[::1]` and the listen address
    /// (`--admin-allowed-hosts`); an entry with a port matches only that port.
    pub allowed_hosts: Vec<String>,
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
        Self { hosts, token }
    }

    /// True when `host` (a `Host` header or an origin's authority) names this server.
    fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        let name = host_name(&host);
        self.hosts.iter().any(|h| *h == host || *h == name)
    }

    /// `Err` with the 403 body when `headers` may not change state.
    fn check(&self, headers: &HeaderMap) -> Result<(), String> {
        let text = |name: header::HeaderName| {
            headers
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        let Some(host) = text(header::HOST) else {
            return Err("forbidden: no Host header".into());
        };
        if !self.host_allowed(&host) {
            return Err(format!(
                "forbidden: Host {host:?} is not an allowed admin host (localhost, 127.0.0.1, \
                 [::1], the admin listen address, or --admin-allowed-hosts)"
            ));
        }
        if let Some(origin) = text(header::ORIGIN) {
            let authority = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            if !authority.is_some_and(|a| self.host_allowed(a)) {
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
        if let Some((key, tag)) = &self.token {
            let presented = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
            let valid =
                presented.is_some_and(|token| hmac::verify(key, token, tag.as_ref()).is_ok());
            if !valid {
                return Err(
                    "forbidden: missing or wrong admin token (Authorization: Bearer <--admin-token>)"
                        .into(),
                );
            }
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

/// Rejects state-changing requests that fail the [`AccessPolicy`] with 403 and the reason.
async fn guard(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    if request.method() == Method::GET || request.method() == Method::HEAD {
        return next.run(request).await;
    }
    match state.access.check(request.headers()) {
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

/// The endpoints, one a line (`/endpoints`, `/?format=text`, and on the status page).
pub const ENDPOINTS: &str = "thunder admin endpoints\n\
GET  /                                   status page (HTML; ?format=text: this list)\n\
GET  /endpoints                          this list\n\
GET  /metrics                            Prometheus text\n\
GET  /healthz                            the process is up (liveness)\n\
GET  /readyz                             200 once caught up, 503 before (readiness)\n\
GET  /debug/pprof/profile?seconds=N      CPU profile, gzipped pprof (N <= 60)\n\
GET  /debug/pprof/flamegraph?seconds=N   the same as an SVG flamegraph\n\
POST /admin/snapshot                     write a snapshot now (with --snapshot-dir; needs the\n\
                                         header X-Thunder-Admin: 1, and the bearer token\n\
                                         when --admin-token is set)\n";

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
    let page = state.status.render(&state.readiness);
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
        metrics::render(),
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

    fn policy(token: Option<&str>, extra: &[&str]) -> AccessPolicy {
        AccessPolicy::new(
            &AdminAccess {
                token: token.map(str::to_owned),
                allowed_hosts: extra.iter().map(|h| (*h).to_owned()).collect(),
            },
            "10.0.0.7:8080".parse().expect("addr"),
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
    fn hosts_and_origins() {
        let p = policy(None, &["Thunder-0.Thunder", "ops.example:9000"]);
        let ok = |host: &str| p.check(&headers(&[("host", host), (ADMIN_HEADER, "1")]));
        for host in [
            "localhost",
            "LOCALHOST:1",
            "127.0.0.1:8080",
            "[::1]:8080",
            "10.0.0.7:8080",
            "thunder-0.thunder:8080",
            "ops.example:9000",
        ] {
            assert_eq!(ok(host), Ok(()), "{host}");
        }
        for host in ["evil.example", "ops.example:9001", "127.0.0.2", "10.0.0.8"] {
            assert!(ok(host).is_err(), "{host}");
        }
        let with_origin = |origin: &str| {
            p.check(&headers(&[
                ("host", "localhost:8080"),
                ("origin", origin),
                (ADMIN_HEADER, "1"),
            ]))
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
    }

    #[test]
    fn header_form_types_and_token() {
        let p = policy(Some("s3cret"), &[]);
        let base = [("host", "127.0.0.1:8080"), (ADMIN_HEADER, "1")];
        let check = |more: &[(&'static str, &str)]| {
            let mut all = base.to_vec();
            all.extend_from_slice(more);
            p.check(&headers(&all))
        };
        assert_eq!(check(&[("authorization", "Bearer s3cret")]), Ok(()));
        assert!(check(&[]).is_err());
        assert!(check(&[("authorization", "Bearer s3cre")]).is_err());
        assert!(check(&[("authorization", "s3cret")]).is_err());
        let no_header = p.check(&headers(&[
            ("host", "127.0.0.1"),
            ("authorization", "Bearer s3cret"),
        ]));
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

//! A minimal HTTP/1.1 client for the admin port: one request per connection
//! (`Connection: close`), chunked bodies decoded.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A parsed HTTP/1.1 response.
#[derive(Debug)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// The header fields, in order.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked).
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first header field called `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Minimal HTTP/1.1 GET with `Connection: close` (handles chunked bodies).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> HttpResponse {
    http_request(addr, "GET", path).await
}

/// Minimal HTTP/1.1 request without a body, `Connection: close` (handles chunked bodies).
pub async fn http_request(addr: std::net::SocketAddr, method: &str, path: &str) -> HttpResponse {
    http_request_with(addr, method, path, &addr.to_string(), &[]).await
}

/// A state-changing admin request as an operator sends it: POST with `X-Thunder-Admin: 1`.
pub async fn admin_post(addr: std::net::SocketAddr, path: &str) -> HttpResponse {
    http_request_with(
        addr,
        "POST",
        path,
        &addr.to_string(),
        &[("X-Thunder-Admin", "1")],
    )
    .await
}

/// [`http_request`] with the given `Host` and extra headers.
pub async fn http_request_with(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    host: &str,
    headers: &[(&str, &str)],
) -> HttpResponse {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("admin connects");
        let extra: String = headers
            .iter()
            .map(|(name, value)| format!("{name}: {value}\r\n"))
            .collect();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream
            .write_all(head.as_bytes())
            .await
            .expect("request written");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.expect("response read");
        raw
    };
    let raw = tokio::time::timeout(Duration::from_secs(120), exchange)
        .await
        .expect("HTTP answer in time");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header end");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    HttpResponse {
        status,
        headers,
        body,
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = data.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&data[..line_end]).into_owned();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("0").trim(), 16)
            .expect("chunk size");
        data = &data[line_end + 2..];
        if size == 0 {
            break;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
    out
}
